"""One remote MCP server: its connection, owned by a task of its own, and its tools.

:class:`McpServerConnection` is the lifecycle of one entry of ``mcp.servers``:
a task that opens the connection when a call needs one
(:func:`~openstarry.mcp.transport.open_client`), lists the server's tools into
proxies (:mod:`openstarry.mcp.proxies`), keeps the list current while it lives
(:mod:`openstarry.mcp.listchanges`), and closes it when told; calls come from
the calling tools' tasks, bounded by :data:`MAX_CONNECTS` connections per
:data:`CONNECT_WINDOW` seconds and dropped after :data:`MAX_ABANDONED_CALLS`
abandoned calls in a row. :class:`~openstarry.mcp.client.McpToolset` holds one
per server; see :mod:`openstarry.mcp.client` for what happens when.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast

import anyio
import anyio.abc
import anyio.lowlevel
from pydantic import ValidationError

from openstarry.errors import McpConnectError, ToolError
from openstarry.manifest import McpServerConfig
from openstarry.mcp.approvals import REQUIRES_APPROVAL, ApprovalAnswers
from openstarry.mcp.guard import RECURSION_LIMIT_EXCEEDED, TraceContext
from openstarry.mcp.listchanges import serve_until
from openstarry.mcp.proxies import (
    MAX_DESCRIPTION_CHARS,
    ReadResourceTool,
    RemoteTool,
    bad_tool,
    cut,
    is_depth_refusal,
    resource_text,
    result_value,
)
from openstarry.mcp.transport import (
    CLOSE_GRACE,
    CURRENT_TRACE,
    connection_closed,
    describe,
    enter_span,
    open_client,
    redacted,
    session_gone,
)

try:
    import mcp_types
    from mcp import Client
    from mcp.shared.exceptions import MCPError
    from opentelemetry import context as otel_context  # a dependency of the SDK
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("openstarry.mcp needs the MCP SDK: pip install 'openstarry[mcp]'") from exc


__all__ = [
    "CONNECT_WINDOW",
    "MAX_ABANDONED_CALLS",
    "MAX_CONNECTS",
    "MAX_TOOLS_PER_SERVER",
    "McpServerConnection",
]

log = logging.getLogger("openstarry.mcp")

#: Tools one server may contribute (after the ``tools`` filter).
MAX_TOOLS_PER_SERVER = 128
#: Connections (stdio: process starts) per server within :data:`CONNECT_WINDOW`.
MAX_CONNECTS = 10
#: Seconds over which :data:`MAX_CONNECTS` is counted.
CONNECT_WINDOW = 60.0
#: Calls in a row abandoned (timed out or stopped) after which the connection is made afresh.
MAX_ABANDONED_CALLS = 2

_MAX_LIST_PAGES = 100
#: Characters of a remote JSON-RPC error message that are kept.
_MAX_ERROR_CHARS = 8192
#: Seconds an HTTP response may go without a byte, at least; a connection whose
#: calls may take longer (``call_timeout``) waits that long plus
#: :data:`~openstarry.mcp.transport.CLOSE_GRACE`.
_HTTP_READ_TIMEOUT = 300.0
#: How the protocol version is agreed: the SDK's ``"auto"`` tries the newest
#: revision and falls back to the ``initialize`` handshake of older servers.
_PROTOCOL_MODE = "auto"


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
        self._read_timeout = max(_HTTP_READ_TIMEOUT, (call_timeout or 0.0) + CLOSE_GRACE)
        #: The server's tools by their agent-side name, in the server's order.
        self.tools: dict[str, RemoteTool | ReadResourceTool] = {}
        #: The names the server listed on the last connection.
        self.listed: list[str] = []
        #: Connections made so far (stdio: processes started).
        self.connects = 0
        #: The answers to the server's approval forms (:mod:`openstarry.mcp.approvals`).
        self.approvals = ApprovalAnswers(self.name)
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
        self.relist = anyio.Event()
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
                async with open_client(
                    self.config,
                    timeout=self.timeout,
                    read_timeout=self._read_timeout,
                    on_closed=lambda: self._closed_under_us(drop),
                    message_handler=self._on_message,
                    mode=_PROTOCOL_MODE,
                    elicitation_callback=self.approvals,
                ) as client:
                    self.absorb(await self.list_tools(client))
                    resources = client.server_capabilities.resources
                    reader = f"{self.name}.read_resource"
                    wanted = self.config.tools is None or "read_resource" in self.config.tools
                    if (
                        resources is not None
                        and wanted
                        and reader not in self.tools
                        and not self._started
                        and await has_resources(client)
                    ):
                        self.tools[reader] = ReadResourceTool(self)
                    scope.deadline = math.inf
                    connected = True
                    self.connects += 1
                    self._abandoned = 0
                    self._client = client
                    self._error = ""
                    settle()
                    await serve_until(self, drop, client, scope)
            if not connected:
                self._error = (
                    "the connection was closed"
                    if self._closing
                    else f"no answer within {self.timeout:g} s"
                )
        except Exception as exc:
            if connected:
                log.warning("MCP server %r: the connection ended: %s", self.name, describe(exc))
                self._error = f"the connection ended: {describe(exc)}"
            elif connection_closed(exc):
                self._error = "the server closed the connection before it answered" + (
                    "" if self.config.url else " (the program exited; see its stderr)"
                )
            else:
                self._error = describe(exc)
        finally:
            self._scope = None
            self._client = None
            settle()

    async def _on_message(self, message: Any) -> None:
        """The SDK's message handler: a tool list that changed is listed again."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.relist.set()
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
                f"{label}: {uri}: {cut(exc.error.message, _MAX_ERROR_CHARS)}",
                code="REMOTE_ERROR",
            ) from None
        return resource_text(result)

    def _closed_under_us(self, drop: anyio.Event) -> None:
        """The server ended the connection ``drop`` belongs to (a stdio server exited)."""
        if drop is not self._drop or drop.is_set():
            return  # a connection that was already ending
        if self._client is not None:
            log.warning("MCP server %r closed the connection", self.name)
            self._error = "the server closed the connection"
        self._client = None
        drop.set()

    async def list_tools(self, client: Client) -> list[mcp_types.Tool]:
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

    def absorb(self, listing: Iterable[mcp_types.Tool], *, grow: bool = False) -> None:
        """Make or refresh the tools from a listing (a known tool is updated in place).

        After the start only a ``grow`` listing (the server said its list
        changed) adds tools.
        """
        self.listed = []
        for remote in listing:
            problem = bad_tool(remote)
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
            if isinstance(tool, RemoteTool):  # the entry's approval, or the listing's word
                listed_approval = (remote.meta or {}).get(REQUIRES_APPROVAL) is True
                tool.requires_approval = self.config.approval or listed_approval

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
            return redacted(self.config.url)
        command = " ".join(self.config.command or ())
        return command if len(command) <= 200 else command[:197] + "..."

    async def call(
        self,
        remote_name: str,
        args: dict[str, Any],
        trace: TraceContext,
        *,
        approved: bool = False,
    ) -> Any:
        """Call a tool of this server with ``args``, carrying ``trace``; return its result.

        ``approved``: the agent's user said yes to this call before it was sent,
        so the server's approval form for it is answered yes.

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
        token = CURRENT_TRACE.set(trace)
        span_token = enter_span(trace)
        try:
            with self.approvals.calling(remote_name, approved):
                result = await client.call_tool(remote_name, args, meta=cast(Any, trace.meta()))
        except MCPError as exc:
            message = cut(exc.error.message, _MAX_ERROR_CHARS)
            if exc.error.code == mcp_types.CONNECTION_CLOSED or session_gone(exc):
                self._drop_client(client)
                raise ToolError(
                    f"{label}: MCP server {self.name!r} closed the connection during the call "
                    f"({self._error or message}); it is connected again on the next call",
                    code="REMOTE_UNAVAILABLE",
                ) from None
            refused = exc.error.code == RECURSION_LIMIT_EXCEEDED or is_depth_refusal(message)
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
                f"{label}: the connection to MCP server {self.name!r} failed: {describe(exc)}",
                code="REMOTE_UNAVAILABLE",
            ) from None
        finally:
            if span_token is not None:
                otel_context.detach(span_token)
            CURRENT_TRACE.reset(token)
        self._abandoned = 0
        return result_value(result, label)

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


async def has_resources(client: Client) -> bool:
    """Whether a server lists any resource or resource template (not just the capability)."""
    try:
        if (await client.list_resources()).resources:
            return True
        return bool((await client.list_resource_templates()).resource_templates)
    except Exception:
        return False
