"""The console and the observability endpoints of ``openstarry serve``.

- ``GET /``: the console, a page to talk to the agent and watch its bus (static
  HTML, CSS and JavaScript shipped beside this module, in
  ``openstarry/api/console/``, read as this package's data; nothing is fetched
  from elsewhere);
- ``GET /events``: the bus as Server-Sent Events (:mod:`openstarry.api.events`);
- ``GET /metrics``: the Prometheus text format (:mod:`openstarry.api.metrics`);
  ``GET /metrics.json``: the same numbers as JSON, for the console's charts;
- ``POST /stop``: ``{"session_id": ...}`` sends ``/stop`` to that session at
  priority 0 (it overtakes everything waiting on the bus); ``202``.

With an API key, the page and its files are served to anyone (they hold
nothing but the console's code); everything else needs the key or the
console's sign-in (:mod:`openstarry.api.signin`).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING

from openstarry.api.events import EventFeed, events_endpoint
from openstarry.api.metrics import AgentMetrics
from openstarry.core import Event
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import EventType

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from openstarry.agent.runtime import Agent

__all__ = ["PUBLIC_PATHS", "console_routes"]

_STATIC = ("index.html", "console.css", "console.js")
#: The console's page and files: static, so they need no key (the page signs in).
PUBLIC_PATHS = ("/", *(f"/console/{name}" for name in _STATIC))
_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css", ".js": "text/javascript"}
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def _static(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


def console_routes(agent: Agent) -> list[BaseRoute]:
    """The routes of the console, ``/events``, ``/metrics`` and ``/stop`` for ``agent``.

    Call it before the agent starts: the event feed and the metrics subscribe
    to its bus, and the metrics time its provider.
    """
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    feed = EventFeed(agent.bus)
    metrics = AgentMetrics(agent)

    async def page(request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        if name not in _STATIC:
            return JSONResponse({"code": "not_found", "message": name}, status_code=404)
        suffix = name[name.rindex(".") :]
        return Response(
            _static(name), media_type=_TYPES[suffix], headers={"cache-control": "no-cache"}
        )

    async def events(request: Request) -> Response:
        return await events_endpoint(feed, request)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=_PROMETHEUS)

    async def metrics_json(request: Request) -> Response:
        snapshot = metrics.snapshot()
        snapshot["agent"] = agent.name
        snapshot["events_clients"] = len(feed.clients)
        return Response(json.dumps(snapshot).encode(), media_type="application/json")

    async def stop(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = None
        session = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(session, str) or not session or len(session) > 200:
            return JSONResponse(
                {"code": "invalid_request", "message": 'expected {"session_id": "..."}'},
                status_code=422,
            )
        event = Event.new(
            EventType.SYSTEM_COMMAND.value,
            {"command": "stop", "args": []},
            source="openstarry.console",
            session_id=session,
            priority=0,
        )
        try:
            agent.bus.publish(event)
        except (QueueFull, QueueClosed) as exc:
            return JSONResponse({"code": "unavailable", "message": str(exc)}, status_code=503)
        return JSONResponse({"status": "stop sent", "session_id": session}, status_code=202)

    return [
        Route("/", page, methods=["GET"]),
        Route("/console/{name}", page, methods=["GET"]),
        Route("/events", events, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/metrics.json", metrics_json, methods=["GET"]),
        Route("/stop", stop, methods=["POST"]),
    ]
