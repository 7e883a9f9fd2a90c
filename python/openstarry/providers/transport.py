"""How a model provider's requests reach their server: the seam, and the transports behind it.

:class:`~openstarry.providers.http.HTTPProvider` builds each request's bytes
and reads the answer through a :class:`Transport`: one method,
:meth:`Transport.send`, from a :class:`Request` to a :class:`Response` whose
head is read and whose body is read on demand. Give a provider a transport of
your own with ``HTTPProvider(..., transport=...)`` (a recording one, one
through a proxy, one with a client certificate); by default it gets the one
that fits its base URL (:func:`openstarry.providers.proxy.default_transport`).

The transports openstarry ships:

:class:`PooledTransport` (the default)
    HTTP/1.1 over keep-alive connections, pooled per host, with TLS verified
    against the usual CA bundle (``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set,
    else certifi's, else the system's). The Rust core reads every byte
    (``openstarry.core.ResponseDecoder``: the head by ``httparse``, the body
    by its length, its chunks or the connection's end). On asyncio each
    connection is a protocol fed by the event loop: a whole answer that
    arrives in one read costs one wake-up. On trio it reads anyio streams.
:class:`~openstarry.providers.proxy.HttpxTransport`
    httpx's client, for what the lean one does not do: proxies
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``; the default
    for a base URL that one of them routes), client certificates, HTTP/2.
:class:`~openstarry.providers.mock_transport.MockTransport`
    No network: a function answers each request. Its answer is turned into
    HTTP/1.1 bytes and read by the same reader as a socket's
    (:class:`ResponseReader`), so a test drives the code production runs.

Failures come out as :class:`TransportError`: :class:`ConnectError` and
:class:`ConnectTimeout` before the request went out, :class:`ReadTimeout`
when the server stays silent, :class:`RemoteProtocolError` for a connection
that broke or bytes that are not HTTP, and :class:`ResponseTooLarge` for a
body past the limit the reader asked for. The provider decides which of them
are worth another attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import anyio
import anyio.abc
import anyio.lowlevel

from openstarry.core import ResponseDecoder

if TYPE_CHECKING:
    pass

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "PooledTransport",
    "ReadTimeout",
    "RemoteProtocolError",
    "Request",
    "Response",
    "ResponseReader",
    "ResponseTooLarge",
    "Transport",
    "TransportError",
    "check_url",
    "default_ssl_context",
    "describe",
    "display_url",
    "header_map",
    "request_bytes",
]

#: The most idle connections a :class:`PooledTransport` keeps per host.
MAX_IDLE_PER_HOST: Final = 32
#: The largest body a transport reads when its reader sets no limit.
NO_LIMIT: Final = 1 << 62
_READ_SIZE: Final = 256 * 1024

# What ResponseDecoder.feed returns.
_HEAD: Final = 0
_BODY: Final = 1
_DONE: Final = 2
#: What a streamed read waits for: some body bytes, or the end.
_SOME_BODY: Final = 3


# --- errors --------------------------------------------------------------------------------------


class TransportError(Exception):
    """A request that could not be completed; the message says why and where."""


class ConnectError(TransportError):
    """No connection could be made (refused, unknown host, TLS refused): nothing was sent."""


class ConnectTimeout(ConnectError):
    """No connection within the timeout: nothing was sent."""


class ReadTimeout(TransportError):
    """The server stayed silent for longer than the timeout."""


class RemoteProtocolError(TransportError):
    """The connection broke, or its bytes are not an HTTP/1.1 response."""


class ResponseTooLarge(TransportError):
    """A body longer than the limit; ``partial`` holds the limit's worth."""

    def __init__(self, message: str, partial: bytes = b"") -> None:
        super().__init__(message)
        self.partial = partial


# --- the seam ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One request: ``headers`` have lower-case names; ``timeout`` is in seconds, for the
    connection and for each silence of the server; ``read_interval``, for a body read
    as it streams (:meth:`Response.receive`), is the least time between two reads of
    the connection, in seconds: what arrives meanwhile is read at once, one wake-up
    for many pieces (0: each piece as it arrives)."""

    method: str
    url: str
    headers: Mapping[str, str]
    content: bytes
    timeout: float = 60.0
    read_interval: float = 0.0


class Response(Protocol):
    """A response whose head is read: ``headers`` have lower-case names (repeated fields
    joined by ``", "``). Read the body with :meth:`read` or :meth:`receive`, then
    :meth:`aclose` (which a half-read response needs, to give up its connection)."""

    status: int
    reason: str
    headers: Mapping[str, str]

    async def read(self, limit: int = NO_LIMIT) -> bytes:
        """The whole body; :class:`ResponseTooLarge` past ``limit`` bytes."""
        ...

    async def receive(self) -> bytes:
        """The body's next bytes as they arrive; ``b""`` at its end."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """What a provider sends its requests through (see the module's documentation)."""

    async def send(self, request: Request) -> Response:
        """Send ``request`` and read the response's head."""
        ...

    async def aclose(self) -> None:
        """Close every connection kept."""
        ...


