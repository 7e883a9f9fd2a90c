"""openstarry's MCP server against the official MCP SDK's client (spec 004, issue 5).

In process (the SDK's ``Client`` on a ``Server`` object, and over Streamable
HTTP through an ASGI transport) the tests also watch the agent's bus; as
separate processes they drive ``openstarry mcp`` over stdio and over HTTP on
127.0.0.1.
"""

from __future__ import annotations

import inspect
import json
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import RequestParamsMeta
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS

import openstarry.mcp
from mcp_fixtures import helpers
from mcp_fixtures.tools import Echo, gate
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import ToolOutcome
from openstarry.agent.runtime import Agent
from openstarry.assembly import agent_from_manifest
from openstarry.core import Event
from openstarry.mcp import (
    DEPTH_HEADER,
    MAX_DEPTH,
    META_DEPTH,
    META_TRACE,
    RECURSION_LIMIT_EXCEEDED,
    SERVER_BUSY,
    TRACE_HEADER,
    AgentMcpServer,
)
from openstarry.protocol import KernelError, parse_payload
from openstarry.testing import ScriptedProvider
from openstarry.tools.weather import get_weather

pytestmark = pytest.mark.anyio

#: A bound on any one exchange, so a broken server fails a test instead of hanging it.
HANG = 10
MODES = ["legacy", "auto"]  # the initialize handshake, and 2026-07-28 discovery


class Served:
    """A running agent, its MCP server, and every event its bus dispatched."""

    def __init__(self, agent: Agent, server: AgentMcpServer) -> None:
        self.agent = agent
        self.mcp = server
        self.events: list[Event] = []
        agent.bus.subscribe("*", self.events.append)

    async def settled(self) -> None:
        with anyio.fail_after(HANG):
            await self.agent.bus.wait_idle()

    def of(self, event_type: str, trace_id: str | None = None) -> list[Event]:
        return [
            e
            for e in self.events
            if e.type == event_type and (trace_id is None or e.trace_id == trace_id)
        ]


@asynccontextmanager
async def serving(
    tmp_path: Path, mcp: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[Served]:
    async with agent_from_manifest(helpers.write_manifest(tmp_path, mcp)) as agent:
        yield Served(agent, AgentMcpServer(agent, **options))


def trace_meta(trace_id: Any, depth: Any) -> RequestParamsMeta:
    """A request's ``_meta`` carrying a trace (of any value, to test malformed ones)."""
    return cast(RequestParamsMeta, {META_TRACE: trace_id, META_DEPTH: depth})


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


# --- in process: handshake and listing -----------------------------------------------------


async def test_initialize_answers_the_manifest_identity_and_the_tools_capability(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server, mode="legacy") as client:
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == ("mcp-test", "2.5.0")
        assert client.server_capabilities.tools is not None
        # Spec 004 section 2.1: tools and resources, both with listChanged.
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.list_changed is True


@pytest.mark.parametrize("mode", MODES)
async def test_list_shows_exactly_the_exposed_tools_with_their_schemas(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server, mode=mode) as client:
        listed = (await client.list_tools()).tools
        assert [tool.name for tool in listed] == helpers.EXPOSED_NAMES
        for tool in listed:
            described = served.agent.tools[tool.name].describe()
            assert tool.input_schema == described["parameters"]
            assert tool.input_schema["type"] == "object"
            assert tool.description == described["description"]
        weather = listed[0]
        assert weather.input_schema["required"] == ["location"]


async def test_private_wins_over_exposed_and_no_mcp_key_exposes_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path, {}) as served, Client(served.mcp.server) as client:
        assert (await client.list_tools()).tools == []
        with pytest.raises(MCPError) as caught:
            await client.call_tool("get_weather", {"location": "Taipei"})
        assert caught.value.code == types.INVALID_PARAMS
    async with serving(tmp_path) as served:
        both = AgentMcpServer(
            served.agent, expose=["get_weather", "fs.write"], private=["fs.write"]
        )
        async with Client(both.server) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["get_weather"]


