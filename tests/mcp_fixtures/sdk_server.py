"""An MCP server written with the official SDK's own server API, for openstarry's client tests.

    python sdk_server.py stdio
    python sdk_server.py http PORT

Its tools: ``echo`` (text back), ``add`` (structured), ``trace`` (what trace the
request carried: the openstarry ``_meta`` keys and HTTP headers), ``fail`` (an
``isError`` result), ``refuse`` (a JSON-RPC error, as a recursion guard sends),
``hang`` (never answers), ``die`` (the process exits mid-call), ``big`` (a long
text), ``pid`` (the server's process id, to tell a restarted server).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

server = MCPServer("sdk-fixture", version="1.2.3")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@server.tool()
def trace(ctx: Context) -> dict[str, Any]:
    """The openstarry trace this request carried (its _meta and HTTP headers)."""
    request_context = ctx.request_context
    meta = dict(request_context.meta or {})
    headers: dict[str, str] = {}
    request = request_context.request
    if request is not None:
        headers = {
            key.lower(): value
            for key, value in request.headers.items()
            if key.lower().startswith("x-openstarry-") or key.lower() == "traceparent"
        }
    return {
        "meta": {
            k: v for k, v in meta.items() if k.startswith("openstarry/") or k == "traceparent"
        },
        "headers": headers,
        "pid": os.getpid(),
    }


@server.tool()
def fail(message: str) -> str:
    """Fail with the message."""
    raise ToolError(message)


@server.tool()
def refuse() -> str:
    """Answer with a JSON-RPC error, as a recursion guard does."""
    raise MCPError(code=-32600, message="call depth 6 exceeds the limit of 5 (trace t): refused")


@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
def die() -> str:
    """Exit the server process mid-call."""
    os._exit(3)


@server.tool()
def big(size: int) -> str:
    """A text of ``size`` characters."""
    return "x" * size


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
