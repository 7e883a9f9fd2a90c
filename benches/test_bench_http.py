"""One agent turn over HTTP on openstarry and on its peers, in CPU time.

The turn of ``test_bench_peers.py`` (the prompt, one call of ``add_one(x=1)``,
the answer ``"done"``), with the model behind a real OpenAI Chat Completions
server: ``benches/chat_server.py``, in a process of its own on 127.0.0.1
(its CPU time is not the client's), which answers a first request with the
tool call and a request that ends with the tool's result with ``"done"``.
Each framework talks to it through its own OpenAI adapter, as its
documentation sets one up, with a ``base_url`` and a dummy key, without
streaming:

- openstarry: the ``openai`` provider made by ``create_provider`` from a
  manifest's ``provider`` section (``baseUrl``, ``apiKeyEnv``,
  ``options: {"stream": false}``), ``@tool``, ``Agent.ask`` with
  ``memory_window=1``, the agent (and so the provider's connections) kept open;
- agno: ``OpenAIChat(id, base_url, api_key)``, ``Agent.arun``;
- openai-agents: ``OpenAIChatCompletionsModel`` over an ``AsyncOpenAI``
  client, ``Runner.run``, tracing disabled;
- langgraph: langchain's ``create_agent`` with ``ChatOpenAI(model, base_url,
  api_key)``, through ``ainvoke``;
- pydantic-ai: ``OpenAIChatModel`` with ``OpenAIProvider(base_url, api_key)``,
  ``Agent.run``.

Every side names a model of its own, so the server counts each side's
requests: the test checks two requests (none streamed) and one tool call per
turn on every side. Times are process CPU time per turn, the sides taking
turns in rounds of one test; every ratio is the peer's median over
openstarry's. A peer that is not installed is skipped with the reason.

Two more groups: one turn whose answer is 400 tokens streamed
(``chat.completion.chunk`` events) on openstarry's ``openai`` provider with
``"stream": true``, beside the official ``openai`` client reading the same
stream raw; and the ``openai`` provider's turn beside the same turn on
``FunctionProvider``, both in process (the provider given an in-memory
transport where openstarry has one), so that the ratio is what the provider's
translation and transport add to a turn.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from benches.chat_server import ChatModel, ChatServer, stream_text
from benches.harness import Benchmark, Side, measure_alternating
from benches.test_bench_peers import PROMPT, Counts, _openstarry
from openstarry import Agent, tool
from openstarry.agent.interfaces import Provider
from openstarry.manifest import ProviderConfig
from openstarry.providers import create_provider

GROUP = "turn over HTTP vs peers: 2 requests + 1 tool call (µs CPU per turn)"
STREAM_GROUP = "turn over HTTP: one answer of 400 streamed tokens (µs CPU per turn)"
PROVIDER_GROUP = "turn: the openai provider in process vs FunctionProvider (µs CPU per turn)"
ROUNDS = 11
STREAM_TOKENS = 400
#: The prompt that has the server answer with ``STREAM_TOKENS`` tokens of text.
STREAM_PROMPT = f"stream {STREAM_TOKENS}"
#: The variable openstarry's provider reads its key from (``apiKeyEnv``), and the dummy key.
KEY_ENV = "OPENSTARRY_BENCH_OPENAI_KEY"
API_KEY = "sk-bench-not-a-real-key"

#: What each side needs installed: its modules, and its distributions for the skip's reason.
NEEDS = {
    "agno": (("agno", "openai"), "agno + openai"),
    "openai_agents": (("agents",), "openai-agents"),
    "langgraph": (("langchain", "langgraph", "langchain_openai"), "langchain + langchain-openai"),
    "pydantic_ai": (("pydantic_ai", "openai"), "pydantic-ai-slim + openai"),
    "openai": (("openai",), "openai"),
}


@dataclass
class HttpPeer:
    """A framework's agent, ready in an event loop: ``turn()`` runs one whole turn.

    ``requests()`` says how many model requests the side has made so far, and
    how many of them asked for a stream: the server's counts under the model
    name that only this side asks for.
    """

    name: str
    label: str
    ops: int
    turn: Callable[[], Awaitable[Any]]
    check: Callable[[Any], None]
    counts: Counts
    requests: Callable[[], tuple[int, int]] | None = None
    note: str = ""
    target: float | None = None
    ceiling: float | None = None
    close: Callable[[], Awaitable[Any]] | None = None


def _missing(name: str) -> str | None:
    """Why the side is skipped, or ``None`` when what it needs is installed."""
    modules, dists = NEEDS[name]
    try:
        found = all(importlib.util.find_spec(module) is not None for module in modules)
    except ModuleNotFoundError:
        found = False
    if found:
        return None
    return f"{dists} not installed (pip install -r benches/requirements-peers.txt)"


def _served(server: ChatServer, model: str) -> Callable[[], tuple[int, int]]:
    def requests() -> tuple[int, int]:
        served, streamed = server.counts()
        return served[model], streamed[model]

    return requests


@pytest.fixture(scope="module")
def server() -> Iterator[ChatServer]:
    """The chat completions server, in its own process, for the module's tests."""
    with ChatServer() as running:
        yield running


