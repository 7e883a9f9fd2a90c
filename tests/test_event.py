"""The spec 002 event envelope: ``Event``, ``decode_event`` and ``encode_event``.

Validation failures have their own file, ``test_codec_errors.py``.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import os
import pickle
import time
import uuid
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envelopes import ENVELOPE, Sentinel, envelope_line, nested
from openstarry.core import (
    DEFAULT_PRIORITY,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    Event,
    decode_event,
    encode_event,
)
from openstarry.errors import DecodeError

EVENT_ID = "0b7c2a54-3f8e-4c1a-9d2e-6f1b5a8c9e01"
PARENT_ID = "5d1e4f0a-8b2c-4e6d-a1f3-7c9b0e2d4a68"
WIRE_FIELDS = {"id", "timestamp", "traceId", "source", "sessionId", "priority", "type", "payload"}


def wire(**overrides: Any) -> dict[str, Any]:
    """A valid envelope as a dict; ``overrides`` replace or add wire fields."""
    env: dict[str, Any] = {
        "id": EVENT_ID,
        "timestamp": 1_700_000_000_123,
        "traceId": "trace-7f3a",
        "source": "transport-websocket-01",
        "sessionId": "session-42",
        "priority": 1,
        "type": "INPUT:USER_MESSAGE",
        "payload": {
            "text": "Read the recent system logs",
            "mimeType": "text/plain",
            "metadata": {"platform": "discord"},
        },
    }
    env.update(overrides)
    return env


def raw(**overrides: Any) -> bytes:
    return json.dumps(wire(**overrides)).encode()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def assert_uuid4(value: str) -> None:
    parsed = uuid.UUID(value)
    assert parsed.version == 4
    assert parsed.variant == uuid.RFC_4122
    assert str(parsed) == value, "the canonical lower-case hyphenated form"


def new_event(payload: Any = None, **kwargs: Any) -> Event:
    return Event.new("INPUT:USER_MESSAGE", payload, source="cli", session_id="s-1", **kwargs)


# --- decoding ---------------------------------------------------------------------------------


def test_decode_reads_every_wire_field_into_snake_case_attributes() -> None:
    event = decode_event(raw(parentId=PARENT_ID))
    assert event.id == EVENT_ID
    assert event.timestamp == 1_700_000_000_123
    assert event.trace_id == "trace-7f3a"
    assert event.source == "transport-websocket-01"
    assert event.session_id == "session-42"
    assert event.priority == 1
    assert event.type == "INPUT:USER_MESSAGE"
    assert event.parent_id == PARENT_ID
    assert event.payload == wire()["payload"]
    assert event.extra == {}


def test_parent_id_is_none_when_the_wire_has_none() -> None:
    assert decode_event(raw()).parent_id is None


def test_spec_002_tool_result_example_decodes() -> None:
    payload = {
        "toolCallId": "call_abc123",
        "success": False,
        "error": {"code": "EPERM", "message": "Operation not permitted", "source": "fs-plugin"},
    }
    event = decode_event(raw(type="EXEC:TOOL_RESULT", payload=payload))
    assert event.type == "EXEC:TOOL_RESULT"
    assert event.payload == payload


def test_an_id_need_not_be_a_uuid() -> None:
    assert decode_event(raw(id="evt-1")).id == "evt-1"


@pytest.mark.parametrize("priority", [0, 1, 2, 3, 4, 5])
def test_every_priority_from_0_to_5_is_accepted(priority: int) -> None:
    assert decode_event(raw(priority=priority)).priority == priority


def test_priority_constants() -> None:
    assert PRIORITY_HIGHEST == 0
    assert PRIORITY_LOWEST == 5
    assert DEFAULT_PRIORITY == 2


def test_timestamp_beyond_32_bits_is_kept_exactly() -> None:
    assert decode_event(raw(timestamp=2**53 + 1)).timestamp == 2**53 + 1


def test_payload_json_is_the_raw_payload_bytes_from_the_wire() -> None:
    data = (
        b'{"id": "' + EVENT_ID.encode() + b'", "timestamp": 1, "traceId": "t", "source": "s",'
        b' "sessionId": "x", "priority": 2, "type": "A:B", "payload" :  [1,  2.50 ,{"k" : "v"} ] }'
    )
    event = decode_event(data)
    assert event.payload_json == b'[1,  2.50 ,{"k" : "v"} ]'
    assert event.payload == [1, 2.5, {"k": "v"}]


@pytest.mark.parametrize(
    ("payload_wire", "expected"),
    [
        (b"null", None),
        (b"true", True),
        (b"false", False),
        (b"0", 0),
        (b"-17", -17),
        (b"123456789012345678901234567890", 123456789012345678901234567890),
        (b"-98765432109876543210987654321", -98765432109876543210987654321),
        (b"2.5", 2.5),
        (b"1e3", 1000.0),
        (b"-1.25E-2", -0.0125),
        (b'"text"', "text"),
        (b'"\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/"', 'é😀\n\t"\\/'),
        (b"[]", []),
        (b"{}", {}),
        (
            b'{"a": [1, {"b": null}], "c": {"d": [true, false]}}',
            {"a": [1, {"b": None}], "c": {"d": [True, False]}},
        ),
    ],
)
def test_payload_of_every_json_type_decodes_like_the_json_module(
    payload_wire: bytes, expected: Any
) -> None:
    data = raw(payload="@@").replace(b'"@@"', payload_wire)
    event = decode_event(data)
    assert event.payload == expected
    assert type(event.payload) is type(expected)
    assert event.payload_json == payload_wire


def test_payload_floats_stay_floats_and_ints_stay_ints() -> None:
    data = raw(payload="@@").replace(b'"@@"', b"[1.0, 1, -0.0, 1e2]")
    payload = decode_event(data).payload
    assert [type(x) for x in payload] == [float, int, float, float]
    assert math.copysign(1.0, payload[2]) == -1.0


def test_payload_is_decoded_once_and_the_same_object_is_returned() -> None:
    event = decode_event(raw())
    first = event.payload
    assert event.payload is first


def test_mutating_the_decoded_payload_does_not_change_the_wire_bytes() -> None:
    data = raw()
    event = decode_event(data)
    event.payload["text"] = "changed"
    assert encode_event(event) == data
    assert event.payload_json == json.dumps(wire()["payload"]).encode()


def test_unknown_fields_are_kept_in_extra_decoded() -> None:
    event = decode_event(raw(zeta=[1, 2.5, None], **{"x-custom": {"a": {"b": True}}}))
    assert event.extra == {"zeta": [1, 2.5, None], "x-custom": {"a": {"b": True}}}


def test_escaped_key_names_are_matched_by_their_decoded_value() -> None:
    # "\u0073ource" is "source" and "\u0069d" is "id" once the escapes are read.
    data = raw().replace(b'"source"', b'"\\u0073ource"').replace(b'"id"', b'"\\u0069d"')
    event = decode_event(data)
    assert event.source == "transport-websocket-01"
    assert event.id == EVENT_ID
    assert event.extra == {}
    assert encode_event(event) == data


def test_escapes_in_header_strings_are_decoded() -> None:
    data = raw(source="@@").replace(b'"@@"', b'"a\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00\\n"')
    assert decode_event(data).source == 'a"b\\c/dé😀\n'


def test_raw_unicode_in_header_strings_is_decoded() -> None:
    data = json.dumps(wire(source="傳輸-é-😀"), ensure_ascii=False).encode()
    assert decode_event(data).source == "傳輸-é-😀"


def test_surrounding_whitespace_is_allowed() -> None:
    event = decode_event(b" \t\r\n" + raw() + b"\r\n ")
    assert event.id == EVENT_ID


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_bytes_bytearray_and_memoryview(kind: Any) -> None:
    data = raw(parentId=PARENT_ID)
    event = decode_event(kind(data))
    assert event.parent_id == PARENT_ID
    assert encode_event(event) == data


def test_decode_accepts_a_memoryview_slice() -> None:
    data = raw()
    view = memoryview(b"junk" + data + b"junk")[4 : 4 + len(data)]
    assert encode_event(decode_event(view)) == data


def test_a_decoded_event_does_not_depend_on_the_input_buffer() -> None:
    buffer = bytearray(raw())
    event = decode_event(buffer)
    buffer[:] = b"x" * len(buffer)
    assert event.id == EVENT_ID
    assert event.payload == wire()["payload"]
    assert encode_event(event) == raw()


def test_decode_refuses_str_with_type_error() -> None:
    with pytest.raises(TypeError):
        decode_event(raw().decode())  # type: ignore[arg-type]


# --- decode -> encode is byte-identical -------------------------------------------------------

ROUND_TRIP_CASES = {
    "compact": json.dumps(wire(), separators=(",", ":")).encode(),
    "odd whitespace": (
        b'{ "id" :"' + EVENT_ID.encode() + b'" ,\n\t"timestamp":1700000000000 ,'
        b'\r\n  "traceId"  :  "t" , "source":"s","sessionId"   :"x",'
        b' "priority" : 0 ,"type":"KERNEL:TICK_START","payload":{ "a" :[ 1 , 2 ] }\n}'
    ),
    "reversed key order": json.dumps(dict(reversed(list(wire().items())))).encode(),
    "unknown fields": raw(
        zeta={"nested": [1, 2.50, "x"]}, version=3, tags=["a", "b"], flag=None, **{"x-y": True}
    ).replace(b"2.5", b"2.50"),
    "escapes": (
        raw(source="@@", payload="##")
        .replace(b'"@@"', b'"a\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00\\b\\f\\n\\r\\t\\u0000"')
        .replace(b'"##"', b'{"k\\u00e9y": "v\\u2028\\"", "\\n": "\\\\"}')
    ),
    "raw unicode": json.dumps(
        wire(source="傳輸-01", payload={"text": "天氣 😀 é", "ключ": "значение"}),
        ensure_ascii=False,
    ).encode(),
    "big numbers": raw(payload="@@").replace(
        b'"@@"',
        b"[123456789012345678901234567890, -1e300, 1.000000000000000000000001, 0.1e-999,"
        b" 18446744073709551616, -9223372036854775809, 1E+2, 0]",
    ),
    "nested payload": raw(payload={"a": [{"b": [{"c": [[[[{"d": None}]]]]}]}], "e": {}}),
    "deep but within limits": raw(payload="@@").replace(b'"@@"', b"[" * 60 + b"]" * 60),
    "parent id": raw(parentId=PARENT_ID),
    "parent id first": json.dumps({"parentId": PARENT_ID, **wire()}).encode(),
    "null payload": raw(payload=None),
    "string payload": raw(payload="just text"),
    "empty containers": raw(payload={"a": [], "b": {}, "c": ""}),
}


@pytest.mark.parametrize("data", list(ROUND_TRIP_CASES.values()), ids=list(ROUND_TRIP_CASES))
def test_decode_then_encode_is_byte_identical(data: bytes) -> None:
    assert encode_event(decode_event(data)) == data


@pytest.mark.parametrize("data", list(ROUND_TRIP_CASES.values()), ids=list(ROUND_TRIP_CASES))
def test_decoded_fields_agree_with_the_json_module(data: bytes) -> None:
    event = decode_event(data)
    expected = json.loads(data)
    assert event.id == expected.pop("id")
    assert event.timestamp == expected.pop("timestamp")
    assert event.trace_id == expected.pop("traceId")
    assert event.source == expected.pop("source")
    assert event.session_id == expected.pop("sessionId")
    assert event.priority == expected.pop("priority")
    assert event.type == expected.pop("type")
    assert event.parent_id == expected.pop("parentId", None)
    assert event.payload == expected.pop("payload")
    assert event.extra == expected


# Payloads the decoder skips in one pass (and hands to the checked scanner when
# it meets anything else): strings with escapes, raw UTF-8 and control
# characters, numbers of every shape, containers nested a few levels.
_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=12)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _payload_wire(value: Any, style: int) -> bytes:
    if style == 0:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if style == 1:
        return json.dumps(value).encode()
    return json.dumps(value, indent="\t").encode()


@settings(max_examples=300, deadline=None)
@given(value=_JSON_VALUES, style=st.integers(0, 2))
def test_any_json_payload_decodes_like_the_json_module_and_round_trips(
    value: Any, style: int
) -> None:
    payload = _payload_wire(value, style)
    data = raw(payload="@@").replace(b'"@@"', payload)
    event = decode_event(data)
    assert event.payload_json == payload
    assert event.payload == json.loads(payload)
    assert encode_event(event) == data


@settings(max_examples=400, deadline=None)
@given(
    value=_JSON_VALUES,
    style=st.integers(0, 2),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(b'{}[]:,"\\ 0-.eE\x01\x80\xfftfn')),
        min_size=1,
        max_size=3,
    ),
)
def test_a_damaged_payload_is_refused_or_read_as_the_json_module_reads_it(
    value: Any, style: int, edits: list[tuple[int, int]]
) -> None:
    payload = bytearray(_payload_wire(value, style))
    for at, byte in edits:
        payload[at % len(payload)] = byte
    data = raw(payload="@@").replace(b'"@@"', bytes(payload))
    event: Event | None = None
    message = ""
    try:
        event = decode_event(data)
    except DecodeError as e:
        message = str(e)
    if event is None:
        # Every refusal names where it happened.
        assert "at byte" in message or "field" in message
        return
    # Accepted: the payload is JSON, and reads as the json module reads it.
    assert event.payload == json.loads(event.payload_json)
    assert encode_event(event) == data


# --- Event.new and child ----------------------------------------------------------------------


def test_new_fills_id_timestamp_and_trace_id() -> None:
    before = now_ms()
    event = Event.new(
        "INPUT:USER_MESSAGE", {"text": "hi"}, source="transport-websocket-01", session_id="s-1"
    )
    after = now_ms()
    assert_uuid4(event.id)
    assert before <= event.timestamp <= after + 1
    assert isinstance(event.trace_id, str)
    assert event.trace_id
    assert event.source == "transport-websocket-01"
    assert event.session_id == "s-1"
    assert event.priority == DEFAULT_PRIORITY == 2
    assert event.type == "INPUT:USER_MESSAGE"
    assert event.payload == {"text": "hi"}
    assert event.parent_id is None
    assert event.extra == {}


def test_new_gives_fresh_ids_and_trace_ids() -> None:
    events = [new_event() for _ in range(100)]
    assert len({e.id for e in events}) == 100
    assert len({e.trace_id for e in events}) == 100


def test_new_keeps_a_given_trace_id_parent_id_and_priority() -> None:
    event = new_event({"x": 1}, priority=0, trace_id="trace-given", parent_id=PARENT_ID)
    assert event.trace_id == "trace-given"
    assert event.parent_id == PARENT_ID
    assert event.priority == 0


def test_new_payload_defaults_to_none() -> None:
    event = Event.new("KERNEL:TICK_START", source="core", session_id="s")
    assert event.payload is None
    assert json.loads(encode_event(event))["payload"] is None


def test_new_event_encodes_with_the_exact_wire_names() -> None:
    event = new_event({"text": "hi"})
    assert set(json.loads(encode_event(event))) == WIRE_FIELDS
    with_parent = new_event({"text": "hi"}, parent_id=PARENT_ID)
    assert set(json.loads(encode_event(with_parent))) == WIRE_FIELDS | {"parentId"}


def test_new_event_encodes_then_decodes_to_equal_fields() -> None:
    event = new_event({"text": "hi", "n": [1, 2.5, None]}, priority=4, parent_id=PARENT_ID)
    data = encode_event(event)
    back = decode_event(data)
    assert back == event
    assert hash(back) == hash(event)
    for name in ("id", "timestamp", "trace_id", "source", "session_id", "priority", "type"):
        assert getattr(back, name) == getattr(event, name), name
    assert back.parent_id == PARENT_ID
    assert back.payload == event.payload
    assert back.payload_json == event.payload_json
    assert encode_event(back) == data


def test_new_event_payload_json_is_its_encoded_payload() -> None:
    event = new_event({"a": [1, "two", None]})
    assert json.loads(event.payload_json) == {"a": [1, "two", None]}


def test_new_event_does_not_follow_later_changes_to_the_payload_passed_in() -> None:
    payload: dict[str, Any] = {"a": 1}
    event = new_event(payload)
    data = encode_event(event)
    payload["a"] = 2
    payload["b"] = 3
    assert encode_event(event) == data
    assert json.loads(data)["payload"] == {"a": 1}


@pytest.mark.parametrize(
    "payload",
    [
        {"text": "hi"},
        [1, "two", 3.5, None, True],
        'plain text with "quotes", \\ and é 😀 \u2028 \x00 \x1f',
        "",
        0,
        -1,
        2**63 - 1,
        2**63,
        2**64,
        -(2**64) - 1,
        2**200,
        -(2**200),
        0.1,
        -0.0,
        1.0,
        1e300,
        5e-324,
        1.7976931348623157e308,
        True,
        False,
        None,
        {},
        [],
        {"nested": {"list": [{"deep": [[[[None]]]]}], "n": 2**70, "f": 1e-7}},
        {"": "", "é": "😀", "a\nb": '"\\'},
    ],
    ids=repr,
)
def test_payload_round_trips_through_new_encode_decode(payload: Any) -> None:
    event = new_event(payload)
    assert event.payload == payload
    back = decode_event(encode_event(event)).payload
    assert back == payload
    assert type(back) is type(payload)
    if isinstance(payload, float):
        assert math.copysign(1.0, back) == math.copysign(1.0, payload)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), {"x": [float("nan")]}])
def test_new_refuses_payloads_json_cannot_carry(bad: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - DecodeError or a plain ValueError are both fine
        new_event(bad)


def test_new_refuses_a_payload_that_is_not_json() -> None:
    with pytest.raises((TypeError, ValueError)):
        new_event({"x": object()})


def test_new_refuses_a_lone_surrogate_in_a_payload_string() -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - UnicodeEncodeError is a ValueError too
        new_event("\ud800")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"type": "input:user_message"},
        {"type": "INPUT"},
        {"priority": 6},
        {"priority": -1},
        {"source": ""},
        {"session_id": ""},
        {"trace_id": ""},
    ],
    ids=repr,
)
def test_new_validates_like_the_decoder(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"type": "INPUT:USER_MESSAGE", "source": "cli", "session_id": "s"}
    args.update(kwargs)
    event_type = args.pop("type")
    with pytest.raises(ValueError):  # noqa: PT011 - DecodeError or a plain ValueError are both fine
        Event.new(event_type, None, **args)


def test_child_inherits_trace_and_session_and_records_its_parent() -> None:
    parent = new_event({"text": "weather?"}, priority=1)
    before = now_ms()
    child = parent.child("EXEC:TOOL_CALL", {"name": "get_weather"})
    after = now_ms()
    assert_uuid4(child.id)
    assert child.id != parent.id
    assert child.trace_id == parent.trace_id
    assert child.session_id == parent.session_id
    assert child.parent_id == parent.id
    assert child.source == parent.source
    assert child.priority == parent.priority == 1
    assert child.type == "EXEC:TOOL_CALL"
    assert child.payload == {"name": "get_weather"}
    assert before <= child.timestamp <= after + 1
    assert json.loads(encode_event(child))["parentId"] == parent.id


def test_child_takes_a_given_source_and_priority() -> None:
    parent = new_event(priority=3)
    child = parent.child("EXEC:TOOL_RESULT", {"ok": True}, source="fs-plugin", priority=0)
    assert child.source == "fs-plugin"
    assert child.priority == 0
    assert child.trace_id == parent.trace_id


def test_child_of_a_decoded_event_and_grandchildren_share_the_trace() -> None:
    root = decode_event(raw())
    child = root.child("KERNEL:TICK_START")
    grandchild = child.child("EXEC:TOOL_CALL", {"name": "read"})
    assert child.payload is None
    assert child.parent_id == root.id == EVENT_ID
    assert grandchild.parent_id == child.id
    assert {root.trace_id, child.trace_id, grandchild.trace_id} == {"trace-7f3a"}
    assert {root.session_id, child.session_id, grandchild.session_id} == {"session-42"}


def test_child_validates_its_type_and_priority() -> None:
    parent = new_event()
    with pytest.raises(ValueError):  # noqa: PT011
        parent.child("not a type")
    with pytest.raises(ValueError):  # noqa: PT011
        parent.child("EXEC:TOOL_CALL", priority=6)


# --- the full constructor ---------------------------------------------------------------------


def full_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "id": EVENT_ID,
        "timestamp": 1_700_000_000_000,
        "trace_id": "trace-1",
        "source": "cli",
        "session_id": "s-1",
        "priority": 3,
        "type": "KERNEL:STATE_CHANGE",
        "payload": {"from": "IDLE", "to": "EXECUTING"},
    }
    kwargs.update(overrides)
    return kwargs


def test_constructor_sets_every_field() -> None:
    event = Event(**full_kwargs(parent_id=PARENT_ID))
    assert event.id == EVENT_ID
    assert event.timestamp == 1_700_000_000_000
    assert event.trace_id == "trace-1"
    assert event.source == "cli"
    assert event.session_id == "s-1"
    assert event.priority == 3
    assert event.type == "KERNEL:STATE_CHANGE"
    assert event.payload == {"from": "IDLE", "to": "EXECUTING"}
    assert event.parent_id == PARENT_ID
    assert json.loads(encode_event(event)) == {
        "id": EVENT_ID,
        "timestamp": 1_700_000_000_000,
        "traceId": "trace-1",
        "source": "cli",
        "sessionId": "s-1",
        "priority": 3,
        "type": "KERNEL:STATE_CHANGE",
        "payload": {"from": "IDLE", "to": "EXECUTING"},
        "parentId": PARENT_ID,
    }


def test_constructor_payload_defaults_to_none() -> None:
    kwargs = full_kwargs()
    del kwargs["payload"]
    assert Event(**kwargs).payload is None


def test_constructed_event_round_trips() -> None:
    event = Event(**full_kwargs())
    back = decode_event(encode_event(event))
    assert back == event
    assert back.to_dict() == event.to_dict()


@pytest.mark.parametrize(
    "overrides",
    [
        {"priority": 6},
        {"priority": -1},
        {"id": ""},
        {"source": ""},
        {"session_id": ""},
        {"trace_id": ""},
        {"type": "input:user_message"},
        {"type": "INPUT"},
        {"type": "INPUT:"},
        {"type": ":X"},
        {"type": "INPUT:USER MESSAGE"},
        {"payload": float("nan")},
    ],
    ids=repr,
)
def test_constructor_validates_like_the_decoder(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - DecodeError or a plain ValueError are both fine
        Event(**full_kwargs(**overrides))


@pytest.mark.parametrize(
    "overrides",
    [{"priority": "2"}, {"timestamp": "1"}, {"id": 5}, {"source": None}, {"type": 1}],
    ids=repr,
)
def test_constructor_refuses_wrong_python_types(overrides: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        Event(**full_kwargs(**overrides))


@pytest.mark.parametrize("field", ["timestamp", "priority"])
@pytest.mark.parametrize("value", [True, False])
def test_constructor_refuses_bools_for_integer_fields(field: str, value: bool) -> None:
    # The decoder refuses ``true`` for both fields; the constructor validates the same way.
    with pytest.raises((TypeError, ValueError)):
        Event(**full_kwargs(**{field: value}))


def test_constructor_needs_every_header_field() -> None:
    kwargs = full_kwargs()
    del kwargs["source"]
    with pytest.raises(TypeError):
        Event(**kwargs)


# --- value semantics --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "id",
        "timestamp",
        "trace_id",
        "source",
        "session_id",
        "priority",
        "type",
        "parent_id",
        "payload",
        "payload_json",
        "extra",
        "not_an_attribute",
    ],
)
def test_events_are_immutable(name: str) -> None:
    event = decode_event(raw())
    with pytest.raises(AttributeError):
        setattr(event, name, "changed")
    with pytest.raises(AttributeError):
        delattr(event, name)
    assert encode_event(event) == raw()


def test_equal_events_hash_equal_and_work_in_sets_and_dicts() -> None:
    a = decode_event(raw())
    b = decode_event(raw())
    other = decode_event(raw(id=PARENT_ID))
    assert a == b
    assert hash(a) == hash(b)
    assert a != other
    assert {a, b, other} == {a, other}
    assert len({a, b, other}) == 2
    table = {a: "first"}
    assert table[b] == "first"
    assert other not in table


def test_new_events_are_equal_only_to_themselves() -> None:
    a = new_event({"x": 1})
    b = new_event({"x": 1})
    assert a == a
    assert a != b
    assert len({a, b}) == 2


def test_events_are_not_equal_to_other_types() -> None:
    event = decode_event(raw())
    assert event != EVENT_ID
    assert event != wire()
    assert event != raw()
    assert event is not None


def test_to_dict_uses_wire_names() -> None:
    event = decode_event(raw())
    assert event.to_dict() == wire()
    assert "parentId" not in event.to_dict()
    with_parent = decode_event(raw(parentId=PARENT_ID))
    assert with_parent.to_dict() == wire(parentId=PARENT_ID)


def test_to_dict_of_a_new_event_matches_its_encoding() -> None:
    event = new_event({"a": [1, 2]}, parent_id=PARENT_ID)
    assert event.to_dict() == json.loads(encode_event(event))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip(protocol: int) -> None:
    event = decode_event(raw(parentId=PARENT_ID, zeta={"kept": [1, 2]}))
    back = pickle.loads(pickle.dumps(event, protocol=protocol))
    assert isinstance(back, Event)
    assert back == event
    assert hash(back) == hash(event)
    assert encode_event(back) == encode_event(event)
    assert back.extra == event.extra == {"zeta": {"kept": [1, 2]}}
    assert back.parent_id == PARENT_ID


@pytest.mark.parametrize(
    ("payload_wire", "limits"),
    [
        (b"[" * 100 + b"]" * 100, {"max_depth": 200}),
        (b'"' + b"x" * (2 * 1024 * 1024) + b'"', {"max_bytes": 4 * 1024 * 1024}),
    ],
    ids=["deeper than the default depth", "larger than the default size"],
)
def test_pickle_of_an_event_decoded_with_raised_limits(
    payload_wire: bytes, limits: dict[str, int]
) -> None:
    # A decoded event is valid whatever limits admitted it; copying it must not re-apply defaults.
    data = raw(payload="@@").replace(b'"@@"', payload_wire)
    event = decode_event(data, **limits)
    back = pickle.loads(pickle.dumps(event))
    assert back == event
    assert encode_event(back) == data
    assert copy.deepcopy(event) == event


def test_pickle_of_a_new_event() -> None:
    event = new_event({"n": 2**80})
    back = pickle.loads(pickle.dumps(event))
    assert back == event
    assert back.payload == {"n": 2**80}
    assert back.timestamp == event.timestamp


def test_copy_and_deepcopy() -> None:
    event = decode_event(raw())
    assert copy.copy(event) == event
    deep = copy.deepcopy(event)
    assert deep == event
    assert encode_event(deep) == encode_event(event)


def test_reduce_carries_the_wire_bytes() -> None:
    event = decode_event(raw())
    _, args = event.__reduce__()
    assert args == (raw(),)


# --- properties -------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"))
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=8), children, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(payload=json_values)
def test_any_json_payload_round_trips(payload: Any) -> None:
    event = new_event(payload)
    data = encode_event(event)
    assert json.loads(data)["payload"] == payload
    back = decode_event(data)
    assert back.payload == payload
    assert encode_event(back) == data


@settings(max_examples=200, deadline=None)
@given(payload=json_values, ensure_ascii=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_any_json_written_by_the_json_module_decodes_and_re_encodes_identically(
    payload: Any, ensure_ascii: bool, indent: int | None
) -> None:
    data = json.dumps(wire(payload=payload), ensure_ascii=ensure_ascii, indent=indent).encode()
    event = decode_event(data)
    assert event.payload == payload
    assert encode_event(event) == data


def test_many_unknown_fields_decode_and_a_repeat_among_them_is_refused() -> None:
    head = envelope_line()[:-1]
    body = b"".join(b',"k%d":0' % i for i in range(50_000))
    event = decode_event(head + body + b"}", max_bytes=1 << 22)
    assert len(event.extra) == 50_000
    with pytest.raises(DecodeError, match="duplicate") as info:
        decode_event(head + body + b',"k0":1}', max_bytes=1 << 22)
    assert info.value.field == "k0"


def test_a_cycle_through_a_decoded_payload_is_collected() -> None:
    sentinel = Sentinel()
    alive = weakref.ref(sentinel)
    event = decode_event(envelope_line())
    event.payload["sentinel"] = sentinel
    event.payload["self"] = event
    del event, sentinel
    gc.collect()
    assert alive() is None


def test_an_event_whose_payload_was_never_read_stays_out_of_the_collector() -> None:
    event = decode_event(envelope_line())
    assert not gc.is_tracked(event)
    assert event.payload == {"text": "hi"}
    assert gc.is_tracked(event)


@pytest.mark.parametrize("levels", [62, 63])
def test_what_an_event_is_built_with_decodes_back(levels: int) -> None:
    """The payload sits one level inside the envelope: builders count it so."""
    event = Event.new("A:B", nested(levels), source="s", session_id="x")
    assert decode_event(encode_event(event)).payload == nested(levels)


def test_a_payload_too_deep_to_decode_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="nesting"):
        Event.new("A:B", nested(64), source="s", session_id="x")


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


def test_a_bytearray_is_copied_so_later_changes_do_not_reach_the_event() -> None:
    buffer = bytearray(envelope_line())
    event = decode_event(buffer)
    buffer[:] = b"x" * len(buffer)
    assert event.session_id == "s-1"
    assert decode_event(memoryview(envelope_line())[:]).id == ENVELOPE["id"]


def test_a_cycle_through_a_list_payload_is_collected() -> None:
    sentinel = Sentinel()
    alive = weakref.ref(sentinel)
    event = decode_event(envelope_line(payload=[1, 2]))
    event.payload.append(sentinel)
    event.payload.append(event)
    del event, sentinel
    gc.collect()
    assert alive() is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="only a POSIX process can fork")
def test_a_forked_child_makes_ids_of_its_own() -> None:
    # The parent has made ids (its generator is seeded): the child, a copy of
    # it, must not make the ids the parent makes next.
    Event.new("X:Y", None, source="s", session_id="s")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        ids = [Event.new("X:Y", None, source="s", session_id="s").id for _ in range(4)]
        event = Event.new("X:Y", None, source="s", session_id="s")
        ids += [event.trace_id, event.child("X:Z").id]
        os.write(write, "\n".join(ids).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        theirs = set(pipe.read().split("\n"))
    assert status == 0
    assert len(theirs) == 6
    mine = [Event.new("X:Y", None, source="s", session_id="s").id for _ in range(4)]
    event = Event.new("X:Y", None, source="s", session_id="s")
    mine += [event.trace_id, event.child("X:Z").id]
    assert theirs.isdisjoint(mine)


def test_a_made_events_flat_payload_is_a_snapshot_equal_to_its_decoding() -> None:
    given: dict[str, Any] = {
        "text": "héllo\u2028",
        "n": -(2**70),
        "x": -0.0,
        "ok": True,
        "no": None,
    }
    event = Event.new("INPUT:USER_MESSAGE", given, source="s", session_id="s")
    given["text"] = "changed after"  # the event keeps what it was made with
    decoded = decode_event(encode_event(event))
    assert event.payload == decoded.payload
    assert [type(v) for v in event.payload.values()] == [type(v) for v in decoded.payload.values()]
    assert math.copysign(1.0, event.payload["x"]) == -1.0
    assert event.payload["text"] == "héllo\u2028"
    # Not flat (a nested object, a subclass of str): decoded from the envelope, as always.
    nested = Event.new("X:Y", {"a": {"b": 1}}, source="s", session_id="s")
    assert nested.payload == {"a": {"b": 1}}

    class Name(str):
        pass

    named = Event.new("X:Y", {"a": Name("b")}, source="s", session_id="s")
    assert type(named.payload["a"]) is str
