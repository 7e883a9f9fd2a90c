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
waiting for longer (see :func:`_listen_changes`). (On trio an HTTP server's
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

import contextvars
import json
import logging
import math
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import anyio
import anyio.abc
import anyio.lowlevel
from pydantic import ValidationError

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.bus import describe_exception
from openstarry.core import __version__
from openstarry.errors import McpConnectError, ToolError
from openstarry.manifest import McpServerConfig
from openstarry.mcp.guard import (
    MAX_DEPTH,
    RECURSION_LIMIT_EXCEEDED,
    TraceContext,
    next_hop,
    w3c_trace_id,
)

try:
    import httpx2
    import mcp_types
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp.types.version import MODERN_PROTOCOL_VERSIONS
    from opentelemetry import context as otel_context  # a dependency of the SDK
    from opentelemetry import trace as otel_trace
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("openstarry.mcp needs the MCP SDK: pip install 'openstarry[mcp]'") from exc

__all__ = [
    "CONNECT_WINDOW",
    "MAX_ABANDONED_CALLS",
    "MAX_CONNECTS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_RESULT_CHARS",
    "MAX_TOOLS_PER_SERVER",
    "McpConnectError",
    "McpServerConnection",
    "McpToolset",
    "RemoteTool",
]

log = logging.getLogger("openstarry.mcp")


class _OneLineParseErrors(logging.Filter):
    """The SDK logs a stdio server's non-JSON-RPC stdout line with a full traceback; say it in
    one line instead, with the line itself (cut), which is what the user needs to see."""

    _SDK_MESSAGE = "Failed to parse JSONRPC message from server"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self._SDK_MESSAGE and record.exc_info:
            exc = record.exc_info[1]
            errors = getattr(exc, "errors", None)
            try:
                line = errors()[0].get("input") if callable(errors) else None
            except Exception:
                line = None
            shown = repr(line)[:200] if line is not None else str(exc).partition("\n")[0][:200]
            record.msg = (
                "an MCP server wrote a line that is not JSON-RPC to its stdout "
                "(only protocol may go there; logs belong on stderr): %s"
            )
            record.args = (shown,)
            record.exc_info = None
            record.exc_text = None
        return True


_sdk_stdio_log = logging.getLogger("mcp.client.stdio")
if not any(isinstance(f, _OneLineParseErrors) for f in _sdk_stdio_log.filters):
    _sdk_stdio_log.addFilter(_OneLineParseErrors())

#: Characters of a call's result that reach the agent; past it the text is cut.
MAX_RESULT_CHARS = 1 << 20
#: Tools one server may contribute (after the ``tools`` filter).
MAX_TOOLS_PER_SERVER = 128
#: Characters of a remote tool's description that are kept.
MAX_DESCRIPTION_CHARS = 8192
#: Characters of a remote tool's input schema (as JSON) that are accepted.
MAX_SCHEMA_CHARS = 64 * 1024
#: Connections (stdio: process starts) per server within :data:`CONNECT_WINDOW`.
MAX_CONNECTS = 10
#: Seconds over which :data:`MAX_CONNECTS` is counted.
CONNECT_WINDOW = 60.0
#: Calls in a row abandoned (timed out or stopped) after which the connection is made afresh.
MAX_ABANDONED_CALLS = 2
#: Seconds an HTTP server's ``subscriptions/listen`` stream is kept before a new
#: one replaces it: how long, at most, it keeps a server that is stopping waiting
#: (see :func:`_listen_changes`).
LISTEN_RENEW = 10.0

_MAX_LIST_PAGES = 100
#: Seconds before a listen stream that ended by itself is opened again.
_RELISTEN_PAUSE = 1.0
#: Characters of a remote JSON-RPC error message that are kept.
_MAX_ERROR_CHARS = 8192
_MAX_TOOL_NAME = 128
#: Seconds an HTTP response may go without a byte, at least; a connection whose
#: calls may take longer (``call_timeout``) waits that long plus :data:`_CLOSE_GRACE`.
_HTTP_READ_TIMEOUT = 300.0
#: Seconds a connection may take to close before it is cut off.
_CLOSE_GRACE = 5.0
#: How the protocol version is agreed: the SDK's ``"auto"`` tries the newest
#: revision and falls back to the ``initialize`` handshake of older servers.
_PROTOCOL_MODE = "auto"

#: The trace of the MCP call the current task is making; read by the HTTP request hook.
_CURRENT_TRACE: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "openstarry_mcp_trace", default=None
)


