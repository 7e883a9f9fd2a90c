"""``ProviderResponse``, ``ContentSegment``, ``ToolCall`` (spec 000 section 3) and their codec."""

from __future__ import annotations

import gc
import json
import uuid
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envelopes import Sentinel, nested
from openstarry.core import (
    ContentSegment,
    ProviderResponse,
    ToolCall,
    decode_response,
    encode_response,
)
from openstarry.errors import DecodeError, OpenStarryError

# The example of spec 000 section 5, as written there.
SPEC_EXAMPLE = b"""{
  "segments": [
    { "type": "text", "text": "Sure, let me check." },
    { "type": "tool_call", "toolCall": { "name": "get_weather", "args": { "location": "Taipei" } } }
  ]
}"""


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def decode_error(data: bytes, field: str | None = None, **kwargs: Any) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode_response(data, **kwargs)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, OpenStarryError)
    assert str(err)
    assert err.field is not None or err.offset is not None
    if field is not None:
        assert err.field == field, str(err)
        assert field in str(err)
    return err


def assert_uuid4(value: str) -> None:
    parsed = uuid.UUID(value)
    assert parsed.version == 4
    assert parsed.variant == uuid.RFC_4122


# --- decoding ---------------------------------------------------------------------------------


def test_spec_example_decodes_to_a_text_and_a_tool_call_segment() -> None:
    response = decode_response(SPEC_EXAMPLE)
    text, call = response.segments
    assert text.type == "text"
    assert text.text == "Sure, let me check."
    assert text.tool_call is None
    assert text.data is None
    assert text.mime_type is None
    assert call.type == "tool_call"
    assert call.text is None
    assert call.tool_call is not None
    assert call.tool_call.name == "get_weather"
    assert call.tool_call.args == {"location": "Taipei"}
    assert_uuid4(call.tool_call.id)
    assert response.metadata is None


def test_a_generated_tool_call_id_is_fresh_each_time() -> None:
    ids = set()
    for _ in range(20):
        tool_call = decode_response(SPEC_EXAMPLE).segments[1].tool_call
        assert tool_call is not None
        ids.add(tool_call.id)
    assert len(ids) == 20


def test_a_generated_tool_call_id_is_written_out() -> None:
    response = decode_response(SPEC_EXAMPLE)
    tool_call = response.segments[1].tool_call
    assert tool_call is not None
    encoded = json.loads(encode_response(response))
    assert encoded["segments"][1]["toolCall"]["id"] == tool_call.id
    assert decode_response(encode_response(response)) == response


def test_a_given_tool_call_id_is_kept() -> None:
    data = dumps(
        {"segments": [{"type": "tool_call", "toolCall": {"id": "call_abc123", "name": "read"}}]}
    )
    tool_call = decode_response(data).segments[0].tool_call
    assert tool_call is not None
    assert tool_call.id == "call_abc123"


def test_missing_args_are_an_empty_object() -> None:
    data = dumps({"segments": [{"type": "tool_call", "toolCall": {"id": "c", "name": "stop"}}]})
    tool_call = decode_response(data).segments[0].tool_call
    assert tool_call is not None
    assert tool_call.args == {}


def test_args_given_as_a_json_string_are_parsed() -> None:
    args = json.dumps({"location": "Taipei", "days": [1, 2], "unit": None})
    data = dumps({"segments": [{"type": "tool_call", "toolCall": {"name": "w", "args": args}}]})
    tool_call = decode_response(data).segments[0].tool_call
    assert tool_call is not None
    assert tool_call.args == {"location": "Taipei", "days": [1, 2], "unit": None}
    encoded = json.loads(encode_response(decode_response(data)))
    assert encoded["segments"][0]["toolCall"]["args"] == tool_call.args