@pytest.fixture(scope="module")
def api_key() -> Iterator[str]:
    """The dummy key, in the variable openstarry's provider reads it from."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, API_KEY)
        yield API_KEY


# -- openstarry --------------------------------------------------------------


def _config(base_url: str, model: str, stream: bool) -> ProviderConfig:
    """A manifest's ``provider`` section for the ``openai`` provider."""
    return ProviderConfig.model_validate(
        {
            "name": "openai",
            "model": model,
            "baseUrl": base_url,
            "apiKeyEnv": KEY_ENV,
            "options": {"stream": stream},
        }
    )


def _openai_provider(base_url: str, model: str, stream: bool) -> Provider:
    """The ``openai`` provider, made as a manifest's ``provider`` section makes it."""
    return create_provider(_config(base_url, model, stream))


def _openstarry_agent(
    provider: Provider, name: str, label: str, ops: int
) -> tuple[HttpPeer, Agent]:
    counts = Counts()

    @tool
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    agent = Agent(provider, [add_one], memory_window=1)

    def check(result: Any) -> None:
        assert result.error is None, result.error
        assert result.replies == ["done"], result.replies

    peer = HttpPeer(
        name,
        label,
        ops,
        lambda: agent.ask(PROMPT),
        check,
        counts,
        note="Agent.ask on asyncio, memory_window=1; the agent entered once, so the "
        "provider keeps its connections.",
    )
    return peer, agent


# -- agno --------------------------------------------------------------------


def _agno(server: ChatServer) -> HttpPeer:
    from agno.agent import Agent as AgnoAgent
    from agno.models.openai import OpenAIChat
    from agno.tools import tool as agno_tool

    model_id = "bench-agno"  # the server counts this side's requests by it

    counts = Counts()

    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    model = OpenAIChat(id=model_id, base_url=server.base_url, api_key=API_KEY)
    agent = AgnoAgent(model=model, tools=[agno_tool(add_one)], telemetry=False)

    def check(result: Any) -> None:
        assert result.content == "done", result.content
        assert [t.result for t in result.tools or ()] == ["2"], result.tools

    async def close() -> None:
        # The AsyncOpenAI client agno made at the first call, and its connections.
        if model.async_client is not None:
            await model.async_client.close()

    return HttpPeer(
        "agno",
        "agno 3.1 Agent.arun, OpenAIChat(base_url) + @tool",
        15,
        lambda: agent.arun(PROMPT),
        check,
        counts,
        requests=_served(server, model_id),
        note="OpenAIChat(id, base_url, api_key): agno's OpenAI adapter; no db, telemetry off.",
        target=10.0,
        close=close,
    )


# -- openai-agents -----------------------------------------------------------


def _openai_agents(server: ChatServer) -> HttpPeer:
    import agents
    from openai import AsyncOpenAI

    model_id = "bench-openai-agents"  # the server counts this side's requests by it

    agents.set_tracing_disabled(True)
    counts = Counts()

    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    client = AsyncOpenAI(base_url=server.base_url, api_key=API_KEY)
    model = agents.OpenAIChatCompletionsModel(model=model_id, openai_client=client)
    agent = agents.Agent(name="peer", model=model, tools=[agents.function_tool(add_one)])
    config = agents.RunConfig(tracing_disabled=True)

    def check(result: Any) -> None:
        assert result.final_output == "done", result.final_output

    return HttpPeer(
        "openai_agents",
        "openai-agents 0.24 Runner.run, OpenAIChatCompletionsModel + @function_tool",
        10,
        lambda: agents.Runner.run(agent, PROMPT, run_config=config),
        check,
        counts,
        requests=_served(server, model_id),
        note="OpenAIChatCompletionsModel over AsyncOpenAI(base_url, api_key); tracing off.",
        target=15.0,
        close=client.close,
    )


