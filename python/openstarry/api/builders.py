"""Builders that produce a response's event stream (spec 003, "Agent API Protocol Builder").

Three layers, as in AgentScope Runtime's ``agent_api_builder``: a
:class:`ResponseBuilder` makes :class:`MessageBuilder` objects, which make
:class:`ContentBuilder` objects. Unlike AgentScope's, every method that produces
a wire event **returns that event** as a snapshot, a model of its own that later
calls never change, ready for :meth:`~openstarry.api.models.WireModel.wire_json`.

Numbering:
    one counter per :class:`ResponseBuilder` numbers every event the response,
    its messages and their content emit: ``sequence_number`` 0, 1, 2, ... in the
    order the methods are called. Methods that produce no event (creating a
    builder, :meth:`ResponseBuilder.set_usage`, :meth:`MessageBuilder.set_error`)
    take no number.

Status order (a wrong call raises :class:`BuilderStateError`, a ``ValueError``
that names the object and the transition, and changes nothing):

- a response: :meth:`~ResponseBuilder.created` first, then optionally
  :meth:`~ResponseBuilder.in_progress`, then :meth:`~ResponseBuilder.completed`;
  :meth:`~ResponseBuilder.failed` or :meth:`~ResponseBuilder.canceled` from
  ``created`` or ``in_progress``. Each status is emitted once; nothing follows a
  terminal status. Messages are created once the response is created.
- a message: :meth:`~MessageBuilder.created` before any of its content's events,
  then optionally :meth:`~MessageBuilder.in_progress`, then
  :meth:`~MessageBuilder.complete` (or ``failed`` / ``canceled``).
- a content item has no ``created`` event (spec 003's example stream shows
  none): its first delta or ``set_*`` makes it ``in_progress``, and
  :meth:`~ContentBuilder.complete` ends it. A delta after ``complete`` is refused.
- completing a message while one of its content items is started but not
  complete is refused (complete the content first, or fail / cancel the
  message); likewise completing a response while one of its messages is
  started but not finished. ``failed`` and ``canceled`` are always allowed from
  a non-terminal status: the unfinished children are abandoned, and any later
  call on them is refused. A builder that never emitted an event does not hold
  its parent open.

Merging: on completion a content item's deltas merge as
:func:`~openstarry.api.models.merge_delta` merges: strings concatenate, lists
extend, dicts merge recursively; a ``set_*`` call replaces the value so far. A
completed content item goes into its message's ``content`` at its ``index``
(the list is ordered by index); a finished message goes into the response's
``output`` (in the order the messages were created).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from openstarry.api.messages import copy_json
from openstarry.api.models import (
    MAX_CONTENT_ITEMS,
    MAX_TEXT_LENGTH,
    TERMINAL_STATUSES,
    AgentResponse,
    AudioContent,
    Content,
    ContentType,
    DataContent,
    Error,
    FileContent,
    ImageContent,
    Message,
    MessageType,
    RefusalContent,
    Role,
    RunStatus,
    StatusTransitionError,
    TextContent,
    content_class,
    merge_delta,
    new_message_id,
    new_response_id,
)

__all__ = ["BuilderStateError", "ContentBuilder", "MessageBuilder", "ResponseBuilder"]


class BuilderStateError(StatusTransitionError):
    """A builder method called out of order: the message names the object and the transition.

    For instance ``"message msg_1: cannot move from 'completed' to 'in_progress'"``
    or ``"content 0 of message msg_1: add_text_delta after complete"``.
    """


#: The statuses a response or a message may move to from each status (``None``: nothing emitted).
_ENDS = frozenset(
    {
        RunStatus.Completed,
        RunStatus.Failed,
        RunStatus.Canceled,
        RunStatus.Incomplete,
        RunStatus.Rejected,
    }
)
_NEXT: Mapping[RunStatus | None, frozenset[RunStatus]] = {
    None: frozenset({RunStatus.Created}),
    RunStatus.Created: frozenset({RunStatus.InProgress, *_ENDS}),
    RunStatus.InProgress: _ENDS,
}


def _name(status: RunStatus | None) -> str:
    return "(nothing emitted)" if status is None else repr(status.value)


def _check_move(what: str, current: RunStatus | None, target: RunStatus) -> None:
    if target not in _NEXT.get(current, frozenset()):
        raise BuilderStateError(f"{what}: cannot move from {_name(current)} to {target.value!r}")


def _as_error(error: Error | Mapping[str, Any]) -> Error:
    return error if isinstance(error, Error) else Error.model_validate(dict(error))


def _as_dict(what: str, action: str, data: Any) -> dict[str, Any]:
    """``data`` as a new dict; a :class:`TypeError` naming ``what`` and ``action`` otherwise."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{what}: {action} needs a dict, not {type(data).__name__}")
    return dict(data)


