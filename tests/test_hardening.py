"""Hostile and unusual inputs found by review: each case once broke a promise of the core."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import threading
import uuid
import weakref
from typing import Any

import pytest

from openstarry.core import (
    MAX_DEPTH,
    ContentSegment,
    DedupWindow,
    Event,
    EventQueue,
    Ingestor,
    ProviderResponse,
    ToolCall,
    decode_event,
    decode_response,
    encode_event,
    encode_response,
)
from openstarry.errors import DecodeError

ENVELOPE = {
    "id": "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f",
    "timestamp": 1730000000000,
    "traceId": "t-1",
    "source": "src",
    "sessionId": "s-1",
    "priority": 2,
    "type": "INPUT:USER_MESSAGE",
    "payload": {"text": "hi"},
}


def line(**changes: Any) -> bytes:
    return json.dumps({**ENVELOPE, **changes}, separators=(",", ":")).encode()


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


# ---------------------------------------------------------------- decoding cost


def test_many_unknown_fields_decode_and_a_repeat_among_them_is_refused() -> None:
    head = line()[:-1]
    body = b"".join(b',"k%d":0' % i for i in range(50_000))
    event = decode_event(head + body + b"}", max_bytes=1 << 22)
    assert len(event.extra) == 50_000
    with pytest.raises(DecodeError, match="duplicate") as info:
        decode_event(head + body + b',"k0":1}', max_bytes=1 << 22)
    assert info.value.field == "k0"


def test_many_unknown_response_fields_decode_and_a_repeat_is_refused() -> None:
    body = b"".join(b',"k%d":0' % i for i in range(50_000))
    assert decode_response(b'{"segments":[]' + body + b"}", max_bytes=1 << 22) is not None
    with pytest.raises(DecodeError, match="duplicate"):
        decode_response(b'{"segments":[]' + body + b',"k7":0}', max_bytes=1 << 22)


# ---------------------------------------------------------------- stack use


def test_deepest_payloads_decode_on_a_small_thread_stack() -> None:
    """Nesting is walked with a heap stack: a 128 KiB thread stack is enough at MAX_DEPTH."""
    script = textwrap.dedent(
        f"""
        import json, threading
        from openstarry.core import decode_event, decode_response
        deep = "[" * {MAX_DEPTH - 1} + "]" * {MAX_DEPTH - 1}
        env = json.dumps({ENVELOPE!r}).replace('{{"text": "hi"}}', deep).encode()
        resp = ('{{"segments":[],"metadata":' + deep + '}}').encode()
        out = []
        def work():
            out.append(len(str(decode_event(env, max_depth={MAX_DEPTH}).payload)))
            out.append(decode_response(resp, max_depth={MAX_DEPTH}).metadata is not None)
        threading.stack_size(128 * 1024)
        t = threading.Thread(target=work)
        t.start(); t.join()
        print(out)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{2 * (MAX_DEPTH - 1)}, True]"


def test_max_depth_above_the_hard_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        decode_event(line(), max_depth=MAX_DEPTH + 1)


# ---------------------------------------------------------------- cycles


class Sentinel:
    pass


def test_a_cycle_through_a_decoded_payload_is_collected() -> None:
    sentinel = Sentinel()
    alive = weakref.ref(sentinel)
    event = decode_event(line())
    event.payload["sentinel"] = sentinel
    event.payload["self"] = event
    del event, sentinel
    gc.collect()
    assert alive() is None


def test_a_cycle_through_response_metadata_is_collected() -> None:
    sentinel = Sentinel()
    alive = weakref.ref(sentinel)
    metadata: dict[str, Any] = {}
    response = ProviderResponse([ContentSegment("text", text="x")], metadata=metadata)
    metadata["sentinel"] = sentinel  # the response holds this very dict
    metadata["response"] = response
    del response, metadata, sentinel
    gc.collect()
    assert alive() is None


def test_an_event_whose_payload_was_never_read_stays_out_of_the_collector() -> None:
    event = decode_event(line())
    assert not gc.is_tracked(event)
    assert event.payload == {"text": "hi"}
    assert gc.is_tracked(event)


# ---------------------------------------------------------------- round trips


def test_args_given_as_a_json_string_must_hold_an_object() -> None:
    body = {"segments": [{"type": "tool_call", "toolCall": {"name": "f", "args": '"abc"'}}]}
    with pytest.raises(DecodeError, match="JSON object") as info:
        decode_response(json.dumps(body).encode())
    assert info.value.field == "segments[0].toolCall.args"
    with pytest.raises(ValueError, match="JSON object"):
        ToolCall("f", args='"hello"')
    assert ToolCall("f", args='{"a": 1}').args == {"a": 1}


@pytest.mark.parametrize("levels", [62, 63])
def test_what_an_event_is_built_with_decodes_back(levels: int) -> None:
    """The payload sits one level inside the envelope: builders count it so."""
    event = Event.new("A:B", nested(levels), source="s", session_id="x")
    assert decode_event(encode_event(event)).payload == nested(levels)


def test_a_payload_too_deep_to_decode_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="nesting"):
        Event.new("A:B", nested(64), source="s", session_id="x")


def test_responses_built_at_the_depth_limit_decode_back() -> None:
    response = ProviderResponse(
        [
            ContentSegment("ui", ui=nested(61)),
            ContentSegment("tool_call", tool_call=ToolCall("f", args={"a": nested(59)})),
        ],
        metadata=nested(63),
    )
    assert decode_response(encode_response(response)) == response
    with pytest.raises(ValueError, match="nesting"):
        ContentSegment("ui", ui=nested(62))
    with pytest.raises(ValueError, match="nesting"):
        ToolCall("f", args={"a": nested(60)})


