"""openstarry's MCP client against a server written with the official SDK's server API.

The server is ``mcp_fixtures/sdk_server.py``, run as a subprocess over stdio
(the client starts it) and over Streamable HTTP on a free 127.0.0.1 port.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")


import pytest

from mcp_fixtures.tools import Echo
from openstarry import Agent, cli
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.loop import LoopLimits
from openstarry.agent.memory import Memory, Session, ToolOutcome
from openstarry.agent.tools import tool
from openstarry.assembly import agent_from_manifest, mcp_toolset
from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.errors import ManifestError, ToolError
from openstarry.manifest import McpServerConfig, load_manifest
from openstarry.mcp import connection as mcp_connection
from openstarry.mcp import proxies as mcp_proxies
from openstarry.mcp.client import McpConnectError, McpToolset, RemoteTool
from openstarry.mcp.guard import (
    DEPTH_HEADER,
    META_DEPTH,
    META_TRACE,
    META_TRACEPARENT,
    TRACE_HEADER,
    TraceContext,
    traceparent_of,
)
from openstarry.testing import FunctionProvider, ScriptedProvider, text, tool_call
from openstarry.tools.weather import get_weather
from openstarry.tracecontext import event_span_id, traceparent

FIXTURES = Path(__file__).resolve().parent / "mcp_fixtures"
SERVER = FIXTURES / "sdk_server.py"
#: A bound on any one wait, so a broken client fails a test instead of hanging it.
HANG = 20.0


def with_servers(
    provider: Any,
    tools: Any = (),
    *,
    servers: list[McpServerConfig],
    limits: LoopLimits | None = None,
    **options: Any,
) -> Agent:
    """An agent with the remote MCP servers ``servers`` as its toolset, as agent.json builds it."""
    timeout = (limits or LoopLimits()).tool_timeout
    toolset = mcp_toolset(servers, tool_timeout=timeout)
    return Agent(provider, tools, limits=limits, toolsets=[toolset], **options)


def remote(agent: Agent) -> McpToolset | None:
    """The agent's MCP toolset while it is connected (the agent runs), else ``None``."""
    toolset = agent.toolsets[0]
    assert isinstance(toolset, McpToolset)
    return toolset if toolset.running else None


