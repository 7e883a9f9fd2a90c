"""The pydantic models of the wire protocol (openstarry.protocol) and their bridge to the core."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from envelopes import envelope_wire
from openstarry import core, events, protocol
from openstarry.core import decode_event, decode_response
from openstarry.errors import DecodeError
from openstarry.protocol import (
    OUTPUT_AGENT_MESSAGE,
    PAYLOAD_MODELS,
    AgentMessage,
    AgentState,
    ContentSegment,
    EventEnvelope,
    EventType,
    KernelError,
    ProviderResponse,
    Signal,
    StateChange,
    SystemCommand,
    TickStart,
    ToolCall,
    ToolCallPayload,
    ToolErrorInfo,
    ToolResultPayload,
    UserMessage,
    json_schema,
    parse_payload,
)

# Spec 000 section 5, as written there.
SPEC_000_RESPONSE = """{
  "segments": [
    { "type": "text", "text": "Sure, let me check." },
    { "type": "tool_call", "toolCall": { "name": "get_weather", "args": { "location": "Taipei" } } }
  ]
}"""

# Spec 002 section 3.1 and 3.2: the type and payload, as written there.
SPEC_002_USER_MESSAGE = {
    "type": "INPUT:USER_MESSAGE",
    "payload": {
        "text": "Read the recent system logs",
        "mimeType": "text/plain",
        "metadata": {"platform": "discord"},
    },
}
SPEC_002_TOOL_RESULT = {
    "type": "EXEC:TOOL_RESULT",
    "payload": {
        "toolCallId": "call_abc123",
        "success": False,
        "error": {"code": "EPERM", "message": "Operation not permitted", "source": "fs-plugin"},
    },
}

HEADER: dict[str, Any] = {
    "id": "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f",
    "timestamp": 1730000000000,
    "traceId": "t-1",
    "source": "transport-websocket-01",
    "sessionId": "s-1",
    "priority": 2,
}


def envelope(**fields: Any) -> dict[str, Any]:
    return {**HEADER, "type": "INPUT:SIGNAL", "payload": None, **fields}


def wire(loc: tuple[str | int, ...]) -> str:
    """A pydantic error location as the core's DecodeError.field spells it."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


# --- the spec's examples ------------------------------------------------------------------------


def test_spec_000_example_response_validates() -> None:
    response = ProviderResponse.model_validate_json(SPEC_000_RESPONSE)
    text, call = response.segments
    assert (text.type, text.text) == ("text", "Sure, let me check.")
    assert call.type == "tool_call"
    assert call.tool_call is not None
    assert call.tool_call.name == "get_weather"
    assert call.tool_call.args == {"location": "Taipei"}
    assert call.tool_call.id is None
    assert response.metadata is None


def test_spec_000_example_converts_like_the_core_decodes_it() -> None:
    mine = ProviderResponse.model_validate_json(SPEC_000_RESPONSE).to_core()
    theirs = core.decode_response(SPEC_000_RESPONSE.encode())
    assert len(mine.segments) == len(theirs.segments) == 2
    assert mine.segments[0] == theirs.segments[0]
    mine_call, theirs_call = mine.segments[1].tool_call, theirs.segments[1].tool_call
    assert mine_call is not None
    assert theirs_call is not None
    assert (mine_call.name, mine_call.args) == (theirs_call.name, theirs_call.args)
    assert uuid.UUID(mine_call.id).version == 4  # generated, as the spec asks


def test_spec_002_user_message_validates() -> None:
    event = EventEnvelope.model_validate(envelope(**SPEC_002_USER_MESSAGE))
    message = event.payload_model()
    assert isinstance(message, UserMessage)
    assert message.text == "Read the recent system logs"
    assert message.mime_type == "text/plain"
    assert message.metadata == {"platform": "discord"}
    assert message.model_dump() == SPEC_002_USER_MESSAGE["payload"]


