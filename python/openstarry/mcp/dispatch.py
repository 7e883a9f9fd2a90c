"""The MCP face of a running agent: the SDK's requests dispatched to the agent, by its rules.

:class:`AgentMcpServer` holds the SDK's lowlevel ``Server`` and answers its
requests: ``tools/list`` and ``tools/call`` by the exposure rules, the
recursion guard and the ``max_calls`` bound (a call runs on the agent's bus),
``resources/*`` from the manifest's catalog, and the live lists (the
``list_changed`` notifications and ``subscriptions/listen`` streams). It also
makes its transports (:meth:`~AgentMcpServer.http_app`,
:meth:`~AgentMcpServer.run_stdio`), with the framing of
:mod:`openstarry.mcp.framing`; a call's trace and result are translated by
:mod:`openstarry.mcp.calls`. :mod:`openstarry.mcp.server` says what the
server does, and runs it (``serve``, ``serve_http``, ``serve_stdio``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
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
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "openstarry.mcp needs the MCP SDK, which is not installed: "
        f"pip install 'openstarry[mcp]' ({exc})"
    ) from exc

from openstarry._http import BearerAuth
from openstarry.agent.waits import Answer
from openstarry.core import Event
from openstarry.errors import QueueClosed, RecursionLimitExceeded
from openstarry.events import EventType
from openstarry.mcp.approvals import REQUIRES_APPROVAL, approval_for
from openstarry.mcp.calls import (
    SOURCE,
    caller_span,
    catalog_of,
    client_name,
    failure_result,
    object_schema,
    result_of,
    session_of,
    tool_name,
    trace_of,
)
from openstarry.mcp.framing import AnswerTracker, UniqueRequestIds, first_line, malformed
from openstarry.mcp.guard import (
    MAX_DEPTH,
    RECURSION_LIMIT_EXCEEDED,
    TraceContext,
    check_depth,
)
from openstarry.mcp.resources import ResourceCatalog, UnknownResource

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from openstarry.agent.runtime import Agent

__all__ = [
    "DEFAULT_MAX_CALLS",
    "DEFAULT_RESOURCE_POLL",
    "MAX_SESSIONS",
    "RESOURCE_NOT_FOUND",
    "SERVER_BUSY",
    "SESSION_IDLE_TIMEOUT",
    "TOOLS_CHANGED",
    "AgentMcpServer",
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
        self.private: frozenset[str] = frozenset(tool_name(entry) for entry in private)
        #: The names a client may use, in the manifest's order, private ones removed.
        self.expose: tuple[str, ...] = tuple(
            dict.fromkeys(name for name in map(tool_name, expose) if name not in self.private)
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
        self.resources = resources if resources is not None else catalog_of(agent.manifest)
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
        needs_approval = self.agent.loop.needs_approval
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
                    input_schema=object_schema(described.get("parameters")),
                    # Where a tool says what it returns (FunctionTool.output_schema).
                    output_schema=getattr(tool, "output_schema", None),
                    _meta={REQUIRES_APPROVAL: True} if needs_approval(name) else None,
                )
            )
        return listed

    def _served(self, name: str) -> bool:
        return name in self.expose and name not in self.private and name in self.agent.tools

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        if not self._served(name):
            return None
        return object_schema(self.agent.tools[name].parameters)

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
    ) -> types.CallToolResult | types.InputRequiredResult:
        self._know(ctx.session)
        name = params.name
        client = client_name(ctx)
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
            trace = trace_of(ctx, params)
        except ValueError as exc:
            self.calls_refused += 1
            raise MCPError(types.INVALID_PARAMS, f"invalid openstarry trace: {exc}") from None
        session_id = session_of(ctx)
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
            approval: Answer | None = None
            if self.agent.loop.needs_approval(name):  # asks the client (openstarry.mcp.approvals)
                asked = await approval_for(
                    ctx, params, self.server.name, self.agent.loop.limits.approval_timeout
                )
                if isinstance(asked, types.InputRequiredResult):
                    return asked
                approval = asked
            outcome = await self.agent.loop.call_tool(
                name,
                params.arguments if params.arguments is not None else {},
                trace_id=trace.trace_id,
                call_depth=trace.depth,
                source=f"mcp:{client}",
                session_id=session_id,
                traceparent=caller_span(ctx, params, trace),
                approval=approval,
            )
        except (RuntimeError, QueueClosed) as exc:
            # The agent is not running (not started, or shutting down).
            log.warning("could not run tools/call of %r from %s: %s", name, client, exc)
            raise MCPError(
                types.INTERNAL_ERROR, f"the agent cannot run {name!r} now: {exc}"
            ) from None
        except (TypeError, ValueError) as exc:
            # Arguments no event can carry (nested deeper than an event allows).
            return failure_result("INVALID_ARGUMENTS", f"invalid arguments for {name}: {exc}")
        finally:
            self.calls_running -= 1
        return result_of(outcome)

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
            "source": SOURCE,
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
                source=SOURCE,
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
        ``api_key``, every request but ``GET /health`` (``{"status": "ok"}``
        while the server serves) needs ``Authorization: Bearer <api_key>``.
        """
        app = self.server.streamable_http_app(
            streamable_http_path=path,
            json_response=json_response,
            host=host,
            session_idle_timeout=session_idle_timeout,
            max_sessions=max_sessions,
        )
        app.add_route("/health", _health, methods=["GET"])
        app.add_middleware(UniqueRequestIds)
        if api_key is not None:
            app.add_middleware(BearerAuth, key=api_key, exempt=("/health",))
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
        writer = AnswerTracker(write_stream)
        grace = self.agent.loop.limits.tool_timeout + _EOF_GRACE
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            async with send:
                try:
                    async for item in read_stream:
                        if isinstance(item, Exception):
                            log.info("answered a malformed message: %s", first_line(item))
                            reply = types.JSONRPCError(
                                jsonrpc="2.0", id=None, error=malformed(item)
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


async def _health(request: Any) -> Any:
    """``GET /health``: the server is up (no key needed, nothing about the agent told)."""
    from starlette.responses import JSONResponse

    return JSONResponse({"status": "ok"})
