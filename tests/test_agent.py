"""``Agent`` (agent/runtime.py): its lifecycle, and serving inputs on the bus it runs.

An agent built from a manifest serves every session of the inputs ingested into its
bus, and two agents given one bus do not both answer an input. (Entering an agent with
MCP servers again while it runs is tested with the MCP client, in test_mcp_client.py.)
"""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG, TOOL_RESULT, USER_MESSAGE, conformance_problems, until
from openstarry.agent.runtime import Agent
from openstarry.bus import EventBus
from openstarry.core import Event, encode_event
from openstarry.events import OUTPUT_AGENT_MESSAGE
from openstarry.testing import FunctionProvider

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"


@pytest.mark.anyio
async def test_a_manifest_agent_driven_by_ingested_ndjson_serves_every_session() -> None:
    """(Regression guard, passes.) ``Agent.from_manifest`` with ``bus.ingest`` of an
    NDJSON batch of INPUT:USER_MESSAGE lines for two sessions (plus a repeated line,
    dropped by the dedup window) serves each input once, in its session, with
    conforming events; the built-in /help answers at once."""
    agent = Agent.from_manifest(EXAMPLE)
    lines = [
        ("a", "Query weather in Taipei"),
        ("b", "list files"),
        ("a", "/read notes.txt"),
        ("b", "/help"),
    ]
    inputs = [
        Event.new(USER_MESSAGE, {"text": line}, source="ndjson", session_id=session)
        for session, line in lines
    ]
    data = b"".join(encode_event(e) + b"\n" for e in [*inputs, inputs[0]])
    async with agent:
        events: list[Event] = []
        agent.bus.subscribe("*", events.append)
        ingested = agent.bus.ingest(data)
        with anyio.fail_after(HANG):
            await until(lambda: agent.loop.runs_completed == 3)
            await agent.bus.wait_idle()
    assert (ingested.accepted, ingested.duplicates, list(ingested.invalid)) == (4, 1, [])
    assert conformance_problems(events, [e.id for e in inputs]) == []
    finals = {
        e.trace_id: e.payload["text"]
        for e in events
        if e.type == OUTPUT_AGENT_MESSAGE and e.payload["final"]
    }
    assert finals[inputs[0].trace_id] == "The weather in Taipei is 25°C, Sunny."
    assert "notes.txt" in finals[inputs[1].trace_id]
    assert finals[inputs[3].trace_id].startswith("Commands:")
    [read] = [e for e in events if e.type == TOOL_RESULT and e.trace_id == inputs[2].trace_id]
    assert read.payload["success"] is True
    assert {agent.loop.sessions[s].id for s in ("a", "b")} == {"a", "b"}


@pytest.mark.anyio
async def test_two_agents_on_one_bus_do_not_both_answer_an_input() -> None:
    """Two agents given the same bus do not both serve every input: an input asked
    through one of them gets one final answer, or sharing the bus is refused when the
    second agent starts. (Today both loops subscribe to INPUT:USER_MESSAGE, so the user
    gets two answers, two runs share one traceId and ``Agent(bus=...)`` says nothing of
    it.)"""
    async with EventBus() as bus:
        events: list[Event] = []
        bus.subscribe("*", events.append)
        first = Agent(FunctionProvider(lambda prompt, context: "from a"), name="a", bus=bus)
        second = Agent(FunctionProvider(lambda prompt, context: "from b"), name="b", bus=bus)
        async with first:
            try:
                await second.__aenter__()
            except RuntimeError:
                return  # refused: the documented alternative
            try:
                with anyio.fail_after(HANG):
                    result = await first.ask("hi", session_id="s")
                    await bus.wait_idle()
            finally:
                await second.__aexit__(None, None, None)
    finals = [
        e.source
        for e in events
        if e.type == OUTPUT_AGENT_MESSAGE and e.trace_id == result.trace_id and e.payload["final"]
    ]
    assert finals == ["agent:a"], f"one input answered by {finals}"