async def test_an_agent_built_in_python_exposes_what_it_is_told(tmp_path: Path) -> None:
    from openstarry.testing import ScriptedProvider
    from openstarry.tools.weather import get_weather

    agent = Agent(ScriptedProvider([]), [get_weather], name="py-agent")
    async with agent:
        assert AgentMcpServer(agent).exposed_tools() == []  # no manifest: nothing
        # A name the agent lacks (a remote server.tool not connected) is not listed.
        server = AgentMcpServer(agent, expose=["get_weather", "ghost.tool"])
        async with Client(server.server, mode="legacy") as client:
            assert client.server_info is not None
            assert client.server_info.name == "py-agent"
            assert [t.name for t in (await client.list_tools()).tools] == ["get_weather"]
            with pytest.raises(MCPError) as caught:
                await client.call_tool("ghost.tool", {})
            assert caught.value.message == "Unknown tool: ghost.tool"
            result = await client.call_tool("get_weather", {"location": "Taipei"})
            assert "25°C, Sunny" in text_of(result)


# --- in process: calls ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_runs_the_tool_through_the_bus(tmp_path: Path, mode: str) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server, mode=mode) as client:
        with anyio.fail_after(HANG):
            result = await client.call_tool("get_weather", {"location": "Taipei"})
        assert result.is_error is False
        assert "25°C, Sunny" in text_of(result)
        assert result.structured_content is not None
        assert result.structured_content["summary"] == "25°C, Sunny"
        assert json.loads(text_of(result)) == result.structured_content
        await served.settled()
        [call] = served.of("EXEC:TOOL_CALL")
        [done] = served.of("EXEC:TOOL_RESULT")
        assert call.payload["name"] == "get_weather"
        assert call.payload["args"] == {"location": "Taipei"}
        assert call.payload["callDepth"] == 1
        assert call.source.startswith("mcp:")
        assert done.parent_id == call.id
        assert done.trace_id == call.trace_id
        assert done.payload["success"] is True


async def test_a_string_result_is_the_text_itself(tmp_path: Path) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server) as client:
        result = await client.call_tool("fs.read", {"path": "notes.txt"})
        assert result.is_error is False
        assert text_of(result) == "hello from the notes\n"
        assert result.structured_content is None


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("fs.write", {"path": "x.txt", "content": "nope"}),  # private
        ("fs.list", {"path": "."}),  # the agent's, not exposed
        ("no_such_tool", {}),  # unknown
    ],
)
async def test_private_unexposed_and_unknown_tools_are_refused_and_run_nothing(
    tmp_path: Path, name: str, args: dict[str, Any]
) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool(name, args)
        assert caught.value.code == types.INVALID_PARAMS
        # One answer for all three: a client cannot probe for private tools.
        assert caught.value.message == f"Unknown tool: {name}"
        await served.settled()
        assert served.of("EXEC:TOOL_CALL") == []
        assert not (tmp_path / "x.txt").exists()
        assert served.mcp.calls_refused == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_failing_tool_answers_is_error_with_its_message(tmp_path: Path, mode: str) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server, mode=mode) as client:
        result = await client.call_tool("explode", {"reason": "on purpose"})
        assert result.is_error is True
        assert text_of(result) == "exploded: on purpose"
        assert result.meta is not None
        assert result.meta["openstarry/error"] == {
            "code": "EBOOM",
            "message": "exploded: on purpose",
            "source": "tool",
        }
        await served.settled()
        [done] = served.of("EXEC:TOOL_RESULT")
        assert done.payload["success"] is False
        assert done.payload["error"]["code"] == "EBOOM"


async def test_arguments_the_schema_refuses_answer_is_error(tmp_path: Path) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server) as client:
        result = await client.call_tool("get_weather", {"location": "Taipei", "unit": "kelvin"})
        assert result.is_error is True
        assert "unit" in text_of(result)
        assert result.meta is not None
        assert result.meta["openstarry/error"]["code"] == "INVALID_ARGUMENTS"
        missing = await client.call_tool("get_weather", {})
        assert missing.is_error is True
        assert "location" in text_of(missing)


