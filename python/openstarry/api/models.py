"""The Agent API's wire models (spec 003): requests, responses, messages and content.

The JSON these models read and write is wire-compatible with the AgentScope
Runtime schema that spec 003 documents: the same snake_case field names
(``msg_id``, ``session_id``, ``created_at``, ``sequence_number``, ``call_id``),
the same ``object`` values (``"response"``, ``"message"``, ``"content"``), the
same status strings and the same id prefixes (``response_``, ``msg_``).

Wire form:
    :meth:`WireModel.to_wire` (a JSON-ready ``dict``) and
    :meth:`WireModel.wire_json` (a JSON string) are the one way openstarry puts a
    model on the wire. Fields that are ``None`` are left out, so a streamed event
    is as compact as the spec's examples
    (``{"status":"created","id":"response_...","object":"response"}``); ``None``
    values *inside* a ``data`` or ``usage`` dict are kept. ``model_dump_json()``
    writes the same JSON with ``null`` for the absent fields; both parse back to
    the same model.

``sequence_number``:
    spec 003 types it ``str = None`` on the response; AgentScope Runtime and
    openstarry use an integer. openstarry always emits an ``int`` (counting from 0
    within one response stream) and, for compatibility, accepts a string of
    digits on input.

Unknown fields:
    ignored, as AgentScope Runtime does, so a client of a newer protocol revision
    still talks to openstarry. Everything openstarry does read is validated: an
    unknown content type, message type, role, status or tool type is refused, and
    so are values of the wrong JSON type (``"stream": "yes"``, ``"n": "3"``).

Tools:
    spec 003 types ``AgentRequest.tools`` as ``List[Union[Tool, Dict]]``; a bare
    dict would let any tool type through, so openstarry accepts :class:`Tool`
    objects only, and a ``type`` other than ``"function"`` is refused (a server
    answers 422).

Limits that protect a server: at most :data:`MAX_INPUT_MESSAGES` input messages,
:data:`MAX_CONTENT_ITEMS` content items per message, :data:`MAX_TOOLS` tools,
:data:`MAX_TEXT_LENGTH` characters in any one string of content, and
:data:`MAX_REQUEST_BYTES` bytes of request JSON for :func:`parse_request`.

The spec's example stream shows ``"type":"assistant"`` on a message: that is a
quirk of the spec's example; ``type`` is a :class:`MessageType`
(``"message"``), and ``"assistant"`` is the message's ``role``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from openstarry.errors import OpenStarryError

__all__ = [
    "MAX_CONTENT_ITEMS",
    "MAX_INPUT_MESSAGES",
    "MAX_REQUEST_BYTES",
    "MAX_TEXT_LENGTH",
    "MAX_TOOLS",
    "TERMINAL_STATUSES",
    "AgentRequest",
    "AgentResponse",
    "AnyContent",
    "AudioContent",
    "BaseRequest",
    "BaseResponse",
    "Content",
    "ContentType",
    "DataContent",
    "Error",
    "Event",
    "FileContent",
    "FunctionCall",
    "FunctionCallOutput",
    "FunctionParameters",
    "FunctionTool",
    "ImageContent",
    "InvalidEventError",
    "InvalidRequestError",
    "Message",
    "MessageType",
    "ProtocolError",
    "RefusalContent",
    "Role",
    "RunStatus",
    "StatusTransitionError",
    "TextContent",
    "Tool",
    "WireModel",
    "content_class",
    "merge_delta",
    "new_message_id",
    "new_response_id",
    "parse_content",
    "parse_event",
    "parse_request",
]

#: The most messages one request's ``input`` may hold.
MAX_INPUT_MESSAGES = 1_000
#: The most content items one message may hold.
MAX_CONTENT_ITEMS = 1_000
#: The most tools one request may declare.
MAX_TOOLS = 1_000
#: The most characters in one string of content (text, URL, base64 data): 8 MiB.
MAX_TEXT_LENGTH = 8 * 1024 * 1024
#: The most bytes of JSON :func:`parse_request` reads: 32 MiB.
MAX_REQUEST_BYTES = 32 * 1024 * 1024
#: The most validation problems an error message lists (the rest are counted).
_MAX_LISTED_ERRORS = 10
#: The most characters of an id or a name.
_MAX_ID_LENGTH = 1_024


# --- enums ----------------------------------------------------------------------------------------


class _WireEnum(str, Enum):
    """A string enum whose ``str()`` is its wire value."""

    def __str__(self) -> str:
        return str(self.value)


class Role(_WireEnum):
    """Who wrote a message."""

    ASSISTANT = "assistant"
    USER = "user"
    SYSTEM = "system"
    TOOL = "tool"


class MessageType(_WireEnum):
    """What a message carries."""

    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"
    PLUGIN_CALL = "plugin_call"
    PLUGIN_CALL_OUTPUT = "plugin_call_output"
    COMPONENT_CALL = "component_call"
    COMPONENT_CALL_OUTPUT = "component_call_output"
    MCP_LIST_TOOLS = "mcp_list_tools"
    MCP_APPROVAL_REQUEST = "mcp_approval_request"
    MCP_TOOL_CALL = "mcp_call"
    MCP_APPROVAL_RESPONSE = "mcp_approval_response"
    REASONING = "reasoning"
    HEARTBEAT = "heartbeat"
    ERROR = "error"


class RunStatus(_WireEnum):
    """The lifecycle status of a response, message or content (member names as in spec 003)."""

    Created = "created"
    InProgress = "in_progress"
    Completed = "completed"
    Canceled = "canceled"
    Failed = "failed"
    Rejected = "rejected"
    Unknown = "unknown"
    Queued = "queued"
    Incomplete = "incomplete"


class ContentType(_WireEnum):
    """The kind of a content item: the ``type`` that selects its model."""

    TEXT = "text"
    IMAGE = "image"
    DATA = "data"
    AUDIO = "audio"
    FILE = "file"
    REFUSAL = "refusal"


#: The statuses after which an object changes no more.
TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(
    {
        RunStatus.Completed,
        RunStatus.Failed,
        RunStatus.Canceled,
        RunStatus.Rejected,
        RunStatus.Incomplete,
    }
)

#: How far along the lifecycle a status is; a status never moves to a lower rank.
_STATUS_RANK: Mapping[RunStatus, int] = {
    RunStatus.Unknown: 0,
    RunStatus.Queued: 0,
    RunStatus.Created: 1,
    RunStatus.InProgress: 2,
    **dict.fromkeys(TERMINAL_STATUSES, 3),
}


def new_response_id() -> str:
    """A fresh response id: ``response_`` and a UUID."""
    return f"response_{uuid.uuid4()}"


def new_message_id() -> str:
    """A fresh message id: ``msg_`` and a UUID."""
    return f"msg_{uuid.uuid4()}"


# --- errors ---------------------------------------------------------------------------------------


class StatusTransitionError(OpenStarryError, ValueError):
    """An object was asked to move to a status its current status forbids.

    For instance ``completed`` after ``failed``, or ``created`` after ``in_progress``.
    """


class ProtocolError(OpenStarryError, ValueError):
    """JSON that is not a valid Agent API object.

    Attributes:
        code: A short machine-readable code: ``"invalid_json"`` (not JSON at all),
            ``"request_too_large"`` or ``"invalid_request"`` / ``"invalid_event"``
            (JSON that does not fit the schema).
        errors: One dict per problem, each with ``loc`` (the dotted path of the
            field, such as ``"input.0.content.0.type"``), ``msg`` and ``type``.
        http_status: The HTTP status a server answers with: 400 for invalid JSON,
            413 for a request too large, 422 for a schema violation.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        errors: list[dict[str, str]] | None = None,
        http_status: int = 422,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.errors: list[dict[str, str]] = errors or []
        self.http_status = http_status

    def to_error(self) -> Error:
        """The :class:`Error` body that reports this problem on the wire."""
        return Error(code=self.code, message=str(self))

    @classmethod
    def _from_validation(cls, what: str, err: ValidationError, *, code: str) -> ProtocolError:
        problems = [
            {
                "loc": ".".join(str(part) for part in e["loc"]) or "(root)",
                "msg": e["msg"],
                "type": e["type"],
            }
            for e in err.errors(include_url=False, include_input=False)
        ]
        if any(p["type"] == "json_invalid" for p in problems):
            code, status = "invalid_json", 400
        else:
            status = 422
        listed = "; ".join(f"{p['loc']}: {p['msg']}" for p in problems[:_MAX_LISTED_ERRORS])
        more = len(problems) - _MAX_LISTED_ERRORS
        if more > 0:
            listed += f"; and {more} more"
        noun = "problem" if len(problems) == 1 else "problems"
        return cls(
            f"invalid {what} ({len(problems)} {noun}): {listed}",
            code=code,
            errors=problems,
            http_status=status,
        )