class RemoteTool(Tool):
    """A tool of a remote MCP server, run by calling it over its connection.

    Attributes:
        name: ``<server>.<tool>``.
        remote_name: The tool's name on its server.
        server: The server's name in the manifest.
        server_label: The same: the Agent API shows its calls as ``mcp_call``
            messages with this ``server_label``.
        requires_approval: The server's entry sets ``approval``: each call
            waits for a person's yes.
    """

    def __init__(
        self,
        connection: McpServerConnection,
        remote_name: str,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self._connection = connection
        self.server = self.server_label = connection.name
        self.requires_approval = connection.config.approval
        self.remote_name = remote_name
        self.name = f"{connection.name}.{remote_name}"
        self.description = description
        self.parameters = dict(parameters) if parameters is not None else _OPEN_SCHEMA

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        """Call the remote tool one hop deeper than ``context``'s run.

        Raises:
            ToolError: ``REMOTE_ERROR``, ``RECURSION_LIMIT``, ``REMOTE_UNAVAILABLE``
                or ``INVALID_RESULT``; see the module's documentation.
        """
        trace = next_hop(context.trace_id, context.call_depth)
        return await self._connection.call(self.remote_name, args, trace)


class ReadResourceTool(Tool):
    """``<server>.read_resource``: read a resource of a remote MCP server by its URI."""

    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"uri": {"type": "string", "description": "The resource's URI."}},
        "required": ["uri"],
    }

    def __init__(self, connection: McpServerConnection) -> None:
        self._connection = connection
        self.server = self.server_label = connection.name
        self.name = f"{connection.name}.read_resource"
        self.description = (
            f"Read a resource of the MCP server {connection.name!r} by its URI "
            "(as its resources/list names them)."
        )

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        """The resource's text (contents joined), or its base64 blob.

        Raises:
            ToolError: ``REMOTE_ERROR`` (unknown resource) or ``REMOTE_UNAVAILABLE``.
        """
        return await self._connection.read_resource(str(args["uri"]))


#: The schema of a tool known by name only (its server not reached yet).
_OPEN_SCHEMA: Mapping[str, Any] = {"type": "object", "additionalProperties": True}


