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
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import sys
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    MutableMapping,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from openstarry._http import ConnectionLimits, check_bind, graceful_server
from openstarry.agent.commands import BUILTIN_COMMANDS, find_tool, parse_line
from openstarry.api.adapter import RunStream, check_request, open_run
from openstarry.api.console import PUBLIC_PATHS, console_routes
from openstarry.api.heartbeat import with_heartbeats
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    Error,
    ProtocolError,
    RunStatus,
    parse_request,
)
from openstarry.api.signin import ConsoleAuth, SignIn, signin_routes
from openstarry.api.tracecontext import TraceContextMiddleware
from openstarry.bus import describe_exception
from openstarry.tools import tool_name

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.api.server needs Starlette and uvicorn: pip install 'openstarry[http]'"
    ) from exc

if TYPE_CHECKING:
    from openstarry.agent.runtime import Agent

__all__ = ["ServerLimits", "create_app", "serve"]

log = logging.getLogger("openstarry.api.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = "application/json"
#: The position of a reader that reads no events (``stream: false``).
_NO_POSITION = 1 << 62
#: The most digits read as a number from a header (a sequence number, a content length).
_MAX_DIGITS = 18
_RESPONSE_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_SSE_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # proxies (nginx) pass events on as they come
}


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The bounds that protect the server; every one is per server unless it says otherwise.

    Attributes:
        max_body_bytes: The largest request body read; a larger one gets 413.
        max_concurrent_runs: Runs at once; more get 503.
        resume_grace: Seconds a run goes on after its last reader disconnected,
            waiting for a reconnect; then it is stopped. 0 stops it at once.
        replay_events: Events kept per response for reconnects (the oldest go first).
        replay_bytes: Bytes of events kept per response.
        max_responses: Responses kept for reconnects (the oldest finished go first).
        response_ttl: Seconds a finished response is kept for reconnects.
        heartbeat: Seconds of silence after which a stream sends an SSE comment,
            so idle connections stay open and dead ones are noticed.
        max_connections: Connections :func:`serve` holds at once. At the limit
            a new connection closes the one that has waited longest for its
            request head (so ``/health`` is still answered under a flood of
            slow clients), or gets ``503`` when every connection is busy.
        max_connections_per_address: Connections at once from one client
            address; more get ``429``. Behind a reverse proxy every client has
            the proxy's address: raise it there.
        header_timeout: Seconds a connection may take to send a request's head
            (its request line and headers); then ``408`` and it is closed.
        body_timeout: Seconds a request's body may take to arrive; then ``408``.
        max_unsent_bytes: Bytes of events a connected reader may fall behind
            by before it is cut off (a reader that keeps up is never cut, however
            large an event is: the replay bounds only limit what is kept for
            reconnects).
        shutdown_grace: Seconds the runs in progress get to finish when the
            server is asked to stop (SIGTERM, SIGINT); then they are stopped and
            end ``canceled``.
        signin_ttl: Seconds a console sign-in lasts (with an API key): its
            session cookie expires then, and the page asks for the key again.
    """

    max_body_bytes: int = 1024 * 1024
    max_concurrent_runs: int = 32
    resume_grace: float = 10.0
    replay_events: int = 10_000
    replay_bytes: int = 2 * 1024 * 1024
    max_responses: int = 64
    response_ttl: float = 300.0
    heartbeat: float = 15.0
    max_connections: int = 4096
    max_connections_per_address: int = 256
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_unsent_bytes: int = 256 * 1024 * 1024
    shutdown_grace: float = 10.0
    signin_ttl: float = 12 * 3600.0

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_concurrent_runs",
            "replay_events",
            "replay_bytes",
            "max_responses",
            "max_connections",
            "max_connections_per_address",
            "max_unsent_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_responses < self.max_concurrent_runs:
            raise ValueError("max_responses must be at least max_concurrent_runs")
        for name in ("resume_grace", "shutdown_grace"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)}")
        for name in ("response_ttl", "heartbeat", "header_timeout", "body_timeout", "signin_ttl"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


#: The error of a response the shutdown stopped.
_SHUTDOWN = Error(code="shutdown", message="the server shut down before the run ended")


class _ApiError(Exception):
    """A request refused with ``status`` and an :class:`Error` body."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def _error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    body = Error(code=code, message=message).wire_json().encode()
    return Response(body, status_code=status, media_type=_JSON, headers=headers)


