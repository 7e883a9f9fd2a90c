"""How a response goes out on a connection: an SSE stream, or one JSON body when it is done.

A request with ``"stream": true`` (or a reconnect) gets an :class:`SSEResponse`:
the response's frames from its :class:`~openstarry.api.replay._Record`, from
where the reader is, live until the response ends, with a keep-alive comment
after ``heartbeat`` seconds of silence (and ``heartbeat`` messages for a client
that asks, :mod:`openstarry.api.heartbeat`). ``"stream": false`` gets a
:class:`WaitResponse`: the whole :class:`~openstarry.api.models.AgentResponse`
once the run ends, after a space every ``heartbeat`` seconds so nothing times
out a silent connection.

Both are raw ASGI responses that notice a client leaving even while the run is
silent; each is a reader of its record for as long as it is connected
(:meth:`openstarry.api.runs._Api.attach` and ``detach``), so the run's reconnect
grace starts when the last one leaves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio

from openstarry.api.heartbeat import with_heartbeats
from openstarry.api.models import AgentResponse, Error, RunStatus
from openstarry.api.replay import ReaderGone, ResponseRecord

try:
    from starlette.responses import Response
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.api.server needs Starlette and uvicorn: pip install 'openstarry[http]'"
    ) from exc

if TYPE_CHECKING:
    from openstarry.api.runs import RunsApi

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_MEDIA_TYPE = "application/json"
#: The position of a reader that reads no events (``stream: false``).
_NO_POSITION = 1 << 62
_SSE_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # proxies (nginx) pass events on as they come
}


class SSEResponse(Response):
    """Streams a record's frames; notices a disconnect even while the run is silent."""

    def __init__(self, api: RunsApi, record: ResponseRecord, after: int) -> None:
        # No Response.__init__: it would declare a content-length.
        self.status_code = 200
        self.background = None
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            **_SSE_HEADERS,
            "x-openstarry-response-id": record.id,
        }
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._api = api
        self._record = record
        self._after = after
        # Attached now, so no event is dropped before the stream starts.
        self._reader = api.attach(record, after)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = self._record
        api = self._api
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with anyio.create_task_group() as task_group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    task_group.cancel_scope.cancel()

                task_group.start_soon(watch)
                # Caught in here: the task group would wrap it in an exception group.
                with contextlib.suppress(OSError):  # the client went away mid-send
                    await self._stream(send, scope)
                task_group.cancel_scope.cancel()
        except OSError:
            pass  # the client went away before the stream started
        finally:
            api.detach(record, self._reader)

    async def _stream(self, send: Send, scope: Scope) -> None:
        record = self._record
        frames = record.frames_after(self._after, self._api.limits.heartbeat, self._reader)
        frames = with_heartbeats(scope, record.id, frames)  # heartbeat messages, if asked
        try:
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
        except ReaderGone as exc:
            # A reader that fell behind the buffer: say so, and end the stream.
            comment = f": {exc}\n\n".encode()
            await send({"type": "http.response.body", "body": comment, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class WaitResponse(Response):
    """``stream: false``: waits for the run to end, then sends the whole response.

    A run that takes longer than ``heartbeat`` gets its ``200`` and headers
    then, and a space every ``heartbeat`` seconds until the response follows:
    JSON ignores whitespace before a value, and a client or proxy that times
    out a silent connection (httpx, by default) does not cut the run.
    """

    def __init__(self, api: RunsApi, record: ResponseRecord) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = []
        self._api = api
        self._record = record
        # A reader for the grace period, at no position: it holds no event in the buffer.
        self._reader = api.attach(record, _NO_POSITION)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = self._record
        api = self._api
        gone = False
        started = False
        try:
            async with anyio.create_task_group() as task_group:

                async def watch() -> None:
                    nonlocal gone
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    gone = True
                    task_group.cancel_scope.cancel()

                task_group.start_soon(watch)
                try:
                    while True:
                        with anyio.move_on_after(api.limits.heartbeat):
                            await record.wait_done()
                        if record.done:
                            break
                        if not started:
                            await send(
                                {
                                    "type": "http.response.start",
                                    "status": 200,
                                    "headers": self._early_headers(),
                                }
                            )
                            started = True
                        await send({"type": "http.response.body", "body": b" ", "more_body": True})
                except OSError:  # caught in here: the task group would wrap it
                    gone = True  # the client went away mid-send
                task_group.cancel_scope.cancel()
        finally:
            api.detach(record, self._reader)
        if gone:
            return
        final = record.final
        if started:
            # The status is sent: a run that ended without a response fails in the body.
            final = final or AgentResponse(
                id=record.id,
                session_id=record.session_id,
                status=RunStatus.Failed,
                error=Error(code="internal_error", message="the run ended without a response"),
                output=[],
            )
            with contextlib.suppress(OSError):
                await send(
                    {
                        "type": "http.response.body",
                        "body": final.wire_json().encode(),
                        "more_body": False,
                    }
                )
            return
        if final is None:
            body = Error(code="internal_error", message="the run ended without a response")
            response = Response(
                body.wire_json().encode(), status_code=500, media_type=JSON_MEDIA_TYPE
            )
        else:
            response = Response(
                final.wire_json().encode(),
                media_type=JSON_MEDIA_TYPE,
                headers={"x-openstarry-response-id": record.id},
            )
        with contextlib.suppress(OSError):
            await response(scope, receive, send)

    def _early_headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", JSON_MEDIA_TYPE.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-openstarry-response-id", self._record.id.encode("latin-1")),
        ]
