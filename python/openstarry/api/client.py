"""A client of the Agent API over HTTP (spec 003), on httpx; needs the ``[http]`` extra.

    async with AgentClient("http://127.0.0.1:8000") as client:
        response = await client.run("Query weather in Taipei", session_id="alice")
        print(response.output[-1].get_text_content())

        async for event in client.stream("And in Tokyo?", session_id="alice"):
            print(event.wire_json())            # every event as it comes

    with Client("http://127.0.0.1:8000") as client:   # the same, blocking
        print(client.run("Query weather in Taipei").status)

:meth:`AgentClient.stream` sends the request with ``stream: true`` and yields
each event of the Server-Sent Events stream as its model. When the connection
drops before the response's terminal event it reconnects (``GET
/process/{response_id}`` with ``Last-Event-ID``, the ``id:`` of the last event
received), up to ``max_reconnects`` times in a row, and goes on from where it
was: no event is lost or repeated. :meth:`AgentClient.run` consumes the stream
and returns the final response with its ``output`` reassembled from the
stream's events by :class:`StreamAssembler` (text deltas concatenated into
complete content, content into messages). :meth:`AgentClient.send` asks for
``stream: false`` and returns the server's one response.

A refused request raises :class:`ApiError` with the server's ``code`` and
``message`` and the HTTP status.

Client-side tools (functions the client declares in ``tools`` and runs
itself) and approvals: :meth:`AgentClient.run_with_tools` runs the request;
while the response ends ``incomplete`` (the run waits for its client), it
calls the local function of each ``function_call`` waited for, asks
``approve`` about each ``mcp_approval_request``, and sends the outputs and
answers on the same session, until the run ends::

    def get_time(city: str) -> str: ...
    response = await client.run_with_tools(
        request_with_tools, {"get_time": get_time}, approve=lambda req: True
    )
"""

from __future__ import annotations

import contextlib
import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import anyio

from openstarry import sse
from openstarry.api.models import (
    TERMINAL_STATUSES,
    AgentRequest,
    AgentResponse,
    Content,
    DataContent,
    Message,
    MessageType,
    Role,
    RunStatus,
    TextContent,
    parse_event,
)
from openstarry.errors import OpenStarryError

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("openstarry.api.client needs httpx: pip install 'openstarry[http]'") from exc

__all__ = [
    "MAX_EVENT_CHARS",
    "AgentClient",
    "ApiError",
    "Client",
    "SSELineReader",
    "SSEParser",
    "StreamAssembler",
    "answers_to",
    "make_request",
]

#: A local function the client runs for a ``function_call``: keyword arguments
#: in, any JSON-able value (or a coroutine of one) out.
LocalFunction = Callable[..., Any]
#: Decides an ``mcp_approval_request`` (its data: ``id``, ``name``,
#: ``arguments``, ``server_label``): ``True``, ``False`` or ``(False, reason)``.
Approver = Callable[[Mapping[str, Any]], bool | tuple[bool, str] | Awaitable[Any]]

WireEvent = AgentResponse | Message | Content

#: The most characters of one line of a stream (an event's ``data:`` line): 64 Mi.
MAX_EVENT_CHARS = 64 * 1024 * 1024
#: The most digits read as the sequence number of an event id.
_MAX_DIGITS = 18