FIXTURE_TOOLS = ["echo", "add", "trace", "fail", "refuse", "hang", "die", "big", "pid"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def http_server(port: int | None = None) -> Iterator[str]:
    """The SDK fixture server over Streamable HTTP; yields its URL once it accepts connections."""
    port = port or free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + HANG
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the fixture server exited with {process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        # Killed, not stopped: told to stop, the SDK's server waits for the open
        # responses, a client's subscriptions/listen stream among them, which the
        # client renews (mcp.client._listen_changes) only while its event loop
        # runs, and this synchronous wait holds that loop.
        process.kill()
        try:
            process.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with http_server() as url:
        yield url


def stdio_config(**options: Any) -> McpServerConfig:
    return McpServerConfig(name="fx", command=[sys.executable, str(SERVER), "stdio"], **options)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def config_for(kind: str, url: str, **options: Any) -> McpServerConfig:
    if kind == "stdio":
        return stdio_config(**options)
    return McpServerConfig(name="fx", url=url, **options)


def results(agent: Agent) -> list[dict[str, Any]]:
    """Record the agent's EXEC:TOOL_RESULT payloads, in order."""
    seen: list[dict[str, Any]] = []

    def record(event: Event) -> None:
        seen.append(event.payload)

    agent.bus.subscribe("EXEC:TOOL_RESULT", record)
    return seen


async def ask(agent: Agent, line: str) -> Any:
    with anyio.fail_after(HANG):
        result = await agent.ask(line)
        await agent.bus.wait_idle()
    return result


def context(trace_id: str = "trace-1", call_depth: int = 0) -> AgentContext:
    return AgentContext({}, Session("s", Memory(None)), trace_id=trace_id, call_depth=call_depth)


# -- tools ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_tools_filter_keeps_only_the_named_tools(http_url: str) -> None:
    agent = with_servers(
        ScriptedProvider([]), servers=[config_for("http", http_url, tools=["echo"])]
    )
    with anyio.fail_after(HANG):
        async with agent:
            assert [name for name in agent.tools if name.startswith("fx.")] == ["fx.echo"]
            assert agent.tools["fx.echo"].describe()["parameters"]["required"] == ["text"]


@pytest.mark.anyio
async def test_remote_tools_join_the_agent_and_a_run_gets_their_results(
    transport: str, http_url: str
) -> None:
    def answer(prompt: str, ctx: AgentContext) -> Any:
        outcome = ctx.memory.current_turn()[-1]
        assert isinstance(outcome, ToolOutcome)
        return text(f"The sum is {outcome.result['sum']}.")

    provider = ScriptedProvider(
        [
            tool_call("fx.add", {"a": 2, "b": 3}, text="Adding."),
            answer,
            tool_call("fx.echo", {"text": "hello"}),
            text("echoed"),
        ]
    )
    agent = with_servers(provider, servers=[config_for(transport, http_url)])
    async with agent:
        # The server's tools are the agent's, named <server>.<tool>, with their schemas.
        assert {name for name in agent.tools if name.startswith("fx.")} == {
            f"fx.{name}" for name in FIXTURE_TOOLS
        }
        add = agent.tools["fx.add"]
        assert isinstance(add, RemoteTool)
        assert (add.server, add.remote_name) == ("fx", "add")
        assert add.describe()["description"] == "Add two integers."
        schema = add.describe()["parameters"]
        assert schema["type"] == "object"
        assert schema["required"] == ["a", "b"]
        assert schema["properties"]["a"]["type"] == "integer"
        toolset = remote(agent)
        assert toolset is not None
        assert toolset.connections["fx"].connected

        seen = results(agent)
        result = await ask(agent, "add 2 and 3")
        assert result.error is None
        assert result.replies == ["Adding.", "The sum is 5."]
        assert seen[0]["name"] == "fx.add"
        assert seen[0]["success"] is True
        assert seen[0]["result"] == {"sum": 5}
        outcome = provider.calls[1].memory[-1]
        assert isinstance(outcome, ToolOutcome)
        assert outcome.result == {"sum": 5}
        await ask(agent, "echo")
        # A string result comes back as the string, not the SDK's {"result": ...} wrapper.
        assert seen[1]["result"] == "hello"
    # Stopped: the remote tools are gone and the connection is closed.
    assert remote(agent) is None
    assert not any(name.startswith("fx.") for name in agent.tools)


@pytest.mark.anyio
async def test_an_agent_with_remote_servers_can_be_entered_again(
    transport: str, http_url: str
) -> None:
    provider = ScriptedProvider(
        [
            tool_call("fx.echo", {"text": "first"}),
            text("one"),
            tool_call("fx.echo", {"text": "second"}),
            text("two"),
        ]
    )
    agent = with_servers(provider, servers=[config_for(transport, http_url)])
    seen = results(agent)
    for reply in ("one", "two"):
        async with agent:
            toolset = remote(agent)
            assert toolset is not None
            assert "fx.echo" in agent.tools
            result = await ask(agent, "echo")
            assert result.error is None
            assert result.replies == [reply]
        assert remote(agent) is None
        assert "fx.echo" not in agent.tools
    assert [r["success"] for r in seen] == [True, True]
    assert toolset is not None
    assert toolset.connections["fx"].connects == 2


@pytest.mark.anyio
async def test_remote_errors_are_fed_back_as_failed_tool_results(
    transport: str, http_url: str
) -> None:
    provider = ScriptedProvider(
        [
            tool_call("fx.fail", {"message": "the disk is on fire"}),
            text("noted"),
            tool_call("fx.refuse", {}),
            text("noted"),
            tool_call("fx.echo", {"text": 42}),
            text("noted"),
        ]
    )
    agent = with_servers(provider, servers=[config_for(transport, http_url)])
    async with agent:
        seen = results(agent)
        first = await ask(agent, "fail")
        assert first.error is None
        assert first.replies == ["noted"]
        failed = seen[0]
        assert failed["success"] is False
        assert failed["error"]["code"] == "REMOTE_ERROR"
        assert "the disk is on fire" in failed["error"]["message"]
        assert failed["error"]["message"].startswith("fx.fail: ")
        # The provider saw the failure in memory before it answered.
        outcome = provider.calls[1].memory[-1]
        assert isinstance(outcome, ToolOutcome)
        assert not outcome.success
        assert outcome.error is not None
        assert "the disk is on fire" in outcome.error.message

        await ask(agent, "refuse")
        refused = seen[1]["error"]
        assert refused["code"] == "RECURSION_LIMIT"
        assert "exceeds the limit of 5" in refused["message"]

        # Arguments the remote schema rejects: the server's own validation error.
        await ask(agent, "bad arguments")
        assert seen[2]["success"] is False
        assert seen[2]["error"]["code"] == "REMOTE_ERROR"
        assert "text" in seen[2]["error"]["message"]


# -- the trace -----------------------------------------------------------------


@pytest.mark.anyio
async def test_each_call_carries_the_runs_trace(transport: str, http_url: str) -> None:
    provider = ScriptedProvider([tool_call("fx.trace", {}), text("traced")])
    agent = with_servers(provider, servers=[config_for(transport, http_url)])
    async with agent:
        seen = results(agent)
        calls: list[Event] = []
        agent.bus.subscribe("EXEC:TOOL_CALL", calls.append)
        result = await ask(agent, "trace")
        received = seen[0]["result"]
        # A user's input runs at depth 0: its calls are the first hop, whose parent
        # span is the span of the call's EXEC:TOOL_CALL (openstarry.mcp.call).
        [call] = calls
        parent = traceparent(result.trace_id, event_span_id(call.id))
        assert received["meta"] == {
            META_TRACE: result.trace_id,
            META_DEPTH: 1,
            META_TRACEPARENT: parent,
        }
        if transport == "http":
            assert received["headers"] == {
                TRACE_HEADER.lower(): result.trace_id,
                DEPTH_HEADER.lower(): "1",
                "traceparent": parent,
            }
        else:
            assert received["headers"] == {}

        # A tool serving a call at depth 3 calls one hop deeper, in the same trace.
        tool = agent.tools["fx.trace"]
        with anyio.fail_after(HANG):
            deeper = await tool.run({}, context("trace-of-a-caller", call_depth=3))
        assert deeper["meta"] == {
            META_TRACE: "trace-of-a-caller",
            META_DEPTH: 4,
            META_TRACEPARENT: traceparent_of(TraceContext("trace-of-a-caller", 4)),
        }
        if transport == "http":
            assert deeper["headers"][DEPTH_HEADER.lower()] == "4"
            assert deeper["headers"][TRACE_HEADER.lower()] == "trace-of-a-caller"

        # Two calls at once keep their own traces (the headers follow each call).
        got: dict[str, Any] = {}

        async def one(trace_id: str, depth: int) -> None:
            got[trace_id] = await tool.run({}, context(trace_id, call_depth=depth))

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(one, "left", 1)
                task_group.start_soon(one, "right", 4)
        assert got["left"]["meta"] == {
            META_TRACE: "left",
            META_DEPTH: 2,
            META_TRACEPARENT: traceparent_of(TraceContext("left", 2)),
        }
        assert got["right"]["meta"] == {
            META_TRACE: "right",
            META_DEPTH: 5,
            META_TRACEPARENT: traceparent_of(TraceContext("right", 5)),
        }
        if transport == "http":
            assert got["left"]["headers"][TRACE_HEADER.lower()] == "left"
            assert got["right"]["headers"][DEPTH_HEADER.lower()] == "5"


# -- hangs, deaths, restarts ---------------------------------------------------


@pytest.mark.anyio
async def test_a_hung_server_times_out_and_the_agent_goes_on(transport: str, http_url: str) -> None:
    provider = ScriptedProvider(
        [tool_call("fx.hang", {}), text("it hung"), tool_call("fx.pid", {}), text("still there")]
    )
    agent = with_servers(
        provider,
        servers=[config_for(transport, http_url, timeout=HANG)],
        limits=LoopLimits(tool_timeout=0.5),
    )
    async with agent:
        toolset = remote(agent)
        assert toolset is not None
        connection = toolset.connections["fx"]
        seen = results(agent)
        hung = await ask(agent, "hang")
        assert hung.error is None
        assert hung.replies == ["it hung"]
        assert seen[0]["error"]["code"] == "TIMEOUT"
        # The agent answers the next input, over the connection that survived the cancel.
        after = await ask(agent, "pid")
        assert after.replies == ["still there"]
        assert seen[1]["success"] is True
        assert connection.connects == 1
        first_pid = seen[1]["result"]

        # Calls abandoned twice in a row: the connection is made afresh.
        hang, pid = agent.tools["fx.hang"], agent.tools["fx.pid"]
        for _ in range(2):
            with anyio.move_on_after(0.3) as scope:
                await hang.run({}, context())
            assert scope.cancelled_caught
        assert not connection.connected
        with anyio.fail_after(HANG):
            fresh = await pid.run({}, context())
        assert connection.connects == 2
        assert isinstance(fresh, int)
        if transport == "stdio":
            assert fresh != first_pid  # a new server process


@pytest.mark.anyio
async def test_a_stdio_server_that_dies_is_restarted_on_the_next_call() -> None:
    provider = ScriptedProvider(
        [
            tool_call("fx.pid", {}),
            text("pid"),
            tool_call("fx.die", {}),
            text("it died"),
            tool_call("fx.pid", {}),
            text("back"),
        ]
    )
    agent = with_servers(provider, servers=[stdio_config()])
    async with agent:
        seen = results(agent)
        await ask(agent, "pid")
        died = await ask(agent, "die")
        assert died.error is None
        assert died.replies == ["it died"]
        assert seen[1]["success"] is False
        assert seen[1]["error"]["code"] == "REMOTE_UNAVAILABLE"
        assert "closed the connection" in seen[1]["error"]["message"]
        back = await ask(agent, "pid")
        assert back.replies == ["back"]
        assert seen[2]["success"] is True
        assert seen[2]["result"] != seen[0]["result"]


@pytest.mark.anyio
async def test_an_http_server_that_goes_away_gives_tool_errors_and_comes_back() -> None:
    port = free_port()
    config = McpServerConfig(name="fx", url=f"http://127.0.0.1:{port}/mcp", timeout=2)
    provider = ScriptedProvider(
        [
            tool_call("fx.die", {}),
            text("it died"),
            tool_call("fx.pid", {}),
            text("nobody there"),
            tool_call("fx.pid", {}),
            text("back"),
        ]
    )
    agent = with_servers(provider, servers=[config])
    with http_server(port):
        await agent.__aenter__()
    try:
        seen = results(agent)
        died = await ask(agent, "die")  # the server process exits mid-call
        assert died.replies == ["it died"]
        assert seen[0]["success"] is False
        assert seen[0]["error"]["code"] == "REMOTE_UNAVAILABLE"
        gone = await ask(agent, "pid")
        assert gone.replies == ["nobody there"]
        assert seen[1]["error"]["code"] == "REMOTE_UNAVAILABLE"
        assert "cannot connect to MCP server 'fx'" in seen[1]["error"]["message"]
        with http_server(port):
            back = await ask(agent, "pid")
        assert back.replies == ["back"]
        assert seen[2]["success"] is True
    finally:
        await agent.__aexit__(None, None, None)


# asyncio only: after the initialize handshake the SDK's HTTP transport keeps a
# GET event stream whose httpx2 async generators it leaves unfinished on trio,
# a ResourceWarning that filterwarnings=error fails (tests/test_mcp_server.py
# skips the same stream on trio). What this test checks, how a forgotten session
# is recognised and replaced, does not depend on the backend.
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_session_the_http_server_forgot_is_opened_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The initialize handshake of servers before the 2026 revision keeps an
    # HTTP session, which a restarted server no longer knows.
    monkeypatch.setattr(mcp_connection, "_PROTOCOL_MODE", "legacy")
    port = free_port()
    toolset = McpToolset([McpServerConfig(name="fx", url=f"http://127.0.0.1:{port}/mcp")])
    with anyio.fail_after(HANG):
        with http_server(port):
            await toolset.__aenter__()
            try:
                pid = toolset.tools["fx.pid"]
                before = await pid.run({}, context())
            except BaseException:
                await toolset.aclose(cancel=True)
                raise
        try:
            with http_server(port):
                with pytest.raises(ToolError, match="Session not found") as caught:
                    await pid.run({}, context())
                assert caught.value.code == "REMOTE_UNAVAILABLE"
                after = await pid.run({}, context())
                assert isinstance(after, int)
                assert after != before
                assert toolset.connections["fx"].connects == 2
        finally:
            await toolset.aclose()


# -- start-up ------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_unreachable_server_without_tools_fails_the_start() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    agent = with_servers(ScriptedProvider([]), servers=[McpServerConfig(name="away", url=url)])
    with anyio.fail_after(HANG), pytest.raises(McpConnectError) as caught:
        await agent.__aenter__()
    message = str(caught.value)
    assert caught.value.server == "away"
    assert "'away'" in message
    assert url in message
    assert "'tools'" in message
    # Nothing is left running: the agent starts once the server is there.
    assert remote(agent) is None


@pytest.mark.anyio
async def test_a_stdio_server_that_cannot_start_fails_the_start() -> None:
    config = McpServerConfig(name="nothing", command=[str(FIXTURES / "no-such-program")])
    agent = with_servers(ScriptedProvider([]), servers=[config])
    with anyio.fail_after(HANG), pytest.raises(McpConnectError, match="'nothing'"):
        await agent.__aenter__()


@pytest.mark.anyio
async def test_a_stdio_server_that_exits_at_once_fails_the_start_clearly() -> None:
    config = McpServerConfig(name="quits", command=[sys.executable, "-c", "pass"])
    agent = with_servers(ScriptedProvider([]), servers=[config])
    with anyio.fail_after(HANG), pytest.raises(McpConnectError) as caught:
        await agent.__aenter__()
    assert "'quits'" in str(caught.value)
    assert "closed the connection before it answered (the program exited" in str(caught.value)


@pytest.mark.anyio
async def test_a_named_tool_the_server_lacks_fails_the_start(http_url: str) -> None:
    config = config_for("http", http_url, tools=["echo", "teleport"])
    agent = with_servers(ScriptedProvider([]), servers=[config])
    with anyio.fail_after(HANG), pytest.raises(McpConnectError, match="teleport") as caught:
        await agent.__aenter__()
    assert "echo" in str(caught.value)  # what it has


@pytest.mark.anyio
async def test_a_server_with_named_tools_is_connected_on_first_use() -> None:
    port = free_port()
    config = McpServerConfig(
        name="later", url=f"http://127.0.0.1:{port}/mcp", tools=["echo"], timeout=2
    )
    provider = ScriptedProvider(
        [
            tool_call("later.echo", {"text": "a"}),
            text("down"),
            tool_call("later.echo", {"text": "b"}),
            text("up"),
        ]
    )
    agent = with_servers(provider, servers=[config])
    with anyio.fail_after(HANG):
        async with agent:
            tool = agent.tools["later.echo"]
            assert tool.describe()["parameters"] == {"type": "object", "additionalProperties": True}
            seen = results(agent)
            await ask(agent, "not yet")
            assert seen[0]["error"]["code"] == "REMOTE_UNAVAILABLE"
            with http_server(port):
                up = await ask(agent, "now")
            assert up.replies == ["up"]
            assert seen[1] == {**seen[1], "success": True, "result": "b"}
            # Connected: the real description and schema replaced the placeholders.
            assert tool.describe()["description"] == "Say the text back."
            assert tool.describe()["parameters"]["required"] == ["text"]


@pytest.mark.anyio
async def test_connection_attempts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_connection, "MAX_CONNECTS", 3)
    url = f"http://127.0.0.1:{free_port()}/mcp"
    toolset = McpToolset([McpServerConfig(name="away", url=url, tools=["echo"])])
    with anyio.fail_after(HANG):
        async with toolset:  # attempt 1, at the start
            tool = toolset.tools["away.echo"]
            for _ in range(2):  # attempts 2 and 3
                with pytest.raises(ToolError, match="cannot connect"):
                    await tool.run({"text": "x"}, context())
            with pytest.raises(ToolError, match="3 connection attempts") as caught:
                await tool.run({"text": "x"}, context())
            assert caught.value.code == "REMOTE_UNAVAILABLE"
            assert toolset.connections["away"].connects == 0


# -- bounds --------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_result_over_the_limit_is_cut(
    monkeypatch: pytest.MonkeyPatch, http_url: str
) -> None:
    monkeypatch.setattr(mcp_proxies, "MAX_RESULT_CHARS", 1000)
    toolset = McpToolset([config_for("http", http_url, tools=["big"])])
    with anyio.fail_after(HANG):
        async with toolset:
            small = await toolset.tools["fx.big"].run({"size": 1000}, context())
            assert small == "x" * 1000
            big = await toolset.tools["fx.big"].run({"size": 5000}, context())
    assert big.startswith("x" * 1000)
    assert big.endswith("[cut: 4000 more characters over the result limit]")
    assert len(big) < 1100