class McpServerConnection:
    """One remote MCP server: its connection, owned by a task of its own, and its tools.

    Use it through :class:`McpToolset`. :meth:`call` may be called from any
    task while the toolset runs; it connects when there is no live connection.

    Args:
        config: The server's manifest entry; a relative ``cwd`` is relative to
            the working directory (:class:`McpToolset` resolves it against the
            manifest's folder first).
        default_timeout: Seconds to connect and list the tools when the entry
            gives no ``timeout``.
        call_timeout: Seconds a call may take (the agent's tool timeout, which
            cuts it off); an HTTP response is waited for at least this long.
    """

    def __init__(
        self,
        config: McpServerConfig,
        *,
        default_timeout: float,
        call_timeout: float | None = None,
    ) -> None:
        if not default_timeout > 0:
            raise ValueError(f"default_timeout must be positive, not {default_timeout}")
        self.config = config
        self.name = config.name
        self.timeout = config.timeout if config.timeout is not None else default_timeout
        # A response that takes longer than this fails the whole connection, so
        # it must not be shorter than the calls the agent lets run.
        self._read_timeout = max(_HTTP_READ_TIMEOUT, (call_timeout or 0.0) + _CLOSE_GRACE)
        #: The server's tools by their agent-side name, in the server's order.
        self.tools: dict[str, RemoteTool | ReadResourceTool] = {}
        #: The names the server listed on the last connection.
        self.listed: list[str] = []
        #: Connections made so far (stdio: processes started).
        self.connects = 0
        self._client: Client | None = None
        self._wake = anyio.Event()
        self._drop: anyio.Event | None = None
        self._attempt: anyio.Event | None = None
        self._scope: anyio.CancelScope | None = None
        self._error = "not connected yet"
        self._closing = False
        self._running = False
        self._stopped = anyio.Event()
        #: Set by a ``notifications/tools/list_changed``: the owner task lists again.
        self._refresh = anyio.Event()
        #: Called when the tools changed after the start (the toolset tells the agent).
        self.on_tools_changed: Callable[[], None] | None = None
        self._recent: deque[float] = deque()
        self._abandoned = 0
        #: Set once the agent has started: later listings refresh tools, never add them.
        self._started = False
        if config.tools is not None:
            for remote_name in config.tools:
                self._add_tool(remote_name)

    def __repr__(self) -> str:
        return f"<McpServerConnection {self.name!r} {self._where()!r}>"

    @property
    def connected(self) -> bool:
        """Whether a live connection is up."""
        return self._client is not None

    @property
    def last_error(self) -> str:
        """Why the last connection attempt failed, or ended."""
        return self._error

    # -- the owner task --------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The task that owns the connection: opens it on request, closes it when told.

        Runs until :meth:`close`; it may run again after that (the toolset
        entered again): each run starts with no connection and lists the tools anew.
        """
        self._closing = False
        self._wake = anyio.Event()
        self._stopped = anyio.Event()
        self._started = False
        self._running = True
        task_status.started()
        try:
            while not self._closing:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._closing:
                    break
                await self._connect_once()
        finally:
            self._running = False
            self._client = None
            if self._attempt is not None:
                self._attempt.set()
                self._attempt = None
            self._stopped.set()

    async def _connect_once(self) -> None:
        attempt = self._attempt
        drop = self._drop = anyio.Event()
        connected = False

        def settle() -> None:
            if attempt is not None:
                attempt.set()
            if self._attempt is attempt:
                self._attempt = None

        try:
            deadline = anyio.current_time() + self.timeout
            with anyio.CancelScope(deadline=deadline) as scope:
                self._scope = scope
                async with self._open(on_closed=lambda: self._closed_under_us(drop)) as client:
                    self._absorb(await self._list_tools(client))
                    resources = client.server_capabilities.resources
                    reader = f"{self.name}.read_resource"
                    wanted = self.config.tools is None or "read_resource" in self.config.tools
                    if (
                        resources is not None
                        and wanted
                        and reader not in self.tools
                        and not self._started
                        and await _has_resources(client)
                    ):
                        self.tools[reader] = ReadResourceTool(self)
                    scope.deadline = math.inf
                    connected = True
                    self.connects += 1
                    self._abandoned = 0
                    self._client = client
                    self._error = ""
                    settle()
                    await _serve_until(self, drop, client, scope)
            if not connected:
                self._error = (
                    "the connection was closed"
                    if self._closing
                    else f"no answer within {self.timeout:g} s"
                )
        except Exception as exc:
            if connected:
                log.warning("MCP server %r: the connection ended: %s", self.name, _describe(exc))
                self._error = f"the connection ended: {_describe(exc)}"
            elif _closed(exc):
                self._error = "the server closed the connection before it answered" + (
                    "" if self.config.url else " (the program exited; see its stderr)"
                )
            else:
                self._error = _describe(exc)
        finally:
            self._scope = None
            self._client = None
            settle()

    async def _on_message(self, message: Any) -> None:
        """The SDK's message handler: a tool list that changed is listed again."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._refresh.set()
        await anyio.lowlevel.checkpoint()

    async def read_resource(self, uri: str) -> str:
        """A resource of this server: its text contents joined, or the base64 blob.

        Raises:
            ToolError: ``REMOTE_ERROR`` (refused, unknown) or ``REMOTE_UNAVAILABLE``.
        """
        label = f"{self.name}.read_resource"
        try:
            client = await self._client_now()
            result = await client.read_resource(uri)
        except McpConnectError as exc:
            raise ToolError(f"{label}: {exc}", code="REMOTE_UNAVAILABLE") from None
        except MCPError as exc:
            raise ToolError(
                f"{label}: {uri}: {_cut(exc.error.message, _MAX_ERROR_CHARS)}",
                code="REMOTE_ERROR",
            ) from None
        parts = [
            str(getattr(item, "text", None) or getattr(item, "blob", ""))
            for item in result.contents
        ]
        return _cut("".join(parts), MAX_RESULT_CHARS)

    def _closed_under_us(self, drop: anyio.Event) -> None:
        """The server ended the connection ``drop`` belongs to (a stdio server exited)."""
        if drop is not self._drop or drop.is_set():
            return  # a connection that was already ending
        if self._client is not None:
            log.warning("MCP server %r closed the connection", self.name)
            self._error = "the server closed the connection"
        self._client = None
        drop.set()

    @asynccontextmanager
    async def _open(self, *, on_closed: Any) -> AsyncIterator[Client]:
        """The SDK client of this server, connected (over stdio or Streamable HTTP)."""
        config = self.config
        async with AsyncExitStack() as stack:
            transport: Any
            if config.url is not None:
                http = httpx2.AsyncClient(
                    timeout=httpx2.Timeout(self.timeout, read=self._read_timeout),
                    event_hooks={"request": [_add_trace_headers]},
                )
                await stack.enter_async_context(http)
                transport = streamable_http_client(config.url, http_client=http)
            else:
                command = config.command or []
                transport = stdio_client(
                    StdioServerParameters(
                        command=command[0],
                        args=list(command[1:]),
                        env=dict(config.env) or None,
                        cwd=config.cwd,
                    ),
                    errlog=_errlog(),
                )
            client = Client(
                _Watched(transport, on_closed),
                client_info=mcp_types.Implementation(name="openstarry", version=__version__),
                cache=None,
                mode=_PROTOCOL_MODE,
                message_handler=self._on_message,
            )
            yield await stack.enter_async_context(client)

    async def _list_tools(self, client: Client) -> list[mcp_types.Tool]:
        wanted = set(self.config.tools) if self.config.tools is not None else None
        found: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                if wanted is None or tool.name in wanted:
                    found.append(tool)
            if len(found) > MAX_TOOLS_PER_SERVER:
                raise McpConnectError(
                    f"MCP server {self.name!r} lists more than {MAX_TOOLS_PER_SERVER} tools; "
                    "name the ones the agent needs in its 'tools'",
                    server=self.name,
                )
            cursor = page.next_cursor
            if cursor is None:
                return found
        raise McpConnectError(
            f"MCP server {self.name!r} lists its tools in more than {_MAX_LIST_PAGES} pages",
            server=self.name,
        )

    def _absorb(self, listing: Iterable[mcp_types.Tool], *, grow: bool = False) -> None:
        """Make or refresh the tools from a listing (a known tool is updated in place).

        After the start only a ``grow`` listing (the server said its list
        changed) adds tools.
        """
        self.listed = []
        for remote in listing:
            problem = _bad_tool(remote)
            if problem is not None:
                log.warning("MCP server %r: tool %r skipped: %s", self.name, remote.name, problem)
                continue
            self.listed.append(remote.name)
            description = (remote.description or remote.title or "").strip()
            if len(description) > MAX_DESCRIPTION_CHARS:
                description = description[: MAX_DESCRIPTION_CHARS - 1] + "…"
            tool = self.tools.get(f"{self.name}.{remote.name}")
            if tool is None:
                if self._started and not grow:
                    continue  # a reconnect refreshes, a list_changed adds
                tool = self._add_tool(remote.name)
            tool.description = description
            tool.parameters = dict(remote.input_schema)

    def _add_tool(self, remote_name: str) -> RemoteTool:
        tool = RemoteTool(self, remote_name)
        self.tools[tool.name] = tool
        return tool

    # -- callers ---------------------------------------------------------

    async def connect(self) -> None:
        """Connect now unless connected (or have the attempt in progress finish).

        Raises:
            McpConnectError: the server cannot be reached, did not answer within
                the timeout, or refused; or too many connections were made lately.
        """
        await self._client_now()

    async def _client_now(self) -> Client:
        client = self._client
        if client is not None:
            return client
        if self._closing or not self._running:
            raise McpConnectError(
                f"MCP server {self.name!r} is not connected: the agent is not running",
                server=self.name,
            )
        attempt = self._attempt
        if attempt is None:
            now = anyio.current_time()
            recent = self._recent
            while recent and now - recent[0] > CONNECT_WINDOW:
                recent.popleft()
            if len(recent) >= MAX_CONNECTS:
                raise McpConnectError(
                    f"MCP server {self.name!r}: {len(recent)} connection attempts in the last "
                    f"{CONNECT_WINDOW:g} s; not trying again yet (last error: {self._error})",
                    server=self.name,
                )
            recent.append(now)
            attempt = self._attempt = anyio.Event()
            self._wake.set()
        await attempt.wait()
        client = self._client
        if client is None:
            raise McpConnectError(
                f"cannot connect to MCP server {self.name!r} ({self._where()}): "
                f"{self._error or 'the connection closed at once'}",
                server=self.name,
            )
        return client

    def _where(self) -> str:
        """Where the server is, for messages: its URL without credentials, or its command."""
        if self.config.url is not None:
            return _redacted(self.config.url)
        command = " ".join(self.config.command or ())
        return command if len(command) <= 200 else command[:197] + "..."

    async def call(self, remote_name: str, args: dict[str, Any], trace: TraceContext) -> Any:
        """Call a tool of this server with ``args``, carrying ``trace``; return its result.

        The result is the call's ``structuredContent`` when it has one, else its
        text (one string), else its content blocks as JSON objects.

        Raises:
            ToolError: see the module's documentation for the codes.
        """
        label = f"{self.name}.{remote_name}"
        try:
            client = await self._client_now()
        except McpConnectError as exc:
            raise ToolError(f"{label}: {exc}", code="REMOTE_UNAVAILABLE") from None
        if self.listed and remote_name not in self.listed:
            raise ToolError(
                f"{label}: MCP server {self.name!r} has no tool {remote_name!r} "
                f"(it has: {', '.join(self.listed)})",
                code="REMOTE_ERROR",
            )
        token = _CURRENT_TRACE.set(trace)
        span_token = _enter_span(trace)
        try:
            result = await client.call_tool(remote_name, args, meta=cast(Any, trace.meta()))
        except MCPError as exc:
            message = _cut(exc.error.message, _MAX_ERROR_CHARS)
            if exc.error.code == mcp_types.CONNECTION_CLOSED or _session_gone(exc):
                self._drop_client(client)
                raise ToolError(
                    f"{label}: MCP server {self.name!r} closed the connection during the call "
                    f"({self._error or message}); it is connected again on the next call",
                    code="REMOTE_UNAVAILABLE",
                ) from None
            refused = exc.error.code == RECURSION_LIMIT_EXCEEDED or _is_depth_refusal(message)
            code = "RECURSION_LIMIT" if refused else "REMOTE_ERROR"
            raise ToolError(
                f"{label}: the MCP server refused the call: {message} (JSON-RPC error "
                f"{exc.error.code})",
                code=code,
            ) from None
        except ValidationError as exc:
            raise ToolError(
                f"{label}: the MCP server's result does not follow the protocol: "
                f"{exc.error_count()} error(s), first: {exc.errors()[0]['msg']}",
                code="INVALID_RESULT",
            ) from None
        except anyio.get_cancelled_exc_class():
            self._abandoned += 1
            if self._abandoned >= MAX_ABANDONED_CALLS:
                log.warning(
                    "MCP server %r: %d calls in a row abandoned; connecting afresh",
                    self.name,
                    self._abandoned,
                )
                self._error = f"{self._abandoned} calls in a row were abandoned"
                self._drop_client(client)
            raise
        except Exception as exc:
            # The transport failed (the HTTP server went away, a broken pipe).
            self._drop_client(client)
            raise ToolError(
                f"{label}: the connection to MCP server {self.name!r} failed: {_describe(exc)}",
                code="REMOTE_UNAVAILABLE",
            ) from None
        finally:
            if span_token is not None:
                otel_context.detach(span_token)
            _CURRENT_TRACE.reset(token)
        self._abandoned = 0
        return _result_value(result, label)

    def _drop_client(self, client: Client) -> None:
        """End ``client``'s connection (the next call connects afresh), unless already replaced."""
        if self._client is client:
            self._client = None
            if self._drop is not None:
                self._drop.set()

    def close(self) -> None:
        """Ask the owner task to close the connection and end; :meth:`wait_closed` waits for it."""
        self._closing = True
        self._client = None
        if self._drop is not None:
            self._drop.set()
        if self._scope is not None and not math.isinf(self._scope.deadline):
            self._scope.cancel()  # an attempt in progress
        self._wake.set()

    async def wait_closed(self) -> None:
        """Wait until the owner task has ended (at once when it never ran)."""
        if self._running:
            await self._stopped.wait()


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
                with anyio.move_on_after(_CLOSE_GRACE + 1.0):
                    for connection in self.connections.values():
                        await connection.wait_closed()
        finally:
            # Also when the caller is cancelled meanwhile (an agent left inside a
            # cancelled scope): a task group never left corrupts the caller's
            # cancel scopes and keeps the connections' tasks, and stdio servers, alive.
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)


