"""``Ingestor``: NDJSON or a list of byte strings in, events in the queue, one report out."""

from __future__ import annotations

import gc
import json
import pickle
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envelopes import envelope_line
from openstarry.core import (
    DedupWindow,
    Event,
    EventQueue,
    Ingestor,
    IngestResult,
    decode_event,
    encode_event,
)
from openstarry.errors import DecodeError

T0 = 1_700_000_000_000


def line(event_id: str | None = None, priority: int = 2, **overrides: Any) -> bytes:
    """One valid envelope (no newline)."""
    env: dict[str, Any] = {
        "id": event_id or str(uuid.uuid4()),
        "timestamp": T0,
        "traceId": "trace-1",
        "source": "transport-test",
        "sessionId": "session-1",
        "priority": priority,
        "type": "INPUT:USER_MESSAGE",
        "payload": {"text": "hello"},
    }
    env.update(overrides)
    return json.dumps(env).encode()


def ndjson(*lines: bytes) -> bytes:
    return b"".join(part + b"\n" for part in lines)


def drain(queue: EventQueue) -> list[Event]:
    events = []
    while (item := queue.pop()) is not None:
        assert isinstance(item, Event)
        events.append(item)
    return events


def ids_of(lines: list[bytes]) -> list[str]:
    return [json.loads(part)["id"] for part in lines]


def check_counts(result: IngestResult, lines: int) -> None:
    """Every line is accounted for exactly once."""
    assert result.accepted + result.duplicates + len(result.invalid) + len(result.rejected) == lines


def make(capacity: int | None = None, overflow: Any = "reject", **kwargs: Any) -> Ingestor:
    return Ingestor(EventQueue(capacity, overflow), DedupWindow(), **kwargs)


# --- the happy path ---------------------------------------------------------------------------


def test_ndjson_batch_is_decoded_and_queued() -> None:
    lines = [line() for _ in range(5)]
    ingestor = make()
    result = ingestor.ingest(ndjson(*lines), now_ms=T0)
    assert result.accepted == 5
    assert result.duplicates == 0
    assert result.invalid == []
    assert result.rejected == []
    assert result.shed == []
    events = drain(ingestor.queue)
    assert [e.id for e in events] == ids_of(lines)
    assert [e.payload for e in events] == [{"text": "hello"}] * 5


def test_queued_events_keep_their_wire_bytes() -> None:
    lines = [line(), line(priority=0, extra_field=[1, 2])]
    ingestor = make()
    ingestor.ingest(ndjson(*lines), now_ms=T0)
    events = drain(ingestor.queue)
    assert [encode_event(e) for e in events] == [lines[1], lines[0]]
    assert events[0].extra == {"extra_field": [1, 2]}


def test_a_sequence_of_byte_strings() -> None:
    lines = [line() for _ in range(4)]
    ingestor = make()
    result = ingestor.ingest(lines, now_ms=T0)
    assert result.accepted == 4
    assert [e.id for e in drain(ingestor.queue)] == ids_of(lines)


def test_a_tuple_of_byte_strings() -> None:
    lines = (line(), line())
    result = make().ingest(lines, now_ms=T0)
    assert result.accepted == 2


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_bytearray_and_memoryview_inputs(kind: Any) -> None:
    lines = [line(), line()]
    ingestor = make()
    result = ingestor.ingest(kind(ndjson(*lines)), now_ms=T0)
    assert result.accepted == 2
    assert [e.id for e in drain(ingestor.queue)] == ids_of(lines)


def test_events_keep_their_bytes_after_the_input_is_dropped() -> None:
    # NDJSON events are slices of the input object, kept by reference.
    lines = [line(priority=p % 6, extra_field=[p]) for p in range(300)]
    data = ndjson(*lines).replace(b"\n", b"\r\n")
    ingestor = make()
    assert ingestor.ingest(data, now_ms=T0).accepted == 300
    del data
    gc.collect()
    # Reuse the freed memory for other bytes of the same size.
    garbage = [bytes(len(lines[0])) * 300 for _ in range(4)]
    events = drain(ingestor.queue)
    by_id = {json.loads(part)["id"]: part for part in lines}
    assert len(events) == 300
    for event in events:
        wire = by_id[event.id]
        assert encode_event(event) == wire
        assert event.payload == json.loads(wire)["payload"]
        assert event.extra == {"extra_field": json.loads(wire)["extra_field"]}
        assert decode_event(encode_event(event)) == event
        assert pickle.loads(pickle.dumps(event)) == event
    del garbage


def test_events_of_a_bytearray_do_not_see_later_changes() -> None:
    lines = [line(), line()]
    data = bytearray(ndjson(*lines))
    ingestor = make()
    ingestor.ingest(data, now_ms=T0)
    data[:] = b"x" * len(data)
    assert [encode_event(e) for e in drain(ingestor.queue)] == lines


def test_an_ndjson_event_keeps_the_input_alive_until_it_goes() -> None:
    # The documented trade-off: an event of an NDJSON input holds a reference
    # to the whole input object (no copy), which lives while any of its events
    # (or of its lines still queued: one reference between them) does.
    data = ndjson(*[line() for _ in range(10)])
    before = sys.getrefcount(data)
    ingestor = make()
    ingestor.ingest(data, now_ms=T0)
    assert sys.getrefcount(data) == before + 1
    events = drain(ingestor.queue)
    assert sys.getrefcount(data) == before + 10
    del events[1:]
    assert sys.getrefcount(data) == before + 1
    del events
    assert sys.getrefcount(data) == before


