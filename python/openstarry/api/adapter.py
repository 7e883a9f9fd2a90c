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
import json
import logging
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from openstarry.agent.commands import find_tool, parse_line, user_message
from openstarry.agent.results import RunResult
from openstarry.agent.waits import Answer
from openstarry.api.builders import ResponseBuilder
from openstarry.api.choices import Choices, check_choices
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    DataContent,
    Error,
    InvalidRequestError,
    MessageType,
    Role,
    TextContent,
    WireModel,
)
from openstarry.api.tracecontext import incoming_depth, incoming_parent, incoming_trace
from openstarry.api.translate import RunTranslator, WireEvent, run_status
from openstarry.bus import EventBus, Subscription, follow_session
from openstarry.core import Event
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import OUTPUT_AGENT_MESSAGE_DELTA, OUTPUT_RUN_END, EventType

if TYPE_CHECKING:
    from types import TracebackType

    from openstarry.agent.loop import PendingRun
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

_PATTERNS = ("OUTPUT:*", "EXEC:*", EventType.ERROR.value, "API:*", EventType.TICK_START.value)
_TICK, _CALL = EventType.TICK_START.value, EventType.TOOL_CALL.value
#: What of a followed run's events the stream translates (as :data:`_PATTERNS`).
_FOLLOWED = ("OUTPUT:", "EXEC:", EventType.ERROR.value)
_AWAITING = "EXEC:AWAITING"


#: The generation parameters of a request that reach the provider (``context.generation``).
GENERATION_PARAMETERS = (
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
)


def check_request(request: AgentRequest, agent: Agent | None = None) -> str:
    """The text a request sends to the agent: its last ``user`` message's text content.

    Text content items are joined by newlines. A request that answers a run
    waiting for its client (``function_call_output`` or
    ``mcp_approval_response`` messages) sends no text: the empty string.

    With ``agent``, the request is also checked against it: a declared tool
    whose name is one of the agent's, answers to calls the session does not
    wait for, or a session that waits for answers the request does not carry.

    Raises:
        InvalidRequestError: (HTTP 422) there is no user message, it holds no
            text or content other than text, ``n`` is above 1 where the
            choices could not run independently (``unsupported_n``, see
            :mod:`openstarry.api.choices`), two declared
            tools share a name or one clashes with the agent's
            (``tool_name_clash``), or the answers do not match what the
            session waits for (``unknown_call_id``, ``missing_call_output``,
            ``no_waiting_run``).
    """
    _client_tools(request, agent)
    answers = client_answers(request)
    if agent is not None and request.session_id is not None:
        _check_answers(agent, request.session_id, answers)
    if answers:
        check_choices(request, "", True, agent)
        if request.session_id is None:
            raise _refuse(
                "no_waiting_run",
                "session_id: answers to a waiting run must name its session",
            )
        return ""
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
    check_choices(request, text, False, agent)
    return text


def _client_tools(request: AgentRequest, agent: Agent | None) -> list[dict[str, Any]]:
    """The request's declared functions as ``{"name", "description", "parameters"}``."""
    declared: list[dict[str, Any]] = []
    seen: set[str] = set()
    clashes: list[str] = []
    theirs = agent.tools if agent is not None else {}
    for tool in request.tools or ():
        function = tool.function
        parameters = function.parameters
        schema = parameters.to_wire() if isinstance(parameters, WireModel) else dict(parameters)
        if function.name in seen or function.name in theirs:
            clashes.append(function.name)
        seen.add(function.name)
        declared.append(
            {"name": function.name, "description": function.description, "parameters": schema}
        )
    if clashes:
        raise _refuse(
            "tool_name_clash",
            f"tools: {', '.join(repr(n) for n in clashes)} clash with the agent's tools "
            "or with another declared tool; rename them",
        )
    return declared


def _generation(request: AgentRequest) -> dict[str, Any]:
    return {
        name: getattr(request, name)
        for name in GENERATION_PARAMETERS
        if getattr(request, name) is not None
    }


