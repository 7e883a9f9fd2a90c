"""Conformance tests for issues 4, 5 and 6 where no other test proves a requirement.

Each test names the issue and the requirement it proves. They drive the real
components: a fake LLM API on 127.0.0.1 behind the real HTTP providers, the
official MCP SDK's server (``mcp_fixtures/sdk_server.py``) and client, and
``openstarry serve`` as a separate process.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from fake_llm_server import FakeLLMServer, Reply
from openstarry import Agent
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import ToolOutcome
from openstarry.agent.tools import tool
from openstarry.api.client import Client
from openstarry.core import Event
from openstarry.manifest import McpServerConfig
from openstarry.testing import FunctionProvider, text, tool_call
from openstarry.tools.weather import get_weather

TESTS = Path(__file__).resolve().parent
WEATHER = TESTS.parent / "examples" / "weather-agent" / "agent.json"
SDK_SERVER = TESTS / "mcp_fixtures" / "sdk_server.py"
#: A bound on any one wait, so a broken component fails a test instead of hanging it.
HANG = 10.0
KEY_ENV = "OPENSTARRY_CONFORMANCE_KEY"
FINAL_TEXT = "The weather in Taipei is 25°C, Sunny."


# --- tools for the retrieval tests (named in agent.json by import reference) -----------------


@tool
def convert_currency(amount: float, source: str, target: str) -> str:
    """Convert an amount of money from one currency into another at today's exchange rate.

    Args:
        amount: How much money.
        source: The currency code to convert from, such as USD.
        target: The currency code to convert into, such as EUR.
    """
    return f"{amount} {source} in {target}"


@tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email message to a recipient's mailbox.

    Args:
        to: The recipient's email address.
        subject: The subject line.
        body: The message text.
    """
    return "sent"


@tool
def create_calendar_event(title: str, start: str) -> str:
    """Create a meeting or appointment in the user's calendar.

    Args:
        title: What the meeting is about.
        start: When it starts, as an ISO 8601 date and time.
    """
    return "created"


@tool
def translate_text(text_: str, language: str) -> str:
    """Translate a piece of text into another language.

    Args:
        text_: The text to translate.
        language: The language to translate into.
    """
    return text_


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search airline flights between two airports on a date.

    Args:
        origin: The departure airport.
        destination: The arrival airport.
        date: The day of travel.
    """
    return "none"


@tool
def resize_image(path: str, width: int, height: int) -> str:
    """Resize an image file to a new width and height in pixels.

    Args:
        path: The image file.
        width: The new width.
        height: The new height.
    """
    return path


@tool
def play_music(song: str) -> str:
    """Play a song or a playlist on the speakers.

    Args:
        song: The song or playlist name.
    """
    return song


@tool
def stock_quote(symbol: str) -> str:
    """Look up the latest share price of a stock by its ticker symbol.

    Args:
        symbol: The ticker symbol.
    """
    return symbol


MANY_TOOLS = [
    "get_weather",
    "fs.read",
    "fs.write",
    "fs.list",
    *(
        f"{__name__}:{f}"
        for f in (
            "convert_currency",
            "send_email",
            "create_calendar_event",
            "translate_text",
            "search_flights",
            "resize_image",
            "play_music",
            "stock_quote",
        )
    ),
]


def chat_answer(words: str) -> Reply:
    """An OpenAI Chat Completions answer with plain text."""
    return Reply(
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4.1-2025-04-14",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": words, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }
    )


def declared_names(body: dict[str, Any]) -> list[str]:
    """The tool names a Chat Completions request declares."""
    return [entry["function"]["name"] for entry in body.get("tools", [])]


# --- issue 6 §4: the tool retrieval layer, configured in agent.json ---------------------------


@pytest.mark.anyio
async def test_issue6_only_the_top_n_tools_of_agent_json_reach_the_http_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More tools than ``toolRetrieval.topN``: the default (lexical, no model) retriever
    picks the N most relevant to each input, and only those reach the LLM API."""
    monkeypatch.setenv(KEY_ENV, "k-conformance")
    with FakeLLMServer() as server:
        manifest = {
            "identity": {"name": "many-tools", "version": "1.0.0"},
            "tools": MANY_TOOLS,
            "fs": {"allowedPaths": ["."]},
            "toolRetrieval": {"topN": 2},
            "provider": {
                "name": "openai",
                "model": "gpt-4.1",
                "baseUrl": server.url + "/v1",
                "apiKeyEnv": KEY_ENV,
                "options": {"stream": False, "retryBackoff": 0.01},
            },
        }
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(manifest), encoding="utf-8")
        server.script(None, chat_answer("one"), chat_answer("two"), chat_answer("three"))
        agent = Agent.from_manifest(path)
        assert len(agent.tools) == len(MANY_TOOLS)
        with anyio.fail_after(HANG):
            async with agent:
                for line in (
                    "Convert 100 dollars into euros at the exchange rate",
                    "What is the weather forecast in Taipei today?",
                    "Send an email to Ada about the meeting",
                ):
                    result = await agent.ask(line)
                    assert result.error is None, result.error
        asked = [declared_names(request.json) for request in server.requests]
    assert [len(names) for names in asked] == [2, 2, 2]
    assert "convert_currency" in asked[0]
    assert "get_weather" in asked[1]
    assert "send_email" in asked[2]
    # Each input gets its own selection.
    assert len({tuple(sorted(names)) for names in asked}) == 3


