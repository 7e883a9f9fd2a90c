"""A turn: one input of a session, served round by round (spec 000 section 5).

Each round of the turn:

1. ``KERNEL:TICK_START`` (``{"round": n}``), then ``KERNEL:STATE_CHANGE`` to ``THINKING``;
2. the provider's ``generate(prompt, context)``, under the provider timeout;
3. its text (and other non-tool) segments go out as one ``OUTPUT:AGENT_MESSAGE``;
4. when it asked for tools: ``KERNEL:STATE_CHANGE`` to ``EXECUTING``, and the
   :class:`~openstarry.agent.execution.ToolExecutor` runs them; their outcomes,
   then what the core observed, go into the session memory before the next round.

The turn ends with a response that asks for no tool, and goes back to ``IDLE``.
A slash line (``/fs.read a.txt``) runs the tool directly, without the provider.

Rules a turn keeps:

- **Every call in memory gets an answer.** A turn stopped, failed or cut by the
  round limit closes its open calls with an outcome, so a provider never sees a
  call without its result.
- **A stop wins over a late answer.** A ``/stop`` or ``/reset`` that arrives
  while the provider answers leaves memory untouched by that answer.
- **The run's events are never dropped**: they wait for room on the bus. Text
  deltas are previews, dropped on a full bus.
- **No cancel scope of its own.** A turn runs in its session worker's scope
  (:mod:`~openstarry.agent.sessions`), which ``/stop`` cancels, and so does
  the loop's deadline watcher (:mod:`~openstarry.agent.deadlines`) when a
  provider call overruns: the turn then ends with ``PROVIDER_TIMEOUT``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from inspect import isawaitable
from types import MappingProxyType
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from openstarry.agent.commands import BUILTIN_COMMANDS, find_tool, parse_line, parse_tool_args
from openstarry.agent.deadlines import Deadlines
from openstarry.agent.execution import ToolExecutor
from openstarry.agent.interfaces import AgentContext, Provider, Tool
from openstarry.agent.journal import RunJournal
from openstarry.agent.limits import LoopLimits
from openstarry.agent.memory import (
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    new_assistant_turn,
    new_user_turn,
)
from openstarry.agent.outbox import Outbox
from openstarry.agent.results import RunResult, Waiters, add_usage
from openstarry.agent.retrieval import LexicalRetriever, ToolRetriever
from openstarry.agent.sessions import SessionRuntime
from openstarry.agent.waits import ClientTool
from openstarry.bus import Emit, EventBus, describe_exception
from openstarry.core import Event, EventRef, ProviderResponse, ToolCall, decode_response
from openstarry.errors import (
    AgentPainException,
    DecodeError,
    LeaseLost,
    QueueClosed,
    QueueFull,
    ToolArgumentsError,
)
from openstarry.events import (
    OUTPUT_AGENT_MESSAGE,
    OUTPUT_AGENT_MESSAGE_DELTA,
    AgentState,
    EventType,
)
from openstarry.tracecontext import MAX_CALL_DEPTH, current_event

__all__ = ["Turn", "TurnHost"]

_TICK_START = EventType.TICK_START.value
_STATE_CHANGE = EventType.STATE_CHANGE.value
_AGENT_DELTA = OUTPUT_AGENT_MESSAGE_DELTA
_IDLE, _THINKING, _EXECUTING = AgentState.IDLE, AgentState.THINKING, AgentState.EXECUTING
#: Each state's wire name (an enum's ``.value`` is a descriptor call).
_VALUE = {state: state.value for state in AgentState}
#: The ``KERNEL:STATE_CHANGE`` payload of each change that gives no reason (an
#: event encodes its payload when it is made: one dict serves every event).
_CHANGE = {
    (old, new): {"from": _VALUE[old], "to": _VALUE[new]} for old in AgentState for new in AgentState
}
#: A run's client tools when its request declares none.
_NO_TOOLS: Mapping[str, Tool] = MappingProxyType({})


def _coerce_response(response: Any) -> ProviderResponse:
    """A provider's return value as the core ``ProviderResponse``, or ``AgentPainException``."""
    if type(response) is ProviderResponse:
        return response
    to_core = getattr(response, "to_core", None)
    if callable(to_core):
        core = to_core()
        if type(core) is ProviderResponse:
            return core
    if isinstance(response, dict):
        try:
            return decode_response(json.dumps(response).encode())
        except (DecodeError, TypeError, ValueError) as exc:
            raise AgentPainException(
                f"the provider's response is not a ProviderResponse: {exc}"
            ) from None
    raise AgentPainException(
        f"the provider returned {type(response).__name__}, not a ProviderResponse"
    )