def client_answers(request: AgentRequest) -> dict[str, Answer]:
    """The answers a request carries to a waiting run, by call or approval id.

    A ``function_call_output`` message's data content ``{"call_id", "output"}``
    answers a client tool's call; an ``mcp_approval_response`` message's
    ``{"approval_request_id", "approve", "reason"?}`` answers an approval.

    Raises:
        InvalidRequestError: an answer lacks its id, or one id is answered twice.
    """
    answers: dict[str, Answer] = {}
    for message in request.input:
        is_output = message.type is MessageType.FUNCTION_CALL_OUTPUT
        if not is_output and message.type is not MessageType.MCP_APPROVAL_RESPONSE:
            continue
        for item in message.content or ():
            data = item.data if isinstance(item, DataContent) else None
            if not isinstance(data, dict):
                raise _refuse(
                    "invalid_request",
                    f"input: a {message.type.value} message's content must be data",
                )
            if is_output:
                key = data.get("call_id")
                output = data.get("output")
                answer = Answer(output=output if isinstance(output, str) else json.dumps(output))
            else:
                key = data.get("approval_request_id")
                reason = data.get("reason")
                answer = Answer(
                    approve=data.get("approve") is True,
                    reason=reason if isinstance(reason, str) else None,
                )
            if not isinstance(key, str) or not key:
                raise _refuse(
                    "invalid_request",
                    f"input: a {message.type.value} needs its "
                    f"{'call_id' if is_output else 'approval_request_id'}",
                )
            if key in answers:
                raise _refuse("invalid_request", f"input: {key!r} is answered twice")
            answers[key] = answer
    return answers


def _check_answers(agent: Agent, session_id: str, answers: dict[str, Answer]) -> None:
    waiting = {w.id for w in agent.loop.waits.pending(session_id)}
    if not answers and not waiting:
        return
    parked = _PARKED.get(agent, {}).get(session_id)
    if answers and (parked is None or not waiting):
        raise _refuse(
            "no_waiting_run",
            f"input: session {session_id!r} has no run waiting for {', '.join(sorted(answers))}",
        )
    unknown = sorted(set(answers) - waiting)
    if unknown:
        raise _refuse(
            "unknown_call_id",
            f"input: session {session_id!r} waits for no call or approval {', '.join(unknown)}; "
            f"it waits for {', '.join(sorted(waiting))}",
        )
    missing = sorted(waiting - set(answers))
    if missing:
        raise _refuse(
            "missing_call_output",
            f"input: session {session_id!r} waits for the output or approval of "
            f"{', '.join(missing)}; send a function_call_output or mcp_approval_response "
            "for each",
        )


def _rejection(agent: Agent, text: str) -> Error | None:
    """Why a request is refused before any run: a slash command of a tool that needs approval.

    A slash command runs its tool at once, with nobody asked; the approval
    policy refuses it (the model may still call the tool, and ask).
    """
    command = parse_line(text)
    if command is None or command.is_builtin:
        return None
    tool = find_tool(command.name, agent.tools)
    if tool is None:
        return None
    approval = getattr(getattr(agent.manifest, "approval", None), "tools", ())
    if tool.name in approval or getattr(tool, "requires_approval", False) is True:
        return Error(
            code="approval_required",
            message=f"/{command.name}: {tool.name} needs approval; a slash command cannot ask "
            "for it (ask the agent in words instead)",
        )
    return None


def server_tools(agent: Agent, label: str) -> list[dict[str, Any]]:
    """A remote MCP server's tools as the agent has them now, by their names on the server."""
    return [
        {
            "name": str(getattr(tool, "remote_name", tool.name)),
            "description": tool.description,
            "input_schema": dict(tool.parameters),
        }
        for tool in agent.tools.values()
        if getattr(tool, "server_label", None) == label
    ]