# --- issue 5 §2: remote MCP tools are the provider's tools like local ones ---------------------


@pytest.mark.anyio
async def test_issue5_the_provider_sees_remote_tools_like_local_ones() -> None:
    """A server written with the official SDK, over stdio: its tools reach the provider's
    context next to the local tool, described the same way, under ``<server>.<tool>``, and
    the retrieval layer ranks them like local tools."""
    seen: list[dict[str, dict[str, Any]]] = []

    def brain(prompt: str, context: AgentContext) -> Any:
        seen.append({name: t.describe() for name, t in context.tools.items()})
        if context.round == 1:
            return tool_call("fx.add", {"a": 2, "b": 3})
        outcome = context.memory.current_turn()[-1]
        assert isinstance(outcome, ToolOutcome)
        return text(f"The sum is {outcome.result['sum']}.")

    config = McpServerConfig(name="fx", command=[sys.executable, str(SDK_SERVER), "stdio"])
    agent = Agent(FunctionProvider(brain), [get_weather], mcp_servers=[config])
    with anyio.fail_after(HANG * 2):
        async with agent:
            everything = await agent.ask("Hello")
            # Now with a limit: the remote tool that fits the input is chosen.
            agent.loop.max_tools = 2
            chosen = await agent.ask("add two integers")
    assert everything.error is None
    assert everything.replies == ["The sum is 5."]
    first = seen[0]
    assert "get_weather" in first
    assert "fx.add" in first
    local, remote = first["get_weather"], first["fx.add"]
    assert set(local) == set(remote)  # one shape of description for both
    assert remote["name"] == "fx.add"
    assert remote["description"] == "Add two integers."
    assert remote["parameters"]["required"] == ["a", "b"]
    assert chosen.replies == ["The sum is 5."]
    assert len(seen[2]) == 2
    assert "fx.add" in seen[2]


# --- issue 5 §3: the trace travels in the X-OpenStarry-Trace-ID header family -----------------