# -- langgraph (langchain's create_agent) ------------------------------------


def _langgraph(server: ChatServer) -> HttpPeer:
    from langchain.agents import create_agent
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool as lc_tool

    model_id = "bench-langgraph"  # the server counts this side's requests by it

    # Imported by name: langchain-openai is installed by `make bench` only, and typed as Any.
    chat_openai: Any = importlib.import_module("langchain_openai").ChatOpenAI
    counts = Counts()

    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    chat = chat_openai(model=model_id, base_url=server.base_url, api_key=API_KEY)
    graph = create_agent(model=chat, tools=[lc_tool(add_one)])
    request = {"messages": [{"role": "user", "content": PROMPT}]}

    def check(result: Any) -> None:
        messages = result["messages"]
        assert messages[-1].content == "done", messages[-1]
        assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["2"]

    return HttpPeer(
        "langgraph",
        "langgraph 1.2 via langchain create_agent, ChatOpenAI(base_url) + @tool",
        10,
        lambda: graph.ainvoke(request),
        check,
        counts,
        requests=_served(server, model_id),
        note="create_agent's graph through ainvoke, with langchain-openai's ChatOpenAI.",
        target=15.0,
        close=chat.root_async_client.close,
    )


# -- pydantic-ai ---------------------------------------------------------------


def _pydantic_ai(server: ChatServer) -> HttpPeer:
    import pydantic_ai
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model_id = "bench-pydantic-ai"  # the server counts this side's requests by it

    counts = Counts()
    provider = OpenAIProvider(base_url=server.base_url, api_key=API_KEY)
    agent = pydantic_ai.Agent(OpenAIChatModel(model_id, provider=provider))

    @agent.tool_plain
    async def add_one(x: int) -> int:
        """Add one to x."""
        counts.tool_calls += 1
        return x + 1

    def check(result: Any) -> None:
        assert result.output == "done", result.output

    return HttpPeer(
        "pydantic_ai",
        "pydantic-ai 2.68 Agent.run, OpenAIChatModel + OpenAIProvider(base_url)",
        8,
        lambda: agent.run(PROMPT),
        check,
        counts,
        requests=_served(server, model_id),
        note="OpenAIChatModel with OpenAIProvider(base_url, api_key); no message history.",
        target=20.0,
        close=provider.client.close,
    )


_BUILDERS: dict[str, Callable[[ChatServer], HttpPeer]] = {
    "agno": _agno,
    "openai_agents": _openai_agents,
    "langgraph": _langgraph,
    "pydantic_ai": _pydantic_ai,
}

# -- running them --------------------------------------------------------------


def _turns(portal: BlockingPortal, peer: HttpPeer, turns: int) -> None:
    turn = peer.turn

    async def run() -> None:
        for _ in range(turns):
            await turn()

    portal.call(run)
    peer.counts.turns += turns