async def _serve_until(
    conn: McpServerConnection, drop: anyio.Event, client: Client, scope: anyio.CancelScope
) -> None:
    """Hold the connection until ``drop``; list the tools again when the server says so."""
    async with anyio.create_task_group() as listening:
        listening.start_soon(_listen_changes, conn, client)
        await _refresh_until(conn, drop, client)
        # Closing is bounded too (an HTTP server that hangs would hold the
        # session's DELETE, or a listen stream); a stdio server's shutdown
        # is shielded by the SDK and bounded on its own.
        scope.deadline = anyio.current_time() + _CLOSE_GRACE
        listening.cancel_scope.cancel()


async def _listen_changes(conn: McpServerConnection, client: Client) -> None:
    """On the 2026-07-28 protocol a change arrives on a ``subscriptions/listen`` stream.

    Over HTTP the stream is renewed every :data:`LISTEN_RENEW` seconds, the new
    one acknowledged before the old one is closed, so no change falls between
    them. Why: told to stop (SIGTERM), a server on the SDK's Streamable HTTP
    transport and uvicorn waits until every response has ended, and the SDK's
    listen responses do not end by themselves then (its older GET streams do,
    through sse-starlette), so one listen stream held for ever would keep such
    a server from stopping until it is killed (measured with mcp 2.3.0 and
    uvicorn 0.54; closing the stream from this side, on cancel, is clean and
    immediate). A stopping server refuses the new stream's connection: the old
    one is then closed at once, and the server stops. (openstarry's own server
    ends its listen streams itself when it stops.) A stream that ends by
    itself is opened again, and the tools listed again, since changes may have
    come meanwhile.
    """
    tools = client.server_capabilities.tools
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (
        tools is not None and tools.list_changed
    ):
        return  # the handshake era: a notification, to the message handler
    if conn.config.url is not None and _on_trio():
        # The SDK aborts a cancelled request's SSE response without closing
        # httpx2's async generators (no aclosing); trio then warns for each
        # (ResourceWarning: "garbage collected before it had been exhausted"),
        # at every renewal. On trio an HTTP server's new tools are taken on
        # its next connection; over stdio, and on asyncio, they come live.
        return
    renew = LISTEN_RENEW if conn.config.url is not None else math.inf
    current: anyio.CancelScope | None = None
    opened = 0
    missed = False
    async with anyio.create_task_group() as streams:
        while True:
            ended = anyio.Event()
            try:
                scope: anyio.CancelScope = await streams.start(_listen_once, conn, client, ended)
            except Exception as exc:
                if current is not None:
                    current.cancel()
                    current = None
                if opened == 0 or math.isinf(renew):
                    # Refused outright: this server has no live list.
                    log.info("MCP server %r: no live tool list: %s", conn.name, _describe(exc))
                    return
                log.info(
                    "MCP server %r: its tool list stream could not be renewed: %s",
                    conn.name,
                    _describe(exc),
                )
                missed = True
                await anyio.sleep(renew)
                continue
            opened += 1
            if current is not None:
                current.cancel()
            current = scope
            if missed:
                conn._refresh.set()  # no stream was open for a while
                missed = False
            with anyio.move_on_after(renew):
                await ended.wait()
            if ended.is_set():
                missed = True
                current = None
                await anyio.sleep(_RELISTEN_PAUSE)


