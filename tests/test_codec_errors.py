"""Bad envelopes: each is a ``DecodeError`` naming the field or the byte offset, never a crash."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from envelopes import ENVELOPE, envelope_line, envelope_wire
from openstarry.core import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    MAX_DEPTH,
    Event,
    EventQueue,
    Ingestor,
    decode_event,
    encode_event,
)
from openstarry.errors import DecodeError, OpenStarryError

EVENT_ID = "0b7c2a54-3f8e-4c1a-9d2e-6f1b5a8c9e01"
REQUIRED = ["id", "timestamp", "traceId", "source", "sessionId", "priority", "type"]
SPEC_TYPES = [
    "INPUT:USER_MESSAGE",
    "INPUT:SYSTEM_COMMAND",
    "INPUT:SIGNAL",
    "KERNEL:TICK_START",
    "KERNEL:STATE_CHANGE",
    "KERNEL:ERROR",
    "EXEC:TOOL_CALL",
    "EXEC:TOOL_RESULT",
]


def wire(**overrides: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "id": EVENT_ID,
        "timestamp": 1_700_000_000_123,
        "traceId": "trace-7f3a",
        "source": "transport-websocket-01",
        "sessionId": "session-42",
        "priority": 2,
        "type": "INPUT:USER_MESSAGE",
        "payload": {"text": "hello", "list": [1, 2, 3]},
    }
    env.update(overrides)
    return env


def raw(**overrides: Any) -> bytes:
    return json.dumps(wire(**overrides)).encode()


def with_payload(payload_wire: bytes) -> bytes:
    return raw(payload="@@").replace(b'"@@"', payload_wire)


VALID = raw()


def decode_error(data: bytes | bytearray | memoryview, **kwargs: Any) -> DecodeError:
    """The DecodeError that ``data`` raises, checked to be well formed."""
    with pytest.raises(DecodeError) as info:
        decode_event(data, **kwargs)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, OpenStarryError)
    assert str(err), "the message must say what is wrong"
    assert err.field is not None or err.offset is not None, "name the field or the byte offset"
    if err.field is not None:
        assert err.field in str(err), "the message names the field"
    if err.offset is not None:
        assert 0 <= err.offset <= len(data)
        assert str(err.offset) in str(err), "the message names the byte offset"
    return err


def try_decode(data: bytes, **kwargs: Any) -> Event | DecodeError:
    """The event, or the DecodeError (any other exception propagates)."""
    try:
        return decode_event(data, **kwargs)
    except DecodeError as err:
        return err


def field_error(data: bytes, field: str, **kwargs: Any) -> DecodeError:
    err = decode_error(data, **kwargs)
    assert err.field == field, str(err)
    return err


def syntax_error(data: bytes, **kwargs: Any) -> DecodeError:
    err = decode_error(data, **kwargs)
    assert err.offset is not None, f"malformed JSON must report a byte offset: {err}"
    return err


def test_the_valid_envelope_decodes() -> None:
    assert decode_event(VALID).id == EVENT_ID


# --- malformed JSON ---------------------------------------------------------------------------


def test_every_prefix_of_a_valid_envelope_is_a_decode_error() -> None:
    data = raw(parentId="p-1", extra={"a": [1.5, "x\\y", None, True]})
    for end in range(len(data)):
        err = syntax_error(data[:end])
        assert err.offset is not None
        assert err.offset <= end


def test_every_prefix_of_an_envelope_with_unicode_and_escapes_is_a_decode_error() -> None:
    data = json.dumps(wire(source="傳輸\n😀", payload='\u00e9"\\'), ensure_ascii=False).encode()
    data = data.replace(b"\\n", b"\\u000a")
    for end in range(len(data)):
        syntax_error(data[:end])


@pytest.mark.parametrize("data", [b"", b" ", b"\n", b" \t\r\n "], ids=repr)
def test_empty_or_whitespace_only_input(data: bytes) -> None:
    syntax_error(data)


@pytest.mark.parametrize(
    "data",
    [b"[]", b"[1, 2]", b'"INPUT:USER_MESSAGE"', b"42", b"-1.5", b"true", b"false", b"null"],
    ids=repr,
)
def test_a_top_level_value_that_is_not_an_object(data: bytes) -> None:
    decode_error(data)


def test_an_array_of_envelopes_is_not_an_envelope() -> None:
    decode_error(b"[" + VALID + b"]")


def test_a_utf8_bom_prefix_is_refused() -> None:
    err = syntax_error(b"\xef\xbb\xbf" + VALID)
    assert err.offset == 0


@pytest.mark.parametrize("garbage", [b"x", b"}", b"{}", b",", b"\x00", b" 1", b"\n" + VALID])
def test_trailing_garbage_after_the_object(garbage: bytes) -> None:
    data = VALID + garbage
    err = syntax_error(data)
    assert err.offset == len(VALID) + len(garbage) - len(garbage.lstrip())


def test_trailing_whitespace_is_not_garbage() -> None:
    assert decode_event(VALID + b" \r\n\t").id == EVENT_ID


@pytest.mark.parametrize(
    "literal", [b"NaN", b"Infinity", b"-Infinity", b"+Infinity", b"nan", b"inf"], ids=repr
)
def test_nan_and_infinity_literals_are_refused(literal: bytes) -> None:
    data = with_payload(b"[1, " + literal + b"]")
    err = syntax_error(data)
    start = data.index(literal)
    assert err.offset is not None
    assert start <= err.offset <= start + len(literal)


@pytest.mark.parametrize(
    "payload",
    [
        b"01",
        b"-01",
        b"1.",
        b".5",
        b"+1",
        b"1e",
        b"1e+",
        b"-",
        b"0x10",
        b"tru",
        b"True",
        b"nul",
        b"None",
        b"'single'",
        b'"unterminated',
        b'"bad escape \\x"',
        b'"bad unicode escape \\u12G4"',
        b'"short unicode escape \\u12"',
        b"[1, 2,]",
        b'{"a": 1,}',
        b'{"a" 1}',
        b'{"a": 1 "b": 2}',
        b"{a: 1}",
        b"{1: 1}",
        b"[1 2]",
        b"[",
        b"]",
        b"{",
        b"}",
        b"/* comment */ 1",
        b"1 // comment",
        b"",
    ],
    ids=repr,
)
def test_malformed_json_in_the_payload(payload: bytes) -> None:
    syntax_error(with_payload(payload))


# --- strings: UTF-8, surrogates, control characters -------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        b"\xff",
        b"\xfe",
        b"\x80",
        b"\xc3",  # a lead byte with no continuation
        b"\xe4\xb8",  # a truncated three-byte sequence
        b"\xc0\xaf",  # overlong "/"
        b"\xe0\x80\xaf",  # overlong "/"
        b"\xed\xa0\x80",  # an encoded surrogate (U+D800)
        b"\xf4\x90\x80\x80",  # above U+10FFFF
        b"\xf8\x88\x80\x80\x80",  # a five-byte form
    ],
    ids=repr,
)
@pytest.mark.parametrize("where", ["source", "payload", "key", "extra"])
def test_invalid_utf8(bad: bytes, where: str) -> None:
    if where == "source":
        data = raw(source="ab@@cd")
    elif where == "payload":
        data = raw(payload={"text": "ab@@cd"})
    elif where == "key":
        data = raw(payload={"ab@@cd": 1})
    else:
        data = raw(note="ab@@cd")
    data = data.replace(b"@@", bad)
    err = decode_error(data)
    if err.offset is not None:
        assert err.offset <= data.index(bad) + len(bad)


def test_invalid_utf8_outside_strings() -> None:
    syntax_error(VALID.replace(b'"source":', b'"source":\xc3\xa9', 1))


@pytest.mark.parametrize(
    "escape",
    [
        b"\\ud800",
        b"\\udbff",
        b"\\udc00",
        b"\\udfff",
        b"\\ud800\\u0041",
        b"\\ud800x",
        b"\\ud800\\ud800",
        b"\\ude00\\ud83d",
        b"\\uD800",
    ],
    ids=repr,
)
@pytest.mark.parametrize("where", ["source", "payload", "key", "extra"])
def test_lone_surrogate_escapes(escape: bytes, where: str) -> None:
    if where == "source":
        data = raw(source="ab@@cd")
    elif where == "payload":
        data = raw(payload=["ab@@cd"])
    elif where == "key":
        data = raw(payload={"ab@@cd": 1})
    else:
        data = raw(note={"deep": "ab@@cd"})
    decode_error(data.replace(b"@@", escape))


@pytest.mark.parametrize("escape", [b"\\ud83d\\ude00", b"\\uD83D\\uDE00", b"\\udbff\\udfff"])
def test_a_surrogate_pair_is_fine(escape: bytes) -> None:
    event = decode_event(raw(source="ab@@cd", payload="@@").replace(b"@@", escape))
    expected = escape.decode("unicode_escape").encode("utf-16", "surrogatepass").decode("utf-16")
    assert event.source == f"ab{expected}cd"
    assert event.payload == expected


@pytest.mark.parametrize(
    "char", [b"\x00", b"\x01", b"\x08", b"\t", b"\n", b"\r", b"\x1f"], ids=repr
)
@pytest.mark.parametrize("where", ["source", "payload", "key", "extra"])
def test_raw_control_characters_in_strings(char: bytes, where: str) -> None:
    if where == "source":
        data = raw(source="ab@@cd")
    elif where == "payload":
        data = raw(payload={"text": "ab@@cd"})
    elif where == "key":
        data = raw(payload={"ab@@cd": 1})
    else:
        data = raw(note="ab@@cd")
    data = data.replace(b"@@", char)
    err = syntax_error(data)
    assert err.offset is not None
    assert err.offset <= data.index(char)


def test_escaped_control_characters_are_fine() -> None:
    event = decode_event(raw(source="a\x00\x1f\t\nb"))
    assert event.source == "a\x00\x1f\t\nb"


def test_delete_character_is_fine_raw() -> None:
    assert decode_event(raw(source="a@b").replace(b"@", b"\x7f")).source == "a\x7fb"


# --- the envelope's fields --------------------------------------------------------------------


@pytest.mark.parametrize("field", REQUIRED)
def test_each_required_field_missing(field: str) -> None:
    env = wire()
    del env[field]
    field_error(json.dumps(env).encode(), field)


def test_a_missing_payload_is_refused_or_read_as_null() -> None:
    # The spec declares ``payload: any``; either reading is defensible, a crash is not.
    env = wire()
    del env["payload"]
    data = json.dumps(env).encode()
    result = try_decode(data)
    if isinstance(result, DecodeError):
        assert result.field == "payload"
    else:
        assert result.payload is None
        assert encode_event(result) == data


def test_an_empty_object() -> None:
    err = decode_error(b"{}")
    assert err.field in [*REQUIRED, "payload"]


WRONG_TYPES: list[tuple[str, Any]] = [
    ("id", 5),
    ("id", None),
    ("id", ["x"]),
    ("id", {"a": 1}),
    ("id", True),
    ("timestamp", "1"),
    ("timestamp", "1700000000000"),
    ("timestamp", 1.5),
    ("timestamp", True),
    ("timestamp", False),
    ("timestamp", None),
    ("timestamp", [1]),
    ("traceId", 1),
    ("traceId", None),
    ("traceId", False),
    ("source", ["s"]),
    ("source", None),
    ("source", 0),
    ("sessionId", {"id": "x"}),
    ("sessionId", None),
    ("sessionId", 42),
    ("priority", 6),
    ("priority", 7),
    ("priority", 255),
    ("priority", 256),
    ("priority", 2**64),
    ("priority", -1),
    ("priority", "2"),
    ("priority", 2.5),
    ("priority", 2.0),
    ("priority", True),
    ("priority", False),
    ("priority", None),
    ("priority", [2]),
    ("type", None),
    ("type", 1),
    ("type", ["INPUT:USER_MESSAGE"]),
    ("parentId", 5),
    ("parentId", ["p"]),
    ("parentId", True),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES, ids=repr)
def test_wrong_value_for_a_field(field: str, value: Any) -> None:
    field_error(raw(**{field: value}), field)


@pytest.mark.parametrize("literal", [b"2.0", b"2e0", b"0.2e1", b"02"], ids=repr)
def test_priority_must_be_written_as_a_plain_integer(literal: bytes) -> None:
    data = raw(priority="@@").replace(b'"@@"', literal)
    decode_error(data)


@pytest.mark.parametrize("literal", [b"1.0", b"1e3", b"1700000000000.5"], ids=repr)
def test_timestamp_must_be_an_integer(literal: bytes) -> None:
    field_error(raw(timestamp="@@").replace(b'"@@"', literal), "timestamp")


@pytest.mark.parametrize("field", ["id", "source", "sessionId", "traceId"])
def test_empty_string_fields(field: str) -> None:
    field_error(raw(**{field: ""}), field)


@pytest.mark.parametrize(
    "event_type",
    [
        "input:user_message",
        "Input:User_Message",
        "INPUT:user_message",
        "INPUT",
        "INPUT:",
        ":X",
        ":",
        "",
        "INPUT:USER MESSAGE",
        " INPUT:USER_MESSAGE",
        "INPUT:USER_MESSAGE ",
        "INPUT :USER_MESSAGE",
    ],
    ids=repr,
)
def test_type_must_be_namespace_colon_name_in_capitals(event_type: str) -> None:
    field_error(raw(type=event_type), "type")


@pytest.mark.parametrize("event_type", [*SPEC_TYPES, "CUSTOM:THING_2", "A:B", "MCP:TOOLS_CALL"])
def test_spec_types_and_custom_types_are_accepted(event_type: str) -> None:
    assert decode_event(raw(type=event_type)).type == event_type


@pytest.mark.parametrize("field", [*REQUIRED, "payload", "parentId", "custom"])
def test_duplicate_keys(field: str) -> None:
    env = wire(parentId="p-1", custom=1)
    data = json.dumps(env).encode()
    value = json.dumps(env[field]).encode()
    duplicated = data[:-1] + b", " + json.dumps(field).encode() + b": " + value + b"}"
    field_error(duplicated, field)


def test_duplicate_key_spelled_with_an_escape() -> None:
    data = VALID[:-1] + b', "\\u0073ource": "other"}'
    field_error(data, "source")


def test_duplicate_keys_inside_the_payload_are_kept_and_the_last_wins() -> None:
    # The envelope's own keys must be unique; inside the payload the bytes stay as they
    # came, and reading them does what Python's json module does: the last key wins.
    data = with_payload(b'{"a": 1, "a": 2}')
    event = decode_event(data)
    assert event.payload_json == b'{"a": 1, "a": 2}'
    assert encode_event(event) == data
    assert event.payload == {"a": 2}


# --- limits -----------------------------------------------------------------------------------


def test_default_limits_are_sane() -> None:
    assert 2 < DEFAULT_MAX_DEPTH < 100_000
    assert len(VALID) < DEFAULT_MAX_BYTES < 10 * 1024 * 1024


@pytest.mark.parametrize("depth", [100_000])
@pytest.mark.parametrize("where", ["payload", "extra"])
@pytest.mark.parametrize("kind", ["arrays", "objects"])
def test_very_deep_nesting_is_refused_not_a_stack_overflow(
    depth: int, where: str, kind: str
) -> None:
    if kind == "arrays":
        nested = b"[" * depth + b"]" * depth
    else:
        nested = b'{"a":' * depth + b"1" + b"}" * depth
    env = raw(payload="@@") if where == "payload" else raw(deep="@@")
    data = env.replace(b'"@@"', nested)
    decode_error(data, max_bytes=len(data) + 1)


def test_very_deep_unterminated_nesting_is_refused() -> None:
    data = VALID[:-1] + b', "x": ' + b"[" * 100_000
    decode_error(data, max_bytes=len(data) + 1)


RAISED_DEPTH_SNIPPETS = {
    "decode_event": (
        "from openstarry.core import decode_event\n"
        "data = ENVELOPE.replace(b'\"@@\"', NESTED)\n"
        "event = decode_event(data, max_depth=10**6, max_bytes=10**9)\n"
        "event.payload\n"
    ),
    "decode_event extra": (
        "from openstarry.core import decode_event\n"
        "data = ENVELOPE[:-1] + b', \"deep\": ' + NESTED + b'}'\n"
        "event = decode_event(data, max_depth=10**6, max_bytes=10**9)\n"
        "event.extra\n"
    ),
    "decode_response": (
        "from openstarry.core import decode_response\n"
        "data = b'{\"segments\": [], \"metadata\": ' + NESTED + b'}'\n"
        "decode_response(data, max_depth=10**6, max_bytes=10**9).metadata\n"
    ),
    "ingest": (
        "from openstarry.core import EventQueue, Ingestor\n"
        "data = ENVELOPE.replace(b'\"@@\"', NESTED)\n"
        "queue = EventQueue()\n"
        "Ingestor(queue, max_depth=10**6, max_line_bytes=10**9).ingest([data])\n"
        "event = queue.pop()\n"
        "event is None or event.payload\n"
    ),
}


@pytest.mark.parametrize(
    "snippet", list(RAISED_DEPTH_SNIPPETS.values()), ids=list(RAISED_DEPTH_SNIPPETS)
)
def test_a_raised_max_depth_never_crashes_the_process(snippet: str) -> None:
    """A raised ``max_depth`` lets deep input decode or raise; it never overflows the stack.

    Run in a subprocess: a stack overflow kills the process (SIGSEGV) instead of failing a test.
    """
    script = (
        "from openstarry.errors import DecodeError\n"
        "ENVELOPE = " + repr(raw(payload="@@")) + "\n"
        "NESTED = b'[' * 200_000 + b']' * 200_000\n"
        "try:\n"
        + "".join("    " + row + "\n" for row in snippet.splitlines())
        + "except (DecodeError, RecursionError, MemoryError, ValueError) as err:\n"
        "    print('refused:', type(err).__name__)\n"
        "else:\n"
        "    print('decoded')\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=300
    )
    assert completed.returncode == 0, (
        f"exit code {completed.returncode}: {completed.stdout}{completed.stderr}"
    )


def test_max_depth_is_honoured() -> None:
    data = with_payload(b"[" * 10 + b"]" * 10)
    assert decode_event(data, max_depth=20).payload_json == b"[" * 10 + b"]" * 10
    decode_error(data, max_depth=5)


def test_max_depth_counts_objects_and_arrays_alike() -> None:
    arrays = with_payload(b"[" * 10 + b"1" + b"]" * 10)
    objects = with_payload(b'{"a":' * 10 + b"1" + b"}" * 10)
    limits = range(1, 16)
    arrays_ok = [_decodes(arrays, max_depth=n) for n in limits]
    objects_ok = [_decodes(objects, max_depth=n) for n in limits]
    assert arrays_ok == objects_ok
    assert arrays_ok[0] is False
    assert arrays_ok[-1] is True
    # Once deep enough, deeper limits keep working.
    first = arrays_ok.index(True)
    assert all(arrays_ok[first:])


def _decodes(data: bytes, **kwargs: Any) -> bool:
    return not isinstance(try_decode(data, **kwargs), DecodeError)


def test_default_max_depth_allows_reasonable_nesting() -> None:
    depth = DEFAULT_MAX_DEPTH // 2
    assert decode_event(with_payload(b"[" * depth + b"]" * depth)).payload is not None
    deep = DEFAULT_MAX_DEPTH * 2
    decode_error(with_payload(b"[" * deep + b"]" * deep))


def test_a_10_mb_line_exceeds_the_default_max_bytes() -> None:
    text = "x" * (10 * 1024 * 1024)
    data = raw(payload={"text": text})
    decode_error(data)
    event = decode_event(data, max_bytes=len(data))
    assert event.payload == {"text": text}
    assert encode_event(event) == data


def test_max_bytes_is_an_inclusive_limit() -> None:
    assert decode_event(VALID, max_bytes=len(VALID)).id == EVENT_ID
    decode_error(VALID, max_bytes=len(VALID) - 1)
    decode_error(bytearray(VALID), max_bytes=len(VALID) - 1)
    decode_error(memoryview(VALID), max_bytes=10)


def test_max_bytes_is_checked_before_parsing() -> None:
    # Not valid JSON either, but the size is what is wrong first.
    data = b"{" + b" " * 200
    err = decode_error(data, max_bytes=100)
    assert "100" in str(err) or "byte" in str(err)


@pytest.mark.parametrize("kwargs", [{"max_bytes": -1}, {"max_depth": -1}], ids=repr)
def test_negative_limits_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises((ValueError, OverflowError)):
        decode_event(VALID, **kwargs)


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=300))
@example(data=b"")
@example(data=b"{")
@example(data=b'{"id"')
@example(data=b"\xef\xbb\xbf{}")
@example(data=VALID[:-1])
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    result = try_decode(data)
    if isinstance(result, DecodeError):
        assert result.field is not None or result.offset is not None


JSONISH = b' \t\r\n{}[]",:\\0123456789.eE+-tfnulrasNIy\x00\x1f\x7f\xc3\xa9\xff\xed\xa0\x80'


def _mutate(data: bytes, draw: st.DataObject) -> bytes:
    for _ in range(draw.draw(st.integers(1, 3))):
        position = draw.draw(st.integers(0, len(data)))
        op = draw.draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        if op == "insert":
            piece = draw.draw(st.binary(min_size=1, max_size=3) | st.sampled_from(JSONISH))
            if isinstance(piece, int):
                piece = bytes([piece])
            data = data[:position] + piece + data[position:]
        elif op == "delete":
            length = draw.draw(st.integers(1, 4))
            data = data[:position] + data[position + length :]
        elif op == "replace" and position < len(data):
            byte = draw.draw(st.sampled_from(JSONISH))
            data = data[:position] + bytes([byte]) + data[position + 1 :]
        elif op == "duplicate":
            length = draw.draw(st.integers(1, 12))
            data = data[:position] + data[position : position + length] + data[position:]
    return data


MUTATION_BASES = [
    VALID,
    raw(parentId="p-1", custom={"a": [1, 2.5e-3, None, "é"]}),
    json.dumps(wire(source="傳輸😀", payload=["\n", "\\u0000"]), ensure_ascii=False).encode(),
    json.dumps(wire(payload={"deep": [[[{"k": True}]]]}), indent=1).encode(),
]


@settings(max_examples=2000, deadline=None)
@given(base=st.sampled_from(MUTATION_BASES), draw=st.data())
def test_mutated_envelopes_agree_with_the_json_module(base: bytes, draw: st.DataObject) -> None:
    """Whatever the decoder accepts, ``json`` reads the same way; it never crashes."""
    data = _mutate(base, draw)
    event = try_decode(data)
    if isinstance(event, DecodeError):
        assert event.field is not None or event.offset is not None
        return
    expected = json.loads(data)
    assert isinstance(expected, dict)
    assert event.id == expected.pop("id")
    assert event.timestamp == expected.pop("timestamp")
    assert event.trace_id == expected.pop("traceId")
    assert event.source == expected.pop("source")
    assert event.session_id == expected.pop("sessionId")
    assert event.priority == expected.pop("priority")
    assert event.type == expected.pop("type")
    assert event.parent_id == expected.pop("parentId", None)
    assert event.payload == expected.pop("payload", None)
    assert event.extra == expected
    assert encode_event(event) in (data, data.strip(b" \t\r\n"))


# Per field: values the decoder must accept, and values it must refuse.
ids = st.text("abcdefABCDEF0123456789-_.:", min_size=1, max_size=40)
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "id": ids,
    "timestamp": st.integers(0, 2**53),
    "traceId": ids,
    "source": ids | st.just("transport-websocket-01 😀"),
    "sessionId": ids,
    "priority": st.integers(0, 5),
    "type": st.sampled_from([*SPEC_TYPES, "CUSTOM:THING_2"]),
    "parentId": ids,
}
BAD: dict[str, st.SearchStrategy[Any]] = {
    "id": st.sampled_from(["", 1, None, True, [], {}]),
    "timestamp": st.sampled_from(["1", 1.5, True, None, [], {}]),
    "traceId": st.sampled_from(["", 1, None, False, ["t"]]),
    "source": st.sampled_from(["", 0, None, {}]),
    "sessionId": st.sampled_from(["", 0.5, None, []]),
    "priority": st.sampled_from([6, -1, "2", 2.5, 2.0, True, None, 100]),
    "type": st.sampled_from(["input:user_message", "INPUT", "INPUT:", ":X", "A B:C", 3, None]),
    "parentId": st.sampled_from([1, [], True]),
}


@settings(max_examples=500, deadline=None)
@given(draw=st.data())
def test_field_model(draw: st.DataObject) -> None:
    """A model of the envelope's rules: valid iff every field is; a single bad field is named."""
    env: dict[str, Any] = {}
    bad: list[str] = []
    for field in [*REQUIRED, "parentId"]:
        choice = draw.draw(st.sampled_from(["good", "good", "good", "bad", "missing"]))
        if field == "parentId" and choice == "missing":
            continue
        if choice == "missing":
            bad.append(field)
        elif choice == "bad":
            env[field] = draw.draw(BAD[field])
            bad.append(field)
        else:
            env[field] = draw.draw(GOOD[field])
    env["payload"] = draw.draw(st.none() | st.integers() | st.text(max_size=5))
    order = draw.draw(st.permutations(list(env)))
    data = json.dumps({k: env[k] for k in order}, ensure_ascii=draw.draw(st.booleans())).encode()
    if not bad:
        event = decode_event(data)
        assert event.to_dict() == env
        assert encode_event(event) == data
        return
    err = decode_error(data)
    if len(bad) == 1:
        assert err.field == bad[0]
    else:
        assert err.field in bad


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
        decode_event(envelope_line(), max_depth=MAX_DEPTH + 1)


