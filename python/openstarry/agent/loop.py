"""The execution loop: an agent's think-act loop for every session, driven by events on a bus.

The loop subscribes to ``INPUT:USER_MESSAGE``, ``INPUT:SYSTEM_COMMAND`` and
``EXEC:TOOL_CALL`` and answers each, publishing the events of spec 002. It is
built from four parts, each in its own module:

- :mod:`~openstarry.agent.sessions`: each session's memory, its queue of inputs
  and the worker that serves them (sessions never wait for each other);
- :mod:`~openstarry.agent.turn`: one input served round by round (spec 000
  section 5): tick, provider, text out, tools, memory;
- :mod:`~openstarry.agent.execution`: the tool calls of a round, their events,
  their failures and the failure streaks that lock a session;
- :mod:`~openstarry.agent.external`: calls from other agents
  (:meth:`ExecutionLoop.call_tool`, MCP).

The loop itself keeps the lifecycle, the inputs (:meth:`~ExecutionLoop.ask`,
:meth:`~ExecutionLoop.start`, :meth:`~ExecutionLoop.submit`) and the built-in
commands. What is not the provider's success is told to it rather than raised
(spec 000 section 7). Every event of a run is a descendant of the input
(:meth:`Event.child <openstarry.core.Event.child>`): same ``traceId`` and
``sessionId``, and a ``parentId``. A ``/stop`` (a slash line, or an
``INPUT:SYSTEM_COMMAND`` at priority 0, which overtakes everything queued on the
bus) cancels the run in progress at once; the session stays usable.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from openstarry._lifecycle import Lifecycle
from openstarry.agent.approvals import answer_approval
from openstarry.agent.commands import (
    InvalidCommand,
    help_text,
    parse_line,
    system_command,
    user_message,
)
from openstarry.agent.deadlines import Deadlines, clock_of_backend
from openstarry.agent.execution import ToolExecutor, tools_by_name
from openstarry.agent.external import MAX_EXTERNAL_CALLS, ExternalCalls
from openstarry.agent.interfaces import AgentContext, Provider, Tool
from openstarry.agent.limits import LoopLimits
from openstarry.agent.memory import (
    Session,
    ToolOutcome,
    slots_maker,
)
from openstarry.agent.outbox import Outbox
from openstarry.agent.results import PendingRun, RunResult, Waiters, add_usage, wakeup_factory
from openstarry.agent.retrieval import ToolRetriever
from openstarry.agent.runs import serve_input
from openstarry.agent.sessions import Sessions
from openstarry.agent.store import SessionStore
from openstarry.agent.taskscope import CancelScopeLike, scope_factory
from openstarry.agent.waits import Answer
from openstarry.bus import Emit, EventBus, Signal, Subscription
from openstarry.core import Event, EventRef
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import (
    OUTPUT_AGENT_MESSAGE_DELTA,
    AgentState,
    EventType,
)

__all__ = [
    "MAX_EXTERNAL_CALLS",
    "ExecutionLoop",
    "LoopLimits",
    "PendingRun",
    "RunResult",
    "add_usage",
]

#: Seconds the loop's exit waits for stopped runs to publish their last events.
_WIND_DOWN = 1.0

_USER_MESSAGE = EventType.USER_MESSAGE.value
#: ``RunResult(trace_id, replies)`` and ``AgentContext(...)`` (every field but
#: the last given), each in one call: a run makes one of each.
_new_run_result: Callable[[str, list[str]], RunResult] = slots_maker(RunResult)
_new_context: Callable[..., AgentContext] = slots_maker(AgentContext)
_SYSTEM_COMMAND = EventType.SYSTEM_COMMAND.value
_TICK_START = EventType.TICK_START.value
_STATE_CHANGE = EventType.STATE_CHANGE.value
_TOOL_CALL = EventType.TOOL_CALL.value
_AGENT_DELTA = OUTPUT_AGENT_MESSAGE_DELTA
_IDLE, _THINKING, _EXECUTING = AgentState.IDLE, AgentState.THINKING, AgentState.EXECUTING


class ExecutionLoop(Lifecycle):
    """Runs an agent's think-act loop for every session, driven by events on a bus.

    Use it as an async context manager inside a running :class:`EventBus`:

        async with EventBus() as bus, ExecutionLoop(bus, provider, tools) as loop:
            result = await loop.ask("Query weather in Taipei", session_id="s1")

    It can be entered again after it has exited; its sessions are kept.

    Args:
        bus: The bus it subscribes to (``INPUT:USER_MESSAGE`` and
            ``INPUT:SYSTEM_COMMAND``) and publishes its events on.
        provider: The agent's brain.
        tools: The agent's tools, as a list or by name.
        limits: The run limits (defaults: 10 tool rounds, 30 s per tool,
            120 s per provider call, 4 tools at once).
        agent_name: The agent's name, shown to providers and as the events' source.
        memory_window: User turns each session's memory keeps (``None``: all).
        instructions: A system prompt handed to the provider in the context.
        max_tools: When the agent has more tools than this, only this many,
            the most relevant to the input, reach the provider in
            ``context.tools`` (spec 000 section 6B); ``None`` sends them all.
        retriever: What picks them (default: the built-in lexical scorer).
        approval_tools: The names of the tools whose calls wait for a yes
            before they run (:mod:`openstarry.agent.waits`); the waits are in
            :attr:`waits`.
        store: Where sessions' memory lives between runs
            (:class:`~openstarry.agent.store.SessionStore`); ``None`` keeps it in
            this process. With a store, each run loads its session's memory
            before it starts and saves it when it ends.
    """

    def __init__(
        self,
        bus: EventBus,
        provider: Provider,
        tools: Iterable[Tool] | Mapping[str, Tool] = (),
        *,
        limits: LoopLimits | None = None,
        agent_name: str = "openstarry",
        memory_window: int | None = 50,
        instructions: str | None = None,
        max_tools: int | None = None,
        retriever: ToolRetriever | None = None,
        approval_tools: Iterable[str] = (),
        store: SessionStore | None = None,
    ) -> None:
        if max_tools is not None and (
            isinstance(max_tools, bool) or not isinstance(max_tools, int) or max_tools < 1
        ):
            raise ValueError(f"max_tools must be an int of at least 1 or None, not {max_tools!r}")
        self.max_tools = max_tools
        self.retriever = retriever
        if store is not None and not isinstance(store, SessionStore):
            raise TypeError(f"store must be a SessionStore, not {type(store).__name__}")
        self.store = store
        self.bus = bus
        self.instructions = instructions
        self.provider = provider
        self.limits = limits = limits or LoopLimits()
        self.agent_name = agent_name
        self.source = source = f"agent:{agent_name}"
        self.memory_window = memory_window
        self._waiters = Waiters()
        #: ``bus.emit`` where a run may use it for its events instead of
        #: awaiting ``apublish`` (on the local bus they differ only when it is
        #: full); ``None`` on a remote bus.
        self._publish: Emit | None = bus.emit if bus.backend is None else None
        self._outbox = Outbox(bus, source, self._waiters)
        self._executor = ToolExecutor(
            bus, tools_by_name(tools), limits, source, approval_tools=frozenset(approval_tools)
        )
        #: The calls waiting for someone outside: client tools' outputs, approvals.
        self.waits = self._executor.waits
        self._sessions = Sessions(
            partial(serve_input, self),
            self._waiters,
            release=partial(_release_dropped, bus, self._outbox),
            memory_window=memory_window,
            max_sessions=limits.max_sessions,
            max_pending_inputs=limits.max_pending_inputs if bus.backend is None else None,
        )
        self._external = ExternalCalls(
            self._executor, self._context, self._outbox.publish_or_drop, self._outbox.error
        )
        self._clock: Callable[[], float] = anyio.current_time
        #: The provider calls in progress and their deadlines.
        self._deadlines = Deadlines()
        #: Makes the runs' and the tool calls' cancel scopes (set for the backend on entry).
        self._new_scope: Callable[..., CancelScopeLike] = anyio.CancelScope
        #: Makes the one-shot signals of runs and workers (set for the backend on entry).
        self._new_signal: Callable[[], Signal] = anyio.Event
        self._open = False
        #: While it runs: its inputs' subscription, its task group's start_soon.
        self._inputs: Subscription | None = None
        self._start_soon: Callable[..., Any] | None = None
        self._take_ref: Callable[[str, str, str, Subscription], EventRef | None] | None = None
        # Where the loop runs, for text deltas sent from a provider's worker thread.
        self._loop_thread = 0
        self._token: Any = None
        self._quit_hooks: list[Callable[[str], None]] = []
        self.runs_completed = 0
        self.runs_stopped = 0

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's tools by name (an :class:`~openstarry.agent.runtime.Agent`
        adds its toolsets' while it runs)."""
        return self._executor.tools

    @tools.setter
    def tools(self, tools: Iterable[Tool] | Mapping[str, Tool]) -> None:
        """Replace the tools; while the loop runs, a ``KERNEL:TOOLS_CHANGED`` says so.

        Its payload is ``{"tools": [names]}``; an MCP server of the agent
        turns it into ``notifications/tools/list_changed``. The next round of
        every run sees the new tools.
        """
        self._executor.tools = by_name = tools_by_name(tools)
        if self._open:
            changed = Event.new(
                TOOLS_CHANGED, {"tools": list(by_name)}, source=self.source, session_id="agent"
            )
            with contextlib.suppress(QueueFull, QueueClosed):
                self.bus.publish(changed)

    # -- lifecycle -------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[ExecutionLoop]:
        bus = self.bus
        owner = bus.input_owner
        if owner is not None and owner is not self:
            raise RuntimeError(
                "this EventBus already has an ExecutionLoop serving its inputs; "
                "two would both answer every input: give each agent its own bus"
            )
        async with anyio.create_task_group() as task_group:
            bus.input_owner = self
            self._new_signal = new_signal = wakeup_factory()
            self._new_scope = self._executor.new_scope = scope_factory()
            self._sessions.open(task_group, new_signal, self._new_scope)
            self._start_soon = task_group.start_soon
            self._external.open(task_group)
            self._clock = clock = clock_of_backend()
            self._deadlines = self._executor.deadlines = Deadlines(clock)
            task_group.start_soon(self._deadlines.watch, bus.new_signal)
            self._loop_thread = threading.get_ident()
            self._token = anyio.lowlevel.current_token()
            # The local bus's Emitter: emit, child, note, mark and (EventBus.deliver's) take.
            emitter = bus.emitter if bus.backend is None else None
            self._publish = self._executor._publish = None if emitter is None else emitter.emit
            self._executor.emit_child = None if emitter is None else emitter.child
            self._executor.emit_note = None if emitter is None else emitter.note
            self._executor.emit_mark = None if emitter is None else emitter.mark
            self._executor.mark_unread = None if emitter is None else emitter.mark_unread
            self._executor.note_unread = None if emitter is None else emitter.note_unread
            self._take_ref = None if emitter is None else emitter.take_ref
            # The loop's own calls are no business of that handler (it ignores them).
            self._executor.own_calls = calls = bus.subscribe(_TOOL_CALL, self._external.on_call)
            self._inputs = inputs = bus.subscribe(_USER_MESSAGE, self._on_user_message)
            subscriptions: list[Subscription] = [
                inputs,
                bus.subscribe(_SYSTEM_COMMAND, self._on_system_command),
                calls,
            ]
            self._open = True
            failed = False
            try:
                yield self
            except BaseException:
                failed = True
                raise
            finally:
                # Leaving the loop stops the agent: every run in progress is
                # stopped as /stop would (its calls answered, its state back to
                # IDLE), and then the workers exit. Whatever still runs after a
                # grace period, or when leaving on an exception, is cancelled.
                self._open = False
                self._inputs = None
                self._start_soon = None
                for subscription in subscriptions:
                    subscription.cancel()
                if bus.input_owner is self:
                    bus.input_owner = None
                self._external.close("the agent stopped before this call finished")
                self._sessions.close()
                self._waiters.stop_all()
                try:
                    if not failed:
                        await self._sessions.wait_closed(_WIND_DOWN)
                finally:
                    task_group.cancel_scope.cancel()

    def on_quit(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(session_id)`` when a session sends ``/quit``."""
        self._quit_hooks.append(hook)

    # -- sessions and inputs ---------------------------------------------

    def session(self, session_id: str) -> Session:
        """The session of that id, created empty on first use."""
        return self._sessions.get(session_id).session

    @property
    def sessions(self) -> Mapping[str, Session]:
        return self._sessions.sessions

    def submit(
        self, text: str, *, session_id: str, source: str = "user", priority: int | None = None
    ) -> Event:
        """Publish an ``INPUT:USER_MESSAGE`` and return it; its ``trace_id`` names the run."""
        event = user_message(text, session_id, source, priority)
        self.bus.publish(event)
        return event

    async def ask(
        self, text: str, *, session_id: str | None = "default", source: str = "user"
    ) -> RunResult:
        """Send ``text`` to the session and wait until the run it starts has ended.

        ``session_id=None`` runs it stateless: in a new session, with no
        history, forgotten once the run has ended.

        When the session is free (no run in progress, nothing queued) and the
        input reaches it at once (the bus is idle and nothing else subscribes
        to inputs), the run is served in the calling task, as a function call
        would be: no worker is woken and nothing waits to be woken. A run whose
        provider and tools never wait then completes without yielding to the
        event loop, as any coroutine that never waits does.

        Cancelling ``ask`` stops its run, as ``/stop`` would: the run's open
        tool calls are answered in memory, it ends ``stopped`` and the session
        stays usable; an input still queued behind another run of its session
        is dropped. (An input still on a busy bus when ``ask`` is cancelled is
        served anyway. :meth:`start` and its ``wait()`` leave the run going
        when the wait is cancelled.)
        """
        # Served here when the session is free and the input reaches it at once
        # (EventBus.deliver). A built-in command goes the usual way.
        inputs = self._inputs
        # (A line that starts with a letter or digit is no command, as Turn.run reads it.)
        command = None if text[:1].isalnum() else parse_line(text)
        local = self._publish is not None  # (a remote bus serves inputs where it will)
        if local and inputs is not None and (command is None or not command.is_builtin):
            sessions = self._sessions
            stateless = session_id is None
            sid = f"stateless-{uuid.uuid4().hex}" if session_id is None else session_id
            rt = sessions.get(sid)
            if rt.free:
                rt.ephemeral = rt.ephemeral or stateless
                # Handled by this loop alone, the input is not made: an
                # EventRef stands for it, and its text is handed over.
                take_ref = self._take_ref
                taken = None if take_ref is None else take_ref(_USER_MESSAGE, sid, source, inputs)
                if taken is not None:
                    result = _new_run_result(taken.trace_id, [])
                    waiters = self._waiters
                    input_id = taken.id
                    waiters.add(input_id, result, None)
                    # A provider that completes at once, and no store to read:
                    # the run's cancel scope is entered only if the run waits.
                    at_once = getattr(self.provider, "completes_at_once", False) is True and (
                        self.store is None or rt.ephemeral
                    )
                    try:
                        await sessions.serve_here(rt, sessions.claim(rt), taken, text, at_once)
                    finally:
                        waiters.forget(input_id)
                    return result
                if stateless:
                    sessions.discard_ephemeral(sid)
        pending = self.start(text, session_id=session_id, source=source)
        try:
            return await pending.wait()
        except BaseException:
            if not pending.ended:
                self._sessions.stop_input(pending.event)
            raise

    def start(
        self,
        text: str,
        *,
        session_id: str | None = "default",
        source: str = "user",
        extra: Mapping[str, Any] | None = None,
        trace_id: str | None = None,
    ) -> PendingRun:
        """Publish ``text`` as an ``INPUT:USER_MESSAGE`` now; await the returned run's ``wait()``.

        Inputs started one after the other in a session run in that order.
        ``session_id=None`` makes the run stateless: it runs in a session of
        its own (``"stateless-<uuid>"``, the events' ``sessionId``) that starts
        with an empty memory, is never loaded from or saved to the store, and
        is forgotten once the run has ended (or its input was refused), so
        stateless runs leave no sessions behind.
        ``extra`` goes into the input's payload beside the text: ``"tools"``
        (functions the client runs, as ``{"name", "description",
        "parameters"}``) and ``"generation"`` (parameters for the provider,
        ``context.generation``).
        ``trace_id`` continues a caller's trace (a transport's incoming
        ``X-OpenStarry-Trace-ID`` or ``traceparent``); by default a new one.

        When the bus is at capacity, the input is published by the run's
        ``wait()``, once there is room; a stateless run whose wait is
        cancelled before then leaves no session behind.

        Raises:
            QueueClosed: the bus is closed.
            RuntimeError: the loop is not running.
        """
        if not self._open:
            raise RuntimeError(
                "the ExecutionLoop is not running: use `async with ExecutionLoop(...)`"
            )
        stateless = session_id is None
        if session_id is None:
            session_id = f"stateless-{uuid.uuid4().hex}"
            self._sessions.get(session_id).ephemeral = True
        event = user_message(text, session_id, source, None, extra, trace_id)
        waiters = self._waiters
        bus = self.bus
        pending = PendingRun(event, self._new_signal(), waiters, bus.apublish)
        if stateless:
            pending.abandoned = partial(self._sessions.discard_ephemeral, session_id)
        waiters.add(event.id, pending.result, pending._done)
        try:
            # On an idle bus where only this loop takes inputs, the input is
            # handed to its session at once (see EventBus.deliver).
            inputs = self._inputs
            if inputs is None or bus.deliver(event, _USER_MESSAGE, inputs) is None:
                bus.publish(event)
        except QueueFull:
            pending._published = False
        except BaseException:
            waiters.forget(event.id)
            if stateless:
                self._sessions.discard_ephemeral(session_id)
            raise
        return pending

    def command(
        self, command: str, args: Sequence[str] = (), *, session_id: str, source: str = "user"
    ) -> Event:
        """Publish an ``INPUT:SYSTEM_COMMAND`` at priority 0.

        At priority 0 it overtakes everything queued on the bus, so a ``/stop``
        takes effect at once.
        """
        event = Event.new(
            _SYSTEM_COMMAND,
            {"command": command.lstrip("/"), "args": list(args)},
            source=source,
            session_id=session_id,
            priority=0,
        )
        self.bus.publish(event)
        return event

    async def call_tool(
        self,
        name: str,
        args: Any,
        *,
        trace_id: str | None = None,
        call_depth: int = 0,
        source: str = "mcp",
        session_id: str = "mcp",
        traceparent: str | None = None,
        approval: Answer | None = None,
    ) -> ToolOutcome:
        """Run one of the agent's tools for another agent (an MCP ``tools/call``).

        The call enters as an ``EXEC:TOOL_CALL`` event on the bus, with the
        caller's ``trace_id`` and a ``callDepth``, so it is traced and
        de-duplicated like any other event; the loop runs it as it runs the
        provider's calls (arguments validated, the tool timeout) with an
        :class:`AgentContext` carrying ``trace_id`` and ``call_depth``, and
        publishes its ``EXEC:TOOL_RESULT``. It touches no session memory
        (:mod:`openstarry.agent.external`).

        Which tools a caller may use is the transport's decision (the MCP
        server checks ``mcp.expose_tools``); here an unknown tool fails with
        ``TOOL_NOT_FOUND``. Cancelling the caller cancels the tool.

        ``traceparent`` names the caller's span (W3C): the call's payload
        carries it, and its ``openstarry.tool`` span is that span's child
        (:mod:`openstarry.otel`).

        A tool that needs approval (:meth:`needs_approval`) runs only with
        ``approval``, the caller's yes, got by the transport (the MCP server
        asks its client); a no is a ``DENIED`` outcome, and without one the
        call is refused (``APPROVAL_REQUIRED``).

        Returns:
            The outcome, as in the ``EXEC:TOOL_RESULT`` payload.

        Raises:
            RuntimeError: when the loop is not running.
        """
        return await self._external.call(
            name,
            args,
            trace_id=trace_id,
            call_depth=call_depth,
            source=source,
            session_id=session_id,
            traceparent=traceparent,
            approval=approval,
        )

    def needs_approval(self, name: str) -> bool:
        """Whether a call of the tool ``name`` waits for a person's yes (False for no such tool)."""
        tool = self._executor.tools.get(name)
        return tool is not None and self._executor.needs_approval(tool)

    @property
    def external_calls(self) -> int:
        """Calls from other agents running now."""
        return self._external.running

    def _context(self, session: Session, trace_id: str, call_depth: int = 0) -> AgentContext:
        """What a provider and the tools see of one run (or one call from another agent)."""
        # (AgentContext's fields, in order, the text sink and the kept outcomes unset.)
        return _new_context(
            self._executor.tools,
            session,
            self.agent_name,
            trace_id,
            0,
            self.instructions,
            call_depth,
            None,
            {},
            None,
            "",
        )

    def _on_user_message(self, event: Event) -> None:
        payload = event.payload
        text = payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            self._outbox.error(
                event, "INVALID_INPUT", "INPUT:USER_MESSAGE needs a payload with a string 'text'"
            )
            self._waiters.finish(event.id)
            self._sessions.discard_ephemeral(event.session_id)
            return
        command = parse_line(text)
        if command is not None and command.is_builtin:
            self._builtin(event, command.name, command.argline.split())
            self._waiters.finish(event.id)
            self._sessions.discard_ephemeral(event.session_id)
            return
        waiting = self._sessions.enqueue(event)
        if waiting is None:
            # On a remote bus the input counts as handled once its run ends.
            if self.bus.backend is not None:
                self.bus.hold(event)
        else:
            self._outbox.error(
                event,
                "SESSION_BUSY",
                f"session {event.session_id!r} already has {waiting} inputs waiting",
            )
            self._waiters.finish(event.id)

    def _on_system_command(self, event: Event) -> None:
        try:
            name, args = system_command(event.payload)
        except InvalidCommand as exc:
            self._outbox.error(event, exc.code, str(exc))
            return
        self._builtin(event, name, args)

    def _builtin(self, event: Event, name: str, args: list[str]) -> None:
        # A command creates no session: sent for an unknown id, it could
        # otherwise push real sessions out of the table.
        sessions = self._sessions
        rt = sessions.find(event.session_id)
        say = self._outbox.say
        if name == "stop":
            dropped = sessions.stop(rt) if rt is not None else 0
            say(
                event,
                f"Stopped.{f' Dropped {dropped} waiting input(s).' if dropped else ''}",
                command=name,
            )
        elif name == "reset":
            if rt is not None:
                sessions.reset(rt)
            store = self.store
            if store is not None and self._start_soon is not None:
                # With the command's commit, where the store commits with the bus.
                delete_with = getattr(store, "delete_with", None)
                if delete_with is None or not delete_with(self.bus, event, event.session_id):
                    self._start_soon(store.delete, event.session_id)
            say(event, "Session reset: memory cleared.", command=name)
        elif name in ("approve", "deny"):
            answer_approval(
                event, name, args, self.bus, self._executor.waits, self._outbox, self._start_soon
            )
        elif name == "quit":
            sessions.quit(event.session_id)
            say(event, "Goodbye.", command=name)
            for hook in self._quit_hooks:
                hook(event.session_id)
        elif name == "metrics":
            metrics = self.metrics()
            say(event, json.dumps(metrics, indent=2, sort_keys=True), command=name, data=metrics)
        else:
            say(event, help_text(self.tools), command=name)

    # -- metrics ---------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """The bus metrics plus the loop's.

        ``sessions`` known, ``running`` (a run in progress), ``waiting`` (inputs
        queued behind runs), ``idle_workers``, runs completed and stopped, and
        events dropped (sync replies to commands on a full bus).
        """
        return {
            "bus": self.bus.metrics(),
            "loop": {
                **self._sessions.metrics(),
                "runs_completed": self.runs_completed,
                "runs_stopped": self.runs_stopped,
                "events_dropped": self._outbox.dropped,
            },
        }


#: Published when the agent's tools change while the loop runs: ``{"tools": [names]}``.
TOOLS_CHANGED = "KERNEL:TOOLS_CHANGED"


def _release_dropped(bus: EventBus, outbox: Outbox, event: Event, *, handled: bool) -> None:
    """The sessions dropped a queued input (``/stop``, the loop leaving): released, and,
    when handled, its end said to an asker in another process that waits for it."""
    if handled:
        outbox.ended(event, stopped=True)
    bus.release(event, handled=handled)