# --- in process: the recursion guard -------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_the_trace_reaches_the_tool_with_its_depth(tmp_path: Path, mode: str) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server, mode=mode) as client:
        result = await client.call_tool("whoami", {}, meta=trace_meta("trace-a", MAX_DEPTH))
        assert result.structured_content == {"traceId": "trace-a", "callDepth": MAX_DEPTH}
        fresh = await client.call_tool("whoami", {})
        assert fresh.structured_content is not None
        assert fresh.structured_content["callDepth"] == 1
        assert fresh.structured_content["traceId"] not in ("", "trace-a")
        await served.settled()
        [call] = served.of("EXEC:TOOL_CALL", "trace-a")
        assert call.payload["callDepth"] == MAX_DEPTH


@pytest.mark.parametrize("mode", MODES)
async def test_depth_6_is_refused_with_a_kernel_error_and_the_server_goes_on(
    tmp_path: Path, mode: str
) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server, mode=mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("whoami", {}, meta=trace_meta("loop-1", MAX_DEPTH + 1))
        assert caught.value.code == RECURSION_LIMIT_EXCEEDED
        assert "depth 6" in caught.value.message
        assert "loop-1" in caught.value.message
        assert caught.value.data == {"traceId": "loop-1", "depth": 6, "maxDepth": MAX_DEPTH}
        await served.settled()
        assert served.of("EXEC:TOOL_CALL", "loop-1") == []  # ran nothing
        [error] = served.of("KERNEL:ERROR")
        assert error.trace_id == "loop-1"
        payload = parse_payload(error.type, error.payload)
        assert isinstance(payload, KernelError)
        assert payload.code == "RECURSION_LIMIT"
        assert "whoami" in payload.message
        assert payload.details["depth"] == 6
        # The same client, a fresh call: served.
        fresh = await client.call_tool("get_weather", {"location": "Taipei"})
        assert "25°C, Sunny" in text_of(fresh)


@pytest.mark.parametrize(
    "meta",
    [
        trace_meta("t", "deep"),
        trace_meta("t", 0),
        trace_meta("t", True),
        trace_meta("", 2),
        trace_meta(7, 2),
        trace_meta("x" * 129, 2),
        cast(RequestParamsMeta, {META_DEPTH: 2}),
    ],
)
async def test_a_malformed_trace_is_refused(tmp_path: Path, meta: RequestParamsMeta) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("whoami", {}, meta=meta)
        assert caught.value.code == types.INVALID_PARAMS
        assert "trace" in caught.value.message
        await served.settled()
        assert served.of("EXEC:TOOL_CALL") == []


# --- in process over Streamable HTTP: the trace in headers -----------------------------------


@asynccontextmanager
async def http_client(
    served: Served, headers: dict[str, str], mode: str = "auto"
) -> AsyncIterator[Client]:
    """The SDK's client over Streamable HTTP to the server's ASGI app, in this process."""
    app = served.mcp.http_app(json_response=True)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://127.0.0.1:8765",
            headers=headers,
        ) as http,
        Client(
            streamable_http_client("http://127.0.0.1:8765/mcp", http_client=http), mode=mode
        ) as client,
    ):
        yield client


