"""The Agent API wire models (spec 003): validation, limits, wire form and round trips."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

import openstarry.api
from openstarry.api import messages, models, requests
from openstarry.api.models import (
    MAX_CONTENT_ITEMS,
    MAX_INPUT_MESSAGES,
    MAX_TEXT_LENGTH,
    AgentRequest,
    AgentResponse,
    AnyContent,
    AudioContent,
    BaseRequest,
    BaseResponse,
    ContentType,
    DataContent,
    Error,
    FileContent,
    FunctionCall,
    FunctionCallOutput,
    FunctionParameters,
    FunctionTool,
    ImageContent,
    InvalidEventError,
    InvalidRequestError,
    Message,
    MessageType,
    RefusalContent,
    Role,
    RunStatus,
    StatusTransitionError,
    TextContent,
    Tool,
    WireModel,
    content_class,
    merge_delta,
    parse_content,
    parse_event,
    parse_request,
)


def _user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "type": "message", "content": [{"type": "text", "text": text}]}


def _request(**fields: Any) -> dict[str, Any]:
    return {"input": [_user()], **fields}


def _invalid(data: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(data)
    return info.value


# --- enums ---------------------------------------------------------------------------------------


def test_enum_wire_values_are_the_specs() -> None:
    assert [r.value for r in Role] == ["assistant", "user", "system", "tool"]
    assert MessageType.MCP_TOOL_CALL.value == "mcp_call"
    assert [m.value for m in MessageType] == [
        "message",
        "function_call",
        "function_call_output",
        "plugin_call",
        "plugin_call_output",
        "component_call",
        "component_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_call",
        "mcp_approval_response",
        "reasoning",
        "heartbeat",
        "error",
    ]
    assert [s.value for s in RunStatus] == [
        "created",
        "in_progress",
        "completed",
        "canceled",
        "failed",
        "rejected",
        "unknown",
        "queued",
        "incomplete",
    ]
    assert RunStatus.InProgress.value == "in_progress"
    assert RunStatus("in_progress") is RunStatus.InProgress
    assert {c.value for c in ContentType} == {"text", "image", "data", "audio", "file", "refusal"}
    assert str(Role.USER) == "user"
    assert f"{RunStatus.Completed}" == "completed"
    assert json.dumps([Role.TOOL, ContentType.DATA]) == '["tool", "data"]'


# --- round trips ---------------------------------------------------------------------------------

_CONTENTS: list[AnyContent] = [
    TextContent(text="hello", index=0, delta=True, msg_id="msg_1", status=RunStatus.InProgress),
    ImageContent(image_url="https://example.com/cat.png"),
    DataContent(data={"call_id": "c1", "nested": {"x": [1, None, "y"]}, "none": None}),
    AudioContent(data="aGk=", format="wav", sequence_number=4),
    FileContent(
        file_url="https://example.com/a.pdf", file_id="f1", filename="a.pdf", file_data="eA=="
    ),
    RefusalContent(refusal="I cannot do that", status=RunStatus.Completed),
]

_MODELS: list[WireModel] = [
    *_CONTENTS,
    FunctionParameters(properties={"city": {"type": "string"}}, required=["city"]),
    FunctionTool(name="get_weather", description="The weather", parameters={"type": "object"}),
    Tool(function=FunctionTool(name="f", description="d")),
    FunctionCall(call_id="c1", name="get_weather", arguments='{"city": "Taipei"}'),
    FunctionCallOutput(call_id="c1", name="get_weather", output='{"temp": 25}'),
    Error(code="E", message="boom"),
    Message(role=Role.ASSISTANT, content=list(_CONTENTS), usage={"t": 1}, metadata={"k": "v"}),
    Message(
        type=MessageType.ERROR,
        role=Role.ASSISTANT,
        code="PROVIDER",
        message="down",
        status=RunStatus.Failed,
    ),
    BaseRequest(input=[Message(role=Role.USER, content=[TextContent(text="x")])], stream=False),
    AgentRequest(
        input=[Message(role=Role.USER, content=[TextContent(text="x")])],
        model="m",
        top_p=0.5,
        temperature=1.0,
        frequency_penalty=-1.0,
        presence_penalty=2.0,
        max_tokens=10,
        stop=["a", "b"],
        n=5,
        seed=7,
        tools=[Tool(function=FunctionTool(name="f", description="d"))],
        session_id="s1",
        response_id="response_1",
    ),
    BaseResponse(status=RunStatus.InProgress, sequence_number=2),
    AgentResponse(
        status=RunStatus.Failed,
        error=Error(code="E", message="m"),
        completed_at=5,
        output=[Message(role=Role.ASSISTANT)],
        usage={"input_tokens": 3},
        session_id="s1",
    ),
]


@pytest.mark.parametrize("model", _MODELS, ids=lambda m: type(m).__name__)
def test_every_model_round_trips_through_json(model: WireModel) -> None:
    cls = type(model)
    assert cls.model_validate_json(model.model_dump_json()) == model
    assert isinstance(model, models.WireModel)
    wire = model.wire_json()
    assert cls.model_validate_json(wire) == model
    assert json.loads(wire) == model.to_wire()
    assert None not in model.to_wire().values()


@pytest.mark.parametrize("content", _CONTENTS, ids=lambda m: type(m).__name__)
def test_content_parses_to_its_own_class(content: WireModel) -> None:
    parsed = parse_content(content.wire_json())
    assert type(parsed) is type(content)
    assert parsed == content
    assert parse_event(content.to_wire()) == content


def test_wire_form_drops_none_fields_but_keeps_none_inside_data() -> None:
    content = DataContent(data={"a": None})
    assert content.to_wire() == {
        "object": "content",
        "type": "data",
        "delta": False,
        "data": {"a": None},
    }
    assert json.loads(content.model_dump_json())["msg_id"] is None


# --- requests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_n_from_1_to_5_is_accepted(n: int) -> None:
    assert parse_request(json.dumps(_request(n=n))).n == n


@pytest.mark.parametrize("n", [0, 6, -1, 100])
def test_n_outside_1_to_5_is_refused(n: int) -> None:
    error = _invalid(json.dumps(_request(n=n)))
    assert error.code == "invalid_request"
    assert error.http_status == 422
    assert [e["loc"] for e in error.errors] == ["n"]
    assert "n: Input should be" in str(error)


def test_request_defaults() -> None:
    request = parse_request(
        b'{"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}'
    )
    assert request.stream is True
    assert request.n == 1
    assert request.tools is None
    message = request.input[0]
    assert message.type is MessageType.MESSAGE
    assert message.role is Role.USER
    assert message.id.startswith("msg_")
    assert message.get_text_content() == "hi"


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"n": "3"}, "n"),
        ({"n": 2.5}, "n"),
        ({"n": True}, "n"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"model": 4}, "model"),
        ({"session_id": 5}, "session_id"),
        ({"stop": 3}, "stop"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"input": "hello"}, "input"),
        ({"input": [1]}, "input.0"),
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": "plain text"}]}, "input.0.content"),
        ({"input": [{"role": "robot"}]}, "input.0.role"),
        ({"input": [{"type": "chat"}]}, "input.0.type"),
        ({"input": [{"status": "done"}]}, "input.0.status"),
        ({"input": [{"object": "content"}]}, "input.0.object"),
        ({"input": [{"content": [{"type": "text", "text": 5}]}]}, "input.0.content.0.text.text"),
        (
            {"input": [{"content": [{"type": "text", "delta": "yes"}]}]},
            "input.0.content.0.text.delta",
        ),
        ({"input": [{"content": [{"type": "data", "data": [1]}]}]}, "input.0.content.0.data.data"),
    ],
)
def test_wrong_types_are_refused(fields: dict[str, Any], loc: str) -> None:
    error = _invalid(json.dumps(_request(**fields)))
    assert error.code == "invalid_request"
    assert any(e["loc"] == loc or e["loc"].startswith(loc + ".") for e in error.errors)
    assert f"{loc}: " in str(error) or f"{loc}." in str(error)


def test_missing_input_is_refused() -> None:
    error = _invalid(b'{"stream": true}')
    assert error.errors[0]["loc"] == "input"
    assert error.errors[0]["type"] == "missing"


@pytest.mark.parametrize("tool_type", ["retrieval", "code_interpreter", "", 3])
def test_unknown_tool_type_is_refused(tool_type: Any) -> None:
    tool = {"type": tool_type, "function": {"name": "f", "description": "d"}}
    error = _invalid(json.dumps(_request(tools=[tool])))
    assert error.errors[0]["loc"] == "tools.0.type"
    assert "unknown tool type" in str(error)
    assert "'function'" in str(error)


def test_function_tools_are_accepted_and_need_a_function() -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d"}}
    request = parse_request(json.dumps(_request(tools=[tool, {"function": tool["function"]}])))
    assert request.tools is not None
    assert [t.type for t in request.tools] == ["function", "function"]
    assert isinstance(request.tools[0].function.parameters, FunctionParameters)
    assert "tools.0.function" in str(_invalid(json.dumps(_request(tools=[{"type": "function"}]))))


@pytest.mark.parametrize("content_type", ["video", "input_text", "TEXT", None])
def test_unknown_content_type_is_refused(content_type: Any) -> None:
    message = {"role": "user", "content": [{"type": content_type, "text": "x"}]}
    error = _invalid(json.dumps({"input": [message]}))
    assert error.errors[0]["loc"].startswith("input.0.content.0")
    with pytest.raises(InvalidEventError):
        parse_content({"type": content_type})


def test_message_content_accepts_all_six_kinds() -> None:
    message = Message.model_validate({"role": "user", "content": [c.to_wire() for c in _CONTENTS]})
    assert message.content is not None
    assert [type(c) for c in message.content] == [type(c) for c in _CONTENTS]


def test_invalid_json_is_a_400_with_its_own_code() -> None:
    error = _invalid(b'{"input": [')
    assert error.code == "invalid_json"
    assert error.http_status == 400
    assert error.to_error() == Error(code="invalid_json", message=str(error))
    assert _invalid(b"\xff\xfe").code == "invalid_json"


@pytest.mark.parametrize("data", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_json_that_is_not_an_object_is_refused(data: bytes) -> None:
    error = _invalid(data)
    assert error.code == "invalid_request"
    assert error.errors[0]["loc"] == "(root)"


def test_a_request_that_is_not_json_text_nor_a_dict_is_refused() -> None:
    error = _invalid(42)
    assert error.code == "invalid_request"
    assert "not int" in str(error)


def test_parse_request_takes_a_dict() -> None:
    assert parse_request(_request(n=2)).n == 2
    assert _invalid({"input": [], "n": 9}).errors[1]["loc"] == "n"


def test_a_request_over_the_byte_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps(_request()).encode()
    # The limit lives beside parse_request (openstarry.api.requests), where it is read.
    monkeypatch.setattr(requests, "MAX_REQUEST_BYTES", len(body) - 1)
    error = _invalid(body)
    assert error.code == "request_too_large"
    assert error.http_status == 413
    assert str(len(body)) in str(error)
    monkeypatch.setattr(requests, "MAX_REQUEST_BYTES", len(body))
    assert parse_request(body).input[0].get_text_content() == "hi"


def test_the_number_of_input_messages_is_bounded() -> None:
    assert len(parse_request(_request(input=[_user()] * MAX_INPUT_MESSAGES)).input) == 1000
    error = _invalid(_request(input=[_user()] * (MAX_INPUT_MESSAGES + 1)))
    assert error.errors[0]["loc"] == "input"
    assert "at most 1000" in str(error)


def test_the_number_of_content_items_is_bounded() -> None:
    items = [{"type": "text", "text": "x"}] * (MAX_CONTENT_ITEMS + 1)
    error = _invalid({"input": [{"role": "user", "content": items}]})
    assert error.errors[0]["loc"] == "input.0.content"


def test_text_length_is_bounded() -> None:
    assert len(TextContent(text="x" * MAX_TEXT_LENGTH).text or "") == MAX_TEXT_LENGTH
    error = _invalid(_request(input=[_user("x" * (MAX_TEXT_LENGTH + 1))]))
    assert error.errors[0]["loc"] == "input.0.content.0.text.text"
    assert "at most 8388608 characters" in str(error)


def test_the_error_message_lists_at_most_ten_problems() -> None:
    error = _invalid({"input": [{"role": "robot"}] * 12})
    assert len(error.errors) == 12
    assert str(error).startswith("invalid request (12 problems): input.0.role:")
    assert str(error).endswith("; and 2 more")
    assert "input.9.role" in str(error)
    assert "input.10.role" not in str(error)


def test_nesting_deeper_than_the_json_parser_allows_is_refused() -> None:
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    body = '{"input":[{"content":[{"type":"data","data":' + deep + "}]}]}"
    error = _invalid(body)
    assert error.code == "invalid_json"


# --- responses and events ------------------------------------------------------------------------


def test_response_defaults_and_ids() -> None:
    response = AgentResponse()
    assert response.id.startswith("response_")
    assert response.id != AgentResponse().id
    assert AgentResponse.model_validate({"id": None}).id.startswith("response_")
    assert response.status is RunStatus.Created
    assert isinstance(response.created_at, int)
    assert set(response.to_wire()) == {"object", "status", "id", "created_at"}
    response.add_new_message(Message(role=Role.ASSISTANT))
    assert response.output is not None
    assert len(response.output) == 1


def test_sequence_number_is_an_int_and_accepts_a_digit_string() -> None:
    event = parse_event('{"object": "response", "status": "created", "sequence_number": "7"}')
    assert event.sequence_number == 7
    assert '"sequence_number":7' in event.wire_json()
    with pytest.raises(InvalidEventError, match="sequence_number"):
        parse_event({"object": "message", "sequence_number": -1})
    with pytest.raises(InvalidEventError, match="sequence_number"):
        parse_event({"object": "message", "sequence_number": "seven"})


def test_parse_event_picks_the_model_by_object() -> None:
    assert type(parse_event({"object": "response", "id": "response_1"})) is AgentResponse
    assert type(parse_event(b'{"object": "message", "id": "msg_1"}')) is Message
    assert type(parse_event('{"object": "content", "type": "image"}')) is ImageContent
    for bad in ({"object": "thing"}, {"id": "x"}):
        with pytest.raises(InvalidEventError, match="'object' must be") as info:
            parse_event(bad)
        assert info.value.code == "invalid_event"
    with pytest.raises(InvalidEventError) as not_json:
        parse_event("{nope")
    assert not_json.value.code == "invalid_json"
    with pytest.raises(InvalidEventError, match="not list"):
        parse_event("[]")
    with pytest.raises(InvalidEventError, match="status"):
        parse_event({"object": "response", "status": "finished"})


def test_event_status_helpers_move_forward_only() -> None:
    message = Message()
    assert message.status is RunStatus.Created
    status: Any
    assert message.created() is message
    assert message.in_progress().in_progress().status is RunStatus.InProgress
    with pytest.raises(StatusTransitionError, match=r"message msg_.*'in_progress' to 'created'"):
        message.created()
    message.failed(Error(code="E", message="boom"))
    assert message.is_terminal
    assert message.error == Error(code="E", message="boom")
    for move in (message.completed, message.canceled, message.rejected, message.in_progress):
        with pytest.raises(StatusTransitionError, match="from 'failed'"):
            move()
    status = message.status
    assert status is RunStatus.Failed
    content = TextContent()
    assert content.status is None
    assert content.completed().status is RunStatus.Completed
    with pytest.raises(StatusTransitionError, match="content: cannot move from 'completed'"):
        content.in_progress()
    stamped = TextContent(index=2, msg_id="msg_9").completed()
    with pytest.raises(StatusTransitionError, match="content 2 of message msg_9: cannot move"):
        stamped.canceled()
    assert AgentResponse().canceled().status is RunStatus.Canceled
    assert AgentResponse().rejected().is_terminal


def test_content_class_names_every_type() -> None:
    for content_type in ContentType:
        assert content_class(content_type).model_fields["type"].default == content_type.value
    with pytest.raises(ValueError, match="unknown content type 'video'"):
        content_class("video")


# --- merging --------------------------------------------------------------------------------------


def test_merge_delta_concatenates_extends_and_merges() -> None:
    base: dict[str, Any] = {
        "text": "Hel",
        "items": [1],
        "nested": {"a": "x", "b": [1], "c": {"d": 1}},
        "n": 1,
    }
    delta: dict[str, Any] = {
        "text": "lo",
        "items": [2, 3],
        "nested": {"a": "y", "b": [2], "c": {"e": 2}},
        "n": 5,
    }
    merged = merge_delta(base, delta)
    assert merged == {
        "text": "Hello",
        "items": [1, 2, 3],
        "nested": {"a": "xy", "b": [1, 2], "c": {"d": 1, "e": 2}},
        "n": 5,
    }
    assert base["items"] == [1]
    assert base["nested"] == {"a": "x", "b": [1], "c": {"d": 1}}
    assert delta["nested"]["b"] == [2]
    merged["nested"]["c"]["e"] = 99
    assert delta["nested"]["c"] == {"e": 2}


@pytest.mark.parametrize(
    ("base", "delta", "expected"),
    [
        ("ab", "cd", "abcd"),
        ([1], [2], [1, 2]),
        ({"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
        (None, {"a": 1}, {"a": 1}),
        ({"a": 1}, None, {"a": 1}),
        ("text", ["list"], ["list"]),
        ({"a": "s"}, {"a": 1}, {"a": 1}),
        ({"a": {"b": 1}}, {"a": "flat"}, {"a": "flat"}),
        ({"a": True}, {"a": False}, {"a": False}),
        (1, 2, 2),
    ],
)
def test_merge_delta_cases(base: Any, delta: Any, expected: Any) -> None:
    assert merge_delta(base, delta) == expected


def test_merge_delta_handles_nesting_deeper_than_the_recursion_limit() -> None:
    def deep(depth: int, leaf: Any) -> dict[str, Any]:
        root: dict[str, Any] = {}
        node = root
        for _ in range(depth):
            node["k"] = {}
            node = node["k"]
        node["leaf"] = leaf
        return root

    merged = merge_delta(deep(5000, "a"), deep(5000, "b"))
    node = merged
    for _ in range(5000):
        node = node["k"]
    assert node == {"leaf": "ab"}


# --- Message key methods -------------------------------------------------------------------------


def test_add_delta_content_opens_a_slot_then_appends() -> None:
    message = Message(id="msg_1", role=Role.ASSISTANT)
    first = TextContent(text="Hel", delta=True)
    opened = message.add_delta_content(first)
    assert (opened.index, opened.msg_id, opened.delta, opened.status) == (
        0,
        "msg_1",
        True,
        "in_progress",
    )
    assert first.index is None
    assert first.msg_id is None
    event = message.add_delta_content(TextContent(text="lo", index=0, delta=True))
    assert isinstance(event, TextContent)
    assert (event.text, event.msg_id, event.status) == ("lo", "msg_1", "in_progress")
    done = message.content_completed(0)
    assert isinstance(done, TextContent)
    assert (done.text, done.delta, done.index, done.status) == ("Hello", False, 0, "completed")
    done.text = "changed"
    assert message.get_text_content() == "Hello"
    data = message.add_delta_content(DataContent(data={"args": '{"a"'}))
    assert data.index == 1
    message.add_delta_content(DataContent(data={"args": ": 1}", "list": [1]}, index=1, delta=True))
    message.add_delta_content(DataContent(data={"list": [2]}, index=1, delta=True))
    assert message.content is not None
    assert message.content[1].data == {"args": '{"a": 1}', "list": [1, 2]}  # type: ignore[union-attr]
    audio = message.add_delta_content(AudioContent(data="AA", format="wav"))
    message.add_delta_content(AudioContent(data="BB", format="mp3", index=audio.index, delta=True))
    assert message.content[2].data == "AABB"  # type: ignore[union-attr]
    assert message.content[2].format == "mp3"  # type: ignore[union-attr]


def test_add_delta_content_refuses_what_it_cannot_apply() -> None:
    message = Message(id="msg_1")
    with pytest.raises(ValueError, match="no content at index 1 to add a delta to"):
        message.add_delta_content(TextContent(text="x", index=1, delta=True))
    assert message.add_delta_content(TextContent(text="x")).delta is False
    with pytest.raises(ValueError, match="not a delta; use add_content"):
        message.add_delta_content(TextContent(text="x", index=0, delta=False))
    with pytest.raises(ValueError, match="a image delta for the text content at index 0"):
        message.add_delta_content(ImageContent(image_url="u", index=0, delta=True))
    with pytest.raises(IndexError, match="no content at index 3"):
        message.content_completed(3)


def test_add_delta_content_bounds_the_merged_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "MAX_TEXT_LENGTH", 4)  # read where Message lives
    message = Message(id="msg_1")
    message.add_delta_content(TextContent(text="abc"))
    with pytest.raises(ValueError, match="would exceed 4 characters"):
        message.add_delta_content(TextContent(text="de", index=0, delta=True))
    assert message.get_text_content() == "abc"


def test_add_content_appends_replaces_and_refuses_gaps() -> None:
    message = Message(id="msg_1")
    event = message.add_content(TextContent(text="a"))
    assert (event.index, event.msg_id, event.status, event.delta) == (
        0,
        "msg_1",
        "completed",
        False,
    )
    message.add_content(ImageContent(image_url="u", index=1))
    message.add_content(TextContent(text="b", index=0))
    assert message.content is not None
    assert [c.type for c in message.content] == ["text", "image"]
    assert message.get_text_content() == "b"
    with pytest.raises(ValueError, match="index 5 leaves a gap"):
        message.add_content(TextContent(text="c", index=5))


def test_the_public_names_import_without_http_packages() -> None:

    code = (
        "import sys, openstarry.api as api\n"
        "assert not {'starlette', 'uvicorn', 'httpx'} & set(sys.modules), sys.modules.keys()\n"
        "print(len(api.__all__))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    for name in openstarry.api.__all__:
        obj = getattr(openstarry.api, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__doc__, f"{name} has no docstring"
    assert set(models.__all__) <= set(openstarry.api.__all__)


def test_validation_errors_of_models_are_pydantic_errors() -> None:
    with pytest.raises(ValidationError):
        Message.model_validate({"role": "robot"})
    with pytest.raises(ValidationError):
        AgentRequest(input=[Message()], n=6)


#: The fields spec 003 gives each model (the AgentScope Runtime schema).
SPEC_FIELDS: dict[str, set[str]] = {
    "FunctionParameters": {"type", "properties", "required"},
    "FunctionTool": {"name", "description", "parameters"},
    "Tool": {"type", "function"},
    "FunctionCall": {"call_id", "name", "arguments"},
    "FunctionCallOutput": {"call_id", "output"},
    "Content": {"type", "object", "index", "delta", "msg_id"},
    "ImageContent": {"image_url"},
    "TextContent": {"text"},
    "DataContent": {"data"},
    "AudioContent": {"data", "format"},
    "FileContent": {"file_url", "file_id", "filename", "file_data"},
    "RefusalContent": {"refusal"},
    "Message": {"id", "object", "type", "status", "role", "content", "code", "message"},
    "BaseRequest": {"input", "stream"},
    "AgentRequest": {
        *("model", "top_p", "temperature", "frequency_penalty", "presence_penalty"),
        *("max_tokens", "stop", "n", "seed", "tools", "session_id", "response_id"),
    },
    "BaseResponse": {
        *("sequence_number", "id", "object", "created_at", "completed_at"),
        *("error", "output", "usage", "status"),
    },
    "AgentResponse": {"session_id"},
    "Error": {"code", "message"},
}


def test_issue4_every_model_has_the_specs_field_names_on_the_wire() -> None:
    """Same field names as spec 003, as the JSON names (aliases) the models read and write."""
    from openstarry.api import models

    for name, fields in SPEC_FIELDS.items():
        cls = getattr(models, name)
        wire = {field.alias or key for key, field in cls.model_fields.items()}
        assert fields <= wire, (name, sorted(fields - wire))
    text_content = models.TextContent(text="x", msg_id="msg_1", index=0, delta=True)
    assert text_content.to_wire() == {
        "object": "content",
        "type": "text",
        "text": "x",
        "msg_id": "msg_1",
        "index": 0,
        "delta": True,
    }
    call = models.FunctionCall(call_id="c1", name="get_weather", arguments="{}")
    assert call.to_wire() == {"call_id": "c1", "name": "get_weather", "arguments": "{}"}
    assert models.Message().to_wire()["object"] == "message"
    assert models.Message().id.startswith("msg_")
