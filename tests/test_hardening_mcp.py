"""Hardening tests for inter-agent MCP (spec 004): hostile requests, secrets, lifecycle races.

Each test names a defect found by review and failed before its fix. The
servers are the real ones: an :class:`AgentMcpServer` driven in process by the
official SDK's ``Client``, and ``openstarry mcp`` through its entry point.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

import mcp.types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import RequestParamsMeta

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import LoopLimits
from openstarry.agent.memory import Session
from openstarry.agent.runtime import Agent
from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.errors import ManifestError, McpConnectError, ToolError
from openstarry.manifest import McpServerConfig
from openstarry.mcp import META_DEPTH, META_TRACE, AgentMcpServer, McpToolset
from openstarry.mcp import server as mcp_server
from openstarry.testing import ScriptedProvider, text, tool_call

#: A bound on any one wait, so a broken server fails a test instead of hanging it.
HANG = 10


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


class Echo(Tool):
    """Returns its argument ``value``, whatever it is."""

    name = "echo"
    description = "Returns its argument."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"value": {}}}
        self.runs = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.runs += 1
        return args.get("value")


class Served:
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
async def serving() -> AsyncIterator[Served]:
    echo, counter = Echo(), Counter()
    async with Agent(ScriptedProvider([]), [echo, counter], name="hardening") as agent:
        yield Served(agent, echo, counter)


def meta(trace_id: Any, depth: Any) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {META_TRACE: trace_id, META_DEPTH: depth})


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


# ----------------------------------------------------------------------------- the server


@pytest.mark.anyio
async def test_arguments_nested_too_deep_for_an_event_are_a_tool_error_not_an_internal_error() -> (
    None
):
    """Defect: arguments nested deeper than an event carries (64 levels) made
    ``tools/call`` fail with ``-32603 Internal server error`` and a traceback in
    the log; they are bad arguments, answered ``isError`` with INVALID_ARGUMENTS."""
    async with serving() as served, Client(served.mcp.server) as client:
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
    async with serving() as served, Client(served.mcp.server) as client:
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
    async with serving() as served, Client(served.mcp.server) as client:
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
    async with serving() as served, Client(served.mcp.server) as client:
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


# ----------------------------------------------------------------------------- the client

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


# ----------------------------------------------------------------------------- the agent


@pytest.mark.anyio
async def test_a_remote_name_clashing_with_a_local_tool_is_a_manifest_error() -> None:
    """Defect: a remote tool named like a local one failed the start with a bare
    ValueError, which ``openstarry mcp``/``run``/``serve`` do not catch: a
    traceback. It is a ManifestError (still a ValueError) naming ``mcp.servers``."""
    echo = Echo()
    echo.name = "peer.relay"
    config = McpServerConfig(name="peer", url=_secret_url(), tools=["relay"], timeout=5)
    agent = Agent(ScriptedProvider([]), [echo], mcp_servers=[config])
    with anyio.fail_after(HANG), pytest.raises(ManifestError) as caught:
        await agent.__aenter__()
    assert caught.value.field == "mcp.servers"
    assert "peer.relay" in str(caught.value)
    assert agent.mcp is None
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
    """Defect: ``python -m openstarry.mcp.server`` (the documented fallback of
    ``openstarry mcp``) died with a traceback when a server of ``mcp.servers``
    could not be reached; :func:`serve` now answers 1 with the reason."""
    manifest = _manifest(tmp_path, [{"name": "peer", "url": _secret_url(), "timeout": 5}])
    assert mcp_server.main([str(manifest)]) == 1
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
    assert mcp_server.main([str(manifest)]) == 2
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
            agent = Agent(provider, [Echo()], bus=bus, mcp_servers=[config])
            async with agent:
                toolset = agent.mcp
                assert toolset is not None
                with pytest.raises(RuntimeError, match="already running"):
                    await agent.__aenter__()
                assert agent.mcp is toolset
                assert "peer.relay" in agent.tools
                assert provider.entered == 1
                assert provider.exited == 0
            assert provider.exited == 1
            assert agent.mcp is None


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


# ----------------------------------------------------------------------------- the loop


@pytest.mark.anyio
async def test_a_call_cancelled_before_it_started_runs_nothing() -> None:
    """Defect (in ``ExecutionLoop.call_tool``, fixed there by the loop's owner):
    a caller cancelled while its ``EXEC:TOOL_CALL`` waited for dispatch (the
    ``tools/call`` of a client that went away at once) left the call to run
    anyway: its cancel scope did not exist yet, so nothing stopped it. On trio
    the tool ran to its end for nobody, outside the server's ``max_calls``."""
    async with serving() as served:
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


SDK_SERVER = Path(__file__).resolve().parent / "mcp_fixtures" / "sdk_server.py"


@pytest.mark.anyio
async def test_a_toolset_left_inside_a_cancelled_scope_closes_its_connections() -> None:
    """Defect: leaving a connected McpToolset (an agent with ``mcp.servers``)
    inside a cancelled scope (a timeout around ``async with agent``, a server
    shutting down) stopped at its first wait: its task group was never left, a
    RuntimeError "cancel scope stack corrupted" followed, and the connections'
    tasks, and the stdio servers, stayed alive."""
    import sys

    config = McpServerConfig(
        name="fx", command=[sys.executable, str(SDK_SERVER), "stdio"], timeout=HANG
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
        name="fx", command=[sys.executable, str(SDK_SERVER), "stdio"], timeout=HANG
    )
    agent = Agent(ScriptedProvider([tool_call("fx.pid", {}), text("done")]), mcp_servers=[config])
    pids: list[int] = []
    agent.bus.subscribe("EXEC:TOOL_RESULT", lambda event: pids.append(event.payload.get("result")))
    with anyio.fail_after(HANG):
        with anyio.CancelScope() as outer:
            async with agent:
                result = await agent.ask("which process?")
                assert result.replies == ["done"]
                outer.cancel()
        assert outer.cancelled_caught
    assert agent.mcp is None
    [pid] = pids
    _assert_exited(pid)


@pytest.fixture(scope="module")
def sdk_http_url() -> Iterator[str]:
    """The SDK fixture server over Streamable HTTP, for this module."""
    import subprocess
    import sys
    import time

    port = _refused_port()
    process = subprocess.Popen(
        [sys.executable, str(SDK_SERVER), "http", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + HANG
        while True:
            assert process.poll() is None, f"the fixture server exited with {process.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the fixture server did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.anyio
async def test_an_http_call_may_take_as_long_as_the_tool_timeout(
    sdk_http_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: the HTTP read timeout was a fixed 300 s, so with a longer
    ``toolTimeout`` (a remote agent that thinks for minutes) the call failed
    at 300 s as REMOTE_UNAVAILABLE and the whole connection, with every other
    call on it, was torn down. The read timeout is now at least the tool
    timeout; here the fixed floor is lowered to show it in a second."""
    from openstarry.mcp import client as mcp_client

    monkeypatch.setattr(mcp_client, "_HTTP_READ_TIMEOUT", 0.3)
    config = McpServerConfig(name="fx", url=sdk_http_url, timeout=HANG)
    provider = ScriptedProvider([tool_call("fx.hang", {}), text("gave up")])
    agent = Agent(provider, mcp_servers=[config], limits=LoopLimits(tool_timeout=1.0))
    seen: list[dict[str, Any]] = []
    agent.bus.subscribe("EXEC:TOOL_RESULT", lambda event: seen.append(event.payload))
    with anyio.fail_after(HANG):
        async with agent:
            assert agent.mcp is not None
            connection = agent.mcp.connections["fx"]
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
    monkeypatch.delitem(sys.modules, "openstarry.mcp.client")
    config = McpServerConfig(name="peer", url=_secret_url(), tools=["relay"])
    agent = Agent(ScriptedProvider([]), mcp_servers=[config])
    with anyio.fail_after(HANG), pytest.raises(ManifestError) as caught:
        await agent.__aenter__()
    assert caught.value.field == "mcp.servers"
    assert "openstarry[mcp]" in str(caught.value)
    assert agent.mcp is None
