"""The server-sent events reader that the HTTP providers and the Agent API client share.

Its linear time on long lines is measured by ``make bench``
(``benches/test_bench_linear.py``), not timed here.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openstarry.sse import (
    MAX_EVENT,
    MAX_LINE,
    EventParser,
    LineReader,
    ServerSentEvent,
    SSEReader,
)


class TooLarge(Exception):
    """The error a test's reader raises for a stream beyond its bounds."""


def read(*chunks: bytes, **bounds: int) -> list[ServerSentEvent]:
    reader = SSEReader(**bounds, error=TooLarge)
    events = [event for chunk in chunks for event in reader.feed(chunk)]
    return events + reader.close()


def lines_of(*chunks: bytes, max_line: int = MAX_LINE) -> list[str]:
    reader = LineReader(max_line, error=TooLarge)
    lines = [line for chunk in chunks for line in reader.feed(chunk)]
    return lines + reader.close()


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# --- lines ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("end", [b"\r\n", b"\n", b"\r"])
def test_each_line_end_ends_a_line(end: bytes) -> None:
    data = b"data: a" + end + b"data: b" + end + end
    assert lines_of(data) == ["data: a", "data: b", ""]
    assert lines_of(*bytewise(data)) == ["data: a", "data: b", ""]


def test_mixed_line_ends_and_a_crlf_split_across_chunks() -> None:
    data = b"a\r\nb\rc\nd\r\r\ne\n"
    expected = ["a", "b", "c", "d", "", "e"]
    for cut in range(len(data) + 1):
        assert lines_of(data[:cut], data[cut:]) == expected, cut
    assert lines_of(*bytewise(data)) == expected


def test_a_cr_at_the_end_of_a_chunk_waits_for_the_next() -> None:
    """It may be the first half of a CRLF; the next chunk, or the end, decides."""
    reader = LineReader()
    assert reader.feed(b"data: a\r") == []
    assert reader.feed(b"\n") == ["data: a"]
    assert reader.feed(b"b\r") == []
    assert reader.feed(b"c") == ["b"]
    assert reader.feed(b"\r") == []
    assert reader.close() == ["c"]