class InvalidRequestError(ProtocolError):
    """A request body that is not a valid :class:`AgentRequest` (see :func:`parse_request`)."""


class InvalidEventError(ProtocolError):
    """A streamed event that is not a valid response, message or content (:func:`parse_event`)."""


# --- the shared base ------------------------------------------------------------------------------


class WireModel(BaseModel):
    """The base of every Agent API model: strict about what it reads, compact on the wire."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict of this model as it goes on the wire (``None`` fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    def wire_json(self) -> str:
        """The JSON text of this model as it goes on the wire (``None`` fields left out)."""
        return self.model_dump_json(exclude_none=True)


_E = TypeVar("_E", bound="Event")

_Id = Annotated[str, Field(min_length=1, max_length=_MAX_ID_LENGTH)]
#: The longest ``session_id`` of a request.
MAX_SESSION_ID_LENGTH = 128
#: A request's ``session_id``: 1 to 128 ASCII letters, digits, ``_``, ``-``, ``.``,
#: ``:`` or ``@`` (it goes into logs, events and headers: no spaces, no control characters).
_SessionId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_SESSION_ID_LENGTH, pattern=r"^[A-Za-z0-9_.:@-]+$"),
]
_Text = Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]


# --- tools ----------------------------------------------------------------------------------------


class FunctionParameters(WireModel):
    """The JSON Schema of a function's arguments; its ``type`` must be ``"object"``."""

    type: Literal["object"] = "object"
    properties: dict[str, Any] = Field(default_factory=dict)
    required: list[str] | None = None


