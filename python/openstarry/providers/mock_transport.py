"""A transport with no network, for tests: a function answers each request.

:class:`MockTransport` turns each answer into HTTP/1.1 bytes and reads them
with :class:`~openstarry.providers.transport.ResponseReader`, the reader of
every socket's bytes, so a provider under test runs the code it runs in
production::

    provider = HTTPProvider(OpenAIChatAPI(), "m", base_url="http://127.0.0.1:8000/v1",
                            transport=MockTransport(answer))
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio.lowlevel

from openstarry.providers.transport import (
    NO_LIMIT,
    Request,
    Response,
    ResponseReader,
    ResponseTooLarge,
    check_url,
    display_url,
    header_map,
)

__all__ = ["Handler", "MockResponse", "MockTransport"]


@dataclass(frozen=True, slots=True)
class MockResponse:
    """What a :class:`MockTransport` handler answers: a status, headers, and the body
    whole (``body``) or in the pieces a server would send (``chunks``, sent with the
    chunked transfer coding, each piece a separate read)."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: Iterable[bytes] | None = None
    reason: str = ""
    _reads: tuple[bytes, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def http_bytes(self) -> list[bytes]:
        """The response as the reads a client would make of it (made once: a handler may
        answer many requests with one response, and ``chunks`` may be an iterator)."""
        if self._reads is None:
            object.__setattr__(self, "_reads", tuple(self._make()))
        assert self._reads is not None
        return list(self._reads)

    def _make(self) -> list[bytes]:
        reason = self.reason or _REASONS.get(self.status, "Unknown")
        head = [f"HTTP/1.1 {self.status} {reason}\r\n".encode("latin-1")]
        for name, value in self.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding"):
                head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if self.chunks is None:
            head.append(b"content-length: %d\r\n\r\n" % len(self.body))
            return [b"".join(head) + self.body]
        head.append(b"transfer-encoding: chunked\r\n\r\n")
        reads = [b"".join(head)]
        reads.extend(b"%x\r\n%s\r\n" % (len(c), c) for c in self.chunks if c)
        reads.append(b"0\r\n\r\n")
        return reads


_REASONS: Final = {200: "OK", 400: "Bad Request", 429: "Too Many Requests", 500: "Error"}

Handler = Callable[[Request], "MockResponse | bytes | Awaitable[MockResponse | bytes]"]


class _MockResponse:
    __slots__ = ("_reader", "_reads", "_where", "headers", "reason", "status")

    def __init__(self, reads: list[bytes], where: str) -> None:
        self._reads = reads
        self._reader = ResponseReader()
        self._where = where
        self._next(ResponseReader.HEAD)
        decoder = self._reader.decoder
        self.status: int = decoder.status
        self.reason: str = decoder.reason
        self.headers: Mapping[str, str] = header_map(decoder.headers)

    def _next(self, want: int) -> None:
        reader = self._reader
        while not reader.ready(want):
            if not self._reads:
                reader.eof()
                continue
            reader.feed(self._reads.pop(0))

    async def read(self, limit: int = NO_LIMIT) -> bytes:
        decoder = self._reader.decoder
        decoder.set_limit(limit)
        try:
            self._next(ResponseReader.DONE)
        except OverflowError:
            raise ResponseTooLarge(
                f"the answer from {self._where} is more than {limit} bytes", decoder.take_body()
            ) from None
        return bytes(decoder.take_body())

    async def receive(self) -> bytes:
        await anyio.lowlevel.checkpoint()
        self._next(ResponseReader.SOME_BODY)
        return bytes(self._reader.decoder.take_body())

    async def aclose(self) -> None:
        self._reads = []


class MockTransport:
    """A transport with no network: ``handler(request)`` answers each request, with a
    :class:`MockResponse` or the raw bytes of an HTTP/1.1 response (either may be
    awaited). The answer is read by the core's decoder, as a socket's bytes are.

    Attributes:
        requests: Every request sent, in order.
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    async def send(self, request: Request) -> Response:
        check_url(request.url)  # the same URLs refused as on the network
        self.requests.append(request)
        answer: Any = self.handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        reads = [bytes(answer)] if isinstance(answer, (bytes, bytearray)) else answer.http_bytes()
        return _MockResponse(reads, display_url(request.url))

    async def aclose(self) -> None:
        return None