def _text_length(what: str, length: int) -> int:
    """``length``, if within :data:`MAX_TEXT_LENGTH`; else a ``ValueError`` naming ``what``."""
    if length > MAX_TEXT_LENGTH:
        raise ValueError(f"{what}: the text would exceed {MAX_TEXT_LENGTH} characters")
    return length


class ResponseBuilder:
    """Builds one response and numbers every event of its stream.

    Args:
        session_id: The conversation the response belongs to; carried on every
            response event.
        response_id: The response's id; a fresh ``response_...`` id when ``None``.
    """

    def __init__(self, session_id: str | None = None, response_id: str | None = None) -> None:
        self.session_id = session_id
        self.response_id = response_id or new_response_id()
        self.created_at = int(time.time())
        self.completed_at: int | None = None
        self._status: RunStatus | None = None
        self._next_number = 0
        self._messages: list[MessageBuilder] = []
        self._usage: dict[str, Any] | None = None
        self._error: Error | None = None
        #: The response's ``metadata`` (openstarry's), in every event that follows.
        self.metadata: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<ResponseBuilder {self.response_id} status={_name(self._status)}>"

    @property
    def status(self) -> RunStatus | None:
        """The status of the last response event, or ``None`` before :meth:`created`."""
        return self._status

    @property
    def message_builders(self) -> tuple[MessageBuilder, ...]:
        """The message builders made so far, in order."""
        return tuple(self._messages)

    @property
    def next_sequence_number(self) -> int:
        """The ``sequence_number`` the next event will get."""
        return self._next_number

    def _describe(self) -> str:
        return f"response {self.response_id}"

    def _take_number(self) -> int:
        number = self._next_number
        self._next_number += 1
        return number

    def _check_live(self, what: str, action: str) -> None:
        """Refuse ``action`` on ``what`` unless this response is created and not terminal."""
        if self._status is None:
            raise BuilderStateError(
                f"{what}: cannot {action} before response {self.response_id} is created"
            )
        if self._status in TERMINAL_STATUSES:
            raise BuilderStateError(
                f"{what}: cannot {action} after response {self.response_id} is "
                f"{self._status.value!r}"
            )

    def snapshot(self) -> AgentResponse:
        """The response as it stands, without a ``sequence_number`` (takes no number).

        ``output`` holds the finished messages, or is ``None`` while there is none
        and the response is not terminal.
        """
        output = [m._final.model_copy(deep=True) for m in self._messages if m._final is not None]
        terminal = self._status in TERMINAL_STATUSES
        return AgentResponse(
            id=self.response_id,
            session_id=self.session_id,
            status=self._status or RunStatus.Created,
            created_at=self.created_at,
            completed_at=self.completed_at,
            error=self._error.model_copy() if self._error is not None else None,
            output=output if output or terminal else None,
            usage=copy_json(self._usage),
            metadata=copy_json(self.metadata) if self.metadata else None,
        )

    def _move(self, target: RunStatus, error: Error | None = None) -> AgentResponse:
        _check_move(self._describe(), self._status, target)
        if target is RunStatus.Completed:
            open_ids = [m.id for m in self._messages if m._is_open()]
            if open_ids:
                raise BuilderStateError(
                    f"{self._describe()}: cannot move from {_name(self._status)} to 'completed' "
                    f"while message(s) {', '.join(open_ids)} are not finished"
                )
        self._status = target
        if error is not None:
            self._error = error
        if target in TERMINAL_STATUSES:
            self.completed_at = int(time.time())
        event = self.snapshot()
        event.sequence_number = self._take_number()
        return event

    def created(self) -> AgentResponse:
        """The response's ``created`` event: the first event of the stream."""
        return self._move(RunStatus.Created)

    def in_progress(self) -> AgentResponse:
        """The response's ``in_progress`` event."""
        return self._move(RunStatus.InProgress)

    def completed(self) -> AgentResponse:
        """The response's ``completed`` event, with its ``output`` and ``usage``.

        Raises:
            BuilderStateError: the response is not created or in progress, or a
                started message is not finished.
        """
        return self._move(RunStatus.Completed)

    def failed(self, error: Error | Mapping[str, Any]) -> AgentResponse:
        """The response's ``failed`` event, carrying ``error`` (an :class:`Error` or its dict)."""
        return self._move(RunStatus.Failed, _as_error(error))

    def canceled(self) -> AgentResponse:
        """The response's ``canceled`` event."""
        return self._move(RunStatus.Canceled)

    def end(
        self, status: RunStatus, error: Error | Mapping[str, Any] | None = None
    ) -> AgentResponse:
        """The response's terminal event of any terminal status (``incomplete``, ``rejected``).

        Raises:
            BuilderStateError: ``status`` is not terminal, or the response cannot move to it.
        """
        if status not in TERMINAL_STATUSES:
            raise BuilderStateError(
                f"{self._describe()}: {status.value!r} is not a terminal status"
            )
        return self._move(status, _as_error(error) if error is not None else None)

    def set_usage(self, usage: Mapping[str, Any]) -> None:
        """Merge ``usage`` into the response's ``usage`` (emits no event).

        Merging is :func:`~openstarry.api.models.merge_delta`'s: nested dicts merge,
        strings concatenate, lists extend, numbers are replaced (pass totals).

        Raises:
            BuilderStateError: the response is already terminal (the usage could
                no longer be sent).
        """
        if self._status in TERMINAL_STATUSES:
            raise BuilderStateError(
                f"{self._describe()}: cannot set usage after {_name(self._status)}"
            )
        self._usage = merge_delta(self._usage, dict(usage))

    def create_message_builder(
        self, role: Role | str = Role.ASSISTANT, message_type: MessageType | str = "message"
    ) -> MessageBuilder:
        """A builder for a new message of this response (emits no event: call its ``created``).

        Raises:
            BuilderStateError: the response is not created yet, or is terminal.
            ValueError: ``role`` or ``message_type`` is unknown.
        """
        self._check_live(self._describe(), "create a message")
        builder = MessageBuilder(self, role=role, message_type=message_type)
        self._messages.append(builder)
        return builder

    def generate_streaming_response(
        self, text_tokens: Iterable[str], role: Role | str = Role.ASSISTANT
    ) -> Iterator[AgentResponse | Message | Content]:
        """The whole event sequence of a one-message text answer, spec 003 section 4.

        Response ``created`` and ``in_progress``, message ``created``, one text
        delta per token, the completed text content, the completed message, the
        completed response.

        Raises:
            BuilderStateError: this builder has already emitted events (raised
                here, before iteration starts).
        """
        if self._status is not None:
            raise BuilderStateError(
                f"{self._describe()}: generate_streaming_response needs a fresh builder, "
                f"this one is {_name(self._status)}"
            )
        message = MessageBuilder(self, role=role, message_type=MessageType.MESSAGE)
        return self._stream(message, text_tokens)

    def _stream(
        self, message: MessageBuilder, text_tokens: Iterable[str]
    ) -> Iterator[AgentResponse | Message | Content]:
        yield self.created()
        yield self.in_progress()
        self._messages.append(message)
        yield message.created()
        content = message.create_content_builder(ContentType.TEXT)
        for token in text_tokens:
            yield content.add_text_delta(token)
        yield content.complete()
        yield message.complete()
        yield self.completed()


