"""Hostile and unusual inputs for the Agent API (spec 003), found by review.

Each test guards one promise of ``openstarry.api``: the server never answers a
malformed request with a 500, every event reaches the client whole whatever
characters its text holds, an error inside a run's stream comes out as itself,
a client that goes away mid-send ends its stream quietly, a ``stream: false``
run outlives a client's read timeout, a reader that keeps up costs what is new
and not the whole replay buffer, a refused builder call changes nothing, and
running the adapter keeps nothing of an agent alive once the agent is gone.
"""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import MutableMapping
from contextlib import AbstractContextManager
from typing import Any

import anyio
import httpx
import pytest

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.runtime import Agent
from openstarry.api import adapter as adapter_module
from openstarry.api.adapter import collect_run, open_run
from openstarry.api.builders import ResponseBuilder
from openstarry.api.client import AgentClient, ApiError, Client, SSELineReader, SSEParser
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    MessageType,
    Role,
)
from openstarry.api.server import ServerLimits, _Record, create_app
from openstarry.testing import FunctionProvider, ScriptedProvider, text, tool_call
from test_api_http import lifespan_of, serving_app

HANG = 10
#: Characters JSON leaves raw in strings that ``str.splitlines`` takes for line ends.
BREAKERS = "a\u2028b\u2029c\x85d"


def serving(app: Any) -> AbstractContextManager[str]:
    """Serve the ASGI ``app`` with uvicorn on a free port of 127.0.0.1 in a thread."""
    return serving_app(app)


