"""Messages and their content items: what a response's stream carries (spec 003).

A :class:`Message` is a user's input or something the agent produced; its
``content`` is a list of content items (:class:`TextContent`,
:class:`DataContent`, ...), one model per ``type``. Streamed, a content item
arrives whole or as deltas, which :func:`merge_delta` merges into its slot
(:meth:`Message.add_delta_content`). Tool calls and their results travel as
data content whose data is a :class:`FunctionCall` or a
:class:`FunctionCallOutput`.

Built on :mod:`openstarry.api.wire`; :mod:`openstarry.api.requests` (a request's
``input``) and :mod:`openstarry.api.responses` (a response's ``output``) build on
this. :mod:`openstarry.api.models` re-exports all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, TypeAdapter, ValidationError

from openstarry.api.wire import (
    MAX_CONTENT_ITEMS,
    MAX_ID_LENGTH,
    MAX_TEXT_LENGTH,
    BoundedText,
    ContentType,
    Event,
    IdText,
    InvalidEventError,
    MessageType,
    Role,
    RunStatus,
    WireModel,
    as_object,
    new_message_id,
)

__all__ = [
    "AnyContent",
    "AudioContent",
    "Content",
    "DataContent",
    "FileContent",
    "FunctionCall",
    "FunctionCallOutput",
    "ImageContent",
    "Message",
    "RefusalContent",
    "TextContent",
    "content_class",
    "merge_delta",
    "parse_content",
]


# --- content --------------------------------------------------------------------------------------


class Content(Event):
    """A content item of a message; the subclasses are selected by ``type``.

    When streamed, ``msg_id`` names the message it belongs to and ``index`` its
    slot in that message's ``content``; ``delta`` is ``true`` for a fragment to
    append to the slot and ``false`` for the whole value.
    """

    #: The payload fields whose deltas append (strings concatenate, lists extend,
    #: dicts merge); the other payload fields are replaced by a delta that sets them.
    DELTA_FIELDS: ClassVar[tuple[str, ...]] = ()

    type: str
    object: Literal["content"] = "content"
    index: Annotated[StrictInt, Field(ge=0, lt=MAX_CONTENT_ITEMS)] | None = None
    delta: StrictBool | None = False
    msg_id: str | None = None

    def _describe(self) -> str:
        where = f" of message {self.msg_id}" if self.msg_id else ""
        return f"content {self.index}{where}" if self.index is not None else f"content{where}"

    def payload(self) -> dict[str, Any]:
        """The fields this content type adds to :class:`Content` (``text``, ``data``, ...)."""
        return {name: getattr(self, name) for name in self.payload_fields()}

    @classmethod
    def payload_fields(cls) -> tuple[str, ...]:
        """The names of the fields this content type adds to :class:`Content`."""
        return tuple(name for name in cls.model_fields if name not in Content.model_fields)


class TextContent(Content):
    """Text."""

    DELTA_FIELDS = ("text",)
    type: Literal["text"] = "text"
    text: BoundedText | None = None


class ImageContent(Content):
    """An image, by URL (``https:`` or a ``data:`` URL)."""

    DELTA_FIELDS = ("image_url",)
    type: Literal["image"] = "image"
    image_url: BoundedText | None = None


class DataContent(Content):
    """Structured data: a JSON object (tool calls and results travel as data)."""

    DELTA_FIELDS = ("data",)
    type: Literal["data"] = "data"
    data: dict[str, Any] | None = None


class AudioContent(Content):
    """Audio: base64 ``data`` in a ``format`` such as ``"mp3"`` or ``"wav"``."""

    DELTA_FIELDS = ("data",)
    type: Literal["audio"] = "audio"
    data: BoundedText | None = None
    format: Annotated[str, Field(max_length=64)] | None = None


class FileContent(Content):
    """A file: by URL, by id, or inline as base64 ``file_data``."""

    DELTA_FIELDS = ("file_data",)
    type: Literal["file"] = "file"
    file_url: BoundedText | None = None
    file_id: Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None = None
    filename: Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None = None
    file_data: BoundedText | None = None


class RefusalContent(Content):
    """The agent's refusal to do what was asked, and why."""

    DELTA_FIELDS = ("refusal",)
    type: Literal["refusal"] = "refusal"
    refusal: BoundedText | None = None


#: Any content item, chosen by its ``type``; an unknown type is a validation error.
AnyContent = Annotated[
    TextContent | ImageContent | DataContent | AudioContent | FileContent | RefusalContent,
    Field(discriminator="type"),
]

_CONTENT_CLASSES: Mapping[str, type[Content]] = {
    "text": TextContent,
    "image": ImageContent,
    "data": DataContent,
    "audio": AudioContent,
    "file": FileContent,
    "refusal": RefusalContent,
}


