"""``AgentContext.emit_progress``: a tool's progress as ``EXEC:TOOL_PROGRESS`` events."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from openstarry import Agent, tool
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import Session
from openstarry.core import Event
from openstarry.testing import ScriptedProvider, text, tool_call

pytestmark = pytest.mark.anyio

HANG = 10


@tool
async def slow_search(query: str, context: AgentContext) -> str:
    """Searches in three steps, saying how far it got.

    Args:
        query: What to look for.
    """
    for step in (1, 2, 3):
        context.emit_progress(text=f"step {step}", step=step)
        await anyio.sleep(0)
    return f"found {query}"


async def test_each_piece_of_progress_is_a_child_of_its_call_in_the_runs_trace() -> None:
    provider = ScriptedProvider([tool_call("slow_search", {"query": "tea"}), text("done")])
    events: list[Event] = []
    async with Agent(provider, [slow_search]) as agent:
        agent.bus.subscribe("EXEC:*", events.append)
        with anyio.fail_after(HANG):
            result = await agent.ask("find tea", session_id="s")
            await agent.bus.wait_idle()
    (call,) = [e for e in events if e.type == "EXEC:TOOL_CALL"]
    progress = [e for e in events if e.type == "EXEC:TOOL_PROGRESS"]
    assert [e.payload["text"] for e in progress] == ["step 1", "step 2", "step 3"]
    for event in progress:
        assert (event.trace_id, event.parent_id) == (result.trace_id, call.id)
        assert event.session_id == "s"
        assert event.payload["toolCallId"] == call.payload["toolCallId"]
        assert event.payload["name"] == "slow_search"
    (done,) = [e for e in events if e.type == "EXEC:TOOL_RESULT"]
    assert done.payload["result"] == "found tea"


async def test_progress_of_a_call_from_another_agent_is_in_the_callers_trace() -> None:
    events: list[Event] = []
    async with Agent(ScriptedProvider([]), [slow_search]) as agent:
        agent.bus.subscribe("EXEC:*", events.append)
        with anyio.fail_after(HANG):
            outcome = await agent.loop.call_tool(
                "slow_search", {"query": "tea"}, trace_id="t" * 32, call_depth=1
            )
            await agent.bus.wait_idle()
    assert outcome.success
    (call,) = [e for e in events if e.type == "EXEC:TOOL_CALL"]
    progress = [e for e in events if e.type == "EXEC:TOOL_PROGRESS"]
    assert len(progress) == 3
    assert {(e.trace_id, e.parent_id) for e in progress} == {(call.trace_id, call.id)}


def test_outside_a_tool_call_progress_goes_nowhere() -> None:
    AgentContext(tools={}, session=Session("s")).emit_progress(text="nobody hears this")


async def test_progress_an_event_cannot_carry_fails_the_tool_that_said_it() -> None:
    @tool
    async def odd(context: AgentContext) -> str:
        """Says something no event can carry."""
        context.emit_progress(thing=object())
        return "never"

    provider = ScriptedProvider([tool_call("odd", {}), text("done")])
    results: list[dict[str, Any]] = []
    async with Agent(provider, [odd]) as agent:
        agent.bus.subscribe("EXEC:TOOL_RESULT", lambda e: results.append(e.payload))
        with anyio.fail_after(HANG):
            await agent.ask("go", session_id="s")
            await agent.bus.wait_idle()
    assert results[0]["success"] is False