class FunctionTool(WireModel):
    """A function a client offers the agent: a name, what it does, its parameters."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: _Text
    parameters: FunctionParameters | dict[str, Any] = Field(default_factory=FunctionParameters)


class Tool(WireModel):
    """A tool declared in a request. Only ``"function"`` tools exist; any other type is refused."""

    type: Literal["function"] = "function"
    function: FunctionTool

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        if value is None:
            return "function"
        if value != "function":
            raise PydanticCustomError(
                "tool_type",
                "unknown tool type {value}: openstarry supports only 'function'",
                {"value": repr(value)},
            )
        return value


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


class Error(WireModel):
    """An error on the wire: a short machine-readable ``code`` and a human ``message``."""

    code: str
    message: str


# --- events ---------------------------------------------------------------------------------------


class Event(WireModel):
    """What every streamed object is: a response, a message or a content item.

    The status helpers move :attr:`status` forward and return ``self``. A status
    never moves back (``created`` after ``in_progress``) and never leaves a
    terminal status (:data:`TERMINAL_STATUSES`): both raise
    :class:`StatusTransitionError`. Setting the current non-terminal status again
    is allowed.
    """

    sequence_number: Annotated[int, Field(ge=0)] | None = None
    """The event's place in its stream, from 0 (``None`` outside a stream)."""
    object: str
    status: RunStatus | None = None
    error: Error | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether :attr:`status` is terminal."""
        return self.status in TERMINAL_STATUSES

    def _move_to(self, status: RunStatus) -> None:
        current = self.status
        if current is not None and (
            current in TERMINAL_STATUSES or _STATUS_RANK[status] < _STATUS_RANK[current]
        ):
            raise StatusTransitionError(
                f"{self._describe()}: cannot move from {current.value!r} to {status.value!r}"
            )
        self.status = status

    def _describe(self) -> str:
        ident = getattr(self, "id", None)
        return f"{self.object} {ident}" if ident else self.object

    def created(self: _E) -> _E:
        """Set the status to ``created``; returns ``self``."""
        self._move_to(RunStatus.Created)
        return self

    def in_progress(self: _E) -> _E:
        """Set the status to ``in_progress``; returns ``self``."""
        self._move_to(RunStatus.InProgress)
        return self

    def completed(self: _E) -> _E:
        """Set the status to ``completed``; returns ``self``."""
        self._move_to(RunStatus.Completed)
        return self

    def failed(self: _E, error: Error) -> _E:
        """Set the status to ``failed`` and record ``error``; returns ``self``."""
        self._move_to(RunStatus.Failed)
        self.error = error
        return self

    def rejected(self: _E) -> _E:
        """Set the status to ``rejected``; returns ``self``."""
        self._move_to(RunStatus.Rejected)
        return self

    def canceled(self: _E) -> _E:
        """Set the status to ``canceled``; returns ``self``."""
        self._move_to(RunStatus.Canceled)
        return self


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
    text: _Text | None = None


class ImageContent(Content):
    """An image, by URL (``https:`` or a ``data:`` URL)."""

    DELTA_FIELDS = ("image_url",)
    type: Literal["image"] = "image"
    image_url: _Text | None = None


class DataContent(Content):
    """Structured data: a JSON object (tool calls and results travel as data)."""

    DELTA_FIELDS = ("data",)
    type: Literal["data"] = "data"
    data: dict[str, Any] | None = None


class AudioContent(Content):
    """Audio: base64 ``data`` in a ``format`` such as ``"mp3"`` or ``"wav"``."""

    DELTA_FIELDS = ("data",)
    type: Literal["audio"] = "audio"
    data: _Text | None = None
    format: Annotated[str, Field(max_length=64)] | None = None


class FileContent(Content):
    """A file: by URL, by id, or inline as base64 ``file_data``."""

    DELTA_FIELDS = ("file_data",)
    type: Literal["file"] = "file"
    file_url: _Text | None = None
    file_id: Annotated[str, Field(max_length=_MAX_ID_LENGTH)] | None = None
    filename: Annotated[str, Field(max_length=_MAX_ID_LENGTH)] | None = None
    file_data: _Text | None = None


class RefusalContent(Content):
    """The agent's refusal to do what was asked, and why."""

    DELTA_FIELDS = ("refusal",)
    type: Literal["refusal"] = "refusal"
    refusal: _Text | None = None


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