def _on_trio() -> bool:
    try:
        import sniffio
    except ImportError:  # anyio then runs on asyncio only
        return False
    try:
        return bool(sniffio.current_async_library() == "trio")
    except sniffio.AsyncLibraryNotFoundError:
        return False


async def _listen_once(
    conn: McpServerConnection,
    client: Client,
    ended: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[anyio.CancelScope],
) -> None:
    """One listen stream: started once acknowledged; ``ended`` set when it ends by itself."""
    with anyio.CancelScope() as scope:
        started = False
        try:
            async with client.listen(tools_list_changed=True) as changes:
                task_status.started(scope)
                started = True
                async for _ in changes:
                    conn._refresh.set()
        except Exception as exc:
            if not started:
                raise
            log.info("MCP server %r: its tool list stream ended: %s", conn.name, _describe(exc))
        ended.set()


async def _refresh_until(conn: McpServerConnection, drop: anyio.Event, client: Client) -> None:
    while not drop.is_set():
        refresh = conn._refresh
        async with anyio.create_task_group() as waiting:

            async def until(event: anyio.Event) -> None:
                await event.wait()
                waiting.cancel_scope.cancel()

            waiting.start_soon(until, drop)
            waiting.start_soon(until, refresh)
        if refresh.is_set() and not drop.is_set():
            conn._refresh = anyio.Event()
            try:
                with anyio.fail_after(conn.timeout):
                    conn._absorb(await conn._list_tools(client), grow=True)
            except Exception as exc:
                log.warning("MCP server %r: listing the tools again failed: %s", conn.name, exc)
                continue
            if conn.on_tools_changed is not None:
                try:
                    conn.on_tools_changed()
                except Exception as exc:  # the agent's trouble must not end the connection
                    log.warning(
                        "MCP server %r: the agent could not take its new tools: %s",
                        conn.name,
                        _describe(exc),
                    )