def test_integers_python_cannot_convert_are_refused_when_decoded() -> None:
    ok = envelope_line(payload="@").replace(b'"@"', b"9" * 4300)
    assert decode_event(ok).payload == int("9" * 4300)
    with pytest.raises(DecodeError, match="digits") as info:
        decode_event(envelope_line(payload="@").replace(b'"@"', b"9" * 4301))
    assert info.value.offset is not None


@pytest.mark.parametrize("data", [5, [123, 125], "{}", 2**40])
def test_decoders_take_only_bytes_like_objects(data: Any) -> None:
    with pytest.raises(TypeError, match="bytes"):
        decode_event(data)
    with pytest.raises(TypeError, match="bytes"):
        Ingestor(EventQueue()).ingest(data)


def test_error_offsets_point_at_the_value_not_the_whitespace_before_it() -> None:
    data = envelope_line().replace(b'"sessionId":"s-1"', b'"sessionId":   ""')
    with pytest.raises(DecodeError) as info:
        decode_event(data)
    assert info.value.field == "sessionId"
    assert data[info.value.offset or 0 :].startswith(b'""')


def test_a_number_beyond_a_64_bit_float_is_refused_where_it_is_decoded() -> None:
    """``1e400`` cannot be a float and be written back as JSON, so the core refuses it.

    Read as infinity, it would turn into ``null`` (or an encoding error) on the
    way out; refused at decode time, the error names where it is.
    """
    raw = json.dumps(envelope_wire(payload="@@")).encode().replace(b'"@@"', b'{"n": 1e400}')
    with pytest.raises(DecodeError, match="out of range"):
        decode_event(raw)