def test_a_single_line_input_is_its_event_wire_bytes() -> None:
    data = line()
    ingestor = make()
    ingestor.ingest(data, now_ms=T0)
    (event,) = drain(ingestor.queue)
    assert encode_event(event) is data


def test_events_come_out_in_priority_order_fifo_within_a_priority() -> None:
    priorities = [5, 2, 0, 2, 5, 1, 0, 3, 4, 2, 0, 5]
    lines = [line(priority=p) for p in priorities]
    ingestor = make()
    ingestor.ingest(ndjson(*lines), now_ms=T0)
    events = drain(ingestor.queue)
    expected = [
        json.loads(part)["id"]
        for _, _, part in sorted(
            (p, i, part) for i, (p, part) in enumerate(zip(priorities, lines, strict=True))
        )
    ]
    assert [e.id for e in events] == expected
    assert [e.priority for e in events] == sorted(priorities)


def test_events_are_queued_at_their_own_priority() -> None:
    ingestor = make()
    ingestor.ingest(ndjson(line(priority=0), line(priority=5), line(priority=5)), now_ms=T0)
    assert ingestor.queue.depths() == [1, 0, 0, 0, 0, 2]


def test_the_result_type() -> None:
    result = make().ingest(ndjson(line()), now_ms=T0)
    assert isinstance(result, IngestResult)


def test_an_empty_batch() -> None:
    ingestor = make()
    inputs: list[bytes | bytearray | list[bytes]] = [b"", [], bytearray()]
    for data in inputs:
        result = ingestor.ingest(data, now_ms=T0)
        assert result.accepted == 0
        assert result.duplicates == 0
        assert result.invalid == []
        assert result.rejected == []
    assert len(ingestor.queue) == 0


# --- line framing -----------------------------------------------------------------------------


def test_crlf_line_endings() -> None:
    lines = [line(), line(), line()]
    ingestor = make()
    result = ingestor.ingest(b"\r\n".join(lines) + b"\r\n", now_ms=T0)
    assert result.accepted == 3
    assert result.invalid == []
    assert [e.id for e in drain(ingestor.queue)] == ids_of(lines)


def test_mixed_line_endings() -> None:
    lines = [line(), line(), line()]
    data = lines[0] + b"\r\n" + lines[1] + b"\n" + lines[2]
    result = make().ingest(data, now_ms=T0)
    assert result.accepted == 3
    assert result.invalid == []


def test_a_final_newline_is_not_a_line_and_none_is_needed() -> None:
    lines = [line(), line()]
    with_newline = make().ingest(b"\n".join(lines) + b"\n", now_ms=T0)
    without_newline = make().ingest(b"\n".join(lines), now_ms=T0)
    for result in (with_newline, without_newline):
        assert result.accepted == 2
        assert result.invalid == []
        check_counts(result, 2)


def test_an_empty_line_in_the_middle_is_invalid() -> None:
    a, b = line(), line()
    ingestor = make()
    result = ingestor.ingest(a + b"\n\n" + b + b"\n", now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]
    assert [e.id for e in drain(ingestor.queue)] == ids_of([a, b])
    check_counts(result, 3)


def test_an_empty_crlf_line_is_invalid() -> None:
    result = make().ingest(line() + b"\r\n\r\n" + line() + b"\r\n", now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]


def test_a_lone_newline_is_one_empty_line() -> None:
    result = make().ingest(b"\n", now_ms=T0)
    assert result.accepted == 0
    assert [index for index, _ in result.invalid] == [0]


def test_a_whitespace_only_line_is_invalid() -> None:
    result = make().ingest(ndjson(line(), b"   ", line()), now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]


def test_an_empty_byte_string_in_a_sequence_is_invalid() -> None:
    result = make().ingest([line(), b"", line()], now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]


def test_a_sequence_item_is_one_line_even_with_a_trailing_newline() -> None:
    result = make().ingest([line() + b"\n", line() + b"\r\n"], now_ms=T0)
    assert result.accepted + len(result.invalid) == 2


def test_sequence_items_must_be_bytes() -> None:
    with pytest.raises(TypeError):
        make().ingest([line().decode()], now_ms=T0)  # type: ignore[list-item]


def test_a_str_is_refused() -> None:
    with pytest.raises(TypeError):
        make().ingest(line().decode(), now_ms=T0)  # type: ignore[arg-type]


# --- invalid lines ----------------------------------------------------------------------------


def test_every_valid_line_goes_in_when_others_are_invalid() -> None:
    good = [line(priority=p) for p in (3, 1, 4)]
    data = ndjson(
        b"not json",  # 0
        good[0],  # 1
        line(priority=9),  # 2
        good[1],  # 3
        b'{"id": "x"}',  # 4
        line(type="input:bad"),  # 5
        good[2],  # 6
        line()[:-5],  # 7
    )
    ingestor = make()
    result = ingestor.ingest(data, now_ms=T0)
    assert result.accepted == 3
    assert [index for index, _ in result.invalid] == [0, 2, 4, 5, 7]
    for _, message in result.invalid:
        assert isinstance(message, str)
        assert message
    check_counts(result, 8)
    assert [e.id for e in drain(ingestor.queue)] == ids_of([good[1], good[0], good[2]])


