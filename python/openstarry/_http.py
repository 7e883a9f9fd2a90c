"""What ``openstarry serve`` and ``openstarry mcp --http`` share in front of their apps.

- :class:`BearerAuth`: an ASGI middleware that asks every request but the
  exempt paths for ``Authorization: Bearer <key>`` (compared in constant
  time) and answers ``401`` with a JSON error otherwise.
- :func:`check_bind`: a server bound to an address other than loopback needs
  a key, unless it is told ``insecure``.
- :class:`ConnectionLimits` and :func:`guarded_protocol`: uvicorn's HTTP
  protocol with a deadline for the request head, a cap on the connections of
  one client address, and a cap on all connections that gives way, when
  reached, by closing the connection that has waited longest for its head
  rather than refusing everyone.
- :func:`graceful_server`: a uvicorn server that, on SIGTERM or SIGINT, stops
  accepting, runs a drain step of the app's (its runs end, their streams get
  their final events) before uvicorn closes the connections, and then
  returns instead of raising the signal again (exit status 0).

Only the standard library is imported here; uvicorn when a server is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BearerAuth",
    "ConnectionLimits",
    "check_bind",
    "graceful_server",
    "guarded_protocol",
    "is_loopback",
    "listen",
    "read_api_key",
    "send_json",
]

log = logging.getLogger("openstarry.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _json_error(code: str, message: str) -> bytes:
    return json.dumps({"code": code, "message": message}).encode()


def read_api_key(env_name: str | None) -> str | None:
    """The key in the environment variable ``env_name`` (``None`` when no name is given).

    Raises:
        ValueError: the variable is unset or empty.
    """
    if env_name is None:
        return None
    key = os.environ.get(env_name, "")
    if not key.strip():
        raise ValueError(f"the environment variable {env_name} holds no API key")
    return key.strip()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, *, insecure: bool) -> None:
    """Refuse to serve on an address other than loopback without a key.

    Raises:
        ValueError: ``host`` is not loopback, no key is set and not ``insecure``.
    """
    if api_key is None and not insecure and not is_loopback(host):
        raise ValueError(
            f"{host} is not a loopback address and no API key is set: anyone who reaches "
            "it could call the agent; give --api-key-env NAME, or --insecure if that is meant"
        )


class BearerAuth:
    """Ask every HTTP request but ``exempt`` paths for ``Authorization: Bearer <key>``."""

    def __init__(self, app: ASGIApp, key: str, exempt: Collection[str] = ()) -> None:
        self.app = app
        self._expected = f"Bearer {key}".encode()
        self._exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._exempt:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        if hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        body = _json_error(
            "unauthorized",
            "this server needs the header 'Authorization: Bearer <key>'"
            if not given
            else "the API key is not valid",
        )
        await send_json(send, 401, body, [(b"www-authenticate", b'Bearer realm="openstarry"')])


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a whole JSON response through an ASGI ``send``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds on connections, enforced before a request reaches the app.

    Attributes:
        max_connections: Connections at once. When reached, a new connection
            closes the one that has waited longest for its request head, or is
            refused (``503``) when every connection has sent its head.
        max_connections_per_address: Connections at once from one client
            address; more are refused with ``429``. Behind a reverse proxy every
            client shares the proxy's address: raise it there.
        header_timeout: Seconds a connection may take to send a request head
            (from its opening, or from its first byte after a finished
            request); past it, ``408`` and the connection is closed.
    """

    max_connections: int = 4096
    max_connections_per_address: int = 256
    header_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_address"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not self.header_timeout > 0:
            raise ValueError(f"header_timeout must be positive, not {self.header_timeout}")