#: Characters that JSON leaves raw in strings but that line readers built on
#: ``str.splitlines`` (httpx's ``iter_lines``, for one) take for line ends.
_LINE_BREAKERS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _sse_safe(data: str) -> str:
    """``data``, a JSON text, with its U+0085, U+2028 and U+2029 written as ``\\u`` escapes.

    JSON escapes CR and LF, so an event is one ``data:`` line for an SSE reader;
    these three it leaves raw, and a client that splits lines the way
    ``str.splitlines`` does would cut the event in two. Outside strings JSON
    has no such characters, so the escaped text parses to the same value.
    """
    if data.isascii():
        return data
    return data.translate(_LINE_BREAKERS)


class _Gone(Exception):
    """The events a reader asked for are no longer in the buffer."""


class _Record:
    """One response: its events as SSE frames, kept for readers and reconnects."""

    def __init__(self, response_id: str, session_id: str, limits: ServerLimits) -> None:
        self.id = response_id
        self.session_id = session_id
        self._limits = limits
        #: (sequence number, SSE frame), oldest first.
        self.frames: deque[tuple[int, bytes]] = deque()
        self.size = 0
        #: The highest sequence number dropped from the buffer (-1: none).
        self.dropped = -1
        self.last_seq = -1
        self.final: AgentResponse | None = None
        self.done = False
        self.finished_at: float | None = None
        #: Each attached reader's position: the last sequence number it was sent.
        self.cursors: dict[object, int] = {}
        #: Bumped when the last reader leaves: a stale grace timer does nothing.
        self.detach_epoch = 0
        self.run: RunStream | None = None
        self.cancel_requested = False
        #: Stopped to make room for a new run (see ``_Api._make_room``).
        self.evicted = False
        #: Why the server stopped the run, for its final event (``None``: it did not).
        self.stop_reason: Error | None = None
        self._changed = anyio.Event()

    @property
    def readers(self) -> int:
        return len(self.cursors)

    def append(self, seq: int, data: str) -> None:
        """Buffer an event; drop the oldest past the bounds.

        Past ``replay_events`` / ``replay_bytes`` the oldest events go, unless an
        attached reader has not been sent them yet: those stay until it has
        (a single event larger than the bounds included: it is sent live, and
        only its replay is refused). A reader more than ``max_unsent_bytes``
        behind is cut off. Nothing is added once the response has ended.
        """
        if self.done:
            return
        frame = f"id: {self.id}:{seq}\ndata: {_sse_safe(data)}\n\n".encode()
        self.frames.append((seq, frame))
        self.size += len(frame)
        self.last_seq = seq
        self.trim()
        self._notify()

    def trim(self) -> None:
        """Drop the oldest events past the bounds that no attached reader still needs."""
        limits = self._limits
        frames = self.frames
        while frames and (len(frames) > limits.replay_events or self.size > limits.replay_bytes):
            old_seq, old = frames[0]
            # A frame a reader still needs stays, unless that reader is so far
            # behind that what it has not been sent passes max_unsent_bytes.
            needed = bool(self.cursors) and old_seq > min(self.cursors.values())
            if needed and self.size - len(old) <= limits.max_unsent_bytes:
                break
            frames.popleft()
            self.size -= len(old)
            self.dropped = old_seq

    def _over_bounds(self) -> bool:
        limits = self._limits
        return len(self.frames) > limits.replay_events or self.size > limits.replay_bytes

    def finish(self) -> None:
        self.done = True
        self.finished_at = time.monotonic()
        self._notify()

    def with_stop_reason(self, response: AgentResponse) -> AgentResponse:
        """``response`` with the server's reason for stopping it as its error, when
        the server stopped it (shutdown, room for a new run) and it ended ``canceled``."""
        if (
            self.stop_reason is None
            or response.status is not RunStatus.Canceled
            or response.error is not None
        ):
            return response
        return response.model_copy(update={"error": self.stop_reason})

    def end_now(self, status: RunStatus, error: Error) -> None:
        """End the response here with a final event of ``status`` (its run is left behind)."""
        if self.done:
            return
        self.final = AgentResponse(
            id=self.id,
            session_id=self.session_id,
            status=status,
            error=error,
            output=[],
            sequence_number=self.last_seq + 1,
        )
        self.append(self.last_seq + 1, self.final.wire_json())
        self.finish()

    def cancel(self) -> None:
        """Stop the run (it ends ``canceled``); before it has opened, as soon as it does."""
        self.cancel_requested = True
        if self.run is not None:
            self.run.cancel()

    async def wait_done(self) -> None:
        """Wait until the response has ended."""
        while not self.done:
            await self._changed.wait()

    def _frames_after(self, seq: int) -> list[tuple[int, bytes]]:
        """The buffered frames after ``seq``, read from the newest back.

        A reader that keeps up needs the newest one or two: reading from the
        newest costs what is new, where a scan from the oldest would cost the
        whole buffer on each event, quadratic over a long run.
        """
        batch: list[tuple[int, bytes]] = []
        for item in reversed(self.frames):
            if item[0] <= seq:
                break
            batch.append(item)
        batch.reverse()
        return batch

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def frames_after(
        self, seq: int, heartbeat: float, reader: object | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The frames after sequence number ``seq``, live until the response ends.

        ``reader``, an attached reader's token, has its position kept up to date.

        Raises:
            _Gone: a frame after ``seq`` has been dropped from the buffer (also
                raised while streaming, when a slow reader falls that far behind).
        """
        while True:
            changed = self._changed
            if seq < self.dropped:
                raise _Gone(
                    f"events after {seq} of {self.id} are no longer buffered "
                    f"(the oldest kept is {self.dropped + 1})"
                )
            batch = self._frames_after(seq)
            if batch:
                for s, frame in batch:
                    yield frame
                    seq = s
                    if reader is not None and reader in self.cursors:
                        self.cursors[reader] = s
                if reader is not None and self._over_bounds():
                    self.trim()  # what only this reader still needed can go now
                continue
            if self.done:
                return
            with anyio.move_on_after(heartbeat) as scope:
                await changed.wait()
            if scope.cancelled_caught:
                yield b": keep-alive\n\n"


class _SSEResponse(Response):
    """Streams a record's frames; notices a disconnect even while the run is silent."""

    def __init__(self, api: _Api, record: _Record, after: int) -> None:
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
        except _Gone as exc:
            # A reader that fell behind the buffer: say so, and end the stream.
            comment = f": {exc}\n\n".encode()
            await send({"type": "http.response.body", "body": comment, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _WaitResponse(Response):
    """``stream: false``: waits for the run to end, then sends the whole response.

    A run that takes longer than ``heartbeat`` gets its ``200`` and headers
    then, and a space every ``heartbeat`` seconds until the response follows:
    JSON ignores whitespace before a value, and a client or proxy that times
    out a silent connection (httpx, by default) does not cut the run.
    """

    def __init__(self, api: _Api, record: _Record) -> None:
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
            response = Response(body.wire_json().encode(), status_code=500, media_type=_JSON)
        else:
            response = Response(
                final.wire_json().encode(),
                media_type=_JSON,
                headers={"x-openstarry-response-id": record.id},
            )
        with contextlib.suppress(OSError):
            await response(scope, receive, send)

    def _early_headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", _JSON.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-openstarry-response-id", self._record.id.encode("latin-1")),
        ]


class _Api:
    """The server's state: the agent, the responses kept, and the runs' task group."""

    def __init__(
        self, agent: Agent, limits: ServerLimits, expose_tools: Collection[str] | None = None
    ) -> None:
        self.agent = agent
        self.limits = limits
        self.records: OrderedDict[str, _Record] = OrderedDict()
        #: The response running in each busy session.
        self.sessions: dict[str, str] = {}
        self.running = 0
        #: Runs stopped to make room that have not ended yet (not counted against the cap).
        self.evicted = 0
        self.task_group: anyio.abc.TaskGroup | None = None
        #: Set once the server is shutting down: no new run starts.
        self.draining = False
        manifest = getattr(agent, "manifest", None)
        if expose_tools is None:
            api_config = getattr(manifest, "api", None)
            expose_tools = getattr(api_config, "expose_tools", None) or ()
        mcp_config = getattr(manifest, "mcp", None)
        private = set(getattr(mcp_config, "private_tools", None) or ())
        private_names = {tool_name(entry) for entry in private}
        #: The tools a slash command over HTTP may run (never a private one).
        self.expose_tools = frozenset(
            name for name in map(tool_name, expose_tools) if name not in private_names
        )

    # -- records ---------------------------------------------------------

    def _purge(self) -> None:
        now = time.monotonic()
        ttl = self.limits.response_ttl
        for key in [
            key
            for key, record in self.records.items()
            if record.done and record.finished_at is not None and now - record.finished_at > ttl
        ]:
            del self.records[key]
        excess = len(self.records) - self.limits.max_responses + 1
        if excess > 0:
            finished = [key for key, record in self.records.items() if record.done]
            for key in finished[:excess]:
                del self.records[key]

    def find(self, response_id: str) -> _Record:
        self._purge()
        record = self.records.get(response_id)
        if record is None:
            raise _ApiError(
                404,
                "response_not_found",
                f"no response {response_id!r} is kept here (unknown, or expired)",
            )
        return record

    def attach(self, record: _Record, after: int) -> object:
        """A new reader of ``record``, at sequence number ``after``; its token."""
        token = object()
        record.cursors[token] = after
        return token

    def detach(self, record: _Record, token: object) -> None:
        """A reader has gone: the last one leaving starts the grace period."""
        record.cursors.pop(token, None)
        record.trim()
        if record.readers > 0 or record.done:
            return
        record.detach_epoch += 1
        grace = self.limits.resume_grace
        if grace == 0 or self.task_group is None:
            record.cancel()
        else:
            self.task_group.start_soon(self._cancel_later, record, record.detach_epoch, grace)

    async def _cancel_later(self, record: _Record, epoch: int, grace: float) -> None:
        await anyio.sleep(grace)
        if record.readers == 0 and record.detach_epoch == epoch and not record.done:
            log.info("response %s: nobody reconnected within %g s; stopping it", record.id, grace)
            record.cancel()

    # -- runs ------------------------------------------------------------

    def check_command(self, text: str) -> None:
        """Refuse a slash command that would run a tool not in ``api.expose_tools``."""
        command = parse_line(text)
        if command is None or command.is_builtin:
            return
        tool = find_tool(command.name, self.agent.loop.tools)
        if tool is None or tool.name not in self.expose_tools:
            allowed = ", ".join(f"/{name}" for name in sorted(self.expose_tools)) or "none"
            raise _ApiError(
                403,
                "command_not_allowed",
                f"/{command.name} is not a command callers over HTTP may run; built-ins: "
                f"{', '.join('/' + c for c in BUILTIN_COMMANDS)}; tools: {allowed} "
                "(the manifest's api.expose_tools)",
            )

    def _make_room(self) -> bool:
        """At the run cap, stop the oldest run nobody reads (waiting out its
        reconnect grace) so a new request can take its place; whether one was."""
        for record in self.records.values():
            if not record.done and record.readers == 0 and not record.evicted:
                log.info("response %s: nobody reads it; stopped to make room", record.id)
                record.evicted = True
                self.evicted += 1
                record.stop_reason = Error(
                    code="evicted",
                    message="stopped to make room for a new run: nobody was reading it",
                )
                record.cancel()
                return True
        return False

    def start(self, request: AgentRequest) -> _Record:
        """Check that the request may run now, and start its run."""
        task_group = self.task_group
        if task_group is None or self.draining:
            raise _ApiError(
                503,
                "shutting_down" if self.draining else "unavailable",
                "the server is shutting down"
                if self.draining
                else "the server is not running its agent",
            )
        self._purge()
        session_id = request.session_id or f"session_{uuid.uuid4()}"
        busy = self.sessions.get(session_id)
        if busy is not None:
            raise _ApiError(
                409,
                "session_busy",
                f"session {session_id!r} is running response {busy}; "
                f"resume it with GET /process/{busy} or wait until it ends",
            )
        response_id = request.response_id or f"response_{uuid.uuid4()}"
        if not _RESPONSE_ID.fullmatch(response_id):
            raise _ApiError(
                422,
                "invalid_request",
                "response_id: 1 to 200 letters, digits, '_', '-' or '.' "
                "(it goes into SSE ids and headers)",
            )
        if response_id in self.records:
            raise _ApiError(
                409,
                "response_exists",
                f"response {response_id!r} exists; resume it with GET /process/{response_id}",
            )
        if self.running - self.evicted >= self.limits.max_concurrent_runs and not self._make_room():
            raise _ApiError(
                503,
                "too_many_runs",
                f"the server is running {self.running} requests, its limit; retry shortly",
                headers={"retry-after": "1"},
            )
        request = request.model_copy(update={"session_id": session_id})
        record = _Record(response_id, session_id, self.limits)
        self.records[response_id] = record
        self.sessions[session_id] = response_id
        self.running += 1
        task_group.start_soon(self._drive, record, request, name=f"openstarry.api {response_id}")
        return record

    async def _drive(self, record: _Record, request: AgentRequest) -> None:
        try:
            async with open_run(self.agent, request, response_id=record.id) as run:
                record.run = run
                if record.cancel_requested:
                    run.cancel()
                async for event in run:
                    seq = event.sequence_number
                    assert seq is not None
                    if isinstance(event, AgentResponse):
                        event = record.with_stop_reason(event)
                    record.append(seq, event.wire_json())
                if not record.done:  # (the shutdown may have ended it already)
                    record.final = run.final and record.with_stop_reason(run.final)
        except Exception as exc:
            log.exception("response %s: the run failed", record.id)
            # Every stream ends with a terminal event, even this one.
            record.final = AgentResponse(
                id=record.id,
                session_id=record.session_id,
                status=RunStatus.Failed,
                error=Error(code="internal_error", message=describe_exception(exc)),
                output=[],
                sequence_number=record.last_seq + 1,
            )
            record.append(record.last_seq + 1, record.final.wire_json())
        finally:
            record.run = None
            record.finish()
            self.running -= 1
            if record.evicted:
                self.evicted -= 1
            if self.sessions.get(record.session_id) == record.id:
                del self.sessions[record.session_id]

    async def stop_all(self) -> None:
        for record in list(self.records.values()):
            if not record.done:
                record.cancel()

    async def drain(self, grace: float, stop_wait: float = 5.0) -> None:
        """Shut down gracefully: refuse new runs, give the runs ``grace`` seconds,
        then stop them, and wait until every open stream has been sent its end.

        A run that does not end within ``stop_wait`` seconds of being stopped is
        ended here: its response ends ``canceled`` with an error saying why.
        """
        self.draining = True
        pending = [record for record in self.records.values() if not record.done]
        if pending:
            log.info("shutting down: %d run(s) in progress get %g s to finish", len(pending), grace)
        with anyio.move_on_after(grace):
            for record in pending:
                await record.wait_done()
        left = [record for record in pending if not record.done]
        for record in left:
            log.info("response %s: stopped by the shutdown", record.id)
            record.stop_reason = _SHUTDOWN
            record.cancel()
        with anyio.move_on_after(stop_wait):
            for record in left:
                await record.wait_done()
        for record in left:
            if not record.done:
                record.end_now(RunStatus.Canceled, _SHUTDOWN)
        # The streams end once their readers have been sent the final event.
        with anyio.move_on_after(stop_wait):
            while any(record.readers for record in pending):
                await anyio.sleep(0.02)


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request's body, at most ``limit`` bytes, within ``timeout`` seconds."""
    with anyio.move_on_after(timeout) as scope:
        return await _read_body_now(request, limit)
    assert scope.cancelled_caught
    raise _ApiError(408, "request_timeout", f"the request body did not arrive within {timeout:g} s")


async def _read_body_now(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if (
        length is not None
        and length.isascii()
        and length.isdigit()
        and (len(length) > _MAX_DIGITS or int(length) > limit)
    ):
        raise _ApiError(
            413, "request_too_large", f"a request body is at most {limit} bytes, not {length[:20]}"
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _ApiError(
                    413, "request_too_large", f"a request body is at most {limit} bytes"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise _ApiError(400, "client_disconnected", "the client left mid-request") from None
    return b"".join(chunks)


def _check_content_type(request: Request) -> None:
    kind = request.headers.get("content-type")
    if kind is None:
        return
    media = kind.split(";", 1)[0].strip().lower()
    if media != _JSON and not media.endswith("+json"):
        raise _ApiError(
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
        raise _ApiError(
            400,
            "invalid_last_event_id",
            f"Last-Event-ID must be '<response id>:<sequence number>' or a number, not {header!r}",
        )
    if named and response_id is not None and named != response_id:
        raise _ApiError(
            400,
            "invalid_last_event_id",
            f"Last-Event-ID names response {named!r}, not {response_id!r}",
        )
    return (named or response_id), int(number)


def _resume(api: _Api, response_id: str | None, header: str | None) -> Response:
    after = -1
    if header is not None and header.strip():
        response_id, after = _last_event(header, response_id)
    if response_id is None:
        raise _ApiError(
            400,
            "invalid_last_event_id",
            "a Last-Event-ID of a POST must name its response ('<response id>:<number>')",
        )
    record = api.find(response_id)
    if after > record.last_seq:
        raise _ApiError(
            400,
            "invalid_last_event_id",
            f"response {response_id} has no event {after} (its last is {record.last_seq})",
        )
    if after < record.dropped:
        raise _ApiError(
            410,
            "events_expired",
            f"events after {after} of {response_id} are no longer buffered "
            f"(the oldest kept is {record.dropped + 1})",
        )
    return _SSEResponse(api, record, after)


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
    api = _Api(agent, limits or ServerLimits(), expose_tools)
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

    async def process(request: Request) -> Response:
        try:
            # An empty Last-Event-ID is no event id at all (an SSE client sends
            # none before its first event): a fresh request, not a resume.
            resume_from = request.headers.get("last-event-id", "").strip() or None
            _check_content_type(request)
            body = await _read_body(request, api.limits.max_body_bytes, api.limits.body_timeout)
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
                return _SSEResponse(api, record, -1)
            return _WaitResponse(api, record)
        except _ApiError as exc:
            return _error_response(exc.status, exc.code, exc.message, exc.headers)

    async def resume(request: Request) -> Response:
        try:
            return _resume(
                api, request.path_params["response_id"], request.headers.get("last-event-id")
            )
        except _ApiError as exc:
            return _error_response(exc.status, exc.code, exc.message, exc.headers)

    async def health(request: Request) -> Response:
        running = api.task_group is not None
        body = {
            "status": "ok" if running else "unavailable",
            "agent": agent.name,
            "runs": api.running,
            "responses": len(api.records),
        }
        return Response(
            json.dumps(body).encode(), status_code=200 if running else 503, media_type=_JSON
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        headers = dict(exc.headers) if exc.headers else None
        return _error_response(
            exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail), headers
        )

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
        return _error_response(500, "internal_error", "the server failed to handle the request")

    app = Starlette(
        routes=[
            Route("/process", process, methods=["POST"]),
            Route("/process/{response_id}", resume, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            # The console, /events, /metrics and /stop (openstarry.api.console).
            *console_routes(agent),
            # With a key, the console's sign-in (openstarry.api.signin).
            *(signin_routes(signin, api.limits.body_timeout) if signin is not None else []),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
        middleware=(
            [
                Middleware(
                    ConsoleAuth,
                    signin=signin,
                    public={"/health", "/signin", "/signout", *PUBLIC_PATHS},
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
    the connections close, the agent stops, and the function returns 0.

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
        The exit status: 0 after a clean shutdown, 1 when the server could not
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
    api: _Api = app.state.openstarry
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
    return 0 if server.started else 1
