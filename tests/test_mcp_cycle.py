"""Agents in separate processes calling each other in a cycle until the recursion guard trips.

Agents A and B run as ``openstarry mcp MANIFEST --http --port N`` on 127.0.0.1.
Each names the other as its MCP server ``peer`` and has the tool ``relay``
(``mcp_fixtures.cycle_tools``), which calls ``peer.relay`` with its own
context, so every hop carries the depth of the call it serves + 1. A third
agent, C, runs in the test and makes the first call. C -> A.relay is depth 1,
A -> B 2, B -> A 3, A -> B 4, B -> A 5, and A -> B at depth 6 is refused by B;
the refusal travels back down the chain to C as a tool error.

A starts first, while B is not up yet: A's manifest names the peer's tools
(``"tools": ["relay", "whoami"]``), so A starts without the connection and
makes it on its first call. B starts once A serves, and connects at once.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")
pytest.importorskip("uvicorn", reason="openstarry mcp --http needs uvicorn")

from openstarry import Agent
from openstarry.agent.loop import LoopLimits
from openstarry.assembly import mcp_toolset
from openstarry.core import Event
from openstarry.manifest import McpServerConfig
from openstarry.testing import ScriptedProvider, text, tool_call

TESTS = Path(__file__).resolve().parent
#: A bound on any one wait, so a hang fails the test instead of stalling it.
HANG = 30.0
_ANNOUNCE = re.compile(r"serving \S+ on (http://\S+)")
_REFUSAL = "call depth 6 exceeds the limit of 5"


@dataclass
class AgentProcess:
    """An ``openstarry mcp --http`` process: its URL, and what it wrote to stderr so far."""

    name: str
    process: subprocess.Popen[bytes]
    url: str = ""
    stderr: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "".join(self.stderr)

    async def logged(self, text: str) -> str:
        """The log once it holds ``text``: a thread reads stderr, so a line can lag the reply."""
        with anyio.move_on_after(HANG):
            while text not in self.log():
                await anyio.sleep(0.01)
        return self.log()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_manifest(folder: Path, name: str, peer_url: str) -> Path:
    manifest = folder / f"{name}.json"
    tools = ["mcp_fixtures.cycle_tools:relay", "mcp_fixtures.cycle_tools:whoami"]
    peer = {"name": "peer", "url": peer_url, "tools": ["relay", "whoami"], "timeout": 5}
    manifest.write_text(
        json.dumps(
            {
                "identity": {"name": name, "version": "1.0.0"},
                "tools": tools,
                "limits": {"toolTimeout": 15},
                "mcp": {
                    "servers": [peer],
                    "expose_tools": tools,
                },
            }
        ),
        encoding="utf-8",
    )
    return manifest


@contextmanager
def serve(name: str, manifest: Path, port: int) -> Iterator[AgentProcess]:
    """``openstarry mcp MANIFEST --http --port PORT``, once it has said where it serves."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "openstarry.cli", "mcp", str(manifest), "--http"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    agent = AgentProcess(name, process)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode("utf-8", "replace")
            agent.stderr.append(line)
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while not agent.url:
            line = lines.get(timeout=HANG)
            if line is None:
                raise RuntimeError(f"agent {name} exited: {agent.log()}")
            match = _ANNOUNCE.search(line)
            if match:
                agent.url = match.group(1)
        yield agent
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=HANG)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=HANG)
        reader.join(timeout=HANG)
        if process.stderr is not None:
            process.stderr.close()


@pytest.fixture(scope="module")
def cycle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    """Agents A and B, each the other's ``peer``; A started first, before B could answer."""
    folder = tmp_path_factory.mktemp("cycle")
    port_b = free_port()
    manifest_a = write_manifest(folder, "cycle-a", f"http://127.0.0.1:{port_b}/mcp")
    with serve("A", manifest_a, 0) as a:
        manifest_b = write_manifest(folder, "cycle-b", a.url)
        with serve("B", manifest_b, port_b) as b:
            yield a, b
            assert a.process.poll() is None, a.log()
            assert b.process.poll() is None, b.log()


def results(agent: Agent) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def record(event: Event) -> None:
        seen.append(event.payload)

    agent.bus.subscribe("EXEC:TOOL_RESULT", record)
    return seen


@pytest.mark.anyio
async def test_a_call_cycle_stops_at_depth_6_and_every_agent_stays_responsive(
    cycle: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = cycle
    # A could not reach B when it started: it started without the connection.
    assert "its tools peer.relay, peer.whoami are connected on first use" in a.log()
    assert "connected on first use" not in b.log()
    provider = ScriptedProvider(
        [
            tool_call("a.relay", {"note": "round and round"}),
            text("the cycle was stopped"),
            tool_call("a.whoami", {}),
            text("A answered"),
            tool_call("b.whoami", {}),
            text("B answered"),
            tool_call("b.relay", {"note": "the other way round"}),
            text("stopped again"),
            text("C answered"),
        ]
    )
    servers = [
        McpServerConfig(name="a", url=a.url, timeout=10),
        McpServerConfig(name="b", url=b.url, timeout=10),
    ]
    c = Agent(
        provider,
        name="cycle-c",
        toolsets=[mcp_toolset(servers, tool_timeout=25)],
        limits=LoopLimits(tool_timeout=25),
    )
    with anyio.fail_after(HANG * 2):
        async with c:
            seen = results(c)

            stopped = await c.ask("start the cycle")
            await c.bus.wait_idle()
            assert stopped.error is None
            assert stopped.replies == ["the cycle was stopped"]
            failure = seen[0]
            assert failure["name"] == "a.relay"
            assert failure["success"] is False
            assert failure["error"]["code"] == "RECURSION_LIMIT"
            message = failure["error"]["message"]
            assert _REFUSAL in message
            # The refusal names the trace of C's run: one trace id crossed every hop.
            assert f"(trace {stopped.trace_id})" in message
            # B refused the sixth hop (A -> B), and logged it; A refused nothing of this trace.
            refusal = f"{_REFUSAL} (trace {stopped.trace_id})"
            assert refusal in await b.logged(refusal)
            assert refusal not in a.log()

            # Each agent answers a fresh request, in a trace of its own, at depth 1.
            for name, agent_name, reply in (("a", "cycle-a", "A"), ("b", "cycle-b", "B")):
                fresh = await c.ask(f"who is {name}")
                await c.bus.wait_idle()
                assert fresh.error is None
                assert fresh.replies == [f"{reply} answered"]
                answer = seen[-1]
                assert answer["success"] is True, answer
                assert answer["result"] == {
                    "agent": agent_name,
                    "callDepth": 1,
                    "traceId": fresh.trace_id,
                }

            # The cycle the other way round is stopped too, by A this time.
            again = await c.ask("start it from B")
            await c.bus.wait_idle()
            assert again.replies == ["stopped again"]
            assert seen[-1]["error"]["code"] == "RECURSION_LIMIT"
            assert f"{_REFUSAL} (trace {again.trace_id})" in seen[-1]["error"]["message"]
            assert f"{_REFUSAL} (trace {again.trace_id})" in await a.logged(
                f"{_REFUSAL} (trace {again.trace_id})"
            )
            assert f"{_REFUSAL} (trace {again.trace_id})" not in b.log()

            # And C, the first caller, answers its next input.
            last = await c.ask("anything else?")
            assert last.replies == ["C answered"]
