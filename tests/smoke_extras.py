"""Smoke test of the wheel with its extras: ``pip install 'openstarry[http,mcp,cli,otel]'``.

Run by ``make test`` with the python of a fresh virtual environment that holds
the wheel and what its extras bring, nothing else (no test tools), so a
dependency missing from ``[http]``, ``[mcp]``, ``[cli]`` or ``[otel]`` fails here. It
serves the example agent with ``openstarry serve``, asks it over HTTP with the
shipped client and reads its console and ``/metrics``, then serves it with
``openstarry mcp`` over stdio and calls its tool with the MCP SDK's own client.
Every server is on 127.0.0.1 and stopped here.

    python tests/smoke_extras.py examples/weather-agent/agent.json
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio

ANSWER = "The weather in Taipei is 25°C, Sunny."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _openstarry() -> str:
    found = shutil.which("openstarry", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("smoke_extras: the openstarry command is not installed beside python")
    return found


def check_http(manifest: str) -> None:
    from openstarry.api.client import Client

    port = _free_port()
    server = subprocess.Popen(
        [_openstarry(), "serve", manifest, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    err = server.stderr.read().decode() if server.stderr else ""
                    message = f"smoke_extras: openstarry serve did not start:\n{err}"
                    raise SystemExit(message) from None
                time.sleep(0.1)
        with Client(base) as client:
            response = client.run("Query weather in Taipei", session_id="smoke")
        texts = [m.get_text_content() for m in response.output or [] if m.role == "assistant"]
        if response.status != "completed" or ANSWER not in texts:
            raise SystemExit(f"smoke_extras: unexpected answer {response.status}: {texts}")
        print(f"http: {response.status}, {len(response.output or [])} messages, {texts[-1]!r}")
        check_console(base)
    finally:
        server.terminate()
        server.wait(timeout=15)


def check_console(base: str) -> None:
    """The console's files came in the wheel, and /metrics speaks Prometheus."""
    import httpx

    for path, needle in (
        ("/", "console.js"),
        ("/console/console.js", "EventSource"),
        ("/console/console.css", "--p0"),
        ("/metrics", "openstarry_tool_calls_total"),
    ):
        reply = httpx.get(base + path, timeout=10)
        if reply.status_code != 200 or needle not in reply.text:
            raise SystemExit(f"smoke_extras: GET {path}: {reply.status_code}, no {needle!r}")
    print("console: /, its script and style, /metrics")


def check_otel() -> None:
    """The [otel] extra brings what openstarry.otel imports."""
    import openstarry.otel  # noqa: F401

    print("otel: openstarry.otel imports")


async def check_mcp(manifest: str) -> None:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=_openstarry(), args=["mcp", manifest], env=dict(os.environ)
    )
    with anyio.fail_after(60):
        async with Client(stdio_client(params)) as client:
            listed = await client.list_tools()
            names = sorted(tool.name for tool in listed.tools)
            if names != ["fs.read", "get_weather"]:
                raise SystemExit(f"smoke_extras: unexpected tools {names}")
            result = await client.call_tool("get_weather", {"location": "Taipei"})
            text = "".join(getattr(block, "text", "") for block in result.content)
            if result.is_error or "25°C, Sunny" not in text:
                raise SystemExit(f"smoke_extras: unexpected tool result {result}")
    print(f"mcp: tools {names}, get_weather -> {text[:60]!r}")


def check_cli() -> None:
    """The terminal prompt's module imports, and its printer renders an answer."""
    import io

    from rich.console import Console

    from openstarry.core import Event
    from openstarry.terminal import RichPrinter

    out = io.StringIO()
    printer = RichPrinter(Console(file=out, width=80))
    printer(Event.new("OUTPUT:AGENT_MESSAGE", {"text": ANSWER}, source="t", session_id="s"))
    if ANSWER not in out.getvalue():
        raise SystemExit(f"smoke_extras: the [cli] printer wrote {out.getvalue()!r}")
    print("cli: the terminal printer renders Markdown")


def main() -> None:
    manifest = sys.argv[1]
    check_cli()
    check_http(manifest)
    check_otel()
    anyio.run(check_mcp, manifest)
    print("smoke_extras: ok")


if __name__ == "__main__":
    main()
