"""``GET /events``: the agent's bus as Server-Sent Events.

Each event on the bus is one SSE event: ``id:`` a number counting the bus's
events since the server started, ``event: bus``, and one ``data:`` line holding
its spec 002 envelope (``{"id", "type", "priority", "traceId", "parentId",
"sessionId", "source", "timestamp", "payload"}``).

Query parameters:

``type``
    Type patterns as the bus takes them (``EXEC:TOOL_CALL``, ``EXEC:*``,
    ``*``), comma-separated or repeated; by default every event.
``session``
    Only the events of these sessions (comma-separated or repeated).

A client that reconnects with ``Last-Event-ID`` gets the events after it that
are still among the last :attr:`EventFeed.replay` kept, then the live stream.

Memory is bounded per client: events wait for a slow client in a queue of at
most ``client_buffer`` events; a client that falls that far behind is sent a
final comment (``: dropped: ...``) and its stream ends, instead of the server
holding more and more for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

import anyio

from openstarry.core import Event, encode_event

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from openstarry.bus import EventBus

__all__ = ["EventFeed"]

#: Characters JSON leaves raw but line readers take for line ends (see api.server).
_LINE_BREAKERS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _matcher(patterns: list[str]) -> set[str] | None:
    """The patterns, checked; ``None`` when they take every event."""
    if not patterns or "*" in patterns:
        return None
    for pattern in patterns:
        namespace, colon, name = pattern.partition(":")
        if not (colon and namespace and name) or "*" in namespace or ("*" in name and name != "*"):
            raise ValueError(
                f"type {pattern!r}: expected TYPE like 'EXEC:TOOL_CALL', 'NAMESPACE:*' or '*'"
            )
    return set(patterns)


def _matches(patterns: set[str] | None, event_type: str) -> bool:
    if patterns is None:
        return True
    return event_type in patterns or f"{event_type.partition(':')[0]}:*" in patterns


def frame(seq: int, event: Event) -> bytes:
    """One SSE frame of ``event``."""
    data = encode_event(event).decode()
    if not data.isascii():
        data = data.translate(_LINE_BREAKERS)
    return f"id: {seq}\nevent: bus\ndata: {data}\n\n".encode()


class _Client:
    __slots__ = ("changed", "dropped", "patterns", "queue", "sessions")

    def __init__(self, patterns: set[str] | None, sessions: set[str] | None) -> None:
        self.patterns = patterns
        self.sessions = sessions
        self.queue: deque[tuple[int, Event]] = deque()
        self.dropped = False
        self.changed = anyio.Event()

    def wants(self, event: Event) -> bool:
        return _matches(self.patterns, event.type) and (
            self.sessions is None or event.session_id in self.sessions
        )

    def wake(self) -> None:
        self.changed.set()


class EventFeed:
    """One subscription to every event of a bus, fanned out to the SSE clients.

    Args:
        bus: The bus to follow (subscribed at once; the bus need not run yet).
        replay: Recent events kept for clients that reconnect with ``Last-Event-ID``.
        client_buffer: Events that may wait for one client; past it, it is dropped.
        heartbeat: Seconds of silence after which a client is sent ``: keep-alive``.
    """

    def __init__(
        self,
        bus: EventBus,
        *,
        replay: int = 1000,
        client_buffer: int = 1000,
        heartbeat: float = 15.0,
    ) -> None:
        if replay < 0 or client_buffer < 1:
            raise ValueError("replay must be 0 or more and client_buffer at least 1")
        self.replay = replay
        self.client_buffer = client_buffer
        self.heartbeat = heartbeat
        self.recent: deque[tuple[int, Event]] = deque(maxlen=replay or None)
        self.seq = 0
        self.clients: set[_Client] = set()
        self.dropped_clients = 0
        self.subscription = bus.subscribe("*", self._on_event)

    def _on_event(self, event: Event) -> None:
        self.seq += 1
        item = (self.seq, event)
        if self.replay:
            self.recent.append(item)
        for client in self.clients:
            if client.dropped or not client.wants(event):
                continue
            if len(client.queue) >= self.client_buffer:
                client.dropped = True
                client.queue.clear()
                self.dropped_clients += 1
            else:
                client.queue.append(item)
            client.wake()

    def open(
        self,
        types: Iterable[str] = (),
        sessions: Iterable[str] = (),
        last_event_id: int | None = None,
    ) -> _Client:
        """A new client, with the kept events after ``last_event_id`` already queued.

        Raises:
            ValueError: a type pattern is malformed.
        """
        session_set = set(sessions) or None
        client = _Client(_matcher(list(types)), session_set)
        if last_event_id is not None:
            for seq, event in self.recent:
                if seq > last_event_id and client.wants(event):
                    client.queue.append((seq, event))
            while len(client.queue) > self.client_buffer:
                client.queue.popleft()
        self.clients.add(client)
        return client

    async def stream(self, client: _Client) -> AsyncIterator[bytes]:
        """The client's frames until it is dropped or goes away."""
        try:
            yield b": openstarry event stream\nretry: 1000\n\n"
            while True:
                while client.queue:
                    seq, event = client.queue.popleft()
                    yield frame(seq, event)
                if client.dropped:
                    yield (
                        f": dropped: more than {self.client_buffer} events waited for this "
                        "client; reconnect with Last-Event-ID\n\n"
                    ).encode()
                    return
                client.changed = anyio.Event()
                if client.queue or client.dropped:
                    continue
                with anyio.move_on_after(self.heartbeat) as scope:
                    await client.changed.wait()
                if scope.cancelled_caught:
                    yield b": keep-alive\n\n"
        finally:
            self.clients.discard(client)


def _listed(request: Request, name: str) -> list[str]:
    return [
        part.strip()
        for value in request.query_params.getlist(name)
        for part in value.split(",")
        if part.strip()
    ]


async def events_endpoint(feed: EventFeed, request: Request) -> Response:
    """``GET /events``."""
    from starlette.responses import JSONResponse, StreamingResponse

    header = request.headers.get("last-event-id", "").strip()
    last = int(header) if header.isascii() and header.isdigit() and len(header) < 19 else None
    try:
        client = feed.open(_listed(request, "type"), _listed(request, "session"), last)
    except ValueError as exc:
        return JSONResponse({"code": "invalid_request", "message": str(exc)}, status_code=422)
    return StreamingResponse(
        feed.stream(client),
        media_type="text/event-stream; charset=utf-8",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
