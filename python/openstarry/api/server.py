"""The Agent API over HTTP (spec 003): ``openstarry serve MANIFEST``.

Needs the ``[http]`` extra (Starlette and uvicorn): ``pip install 'openstarry[http]'``.

Endpoints:

``POST /process``
    An :class:`~openstarry.api.models.AgentRequest`. The input is the text of
    the last ``user`` message (its text content items joined); the session's
    memory holds the conversation, so earlier messages of ``input`` are not
    replayed to the agent. With ``"stream": true`` (the default) the answer is
    a Server-Sent Events stream (``text/event-stream``): one JSON object per
    ``data:`` line, each event with an ``id:`` of the form
    ``<response id>:<sequence_number>``, and an SSE comment (``: keep-alive``)
    after ``heartbeat`` seconds of silence, followed by a ``heartbeat``
    message for a client that asks (:mod:`openstarry.api.heartbeat`); the stream ends after the
    response's terminal event (``completed``, ``failed`` or ``canceled``).
    With ``"stream": false`` the answer is one JSON
    :class:`~openstarry.api.models.AgentResponse` with the whole ``output``;
    while a long run goes on, a space every ``heartbeat`` seconds precedes it
    (JSON ignores leading whitespace), so clients and proxies that time out a
    silent connection do not cut the run (the ``200`` is then sent at the
    first space).
    Either way the ``X-OpenStarry-Response-ID`` header names the response. A
    request's ``response_id``, when given, becomes the response's id (letters,
    digits, ``_``, ``-``, ``.``; not in use). ``tools`` and ``n`` > 1 are
    taken as :mod:`openstarry.api.adapter` and :mod:`openstarry.api.choices` say.
    Generation parameters (``model``, ``temperature``, ...) are accepted and
    left to the manifest's provider.

``GET /process/{response_id}``
    Reconnect to a response: with a ``Last-Event-ID`` header (the ``id:`` of
    the last event received, or just its sequence number) the events after it
    are replayed, then the stream goes on live; without it, the whole stream
    from the start. A ``POST /process`` that carries a (non-empty)
    ``Last-Event-ID`` header resumes the response that id names (or, for a
    bare sequence number, the body's ``response_id``) the same way, without
    starting a new run: an SSE client that retries re-sends its request with
    that header. Events are kept per response in a bounded buffer
    (:class:`ServerLimits`): a reconnect asking for events already dropped
    gets ``410``, one for a response no longer kept gets ``404``. Each event
    is one ``data:`` line: U+2028, U+2029 and U+0085, which JSON may leave
    raw, are written as ``\\u`` escapes, so no line reader cuts an event.

``GET /health``
    ``{"status": "ok", "agent": ..., "runs": ..., "responses": ...}``.

Runs and connections:

- A run belongs to the server, not to the connection: when its last reader
  disconnects, it keeps running for ``resume_grace`` seconds so the client can
  reconnect; with nobody back by then it is stopped (``/stop`` on its session)
  and ends ``canceled``.
- ``session_id`` carries a conversation across requests (the loop's session
  memory); a request without one gets a new session, echoed in every response
  event. One run per session at a time: a request for a session whose run is
  still going gets ``409`` with code ``session_busy`` (resume that run, or wait
  for it, instead).
- At most ``max_concurrent_runs`` runs at once; beyond it ``503`` with
  ``Retry-After``.
- Every refused request gets a 4xx (or 503) with an
  :class:`~openstarry.api.models.Error` body ``{"code", "message"}``: invalid
  JSON (400), a body over ``max_body_bytes`` (413), a non-JSON content type
  (415), a request that does not fit the schema (422: wrong types, ``n`` = 6,
  an unknown tool type, no user text), unknown paths (404) and methods (405).

Text that starts with ``/`` is a slash command, as at the ``openstarry run``
prompt: the built-ins (``/reset``, ``/stop``, ``/help``...) always work; one that
runs a tool directly (``/read notes.txt``) only for a tool in the manifest's
``api.expose_tools`` (none by default) and never for one in
``mcp.private_tools``: ``403`` with code ``command_not_allowed`` otherwise.
``session_id`` is 1 to 128 ASCII letters, digits, ``_``, ``-``, ``.``, ``:`` or
``@`` (``422`` otherwise).

Who may call: with ``api_key``, every route but ``/health``, the console's
page and its sign-in needs ``Authorization: Bearer <key>`` or the session
cookie the console's sign-in gives a browser (``401`` otherwise; repeated
wrong keys from one address are slowed down with ``429``: see
:mod:`openstarry.api.signin`). :func:`serve` refuses a
non-loopback address without a key unless told ``insecure``, closes a
connection whose request head or body comes too slowly (``408``), caps the
connections of one client address (``429``), and shuts down gracefully (see
there). Live streams are never cut by the replay buffer: its bounds limit what
is kept for reconnects, not what a reader that keeps up is sent.

Where each part lives: :mod:`openstarry.api.routes` (the routes above, and
the errors' bodies), :mod:`openstarry.api.runs` (which runs may start, the
reconnect grace, the shutdown of the runs), :mod:`openstarry.api.replay` (the
events kept per response), :mod:`openstarry.api.streams` (an SSE stream or a
JSON body on a connection), :mod:`openstarry.api.limits`
(:class:`ServerLimits`); this module puts them together into an application
(:func:`create_app`) and serves it (:func:`serve`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING

import anyio

from openstarry._http import ConnectionLimits, check_bind, graceful_server
from openstarry.api.a2a import CARD_PATH, A2AMethods, a2a_routes
from openstarry.api.a2a_rest import rest_routes
from openstarry.api.console import PUBLIC_PATHS, console_routes
from openstarry.api.limits import ServerLimits
from openstarry.api.routes import api_routes, exception_handlers
from openstarry.api.runs import RunsApi
from openstarry.api.signin import ConsoleAuth, SignIn, signin_routes
from openstarry.api.tracecontext import TraceContextMiddleware

try:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.api.server needs Starlette and uvicorn: pip install 'openstarry[http]'"
    ) from exc

if TYPE_CHECKING:
    from openstarry.agent.runtime import Agent

__all__ = ["ServerLimits", "create_app", "serve"]

log = logging.getLogger("openstarry.api.server")


def create_app(
    agent: Agent,
    *,
    limits: ServerLimits | None = None,
    api_key: str | None = None,
    expose_tools: Collection[str] | None = None,
) -> Starlette:
    """The Agent API as a Starlette application serving ``agent``.

    The application starts the agent when the server starts (its lifespan) and
    stops it, with the runs still going, when the server stops.

    Args:
        agent: The agent to serve (not yet started).
        limits: The server's bounds (default :class:`ServerLimits`).
        api_key: When given, every route but ``/health`` and the console's
            page needs ``Authorization: Bearer <api_key>`` or the console's
            sign-in cookie (``401`` otherwise); ``/signin`` and ``/signout``
            are added (:mod:`openstarry.api.signin`).
        expose_tools: The tools a slash command may run (default: the
            manifest's ``api.expose_tools``, else none); ``mcp.private_tools``
            never are.
    """
    api = RunsApi(agent, limits or ServerLimits(), expose_tools)
    signin = SignIn(api_key, ttl=api.limits.signin_ttl) if api_key is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with agent, anyio.create_task_group() as task_group:
            api.task_group = task_group
            try:
                yield
            finally:
                api.task_group = None
                await api.stop_all()
                task_group.cancel_scope.cancel()

    a2a = A2AMethods(api)
    app = Starlette(
        routes=[
            # /process, /process/{response_id} and /health (openstarry.api.routes).
            *api_routes(api),
            # A2A 1.0: the agent card, the JSON-RPC and HTTP+JSON bindings
            # (openstarry.api.a2a, openstarry.api.a2a_rest).
            *a2a_routes(a2a, secured=signin is not None),
            *rest_routes(a2a),
            # The console, /events, /metrics and /stop (openstarry.api.console).
            *console_routes(agent),
            # With a key, the console's sign-in (openstarry.api.signin).
            *(signin_routes(signin, api.limits.body_timeout) if signin is not None else []),
        ],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
        middleware=(
            [
                Middleware(
                    ConsoleAuth,
                    signin=signin,
                    public={"/health", "/signin", "/signout", CARD_PATH, *PUBLIC_PATHS},
                )
            ]
            if signin is not None
            else []
        ),
    )
    app.state.openstarry = api
    app.state.signin = signin
    # X-OpenStarry-Trace-ID / traceparent of a request continue into its run.
    app.add_middleware(TraceContextMiddleware)
    return app


def serve(
    agent: Agent,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
    sock: socket.socket | None = None,
    api_key: str | None = None,
    insecure: bool = False,
) -> int:
    """Serve ``agent`` over HTTP until SIGTERM or SIGINT (``openstarry serve``).

    The shutdown is graceful: the server stops accepting connections, refuses
    new runs (``503``), gives the runs in progress ``limits.shutdown_grace``
    seconds, then stops those left (they end ``canceled``); every open stream
    is sent its final event and every waiting client its JSON response before
    the connections close, the agent stops, and the function returns.

    Args:
        agent: The agent (:func:`openstarry.assembly.agent_from_manifest` builds
            one from an ``agent.json``); the server starts and stops it.
        host: The address to listen on.
        port: The port (0: any free one).
        limits: The server's bounds.
        sock: A bound socket to serve on instead of ``host``/``port``.
        api_key: Every route but ``/health`` and the console's page needs
            ``Authorization: Bearer <api_key>`` or the console's sign-in.
        insecure: Serve on an address other than loopback without ``api_key``.

    Returns:
        The exit status: 0 after a clean shutdown on SIGTERM, 130 after one on
        SIGINT (Ctrl-C, as a shell expects), 1 when the server could not
        start (the address cannot be bound, or it is not loopback and there
        is no key and no ``insecure``).
    """
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("openstarry serve needs uvicorn: pip install 'openstarry[http]'") from exc
    bound_host = host
    if sock is not None:
        bound_host = str(sock.getsockname()[0])
    try:
        check_bind(bound_host, api_key, insecure=insecure)
    except ValueError as exc:
        log.error("openstarry serve: %s", exc)
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 1
    limits = limits or ServerLimits()
    app = create_app(agent, limits=limits, api_key=api_key)
    api: RunsApi = app.state.openstarry
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        # The drain has ended every stream by then: this only bounds a stuck send.
        timeout_graceful_shutdown=5,
        log_level="info",
    )
    server = graceful_server(
        config,
        drain=lambda: api.drain(limits.shutdown_grace),
        connection_limits=ConnectionLimits(
            max_connections=limits.max_connections,
            max_connections_per_address=limits.max_connections_per_address,
            header_timeout=limits.header_timeout,
        ),
    )
    try:
        server.run(sockets=[sock] if sock is not None else None)
    except SystemExit as exc:  # uvicorn exits when it cannot bind
        return 1 if exc.code else 0
    if not server.started:
        return 1
    return 130 if signal.SIGINT in server.signals else 0
