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
import time
from collections import OrderedDict
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
    "WrongKeys",
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


class _Failures:
    __slots__ = ("count", "last", "until")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.until = 0.0


class WrongKeys:
    """The book of wrong keys per client address, and how long each must wait.

    Args:
        free_attempts: Wrong keys in a row before the address must wait.
        max_delay: The longest wait, in seconds.
        forget_after: Seconds after its last wrong key that an address is forgotten.
        max_addresses: Addresses kept at most (the least recently failed go first).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        *,
        free_attempts: int = 5,
        max_delay: float = 60.0,
        forget_after: float = 900.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if free_attempts < 1 or max_addresses < 1:
            raise ValueError("free_attempts and max_addresses must be at least 1")
        if not (max_delay > 0 and forget_after >= max_delay):
            raise ValueError("max_delay must be positive and forget_after at least max_delay")
        self.free_attempts = free_attempts
        self.max_delay = max_delay
        self.forget_after = forget_after
        self.max_addresses = max_addresses
        self.clock = clock
        self._book: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._book)

    @staticmethod
    def key_of(address: str) -> str:
        """The book's key for a client address: an IPv6 address counts by its /64."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address
        if ip.version == 6:
            return str(ipaddress.ip_network(f"{ip}/64", strict=False))
        return str(ip)

    def _forget_old(self, now: float) -> None:
        book = self._book
        while book:
            first = next(iter(book.values()))
            if now - first.last < self.forget_after:
                break
            book.popitem(last=False)

    def wait(self, address: str) -> float:
        """Seconds ``address`` must still wait before its next key is checked (0: none)."""
        now = self.clock()
        self._forget_old(now)
        entry = self._book.get(self.key_of(address))
        return max(entry.until - now, 0.0) if entry is not None else 0.0

    def failed(self, address: str) -> tuple[int, float]:
        """Record a wrong key from ``address``: ``(wrong keys in a row, seconds to wait)``."""
        now = self.clock()
        self._forget_old(now)
        key = self.key_of(address)
        entry = self._book.pop(key, None) or _Failures()
        self._book[key] = entry  # the most recently failed last
        while len(self._book) > self.max_addresses:
            self._book.popitem(last=False)
        entry.count += 1
        entry.last = now
        delay = 0.0
        if entry.count >= self.free_attempts:
            delay = min(2.0 ** min(entry.count - self.free_attempts, 30), self.max_delay)
            entry.until = now + delay
        return entry.count, delay

    def succeeded(self, address: str) -> None:
        """A right key from ``address``: its count starts again."""
        self._book.pop(self.key_of(address), None)


class BearerAuth:
    """Ask every HTTP request but ``exempt`` paths for ``Authorization: Bearer <key>``.

    Wrong keys from one address are slowed down (:class:`WrongKeys`): past a few in a
    row, its next tries are answered ``429`` until its wait is over, so a key cannot
    be guessed at the server's full speed.
    """

    def __init__(
        self,
        app: ASGIApp,
        key: str,
        exempt: Collection[str] = (),
        wrong_keys: WrongKeys | None = None,
    ) -> None:
        self.app = app
        self._expected = f"Bearer {key}".encode()
        self._exempt = frozenset(exempt)
        self.wrong_keys = wrong_keys if wrong_keys is not None else WrongKeys()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._exempt:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        client = scope.get("client")
        address = str(client[0]) if client else ""
        wait = self.wrong_keys.wait(address) if given else 0.0
        if wait > 0:
            retry = str(int(wait) + 1).encode()
            body = _json_error(
                "too_many_wrong_keys",
                f"too many wrong keys from this address: try again in {wait:.0f} s",
            )
            await send_json(send, 429, body, [(b"retry-after", retry)])
            return
        if hmac.compare_digest(given, self._expected):
            if given:
                self.wrong_keys.succeeded(address)
            await self.app(scope, receive, send)
            return
        if given:
            count, delay = self.wrong_keys.failed(address)
            log.warning(
                "wrong API key from %s (%d in a row)%s",
                address or "an unknown address",
                count,
                f": its next try waits {delay:g} s" if delay else "",
            )
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
