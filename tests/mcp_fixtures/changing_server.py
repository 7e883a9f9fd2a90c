"""An MCP server (the official SDK's) whose tool list changes, and which has a resource.

    python changing_server.py             # over stdio
    python changing_server.py http PORT   # over Streamable HTTP on 127.0.0.1:PORT

``grow`` adds the tool ``grown`` and sends ``notifications/tools/list_changed``;
the resource ``fixture://greeting`` reads ``hello from the fixture``.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("changing-fixture", version="0.1.0")


def grown(text: str) -> str:
    """A tool that exists once grow has run."""
    return f"grown: {text}"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool grown, and tell the client its tool list changed."""
    server.add_tool(grown)
    await ctx.notify_tools_changed()  # 2026-07-28: to subscriptions/listen streams
    await ctx.session.send_tool_list_changed()  # the handshake era: a notification
    return "grew"


@server.resource("fixture://greeting")
def greeting() -> str:
    """A greeting."""
    return "hello from the fixture"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