class MessageBuilder:
    """Builds one message of a response; made by :meth:`ResponseBuilder.create_message_builder`."""

    def __init__(
        self,
        response_builder: ResponseBuilder,
        role: Role | str = Role.ASSISTANT,
        message_type: MessageType | str = MessageType.MESSAGE,
    ) -> None:
        self.response_builder = response_builder
        self.role = Role(role)
        self.message_type = MessageType(message_type)
        self.id = new_message_id()
        self._status: RunStatus | None = None
        self._contents: dict[int, Content] = {}
        self._builders: list[ContentBuilder] = []
        self._code: str | None = None
        self._message: str | None = None
        self._error: Error | None = None
        self._final: Message | None = None
        #: The message's ``metadata`` (such as ``{"choice": 1}`` when ``n`` > 1).
        self.metadata: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<MessageBuilder {self.id} {self.message_type.value} status={_name(self._status)}>"

    @property
    def status(self) -> RunStatus | None:
        """The status of the last message event, or ``None`` before :meth:`created`."""
        return self._status

    @property
    def content_builders(self) -> tuple[ContentBuilder, ...]:
        """The content builders made so far, in order."""
        return tuple(self._builders)

    def _describe(self) -> str:
        return f"message {self.id}"

    def _is_open(self) -> bool:
        return self._status is not None and self._status not in TERMINAL_STATUSES

    def _check_writable(self, what: str, action: str) -> None:
        """Refuse ``action`` on ``what`` unless this message is created and not terminal."""
        self.response_builder._check_live(what, action)
        if self._status is None:
            raise BuilderStateError(f"{what}: cannot {action} before {self._describe()} is created")
        if self._status in TERMINAL_STATUSES:
            raise BuilderStateError(
                f"{what}: cannot {action} after {self._describe()} is {self._status.value!r}"
            )

    def snapshot(self) -> Message:
        """The message as it stands, without a ``sequence_number`` (takes no number).

        ``content`` holds the completed content items ordered by index, or is
        ``None`` while there is none and the message is not terminal.
        """
        items = [self._contents[i].model_copy(deep=True) for i in sorted(self._contents)]
        terminal = self._status in TERMINAL_STATUSES
        return Message(
            id=self.id,
            type=self.message_type,
            role=self.role,
            status=self._status or RunStatus.Created,
            content=items if items or terminal else None,  # type: ignore[arg-type]
            code=self._code,
            message=self._message,
            error=self._error.model_copy() if self._error is not None else None,
            metadata=copy_json(self.metadata) if self.metadata else None,
        )

    def _move(self, target: RunStatus, error: Error | None = None) -> Message:
        what = self._describe()
        self.response_builder._check_live(what, f"move to {target.value!r}")
        _check_move(what, self._status, target)
        if target is RunStatus.Completed:
            # Started and not complete: a content that never emitted holds nothing open.
            open_indexes = [
                str(b.index) for b in self._builders if b.status is RunStatus.InProgress
            ]
            if open_indexes:
                raise BuilderStateError(
                    f"{what}: cannot move from {_name(self._status)} to 'completed' while "
                    f"content {', '.join(open_indexes)} is not complete"
                )
        self._status = target
        if error is not None:
            self._error = error
        event = self.snapshot()
        if target in TERMINAL_STATUSES:
            self._final = event.model_copy(deep=True)
        event.sequence_number = self.response_builder._take_number()
        return event

    def created(self) -> Message:
        """The message's ``created`` event; must precede its content's events."""
        return self._move(RunStatus.Created)

    def in_progress(self) -> Message:
        """The message's ``in_progress`` event (optional)."""
        return self._move(RunStatus.InProgress)

    def complete(self) -> Message:
        """The message's ``completed`` event, with its completed content; it joins the output.

        Raises:
            BuilderStateError: the message is not created or in progress, its
                response is terminal, or a started content item is not complete.
        """
        return self._move(RunStatus.Completed)

    completed = complete

    def failed(self, error: Error | Mapping[str, Any]) -> Message:
        """The message's ``failed`` event, carrying ``error``; it joins the output."""
        return self._move(RunStatus.Failed, _as_error(error))

    def canceled(self) -> Message:
        """The message's ``canceled`` event; it joins the output."""
        return self._move(RunStatus.Canceled)

    def set_error(self, code: str, message: str) -> None:
        """Set the ``code`` and ``message`` an ``error`` message carries (emits no event).

        Raises:
            BuilderStateError: the message is terminal.
            TypeError: ``code`` or ``message`` is not a string (checked here:
                found only at :meth:`complete`, it would leave the message
                completed without an event).
        """
        if self._status in TERMINAL_STATUSES:
            raise BuilderStateError(
                f"{self._describe()}: cannot set the error after {_name(self._status)}"
            )
        if not isinstance(code, str) or not isinstance(message, str):
            raise TypeError(
                f"{self._describe()}: set_error needs a str code and message, not "
                f"{type(code).__name__} and {type(message).__name__}"
            )
        self._code, self._message = code, message

    def _used_indexes(self) -> set[int]:
        return {b.index for b in self._builders} | set(self._contents)

    def create_content_builder(
        self, content_type: ContentType | str = ContentType.TEXT, index: int | None = None
    ) -> ContentBuilder:
        """A builder for a content item of this message (emits no event).

        Args:
            content_type: One of :class:`~openstarry.api.models.ContentType`.
            index: Its slot in the message's ``content``; by default the slot
                after the highest one used so far.

        Raises:
            BuilderStateError: the message or its response is terminal, or
                ``index`` is taken or out of range.
            ValueError: ``content_type`` is unknown.
        """
        if self._status in TERMINAL_STATUSES:
            raise BuilderStateError(
                f"{self._describe()}: cannot create content after {_name(self._status)}"
            )
        self.response_builder._check_live(self._describe(), "create content")
        index = self._claim_index(index)
        builder = ContentBuilder(self, content_type, index)
        self._builders.append(builder)
        return builder

    def _claim_index(self, index: int | None) -> int:
        used = self._used_indexes()
        if index is None:
            index = max(used) + 1 if used else 0
        if isinstance(index, bool) or not isinstance(index, int):
            raise BuilderStateError(
                f"{self._describe()}: a content index must be an int, not {type(index).__name__}"
            )
        if not 0 <= index < MAX_CONTENT_ITEMS:
            raise BuilderStateError(
                f"{self._describe()}: content index {index} is outside 0..{MAX_CONTENT_ITEMS - 1}"
            )
        if index in used:
            raise BuilderStateError(f"{self._describe()}: content index {index} is already used")
        return index

    def add_content(self, content: Content) -> Content:
        """Add a whole content item at its ``index`` (or the next free slot); its completed event.

        The returned event is a copy stamped with this message's id, the index,
        ``delta`` false and status ``completed``; ``content`` itself is not changed.

        Raises:
            BuilderStateError: the message is not created, or is terminal, or the
                index is taken.
        """
        self._check_writable(self._describe(), "add content")
        index = self._claim_index(content.index)
        stored = content.model_copy(deep=True)
        stored.index, stored.msg_id, stored.delta = index, self.id, False
        stored.status, stored.sequence_number = RunStatus.Completed, None
        self._contents[index] = stored
        event = stored.model_copy(deep=True)
        event.sequence_number = self.response_builder._take_number()
        return event

    def _store(self, index: int, content: Content) -> None:
        self._contents[index] = content


