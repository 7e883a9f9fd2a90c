"""``Agent`` (agent/runtime.py): its lifecycle, and serving inputs on the bus it runs.

An agent built from a manifest serves every session of the inputs ingested into its
bus, and two agents given one bus do not both answer an input. An agent starts its
bus, provider and toolsets in order and stops them in reverse, and can be entered
again once it has exited. (Entering an agent with
MCP servers again while it runs is tested with the MCP client, in test_mcp_client.py.)
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG, TOOL_RESULT, USER_MESSAGE, conformance_problems, until
from openstarry.agent.interfaces import AgentContext, Tool, Toolset
from openstarry.agent.runtime import Agent
from openstarry.assembly import agent_from_manifest
from openstarry.bus import EventBus
from openstarry.core import Event, encode_event
from openstarry.errors import ManifestError
from openstarry.events import OUTPUT_AGENT_MESSAGE
from openstarry.testing import FunctionProvider, ScriptedProvider, text

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"


@pytest.mark.anyio
async def test_a_manifest_agent_driven_by_ingested_ndjson_serves_every_session() -> None:
    """(Regression guard, passes.) ``Agent.from_manifest`` with ``bus.ingest`` of an
    NDJSON batch of INPUT:USER_MESSAGE lines for two sessions (plus a repeated line,
    dropped by the dedup window) serves each input once, in its session, with
    conforming events; the built-in /help answers at once."""
    agent = agent_from_manifest(EXAMPLE)
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


# -- lifecycle -------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_agent_can_be_entered_again() -> None:
    agent = Agent(ScriptedProvider([text("one"), text("two")]))
    with anyio.fail_after(HANG):
        async with agent:
            assert (await agent.ask("first")).text == "one"
        assert agent.bus.closed
        async with agent:
            assert (await agent.ask("second")).text == "two"


class _Provider:
    """A provider that is an async context manager and records its life."""

    name = "cm"

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def __aenter__(self) -> _Provider:
        self.log.append("provider in")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.log.append(f"provider out {exc_type.__name__ if exc_type else None}")

    async def generate(self, prompt: str, context: AgentContext) -> Any:
        return text(",".join(sorted(context.tools)))


class _Remote(Tool):
    def __init__(self, name: str) -> None:
        self.name = name
        self.parameters = {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return self.name


class _Toolset:
    """A toolset test double: its tools exist while it is entered; it can fail to connect."""

    origin = "test.toolsets"

    def __init__(self, log: list[str], names: list[str], *, fail: bool = False) -> None:
        self.log = log
        self.names = names
        self.fail = fail
        self._tools: dict[str, Tool] = {}

    @property
    def tools(self) -> dict[str, Tool]:
        return self._tools

    async def __aenter__(self) -> _Toolset:
        self.log.append(f"toolset {self.names} in")
        if self.fail:
            raise ConnectionError("cannot connect")
        self._tools = {name: _Remote(name) for name in self.names}
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.log.append(f"toolset {self.names} out {exc_type.__name__ if exc_type else None}")
        self._tools = {}


def test_the_toolset_double_is_a_toolset() -> None:
    assert isinstance(_Toolset([], []), Toolset)


def test_an_agent_refuses_toolsets_that_are_not_toolsets() -> None:
    with pytest.raises(TypeError, match="Toolset"):
        Agent(ScriptedProvider([]), toolsets=[object()])  # type: ignore[list-item]


@pytest.mark.anyio
async def test_an_agent_starts_its_parts_in_order_and_stops_them_in_reverse() -> None:
    log: list[str] = []
    toolset = _Toolset(log, ["far.a", "far.b"])
    agent = Agent(_Provider(log), [_Remote("near")], toolsets=[toolset])
    with anyio.fail_after(HANG):
        async with agent:
            assert sorted(agent.tools) == ["far.a", "far.b", "near"]
            assert (await agent.ask("tools?")).text == "far.a,far.b,near"
            log.append("running")
    assert list(agent.tools) == ["near"]
    assert log == [
        "provider in",
        "toolset ['far.a', 'far.b'] in",
        "running",
        "toolset ['far.a', 'far.b'] out None",
        "provider out None",
    ]
    # And again: the toolset is entered anew.
    with anyio.fail_after(HANG):
        async with agent:
            assert sorted(agent.tools) == ["far.a", "far.b", "near"]
    assert log[-2:] == ["toolset ['far.a', 'far.b'] out None", "provider out None"]


@pytest.mark.anyio
async def test_a_failed_start_leaves_what_it_started_and_the_agent_can_start_later() -> None:
    log: list[str] = []
    good = _Toolset(log, ["far.a"])
    bad = _Toolset(log, ["other.b"], fail=True)
    agent = Agent(_Provider(log), toolsets=[good, bad])
    with anyio.fail_after(HANG), pytest.raises(ConnectionError):
        await agent.__aenter__()
    assert log == [
        "provider in",
        "toolset ['far.a'] in",
        "toolset ['other.b'] in",
        "toolset ['far.a'] out ConnectionError",
        "provider out ConnectionError",
    ]
    assert dict(agent.tools) == {}
    assert agent.bus.input_owner is None
    bad.fail = False
    with anyio.fail_after(HANG):
        async with agent:
            assert sorted(agent.tools) == ["far.a", "other.b"]


@pytest.mark.anyio
async def test_a_toolset_tool_named_like_a_local_one_fails_the_start_naming_its_origin() -> None:
    log: list[str] = []
    near = _Remote("far.a")
    agent = Agent(ScriptedProvider([]), [near], toolsets=[_Toolset(log, ["far.a"])])
    with anyio.fail_after(HANG), pytest.raises(ManifestError) as caught:
        await agent.__aenter__()
    assert caught.value.field == "test.toolsets"
    assert "far.a" in str(caught.value)
    assert log[-1] == "toolset ['far.a'] out ManifestError"
    assert dict(agent.tools) == {"far.a": near}