def _copy_json(value: Any) -> Any:
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
        return _copy_json(base)
    if base is None:
        return _copy_json(delta)
    if isinstance(base, str) and isinstance(delta, str):
        return base + delta
    if isinstance(base, list) and isinstance(delta, list):
        merged_list: list[Any] = _copy_json(base)
        merged_list.extend(_copy_json(delta))
        return merged_list
    if not (isinstance(base, dict) and isinstance(delta, dict)):
        return _copy_json(delta)
    result: dict[Any, Any] = _copy_json(base)
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
                old.extend(_copy_json(value))
            else:
                target[key] = _copy_json(value)
    return result


# --- messages -------------------------------------------------------------------------------------


class Message(Event):
    """A message: a user's input, or something the agent produced.

    ``type`` says what it carries: ``"message"`` (text and other content),
    ``"function_call"`` (a :class:`DataContent` whose data is a
    :class:`FunctionCall`), ``"function_call_output"`` (data that is a
    :class:`FunctionCallOutput`), ``"error"`` (``code`` and ``message`` set), ...
    """

    id: _Id = Field(default_factory=new_message_id)
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
                else _copy_json(value)
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


# --- requests -------------------------------------------------------------------------------------


class BaseRequest(WireModel):
    """What a client sends: input messages, and whether to stream the answer."""

    input: Annotated[list[Message], Field(min_length=1, max_length=MAX_INPUT_MESSAGES)]
    stream: StrictBool = True
    id: Annotated[str, Field(max_length=_MAX_ID_LENGTH)] | None = None


class AgentRequest(BaseRequest):
    """A request to run the agent (``POST /process``).

    ``n`` must lie in 1..5. ``session_id`` carries a conversation across
    requests. Generation parameters are passed on to the agent's provider where
    it supports them.
    """

    model: Annotated[str, Field(max_length=256)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2, strict=True)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2, strict=True)] | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=5)] | None = 1
    seed: StrictInt | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    session_id: _SessionId | None = None
    response_id: _Id | None = None


# --- responses ------------------------------------------------------------------------------------


class BaseResponse(Event):
    """A response: the run's status, and when complete its ``output`` and ``usage``."""

    id: _Id = Field(default_factory=new_response_id)
    object: Literal["response"] = "response"
    status: RunStatus | None = RunStatus.Created
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    output: list[Message] | None = None
    usage: dict[str, Any] | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _fresh_id_for_none(cls, value: Any) -> Any:
        return new_response_id() if value is None else value

    def add_new_message(self, message: Message) -> None:
        """Append ``message`` to :attr:`output`."""
        self.output = [*(self.output or []), message]


