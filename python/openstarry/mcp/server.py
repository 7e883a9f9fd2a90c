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

import json
import logging
import re
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

try:
    import mcp.types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import NotificationOptions, Server
    from mcp.server.stdio import stdio_server
    from mcp.server.subscriptions import (
        InMemorySubscriptionBus,
        ListenHandler,
        ResourcesListChanged,
        ToolsListChanged,
    )
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
    from opentelemetry import trace as otel_trace  # a dependency of the SDK
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "openstarry.mcp needs the MCP SDK, which is not installed: "
        f"pip install 'openstarry[mcp]' ({exc})"
    ) from exc
from pydantic import ValidationError

from openstarry._http import BearerAuth, send_json
from openstarry.core import Event
from openstarry.errors import (
    ManifestError,
    McpConnectError,
    QueueClosed,
    RecursionLimitExceeded,
)
from openstarry.events import EventType
from openstarry.mcp.guard import (
    MAX_DEPTH,
    META_TRACEPARENT,
    RECURSION_LIMIT_EXCEEDED,
    TRACEPARENT_HEADER,
    TraceContext,
    check_depth,
    trace_from_headers,
    trace_from_meta,
    w3c_trace_id,
)
from openstarry.mcp.resources import ResourceCatalog, UnknownResource
from openstarry.tracecontext import parse_traceparent

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from openstarry.agent.memory import ToolOutcome
    from openstarry.agent.runtime import Agent

