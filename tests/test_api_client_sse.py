"""The Agent API client reads its stream with the shared SSE reader, line ends and all."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from openstarry.api.client import AgentClient, Client

EVENTS: list[dict[str, Any]] = [
    {"object": "response", "id": "response_1", "status": "in_progress", "sequence_number": 0},
    {
        "object": "content",
        "type": "text",
        "delta": True,
        "msg_id": "m1",
        "text": "a\u2028b",
        "sequence_number": 1,
    },
    {"object": "response", "id": "response_1", "status": "completed", "sequence_number": 2},
]


def stream_with(end: str) -> bytes:
    """The events with ``end`` as every line end: the stream's last bytes end its last event."""
    return "".join(
        f"id: response_1:{e['sequence_number']}{end}data: {json.dumps(e)}{end}{end}" for e in EVENTS
    ).encode()


def transport(body: bytes, requests: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_a_stream_whose_last_byte_is_a_cr_ends_the_response(end: str) -> None:
    """A CR at the end of a chunk is held back (it may start a CRLF): the end of the
    stream must still complete the last event, not reconnect for it."""
    requests: list[httpx.Request] = []
    http = httpx.Client(base_url="http://agent", transport=transport(stream_with(end), requests))
    with Client(http=http, max_reconnects=0) as client:
        response = client.run("hi")
    http.close()
    assert str(response.status) == "completed"
    assert response.output is not None
    assert response.output[0].get_text_content() == "a\u2028b"
    assert len(requests) == 1


@pytest.mark.parametrize("end", ["\n", "\r"])
def test_the_async_client_reads_the_same(end: str) -> None:
    requests: list[httpx.Request] = []

    async def main() -> list[str]:
        http = httpx.AsyncClient(
            base_url="http://agent", transport=transport(stream_with(end), requests)
        )
        async with http, AgentClient(http=http, max_reconnects=0) as client:
            return [str(getattr(e, "status", "")) async for e in client.stream("hi")]

    statuses = anyio.run(main)
    assert statuses[-1] == "completed"
    assert len(statuses) == 3
    assert len(requests) == 1