def test_invalid_messages_name_the_field() -> None:
    data = ndjson(line(priority=9), line(source=""), line(type="input:bad"))
    result = make().ingest(data, now_ms=T0)
    messages = dict(result.invalid)
    assert "priority" in messages[0]
    assert "source" in messages[1]
    assert "type" in messages[2]


def test_invalid_lines_of_a_sequence_use_their_index() -> None:
    result = make().ingest([b"{}", line(), b"[]", line(), b"\xff"], now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [0, 2, 4]


def test_invalid_utf8_and_nan_lines_are_invalid() -> None:
    result = make().ingest(
        ndjson(
            line(source="a@b").replace(b"@", b"\xff"), line(payload="@").replace(b'"@"', b"NaN")
        ),
        now_ms=T0,
    )
    assert [index for index, _ in result.invalid] == [0, 1]


def test_a_line_over_max_line_bytes_is_invalid_and_the_rest_still_go_in() -> None:
    short = [line(), line()]
    long = line(payload={"text": "x" * 1000})
    ingestor = make(max_line_bytes=500)
    result = ingestor.ingest(ndjson(short[0], long, short[1]), now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]
    assert [e.id for e in drain(ingestor.queue)] == ids_of(short)


def test_max_line_bytes_is_an_inclusive_limit() -> None:
    exact = line()
    ingestor = make(max_line_bytes=len(exact))
    assert ingestor.ingest(ndjson(exact), now_ms=T0).accepted == 1
    too_long = line(source="transport-test!")
    result = ingestor.ingest(ndjson(too_long), now_ms=T0)
    assert [index for index, _ in result.invalid] == [0]


def test_max_line_bytes_does_not_count_the_line_ending() -> None:
    a, b = line(), line()
    assert len(a) == len(b)
    ingestor = make(max_line_bytes=len(a))
    result = ingestor.ingest(a + b"\r\n" + b + b"\r\n", now_ms=T0)
    assert result.accepted == 2
    assert result.invalid == []


def test_max_depth_applies_to_each_line() -> None:
    deep = line(payload="@").replace(b'"@"', b"[" * 30 + b"]" * 30)
    ingestor = make(max_depth=10)
    result = ingestor.ingest(ndjson(line(), deep, line()), now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]
    assert make(max_depth=100).ingest(ndjson(deep), now_ms=T0).accepted == 1


def test_a_100000_deep_line_is_invalid_not_a_crash() -> None:
    deep = line(payload="@").replace(b'"@"', b"[" * 100_000 + b"]" * 100_000)
    ingestor = make(max_line_bytes=len(deep) + 1)
    result = ingestor.ingest(ndjson(line(), deep, line()), now_ms=T0)
    assert result.accepted == 2
    assert [index for index, _ in result.invalid] == [1]


# --- duplicates -------------------------------------------------------------------------------


def test_duplicates_within_a_batch() -> None:
    a, b = line(), line()
    ingestor = make()
    result = ingestor.ingest(ndjson(a, b, a, a, b), now_ms=T0)
    assert result.accepted == 2
    assert result.duplicates == 3
    check_counts(result, 5)
    assert [e.id for e in drain(ingestor.queue)] == ids_of([a, b])


def test_a_duplicate_is_by_id_even_when_the_rest_differs() -> None:
    event_id = str(uuid.uuid4())
    ingestor = make()
    result = ingestor.ingest(
        ndjson(line(event_id, priority=3), line(event_id, priority=0, payload="other")), now_ms=T0
    )
    assert result.accepted == 1
    assert result.duplicates == 1
    (event,) = drain(ingestor.queue)
    assert event.priority == 3


def test_duplicates_across_batches() -> None:
    a, b, c = line(), line(), line()
    ingestor = make()
    first = ingestor.ingest(ndjson(a, b), now_ms=T0)
    second = ingestor.ingest(ndjson(b, c, a), now_ms=T0 + 10)
    assert (first.accepted, first.duplicates) == (2, 0)
    assert (second.accepted, second.duplicates) == (1, 2)
    assert [e.id for e in drain(ingestor.queue)] == ids_of([a, b, c])


def test_duplicates_across_sequence_and_ndjson_inputs() -> None:
    a = line()
    ingestor = make()
    assert ingestor.ingest([a], now_ms=T0).accepted == 1
    assert ingestor.ingest(ndjson(a), now_ms=T0).duplicates == 1


def test_uuid_ids_are_duplicates_whatever_their_case() -> None:
    event_id = str(uuid.uuid4())
    ingestor = make()
    result = ingestor.ingest(ndjson(line(event_id), line(event_id.upper())), now_ms=T0)
    assert (result.accepted, result.duplicates) == (1, 1)


def test_ingested_ids_are_in_the_window() -> None:
    a = line()
    dedup = DedupWindow()
    Ingestor(EventQueue(), dedup).ingest(ndjson(a), now_ms=T0)
    assert json.loads(a)["id"] in dedup


def test_invalid_lines_are_not_recorded_in_the_window() -> None:
    event_id = str(uuid.uuid4())
    dedup = DedupWindow()
    ingestor = Ingestor(EventQueue(), dedup)
    result = ingestor.ingest(ndjson(line(event_id, priority=9)), now_ms=T0)
    assert len(result.invalid) == 1
    assert event_id not in dedup
    assert ingestor.ingest(ndjson(line(event_id)), now_ms=T0).accepted == 1


def test_no_dedup_window_means_no_deduplication() -> None:
    a = line()
    ingestor = Ingestor(EventQueue(), None)
    assert ingestor.dedup is None
    first = ingestor.ingest(ndjson(a, a), now_ms=T0)
    second = ingestor.ingest(ndjson(a))
    assert (first.accepted, first.duplicates) == (2, 0)
    assert (second.accepted, second.duplicates) == (1, 0)
    assert len(ingestor.queue) == 3


def test_dedup_defaults_to_none() -> None:
    ingestor = Ingestor(EventQueue())
    assert ingestor.dedup is None
    assert ingestor.ingest(ndjson(line("same"), line("same"))).accepted == 2


def test_now_ms_is_passed_to_the_window() -> None:
    a = line()
    dedup = DedupWindow(window_ms=1_000)
    ingestor = Ingestor(EventQueue(), dedup)
    assert ingestor.ingest(ndjson(a), now_ms=T0).accepted == 1
    assert ingestor.ingest(ndjson(a), now_ms=T0 + 500).duplicates == 1
    assert ingestor.ingest(ndjson(a), now_ms=T0 + 999).duplicates == 1
    # Past the window the id is new again.
    assert ingestor.ingest(ndjson(a), now_ms=T0 + 5_000).accepted == 1
    assert ingestor.ingest(ndjson(a), now_ms=T0 + 5_001).duplicates == 1
    assert len(ingestor.queue) == 2


def test_the_event_timestamp_is_not_the_window_clock() -> None:
    # The window runs on now_ms, not on the envelope's own timestamp.
    event_id = str(uuid.uuid4())
    dedup = DedupWindow(window_ms=1_000)
    ingestor = Ingestor(EventQueue(), dedup)
    first = ingestor.ingest(ndjson(line(event_id, timestamp=0)), now_ms=T0)
    again = ingestor.ingest(ndjson(line(event_id, timestamp=T0 + 10**9)), now_ms=T0 + 1)
    assert (first.accepted, again.duplicates) == (1, 1)


def test_the_ingestor_shares_its_queue_and_window() -> None:
    queue = EventQueue()
    dedup = DedupWindow()
    ingestor = Ingestor(queue, dedup)
    a = line()
    ingestor.ingest(ndjson(a), now_ms=T0)
    assert len(queue) == 1
    assert len(dedup) == 1
    assert dedup.check_and_insert(json.loads(a)["id"], now_ms=T0) is False
    assert len(ingestor.queue) == 1
    assert ingestor.dedup is not None
    assert len(ingestor.dedup) == 1


# --- a full or closed queue -------------------------------------------------------------------


def test_a_full_queue_under_reject_reports_the_rejected_lines() -> None:
    lines = [line() for _ in range(5)]
    dedup = DedupWindow()
    ingestor = Ingestor(EventQueue(2, "reject"), dedup)
    result = ingestor.ingest(ndjson(*lines), now_ms=T0)
    assert result.accepted == 2
    assert result.rejected == [2, 3, 4]
    assert result.shed == []
    check_counts(result, 5)
    for event_id in ids_of(lines[2:]):
        assert event_id not in dedup
    for event_id in ids_of(lines[:2]):
        assert event_id in dedup


def test_rejected_lines_are_accepted_on_retry() -> None:
    lines = [line() for _ in range(4)]
    ingestor = Ingestor(EventQueue(2, "reject"), DedupWindow())
    first = ingestor.ingest(ndjson(*lines), now_ms=T0)
    assert first.rejected == [2, 3]
    popped = drain(ingestor.queue)
    assert [e.id for e in popped] == ids_of(lines[:2])
    retry = ingestor.ingest(ndjson(*lines), now_ms=T0 + 1)
    assert retry.duplicates == 2
    assert retry.accepted == 2
    assert retry.rejected == []
    assert [e.id for e in drain(ingestor.queue)] == ids_of(lines[2:])


def test_rejected_indexes_count_invalid_lines_too() -> None:
    a, b, c = line(), line(), line()
    ingestor = Ingestor(EventQueue(1, "reject"), DedupWindow())
    result = ingestor.ingest(ndjson(b"bad", a, b"", b, a, c), now_ms=T0)
    assert result.accepted == 1
    assert [index for index, _ in result.invalid] == [0, 2]
    assert result.duplicates == 1
    assert result.rejected == [3, 5]


def test_a_repeat_of_a_rejected_line_in_the_same_batch_is_rejected_too() -> None:
    # A rejected id is not recorded in the window, so a later line with that id is not a
    # duplicate of anything seen: the queue refuses it as well.
    a, b = line(), line()
    dedup = DedupWindow()
    ingestor = Ingestor(EventQueue(1, "reject"), dedup)
    result = ingestor.ingest(ndjson(a, b, b), now_ms=T0)
    assert json.loads(b)["id"] not in dedup
    assert (result.accepted, result.duplicates, result.rejected) == (1, 0, [1, 2])


def test_a_closed_queue_rejects_everything() -> None:
    lines = [line(), line()]
    queue = EventQueue()
    dedup = DedupWindow()
    queue.close()
    ingestor = Ingestor(queue, dedup)
    result = ingestor.ingest(ndjson(*lines, b"bad"), now_ms=T0)
    assert result.accepted == 0
    assert result.rejected == [0, 1]
    assert [index for index, _ in result.invalid] == [2]
    assert len(dedup) == 0
    for event_id in ids_of(lines):
        assert event_id not in dedup


def test_shed_policy_reports_what_it_dropped() -> None:
    low = line(priority=5)
    high = [line(priority=1), line(priority=1)]
    queue = EventQueue(2, "shed")
    ingestor = Ingestor(queue, DedupWindow())
    result = ingestor.ingest(ndjson(low, *high), now_ms=T0)
    assert result.rejected == []
    assert len(result.shed) == 1
    (dropped,) = result.shed
    assert isinstance(dropped, Event)
    assert dropped.id == json.loads(low)["id"]
    assert queue.shed_count == 1
    assert [e.id for e in drain(queue)] == ids_of(high)


def test_shed_policy_may_drop_the_incoming_event() -> None:
    high = [line(priority=0), line(priority=0)]
    low = line(priority=5)
    queue = EventQueue(2, "shed")
    result = Ingestor(queue, DedupWindow()).ingest(ndjson(*high, low), now_ms=T0)
    assert [e.id for e in result.shed] == ids_of([low])
    assert [e.id for e in drain(queue)] == ids_of(high)


def test_shed_results_are_per_call() -> None:
    queue = EventQueue(1, "shed")
    ingestor = Ingestor(queue, DedupWindow())
    first = ingestor.ingest(ndjson(line(priority=4), line(priority=3)), now_ms=T0)
    second = ingestor.ingest(ndjson(line(priority=4)), now_ms=T0)
    assert len(first.shed) == 1
    assert len(second.shed) == 1
    assert queue.shed_count == 2


# --- a big batch ------------------------------------------------------------------------------


def test_a_batch_of_100000_lines_counts_exactly() -> None:
    n = 100_000
    lines: list[bytes] = []
    invalid: list[int] = []
    duplicates = 0
    depths = [0] * 6
    for i in range(n):
        if i % 97 == 0:
            lines.append(b'{"id": "broken"')
            invalid.append(i)
        elif i % 101 == 0:
            lines.append(lines[-1] if lines[-1] != b'{"id": "broken"' else lines[-2])
            duplicates += 1
        else:
            lines.append(line(f"evt-{i}", priority=i % 6))
            depths[i % 6] += 1
    ingestor = make()
    result = ingestor.ingest(b"\n".join(lines) + b"\n", now_ms=T0)
    accepted = n - len(invalid) - duplicates
    assert result.accepted == accepted == sum(depths)
    assert result.duplicates == duplicates
    assert [index for index, _ in result.invalid] == invalid
    assert result.rejected == []
    assert len(ingestor.queue) == accepted
    assert ingestor.queue.depths() == depths
    popped = ingestor.queue.pop_many(n)
    assert len(popped) == accepted
    assert [e.priority for e in popped] == sorted(e.priority for e in popped)


def test_a_batch_of_100000_byte_strings_counts_exactly() -> None:
    lines = [line(f"id-{i}") for i in range(100_000)]
    ingestor = make()
    result = ingestor.ingest(lines, now_ms=T0)
    assert result.accepted == 100_000
    assert len(ingestor.queue) == 100_000
    again = ingestor.ingest(lines, now_ms=T0)
    assert again.duplicates == 100_000
    assert again.accepted == 0


# --- threads ----------------------------------------------------------------------------------


def test_concurrent_ingests_share_the_window_exactly() -> None:
    lines = [line(f"evt-{i}", priority=i % 6) for i in range(5_000)]
    data = ndjson(*lines)
    queue = EventQueue()
    dedup = DedupWindow()
    # Several ingestors over one queue and one window, as several transports would have.
    ingestors = [Ingestor(queue, dedup) for _ in range(4)]
    results: list[IngestResult] = []
    barrier = threading.Barrier(len(ingestors))

    def run(ingestor: Ingestor) -> None:
        barrier.wait()
        results.append(ingestor.ingest(data, now_ms=T0))

    threads = [threading.Thread(target=run, args=(i,)) for i in ingestors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.accepted for r in results) == 5_000
    assert sum(r.duplicates for r in results) == 15_000
    assert all(r.invalid == [] and r.rejected == [] for r in results)
    popped = queue.pop_many(100_000)
    assert sorted(e.id for e in popped) == sorted(ids_of(lines))


def test_ingest_while_another_thread_pops() -> None:
    batches = [[line(f"b{b}-{i}") for i in range(1_000)] for b in range(10)]
    queue = EventQueue(capacity=None)
    ingestor = Ingestor(queue, DedupWindow())
    popped: list[Event] = []
    done = threading.Event()

    def consume() -> None:
        while not (done.is_set() and len(queue) == 0):
            popped.extend(queue.pop_many(100, timeout=0.01))

    consumer = threading.Thread(target=consume)
    consumer.start()
    accepted = sum(ingestor.ingest(batch, now_ms=T0).accepted for batch in batches)
    done.set()
    consumer.join()
    assert accepted == 10_000
    assert len({e.id for e in popped}) == 10_000


def test_an_ingest_meeting_a_held_window_admits_in_order_and_exactly() -> None:
    # One thread ingests 60,000 lines while another records 200,000 ids in the
    # same window through check_and_insert_many, which holds the window's lock
    # for the whole call: the ingest decodes ahead meanwhile, then admits its
    # chunks in order. Whichever thread records a shared id first, it is
    # taken once, and the ingest's events keep their order in each priority.
    count = 60_000
    ids = [f"evt-{i}" for i in range(count)]
    lines = [line(event_id, priority=i % 6) for i, event_id in enumerate(ids)]
    data = ndjson(*lines)
    dedup = DedupWindow(max_entries=1_000_000)
    ingestor = Ingestor(EventQueue(), dedup)
    # Every tenth of the ingest's ids, in reverse, comes from the other thread too.
    shared = ids[::10][::-1]
    others = shared + [f"other-{i}" for i in range(200_000)]
    answers: list[bool] = []
    results: list[IngestResult] = []
    started = threading.Event()

    def ingest() -> None:
        started.set()
        results.append(ingestor.ingest(data, now_ms=T0))

    def record() -> None:
        started.wait()
        answers.extend(dedup.check_and_insert_many(others, now_ms=T0))

    threads = [threading.Thread(target=ingest), threading.Thread(target=record)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (result,) = results
    assert all(answers[len(shared) :])
    # A shared id refused to the other thread was the ingest's first; the
    # rest are the ingest's duplicates.
    ingest_first = {i for i, new in zip(shared, answers, strict=False) if not new}
    lost = set(shared) - ingest_first
    assert result.duplicates == len(lost)
    assert result.accepted == count - len(lost)
    assert result.invalid == []
    assert result.rejected == []
    assert len(dedup) == 200_000 + count
    popped = [e.id for e in ingestor.queue.pop_many(count)]
    kept = sorted((i % 6, i) for i, event_id in enumerate(ids) if event_id not in lost)
    assert popped == [ids[i] for _, i in kept]


def _producer_lines(tag: str, count: int, shared: int) -> list[bytes]:
    """``count`` lines of ids ``tag-i`` (priorities cycling 0..5), the first
    ``shared`` of them with ids every producer uses, and each tenth line a
    repeat of the line before it."""
    lines: list[bytes] = []
    for i in range(count):
        if i % 10 == 9:
            lines.append(lines[-1])
        else:
            event_id = f"shared-{i}" if i < shared else f"{tag}-{i}"
            lines.append(line(event_id, priority=i % 6))
    return lines


def _run_threads(work: list[Any]) -> None:
    barrier = threading.Barrier(len(work))

    def run(task: Any) -> None:
        barrier.wait()
        task()

    threads = [threading.Thread(target=run, args=(task,)) for task in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _in_queue_order(lines: list[bytes]) -> list[str]:
    """The ids of ``lines`` first seen, in the order a queue pops them."""
    first: dict[str, tuple[int, int]] = {}
    for index, part in enumerate(lines):
        env = json.loads(part)
        first.setdefault(env["id"], (env["priority"], index))
    return [event_id for event_id, _ in sorted(first.items(), key=lambda kv: kv[1])]


@pytest.mark.parametrize("as_list", [False, True], ids=["ndjson", "byte-strings"])
def test_two_threads_with_their_own_ingestors_lose_nothing(as_list: bool) -> None:
    # Each thread has its own queue and window: the threads share nothing.
    blobs = {tag: _producer_lines(tag, 3_000, shared=500) for tag in ("a", "b")}
    ingestors = {tag: make() for tag in blobs}
    results: dict[str, list[IngestResult]] = {tag: [] for tag in blobs}

    def task(tag: str) -> Any:
        def ingest() -> None:
            # Three calls a thread, so the threads' calls interleave.
            for k in range(3):
                part = blobs[tag][k * 1_000 : (k + 1) * 1_000]
                data: bytes | list[bytes] = part if as_list else ndjson(*part)
                results[tag].append(ingestors[tag].ingest(data, now_ms=T0))

        return ingest

    _run_threads([task(tag) for tag in blobs])
    for tag, lines in blobs.items():
        expected = _in_queue_order(lines)
        assert sum(r.accepted for r in results[tag]) == len(expected)
        assert sum(r.duplicates for r in results[tag]) == len(lines) - len(expected)
        assert [e.id for e in drain(ingestors[tag].queue)] == expected


def test_two_threads_sharing_one_ingestor_take_each_id_once_in_order() -> None:
    # One Ingestor (one queue, one window) for both threads: ids both send are
    # caught as duplicates across the threads, and each thread's events keep
    # their order within a priority.
    blobs = {tag: _producer_lines(tag, 4_000, shared=1_000) for tag in ("a", "b")}
    ingestor = make()
    results: list[IngestResult] = []

    def task(tag: str) -> Any:
        def ingest() -> None:
            for k in range(4):
                part = blobs[tag][k * 1_000 : (k + 1) * 1_000]
                results.append(ingestor.ingest(ndjson(*part), now_ms=T0))

        return ingest

    _run_threads([task(tag) for tag in blobs])
    distinct = set(ids_of(blobs["a"])) | set(ids_of(blobs["b"]))
    assert sum(r.accepted for r in results) == len(distinct)
    assert sum(r.duplicates for r in results) == 8_000 - len(distinct)
    assert all(r.invalid == [] and r.rejected == [] for r in results)
    popped = drain(ingestor.queue)
    assert sorted(e.id for e in popped) == sorted(distinct)
    priorities = [e.priority for e in popped]
    assert priorities == sorted(priorities)
    # Within a priority, each thread's own ids come out in its input order.
    for tag, lines in blobs.items():
        own = [e.id for e in popped if e.id.startswith(f"{tag}-")]
        order = [i for i in _in_queue_order(lines) if i.startswith(f"{tag}-")]
        assert own == order


def test_threads_sharing_a_full_queue_report_each_refusal_once() -> None:
    # Four threads share one Ingestor whose queue holds 3,000 events and
    # rejects the rest: a thread that finds the window busy decodes ahead and
    # admits its chunks later, in order. Every line ends up accepted, a
    # duplicate, or rejected (sorted, by its index); rejected ids stay out of
    # the window, so a retry after draining is not a duplicate.
    lines = [line(f"evt-{i}", priority=i % 6) for i in range(6_000)]
    ingestor = make(capacity=3_000, overflow="reject")
    results: dict[int, IngestResult] = {}

    def task(k: int) -> Any:
        def ingest() -> None:
            results[k] = ingestor.ingest(ndjson(*lines), now_ms=T0)

        return ingest

    _run_threads([task(k) for k in range(4)])
    assert sum(r.accepted for r in results.values()) == 3_000
    for r in results.values():
        assert r.invalid == []
        assert r.rejected == sorted(r.rejected)
        assert r.accepted + r.duplicates + len(r.rejected) == 6_000
    accepted = {e.id for e in drain(ingestor.queue)}
    assert len(accepted) == 3_000
    refused = {f"evt-{i}" for r in results.values() for i in r.rejected}
    assert refused == {f"evt-{i}" for i in range(6_000)} - accepted
    retry = ingestor.ingest(ndjson(*(line(i) for i in sorted(refused))), now_ms=T0)
    assert (retry.accepted, retry.duplicates) == (3_000, 0)


def test_ingested_lines_and_pushed_events_share_the_fifo_of_a_priority() -> None:
    queue = EventQueue()
    ingestor = Ingestor(queue, DedupWindow())
    first = decode_event(line("pushed-1", priority=1))
    queue.push(first)
    ingestor.ingest(ndjson(*[line(f"line-{i}", priority=1) for i in range(40)]), now_ms=T0)
    queue.push(decode_event(line("pushed-2", priority=1)))
    queue.push("not an event", priority=1)
    gc.collect()  # the collector walks a queue holding both kinds
    popped = queue.pop_many(100)
    assert popped[0] is first
    assert [e.id for e in popped[1:41]] == [f"line-{i}" for i in range(40)]
    assert popped[41].id == "pushed-2"
    assert popped[42] == "not an event"
    assert all(type(e) is Event for e in popped[:42])


def test_other_threads_run_while_a_large_input_is_ingested() -> None:
    # With a switch interval far longer than the call, a thread that held the
    # GIL through ingest would let no other thread in until it returned.
    data = ndjson(*[line(f"big-{i}", priority=i % 6) for i in range(200_000)])
    ingestor = make()
    state = {"started": False, "done": False, "ran_during": 0}

    def other() -> None:
        while not state["done"]:
            if state["started"]:
                state["ran_during"] += 1
            time.sleep(0.0002)  # releases the GIL, so the ingesting thread can take it

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    thread = threading.Thread(target=other)
    try:
        thread.start()
        state["started"] = True
        result = ingestor.ingest(data, now_ms=T0)
        state["done"] = True
    finally:
        state["done"] = True
        thread.join()
        sys.setswitchinterval(interval)
    assert result.accepted == 200_000
    assert state["ran_during"] > 0


# --- a model ----------------------------------------------------------------------------------

MODEL_IDS = ["a", "b", "c", "d", "e", "f"]
model_lines = st.one_of(
    st.builds(lambda i, p: line(i, priority=p), st.sampled_from(MODEL_IDS), st.integers(0, 5)),
    st.sampled_from([b"", b"   ", b"{", b"[]", b"not json", line(priority=6), line(type="x")]),
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(model_lines, max_size=30),
    capacity=st.none() | st.integers(1, 8),
    use_dedup=st.booleans(),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    as_list=st.booleans(),
)
def test_ingest_matches_a_plain_python_model(
    lines: list[bytes],
    capacity: int | None,
    use_dedup: bool,
    crlf: bool,
    final_newline: bool,
    as_list: bool,
) -> None:
    if not as_list and not final_newline and lines and lines[-1] == b"":
        lines = [*lines, line("z")]  # without a final newline a trailing empty line vanishes
    # The model: decode_event is the validity oracle, a set is the window, a list the queue.
    seen: set[str] = set()
    queued: list[tuple[int, int, str]] = []
    accepted = duplicates = 0
    invalid: list[int] = []
    rejected: list[int] = []
    for index, part in enumerate(lines):
        try:
            event = decode_event(part)
        except DecodeError:
            invalid.append(index)
            continue
        if use_dedup and event.id in seen:
            duplicates += 1
        elif capacity is not None and len(queued) >= capacity:
            rejected.append(index)
        else:
            accepted += 1
            seen.add(event.id)
            queued.append((event.priority, index, event.id))

    queue = EventQueue(capacity, "reject")
    ingestor = Ingestor(queue, DedupWindow() if use_dedup else None)
    ending = b"\r\n" if crlf else b"\n"
    data: bytes | list[bytes] = lines
    if not as_list:
        data = ending.join(lines) + (ending if final_newline and lines else b"")
    result = ingestor.ingest(data, now_ms=T0)

    assert result.accepted == accepted
    assert result.duplicates == duplicates
    assert [index for index, _ in result.invalid] == invalid
    assert result.rejected == rejected
    assert result.shed == []
    assert [e.id for e in drain(queue)] == [event_id for _, _, event_id in sorted(queued)]


def test_a_refused_line_leaves_a_full_dedup_window_as_it_was() -> None:
    queue = EventQueue(capacity=2)
    window = DedupWindow(max_entries=2)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    result = Ingestor(queue, window).ingest([envelope_line(id=i) for i in ids], now_ms=0)
    assert (result.accepted, result.rejected) == (2, [2])
    assert [i in window for i in ids] == [True, True, False]
    queue.pop_many(2)
    again = Ingestor(queue, window).ingest([envelope_line(id=ids[0])], now_ms=1)
    assert (again.accepted, again.duplicates) == (0, 1)


def test_a_uuid_repeated_in_another_case_follows_its_refused_first_sight() -> None:
    u = str(uuid.uuid4())
    queue = EventQueue(capacity=1)
    lines = [envelope_line(id=str(uuid.uuid4())), envelope_line(id=u.upper()), envelope_line(id=u)]
    result = Ingestor(queue, DedupWindow()).ingest(lines, now_ms=0)
    assert (result.accepted, result.duplicates, result.rejected) == (1, 0, [1, 2])


def test_a_finalizer_running_another_ingest_cannot_let_an_id_in_twice() -> None:
    """Two ingestors share a window; a finalizer runs the second in the middle of the first."""
    queue, window = EventQueue(), DedupWindow()
    first, second = Ingestor(queue, window), Ingestor(queue, window)
    data = envelope_line(id="same-id")
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
    result = ingestor.ingest(
        [envelope_line(id="mid", priority=3), envelope_line(id="low", priority=5)], now_ms=0
    )
    assert [e.id for e in result.shed] == ["low"]  # shed on arrival
    assert "mid" in window
    assert "low" not in window
    result = ingestor.ingest([envelope_line(id="top", priority=0)], now_ms=1)
    assert [e.id for e in result.shed] == ["mid"]  # queued earlier, then shed
    assert "mid" not in window
    assert queue.pop().id == "top"
    again = ingestor.ingest([envelope_line(id="mid", priority=3)], now_ms=2)
    assert (again.accepted, again.duplicates) == (1, 0)


# --- compact lines, as encoders write them ----------------------------------------------------


def _fields(event: Event) -> tuple[Any, ...]:
    return (
        event.id,
        event.timestamp,
        event.trace_id,
        event.source,
        event.session_id,
        event.priority,
        event.type,
        event.payload,
        event.parent_id,
        event.extra,
        encode_event(event),
    )


@pytest.mark.parametrize("as_parts", [False, True], ids=["ndjson", "parts"])
def test_compact_lines_pop_as_the_events_they_decode_to(as_parts: bool) -> None:
    def compact(**overrides: Any) -> bytes:
        return json.dumps(json.loads(line(**overrides)), separators=(",", ":")).encode()

    lines = [
        compact(),
        compact(parentId="parent-1"),
        # Escaped strings, an unknown field, a line over 64 KiB: each held in full.
        compact(source="transport-\u00e9").replace(b"\xc3\xa9", b"\\u00e9"),
        compact(event_id="\u0061bc").replace(b'"abc"', b'"\\u0061bc"'),
        compact(x_extra={"k": [1, 2]}),
        compact(payload={"text": "x" * 70_000}),
        compact(payload={"text": "y" * 70_000}, parentId="parent-2"),
    ]
    ingestor = make()
    result = ingestor.ingest(lines if as_parts else ndjson(*lines), now_ms=T0)
    assert (result.accepted, result.invalid) == (len(lines), [])
    popped = sorted(drain(ingestor.queue), key=lambda e: lines.index(encode_event(e)))
    assert [_fields(e) for e in popped] == [_fields(decode_event(b)) for b in lines]
    assert popped[3].id == "abc"
    assert popped[2].source == "transport-\u00e9"