def _raw_response(status: int, reason: str, code: str, message: str) -> bytes:
    body = _json_error(code, message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


#: Seconds a refused connection stays open, reading, after its answer.
_LINGER = 1.0


class _Connections:
    """The guard's books: connections per address, and those waiting for a request head."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_address: dict[str, int] = {}
        #: Connections waiting for a request head, the longest waiting first.
        self.waiting: dict[Any, None] = {}


def guarded_protocol(base: type[asyncio.Protocol], limits: ConnectionLimits) -> type[Any]:
    """uvicorn's HTTP protocol class ``base`` with ``limits`` enforced (see the module)."""
    books = _Connections(limits)
    # The protocol's attributes (cycle, transport, client, loop) are uvicorn's.
    parent: Any = base

    class Guarded(parent):  # type: ignore[misc]
        _os_address: str | None = None
        _os_timer: asyncio.TimerHandle | None = None
        _os_done = False
        _os_refused = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            client = self.client
            address = client[0] if client else ""
            self._os_address = address
            books.total += 1
            count = books.per_address.get(address, 0) + 1
            books.per_address[address] = count
            if count > limits.max_connections_per_address:
                self._os_refuse(
                    429,
                    "Too Many Requests",
                    "too_many_connections",
                    f"at most {limits.max_connections_per_address} connections "
                    "from one address at once",
                )
                return
            if books.total > limits.max_connections:
                oldest = next(iter(books.waiting), None)
                if oldest is None:
                    self._os_refuse(
                        503,
                        "Service Unavailable",
                        "too_many_connections",
                        f"the server holds {limits.max_connections} connections, its limit",
                    )
                    return
                oldest._os_refuse(
                    408,
                    "Request Timeout",
                    "request_timeout",
                    "the server needed this connection: its request head came too slowly",
                )
            self._os_wait_head()

        def data_received(self, data: bytes) -> None:
            if self._os_refused:
                return  # answered and closing: what the client still sends is dropped
            cycle = self.cycle
            if self._os_timer is None and (cycle is None or cycle.response_complete):
                self._os_wait_head()  # a new request starts on this connection
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                self._os_head_done()

        def connection_lost(self, exc: Exception | None) -> None:
            self._os_close_books()
            super().connection_lost(exc)

        def _os_wait_head(self) -> None:
            if self._os_done:
                return
            self._os_timer = self.loop.call_later(limits.header_timeout, self._os_too_slow)
            books.waiting[self] = None

        def _os_head_done(self) -> None:
            if self._os_timer is not None:
                self._os_timer.cancel()
                self._os_timer = None
            books.waiting.pop(self, None)

        def _os_too_slow(self) -> None:
            self._os_timer = None
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self._os_refuse(
                    408,
                    "Request Timeout",
                    "request_timeout",
                    f"the request head did not arrive within {limits.header_timeout:g} s",
                )

        def _os_refuse(self, status: int, reason: str, code: str, message: str) -> None:
            """Answer with a JSON error and close: the write side at once, the rest
            after a moment (closing with the client's bytes unread would reset the
            connection, and the client could lose the answer)."""
            self._os_head_done()
            self._os_refused = True
            transport = self.transport
            if not transport.is_closing():
                with contextlib.suppress(OSError, RuntimeError):
                    transport.write(_raw_response(status, reason, code, message))
                    if transport.can_write_eof():
                        transport.write_eof()
                self.loop.call_later(_LINGER, transport.close)
            self._os_close_books()

        def _os_close_books(self) -> None:
            if self._os_done:
                return
            self._os_done = True
            self._os_head_done()
            books.total -= 1
            address = self._os_address
            if address is not None:
                left = books.per_address.get(address, 1) - 1
                if left > 0:
                    books.per_address[address] = left
                else:
                    books.per_address.pop(address, None)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def graceful_server(
    config: Any,
    drain: Callable[[], Awaitable[None]] | None = None,
    connection_limits: ConnectionLimits | None = None,
) -> Any:
    """A ``uvicorn.Server`` for ``config`` that shuts down as the module says.

    ``drain`` runs once the listening sockets are closed, before uvicorn asks
    the open connections to close; ``connection_limits`` guards the HTTP
    protocol (see :func:`guarded_protocol`).
    """
    import uvicorn

    if not config.loaded:
        config.load()
    if connection_limits is not None:
        config.http_protocol_class = guarded_protocol(config.http_protocol_class, connection_limits)

    class _Server(uvicorn.Server):
        #: The signals received, for the caller to report.
        signals: list[int]

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            self.signals = []
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self._on_signal) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        def _on_signal(self, sig: int, frame: Any) -> None:
            self.signals.append(sig)
            # A second SIGINT forces uvicorn out of its own wait for connections.
            self.handle_exit(sig, frame)

        async def shutdown(self, sockets: list[Any] | None = None) -> None:
            for server in self.servers:
                server.close()
            for sock in sockets or []:
                sock.close()
            if drain is not None:
                try:
                    await drain()
                except Exception:  # the shutdown goes on whatever the drain met
                    log.exception("draining the server failed")
            await super().shutdown(sockets)

    return _Server(config)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port), non-blocking.

    ``openstarry serve`` and ``openstarry mcp --http`` bind before they start
    anything, so an address in use or a host that is not this machine's is
    told in one line, before the server's start-up lines.

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