def test_spec_002_tool_result_validates() -> None:
    event = EventEnvelope.model_validate(envelope(**SPEC_002_TOOL_RESULT))
    result = event.payload_model()
    assert isinstance(result, ToolResultPayload)
    assert result.tool_call_id == "call_abc123"
    assert result.success is False
    assert result.error == ToolErrorInfo(
        code="EPERM", message="Operation not permitted", source="fs-plugin"
    )
    assert result.model_dump() == SPEC_002_TOOL_RESULT["payload"]


# --- every model round-trips JSON ---------------------------------------------------------------

SEGMENT = ContentSegment(type="image", data="aGk=", mime_type="image/png")
INSTANCES: list[BaseModel] = [
    ToolCall(id="c1", name="fs.read", args={"path": "a.txt", "n": [1, 2.5, None, True]}),
    ToolCall(name="no_id"),
    ContentSegment(type="text", text="hi"),
    SEGMENT,
    ContentSegment(type="audio", data="https://x/a.mp3", mime_type="audio/mp3"),
    ContentSegment(type="video", data="dmlk"),
    ContentSegment(type="ui", ui={"component": "card", "children": [{"text": "x"}]}),
    ContentSegment(type="tool_call", tool_call=ToolCall(name="f", args={"a": 1})),
    ProviderResponse(segments=[SEGMENT], metadata={"usage": {"tokens": 12}}),
    ProviderResponse(segments=[]),
    EventEnvelope.model_validate(envelope(parentId="p-1", payload={"name": "x"})),
    UserMessage(text="hello"),
    UserMessage(text="<b>hi</b>", mime_type="text/html", metadata={"platform": "web"}),
    SystemCommand(command="reset", args=["all"]),
    Signal(name="door", data={"open": True}),
    TickStart(round=3),
    StateChange(from_=AgentState.IDLE, to=AgentState.THINKING, reason="input"),
    KernelError(code="E1", message="boom", source="kernel", details={"at": 1}),
    ToolCallPayload(tool_call_id="c1", name="fs.read", args={"path": "x"}),
    ToolErrorInfo(code="EPERM", message="no", source="fs"),
    ToolResultPayload(tool_call_id="c1", name="fs.read", success=True, result={"text": "x"}),
    ToolResultPayload(
        tool_call_id="c1", success=False, error=ToolErrorInfo(code="E", message="m", source="s")
    ),
    AgentMessage(text="hi", segments=[SEGMENT], metadata={"m": 1}, final=True),
    AgentMessage(),
]


@pytest.mark.parametrize("model", INSTANCES, ids=lambda m: type(m).__name__)
def test_every_model_round_trips_json(model: BaseModel) -> None:
    text = model.model_dump_json()
    again = type(model).model_validate_json(text)
    assert again == model
    assert again.model_dump_json() == text
    # Through plain JSON data too, as a transport would carry it.
    assert type(model).model_validate(json.loads(text)) == model


def test_output_uses_wire_names_and_omits_absent_fields() -> None:
    assert json.loads(SEGMENT.model_dump_json()) == {
        "type": "image",
        "data": "aGk=",
        "mimeType": "image/png",
    }
    assert ToolCallPayload(tool_call_id="c", name="n", args={}).model_dump() == {
        "toolCallId": "c",
        "name": "n",
        "args": {},
    }
    event = EventEnvelope.model_validate(envelope())
    dumped = json.loads(event.model_dump_json())
    assert "parentId" not in dumped  # the core rejects "parentId": null
    assert dumped["payload"] is None  # a required wire field, even when null
    assert {"traceId", "sessionId"} <= set(dumped)


def test_nulls_inside_free_form_values_are_kept() -> None:
    call = ToolCall(name="f", args={"a": None, "b": [None]})
    assert json.loads(call.model_dump_json())["args"] == {"a": None, "b": [None]}


def test_models_accept_python_and_wire_names() -> None:
    assert ContentSegment.model_validate({"type": "image", "data": "x", "mime_type": "a/b"}) == (
        ContentSegment.model_validate({"type": "image", "data": "x", "mimeType": "a/b"})
    )