@pytest.mark.parametrize("args", ["{", "not json", "{'a': 1}", '{"a": NaN}', '{"a": 1} x', ""])
def test_args_string_that_is_not_json_is_a_decode_error(args: str) -> None:
    data = dumps(
        {
            "segments": [
                {"type": "text", "text": "x"},
                {"type": "tool_call", "toolCall": {"name": "w", "args": args}},
            ]
        }
    )
    decode_error(data, "segments[1].toolCall.args")


@pytest.mark.parametrize(
    "args", [{"a": 1}, [1, 2], 3, 2.5, True, None, {"deep": {"x": [None, {"y": "z"}]}}], ids=repr
)
def test_args_of_any_json_type_are_kept(args: Any) -> None:
    data = dumps({"segments": [{"type": "tool_call", "toolCall": {"name": "w", "args": args}}]})
    tool_call = decode_response(data).segments[0].tool_call
    assert tool_call is not None
    assert tool_call.args == args or (args is None and tool_call.args in (None, {}))


def test_a_tool_call_segment_without_a_name_names_the_field() -> None:
    data = dumps(
        {
            "segments": [
                {"type": "text", "text": "Sure, let me check."},
                {"type": "tool_call", "toolCall": {"args": {"location": "Taipei"}}},
            ]
        }
    )
    decode_error(data, "segments[1].toolCall.name")


@pytest.mark.parametrize("name", [None, 3, ["get_weather"], {"n": 1}], ids=repr)
def test_a_tool_call_name_that_is_not_a_string(name: Any) -> None:
    data = dumps({"segments": [{"type": "tool_call", "toolCall": {"name": name}}]})
    decode_error(data, "segments[0].toolCall.name")


@pytest.mark.parametrize("tool_call", [None, "get_weather", [], 1], ids=repr)
def test_a_tool_call_segment_without_a_tool_call_object(tool_call: Any) -> None:
    segment: dict[str, Any] = {"type": "tool_call"}
    if tool_call is not None:
        segment["toolCall"] = tool_call
    decode_error(dumps({"segments": [segment]}), "segments[0].toolCall")


def test_a_tool_call_id_that_is_not_a_string() -> None:
    data = dumps({"segments": [{"type": "tool_call", "toolCall": {"id": 5, "name": "w"}}]})
    decode_error(data, "segments[0].toolCall.id")


def test_a_text_segment_without_text() -> None:
    data = dumps({"segments": [{"type": "text", "text": "a"}, {"type": "text"}]})
    decode_error(data, "segments[1].text")


@pytest.mark.parametrize("text", [None, 1, ["a"]], ids=repr)
def test_a_text_that_is_not_a_string(text: Any) -> None:
    decode_error(dumps({"segments": [{"type": "text", "text": text}]}), "segments[0].text")


def test_an_empty_text_is_still_text() -> None:
    response = decode_response(dumps({"segments": [{"type": "text", "text": ""}]}))
    assert response.segments[0].text == ""


@pytest.mark.parametrize("kind", ["image", "audio", "video"])
def test_media_segments_need_data(kind: str) -> None:
    data = dumps({"segments": [{"type": kind, "mimeType": "application/octet-stream"}]})
    decode_error(data, "segments[0].data")


@pytest.mark.parametrize(
    ("kind", "mime"), [("image", "image/png"), ("audio", "audio/mp3"), ("video", "video/mp4")]
)
def test_media_segments_with_data_and_mime_type(kind: str, mime: str) -> None:
    wire = {"segments": [{"type": kind, "data": "aGVsbG8=", "mimeType": mime}]}
    response = decode_response(dumps(wire))
    segment = response.segments[0]
    assert segment.type == kind
    assert segment.data == "aGVsbG8="
    assert segment.mime_type == mime
    assert json.loads(encode_response(response)) == wire


def test_a_media_segment_may_carry_a_url_without_a_mime_type() -> None:
    wire = {"segments": [{"type": "image", "data": "https://example.com/a.png"}]}
    response = decode_response(dumps(wire))
    assert response.segments[0].mime_type is None
    assert json.loads(encode_response(response)) == wire