__all__ = [
    "DEFAULT_MAX_CALLS",
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

log = logging.getLogger("openstarry.mcp")

#: The JSON-RPC error code of a call refused because ``max_calls`` calls are running.
SERVER_BUSY = -32051
#: The JSON-RPC error code of a ``resources/read`` of a URI not exposed (MCP's).
RESOURCE_NOT_FOUND = -32002
#: The event the execution loop publishes when the agent's tools change.
TOOLS_CHANGED = "KERNEL:TOOLS_CHANGED"
#: Client sessions remembered for notifications, at most.
_MAX_SESSIONS = 256
#: Seconds between two looks at the exposed files, for ``resources/list_changed``.
DEFAULT_RESOURCE_POLL = 1.0
#: Calls an MCP server of an agent runs at once, by default.
DEFAULT_MAX_CALLS = 64

#: The ``source`` of the events the server publishes on the agent's bus.
_SOURCE = "openstarry.mcp"
#: Client names go into event sources: these characters only, this long at most.
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 64
_SESSION_HEADER = "mcp-session-id"
#: Seconds a refusal waits for room on a full bus before giving up its KERNEL:ERROR.
_PUBLISH_WAIT = 1.0
#: Seconds a Streamable HTTP session may go without a request before it is closed.
SESSION_IDLE_TIMEOUT = 600.0
#: Streamable HTTP sessions open at once (each holds about 40 KB); one more is refused.
MAX_SESSIONS = 256
#: Seconds beyond the tool timeout that answers are waited for once stdin is closed.
_EOF_GRACE = 5.0


class AgentMcpServer:
    """The MCP face of a running agent: the exposure rules, the guard, the bridge to its bus.

    :attr:`server` is the SDK's lowlevel ``Server``; run it with
    :func:`serve_stdio`, :func:`serve_http` or any SDK transport while the
    agent is running (``async with agent:``).

    Args:
        agent: The agent whose tools are served.
        expose: The tools a client may list and call; default: the manifest's
            ``mcp.expose_tools`` (none without a manifest). Each is a tool's
            name or, as in the manifest, its ``tools`` entry (an import
            reference stands for the tool it imports).
        private: Tools never served, even when in ``expose``; default: the
            manifest's ``mcp.private_tools``.
        max_calls: Calls run at once, at most; one more is refused with
            :data:`SERVER_BUSY`.
        resources: What ``resources/*`` serve; default: the manifest's
            ``mcp.expose_resources`` and ``mcp.private_resources``.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        expose: Sequence[str] | None = None,
        private: Sequence[str] | None = None,
        max_calls: int = DEFAULT_MAX_CALLS,
        resources: ResourceCatalog | None = None,
    ) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, not {max_calls}")
        mcp_config = getattr(agent.manifest, "mcp", None)
        if expose is None:
            expose = list(getattr(mcp_config, "expose_tools", ()))
        if private is None:
            private = list(getattr(mcp_config, "private_tools", ()))
        self.agent = agent
        self.private: frozenset[str] = frozenset(_tool_name(entry) for entry in private)
        #: The names a client may use, in the manifest's order, private ones removed.
        self.expose: tuple[str, ...] = tuple(
            dict.fromkeys(name for name in map(_tool_name, expose) if name not in self.private)
        )
        self.max_calls = max_calls
        self.calls_running = 0
        self.calls_refused = 0
        identity = getattr(agent.manifest, "identity", None)
        self._listeners = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._listeners)
        self.server: Server[Any] = Server(
            getattr(identity, "name", None) or agent.name,
            version=getattr(identity, "version", None) or "0.0.0",
            description=getattr(identity, "description", None) or None,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            get_tool_input_schema=self._input_schema,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
            # The 2026-07-28 protocol: changes go to subscriptions/listen streams.
            on_subscriptions_listen=self._listen,
        )
        self.resources = resources if resources is not None else _catalog_of(agent.manifest)
        #: The clients' sessions, known once they made a request (for notifications);
        #: the most recent :data:`_MAX_SESSIONS`, a gone one dropped when it fails.
        self.sessions: dict[int, Any] = {}
        notify = NotificationOptions(tools_changed=True, resources_changed=True)
        initialization = self.server.create_initialization_options
        # The SDK's transports ask the server for these; the list-changed flags
        # are what spec 004 section 2.1 declares.
        self.server.create_initialization_options = (  # type: ignore[method-assign]
            lambda *args, **kwargs: initialization(notify, *args[1:], **kwargs)
        )
        self._listing: tuple[str, ...] | None = None
        agent.bus.subscribe(TOOLS_CHANGED, self._on_tools_changed)

    # -- exposure --------------------------------------------------------

    def exposed_tools(self) -> list[types.Tool]:
        """The tools a client sees now: exposed, not private, and the agent's.

        Remote tools (``server.tool``) count once the agent has them.
        """
        tools = self.agent.tools
        listed = []
        for name in self.expose:
            tool = tools.get(name)
            if tool is None:
                continue
            described = tool.describe()
            listed.append(
                types.Tool(
                    name=name,
                    description=described.get("description") or None,
                    input_schema=_object_schema(described.get("parameters")),
                )
            )
        return listed

    def _served(self, name: str) -> bool:
        return name in self.expose and name not in self.private and name in self.agent.tools

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        if not self._served(name):
            return None
        return _object_schema(self.agent.tools[name].parameters)

    # -- handlers --------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._know(ctx.session)
        return types.ListToolsResult(tools=self.exposed_tools())

    async def _list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        self._know(ctx.session)
        return types.ListResourcesResult(resources=self.resources.listed())

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        self._know(ctx.session)
        return types.ListResourceTemplatesResult(resource_templates=self.resources.templates())

    async def _read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        self._know(ctx.session)
        uri = str(params.uri)
        try:
            contents = await self.resources.read(uri)
        except UnknownResource:
            raise MCPError(RESOURCE_NOT_FOUND, f"Unknown resource: {uri}", {"uri": uri}) from None
        except (OSError, ValueError) as exc:
            raise MCPError(types.INVALID_PARAMS, f"cannot read {uri}: {exc}") from None
        return types.ReadResourceResult(contents=contents)

    # -- live lists ------------------------------------------------------

    def _know(self, session: Any) -> None:
        # The SDK hands each request its own session object over one connection.
        key = id(getattr(session, "_connection", session))
        sessions = self.sessions
        sessions.pop(key, None)
        sessions[key] = session
        if len(sessions) > _MAX_SESSIONS:
            del sessions[next(iter(sessions))]

    async def _on_tools_changed(self, event: Event) -> None:
        await self._notify(tools=True)

    async def _notify(self, *, tools: bool) -> None:
        """Tell every known client its tool (or resource) list changed; a gone one is dropped."""
        await self._listeners.publish(ToolsListChanged() if tools else ResourcesListChanged())
        for key, session in list(self.sessions.items()):
            try:
                if tools:
                    await session.send_tool_list_changed()
                else:
                    await session.send_resource_list_changed()
            except Exception as exc:  # a closed connection
                log.info("could not notify an MCP client: %s", exc)
                self.sessions.pop(key, None)

    def close_listen_streams(self) -> None:
        """End every client's ``subscriptions/listen`` stream gracefully (the server stops).

        Each stream sends its final result, so the client knows the server
        closed it; a client that listens again is served as before. Call it
        when the HTTP server is told to stop, before it waits for the open
        responses: a listen stream never ends by itself.
        """
        self._listen.close()

    async def watch_resources(self, interval: float = DEFAULT_RESOURCE_POLL) -> None:
        """Look at the exposed files every ``interval`` s; notify the clients when they change."""
        if not self.resources.files and not self.resources.folders:
            return
        while True:
            listing = await anyio.to_thread.run_sync(self.resources.listing)
            if self._listing is not None and listing != self._listing:
                await self._notify(tools=False)
            self._listing = listing
            await anyio.sleep(interval)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self._know(ctx.session)
        name = params.name
        client = _client_name(ctx)
        if not self._served(name):
            reason = (
                "private"
                if name in self.private
                else "not exposed"
                if name in self.agent.tools
                else "unknown"
            )
            log.info("refused tools/call of %r from %s: the tool is %s", name, client, reason)
            self.calls_refused += 1
            # One answer for all three, so a client cannot tell a private tool exists.
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        try:
            trace = _trace_of(ctx, params)
        except ValueError as exc:
            self.calls_refused += 1
            raise MCPError(types.INVALID_PARAMS, f"invalid openstarry trace: {exc}") from None
        session_id = _session_of(ctx)
        try:
            check_depth(trace)
        except RecursionLimitExceeded as exc:
            self.calls_refused += 1
            log.warning("refused tools/call of %r from %s: %s", name, client, exc)
            await self._publish_refusal(exc, trace, name, client, session_id)
            raise MCPError(
                RECURSION_LIMIT_EXCEEDED,
                str(exc),
                {"traceId": trace.trace_id, "depth": trace.depth, "maxDepth": MAX_DEPTH},
            ) from None
        if self.calls_running >= self.max_calls:
            self.calls_refused += 1
            raise MCPError(
                SERVER_BUSY, f"{self.max_calls} calls are running: try again when one has finished"
            )
        self.calls_running += 1
        try:
            outcome = await self.agent.loop.call_tool(
                name,
                params.arguments if params.arguments is not None else {},
                trace_id=trace.trace_id,
                call_depth=trace.depth,
                source=f"mcp:{client}",
                session_id=session_id,
                traceparent=_caller_span(ctx, params, trace),
            )
        except (RuntimeError, QueueClosed) as exc:
            # The agent is not running (not started, or shutting down).
            log.warning("could not run tools/call of %r from %s: %s", name, client, exc)
            raise MCPError(
                types.INTERNAL_ERROR, f"the agent cannot run {name!r} now: {exc}"
            ) from None
        except (TypeError, ValueError) as exc:
            # Arguments no event can carry (nested deeper than an event allows).
            return _failure_result("INVALID_ARGUMENTS", f"invalid arguments for {name}: {exc}")
        finally:
            self.calls_running -= 1
        return _result_of(outcome)

    async def _publish_refusal(
        self,
        exc: RecursionLimitExceeded,
        trace: TraceContext,
        tool: str,
        client: str,
        session_id: str,
    ) -> None:
        """Tell the agent's bus about a refused call: a ``KERNEL:ERROR`` in the call's trace."""
        payload = {
            "code": "RECURSION_LIMIT",
            "message": f"refused an MCP call of {tool!r} from {client}: {exc}",
            "source": _SOURCE,
            "details": {
                "tool": tool,
                "client": client,
                "traceId": trace.trace_id,
                "depth": trace.depth,
                "maxDepth": MAX_DEPTH,
            },
        }
        try:
            event = Event.new(
                EventType.ERROR.value,
                payload,
                source=_SOURCE,
                session_id=session_id,
                trace_id=trace.trace_id,
            )
            with anyio.move_on_after(_PUBLISH_WAIT):
                await self.agent.bus.apublish(event)
                return
            log.warning("the agent's bus stayed full: the KERNEL:ERROR of a refused call is lost")
        except QueueClosed:
            log.warning("the agent's bus is closed: the KERNEL:ERROR of a refused call is lost")

    # -- transports ------------------------------------------------------

    def http_app(
        self,
        *,
        host: str = "127.0.0.1",
        path: str = "/mcp",
        json_response: bool = False,
        session_idle_timeout: float = SESSION_IDLE_TIMEOUT,
        max_sessions: int = MAX_SESSIONS,
        api_key: str | None = None,
    ) -> Starlette:
        """The Streamable HTTP ASGI app (one per server: the SDK's session manager runs once).

        Its lifespan runs the SDK's session manager; the agent must be running
        while it serves. For a loopback ``host`` the SDK refuses other
        ``Host``/``Origin`` headers (DNS rebinding protection). A session with
        no request for ``session_idle_timeout`` seconds is closed, and at most
        ``max_sessions`` are open at once (one more is refused until one
        closes). A request whose JSON-RPC id is that of a request still running
        in the same session is answered at once with the error ``-32600``
        (the SDK would otherwise leave one of the two unanswered). With
        ``api_key``, every request needs ``Authorization: Bearer <api_key>``.
        """
        app = self.server.streamable_http_app(
            streamable_http_path=path,
            json_response=json_response,
            host=host,
            session_idle_timeout=session_idle_timeout,
            max_sessions=max_sessions,
        )
        app.add_middleware(_UniqueRequestIds)
        if api_key is not None:
            app.add_middleware(BearerAuth, key=api_key)
        return app

    async def run_stdio(self) -> None:
        """Serve one client over this process's stdin and stdout until stdin closes."""
        async with stdio_server() as (read_stream, write_stream):
            try:
                await self.run_streams(read_stream, write_stream)
            finally:
                # A tool's stray print() sits in sys.stdout's buffer: flush it
                # while fd 1 still points at stderr, not at the protocol.
                sys.stdout.flush()

    async def run_streams(self, read_stream: Any, write_stream: Any) -> None:
        """Serve one client over a pair of SDK message streams (as ``stdio_server`` yields).

        Two things are added to the SDK's serving loop. Unparsable lines, which
        the SDK's stdio reader passes on as exceptions, are answered with
        ``-32700``/``-32600`` and ``id: null``. And when the client closes its
        side (end of stdin) with requests still running, their answers are
        waited for (up to the tool timeout and a few seconds) before the
        connection ends, so a client that sends its requests and then closes
        stdin, as a pipe does, still gets every answer.
        """
        writer = _AnswerTracker(write_stream)
        grace = self.agent.loop.limits.tool_timeout + _EOF_GRACE
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            async with send:
                try:
                    async for item in read_stream:
                        if isinstance(item, Exception):
                            log.info("answered a malformed message: %s", _first_line(item))
                            reply = types.JSONRPCError(
                                jsonrpc="2.0", id=None, error=_malformed(item)
                            )
                            await writer.send(SessionMessage(reply))
                            continue
                        message = item.message
                        if isinstance(message, types.JSONRPCRequest):
                            writer.expect(message.id)
                        elif (
                            isinstance(message, types.JSONRPCNotification)
                            and message.method == "notifications/cancelled"
                            and isinstance(message.params, dict)
                        ):
                            # A cancelled request gets no answer: stop waiting for one.
                            writer.answered(message.params.get("requestId"))
                        await send.send(item)
                    with anyio.move_on_after(grace) as waited:
                        await writer.drained.wait()
                    if waited.cancelled_caught:
                        log.warning(
                            "the client closed the connection; %d request(s) still unanswered "
                            "after %g s are dropped",
                            len(writer.pending),
                            grace,
                        )
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass  # the server is done with the connection

        async with read_stream, receive, anyio.create_task_group() as task_group:
            task_group.start_soon(relay)
            task_group.start_soon(self.watch_resources)
            options = self.server.create_initialization_options()
            await self.server.run(receive, writer, options)
            task_group.cancel_scope.cancel()


class _AnswerTracker:
    """The write side of a connection, noting which requests have been answered."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: set[types.RequestId] = set()
        #: Set while no request waits for its answer.
        self.drained = anyio.Event()
        self.drained.set()

    def expect(self, request_id: types.RequestId) -> None:
        if not self.pending:
            self.drained = anyio.Event()
        self.pending.add(request_id)

    def answered(self, request_id: Any) -> None:
        if request_id in self.pending:
            self.pending.discard(request_id)
            if not self.pending:
                self.drained.set()

    async def send(self, item: SessionMessage) -> None:
        await self.inner.send(item)
        message = item.message
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self.answered(message.id)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _AnswerTracker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _UniqueRequestIds:
    """Answer a request that reuses the id of one still running in its session with ``-32600``.

    The SDK routes an answer to the HTTP request waiting for its id: two
    requests of one id in one session would leave one waiting for ever.
    """

    #: The largest body read to find the ids; a larger one passes as it is.
    MAX_BODY = 4 * 1024 * 1024

    def __init__(self, app: Any) -> None:
        self.app = app
        #: The ids of the requests running in each session.
        self.running: dict[str, set[Any]] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        session = next(
            (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"mcp-session-id"),
            None,
        )
        if session is None:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.MAX_BODY:
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        ids = _request_ids(body) if not more else []
        running = self.running.setdefault(session, set())
        taken = [i for i in ids if i in running]
        if taken:
            errors = [
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "error": {
                        "code": -32600,
                        "message": f"request id {i!r} is already in use by a request "
                        "still running in this session",
                    },
                }
                for i in taken
            ]
            answer = json.dumps(errors if len(errors) > 1 else errors[0]).encode()
            await send_json(send, 409, answer)
            return
        running.update(ids)
        try:
            await self.app(scope, replay, send)
        finally:
            running.difference_update(ids)
            if not running:
                self.running.pop(session, None)


def _request_ids(body: bytes) -> list[Any]:
    """The ids of the JSON-RPC requests in ``body`` (none when it does not parse)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return []
    items = data if isinstance(data, list) else [data]
    ids: list[Any] = []
    for item in items:
        if isinstance(item, dict) and "method" in item and "id" in item:
            key = item["id"]
            if isinstance(key, (str, int)) and not isinstance(key, bool):
                ids.append(key)
    return ids


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


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port).

    Raises:
        OSError: the address cannot be bound (in use, not local, no permission).
        OverflowError: ``port`` is not 0 to 65535.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


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
    listening = sock if sock is not None else _listen(host, port)
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
            sock = _listen(host, port)
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


# -- helpers -------------------------------------------------------------------


def _catalog_of(manifest: Any) -> ResourceCatalog:
    """The manifest's ``mcp.expose_resources`` (none without a manifest)."""
    mcp_config = getattr(manifest, "mcp", None)
    entries = list(getattr(mcp_config, "expose_resources", ()))
    if manifest is None or not entries:
        return ResourceCatalog([], [], Path.cwd(), [])
    return ResourceCatalog(
        entries,
        list(getattr(mcp_config, "private_resources", ())),
        manifest.base_dir,
        manifest.allowed_paths(),
    )


def _tool_name(entry: str) -> str:
    """The tool a manifest's ``tools`` entry names (:func:`openstarry.tools.tool_name`)."""
    from openstarry.tools import tool_name

    return tool_name(entry)


def _object_schema(parameters: Any) -> dict[str, Any]:
    """A tool's parameters as an MCP ``inputSchema``, whose root must be ``type: object``."""
    schema = dict(parameters) if isinstance(parameters, Mapping) else {}
    schema.setdefault("type", "object")
    return schema


def _client_name(ctx: ServerRequestContext[Any, Any]) -> str:
    """The client's ``clientInfo.name``, cut to a safe event source; ``client`` when absent."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    name = _NAME_CHARS.sub("_", info.name if info is not None else "")[:_MAX_NAME]
    return name or "client"


def _session_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """The ``sessionId`` of the call's events: ``mcp``, or ``mcp:<Mcp-Session-Id>`` over HTTP."""
    headers = getattr(ctx.request, "headers", None)
    session = headers.get(_SESSION_HEADER) if headers is not None else None
    if session:
        return "mcp:" + _NAME_CHARS.sub("_", session)[:_MAX_NAME]
    return "mcp"


def _trace_of(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> TraceContext:
    """The call's trace: from the HTTP headers or ``_meta`` (the deeper when both), else new.

    Raises:
        ValueError: a malformed trace id or depth.
    """
    headers = getattr(ctx.request, "headers", None)
    found = [
        trace
        for trace in (
            trace_from_headers(headers) if headers is not None else None,
            trace_from_meta(dict(params.meta) if params.meta else None),
        )
        if trace is not None
    ]
    if not found:
        return TraceContext(str(uuid.uuid4()), 1)
    return max(found, key=lambda trace: trace.depth)


def _caller_span(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, trace: TraceContext
) -> str | None:
    """The ``traceparent`` of the span the call's spans are children of, if any.

    The SDK's own server span (``tools/call NAME``) when a tracer provider
    records it, else the caller's span that ``_meta`` or the headers name:
    the first of these in the call's trace.
    """
    w3c = w3c_trace_id(trace.trace_id)
    current = otel_trace.get_current_span().get_span_context()
    if current.is_valid and f"{current.trace_id:032x}" == w3c:
        return f"00-{w3c}-{current.span_id:016x}-01"
    headers = getattr(ctx.request, "headers", None)
    meta = dict(params.meta) if params.meta else {}
    for value in (meta.get(META_TRACEPARENT), headers.get(TRACEPARENT_HEADER) if headers else None):
        parsed = parse_traceparent(value)
        if parsed is not None and w3c_trace_id(parsed[0]) == w3c:
            return f"00-{w3c}-{parsed[1]}-01"
    return None


def _result_of(outcome: ToolOutcome) -> types.CallToolResult:
    """The MCP result of a tool's outcome."""
    if not outcome.success:
        error = outcome.error
        message = error.message if error is not None else "the tool failed"
        meta = {"openstarry/error": error.to_dict()} if error is not None else None
        return types.CallToolResult(
            content=[types.TextContent(text=message or "the tool failed")],
            is_error=True,
            _meta=meta,
        )
    result = outcome.result
    try:
        text = (
            result
            if isinstance(result, str)
            else json.dumps(result, ensure_ascii=False, allow_nan=False)
        )
    except (TypeError, ValueError) as exc:
        return _failure_result("INVALID_RESULT", f"the tool's result is not JSON: {exc}")
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=result if isinstance(result, dict) else None,
    )


def _failure_result(code: str, message: str) -> types.CallToolResult:
    """An ``isError`` result for a failure of the server's own (code under ``_meta``)."""
    failure = {"code": code, "message": message, "source": _SOURCE}
    return types.CallToolResult(
        content=[types.TextContent(text=message)],
        is_error=True,
        _meta={"openstarry/error": failure},
    )


def _malformed(exc: Exception) -> types.ErrorData:
    """The JSON-RPC error of a line the stdio reader could not take as a message."""
    if isinstance(exc, ValidationError) and any(
        error["type"] == "json_invalid" for error in exc.errors()
    ):
        return types.ErrorData(code=types.PARSE_ERROR, message="Parse error")
    return types.ErrorData(
        code=types.INVALID_REQUEST,
        message="Invalid Request: not a JSON-RPC 2.0 request, notification or response",
    )


def _first_line(exc: Exception) -> str:
    return str(exc).partition("\n")[0]