@asynccontextmanager
async def mcp_http_client(agent: Agent, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The official SDK's client over Streamable HTTP to ``agent``'s MCP app, in process."""
    import httpx2
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    from openstarry.mcp import AgentMcpServer

    app = AgentMcpServer(agent, expose=["whoami", "get_weather"]).http_app(json_response=True)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://127.0.0.1:8765",
            headers=headers,
        ) as http,
        McpClient(streamable_http_client("http://127.0.0.1:8765/mcp", http_client=http)) as client,
    ):
        yield client


@pytest.mark.anyio
async def test_issue5_the_trace_header_is_x_openstarry_trace_id_with_its_depth_beside_it() -> None:
    """The header is literally ``X-OpenStarry-Trace-ID`` (spec 004 §4); the depth header is
    of the same family; a depth over 5 is refused with a JSON-RPC error and KERNEL:ERROR."""
    pytest.importorskip("mcp", reason="the [mcp] extra is not installed")
    from mcp.shared.exceptions import MCPError

    from mcp_fixtures.tools import whoami
    from openstarry.mcp import DEPTH_HEADER, RECURSION_LIMIT_EXCEEDED, TRACE_HEADER
    from openstarry.testing import ScriptedProvider

    assert TRACE_HEADER == "X-OpenStarry-Trace-ID"
    assert DEPTH_HEADER.lower().startswith("x-openstarry-")
    agent = Agent(ScriptedProvider([]), [whoami, get_weather], name="trace-agent")
    errors: list[Event] = []
    with anyio.fail_after(HANG):
        async with agent:
            agent.bus.subscribe("KERNEL:ERROR", errors.append)
            headers = {"x-openstarry-trace-id": "literal-1", DEPTH_HEADER: "5"}
            async with mcp_http_client(agent, headers) as client:
                result = await client.call_tool("whoami", {})
                assert result.structured_content == {"traceId": "literal-1", "callDepth": 5}
            deep = {"X-OpenStarry-Trace-ID": "literal-2", DEPTH_HEADER: "6"}
            async with mcp_http_client(agent, deep) as client:
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("whoami", {})
                assert caught.value.code == RECURSION_LIMIT_EXCEEDED
                assert "literal-2" in caught.value.message
                # The agent stays responsive to a new request, in another trace.
            async with mcp_http_client(agent, {"X-OpenStarry-Trace-ID": "literal-3"}) as client:
                fresh = await client.call_tool("whoami", {})
                assert fresh.structured_content == {"traceId": "literal-3", "callDepth": 1}
            await agent.bus.wait_idle()
    assert [e.trace_id for e in errors] == ["literal-2"]


# --- issue 4 §4: openstarry serve MANIFEST --host H --port N ----------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_issue4_openstarry_serve_takes_host_and_port() -> None:
    """``openstarry serve MANIFEST --host 127.0.0.1 --port N``: health, then a streamed run."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "openstarry.cli", "serve", str(WEATHER)),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with Client(f"http://127.0.0.1:{port}", timeout=HANG) as client:
            deadline = time.monotonic() + HANG
            while True:
                try:
                    health = client.health()
                    break
                except httpx.TransportError:
                    assert process.poll() is None, process.communicate()
                    assert time.monotonic() < deadline, "the server did not come up"
                    time.sleep(0.05)
            streamed = client.run("Query weather in Taipei", session_id="host")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=HANG * 3)
        except subprocess.TimeoutExpired:  # never left running past the test
            process.kill()
            process.communicate()
            raise
    assert health["status"] == "ok"
    assert health["agent"] == "weather-agent"
    assert streamed.session_id == "host"
    assert streamed.output is not None
    assert streamed.output[-1].get_text_content() == FINAL_TEXT
    assert f"127.0.0.1:{port}" in err


# --- issue 5 §1: a tools/call is an EXEC:TOOL_CALL like any other: de-duplicated -------------


class Counter(Tool):
    """Counts its runs."""

    name = "count"
    description = "Counts how often it ran."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {}}
        self.runs = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.runs += 1
        return {"runs": self.runs}


@pytest.mark.anyio
async def test_issue5_a_tools_call_event_delivered_twice_runs_the_tool_once() -> None:
    """The MCP call enters the bus as EXEC:TOOL_CALL; the same event published again (a
    duplicate delivery) is de-duplicated like any other and runs nothing more."""
    pytest.importorskip("mcp", reason="the [mcp] extra is not installed")
    from mcp import Client as McpClient

    from openstarry.mcp import AgentMcpServer
    from openstarry.testing import ScriptedProvider

    counter = Counter()
    agent = Agent(ScriptedProvider([]), [counter], name="dedup-agent")
    calls: list[Event] = []
    results: list[Event] = []
    with anyio.fail_after(HANG):
        async with agent:
            agent.bus.subscribe("EXEC:TOOL_CALL", calls.append)
            agent.bus.subscribe("EXEC:TOOL_RESULT", results.append)
            server = AgentMcpServer(agent, expose=["count"])
            async with McpClient(server.server) as client:
                result = await client.call_tool("count", {})
                assert result.is_error is False
                await agent.bus.wait_idle()
                [call] = calls
                assert await agent.bus.apublish(call) is False  # the same event, again
                await agent.bus.wait_idle()
                again = await client.call_tool("count", {})  # a new call runs
                await agent.bus.wait_idle()
    assert counter.runs == 2
    assert again.structured_content == {"runs": 2}
    assert len(results) == 2
    assert all(r.payload["success"] for r in results)


