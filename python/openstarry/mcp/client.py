"""openstarry as an MCP client: remote servers' tools become the agent's (spec 004 section 1).

Each entry of the manifest's ``mcp.servers`` is a remote MCP server, spoken to
with the official MCP SDK over stdio (``command``) or Streamable HTTP (``url``).
Its tools join the agent's as ``<server>.<tool>`` with the remote description
and input schema, so a provider sees them like local tools::

    "mcp": {"servers": [
        {"name": "files", "command": ["python", "files_server.py"]},
        {"name": "peer", "url": "http://127.0.0.1:8700/mcp", "tools": ["relay"]}
    ]}

:class:`McpToolset` holds the connections of one agent; the
:class:`~openstarry.agent.runtime.Agent` enters it when it starts and leaves it
when it stops. What happens when:

- **Start.** Every server is connected at once, each within its ``timeout``
  (default: ``limits.toolTimeout``), and its tools listed. A server that cannot
  be reached then is handled by its ``tools`` key: with ``tools`` (the remote
  names, such as ``["relay"]``), the agent starts anyway, its tools exist from
  the start with an open schema, and the connection is made on their first
  call (so agents that call each other can start in any order); without
  ``tools`` nobody knows what the server offers, and the agent's start fails
  with :class:`McpConnectError` naming the server. A reachable server that
  lacks a tool its ``tools`` names also fails the start.
- **Each call** carries its trace (:mod:`openstarry.mcp.guard`): the depth is
  the calling run's ``context.call_depth`` + 1 and the trace id its
  ``context.trace_id``, in the request's ``params._meta`` on every transport and
  in the ``X-OpenStarry-Trace-ID`` / ``X-OpenStarry-Trace-Depth`` headers of
  that request over HTTP, with a ``traceparent`` whose parent is the call's
  ``openstarry.mcp.call`` span (while the SDK sends it, that span is
  OpenTelemetry's current one, so the SDK's own client span nests under it).
- **Failures** raise :class:`~openstarry.errors.ToolError`, which the loop
  feeds back as a failed ``EXEC:TOOL_RESULT``: ``REMOTE_ERROR`` for a result
  with ``isError: true`` or a JSON-RPC error, ``RECURSION_LIMIT`` when the
  remote refused the call for its depth, ``REMOTE_UNAVAILABLE`` when the
  server cannot be reached or dropped the connection, ``INVALID_RESULT`` for a
  result that does not follow the protocol. A hung server is cut off by the
  loop's tool timeout; the connection stays usable, and after
  :data:`MAX_ABANDONED_CALLS` abandoned calls in a row it is dropped. Messages
  and logs name an HTTP server by its URL without its password or query values.
- **Reconnects.** A connection that died (a stdio server that exited, an HTTP
  server that went away) is made again on the next call, restarting a stdio
  server; at most :data:`MAX_CONNECTS` connections per
  :data:`CONNECT_WINDOW` seconds per server, after which calls fail at once
  until the window frees up.

A stdio server runs in its entry's ``cwd`` (relative to the manifest's folder,
which is also the default) with a minimal environment (``PATH``, ``HOME`` and
the like, as the SDK passes on) plus its ``env``; its stderr is the agent's.

Each connection lives in a task of its own (the SDK's transports hold task
groups and cancel scopes that must be entered and left by one task); calls are
made from the calling tool's task, so a cancelled call never tears the
connection down. A server's tools are listed when the agent starts; a later
connection refreshes their descriptions and schemas, and a
``notifications/tools/list_changed`` from the server lists them again, adding
new ones: the agent's tools then change (the model's next round sees them).

On the 2026-07-28 protocol the changes come on a ``subscriptions/listen``
stream, over stdio and HTTP alike; an HTTP server's stream is renewed every
:data:`LISTEN_RENEW` seconds, so that it never keeps a server that is stopping
waiting for longer (see :mod:`openstarry.mcp.listchanges`). (On trio an HTTP server's
new tools still arrive with its next connection: the SDK leaves a cancelled
stream's async generators unclosed, which trio warns about at every renewal.)

A server that lists resources gets one more tool, ``<server>.read_resource``
(``{"uri": ...}``), which reads a resource of the server by its URI and
returns its text (or, for binary contents, the base64 blob); with a ``tools``
filter, only when it names ``read_resource``.

Bounds: :data:`MAX_TOOLS_PER_SERVER` tools per server, :data:`MAX_RESULT_CHARS`
characters of result per call (a longer text is cut, with a note saying so),
descriptions cut at :data:`MAX_DESCRIPTION_CHARS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc

from openstarry.agent.interfaces import Tool
from openstarry.errors import McpConnectError
from openstarry.manifest import McpServerConfig
from openstarry.mcp.connection import (
    CONNECT_WINDOW,
    MAX_ABANDONED_CALLS,
    MAX_CONNECTS,
    MAX_TOOLS_PER_SERVER,
    McpServerConnection,
)
from openstarry.mcp.listchanges import LISTEN_RENEW
from openstarry.mcp.proxies import (
    MAX_DESCRIPTION_CHARS,
    MAX_RESULT_CHARS,
    MAX_SCHEMA_CHARS,
    ReadResourceTool,
    RemoteTool,
)
from openstarry.mcp.transport import CLOSE_GRACE

__all__ = [
    "CONNECT_WINDOW",
    "LISTEN_RENEW",
    "MAX_ABANDONED_CALLS",
    "MAX_CONNECTS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_RESULT_CHARS",
    "MAX_SCHEMA_CHARS",
    "MAX_TOOLS_PER_SERVER",
    "McpConnectError",
    "McpServerConnection",
    "McpToolset",
    "ReadResourceTool",
    "RemoteTool",
]

log = logging.getLogger("openstarry.mcp")


class McpToolset:
    """The remote MCP servers of one agent, and their tools while it runs.

    A :class:`~openstarry.agent.interfaces.Toolset`: the agent enters it when
    it starts and leaves it when it stops.

    Enter it in the task that will leave it (the :class:`Agent` does, when it
    starts and stops); :attr:`tools` is then final. See the module's
    documentation for what happens to a server that cannot be reached.

    Args:
        servers: The manifest's ``mcp.servers``.
        default_timeout: Seconds to connect to a server whose entry gives no
            ``timeout`` (the agent passes ``limits.toolTimeout``).
        call_timeout: Seconds a call may take (the agent passes
            ``limits.toolTimeout``); ``None``: the HTTP read timeout alone.
        base_dir: What a relative ``cwd`` is relative to, and the ``cwd`` of a
            stdio server that gives none (the agent passes the manifest's folder);
            ``None``: the working directory.

    Raises:
        ValueError: two servers share a name.
    """

    def __init__(
        self,
        servers: Sequence[McpServerConfig],
        *,
        default_timeout: float = 30.0,
        call_timeout: float | None = None,
        base_dir: str | Path | None = None,
    ) -> None:
        self.connections: dict[str, McpServerConnection] = {}
        for config in servers:
            if config.name in self.connections:
                raise ValueError(f"two MCP servers are named {config.name!r}")
            if config.command is not None and base_dir is not None:
                cwd = Path(base_dir) / Path(config.cwd or ".").expanduser()
                config = config.model_copy(update={"cwd": str(cwd.resolve())})
            self.connections[config.name] = McpServerConnection(
                config, default_timeout=default_timeout, call_timeout=call_timeout
            )
        self._task_group: anyio.abc.TaskGroup | None = None
        #: Called when a server's tools changed while the toolset runs (the
        #: :class:`~openstarry.agent.runtime.Agent` sets it to take the new tools).
        self.on_change: Callable[[], None] | None = None
        for connection in self.connections.values():
            connection.on_tools_changed = self._changed

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    #: Named in the agent's errors about these tools (the manifest's field).
    origin = "mcp.servers"

    @property
    def running(self) -> bool:
        """Entered and not yet left: the connections' tasks are alive."""
        return self._task_group is not None

    @property
    def tools(self) -> dict[str, Tool]:
        """Every server's tools, by their agent-side names (``<server>.<tool>``)."""
        return {
            name: tool
            for connection in self.connections.values()
            for name, tool in connection.tools.items()
        }

    async def __aenter__(self) -> McpToolset:
        if self._task_group is not None:
            raise RuntimeError("this McpToolset is already running")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            for connection in self.connections.values():
                await task_group.start(connection.run)
            failures: dict[str, str] = {}

            async def connect(connection: McpServerConnection) -> None:
                try:
                    await connection.connect()
                except McpConnectError as exc:
                    failures[connection.name] = str(exc)

            async with anyio.create_task_group() as connecting:
                for connection in self.connections.values():
                    connecting.start_soon(connect, connection)
            problems: list[tuple[str, str]] = []
            for connection in self.connections.values():
                connection._started = True
                failure = failures.get(connection.name)
                if failure is None:
                    missing = [
                        tool.remote_name
                        for tool in connection.tools.values()
                        if isinstance(tool, RemoteTool)
                        and tool.remote_name not in connection.listed
                    ]
                    if missing:
                        problems.append(
                            (
                                connection.name,
                                f"MCP server {connection.name!r} has no tool(s) {missing} "
                                f"(it has: {', '.join(connection.listed) or 'none'})",
                            )
                        )
                elif connection.config.tools is None:
                    problems.append(
                        (
                            connection.name,
                            f"{failure}; give the server's 'tools' in the manifest to start "
                            "without it and connect on first use",
                        )
                    )
                else:
                    log.warning(
                        "%s; its tools %s are connected on first use",
                        failure,
                        ", ".join(connection.tools),
                    )
            if problems:
                raise McpConnectError(
                    "; ".join(message for _, message in problems), server=problems[0][0]
                )
        except BaseException:
            await self.aclose(cancel=True)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose(cancel=exc_type is not None)

    async def aclose(self, *, cancel: bool = False) -> None:
        """Close every connection (stdio servers are stopped); the tools fail from then on.

        Args:
            cancel: Cut the connections off at once rather than close them in
                order (when leaving on an error).
        """
        task_group, self._task_group = self._task_group, None
        if task_group is None:
            return
        for connection in self.connections.values():
            connection.close()
        try:
            if not cancel:
                with anyio.move_on_after(CLOSE_GRACE + 1.0):
                    for connection in self.connections.values():
                        await connection.wait_closed()
        finally:
            # Also when the caller is cancelled meanwhile (an agent left inside a
            # cancelled scope): a task group never left corrupts the caller's
            # cancel scopes and keeps the connections' tasks, and stdio servers, alive.
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