async def test_the_trace_headers_set_the_depth_over_http(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        async with http_client(served, {TRACE_HEADER: "hdr-1", DEPTH_HEADER: "3"}) as client:
            result = await client.call_tool("whoami", {})
            assert result.structured_content == {"traceId": "hdr-1", "callDepth": 3}
        async with http_client(served, {TRACE_HEADER: "hdr-2", DEPTH_HEADER: "6"}) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("whoami", {})
            assert caught.value.code == RECURSION_LIMIT_EXCEEDED
            # _meta cannot lower the depth the headers carry: the deeper wins.
            with pytest.raises(MCPError):
                await client.call_tool("whoami", {}, meta=trace_meta("hdr-2", 1))
        await served.settled()
        errors = served.of("KERNEL:ERROR", "hdr-2")
        assert [e.payload["code"] for e in errors] == ["RECURSION_LIMIT"] * 2
        assert served.of("EXEC:TOOL_CALL", "hdr-2") == []
        [call] = served.of("EXEC:TOOL_CALL", "hdr-1")
        assert call.session_id == "mcp"  # the 2026-07-28 era has no HTTP session


async def test_a_handshake_era_http_session_names_the_calls_session(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        async with http_client(served, {TRACE_HEADER: "hdr-3"}, mode="legacy") as client:
            result = await client.call_tool("whoami", {})
            assert result.structured_content == {"traceId": "hdr-3", "callDepth": 1}
        await served.settled()
        [call] = served.of("EXEC:TOOL_CALL", "hdr-3")
        assert call.session_id.startswith("mcp:")
        assert len(call.session_id) > len("mcp:")


# --- in process: concurrency and limits ----------------------------------------------------


async def test_calls_run_concurrently_and_a_tripped_guard_blocks_nobody(tmp_path: Path) -> None:
    async with serving(tmp_path) as served, Client(served.mcp.server) as client:
        gate.reset()
        assert gate.entered is not None
        assert gate.opened is not None
        answers: list[str] = []

        async def held() -> None:
            answers.append(text_of(await client.call_tool("gate", {})))

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(held)
                await gate.entered.wait()
                # While the gate holds a call: a refused cycle, then ordinary calls.
                with pytest.raises(MCPError):
                    await client.call_tool("whoami", {}, meta=trace_meta("cycle", 6))
                other = await client.call_tool("whoami", {}, meta=trace_meta("other", 2))
                assert other.structured_content == {"traceId": "other", "callDepth": 2}
                weather = await client.call_tool("get_weather", {"location": "Paris"})
                assert weather.is_error is False
                assert answers == []  # the gate still holds its call
                gate.opened.set()
        assert answers == ["opened"]


async def test_calls_beyond_max_calls_are_refused_as_busy(tmp_path: Path) -> None:
    async with serving(tmp_path, max_calls=1) as served, Client(served.mcp.server) as client:
        gate.reset()
        assert gate.entered is not None
        assert gate.opened is not None
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(client.call_tool, "gate", {})
                await gate.entered.wait()
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("get_weather", {"location": "Paris"})
                assert caught.value.code == SERVER_BUSY
                gate.opened.set()
            result = await client.call_tool("get_weather", {"location": "Paris"})
        assert result.is_error is False
        assert served.mcp.calls_running == 0


def test_max_calls_must_be_positive(tmp_path: Path) -> None:
    agent = agent_from_manifest(helpers.write_manifest(tmp_path))
    with pytest.raises(ValueError, match="max_calls"):
        AgentMcpServer(agent, max_calls=0)


# --- separate processes: `openstarry mcp` over stdio and over HTTP ---------------------------


async def exercise(client: Client) -> None:
    """Everything the issue asks of a server, through one connected client."""
    with anyio.fail_after(HANG):
        assert client.server_capabilities.tools is not None
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names == helpers.EXPOSED_NAMES
        weather = await client.call_tool("get_weather", {"location": "Taipei"})
        assert "25°C, Sunny" in text_of(weather)
        for refused in ("fs.write", "fs.list", "nope"):
            with pytest.raises(MCPError) as caught:
                await client.call_tool(refused, {"path": "notes.txt", "content": "x"})
            assert caught.value.code == types.INVALID_PARAMS
        failed = await client.call_tool("explode", {})
        assert failed.is_error is True
        assert text_of(failed) == "exploded: boom"
        with pytest.raises(MCPError) as tripped:
            await client.call_tool("whoami", {}, meta=trace_meta("cycle", 6))
        assert tripped.value.code == RECURSION_LIMIT_EXCEEDED
        again = await client.call_tool("get_weather", {"location": "Taipei"})
        assert "25°C, Sunny" in text_of(again)


@pytest.mark.parametrize("mode", MODES)
async def test_openstarry_mcp_over_stdio(tmp_path: Path, mode: str) -> None:
    manifest = helpers.write_manifest(tmp_path)
    command = helpers.server_command(manifest)
    errlog = tmp_path / "stderr.txt"
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=helpers.environment()
    )
    with errlog.open("w", encoding="utf-8") as stderr:
        async with Client(stdio_client(parameters, errlog=stderr), mode=mode) as client:
            if mode == "legacy":
                assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            assert client.server_info is not None
            assert (client.server_info.name, client.server_info.version) == ("mcp-test", "2.5.0")
            await exercise(client)
    # The server's logs went to stderr (stdout carries the protocol alone).
    assert "refused tools/call of 'whoami'" in errlog.read_text(encoding="utf-8")


@pytest.mark.parametrize("mode", MODES)
async def test_openstarry_mcp_over_http(tmp_path: Path, mode: str, anyio_backend: str) -> None:
    if anyio_backend == "trio" and mode == "legacy":
        pytest.skip(
            "the SDK's HTTP client (httpx2) leaves the SSE response streams of the handshake "
            "era unclosed on trio, a ResourceWarning that filterwarnings=error fails; the "
            "server is another process, so the client's backend does not matter to it"
        )
    manifest = helpers.write_manifest(tmp_path)
    exits: list[int] = []
    with helpers.http_server(manifest, exits) as (url, stderr):
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/mcp")
        async with Client(url, mode=mode) as client:
            assert client.server_info is not None
            assert (client.server_info.name, client.server_info.version) == ("mcp-test", "2.5.0")
            await exercise(client)
        headers = {TRACE_HEADER: "hdr", DEPTH_HEADER: "6"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode) as deep,
        ):
            with pytest.raises(MCPError) as caught:
                await deep.call_tool("get_weather", {"location": "Taipei"})
            assert caught.value.code == RECURSION_LIMIT_EXCEEDED
    # SIGTERM: a graceful shutdown (the agent stops), then the signal ends the process.
    assert exits == [-signal.SIGTERM]
    assert "Traceback" not in stderr.join()


