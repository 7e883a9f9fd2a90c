"""One agent turn on openstarry and on the frameworks users pick instead, in CPU time.

The turn of ``test_bench_turn.py`` on five frameworks, in alternating rounds
of one test: the user's prompt; a fake model that asks for one tool call,
``add_one(x=1)``; the tool, an ``async`` function of one ``int`` argument,
validated the way its framework validates a tool's arguments; the model
called again with the tool's result, answering ``"done"``. Each framework gets
a fake model of its own kind, built as its documentation builds one (how each
is built: ``benches/README.md``), and a counter on every side checks that each
turn made exactly two model calls and one tool call.

- openstarry: ``Agent.ask``, ``FunctionProvider`` and ``@tool``, ``memory_window=1``;
- agno: ``Agent.arun`` with a ``Model`` subclass, no database, telemetry off;
- openai-agents: ``Runner.run`` with a ``Model`` subclass and ``@function_tool``,
  tracing disabled;
- langgraph: the graph that langchain's ``create_agent`` builds, with a
  ``BaseChatModel`` subclass and langchain's ``@tool``, through ``ainvoke``;
- pydantic-ai: ``Agent.run`` with ``FunctionModel`` and ``@agent.tool_plain``.

The peers are pinned in ``benches/requirements-peers.txt``, which ``make
bench`` installs (``make test`` does not); a peer that is not installed is
skipped, with the reason, and the others are timed without it. Times are
process CPU time per turn; every ratio is the peer's median over
openstarry's, in the same run.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from benches.harness import Benchmark, Side, measure_alternating
from openstarry import Agent, tool
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import ToolOutcome
from openstarry.core import ProviderResponse
from openstarry.testing import FunctionProvider, text, tool_call

GROUP = "turn vs peers: 2 model calls + 1 tool call (µs CPU per turn)"
ROUNDS = 11
PROMPT = "add one to one"

#: What each peer needs installed (its distribution, for the skip's reason).
PEERS = {
    "agno": ("agno", "agno"),
    "openai_agents": ("agents", "openai-agents"),
    "langgraph": ("langchain.agents", "langchain + langgraph"),
    "pydantic_ai": ("pydantic_ai", "pydantic-ai-slim"),
}


@dataclass
class Counts:
    """One side's model calls, tool calls and turns, checked against each other."""

    model_calls: int = 0
    tool_calls: int = 0
    turns: int = 0

    def check(self, name: str) -> None:
        assert self.turns > 0, name
        assert (self.model_calls, self.tool_calls) == (2 * self.turns, self.turns), (
            f"{name}: {self.model_calls} model calls and {self.tool_calls} tool calls "
            f"in {self.turns} turns (2 and 1 a turn expected)"
        )


@dataclass
class Peer:
    """A framework's agent, ready in an event loop: ``turn()`` runs one whole turn."""

    name: str
    label: str
    ops: int
    turn: Callable[[], Any]
    check: Callable[[Any], None]
    counts: Counts = field(default_factory=Counts)
    note: str = ""
    target: float | None = None


def _installed(name: str) -> str | None:
    """Why the peer is skipped, or ``None`` when it is installed."""
    module, dist = PEERS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return (
        None
        if found
        else f"{dist} is not installed (pip install -r benches/requirements-peers.txt)"
    )


# -- openstarry --------------------------------------------------------------


def _openstarry() -> tuple[Peer, Agent]:
    counts = Counts()

    @tool
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        counts.model_calls += 1
        if not context.tool_results:
            return tool_call("add_one", {"x": 1})
        return text("done")

    agent = Agent(FunctionProvider(model, record=0), [add_one], memory_window=1)

    def check(result: Any) -> None:
        assert result.error is None
        assert result.replies == ["done"]
        memory = agent.loop.session("default").memory
        outcomes = [entry.result for entry in memory if isinstance(entry, ToolOutcome)]
        assert outcomes == [2], list(memory)

    peer = Peer(
        "openstarry",
        "openstarry Agent.ask, FunctionProvider + @tool",
        2_000,
        lambda: agent.ask(PROMPT),
        check,
        counts,
        note="Agent.ask on asyncio, memory_window=1: the run's 10 events on the bus, memory kept.",
    )
    return peer, agent


