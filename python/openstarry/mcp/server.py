"""An agent as an MCP server (spec 004): its exposed tools over stdio or Streamable HTTP.

    openstarry mcp agent.json                        # stdio: a client starts the process
    openstarry mcp agent.json --http --port 8765     # Streamable HTTP on http://127.0.0.1:8765/mcp

In Python, with the agent running::

    async with agent_from_manifest("agent.json") as agent:  # openstarry.assembly
        server = create_server(agent)          # the SDK's lowlevel Server
        await serve_stdio(agent)               # or serve_http(agent, port=8765)

The protocol and its transports are the official MCP SDK's (``pip install
'openstarry[mcp]'``); openstarry adds:

- **Exposure.** ``tools/list`` lists exactly the tools named in the manifest's
  ``mcp.expose_tools`` that the agent has (remote ``server.tool`` names
  included), never one in ``mcp.private_tools``, each with its JSON Schema.
  ``tools/call`` of any other name (private, unexposed or unknown alike, so
  a client cannot probe for private tools) is refused with the JSON-RPC error
  ``-32602`` (``Unknown tool``, as the MCP specification asks) and runs nothing.
- **The bus.** An accepted call enters the agent as an ``EXEC:TOOL_CALL`` event
  (:meth:`ExecutionLoop.call_tool <openstarry.agent.loop.ExecutionLoop.call_tool>`):
  traced, de-duplicated, validated and timed out like a provider's call. Its
  outcome becomes the MCP result: on success one text block (the result, or
  its JSON when it is not a string) plus ``structuredContent`` when the
  result is a JSON object; on failure ``isError: true`` with the failure's
  message, its code under ``_meta["openstarry/error"]``.
- **The recursion guard** (:mod:`openstarry.mcp.guard`). A call's trace comes
  from the HTTP headers ``X-OpenStarry-Trace-ID`` / ``X-OpenStarry-Trace-Depth``
  or from ``params._meta`` (``openstarry/traceId``, ``openstarry/depth``); when
  both carry one, the deeper wins. A call without a trace starts a new one at
  depth 1. A call deeper than :data:`~openstarry.mcp.guard.MAX_DEPTH` is refused
  with the JSON-RPC error :data:`RECURSION_LIMIT_EXCEEDED` (``-32050``) and a
  ``KERNEL:ERROR`` (code ``RECURSION_LIMIT``) on the agent's bus, and runs
  nothing; the tool of an accepted call runs with ``context.call_depth`` set to
  the call's depth, so the calls it makes in turn carry depth + 1. A malformed
  trace is refused with ``-32602``.
- **Limits.** At most ``max_calls`` calls run at once; one more is refused with
  :data:`SERVER_BUSY` (``-32051``) rather than queued without bound.
- **Resources** (:mod:`openstarry.mcp.resources`): ``resources/list``,
  ``resources/templates/list`` and ``resources/read`` serve the manifest's
  ``mcp.expose_resources``, never a ``mcp.private_resources`` path; an
  unknown or private URI is answered with :data:`RESOURCE_NOT_FOUND`.
- **Live lists.** ``initialize`` declares ``tools.listChanged`` and
  ``resources.listChanged``. When the agent's tools change while it runs
  (``agent.loop.tools = ...``, which publishes ``KERNEL:TOOLS_CHANGED``), every
  client connected sends ``notifications/tools/list_changed``; when the
  exposed files change (one appears in an exposed folder, one goes away),
  ``notifications/resources/list_changed`` (the files are looked at every
  ``resource_poll`` seconds while the server runs over stdio or
  :func:`serve_http`). A client is known once it has made a request. On the
  2026-07-28 protocol the same changes go to the clients'
  ``subscriptions/listen`` streams; :func:`serve_http` ends those streams
  (their graceful close) as soon as it is told to stop, since the server
  waits for every open response before it stops (a server of your own around
  :meth:`AgentMcpServer.http_app` calls :meth:`AgentMcpServer.close_listen_streams`).

Over stdio nothing but protocol reaches stdout: logs go to stderr, and while
serving the SDK points file descriptor 1 at stderr so a stray ``print`` cannot
corrupt the stream. A line that is not JSON is answered with ``-32700`` (Parse
error) and a JSON value that is not a JSON-RPC message with ``-32600``
(Invalid Request), both with ``id: null``; the connection stays open. When
the client closes stdin, the requests still running are answered before the
process exits.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

try:
    from mcp.server.lowlevel import Server
    from opentelemetry import trace as otel_trace  # a dependency of the SDK
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "openstarry.mcp needs the MCP SDK, which is not installed: "
        f"pip install 'openstarry[mcp]' ({exc})"
    ) from exc

from openstarry._http import listen
from openstarry.errors import ManifestError, McpConnectError
from openstarry.mcp.dispatch import (
    DEFAULT_MAX_CALLS,
    DEFAULT_RESOURCE_POLL,
    MAX_SESSIONS,
    RESOURCE_NOT_FOUND,
    SERVER_BUSY,
    SESSION_IDLE_TIMEOUT,
    TOOLS_CHANGED,
    AgentMcpServer,
)
from openstarry.mcp.guard import RECURSION_LIMIT_EXCEEDED

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from openstarry.agent.runtime import Agent

__all__ = [
    "DEFAULT_MAX_CALLS",
    "DEFAULT_RESOURCE_POLL",
    "MAX_SESSIONS",
    "RECURSION_LIMIT_EXCEEDED",
    "RESOURCE_NOT_FOUND",
    "TOOLS_CHANGED",
    "SERVER_BUSY",
    "SESSION_IDLE_TIMEOUT",
    "AgentMcpServer",
    "create_http_app",
    "create_server",
    "serve",
    "serve_http",
    "serve_stdio",
]


def create_server(
    agent: Agent,
    *,
    expose: Sequence[str] | None = None,
    private: Sequence[str] | None = None,
    max_calls: int = DEFAULT_MAX_CALLS,
) -> Server[Any]:
    """The SDK's lowlevel ``Server`` for ``agent``'s exposed tools (see :class:`AgentMcpServer`).

    The agent must be running (``async with agent:``) while the server serves.
    """
    return AgentMcpServer(agent, expose=expose, private=private, max_calls=max_calls).server


def create_http_app(
    agent: Agent,
    *,
    host: str = "127.0.0.1",
    path: str = "/mcp",
    json_response: bool = False,
    max_calls: int = DEFAULT_MAX_CALLS,
) -> Starlette:
    """A Streamable HTTP ASGI app serving ``agent`` at ``path``.

    See :meth:`AgentMcpServer.http_app`.
    """
    return AgentMcpServer(agent, max_calls=max_calls).http_app(
        host=host, path=path, json_response=json_response
    )


async def serve_stdio(agent: Agent) -> None:
    """Serve the running ``agent`` over stdin and stdout until the client closes stdin."""
    await AgentMcpServer(agent).run_stdio()


async def serve_http(
    agent: Agent,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    sock: socket.socket | None = None,
    announce: bool = True,
    api_key: str | None = None,
) -> None:
    """Serve the running ``agent`` over Streamable HTTP until interrupted (asyncio only).

    ``port`` 0 picks a free port; ``sock``, a socket already listening, is
    used instead of binding ``host``:``port`` (``host`` still decides the
    allowed ``Host`` headers). With ``announce``, a line ``openstarry mcp:
    serving NAME on http://HOST:PORT/mcp`` goes to stderr once the socket is
    bound, before any request is accepted.

    Raises:
        OSError: ``host``:``port`` cannot be bound.
    """
    import uvicorn

    mcp_server = AgentMcpServer(agent)
    app = mcp_server.http_app(host=host, path=path, api_key=api_key)
    listening = sock if sock is not None else listen(host, port)
    try:
        if announce:
            bound = listening.getsockname()[1]
            shown = f"[{host}]" if listening.family == socket.AF_INET6 else host
            print(
                f"openstarry mcp: serving {agent.name} on http://{shown}:{bound}{path}",
                file=sys.stderr,
                flush=True,
            )
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)

        class Server(uvicorn.Server):
            async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
                # uvicorn waits for every response to end: the listen streams first.
                mcp_server.close_listen_streams()
                await super().shutdown(sockets)
                # uvicorn then raises the signal again, which ends the process
                # before any finally: the spans still waiting go out now (--otel).
                flush = getattr(otel_trace.get_tracer_provider(), "force_flush", None)
                if flush is not None:
                    flush()

        async with anyio.create_task_group() as watching:
            watching.start_soon(mcp_server.watch_resources)
            await Server(config).serve(sockets=[listening])
            watching.cancel_scope.cancel()
    finally:
        if sock is None:
            listening.close()


def serve(
    agent: Agent,
    *,
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = 8765,
    api_key: str | None = None,
) -> int:
    """``openstarry mcp``: serve ``agent`` over stdio, or HTTP with ``http``.

    The agent (:func:`openstarry.assembly.agent_from_manifest` builds one from
    an ``agent.json``) is started and stopped here. Returns the exit status: 0
    when the client closed the connection (stdio), 1 when the HTTP address
    cannot be bound or a server of ``mcp.servers`` cannot be used, 2 for a bad
    manifest (a remote tool named like a local one), 130 when interrupted. Over
    HTTP, SIGINT or SIGTERM shuts down gracefully (requests in progress end, the
    agent stops), after which the signal ends the process, as uvicorn does.
    """
    sock = None
    if http:
        try:
            sock = listen(host, port)
        except (OSError, OverflowError) as exc:
            print(f"openstarry mcp: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
            return 1

    async def run() -> None:
        async with agent:
            if sock is not None:
                await serve_http(agent, host=host, sock=sock, api_key=api_key)
            else:
                await serve_stdio(agent)

    try:
        anyio.run(run, backend="asyncio")
    except ManifestError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    except McpConnectError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if sock is not None:
            sock.close()
    return 0