class TurnHost(Protocol):
    """What a turn uses of the loop that serves it (an
    :class:`~openstarry.agent.loop.ExecutionLoop`): its parts, its limits, its counters.

    The loop imports the turn, never the other way round: this is the turn's
    side of that seam.
    """

    bus: EventBus
    provider: Provider
    limits: LoopLimits
    source: str
    max_tools: int | None
    retriever: ToolRetriever | None
    runs_completed: int
    runs_stopped: int
    _waiters: Waiters
    _publish: Emit | None
    _executor: ToolExecutor
    _outbox: Outbox
    _deadlines: Deadlines
    _loop_thread: int
    _token: Any

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    def _context(self, session: Session, trace_id: str, call_depth: int = 0) -> AgentContext: ...


class Turn:
    """One input of a session being served, round by round.

    The events it emits all descend from ``input``.
    """

    __slots__ = (
        "client_tools",
        "context",
        "input",
        "loop",
        "observations",
        "open_calls",
        "result",
        "rt",
        "state",
        "text",
        "tick",
    )

    def __init__(
        self,
        loop: TurnHost,
        rt: SessionRuntime,
        event: Event | EventRef,
        text: str | None = None,
        journal: RunJournal | None = None,
    ) -> None:
        self.loop = loop
        self.rt = rt
        self.input = event
        self.tick: Event | EventRef = event
        self.state = _IDLE
        self.context = context = loop._context(rt.session, event.trace_id)
        context.run_id = event.id
        if journal is not None:
            context.journal = journal
        self.result: RunResult | None = loop._waiters.result(event.id)
        #: Tool calls in memory that have no outcome yet (closed if the run stops).
        self.open_calls: Sequence[ToolCall] = ()
        #: Observations of this round, added to memory after the round's outcomes.
        self.observations: list[Observation] = []
        #: The functions the input's client declared and runs itself, by name.
        self.client_tools: Mapping[str, Tool] = _NO_TOOLS
        if text is None:
            # An Event (the loop checked its payload: a dict with a str text).
            assert isinstance(event, Event), "an EventRef input comes with its text"
            payload = event.payload
            text = payload["text"]
            if "tools" in payload or "generation" in payload or "callDepth" in payload:
                self._read_request(payload)
        #: The input's text.
        self.text: str = text

    def _read_request(self, payload: dict[str, Any]) -> None:
        """What the input's request adds to a run: its client's tools, its generation
        parameters, and how many agent-to-agent calls deep it is."""
        declared = payload.get("tools")
        client_tools: dict[str, Tool] = {}
        for spec in declared if isinstance(declared, list) else ():
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                tool = ClientTool.from_spec(spec)
                client_tools[tool.name] = tool
        if client_tools:
            self.client_tools = client_tools
        generation = payload.get("generation")
        if isinstance(generation, dict):
            self.context.generation = generation
        depth = payload.get("callDepth")
        if isinstance(depth, int) and not isinstance(depth, bool) and 0 < depth <= MAX_CALL_DEPTH:
            # Asked by another agent, ``depth`` calls deep (an A2A message): its calls go deeper.
            self.context.call_depth = depth

    def close_calls(self, code: str, message: str) -> None:
        """Give every open call of memory an outcome, so each call keeps its answer."""
        memory = self.rt.session.memory
        for call in self.open_calls:
            memory.append(
                ToolOutcome(call.id, call.name, False, error=ToolFailure(code, message, "core"))
            )
        self.open_calls = ()

    async def run(self) -> None:
        """Serve the input to its end: completed, failed, timed out or stopped.

        Whatever happens, the input's waiter is woken with its result. The run
        is served in a cancel scope of its session's worker, or of its asker
        when the asker serves it (``rt.live_scope``): a ``/stop`` or the
        provider deadline cancels it, the cancellation leaves this method (its
        open calls answered in memory first), and the worker or the asker, out
        of the scope, finishes the run with :meth:`finish_stopped`.
        """
        loop = self.loop
        rt = self.rt
        rt.stop_requested = rt.cancelled = False
        epoch = rt.epoch
        outbox = loop._outbox
        scope = rt.live_scope
        assert scope is not None, "a run is served by its session's worker"
        stopped = False
        try:
            try:
                rt.scope = scope
                text = self.text
                # (A line that starts with a letter or digit is no command.)
                if rt.session.locked or (not text[:1].isalnum() and parse_line(text) is not None):
                    await self.serve()
                else:
                    await self.think_act(text)
            except (QueueClosed, LeaseLost):
                raise
            except Exception as exc:
                # A defect past every specific guard: this run ends, the loop and
                # the other sessions go on.
                rt.scope = None
                self.close_calls("INTERNAL_ERROR", "the run failed before this call finished")
                await outbox.fail(self.tick, "INTERNAL_ERROR", describe_exception(exc), self.result)
                await self.set_state(_IDLE, reason="error")
                loop.runs_completed += 1
                return
            except BaseException:
                rt.scope = None
                if scope.cancel_called or rt.served_here:
                    # Stopped or timed out (or, served in its asker's task, its
                    # asker was cancelled: a stop too): memory is made whole
                    # now (before a store saves it), the rest once out of the scope.
                    if not scope.cancel_called:
                        rt.stop_requested = True
                    stopped = True
                    rt.stopped_turn = self
                    # Answer the open calls, unless a /reset has cleared memory meanwhile.
                    if rt.epoch == epoch:
                        self.close_calls(
                            "CANCELLED", "the run was stopped before this call finished"
                        )
                raise
            rt.scope = None
            loop.runs_completed += 1
        except QueueClosed:
            # The bus was closed under the run: nothing more can be said.
            rt.scope = None
            if self.result is not None:
                self.result.stopped = True
        finally:
            if not stopped:
                loop._waiters.finish(self.input.id)

    async def finish_stopped(self) -> None:
        """End a run its scope cancelled: stopped (``/stop``, ``/reset``) or timed out.

        Called by the session's worker, or the asker that served the run, once
        out of the cancelled scope; the input's waiter is woken with the
        result at the end.
        """
        loop = self.loop
        try:
            if self.rt.stop_requested:
                loop.runs_stopped += 1
                if self.result is not None:
                    self.result.stopped = True
                await self.set_state(_IDLE, reason="stopped")
            else:
                # Only a provider call runs under the run's deadline.
                timeout = loop.limits.provider_timeout
                await loop._outbox.fail(
                    self.tick,
                    "PROVIDER_TIMEOUT",
                    f"the provider gave no answer within {timeout:g} s",
                    self.result,
                )
                await self.set_state(_IDLE, reason="provider timeout")
                loop.runs_completed += 1
        except QueueClosed:
            if self.result is not None:
                self.result.stopped = True
        finally:
            loop._waiters.finish(self.input.id)

    async def fail(self, parent: Event | EventRef, code: str, message: str) -> None:
        await self.loop._outbox.fail(parent, code, message, self.result)

    def state_now(self, state: AgentState) -> bool:
        """Change to ``state`` without waiting; False when that needs :meth:`set_state`.

        It does on a remote bus, and when the local bus is full (the change
        then waits for room: a run's events are never dropped).
        """
        old = self.state
        if old is state:
            return True
        emit_note = self.loop._executor.emit_note
        if emit_note is None:
            return False
        try:
            emit_note(self.tick, _STATE_CHANGE, _CHANGE[old, state], self.loop.source)
        except QueueFull:
            return False
        self.state = state
        self.rt.session.state = state
        return True

    async def set_state(self, state: AgentState, *, reason: str | None = None) -> None:
        if self.state is state:
            return
        if reason is None:
            if self.state_now(state):
                return
            payload: dict[str, Any] = _CHANGE[self.state, state]
        else:
            payload = {"from": _VALUE[self.state], "to": _VALUE[state], "reason": reason}
        loop = self.loop
        event = self.tick.child(_STATE_CHANGE, payload, source=loop.source)
        publish = self.loop._publish
        if publish is None:
            await loop.bus.apublish(event)
        else:
            try:
                publish(event, _STATE_CHANGE)
            except QueueFull:
                await loop.bus.apublish(event)
        # Recorded once published: a run stopped while it waited for room on the
        # bus reports its last published state, so the chain of changes holds.
        self.state = state
        self.rt.session.state = state

    async def serve(self) -> None:
        event = self.input
        text = self.text
        command = parse_line(text)
        session = self.rt.session
        if session.locked:
            await self.fail(
                event,
                "SESSION_LOCKED",
                f"session {session.id!r} is locked after {session.failure_streak} "
                "failed tool calls in a row; send /reset",
            )
            return
        if command is not None:
            await self.slash_tool(command.name, command.argline)
        else:
            await self.think_act(text)

    async def slash_tool(self, name: str, argline: str) -> None:
        """Run a tool straight from a ``/name args`` line, without the provider."""
        tools = self.loop.tools
        tool = find_tool(name, tools)
        if tool is None:
            await self.fail(
                self.input,
                "UNKNOWN_COMMAND",
                f"unknown command /{name}; "
                f"built-ins: {', '.join('/' + c for c in BUILTIN_COMMANDS)}; "
                f"tools: {', '.join('/' + t for t in tools) or 'none'}",
            )
            return
        parse_error: ToolArgumentsError | None = None
        try:
            call = ToolCall(tool.name, parse_tool_args(tool, argline))
        except ToolArgumentsError as exc:
            parse_error = exc
        except ValueError as exc:  # arguments the core cannot carry (nested too deep)
            parse_error = ToolArgumentsError(f"/{tool.name}: {exc}")
        if parse_error is not None:
            call = ToolCall(tool.name, {"_line": argline[:1000]})
        await self.set_state(_EXECUTING)
        await self.execute([call], parse_errors={0: parse_error} if parse_error else None)
        # A slash command is the user's: what the core observed is not for the provider.
        self.observations.clear()
        await self.set_state(_IDLE)

    async def execute(
        self,
        calls: Sequence[ToolCall],
        parse_errors: Mapping[int, ToolArgumentsError | None] | None = None,
    ) -> tuple[list[ToolOutcome], bool]:
        """Run the round's calls; returns their outcomes and whether the session got locked."""
        executor = self.loop._executor
        tools = {**executor.tools, **self.client_tools} if self.client_tools else None
        if self.rt.enter_scope is not None and executor.may_wait(calls, tools):
            self.enter_scope()
        outcomes = await executor.execute(
            self.tick, calls, self.context, self.observations, parse_errors, tools
        )
        locked = executor.count_failures(self.rt, outcomes, calls, self.observations)
        if locked:
            await self.report_locked()
        return outcomes, locked

    def enter_scope(self) -> None:
        """Enter the run's cancel scope, if it has not been (its asker serves it: RunScope)."""
        rt = self.rt
        enter_scope = rt.enter_scope
        if enter_scope is not None:
            enter_scope()
            rt.enter_scope = None

    async def report_locked(self) -> None:
        """The session has just been locked by its failure streak: say so."""
        session = self.rt.session
        await self.fail(
            self.tick,
            "SESSION_LOCKED",
            f"{session.failure_streak} tool calls failed in a row; "
            f"session {session.id!r} is locked until /reset",
        )

    async def think_act(self, prompt: str) -> None:
        loop = self.loop
        source = loop.source
        limits = loop.limits
        rt = self.rt
        session = rt.session
        memory = session.memory
        memory.append(new_user_turn(prompt))
        # What the round appends starts no turn: added as Memory.append adds it.
        remember = memory.add
        remember_all = memory.add_all
        context = self.context
        journal = context.journal
        limit = loop.max_tools
        if limit is not None and len(context.tools) > limit:
            self.enter_scope()  # (tools are chosen in a worker thread)
            context.tools = await self.select_tools(prompt)
        if self.client_tools:
            context.tools = {**context.tools, **self.client_tools}
        event = self.input
        result = self.result
        executor = loop._executor
        provider = loop.provider
        emit_note = executor.emit_note
        emit_mark = executor.emit_mark
        mark_unread = executor.mark_unread
        note_unread = executor.note_unread
        sink = self.emit_delta
        tool_rounds = 0
        round_no = 0
        # What context.tool_results answers: the run knows it without reading memory.
        context._tool_results = ()
        while True:
            round_no += 1
            tick: Event | EventRef | None
            old = self.state
            # Read by nobody, the tick and the change to THINKING go in one
            # call (the tick an EventRef: a parent, no more); else one by one.
            tick = (
                None
                if mark_unread is None
                else mark_unread(
                    event, _TICK_START, None if old is _THINKING else _STATE_CHANGE, source
                )
            )
            if tick is not None:
                self.state = session.state = _THINKING
            elif emit_mark is None:
                tick = event.child(_TICK_START, {"round": round_no}, source=source)
                await loop.bus.apublish(tick)
            else:
                try:
                    tick = emit_mark(event, _TICK_START, {"round": round_no}, source)
                except QueueFull:  # no room: made, and waits for room
                    tick = event.child(_TICK_START, {"round": round_no}, source=source)
                    await loop.bus.apublish(tick)
            self.tick = tick  # once published: later events may name it as parent
            if self.state is not _THINKING and not self.state_now(_THINKING):
                await self.set_state(_THINKING)
            context.round = round_no
            # A durable run handled again replays what an earlier attempt recorded.
            replayed = None if journal is None else journal.response(round_no)
            try:
                if replayed is not None:
                    response = replayed
                else:
                    context.text_sink = sink
                    # The provider's calls are made from the round's span (tracecontext).
                    working = current_event.set((tick.trace_id, tick.id))
                    try:
                        # (A sync provider's generate returns its answer: not awaited.)
                        raw: Any = provider.generate(prompt, context)
                        if type(raw) is not ProviderResponse and isawaitable(raw):
                            # The provider deadline: when it passes, the loop's watcher
                            # cancels the run's scope and the run ends (see run()).
                            loop._deadlines.begin(rt, limits.provider_timeout)
                            try:
                                raw = await raw
                            finally:
                                loop._deadlines.end(rt)
                    finally:
                        current_event.reset(working)
                        context.text_sink = None
                    response = raw if type(raw) is ProviderResponse else _coerce_response(raw)
            except AgentPainException as exc:
                await self.fail(tick, "AGENT_PAIN", describe_exception(exc).partition(": ")[2])
                break
            except Exception as exc:
                await self.fail(tick, "PROVIDER_ERROR", describe_exception(exc))
                break
            metadata = response.metadata
            if result is not None and isinstance(metadata, dict):
                usage = metadata.get("usage")
                if isinstance(usage, dict):
                    result.usage = add_usage(result.usage, usage)
            # A /stop or /reset that came while the provider answered wins over
            # the answer: nothing of it goes into memory. (An awaited call that
            # completes in the loop iteration of a cancel is not interrupted:
            # the checkpoint raises the cancellation now.)
            if rt.cancelled:
                await anyio.lowlevel.checkpoint()
            calls, text, thought, segments, plain = response.parts()
            if calls and journal is not None and replayed is None:
                # Recorded before any of its tools runs: a run handled again asks
                # for the same calls (their ids key their recorded outcomes).
                await journal.record_response(round_no, response)
            remember(new_assistant_turn(text, calls, thought))
            self.open_calls = calls
            if segments is not None:
                # One plain text segment of ASCII: an event can carry it (nothing
                # to check by encoding it); read by nobody, it is counted, not made
                # (what the caller hears is the run's result).
                if not (plain and note_unread is not None and note_unread(OUTPUT_AGENT_MESSAGE)):
                    payload: dict[str, Any] = {
                        "text": text,
                        "segments": segments,
                        "final": not calls,
                    }
                    if metadata is not None:
                        payload["metadata"] = metadata
                    said_event: Event | None = None
                    try:
                        if plain and emit_note is not None:
                            try:
                                emit_note(event, OUTPUT_AGENT_MESSAGE, payload, source)
                            except QueueFull:  # no room: made, and waits for room
                                said_event = event.child(
                                    OUTPUT_AGENT_MESSAGE, payload, source=source
                                )
                        elif executor.emit_child is None:
                            said_event = event.child(OUTPUT_AGENT_MESSAGE, payload, source=source)
                        else:
                            try:
                                executor.emit_child(event, OUTPUT_AGENT_MESSAGE, payload, source)
                            except QueueFull:  # no room: made again, waits for room
                                said_event = event.child(
                                    OUTPUT_AGENT_MESSAGE, payload, source=source
                                )
                    except (TypeError, ValueError) as exc:
                        # Deeper than an event may nest, or not JSON.
                        self.close_calls("AGENT_PAIN", "the response that asked for it was refused")
                        await self.fail(
                            tick, "AGENT_PAIN", f"the provider's response cannot be sent: {exc}"
                        )
                        break
                    if said_event is not None:
                        await loop.bus.apublish(said_event)
                if result is not None:
                    result.replies.append(text)
            if not calls:
                break
            if tool_rounds >= limits.max_tool_rounds:
                message = (
                    f"the provider asked for tools after {limits.max_tool_rounds} tool rounds; "
                    "the run stops here"
                )
                self.close_calls("TOOL_ROUND_LIMIT", message)
                memory.append(Observation(message))
                await self.fail(tick, "TOOL_ROUND_LIMIT", message)
                break
            tool_rounds += 1
            if self.state is not _EXECUTING:
                # Read by nobody, the change is counted, not made.
                if note_unread is not None and note_unread(_STATE_CHANGE):
                    self.state = session.state = _EXECUTING
                elif not self.state_now(_EXECUTING):
                    await self.set_state(_EXECUTING)
            # (What execute() does, without its coroutine.)
            observations = self.observations
            done = (
                await executor.execute_at_once(tick, calls[0], context, observations)
                if len(calls) == 1 and not self.client_tools
                else None
            )
            outcomes: Sequence[ToolOutcome]
            if done is not None and done.success:
                # One call, and it succeeded: the failure streaks start again
                # (what count_failures does for it, without its call).
                outcomes = (done,)
                session.failure_streak = 0
                rt.failure_key = None
                rt.failure_repeats = 0
                locked = False
            else:
                if done is not None:
                    outcomes = (done,)
                else:
                    run_tools = (
                        {**executor.tools, **self.client_tools} if self.client_tools else None
                    )
                    if rt.enter_scope is not None and executor.may_wait(calls, run_tools):
                        self.enter_scope()
                    outcomes = await executor.execute(
                        tick, calls, context, observations, None, run_tools
                    )
                locked = executor.count_failures(rt, outcomes, calls, observations)
            if locked:
                await self.report_locked()
            if rt.cancelled:
                await anyio.lowlevel.checkpoint()
            # Each call's outcome right after the call, then what the core observed.
            remember_all(outcomes)
            context._tool_results = tuple(outcomes)
            self.open_calls = ()
            if observations:
                remember_all(observations)
                observations.clear()
            if locked:
                break
        if self.state is not _IDLE:
            if note_unread is not None and note_unread(_STATE_CHANGE):
                self.state = session.state = _IDLE
            elif not self.state_now(_IDLE):
                await self.set_state(_IDLE)

    async def select_tools(self, prompt: str) -> Mapping[str, Tool]:
        """The tools the provider sees for this input (spec 000 section 6B).

        All of them, unless there are more than ``max_tools``: then the
        retriever's pick. A tool left out still runs if the provider names it.
        The built-in lexical retriever answers in microseconds, on the event
        loop; any other (an embedding model behind a network call) runs in a
        worker thread, so that it does not hold up the other sessions, and a
        ``/stop`` does not wait for it.
        """
        loop = self.loop
        tools = loop.tools
        limit = loop.max_tools
        if limit is None or len(tools) <= limit:
            return tools
        retriever = loop.retriever
        if retriever is None:
            retriever = loop.retriever = LexicalRetriever()
        selected: Sequence[str]
        if type(retriever) is LexicalRetriever:
            selected = retriever.select(prompt, tools, limit)
        else:
            selected = await anyio.to_thread.run_sync(
                retriever.select, prompt, tools, limit, abandon_on_cancel=True
            )
        chosen: dict[str, Tool] = {}
        for name in selected:
            tool = tools.get(name)
            if tool is not None:
                chosen[name] = tool
                if len(chosen) == limit:
                    break
        return chosen

    def emit_delta(self, text: str) -> None:
        """What ``context.emit_text_delta`` calls during a provider call: a delta of this round.

        A provider may stream in a worker thread (a sync SDK under
        ``anyio.to_thread``): the event is then handed to the event loop, which
        owns the bus, and the thread waits until it is published.
        """
        if not isinstance(text, str):
            raise TypeError(f"a text delta must be a str, not {type(text).__name__}")
        loop = self.loop
        if threading.get_ident() == loop._loop_thread:
            # Nobody subscribes to deltas and the bus is idle: counted, never made.
            note_unread = loop._executor.note_unread
            if note_unread is not None and note_unread(_AGENT_DELTA):
                return
        event = self.tick.child(
            _AGENT_DELTA, {"text": text, "round": self.context.round}, source=loop.source
        )
        # A preview: dropped rather than waited for when the bus is full.
        if threading.get_ident() == loop._loop_thread:
            loop._outbox.publish_or_drop(event)
        else:
            anyio.from_thread.run_sync(loop._outbox.publish_or_drop, event, token=loop._token)