class AgentResponse(BaseResponse):
    """The agent's response; ``session_id`` names the conversation it belongs to.

    ``metadata`` (openstarry's, absent when empty) says what the client should
    know beyond the spec's fields: on an ``incomplete`` response the calls it
    waits for (``{"waiting_for": {"function_call": [call ids],
    "mcp_approval_request": [approval ids]}}``), and the generation
    parameters the provider could not use (``"dropped_parameters"``).
    """

    session_id: str | None = None
    metadata: dict[str, Any] | None = None


# --- parsing --------------------------------------------------------------------------------------

_CONTENT_ADAPTER: TypeAdapter[AnyContent] = TypeAdapter(AnyContent)


def parse_request(data: bytes | bytearray | str | Mapping[str, Any]) -> AgentRequest:
    """An :class:`AgentRequest` from a request body (JSON bytes or text) or a parsed dict.

    Raises:
        InvalidRequestError: the body is larger than :data:`MAX_REQUEST_BYTES`
            (``code`` ``"request_too_large"``), is not JSON (``"invalid_json"``), or
            does not fit the schema (``"invalid_request"``); the message lists
            each problem with its field path.
    """
    if isinstance(data, (bytes, bytearray, str)):
        size = len(data) if not isinstance(data, str) else len(data.encode("utf-8", "replace"))
        if size > MAX_REQUEST_BYTES:
            raise InvalidRequestError(
                f"request of {size} bytes is larger than the limit of {MAX_REQUEST_BYTES} bytes",
                code="request_too_large",
                http_status=413,
            )
        try:
            return AgentRequest.model_validate_json(data)
        except ValidationError as e:
            raise InvalidRequestError._from_validation(
                "request", e, code="invalid_request"
            ) from None
    if isinstance(data, Mapping):
        try:
            return AgentRequest.model_validate(dict(data))
        except ValidationError as e:
            raise InvalidRequestError._from_validation(
                "request", e, code="invalid_request"
            ) from None
    raise InvalidRequestError(
        f"a request must be a JSON object, not {type(data).__name__}",
        code="invalid_request",
        errors=[{"loc": "(root)", "msg": "not a JSON object", "type": "model_type"}],
    )


def _as_object(data: bytes | bytearray | str | Mapping[str, Any], what: str) -> dict[str, Any]:
    if isinstance(data, Mapping):
        return dict(data)
    try:
        parsed = json.loads(data)
    except ValueError as e:
        raise InvalidEventError(
            f"invalid {what}: not JSON: {e}",
            code="invalid_json",
            errors=[{"loc": "(root)", "msg": str(e), "type": "json_invalid"}],
            http_status=400,
        ) from None
    if not isinstance(parsed, dict):
        raise InvalidEventError(
            f"invalid {what}: a JSON object is needed, not {type(parsed).__name__}",
            code="invalid_event",
            errors=[{"loc": "(root)", "msg": "not a JSON object", "type": "model_type"}],
        )
    return parsed


def parse_content(data: bytes | bytearray | str | Mapping[str, Any]) -> AnyContent:
    """A content item from JSON or a dict, its model chosen by ``type``.

    Raises:
        InvalidEventError: the data is not JSON, or not a valid content item
            (an unknown ``type`` included).
    """
    obj = _as_object(data, "content")
    try:
        return _CONTENT_ADAPTER.validate_python(obj)
    except ValidationError as e:
        raise InvalidEventError._from_validation("content", e, code="invalid_event") from None


def parse_event(
    data: bytes | bytearray | str | Mapping[str, Any],
) -> AgentResponse | Message | AnyContent:
    """One streamed event (an SSE ``data:`` line) as its model, chosen by ``object``.

    ``"response"`` gives an :class:`AgentResponse`, ``"message"`` a
    :class:`Message`, ``"content"`` the content model its ``type`` names.

    Raises:
        InvalidEventError: the data is not JSON, its ``object`` is missing or
            unknown, or it does not fit its model.
    """
    obj = _as_object(data, "event")
    kind = obj.get("object")
    model: type[AgentResponse] | type[Message]
    if kind == "content":
        return parse_content(obj)
    if kind == "response":
        model = AgentResponse
    elif kind == "message":
        model = Message
    else:
        raise InvalidEventError(
            f"invalid event: 'object' must be 'response', 'message' or 'content', not {kind!r}",
            code="invalid_event",
            errors=[{"loc": "object", "msg": "unknown object", "type": "literal_error"}],
        )
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise InvalidEventError._from_validation("event", e, code="invalid_event") from None


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