@pytest.mark.parametrize("ui", [{"component": "card", "props": {"title": "x"}}, [1], "raw", 0])
def test_ui_segment_carries_any_json(ui: Any) -> None:
    wire = {"segments": [{"type": "ui", "ui": ui}]}
    response = decode_response(dumps(wire))
    assert response.segments[0].type == "ui"
    assert response.segments[0].ui == ui
    assert json.loads(encode_response(response)) == wire


@pytest.mark.parametrize(
    "kind", ["TEXT", "Text", "toolCall", "tool-call", "file", "", "json", "markdown"]
)
def test_an_unknown_segment_type(kind: str) -> None:
    data = dumps({"segments": [{"type": "text", "text": "a"}, {"type": kind, "text": "x"}]})
    decode_error(data, "segments[1].type")


@pytest.mark.parametrize("kind", [None, 1, ["text"]], ids=repr)
def test_a_segment_type_that_is_not_a_string(kind: Any) -> None:
    decode_error(dumps({"segments": [{"type": kind, "text": "x"}]}), "segments[0].type")


def test_a_segment_without_a_type() -> None:
    decode_error(dumps({"segments": [{"text": "x"}]}), "segments[0].type")


@pytest.mark.parametrize("segment", [None, "text", 1, [{"type": "text"}]], ids=repr)
def test_a_segment_that_is_not_an_object(segment: Any) -> None:
    decode_error(dumps({"segments": [segment]}), "segments[0]")


def test_missing_segments() -> None:
    decode_error(dumps({"metadata": {}}), "segments")


@pytest.mark.parametrize("segments", [None, {}, "text", 1], ids=repr)
def test_segments_that_are_not_a_list(segments: Any) -> None:
    decode_error(dumps({"segments": segments}), "segments")


def test_empty_segments_are_fine() -> None:
    response = decode_response(b'{"segments": []}')
    assert response.segments == []
    assert json.loads(encode_response(response))["segments"] == []


@pytest.mark.parametrize(
    "data",
    [b"", b"   ", b"[]", b"null", b'"segments"', b"{", b'{"segments": [}', b'{"segments": []} x'],
    ids=repr,
)
def test_malformed_json(data: bytes) -> None:
    decode_error(data)


def test_every_prefix_of_the_spec_example_is_a_decode_error() -> None:
    for end in range(len(SPEC_EXAMPLE)):
        err = decode_error(SPEC_EXAMPLE[:end])
        assert err.offset is not None


def test_duplicate_segments_key() -> None:
    decode_error(b'{"segments": [], "segments": []}', "segments")


def test_limits_are_honoured() -> None:
    decode_error(SPEC_EXAMPLE, max_bytes=len(SPEC_EXAMPLE) - 1)
    assert len(decode_response(SPEC_EXAMPLE, max_bytes=len(SPEC_EXAMPLE)).segments) == 2
    deep = b'{"segments": [], "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    decode_error(deep, max_bytes=len(deep))
    nested = b'{"segments": [], "metadata": ' + b"[" * 10 + b"]" * 10 + b"}"
    assert decode_response(nested, max_depth=20).metadata is not None
    decode_error(nested, max_depth=5)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_bytes_like_inputs(kind: Any) -> None:
    assert len(decode_response(kind(SPEC_EXAMPLE)).segments) == 2


def test_invalid_utf8_and_lone_surrogates_are_refused() -> None:
    decode_error(b'{"segments": [{"type": "text", "text": "a\xffb"}]}')
    decode_error(b'{"segments": [{"type": "text", "text": "a\\ud800b"}]}')


# --- metadata and unknown fields --------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        {"usage": {"input_tokens": 12, "output_tokens": 34}, "latency_ms": 812.5},
        [1, "two", None],
        "string",
        42,
        2**80,
        1.5,
        True,
        None,
    ],
    ids=repr,
)
def test_metadata_is_any_json(metadata: Any) -> None:
    response = decode_response(dumps({"segments": [], "metadata": metadata}))
    assert response.metadata == metadata
    again = decode_response(encode_response(response))
    assert again.metadata == metadata
    assert again == response