def test_an_address_in_use_exits_1_saying_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            helpers.server_command(helpers.write_manifest(tmp_path), "--http", "--port", str(port)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=helpers.environment(),
            timeout=helpers.WAIT,
            check=False,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert done.stdout == ""


def test_a_bad_manifest_exits_2_naming_the_file(tmp_path: Path) -> None:
    manifest = tmp_path / "agent.json"
    manifest.write_text('{"identity": {"name": "x"}, "tools": ["nope"]}', encoding="utf-8")
    done = subprocess.run(
        helpers.server_command(manifest),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=helpers.environment(),
        timeout=helpers.WAIT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert str(manifest) in done.stderr


def test_a_result_json_cannot_carry_is_an_error() -> None:
    from openstarry.mcp.calls import result_of as _result_of

    result = _result_of(ToolOutcome("id", "odd", True, result={"x": float("nan")}))
    assert result.is_error is True
    assert text_of(result).startswith("the tool's result is not JSON")
    assert result.meta is not None
    assert result.meta["openstarry/error"]["code"] == "INVALID_RESULT"
    plain = _result_of(ToolOutcome("id", "list", True, result=[1, "two"]))
    assert text_of(plain) == '[1, "two"]'
    assert plain.structured_content is None  # an object only


async def test_a_call_to_an_agent_that_is_not_running_is_an_error(tmp_path: Path) -> None:
    agent = agent_from_manifest(helpers.write_manifest(tmp_path))  # never started
    async with Client(AgentMcpServer(agent).server) as client:
        assert [t.name for t in (await client.list_tools()).tools] == helpers.EXPOSED_NAMES
        with pytest.raises(MCPError) as caught:
            await client.call_tool("get_weather", {"location": "Taipei"})
        assert caught.value.code == types.INTERNAL_ERROR
        assert "cannot run 'get_weather'" in caught.value.message


WITHOUT_SDK = """
import sys
sys.modules["mcp"] = None  # as if the [mcp] extra were not installed
import openstarry.mcp as package
from openstarry.mcp import MAX_DEPTH, TRACE_HEADER, next_hop  # the guard needs no SDK
assert MAX_DEPTH == 5 and next_hop("t", 1).depth == 2
for attempt in (
    lambda: package.create_server,
    lambda: __import__("openstarry.mcp.server"),
    lambda: exec("from openstarry.mcp import serve"),
    lambda: package.McpToolset,
):
    try:
        attempt()
    except ImportError as exc:
        print(exc)
    else:
        raise SystemExit("no ImportError")
"""


def test_without_the_sdk_the_server_names_the_extra_and_the_guard_still_imports() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_SDK],
        capture_output=True,
        text=True,
        timeout=helpers.WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert "pip install 'openstarry[mcp]'" in line


@pytest.mark.parametrize("name", openstarry.mcp.__all__)
def test_every_public_name_imports_and_is_documented(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from openstarry.mcp import {name}", namespace)
    obj = namespace[name]
    assert obj is getattr(openstarry.mcp, name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert inspect.getdoc(obj), f"{name} has no docstring"
    assert name in dir(openstarry.mcp)


class Counter(Tool):
    """An async tool that counts the calls it started and the ones it finished."""

    name = "counter"
    description = "Counts its calls; sleeps ``seconds`` first."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"seconds": {"type": "number"}}}
        self.started = 0
        self.finished = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started += 1
        await anyio.sleep(float(args.get("seconds", 0)))
        self.finished += 1
        return {"value": args.get("value"), "calls": self.started}


class ToolsServed:
    """A running agent with ``echo`` and ``counter``, both exposed, and every event of its bus."""

    def __init__(self, agent: Agent, echo: Echo, counter: Counter) -> None:
        self.agent = agent
        self.echo = echo
        self.counter = counter
        self.mcp = AgentMcpServer(agent, expose=["echo", "counter"])
        self.events: list[Event] = []
        agent.bus.subscribe("*", self.events.append)

    def of(self, event_type: str) -> list[Event]:
        return [e for e in self.events if e.type == event_type]


@asynccontextmanager
async def serving_tools() -> AsyncIterator[ToolsServed]:
    echo, counter = Echo(), Counter()
    async with Agent(ScriptedProvider([]), [echo, counter], name="hardening") as agent:
        yield ToolsServed(agent, echo, counter)


def meta(trace_id: Any, depth: Any) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {META_TRACE: trace_id, META_DEPTH: depth})


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.anyio
async def test_arguments_nested_too_deep_for_an_event_are_a_tool_error_not_an_internal_error() -> (
    None
):
    """Defect: arguments nested deeper than an event carries (64 levels) made
    ``tools/call`` fail with ``-32603 Internal server error`` and a traceback in
    the log; they are bad arguments, answered ``isError`` with INVALID_ARGUMENTS."""
    async with serving_tools() as served, Client(served.mcp.server) as client:
        with anyio.fail_after(HANG):
            result = await client.call_tool("echo", {"value": nested(70)})
            assert result.is_error is True
            [block] = result.content
            assert isinstance(block, types.TextContent)
            assert "nest" in block.text
            assert result.meta is not None
            assert result.meta["openstarry/error"]["code"] == "INVALID_ARGUMENTS"
            assert served.echo.runs == 0
            # The server goes on.
            fine = await client.call_tool("echo", {"value": nested(10)})
        assert fine.is_error is False
        assert served.echo.runs == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "depth", [10**5000, 2**63, "9" * 5000], ids=["5000-digit-int", "2**63", "5000-digit-string"]
)
async def test_an_absurd_depth_is_a_malformed_trace_not_an_internal_error(depth: Any) -> None:
    """Defect: a ``_meta`` depth of thousands of digits made formatting the
    refusal raise (Python's int-to-str digit limit): ``-32603`` and a traceback.
    Now any depth beyond a sane bound is a malformed trace (``-32602``), and the
    message does not echo the whole value."""
    async with serving_tools() as served, Client(served.mcp.server) as client:
        with anyio.fail_after(HANG), pytest.raises(MCPError) as caught:
            await client.call_tool("echo", {"value": 1}, meta=meta("t-1", depth))
        assert caught.value.code == types.INVALID_PARAMS
        assert "depth" in caught.value.message
        assert len(caught.value.message) < 300
        assert served.echo.runs == 0


