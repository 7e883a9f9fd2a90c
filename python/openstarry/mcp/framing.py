"""What the MCP server adds around the SDK's transports, below the protocol.

Over stdio, :class:`AnswerTracker` notes which requests are still unanswered,
so that a client that closes stdin still gets every answer, and
:func:`malformed` is the JSON-RPC error of a line that is not a message. Over
Streamable HTTP, :class:`UniqueRequestIds` (ASGI middleware) answers a request
that reuses the id of one still running in its session, which the SDK would
leave waiting for ever. :class:`~openstarry.mcp.dispatch.AgentMcpServer` puts
them in place.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio

try:
    import mcp.types as types
    from mcp.shared.message import SessionMessage
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "openstarry.mcp needs the MCP SDK, which is not installed: "
        f"pip install 'openstarry[mcp]' ({exc})"
    ) from exc
from pydantic import ValidationError

from openstarry._http import send_json

__all__ = ["AnswerTracker", "UniqueRequestIds", "first_line", "malformed"]

log = logging.getLogger("openstarry.mcp")


class AnswerTracker:
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

    async def __aenter__(self) -> AnswerTracker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class UniqueRequestIds:
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


def malformed(exc: Exception) -> types.ErrorData:
    """The JSON-RPC error of a line the stdio reader could not take as a message."""
    if isinstance(exc, ValidationError) and any(
        error["type"] == "json_invalid" for error in exc.errors()
    ):
        return types.ErrorData(code=types.PARSE_ERROR, message="Parse error")
    return types.ErrorData(
        code=types.INVALID_REQUEST,
        message="Invalid Request: not a JSON-RPC 2.0 request, notification or response",
    )


def first_line(exc: Exception) -> str:
    return str(exc).partition("\n")[0]
