"""An agent's MCP resources and live lists, against the official MCP SDK's client (spec 004).

The manifest exposes ``workspace/`` (a folder) and two Python resources, and
keeps ``workspace/secret.txt`` private. The SDK's client lists and reads the
exposed files, is refused the private one and anything outside, reads the
Python resources and the template, and receives
``notifications/tools/list_changed`` when a tool is added while the agent runs
and ``notifications/resources/list_changed`` when a file appears.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from mcp_fixtures import helpers
from openstarry.agent.runtime import Agent
from openstarry.assembly import agent_from_manifest, mcp_toolset
from openstarry.errors import ManifestError
from openstarry.mcp import AgentMcpServer
from openstarry.mcp.client import McpToolset
from openstarry.mcp.server import RESOURCE_NOT_FOUND

pytestmark = pytest.mark.anyio

HANG = 10
RESOURCES = {
    "expose_tools": ["get_weather"],
    "expose_resources": [
        "workspace/",
        "mcp_fixtures.resources:today",
        "mcp_fixtures.resources:day",
    ],
    "private_resources": ["workspace/secret.txt"],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "workspace"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha", encoding="utf-8")
    (folder / "sub" / "b.md").write_text("# beta", encoding="utf-8")
    (folder / "secret.txt").write_text("the password", encoding="utf-8")
    (tmp_path / "outside.txt").write_text("not exposed", encoding="utf-8")
    return folder


def uri(path: Path) -> str:
    return "file://" + path.resolve().as_posix()


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[Agent, AgentMcpServer]]:
    workspace(tmp_path)
    async with agent_from_manifest(helpers.write_manifest(tmp_path, RESOURCES)) as agent:
        yield agent, AgentMcpServer(agent)


def text(result: types.ReadResourceResult) -> str:
    (contents,) = result.contents
    assert isinstance(contents, types.TextResourceContents)
    return contents.text


async def test_resources_are_listed_and_read_and_private_ones_are_not(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, served), Client(served.server, mode="legacy") as client:
        capabilities = client.server_capabilities
        assert capabilities.tools is not None
        assert capabilities.tools.list_changed is True
        assert capabilities.resources is not None
        assert capabilities.resources.list_changed is True
        listed = await client.list_resources()
        names = [r.name for r in listed.resources]
        assert names == ["workspace/a.txt", "workspace/sub/b.md", "today"]
        assert "secret" not in str(listed)
        files = {r.name: str(r.uri) for r in listed.resources}
        assert text(await client.read_resource(files["workspace/a.txt"])) == "alpha"
        assert text(await client.read_resource(files["workspace/sub/b.md"])) == "# beta"
        for refused in (
            uri(tmp_path / "workspace" / "secret.txt"),
            uri(tmp_path / "outside.txt"),
            uri(tmp_path / "workspace" / "missing.txt"),
            uri(tmp_path / "workspace" / ".." / "outside.txt"),
        ):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(refused)
            assert caught.value.code == RESOURCE_NOT_FOUND
        assert text(await client.read_resource("notes://today")) == "Buy milk."
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == ["notes://day/{day}"]
        assert text(await client.read_resource("notes://day/monday")) == "# Notes of monday"


async def test_a_link_out_of_an_exposed_folder_is_not_followed(tmp_path: Path) -> None:
    folder = workspace(tmp_path)
    (folder / "link.txt").symlink_to(tmp_path / "outside.txt")
    async with agent_from_manifest(
        helpers.write_manifest(tmp_path, {**RESOURCES, "expose_resources": ["workspace/"]}),
    ) as agent:
        served = AgentMcpServer(agent)
        names = [r.name for r in served.resources.listed()]
        assert names == ["workspace/a.txt", "workspace/sub/b.md"]


def test_a_resource_outside_the_allowed_paths_is_a_manifest_error(tmp_path: Path) -> None:
    workspace(tmp_path)
    manifest = helpers.write_manifest(
        tmp_path, {"expose_resources": ["workspace/"]}, fs={"allowedPaths": ["elsewhere"]}
    )
    (tmp_path / "elsewhere").mkdir()
    agent = agent_from_manifest(manifest)
    with pytest.raises(ManifestError, match=r"outside fs\.allowedPaths"):
        AgentMcpServer(agent)


async def test_list_changed_notifications_for_tools_and_files(tmp_path: Path) -> None:
    received: list[str] = []
    tools_changed = anyio.Event()
    resources_changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            received.append("tools")
            tools_changed.set()
        elif isinstance(message, types.ResourceListChangedNotification):
            received.append("resources")
            resources_changed.set()

    async with (
        serving(tmp_path) as (agent, served),
        Client(served.server, mode="legacy", message_handler=on_message) as client,
        anyio.create_task_group() as watching,
    ):
        if True:
            watching.start_soon(served.watch_resources, 0.05)
            before = await client.list_tools()
            assert [t.name for t in before.tools] == ["get_weather"]
            await client.list_resources()
            # A tool added at run time: the client is told, and sees it.
            renamed = helpers_tool("get_weather_now")
            agent.loop.tools = {**agent.tools, renamed.name: renamed}
            served.expose = (*served.expose, renamed.name)
            with anyio.fail_after(HANG):
                await tools_changed.wait()
            after = await client.list_tools()
            assert [t.name for t in after.tools] == ["get_weather", "get_weather_now"]
            # A file that appears in the exposed folder, once the watcher has looked.
            with anyio.fail_after(HANG):
                while served._listing is None:
                    await anyio.sleep(0.01)
            (tmp_path / "workspace" / "new.txt").write_text("fresh", encoding="utf-8")
            with anyio.fail_after(HANG):
                await resources_changed.wait()
            names = [r.name for r in (await client.list_resources()).resources]
            assert "workspace/new.txt" in names
            watching.cancel_scope.cancel()
    assert received[0] == "tools"
    assert "resources" in received


def helpers_tool(name: str) -> Any:
    from openstarry import tool

    @tool(name=name)
    def now(location: str) -> str:
        """The weather now."""
        return f"{location}: sunny"

    return now


async def test_resources_over_stdio_with_openstarry_mcp(tmp_path: Path) -> None:
    workspace(tmp_path)
    manifest = helpers.write_manifest(tmp_path, RESOURCES)
    command = helpers.server_command(manifest)
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=helpers.environment()
    )
    with (tmp_path / "stderr.txt").open("w", encoding="utf-8") as stderr, anyio.fail_after(30):
        async with Client(stdio_client(parameters, errlog=stderr), mode="legacy") as client:
            listed = await client.list_resources()
            files = {r.name: str(r.uri) for r in listed.resources}
            assert set(files) == {"workspace/a.txt", "workspace/sub/b.md", "today"}
            assert text(await client.read_resource(files["workspace/a.txt"])) == "alpha"
            with pytest.raises(MCPError) as caught:
                await client.read_resource(uri(tmp_path / "workspace" / "secret.txt"))
            assert caught.value.code == RESOURCE_NOT_FOUND


# --- openstarry as the client of a server whose tools change ------------------------------------


async def test_the_client_reads_remote_resources_and_takes_new_tools_on_list_changed(
    tmp_path: Path,
) -> None:
    from openstarry.agent.loop import TOOLS_CHANGED
    from openstarry.manifest import McpServerConfig
    from openstarry.testing import ScriptedProvider

    server = Path(__file__).resolve().parent / "mcp_fixtures" / "changing_server.py"
    toolset = mcp_toolset(
        [McpServerConfig(name="peer", command=[sys.executable, str(server)])], tool_timeout=HANG
    )
    agent = Agent(ScriptedProvider([]), toolsets=[toolset])
    changed = anyio.Event()
    with anyio.fail_after(30):
        async with agent:
            agent.bus.subscribe(TOOLS_CHANGED, lambda event: changed.set())
            assert set(agent.tools) == {"peer.grow", "peer.read_resource"}
            read = await agent.loop.call_tool(
                "peer.read_resource", {"uri": "fixture://greeting"}, session_id="t"
            )
            assert read.success, read.error
            assert read.result == "hello from the fixture"
            missing = await agent.loop.call_tool(
                "peer.read_resource", {"uri": "fixture://nothing"}, session_id="t"
            )
            assert not missing.success
            assert missing.error is not None
            assert missing.error.code == "REMOTE_ERROR"
            grew = await agent.loop.call_tool("peer.grow", {}, session_id="t")
            assert grew.success, grew.error
            await changed.wait()
            assert "peer.grown" in agent.tools
            used = await agent.loop.call_tool("peer.grown", {"text": "x"}, session_id="t")
            assert used.result == "grown: x"


async def test_a_new_remote_tool_named_like_a_local_one_is_left_out_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect: a ``list_changed`` that brought a tool named like a local one raised
    ``ManifestError`` inside the notification callback, which ended the connection
    to the server (its other tools then failed until a reconnect) and told nobody
    why. Now the new tool is left out, the agent keeps its own and runs on, and the
    clash is said once: a ``KERNEL:ERROR`` and a log line naming both tools."""
    from openstarry import tool
    from openstarry.agent.loop import TOOLS_CHANGED
    from openstarry.agent.runtime import TOOL_NAME_CLASH
    from openstarry.core import Event
    from openstarry.manifest import McpServerConfig
    from openstarry.testing import ScriptedProvider, text

    @tool(name="peer.grown")
    def local_grown(text: str) -> str:
        """The agent's own tool, named like the one the server is about to add."""
        return f"local: {text}"

    server = Path(__file__).resolve().parent / "mcp_fixtures" / "changing_server.py"
    toolset = mcp_toolset(
        [McpServerConfig(name="peer", command=[sys.executable, str(server)])], tool_timeout=HANG
    )
    agent = Agent(ScriptedProvider([text("still here")]), [local_grown], toolsets=[toolset])
    errors: list[dict[str, Any]] = []
    changes: list[Event] = []
    caplog.set_level(logging.WARNING)
    with anyio.fail_after(30):
        async with agent:
            agent.bus.subscribe("KERNEL:ERROR", lambda event: errors.append(event.payload))
            agent.bus.subscribe(TOOLS_CHANGED, changes.append)
            for _ in range(2):  # each grow sends list_changed; the clash is said once
                seen = len(changes)
                grew = await agent.loop.call_tool("peer.grow", {}, session_id="t")
                assert grew.success, grew.error
                while len(changes) == seen:
                    await anyio.sleep(0.01)
            await agent.bus.wait_idle()
            # The agent keeps its own tool, and the connection and the agent run on.
            assert agent.tools["peer.grown"] is local_grown
            used = await agent.loop.call_tool("peer.grown", {"text": "x"}, session_id="t")
            assert used.result == "local: x"
            again = await agent.loop.call_tool("peer.grow", {}, session_id="t")
            assert again.success, again.error
            assert (await agent.ask("hello")).text == "still here"
            await agent.bus.wait_idle()
    [error] = [e for e in errors if e["code"] == TOOL_NAME_CLASH]
    assert "'grown' of MCP server 'peer'" in error["message"]
    assert "the local tool 'peer.grown'" in error["message"]
    said = [r.getMessage() for r in caplog.records if "is left out" in r.getMessage()]
    assert said == [error["message"]]
    assert not [r for r in caplog.records if "connection ended" in r.getMessage()]


