"""Inter-agent MCP (spec 004): an agent as an MCP server and client, and the recursion guard.

The protocol and its transports are the official MCP SDK's, an optional
extra: ``pip install 'openstarry[mcp]'``. Importing this package always works
and gives the recursion guard of :mod:`openstarry.mcp.guard` (standard library
only: the trace headers and ``_meta`` keys, :data:`MAX_DEPTH`,
:func:`check_depth`, :func:`next_hop`), so code that only carries traces needs
no SDK. The other names load the SDK on first use: the server's
(:func:`create_server`, :func:`serve`, ... from :mod:`openstarry.mcp.server`)
and the client's (:class:`McpToolset`, :class:`RemoteTool`, ... from
:mod:`openstarry.mcp.client`). Without the SDK they raise an
:class:`ImportError` that says ``pip install 'openstarry[mcp]'``, as does
importing either module.

    from openstarry.mcp import serve_stdio

    async with agent_from_manifest("agent.json") as agent:  # openstarry.assembly
        await serve_stdio(agent)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from openstarry.errors import McpConnectError
from openstarry.mcp.guard import (
    DEPTH_HEADER,
    MAX_DEPTH,
    META_DEPTH,
    META_TRACE,
    RECURSION_LIMIT_EXCEEDED,
    TRACE_HEADER,
    TraceContext,
    check_depth,
    next_hop,
    trace_from_headers,
    trace_from_meta,
)

if TYPE_CHECKING:
    from openstarry.mcp.client import (
        McpServerConnection,
        McpToolset,
        RemoteTool,
    )
    from openstarry.mcp.server import (
        DEFAULT_MAX_CALLS,
        SERVER_BUSY,
        AgentMcpServer,
        create_http_app,
        create_server,
        serve,
        serve_http,
        serve_stdio,
    )

__all__ = [
    "DEFAULT_MAX_CALLS",
    "DEPTH_HEADER",
    "MAX_DEPTH",
    "META_DEPTH",
    "META_TRACE",
    "RECURSION_LIMIT_EXCEEDED",
    "SERVER_BUSY",
    "TRACE_HEADER",
    "AgentMcpServer",
    "McpConnectError",
    "McpServerConnection",
    "McpToolset",
    "RemoteTool",
    "TraceContext",
    "check_depth",
    "create_http_app",
    "create_server",
    "next_hop",
    "serve",
    "serve_http",
    "serve_stdio",
    "trace_from_headers",
    "trace_from_meta",
]

#: The names that need the SDK, by the module that defines them.
_LAZY = {
    "DEFAULT_MAX_CALLS": "openstarry.mcp.server",
    "SERVER_BUSY": "openstarry.mcp.server",
    "AgentMcpServer": "openstarry.mcp.server",
    "create_http_app": "openstarry.mcp.server",
    "create_server": "openstarry.mcp.server",
    "serve": "openstarry.mcp.server",
    "serve_http": "openstarry.mcp.server",
    "serve_stdio": "openstarry.mcp.server",
    "McpServerConnection": "openstarry.mcp.client",
    "McpToolset": "openstarry.mcp.client",
    "RemoteTool": "openstarry.mcp.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'openstarry.mcp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)  # ImportError names the extra
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
