"""The execution loop: spec 000 section 5, with the events of spec 002.

An ``INPUT:USER_MESSAGE`` starts a run in its session. Each round of the run:

1. ``KERNEL:TICK_START`` (``{"round": n}``), then ``KERNEL:STATE_CHANGE`` to ``THINKING``;
2. the provider's ``generate(prompt, context)``, under the provider timeout;
3. its text (and other non-tool) segments go out as one ``OUTPUT:AGENT_MESSAGE``;
4. when it asked for tools: ``KERNEL:STATE_CHANGE`` to ``EXECUTING``, one
   ``EXEC:TOOL_CALL`` per ``tool_call`` segment, the tools run (concurrently,
   up to ``max_concurrent_tools``, each under the tool timeout), one
   ``EXEC:TOOL_RESULT`` per call in the order of the calls, and the outcomes go
   into the session memory before the next round.

The run ends with a response that asks for no tool, and goes back to ``IDLE``.
Every event of a run is a descendant of the input (:meth:`Event.child
<openstarry.core.Event.child>`): same ``traceId`` and ``sessionId``, and a
``parentId``: ticks and messages point at the input, state changes and tool
calls at their tick, a tool result at its call.

What is not the provider's success is told to it rather than raised (spec 000
section 7): an unknown tool or arguments that fail the tool's schema become a
failed ``EXEC:TOOL_RESULT`` and a system observation in memory; a tool that
raises or times out becomes a failed result. Three identical failing calls in a
row add a warning observation; ``max_failure_streak`` failures in a row lock the
session until ``/reset``. A provider that fails (``AgentPainException``, another
exception, or the timeout) ends the run with a ``KERNEL:ERROR``.

Sessions are isolated: each has its memory and its own worker task, so a slow
session never holds up another. A ``/stop`` (a slash line, or an
``INPUT:SYSTEM_COMMAND`` at priority 0, which overtakes everything queued on the
bus) cancels the run in progress at once; the session stays usable.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from openstarry.agent.commands import BUILTIN_COMMANDS, find_tool, parse_line, parse_tool_args
from openstarry.agent.interfaces import AgentContext, Provider, Tool
from openstarry.agent.memory import (
    AssistantTurn,
    Memory,
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.agent.retrieval import LexicalRetriever, ToolRetriever
from openstarry.bus import EventBus, Signal, Subscription, describe_exception
from openstarry.core import (
    ContentSegment,
    Event,
    ProviderResponse,
    ToolCall,
    decode_response,
)
from openstarry.errors import (
    AgentPainException,
    DecodeError,
    QueueClosed,
    QueueFull,
    ToolArgumentsError,
    ToolError,
)
from openstarry.events import (
    OUTPUT_AGENT_MESSAGE,
    OUTPUT_AGENT_MESSAGE_DELTA,
    AgentState,
    EventType,
)

__all__ = ["ExecutionLoop", "LoopLimits", "PendingRun", "RunResult"]

#: Seconds the loop's exit waits for stopped runs to publish their last events.
_WIND_DOWN = 1.0

#: Workers kept waiting for their session's next input; past it the one idle
#: the longest exits (its session starts a new worker when it needs one).
_MAX_IDLE_WORKERS = 256

_USER_MESSAGE = EventType.USER_MESSAGE.value
_SYSTEM_COMMAND = EventType.SYSTEM_COMMAND.value
_TICK_START = EventType.TICK_START.value
_STATE_CHANGE = EventType.STATE_CHANGE.value
_ERROR = EventType.ERROR.value
_TOOL_CALL = EventType.TOOL_CALL.value
_TOOL_RESULT = EventType.TOOL_RESULT.value
_AGENT_DELTA = OUTPUT_AGENT_MESSAGE_DELTA
#: Calls from other agents (``call_tool``, MCP) running at once, at most;
#: beyond it a call is answered BUSY at once rather than queued without bound.
MAX_EXTERNAL_CALLS = 256
_IDLE, _THINKING, _EXECUTING = AgentState.IDLE, AgentState.THINKING, AgentState.EXECUTING


@dataclass(frozen=True, slots=True)
class LoopLimits:
    """The limits of a run; the manifest's ``limits`` (seconds for timeouts)."""

    max_tool_rounds: int = 10
    tool_timeout: float = 30.0
    provider_timeout: float = 120.0
    max_concurrent_tools: int = 4
    #: Failed tool calls in a row (across rounds and inputs) that lock the session.
    max_failure_streak: int = 5
    #: Identical failing calls in a row that add a warning observation.
    repeated_failure_warning: int = 3
    #: Inputs that may wait behind a session's run; more are refused with ``KERNEL:ERROR``.
    max_pending_inputs: int = 64
    #: Sessions kept; past it the least recently used idle one is forgotten.
    max_sessions: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "max_tool_rounds",
            "max_concurrent_tools",
            "max_failure_streak",
            "max_pending_inputs",
            "max_sessions",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.repeated_failure_warning < 2:
            raise ValueError("repeated_failure_warning must be at least 2")
        for name in ("tool_timeout", "provider_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


@dataclass(slots=True)
class RunResult:
    """How one input ended, for :meth:`ExecutionLoop.ask`.

    Attributes:
        trace_id: The ``traceId`` shared by the run's events.
        replies: The text of each ``OUTPUT:AGENT_MESSAGE`` of the run, in order.
        stopped: The run was cancelled by ``/stop``, ``/reset`` or ``/quit``.
        error: The ``KERNEL:ERROR`` payload that ended the run, if one did.
        usage: The ``metadata.usage`` of every provider response of the run,
            added up (numbers summed, objects merged), or ``None`` when no
            provider reported any. It counts responses that only called tools,
            which publish no ``OUTPUT:AGENT_MESSAGE``.
    """

    trace_id: str
    replies: list[str] = field(default_factory=list)
    stopped: bool = False
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """The replies joined by newlines."""
        return "\n".join(self.replies)


class PendingRun:
    """An input published by :meth:`ExecutionLoop.start`; :meth:`wait` for its result."""

    __slots__ = ("_done", "_loop", "_published", "event", "result")

    def __init__(self, loop: ExecutionLoop, event: Event, done: Signal) -> None:
        self._loop = loop
        self.event = event
        self.result = RunResult(event.trace_id)
        self._done = done
        self._published = True

    async def wait(self) -> RunResult:
        """Wait until the run has ended (completed, failed or stopped) and return its result."""
        try:
            if not self._published:
                await self._publish_unless_done()
            await self._done.wait()
        finally:
            self._loop._forget(self.event.id)
        return self.result

    async def _publish_unless_done(self) -> None:
        """Wait for room on the bus, unless the run ends first (the loop leaves)."""
        async with anyio.create_task_group() as task_group:

            async def publish() -> None:
                await self._loop.bus.apublish(self.event)
                self._published = True
                task_group.cancel_scope.cancel()

            async def ended() -> None:
                await self._done.wait()
                task_group.cancel_scope.cancel()

            task_group.start_soon(publish)
            task_group.start_soon(ended)


class _SessionRuntime:
    """The loop's private state of one session."""

    __slots__ = (
        "epoch",
        "failure_key",
        "failure_repeats",
        "idle",
        "pending",
        "running",
        "scope",
        "session",
        "stop_requested",
        "wake",
    )

    def __init__(self, session: Session) -> None:
        self.session = session
        self.pending: deque[Event] = deque()
        #: A worker task serves this session (it stays, idle, after its last input).
        self.running = False
        #: The worker waits on ``wake`` for more input; ``idle`` says it is waiting.
        self.idle = False
        self.wake: Signal | None = None
        #: The cancel scope of the run in progress.
        self.scope: anyio.CancelScope | None = None
        self.stop_requested = False
        #: Bumped by /reset: a run that started before it leaves memory alone.
        self.epoch = 0
        self.failure_key: tuple[str, str] | None = None
        self.failure_repeats = 0


class _Run:
    """One input being served: the events it emits all descend from ``input``."""

    __slots__ = ("context", "input", "observations", "open_calls", "result", "rt", "state", "tick")

    def __init__(self, rt: _SessionRuntime, event: Event, context: AgentContext) -> None:
        self.rt = rt
        self.input = event
        self.tick = event
        self.state = _IDLE
        self.context = context
        self.result: RunResult | None = None
        #: Tool calls in memory that have no outcome yet (closed if the run stops).
        self.open_calls: Sequence[ToolCall] = ()
        #: Observations of this round, added to memory after the round's outcomes.
        self.observations: list[Observation] = []

    def close_calls(self, code: str, message: str) -> None:
        """Give every open call of memory an outcome, so each call keeps its answer."""
        memory = self.rt.session.memory
        for call in self.open_calls:
            memory.append(
                ToolOutcome(call.id, call.name, False, error=ToolFailure(code, message, "core"))
            )
        self.open_calls = ()


def add_usage(total: dict[str, Any] | None, usage: Mapping[str, Any]) -> dict[str, Any]:
    """``usage`` added into ``total``: numbers summed, objects merged, anything else the latest."""
    result = dict(total or {})
    for key, value in usage.items():
        old = result.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float, Mapping)):
            result[key] = value
        elif isinstance(value, Mapping):
            result[key] = add_usage(old if isinstance(old, dict) else None, value)
        elif isinstance(old, (int, float)) and not isinstance(old, bool):
            result[key] = old + value
        else:
            result[key] = value
    return result