def copy_json(value: Any) -> Any:
    """A copy of ``value`` whose dicts and lists are new, made without recursion."""
    if not isinstance(value, (dict, list)):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            if isinstance(item, (dict, list)):
                child: Any = {} if isinstance(item, dict) else []
                stack.append((item, child))
                item = child
            if isinstance(target, dict):
                target[key] = item
            else:
                target.append(item)
    return root


def merge_delta(base: Any, delta: Any) -> Any:
    """``delta`` merged onto ``base``, as deltas merge on completion; neither is changed.

    Strings concatenate, lists extend, dicts merge key by key (recursively, for
    dicts inside dicts); anything else, or two values of different kinds, the
    delta replaces (numbers too: a delta carries the new value, not an
    increment). ``None`` on either side yields the other. The walk and the
    copies use explicit stacks, so deeply nested data cannot exhaust Python's
    recursion limit.
    """
    if delta is None:
        return copy_json(base)
    if base is None:
        return copy_json(delta)
    if isinstance(base, str) and isinstance(delta, str):
        return base + delta
    if isinstance(base, list) and isinstance(delta, list):
        merged_list: list[Any] = copy_json(base)
        merged_list.extend(copy_json(delta))
        return merged_list
    if not (isinstance(base, dict) and isinstance(delta, dict)):
        return copy_json(delta)
    result: dict[Any, Any] = copy_json(base)
    stack: list[tuple[dict[Any, Any], dict[Any, Any]]] = [(result, delta)]
    while stack:
        target, changes = stack.pop()
        for key, value in changes.items():
            old = target.get(key)
            if isinstance(old, dict) and isinstance(value, dict):
                stack.append((old, value))
            elif isinstance(old, str) and isinstance(value, str):
                target[key] = old + value
            elif isinstance(old, list) and isinstance(value, list):
                old.extend(copy_json(value))
            else:
                target[key] = copy_json(value)
    return result


# --- messages -------------------------------------------------------------------------------------


