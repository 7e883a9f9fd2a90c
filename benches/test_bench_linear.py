"""Work that must stay linear in its input: each long case beside the same work cut small.

Each group times one long input against the same amount of work in small
pieces, measured in the same run. A ratio near 1x is linear; quadratic work
(re-reading or re-copying what came before at each step) shows as a ratio of
a few hundredths, far under the 0.2x target. Three places where review found
quadratic work:

- the SSE decoder of the HTTP providers, on one 4 MiB line in network-sized chunks;
- the stream assemblers of the provider translators, on 40,000 text deltas of one answer;
- the Agent API's replay buffer, for a reader that keeps up with 30,000 frames kept.

In ``make test`` (benchmarks disabled) each runs once, checking what it computes.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from benches.harness import Benchmark, measure
from openstarry.api.replay import ResponseRecord
from openstarry.api.server import ServerLimits
from openstarry.providers.anthropic import AnthropicAPI
from openstarry.providers.gemini import GeminiAPI
from openstarry.providers.http import SSEDecoder
from openstarry.providers.openai_chat import OpenAIChatAPI
from openstarry.providers.openai_responses import OpenAIResponsesAPI
from openstarry.providers.wire import ToolNameMap

#: Linear work keeps the ratio near 1x; quadratic work falls to a few hundredths.
LINEAR = 0.2

# --- the SSE decoder ----------------------------------------------------------------------------

SSE_GROUP = "linear: SSE decoding, 4 MiB in 1460-byte chunks (per byte)"
SIZE = 4 * 1024 * 1024 - 1024  # under the decoder's 4 MiB line limit
LONG_LINE = b"data: " + b"x" * SIZE + b"\n\n"
SHORT_LINES = (b"data: " + b"x" * 1016 + b"\n\n") * (SIZE // 1024)


def _decode_in_chunks(payload: bytes) -> int:
    decoder = SSEDecoder()
    events = 0
    data = 0
    for i in range(0, len(payload), 1460):
        for _event, text in decoder.feed(payload[i : i + 1460]):
            events += 1
            data += len(text)
    assert data in (SIZE, (SIZE // 1024) * 1016)
    return events


def test_sse_one_long_line(benchmark: Benchmark) -> None:
    assert _decode_in_chunks(LONG_LINE) == 1
    measure(
        benchmark,
        _decode_in_chunks,
        group=SSE_GROUP,
        label="SSEDecoder: one 4 MiB event",
        ops=len(LONG_LINE),
        rounds=5,
        role="openstarry",
        setup=lambda: ((LONG_LINE,), {}),
    )


def test_sse_short_lines(benchmark: Benchmark) -> None:
    assert _decode_in_chunks(SHORT_LINES) == SIZE // 1024
    measure(
        benchmark,
        _decode_in_chunks,
        group=SSE_GROUP,
        label="SSEDecoder: the same bytes as 1 KiB events",
        ops=len(SHORT_LINES),
        rounds=5,
        target=LINEAR,
        setup=lambda: ((SHORT_LINES,), {}),
    )


# --- the stream assemblers ----------------------------------------------------------------------

DELTAS = 40_000
PIECE = "a" * 50


def _chunk(delta: dict[str, Any]) -> str:
    return json.dumps({"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta}]})


def _stream_and_delta(api: str) -> tuple[Any, str]:
    names = ToolNameMap([])
    if api == "openai":
        return OpenAIChatAPI().stream(names), _chunk({"content": PIECE})
    if api == "anthropic":
        stream: Any = AnthropicAPI().stream(names)
        stream.feed(None, json.dumps({"type": "message_start", "message": {"content": []}}))
        start = {"type": "content_block_start", "index": 0}
        stream.feed(None, json.dumps({**start, "content_block": {"type": "text", "text": ""}}))
        delta = {"type": "content_block_delta", "index": 0}
        return stream, json.dumps({**delta, "delta": {"type": "text_delta", "text": PIECE}})
    if api == "openai-responses":
        stream = OpenAIResponsesAPI().stream(names)
        delta = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0}
        return stream, json.dumps({**delta, "delta": PIECE})
    stream = GeminiAPI().stream(names)
    return stream, json.dumps({"candidates": [{"content": {"parts": [{"text": PIECE}]}}]})


def _assemble(api: str, deltas: int) -> str:
    stream, event = _stream_and_delta(api)
    for _ in range(deltas):
        stream.feed(None, event)
    # Cut off (no end event): the text so far is kept.
    text: str = stream.finish().segments[0].text or ""
    return text


@pytest.mark.parametrize("api", ["anthropic", "openai-responses", "gemini", "openai"])
def test_stream_assembly(benchmark: Benchmark, api: str) -> None:
    assert _assemble(api, 100) == PIECE * 100
    assert _assemble(api, DELTAS).startswith(PIECE * DELTAS)
    measure(
        benchmark,
        _assemble,
        group=f"linear: {api} stream assembly, {DELTAS:,} text deltas (per delta)",
        label=f"{api}: one answer of {DELTAS:,} deltas",
        ops=DELTAS,
        rounds=3,
        role="openstarry",
        setup=lambda: ((api, DELTAS), {}),
    )


@pytest.mark.parametrize("api", ["anthropic", "openai-responses", "gemini", "openai"])
def test_stream_assembly_small(benchmark: Benchmark, api: str) -> None:
    def many(count: int) -> None:
        for _ in range(count):
            _assemble(api, 100)

    measure(
        benchmark,
        many,
        group=f"linear: {api} stream assembly, {DELTAS:,} text deltas (per delta)",
        label=f"{api}: {DELTAS // 100} answers of 100 deltas",
        ops=DELTAS,
        rounds=3,
        target=LINEAR,
        setup=lambda: ((DELTAS // 100,), {}),
    )


# --- the replay buffer of the Agent API ---------------------------------------------------------

REPLAY_GROUP = "linear: Agent API reader keeping up, 6,000 events (per event)"
FOLLOWED = 6000


KEPT = 30_000


def _keep_up(kept_before: bool) -> int:
    """A reader following :data:`FOLLOWED` new frames as they are appended to its response.

    Both sides append :data:`KEPT` frames first, so both do the same work but
    for one thing: with ``kept_before`` those frames are in the reader's own
    buffer (a reader that rescans it pays for them on every frame), otherwise
    in another response's.
    """

    async def follow() -> int:
        limits = ServerLimits(replay_events=50_000, replay_bytes=1 << 30)
        record = ResponseRecord("response_big", "s", limits)
        other = ResponseRecord("response_other", "s", limits)
        for seq in range(KEPT):
            (record if kept_before else other).append(seq, "{}")
        start = KEPT if kept_before else 0
        reader = object()
        record.cursors[reader] = start - 1
        frames = record.frames_after(start - 1, heartbeat=60, reader=reader)
        received = 0
        for seq in range(start, start + FOLLOWED):
            record.append(seq, "{}")
            frame = await frames.__anext__()
            assert frame.startswith(f"id: response_big:{seq}\n".encode())
            received += 1
        await frames.aclose()
        return received

    received: int = anyio.run(follow)
    return received


def test_replay_reader_with_30000_frames_kept(benchmark: Benchmark) -> None:
    assert _keep_up(True) == FOLLOWED
    measure(
        benchmark,
        _keep_up,
        group=REPLAY_GROUP,
        label="a reader keeping up, 30,000 frames kept before",
        ops=FOLLOWED,
        rounds=3,
        role="openstarry",
        setup=lambda: ((True,), {}),
    )


def test_replay_reader_with_the_frames_elsewhere(benchmark: Benchmark) -> None:
    assert _keep_up(False) == FOLLOWED
    measure(
        benchmark,
        _keep_up,
        group=REPLAY_GROUP,
        label="the same reader, the 30,000 frames kept by another response",
        ops=FOLLOWED,
        rounds=3,
        target=LINEAR,
        setup=lambda: ((False,), {}),
    )