async def _has_resources(client: Client) -> bool:
    """Whether a server lists any resource or resource template (not just the capability)."""
    try:
        if (await client.list_resources()).resources:
            return True
        return bool((await client.list_resource_templates()).resource_templates)
    except Exception:
        return False


class _Watched:
    """A transport whose read stream reports its end: the server closed the connection."""

    def __init__(self, transport: Any, on_closed: Any) -> None:
        self._transport = transport
        self._on_closed = on_closed

    async def __aenter__(self) -> tuple[Any, Any]:
        read_stream, write_stream = await self._transport.__aenter__()
        return _WatchedReadStream(read_stream, self._on_closed), write_stream

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        result: bool | None = await self._transport.__aexit__(*exc_info)
        return result


class _WatchedReadStream:
    """Forwards a read stream, calling ``on_closed`` once it ends."""

    def __init__(self, inner: Any, on_closed: Any) -> None:
        self._inner = inner
        self._on_closed = on_closed

    @property
    def last_context(self) -> contextvars.Context | None:
        context: contextvars.Context | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_closed()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


async def _add_trace_headers(request: httpx2.Request) -> None:
    """An HTTP request hook: the trace of the MCP call being made, as headers.

    The SDK sends each request from a task that inherits the caller's context
    variables, so the call's trace is visible here and nowhere else.
    """
    trace = _CURRENT_TRACE.get()
    if trace is not None:
        request.headers.update(trace.headers())