# --- issue 4 §1: the spec's field names, and the spec's own request accepted -----------------

#: The fields spec 003 gives each model (the AgentScope Runtime schema).
SPEC_FIELDS: dict[str, set[str]] = {
    "FunctionParameters": {"type", "properties", "required"},
    "FunctionTool": {"name", "description", "parameters"},
    "Tool": {"type", "function"},
    "FunctionCall": {"call_id", "name", "arguments"},
    "FunctionCallOutput": {"call_id", "output"},
    "Content": {"type", "object", "index", "delta", "msg_id"},
    "ImageContent": {"image_url"},
    "TextContent": {"text"},
    "DataContent": {"data"},
    "AudioContent": {"data", "format"},
    "FileContent": {"file_url", "file_id", "filename", "file_data"},
    "RefusalContent": {"refusal"},
    "Message": {"id", "object", "type", "status", "role", "content", "code", "message"},
    "BaseRequest": {"input", "stream"},
    "AgentRequest": {
        *("model", "top_p", "temperature", "frequency_penalty", "presence_penalty"),
        *("max_tokens", "stop", "n", "seed", "tools", "session_id", "response_id"),
    },
    "BaseResponse": {
        *("sequence_number", "id", "object", "created_at", "completed_at"),
        *("error", "output", "usage", "status"),
    },
    "AgentResponse": {"session_id"},
    "Error": {"code", "message"},
}


def test_issue4_every_model_has_the_specs_field_names_on_the_wire() -> None:
    """Same field names as spec 003, as the JSON names (aliases) the models read and write."""
    from openstarry.api import models

    for name, fields in SPEC_FIELDS.items():
        cls = getattr(models, name)
        wire = {field.alias or key for key, field in cls.model_fields.items()}
        assert fields <= wire, (name, sorted(fields - wire))
    text_content = models.TextContent(text="x", msg_id="msg_1", index=0, delta=True)
    assert text_content.to_wire() == {
        "object": "content",
        "type": "text",
        "text": "x",
        "msg_id": "msg_1",
        "index": 0,
        "delta": True,
    }
    call = models.FunctionCall(call_id="c1", name="get_weather", arguments="{}")
    assert call.to_wire() == {"call_id": "c1", "name": "get_weather", "arguments": "{}"}
    assert models.Message().to_wire()["object"] == "message"
    assert models.Message().id.startswith("msg_")


#: The request of spec 003's "Example Use Case", verbatim.
SPEC_REQUEST = """{
  "input": [{
    "role": "user",
    "content": [{"type": "text", "text": "Describe this image"}],
    "type": "message"
  }],
  "stream": true,
  "model": "gpt-4-vision"
}"""