def test_integers_python_cannot_convert_are_refused_when_decoded() -> None:
    ok = line(payload="@").replace(b'"@"', b"9" * 4300)
    assert decode_event(ok).payload == int("9" * 4300)
    with pytest.raises(DecodeError, match="digits") as info:
        decode_event(line(payload="@").replace(b'"@"', b"9" * 4301))
    assert info.value.offset is not None


def test_encoding_runs_no_user_code() -> None:
    """Subclasses are encoded by value: their overridden methods are never called."""

    class Loud(int):
        def __str__(self) -> str:
            raise AssertionError("str() called")

        __repr__ = __str__

    class Sneaky(list[Any]):
        def __iter__(self) -> Any:
            raise AssertionError("__iter__ called")

    payload = {"big": Loud(2**70), "items": Sneaky([1, 2])}
    event = Event.new("A:B", payload, source="s", session_id="x")
    assert event.payload == {"big": 2**70, "items": [1, 2]}


# ---------------------------------------------------------------- ingestion


def test_a_refused_line_leaves_a_full_dedup_window_as_it_was() -> None:
    queue = EventQueue(capacity=2)
    window = DedupWindow(max_entries=2)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    result = Ingestor(queue, window).ingest([line(id=i) for i in ids], now_ms=0)
    assert (result.accepted, result.rejected) == (2, [2])
    assert [i in window for i in ids] == [True, True, False]
    queue.pop_many(2)
    again = Ingestor(queue, window).ingest([line(id=ids[0])], now_ms=1)
    assert (again.accepted, again.duplicates) == (0, 1)


def test_a_uuid_repeated_in_another_case_follows_its_refused_first_sight() -> None:
    u = str(uuid.uuid4())
    queue = EventQueue(capacity=1)
    lines = [line(id=str(uuid.uuid4())), line(id=u.upper()), line(id=u)]
    result = Ingestor(queue, DedupWindow()).ingest(lines, now_ms=0)
    assert (result.accepted, result.duplicates, result.rejected) == (1, 0, [1, 2])


@pytest.mark.parametrize("data", [5, [123, 125], "{}", 2**40])
def test_decoders_take_only_bytes_like_objects(data: Any) -> None:
    with pytest.raises(TypeError, match="bytes"):
        decode_event(data)
    with pytest.raises(TypeError, match="bytes"):
        Ingestor(EventQueue()).ingest(data)


def test_a_bytearray_is_copied_so_later_changes_do_not_reach_the_event() -> None:
    buffer = bytearray(line())
    event = decode_event(buffer)
    buffer[:] = b"x" * len(buffer)
    assert event.session_id == "s-1"
    assert decode_event(memoryview(line())[:]).id == ENVELOPE["id"]


@pytest.mark.parametrize("capacity", [True, 0, -1, 1.5])
def test_queue_capacity_must_be_a_positive_int(capacity: Any) -> None:
    with pytest.raises(ValueError, match="capacity"):
        EventQueue(capacity=capacity)


def test_error_offsets_point_at_the_value_not_the_whitespace_before_it() -> None:
    data = line().replace(b'"sessionId":"s-1"', b'"sessionId":   ""')
    with pytest.raises(DecodeError) as info:
        decode_event(data)
    assert info.value.field == "sessionId"
    assert data[info.value.offset or 0 :].startswith(b'""')


def test_a_cycle_through_a_list_payload_is_collected() -> None:
    sentinel = Sentinel()
    alive = weakref.ref(sentinel)
    event = decode_event(line(payload=[1, 2]))
    event.payload.append(sentinel)
    event.payload.append(event)
    del event, sentinel
    gc.collect()
    assert alive() is None


def test_a_finalizer_running_another_ingest_cannot_let_an_id_in_twice() -> None:
    """Two ingestors share a window; a finalizer runs the second in the middle of the first."""
    queue, window = EventQueue(), DedupWindow()
    first, second = Ingestor(queue, window), Ingestor(queue, window)
    data = line(id="same-id")
    results = []

    class Intruder:
        def __del__(self) -> None:
            thread = threading.Thread(target=lambda: results.append(second.ingest(data, now_ms=1)))
            thread.start()
            thread.join()

    intruder = Intruder()
    intruder.cycle = intruder  # type: ignore[attr-defined]
    del intruder
    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # the next allocation of the ingest collects the intruder
    try:
        results.append(first.ingest(data, now_ms=1))
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    assert sorted(r.accepted for r in results) == [0, 1]
    assert [e.id for e in queue.pop_many(10)] == ["same-id"]


def test_shed_events_leave_the_window_so_a_redelivery_gets_in() -> None:
    queue, window = EventQueue(capacity=1, overflow="shed"), DedupWindow()
    ingestor = Ingestor(queue, window)
    result = ingestor.ingest([line(id="mid", priority=3), line(id="low", priority=5)], now_ms=0)
    assert [e.id for e in result.shed] == ["low"]  # shed on arrival
    assert "mid" in window
    assert "low" not in window
    result = ingestor.ingest([line(id="top", priority=0)], now_ms=1)
    assert [e.id for e in result.shed] == ["mid"]  # queued earlier, then shed
    assert "mid" not in window
    assert queue.pop().id == "top"
    again = ingestor.ingest([line(id="mid", priority=3)], now_ms=2)
    assert (again.accepted, again.duplicates) == (1, 0)