def _refuse(code: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(
        message, code=code, errors=[{"loc": "(root)", "msg": message, "type": code}]
    )


class _Router:
    """One subscription per bus that hands each run its own events: by ``traceId``, and
    within a trace that several runs share, by the input each event descends from.

    Runs share a trace when one calls another in the same process (an agent that asks
    itself over A2A, each hop joining the caller's trace), or when two requests carry
    the same trace header. Each run's ``KERNEL:TICK_START`` and ``EXEC:TOOL_CALL`` are
    remembered as its own, and an event goes to the run its parent (the input, a tick,
    a call) belongs to.

    It holds its bus only through its subscriptions, while a run is routed: a
    router is the value of a weak-keyed table whose key is the bus, and a
    strong reference from it would keep every bus ever used alive.
    """

    def __init__(self) -> None:
        #: The runs routed, by trace, each by its input's id.
        self.routes: dict[str, dict[str, Callable[[Event], None]]] = {}
        #: The ticks and calls of the runs routed: the input each belongs to.
        self.owner: dict[str, str] = {}
        self.subscriptions: list[Subscription] = []

    def add(
        self, bus: EventBus, trace_id: str, input_id: str, handler: Callable[[Event], None]
    ) -> None:
        if not self.subscriptions:
            self.subscriptions = [bus.subscribe(p, self._dispatch) for p in _PATTERNS]
        self.routes.setdefault(trace_id, {})[input_id] = handler

    def remove(self, trace_id: str, input_id: str) -> None:
        runs = self.routes.get(trace_id)
        if runs is not None and runs.pop(input_id, None) is not None:
            owner = self.owner
            for event_id in [e for e, run in owner.items() if run == input_id]:
                del owner[event_id]
            if not runs:
                del self.routes[trace_id]
        if not self.routes:
            for subscription in self.subscriptions:
                subscription.cancel()
            self.subscriptions = []
            self.owner.clear()

    def _dispatch(self, event: Event) -> None:
        runs = self.routes.get(event.trace_id)
        if runs is None:
            return
        kind = event.type
        if len(runs) == 1:
            run, handler = next(iter(runs.items()))
        else:
            parent = event.parent_id
            found = parent if parent in runs else self.owner.get(parent or "")
            if found is None:
                return
            run, handler = found, runs[found]
        if kind in (_TICK, _CALL):
            self.owner[event.id] = run
        if kind != _TICK:
            handler(event)


_ROUTERS: weakref.WeakKeyDictionary[EventBus, _Router] = weakref.WeakKeyDictionary()


def _router(bus: EventBus) -> _Router:
    router = _ROUTERS.get(bus)
    if router is None:
        router = _ROUTERS[bus] = _Router()
    return router


#: The runs that wait for their client, by agent and session: a request that
#: answers them follows the same run on.
_PARKED: weakref.WeakKeyDictionary[Agent, dict[str, PendingRun]] = weakref.WeakKeyDictionary()


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
        self._text = check_request(request, agent)
        self._answers = client_answers(request)
        self._extra: dict[str, Any] = {}
        tools = _client_tools(request, agent)
        if tools:
            self._extra["tools"] = tools
        generation = _generation(request)
        if generation:
            self._extra["generation"] = generation
        depth = incoming_depth.get()
        if depth:  # a call from another agent: the run's own calls go one deeper
            self._extra["callDepth"] = depth
        self.agent = agent
        #: Why the request is refused before any run (``rejected``), if it is.
        self.rejection = _rejection(agent, self._text)
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
        self._translator = RunTranslator(builder, lambda label: server_tools(agent, label))
        #: ``n`` above 1: the runs of the choices, merged into this response.
        self._choices = (
            Choices(agent, request, self.session_id, builder, self._translator.out, collect_run)
            if (request.n or 1) > 1 and self.rejection is None
            else None
        )
        self._stop_sent = False
        self._ended = False
        self._finished = False
        #: On a bus shared with other workers (Redis): the run is followed in its
        #: partition's streams, whoever runs it (see :meth:`_start_followed`).
        self._follow: contextlib.AbstractAsyncContextManager[None] | None = None
        self._input: Event | None = None
        self._seen: set[str] = set()
        self._end: Event | None = None
        #: The run waits for this stream's client (the response ended ``incomplete``).
        self.waiting = False
        #: Text deltas dropped because the consumer fell behind.
        self.deltas_dropped = 0

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> RunStream:
        loop = self.agent.loop
        if self.rejection is not None:
            # Refused by the approval policy before any run: created, then rejected.
            self.final = self._translator.rejected(self.rejection)
            self._finished = self._ended = True
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            return self
        if self._choices is not None:
            self._translator.start()
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            self._task_group.start_soon(self._watch, name=f"openstarry.api n {self.response_id}")
            return self
        if not self._answers and "tools" not in self._extra:
            follow = follow_session(self.agent.bus.backend, self.session_id, self._on_followed)
            if follow is not None:
                await self._start_followed(follow)
                return self
        if self._answers:
            pending = _PARKED.get(self.agent, {}).pop(self.session_id, None)
            if pending is None:
                raise _refuse("no_waiting_run", f"session {self.session_id!r} has no run waiting")
            pending.keep = False
        else:
            # The trace of the HTTP request that started it, if any, and the
            # caller's span the run's spans are children of (api.tracecontext).
            caller = incoming_parent.get()
            pending = loop.start(
                self._text,
                session_id=self.session_id,
                source=SOURCE,
                extra=self._extra if caller is None else {**self._extra, "traceparent": caller},
                trace_id=incoming_trace.get(),
            )
        self._pending = pending
        # Routed before anything of the run can be dispatched (no await since start).
        self._trace_id = pending.event.trace_id
        _router(self.agent.bus).add(
            self.agent.bus, self._trace_id, pending.event.id, self._on_event
        )
        for wait_id, answer in self._answers.items():
            loop.waits.answer(self.session_id, wait_id, answer)
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

    async def _start_followed(self, follow: contextlib.AbstractAsyncContextManager[None]) -> None:
        """Publish the input and follow its run in its partition's streams: on a bus
        shared with other workers, whichever worker owns the session runs it, and its
        events reach this process only there. The input asks for ``OUTPUT:RUN_END``,
        committed with the run's other events: the stream ends once it has read them."""
        caller = incoming_parent.get()
        extra = {**self._extra, "reportEnd": True}
        if caller is not None:
            extra["traceparent"] = caller
        event = user_message(self._text, self.session_id, SOURCE, None, extra, incoming_trace.get())
        self._input = event
        self._trace_id = event.trace_id
        await follow.__aenter__()  # before the input: nothing of its run is missed
        self._follow = follow
        try:
            await self.agent.bus.apublish(event)
            self._translator.start()
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
        except BaseException:
            self._follow = None
            with anyio.CancelScope(shield=True):
                await follow.__aexit__(None, None, None)
            raise

    def _on_followed(self, events: list[Event], caught_up: bool) -> None:
        """A read of the run's partition: its events, then its end once all are read."""
        run = self._input
        if run is None or self._ended:
            return
        seen = self._seen
        for event in events:
            if event.trace_id != run.trace_id or event.id in seen or event.id == run.id:
                continue
            seen.add(event.id)
            if event.type == OUTPUT_RUN_END:
                if event.parent_id == run.id:
                    self._end = event
            elif event.type.startswith(_FOLLOWED):
                self._on_event(event)
        end = self._end
        if end is not None and caught_up:
            payload = end.payload if isinstance(end.payload, dict) else {}
            error = payload.get("error")
            usage = payload.get("usage")
            self.result = RunResult(
                run.trace_id,
                stopped=payload.get("stopped") is True,
                error=error if isinstance(error, dict) else None,
                usage=usage if isinstance(usage, dict) else None,
            )
            status = run_status(self.result).value
            self._push(run.child(RESPONSE_END, {"responseId": self.response_id, "status": status}))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            return await self._leave(exc_type, exc, tb)
        finally:
            follow, self._follow = self._follow, None
            if follow is not None:
                with anyio.CancelScope(shield=True):
                    await follow.__aexit__(None, None, None)

    async def _leave(
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
        if self._choices is not None:
            self._choices.cancel()
            return
        # A closed bus: the agent is stopping, and stops the run itself.
        with contextlib.suppress(QueueClosed):
            await self.agent.bus.apublish(self._stop_event())

    def _stop_now(self) -> None:
        self._stop_sent = True
        if self._choices is not None:
            self._choices.cancel()
            return
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
        pending = self._pending
        if self._trace_id is not None and pending is not None:
            router = _ROUTERS.get(self.agent.bus)
            if router is not None:
                router.remove(self._trace_id, pending.event.id)

    def _park(self) -> None:
        """The run waits for the client: keep it for the request that answers."""
        pending = self._pending
        assert pending is not None
        pending.keep = True
        _PARKED.setdefault(self.agent, {})[self.session_id] = pending
        self.waiting = True
        self._ended = True  # leaving the stream must not stop the run

    async def _watch(self) -> None:
        """Wait for the loop to end the run, then mark the end of its events on the bus.

        With choices: run them, and end once they have merged into the response.
        """
        if self._choices is not None:
            try:
                await self._choices.run()
            finally:
                self._push(None)
            return
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
            if event is None and self._choices is not None:
                self.final = self._choices.final
                self._finished = True
            elif event is None or event.type == RESPONSE_END:
                self.final = self._translator.end(self.result)
                self._finished = True
            elif event.type == _AWAITING and isinstance(event.payload, dict):
                if self._input is None:
                    self._park()
                else:  # followed: answered with /approve or /deny (the run is durable)
                    self.waiting = self._ended = True
                self.final = self._translator.waiting(event.payload)
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