def test_unknown_top_level_fields_are_kept_on_re_encode() -> None:
    wire = json.loads(SPEC_EXAMPLE)
    wire["model"] = "gemini-1.5"
    wire["x-trace"] = {"a": [1, 2]}
    encoded = json.loads(encode_response(decode_response(dumps(wire))))
    assert encoded["model"] == "gemini-1.5"
    assert encoded["x-trace"] == {"a": [1, 2]}


def test_unknown_segment_fields_are_kept_on_re_encode() -> None:
    wire = {
        "segments": [{"type": "text", "text": "hi", "annotations": [{"start": 0}], "lang": "en"}]
    }
    encoded = json.loads(encode_response(decode_response(dumps(wire))))
    assert encoded == wire


def test_unknown_tool_call_fields_are_kept_on_re_encode() -> None:
    call = {"id": "c1", "name": "read", "args": {"path": "a.txt"}, "thoughtSignature": "abc"}
    wire = {"segments": [{"type": "tool_call", "toolCall": call}]}
    encoded = json.loads(encode_response(decode_response(dumps(wire))))
    assert encoded == wire


def test_a_full_response_round_trips_with_the_wire_names() -> None:
    wire = {
        "segments": [
            {"type": "text", "text": "Sure, let me check."},
            {"type": "tool_call", "toolCall": {"id": "c1", "name": "get_weather", "args": {}}},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "ui", "ui": {"component": "chart"}},
        ],
        "metadata": {"usage": {"total": 10}},
    }
    response = decode_response(dumps(wire))
    assert json.loads(encode_response(response)) == wire
    assert decode_response(encode_response(response)) == response


# --- constructors -----------------------------------------------------------------------------


def test_tool_call_constructor() -> None:
    call = ToolCall("get_weather", {"location": "Taipei"}, id="call_1")
    assert call.name == "get_weather"
    assert call.args == {"location": "Taipei"}
    assert call.id == "call_1"


def test_tool_call_defaults() -> None:
    call = ToolCall("stop")
    assert call.args == {}
    assert_uuid4(call.id)
    assert ToolCall("stop").id != call.id


def test_tool_call_parses_a_json_string_of_args() -> None:
    assert ToolCall("w", '{"location": "Taipei"}').args == {"location": "Taipei"}