def _result_payload(outcome: ToolOutcome) -> dict[str, Any]:
    """The ``EXEC:TOOL_RESULT`` payload of an outcome (spec 002 section 3.2)."""
    payload: dict[str, Any] = {
        "toolCallId": outcome.tool_call_id,
        "name": outcome.name,
        "success": outcome.success,
    }
    if outcome.error is not None:
        payload["error"] = outcome.error.to_dict()
    else:
        payload["result"] = outcome.result
    return payload


def _segment_dict(segment: ContentSegment) -> dict[str, Any]:
    out: dict[str, Any] = {"type": segment.type}
    if segment.text is not None:
        out["text"] = segment.text
    if segment.data is not None:
        out["data"] = segment.data
    if segment.mime_type is not None:
        out["mimeType"] = segment.mime_type
    if segment.ui is not None:
        out["ui"] = segment.ui
    return out


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


async def _honour_cancellation(scope: anyio.CancelScope | None) -> None:
    """Raise the cancellation now if ``scope`` was cancelled while the task was already woken.

    An awaited call that completes in the same loop iteration as a cancel is
    not interrupted; the run must not then write its result into a memory that
    /reset has cleared.
    """
    if scope is not None and scope.cancel_called:
        await anyio.lowlevel.checkpoint()


def _clock_of_backend() -> Callable[[], float]:
    """The clock cancel-scope deadlines are read on: ``anyio.current_time``, looked up once."""
    try:
        return asyncio.get_running_loop().time  # what anyio's asyncio backend reads
    except RuntimeError:
        return anyio.current_time


