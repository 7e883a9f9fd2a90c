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
  sync tools run in worker threads.
- **One builder for result events** (:meth:`ToolExecutor.result_event`): a
  result that JSON (or an event's nesting) cannot carry becomes an
  ``INVALID_RESULT`` failure, for the provider's calls and for other agents' alike.
- **Failure streaks per session.** Failures in a row lock the session at
  ``max_failure_streak``; the same failing call ``repeated_failure_warning``
  times in a row adds a warning observation.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.limits import LoopLimits
from openstarry.agent.memory import Observation, ToolFailure, ToolOutcome
from openstarry.agent.sessions import SessionRuntime
from openstarry.bus import EventBus, describe_exception
from openstarry.core import Event, ToolCall
from openstarry.errors import ToolArgumentsError, ToolError
from openstarry.events import EventType

__all__ = ["ToolExecutor", "result_payload"]

_TOOL_CALL = EventType.TOOL_CALL.value
_TOOL_RESULT = EventType.TOOL_RESULT.value


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

    __slots__ = ("bus", "limits", "source", "tools")

    def __init__(
        self, bus: EventBus, tools: Mapping[str, Tool], limits: LoopLimits, source: str
    ) -> None:
        self.bus = bus
        self.tools = tools
        self.limits = limits
        self.source = source

    def result_event(self, call_event: Event, outcome: ToolOutcome) -> tuple[Event, ToolOutcome]:
        """The ``EXEC:TOOL_RESULT`` child of ``call_event``, and the outcome it carries.

        A result that JSON (or an event's nesting) cannot carry is replaced by
        an ``INVALID_RESULT`` failure, which is the outcome then returned.
        """
        try:
            event = call_event.child(_TOOL_RESULT, result_payload(outcome), source=self.source)
        except (TypeError, ValueError) as exc:
            failure = ToolFailure("INVALID_RESULT", f"the tool's result is not JSON: {exc}", "core")
            outcome = ToolOutcome(outcome.tool_call_id, outcome.name, False, error=failure)
            event = call_event.child(_TOOL_RESULT, result_payload(outcome), source=self.source)
        return event, outcome

    async def execute(
        self,
        parent: Event,
        calls: Sequence[ToolCall],
        context: AgentContext,
        observations: list[Observation],
        parse_errors: Mapping[int, ToolArgumentsError | None] | None = None,
    ) -> list[ToolOutcome]:
        """Run the calls (concurrently, up to the cap) and publish their events.

        Args:
            parent: The event the ``EXEC:TOOL_CALL`` events are children of (the tick).
            calls: The calls, in the provider's order.
            context: What the tools see.
            observations: Where what the provider should hear about goes.
            parse_errors: Arguments that could not be parsed, by call index
                (a slash command's line); those calls fail with them.

        Returns:
            The outcomes in the order of the calls.
        """
        publish = self.bus.apublish
        call_events = []
        for call in calls:
            call_event = parent.child(
                _TOOL_CALL,
                {"toolCallId": call.id, "name": call.name, "args": call.args},
                source=self.source,
            )
            call_events.append(call_event)
            await publish(call_event)
        outcomes: list[ToolOutcome | None] = [None] * len(calls)
        if len(calls) == 1:
            parse_error = parse_errors.get(0) if parse_errors else None
            outcomes[0] = await self.run(calls[0], parse_error, context, observations)
        else:
            limiter = anyio.CapacityLimiter(self.limits.max_concurrent_tools)

            async def one(i: int) -> None:
                async with limiter:
                    outcomes[i] = await self.run(calls[i], None, context, observations)

            async with anyio.create_task_group() as task_group:
                for i in range(len(calls)):
                    task_group.start_soon(one, i)
        done: list[ToolOutcome] = []
        for call_event, outcome in zip(call_events, outcomes, strict=True):
            assert outcome is not None
            result_event, outcome = self.result_event(call_event, outcome)
            await publish(result_event)
            done.append(outcome)
        return done

    async def run(
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
        tools = self.tools
        tool = tools.get(call.name)
        if tool is None:
            available = ", ".join(tools) or "none"
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