@pytest.mark.parametrize("args", ["not json", "{", '{"a": NaN}', ""])
def test_tool_call_refuses_a_string_of_args_that_is_not_json(args: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - DecodeError or a plain ValueError
        ToolCall("w", args)


def test_tool_call_refuses_a_non_string_name() -> None:
    with pytest.raises((TypeError, ValueError)):
        ToolCall(None)  # type: ignore[arg-type]


def test_tool_call_args_must_be_json() -> None:
    with pytest.raises((TypeError, ValueError)):
        ToolCall("w", {"x": object()})
    with pytest.raises(ValueError):  # noqa: PT011
        ToolCall("w", {"x": float("nan")})


def test_tool_call_equality() -> None:
    assert ToolCall("w", {"a": 1}, id="1") == ToolCall("w", {"a": 1}, id="1")
    assert ToolCall("w", '{"a": 1}', id="1") == ToolCall("w", {"a": 1}, id="1")
    assert ToolCall("w", {"a": 1}, id="1") != ToolCall("w", {"a": 1}, id="2")
    assert ToolCall("w", {"a": 1}, id="1") != ToolCall("v", {"a": 1}, id="1")
    assert ToolCall("w", {"a": 1}, id="1") != ToolCall("w", {"a": 2}, id="1")
    assert ToolCall("w", id="1") != "w"


def test_segment_constructors() -> None:
    text = ContentSegment("text", text="hello")
    assert text.type == "text"
    assert text.text == "hello"
    call = ContentSegment("tool_call", tool_call=ToolCall("w", id="1"))
    assert call.tool_call == ToolCall("w", id="1")
    image = ContentSegment("image", data="aGk=", mime_type="image/png")
    assert (image.data, image.mime_type) == ("aGk=", "image/png")
    ui = ContentSegment("ui", ui={"component": "card"})
    assert ui.ui == {"component": "card"}


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("text", {}),
        ("text", {"data": "x"}),
        ("image", {}),
        ("audio", {"mime_type": "audio/mp3"}),
        ("video", {"text": "x"}),
        ("tool_call", {}),
        ("tool_call", {"text": "call w"}),
        ("bogus", {"text": "x"}),
        ("TEXT", {"text": "x"}),
    ],
    ids=repr,
)
def test_segment_constructor_applies_the_per_type_rules(kind: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - DecodeError or a plain ValueError
        ContentSegment(kind, **kwargs)


def test_segment_equality() -> None:
    assert ContentSegment("text", text="a") == ContentSegment("text", text="a")
    assert ContentSegment("text", text="a") != ContentSegment("text", text="b")
    assert ContentSegment("image", data="x") != ContentSegment("audio", data="x")
    assert ContentSegment("image", data="x", mime_type="image/png") != ContentSegment(
        "image", data="x"
    )
    assert ContentSegment("text", text="a") != "a"


def test_response_constructor_and_encoding() -> None:
    response = ProviderResponse(
        [
            ContentSegment("text", text="Sure, let me check."),
            ContentSegment(
                "tool_call", tool_call=ToolCall("get_weather", {"location": "Taipei"}, id="c1")
            ),
            ContentSegment("audio", data="UklGR", mime_type="audio/wav"),
        ],
        metadata={"latency_ms": 812},
    )
    assert len(response.segments) == 3
    assert response.metadata == {"latency_ms": 812}
    assert json.loads(encode_response(response)) == {
        "segments": [
            {"type": "text", "text": "Sure, let me check."},
            {
                "type": "tool_call",
                "toolCall": {"id": "c1", "name": "get_weather", "args": {"location": "Taipei"}},
            },
            {"type": "audio", "data": "UklGR", "mimeType": "audio/wav"},
        ],
        "metadata": {"latency_ms": 812},
    }
    assert decode_response(encode_response(response)) == response


def test_response_accepts_any_sequence_of_segments() -> None:
    segments = (ContentSegment("text", text="a"), ContentSegment("text", text="b"))
    assert ProviderResponse(segments) == ProviderResponse(list(segments))
    assert ProviderResponse([]).segments == []
    assert ProviderResponse([]).metadata is None


def test_response_refuses_segments_that_are_not_segments() -> None:
    with pytest.raises((TypeError, ValueError)):
        ProviderResponse([{"type": "text", "text": "a"}])  # type: ignore[list-item]


def test_response_equality() -> None:
    a = ProviderResponse([ContentSegment("text", text="a")], metadata={"m": 1})
    b = ProviderResponse([ContentSegment("text", text="a")], metadata={"m": 1})
    assert a == b
    assert a != ProviderResponse([ContentSegment("text", text="a")], metadata={"m": 2})
    assert a != ProviderResponse([ContentSegment("text", text="b")], metadata={"m": 1})
    assert a != ProviderResponse([], metadata={"m": 1})
    assert a != "response"


# --- properties -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=10),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
texts = st.text(st.characters(codec="utf-8"), max_size=20)
segments = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(
        lambda kind, data, mime: (
            {"type": kind, "data": data} | ({"mimeType": mime} if mime is not None else {})
        ),
        st.sampled_from(["image", "audio", "video"]),
        texts.filter(bool),
        st.none() | st.sampled_from(["image/png", "audio/mp3", "video/mp4"]),
    ),
    st.builds(
        lambda i, name, args: {
            "type": "tool_call",
            "toolCall": {"id": i, "name": name, "args": args},
        },
        texts.filter(bool),
        texts.filter(bool),
        st.dictionaries(texts, json_values, max_size=4),
    ),
    st.builds(lambda ui: {"type": "ui", "ui": ui}, json_values.filter(lambda v: v is not None)),
)