def body(text_: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": [{"type": "text", "text": text_}]}], **fields}


def request(text_: str = "hi", **fields: Any) -> AgentRequest:
    return AgentRequest.model_validate(body(text_, **fields))


def blocking_run(url: str) -> AgentResponse:
    """``Client.run("hi")`` against ``url``, the connection closed after."""
    with Client(url, timeout=HANG, max_reconnects=0) as client:
        return client.run("hi")


def data_lines(raw: bytes) -> list[dict[str, Any]]:
    """The JSON of each ``data:`` line of an SSE body, split at LF only."""
    return [
        json.loads(line[len(b"data: ") :].decode())
        for line in raw.split(b"\n")
        if line.startswith(b"data: ")
    ]


# --- Last-Event-ID: a number that str.isdigit takes but int refuses ---------------------------


@pytest.mark.anyio
async def test_a_last_event_id_that_is_not_an_ascii_number_is_a_400_not_a_500() -> None:
    with serving(create_app(Agent(ScriptedProvider(["One."])))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            done = await http.post("/process", json=body(stream=False))
            response_id = done.json()["id"]
            headers = [
                b"\xb2",  # a superscript two in latin-1: isdigit() but not int()
                f"{response_id}:".encode() + b"\xb2",
                b"9" * 5000,  # more digits than int() converts
                f"{response_id}:{'1' * 5000}".encode(),
            ]
            answers = [
                await http.get(f"/process/{response_id}", headers={b"last-event-id": header})
                for header in headers
            ]
            answers.append(
                await http.post(
                    "/process",
                    json=body(response_id=response_id),
                    headers={b"last-event-id": b"\xb2"},
                )
            )
            health = await http.get("/health")
    for header, answer in zip([*headers, b"\xb2"], answers, strict=True):
        assert answer.status_code == 400, (header[:30], answer.text)
        assert answer.json()["code"] == "invalid_last_event_id"
    assert health.status_code == 200


@pytest.mark.anyio
async def test_an_empty_last_event_id_on_a_post_starts_a_fresh_run() -> None:
    # An SSE client has no event id before its first event: an empty header is none.
    provider = ScriptedProvider(["Fresh."])
    app = create_app(Agent(provider))
    async with lifespan_of(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            answer = await http.post(
                "/process",
                json=body(stream=False, response_id="response_fresh"),
                headers={"last-event-id": ""},
            )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"
    assert answer.json()["output"][-1]["content"][0]["text"] == "Fresh."


# --- U+2028, U+2029 and U+0085 in an event ------------------------------------------------------


@pytest.mark.anyio
async def test_line_separators_in_the_text_reach_both_clients_whole() -> None:
    agent = Agent(ScriptedProvider([f"async {BREAKERS}", f"blocking {BREAKERS}", BREAKERS]))
    with serving(create_app(agent)) as url:
        async with AgentClient(url, timeout=HANG) as client:
            streamed = await client.run("hi")
        blocking = await anyio.to_thread.run_sync(blocking_run, url)
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            raw = (await http.post("/process", json=body())).content
    assert streamed.output is not None
    assert streamed.output[-1].get_text_content() == f"async {BREAKERS}"
    assert blocking.output is not None
    assert blocking.output[-1].get_text_content() == f"blocking {BREAKERS}"
    # On the wire they are JSON escapes, so any line reader keeps each event whole.
    for breaker in ("\u2028", "\u2029", "\x85"):
        assert breaker.encode() not in raw
    events = data_lines(raw)
    assert events[-1]["status"] == "completed"
    assert events[-1]["output"][-1]["content"][0]["text"] == BREAKERS


def raw_sse_app(chunks: list[bytes]) -> Any:
    """An ASGI app that answers every request with these SSE bytes, chunk by chunk."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def foreign_stream() -> list[bytes]:
    """A stream as another Agent API server may write it: raw separators, CRLF line ends."""
    events = [
        {"sequence_number": 0, "object": "response", "status": "created", "id": "response_x"},
        {"sequence_number": 1, "object": "message", "status": "created", "id": "msg_x"},
        {
            "sequence_number": 2,
            "object": "content",
            "type": "text",
            "status": "in_progress",
            "delta": True,
            "index": 0,
            "msg_id": "msg_x",
            "text": BREAKERS,
        },
        {
            "sequence_number": 3,
            "object": "content",
            "type": "text",
            "status": "completed",
            "index": 0,
            "msg_id": "msg_x",
            "text": BREAKERS,
        },
        {"sequence_number": 4, "object": "message", "status": "completed", "id": "msg_x"},
        {"sequence_number": 5, "object": "response", "status": "completed", "id": "response_x"},
    ]
    raw = "".join(
        f"id: response_x:{e['sequence_number']}\r\n"
        f"data: {json.dumps(e, ensure_ascii=False)}\r\n\r\n"
        for e in events
    ).encode()
    # Cut between the CR and the LF of a line end, and inside a two-byte character.
    cut_crlf = raw.index(b"\r\n") + 1
    cut_char = raw.index("\x85".encode()) + 1
    return [raw[:cut_crlf], raw[cut_crlf:cut_char], raw[cut_char:]]


@pytest.mark.anyio
async def test_the_clients_split_lines_only_where_sse_does() -> None:
    with serving(raw_sse_app(foreign_stream())) as url:
        async with AgentClient(url, timeout=HANG, max_reconnects=0) as client:
            streamed = await client.run("hi")
        blocking = await anyio.to_thread.run_sync(blocking_run, url)
    for response in (streamed, blocking):
        assert str(response.status) == "completed"
        assert response.output is not None
        assert response.output[0].get_text_content() == BREAKERS


def test_the_line_reader_gives_the_same_lines_however_the_bytes_are_cut() -> None:
    raw = f"data: {BREAKERS}é\r\n\r\nid: 1\rdata: x\n\n: c\r\n".encode()
    expected = [f"data: {BREAKERS}é", "", "id: 1", "data: x", "", ": c"]
    for cut in range(len(raw) + 1):
        reader = SSELineReader()
        lines = reader.feed(raw[:cut]) + reader.feed(raw[cut:])
        assert lines == expected, cut
    bytewise = SSELineReader()
    assert [line for i in range(len(raw)) for line in bytewise.feed(raw[i : i + 1])] == expected
    # The SSE format drops a byte order mark at the start of the stream, and only there.
    marked = SSELineReader()
    assert marked.feed(b"\xef\xbb") + marked.feed(b"\xbfdata: 1\n\xef\xbb\xbf\n") == [
        "data: 1",
        "\ufeff",
    ]


def test_a_line_or_an_event_past_the_bound_is_refused() -> None:
    reader = SSELineReader(max_chars=8)
    assert reader.feed(b"data: 12") == []
    with pytest.raises(ApiError) as caught:
        reader.feed(b"3")
    assert caught.value.code == "event_too_large"
    parser = SSEParser(max_chars=8)
    assert parser.feed("data: 1234") is None
    with pytest.raises(ApiError) as caught:
        parser.feed("data: 5678")
    assert caught.value.code == "event_too_large"


# --- an error inside the stream comes out as itself ---------------------------------------------


async def break_inside(agent: Agent) -> None:
    """Raise ``KeyError`` in the body of ``open_run``, at its first event."""
    async with open_run(agent, request(session_id="s")) as run:
        async for _ in run:
            raise KeyError("mine")


@pytest.mark.anyio
async def test_an_error_in_the_body_of_open_run_comes_out_as_itself() -> None:
    async with Agent(ScriptedProvider(["First.", "Second."])) as agent:
        with pytest.raises(KeyError, match="mine"):
            await break_inside(agent)
        # The run was stopped and its routing undone: the session answers again.
        with anyio.fail_after(HANG):
            final = await collect_run(agent, request(session_id="s"))
    assert str(final.status) == "completed"
    assert final.output is not None
    assert final.output[-1].get_text_content() == "Second."


@pytest.mark.anyio
async def test_a_run_that_breaks_its_stream_fails_with_the_real_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("openstarry.api.builders.MAX_TEXT_LENGTH", 10)

    async def long_deltas(prompt: str, context: AgentContext) -> Any:
        context.emit_text_delta("x" * 20)
        return text("x" * 20)

    app = create_app(Agent(FunctionProvider(long_deltas)))
    async with lifespan_of(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            with anyio.fail_after(HANG):
                raw = (await http.post("/process", json=body())).content
    final = data_lines(raw)[-1]
    assert (final["object"], final["status"]) == ("response", "failed")
    assert final["error"]["code"] == "internal_error"
    assert "would exceed 10 characters" in final["error"]["message"]
    assert "TaskGroup" not in final["error"]["message"]
    assert "nursery" not in final["error"]["message"]


# --- a send that raises OSError (the ASGI spec's closed connection) -----------------------------


class WaitingTool(Tool):
    """An async tool that waits until cancelled; flags what happened."""

    name = "wait"
    description = "Waits."

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()


@pytest.mark.anyio
async def test_a_client_gone_mid_send_ends_the_stream_quietly_and_stops_the_run() -> None:
    tool = WaitingTool()
    agent = Agent(ScriptedProvider([tool_call("wait", {}, text="Waiting."), text("Done.")]), [tool])
    app = create_app(agent, limits=ServerLimits(resume_grace=0))
    data = json.dumps(body()).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/process",
        "raw_path": b"/process",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"api"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    requested = False
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": data, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        # As the ASGI spec asks of a server: send on a closed connection raises OSError.
        if message["type"] == "http.response.body" and tool.started.is_set():
            raise OSError("the connection is closed")
        sent.append(message)

    async with lifespan_of(app):
        with anyio.fail_after(HANG):
            await app(scope, receive, send)  # returns: no exception group escapes
            await tool.cancelled.wait()  # the reader left, so the run was stopped
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    events = [json.loads(m["body"].split(b"data: ", 1)[1]) for m in sent[1:] if m["body"]]
    assert events[0]["status"] == "created"


# --- nothing of a finished agent is kept ------------------------------------------------------


@pytest.mark.anyio
async def test_running_the_adapter_keeps_no_agents_bus_alive() -> None:
    buses = []
    for _ in range(3):
        agent = Agent(ScriptedProvider(["Fine."]))
        async with agent:
            final = await collect_run(agent, request())
        assert str(final.status) == "completed"
        buses.append(weakref.ref(agent.bus))
        del agent
    gc.collect()
    assert [ref() for ref in buses] == [None, None, None]
    assert len(adapter_module._ROUTERS) == 0


# --- builders: a refused call changes nothing -------------------------------------------------


def test_set_error_refuses_what_would_break_the_message_later() -> None:
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder(Role.ASSISTANT, MessageType.ERROR)
    message.created()
    with pytest.raises(TypeError, match="set_error needs a str"):
        message.set_error(500, None)  # type: ignore[arg-type]
    message.set_error("E500", "the tool broke")
    done = message.complete()
    assert (done.code, done.message, str(done.status)) == ("E500", "the tool broke", "completed")
    final = response.completed()
    assert final.output is not None
    assert [m.id for m in final.output] == [message.id]


# --- stream: false and a client's read timeout --------------------------------------------------


@pytest.mark.anyio
async def test_a_long_run_with_stream_false_outlives_the_clients_read_timeout() -> None:
    async def slow(prompt: str, context: AgentContext) -> Any:
        await anyio.sleep(0.6)
        return text(f"Slow answer to {prompt}.")

    # A heartbeat every 0.03 s: ten within each read's 0.3 s, so a loaded machine still
    # sends one in time; the run takes twice the read timeout.
    limits = ServerLimits(heartbeat=0.03)
    with serving(create_app(Agent(FunctionProvider(slow)), limits=limits)) as url:
        async with AgentClient(url, timeout=0.3, max_reconnects=0) as client:
            answer = await client.send("one")
        async with httpx.AsyncClient(base_url=url, timeout=0.3) as http:
            raw = await http.post("/process", json=body("two", stream=False))
    assert str(answer.status) == "completed"
    assert answer.output is not None
    assert answer.output[-1].get_text_content() == "Slow answer to one."
    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.headers["x-openstarry-response-id"] == raw.json()["id"]
    assert raw.content.startswith(b" ")  # the spaces that kept the connection alive
    assert raw.json()["output"][-1]["content"][0]["text"] == "Slow answer to two."


# --- the replay buffer: a reader that keeps up costs what is new --------------------------------


async def _keep_up(buffered: int, events: int) -> None:
    """A reader follows ``events`` new events, in order, with ``buffered`` kept before."""
    limits = ServerLimits(replay_events=50_000, replay_bytes=1 << 30)
    record = _Record("response_big", "s", limits)
    for seq in range(buffered):
        record.append(seq, "{}")
    reader = object()
    record.cursors[reader] = buffered - 1
    frames = record.frames_after(buffered - 1, heartbeat=HANG, reader=reader)
    received = 0
    with anyio.fail_after(HANG):
        for seq in range(buffered, buffered + events):
            record.append(seq, "{}")
            frame = await frames.__anext__()
            assert frame.startswith(f"id: response_big:{seq}\n".encode())
            received += 1
    await frames.aclose()
    assert received == events


@pytest.mark.anyio
async def test_a_reader_that_keeps_up_gets_every_new_frame() -> None:
    """A reader scanned the whole buffer on each new frame (quadratic over a long run); it
    now reads from the newest end, which ``make bench`` measures
    (``benches/test_bench_linear.py``). Here: a reader with 30,000 frames kept before it
    gets each new frame, in order.
    """
    await _keep_up(30_000, 2000)