def _stray_cancellation() -> bool:
    """On asyncio 3.11+, whether the running task has no cancellation pending.

    A CancelledError raised then did not come from a cancel scope: it escaped
    from code the tool awaited. Elsewhere (trio, Python 3.10) every
    cancellation is taken as real.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False
    cancelling = getattr(task, "cancelling", None)
    return task is not None and cancelling is not None and cancelling() == 0


def _failure_of(exc: BaseException) -> ToolFailure:
    message = describe_exception(exc).partition(": ")[2]
    if isinstance(exc, ToolError):
        return ToolFailure(str(exc.code), message, "tool")
    if isinstance(exc, ToolArgumentsError):
        return ToolFailure("INVALID_ARGUMENTS", message, "core")
    if isinstance(exc, OSError) and isinstance(exc.errno, int):
        return ToolFailure(errno.errorcode.get(exc.errno, "EIO"), exc.strerror or message, "tool")
    return ToolFailure("TOOL_ERROR", describe_exception(exc), "tool")


class _ExternalCall:
    """A call from another agent: where its outcome goes, and the scope that runs it.

    ``dispatched`` once the bus handed its event to the loop; ``abandoned``
    once its caller went away (then it must not start).
    """

    __slots__ = ("abandoned", "dispatched", "done", "outcome", "scope")

    def __init__(self, done: Signal | None) -> None:
        self.done = done
        self.outcome: ToolOutcome | None = None
        self.scope: anyio.CancelScope | None = None
        self.dispatched = False
        self.abandoned = False

    def finish(self, outcome: ToolOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
        if self.done is not None:
            self.done.set()

    def cancel(self, message: str) -> None:
        if self.scope is not None:
            self.scope.cancel()
        self.finish(ToolOutcome("", "", False, error=ToolFailure("CANCELLED", message, "core")))


class ExecutionLoop:
    """Runs an agent's think-act loop for every session, driven by events on a bus.

    Use it as an async context manager inside a running :class:`EventBus`:

        async with EventBus() as bus, ExecutionLoop(bus, provider, tools) as loop:
            result = await loop.ask("Query weather in Taipei", session_id="s1")

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
    ) -> None:
        if max_tools is not None and (
            isinstance(max_tools, bool) or not isinstance(max_tools, int) or max_tools < 1
        ):
            raise ValueError(f"max_tools must be an int of at least 1 or None, not {max_tools!r}")
        self.max_tools = max_tools
        self.retriever = retriever
        self.bus = bus
        self.instructions = instructions
        self.provider = provider
        items = tools.values() if isinstance(tools, Mapping) else tools
        by_name: dict[str, Tool] = {}
        for tool in items:
            if not isinstance(tool, Tool):
                raise TypeError(f"tools must be openstarry Tool objects, not {type(tool).__name__}")
            if tool.name in by_name:
                raise ValueError(f"two tools are named {tool.name!r}")
            by_name[tool.name] = tool
        self.tools: Mapping[str, Tool] = by_name
        self.limits = limits or LoopLimits()
        self.agent_name = agent_name
        self.source = f"agent:{agent_name}"
        self.memory_window = memory_window
        self._sessions: OrderedDict[str, _SessionRuntime] = OrderedDict()
        self._clock: Callable[[], float] = anyio.current_time
        self._closing = False
        # Worker tasks alive, and the signal their count reaching 0 sets while closing.
        self._workers = 0
        self._workers_gone: Signal | None = None
        # Workers waiting for input, the longest idle first.
        self._idle_workers: dict[_SessionRuntime, None] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._loop_thread = 0
        self._token: Any = None
        self._subscriptions: list[Subscription] = []
        self._waiting: dict[str, RunResult] = {}
        self._done: dict[str, Signal] = {}
        self._quit_hooks: list[Callable[[str], None]] = []
        self.runs_completed = 0
        self.runs_stopped = 0
        self._dropped = 0
        # Calls from other agents: the caller's slot by call event id, and the
        # cancel scope of each call running.
        self._external: dict[str, _ExternalCall] = {}
        self.external_calls = 0

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> ExecutionLoop:
        if self._task_group is not None:
            raise RuntimeError("this ExecutionLoop is already running")
        owner = self.bus.input_owner
        if owner is not None and owner is not self:
            raise RuntimeError(
                "this EventBus already has an ExecutionLoop serving its inputs; "
                "two would both answer every input: give each agent its own bus"
            )
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self.bus.input_owner = self
        self._task_group = task_group
        self._closing = False
        self._workers_gone = self.bus.new_signal()
        self._clock = _clock_of_backend()
        # Where the loop runs, for text deltas sent from a provider's worker thread.
        self._loop_thread = threading.get_ident()
        self._token = anyio.lowlevel.current_token()
        self._subscriptions = [
            self.bus.subscribe(_USER_MESSAGE, self._on_user_message),
            self.bus.subscribe(_SYSTEM_COMMAND, self._on_system_command),
            self.bus.subscribe(_TOOL_CALL, self._on_external_call),
        ]
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        for subscription in self._subscriptions:
            subscription.cancel()
        if self.bus.input_owner is self:
            self.bus.input_owner = None
        task_group, self._task_group = self._task_group, None
        if task_group is None:
            return None
        # Leaving the loop stops the agent: every run in progress is stopped as
        # /stop would (its calls answered, its state back to IDLE), and then the
        # workers exit. Whatever is still running after a grace period, or when
        # leaving on an exception, is cancelled outright.
        self._closing = True
        for rt in list(self._sessions.values()):
            self._stop(rt)
            if rt.idle:
                self._unpark(rt)
        for event_id, done in list(self._done.items()):
            result = self._waiting.get(event_id)
            if result is not None and not done.is_set():
                result.stopped = True
            done.set()
        self._done.clear()
        self._waiting.clear()
        for call in list(self._external.values()):
            call.cancel("the agent stopped before this call finished")
        self._external.clear()
        try:
            if exc_info[0] is None and self._workers and self._workers_gone is not None:
                with anyio.move_on_after(_WIND_DOWN):
                    await self._workers_gone.wait()
        except BaseException:
            # Left inside a cancelled scope: the task group must be left all the
            # same, or the caller's cancel scopes are corrupted (trio says so).
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            raise
        task_group.cancel_scope.cancel()
        return await task_group.__aexit__(*exc_info)  # type: ignore[arg-type]

    def on_quit(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(session_id)`` when a session sends ``/quit``."""
        self._quit_hooks.append(hook)

    # -- sessions --------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """The session of that id, created empty on first use."""
        return self._runtime(session_id).session

    @property
    def sessions(self) -> Mapping[str, Session]:
        return {key: rt.session for key, rt in self._sessions.items()}

    def _runtime(self, session_id: str) -> _SessionRuntime:
        rt = self._sessions.get(session_id)
        if rt is None:
            while len(self._sessions) >= self.limits.max_sessions and self._evict_idle():
                pass
            rt = _SessionRuntime(Session(session_id, Memory(self.memory_window)))
            self._sessions[session_id] = rt
        else:
            self._sessions.move_to_end(session_id)
        return rt

    def _evict_idle(self) -> bool:
        """Forget the least recently used idle session, sparing locked ones if it can.

        Returns whether one was forgotten (none is when every session is busy).
        """
        idle = [
            key
            for key, rt in self._sessions.items()
            if (rt.idle or not rt.running) and not rt.pending
        ]
        unlocked = [key for key in idle if not self._sessions[key].session.locked]
        for key in unlocked[:1] or idle[:1]:
            rt = self._sessions.pop(key)
            if rt.idle:
                self._unpark(rt)
            return True
        return False

    # -- inputs ----------------------------------------------------------

    def submit(
        self, text: str, *, session_id: str, source: str = "user", priority: int | None = None
    ) -> Event:
        """Publish an ``INPUT:USER_MESSAGE`` and return it; its ``trace_id`` names the run."""
        event = Event.new(
            _USER_MESSAGE,
            {"text": text, "mimeType": "text/plain"},
            source=source,
            session_id=session_id,
            priority=priority,
        )
        self.bus.publish(event)
        return event

    async def ask(
        self, text: str, *, session_id: str = "default", source: str = "user"
    ) -> RunResult:
        """Send ``text`` to the session and wait until the run it starts has ended."""
        pending = self.start(text, session_id=session_id, source=source)
        return await pending.wait()

    def start(self, text: str, *, session_id: str = "default", source: str = "user") -> PendingRun:
        """Publish ``text`` as an ``INPUT:USER_MESSAGE`` now; await the returned run's ``wait()``.

        Inputs started one after the other in a session run in that order.

        Raises:
            QueueFull: the bus is at capacity (:meth:`ask` waits for room instead).
            RuntimeError: the loop is not running.
        """
        if self._task_group is None:
            raise RuntimeError(
                "the ExecutionLoop is not running: use `async with ExecutionLoop(...)`"
            )
        event = Event.new(
            _USER_MESSAGE,
            {"text": text, "mimeType": "text/plain"},
            source=source,
            session_id=session_id,
        )
        pending = PendingRun(self, event, self.bus.new_signal())
        self._waiting[event.id] = pending.result
        self._done[event.id] = pending._done
        try:
            self.bus.publish(event)
        except QueueFull:
            pending._published = False
        except BaseException:
            self._forget(event.id)
            raise
        return pending

    def _forget(self, event_id: str) -> None:
        self._waiting.pop(event_id, None)
        self._done.pop(event_id, None)

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

    def _finish(self, event: Event) -> None:
        """The input's run has ended: wake its waiter and forget it (the waiter holds both)."""
        self._waiting.pop(event.id, None)
        done = self._done.pop(event.id, None)
        if done is not None:
            done.set()

    def _on_user_message(self, event: Event) -> None:
        payload = event.payload
        text = payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            self._error(
                event, "INVALID_INPUT", "INPUT:USER_MESSAGE needs a payload with a string 'text'"
            )
            self._finish(event)
            return
        command = parse_line(text)
        if command is not None and command.is_builtin:
            self._builtin(event, command.name, command.argline.split())
            self._finish(event)
            return
        self._enqueue(event)

    def _on_system_command(self, event: Event) -> None:
        payload = event.payload
        name = payload.get("command") if isinstance(payload, dict) else None
        args = payload.get("args", []) if isinstance(payload, dict) else []
        if not isinstance(name, str) or not isinstance(args, list):
            self._error(
                event, "INVALID_INPUT", "INPUT:SYSTEM_COMMAND needs {'command': str, 'args': [str]}"
            )
            return
        name = name.lstrip("/")
        if name not in BUILTIN_COMMANDS:
            self._error(
                event,
                "UNKNOWN_COMMAND",
                f"unknown system command {name!r}; known: {sorted(BUILTIN_COMMANDS)}",
            )
            return
        self._builtin(event, name, [str(a) for a in args])

    def _enqueue(self, event: Event) -> None:
        rt = self._runtime(event.session_id)
        if len(rt.pending) >= self.limits.max_pending_inputs:
            self._error(
                event,
                "SESSION_BUSY",
                f"session {event.session_id!r} already has {len(rt.pending)} inputs waiting",
            )
            self._finish(event)
            return
        rt.pending.append(event)
        if rt.idle:
            self._unpark(rt)
        elif not rt.running:
            rt.running = True
            task_group = self._task_group
            if task_group is None:
                raise RuntimeError(
                    "the ExecutionLoop is not running: use `async with ExecutionLoop(...)`"
                )
            self._workers += 1
            task_group.start_soon(self._worker, rt)

    # -- built-in commands -----------------------------------------------

    def _builtin(self, event: Event, name: str, args: list[str]) -> None:
        # A command creates no session: sent for an unknown id, it could
        # otherwise push real sessions out of the table.
        rt = self._sessions.get(event.session_id)
        if name == "stop":
            dropped = self._stop(rt) if rt is not None else 0
            self._say(
                event,
                f"Stopped.{f' Dropped {dropped} waiting input(s).' if dropped else ''}",
                command=name,
            )
        elif name == "reset":
            if rt is not None:
                self._stop(rt)
                rt.epoch += 1
                rt.session.memory.clear()
                rt.session.failure_streak = 0
                rt.session.locked = False
                rt.failure_key, rt.failure_repeats = None, 0
            self._say(event, "Session reset: memory cleared.", command=name)
        elif name == "quit":
            if rt is not None:
                self._stop(rt)
                self._sessions.pop(event.session_id, None)
                if rt.idle:
                    self._unpark(rt)  # with nothing pending, the worker exits
            self._say(event, "Goodbye.", command=name)
            for hook in self._quit_hooks:
                hook(event.session_id)
        elif name == "metrics":
            self._say(
                event,
                json.dumps(self.metrics(), indent=2, sort_keys=True),
                command=name,
                data=self.metrics(),
            )
        else:  # help
            lines = ["Commands:"]
            lines += [f"  /{key:<8} {text}" for key, text in BUILTIN_COMMANDS.items()]
            if self.tools:
                lines.append("Tools (run one directly with /name args):")
                lines += [f"  /{t.name:<8} {t.description}" for t in self.tools.values()]
            self._say(event, "\n".join(lines), command=name)

    def _stop(self, rt: _SessionRuntime) -> int:
        dropped = len(rt.pending)
        for waiting in rt.pending:
            result = self._waiting.get(waiting.id)
            if result is not None:
                result.stopped = True
            self._finish(waiting)
        rt.pending.clear()
        if rt.scope is not None:
            rt.stop_requested = True
            rt.scope.cancel()
        return dropped

    # -- running ---------------------------------------------------------

    async def _worker(self, rt: _SessionRuntime) -> None:
        """Serve the session's inputs one after the other, then wait, idle, for more.

        Waking an idle worker costs a signal, where starting a task (and a
        timer to end a lingering one) costs more on every turn. The idle
        workers are bounded: past ``_MAX_IDLE_WORKERS`` the oldest is woken
        with nothing to do, and exits.
        """
        try:
            while True:
                while rt.pending:
                    await self._run(rt, rt.pending.popleft())
                if self._closing or self._sessions.get(rt.session.id) is not rt:
                    return  # the loop is leaving, or the session was quit or evicted
                wake = rt.wake = self.bus.new_signal()
                rt.idle = True
                idle = self._idle_workers
                idle[rt] = None
                if len(idle) > _MAX_IDLE_WORKERS:
                    self._unpark(next(iter(idle)))
                await wake.wait()
                if not rt.pending:
                    return
        finally:
            self._idle_workers.pop(rt, None)
            rt.running = False
            rt.idle = False
            rt.scope = None
            self._workers -= 1
            if self._closing and not self._workers and self._workers_gone is not None:
                self._workers_gone.set()

    def _unpark(self, rt: _SessionRuntime) -> None:
        """Wake an idle worker: it serves what is pending, or exits when nothing is."""
        self._idle_workers.pop(rt, None)
        rt.idle = False
        assert rt.wake is not None
        rt.wake.set()

    async def _run(self, rt: _SessionRuntime, event: Event) -> None:
        context = AgentContext(
            self.tools, rt.session, self.agent_name, event.trace_id, 0, self.instructions
        )
        run = _Run(rt, event, context)
        run.result = self._waiting.get(event.id)
        rt.stop_requested = False
        epoch = rt.epoch
        try:
            try:
                with anyio.CancelScope() as scope:
                    rt.scope = scope
                    await self._serve(run, event)
            except QueueClosed:
                raise
            except Exception as exc:
                # A defect past every specific guard: this run ends, the loop and
                # the other sessions go on.
                rt.scope = None
                run.close_calls("INTERNAL_ERROR", "the run failed before this call finished")
                await self._fail(run.tick, "INTERNAL_ERROR", describe_exception(exc), run)
                await self._set_state(run, _IDLE, reason="error")
                self.runs_completed += 1
                return
            rt.scope = None
            if scope.cancelled_caught:
                # Answer the open calls, unless a /reset has cleared memory meanwhile.
                if rt.epoch == epoch:
                    run.close_calls("CANCELLED", "the run was stopped before this call finished")
                if rt.stop_requested:
                    self.runs_stopped += 1
                    if run.result is not None:
                        run.result.stopped = True
                    await self._set_state(run, _IDLE, reason="stopped")
                else:
                    # Only the provider call runs under the scope's deadline.
                    timeout = self.limits.provider_timeout
                    await self._fail(
                        run.tick,
                        "PROVIDER_TIMEOUT",
                        f"the provider gave no answer within {timeout:g} s",
                        run,
                    )
                    await self._set_state(run, _IDLE, reason="provider timeout")
                    self.runs_completed += 1
            else:
                self.runs_completed += 1
        except QueueClosed:
            # The bus was closed under the run: nothing more can be said.
            rt.scope = None
            if run.result is not None:
                run.result.stopped = True
        finally:
            self._finish(event)

    async def _serve(self, run: _Run, event: Event) -> None:
        text: str = event.payload["text"]
        command = parse_line(text)
        session = run.rt.session
        if session.locked:
            await self._fail(
                event,
                "SESSION_LOCKED",
                f"session {session.id!r} is locked after {session.failure_streak} "
                "failed tool calls in a row; send /reset",
                run,
            )
            return
        if command is not None:
            await self._slash_tool(run, command.name, command.argline)
        else:
            await self._think_act(run, text)

    async def _slash_tool(self, run: _Run, name: str, argline: str) -> None:
        event = run.input
        tool = find_tool(name, self.tools)
        if tool is None:
            await self._fail(
                event,
                "UNKNOWN_COMMAND",
                f"unknown command /{name}; "
                f"built-ins: {', '.join('/' + c for c in BUILTIN_COMMANDS)}; "
                f"tools: {', '.join('/' + t for t in self.tools) or 'none'}",
                run,
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
        await self._set_state(run, _EXECUTING)
        outcomes = await self._execute(
            run, [call], parse_errors={0: parse_error} if parse_error else None
        )
        await self._count_failures(run, outcomes, [call])
        # A slash command is the user's: what the core observed is not for the provider.
        run.observations.clear()
        await self._set_state(run, _IDLE)

    async def _think_act(self, run: _Run, prompt: str) -> None:
        session = run.rt.session
        memory = session.memory
        limits = self.limits
        memory.append(UserTurn(prompt))
        run.context.tools = await self._select_tools(prompt)
        event = run.input
        tool_rounds = 0
        round_no = 0
        while True:
            round_no += 1
            tick = event.child(_TICK_START, {"round": round_no}, source=self.source)
            await self._send(tick)
            run.tick = tick  # once published: later events may name it as parent
            await self._set_state(run, _THINKING)
            run.context.round = round_no
            scope = run.rt.scope
            try:
                # The run's own scope carries the provider deadline: one cancel
                # scope fewer per round. When it fires the run ends (see _run).
                if scope is not None:
                    scope.deadline = self._clock() + limits.provider_timeout
                run.context.text_sink = self._delta_sink(tick, round_no)
                try:
                    raw = await self.provider.generate(prompt, run.context)
                finally:
                    run.context.text_sink = None
                    if scope is not None:
                        scope.deadline = math.inf
                response = _coerce_response(raw)
            except AgentPainException as exc:
                await self._fail(
                    tick, "AGENT_PAIN", describe_exception(exc).partition(": ")[2], run
                )
                break
            except Exception as exc:
                await self._fail(tick, "PROVIDER_ERROR", describe_exception(exc), run)
                break
            if run.result is not None:
                metadata = response.metadata
                if isinstance(metadata, dict) and isinstance(metadata.get("usage"), dict):
                    run.result.usage = add_usage(run.result.usage, metadata["usage"])
            # A /stop or /reset that came while the provider answered wins over
            # the answer: nothing of it goes into memory.
            await _honour_cancellation(scope)
            calls: list[ToolCall] = []
            said: list[ContentSegment] = []
            for segment in response.segments:
                tool_call = segment.tool_call
                if tool_call is not None:
                    calls.append(tool_call)
                else:
                    said.append(segment)
            text = "".join(s.text for s in said if s.text is not None)
            memory.append(AssistantTurn(text, tuple(calls)))
            run.open_calls = calls
            if said:
                payload: dict[str, Any] = {
                    "text": text,
                    "segments": [_segment_dict(s) for s in said],
                    "final": not calls,
                }
                if response.metadata is not None:
                    payload["metadata"] = response.metadata
                try:
                    said_event = event.child(OUTPUT_AGENT_MESSAGE, payload, source=self.source)
                except (TypeError, ValueError) as exc:
                    # Deeper than an event may nest, or not JSON.
                    run.close_calls("AGENT_PAIN", "the response that asked for it was refused")
                    await self._fail(
                        tick, "AGENT_PAIN", f"the provider's response cannot be sent: {exc}", run
                    )
                    break
                await self._send(said_event)
                if run.result is not None:
                    run.result.replies.append(text)
            if not calls:
                break
            if tool_rounds >= limits.max_tool_rounds:
                message = (
                    f"the provider asked for tools after {limits.max_tool_rounds} tool rounds; "
                    "the run stops here"
                )
                run.close_calls("TOOL_ROUND_LIMIT", message)
                memory.append(Observation(message))
                await self._fail(tick, "TOOL_ROUND_LIMIT", message, run)
                break
            tool_rounds += 1
            await self._set_state(run, _EXECUTING)
            outcomes = await self._execute(run, calls)
            await _honour_cancellation(run.rt.scope)
            # Each call's outcome right after the call, then what the core observed.
            memory.extend(outcomes)
            run.open_calls = ()
            locked = await self._count_failures(run, outcomes, calls)
            memory.extend(run.observations)
            run.observations.clear()
            if locked:
                break
        await self._set_state(run, _IDLE)

    async def _count_failures(
        self, run: _Run, outcomes: Sequence[ToolOutcome], calls: Sequence[ToolCall]
    ) -> bool:
        """Update the failure streaks; True when the session just got locked."""
        rt = run.rt
        session = rt.session
        limits = self.limits
        for outcome, call in zip(outcomes, calls, strict=True):
            if outcome.success:
                session.failure_streak = 0
                rt.failure_key, rt.failure_repeats = None, 0
                continue
            session.failure_streak += 1
            try:
                key = (call.name, json.dumps(call.args, sort_keys=True, default=str))
            except (TypeError, ValueError, RecursionError):
                key = (call.name, repr(call.args)[:1000])
            rt.failure_repeats = rt.failure_repeats + 1 if key == rt.failure_key else 1
            rt.failure_key = key
            if rt.failure_repeats == limits.repeated_failure_warning:
                run.observations.append(
                    Observation(
                        f"Warning: {call.name} has failed {rt.failure_repeats} times in a row "
                        f"with the same arguments {key[1]}. Do not call it that way again; "
                        "try something else or answer the user."
                    )
                )
        if session.failure_streak >= limits.max_failure_streak and not session.locked:
            session.locked = True
            await self._fail(
                run.tick,
                "SESSION_LOCKED",
                f"{session.failure_streak} tool calls failed in a row; "
                f"session {session.id!r} is locked until /reset",
                run,
            )
            return True
        return False

    async def _execute(
        self,
        run: _Run,
        calls: Sequence[ToolCall],
        parse_errors: Mapping[int, ToolArgumentsError | None] | None = None,
    ) -> list[ToolOutcome]:
        """Run the calls (concurrently, up to the cap) and publish their events.

        Returns the outcomes in the order of the calls.
        """
        parent = run.tick
        call_events = []
        for call in calls:
            call_event = parent.child(
                _TOOL_CALL,
                {"toolCallId": call.id, "name": call.name, "args": call.args},
                source=self.source,
            )
            call_events.append(call_event)
            await self._send(call_event)
        outcomes: list[ToolOutcome | None] = [None] * len(calls)
        if len(calls) == 1:
            outcomes[0] = await self._run_one(
                run, calls[0], parse_errors.get(0) if parse_errors else None
            )
        else:
            limiter = anyio.CapacityLimiter(self.limits.max_concurrent_tools)

            async def one(i: int) -> None:
                async with limiter:
                    outcomes[i] = await self._run_one(run, calls[i], None)

            async with anyio.create_task_group() as task_group:
                for i in range(len(calls)):
                    task_group.start_soon(one, i)
        done: list[ToolOutcome] = []
        for call_event, outcome in zip(call_events, outcomes, strict=True):
            assert outcome is not None
            try:
                result_event = call_event.child(
                    _TOOL_RESULT, _result_payload(outcome), source=self.source
                )
            except (TypeError, ValueError) as exc:
                # The tool returned something JSON (or an event's nesting) cannot carry.
                failure = ToolFailure(
                    "INVALID_RESULT", f"the tool's result is not JSON: {exc}", "core"
                )
                outcome = ToolOutcome(outcome.tool_call_id, outcome.name, False, error=failure)
                result_event = call_event.child(
                    _TOOL_RESULT, _result_payload(outcome), source=self.source
                )
            await self._send(result_event)
            done.append(outcome)
        return done

    async def _run_one(
        self, run: _Run, call: ToolCall, parse_error: ToolArgumentsError | None
    ) -> ToolOutcome:
        return await self._run_tool(call, parse_error, run.context, run.observations)

    async def _run_tool(
        self,
        call: ToolCall,
        parse_error: ToolArgumentsError | None,
        context: AgentContext,
        observations: list[Observation],
    ) -> ToolOutcome:
        """Validate and run one call under the tool timeout; failures become outcomes.

        What the provider should hear about (an unknown tool, bad arguments)
        goes into ``observations``.
        """
        tool = self.tools.get(call.name)
        if tool is None:
            available = ", ".join(self.tools) or "none"
            message = f"Tool {call.name!r} does not exist. Available tools: {available}."
            observations.append(Observation(message))
            return ToolOutcome(
                call.id, call.name, False, error=ToolFailure("TOOL_NOT_FOUND", message, "core")
            )
        try:
            if parse_error is not None:
                raise parse_error
            args = tool.validate(call.args)
        except ToolArgumentsError as exc:
            schema = json.dumps(dict(tool.parameters), default=str)
            message = f"Invalid arguments for {call.name}: {exc}. Its parameters: {schema}"
            observations.append(Observation(message))
            return ToolOutcome(
                call.id, call.name, False, error=ToolFailure("INVALID_ARGUMENTS", str(exc), "core")
            )
        except Exception as exc:
            # A validate() that fails otherwise is the tool's own failure.
            return ToolOutcome(call.id, call.name, False, error=_failure_of(exc))
        timeout = self.limits.tool_timeout
        result: Any = None
        try:
            # move_on_after, not fail_after: a TimeoutError the tool raises
            # itself (a socket timeout) is the tool's failure, not the limit.
            with anyio.move_on_after(timeout) as scope:
                if tool.is_async:
                    result = await tool.run(args, context)
                else:
                    result = await anyio.to_thread.run_sync(
                        tool.run, args, context, abandon_on_cancel=True
                    )
        except Exception as exc:
            return ToolOutcome(call.id, call.name, False, error=_failure_of(exc))
        except anyio.get_cancelled_exc_class() as exc:
            if not _stray_cancellation():
                raise
            # asyncio: a CancelledError nobody asked for (the tool awaited a
            # future someone else cancelled) is the tool's failure.
            return ToolOutcome(call.id, call.name, False, error=_failure_of(exc))
        if scope.cancelled_caught:
            message = f"{call.name} did not finish within {timeout:g} s and was cancelled"
            return ToolOutcome(
                call.id, call.name, False, error=ToolFailure("TIMEOUT", message, "core")
            )
        return ToolOutcome(call.id, call.name, True, result)

    # -- tool selection and deltas ---------------------------------------

    async def _select_tools(self, prompt: str) -> Mapping[str, Tool]:
        """The tools the provider sees for this input (spec 000 section 6B).

        All of them, unless there are more than :attr:`max_tools`: then the
        retriever's pick. A tool left out still runs if the provider names it.
        The built-in lexical retriever answers in microseconds, on the event
        loop; any other (an embedding model behind a network call) runs in a
        worker thread, so that it does not hold up the other sessions, and a
        ``/stop`` does not wait for it.
        """
        limit = self.max_tools
        if limit is None or len(self.tools) <= limit:
            return self.tools
        retriever = self.retriever
        if retriever is None:
            retriever = self.retriever = LexicalRetriever()
        tools = self.tools
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

    def _delta_sink(self, tick: Event, round_no: int) -> Callable[[str], None]:
        """What ``context.emit_text_delta`` calls during this provider call.

        A provider may stream in a worker thread (a sync SDK under
        ``anyio.to_thread``): the event is then handed to the event loop, which
        owns the bus, and the thread waits until it is published.
        """
        loop_thread = self._loop_thread
        token = self._token

        def sink(text: str) -> None:
            if not isinstance(text, str):
                raise TypeError(f"a text delta must be a str, not {type(text).__name__}")
            event = tick.child(_AGENT_DELTA, {"text": text, "round": round_no}, source=self.source)
            # A preview: dropped rather than waited for when the bus is full.
            if threading.get_ident() == loop_thread:
                self._emit(event)
            else:
                anyio.from_thread.run_sync(self._emit, event, token=token)

        return sink

    # -- calls from other agents -----------------------------------------

    async def call_tool(
        self,
        name: str,
        args: Any,
        *,
        trace_id: str | None = None,
        call_depth: int = 0,
        source: str = "mcp",
        session_id: str = "mcp",
    ) -> ToolOutcome:
        """Run one of the agent's tools for another agent (an MCP ``tools/call``).

        The call enters as an ``EXEC:TOOL_CALL`` event on the bus, with the
        caller's ``trace_id`` and a ``callDepth``, so it is traced and
        de-duplicated like any other event; the loop runs it as it runs the
        provider's calls (arguments validated, the tool timeout) with an
        :class:`AgentContext` carrying ``trace_id`` and ``call_depth``, and
        publishes its ``EXEC:TOOL_RESULT``. It touches no session memory.

        Which tools a caller may use is the transport's decision (the MCP
        server checks ``mcp.expose_tools``); here an unknown tool fails with
        ``TOOL_NOT_FOUND``. Cancelling the caller cancels the tool.

        Returns:
            The outcome, as in the ``EXEC:TOOL_RESULT`` payload.

        Raises:
            RuntimeError: when the loop is not running.
        """
        if self._task_group is None or self._closing:
            raise RuntimeError("the ExecutionLoop is not running")
        payload: dict[str, Any] = {
            "toolCallId": str(uuid.uuid4()),
            "name": name,
            "args": args,
            "callDepth": max(int(call_depth), 0),
        }
        event = Event.new(
            _TOOL_CALL, payload, source=source, session_id=session_id, trace_id=trace_id
        )
        done = self.bus.new_signal()
        call = _ExternalCall(done)
        self._external[event.id] = call
        try:
            await self._send(event)
            try:
                await done.wait()
            except BaseException:
                # The call must not run on, nor start later, for nobody.
                call.abandoned = True
                if call.scope is not None:
                    call.scope.cancel()
                raise
        finally:
            # Not yet dispatched: kept, so that the loop knows it is abandoned
            # when the bus hands it over (and forgets it then).
            if call.dispatched or not call.abandoned:
                self._external.pop(event.id, None)
        assert call.outcome is not None
        return call.outcome

    def _on_external_call(self, event: Event) -> None:
        if event.source == self.source or self._task_group is None:
            return  # the loop's own calls, run by the run that made them
        call = self._external.get(event.id)
        if call is None:
            # Published by someone else on the bus: answered on the bus alone.
            call = _ExternalCall(None)
        call.dispatched = True
        if call.abandoned:
            del self._external[event.id]
            self._answer_external(
                event, call, ToolFailure("CANCELLED", "the caller went away", "core")
            )
            return
        if self.external_calls >= MAX_EXTERNAL_CALLS:
            message = f"the agent is already running {MAX_EXTERNAL_CALLS} calls from other agents"
            self._answer_external(event, call, ToolFailure("BUSY", message, "core"))
            return
        self.external_calls += 1
        self._task_group.start_soon(self._serve_external, event, call)

    async def _serve_external(self, event: Event, call: _ExternalCall) -> None:
        try:
            payload = event.payload
            tool_call_id = payload.get("toolCallId") if isinstance(payload, dict) else None
            name = payload.get("name") if isinstance(payload, dict) else None
            if not isinstance(tool_call_id, str) or not isinstance(name, str):
                self._error(event, "INVALID_INPUT", "EXEC:TOOL_CALL needs toolCallId and name")
                call.finish(
                    ToolOutcome(
                        str(tool_call_id),
                        str(name),
                        False,
                        error=ToolFailure("INVALID_INPUT", "a call needs an id and a name", "core"),
                    )
                )
                return
            depth = payload.get("callDepth")
            context = AgentContext(
                self.tools,
                Session(event.session_id),
                self.agent_name,
                event.trace_id,
                0,
                self.instructions,
                call_depth=depth if isinstance(depth, int) and depth > 0 else 0,
            )
            outcome: ToolOutcome | None = None
            try:
                tool_call = ToolCall(name, payload.get("args", {}), tool_call_id)
            except (TypeError, ValueError) as exc:
                failure = ToolFailure("INVALID_ARGUMENTS", f"{name}: {exc}", "core")
                outcome = ToolOutcome(tool_call_id, name, False, error=failure)
                call.finish(self._publish_result(event, outcome))
                return
            if not call.abandoned:  # the caller may have gone since the dispatch
                with anyio.CancelScope() as scope:
                    call.scope = scope
                    outcome = await self._run_tool(tool_call, None, context, [])
            if outcome is None:
                outcome = ToolOutcome(
                    tool_call_id,
                    name,
                    False,
                    error=ToolFailure("CANCELLED", "the caller went away", "core"),
                )
            call.finish(self._publish_result(event, outcome))
        finally:
            self.external_calls -= 1

    def _answer_external(self, event: Event, call: _ExternalCall, failure: ToolFailure) -> None:
        payload = event.payload if isinstance(event.payload, dict) else {}
        outcome = ToolOutcome(
            str(payload.get("toolCallId", "")), str(payload.get("name", "")), False, error=failure
        )
        call.finish(self._publish_result(event, outcome))

    def _publish_result(self, event: Event, outcome: ToolOutcome) -> ToolOutcome:
        try:
            result = event.child(_TOOL_RESULT, _result_payload(outcome), source=self.source)
        except (TypeError, ValueError) as exc:
            failure = ToolFailure("INVALID_RESULT", f"the tool's result is not JSON: {exc}", "core")
            outcome = ToolOutcome(outcome.tool_call_id, outcome.name, False, error=failure)
            result = event.child(_TOOL_RESULT, _result_payload(outcome), source=self.source)
        self._emit(result)
        return outcome

    # -- events ----------------------------------------------------------

    async def _set_state(self, run: _Run, state: AgentState, *, reason: str | None = None) -> None:
        if run.state is state:
            return
        payload: dict[str, Any] = {"from": run.state.value, "to": state.value}
        if reason is not None:
            payload["reason"] = reason
        await self._send(run.tick.child(_STATE_CHANGE, payload, source=self.source))
        # Recorded once published: a run stopped while it waited for room on the
        # bus reports its last published state, so the chain of changes holds.
        run.state = state
        run.rt.session.state = state

    def _say(self, event: Event, text: str, *, command: str, data: Any = None) -> None:
        metadata: dict[str, Any] = {"command": command}
        if data is not None:
            metadata["data"] = data
        self._emit(
            event.child(
                OUTPUT_AGENT_MESSAGE,
                {
                    "text": text,
                    "segments": [{"type": "text", "text": text}],
                    "final": True,
                    "metadata": metadata,
                },
                source=self.source,
            )
        )
        result = self._waiting.get(event.id)
        if result is not None:
            result.replies.append(text)

    async def _fail(self, parent: Event, code: str, message: str, run: _Run) -> None:
        """A ``KERNEL:ERROR`` that ends (part of) a run: recorded on its result, never dropped."""
        payload = {"code": code, "message": message, "source": self.source}
        if run.result is not None:
            run.result.error = payload
        await self._send(parent.child(_ERROR, payload, source=self.source))

    def _error(self, parent: Event, code: str, message: str) -> None:
        """A ``KERNEL:ERROR`` from a handler (an input refused before any run)."""
        payload = {"code": code, "message": message, "source": self.source}
        result = self._waiting.get(parent.id)
        if result is not None:
            result.error = payload
        self._emit(parent.child(_ERROR, payload, source=self.source))

    async def _send(self, event: Event) -> None:
        """Publish, waiting for room when the bus is full: the run's events are never dropped."""
        try:
            self.bus.publish(event)
        except QueueFull:
            await self.bus.apublish(event)

    def _emit(self, event: Event) -> None:
        """Publish from sync code; a full bus drops the event rather than block the run."""
        try:
            self.bus.publish(event)
        except QueueClosed:
            raise
        except Exception:  # QueueFull: counted by the bus metrics' depth; nothing else to do
            self._dropped += 1

    # -- metrics ---------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """The bus metrics plus the loop's.

        ``sessions`` known, ``running`` (a run in progress), ``waiting`` (inputs
        queued behind runs), ``idle_workers``, runs completed and stopped, and
        events dropped (sync replies to commands on a full bus).
        """
        running = sum(1 for rt in self._sessions.values() if rt.scope is not None)
        return {
            "bus": self.bus.metrics(),
            "loop": {
                "sessions": len(self._sessions),
                "running": running,
                "waiting": sum(len(rt.pending) for rt in self._sessions.values()),
                "idle_workers": len(self._idle_workers),
                "runs_completed": self.runs_completed,
                "runs_stopped": self.runs_stopped,
                "events_dropped": self._dropped,
            },
        }
