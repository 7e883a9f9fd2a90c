"""The Agent API's own routes: ``POST /process``, ``GET /process/{response_id}``, ``GET /health``.

A route reads and checks the request (content type, a body bounded in size and
time, ``Last-Event-ID``), asks :class:`~openstarry.api.runs._Api` to start or
find the response, and answers with one of :mod:`openstarry.api.streams`'
responses. Every refusal, here or in the runs, is an :class:`ApiError` that
becomes a 4xx (or 503) with an :class:`~openstarry.api.models.Error` body; so do
Starlette's own 404 and 405 (:func:`exception_handlers`), and anything
unexpected is a logged 500 with the same body.

:func:`openstarry.api.server.create_app` puts these beside the console's routes
(:mod:`openstarry.api.console`) and the sign-in's (:mod:`openstarry.api.signin`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from openstarry.api.adapter import check_request
from openstarry.api.models import Error, ProtocolError, parse_request
from openstarry.api.runs import ApiError, RunsApi
from openstarry.api.streams import JSON_MEDIA_TYPE, SSEResponse, WaitResponse

try:
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.api.server needs Starlette and uvicorn: pip install 'openstarry[http]'"
    ) from exc

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

# The server's log, under the name it had when the server was one module.
log = logging.getLogger("openstarry.api.server")

#: The most digits read as a number from a header (a sequence number, a content length).
_MAX_DIGITS = 18


def _error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    body = Error(code=code, message=message).wire_json().encode()
    return Response(body, status_code=status, media_type=JSON_MEDIA_TYPE, headers=headers)


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request's body, at most ``limit`` bytes, within ``timeout`` seconds."""
    with anyio.move_on_after(timeout) as scope:
        return await _read_body_now(request, limit)
    assert scope.cancelled_caught
    raise ApiError(408, "request_timeout", f"the request body did not arrive within {timeout:g} s")


async def _read_body_now(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if (
        length is not None
        and length.isascii()
        and length.isdigit()
        and (len(length) > _MAX_DIGITS or int(length) > limit)
    ):
        raise ApiError(
            413, "request_too_large", f"a request body is at most {limit} bytes, not {length[:20]}"
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "request_too_large", f"a request body is at most {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "client_disconnected", "the client left mid-request") from None
    return b"".join(chunks)


def check_content_type(request: Request) -> None:
    kind = request.headers.get("content-type")
    if kind is None:
        return
    media = kind.split(";", 1)[0].strip().lower()
    if media != JSON_MEDIA_TYPE and not media.endswith("+json"):
        raise ApiError(
            415, "unsupported_media_type", f"the body must be application/json, not {media!r}"
        )


def _last_event(header: str, response_id: str | None) -> tuple[str | None, int]:
    """``(response id or None, sequence number)`` of a ``Last-Event-ID`` header.

    The number is ASCII digits only: ``str.isdigit`` also takes ``"²"`` and
    Arabic-Indic digits, which ``int`` refuses, and ``int`` refuses more than
    4300 digits; either would otherwise be a 500.
    """
    named, sep, number = header.strip().rpartition(":")
    if (
        not (number.isascii() and number.isdigit())
        or len(number) > _MAX_DIGITS
        or (sep and not named)
    ):
        raise ApiError(
            400,
            "invalid_last_event_id",
            f"Last-Event-ID must be '<response id>:<sequence number>' or a number, not {header!r}",
        )
    if named and response_id is not None and named != response_id:
        raise ApiError(
            400,
            "invalid_last_event_id",
            f"Last-Event-ID names response {named!r}, not {response_id!r}",
        )
    return (named or response_id), int(number)


def _resume(api: RunsApi, response_id: str | None, header: str | None) -> Response:
    after = -1
    if header is not None and header.strip():
        response_id, after = _last_event(header, response_id)
    if response_id is None:
        raise ApiError(
            400,
            "invalid_last_event_id",
            "a Last-Event-ID of a POST must name its response ('<response id>:<number>')",
        )
    record = api.find(response_id)
    if after > record.last_seq:
        raise ApiError(
            400,
            "invalid_last_event_id",
            f"response {response_id} has no event {after} (its last is {record.last_seq})",
        )
    if after < record.dropped:
        raise ApiError(
            410,
            "events_expired",
            f"events after {after} of {response_id} are no longer buffered "
            f"(the oldest kept is {record.dropped + 1})",
        )
    return SSEResponse(api, record, after)


def api_routes(api: RunsApi) -> list[BaseRoute]:
    """The routes of the Agent API served by ``api``: ``/process``, its resume, ``/health``."""

    async def process(request: Request) -> Response:
        try:
            # An empty Last-Event-ID is no event id at all (an SSE client sends
            # none before its first event): a fresh request, not a resume.
            resume_from = request.headers.get("last-event-id", "").strip() or None
            check_content_type(request)
            body = await read_body(request, api.limits.max_body_bytes, api.limits.body_timeout)
            if resume_from is not None:
                # A retry of a streamed request: resume the response it started
                # (named by the header, or by the body's response_id).
                try:
                    named = parse_request(body).response_id
                except ProtocolError:
                    named = None
                return _resume(api, named, resume_from)
            try:
                agent_request = parse_request(body)
                text = check_request(agent_request, api.agent)
            except ProtocolError as exc:
                return _error_response(exc.http_status, exc.code, str(exc))
            api.check_command(text)
            record = api.start(agent_request)
            if agent_request.stream:
                return SSEResponse(api, record, -1)
            return WaitResponse(api, record)
        except ApiError as exc:
            return _error_response(exc.status, exc.code, exc.message, exc.headers)

    async def resume(request: Request) -> Response:
        try:
            return _resume(
                api, request.path_params["response_id"], request.headers.get("last-event-id")
            )
        except ApiError as exc:
            return _error_response(exc.status, exc.code, exc.message, exc.headers)

    async def health(request: Request) -> Response:
        running = api.task_group is not None
        body = {
            "status": "ok" if running else "unavailable",
            "agent": api.agent.name,
            "runs": api.running,
            "responses": len(api.records),
        }
        return Response(
            json.dumps(body).encode(),
            status_code=200 if running else 503,
            media_type=JSON_MEDIA_TYPE,
        )

    return [
        Route("/process", process, methods=["POST"]),
        Route("/process/{response_id}", resume, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    headers = dict(exc.headers) if exc.headers else None
    return _error_response(
        exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail), headers
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
    return _error_response(500, "internal_error", "the server failed to handle the request")


def exception_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette's 404 and 405, and any unexpected error (a 500), as :class:`Error` bodies."""
    return {HTTPException: _http_error, Exception: _server_error}