class ApiError(OpenStarryError):
    """The server refused a request, or a stream could not be completed.

    Attributes:
        status: The HTTP status (0 when the stream broke and could not be resumed).
        code: The ``code`` of the server's :class:`~openstarry.api.models.Error` body.
        message: Its ``message``.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def make_request(
    request: AgentRequest | str, *, session_id: str | None = None, stream: bool = True
) -> AgentRequest:
    """An :class:`AgentRequest` from a request or a user's text, with ``stream`` (and the session).

    ``session_id`` given here overrides the request's.
    """
    if isinstance(request, str):
        request = AgentRequest(
            input=[Message(role=Role.USER, content=[TextContent(text=request)])],
        )
    update: dict[str, Any] = {"stream": stream}
    if session_id is not None:
        update["session_id"] = session_id
    return request.model_copy(update=update)


async def answers_to(
    response: AgentResponse,
    functions: Mapping[str, LocalFunction],
    approve: Approver | None = None,
) -> list[Message]:
    """The messages that answer an ``incomplete`` response: outputs and approval answers.

    For each call id in ``response.metadata["waiting_for"]["function_call"]``
    the function of its name runs with the call's arguments; what it returns
    (a string as it is, anything else as JSON) or raises (``{"error": ...}``)
    becomes a ``function_call_output``. Each approval id gets an
    ``mcp_approval_response`` with what ``approve`` says (no ``approve``: denied).
    """
    waiting = (response.metadata or {}).get("waiting_for") or {}
    call_ids = set(waiting.get(MessageType.FUNCTION_CALL.value) or ())
    approval_ids = set(waiting.get(MessageType.MCP_APPROVAL_REQUEST.value) or ())
    answers: list[Message] = []
    for message in response.output or ():
        for item in message.content or ():
            data = item.data if isinstance(item, DataContent) else None
            if not isinstance(data, dict):
                continue
            if message.type is MessageType.FUNCTION_CALL and data.get("call_id") in call_ids:
                output = await _call_local(functions, data)
                answers.append(
                    _data_message(
                        MessageType.FUNCTION_CALL_OUTPUT,
                        Role.TOOL,
                        {"call_id": data["call_id"], "output": output},
                    )
                )
            elif (
                message.type is MessageType.MCP_APPROVAL_REQUEST and data.get("id") in approval_ids
            ):
                verdict: Any = approve(data) if approve is not None else False
                if inspect.isawaitable(verdict):
                    verdict = await verdict
                yes, reason = verdict if isinstance(verdict, tuple) else (bool(verdict), None)
                answer: dict[str, Any] = {"approval_request_id": data["id"], "approve": yes}
                if reason:
                    answer["reason"] = reason
                answers.append(_data_message(MessageType.MCP_APPROVAL_RESPONSE, Role.USER, answer))
    return answers


async def _call_local(functions: Mapping[str, LocalFunction], call: Mapping[str, Any]) -> str:
    name = str(call.get("name"))
    function = functions.get(name)
    try:
        if function is None:
            raise LookupError(f"the client has no function {name!r}")
        args = json.loads(call.get("arguments") or "{}")
        result = function(**args) if isinstance(args, dict) else function(args)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        return json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}})
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _data_message(kind: MessageType, role: Role, data: dict[str, Any]) -> Message:
    return Message(type=kind, role=role, content=[DataContent(data=data)])


def _continuation(answers: list[Message], session_id: str | None) -> AgentRequest:
    return AgentRequest(input=answers, session_id=session_id)


def _body(request: AgentRequest) -> bytes:
    return request.wire_json().encode()


def _error_of(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        return ApiError(response.status_code, str(body["code"]), str(body["message"]))
    except (ValueError, KeyError, TypeError):
        return ApiError(response.status_code, "http_error", response.text[:500])


def _sequence_of(event_id: str | None) -> int | None:
    """The sequence number an event id ends with (``<response id>:<n>`` or ``<n>``), if any."""
    if event_id is None:
        return None
    number = event_id.rpartition(":")[2]
    if number.isascii() and number.isdigit() and len(number) <= _MAX_DIGITS:
        return int(number)
    return None


def _too_large(message: str) -> ApiError:
    return ApiError(0, "event_too_large", message)


class SSELineReader(sse.LineReader):
    """Splits a stream's bytes into lines the way Server-Sent Events do.

    :class:`openstarry.sse.LineReader` with this client's bound and error: the
    stream is UTF-8 (a byte order mark at its start is dropped), and a line
    ends at CRLF, CR or LF only, never at U+2028, U+2029 or U+0085, which JSON
    leaves raw inside strings.

    Raises:
        ApiError: a line longer than ``max_chars`` (``event_too_large``).
    """

    __slots__ = ()

    def __init__(self, max_chars: int = MAX_EVENT_CHARS) -> None:
        super().__init__(max_chars, error=_too_large)

    @property
    def max_chars(self) -> int:
        """The longest line, in characters."""
        return self.max_line


class SSEParser(sse.EventParser):
    """Splits Server-Sent Events text into ``(id, data)`` pairs, one per event with data.

    :class:`openstarry.sse.EventParser` with this client's bound and error:
    comments (``:`` lines) are skipped; ``id`` is the last ``id:`` field seen
    (it persists across events, as the SSE spec says).

    Raises:
        ApiError: an event's data grows past ``max_chars`` (``event_too_large``).
    """

    __slots__ = ()

    def __init__(self, max_chars: int = MAX_EVENT_CHARS) -> None:
        super().__init__(max_chars, error=_too_large)

    @property
    def max_chars(self) -> int:
        """The most data one event may carry, in characters."""
        return self.max_event

    def feed(self, line: str) -> tuple[str | None, str] | None:
        """Take one line (without its end); an ``(id, data)`` pair when it ends an event."""
        event = self.feed_line(line)
        return None if event is None else (event.id, event.data)


class StreamAssembler:
    """Rebuilds a response's messages from its streamed events.

    Feed it every event in order (:meth:`feed`); :attr:`messages` holds the
    messages, each with its content assembled from deltas (text concatenated,
    data merged) and replaced by each whole content event;
    :meth:`response` is the last response event with that ``output``.
    Events whose ``sequence_number`` was already seen are skipped (a replay
    that overlaps); a gap in the numbers raises :class:`ApiError`.
    """

    def __init__(self) -> None:
        self.messages: dict[str, Message] = {}
        self.last_response: AgentResponse | None = None
        self.last_sequence = -1

    @property
    def done(self) -> bool:
        """Whether the response's terminal event has arrived."""
        last = self.last_response
        return last is not None and last.status in TERMINAL_STATUSES

    def feed(self, event: WireEvent) -> bool:
        """Apply ``event``; ``False`` when it was a repeat and was skipped.

        Raises:
            ApiError: an event is missing before this one (``stream_gap``).
        """
        if isinstance(event, Message) and event.type is MessageType.HEARTBEAT:
            return True  # a beat on a quiet stream, no part of the response
        number = event.sequence_number
        if number is not None:
            if number <= self.last_sequence:
                return False
            if number != self.last_sequence + 1:
                raise ApiError(
                    0,
                    "stream_gap",
                    f"events {self.last_sequence + 1}..{number - 1} are missing from the stream",
                )
            self.last_sequence = number
        if isinstance(event, AgentResponse):
            self.last_response = event
        elif isinstance(event, Message):
            self._message(event)
        else:
            self._content(event)
        return True

    def _message(self, event: Message) -> None:
        known = self.messages.get(event.id)
        if known is None:
            known = event.model_copy(deep=True, update={"sequence_number": None})
            if known.status not in TERMINAL_STATUSES:
                known.content = None  # built from the content events
            self.messages[event.id] = known
            return
        known.status = event.status
        known.code, known.message = event.code or known.code, event.message or known.message
        if event.error is not None:
            known.error = event.error
        if not known.content and event.content:
            known.content = [c.model_copy(deep=True) for c in event.content]

    def _content(self, event: Content) -> None:
        msg_id = event.msg_id or ""
        message = self.messages.get(msg_id)
        if message is None:
            message = self.messages[msg_id] = Message(id=msg_id) if msg_id else Message()
        item = event.model_copy(deep=True, update={"sequence_number": None})
        slots = len(message.content or ())
        if item.delta:
            if item.index is None or item.index >= slots:
                item.index = None  # opens the slot
            message.add_delta_content(item)
        else:
            if item.index is not None and item.index > slots:
                item.index = None
            message.add_content(item)
            if event.status is not None and message.content is not None:
                index = event.index if event.index is not None else len(message.content) - 1
                if index < len(message.content):
                    message.content[index].status = event.status

    def response(self) -> AgentResponse:
        """The last response event, with ``output`` the assembled messages.

        Raises:
            ApiError: no response event has arrived.
        """
        if self.last_response is None:
            raise ApiError(0, "no_response", "the stream carried no response event")
        output = [m.model_copy(deep=True) for m in self.messages.values()]
        return self.last_response.model_copy(
            update={"output": output or self.last_response.output, "sequence_number": None}
        )