# --- targets and request bytes -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    tls: bool
    host: str
    port: int
    #: ``POST /path?query HTTP/1.1\r\nhost: ...\r\n`` without the method.
    line: bytes


@functools.lru_cache(maxsize=256)
def _target(url: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ConnectError(f"not an http:// or https:// URL: {display_url(url)}")
    tls = scheme == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError:
        raise ConnectError(f"a URL with a bad port: {display_url(url)}") from None
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    default = port == (443 if tls else 80)
    host_field = shown if default else f"{shown}:{port}"
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    line = f" {path} HTTP/1.1\r\nhost: {host_field}\r\n".encode("ascii", "strict")
    return _Target(tls, host, port, line)


@functools.lru_cache(maxsize=256)
def display_url(url: str) -> str:
    """``url`` for messages: no user info, no query string."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def check_url(url: str) -> None:
    """Refuse a URL no transport can send to (not http or https, no host, a bad port).

    Raises:
        ConnectError: which says what is wrong with it.
    """
    _target(url)


def request_bytes(request: Request, target: _Target) -> bytes:
    """The request's HTTP/1.1 bytes: its line, ``host``, the headers, the length, the body."""
    lines = [request.method.encode("ascii"), target.line]
    for name, value in request.headers.items():
        text = f"{name}: {value}\r\n"
        if "\r" in text[:-2] or "\n" in text[:-2]:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(text.encode("latin-1"))
    lines.append(b"content-length: %d\r\n\r\n" % len(request.content))
    lines.append(request.content)
    return b"".join(lines)


def header_map(fields: list[tuple[str, str]]) -> dict[str, str]:
    """Header fields as a mapping: lower-case names, repeated fields joined by a comma."""
    headers: dict[str, str] = {}
    for name, value in fields:
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context: ``SSL_CERT_FILE``/``SSL_CERT_DIR``, else certifi, else the
    system's CA bundle (loading one takes milliseconds, so it is loaded once)."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    if cafile is None and capath is None:
        with contextlib.suppress(ImportError):
            import certifi

            cafile = certifi.where()
    context = ssl.create_default_context(cafile=cafile, capath=capath)
    context.set_alpn_protocols(["http/1.1"])
    return context


# --- one connection, its bytes read by the core ---------------------------------------------------


class ResponseReader:
    """A response read by the core's :class:`~openstarry.core.ResponseDecoder`, for any
    transport that reads HTTP/1.1 bytes: :meth:`feed` them as they come, :meth:`eof` at the
    connection's end; :meth:`ready` says whether what a reader waits for is there.

    Raises:
        RemoteProtocolError: from :meth:`feed` and :meth:`eof`, for bytes that are not
            HTTP/1.1 or a response cut short.
        OverflowError: from :meth:`feed`, for a body past the decoder's limit.
    """

    __slots__ = ("decoder", "state")

    #: What a reader may wait for: the head, the whole response, some body bytes (or the end).
    HEAD: Final = _BODY
    DONE: Final = _DONE
    SOME_BODY: Final = _SOME_BODY

    def __init__(self) -> None:
        self.decoder = ResponseDecoder(NO_LIMIT)
        self.state = _HEAD

    def feed(self, data: bytes) -> None:
        try:
            self.state = self.decoder.feed(data)
        except OverflowError:
            raise
        except ValueError as exc:
            raise RemoteProtocolError(f"not an HTTP/1.1 response: {exc}") from None

    def eof(self) -> None:
        try:
            self.state = self.decoder.eof()
        except ValueError as exc:
            raise RemoteProtocolError(str(exc)) from None

    def ready(self, want: int) -> bool:
        """Whether what a wait for ``want`` waits for is there."""
        if want == _SOME_BODY:
            return self.state == _DONE or self.decoder.body_pending
        return self.state >= want


class _AioConnection(asyncio.Protocol):
    """A keep-alive connection on asyncio: the loop feeds its bytes to the decoder as they
    come, and wakes the reader only when what it waits for is there."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        self.want = _BODY
        self.waiter: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None
        self.closed = False
        self.used = False
        self.held: asyncio.TimerHandle | None = None

    # -- the loop's side --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:  # bytes nobody asked for: the connection cannot be trusted
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            return
        try:
            reader.feed(data)
        except (OverflowError, TransportError) as exc:
            self.failure = exc
        if self.failure is not None or reader.ready(self.want):
            self._wake()

    def eof_received(self) -> bool:
        return False

    def hold(self, seconds: float) -> None:
        """Read nothing for ``seconds``: what arrives meanwhile waits in the socket."""
        transport = self.transport
        if self.held is None and transport is not None and not self.closed:
            transport.pause_reading()
            self.held = self.loop.call_later(seconds, self.release_hold)

    def release_hold(self) -> None:
        """Read again (at the end of :meth:`hold`, or when the response is let go)."""
        held, self.held = self.held, None
        if held is not None:
            held.cancel()
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reader = self.reader
        if reader is not None and reader.state != _DONE and self.failure is None:
            try:
                reader.eof()
            except TransportError as error:
                self.failure = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the reader's side --

    async def wait(self, want: int, timeout: float, where: str) -> None:
        """Until the decoder reaches ``want`` (or, for the body, has bytes to give)."""
        reader = self.reader
        assert reader is not None
        while self.failure is None and not reader.ready(want):
            if self.closed:
                raise RemoteProtocolError(f"the connection to {where} closed")
            self.want = want
            waiter = self.waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, _time_out, waiter)
            try:
                await waiter
            except _Silent:
                raise ReadTimeout(f"no answer from {where} within {timeout:g} s") from None
            finally:
                timer.cancel()
                self.waiter = None
        if self.failure is not None:
            raise self.failure


class _Silent(Exception):
    pass


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(_Silent())


class _AnyioConnection:
    """A keep-alive connection on any backend anyio runs (trio), read through its stream."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.reader: ResponseReader | None = None
        self.closed = False
        self.used = False

    async def wait(self, want: int, timeout: float, where: str) -> None:
        reader = self.reader
        assert reader is not None
        while not reader.ready(want):
            try:
                with anyio.fail_after(timeout):
                    data = await self.stream.receive(_READ_SIZE)
            except TimeoutError:
                raise ReadTimeout(f"no answer from {where} within {timeout:g} s") from None
            except anyio.EndOfStream:
                self.closed = True
                reader.eof()
                continue
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self.closed = True
                raise RemoteProtocolError(f"the connection to {where} broke: {exc}") from None
            reader.feed(data)

    async def write(self, data: bytes) -> None:
        try:
            await self.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.closed = True
            raise RemoteProtocolError(f"the connection broke: {exc}") from None

    def close(self) -> None:
        self.closed = True


_Connection = _AioConnection | _AnyioConnection


class _PooledResponse:
    """A response read from a pooled connection; back to the pool once read whole."""

    __slots__ = (
        "_conn",
        "_interval",
        "_next_read",
        "_pool",
        "_timeout",
        "_where",
        "headers",
        "reason",
        "status",
    )

    def __init__(
        self, conn: _Connection, pool: PooledTransport, key: _Target, where: str, request: Request
    ) -> None:
        reader = conn.reader
        assert reader is not None
        decoder = reader.decoder
        self._conn: _Connection | None = conn
        self._pool = (pool, key)
        self._where = where
        self._timeout = request.timeout
        self._interval = request.read_interval
        self._next_read = 0.0
        self.status: int = decoder.status
        self.reason: str = decoder.reason
        self.headers: Mapping[str, str] = header_map(decoder.headers)

    async def read(self, limit: int = NO_LIMIT) -> bytes:
        conn = self._conn
        if conn is None:
            return b""
        reader = conn.reader
        assert reader is not None
        decoder = reader.decoder
        decoder.set_limit(limit)
        try:
            await conn.wait(_DONE, self._timeout, self._where)
        except OverflowError:
            partial = decoder.take_body()
            await self.aclose()
            raise ResponseTooLarge(
                f"the answer from {self._where} is more than {limit} bytes", partial
            ) from None
        body = decoder.take_body()
        await self.aclose()
        return body

    async def receive(self) -> bytes:
        conn = self._conn
        if conn is None:
            return b""
        reader = conn.reader
        assert reader is not None
        interval = self._interval
        if interval and isinstance(conn, _AnyioConnection) and not reader.ready(_SOME_BODY):
            delay = self._next_read - anyio.current_time()
            if delay > 0:
                await anyio.sleep(delay)
        await conn.wait(_SOME_BODY, self._timeout, self._where)
        body = reader.decoder.take_body()
        if not body and reader.state == _DONE:
            await self.aclose()
        elif interval and reader.state != _DONE:
            if isinstance(conn, _AioConnection):
                conn.hold(interval)
            else:
                self._next_read = anyio.current_time() + interval
        return body

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        pool, key = self._pool
        await pool.release(key, conn)


class PooledTransport:
    """HTTP/1.1 over keep-alive connections pooled per host (see the module's documentation).

    Args:
        ssl_context: The TLS context for ``https://``; by default one that
            verifies against the usual CA bundle.
        max_idle_per_host: The most idle connections kept per host.
    """

    def __init__(
        self, *, ssl_context: ssl.SSLContext | None = None, max_idle_per_host: int = 8
    ) -> None:
        if not 0 <= max_idle_per_host <= MAX_IDLE_PER_HOST:
            raise ValueError(f"max_idle_per_host must be from 0 to {MAX_IDLE_PER_HOST}")
        self._ssl = ssl_context
        self._max_idle = max_idle_per_host
        self._idle: dict[_Target, list[_Connection]] = {}

    def __repr__(self) -> str:
        idle = sum(len(v) for v in self._idle.values())
        return f"<PooledTransport idle={idle}>"

    @property
    def idle_connections(self) -> int:
        """Connections kept for the next request."""
        return sum(len(v) for v in self._idle.values())

    async def send(self, request: Request) -> Response:
        target = _target(request.url)
        data = request_bytes(request, target)
        where = display_url(request.url)
        while True:
            conn = self._take(target)
            fresh = conn is None
            if conn is None:
                conn = await self._connect(target, request.timeout, where)
            try:
                await self._start(conn, data, request.timeout, where)
            except RemoteProtocolError:
                await _close(conn)
                # A kept connection the server had closed meanwhile: nothing was
                # served, so the request goes again on a new one, once.
                if fresh or conn.reader is None or conn.reader.decoder.status:
                    raise
                continue
            except BaseException:
                await _close(conn)
                raise
            return _PooledResponse(conn, self, target, where, request)

    async def _start(self, conn: _Connection, data: bytes, timeout: float, where: str) -> None:
        conn.reader = ResponseReader()
        conn.used = True
        if isinstance(conn, _AioConnection):
            if conn.closed or conn.transport is None:
                raise RemoteProtocolError(f"the connection to {where} closed")
            conn.failure = None
            conn.transport.write(data)
        else:
            await conn.write(data)
        await conn.wait(_BODY, timeout, where)

    def _take(self, target: _Target) -> _Connection | None:
        idle = self._idle.get(target)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def release(self, target: _Target, conn: _Connection) -> None:
        """Take ``conn`` back: kept if its response was read whole and it may carry another."""
        reader = conn.reader
        if isinstance(conn, _AioConnection):
            conn.release_hold()
        reusable = (
            not conn.closed
            and reader is not None
            and reader.state == _DONE
            and reader.decoder.keep_alive
            and (not isinstance(conn, _AioConnection) or conn.failure is None)
        )
        conn.reader = None
        idle = self._idle.setdefault(target, [])
        if reusable and len(idle) < self._max_idle:
            idle.append(conn)
        else:
            await _close(conn)

    async def _connect(self, target: _Target, timeout: float, where: str) -> _Connection:
        context = (self._ssl or default_ssl_context()) if target.tls else None
        try:
            with anyio.fail_after(timeout):
                if _on_asyncio():
                    loop = asyncio.get_running_loop()
                    _, protocol = await loop.create_connection(
                        lambda: _AioConnection(loop),
                        target.host,
                        target.port,
                        ssl=context,
                        server_hostname=target.host if context is not None else None,
                    )
                    return protocol
                stream: anyio.abc.ByteStream
                if context is None:
                    stream = await anyio.connect_tcp(target.host, target.port)
                else:
                    stream = await anyio.connect_tcp(
                        target.host,
                        target.port,
                        ssl_context=context,
                        tls_standard_compatible=False,
                    )
                return _AnyioConnection(stream)
        except TimeoutError:
            raise ConnectTimeout(f"could not connect to {where} within {timeout:g} s") from None
        except ssl.SSLError as exc:
            raise ConnectError(f"TLS with {where} failed: {exc}") from None
        except OSError as exc:
            raise ConnectError(f"could not connect to {where}: {describe(exc)}") from None

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await _close(conn)


async def _close(conn: _Connection) -> None:
    """Let ``conn`` go: its transport closed, or its stream closed without waiting on
    the peer (a TLS stream's goodbye is not awaited), even in a cancelled scope."""
    conn.closed = True
    if isinstance(conn, _AioConnection):
        if conn.transport is not None:
            # Now, not after a TLS goodbye the loop may never get to read.
            conn.transport.abort()
    else:
        with anyio.CancelScope(shield=True):
            await anyio.aclose_forcefully(conn.stream)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def describe(exc: BaseException) -> str:
    """``exc`` for a message: its type, and its text when it has one."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
