"""A scripted LLM API server on 127.0.0.1, for the HTTP provider tests.

It speaks real HTTP/1.1 (the standard library's ``http.server`` in a thread,
so it serves asyncio and trio tests alike) and answers each request with the
next :class:`Reply` scripted for its path: a status, headers (``Retry-After``),
a JSON body or a stream of server-sent events, a delay before the answer or
between events, and a stream cut in the middle (the connection dropped before
the chunked body ends). Every request is recorded with its arrival time::

    with FakeLLMServer() as server:
        server.script("/v1/chat/completions", Reply(429, headers={"Retry-After": "0"}))
        server.script("/v1/chat/completions", Reply(json={...}))
        ... # point a provider at server.url
        assert len(server.requests) == 2

A request nothing is scripted for gets a 418 that says so (not retried), so a test that
asks more than it scripted fails loudly.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["FakeLLMServer", "Recorded", "Reply", "sse"]


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``data`` as JSON (a ``str`` as it is), then a blank line."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event is not None else ""
    lines = "".join(f"data: {line}\n" for line in text.split("\n"))
    return (head + lines + "\n").encode()


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    """One OpenAI Chat Completions stream chunk, as JSON: ``delta`` for choice 0."""
    return json.dumps(
        {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        status: The HTTP status.
        json: A JSON body (``Content-Type: application/json``).
        body: A raw body, when not ``json`` or ``events``.
        events: A server-sent event stream: each ``bytes`` item is sent as one
            piece of the chunked body (make them with :func:`sse`), each
            ``float`` is a pause of that many seconds.
        headers: More headers (``Retry-After``).
        delay: Seconds to wait before answering.
        event_delay: Seconds to wait before each event.
        cut: Drop the connection after the events, before the body's end.
    """

    status: int = 200
    json: Any = None
    body: bytes | None = None
    events: Sequence[bytes | float] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    event_delay: float = 0.0
    cut: bool = False


def chat_answer(words: str) -> Reply:
    """An OpenAI Chat Completions answer with plain text."""
    return Reply(
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4.1-2025-04-14",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": words, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }
    )


@dataclass(frozen=True)
class Recorded:
    """A request the server got."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    time: float
    #: The client's port: requests over one connection share it.
    client_port: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    #: An idle keep-alive connection is dropped after this many seconds.
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._connections.add(self.connection)

    def finish(self) -> None:
        self.server.owner._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        record = Recorded(
            self.command,
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            time.monotonic(),
            self.client_address[1],
        )
        reply = owner._next(record)
        try:
            self._answer(reply, owner._stopping)
        except OSError:
            # The client went away (a timeout on its side): nothing to answer.
            self.close_connection = True

    def _answer(self, reply: Reply, stopping: threading.Event) -> None:
        if reply.delay and stopping.wait(reply.delay):
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.events is not None:
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in reply.events:
                if isinstance(chunk, float):
                    if stopping.wait(chunk):
                        break
                    continue
                if reply.event_delay and stopping.wait(reply.event_delay):
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            if reply.cut:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if reply.json is not None:
            payload = json.dumps(reply.json).encode()
            content_type = "application/json"
        else:
            payload = reply.body or b""
            content_type = "text/plain; charset=utf-8"
        if not any(name.lower() == "content-type" for name in reply.headers):
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: FakeLLMServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        self.owner._threads.append(thread)
        thread.start()


class FakeLLMServer:
    """A scripted HTTP server on ``127.0.0.1`` (a free port), for one test.

    Use it as a context manager: it serves from entry and, on exit, wakes
    every delayed answer, closes every connection and joins its threads.

    Attributes:
        requests: The requests received, in order.
        handler: When set, answers any request nothing is scripted for.
    """

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.handler: Callable[[Recorded], Reply] | None = None
        self._scripts: dict[str | None, deque[Reply]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._server: _Server | None = None
        self._serving: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._server is not None, "the server is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, path: str | None, *replies: Reply) -> None:
        """Answer the next requests to ``path`` (any path, for ``None``) with ``replies``, in order.

        The path is compared without its query string.
        """
        with self._lock:
            self._scripts.setdefault(path, deque()).extend(replies)

    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return sum(len(q) for q in self._scripts.values())

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def _next(self, record: Recorded) -> Reply:
        path = record.path.split("?", 1)[0]
        with self._lock:
            self.requests.append(record)
            for key in (path, None):
                queue = self._scripts.get(key)
                if queue:
                    return queue.popleft()
        if self.handler is not None:
            return self.handler(record)
        return Reply(418, json={"error": {"message": f"nothing scripted for {record.path}"}})

    def __enter__(self) -> FakeLLMServer:
        self._server = _Server(self)
        self._serving = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._serving.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        if self._serving is not None:
            self._serving.join(timeout=5)
        server.server_close()