def _reader() -> sse.SSEReader:
    """A reader of one answered stream, with this client's bound on lines and events."""
    return sse.SSEReader(MAX_EVENT_CHARS, MAX_EVENT_CHARS, error=_too_large)


def _response_id_of(event_id: str | None, fallback: str | None) -> str | None:
    if event_id and ":" in event_id:
        return event_id.rpartition(":")[0]
    return fallback


class _Follow:
    """Following one response's stream across reconnects: what both clients share.

    The first request is the caller's; after a break, each next one is ``GET
    /process/{response_id}`` with ``Last-Event-ID``, the id of the last event
    received, so no event is lost or repeated.
    """

    def __init__(
        self,
        first: tuple[str, str, bytes | None, dict[str, str] | None],
        response_id: str | None,
        base_url: str,
        max_reconnects: int,
    ) -> None:
        self.method, self.url, self.body, self.headers = first
        self.response_id = response_id
        self.last_id: str | None = (self.headers or {}).get("last-event-id")
        self.assembler = StreamAssembler()
        resumed_at = _sequence_of(self.last_id)
        if resumed_at is not None:
            self.assembler.last_sequence = resumed_at
        self.attempts = 0
        self._base_url = base_url
        self._max_reconnects = max_reconnects
        self._reader = _reader()

    def send_headers(self) -> dict[str, str]:
        headers = {"accept": "text/event-stream", **(self.headers or {})}
        if self.body is not None:
            headers["content-type"] = "application/json"
        return headers

    def started(self, response: httpx.Response) -> None:
        """A stream answered: read it from its start."""
        self.response_id = response.headers.get("x-openstarry-response-id", self.response_id)
        self._reader = _reader()

    def feed(self, chunk: bytes) -> list[WireEvent]:
        """The new events a chunk of the stream completes (repeats after a resume dropped)."""
        return self._take(self._reader.feed(chunk))

    def ended(self) -> list[WireEvent]:
        """The stream ended: the events its last bytes complete (a CR held back ends a line)."""
        return self._take(self._reader.close())

    def _take(self, events: list[sse.ServerSentEvent]) -> list[WireEvent]:
        new: list[WireEvent] = []
        for sent in events:
            event = parse_event(sent.data)
            if self.assembler.feed(event):
                self.attempts = 0
                self.last_id = sent.id
                self.response_id = _response_id_of(sent.id, self.response_id)
                new.append(event)
        return new

    def broke(self, error: Exception | None) -> None:
        """The stream broke (``error``) or ended early (``None``): aim the next request at
        the rest of it.

        Raises:
            ApiError: ``cannot_connect`` when nothing was ever received,
                ``stream_broken`` when the stream cannot be resumed (no response
                id, or ``max_reconnects`` breaks in a row).
        """
        failure = error or ApiError(0, "stream_ended", "the stream ended before the response did")
        self.attempts += 1
        if self.last_id is None and isinstance(failure, httpx.ConnectError):
            # Nothing was ever received: there is no stream to resume.
            raise ApiError(
                0, "cannot_connect", f"cannot connect to {self._base_url}: {failure}"
            ) from failure
        if self.response_id is None or self.attempts > self._max_reconnects:
            raise ApiError(
                0, "stream_broken", f"the stream broke and could not be resumed: {failure}"
            ) from failure
        self.method, self.url, self.body = "GET", f"/process/{self.response_id}", None
        self.headers = {"last-event-id": self.last_id} if self.last_id else None


