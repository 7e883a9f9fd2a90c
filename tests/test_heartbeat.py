"""``heartbeat`` messages on a quiet stream, for a client that asks with ``X-OpenStarry-Heartbeat``.

A real server (uvicorn on 127.0.0.1, a short ``heartbeat``) runs an agent
whose provider waits until the test has seen what it looks for.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import anyio.to_thread
import httpx

from openstarry.agent.interfaces import AgentContext
from openstarry.agent.runtime import Agent
from openstarry.api.client import StreamAssembler
from openstarry.api.heartbeat import heartbeat_frame, wants_messages
from openstarry.api.models import Message, MessageType, RunStatus, parse_event
from openstarry.api.server import ServerLimits
from openstarry.testing import FunctionProvider
from test_api_http import serving

HANG = 10.0
BODY = {"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}


def slow_agent(release: threading.Event) -> Agent:
    async def answer(prompt: str, context: AgentContext) -> str:
        await anyio.to_thread.run_sync(release.wait, HANG)
        return "Hello."

    return Agent(FunctionProvider(answer))


def read(url: str, headers: dict[str, str], release: threading.Event) -> list[str]:
    """The stream's lines; the provider is released at the first keep-alive comment."""
    lines: list[str] = []
    with httpx.stream(
        "POST", url + "/process", json=BODY, headers=headers, timeout=HANG
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith(": keep-alive"):
                release.set()
    return lines


def frames(lines: list[str]) -> list[list[str]]:
    """The stream's frames, each as its lines."""
    out: list[list[str]] = [[]]
    for line in lines:
        if line:
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [f for f in out if f]


def test_a_client_that_asks_gets_heartbeat_messages_after_the_comments() -> None:
    release = threading.Event()
    with serving(slow_agent(release), ServerLimits(heartbeat=0.05)) as url:
        lines = read(url, {"X-OpenStarry-Heartbeat": "message"}, release)
    beats = [f for f in frames(lines) if any('"heartbeat"' in line for line in f)]
    assert beats
    for frame in beats:
        assert not any(line.startswith("id:") for line in frame)  # no part of the response
        (data,) = [line.removeprefix("data: ") for line in frame if line.startswith("data: ")]
        event = parse_event(data)
        assert isinstance(event, Message)
        assert event.type is MessageType.HEARTBEAT
        assert event.sequence_number is None
        assert event.metadata is not None
        assert event.metadata["response_id"].startswith("response_")
    # Each comes right after a keep-alive comment, and the response still ends whole.
    comments = [f for f in frames(lines) if f[0].startswith(": keep-alive")]
    assert len(comments) >= len(beats)
    assembler = StreamAssembler()
    for frame in frames(lines):
        for line in frame:
            if line.startswith("data: "):
                assembler.feed(parse_event(line.removeprefix("data: ")))
    final = assembler.response()
    assert final.status is RunStatus.Completed
    assert [m.type for m in final.output or []] == [MessageType.MESSAGE]


def test_a_client_that_does_not_ask_gets_only_the_comments() -> None:
    release = threading.Event()
    with serving(slow_agent(release), ServerLimits(heartbeat=0.05)) as url:
        lines = read(url, {}, release)
    assert any(line.startswith(": keep-alive") for line in lines)
    assert not any('"heartbeat"' in line for line in lines)


def test_the_header_and_the_frame() -> None:
    assert wants_messages([(b"X-OpenStarry-Heartbeat", b" Message ")])
    assert not wants_messages([(b"x-openstarry-heartbeat", b"comment")])
    assert not wants_messages([])
    frame = heartbeat_frame("response_1")
    assert frame.startswith(b"data: ")
    assert frame.endswith(b"\n\n")
    data: Any = json.loads(frame.removeprefix(b"data: "))
    assert data["type"] == "heartbeat"
    assert data["object"] == "message"