def _first(portal: BlockingPortal, peer: HttpPeer) -> None:
    """One turn, its answer checked, then untimed warm-up turns."""

    async def one() -> Any:
        return await peer.turn()

    peer.check(portal.call(one))
    peer.counts.turns += 1
    _turns(portal, peer, max(2, peer.ops // 5))


def _verify(peers: list[HttpPeer], *, per_turn: int = 2, streamed: bool = False) -> None:
    """Every side made ``per_turn`` model requests and one tool call per turn so far."""
    for peer in peers:
        if peer.requests is not None:
            served, streams = peer.requests()
            peer.counts.model_calls = served
            assert streams == (served if streamed else 0), (
                f"{peer.name}: {streams} of its {served} requests asked for a stream"
            )
        if per_turn == 2:
            peer.counts.check(peer.name)
        else:
            counts = peer.counts
            assert counts.turns > 0, peer.name
            assert (counts.model_calls, counts.tool_calls) == (per_turn * counts.turns, 0), (
                f"{peer.name}: {counts.model_calls} model calls and {counts.tool_calls} tool "
                f"calls in {counts.turns} turns ({per_turn} and 0 a turn expected)"
            )


def _alternate(
    benchmark: Benchmark, portal: BlockingPortal, peers: list[HttpPeer], group: str
) -> None:
    sides = [
        Side(
            peer.name,
            _turns,
            label=peer.label,
            ops=peer.ops,
            setup=lambda peer=peer: ((portal, peer, peer.ops), {}),  # type: ignore[misc]
            role="openstarry" if i == 0 else "baseline",
            target=peer.target,
            ceiling=peer.ceiling,
            note=peer.note,
        )
        for i, peer in enumerate(peers)
    ]
    measure_alternating(benchmark, sides, group=group, rounds=ROUNDS)


async def _build(builder: Callable[..., Any], *args: Any) -> Any:
    """Build a side inside the running loop (some bind to it when made)."""
    return builder(*args)


def _close(portal: BlockingPortal, peers: list[HttpPeer]) -> None:
    for peer in peers:
        if peer.close is not None:
            portal.call(peer.close)


# -- the turn beside its peers ---------------------------------------------------


@pytest.mark.benchmark(timer=time.process_time)
def test_turn_over_http_vs_peers(benchmark: Benchmark, server: ChatServer, api_key: str) -> None:
    # agno logs a warning for every run without a db; the bench's output stays quiet.
    logging.getLogger("agno").setLevel(logging.ERROR)
    skipped = {name: why for name in _BUILDERS if (why := _missing(name)) is not None}
    with start_blocking_portal("asyncio") as portal:
        provider = portal.call(_build, _openai_provider, server.base_url, "bench-openstarry", False)
        ours, agent = _openstarry_agent(
            provider,
            "openstarry",
            "openstarry Agent.ask, the openai provider (stream false) + @tool",
            40,
        )
        ours.requests = _served(server, "bench-openstarry")
        if skipped:
            ours.note += " Skipped: " + "; ".join(f"{n} ({why})" for n, why in skipped.items())
        with portal.wrap_async_context_manager(agent):
            peers = [ours]
            try:
                for name, builder in _BUILDERS.items():
                    if name not in skipped:
                        peers.append(portal.call(_build, builder, server))
                for peer in peers:
                    _first(portal, peer)
                _verify(peers)
                _alternate(benchmark, portal, peers, GROUP)
                _verify(peers)
            finally:
                _close(portal, peers)


# -- a streamed answer ---------------------------------------------------------


def _openstarry_stream(provider: Provider) -> tuple[HttpPeer, Agent]:
    agent = Agent(provider, memory_window=1)
    expected = stream_text(STREAM_TOKENS)

    def check(result: Any) -> None:
        assert result.error is None, result.error
        assert result.replies == [expected], result.replies[:1]

    peer = HttpPeer(
        "openstarry_stream",
        f"openstarry Agent.ask, the openai provider (stream true): {STREAM_TOKENS} tokens",
        10,
        lambda: agent.ask(STREAM_PROMPT),
        check,
        Counts(),
        note=f"One whole turn whose answer is {STREAM_TOKENS} chat.completion.chunk events, "
        "one token each, in a chunked body; no tools; each piece of text passed on as it "
        "arrives (the run's text deltas on the bus).",
    )
    return peer, agent


def _openai_stream(server: ChatServer) -> HttpPeer:
    from openai import AsyncOpenAI

    model_id = "bench-openai-stream"  # the server counts this side's requests by it

    client = AsyncOpenAI(base_url=server.base_url, api_key=API_KEY)
    messages = [{"role": "user", "content": STREAM_PROMPT}]
    expected = stream_text(STREAM_TOKENS)

    async def turn() -> str:
        stream = await client.chat.completions.create(
            model=model_id, messages=messages, stream=True
        )
        parts = []
        async for chunk in stream:
            if chunk.choices and (content := chunk.choices[0].delta.content):
                parts.append(content)
        return "".join(parts)

    def check(result: Any) -> None:
        assert result == expected, result[:80]

    return HttpPeer(
        "openai_stream",
        f"openai client: chat.completions.create(stream=True), {STREAM_TOKENS} chunks read raw",
        3,
        turn,
        check,
        Counts(),
        requests=_served(server, model_id),
        note="The official client's AsyncOpenAI on the same server: every chunk parsed into "
        "its ChatCompletionChunk and the text collected; no agent around it.",
        target=40.0,
        close=client.close,
    )


@pytest.mark.benchmark(timer=time.process_time)
def test_streamed_answer_over_http(benchmark: Benchmark, server: ChatServer, api_key: str) -> None:
    if (why := _missing("openai")) is not None:
        pytest.skip(why)
    with start_blocking_portal("asyncio") as portal:
        provider = portal.call(
            _build, _openai_provider, server.base_url, "bench-openstarry-stream", True
        )
        ours, agent = _openstarry_stream(provider)
        ours.requests = _served(server, "bench-openstarry-stream")
        with portal.wrap_async_context_manager(agent):
            raw = portal.call(_build, _openai_stream, server)
            peers = [ours, raw]
            try:
                for peer in peers:
                    _first(portal, peer)
                _verify(peers, per_turn=1, streamed=True)
                _alternate(benchmark, portal, peers, STREAM_GROUP)
                _verify(peers, per_turn=1, streamed=True)
            finally:
                _close(portal, peers)


# -- the openai provider's turn beside FunctionProvider's ---------------------------


#: Where openstarry's in-memory transport may be, in the order looked at.
_MOCK_MODULES = ("openstarry.providers.mock_transport", "openstarry.providers.transport")


def _memory_provider(chat: ChatModel, model: str) -> tuple[Provider | None, str]:
    """The ``openai`` provider over an in-memory transport answered by ``chat``, if
    openstarry has one (a ``MockTransport`` given to the provider as ``transport=``);
    else ``None`` and why."""
    module: Any = None
    for name in _MOCK_MODULES:
        try:
            found = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(found, "MockTransport"):
            module = found
            break
    if module is None:
        return None, "no MockTransport in " + " or ".join(_MOCK_MODULES)
    from openstarry.providers.http import HTTPProvider
    from openstarry.providers.openai_chat import OpenAIChatAPI

    provider_type: Any = HTTPProvider
    if "transport" not in inspect.signature(provider_type.from_config).parameters:
        return None, "HTTPProvider.from_config takes no transport="
    mock_response: Any = getattr(module, "MockResponse", None)

    def handler(request: Any) -> Any:
        content = chat.completion(json.loads(request.content))
        headers = {"content-type": "application/json"}
        if mock_response is not None:  # MockResponse(status, headers, body)
            return mock_response(200, headers=headers, body=content)
        import httpx  # else a response of httpx's shape

        return httpx.Response(200, headers=headers, content=content)

    config = _config("http://127.0.0.1:8000/v1", model, False)
    transport = module.MockTransport(handler)
    provider: Provider = provider_type.from_config(OpenAIChatAPI(), config, transport=transport)
    return provider, ""


@pytest.mark.benchmark(timer=time.process_time)
def test_openai_provider_vs_function_provider(
    benchmark: Benchmark, server: ChatServer, api_key: str
) -> None:
    chat = ChatModel()
    model = "bench-openstarry-provider"
    provider, why = _memory_provider(chat, model)
    over = "an in-memory transport (MockTransport), no socket"
    requests = lambda: (chat.requests[model], chat.streamed[model])  # noqa: E731
    if provider is None:
        provider = _openai_provider(server.base_url, model, False)
        over = (
            "HTTP to the benchmark's server on 127.0.0.1, as openstarry has no in-memory "
            f"transport ({why})"
        )
        requests = _served(server, model)
    function_peer, function_agent = _openstarry()
    reference = HttpPeer(
        "function_provider",
        function_peer.label,
        1_000,
        function_peer.turn,
        function_peer.check,
        function_peer.counts,
        note=function_peer.note,
    )
    with start_blocking_portal("asyncio") as portal:
        theirs, agent = _openstarry_agent(
            provider,
            "openai_provider",
            "openstarry Agent.ask, the openai provider (stream false) + @tool",
            100,
        )
        theirs.requests = requests
        theirs.ceiling = 5.0
        theirs.note = (
            f"The same turn through the openai provider's request building, transport and "
            f"response parsing, over {over}; the answers are the chat server's."
        )
        with (
            portal.wrap_async_context_manager(function_agent),
            portal.wrap_async_context_manager(agent),
        ):
            peers = [reference, theirs]
            for peer in peers:
                _first(portal, peer)
            _verify(peers)
            _alternate(benchmark, portal, peers, PROVIDER_GROUP)
            _verify(peers)