@contextmanager
def changing_http_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``changing_server.py`` over Streamable HTTP (the SDK's own server and uvicorn)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = Path(__file__).resolve().parent / "mcp_fixtures" / "changing_server.py"
    process = subprocess.Popen(
        [sys.executable, str(server), "http", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + HANG
        while True:
            assert process.poll() is None, "the fixture server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the fixture server does not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        helpers.stop(process)


async def test_an_http_server_s_new_tools_arrive_live_on_the_newest_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect: over HTTP the client never opened a ``subscriptions/listen`` stream,
    so a server on the 2026-07-28 protocol (which sends its changes nowhere else)
    had its new tools taken only at the next connection. Its stream is renewed
    (here every 0.2 s, so that the change comes after a few renewals)."""
    from openstarry.agent.loop import TOOLS_CHANGED
    from openstarry.manifest import McpServerConfig
    from openstarry.mcp import listchanges
    from openstarry.testing import ScriptedProvider

    monkeypatch.setattr(listchanges, "LISTEN_RENEW", 0.2)
    changed = anyio.Event()
    with changing_http_server() as (url, _), anyio.fail_after(30):
        toolset = McpToolset([McpServerConfig(name="peer", url=url)], default_timeout=HANG)
        agent = Agent(ScriptedProvider([]), toolsets=[toolset])
        async with agent:
            connection = toolset.connections["peer"]
            assert connection._client is not None
            assert connection._client.protocol_version == "2026-07-28"
            agent.bus.subscribe(TOOLS_CHANGED, lambda event: changed.set())
            await anyio.sleep(1.0)  # a few renewals
            grew = await agent.loop.call_tool("peer.grow", {}, session_id="t")
            assert grew.success, grew.error
            await changed.wait()
            used = await agent.loop.call_tool("peer.grown", {"text": "x"}, session_id="t")
            assert used.result == "grown: x"
            assert connection.connects == 1  # live, not a new connection


async def test_a_listening_client_does_not_keep_an_sdk_http_server_from_stopping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's HTTP server, told to stop, waits for every open response, and a
    listen stream does not end by itself: the client's renewal (0.5 s here) is what
    lets it stop. Killed after ``HANG`` seconds otherwise (exit status -9)."""
    from openstarry.manifest import McpServerConfig
    from openstarry.mcp import listchanges

    monkeypatch.setattr(listchanges, "LISTEN_RENEW", 0.5)
    with changing_http_server() as (url, process), anyio.fail_after(60):
        toolset = McpToolset([McpServerConfig(name="peer", url=url)], default_timeout=HANG)
        async with toolset:
            assert "peer.grow" in toolset.tools
            process.terminate()
            status = await anyio.to_thread.run_sync(lambda: process.wait(HANG))
    assert status != -signal.SIGKILL


async def test_openstarry_mcp_http_ends_its_listen_streams_when_told_to_stop(
    tmp_path: Path,
) -> None:
    """Defect: ``openstarry mcp --http`` did not stop on SIGTERM while a client
    held a ``subscriptions/listen`` stream (uvicorn waits for every open response,
    and a listen stream never ends by itself): it had to be killed. It now ends
    the streams (their graceful close) first, and stops on the signal."""
    from openstarry.manifest import McpServerConfig

    exits: list[int] = []
    manifest = helpers.write_manifest(tmp_path)
    with anyio.fail_after(60):
        with helpers.http_server(manifest, exits) as (url, _):
            toolset = McpToolset([McpServerConfig(name="peer", url=url)], default_timeout=HANG)
            await toolset.__aenter__()
            try:
                connection = toolset.connections["peer"]
                assert connection._client is not None
                assert connection._client.protocol_version == "2026-07-28"
                await anyio.sleep(0.5)  # the listen stream is open
            except BaseException:
                await toolset.aclose(cancel=True)
                raise
        try:
            assert exits == [-signal.SIGTERM]
        finally:
            await toolset.aclose()
