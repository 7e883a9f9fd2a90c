"""Tool execution: running the calls a provider (or another agent) asks for.

Rules the executor keeps:

- **What is not the tool's success is an outcome, never an exception** (spec
  000 section 7). An unknown tool or arguments that fail the tool's schema
  become a failed outcome and an observation for the provider; a tool that
  raises or exceeds the tool timeout becomes a failed outcome. Only a real
  cancellation (``/stop``, the caller going away) passes through.
- **Events in the order of the calls.** One ``EXEC:TOOL_CALL`` per call before
  any runs, then one ``EXEC:TOOL_RESULT`` per call in the order of the calls,
  each a child of its call, whatever order the tools finished in. They are
  published waiting for room on the bus: a run's events are never dropped.
- **At most ``max_concurrent_tools`` at once**, each under the tool timeout;
  sync tools run in worker threads. A tool whose call cannot wait
  (:attr:`Tool.completes_at_once <openstarry.agent.interfaces.Tool.completes_at_once>`:
  an ``async def`` with no ``await``) runs without the timeout's cancel
  scope, which could never fire before it returns.
- **One builder for result events** (:meth:`ToolExecutor.result_event`): a
  result that JSON (or an event's nesting) cannot carry becomes an
  ``INVALID_RESULT`` failure, for the provider's calls and for other agents' alike.
- **Calls that wait for the outside** (:mod:`openstarry.agent.waits`): a client
  tool's call waits for its output, a call that needs approval for a yes; both
  are announced (``EXEC:APPROVAL_REQUEST``, then one ``EXEC:AWAITING``) before
  any call of the round runs. A denied or unanswered approval is a ``DENIED``
  outcome and an observation, never a run of the tool. A call from another
  agent to a tool that needs approval is refused (``APPROVAL_REQUIRED``).
- **Failure streaks per session.** Failures in a row lock the session at
  ``max_failure_streak``; the same failing call ``repeated_failure_warning``
  times in a row adds a warning observation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
import anyio.to_thread

from openstarry.agent.deadlines import Deadlines, ToolCallWatch
from openstarry.agent.interfaces import TOOL_CALL_KEY, TOOL_PROGRESS, AgentContext, Tool
from openstarry.agent.limits import LoopLimits
from openstarry.agent.memory import Observation, ToolFailure, ToolOutcome, new_tool_outcome
from openstarry.agent.progress import ProgressSender
from openstarry.agent.sessions import CancelScopeLike, SessionRuntime
from openstarry.agent.waits import APPROVAL, CLIENT_CALL, Answer, ClientTool, Wait, Waits
from openstarry.bus import Emit, EventBus, Subscription, describe_exception
from openstarry.core import Event, EventRef, ToolCall
from openstarry.errors import QueueFull, ToolArgumentsError, ToolError
from openstarry.events import EventType
from openstarry.tracecontext import current_event

__all__ = ["APPROVAL_REQUEST", "AWAITING", "ToolExecutor", "result_payload", "tools_by_name"]

_TOOL_CALL = EventType.TOOL_CALL.value
_TOOL_RESULT = EventType.TOOL_RESULT.value
#: A call waits for a yes or a no: ``{"approvalId", "toolCallId", "name", "args",
#: "serverLabel"?}``, a child of its ``EXEC:TOOL_CALL``.
APPROVAL_REQUEST = "EXEC:APPROVAL_REQUEST"
#: The round now waits for its client: ``{"callIds": [...], "approvalIds": [...]}``
#: (the client tools' calls, the approvals), a child of the tick.
AWAITING = "EXEC:AWAITING"


#: The waits of a round that has none.
_NO_WAITS: Mapping[int, Wait] = MappingProxyType({})


#: The longest text a noted event carries (``Emitter.note``): far below what
#: an event may hold, so that it needs no encoding to be sure of it.
_NOTED_TEXT = 1 << 20
#: The kinds of result an event carries as they are (with short ASCII text).
_NOTED_KINDS = frozenset({int, bool, type(None)})


def result_payload(outcome: ToolOutcome) -> dict[str, Any]:
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


def _valid(tool: Tool, call: ToolCall) -> bool:
    """Whether the call's arguments pass the tool's schema (else nobody is asked about it)."""
    try:
        tool.validate(call.args)
    except Exception:
        return False
    return True


def _failure_of(exc: BaseException) -> ToolFailure:
    message = describe_exception(exc).partition(": ")[2]
    if isinstance(exc, ToolError):
        return ToolFailure(str(exc.code), message, "tool")
    if isinstance(exc, ToolArgumentsError):
        return ToolFailure("INVALID_ARGUMENTS", message, "core")
    if isinstance(exc, OSError) and isinstance(exc.errno, int):
        return ToolFailure(errno.errorcode.get(exc.errno, "EIO"), exc.strerror or message, "tool")
    return ToolFailure("TOOL_ERROR", describe_exception(exc), "tool")


class ToolExecutor:
    """Runs tool calls for a loop and publishes their events.

    Args:
        bus: Where the call and result events go.
        tools: The agent's tools by name (the loop replaces it when they change).
        limits: The tool timeout, the concurrency cap and the failure streaks.
        source: The ``source`` of the events.
    """

    __slots__ = (
        "_publish",
        "approval_tools",
        "bus",
        "deadlines",
        "emit_child",
        "emit_mark",
        "emit_note",
        "limits",
        "mark_unread",
        "new_scope",
        "note_unread",
        "own_calls",
        "progress",
        "source",
        "tools",
        "waits",
    )

    def __init__(
        self,
        bus: EventBus,
        tools: Mapping[str, Tool],
        limits: LoopLimits,
        source: str,
        *,
        approval_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.bus = bus
        # bus.emit where it can stand for apublish (the local bus), else None;
        # and its Emitter.child (makes and emits a caused event), set by the loop.
        self._publish: Emit | None = bus.emit if bus.backend is None else None
        self.emit_child: Callable[..., Event] | None = None
        #: Its ``Emitter.mark`` (``child`` for an event needed only as a
        #: parent: an ``EventRef`` stands for it when nobody could read it).
        self.emit_mark: Callable[..., Event | EventRef] | None = None
        #: Its ``Emitter.note`` (``child`` for an event whose maker has no use
        #: for it, made only if someone could read it), set by the loop.
        self.emit_note: Callable[[Event | EventRef, str, Any, str], bool] | None = None
        #: Its ``Emitter.mark_unread`` (``mark`` and ``note`` in one call for
        #: events nobody could read, or ``None`` and nothing emitted), set by the loop.
        self.mark_unread: Callable[..., EventRef | None] | None = None
        #: Its ``Emitter.note_unread`` (an event nobody could read counted,
        #: unmade: ``True``; else nothing and ``False``), set by the loop.
        self.note_unread: Callable[[str], bool] | None = None
        #: The loop's handler of ``EXEC:TOOL_CALL`` (for other agents' calls),
        #: which the executor's own calls need not reach.
        self.own_calls: Subscription | None = None
        self.tools = tools
        self.limits = limits
        self.source = source
        #: The names of the tools whose calls wait for approval.
        self.approval_tools = approval_tools
        self.waits = Waits()
        #: The cancel scope class of the running backend and the loop's
        #: deadline watcher (the loop sets both when it starts).
        self.new_scope: Callable[..., CancelScopeLike] = anyio.CancelScope
        self.deadlines = Deadlines()
        #: Publishes a running call's progress (:meth:`AgentContext.emit_progress`).
        self.progress = ProgressSender(bus, source).send

    def needs_approval(self, tool: Tool) -> bool:
        """Whether a call of ``tool`` waits for a yes before it runs."""
        return tool.name in self.approval_tools or getattr(tool, "requires_approval", False) is True

    def result_event(
        self, call_event: Event | EventRef, outcome: ToolOutcome
    ) -> tuple[Event, ToolOutcome]:
        """The ``EXEC:TOOL_RESULT`` child of ``call_event``, and the outcome it carries.

        A result that JSON (or an event's nesting) cannot carry is replaced by
        an ``INVALID_RESULT`` failure, which is the outcome then returned.
        """
        try:
            event = call_event.child(_TOOL_RESULT, result_payload(outcome), source=self.source)
        except (TypeError, ValueError) as exc:
            plain = _as_json_object(outcome.result) if outcome.success else None
            if plain is not None:  # a pydantic model or a dataclass: its fields
                outcome = ToolOutcome(outcome.tool_call_id, outcome.name, True, result=plain)
                return self.result_event(call_event, outcome)
            failure = ToolFailure("INVALID_RESULT", f"the tool's result is not JSON: {exc}", "core")
            outcome = ToolOutcome(outcome.tool_call_id, outcome.name, False, error=failure)
            event = call_event.child(_TOOL_RESULT, result_payload(outcome), source=self.source)
        return event, outcome

    async def execute(
        self,
        parent: Event | EventRef,
        calls: Sequence[ToolCall],
        context: AgentContext,
        observations: list[Observation],
        parse_errors: Mapping[int, ToolArgumentsError | None] | None = None,
        tools: Mapping[str, Tool] | None = None,
    ) -> list[ToolOutcome]:
        """Run the calls (concurrently, up to the cap) and publish their events.

        Args:
            parent: The event the ``EXEC:TOOL_CALL`` events are children of (the tick).
            calls: The calls, in the provider's order.
            context: What the tools see.
            observations: Where what the provider should hear about goes.
            parse_errors: Arguments that could not be parsed, by call index
                (a slash command's line); those calls fail with them.
            tools: The tools of this run, when they are not just the agent's
                (a request's client tools beside them).

        Returns:
            The outcomes in the order of the calls.
        """
        apublish = self.bus.apublish
        emit_mark = self.emit_mark
        source = self.source
        own_calls = self.own_calls
        known = self.tools if tools is None else tools
        approval_tools = self.approval_tools
        call_events: list[Event | EventRef] = []
        waiting = False
        for call in calls:
            payload: dict[str, Any] = {"toolCallId": call.id, "name": call.name, "args": call.args}
            tool = known.get(call.name)
            label = getattr(tool, "server_label", None)
            if isinstance(label, str):
                # A remote MCP server's tool: the Agent API shows an mcp_call.
                payload["serverLabel"] = label
            if tool is not None and not waiting:
                # (ClientTool is final: a type check spares the ABC's isinstance;
                # and needs_approval, inlined.)
                waiting = (
                    type(tool) is ClientTool
                    or tool.name in approval_tools
                    or getattr(tool, "requires_approval", False) is True
                )
            if emit_mark is not None:
                try:
                    call_events.append(emit_mark(parent, _TOOL_CALL, payload, source, own_calls))
                    continue
                except QueueFull:
                    pass  # no room: it is made, and waits for room
            made = parent.child(_TOOL_CALL, payload, source=source)
            call_events.append(made)
            await apublish(made)
        waits: Mapping[int, Wait] = (
            await self._announce_waits(parent, call_events, calls, context, known)
            if waiting
            else _NO_WAITS
        )
        if len(calls) == 1:
            call_event = call_events[0]
            # A tool's calls are made from its call's span (tracecontext).
            working = current_event.set((call_event.trace_id, call_event.id))
            try:
                outcome = await self.run(
                    calls[0],
                    parse_errors.get(0) if parse_errors else None,
                    context,
                    observations,
                    tools=known,
                    wait=waits.get(0) if waiting else None,
                )
            finally:
                current_event.reset(working)
            if self.result_now(call_event, outcome):
                return [outcome]
            return [await self.publish_result(call_event, outcome)]
        outcomes: list[ToolOutcome | None] = [None] * len(calls)
        limiter = anyio.CapacityLimiter(self.limits.max_concurrent_tools)

        async def one(i: int) -> None:
            # Each in a task of its own: its context variables are its own.
            current_event.set((call_events[i].trace_id, call_events[i].id))
            wait = waits.get(i)
            if wait is not None and wait.kind == CLIENT_CALL:
                # Waiting for the client takes no slot from the agent's tools.
                outcomes[i] = await self.run(
                    calls[i], None, context, observations, tools=known, wait=wait
                )
                return
            async with limiter:
                outcomes[i] = await self.run(
                    calls[i], None, context, observations, tools=known, wait=wait
                )

        async with anyio.create_task_group() as task_group:
            for i in range(len(calls)):
                task_group.start_soon(one, i)
        done: list[ToolOutcome] = []
        for call_event, ended in zip(call_events, outcomes, strict=True):
            assert ended is not None
            if self.result_now(call_event, ended):
                done.append(ended)
            else:
                done.append(await self.publish_result(call_event, ended))
        return done

    @staticmethod
    def _not_found(
        call: ToolCall, tools: Mapping[str, Tool], observations: list[Observation]
    ) -> ToolOutcome:
        """The outcome of a call to a tool that does not exist (the provider hears of it)."""
        available = ", ".join(tools) or "none"
        message = f"Tool {call.name!r} does not exist. Available tools: {available}."
        observations.append(Observation(message))
        return ToolOutcome(
            call.id, call.name, False, error=ToolFailure("TOOL_NOT_FOUND", message, "core")
        )

    @staticmethod
    def _refused(
        tool: Tool, call: ToolCall, exc: Exception, observations: list[Observation]
    ) -> ToolOutcome:
        """The outcome of a call whose arguments the tool refused (bad ones: the provider hears)."""
        if not isinstance(exc, ToolArgumentsError):
            # A validate() that fails otherwise is the tool's own failure.
            return ToolOutcome(call.id, call.name, False, error=_failure_of(exc))
        schema = json.dumps(dict(tool.parameters), default=str)
        message = f"Invalid arguments for {call.name}: {exc}. Its parameters: {schema}"
        observations.append(Observation(message))
        return ToolOutcome(
            call.id, call.name, False, error=ToolFailure("INVALID_ARGUMENTS", str(exc), "core")
        )

    async def execute_at_once(
        self,
        parent: Event | EventRef,
        call: ToolCall,
        context: AgentContext,
        observations: list[Observation],
    ) -> ToolOutcome | None:
        """Run one call of the agent's tools that completes at once, if it can be; else ``None``.

        It can when the tool completes at once and needs no approval, and the
        local bus takes its events without waiting: then what :meth:`execute`
        does for it, in one step that never waits. ``None`` (nothing done)
        otherwise: :meth:`execute` then runs it.
        """
        emit_mark = self.emit_mark
        mark_unread = self.mark_unread
        note_unread = self.note_unread
        tool = self.tools.get(call.name)
        if (
            emit_mark is None
            or context.journal is not None
            or mark_unread is None
            or note_unread is None
            or tool is None
            or not tool.completes_at_once
            or tool.name in self.approval_tools
            or getattr(tool, "requires_approval", False) is True
            or isinstance(getattr(tool, "server_label", None), str)
        ):
            return None
        # Read by nobody (but the loop's own handler), the call needs no payload.
        call_event: Event | EventRef | None = mark_unread(
            parent, _TOOL_CALL, None, self.source, self.own_calls
        )
        if call_event is None:
            payload = {"toolCallId": call.id, "name": call.name, "args": call.args}
            try:
                call_event = emit_mark(parent, _TOOL_CALL, payload, self.source, self.own_calls)
            except QueueFull:
                return None  # no room: execute() waits for it
        # A tool's calls are made from its call's span (tracecontext).
        working = current_event.set((call_event.trace_id, call_event.id))
        try:
            args = tool.validate(call.args)
        except Exception as exc:
            outcome = self._refused(tool, call, exc, observations)
        else:
            key = TOOL_CALL_KEY.set(f"{context.run_id}/{call.id}")
            running = TOOL_PROGRESS.set((self.progress, context.session_id, call.id, call.name))
            try:
                outcome = new_tool_outcome(call.id, call.name, True, await tool.run(args, context))
            except Exception as exc:
                outcome = ToolOutcome(call.id, call.name, False, error=_failure_of(exc))
            finally:
                TOOL_PROGRESS.reset(running)
                TOOL_CALL_KEY.reset(key)
        finally:
            current_event.reset(working)
        result = outcome.result
        kind = type(result)
        if (
            outcome.error is None
            and (
                kind in _NOTED_KINDS
                or (kind is str and len(result) < _NOTED_TEXT and result.isascii())
            )
            and note_unread(_TOOL_RESULT)
        ):
            # (What result_now does with a result read by nobody, without its call.)
            return outcome
        if self.result_now(call_event, outcome):
            return outcome
        return await self.publish_result(call_event, outcome)

    def may_wait(self, calls: Sequence[ToolCall], tools: Mapping[str, Tool] | None = None) -> bool:
        """Whether running ``calls`` may wait (and enter cancel scopes of its own first).

        False only for one call whose tool completes at once and waits for no
        approval (or that names no tool: its outcome is a failure at once).
        Several calls run in a task group.
        """
        if len(calls) != 1:
            return True
        tool = (self.tools if tools is None else tools).get(calls[0].name)
        if tool is None:
            return False
        return (
            not tool.completes_at_once
            or tool.name in self.approval_tools
            or getattr(tool, "requires_approval", False) is True
        )

    def result_now(self, call_event: Event | EventRef, outcome: ToolOutcome) -> bool:
        """Emit the call's ``EXEC:TOOL_RESULT`` on the local bus without waiting.

        False when that cannot be done: a remote bus, a full one, or a result
        JSON cannot carry (:meth:`publish_result` then does it).
        """
        if outcome.error is None:
            emit_note = self.emit_note
            result = outcome.result
            kind = type(result)
            if emit_note is not None and (
                kind in _NOTED_KINDS
                or (kind is str and len(result) < _NOTED_TEXT and result.isascii())
            ):
                # An event can carry it (its id and name went out with the
                # call): nothing to check by encoding it; read by nobody, it is
                # counted, not made.
                note_unread = self.note_unread
                if note_unread is not None and note_unread(_TOOL_RESULT):
                    return True
                payload = {
                    "toolCallId": outcome.tool_call_id,
                    "name": outcome.name,
                    "success": True,
                    "result": result,
                }
                try:
                    emit_note(call_event, _TOOL_RESULT, payload, self.source)
                    return True
                except QueueFull:
                    pass  # no room: as below
        if self.emit_child is not None:
            try:
                self.emit_child(call_event, _TOOL_RESULT, result_payload(outcome), self.source)
                return True
            except (TypeError, ValueError, QueueFull):
                pass  # a result JSON cannot carry, or no room: publish_result
        return False

    async def publish_result(
        self, call_event: Event | EventRef, outcome: ToolOutcome
    ) -> ToolOutcome:
        """Publish the call's ``EXEC:TOOL_RESULT``, waiting for room; returns its outcome.

        A result JSON cannot carry becomes an ``INVALID_RESULT`` failure (:meth:`result_event`).
        """
        result_event, outcome = self.result_event(call_event, outcome)
        publish = self._publish
        if publish is None:
            await self.bus.apublish(result_event)
        else:
            try:
                publish(result_event, _TOOL_RESULT)
            except QueueFull:
                await self.bus.apublish(result_event)
        return outcome

    async def _announce_waits(
        self,
        parent: Event | EventRef,
        call_events: Sequence[Event | EventRef],
        calls: Sequence[ToolCall],
        context: AgentContext,
        tools: Mapping[str, Tool],
    ) -> dict[int, Wait]:
        """Open the round's waits, publish their approval requests and the ``EXEC:AWAITING``."""
        waits: dict[int, Wait] = {}
        published_now = False
        for i, call in enumerate(calls):
            tool = tools.get(call.name)
            if tool is None:
                continue
            if type(tool) is ClientTool:
                waits[i] = self.waits.open(CLIENT_CALL, context, call.id, call.name, call.args)
            elif self.needs_approval(tool) and _valid(tool, call):
                label = getattr(tool, "server_label", None)
                journal = context.journal
                wait = self.waits.open(
                    APPROVAL,
                    context,
                    call.id,
                    call.name,
                    call.args,
                    server_label=label if isinstance(label, str) else None,
                    wait_id=None if journal is None else journal.approval_id(call.id),
                )
                waits[i] = wait
                if journal is not None:
                    answered = journal.answers.get(wait.id)
                    if answered is not None:  # while no worker ran it (all restarted)
                        approve, reason = answered
                        self.waits.answer(
                            wait.session_id, wait.id, Answer(approve=approve, reason=reason)
                        )
                    if wait.id in journal.announced:
                        continue  # published by an earlier attempt
                payload: dict[str, Any] = {
                    "approvalId": wait.id,
                    "toolCallId": call.id,
                    "name": call.name,
                    "args": call.args,
                }
                if wait.server_label is not None:
                    payload["serverLabel"] = wait.server_label
                request = call_events[i].child(APPROVAL_REQUEST, payload, source=self.source)
                if journal is None:
                    await self.bus.apublish(request)
                    continue
                # A durable run's: published now, not with the run's commit (its client
                # must see it while the run waits), and once, whatever the attempts.
                with self.bus.effects_of(request):  # (no delivery's effect: sent at once)
                    await self.bus.apublish(request)
                await journal.record_announced(wait.id)
                published_now = True
        if waits:
            announced = {
                "callIds": [w.id for w in waits.values() if w.kind == CLIENT_CALL],
                "approvalIds": [w.id for w in waits.values() if w.kind == APPROVAL],
            }
            awaiting = parent.child(AWAITING, announced, source=self.source)
            if published_now:  # with its requests, at once
                with self.bus.effects_of(awaiting):
                    await self.bus.apublish(awaiting)
            else:
                await self.bus.apublish(awaiting)
        return waits

    async def _client_output(self, call: ToolCall, wait: Wait) -> ToolOutcome:
        """The outcome of a client tool's call: the output its client sent."""
        timeout = self.limits.client_timeout
        answer = await self.waits.wait(wait, timeout)
        if answer is None or answer.output is None:
            message = f"the client sent no output for {call.name} within {timeout:g} s"
            return ToolOutcome(
                call.id, call.name, False, error=ToolFailure("TIMEOUT", message, "core")
            )
        try:
            result: Any = json.loads(answer.output)
        except ValueError:
            result = answer.output
        return new_tool_outcome(call.id, call.name, True, result)

    async def _approved(
        self, call: ToolCall, wait: Wait | None, observations: list[Observation]
    ) -> ToolOutcome | None:
        """``None`` when the call may run; else the outcome of its refusal."""
        if wait is None:
            message = f"{call.name} needs approval, which a call from another agent cannot get"
            return ToolOutcome(
                call.id, call.name, False, error=ToolFailure("APPROVAL_REQUIRED", message, "core")
            )
        timeout = self.limits.approval_timeout
        answer: Answer | None = await self.waits.wait(wait, timeout)
        if answer is not None and answer.approve:
            return None
        if answer is None:
            why = f"nobody answered the approval request within {timeout:g} s"
        else:
            why = f"the user denied it{f': {answer.reason}' if answer.reason else ''}"
        message = f"The call to {call.name} was not run: {why}."
        observations.append(Observation(message))
        return ToolOutcome(call.id, call.name, False, error=ToolFailure("DENIED", message, "user"))

    async def run(
        self,
        call: ToolCall,
        parse_error: ToolArgumentsError | None,
        context: AgentContext,
        observations: list[Observation],
        *,
        tools: Mapping[str, Tool] | None = None,
        wait: Wait | None = None,
    ) -> ToolOutcome:
        """Validate and run one call under the tool timeout; failures become outcomes.

        What the provider should hear about (an unknown tool, bad arguments)
        goes into ``observations``. ``wait`` is the call's announced wait (a
        client tool's output, an approval). The call runs with its idempotency
        key set (:attr:`AgentContext.idempotency_key`); in a durable run (a
        journal) an outcome recorded by an earlier attempt is replayed instead,
        and a new one is recorded before it is returned.
        """
        journal = context.journal
        if journal is not None:
            recorded = journal.outcome(call.id)
            if recorded is not None:
                if wait is not None:
                    self.waits.close(wait)
                observations.extend(recorded[1])
                return recorded[0]
        key = TOOL_CALL_KEY.set(f"{context.run_id}/{call.id}")
        running = TOOL_PROGRESS.set((self.progress, context.session_id, call.id, call.name))
        try:
            if journal is None:
                return await self.run_live(call, parse_error, context, observations, tools, wait)
            observed: list[Observation] = []
            outcome = await self.run_live(call, parse_error, context, observed, tools, wait)
        finally:
            TOOL_PROGRESS.reset(running)
            TOOL_CALL_KEY.reset(key)
        await journal.record_outcome(outcome, observed)
        observations.extend(observed)
        return outcome

    async def run_live(
        self,
        call: ToolCall,
        parse_error: ToolArgumentsError | None,
        context: AgentContext,
        observations: list[Observation],
        tools: Mapping[str, Tool] | None,
        wait: Wait | None,
    ) -> ToolOutcome:
        """:meth:`run`, with neither a journal nor the key: the call itself."""
        if wait is not None and wait.kind == CLIENT_CALL:
            return await self._client_output(call, wait)
        tools = self.tools if tools is None else tools
        tool = tools.get(call.name)
        if tool is None:
            return self._not_found(call, tools, observations)
        try:
            if parse_error is not None:
                raise parse_error
            args = tool.validate(call.args)
        except Exception as exc:
            if wait is not None and not isinstance(exc, ToolArgumentsError):
                self.waits.close(wait)
            return self._refused(tool, call, exc, observations)
        if (
            wait is not None
            or tool.name in self.approval_tools
            or getattr(tool, "requires_approval", False) is True
        ):  # (needs_approval, inlined)
            refused = await self._approved(call, wait, observations)
            if refused is not None:
                return refused
        try:
            if tool.completes_at_once:
                # It cannot wait: nothing could cancel it or time it out.
                return new_tool_outcome(call.id, call.name, True, await tool.run(args, context))
            # The tool timeout cancels the scope (the loop's watcher does, at
            # the deadline), which then reports it: a TimeoutError the tool
            # raises itself (a socket timeout) is the tool's failure, not the limit.
            timeout = self.limits.tool_timeout
            scope = self.new_scope()
            watch = ToolCallWatch(scope)
            deadlines = self.deadlines
            deadlines.begin(watch, timeout)
            try:
                with scope:
                    if tool.is_async:
                        result = await tool.run(args, context)
                    else:
                        result = await anyio.to_thread.run_sync(
                            tool.run, args, context, abandon_on_cancel=True
                        )
            finally:
                deadlines.end(watch)
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
        return new_tool_outcome(call.id, call.name, True, result)

    def count_failures(
        self,
        rt: SessionRuntime,
        outcomes: Sequence[ToolOutcome],
        calls: Sequence[ToolCall],
        observations: list[Observation],
    ) -> bool:
        """Update the session's failure streaks; True when the session just got locked."""
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
                observations.append(
                    Observation(
                        f"Warning: {call.name} has failed {rt.failure_repeats} times in a row "
                        f"with the same arguments {key[1]}. Do not call it that way again; "
                        "try something else or answer the user."
                    )
                )
        if session.failure_streak >= limits.max_failure_streak and not session.locked:
            session.locked = True
            return True
        return False


def tools_by_name(tools: Iterable[Tool] | Mapping[str, Tool]) -> dict[str, Tool]:
    """The tools by name; each must be a :class:`Tool`, and no two may share a name."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    by_name: dict[str, Tool] = {}
    for tool in items:
        if not isinstance(tool, Tool):
            raise TypeError(f"tools must be openstarry Tool objects, not {type(tool).__name__}")
        if tool.name in by_name:
            raise ValueError(f"two tools are named {tool.name!r}")
        by_name[tool.name] = tool
    return by_name


def _as_json_object(value: Any) -> dict[str, Any] | None:
    """A tool's result that JSON cannot carry as it is, as the object of its fields: a
    pydantic model (``model_dump(mode="json")``) or a dataclass; ``None`` otherwise."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            dumped = dump(mode="json")
        except Exception:  # a model whose fields cannot be dumped either
            return None
        return dumped if isinstance(dumped, dict) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            plain = json.loads(json.dumps(dataclasses.asdict(value), default=str))
        except (TypeError, ValueError):
            return None
        return plain if isinstance(plain, dict) else None
    return None
