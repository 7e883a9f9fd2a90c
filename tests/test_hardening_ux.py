"""What a new user ran into, following the README: each test failed before its fix."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from mcp_fixtures import helpers
from openstarry.agent.commands import parse_tool_args
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.runtime import Agent
from openstarry.api.client import AgentClient, ApiError, Client
from openstarry.errors import ManifestError, ToolArgumentsError
from openstarry.manifest import AgentManifest


def _manifest(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"identity": {"name": "ux"}, **data}), encoding="utf-8")
    return path


def test_an_http_provider_without_the_extra_is_a_manifest_error(tmp_path: Path) -> None:
    """It was a 30-line traceback and exit 1; now exit 2 naming the extra."""
    path = _manifest(tmp_path, {"provider": {"name": "openai", "model": "m"}})
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "from openstarry.cli import main\n"
        f"sys.exit(main(['run', {str(path)!r}, '--input', 'hi']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "provider.name" in done.stderr
    assert "openstarry[http]" in done.stderr


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


def test_exposing_an_imported_tool_by_its_name_says_how_to_name_it() -> None:
    with pytest.raises(ValueError, match=r"name an imported tool by its entry in tools"):
        AgentManifest.model_validate(
            {
                "identity": {"name": "x"},
                "tools": ["mcp_fixtures.tools:mumble"],
                "mcp": {"expose_tools": ["mumble"]},
            }
        )


def test_an_unknown_retriever_name_says_what_is_known(tmp_path: Path) -> None:
    path = _manifest(tmp_path, {"toolRetrieval": {"topN": 2, "retriever": "embedding"}})
    with pytest.raises(ManifestError, match=r"unknown retriever 'embedding': 'lexical' or"):
        Agent.from_manifest(path)


class NoParams(Tool):
    name = "ping"
    parameters = MappingProxyType({"type": "object", "properties": {}})

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return "pong"


class OneParam(Tool):
    name = "echo"
    parameters = MappingProxyType({"type": "object", "properties": {"n": {"type": "integer"}}})

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return args


def test_words_for_a_tool_without_parameters_are_explained() -> None:
    with pytest.raises(ToolArgumentsError, match=r"/ping takes no words here: give key=value"):
        parse_tool_args(NoParams(), "hello")
    with pytest.raises(ToolArgumentsError, match=r"/echo: 2 words for 1 parameter \['n'\]"):
        parse_tool_args(OneParam(), "1 2")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_the_client_says_it_cannot_connect_rather_than_a_broken_stream() -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    with Client(base) as client, pytest.raises(ApiError) as info:
        client.run("hi")
    assert info.value.code == "cannot_connect"
    assert "cannot connect to" in str(info.value)


@pytest.mark.anyio
async def test_the_async_client_says_it_cannot_connect() -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    async with AgentClient(base) as client:
        with pytest.raises(ApiError) as info:
            await client.run("hi", session_id="s")
    assert info.value.code == "cannot_connect"


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