@pytest.mark.anyio
async def test_too_many_tools_fail_the_connection(
    monkeypatch: pytest.MonkeyPatch, http_url: str
) -> None:
    monkeypatch.setattr(mcp_connection, "MAX_TOOLS_PER_SERVER", 3)
    agent = with_servers(ScriptedProvider([]), servers=[config_for("http", http_url)])
    with anyio.fail_after(HANG), pytest.raises(McpConnectError, match="more than 3 tools"):
        await agent.__aenter__()


@pytest.mark.anyio
async def test_a_remote_name_clashing_with_a_local_tool_is_refused(http_url: str) -> None:

    @tool
    def clash() -> str:
        """A local tool named like a remote one."""
        return "local"

    clash.name = "fx.echo"
    agent = with_servers(ScriptedProvider([]), [clash], servers=[config_for("http", http_url)])
    with anyio.fail_after(HANG), pytest.raises(ValueError, match=r"fx\.echo"):
        await agent.__aenter__()
    assert remote(agent) is None
    assert list(agent.tools) == ["fx.echo"]
    assert agent.tools["fx.echo"] is clash


# -- the manifest --------------------------------------------------------------


@pytest.mark.anyio
async def test_a_manifest_s_servers_start_relative_to_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "agent"
    folder.mkdir()
    manifest = folder / "agent.json"
    manifest.write_text(
        json.dumps(
            {
                "identity": {"name": "client"},
                "limits": {"toolTimeout": 10},
                "mcp": {
                    "servers": [
                        {
                            "name": "fx",
                            "command": [sys.executable, SERVER.name, "stdio"],
                            "cwd": os.path.relpath(FIXTURES, folder),
                            "tools": ["pid", "echo"],
                        }
                    ],
                    "expose_tools": ["fx.echo"],
                },
            }
        ),
        encoding="utf-8",
    )
    agent = agent_from_manifest(manifest)
    assert load_manifest(manifest).mcp.servers[0].cwd == os.path.relpath(FIXTURES, folder)
    with anyio.fail_after(HANG):
        async with agent:
            assert sorted(n for n in agent.tools if n.startswith("fx.")) == ["fx.echo", "fx.pid"]
            toolset = remote(agent)
            assert toolset is not None
            assert toolset.connections["fx"].config.cwd == str(FIXTURES)
            pid = await agent.tools["fx.pid"].run({}, context())
            assert isinstance(pid, int)
            assert pid != os.getpid()


