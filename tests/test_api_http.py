"""The Agent API over HTTP: a real uvicorn server on 127.0.0.1, driven with httpx.

Each test starts a server in a thread (its own asyncio loop, as ``openstarry
serve`` runs it) on a free port, and stops it at the end. The client side runs
on asyncio and on trio.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import pytest
import uvicorn
from anyio.abc import SocketAttribute, SocketStream

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.runtime import Agent
from openstarry.api.client import (
    AgentClient,
    ApiError,
    Client,
    SSELineReader,
    SSEParser,
    StreamAssembler,
)
from openstarry.api.models import AgentResponse, Message, parse_event
from openstarry.api.replay import ResponseRecord
from openstarry.api.server import ServerLimits, create_app
from openstarry.assembly import agent_from_manifest
from openstarry.testing import FunctionProvider, ScriptedProvider, text, tool_call

WEATHER = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
HANG = 10
FINAL_TEXT = "The weather in Taipei is 25°C, Sunny."


@contextmanager
def serving(agent: Agent, limits: ServerLimits | None = None) -> Iterator[str]:
    """Serve ``agent`` on a free port of 127.0.0.1 in a thread; yield its base URL."""
    with serving_app(create_app(agent, limits=limits), lifespan="on") as url:
        yield url


@contextmanager
def serving_app(
    app: Any, lifespan: Literal["auto", "on", "off"] = "auto", port: int = 0
) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on 127.0.0.1 in a thread: on ``port``, or
    a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", log_config=None, timeout_graceful_shutdown=2, lifespan=lifespan
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(HANG)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def body(text_: str = "Query weather in Taipei", **fields: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": [{"type": "text", "text": text_}]}], **fields}


class BlockingTool(Tool):
    """An async tool that waits until released (or cancelled); thread-safe flags for the test."""

    name = "block"
    description = "Waits."

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        try:
            while not self.release.is_set():
                await anyio.sleep(0.01)
        except BaseException:
            self.cancelled.set()
            raise
        return {"released": True}


def blocking_agent(tool: BlockingTool, answers: int = 1) -> Agent:
    script: list[Any] = []
    for _ in range(answers):
        script += [tool_call("block", {}, text="Working on it."), text("Done.")]
    return Agent(ScriptedProvider(script), [tool])


async def wait_for(flag: threading.Event) -> bool:
    return await anyio.to_thread.run_sync(flag.wait, HANG)


async def stream_until(
    url: str,
    payload: dict[str, Any],
    stop: Callable[[dict[str, Any]], bool],
    comments: list[str] | None = None,
) -> tuple[dict[str, str], list[tuple[str, dict[str, Any]]]]:
    """POST ``payload`` on a raw connection, read events until ``stop(event)``, then hang up.

    With ``comments``, the SSE comment lines read go there, and the first one
    also ends the reading. Returns the response's headers and the ``(id,
    event)`` pairs read.
    """
    host, _, port = url.removeprefix("http://").partition(":")
    data = json.dumps(payload).encode()
    head = (
        f"POST /process HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    headers: dict[str, str] | None = None
    events: list[tuple[str, dict[str, Any]]] = []
    parser = SSEParser()
    buffer = b""
    async with await anyio.connect_tcp(host, int(port)) as connection:
        await connection.send(head.encode() + data)
        while True:
            buffer += await connection.receive()
            if headers is None:
                if b"\r\n\r\n" not in buffer:
                    continue
                raw, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = raw.decode("latin-1").split("\r\n")
                assert lines[0].split()[1] == "200", lines[0]
                headers = {
                    k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
                }
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if comments is not None and line.startswith(b":"):
                    comments.append(line.decode())
                    return headers, events
                parsed = parser.feed(line.decode().rstrip("\r"))
                if parsed is not None:
                    assert parsed[0] is not None
                    events.append((parsed[0], json.loads(parsed[1])))
                    if stop(events[-1][1]):
                        return headers, events


def frames(raw: str) -> list[dict[str, str]]:
    """The SSE frames of a stream body: the fields of each block, comments left out."""
    blocks = []
    for block in raw.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            assert name not in fields, f"field {name} twice in one event: {block!r}"
            fields[name] = value
        if fields:
            blocks.append(fields)
    return blocks


@pytest.mark.anyio
async def test_health() -> None:
    with serving(agent_from_manifest(WEATHER)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            response = await http.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "agent": "weather-agent", "runs": 0, "responses": 0}


@pytest.mark.anyio
async def test_weather_run_streams_end_to_end() -> None:
    with serving(agent_from_manifest(WEATHER)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            response = await http.post("/process", json=body(session_id="alice"))
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = response.text
            async with AgentClient(url) as client:
                assembled = await client.run("Query weather in Taipei", session_id="bob")
    blocks = frames(raw)
    assert all(set(block) == {"id", "data"} for block in blocks)
    events = [json.loads(block["data"]) for block in blocks]
    response_id = events[0]["id"]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(len(events)))
    assert [block["id"] for block in blocks] == [f"{response_id}:{n}" for n in numbers]
    assert [(e["object"], e["status"]) for e in events[:2]] == [
        ("response", "created"),
        ("response", "in_progress"),
    ]
    final = events[-1]
    assert (final["object"], final["status"], final["session_id"]) == (
        "response",
        "completed",
        "alice",
    )
    assert [m["type"] for m in final["output"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert final["output"][-1]["content"][0]["text"] == FINAL_TEXT
    deltas = [e["text"] for e in events if e["object"] == "content" and e.get("delta")]
    assert deltas == ["Sure, let me check.", FINAL_TEXT]
    # The client reassembles the same messages from the deltas.
    assert assembled.status is not None
    assert str(assembled.status) == "completed"
    assert assembled.session_id == "bob"
    assert assembled.output is not None
    assert [m.get_text_content() for m in assembled.output] == [
        "Sure, let me check.",
        None,
        None,
        FINAL_TEXT,
    ]
    assert [m.type.value for m in assembled.output] == [m["type"] for m in final["output"]]


@pytest.mark.anyio
async def test_stream_false_gives_one_whole_response() -> None:
    with serving(agent_from_manifest(WEATHER)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            response = await http.post("/process", json=body(stream=False, session_id="s"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    result = AgentResponse.model_validate_json(response.content)
    assert str(result.status) == "completed"
    assert result.session_id == "s"
    assert result.output is not None
    assert result.output[-1].get_text_content() == FINAL_TEXT
    assert result.usage is not None
    assert result.usage["output_tokens"] > 0


@pytest.mark.anyio
async def test_session_id_carries_the_conversation_across_requests() -> None:
    provider = ScriptedProvider(["Nice to meet you, Ada.", "Your name is Ada.", "Hello."])
    with serving(Agent(provider)) as url:
        async with AgentClient(url, timeout=HANG) as client:
            first = await client.send("My name is Ada.", session_id="ada")
            second = await client.run("What is my name?", session_id="ada")
            other = await client.send("Hi.")
    assert first.session_id == second.session_id == "ada"
    assert second.output is not None
    assert second.output[0].get_text_content() == "Your name is Ada."
    remembered = [getattr(entry, "text", None) for entry in provider.calls[1].memory]
    assert remembered[:2] == ["My name is Ada.", "Nice to meet you, Ada."]
    # A request without a session gets a new one, with nothing remembered.
    assert other.session_id is not None
    assert other.session_id not in ("ada", None)
    assert [getattr(e, "text", None) for e in provider.calls[2].memory] == ["Hi."]


@pytest.mark.anyio
async def test_a_client_that_disconnects_cancels_its_run() -> None:
    tool = BlockingTool()
    limits = ServerLimits(resume_grace=0.2)
    with serving(blocking_agent(tool), limits) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            headers, _ = await stream_until(
                url, body(session_id="d"), lambda e: e.get("type") == "function_call"
            )
            response_id = headers["x-openstarry-response-id"]
            # The connection is closed; the tool was running.
            assert tool.started.is_set()
            assert await wait_for(tool.cancelled)
            assert not tool.release.is_set()
            # The response ended canceled, and the session is free again.
            replay = await http.get(f"/process/{response_id}")
            events = [json.loads(f["data"]) for f in frames(replay.text)]
            assert (events[-1]["object"], events[-1]["status"]) == ("response", "canceled")
            health = (await http.get("/health")).json()
            assert health["runs"] == 0


@pytest.mark.anyio
async def test_resume_with_last_event_id_replays_exactly_what_was_missed() -> None:
    tool = BlockingTool()
    with serving(blocking_agent(tool), ServerLimits(resume_grace=HANG)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            _, seen = await stream_until(
                url, body(session_id="r"), lambda e: e.get("type") == "function_call"
            )
            last_id = seen[-1][0]
            response_id = seen[0][1]["id"]
            assert last_id == f"{response_id}:{seen[-1][1]['sequence_number']}"
            # The run goes on while nobody listens.
            tool.release.set()
            async with AgentClient(url, timeout=HANG) as client:
                missed = [e async for e in client.resume(response_id, last_id)]
            whole = frames((await http.get(f"/process/{response_id}")).text)
            # POST with the header resumes too (a retrying SSE client).
            again = await http.post(
                "/process", json=body(session_id="r"), headers={"Last-Event-ID": last_id}
            )
            number = last_id.rpartition(":")[2]
            bare = await http.post(
                "/process",
                json=body(session_id="r", response_id=response_id),
                headers={"Last-Event-ID": number},
            )
    assert not tool.cancelled.is_set()
    first_missed = seen[-1][1]["sequence_number"] + 1
    assert [e.sequence_number for e in missed] == list(range(first_missed, len(whole)))
    assert [json.loads(e.wire_json()) for e in missed] == [
        json.loads(f["data"]) for f in whole[first_missed:]
    ]
    assert [json.loads(f["data"]) for f in whole[:first_missed]] == [e for _, e in seen]
    final = missed[-1]
    assert isinstance(final, AgentResponse)
    assert str(final.status) == "completed"
    assert again.status_code == 200
    assert frames(again.text) == whole[first_missed:]
    assert bare.status_code == 200
    assert frames(bare.text) == whole[first_missed:]


@pytest.mark.anyio
async def test_resume_errors() -> None:
    limits = ServerLimits(replay_events=3)
    with serving(Agent(ScriptedProvider(["One.", "Two."])), limits) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            done = await http.post("/process", json=body(session_id="e"))
            events = [json.loads(f["data"]) for f in frames(done.text)]
            response_id = events[0]["id"]
            last = events[-1]["sequence_number"]
            # The newest three events are kept.
            kept = await http.get(
                f"/process/{response_id}", headers={"Last-Event-ID": f"{response_id}:{last - 3}"}
            )
            gone = await http.get(
                f"/process/{response_id}", headers={"Last-Event-ID": f"{response_id}:0"}
            )
            unknown = await http.get("/process/response_nope")
            bad = await http.get(f"/process/{response_id}", headers={"Last-Event-ID": "x:y"})
            other = await http.get(
                f"/process/{response_id}", headers={"Last-Event-ID": "response_other:1"}
            )
            future = await http.get(
                f"/process/{response_id}", headers={"Last-Event-ID": str(last + 5)}
            )
            post_bare = await http.post("/process", json=body(), headers={"Last-Event-ID": "3"})
    assert kept.status_code == 200, kept.text
    assert [json.loads(f["data"])["sequence_number"] for f in frames(kept.text)] == [
        last - 2,
        last - 1,
        last,
    ]
    for response, status, code in [
        (gone, 410, "events_expired"),
        (unknown, 404, "response_not_found"),
        (bad, 400, "invalid_last_event_id"),
        (other, 400, "invalid_last_event_id"),
        (future, 400, "invalid_last_event_id"),
        (post_bare, 400, "invalid_last_event_id"),
    ]:
        assert response.status_code == status, response.text
        assert response.json()["code"] == code
        assert set(response.json()) == {"code", "message"}


MALFORMED: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("invalid JSON", b'{"input": [', {}, 400, "invalid_json"),
    ("not an object", b"[1, 2]", {}, 422, "invalid_request"),
    ("stream is a string", json.dumps(body(stream="yes")).encode(), {}, 422, "invalid_request"),
    ("n = 6", json.dumps(body(n=6)).encode(), {}, 422, "invalid_request"),
    (
        "unknown tool type",
        json.dumps(body(tools=[{"type": "retrieval", "function": {"name": "f"}}])).encode(),
        {},
        422,
        "invalid_request",
    ),
    ("empty input", json.dumps({"input": []}).encode(), {}, 422, "invalid_request"),
    ("no input", b"{}", {}, 422, "invalid_request"),
    ("blank text", json.dumps(body("   ")).encode(), {}, 422, "empty_input"),
    (
        "no user message",
        json.dumps({"input": [{"role": "system"}]}).encode(),
        {},
        422,
        "invalid_request",
    ),
    (
        "image input",
        json.dumps(
            {
                "input": [
                    {"role": "user", "content": [{"type": "image", "image_url": "https://a/b"}]}
                ]
            }
        ).encode(),
        {},
        422,
        "unsupported_content",
    ),
    (
        "n = 2 of a slash command",
        json.dumps(body("/reset", n=2)).encode(),
        {},
        422,
        "unsupported_n",
    ),
    ("too large", json.dumps(body("x" * 5000)).encode(), {}, 413, "request_too_large"),
    (
        "response_id with a newline",
        json.dumps(body(response_id="response_1\ndata: {}")).encode(),
        {},
        422,
        "invalid_request",
    ),
    (
        "form data",
        b"input=hi",
        {"content-type": "application/x-www-form-urlencoded"},
        415,
        "unsupported_media_type",
    ),
]


@pytest.mark.anyio
async def test_malformed_requests_get_4xx_with_an_error_body() -> None:
    provider = ScriptedProvider([])
    with serving(Agent(provider), ServerLimits(max_body_bytes=4096)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            results = []
            for name, content, headers, _, _ in MALFORMED:
                headers = {"content-type": "application/json", **headers}
                response = await http.post("/process", content=content, headers=headers)
                results.append((name, response))
            wrong_method = await http.get("/process")
            no_route = await http.get("/nowhere")
            health = (await http.get("/health")).json()
    for (name, response), (_, _, _, status, code) in zip(results, MALFORMED, strict=True):
        assert response.status_code == status, (name, response.text)
        error = response.json()
        assert set(error) == {"code", "message"}, name
        assert error["code"] == code, (name, error)
        assert error["message"], name
    assert (wrong_method.status_code, wrong_method.json()["code"]) == (405, "method_not_allowed")
    assert (no_route.status_code, no_route.json()["code"]) == (404, "not_found")
    assert not provider.calls  # nothing reached the agent
    assert health["runs"] == 0


@pytest.mark.anyio
async def test_one_run_per_session_and_a_bound_on_runs() -> None:
    tool = BlockingTool()
    limits = ServerLimits(max_concurrent_runs=1, max_responses=4, resume_grace=0)
    with serving(blocking_agent(tool), limits) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            async with http.stream("POST", "/process", json=body(session_id="busy")) as first:
                assert first.status_code == 200
                assert await wait_for(tool.started)
                same = await http.post("/process", json=body(session_id="busy"))
                other = await http.post("/process", json=body(session_id="other"))
                tool.release.set()
                raw = await first.aread()
            after = await http.post("/process", json=body("again", session_id="busy"))
    assert same.status_code == 409
    assert same.json()["code"] == "session_busy"
    assert first.headers["x-openstarry-response-id"] in same.json()["message"]
    assert other.status_code == 503
    assert other.json()["code"] == "too_many_runs"
    assert other.headers["retry-after"] == "1"
    assert json.loads(frames(raw.decode())[-1]["data"])["status"] == "completed"
    # The session is free once its run has ended (the script is spent: the run fails).
    assert after.status_code == 200


def test_blocking_client() -> None:
    with serving(agent_from_manifest(WEATHER)) as url, Client(url, timeout=HANG) as client:
        assert client.health()["status"] == "ok"
        streamed = client.run("Query weather in Taipei", session_id="sync")
        whole = client.send("Query weather in Taipei", session_id="sync")
        with pytest.raises(ApiError) as caught:
            client.send("   ")
    assert streamed.output is not None
    assert whole.output is not None
    assert streamed.output[-1].get_text_content() == FINAL_TEXT
    assert whole.output[-1].get_text_content() == FINAL_TEXT
    assert (caught.value.status, caught.value.code) == (422, "empty_input")


def test_stream_assembler_rebuilds_the_spec_example() -> None:
    lines = [
        '{"status":"created","id":"response_1","object":"response","sequence_number":0}',
        '{"status":"created","id":"msg_1","object":"message","role":"assistant","sequence_number":1}',
        '{"status":"in_progress","type":"text","index":0,"delta":true,"text":"Hello",'
        '"object":"content","msg_id":"msg_1","sequence_number":2}',
        '{"status":"in_progress","type":"text","index":0,"delta":true,"text":", ",'
        '"object":"content","msg_id":"msg_1","sequence_number":3}',
        '{"status":"in_progress","type":"text","index":0,"delta":true,"text":"world",'
        '"object":"content","msg_id":"msg_1","sequence_number":4}',
        '{"status":"completed","type":"text","index":0,"delta":false,"text":"Hello, world!",'
        '"object":"content","msg_id":"msg_1","sequence_number":5}',
        '{"status":"completed","id":"msg_1","object":"message","sequence_number":6}',
        '{"status":"completed","id":"response_1","object":"response","sequence_number":7}',
    ]
    assembler = StreamAssembler()
    partial = ""
    for line in lines:
        event = parse_event(line)
        assert assembler.feed(event)
        message = assembler.messages.get("msg_1")
        if message is not None and message.content:
            partial = message.get_text_content() or ""
        if line.endswith('"sequence_number":4}'):
            assert partial == "Hello, world"
    assert not assembler.feed(parse_event(lines[3]))  # a replayed event is skipped
    result = assembler.response()
    assert str(result.status) == "completed"
    assert result.output is not None
    (message,) = result.output
    assert isinstance(message, Message)
    assert str(message.status) == "completed"
    assert message.get_text_content() == "Hello, world!"
    with pytest.raises(ApiError, match="missing"):
        StreamAssembler().feed(parse_event(lines[2]))


@asynccontextmanager
async def cutting_proxy(url: str, cut_after: int) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP proxy to ``url`` that cuts its first connection after ``cut_after`` bytes back.

    Yields its URL and the list of connections it took.
    """
    host, _, port = url.removeprefix("http://").partition(":")
    connections: list[int] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy_port = listener.extra(SocketAttribute.local_port)

    async def handle(client: SocketStream) -> None:
        index = len(connections)
        connections.append(index)
        upstream = await anyio.connect_tcp(host, int(port))
        async with client, upstream, anyio.create_task_group() as pumps:

            async def up() -> None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    async for chunk in client:
                        await upstream.send(chunk)
                pumps.cancel_scope.cancel()

            async def down() -> None:
                sent = 0
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    async for chunk in upstream:
                        if index == 0 and sent + len(chunk) >= cut_after:
                            await client.send(chunk[: cut_after - sent])
                            break
                        await client.send(chunk)
                        sent += len(chunk)
                pumps.cancel_scope.cancel()

            pumps.start_soon(up)
            pumps.start_soon(down)

    async with listener, anyio.create_task_group() as serving_group:
        serving_group.start_soon(listener.serve, handle)
        try:
            yield f"http://127.0.0.1:{proxy_port}", connections
        finally:
            serving_group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_client_resumes_a_dropped_stream_with_last_event_id() -> None:
    with serving(agent_from_manifest(WEATHER)) as url:
        async with (
            cutting_proxy(url, cut_after=1500) as (proxy, connections),
            AgentClient(proxy, timeout=HANG, retry_delay=0.05) as client,
        ):
            with anyio.fail_after(HANG):
                events = [e async for e in client.stream("Query weather in Taipei")]
    assert len(connections) == 2  # the first was cut; the client reconnected once
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert isinstance(final, AgentResponse)
    assert str(final.status) == "completed"
    assert final.output is not None
    assert final.output[-1].get_text_content() == FINAL_TEXT