# --- ToolCall ----------------------------------------------------------------------------------


def test_tool_call_needs_a_non_empty_name() -> None:
    with pytest.raises(ValidationError) as info:
        ToolCall.model_validate({"args": {}})
    assert info.value.errors()[0]["loc"] == ("name",)
    with pytest.raises(ValidationError):
        ToolCall(name="")


def test_tool_call_args_as_the_core_reads_them() -> None:
    assert ToolCall.model_validate({"name": "f", "args": None}).args == {}
    assert ToolCall.model_validate({"name": "f", "args": '{"a": [1]}'}).args == {"a": [1]}
    for bad in ('{"a": ', "[1, 2]", "3"):
        with pytest.raises(ValidationError) as info:
            ToolCall.model_validate({"name": "f", "args": bad})
        assert info.value.errors()[0]["loc"] == ("args",)
    with pytest.raises(ValidationError):
        ToolCall.model_validate({"name": "f", "args": [1, 2]})


def test_tool_call_empty_id_is_absent() -> None:
    assert ToolCall(name="f", id="").id is None


def test_tool_call_to_core_and_back() -> None:
    model = ToolCall(id="call-1", name="fs.read", args={"path": "a.txt", "deep": {"x": [1]}})
    native = model.to_core()
    assert isinstance(native, core.ToolCall)
    assert native == core.ToolCall("fs.read", {"path": "a.txt", "deep": {"x": [1]}}, "call-1")
    assert ToolCall.from_core(native) == model


def test_tool_call_without_id_gets_one_in_the_core() -> None:
    native = ToolCall(name="f").to_core()
    assert uuid.UUID(native.id).version == 4
    back = ToolCall.from_core(native)
    assert back.id == native.id
    assert (back.name, back.args) == ("f", {})


def test_tool_call_keeps_unknown_wire_fields_both_ways() -> None:
    raw = b'{"segments":[{"type":"tool_call","toolCall":{"id":"c","name":"f","args":{},"x":[1]}}]}'
    native = core.decode_response(raw).segments[0].tool_call
    assert native is not None
    model = ToolCall.from_core(native)
    assert model.model_extra == {"x": [1]}
    assert model.to_core() == native


# --- ContentSegment -----------------------------------------------------------------------------

SEGMENT_CASES: list[tuple[dict[str, Any], Any]] = [
    ({"type": "text", "text": "hi"}, core.ContentSegment("text", text="hi")),
    (
        {"type": "image", "data": "aGk=", "mimeType": "image/png"},
        core.ContentSegment("image", data="aGk=", mime_type="image/png"),
    ),
    ({"type": "audio", "data": "YQ=="}, core.ContentSegment("audio", data="YQ==")),
    ({"type": "video", "data": "https://v"}, core.ContentSegment("video", data="https://v")),
    ({"type": "ui", "ui": {"kind": "card"}}, core.ContentSegment("ui", ui={"kind": "card"})),
    (
        {"type": "tool_call", "toolCall": {"id": "c", "name": "f", "args": {"a": 1}}},
        core.ContentSegment("tool_call", tool_call=core.ToolCall("f", {"a": 1}, "c")),
    ),
    (
        {"type": "text", "text": "both", "data": "x", "mimeType": "text/plain"},
        core.ContentSegment("text", text="both", data="x", mime_type="text/plain"),
    ),
]


@pytest.mark.parametrize(("data", "native"), SEGMENT_CASES)
def test_segment_to_core_and_back(data: dict[str, Any], native: core.ContentSegment) -> None:
    model = ContentSegment.model_validate(data)
    assert model.to_core() == native
    assert ContentSegment.from_core(native) == model
    assert json.loads(model.model_dump_json()) == data