_SECRETS = ("s3cret", "TOPSECRET", "abc123")


def _refused_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _secret_url() -> str:
    port = _refused_port()
    return f"http://alice:s3cret@127.0.0.1:{port}/mcp?token=TOPSECRET&key=abc123"


def _assert_no_secret(text: str) -> None:
    for secret in _SECRETS:
        assert secret not in text, text


@pytest.mark.anyio
async def test_credentials_in_a_server_url_stay_out_of_errors_logs_and_repr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defect: an ``mcp.servers`` URL is the only place a server's credentials
    can go (``user:password@`` or a ``?token=`` query), and it was quoted whole
    in every connection error: the warning logged at start, the ToolError the
    provider is shown as an observation, the connection's repr."""
    config = McpServerConfig(name="peer", url=_secret_url(), tools=["relay"], timeout=5)
    context = AgentContext({}, Session("s"), trace_id="t-3")
    with caplog.at_level(logging.INFO, logger="openstarry.mcp"), anyio.fail_after(HANG):
        async with McpToolset([config]) as toolset:
            connection = toolset.connections["peer"]
            _assert_no_secret(repr(connection))
            assert "127.0.0.1" in repr(connection)
            with pytest.raises(ToolError) as caught:
                await toolset.tools["peer.relay"].run({}, context)
    assert caught.value.code == "REMOTE_UNAVAILABLE"
    assert "127.0.0.1" in str(caught.value)  # still says where
    _assert_no_secret(str(caught.value))
    assert any("peer" in record.getMessage() for record in caplog.records)
    for record in caplog.records:
        if record.name == "openstarry.mcp":
            _assert_no_secret(record.getMessage())