# -- agno --------------------------------------------------------------------


def _agno() -> Peer:
    from agno.agent import Agent as AgnoAgent
    from agno.models.base import Model
    from agno.models.response import ModelResponse
    from agno.tools import tool as agno_tool

    counts = Counts()
    ids = itertools.count()

    class FakeModel(Model):
        """A model that calls ``add_one`` until a tool result is in its messages."""

        def _response(self, messages: list[Any]) -> ModelResponse:
            counts.model_calls += 1
            if messages and messages[-1].role == "tool":
                return ModelResponse(role="assistant", content="done")
            call = {
                "id": f"call_{next(ids)}",
                "type": "function",
                "function": {"name": "add_one", "arguments": json.dumps({"x": 1})},
            }
            return ModelResponse(role="assistant", tool_calls=[call])

        def invoke(self, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            return self._response(messages)

        async def ainvoke(self, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            return self._response(messages)

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def ainvoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
            return response

        def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
            return response

    @agno_tool
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    agent = AgnoAgent(model=FakeModel(id="fake"), tools=[add_one], telemetry=False)

    def check(result: Any) -> None:
        assert result.content == "done", result.content
        assert [t.result for t in result.tools or ()] == ["2"], result.tools

    return Peer(
        "agno",
        "agno 3.1 Agent.arun, a Model subclass + @tool",
        200,
        lambda: agent.arun(PROMPT),
        check,
        counts,
        note="A Model subclass whose ainvoke returns agno's ModelResponse; no db, telemetry off.",
        target=25.0,
    )


# -- openai-agents -----------------------------------------------------------


def _openai_agents() -> Peer:
    import agents
    from agents.items import ModelResponse
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    agents.set_tracing_disabled(True)
    counts = Counts()
    ids = itertools.count()

    class FakeModel(agents.Model):
        """A model that calls ``add_one`` until its input holds the call's output."""

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            counts.model_calls += 1
            n = next(ids)
            answered = not isinstance(input, str) and any(
                isinstance(item, dict) and item.get("type") == "function_call_output"
                for item in input
            )
            output: list[Any]
            if answered:
                text_part = ResponseOutputText(type="output_text", text="done", annotations=[])
                output = [
                    ResponseOutputMessage(
                        id=f"msg_{n}",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[text_part],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        id=f"fc_{n}",
                        call_id=f"call_{n}",
                        type="function_call",
                        name="add_one",
                        arguments=json.dumps({"x": 1}),
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @agents.function_tool
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    agent = agents.Agent(name="peer", model=FakeModel(), tools=[add_one])
    config = agents.RunConfig(tracing_disabled=True)

    def check(result: Any) -> None:
        assert result.final_output == "done", result.final_output
        outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
        assert outputs == [2], result.new_items

    return Peer(
        "openai_agents",
        "openai-agents 0.24 Runner.run, a Model subclass + @function_tool",
        40,
        lambda: agents.Runner.run(agent, PROMPT, run_config=config),
        check,
        counts,
        note="A Model subclass whose get_response returns the Responses API's items; tracing off.",
        target=100.0,
    )


# -- langgraph (langchain's create_agent) ------------------------------------


def _langgraph() -> Peer:
    from langchain.agents import create_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool

    counts = Counts()
    ids = itertools.count()

    class FakeChatModel(BaseChatModel):
        """A chat model that calls ``add_one`` until a ``ToolMessage`` comes back."""

        @property
        def _llm_type(self) -> str:
            return "fake-tool-caller"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _answer(self, messages: list[BaseMessage]) -> ChatResult:
            counts.model_calls += 1
            if messages and isinstance(messages[-1], ToolMessage):
                message = AIMessage(content="done")
            else:
                message = AIMessage(
                    content="",
                    tool_calls=[
                        {
                            "name": "add_one",
                            "args": {"x": 1},
                            "id": f"call_{next(ids)}",
                            "type": "tool_call",
                        }
                    ],
                )
            return ChatResult(generations=[ChatGeneration(message=message)])

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            return self._answer(messages)

        async def _agenerate(
            self, messages: list[BaseMessage], *args: Any, **kwargs: Any
        ) -> ChatResult:
            # Answered in the event loop (the default runs _generate in a thread).
            return self._answer(messages)

    @lc_tool
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    graph = create_agent(model=FakeChatModel(), tools=[add_one])
    request = {"messages": [{"role": "user", "content": PROMPT}]}

    def check(result: Any) -> None:
        messages = result["messages"]
        assert messages[-1].content == "done", messages[-1]
        assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["2"]

    return Peer(
        "langgraph",
        "langgraph 1.2 via langchain create_agent, a BaseChatModel + @tool",
        40,
        lambda: graph.ainvoke(request),
        check,
        counts,
        note="create_agent's graph through ainvoke; a BaseChatModel subclass with _agenerate.",
        target=100.0,
    )


# -- pydantic-ai ---------------------------------------------------------------


def _pydantic_ai() -> Peer:
    import pydantic_ai
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    counts = Counts()

    def function_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        counts.model_calls += 1
        if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("add_one", {"x": 1})])

    agent = pydantic_ai.Agent(FunctionModel(function_model))

    @agent.tool_plain
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    def check(result: Any) -> None:
        assert result.output == "done", result.output
        returns = [
            part.content
            for message in result.all_messages()
            for part in message.parts
            if part.part_kind == "tool-return"
        ]
        assert returns == [2], returns

    return Peer(
        "pydantic_ai",
        "pydantic-ai 2.68 Agent.run, FunctionModel + @agent.tool_plain",
        25,
        lambda: agent.run(PROMPT),
        check,
        counts,
        note="Agent.run with no message history; FunctionModel and @agent.tool_plain.",
        target=200.0,
    )


_BUILDERS: dict[str, Callable[[], Peer]] = {
    "agno": _agno,
    "openai_agents": _openai_agents,
    "langgraph": _langgraph,
    "pydantic_ai": _pydantic_ai,
}


def _turns(portal: BlockingPortal, peer: Peer, turns: int) -> None:
    turn = peer.turn

    async def run() -> None:
        for _ in range(turns):
            await turn()

    portal.call(run)
    peer.counts.turns += turns


def _check(portal: BlockingPortal, peer: Peer) -> None:
    async def one() -> Any:
        return await peer.turn()

    peer.check(portal.call(one))
    peer.counts.turns += 1
    peer.counts.check(peer.name)


@pytest.mark.benchmark(timer=time.process_time)
def test_turn_vs_peers(benchmark: Benchmark) -> None:
    # agno logs a warning for a model with no provider name; the bench's output stays quiet.
    logging.getLogger("agno").setLevel(logging.ERROR)
    skipped = {name: why for name in PEERS if (why := _installed(name)) is not None}
    openstarry_peer, agent = _openstarry()
    if skipped:
        # Timed without them: said in the table, so a partial one is not taken for whole.
        openstarry_peer.note += " Skipped: " + "; ".join(
            f"{name} ({why})" for name, why in skipped.items()
        )
    with start_blocking_portal("asyncio") as portal, portal.wrap_async_context_manager(agent):
        peers: list[Peer] = [openstarry_peer]
        peers += [
            portal.call(_build, builder)
            for name, builder in _BUILDERS.items()
            if name not in skipped
        ]
        for peer in peers:
            _check(portal, peer)
            _turns(portal, peer, max(2, peer.ops // 10))  # warm-up, untimed
        sides = [
            Side(
                peer.name,
                _turns,
                label=peer.label,
                ops=peer.ops,
                setup=lambda peer=peer: ((portal, peer, peer.ops), {}),  # type: ignore[misc]
                role="openstarry" if peer.name == "openstarry" else "baseline",
                target=peer.target,
                note=peer.note,
            )
            for peer in peers
        ]
        measure_alternating(benchmark, sides, group=GROUP, rounds=ROUNDS)
        for peer in peers:
            peer.counts.check(peer.name)


async def _build(builder: Callable[[], Peer]) -> Peer:
    """Build a peer inside the running loop (some bind to it when made)."""
    return builder()