# The per-type rules, with the wire path both the core and the model name (rust/segment.rs).
BAD_RESPONSES = [
    ({"segments": [{"type": "text"}]}, "segments[0].text"),
    ({"segments": [{"type": "text", "text": None}]}, "segments[0].text"),
    (
        {"segments": [{"type": "text", "text": "a"}, {"type": "image", "mimeType": "image/png"}]},
        "segments[1].data",
    ),
    ({"segments": [{"type": "audio"}]}, "segments[0].data"),
    ({"segments": [{"type": "video", "text": "x"}]}, "segments[0].data"),
    ({"segments": [{"type": "tool_call", "toolCall": {"args": {}}}]}, "segments[0].toolCall.name"),
    ({"segments": [{"type": "tool_call"}]}, "segments[0].toolCall"),
    ({"segments": [{"type": "tool_call", "toolCall": None}]}, "segments[0].toolCall"),
    ({"segments": [{"type": "ui"}]}, "segments[0].ui"),
    ({"segments": [{"type": "ui", "ui": None}]}, "segments[0].ui"),
    ({"segments": [{"type": "movie", "data": "x"}]}, "segments[0].type"),
    ({"segments": [{"text": "x"}]}, "segments[0].type"),
    ({"segments": {}}, "segments"),
    ({"metadata": {}}, "segments"),
]


