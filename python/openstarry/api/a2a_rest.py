"""A2A 1.0's HTTP+JSON binding on ``openstarry serve``: the methods of the JSON-RPC
binding (:class:`~openstarry.api.a2a.A2AMethods`) as resources under ``/a2a``, on the
same port, auth and limits.

=========================================  ============================================
``POST /a2a/message:send``                 ``SendMessage``: the body is its request
``POST /a2a/message:stream``               ``SendStreamingMessage``: server-sent events
``GET /a2a/tasks/{id}``                    ``GetTask`` (``?historyLength=N``)
``GET /a2a/tasks``                         ``ListTasks`` (its fields as query parameters)
``POST /a2a/tasks/{id}:cancel``            ``CancelTask``
``POST`` or ``GET /a2a/tasks/{id}:subscribe``  ``SubscribeToTask``: server-sent events
=========================================  ============================================

A result is the JSON-RPC method's result, and a streamed event its ``StreamResponse``,
each bare (no JSON-RPC envelope). An error is a ``google.rpc.Status`` with the HTTP
status of A2A's mapping, and an ``ErrorInfo`` detail whose ``reason`` names it
(``TASK_NOT_FOUND`` with 404, ``INVALID_PARAMS`` with 400, ...): never a 5xx for bad
input. The push notification configurations and the extended card are answered as
over JSON-RPC: not supported.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from openstarry.api.a2a import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PUSH_NOT_SUPPORTED,
    RECURSION_LIMIT_EXCEEDED,
    TASK_NOT_CANCELABLE,
    TASK_NOT_FOUND,
    UNSUPPORTED,
    VERSION_NOT_SUPPORTED,
    A2AError,
    A2AMethods,
    check_version,
    events,
)
from openstarry.api.routes import check_content_type, read_body
from openstarry.api.runs import ApiError

try:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute, Route
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.api.server needs Starlette and uvicorn: pip install 'openstarry[http]'"
    ) from exc

__all__ = ["rest_routes"]

#: A2A's error codes as HTTP+JSON says them: (HTTP status, google.rpc status, reason).
_MAPPED: dict[int, tuple[int, str, str]] = {
    TASK_NOT_FOUND: (404, "NOT_FOUND", "TASK_NOT_FOUND"),
    TASK_NOT_CANCELABLE: (400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE"),
    PUSH_NOT_SUPPORTED: (400, "FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED"),
    UNSUPPORTED: (400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION"),
    VERSION_NOT_SUPPORTED: (400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"),
    INVALID_PARAMS: (400, "INVALID_ARGUMENT", "INVALID_PARAMS"),
    INVALID_REQUEST: (400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    PARSE_ERROR: (400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    METHOD_NOT_FOUND: (404, "NOT_FOUND", "METHOD_NOT_FOUND"),
    RECURSION_LIMIT_EXCEEDED: (400, "FAILED_PRECONDITION", "RECURSION_LIMIT_EXCEEDED"),
}
#: Query parameters that are numbers, and the one that is a boolean.
_NUMBERS = frozenset({"historyLength", "pageSize"})
_FLAGS = frozenset({"includeArtifacts"})

Handler = Callable[[Request], Awaitable[Response]]


def _problem(code: int, message: str) -> Response:
    """An A2A error as HTTP+JSON answers it."""
    http, status, reason = _MAPPED.get(code, (400, "INVALID_ARGUMENT", "INVALID_REQUEST"))
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "a2a-protocol.org",
    }
    body = {"error": {"code": http, "status": status, "message": message, "details": [info]}}
    return Response(json.dumps(body).encode(), status_code=http, media_type="application/json")


def _json(result: dict[str, Any]) -> Response:
    body = json.dumps(result, ensure_ascii=False).encode()
    return Response(body, media_type="application/json")


def _bare(result: dict[str, Any]) -> bytes:
    """The server-sent event of a ``StreamResponse``, bare."""
    return b"data: " + json.dumps(result, ensure_ascii=False).encode() + b"\n\n"


def _query(request: Request) -> dict[str, Any]:
    """A method's fields from the query string (numbers and flags read as such)."""
    params: dict[str, Any] = {}
    for key, value in request.query_params.items():
        if key == "A2A-Version":
            continue
        if key in _NUMBERS:
            digits = value.removeprefix("-")
            params[key] = int(value) if digits.isascii() and digits.isdigit() else value
        elif key in _FLAGS:
            params[key] = value.lower() == "true"
        else:
            params[key] = value
    return params


def rest_routes(methods: A2AMethods) -> list[BaseRoute]:
    """The HTTP+JSON binding's resources, over ``methods``."""
    limits = methods.api.limits

    def answered(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                check_version(request)
                return await handler(request)
            except A2AError as exc:
                return _problem(exc.code, exc.message)
            except ApiError as exc:  # the body's size, time or type
                return _problem(INVALID_REQUEST, f"{exc.code}: {exc.message}")

        return endpoint

    async def body_of(request: Request) -> dict[str, Any]:
        check_content_type(request)
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout)
        try:
            params = json.loads(body)
        except ValueError:
            raise A2AError(PARSE_ERROR, "the body is not JSON") from None
        if not isinstance(params, dict):
            raise A2AError(INVALID_REQUEST, "the body is a JSON object")
        return params

    async def send(request: Request) -> Response:
        return _json(await methods.send(await body_of(request)))

    async def stream(request: Request) -> Response:
        return events(methods.stream(methods.start(await body_of(request)), _bare))

    async def get_task(request: Request) -> Response:
        return _json(methods.get({**_query(request), "id": request.path_params["id"]}))

    async def list_tasks(request: Request) -> Response:
        return _json(methods.list(_query(request)))

    async def cancel(request: Request) -> Response:
        return _json(await methods.cancel({"id": request.path_params["id"]}))

    async def subscribe(request: Request) -> Response:
        record = methods.tasks.record(request.path_params["id"])
        if record.done:
            raise A2AError(UNSUPPORTED, f"task {record.id} has ended: get it to see how")
        return events(methods.stream(record, _bare))

    async def push(request: Request) -> Response:
        raise A2AError(PUSH_NOT_SUPPORTED, "this agent sends no push notifications")

    async def extended_card(request: Request) -> Response:
        raise A2AError(UNSUPPORTED, "this agent has no extended card")

    async def unknown(request: Request) -> Response:
        raise A2AError(
            METHOD_NOT_FOUND, f"no resource {request.method} {request.url.path[:100]!r} (A2A)"
        )

    every = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return [
        Route("/a2a/message:send", answered(send), methods=["POST"]),
        Route("/a2a/message:stream", answered(stream), methods=["POST"]),
        Route("/a2a/tasks", answered(list_tasks), methods=["GET"]),
        Route("/a2a/tasks/{id}:cancel", answered(cancel), methods=["POST"]),
        Route("/a2a/tasks/{id}:subscribe", answered(subscribe), methods=["GET", "POST"]),
        Route("/a2a/tasks/{id}/pushNotificationConfigs", answered(push), methods=every),
        Route("/a2a/tasks/{id}/pushNotificationConfigs/{cid}", answered(push), methods=every),
        Route("/a2a/tasks/{id}", answered(get_task), methods=["GET"]),
        Route("/a2a/extendedAgentCard", answered(extended_card), methods=["GET"]),
        Route("/a2a/{rest:path}", answered(unknown), methods=every),
    ]