@pytest.mark.anyio
async def test_issue4_the_specs_example_request_is_served_over_http() -> None:
    """The spec's own request JSON, sent as it is to a real server, gets the spec's stream."""
    from openstarry.testing import ScriptedProvider
    from test_api_http import frames, serving

    provider = ScriptedProvider(["This image shows..."])
    with serving(Agent(provider)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            response = await http.post(
                "/process", content=SPEC_REQUEST, headers={"content-type": "application/json"}
            )
    assert response.status_code == 200, response.text
    events = [json.loads(block["data"]) for block in frames(response.text)]
    assert provider.calls[0].prompt == "Describe this image"
    kinds = [(e["object"], e["status"]) for e in events]
    assert kinds[0] == ("response", "created")
    assert kinds[-1] == ("response", "completed")
    message = next(e for e in events if e["object"] == "message")
    contents = [e for e in events if e["object"] == "content"]
    assert all(c["msg_id"] == message["id"] for c in contents)
    assert [c["delta"] for c in contents] == [True, False]
    assert contents[-1]["text"] == "This image shows..."
    assert all(c["index"] == 0 for c in contents)


# --- issue 6 §2: output that cannot be parsed never crashes the loop (real HTTP provider) ----


@pytest.mark.anyio
async def test_issue6_unparseable_llm_output_is_pain_or_a_note_and_the_agent_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the real provider and loop: a body that is not JSON ends that run with an
    error (AgentPainException), invalid JSON arguments become a text note and run no tool,
    and the agent answers the next input."""
    from openstarry.manifest import parse_manifest

    monkeypatch.setenv(KEY_ENV, "k-conformance")
    broken_call = chat_answer("")
    broken_call.json["choices"][0]["message"]["tool_calls"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location": "Tai'},
        }
    ]
    broken_call.json["choices"][0]["finish_reason"] = "tool_calls"
    with FakeLLMServer() as server:
        server.script(
            None,
            Reply(body=b"<html>not json</html>", headers={"Content-Type": "application/json"}),
            broken_call,
            chat_answer("Still here."),
        )
        data = json.loads(WEATHER.read_text(encoding="utf-8"))
        data["provider"] = {
            "name": "openai",
            "model": "gpt-4.1",
            "baseUrl": server.url + "/v1",
            "apiKeyEnv": KEY_ENV,
            "options": {"stream": False, "retryBackoff": 0.01},
        }
        agent = Agent.from_manifest(parse_manifest(data, base_dir=WEATHER.parent))
        ran: list[Event] = []
        with anyio.fail_after(HANG):
            async with agent:
                agent.bus.subscribe("EXEC:TOOL_CALL", ran.append)
                pain = await agent.ask("Query weather in Taipei")
                noted = await agent.ask("Query weather in Taipei")
                after = await agent.ask("Hello?")
                await agent.bus.wait_idle()
    assert pain.error is not None
    assert pain.error["code"] == "AGENT_PAIN", pain.error
    assert noted.error is None, noted.error
    assert len(noted.replies) == 1
    assert "get_weather" in noted.replies[0]
    assert "JSON" in noted.replies[0] or "json" in noted.replies[0]
    assert ran == []  # the broken call ran nothing
    assert after.error is None
    assert after.replies == ["Still here."]


# --- issue 6 §3: each real adapter against the fake API: 429, 500, a stream cut midway ------

#: Per API, how many of the weather run's streamed events arrive before the connection drops,
#: and the text they carry: the text and part of the tool call (Gemini sends a call whole in
#: its last chunk, so two of its three text pieces).
CUT_AFTER = {
    "openai": (6, "Sure, let me check."),
    "openai-responses": (11, "Sure, let me check."),
    "anthropic": (10, "Sure, let me check."),
    "gemini": (2, "Sure, let me"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("api_name", list(CUT_AFTER))
async def test_issue6_each_http_provider_retries_429_and_500_and_survives_a_cut_stream(
    api_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through each real adapter, the transport and the loop: a 429 with ``Retry-After`` and
    a 500 are retried, a stream cut in the middle of a tool call keeps the text, runs no
    tool and says the answer was cut; the next input is answered."""
    from test_provider_agent_runs import APIS, FIRST_TEXT, KEY, manifest_for
    from test_provider_agent_runs import KEY_ENV as RUNS_KEY_ENV

    api = next(a for a in APIS if a.name == api_name)
    monkeypatch.setenv(RUNS_KEY_ENV, KEY)
    whole = api.streamed(FIRST_TEXT, True)
    assert whole.events is not None
    count, delivered = CUT_AFTER[api_name]
    cut = Reply(events=list(whole.events[:count]), cut=True)
    with FakeLLMServer() as server:
        server.script(
            None,
            Reply(429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "0"}),
            Reply(500, json={"error": {"message": "boom"}}),
            cut,
            api.streamed(FINAL_TEXT, False),
        )
        agent = Agent.from_manifest(manifest_for(api, server.url + "/v1", stream=True))
        ran: list[Event] = []
        with anyio.fail_after(HANG):
            async with agent:
                agent.bus.subscribe("EXEC:TOOL_CALL", ran.append)
                first = await agent.ask("Query weather in Taipei")
                second = await agent.ask("And now?")
                await agent.bus.wait_idle()
        paths = server.paths()
    assert first.error is None, first.error
    assert len(first.replies) == 1
    assert first.replies[0].startswith(delivered)
    assert "cut" in first.replies[0][len(delivered) :]
    assert ran == []
    assert second.error is None, second.error
    assert second.replies == [FINAL_TEXT]
    assert len(paths) == 4
    assert len(set(paths)) == 1