class Message(Event):
    """A message: a user's input, or something the agent produced.

    ``type`` says what it carries: ``"message"`` (text and other content),
    ``"function_call"`` (a :class:`DataContent` whose data is a
    :class:`FunctionCall`), ``"function_call_output"`` (data that is a
    :class:`FunctionCallOutput`), ``"error"`` (``code`` and ``message`` set), ...
    """

    id: IdText = Field(default_factory=new_message_id)
    object: Literal["message"] = "message"
    type: MessageType = MessageType.MESSAGE
    status: RunStatus | None = RunStatus.Created
    role: Role | None = None
    content: Annotated[list[AnyContent], Field(max_length=MAX_CONTENT_ITEMS)] | None = None
    code: str | None = None
    """The error code, on a message of type ``"error"``."""
    message: str | None = None
    """The error message, on a message of type ``"error"``."""
    usage: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    def get_text_content(self) -> str | None:
        """The text of the first text content, or ``None`` when there is none."""
        for item in self.content or ():
            if isinstance(item, TextContent):
                return item.text
        return None

    def _stamp(self, content: Content, index: int, status: RunStatus, delta: bool) -> Content:
        event = content.model_copy(deep=True)
        event.index = index
        event.msg_id = self.id
        event.delta = delta
        event.status = status
        event.sequence_number = None
        return event

    def add_delta_content(self, new_content: Content) -> Content:
        """Apply a streamed content item to this message (spec 003 "Key Methods").

        An item with ``index`` ``None``, or a delta whose ``index`` is the next
        free slot (as the first delta of a stream is), opens a new slot at the
        end of :attr:`content` holding the item. A delta with the ``index`` of an
        existing slot is a fragment merged into it as :func:`merge_delta` merges
        (text concatenates, data dicts merge).

        Returns:
            The event for the item: a copy stamped with its ``index``, this
            message's id as ``msg_id``, and status ``in_progress``.

        Raises:
            ValueError: the item has an ``index`` but is not a delta (use
                :meth:`add_content`), the slot does not exist or holds another
                content type, or the message would exceed :data:`MAX_CONTENT_ITEMS`
                items or a string would exceed :data:`MAX_TEXT_LENGTH` characters.
        """
        contents = self.content if self.content is not None else []
        delta = new_content.delta is True
        if new_content.index is None or (delta and new_content.index == len(contents)):
            if len(contents) >= MAX_CONTENT_ITEMS:
                raise ValueError(f"message {self.id}: more than {MAX_CONTENT_ITEMS} content items")
            stored = self._stamp(new_content, len(contents), RunStatus.InProgress, False)
            contents.append(stored)  # type: ignore[arg-type]
            self.content = contents
            return self._stamp(new_content, len(contents) - 1, RunStatus.InProgress, delta)
        if new_content.delta is not True:
            raise ValueError(
                f"message {self.id}: content at index {new_content.index} is not a delta; "
                "use add_content for a whole content item"
            )
        index = new_content.index
        if index >= len(contents):
            raise ValueError(f"message {self.id}: no content at index {index} to add a delta to")
        target = contents[index]
        if target.type != new_content.type:
            raise ValueError(
                f"message {self.id}: a {new_content.type} delta for the {target.type} content "
                f"at index {index}"
            )
        for name in new_content.payload_fields():
            value = getattr(new_content, name)
            if value is None:
                continue
            merged = (
                merge_delta(getattr(target, name), value)
                if name in target.DELTA_FIELDS
                else copy_json(value)
            )
            if isinstance(merged, str) and len(merged) > MAX_TEXT_LENGTH:
                raise ValueError(
                    f"message {self.id}: content {index}.{name} would exceed "
                    f"{MAX_TEXT_LENGTH} characters"
                )
            setattr(target, name, merged)
        return self._stamp(new_content, index, RunStatus.InProgress, True)

    def content_completed(self, content_index: int) -> Content:
        """The completed event of the content at ``content_index`` (spec 003 "Key Methods").

        Marks the stored item completed and returns a copy with ``delta`` false,
        its ``index``, this message's id and status ``completed``.

        Raises:
            IndexError: there is no content at that index.
        """
        contents = self.content or []
        if not 0 <= content_index < len(contents):
            raise IndexError(f"message {self.id}: no content at index {content_index}")
        contents[content_index].status = RunStatus.Completed
        return self._stamp(contents[content_index], content_index, RunStatus.Completed, False)

    def add_content(self, new_content: Content) -> Content:
        """Add a whole content item (spec 003 "Key Methods").

        With ``index`` ``None`` the item goes at the end; with an ``index`` it
        replaces the item there, or goes at the end when ``index`` is the length
        of :attr:`content`.

        Returns:
            The item's completed event: a copy with its ``index``, this message's
            id, ``delta`` false and status ``completed``.

        Raises:
            ValueError: the index leaves a gap, or the message would exceed
                :data:`MAX_CONTENT_ITEMS` items.
        """
        contents = self.content if self.content is not None else []
        index = len(contents) if new_content.index is None else new_content.index
        if index > len(contents):
            raise ValueError(
                f"message {self.id}: content index {index} leaves a gap "
                f"(the message has {len(contents)} items)"
            )
        if index == len(contents) and len(contents) >= MAX_CONTENT_ITEMS:
            raise ValueError(f"message {self.id}: more than {MAX_CONTENT_ITEMS} content items")
        stored = self._stamp(new_content, index, RunStatus.Completed, False)
        if index == len(contents):
            contents.append(stored)  # type: ignore[arg-type]
        else:
            contents[index] = stored  # type: ignore[call-overload]
        self.content = contents
        return self._stamp(new_content, index, RunStatus.Completed, False)


# --- tool calls and results, as a message's data ------------------------------------------------


class FunctionCall(WireModel):
    """A tool call the agent makes: the ``data`` of a ``function_call`` message's content."""

    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    """The arguments as JSON text, as the model produced them (not necessarily valid)."""


class FunctionCallOutput(WireModel):
    """A tool's result: the ``data`` of a ``function_call_output`` message's content."""

    call_id: str
    name: str | None = None
    output: str


# --- parsing --------------------------------------------------------------------------------------

_CONTENT_ADAPTER: TypeAdapter[AnyContent] = TypeAdapter(AnyContent)


def parse_content(data: bytes | bytearray | str | Mapping[str, Any]) -> AnyContent:
    """A content item from JSON or a dict, its model chosen by ``type``.

    Raises:
        InvalidEventError: the data is not JSON, or not a valid content item
            (an unknown ``type`` included).
    """
    obj = as_object(data, "content")
    try:
        return _CONTENT_ADAPTER.validate_python(obj)
    except ValidationError as e:
        raise InvalidEventError._from_validation("content", e, code="invalid_event") from None


def content_class(content_type: str) -> type[Content]:
    """The content model for a ``type`` such as ``"text"``.

    Raises:
        ValueError: the type is not one of :class:`ContentType`.
    """
    try:
        return _CONTENT_CLASSES[str(content_type)]
    except KeyError:
        known = ", ".join(repr(t.value) for t in ContentType)
        raise ValueError(
            f"unknown content type {content_type!r}: expected one of {known}"
        ) from None