@pytest.mark.parametrize(("data", "field"), BAD_RESPONSES)
def test_segment_rules_match_the_core(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ProviderResponse.model_validate(data)
    assert wire(info.value.errors()[0]["loc"]) == field
    with pytest.raises(DecodeError) as core_info:
        core.decode_response(json.dumps(data).encode())
    assert core_info.value.field == field


def test_segment_rule_message_names_the_field() -> None:
    with pytest.raises(ValidationError, match="an image segment needs data"):
        ContentSegment(type="image", mime_type="image/png")
    with pytest.raises(ValidationError, match="a tool_call segment needs toolCall"):
        ContentSegment(type="tool_call")


# --- ProviderResponse ---------------------------------------------------------------------------


def test_response_to_core_and_back() -> None:
    model = ProviderResponse.model_validate_json(SPEC_000_RESPONSE)
    model = model.model_copy(update={"metadata": {"latencyMs": 12, "usage": [1, 2]}})
    native = model.to_core()
    assert isinstance(native, core.ProviderResponse)
    assert native.metadata == {"latencyMs": 12, "usage": [1, 2]}
    back = ProviderResponse.from_core(native)
    call = back.segments[1].tool_call
    assert call is not None
    assert call.id is not None  # the core gave it one
    assert back.model_dump(exclude={"segments": {1: {"tool_call": {"id"}}}}) == model.model_dump()
    assert back.to_core() == native


def test_response_from_a_built_core_response() -> None:
    native = core.ProviderResponse(
        [core.ContentSegment("text", text="a"), core.ContentSegment("ui", ui=[1, {"b": None}])],
        metadata={"k": "v"},
    )
    model = ProviderResponse.from_core(native)
    assert model == ProviderResponse(
        segments=[
            ContentSegment(type="text", text="a"),
            ContentSegment(type="ui", ui=[1, {"b": None}]),
        ],
        metadata={"k": "v"},
    )
    assert model.to_core() == native


def test_response_keeps_unknown_wire_fields_both_ways() -> None:
    raw = b'{"segments":[{"type":"text","text":"a","lang":"en"}],"model":"m1"}'
    native = core.decode_response(raw)
    model = ProviderResponse.from_core(native)
    assert model.model_extra == {"model": "m1"}
    assert model.segments[0].model_extra == {"lang": "en"}
    assert model.to_core() == native
    assert json.loads(core.encode_response(model.to_core())) == json.loads(raw)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(args=st.dictionaries(st.text(max_size=6), json_values, max_size=4), metadata=json_values)
def test_arbitrary_json_survives_the_core_round_trip(args: dict[str, Any], metadata: Any) -> None:
    model = ProviderResponse(
        segments=[
            ContentSegment(type="tool_call", tool_call=ToolCall(id="c", name="f", args=args))
        ],
        metadata=metadata,
    )
    assert ProviderResponse.from_core(model.to_core()) == model


# --- EventEnvelope ------------------------------------------------------------------------------


def test_envelope_from_a_new_core_event_and_back() -> None:
    native = core.Event.new(
        "INPUT:USER_MESSAGE", {"text": "hi"}, source="cli", session_id="s", priority=1
    )
    model = EventEnvelope.from_core(native)
    assert model.id == native.id
    assert model.timestamp == native.timestamp
    assert model.trace_id == native.trace_id
    assert (model.source, model.session_id, model.priority) == ("cli", "s", 1)
    assert model.type == "INPUT:USER_MESSAGE"
    assert model.payload == {"text": "hi"}
    assert model.parent_id is None
    again = model.to_core()
    assert isinstance(again, core.Event)
    assert again.to_dict() == native.to_dict()


def test_envelope_parent_id_both_ways() -> None:
    parent = core.Event.new("INPUT:SIGNAL", {"name": "x"}, source="a", session_id="s")
    child = parent.child("EXEC:TOOL_CALL", {"toolCallId": "c", "name": "f", "args": {}})
    model = EventEnvelope.from_core(child)
    assert model.parent_id == parent.id
    assert model.trace_id == parent.trace_id
    assert model.to_core().parent_id == parent.id


def test_envelope_keeps_unknown_fields_both_ways() -> None:
    raw = json.dumps(envelope(**{"x-region": "eu", "hops": [1, {"n": None}]})).encode()
    native = core.decode_event(raw)
    model = EventEnvelope.from_core(native)
    assert model.model_extra == {"x-region": "eu", "hops": [1, {"n": None}]}
    assert model.to_core().extra == native.extra == {"x-region": "eu", "hops": [1, {"n": None}]}
    # And for an envelope built in Python.
    built = EventEnvelope.model_validate(envelope(trail="abc"))
    assert built.to_core().extra == {"trail": "abc"}


@pytest.mark.parametrize(
    "event_type",
    [*(t.value for t in EventType), OUTPUT_AGENT_MESSAGE, "CUSTOM:THING_2", "A:B"],
)
def test_envelope_accepts_what_the_core_accepts(event_type: str) -> None:
    data = envelope(type=event_type)
    model = EventEnvelope.model_validate(data)
    assert model.type == event_type
    assert model.to_core().type == event_type


BAD_ENVELOPES: list[tuple[dict[str, Any], str]] = [
    ({"type": "input:user_message"}, "type"),
    ({"type": "INPUT"}, "type"),
    ({"type": "INPUT:"}, "type"),
    ({"type": "A:B:C"}, "type"),
    ({"type": "_A:B"}, "type"),
    ({"type": "1A:B"}, "type"),
    ({"type": "A :B"}, "type"),
    ({"type": "A:B\n"}, "type"),
    ({"priority": 6}, "priority"),
    ({"priority": -1}, "priority"),
    ({"priority": 2.0}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": "2"}, "priority"),
    ({"timestamp": -1}, "timestamp"),
    ({"timestamp": 1.5}, "timestamp"),
    ({"id": ""}, "id"),
    ({"traceId": ""}, "traceId"),
    ({"source": ""}, "source"),
    ({"sessionId": 3}, "sessionId"),
    ({"parentId": ""}, "parentId"),
    ({"parentId": None}, "parentId"),
]


@pytest.mark.parametrize(("change", "field"), BAD_ENVELOPES)
def test_envelope_rejects_what_the_core_rejects(change: dict[str, Any], field: str) -> None:
    data = envelope(**change)
    with pytest.raises(DecodeError) as core_info:
        core.decode_event(json.dumps(data).encode())
    assert core_info.value.field == field
    if change == {"parentId": None}:
        # A model's absent parent is None; on the wire it is left out, never null.
        assert "parentId" not in EventEnvelope.model_validate(data).model_dump()
        return
    with pytest.raises(ValidationError) as info:
        EventEnvelope.model_validate_json(json.dumps(data))
    assert info.value.errors()[0]["loc"] == (field,)


def test_envelope_requires_the_header() -> None:
    with pytest.raises(ValidationError) as info:
        EventEnvelope.model_validate({"type": "INPUT:SIGNAL"})
    missing = {e["loc"][0] for e in info.value.errors() if e["type"] == "missing"}
    assert missing == {"id", "timestamp", "traceId", "source", "sessionId", "priority", "payload"}


def test_envelope_stores_a_model_payload_as_wire_data() -> None:
    change = StateChange(from_=AgentState.IDLE, to=AgentState.EXECUTING)
    event = EventEnvelope.model_validate(envelope(type=EventType.STATE_CHANGE, payload=change))
    assert event.type == "KERNEL:STATE_CHANGE"
    assert event.payload == {"from": "IDLE", "to": "EXECUTING"}
    assert event.to_core().payload == {"from": "IDLE", "to": "EXECUTING"}
    assert event.payload_model() == change


def test_payload_model_of_an_extension_type_is_none() -> None:
    assert (
        EventEnvelope.model_validate(envelope(type="CUSTOM:X", payload=[1])).payload_model() is None
    )


def test_payload_model_rejects_a_bad_payload() -> None:
    event = EventEnvelope.model_validate(envelope(type="KERNEL:TICK_START", payload={"round": -1}))
    with pytest.raises(ValidationError):
        event.payload_model()


# --- the payloads -------------------------------------------------------------------------------


def test_payload_models_cover_every_event_type() -> None:
    assert set(PAYLOAD_MODELS) == {t.value for t in EventType} | {
        OUTPUT_AGENT_MESSAGE,
        "OUTPUT:AGENT_MESSAGE_DELTA",
    }
    assert len(PAYLOAD_MODELS) == 10
    for member in EventType:
        assert PAYLOAD_MODELS[member] is PAYLOAD_MODELS[member.value]
    assert PAYLOAD_MODELS[OUTPUT_AGENT_MESSAGE] is AgentMessage
    assert PAYLOAD_MODELS["EXEC:TOOL_RESULT"] is ToolResultPayload
    with pytest.raises(TypeError):
        PAYLOAD_MODELS["X:Y"] = UserMessage  # type: ignore[index]


def test_parse_payload() -> None:
    parsed = parse_payload(EventType.TOOL_CALL, {"toolCallId": "c", "name": "f", "args": {"a": 1}})
    assert parsed == ToolCallPayload(tool_call_id="c", name="f", args={"a": 1})
    assert parse_payload("KERNEL:TICK_START", {"round": 0}) == TickStart(round=0)
    with pytest.raises(ValueError, match="no payload model for event type 'CUSTOM:X'"):
        parse_payload("CUSTOM:X", {})
    with pytest.raises(ValidationError, match="toolCallId"):
        parse_payload("EXEC:TOOL_CALL", {"name": "f", "args": {}})


def test_payloads_reject_unknown_fields() -> None:
    with pytest.raises(ValidationError) as info:
        UserMessage.model_validate({"text": "x", "txet": "y"})
    assert info.value.errors()[0]["loc"] == ("txet",)


def test_user_message_defaults() -> None:
    message = UserMessage.model_validate({"text": "hi"})
    assert (message.mime_type, message.metadata) == ("text/plain", None)
    assert message.model_dump() == {"text": "hi", "mimeType": "text/plain"}


def test_state_change_serialises_from() -> None:
    change = StateChange(from_=AgentState.IDLE, to=AgentState.EXECUTING)
    assert json.loads(change.model_dump_json()) == {"from": "IDLE", "to": "EXECUTING"}
    parsed = StateChange.model_validate({"from": "THINKING", "to": "IDLE", "reason": "done"})
    assert parsed.from_ is AgentState.THINKING
    assert parsed.to is AgentState.IDLE
    with pytest.raises(ValidationError):
        StateChange.model_validate({"from": "SLEEPING", "to": "IDLE"})
    with pytest.raises(ValidationError):
        StateChange.model_validate({"to": "IDLE"})


@pytest.mark.parametrize(("given", "command"), [("stop", "stop"), ("/reset", "reset")])
def test_system_command_strips_the_slash(given: str, command: str) -> None:
    assert SystemCommand(command=given).command == command


@pytest.mark.parametrize("bad", ["", "/", "stop now", "/ stop"])
def test_system_command_rejects(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        SystemCommand(command=bad)
    assert info.value.errors()[0]["loc"] == ("command",)


def test_system_command_from_text() -> None:
    assert SystemCommand.from_text("/read  notes.txt b") == SystemCommand(
        command="read", args=["notes.txt", "b"]
    )
    assert SystemCommand.from_text("stop") == SystemCommand(command="stop")
    with pytest.raises(ValidationError):
        SystemCommand.from_text("   ")


def test_tick_start_round() -> None:
    assert TickStart.model_validate({"round": 0}).round == 0
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValidationError):
            TickStart.model_validate({"round": bad})


def test_tool_result_success_and_error_agree() -> None:
    error = {"code": "E", "message": "m", "source": "s"}
    with pytest.raises(ValidationError) as info:
        ToolResultPayload.model_validate({"toolCallId": "c", "success": False})
    assert info.value.errors()[0]["loc"] == ("error",)
    assert "needs error" in str(info.value)
    with pytest.raises(ValidationError) as info:
        ToolResultPayload.model_validate({"toolCallId": "c", "success": True, "error": error})
    assert info.value.errors()[0]["loc"] == ("error",)
    ok = ToolResultPayload.model_validate({"toolCallId": "c", "success": True, "result": 3})
    assert (ok.result, ok.error) == (3, None)
    with pytest.raises(ValidationError):  # "false" is not a boolean on the wire
        ToolResultPayload.model_validate({"toolCallId": "c", "success": "false", "error": error})
    with pytest.raises(ValidationError):  # the error object is closed too
        ToolResultPayload.model_validate(
            {"toolCallId": "c", "success": False, "error": {**error, "extra": 1}}
        )


def test_kernel_error_and_signal_required_fields() -> None:
    with pytest.raises(ValidationError) as info:
        KernelError.model_validate({"code": "E"})
    assert {e["loc"][0] for e in info.value.errors()} == {"message", "source"}
    with pytest.raises(ValidationError):
        Signal.model_validate({"data": 1})


def test_agent_message_segments_follow_the_segment_rules() -> None:
    message = AgentMessage.model_validate(
        {"text": "hi", "segments": [{"type": "text", "text": "hi"}], "final": True}
    )
    assert message.segments == [ContentSegment(type="text", text="hi")]
    with pytest.raises(ValidationError) as info:
        AgentMessage.model_validate({"segments": [{"type": "image"}]})
    assert info.value.errors()[0]["loc"] == ("segments", 0, "data")


def test_events_are_re_exported() -> None:
    from openstarry import protocol

    assert protocol.EventType is events.EventType
    assert protocol.AgentState is events.AgentState
    assert protocol.OUTPUT_AGENT_MESSAGE == events.OUTPUT_AGENT_MESSAGE
    for name in protocol.__all__:
        obj = getattr(protocol, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name


# --- JSON Schema --------------------------------------------------------------------------------


def test_json_schema_document() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    defs = schema["$defs"]
    for model in (ToolCall, ContentSegment, ProviderResponse, EventEnvelope, ToolErrorInfo):
        assert model.__name__ in defs
    for event_type, payload_model in PAYLOAD_MODELS.items():
        ref = schema["x-payloads"][event_type]["$ref"]
        assert ref == f"#/$defs/{payload_model.__name__}"
        assert ref.removeprefix("#/$defs/") in defs
    json.dumps(schema)  # plain JSON
    assert defs["ProviderResponse"]["properties"]["segments"]["items"] == {
        "$ref": "#/$defs/ContentSegment"
    }


def test_json_schema_uses_wire_names_and_rules() -> None:
    segment = ContentSegment.model_json_schema(by_alias=True)
    assert {"mimeType", "toolCall"} <= set(segment["properties"])
    assert "mime_type" not in segment["properties"]
    rules = {
        rule["if"]["properties"]["type"]["const"]: rule["then"]["required"]
        for rule in segment["allOf"]
    }
    assert rules == {
        "text": ["text"],
        "image": ["data"],
        "audio": ["data"],
        "video": ["data"],
        "ui": ["ui"],
        "tool_call": ["toolCall"],
        "reasoning": ["text"],
    }
    assert "from" in StateChange.model_json_schema(by_alias=True)["properties"]
    envelope_schema = EventEnvelope.model_json_schema(by_alias=True)
    assert envelope_schema["properties"]["type"]["pattern"] == "^[A-Z][A-Z0-9_]*:[A-Z][A-Z0-9_]*$"
    assert envelope_schema["properties"]["priority"]["maximum"] == 5
    assert envelope_schema["additionalProperties"] is True
    assert UserMessage.model_json_schema(by_alias=True)["additionalProperties"] is False
    result = ToolResultPayload.model_json_schema(by_alias=True)
    assert "toolCallId" in result["required"]
    assert result["allOf"][0]["then"]["required"] == ["error"]


def test_envelope_without_payload_is_refused_as_the_core_and_spec_002_refuse_it() -> None:
    """``payload`` is a required envelope field: the model and its JSON Schema say so.

    Spec 002 declares ``payload`` without ``?`` and ``decode_event`` refuses an
    envelope without it; a model that accepts it, and a schema other languages
    validate against that does not require it, let producers emit events the
    core then rejects.
    """
    wire = envelope_wire()
    del wire["payload"]
    raw = json.dumps(wire).encode()
    with pytest.raises(DecodeError):
        decode_event(raw)

    with pytest.raises(ValidationError):
        protocol.EventEnvelope.model_validate_json(raw)
    assert "payload" in protocol.json_schema()["$defs"]["EventEnvelope"]["required"]


NON_FINITE_MODELS: dict[str, Callable[[], Any]] = {
    "tool call args NaN": lambda: protocol.ToolCall.model_validate(
        {"name": "w", "args": {"x": float("nan")}}
    ),
    "ui segment inf": lambda: protocol.ContentSegment.model_validate(
        {"type": "ui", "ui": {"x": float("inf")}}
    ),
    "response metadata -inf": lambda: protocol.ProviderResponse.model_validate(
        {"segments": [], "metadata": float("-inf")}
    ),
    "envelope payload NaN": lambda: protocol.EventEnvelope.model_validate(
        envelope_wire(payload={"x": float("nan")})
    ),
}


@pytest.mark.parametrize("build", list(NON_FINITE_MODELS.values()), ids=list(NON_FINITE_MODELS))
def test_to_core_refuses_a_non_finite_number_instead_of_turning_it_into_null(
    build: Callable[[], Any],
) -> None:
    """A NaN or infinity in a model is refused (``ValueError``), as the core's own classes do.

    ``core.ToolCall("w", {"x": nan})`` raises; the pydantic model must not
    silently convert the same value into ``null`` on its way to the core, which
    changes the data a tool or a transport receives.
    """
    with pytest.raises(ValueError):  # noqa: PT011 - a ValidationError or the core's ValueError
        build().to_core()


def test_provider_response_from_core_converts_every_response_the_core_decodes() -> None:
    """A response ``decode_response`` accepts converts to the model with ``from_core``.

    ``1e400`` is valid JSON: the core must either refuse it when decoding (a
    ``DecodeError`` naming the field) or produce a response that converts;
    today it decodes it as infinity, which ``encode_response`` and therefore
    ``ProviderResponse.from_core`` then fail on with a bare ``ValueError``.
    """
    raw = b'{"segments":[{"type":"text","text":"a"}],"metadata":{"n":1e400}}'
    try:
        response = decode_response(raw)
    except DecodeError:
        return
    model = protocol.ProviderResponse.from_core(response)
    assert model.metadata == response.metadata