@pytest.mark.anyio
async def test_a_malformed_depth_is_not_echoed_whole() -> None:
    """Defect: a malformed depth was repeated in full in the error (100 kB of
    ``x`` came back, and went into the server's log)."""
    async with serving_tools() as served, Client(served.mcp.server) as client:
        with anyio.fail_after(HANG), pytest.raises(MCPError) as caught:
            await client.call_tool("echo", {}, meta=meta("t-2", "x" * 100_000))
        assert caught.value.code == types.INVALID_PARAMS
        assert len(caught.value.message) < 300
        assert served.echo.runs == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    "trace_id",
    ["a\nrefused tools/call of 'x'", "tab\there", "nul\x00", "\x1b[2J"],
    ids=["newline", "tab", "nul", "escape"],
)
async def test_a_trace_id_with_control_characters_is_refused(
    trace_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect: a ``_meta`` trace id could carry newlines and other control
    characters (HTTP headers cannot), which went as they were into the server's
    log lines (forging entries) and every event of the call."""
    async with serving_tools() as served, Client(served.mcp.server) as client:
        with (
            caplog.at_level(logging.INFO, logger="openstarry.mcp"),
            anyio.fail_after(HANG),
            pytest.raises(MCPError) as caught,
        ):
            await client.call_tool("echo", {"value": 1}, meta=meta(trace_id, 2))
        assert caught.value.code == types.INVALID_PARAMS
        assert "trace" in caught.value.message
        assert served.echo.runs == 0
        assert not any(trace_id in record.getMessage() for record in caplog.records)
        with anyio.fail_after(HANG):
            fine = await client.call_tool("echo", {"value": 1}, meta=meta("plain-trace.1", 2))
        assert fine.is_error is False


@pytest.mark.anyio
async def test_a_call_cancelled_before_it_started_runs_nothing() -> None:
    """Defect (in ``ExecutionLoop.call_tool``, fixed there by the loop's owner):
    a caller cancelled while its ``EXEC:TOOL_CALL`` waited for dispatch (the
    ``tools/call`` of a client that went away at once) left the call to run
    anyway: its cancel scope did not exist yet, so nothing stopped it. On trio
    the tool ran to its end for nobody, outside the server's ``max_calls``."""
    async with serving_tools() as served:
        with anyio.fail_after(HANG):
            with anyio.move_on_after(0):
                await served.agent.loop.call_tool("counter", {"seconds": 0.2})
            # Settled when its result is published: at once when the call is stopped, only
            # after the tool's 0.2 s when it runs on (no fixed sleep to outlast it).
            while not served.of("EXEC:TOOL_RESULT"):
                await anyio.sleep(0.01)
            await served.agent.bus.wait_idle()
        assert served.counter.finished == 0
        [result] = served.of("EXEC:TOOL_RESULT")
        assert result.payload["success"] is False
        assert result.payload["error"]["code"] == "CANCELLED"
        assert served.agent.loop.external_calls == 0


def test_an_unflushed_print_of_a_tool_never_reaches_the_mcp_wire(tmp_path: Path) -> None:
    manifest = helpers.write_manifest(
        tmp_path,
        {"expose_tools": ["mcp_fixtures.tools:mumble"]},
        tools=["mcp_fixtures.tools:mumble"],
    )
    with helpers.stdio_server(manifest) as (process, out, err):
        assert process.stdin is not None
        replies: list[dict[str, Any]] = []
        for message in (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "ux", "version": "1"},
                },
            },
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "mumble", "arguments": {"text": "psst"}},
            },
        ):
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()
            if "id" in message:
                reply = json.loads(out.next() or "null")
                assert reply["id"] == message["id"]
                assert "error" not in reply, reply
                replies.append(reply)
        process.stdin.close()
        assert process.wait(timeout=helpers.WAIT) == 0
        # Every line on stdout is protocol; the print went to stderr.
        assert out.next() is None
        assert "buffered chatter: psst" in err.join()
    # The call ran and its reply, the tool's own result, is intact.
    result = replies[1]["result"]
    assert result["isError"] is False, result
    assert result["content"] == [{"type": "text", "text": "psst"}]


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


class RunCounter(Tool):
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

    counter = RunCounter()
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
                assert not await agent.bus.apublish(call)  # the same event, again
                await agent.bus.wait_idle()
                again = await client.call_tool("count", {})  # a new call runs
                await agent.bus.wait_idle()
    assert counter.runs == 2
    assert again.structured_content == {"runs": 2}
    assert len(results) == 2
    assert all(r.payload["success"] for r in results)