@pytest.mark.parametrize("breaker", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c"])
def test_only_cr_and_lf_break_a_line(breaker: str) -> None:
    """``str.splitlines`` breaks at these too; JSON leaves them raw inside strings."""
    data = f'data: {{"text": "a{breaker}b"}}\n\n'.encode()
    assert read(data) == [ServerSentEvent(f'{{"text": "a{breaker}b"}}')]
    assert read(*bytewise(data)) == [ServerSentEvent(f'{{"text": "a{breaker}b"}}')]


def test_utf8_split_across_chunks_and_invalid_bytes() -> None:
    assert lines_of(b"data: \xe6\x97", b"\xa5\n") == ["data: \u65e5"]
    assert lines_of(b"data: \xff\n") == ["data: \ufffd"]


def test_a_byte_order_mark_is_dropped_at_the_start_only() -> None:
    assert lines_of(b"\xef\xbb\xbfdata: 1\n") == ["data: 1"]
    assert lines_of(b"\xef", b"\xbb", b"\xbfdata: 1\n") == ["data: 1"]
    assert lines_of(b"data: 1\n\xef\xbb\xbf\n") == ["data: 1", "\ufeff"]


def test_an_unfinished_last_line_is_dropped() -> None:
    assert lines_of(b"a\nb") == ["a"]
    assert read(b"data: ok\n\ndata: cut") == [ServerSentEvent("ok")]


# --- fields and events ---------------------------------------------------------------------------


def test_multi_line_data_and_the_one_space_after_the_colon() -> None:
    assert read(b"data: 1\ndata:2\ndata:  3\ndata\n\n") == [ServerSentEvent("1\n2\n 3\n")]
    assert read(b"data\n\n") == [ServerSentEvent("")]


def test_comments_are_skipped() -> None:
    assert read(b": keep-alive\n\n: a\ndata: x\n:b\n\n") == [ServerSentEvent("x")]


def test_event_names_and_the_event_without_data() -> None:
    assert read(b"event: a\ndata: 1\n\ndata: 2\n\n") == [
        ServerSentEvent("1", "a"),
        ServerSentEvent("2"),  # a name is the event's, not the stream's
    ]
    assert read(b"event: ping\n\ndata: 3\n\n") == [ServerSentEvent("3")]
    assert read(b"event:\ndata: 4\n\n") == [ServerSentEvent("4")]


def test_the_last_event_id_stays_until_the_stream_sets_another() -> None:
    events = read(b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n")
    assert [(event.id, event.data) for event in events] == [
        ("1", "a"),
        ("1", "b"),
        ("2", "c"),
        ("", "d"),
    ]
    assert read(b"id: 3\nid: a\x00b\ndata: e\n\n") == [ServerSentEvent("e", id="3")]
    reader = SSEReader()
    reader.feed(b"id: 9\n")
    assert reader.last_id == "9"  # set before the event is dispatched


def test_retry_and_unknown_fields_are_ignored() -> None:
    assert read(b"retry: 10\nfoo: bar\nDATA: no\ndata: x\n\n") == [ServerSentEvent("x")]


def test_an_event_open_at_the_end_is_dropped() -> None:
    assert read(b"data: open at the end\n") == []
    assert read(b"data: x\n\r") == [ServerSentEvent("x")]  # a final CR ends the line


def test_the_parser_takes_lines() -> None:
    parser = EventParser()
    assert parser.feed_line("data: a") is None
    assert parser.feed_line("") == ServerSentEvent("a")
    assert parser.feed_lines(["event: e", "data: b", "", "data: c"]) == [ServerSentEvent("b", "e")]
    parser.reset()
    assert parser.feed_line("") is None


# --- bounds --------------------------------------------------------------------------------------


def test_the_default_bounds() -> None:
    assert (MAX_LINE, MAX_EVENT) == (4 * 1024 * 1024, 8 * 1024 * 1024)
    reader = SSEReader()
    assert (reader.lines.max_line, reader.parser.max_event) == (MAX_LINE, MAX_EVENT)


def test_a_line_at_the_bound_is_read() -> None:
    assert read(b"data: " + b"x" * 10 + b"\n\n", max_line=16) == [ServerSentEvent("x" * 10)]


def test_a_line_over_the_bound_is_refused_as_soon_as_it_is_read() -> None:
    """An endless line must not fill memory before it ends."""
    reader = LineReader(16, error=TooLarge)
    assert reader.feed(b"data: " + b"x" * 10) == []
    with pytest.raises(TooLarge, match="longer than 16 characters"):
        reader.feed(b"x")


@pytest.mark.parametrize(
    "data",
    [
        b"data: " + b"x" * 11 + b"\n",  # ends in the chunk that makes it too long
        b"a\n" + b"x" * 17 + b"\nb\n",  # among shorter lines
        b"a\n" + b"x" * 17 + b"\r",  # before a CR held back
    ],
)
def test_a_complete_line_over_the_bound_is_refused(data: bytes) -> None:
    with pytest.raises(TooLarge, match="longer than 16 characters"):
        lines_of(data, max_line=16)


def test_an_event_over_the_bound_is_refused() -> None:
    # Each data line counts with the LF that joins it to the next.
    assert read(b"data: 1234\ndata: 1234\n\n", max_event=10) == [ServerSentEvent("1234\n1234")]
    with pytest.raises(TooLarge, match="more than 10 characters"):
        read(b"data: 12345\ndata: 12345\n\n", max_event=10)
    # The bound is per event: a dispatched event's data no longer counts.
    assert len(read(b"data: 123456789\n\n" * 5, max_event=10)) == 5


def test_the_owner_chooses_the_error() -> None:
    with pytest.raises(ValueError, match="longer than 4"):
        LineReader(4).feed(b"12345")
    with pytest.raises(ValueError, match="more than 4"):
        EventParser(4).feed_line("data: 12345")


# --- however the bytes are cut -------------------------------------------------------------------

#: What the lines of a generated stream are made of: fields, values, comments, breakers of
#: ``str.splitlines`` and a character of two UTF-8 bytes.
PIECES = ["data:", "data: ", "event: e", "id: 7", "retry: 1", ":", "x", " ", "\u2028", "\u00e9"]


@given(
    lines=st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map("".join), max_size=12),
    ends=st.lists(st.sampled_from(["\n", "\r", "\r\n"]), min_size=1),
    sizes=st.lists(st.integers(min_value=1, max_value=40), min_size=1),
)
def test_events_do_not_depend_on_how_the_bytes_are_cut(
    lines: list[str], ends: list[str], sizes: list[int]
) -> None:
    """The same stream in chunks of any sizes, down to single bytes, reads as one chunk does."""
    data = ("".join(line + ends[i % len(ends)] for i, line in enumerate(lines)) + "\n\n").encode()
    chunks: list[bytes] = []
    start = 0
    while start < len(data):
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(data[start : start + size])
        start += size
    expected = read(data)
    assert read(*chunks) == expected
    assert read(*bytewise(data)) == expected