@pytest.mark.anyio
async def test_stopping_the_server_stops_its_runs() -> None:
    tool = BlockingTool()
    with serving(blocking_agent(tool), ServerLimits(resume_grace=HANG)) as url:
        await stream_until(url, body(), lambda e: e.get("type") == "function_call")
        assert tool.started.is_set()
        assert not tool.cancelled.is_set()
    assert tool.cancelled.is_set()


@pytest.mark.anyio
async def test_a_waiting_client_that_disconnects_cancels_its_run() -> None:
    tool = BlockingTool()
    with serving(blocking_agent(tool), ServerLimits(resume_grace=0)) as url:
        host, _, port = url.removeprefix("http://").partition(":")
        data = json.dumps(body(stream=False)).encode()
        head = (
            f"POST /process HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        async with await anyio.connect_tcp(host, int(port)) as connection:
            await connection.send(head + data)
            assert await wait_for(tool.started)
        assert await wait_for(tool.cancelled)


@pytest.mark.anyio
async def test_a_run_that_cannot_start_ends_failed_and_the_server_goes_on() -> None:
    agent = Agent(ScriptedProvider(["Fine."]))
    real_start = agent.loop.start
    calls = 0

    def start_once_broken(text_: str, **options: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected failure")
        return real_start(text_, **options)

    agent.loop.start = start_once_broken  # type: ignore[method-assign,assignment]
    with serving(agent) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            broken = await http.post("/process", json=body(session_id="x"))
            fine = await http.post("/process", json=body(stream=False, session_id="x"))
    events = [json.loads(f["data"]) for f in frames(broken.text)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (events[-1]["status"], events[-1]["error"]["code"]) == ("failed", "internal_error")
    assert "injected failure" in events[-1]["error"]["message"]
    assert fine.status_code == 200
    assert fine.json()["status"] == "completed"


@pytest.mark.anyio
async def test_a_quiet_stream_sends_heartbeats() -> None:
    tool = BlockingTool()
    limits = ServerLimits(heartbeat=0.05, resume_grace=0)
    with serving(blocking_agent(tool), limits) as url:
        comments: list[str] = []
        _, events = await stream_until(url, body(), lambda e: False, comments)
        assert await wait_for(tool.cancelled)  # hanging up stopped the run
    assert comments == [": keep-alive"]
    assert events[-1][1]["type"] == "function_call"  # sent while the tool ran


@asynccontextmanager
async def lifespan_of(app: Any) -> AsyncIterator[None]:
    """Run an ASGI app's lifespan (startup on entry, shutdown on exit) in this event loop."""
    to_app, app_inbox = anyio.create_memory_object_stream[dict[str, Any]](4)
    app_outbox, from_app = anyio.create_memory_object_stream[dict[str, Any]](4)

    async def receive() -> dict[str, Any]:
        return await app_inbox.receive()

    async def send(message: dict[str, Any]) -> None:
        await app_outbox.send(message)

    async with to_app, from_app, app_inbox, app_outbox, anyio.create_task_group() as group:
        group.start_soon(app, {"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        await to_app.send({"type": "lifespan.startup"})
        assert (await from_app.receive())["type"] == "lifespan.startup.complete"
        try:
            yield
        finally:
            await to_app.send({"type": "lifespan.shutdown"})
            assert (await from_app.receive())["type"] == "lifespan.shutdown.complete"


@pytest.mark.anyio
async def test_the_app_runs_in_the_clients_event_loop_too() -> None:
    """The application is anyio code: on trio as on asyncio (here without a socket)."""
    app = create_app(agent_from_manifest(WEATHER))
    async with lifespan_of(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            streamed = await http.post("/process", json=body(session_id="t"))
            whole = await http.post("/process", json=body(stream=False, session_id="t"))
            refused = await http.post("/process", json=body(n=6))
    events = [json.loads(f["data"]) for f in frames(streamed.text)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["status"] == "completed"
    assert events[-1]["output"][-1]["content"][0]["text"] == FINAL_TEXT
    assert whole.json()["output"][-1]["content"][0]["text"] == FINAL_TEXT
    assert (refused.status_code, refused.json()["code"]) == (422, "invalid_request")


def test_openstarry_serve_runs_until_interrupted() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "openstarry.cli", "serve", str(WEATHER), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with Client(f"http://127.0.0.1:{port}", timeout=HANG) as client:
            deadline = time.monotonic() + HANG
            while True:
                try:
                    assert client.health()["status"] == "ok"
                    break
                except httpx.TransportError:
                    assert process.poll() is None, process.communicate()
                    assert time.monotonic() < deadline, "the server did not come up"
                    time.sleep(0.05)
            answer = client.send("Query weather in Taipei")
        assert answer.output is not None
        assert answer.output[-1].get_text_content() == FINAL_TEXT
        # The port is taken now: a second server says so and exits 1.
        second = subprocess.run(command, capture_output=True, text=True, timeout=HANG * 3)
        assert second.returncode == 1
        assert "Address already in use" in second.stderr
        assert second.stderr.count("\n") == 1  # one line, before anything starts
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=HANG * 3)
        except subprocess.TimeoutExpired:  # never left running past the test
            process.kill()
            process.communicate()
            raise
    # A graceful shutdown, and the exit status of Ctrl-C.
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert "Application shutdown complete" in err


def test_the_http_modules_name_the_extra_when_it_is_missing() -> None:
    code = (
        "import sys\n"
        "sys.modules['starlette'] = sys.modules['httpx'] = None\n"
        "for name in ('server', 'client'):\n"
        "    try:\n"
        "        __import__('openstarry.api.' + name)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
        "import openstarry.api.adapter\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert all("pip install 'openstarry[http]'" in line for line in lines)


#: Characters JSON leaves raw in strings that ``str.splitlines`` takes for line ends.
BREAKERS = "a\u2028b\u2029c\x85d"


def hi_body(text_: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": [{"type": "text", "text": text_}]}], **fields}


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


@pytest.mark.anyio
async def test_a_last_event_id_that_is_not_an_ascii_number_is_a_400_not_a_500() -> None:
    with serving_app(create_app(Agent(ScriptedProvider(["One."])))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            done = await http.post("/process", json=hi_body(stream=False))
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
                    json=hi_body(response_id=response_id),
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
                json=hi_body(stream=False, response_id="response_fresh"),
                headers={"last-event-id": ""},
            )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"
    assert answer.json()["output"][-1]["content"][0]["text"] == "Fresh."


@pytest.mark.anyio
async def test_line_separators_in_the_text_reach_both_clients_whole() -> None:
    agent = Agent(ScriptedProvider([f"async {BREAKERS}", f"blocking {BREAKERS}", BREAKERS]))
    with serving_app(create_app(agent)) as url:
        async with AgentClient(url, timeout=HANG) as client:
            streamed = await client.run("hi")
        blocking = await anyio.to_thread.run_sync(blocking_run, url)
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            raw = (await http.post("/process", json=hi_body())).content
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
    with serving_app(raw_sse_app(foreign_stream())) as url:
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
                raw = (await http.post("/process", json=hi_body())).content
    final = data_lines(raw)[-1]
    assert (final["object"], final["status"]) == ("response", "failed")
    assert final["error"]["code"] == "internal_error"
    assert "would exceed 10 characters" in final["error"]["message"]
    assert "TaskGroup" not in final["error"]["message"]
    assert "nursery" not in final["error"]["message"]


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
    data = json.dumps(hi_body()).encode()
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


@pytest.mark.anyio
async def test_a_long_run_with_stream_false_outlives_the_clients_read_timeout() -> None:
    async def slow(prompt: str, context: AgentContext) -> Any:
        await anyio.sleep(0.6)
        return text(f"Slow answer to {prompt}.")

    # A heartbeat every 0.03 s: ten within each read's 0.3 s, so a loaded machine still
    # sends one in time; the run takes twice the read timeout.
    limits = ServerLimits(heartbeat=0.03)
    with serving_app(create_app(Agent(FunctionProvider(slow)), limits=limits)) as url:
        async with AgentClient(url, timeout=0.3, max_reconnects=0) as client:
            answer = await client.send("one")
        async with httpx.AsyncClient(base_url=url, timeout=0.3) as http:
            raw = await http.post("/process", json=hi_body("two", stream=False))
    assert str(answer.status) == "completed"
    assert answer.output is not None
    assert answer.output[-1].get_text_content() == "Slow answer to one."
    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.headers["x-openstarry-response-id"] == raw.json()["id"]
    assert raw.content.startswith(b" ")  # the spaces that kept the connection alive
    assert raw.json()["output"][-1]["content"][0]["text"] == "Slow answer to two."


async def _keep_up(buffered: int, events: int) -> None:
    """A reader follows ``events`` new events, in order, with ``buffered`` kept before."""
    limits = ServerLimits(replay_events=50_000, replay_bytes=1 << 30)
    record = ResponseRecord("response_big", "s", limits)
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


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_the_client_says_it_cannot_connect_rather_than_a_broken_stream() -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    with Client(base) as client, pytest.raises(ApiError) as info:
        client.run("hi")
    assert info.value.code == "cannot_connect"
    assert "cannot connect to" in str(info.value)


@pytest.mark.anyio
async def test_the_async_client_says_it_cannot_connect() -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    async with AgentClient(base) as client:
        with pytest.raises(ApiError) as info:
            await client.run("hi", session_id="s")
    assert info.value.code == "cannot_connect"


#: The request of spec 003's "Example Use Case", verbatim.
SPEC_REQUEST = """{
  "input": [{
    "role": "user",
    "content": [{"type": "text", "text": "Describe this image"}],
    "type": "message"
  }],
  "stream": true,
  "model": "gpt-4-vision"
}"""


@pytest.mark.anyio
async def test_issue4_the_specs_example_request_is_served_over_http() -> None:
    """The spec's own request JSON, sent as it is to a real server, gets the spec's stream."""
    from openstarry.testing import ScriptedProvider

    provider = ScriptedProvider(["This image shows..."])
    with serving(Agent(provider)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            response = await http.post(
                "/process", content=SPEC_REQUEST, headers={"content-type": "application/json"}
            )
    assert response.status_code == 200, response.text
    events = [json.loads(block["data"]) for block in frames(response.text)]
    assert provider.calls[0].prompt == "Describe this image"
    kinds = [(e["object"], e["status"]) for e in events]
    assert kinds[0] == ("response", "created")
    assert kinds[-1] == ("response", "completed")
    message = next(e for e in events if e["object"] == "message")
    contents = [e for e in events if e["object"] == "content"]
    assert all(c["msg_id"] == message["id"] for c in contents)
    assert [c["delta"] for c in contents] == [True, False]
    assert contents[-1]["text"] == "This image shows..."
    assert all(c["index"] == 0 for c in contents)