class ContentBuilder:
    """Builds one content item; made by :meth:`MessageBuilder.create_content_builder`."""

    def __init__(
        self,
        message_builder: MessageBuilder,
        content_type: ContentType | str = ContentType.TEXT,
        index: int = 0,
    ) -> None:
        self.message_builder = message_builder
        self._cls = content_class(str(content_type))
        self.content_type = ContentType(str(content_type))
        self.index = index
        self._status: RunStatus | None = None
        self._text_parts: list[str] = []
        self._text_length = 0
        self._value: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (
            f"<ContentBuilder {self.content_type.value} {self.index} of "
            f"{self.message_builder.id} status={_name(self._status)}>"
        )

    @property
    def msg_id(self) -> str:
        """The id of the message this content belongs to."""
        return self.message_builder.id

    @property
    def status(self) -> RunStatus | None:
        """``None`` before the first event, then ``in_progress``, then ``completed``."""
        return self._status

    def _describe(self) -> str:
        return f"content {self.index} of message {self.message_builder.id}"

    def _check(self, action: str, needs: ContentType | None = None) -> str:
        """Refuse ``action`` unless it fits this content and its status; this content's name."""
        what = self._describe()
        if needs is not None and self.content_type is not needs:
            raise BuilderStateError(
                f"{what}: {action} needs a {needs.value} content, this one is "
                f"{self.content_type.value}"
            )
        if self._status is RunStatus.Completed:
            raise BuilderStateError(f"{what}: {action} after complete")
        self.message_builder._check_writable(what, action)
        return what

    def _emit(self, delta: bool, payload: Mapping[str, Any]) -> Content:
        """A numbered ``in_progress`` event carrying ``payload`` (validated before numbering)."""
        event = self._cls(
            index=self.index,
            msg_id=self.message_builder.id,
            delta=delta,
            status=RunStatus.InProgress,
            **copy_json(dict(payload)),
        )
        event.sequence_number = self.message_builder.response_builder._take_number()
        self._status = RunStatus.InProgress
        return event

    def _current(self) -> dict[str, Any]:
        payload = dict(self._value)
        if self.content_type is ContentType.TEXT:
            payload["text"] = "".join(self._text_parts)
            self._text_parts = [payload["text"]]
        return payload

    def _set(self, action: str, needs: ContentType, **fields: Any) -> Content:
        self._check(action, needs)
        value = {**self._value, **{k: v for k, v in fields.items() if v is not None}}
        event = self._emit(False, value)
        self._value = copy_json(value)
        return event

    def add_text_delta(self, text: str) -> TextContent:
        """A text fragment: the ``in_progress`` delta event carrying just ``text``."""
        what = self._check("add_text_delta", ContentType.TEXT)
        length = _text_length(what, self._text_length + len(text))
        event = self._emit(True, {"text": text})
        self._text_parts.append(text)
        self._text_length = length
        assert isinstance(event, TextContent)
        return event

    add_delta = add_text_delta

    def set_text(self, text: str) -> TextContent:
        """Replace the text so far; the ``in_progress`` event with the whole text, not a delta."""
        what = self._check("set_text", ContentType.TEXT)
        length = _text_length(what, len(text))
        event = self._emit(False, {"text": text})
        self._text_parts = [text]
        self._text_length = length
        assert isinstance(event, TextContent)
        return event

    def set_image_url(self, image_url: str) -> ImageContent:
        """Set the image URL; the ``in_progress`` event with it."""
        event = self._set("set_image_url", ContentType.IMAGE, image_url=image_url)
        assert isinstance(event, ImageContent)
        return event

    def set_data(self, data: Mapping[str, Any]) -> DataContent:
        """Replace the data so far; the ``in_progress`` event with the whole data."""
        what = self._check("set_data", ContentType.DATA)
        value = _as_dict(what, "set_data", data)
        event = self._emit(False, {"data": value})
        self._value["data"] = copy_json(value)
        assert isinstance(event, DataContent)
        return event

    def add_data_delta(self, delta_data: Mapping[str, Any]) -> DataContent:
        """A data fragment, merged into the data so far; the delta event carrying just it."""
        what = self._check("add_data_delta", ContentType.DATA)
        delta = _as_dict(what, "add_data_delta", delta_data)
        merged = merge_delta(self._value.get("data"), delta)
        event = self._emit(True, {"data": delta})
        self._value["data"] = merged
        assert isinstance(event, DataContent)
        return event

    def set_refusal(self, refusal: str) -> RefusalContent:
        """Set the refusal text; the ``in_progress`` event with it."""
        event = self._set("set_refusal", ContentType.REFUSAL, refusal=refusal)
        assert isinstance(event, RefusalContent)
        return event

    def set_audio(self, data: str, audio_format: str | None = None) -> AudioContent:
        """Set the audio (base64 ``data``, and its ``format``); the ``in_progress`` event."""
        event = self._set("set_audio", ContentType.AUDIO, data=data, format=audio_format)
        assert isinstance(event, AudioContent)
        return event

    def set_file(
        self,
        *,
        file_url: str | None = None,
        file_id: str | None = None,
        filename: str | None = None,
        file_data: str | None = None,
    ) -> FileContent:
        """Set the file's fields given (the others keep their value); the ``in_progress`` event."""
        event = self._set(
            "set_file",
            ContentType.FILE,
            file_url=file_url,
            file_id=file_id,
            filename=filename,
            file_data=file_data,
        )
        assert isinstance(event, FileContent)
        return event

    def complete(self) -> Content:
        """The completed event: ``delta`` false, the merged value; it joins the message.

        A text content with no text completes with ``""``, a data content with
        no data with ``{}``.

        Raises:
            BuilderStateError: already complete, or the message is not created,
                or is terminal, or the response is terminal.
        """
        self._check("complete")
        payload = self._current()
        if self.content_type is ContentType.DATA and payload.get("data") is None:
            payload["data"] = {}
        stored = self._cls(
            index=self.index,
            msg_id=self.message_builder.id,
            delta=False,
            status=RunStatus.Completed,
            **copy_json(payload),
        )
        self._status = RunStatus.Completed
        self.message_builder._store(self.index, stored)
        event = stored.model_copy(deep=True)
        event.sequence_number = self.message_builder.response_builder._take_number()
        return event

    def snapshot(self) -> Content:
        """The content as it stands (takes no number)."""
        return self._cls(
            index=self.index,
            msg_id=self.message_builder.id,
            delta=False,
            status=self._status,
            **copy_json(self._current()),
        )
