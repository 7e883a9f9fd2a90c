"""From an execution-loop run to spec 003's event stream.

    async with open_run(agent, request) as run:
        async for event in run:               # AgentResponse, Message or Content models
            print(event.wire_json())           # each with its sequence_number
    print(run.final.status)                    # completed, failed or canceled

:func:`open_run` sends the request's input to the agent's execution loop as
one user turn and turns the events of that run (all sharing the input's
``traceId``) into the Agent API's events:

- the response ``created``, then ``in_progress``;
- the agent's text: a message (role ``assistant``, type ``message``) whose text
  content streams as deltas, from the ``OUTPUT:AGENT_MESSAGE_DELTA`` events of a
  streaming provider or, without them, the whole text as one delta; then the
  completed content (its text is the ``OUTPUT:AGENT_MESSAGE``'s, the record)
  and the completed message. Image, audio and UI segments follow the text as
  more content items of the same message;
- each ``EXEC:TOOL_CALL``: a ``function_call`` message (role ``assistant``)
  whose data content is ``{"call_id", "name", "arguments"}`` with the
  arguments as JSON text, as AgentScope Runtime sends them;
- each ``EXEC:TOOL_RESULT``: a ``function_call_output`` message (role ``tool``)
  whose data content is ``{"call_id", "name", "output"}``, the output being the
  result as JSON text (``{"error": {"code", "message", "source"}}`` for a
  failed call);
- each ``KERNEL:ERROR``: an ``error`` message with ``code`` and ``message``;
- the end: the response ``completed`` (with its ``output`` and the ``usage``
  the provider reported in its responses' ``metadata.usage``, numbers summed
  over every provider response of the run, including those that only called
  tools: ``RunResult.usage``); ``failed``
  with ``error`` when a ``KERNEL:ERROR`` ended the run; or ``canceled`` when the
  run was stopped (:meth:`RunStream.cancel`, leaving the stream early, or a
  ``/stop`` on its session).

The stream ends once the loop has finished the run and the bus has dispatched
every event the run published. To know the second, the adapter publishes an
``API:RESPONSE_END`` event when the run has finished (a child of the input, so
at its priority, ``{"responseId", "status"}``): the bus, first in first out
within a priority, delivers it after the run's own events.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from openstarry.agent.loop import add_usage
from openstarry.api.builders import ContentBuilder, MessageBuilder, ResponseBuilder
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    AudioContent,
    Content,
    ContentType,
    DataContent,
    Error,
    FileContent,
    FunctionCall,
    FunctionCallOutput,
    ImageContent,
    InvalidRequestError,
    Message,
    MessageType,
    Role,
    RunStatus,
    TextContent,
)
from openstarry.bus import EventBus, Subscription
from openstarry.core import Event
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA, EventType

if TYPE_CHECKING:
    from types import TracebackType

    from openstarry.agent.loop import PendingRun, RunResult
    from openstarry.agent.runtime import Agent

__all__ = ["RESPONSE_END", "RunStream", "check_request", "collect_run", "open_run"]

log = logging.getLogger("openstarry.api")

#: The event the adapter publishes once a run's events have all been dispatched.
RESPONSE_END = "API:RESPONSE_END"
#: The ``source`` of the events the adapter publishes.
SOURCE = "openstarry.api"
#: Bus events waiting for translation, at most; beyond it text deltas are
#: dropped (the completed content still carries the whole text).
MAX_PENDING_EVENTS = 10_000

_TOOL_CALL = EventType.TOOL_CALL.value
_TOOL_RESULT = EventType.TOOL_RESULT.value
_ERROR = EventType.ERROR.value
_PATTERNS = ("OUTPUT:*", "EXEC:*", _ERROR, "API:*")

WireEvent = AgentResponse | Message | Content


def check_request(request: AgentRequest) -> str:
    """The text a request sends to the agent: its last ``user`` message's text content.

    Text content items are joined by newlines.

    Raises:
        InvalidRequestError: (HTTP 422) there is no user message, it holds no
            text or content other than text, or the request asks for what the
            agent cannot do: ``tools`` (the agent's come from its manifest) or
            ``n`` above 1.
    """
    if request.tools:
        raise _refuse(
            "unsupported_tools",
            "tools: this agent's tools are set by its manifest; a request cannot add tools",
        )
    if request.n is not None and request.n != 1:
        raise _refuse(
            "unsupported_n", f"n: this agent gives one answer per request, not {request.n}"
        )
    for message in reversed(request.input):
        if message.role is Role.USER:
            break
    else:
        raise _refuse("invalid_request", "input: no message has the role 'user'")
    texts: list[str] = []
    for index, item in enumerate(message.content or ()):
        if not isinstance(item, TextContent):
            raise _refuse(
                "unsupported_content",
                f"input: the last user message's content {index} is {item.type!r}; "
                "this agent takes text",
            )
        if item.text:
            texts.append(item.text)
    text = "\n".join(texts)
    if not text.strip():
        raise _refuse("empty_input", "input: the last user message has no text")
    return text


def _refuse(code: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(
        message, code=code, errors=[{"loc": "(root)", "msg": message, "type": code}]
    )


class _Router:
    """One subscription per bus that hands each run its own events, by ``traceId``.

    It holds its bus only through its subscriptions, while a run is routed: a
    router is the value of a weak-keyed table whose key is the bus, and a
    strong reference from it would keep every bus ever used alive.
    """

    def __init__(self) -> None:
        self.routes: dict[str, Callable[[Event], None]] = {}
        self.subscriptions: list[Subscription] = []

    def add(self, bus: EventBus, trace_id: str, handler: Callable[[Event], None]) -> None:
        if not self.subscriptions:
            self.subscriptions = [bus.subscribe(p, self._dispatch) for p in _PATTERNS]
        self.routes[trace_id] = handler

    def remove(self, trace_id: str) -> None:
        self.routes.pop(trace_id, None)
        if not self.routes:
            for subscription in self.subscriptions:
                subscription.cancel()
            self.subscriptions = []

    def _dispatch(self, event: Event) -> None:
        handler = self.routes.get(event.trace_id)
        if handler is not None:
            handler(event)


_ROUTERS: weakref.WeakKeyDictionary[EventBus, _Router] = weakref.WeakKeyDictionary()


def _router(bus: EventBus) -> _Router:
    router = _ROUTERS.get(bus)
    if router is None:
        router = _ROUTERS[bus] = _Router()
    return router


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(str(value), ensure_ascii=False)


def _segment_content(segment: Mapping[str, Any]) -> Content | None:
    """The content item of a non-text segment of an ``OUTPUT:AGENT_MESSAGE``."""
    kind = segment.get("type")
    data = segment.get("data")
    mime = segment.get("mimeType")
    if kind == "text":
        return None
    if kind == "image" and isinstance(data, str):
        if data.startswith(("http://", "https://", "data:")):
            return ImageContent(image_url=data)
        return ImageContent(image_url=f"data:{mime or 'image/png'};base64,{data}")
    if kind == "audio" and isinstance(data, str):
        audio_format = mime.rpartition("/")[2] if isinstance(mime, str) else None
        return AudioContent(data=data, format=audio_format)
    if kind == "video" and isinstance(data, str):
        return FileContent(file_data=data, filename=f"video.{(mime or '/mp4').rpartition('/')[2]}")
    if kind == "ui":
        return DataContent(data={"ui": segment.get("ui")})
    return DataContent(data=dict(segment))


class _OpenText:
    """The assistant message whose text is streaming in, in one provider round."""

    __slots__ = ("content", "message", "round", "streamed")

    def __init__(self, message: MessageBuilder, content: ContentBuilder, round_no: int) -> None:
        self.message = message
        self.content = content
        self.round = round_no
        self.streamed: list[str] = []


class RunStream:
    """One run of the agent as a stream of Agent API events; made by :func:`open_run`.

    Use it as an async context manager, and iterate it inside: each item is
    an :class:`~openstarry.api.models.AgentResponse`,
    :class:`~openstarry.api.models.Message` or content model with its
    ``sequence_number``. The last is the response's terminal event, also kept
    as :attr:`final`. Leaving the context before the end stops the run.

    Attributes:
        response_id: The response's id.
        session_id: The loop session the run is in.
        final: The terminal response event, once iterated to the end.
        result: The loop's :class:`~openstarry.agent.loop.RunResult`, once the run ended.
    """

    def __init__(
        self,
        agent: Agent,
        request: AgentRequest,
        *,
        response_id: str | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        self._text = check_request(request)
        self.agent = agent
        self.session_id = request.session_id or f"session_{uuid.uuid4()}"
        self._builder = ResponseBuilder(session_id=self.session_id, response_id=response_id)
        self.response_id = self._builder.response_id
        self.final: AgentResponse | None = None
        self.result: RunResult | None = None
        self._stop_timeout = stop_timeout
        self._pending: PendingRun | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._trace_id: str | None = None
        self._queue: deque[Event | None] = deque()
        self._wake: anyio.Event | None = None  # made in the event loop, when needed
        self._out: deque[WireEvent] = deque()
        self._open: _OpenText | None = None
        self._usage: dict[str, Any] | None = None
        self._stop_sent = False
        self._ended = False
        self._finished = False
        #: Text deltas dropped because the consumer fell behind.
        self.deltas_dropped = 0

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> RunStream:
        pending = self.agent.loop.start(self._text, session_id=self.session_id, source=SOURCE)
        self._pending = pending
        # Routed before anything of the run can be dispatched (no await since start).
        self._trace_id = pending.event.trace_id
        _router(self.agent.bus).add(self.agent.bus, self._trace_id, self._on_event)
        self._out.append(self._builder.created())
        self._out.append(self._builder.in_progress())
        task_group = anyio.create_task_group()
        try:
            await task_group.__aenter__()
        except BaseException:
            self._stop_now()
            self._unroute()
            raise
        task_group.start_soon(self._watch, name=f"openstarry.api watch {self.response_id}")
        self._task_group = task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group, self._task_group = self._task_group, None
        assert task_group is not None
        try:
            if not self._ended:
                self._stop_now()
                if exc_type is None:
                    # Give the loop a moment to stop the run, so it is over on return.
                    with anyio.move_on_after(self._stop_timeout):
                        while not self._ended:
                            await self._wait()
                            self._queue.clear()
            task_group.cancel_scope.cancel()
            if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
                # The body's own exception goes on as it is: handed to the task
                # group, it would come out wrapped in an exception group.
                await task_group.__aexit__(None, None, None)
                return None
            return await task_group.__aexit__(exc_type, exc, tb)
        finally:
            self._unroute()

    def cancel(self) -> None:
        """Stop the run: ``/stop`` on its session. The stream goes on to end ``canceled``.

        The loop stops the run of the session in progress (and drops the inputs
        waiting behind it), so this run, which the session is serving.
        """
        if self._ended or self._stop_sent:
            return
        self._stop_sent = True
        if self._task_group is not None:
            self._task_group.start_soon(self._send_stop)
        else:
            self._stop_now()

    def _stop_event(self) -> Event:
        return Event.new(
            EventType.SYSTEM_COMMAND.value,
            {"command": "stop", "args": []},
            source=SOURCE,
            session_id=self.session_id,
            priority=0,
        )

    async def _send_stop(self) -> None:
        # A closed bus: the agent is stopping, and stops the run itself.
        with contextlib.suppress(QueueClosed):
            await self.agent.bus.apublish(self._stop_event())

    def _stop_now(self) -> None:
        self._stop_sent = True
        try:
            self.agent.bus.publish(self._stop_event())
        except QueueClosed:
            pass
        except QueueFull:
            log.warning(
                "response %s: the bus is full; the /stop for session %s was not sent",
                self.response_id,
                self.session_id,
            )

    def _unroute(self) -> None:
        if self._trace_id is not None:
            router = _ROUTERS.get(self.agent.bus)
            if router is not None:
                router.remove(self._trace_id)

    async def _watch(self) -> None:
        """Wait for the loop to end the run, then mark the end of its events on the bus."""
        pending = self._pending
        assert pending is not None
        result = await pending.wait()
        self.result = result
        marker = pending.event.child(
            RESPONSE_END,
            {"responseId": self.response_id, "status": self._status_of(result).value},
            source=SOURCE,
        )
        try:
            await self.agent.bus.apublish(marker)
        except QueueClosed:
            self._push(None)  # no bus to order the end: end after what has arrived

    @staticmethod
    def _status_of(result: RunResult) -> RunStatus:
        if result.stopped:
            return RunStatus.Canceled
        if result.error is not None:
            return RunStatus.Failed
        return RunStatus.Completed

    # -- events in -------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if event.type == OUTPUT_AGENT_MESSAGE_DELTA and len(self._queue) >= MAX_PENDING_EVENTS:
            self.deltas_dropped += 1
            return
        self._push(event)

    def _push(self, event: Event | None) -> None:
        if event is None or event.type == RESPONSE_END:
            self._ended = True
        self._queue.append(event)
        if self._wake is not None:
            self._wake.set()

    async def _wait(self) -> None:
        if not self._queue:
            self._wake = anyio.Event()
            await self._wake.wait()

    # -- events out ------------------------------------------------------

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> WireEvent:
        while True:
            if self._out:
                return self._out.popleft()
            if self._finished:
                raise StopAsyncIteration
            if self._task_group is None:
                raise RuntimeError("iterate a RunStream inside `async with open_run(...)`")
            if not self._queue:
                await self._wait()
                continue
            self._translate(self._queue.popleft())

    def _translate(self, event: Event | None) -> None:
        if event is None or event.type == RESPONSE_END:
            self._end()
            return
        kind = event.type
        payload = event.payload
        if not isinstance(payload, dict):
            return
        if kind == OUTPUT_AGENT_MESSAGE_DELTA:
            self._delta(payload)
        elif kind == OUTPUT_AGENT_MESSAGE:
            self._said(payload)
        elif kind == _TOOL_CALL:
            self._close_open()
            self._tool_call(payload)
        elif kind == _TOOL_RESULT:
            self._close_open()
            self._tool_result(payload)
        elif kind == _ERROR:
            error = Error(
                code=str(payload.get("code", "ERROR")), message=str(payload.get("message", ""))
            )
            self._close_open(failed=error)
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.ERROR)
            message.set_error(error.code, error.message)
            self._out.append(message.created())
            self._out.append(message.complete())

    def _delta(self, payload: dict[str, Any]) -> None:
        text = payload.get("text")
        round_no = payload.get("round")
        if not isinstance(text, str) or not text:
            return
        current = self._open
        if current is not None and current.round != round_no:
            self._close_open()
            current = None
        if current is None:
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.MESSAGE)
            self._out.append(message.created())
            content = message.create_content_builder(ContentType.TEXT)
            current = self._open = _OpenText(
                message, content, round_no if isinstance(round_no, int) else 0
            )
        current.streamed.append(text)
        self._out.append(current.content.add_text_delta(text))

    def _said(self, payload: dict[str, Any]) -> None:
        metadata = payload.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("usage"), dict):
            self._usage = add_usage(self._usage, metadata["usage"])
        text = payload.get("text")
        text = text if isinstance(text, str) else ""
        current, self._open = self._open, None
        content: ContentBuilder | None
        if current is not None:
            message, content = current.message, current.content
            streamed = "".join(current.streamed)
        else:
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.MESSAGE)
            self._out.append(message.created())
            content = message.create_content_builder(ContentType.TEXT) if text else None
            streamed = ""
        if content is not None:
            # The message's text is the record; the deltas were its preview.
            if text.startswith(streamed):
                if len(text) > len(streamed) or not streamed:
                    self._out.append(content.add_text_delta(text[len(streamed) :]))
            else:
                self._out.append(content.set_text(text))
            self._out.append(content.complete())
        segments = payload.get("segments")
        for segment in segments if isinstance(segments, list) else ():
            if isinstance(segment, dict):
                item = _segment_content(segment)
                if item is not None:
                    self._out.append(message.add_content(item))
        self._out.append(message.complete())

    def _tool_call(self, payload: dict[str, Any]) -> None:
        call = FunctionCall(
            call_id=str(payload.get("toolCallId", "")),
            name=str(payload.get("name", "")),
            arguments=_json_text(payload.get("args", {})),
        )
        message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.FUNCTION_CALL)
        self._out.append(message.created())
        self._out.append(message.add_content(DataContent(data=call.to_wire())))
        self._out.append(message.complete())

    def _tool_result(self, payload: dict[str, Any]) -> None:
        if payload.get("success"):
            output = payload.get("result")
        else:
            output = {"error": payload.get("error")}
        result = FunctionCallOutput(
            call_id=str(payload.get("toolCallId", "")),
            name=str(payload.get("name", "")),
            output=_json_text(output),
        )
        message = self._builder.create_message_builder(Role.TOOL, MessageType.FUNCTION_CALL_OUTPUT)
        self._out.append(message.created())
        self._out.append(message.add_content(DataContent(data=result.to_wire())))
        self._out.append(message.complete())

    def _close_open(self, *, failed: Error | None = None, canceled: bool = False) -> None:
        """End the message whose text was streaming: with what it said so far."""
        current, self._open = self._open, None
        if current is None:
            return
        self._out.append(current.content.complete())
        if failed is not None:
            self._out.append(current.message.failed(failed))
        elif canceled:
            self._out.append(current.message.canceled())
        else:
            self._out.append(current.message.complete())

    def _end(self) -> None:
        result = self.result
        status = self._status_of(result) if result is not None else RunStatus.Canceled
        builder = self._builder
        if result is not None and result.usage:
            # The loop's count includes responses that only called tools.
            self._usage = result.usage
        if status is RunStatus.Failed:
            assert result is not None
            assert result.error is not None
            error = Error(
                code=str(result.error.get("code", "ERROR")),
                message=str(result.error.get("message", "")),
            )
            self._close_open(failed=error)
            if self._usage:
                builder.set_usage(self._usage)
            final = builder.failed(error)
        elif status is RunStatus.Canceled:
            self._close_open(canceled=True)
            if self._usage:
                builder.set_usage(self._usage)
            final = builder.canceled()
        else:
            self._close_open()
            if self._usage:
                builder.set_usage(self._usage)
            final = builder.completed()
        self.final = final
        self._out.append(final)
        self._finished = True


def open_run(
    agent: Agent,
    request: AgentRequest,
    *,
    response_id: str | None = None,
    stop_timeout: float = 5.0,
) -> RunStream:
    """Start ``request`` on the running ``agent``; iterate the result for its events.

    Args:
        agent: A started agent (inside ``async with agent``).
        request: The request; its last user message's text is the input, and
            its ``session_id`` the loop session (a new one when absent).
        response_id: The response's id (default: a fresh ``response_...``).
        stop_timeout: Seconds leaving the stream early waits for the stopped
            run to end.

    Raises:
        InvalidRequestError: the request has no text input, or asks for what
            the agent cannot do (see :func:`check_request`); raised at once.
    """
    return RunStream(agent, request, response_id=response_id, stop_timeout=stop_timeout)


async def collect_run(
    agent: Agent, request: AgentRequest, *, response_id: str | None = None
) -> AgentResponse:
    """Run ``request`` to its end and return the terminal response, ``output`` and all."""
    async with open_run(agent, request, response_id=response_id) as run:
        async for _ in run:
            pass
    assert run.final is not None
    return run.final