@settings(max_examples=300, deadline=None)
@given(segs=st.lists(segments, max_size=5), metadata=st.none() | json_values)
def test_any_valid_response_round_trips(segs: list[dict[str, Any]], metadata: Any) -> None:
    wire: dict[str, Any] = {"segments": segs}
    if metadata is not None:
        wire["metadata"] = metadata
    response = decode_response(json.dumps(wire).encode())
    encoded = encode_response(response)
    assert json.loads(encoded) == wire
    assert decode_response(encoded) == response


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        decode_response(data)
    except DecodeError:
        return


def test_many_unknown_response_fields_decode_and_a_repeat_is_refused() -> None:
    body = b"".join(b',"k%d":0' % i for i in range(50_000))
    assert decode_response(b'{"segments":[]' + body + b"}", max_bytes=1 << 22) is not None
    with pytest.raises(DecodeError, match="duplicate"):
        decode_response(b'{"segments":[]' + body + b',"k7":0}', max_bytes=1 << 22)


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


def test_args_given_as_a_json_string_must_hold_an_object() -> None:
    body = {"segments": [{"type": "tool_call", "toolCall": {"name": "f", "args": '"abc"'}}]}
    with pytest.raises(DecodeError, match="JSON object") as info:
        decode_response(json.dumps(body).encode())
    assert info.value.field == "segments[0].toolCall.args"
    with pytest.raises(ValueError, match="JSON object"):
        ToolCall("f", args='"hello"')
    assert ToolCall("f", args='{"a": 1}').args == {"a": 1}


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


# -- ProviderResponse.parts: the response as a turn reads it ----------------


def _parts_in_python(
    response: ProviderResponse,
) -> tuple[tuple[ToolCall, ...], str, tuple[ContentSegment, ...], Any, bool]:
    """What ``parts`` must equal, written out from the segments one by one."""
    calls = tuple(s.tool_call for s in response.segments if s.tool_call is not None)
    said = [s for s in response.segments if s.tool_call is None]
    thought = tuple(s for s in said if s.type == "reasoning")
    text = "".join(s.text for s in said if s.type != "reasoning" and s.text is not None)
    shown = []
    for s in said:
        if s.type == "reasoning":
            shown.append({"type": "reasoning", "text": s.text or ""})
            continue
        out: dict[str, Any] = {"type": s.type}
        for key, value in (("text", s.text), ("data", s.data), ("mimeType", s.mime_type)):
            if value is not None:
                out[key] = value
        if s.ui is not None:
            out["ui"] = s.ui
        shown.append(out)
    plain = (
        len(said) == 1
        and shown[0].keys() == {"type", "text"}
        and said[0].type == "text"
        and response.metadata is None
        and len(text) < 1 << 20
        and text.isascii()
    )
    return calls, text, thought, shown or None, plain


PARTS_CASES = [
    ProviderResponse([]),
    ProviderResponse([ContentSegment("text", text="done")]),
    ProviderResponse([ContentSegment("text", text="done")], {"usage": {"inputTokens": 3}}),
    ProviderResponse([ContentSegment("text", text="café")]),
    ProviderResponse([ContentSegment("text", text="x" * (1 << 20))]),
    ProviderResponse([ContentSegment("text", text="a", mime_type="text/markdown")]),
    ProviderResponse([ContentSegment("tool_call", tool_call=ToolCall("f", {"x": 1}))]),
    ProviderResponse(
        [
            ContentSegment("reasoning", text="think", signature="sig"),
            ContentSegment("text", text="Sure, "),
            ContentSegment("image", data="aGk=", mime_type="image/png"),
            ContentSegment("ui", ui={"kind": "card"}),
            ContentSegment("text", text="here."),
            ContentSegment("tool_call", tool_call=ToolCall("f", {"x": 1}, "c1")),
            ContentSegment("tool_call", tool_call=ToolCall("g", None, "c2")),
        ]
    ),
]