@pytest.mark.anyio
async def test_credentials_in_a_server_url_stay_out_of_the_start_failure() -> None:
    """Defect: as above, for the McpConnectError that fails an agent's start."""
    config = McpServerConfig(name="peer", url=_secret_url(), timeout=5)
    with anyio.fail_after(HANG), pytest.raises(McpConnectError) as caught:
        async with McpToolset([config]):
            pass
    assert "peer" in str(caught.value)
    _assert_no_secret(str(caught.value))


@pytest.mark.anyio
async def test_a_remote_name_clashing_with_a_local_tool_is_a_manifest_error() -> None:
    """Defect: a remote tool named like a local one failed the start with a bare
    ValueError, which ``openstarry mcp``/``run``/``serve`` do not catch: a
    traceback. It is a ManifestError (still a ValueError) naming ``mcp.servers``."""
    echo = Echo()
    echo.name = "peer.relay"
    config = McpServerConfig(name="peer", url=_secret_url(), tools=["relay"], timeout=5)
    agent = with_servers(ScriptedProvider([]), [echo], servers=[config])
    with anyio.fail_after(HANG), pytest.raises(ManifestError) as caught:
        await agent.__aenter__()
    assert caught.value.field == "mcp.servers"
    assert "peer.relay" in str(caught.value)
    assert remote(agent) is None
    assert agent.tools["peer.relay"] is echo