class AgentClient:
    """An async client of an openstarry Agent API server (asyncio or trio).

    Args:
        base_url: The server, e.g. ``"http://127.0.0.1:8000"``.
        timeout: Seconds to connect, and to wait for each piece of a response
            (the server sends a heartbeat on a quiet stream, 15 s by default).
        max_reconnects: Reconnects in a row, without an event between, before
            a broken stream raises :class:`ApiError`.
        retry_delay: Seconds before a reconnect.
        http: An ``httpx.AsyncClient`` to use instead of one of its own.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 60.0,
        max_reconnects: int = 3,
        retry_delay: float = 0.2,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._owns = http is None
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self.max_reconnects = max_reconnects
        self.retry_delay = retry_delay

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (of a client it made itself)."""
        if self._owns:
            await self.http.aclose()

    async def health(self) -> dict[str, Any]:
        """``GET /health``."""
        response = await self.http.get("/health")
        if response.status_code != 200:
            raise _error_of(response)
        body: dict[str, Any] = response.json()
        return body

    async def send(
        self, request: AgentRequest | str, *, session_id: str | None = None
    ) -> AgentResponse:
        """Send the request with ``stream: false``; the server's whole response."""
        req = make_request(request, session_id=session_id, stream=False)
        response = await self.http.post(
            "/process", content=_body(req), headers={"content-type": "application/json"}
        )
        if response.status_code != 200:
            raise _error_of(response)
        return AgentResponse.model_validate_json(response.content)

    async def run(
        self, request: AgentRequest | str, *, session_id: str | None = None
    ) -> AgentResponse:
        """Stream the request to its end; the final response with the reassembled ``output``."""
        assembler = StreamAssembler()
        async for event in self.stream(request, session_id=session_id):
            assembler.feed(event)
        return assembler.response()

    async def run_with_tools(
        self,
        request: AgentRequest | str,
        functions: Mapping[str, LocalFunction],
        *,
        approve: Approver | None = None,
        session_id: str | None = None,
        max_steps: int = 20,
    ) -> AgentResponse:
        """:meth:`run`, answering what the run waits for until it ends (see the module).

        Returns the last response (its ``output`` that of the last request).

        Raises:
            ApiError: the run still waits after ``max_steps`` answers (``too_many_steps``).
        """
        response = await self.run(request, session_id=session_id)
        for _ in range(max_steps):
            if response.status is not RunStatus.Incomplete:
                return response
            answers = await answers_to(response, functions, approve)
            response = await self.run(_continuation(answers, response.session_id))
        if response.status is RunStatus.Incomplete:
            raise ApiError(0, "too_many_steps", f"the run still waits after {max_steps} answers")
        return response

    async def stream(
        self, request: AgentRequest | str, *, session_id: str | None = None
    ) -> AsyncIterator[WireEvent]:
        """Send the request with ``stream: true`` and yield each event, reconnecting as needed."""
        req = make_request(request, session_id=session_id, stream=True)
        async for event in self._follow(("POST", "/process", _body(req), None), req.response_id):
            yield event

    async def resume(
        self, response_id: str, last_event_id: str | None = None
    ) -> AsyncIterator[WireEvent]:
        """Follow a response already started: the events after ``last_event_id`` (all without)."""
        headers = {"last-event-id": last_event_id} if last_event_id else None
        async for event in self._follow(
            ("GET", f"/process/{response_id}", None, headers), response_id
        ):
            yield event

    async def _follow(
        self,
        first: tuple[str, str, bytes | None, dict[str, str] | None],
        response_id: str | None,
    ) -> AsyncIterator[WireEvent]:
        follow = _Follow(first, response_id, str(self.http.base_url), self.max_reconnects)
        while True:
            try:
                async with self.http.stream(
                    follow.method, follow.url, content=follow.body, headers=follow.send_headers()
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise _error_of(response)
                    follow.started(response)
                    chunks = response.aiter_bytes()
                    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                        async for chunk in chunks:
                            for event in follow.feed(chunk):
                                yield event
                    for event in follow.ended():
                        yield event
                    # The server ends the stream after the terminal event: read to
                    # its end, so httpx's generators are exhausted rather than abandoned.
                    if follow.assembler.done:
                        return
            except httpx.TransportError as exc:  # a dropped connection, a timeout
                follow.broke(exc)
            else:
                follow.broke(None)
            await anyio.sleep(self.retry_delay)


class Client:
    """The blocking twin of :class:`AgentClient`, for scripts (same arguments and methods)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 60.0,
        max_reconnects: int = 3,
        retry_delay: float = 0.2,
        http: httpx.Client | None = None,
    ) -> None:
        self._owns = http is None
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self.max_reconnects = max_reconnects
        self.retry_delay = retry_delay

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (of a client it made itself)."""
        if self._owns:
            self.http.close()

    def health(self) -> dict[str, Any]:
        """``GET /health``."""
        response = self.http.get("/health")
        if response.status_code != 200:
            raise _error_of(response)
        body: dict[str, Any] = response.json()
        return body

    def send(self, request: AgentRequest | str, *, session_id: str | None = None) -> AgentResponse:
        """Send the request with ``stream: false``; the server's whole response."""
        req = make_request(request, session_id=session_id, stream=False)
        response = self.http.post(
            "/process", content=_body(req), headers={"content-type": "application/json"}
        )
        if response.status_code != 200:
            raise _error_of(response)
        return AgentResponse.model_validate_json(response.content)

    def run(self, request: AgentRequest | str, *, session_id: str | None = None) -> AgentResponse:
        """Stream the request to its end; the final response with the reassembled ``output``."""
        assembler = StreamAssembler()
        for event in self.stream(request, session_id=session_id):
            assembler.feed(event)
        return assembler.response()

    def run_with_tools(
        self,
        request: AgentRequest | str,
        functions: Mapping[str, LocalFunction],
        *,
        approve: Approver | None = None,
        session_id: str | None = None,
        max_steps: int = 20,
    ) -> AgentResponse:
        """The blocking :meth:`AgentClient.run_with_tools` (the functions may not be async)."""
        response = self.run(request, session_id=session_id)
        for _ in range(max_steps):
            if response.status is not RunStatus.Incomplete:
                return response
            answers = anyio.run(answers_to, response, functions, approve)
            response = self.run(_continuation(answers, response.session_id))
        if response.status is RunStatus.Incomplete:
            raise ApiError(0, "too_many_steps", f"the run still waits after {max_steps} answers")
        return response

    def stream(
        self, request: AgentRequest | str, *, session_id: str | None = None
    ) -> Iterator[WireEvent]:
        """Send the request with ``stream: true`` and yield each event, reconnecting as needed."""
        req = make_request(request, session_id=session_id, stream=True)
        return self._follow(("POST", "/process", _body(req), None), req.response_id)

    def resume(self, response_id: str, last_event_id: str | None = None) -> Iterator[WireEvent]:
        """Follow a response already started: the events after ``last_event_id`` (all without)."""
        headers = {"last-event-id": last_event_id} if last_event_id else None
        return self._follow(("GET", f"/process/{response_id}", None, headers), response_id)

    def _follow(
        self,
        first: tuple[str, str, bytes | None, dict[str, str] | None],
        response_id: str | None,
    ) -> Iterator[WireEvent]:
        follow = _Follow(first, response_id, str(self.http.base_url), self.max_reconnects)
        while True:
            try:
                with self.http.stream(
                    follow.method, follow.url, content=follow.body, headers=follow.send_headers()
                ) as response:
                    if response.status_code != 200:
                        response.read()
                        raise _error_of(response)
                    follow.started(response)
                    for chunk in response.iter_bytes():
                        yield from follow.feed(chunk)
                    yield from follow.ended()
                    if follow.assembler.done:
                        return
            except httpx.TransportError as exc:  # a dropped connection, a timeout
                follow.broke(exc)
            else:
                follow.broke(None)
            time.sleep(self.retry_delay)