def _enter_span(trace: TraceContext) -> contextvars.Token[Any] | None:
    """Make the calling span OpenTelemetry's current span while the SDK sends the call.

    The SDK opens a span of its own for each request it sends (``MCP send
    tools/call``, when a tracer provider is set) and puts that span's
    ``traceparent`` into ``_meta``: as a child of the call's
    ``openstarry.mcp.call`` span, in the run's trace, rather than a trace of
    its own. Returns the token to detach, ``None`` when there is no calling span.
    """
    if trace.parent_span is None:
        return None
    span = otel_trace.NonRecordingSpan(
        otel_trace.SpanContext(
            int(w3c_trace_id(trace.trace_id), 16),
            int(trace.parent_span, 16),
            is_remote=False,
            trace_flags=otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED),
        )
    )
    return otel_context.attach(otel_trace.set_span_in_context(span))


def _redacted(url: str) -> str:
    """``url`` fit for a message or a log: no password, no query values, no fragment.

    A server's URL is where its credentials go (``https://user:token@host/mcp``,
    ``?api_key=...``), and connection errors reach logs and the provider.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<an invalid URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    if parts.username is not None:
        netloc = f"{parts.username}:***@{netloc}" if parts.password else f"***@{netloc}"
    query = "&".join(f"{key}=***" for key, _ in parse_qsl(parts.query, keep_blank_values=True))
    if parts.query and not query:
        query = "***"
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: the agent's, when it is a real file."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return cast(TextIO, subprocess.DEVNULL)
    return sys.stderr


def _bad_tool(tool: mcp_types.Tool) -> str | None:
    """Why a listed tool cannot become an agent's tool, or None."""
    name = tool.name
    if not name or len(name) > _MAX_TOOL_NAME:
        return f"its name must have 1 to {_MAX_TOOL_NAME} characters"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "its name has spaces or control characters"
    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "its input schema is not an object schema"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        return "its input schema is not JSON"
    if size > MAX_SCHEMA_CHARS:
        return f"its input schema is larger than {MAX_SCHEMA_CHARS} characters"
    return None


#: Where an openstarry MCP server puts a failed tool's error (``{"code", "message", ...}``).
_ERROR_META = "openstarry/error"