@pytest.mark.parametrize("response", PARTS_CASES, ids=range(len(PARTS_CASES)))
def test_parts_reads_the_segments_as_a_turn_does(response: ProviderResponse) -> None:
    calls, text, thought, said, plain = response.parts()
    assert type(calls) is tuple
    assert type(thought) is tuple
    assert (calls, text, thought, said, plain) == _parts_in_python(response)


def test_parts_of_a_plain_reply_and_of_a_call() -> None:
    assert ProviderResponse([ContentSegment("text", text="done")]).parts() == (
        (),
        "done",
        (),
        [{"type": "text", "text": "done"}],
        True,
    )
    call = ToolCall("add_one", {"x": 1}, "c1")
    assert ProviderResponse([ContentSegment("tool_call", tool_call=call)]).parts() == (
        (call,),
        "",
        (),
        None,
        False,
    )


def test_parts_gives_new_dicts_each_call() -> None:
    response = ProviderResponse([ContentSegment("ui", ui={"kind": "card"})])
    first = response.parts()[3]
    assert first is not None
    first[0]["type"] = "changed"
    assert response.parts()[3] == [{"type": "ui", "ui": {"kind": "card"}}]


# --- the one-call constructors ---------------------------------------------------------------


def test_of_text_is_the_response_of_one_text_segment() -> None:
    made = ProviderResponse.of_text("hello", {"usage": {"in": 1}})
    assert made == ProviderResponse([ContentSegment("text", text="hello")], {"usage": {"in": 1}})
    assert encode_response(made) == encode_response(
        ProviderResponse([ContentSegment("text", text="hello")], {"usage": {"in": 1}})
    )
    assert ProviderResponse.of_text("").segments[0].text == ""
    assert ProviderResponse.of_text("x").metadata is None


def test_of_tool_call_is_the_response_of_its_segments() -> None:
    call = ToolCall("get_weather", {"location": "Taipei"}, "c1")
    assert ProviderResponse.of_tool_call("get_weather", {"location": "Taipei"}, "c1") == (
        ProviderResponse([ContentSegment("tool_call", tool_call=call)])
    )
    with_text = ProviderResponse.of_tool_call(
        "get_weather", '{"location": "Taipei"}', "c1", "Sure, let me check.", {"m": 1}
    )
    assert with_text == ProviderResponse(
        [
            ContentSegment("text", text="Sure, let me check."),
            ContentSegment("tool_call", tool_call=call),
        ],
        {"m": 1},
    )
    [segment] = ProviderResponse.of_tool_call("ping").segments
    assert segment.tool_call is not None
    assert segment.tool_call.args == {}
    assert uuid.UUID(segment.tool_call.id).version == 4  # a fresh id, as ToolCall gives


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("",), {}, ValueError, "non-empty name"),
        (("f", "[1]"), {}, ValueError, "args"),
        (("f", {"x": Sentinel()}), {}, TypeError, "Sentinel"),
        (("f",), {"metadata": {"x": Sentinel()}}, TypeError, "Sentinel"),
    ],
)
def test_of_tool_call_refuses_what_the_constructors_refuse(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ProviderResponse.of_tool_call(*args, **kwargs)
    name, *rest = args

    def by_constructors() -> ProviderResponse:
        call = ToolCall(name, *rest)
        return ProviderResponse(
            [ContentSegment("tool_call", tool_call=call)], kwargs.get("metadata")
        )

    with pytest.raises(error, match=match):
        by_constructors()


def test_of_text_refuses_metadata_no_json_carries() -> None:
    with pytest.raises(TypeError):
        ProviderResponse.of_text("hi", {"x": Sentinel()})
    with pytest.raises(TypeError):
        ProviderResponse.of_text(3)  # type: ignore[arg-type]