def _manifest(tmp_path: Path, servers: list[dict[str, Any]]) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(
        json.dumps(
            {
                "identity": {"name": "hardening"},
                "tools": ["fs.read"],
                "limits": {"toolTimeout": 5},
                "mcp": {"servers": servers},
            }
        ),
        encoding="utf-8",
    )
    return path


def test_openstarry_mcp_exits_cleanly_when_a_remote_server_cannot_be_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: ``python -m openstarry.mcp.server`` (then the documented fallback of
    ``openstarry mcp``) died with a traceback when a server of ``mcp.servers``
    could not be reached; :func:`serve` now answers 1 with the reason."""
    manifest = _manifest(tmp_path, [{"name": "peer", "url": _secret_url(), "timeout": 5}])
    assert cli.main(["mcp", str(manifest)]) == 1
    err = capsys.readouterr().err
    assert "openstarry mcp:" in err
    assert "'peer'" in err
    assert "Traceback" not in err
    _assert_no_secret(err)


def test_openstarry_mcp_exits_2_when_a_remote_tool_clashes_with_a_local_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: a remote ``fs.read`` (server ``fs``) next to the built-in
    ``fs.read`` ended ``openstarry mcp`` with a traceback; it is a bad manifest."""
    manifest = _manifest(tmp_path, [{"name": "fs", "url": _secret_url(), "tools": ["read"]}])
    assert cli.main(["mcp", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "fs.read" in err
    assert "mcp.servers" in err
    assert "Traceback" not in err


@pytest.mark.anyio
async def test_entering_a_running_agent_again_leaves_it_running() -> None:
    """Defect: a second ``async with agent`` on an agent already running (on a
    bus it was given) was refused only by its loop, after it had swapped in a
    second MCP toolset; the clean-up of the refused entry then closed the
    running agent's connections, took its remote tools away and left its
    provider."""
    config = McpServerConfig(name="peer", url=_secret_url(), tools=["relay"], timeout=5)
    provider = _CountingProvider()
    with anyio.fail_after(HANG):
        async with EventBus() as bus:
            agent = with_servers(provider, [Echo()], bus=bus, servers=[config])
            async with agent:
                toolset = remote(agent)
                assert toolset is not None
                with pytest.raises(RuntimeError, match="already running"):
                    await agent.__aenter__()
                assert remote(agent) is toolset
                assert "peer.relay" in agent.tools
                assert provider.entered == 1
                assert provider.exited == 0
            assert provider.exited == 1
            assert remote(agent) is None


class _CountingProvider(ScriptedProvider):
    """A scripted provider that counts how often it is entered and left."""

    def __init__(self) -> None:
        super().__init__([])
        self.entered = 0
        self.exited = 0

    async def __aenter__(self) -> _CountingProvider:
        self.entered += 1
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.exited += 1


@pytest.mark.anyio
async def test_a_toolset_left_inside_a_cancelled_scope_closes_its_connections() -> None:
    """Defect: leaving a connected McpToolset (an agent with ``mcp.servers``)
    inside a cancelled scope (a timeout around ``async with agent``, a server
    shutting down) stopped at its first wait: its task group was never left, a
    RuntimeError "cancel scope stack corrupted" followed, and the connections'
    tasks, and the stdio servers, stayed alive."""
    import sys

    config = McpServerConfig(
        name="fx", command=[sys.executable, str(SERVER), "stdio"], timeout=HANG
    )
    toolset = McpToolset([config])
    with anyio.fail_after(HANG):
        with anyio.CancelScope() as outer:
            async with toolset:
                connection = toolset.connections["fx"]
                assert connection.connected
                pid = await toolset.tools["fx.pid"].run({}, AgentContext({}, Session("s")))
                outer.cancel()
        assert outer.cancelled_caught
        assert not connection.connected
        assert not connection._running  # the owner task ended
    _assert_exited(pid)


def _assert_exited(pid: int) -> None:
    """The stdio server process ``pid`` is gone (reaped by the SDK's transport)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"the stdio server {pid} is still running")


@pytest.mark.anyio
async def test_an_agent_left_inside_a_cancelled_scope_stops_its_servers() -> None:
    """Defect: the same through an Agent that has served an input. Its
    toolset's part is fixed here; on trio the ExecutionLoop's ``__aexit__`` has
    the same fault (it waits for its workers before leaving its task group; see
    the report's loop.py diff)."""
    import sys

    config = McpServerConfig(
        name="fx", command=[sys.executable, str(SERVER), "stdio"], timeout=HANG
    )
    agent = with_servers(
        ScriptedProvider([tool_call("fx.pid", {}), text("done")]), servers=[config]
    )
    pids: list[int] = []
    agent.bus.subscribe("EXEC:TOOL_RESULT", lambda event: pids.append(event.payload.get("result")))
    with anyio.fail_after(HANG):
        with anyio.CancelScope() as outer:
            async with agent:
                result = await agent.ask("which process?")
                assert result.replies == ["done"]
                outer.cancel()
        assert outer.cancelled_caught
    assert remote(agent) is None
    [pid] = pids
    _assert_exited(pid)


@pytest.mark.anyio
async def test_an_http_call_may_take_as_long_as_the_tool_timeout(
    http_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: the HTTP read timeout was a fixed 300 s, so with a longer
    ``toolTimeout`` (a remote agent that thinks for minutes) the call failed
    at 300 s as REMOTE_UNAVAILABLE and the whole connection, with every other
    call on it, was torn down. The read timeout is now at least the tool
    timeout; here the fixed floor is lowered to show it in a second."""
    monkeypatch.setattr(mcp_connection, "_HTTP_READ_TIMEOUT", 0.3)
    config = McpServerConfig(name="fx", url=http_url, timeout=HANG)
    provider = ScriptedProvider([tool_call("fx.hang", {}), text("gave up")])
    agent = with_servers(provider, servers=[config], limits=LoopLimits(tool_timeout=1.0))
    seen: list[dict[str, Any]] = []
    agent.bus.subscribe("EXEC:TOOL_RESULT", lambda event: seen.append(event.payload))
    with anyio.fail_after(HANG):
        async with agent:
            toolset = remote(agent)
            assert toolset is not None
            connection = toolset.connections["fx"]
            result = await agent.ask("hang")
            await agent.bus.wait_idle()
            assert result.replies == ["gave up"]
            # Cut off by the agent's tool timeout, not by the transport.
            assert seen[0]["error"]["code"] == "TIMEOUT"
            assert connection.connected
            assert connection.connects == 1


@pytest.mark.anyio
async def test_mcp_servers_without_the_sdk_fail_the_start_as_a_manifest_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect: an agent with ``mcp.servers`` and no ``[mcp]`` extra failed its
    start with a bare ImportError, a traceback from ``openstarry run``/``serve``;
    it is a ManifestError naming ``mcp.servers`` and the extra."""
    import sys

    monkeypatch.setitem(sys.modules, "httpx2", None)
    # The client and the modules under it that import the SDK, imported afresh.
    for module in ("client", "connection", "listchanges", "proxies", "transport"):
        monkeypatch.delitem(sys.modules, f"openstarry.mcp.{module}")
    config = McpServerConfig(name="peer", url=_secret_url(), tools=["relay"])
    # The composition root builds the toolset, so it is where the extra is missed.
    with anyio.fail_after(HANG), pytest.raises(ManifestError) as caught:
        with_servers(ScriptedProvider([]), servers=[config])
    assert caught.value.field == "mcp.servers"
    assert "openstarry[mcp]" in str(caught.value)


@pytest.mark.anyio
async def test_a_stdio_server_writing_junk_is_reported_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SDK logged a full traceback for each line a server wrote that is not JSON-RPC."""
    from openstarry.errors import McpConnectError
    from openstarry.manifest import McpServerConfig
    from openstarry.mcp.client import McpToolset

    junk = "print('oops, a log line')"
    config = McpServerConfig(name="junk", command=[sys.executable, "-c", junk], timeout=2)
    caplog.set_level(logging.ERROR, logger="mcp.client.stdio")
    with pytest.raises(McpConnectError):
        async with McpToolset([config], default_timeout=2):
            pass
    records = [r for r in caplog.records if r.name == "mcp.client.stdio"]
    assert records, "the SDK reported nothing"
    for record in records:
        assert record.exc_info is None
        assert "not JSON-RPC" in record.getMessage()
    assert "oops, a log line" in records[0].getMessage()


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

    config = McpServerConfig(name="fx", command=[sys.executable, str(SERVER), "stdio"])
    agent = with_servers(FunctionProvider(brain), [get_weather], servers=[config])
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
