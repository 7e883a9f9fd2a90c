"""A fake OpenAI Chat Completions server, in a process of its own, for the HTTP turn benchmarks.

Run as a script (``python benches/chat_server.py [--port N]``) it serves
HTTP/1.1 on 127.0.0.1 with asyncio streams, keeping connections alive, and
prints ``listening on PORT`` once it accepts them. The benchmarks start it
with :class:`ChatServer`, which reads that line and stops the process at the
end; its CPU time is its own process's, so it is not in the client's
``time.process_time``.

``POST .../chat/completions`` answers as an OpenAI model would, shaped as
OpenAI's and vLLM's answers are (``id``, ``object``, ``created``, ``model``,
``system_fingerprint``, ``choices[0].message`` or ``.delta``,
``finish_reason``, ``usage``):

- a user message holding ``stream N`` (the last one): ``N`` tokens of text
  (:func:`stream_text`), finish reason ``stop``;
- else, when the last message is a tool result (``role: "tool"``): the text
  ``"done"``, finish reason ``stop``;
- else: one call of the tool ``add_one`` with arguments ``{"x": 1}`` and a
  call id of its own, finish reason ``tool_calls``.

A request with ``"stream": true`` gets its answer as ``chat.completion.chunk``
server-sent events in a chunked body (``Transfer-Encoding: chunked``, as vLLM
and OpenAI send them): a first chunk with the role, one chunk per token of
text (or one with the whole tool call), a last one with the finish reason,
one with the usage when ``stream_options.include_usage`` asks for it, then
``data: [DONE]``. Each event is written to the socket on its own (one
``send`` each, ``TCP_NODELAY``), though with no pause between tokens: the
client reads as many as have arrived. Other requests get a JSON body with a
``Content-Length``.

``GET /count`` answers the number of chat completion requests served so far
for each ``model`` the requests named, and of those that asked for a stream,
as JSON (``{"requests": {model: n}, "streamed": {model: n}}``): a benchmark
gives each of its sides a model name of its own and checks its requests by it.
:class:`ChatModel` is the answering without the HTTP, for an in-memory transport.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import http.client
import itertools
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ChatModel", "ChatServer", "stream_text"]

#: What a user message says to ask for a long answer of N tokens.
_STREAM_N = re.compile(r"\bstream (\d+)\b")
_FINGERPRINT = "fp_bench"


def stream_text(tokens: int) -> str:
    """The text of an answer of ``tokens`` tokens, as the server sends it (one token an event)."""
    return "".join(_token(i) for i in range(tokens))


def _token(i: int) -> str:
    return f" word{i}" if i else "word0"


class ChatModel:
    """The answers, without the HTTP: what a request gets, and the requests counted by model.

    The server answers with it; a benchmark that hands the provider an
    in-memory transport answers with it too, so both give the same answers.
    """

    def __init__(self) -> None:
        #: Chat completion requests answered, by the ``model`` they named.
        self.requests: Counter[str] = Counter()
        #: Those of them that asked for a stream.
        self.streamed: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._templates: dict[tuple[str, str | None, int], bytes] = {}

    def count(self, request: dict[str, Any]) -> str:
        """Count ``request`` under its model, which is returned."""
        model = str(request.get("model", ""))
        self.requests[model] += 1
        if request.get("stream"):
            self.streamed[model] += 1
        return model

    def reply(self, request: dict[str, Any]) -> str | None:
        """The text that answers ``request``, or ``None`` for a call of ``add_one``."""
        messages = request.get("messages") or [{}]
        users = [m for m in messages if m.get("role") == "user"]
        asked = _STREAM_N.search(_text_of(users[-1].get("content"))) if users else None
        if asked is not None:
            return stream_text(int(asked.group(1)))
        if messages[-1].get("role") == "tool":
            return "done"
        return None

    def call(self) -> dict[str, Any]:
        """A call of ``add_one(x=1)`` with an id of its own, as ``message.tool_calls`` holds it."""
        return _call(f"{next(self._ids):08d}")

    def head(self, model: str, kind: str) -> dict[str, Any]:
        """The fields every response or chunk starts with, with an id of its own."""
        return _head(f"{next(self._ids):08d}", model, kind)

    def completion(self, request: dict[str, Any]) -> bytes:
        """The whole ``chat.completion`` answering ``request`` as JSON, counted.

        Each kind of answer is encoded once and its ids filled in for each
        request, so that answering costs little beside what the client does.
        """
        model = self.count(request)
        text = self.reply(request)
        key = (model, text, len(request.get("messages") or ()))
        template = self._templates.get(key)
        if template is None:
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if text is None:
                message["tool_calls"] = [_call(_ID)]
            tokens = 1 if text is None else max(1, len(text.split()))
            body = _head(_ID, model, "chat.completion") | {
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "stop" if text is not None else "tool_calls",
                    }
                ],
                "usage": _usage(request, tokens),
            }
            template = self._templates[key] = json.dumps(body, separators=(",", ":")).encode()
        return template.replace(_ID.encode(), b"%08d" % next(self._ids))


#: Where a template's ids go.
_ID = "@@ID@@@@"


def _call(id: str) -> dict[str, Any]:
    return {
        "id": f"call_{id}",
        "type": "function",
        "function": {"name": "add_one", "arguments": json.dumps({"x": 1})},
    }


def _head(id: str, model: str, kind: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{id}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": _FINGERPRINT,
    }


class _Server:
    """The HTTP side: one :class:`ChatModel` answering every connection."""

    def __init__(self) -> None:
        self.model = ChatModel()
        self._date = ""
        self._date_at = 0.0

    def date(self) -> str:
        now = time.time()
        if now - self._date_at >= 1.0:
            self._date, self._date_at = email.utils.formatdate(now, usegmt=True), now
        return self._date

    # -- the connection --

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                await self._answer(writer, method, target.split("?", 1)[0], body)
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self, writer: asyncio.StreamWriter, method: str, path: str, body: bytes
    ) -> None:
        if method == "GET" and path == "/count":
            counts = {"requests": self.model.requests, "streamed": self.model.streamed}
            self._send_json(writer, 200, counts)
        elif method == "POST" and path.endswith("/chat/completions"):
            request = json.loads(body)
            if request.get("stream"):
                await self._stream(writer, request)
            else:
                self._send_body(writer, 200, self.model.completion(request))
        else:
            error = {"message": f"no route {method} {path}", "type": "invalid_request_error"}
            self._send_json(writer, 404, {"error": error})
        await writer.drain()

    def _send_json(self, writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
        self._send_body(writer, status, json.dumps(payload, separators=(",", ":")).encode())

    def _send_body(self, writer: asyncio.StreamWriter, status: int, content: bytes) -> None:
        reason = http.client.responses.get(status, "")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\ndate: {self.date()}\r\nserver: uvicorn\r\n"
            f"content-length: {len(content)}\r\ncontent-type: application/json\r\n\r\n".encode()
            + content
        )

    # -- the stream --

    async def _stream(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        writer.write(
            f"HTTP/1.1 200 OK\r\ndate: {self.date()}\r\nserver: uvicorn\r\n"
            "content-type: text/event-stream; charset=utf-8\r\n"
            "transfer-encoding: chunked\r\n\r\n".encode()
        )
        model = self.model.count(request)
        head = self.model.head(model, "chat.completion.chunk")
        text = self.model.reply(request)
        call = self.model.call() if text is None else None

        def event(delta: dict[str, Any], finish: str | None = None) -> None:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            _send_event(writer, json.dumps(head | {"choices": [choice]}, separators=(",", ":")))

        event({"role": "assistant", "content": ""})
        if call is not None:
            event({"tool_calls": [{"index": 0} | call]})
            tokens = 1
        else:
            pieces = (text or "").split(" ")
            tokens = len(pieces)
            for i, piece in enumerate(pieces):
                event({"content": piece if i == 0 else " " + piece})
                if i % 64 == 63:
                    await writer.drain()
        event({}, "stop" if call is None else "tool_calls")
        options = request.get("stream_options") or {}
        if options.get("include_usage"):
            usage = head | {"choices": [], "usage": _usage(request, tokens)}
            _send_event(writer, json.dumps(usage, separators=(",", ":")))
        _send_event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")


def _send_event(writer: asyncio.StreamWriter, data: str) -> None:
    """One server-sent event as one piece of the chunked body."""
    event = f"data: {data}\n\n".encode()
    writer.write(b"%x\r\n%s\r\n" % (len(event), event))


def _text_of(content: Any) -> str:
    """A message's text, whether its content is a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _usage(request: dict[str, Any], completion_tokens: int) -> dict[str, int]:
    prompt_tokens = 10 * len(request.get("messages") or ())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _main(host: str, port: int) -> None:
    state = _Server()
    server = await asyncio.start_server(state.serve, host, port, limit=1 << 20)
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def stopped() -> None:
        if not stop.done():
            stop.set_result(None)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop


# -- the client side: the process, started and stopped -------------------------------------------


class ChatServer:
    """This module's server in a process of its own, on a free port of 127.0.0.1.

    ``with ChatServer() as server:`` starts it and waits until it listens;
    ``server.base_url`` is what an OpenAI client takes (``http://127.0.0.1:PORT/v1``),
    and :meth:`counts` reads its request counters.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--host", self.host, "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._process = process
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the chat server did not start: {line!r}")
        self.port = int(line.split()[-1])

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """The chat completion requests served so far by the model they named, and
        those of them that asked for a stream."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("GET", "/count")
            payload = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        return Counter(payload["requests"]), Counter(payload["streamed"])

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> ChatServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    args = parser.parse_args(argv)
    asyncio.run(_main(args.host, args.port))


if __name__ == "__main__":
    main()