def _closed(exc: BaseException) -> bool:
    """Whether ``exc`` (or a group's first leaf) is the SDK's "connection closed" error."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return isinstance(exc, MCPError) and exc.error.code == mcp_types.CONNECTION_CLOSED


def _session_gone(exc: MCPError) -> bool:
    """Whether an HTTP server no longer knows the session (it restarted, or ended it).

    ``Session not found`` is what SDK servers answer; ``Session terminated`` what
    the SDK's client makes of a bare 404.
    """
    message = exc.error.message.lower()
    return exc.error.code == mcp_types.INVALID_REQUEST and (
        message.startswith("session not found") or message.startswith("session terminated")
    )


def _is_depth_refusal(message: str) -> bool:
    """Whether a remote error is the recursion guard's refusal (see guard.check_depth)."""
    return f"exceeds the limit of {MAX_DEPTH}" in message and "depth" in message


def _result_value(result: mcp_types.CallToolResult, label: str) -> Any:
    """What a ``tools/call`` result gives the agent, or the ToolError it is."""
    if result.is_error:
        text = _text_of(result.content) or "the remote tool failed without a message"
        text = _cut(text, MAX_RESULT_CHARS)
        error = (result.meta or {}).get(_ERROR_META)
        remote_code = error.get("code") if isinstance(error, dict) else None
        if remote_code == "RECURSION_LIMIT" or _is_depth_refusal(text):
            raise ToolError(f"{label}: {text}", code="RECURSION_LIMIT")
        if isinstance(remote_code, str) and remote_code:
            text = f"{text} (remote code {remote_code[:64]})"
        raise ToolError(f"{label}: {text}", code="REMOTE_ERROR")
    structured = result.structured_content
    blocks = result.content
    if structured is not None:
        try:
            size = len(json.dumps(structured))
        except (TypeError, ValueError, RecursionError):
            size = MAX_RESULT_CHARS + 1
        if size <= MAX_RESULT_CHARS:
            return _unwrapped(structured, blocks)
    if all(isinstance(block, mcp_types.TextContent) for block in blocks):
        return _cut(_text_of(blocks), MAX_RESULT_CHARS)
    out: list[dict[str, Any]] = []
    budget = MAX_RESULT_CHARS
    for block in blocks:
        item = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key in ("text", "data", "blob"):
            value = item.get(key)
            if isinstance(value, str):
                if key == "text":
                    item[key] = _cut(value, max(budget, 0))
                elif len(value) > budget:
                    item[key] = None
                    item["omitted"] = f"{len(value)} characters of {key}: over the result limit"
                budget -= len(item[key] or "")
        resource = item.get("resource")
        if isinstance(resource, dict):
            for key in ("text", "blob"):
                value = resource.get(key)
                if isinstance(value, str) and len(value) > budget:
                    resource[key] = _cut(value, max(budget, 0)) if key == "text" else None
                    item["omitted"] = f"{len(value)} characters of {key}: over the result limit"
                budget -= len(resource.get(key) or "")
        out.append(item)
    return out


def _unwrapped(structured: Any, blocks: Sequence[Any]) -> Any:
    """``structuredContent``, without the ``{"result": ...}`` wrapper servers put around a
    value that is not an object, when the text block says that value alone."""
    if not (isinstance(structured, dict) and len(structured) == 1 and "result" in structured):
        return structured
    if len(blocks) != 1 or not isinstance(blocks[0], mcp_types.TextContent):
        return structured
    value, said = structured["result"], blocks[0].text
    if isinstance(value, str):
        return value if said == value else structured
    try:
        return value if json.loads(said) == value else structured
    except (ValueError, RecursionError):
        return structured


def _text_of(blocks: Iterable[Any]) -> str:
    return "\n".join(block.text for block in blocks if isinstance(block, mcp_types.TextContent))


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[cut: {len(text) - limit} more characters over the result limit]"


def _describe(exc: BaseException) -> str:
    """An exception in words; a group (as the SDK's task groups raise) by its first leaf."""
    seen = 0
    while seen < 16:
        inner = getattr(exc, "exceptions", None)
        if not inner:
            break
        exc = inner[0]
        seen += 1
    if isinstance(exc, McpConnectError):
        return str(exc)
    if isinstance(exc, MCPError):
        return f"error {exc.error.code}: {exc.error.message}"
    return describe_exception(exc)
