"""How the MCP client reaches a server: the SDK's transports, watched, with the call's trace.

:func:`open_client` connects the SDK's ``Client`` over stdio (a program the
client starts) or Streamable HTTP (an httpx2 client whose request hook adds
the trace headers of the call being made, from :data:`CURRENT_TRACE`), its
transport wrapped so that the connection learns when the server closed it.
Below the connection (:mod:`openstarry.mcp.connection`) and knowing nothing of
tools: also the words for what goes wrong (:func:`describe`,
:func:`connection_closed`, :func:`session_gone`), a URL fit for logs
(:func:`redacted`), and the SDK's stdio log made to say a bad line in one line.
"""

from __future__ import annotations

import contextvars
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TextIO, cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import anyio
import anyio.abc

from openstarry.bus import describe_exception
from openstarry.core import __version__
from openstarry.errors import McpConnectError
from openstarry.manifest import McpServerConfig
from openstarry.mcp.guard import TraceContext, w3c_trace_id

try:
    import httpx2
    import mcp_types
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from opentelemetry import context as otel_context  # a dependency of the SDK
    from opentelemetry import trace as otel_trace
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("openstarry.mcp needs the MCP SDK: pip install 'openstarry[mcp]'") from exc

__all__ = [
    "CLOSE_GRACE",
    "CURRENT_TRACE",
    "Watched",
    "add_trace_headers",
    "connection_closed",
    "describe",
    "enter_span",
    "errlog",
    "open_client",
    "redacted",
    "session_gone",
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
#: Seconds a connection may take to close before it is cut off.
CLOSE_GRACE = 5.0

#: The trace of the MCP call the current task is making; read by the HTTP request hook.
CURRENT_TRACE: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "openstarry_mcp_trace", default=None
)


class Watched:
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


async def add_trace_headers(request: httpx2.Request) -> None:
    """An HTTP request hook: the trace of the MCP call being made, as headers.

    The SDK sends each request from a task that inherits the caller's context
    variables, so the call's trace is visible here and nowhere else.
    """
    trace = CURRENT_TRACE.get()
    if trace is not None:
        request.headers.update(trace.headers())


def enter_span(trace: TraceContext) -> contextvars.Token[Any] | None:
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


def redacted(url: str) -> str:
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


def errlog() -> TextIO:
    """Where a stdio server's stderr goes: the agent's, when it is a real file."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return cast(TextIO, subprocess.DEVNULL)
    return sys.stderr


def connection_closed(exc: BaseException) -> bool:
    """Whether ``exc`` (or a group's first leaf) is the SDK's "connection closed" error."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return isinstance(exc, MCPError) and exc.error.code == mcp_types.CONNECTION_CLOSED


def session_gone(exc: MCPError) -> bool:
    """Whether an HTTP server no longer knows the session (it restarted, or ended it).

    ``Session not found`` is what SDK servers answer; ``Session terminated`` what
    the SDK's client makes of a bare 404.
    """
    message = exc.error.message.lower()
    return exc.error.code == mcp_types.INVALID_REQUEST and (
        message.startswith("session not found") or message.startswith("session terminated")
    )


def describe(exc: BaseException) -> str:
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


@asynccontextmanager
async def open_client(
    config: McpServerConfig,
    *,
    timeout: float,
    read_timeout: float,
    on_closed: Any,
    message_handler: Any,
    mode: Any,
    elicitation_callback: Any = None,
) -> AsyncIterator[Client]:
    """The SDK client of the server ``config`` names, connected (over stdio or Streamable HTTP).

    Args:
        config: The server's manifest entry.
        timeout: Seconds to connect (HTTP).
        read_timeout: Seconds an HTTP response may go without a byte.
        on_closed: Called when the server ends the connection.
        message_handler: The SDK's handler of the server's notifications.
        mode: How the protocol version is agreed (the SDK's ``mode``).
        elicitation_callback: Answers the server's forms (its approval requests).
    """
    async with AsyncExitStack() as stack:
        transport: Any
        if config.url is not None:
            http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(timeout, read=read_timeout),
                event_hooks={"request": [add_trace_headers]},
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
                errlog=errlog(),
            )
        client = Client(
            Watched(transport, on_closed),
            client_info=mcp_types.Implementation(name="openstarry", version=__version__),
            cache=None,
            mode=mode,
            message_handler=message_handler,
            elicitation_callback=elicitation_callback,
        )
        yield await stack.enter_async_context(client)
