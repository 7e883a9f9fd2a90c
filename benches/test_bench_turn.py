"""One agent turn through the public API, in CPU time: openstarry on asyncio and trio, pydantic-ai.

The same work on every side: the user's prompt; a model (a plain function)
that asks for one tool call, ``add_one(x=1)``; the tool, an ``async`` function
of one ``int`` argument, its argument validated by pydantic; the model called
again with the tool's result, and answering ``"done"``. Two model calls, one
tool call, per turn.

- openstarry: ``Agent.ask`` with a :class:`~openstarry.testing.FunctionProvider`
  (``record=0``) and an ``@tool``, ``memory_window=1``. Each turn also keeps the
  session's memory of one turn and emits the run's 10 events on the bus
  (input, ticks, state changes, tool call and result, reply), each with its
  id minted in Rust, checked and recorded by the dedup window, and counted;
  nothing else subscribes, so none is queued for the dispatcher, and none is
  made into an ``Event`` (nothing could read it: ``Emitter.take_ref``,
  ``Emitter.mark``, ``Emitter.note``; a subscriber gets each made, with its
  trace and parent ids, as the bus tests show). The session is free,
  so ``ask`` serves the run in the asking task, in a cancel scope that a
  ``/stop`` or the provider deadline would cancel (``TaskScope`` on asyncio,
  trio's on trio), its memory and state exactly as a worker's run leaves them.
- pydantic-ai: ``Agent.run`` with ``FunctionModel`` and ``@agent.tool_plain``,
  no message history; it builds its message list and usage for each run.

Each side runs its turns one after the other inside a running event loop (a
blocking portal's thread, started untimed), ``TURNS`` turns a round. The three
sides take turns, one round each (asyncio, trio, pydantic-ai, asyncio, ...),
in one test, so every ratio compares rounds run under the same load of the
machine (``harness.measure_alternating``). Times are process CPU time
(``time.process_time``: both threads of a portal, no waiting counted), per
turn.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from benches.harness import Benchmark, Side, measure_alternating
from openstarry import Agent, tool
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import ToolOutcome
from openstarry.core import ProviderResponse
from openstarry.testing import FunctionProvider, text, tool_call

GROUP = "turn: Agent.ask, 2 model calls + 1 tool call (µs CPU per turn)"
#: Turns per round for openstarry, and for pydantic-ai (about 40x slower a turn).
TURNS = 2_000
PYDANTIC_AI_TURNS = 100
ROUNDS = 15
#: CPU time, not wall time: the machine's other work does not count.
CPU = pytest.mark.benchmark(timer=time.process_time)


@tool
async def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


def model(prompt: str, context: AgentContext) -> ProviderResponse:
    """Call the tool on the first round; answer once its result has come back."""
    if not context.tool_results:
        return tool_call("add_one", {"x": 1})
    return text("done")


@contextmanager
def openstarry_agent(backend: str) -> Iterator[tuple[BlockingPortal, Agent]]:
    """An agent running in an event loop of ``backend`` in a portal's thread."""
    with start_blocking_portal(backend) as portal:
        agent = Agent(FunctionProvider(model, record=0), [add_one], memory_window=1)
        with portal.wrap_async_context_manager(agent):
            yield portal, agent


def openstarry_turns(portal: BlockingPortal, agent: Agent, turns: int) -> None:
    async def run() -> None:
        ask = agent.ask
        for _ in range(turns):
            await ask("add one to one")

    portal.call(run)


def _check_openstarry(portal: BlockingPortal, agent: Agent) -> None:
    async def one() -> Any:
        result = await agent.ask("add one to one")
        await agent.bus.wait_idle()
        return result

    result = portal.call(one)
    assert result.error is None
    assert result.replies == ["done"]
    memory = agent.loop.session("default").memory
    outcomes = [entry for entry in memory if isinstance(entry, ToolOutcome)]
    assert [(o.name, o.success, o.result) for o in outcomes] == [("add_one", True, 2)]
    published = agent.bus.metrics()["published"]
    assert published > 0  # (0 would pass the next check without a turn)
    assert published % 10 == 0  # 10 events a turn


def _pydantic_ai_agent() -> Any:
    pydantic_ai = pytest.importorskip(
        "pydantic_ai", reason="pydantic-ai-slim (requirements-dev.txt) is the turn group's baseline"
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def function_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # The tool's result is in the last request once the tool has run.
        if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("add_one", {"x": 1})])

    agent = pydantic_ai.Agent(FunctionModel(function_model))

    @agent.tool_plain  # type: ignore[untyped-decorator]
    async def add_one(x: int) -> int:
        """Add one to x."""
        return x + 1

    return agent


def pydantic_ai_turns(portal: BlockingPortal, agent: Any, turns: int) -> None:
    async def run() -> None:
        for _ in range(turns):
            await agent.run("add one to one")

    portal.call(run)


def _check_pydantic_ai(portal: BlockingPortal, agent: Any) -> None:
    async def one() -> Any:
        return await agent.run("add one to one")

    result = portal.call(one)
    assert result.output == "done"
    returns = [
        part.content
        for message in result.all_messages()
        for part in message.parts
        if type(part).__name__ == "ToolReturnPart"
    ]
    assert returns == [2]


@CPU
def test_turn(benchmark: Benchmark) -> None:
    pydantic_ai = _pydantic_ai_agent()
    with (
        openstarry_agent("asyncio") as on_asyncio,
        openstarry_agent("trio") as on_trio,
        start_blocking_portal("asyncio") as pydantic_ai_portal,
    ):
        for portal, agent in (on_asyncio, on_trio):
            _check_openstarry(portal, agent)
            openstarry_turns(portal, agent, 200)  # warm-up, untimed
        _check_pydantic_ai(pydantic_ai_portal, pydantic_ai)
        pydantic_ai_turns(pydantic_ai_portal, pydantic_ai, 20)  # warm-up, untimed
        # The sides take turns, one round each, so that the ratios compare
        # rounds run under the same load of the machine.
        measure_alternating(
            benchmark,
            [
                Side(
                    "asyncio",
                    openstarry_turns,
                    label="Agent.ask on asyncio",
                    ops=TURNS,
                    setup=lambda: ((*on_asyncio, TURNS), {}),
                    role="openstarry",
                ),
                Side(
                    "trio",
                    openstarry_turns,
                    label="Agent.ask on trio",
                    ops=TURNS,
                    setup=lambda: ((*on_trio, TURNS), {}),
                    ceiling=1.3,
                    note="The same turn on trio; its ratio to asyncio must stay at most 1.3x.",
                ),
                Side(
                    "pydantic_ai",
                    pydantic_ai_turns,
                    label="pydantic-ai Agent.run, FunctionModel",
                    ops=PYDANTIC_AI_TURNS,
                    setup=lambda: ((pydantic_ai_portal, pydantic_ai, PYDANTIC_AI_TURNS), {}),
                    target=100.0,
                    note="Agent.run with no message history; FunctionModel and @agent.tool_plain.",
                ),
            ],
            group=GROUP,
            rounds=ROUNDS,
        )
