"""Calls from other agents: ``ExecutionLoop.call_tool`` and EXEC:TOOL_CALL events that
another component publishes on the bus, each run as an event with its trace and depth."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agent_harness import HANG, Echo, running, validate_payload
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop
from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.errors import ToolError
from openstarry.testing import ScriptedProvider, text, tool_call
from openstarry.tools import get_weather

pytestmark = pytest.mark.anyio


class Recorder(Tool):
    """Records the context each call ran with."""

    name = "recorder"

    def __init__(self) -> None:
        self.parameters = {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "required": ["x"],
        }
        self.contexts: list[AgentContext] = []

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.contexts.append(context)
        return {"x": args.get("x"), "depth": context.call_depth, "trace": context.trace_id}


class Failing(Tool):
    name = "failing"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise ToolError("the disk is on fire", code="EFIRE")


class Blocking(Tool):
    name = "blocking"

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = False

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise


# --- call_tool ----------------------------------------------------------------------------------


async def test_call_tool_runs_the_tool_as_an_event_with_trace_and_depth() -> None:
    recorder = Recorder()
    async with running(ScriptedProvider([]), [recorder, get_weather]) as h:
        with anyio.fail_after(HANG):
            outcome = await h.loop.call_tool(
                "recorder", {"x": 7}, trace_id="trace-1", call_depth=3, source="mcp:test"
            )
            await h.bus.wait_idle()
    assert outcome.success
    assert outcome.result == {"x": 7, "depth": 3, "trace": "trace-1"}
    calls = h.of("EXEC:TOOL_CALL", "trace-1")
    results = h.of("EXEC:TOOL_RESULT", "trace-1")
    assert len(calls) == 1
    assert len(results) == 1
    assert calls[0].source == "mcp:test"
    assert calls[0].payload["callDepth"] == 3
    assert calls[0].payload["args"] == {"x": 7}
    assert results[0].parent_id == calls[0].id
    assert results[0].payload["toolCallId"] == calls[0].payload["toolCallId"]
    assert results[0].payload["success"] is True
    for event in calls + results:
        validate_payload(event)
    # No session memory is touched by a call from another agent.
    assert all(len(session.memory) == 0 for session in h.loop.sessions.values())


async def test_call_tool_failures_are_outcomes() -> None:
    async with running(ScriptedProvider([]), [Recorder(), Failing()]) as h:
        with anyio.fail_after(HANG):
            missing = await h.loop.call_tool("nope", {})
            bad = await h.loop.call_tool("recorder", {"y": 1})
            not_object = await h.loop.call_tool("recorder", [1, 2])
            failing = await h.loop.call_tool("failing", {})
            await h.bus.wait_idle()
    assert missing.error is not None
    assert missing.error.code == "TOOL_NOT_FOUND"
    assert bad.error is not None
    assert bad.error.code == "INVALID_ARGUMENTS"
    assert not_object.error is not None
    assert not_object.error.code == "INVALID_ARGUMENTS"
    assert failing.error is not None
    assert (failing.error.code, failing.error.message) == ("EFIRE", "the disk is on fire")
    results = h.of("EXEC:TOOL_RESULT")
    assert [r.payload["success"] for r in results] == [False] * 4
    for event in results:
        validate_payload(event)


async def test_cancelling_the_caller_cancels_the_tool() -> None:
    blocking = Blocking()
    async with running(ScriptedProvider([]), [blocking, Echo()]) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.loop.call_tool, "blocking", {})
                await blocking.started.wait()
                tg.cancel_scope.cancel()
            await h.bus.wait_idle()
            # The loop stays usable.
            again = await h.loop.call_tool("echo", {"x": 1})
    assert blocking.cancelled
    assert again.success
    assert again.result == {"x": 1}
    results = h.of("EXEC:TOOL_RESULT")
    assert [r.payload["success"] for r in results] == [False, True]
    assert results[0].payload["error"]["code"] == "CANCELLED"


async def test_call_tool_times_out_like_any_call() -> None:
    from openstarry.agent.loop import LoopLimits

    blocking = Blocking()
    limits = LoopLimits(tool_timeout=0.05)
    async with running(ScriptedProvider([]), [blocking], limits=limits) as h:
        with anyio.fail_after(HANG):
            outcome = await h.loop.call_tool("blocking", {})
    assert outcome.error is not None
    assert outcome.error.code == "TIMEOUT"
    assert blocking.cancelled


async def test_a_call_published_by_another_component_is_answered_on_the_bus() -> None:
    async with running(ScriptedProvider([]), [get_weather]) as h:
        event = Event.new(
            "EXEC:TOOL_CALL",
            {"toolCallId": "c1", "name": "get_weather", "args": {"location": "Taipei"}},
            source="bridge",
            session_id="x",
        )
        await h.publish(event)
        with anyio.fail_after(HANG):
            while not h.of("EXEC:TOOL_RESULT"):
                await anyio.sleep(0.01)
    (result,) = h.of("EXEC:TOOL_RESULT")
    assert result.parent_id == event.id
    assert result.payload["success"] is True
    assert "Taipei" in str(result.payload["result"])


async def test_a_malformed_call_on_the_bus_is_reported_not_fatal() -> None:
    async with running(ScriptedProvider([text("fine")]), [get_weather]) as h:
        await h.publish(Event.new("EXEC:TOOL_CALL", {"oops": 1}, source="bridge", session_id="x"))
        with anyio.fail_after(HANG):
            while not h.of("KERNEL:ERROR"):
                await anyio.sleep(0.01)
        result = await h.ask("still there?")
    assert h.of("KERNEL:ERROR")[0].payload["code"] == "INVALID_INPUT"
    assert result.text == "fine"


async def test_call_tool_needs_a_running_loop() -> None:
    async with EventBus() as bus:
        loop = ExecutionLoop(bus, ScriptedProvider([]), [Echo()])
        with pytest.raises(RuntimeError, match="not running"):
            await loop.call_tool("echo", {})


async def test_the_loops_own_calls_are_not_run_twice() -> None:
    recorder = Recorder()
    provider = ScriptedProvider([tool_call("recorder", {"x": 1}), text("done")])
    async with running(provider, [recorder]) as h:
        result = await h.ask("go")
    assert result.text == "done"
    assert len(recorder.contexts) == 1
    assert recorder.contexts[0].call_depth == 0
    assert len(h.of("EXEC:TOOL_RESULT")) == 1


class SideEffect(Tool):
    """A tool with an effect in the world: counts its runs."""

    name = "side_effect"

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.runs += 1
        return "done"


@pytest.mark.anyio
async def test_a_call_tool_cancelled_before_it_starts_never_runs_the_tool() -> None:
    """An MCP client cancels its ``tools/call`` while the bus is busy: the tool must not run later.

    The caller forgot the call on its way out, so when the bus got to it the
    loop took it for a call published by someone else, and ran it.
    """
    tool = SideEffect()
    entered, hold = anyio.Event(), anyio.Event()

    async def busy(event: Event) -> None:
        if event.source == "bridge":  # holds the bus's dispatch up
            entered.set()
            await hold.wait()

    async with running(ScriptedProvider([]), [tool, Echo()]) as h:
        h.bus.subscribe("EXEC:TOOL_CALL", busy)
        first = {"toolCallId": "c0", "name": "echo", "args": {"x": 0}}
        h.bus.publish(Event.new("EXEC:TOOL_CALL", first, source="bridge", session_id="x"))
        with anyio.fail_after(HANG):
            await entered.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.loop.call_tool, "side_effect", {})
                while not len(h.loop._external):  # published, not dispatched
                    await anyio.sleep(0.001)
                tg.cancel_scope.cancel()
            hold.set()
            await h.bus.wait_idle()
            again = await h.loop.call_tool("echo", {"x": 1})
            await h.bus.wait_idle()
        assert again.success
        assert tool.runs == 0
        (result,) = [r for r in h.of("EXEC:TOOL_RESULT") if r.payload["name"] == "side_effect"]
        assert result.payload["success"] is False
        assert result.payload["error"]["code"] == "CANCELLED"
        assert len(h.loop._external) == 0  # nothing kept for the cancelled call
