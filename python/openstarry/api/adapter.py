"""From an execution-loop run to spec 003's event stream.

    async with open_run(agent, request) as run:
        async for event in run:               # AgentResponse, Message or Content models
            print(event.wire_json())           # each with its sequence_number
    print(run.final.status)                    # completed, failed or canceled

:func:`open_run` sends the request's input to the agent's execution loop as
one user turn, follows the events of that run on the bus (all sharing the
input's ``traceId``) and hands them, in order, to a
:class:`~openstarry.api.translate.RunTranslator`, which turns them into the
Agent API's events: the response ``created`` and ``in_progress``; the agent's
text as a streaming message with its image, audio and UI segments;
``function_call`` and ``function_call_output`` messages for tool calls and
results; ``error`` messages; and the response ``completed`` (with its
``output`` and ``usage``, ``RunResult.usage``), ``failed`` when an error ended
the run, or ``canceled`` when the run was stopped (:meth:`RunStream.cancel`,
leaving the stream early, or a ``/stop`` on its session). The module
:mod:`openstarry.api.translate` states the mapping in full.

The stream ends once the loop has finished the run and the bus has dispatched
every event the run published. To know the second, the adapter publishes an
``API:RESPONSE_END`` event when the run has finished (a child of the input, so
at its priority, ``{"responseId", "status"}``): the bus, first in first out
within a priority, delivers it after the run's own events.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from openstarry.api.builders import ResponseBuilder
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    InvalidRequestError,
    Role,
    TextContent,
)
from openstarry.api.tracecontext import incoming_trace
from openstarry.api.translate import RunTranslator, WireEvent, run_status
from openstarry.bus import EventBus, Subscription
from openstarry.core import Event
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import OUTPUT_AGENT_MESSAGE_DELTA, EventType

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

_PATTERNS = ("OUTPUT:*", "EXEC:*", EventType.ERROR.value, "API:*")


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
        builder = ResponseBuilder(session_id=self.session_id, response_id=response_id)
        self.response_id = builder.response_id
        self.final: AgentResponse | None = None
        self.result: RunResult | None = None
        self._stop_timeout = stop_timeout
        self._pending: PendingRun | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._trace_id: str | None = None
        self._queue: deque[Event | None] = deque()
        self._wake: anyio.Event | None = None  # made in the event loop, when needed
        self._translator = RunTranslator(builder)
        self._stop_sent = False
        self._ended = False
        self._finished = False
        #: Text deltas dropped because the consumer fell behind.
        self.deltas_dropped = 0

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> RunStream:
        pending = self.agent.loop.start(
            self._text,
            session_id=self.session_id,
            source=SOURCE,
            # The trace of the HTTP request that started it, if any (api.tracecontext).
            trace_id=incoming_trace.get(),
        )
        self._pending = pending
        # Routed before anything of the run can be dispatched (no await since start).
        self._trace_id = pending.event.trace_id
        _router(self.agent.bus).add(self.agent.bus, self._trace_id, self._on_event)
        self._translator.start()
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
            {"responseId": self.response_id, "status": run_status(result).value},
            source=SOURCE,
        )
        try:
            await self.agent.bus.apublish(marker)
        except QueueClosed:
            self._push(None)  # no bus to order the end: end after what has arrived

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
        out = self._translator.out
        while True:
            if out:
                return out.popleft()
            if self._finished:
                raise StopAsyncIteration
            if self._task_group is None:
                raise RuntimeError("iterate a RunStream inside `async with open_run(...)`")
            if not self._queue:
                await self._wait()
                continue
            event = self._queue.popleft()
            if event is None or event.type == RESPONSE_END:
                self.final = self._translator.end(self.result)
                self._finished = True
            else:
                self._translator.translate(event)


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
