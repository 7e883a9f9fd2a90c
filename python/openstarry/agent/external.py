"""Calls from other agents: a tool run for a caller outside the agent's sessions.

Another agent (an MCP ``tools/call``, or anything that publishes an
``EXEC:TOOL_CALL`` on the bus) asks for one of the agent's tools. The call goes
through the bus like every other event (traced, de-duplicated, in priority
order) and runs as the provider's calls do (arguments validated, the tool
timeout), with an :class:`~openstarry.agent.interfaces.AgentContext` that
carries the caller's ``traceId`` and ``callDepth``; its ``EXEC:TOOL_RESULT``
is published. It touches no session memory.

Rules kept:

- **Every call is answered once**: with the tool's outcome, or ``CANCELLED``
  (the caller went away, the agent stopped), ``BUSY`` (``MAX_EXTERNAL_CALLS``
  already running: refused at once rather than queued without bound),
  ``INVALID_INPUT`` or ``INVALID_ARGUMENTS``.
- **A caller that goes away takes its call with it**: cancelling
  :meth:`ExternalCalls.call` cancels the tool, and a call whose caller left
  before the bus handed it over never starts.
- **The loop's own calls are not answered twice**: an ``EXEC:TOOL_CALL`` whose
  source is the agent's own was made by one of its runs, which runs it.
- **An approval comes from the caller's transport, never from the bus.** A call
  to a tool that needs approval is refused (``APPROVAL_REQUIRED``) unless the
  transport that made it passes the caller's answer (``approval``, as the MCP
  server does once its client has answered). A yes runs the tool; a no is a
  ``DENIED`` outcome. The ``EXEC:TOOL_CALL`` says who answered
  (``approval: {"approve", "by"}``), for the record only: nothing published on
  the bus grants an approval.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from openstarry.agent.execution import ToolExecutor
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import Session, ToolFailure, ToolOutcome
from openstarry.agent.waits import APPROVAL, Answer
from openstarry.bus import Signal
from openstarry.core import Event, ToolCall
from openstarry.events import EventType
from openstarry.tracecontext import current_event

__all__ = ["MAX_EXTERNAL_CALLS", "ExternalCalls"]

#: Calls from other agents running at once, at most; beyond it a call is
#: answered BUSY at once rather than queued without bound.
MAX_EXTERNAL_CALLS = 256

_TOOL_CALL = EventType.TOOL_CALL.value


class _ExternalCall:
    """A call from another agent: where its outcome goes, and the scope that runs it.

    ``dispatched`` once the bus handed its event to the loop; ``abandoned``
    once its caller went away (then it must not start).
    """

    __slots__ = ("abandoned", "approval", "dispatched", "done", "outcome", "scope")

    def __init__(self, done: Signal | None, approval: Answer | None = None) -> None:
        self.done = done
        #: The caller's answer, when its transport asked it for approval.
        self.approval = approval
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


class ExternalCalls:
    """The calls from other agents that one loop answers.

    Args:
        executor: Runs the tools and builds the result events.
        make_context: The context a call's tool sees: ``(session, trace_id, call_depth)``.
        publish_or_drop: Publishes an event from sync code (the loop's).
        error: Publishes a ``KERNEL:ERROR`` child of an event (the loop's).
    """

    def __init__(
        self,
        executor: ToolExecutor,
        make_context: Callable[[Session, str, int], AgentContext],
        publish_or_drop: Callable[[Event], None],
        error: Callable[[Event, str, str], None],
    ) -> None:
        self._executor = executor
        self._make_context = make_context
        self._publish_or_drop = publish_or_drop
        self._error = error
        self._task_group: anyio.abc.TaskGroup | None = None
        # The caller's slot by call event id.
        self._calls: dict[str, _ExternalCall] = {}
        #: Calls running now.
        self.running = 0

    def open(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start answering: calls run in ``task_group``."""
        self._task_group = task_group

    def close(self, message: str) -> None:
        """Stop answering; every call still waited for is answered ``CANCELLED``."""
        self._task_group = None
        for call in list(self._calls.values()):
            call.cancel(message)
        self._calls.clear()

    def __len__(self) -> int:
        """Calls kept: waited for, or published and not yet dispatched."""
        return len(self._calls)

    async def call(
        self,
        name: str,
        args: Any,
        *,
        trace_id: str | None,
        call_depth: int,
        source: str,
        session_id: str,
        traceparent: str | None = None,
        approval: Answer | None = None,
    ) -> ToolOutcome:
        """Publish the call as an ``EXEC:TOOL_CALL`` and wait for its outcome.

        ``approval`` is the caller's yes or no, for a tool that needs approval.

        Raises:
            RuntimeError: when the loop is not running.
        """
        if self._task_group is None:
            raise RuntimeError("the ExecutionLoop is not running")
        payload: dict[str, Any] = {
            "toolCallId": str(uuid.uuid4()),
            "name": name,
            "args": args,
            "callDepth": max(int(call_depth), 0),
        }
        if traceparent is not None:
            payload["traceparent"] = traceparent  # the caller's span
        if approval is not None:  # for the record: the answer itself stays in process
            payload["approval"] = {"approve": approval.approve, "by": source}
        event = Event.new(
            _TOOL_CALL, payload, source=source, session_id=session_id, trace_id=trace_id
        )
        bus = self._executor.bus
        done = bus.new_signal()
        call = _ExternalCall(done, approval)
        self._calls[event.id] = call
        try:
            await bus.apublish(event)
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
                self._calls.pop(event.id, None)
        assert call.outcome is not None
        return call.outcome

    def on_call(self, event: Event) -> None:
        """The bus handler of ``EXEC:TOOL_CALL``."""
        if event.source == self._executor.source or self._task_group is None:
            return  # the loop's own calls, run by the run that made them
        call = self._calls.get(event.id)
        if call is None:
            # Published by someone else on the bus: answered on the bus alone.
            call = _ExternalCall(None)
        call.dispatched = True
        if call.abandoned:
            del self._calls[event.id]
            self._refuse(event, call, ToolFailure("CANCELLED", "the caller went away", "core"))
            return
        if self.running >= MAX_EXTERNAL_CALLS:
            message = f"the agent is already running {MAX_EXTERNAL_CALLS} calls from other agents"
            self._refuse(event, call, ToolFailure("BUSY", message, "core"))
            return
        self.running += 1
        self._task_group.start_soon(self._serve, event, call)

    async def _serve(self, event: Event, call: _ExternalCall) -> None:
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
            context = self._make_context(
                Session(event.session_id),
                event.trace_id,
                depth if isinstance(depth, int) and depth > 0 else 0,
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
                wait = None
                tool = self._executor.tools.get(name)
                if (
                    call.approval is not None
                    and tool is not None
                    and self._executor.needs_approval(tool)
                ):  # answered already: the wait ends at once
                    wait = self._executor.waits.open(
                        APPROVAL, context, tool_call_id, name, tool_call.args
                    )
                    wait.answer = call.approval
                with anyio.CancelScope() as scope:
                    call.scope = scope
                    # Calls the tool makes are children of this call's span.
                    current_event.set((event.trace_id, event.id))
                    outcome = await self._executor.run(tool_call, None, context, [], wait=wait)
            if outcome is None:
                outcome = ToolOutcome(
                    tool_call_id,
                    name,
                    False,
                    error=ToolFailure("CANCELLED", "the caller went away", "core"),
                )
            call.finish(self._publish_result(event, outcome))
        finally:
            self.running -= 1

    def _refuse(self, event: Event, call: _ExternalCall, failure: ToolFailure) -> None:
        """Answer a call that will not run."""
        payload = event.payload if isinstance(event.payload, dict) else {}
        outcome = ToolOutcome(
            str(payload.get("toolCallId", "")), str(payload.get("name", "")), False, error=failure
        )
        call.finish(self._publish_result(event, outcome))

    def _publish_result(self, event: Event, outcome: ToolOutcome) -> ToolOutcome:
        """Publish the call's ``EXEC:TOOL_RESULT``; the outcome it carries is returned."""
        result, outcome = self._executor.result_event(event, outcome)
        self._publish_or_drop(result)
        return outcome
