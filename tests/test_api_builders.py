"""The Agent API builders (spec 003): example streams, numbering, merging, status order."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pydantic import ValidationError

from openstarry.api import builders
from openstarry.api.builders import BuilderStateError, ResponseBuilder
from openstarry.api.models import (
    MAX_TEXT_LENGTH,
    AgentResponse,
    Content,
    DataContent,
    Error,
    Event,
    Message,
    MessageType,
    Role,
    RunStatus,
    StatusTransitionError,
    TextContent,
    parse_event,
)

#: Fields an event may carry beyond those a spec example line shows.
_EXTRA_OK = {
    "response": {"sequence_number", "created_at", "completed_at", "session_id", "output", "usage"},
    "message": {"sequence_number", "role", "type", "content"},
    "content": {"sequence_number", "msg_id"},
}


def _text(content: object) -> str | None:
    assert isinstance(content, TextContent)
    return content.text


def _data(content: object) -> dict[str, Any] | None:
    assert isinstance(content, DataContent)
    return content.data


def _match_spec(events: list[Any], spec_lines: list[dict[str, Any]]) -> None:
    """Each event's wire form holds exactly the spec line's fields and values.

    Ids written ``response_...``/``msg_...`` (or, in the second example, ``msg_abc``)
    stand for the id the builder generated: it must have that prefix and be the
    same on every line that names it. ``sequence_number`` must count from 0.
    """
    assert len(events) == len(spec_lines)
    ids: dict[str, str] = {}
    for number, (event, expected) in enumerate(zip(events, spec_lines, strict=True)):
        wire = json.loads(event.wire_json())
        assert wire["sequence_number"] == number
        for key, value in expected.items():
            assert key in wire, f"line {number}: {key} missing from {wire}"
            if key in ("id", "msg_id") and (value.endswith("...") or value == "msg_abc"):
                prefix = value.split("_")[0] + "_"
                assert wire[key].startswith(prefix)
                assert len(wire[key]) > len(prefix)
                assert ids.setdefault(value, wire[key]) == wire[key]
            else:
                assert wire[key] == value, f"line {number}: {key}"
        extra = set(wire) - set(expected)
        assert extra <= _EXTRA_OK[wire["object"]], f"line {number}: unexpected {extra}"
        assert parse_event(event.wire_json()) == event


def test_spec_example_stream_hello_world() -> None:
    response = ResponseBuilder(session_id="session_123")
    events: list[Any] = [response.created()]
    message = response.create_message_builder(role="assistant", message_type="message")
    events.append(message.created())
    content = message.create_content_builder(content_type="text", index=0)
    events += [content.add_text_delta(t) for t in ("Hello", ", ", "world", "!")]
    events += [content.complete(), message.complete(), response.completed()]

    msg_id = message.id
    _match_spec(
        events,
        [
            {"status": "created", "id": "response_...", "object": "response"},
            # The spec shows "type":"assistant" here: "assistant" is the role, and
            # the message's type is "message".
            {
                "status": "created",
                "id": "msg_...",
                "object": "message",
                "role": "assistant",
                "type": "message",
            },
            {
                "status": "in_progress",
                "type": "text",
                "index": 0,
                "delta": True,
                "text": "Hello",
                "object": "content",
            },
            {
                "status": "in_progress",
                "type": "text",
                "index": 0,
                "delta": True,
                "text": ", ",
                "object": "content",
            },
            {
                "status": "in_progress",
                "type": "text",
                "index": 0,
                "delta": True,
                "text": "world",
                "object": "content",
            },
            # The spec's example leaves this delta out although its completed text ends in "!".
            {
                "status": "in_progress",
                "type": "text",
                "index": 0,
                "delta": True,
                "text": "!",
                "object": "content",
            },
            {
                "status": "completed",
                "type": "text",
                "index": 0,
                "delta": False,
                "text": "Hello, world!",
                "object": "content",
            },
            {"status": "completed", "id": "msg_...", "object": "message"},
            {"status": "completed", "id": "response_...", "object": "response"},
        ],
    )
    for event in events[2:7]:
        assert event.msg_id == msg_id
    final = events[-1]
    assert isinstance(final, AgentResponse)
    assert final.session_id == "session_123"
    assert final.output is not None
    assert [m.id for m in final.output] == [msg_id]
    assert final.output[0].get_text_content() == "Hello, world!"
    assert final.output[0].sequence_number is None
    assert final.completed_at is not None


def test_spec_example_stream_image_description() -> None:
    response = ResponseBuilder(response_id="response_123")
    events: list[Any] = [response.created()]
    message = response.create_message_builder()
    events.append(message.created())
    content = message.create_content_builder("text")
    events += [content.add_text_delta("This"), content.add_text_delta(" image shows...")]
    events += [content.complete(), message.complete(), response.completed()]
    _match_spec(
        events,
        [
            {"id": "response_123", "object": "response", "status": "created"},
            {"id": "msg_abc", "object": "message", "status": "created"},
            {
                "status": "in_progress",
                "type": "text",
                "index": 0,
                "delta": True,
                "text": "This",
                "object": "content",
                "msg_id": "msg_abc",
            },
            {
                "status": "in_progress",
                "type": "text",
                "index": 0,
                "delta": True,
                "text": " image shows...",
                "object": "content",
                "msg_id": "msg_abc",
            },
            {
                "status": "completed",
                "type": "text",
                "index": 0,
                "delta": False,
                "text": "This image shows...",
                "object": "content",
                "msg_id": "msg_abc",
            },
            {"id": "msg_abc", "status": "completed", "object": "message"},
            {"id": "response_123", "status": "completed", "object": "response"},
        ],
    )


def test_generate_streaming_response_follows_spec_section_4() -> None:
    response = ResponseBuilder(session_id="s")
    events = list(
        response.generate_streaming_response(["Hello", " ", "World", "!"], role="assistant")
    )
    kinds = [(e.object, e.status, getattr(e, "delta", None)) for e in events]
    assert kinds == [
        ("response", "created", None),
        ("response", "in_progress", None),
        ("message", "created", None),
        *[("content", "in_progress", True)] * 4,
        ("content", "completed", False),
        ("message", "completed", None),
        ("response", "completed", None),
    ]
    assert [e.sequence_number for e in events] == list(range(10))
    assert _text(events[7]) == "Hello World!"
    assert response.status is RunStatus.Completed
    with pytest.raises(BuilderStateError, match="needs a fresh builder, this one is 'completed'"):
        response.generate_streaming_response(["x"])


def test_one_counter_numbers_every_event_of_a_response() -> None:
    response = ResponseBuilder()
    events: list[Event] = [response.created(), response.in_progress()]
    first = response.create_message_builder()
    second = response.create_message_builder(role="tool", message_type="function_call_output")
    events.append(first.created())
    events.append(second.created())
    text = first.create_content_builder()
    data = second.create_content_builder("data")
    events += [text.add_text_delta("a"), data.set_data({"call_id": "c"}), text.set_text("b")]
    response.set_usage({"input_tokens": 1})
    events += [text.complete(), data.complete(), first.in_progress(), first.complete()]
    events += [second.complete(), response.completed()]
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    assert response.next_sequence_number == len(events)
    other = ResponseBuilder()
    assert other.created().sequence_number == 0


def test_events_are_snapshots_that_later_calls_do_not_change() -> None:
    response = ResponseBuilder()
    created = response.created()
    message = response.create_message_builder()
    message_created = message.created()
    content = message.create_content_builder("data")
    set_event = content.set_data({"a": [1]})
    delta = content.add_data_delta({"a": [2]})
    done = content.complete()
    message_done = message.complete()
    response.set_usage({"output_tokens": 3})
    completed = response.completed()
    assert created.status is RunStatus.Created
    assert created.output is None
    assert created.usage is None
    assert message_created.content is None
    assert message_created.status is RunStatus.Created
    assert _data(set_event) == {"a": [1]}
    assert _data(delta) == {"a": [2]}
    done_data = _data(done)
    assert done_data == {"a": [1, 2]}
    done_data["a"].append(99)
    assert message_done.content is not None
    assert _data(message_done.content[0]) == {"a": [1, 2]}
    assert completed.output is not None
    completed.output[0].status = RunStatus.Failed
    assert response.snapshot().output[0].status is RunStatus.Completed  # type: ignore[index]
    assert completed.usage == {"output_tokens": 3}


def test_data_deltas_merge_on_completion() -> None:
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder()
    message.created()
    data = message.create_content_builder("data", index=0)
    data.set_data(
        {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Beijing"}'}
    )
    data.add_data_delta({"status": "processing"})
    data.add_data_delta({"result": "sunny", "arguments": "", "trace": ["a"]})
    data.add_data_delta({"trace": ["b"], "meta": {"n": 1, "deep": {"x": "1"}}})
    data.add_data_delta({"meta": {"n": 2, "deep": {"x": "2", "y": True}}})
    done = data.complete()
    assert isinstance(done, DataContent)
    assert done.data == {
        "type": "function_call",
        "name": "get_weather",
        "arguments": '{"city": "Beijing"}',
        "status": "processing",
        "result": "sunny",
        "trace": ["a", "b"],
        "meta": {"n": 2, "deep": {"x": "12", "y": True}},
    }


def test_text_set_replaces_and_deltas_append() -> None:
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder()
    message.created()
    text = message.create_content_builder()
    text.add_text_delta("ignored ")
    whole = text.set_text("Hello")
    assert (whole.text, whole.delta, whole.status) == ("Hello", False, "in_progress")
    text.add_text_delta(", world")
    assert _text(text.snapshot()) == "Hello, world"
    assert _text(text.complete()) == "Hello, world"
    empty = message.create_content_builder("text").complete()
    assert _text(empty) == ""
    assert _data(message.create_content_builder("data").complete()) == {}


def test_multi_content_message_orders_content_by_index() -> None:
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder()
    message.created()
    text = message.create_content_builder("text", index=0)
    image = message.create_content_builder("image", index=1)
    assert (
        image.set_image_url("https://example.com/image.jpg").image_url
        == "https://example.com/image.jpg"
    )
    image.complete()
    text.set_text("This is an image:")
    text.complete()
    refusal = message.create_content_builder("refusal")
    assert refusal.index == 2
    refusal.set_refusal("no")
    refusal.complete()
    audio = message.create_content_builder("audio")
    audio.set_audio("aGk=", "wav")
    audio.complete()
    file = message.create_content_builder("file")
    file.set_file(file_url="https://example.com/a.pdf")
    assert file.set_file(filename="a.pdf").file_url == "https://example.com/a.pdf"
    file.complete()
    added = message.add_content(TextContent(text="extra"))
    assert (added.index, added.msg_id, added.status, added.delta) == (
        5,
        message.id,
        "completed",
        False,
    )
    done = message.complete()
    assert done.content is not None
    assert [(c.index, c.type) for c in done.content] == [
        (0, "text"),
        (1, "image"),
        (2, "refusal"),
        (3, "audio"),
        (4, "file"),
        (5, "text"),
    ]
    assert all(c.msg_id == message.id and c.status == "completed" for c in done.content)
    assert all(c.sequence_number is None for c in done.content)


def test_client_side_reassembly_matches_the_builders_message() -> None:
    response = ResponseBuilder()
    events = list(response.generate_streaming_response(["a", "b", "c"]))
    rebuilt = Message.model_validate(events[2].to_wire())
    for event in events[3:]:
        if isinstance(event, Content) and event.delta:
            rebuilt.add_delta_content(event)
    assert rebuilt.get_text_content() == "abc"
    rebuilt.content_completed(0)
    final = events[-1]
    assert isinstance(final, AgentResponse)
    assert final.output is not None
    assert rebuilt.get_text_content() == final.output[0].get_text_content()


def test_failed_and_canceled_responses() -> None:
    response = ResponseBuilder(session_id="s")
    response.created()
    message = response.create_message_builder()
    message.created()
    content = message.create_content_builder()
    content.add_text_delta("partial")
    failed = response.failed(Error(code="PROVIDER_ERROR", message="the provider is down"))
    assert failed.status is RunStatus.Failed
    assert failed.error == Error(code="PROVIDER_ERROR", message="the provider is down")
    assert failed.output == []
    assert failed.to_wire()["error"] == {
        "code": "PROVIDER_ERROR",
        "message": "the provider is down",
    }
    with pytest.raises(BuilderStateError, match=r"after response response_.* is 'failed'"):
        content.add_text_delta("more")
    with pytest.raises(BuilderStateError, match="is 'failed'"):
        message.complete()
    canceled = ResponseBuilder()
    canceled.created()
    assert canceled.canceled().status is RunStatus.Canceled
    as_dict = ResponseBuilder()
    as_dict.created()
    assert as_dict.failed({"code": "E", "message": "m"}).error == Error(code="E", message="m")


def test_failed_messages_and_error_messages_join_the_output() -> None:
    response = ResponseBuilder()
    response.created()
    error = response.create_message_builder(message_type="error")
    error.set_error("TOOL_ERROR", "get_weather failed")
    error.created()
    error_done = error.complete()
    assert (error_done.type, error_done.code, error_done.message) == (
        "error",
        "TOOL_ERROR",
        "get_weather failed",
    )
    broken = response.create_message_builder()
    broken.created()
    broken.create_content_builder().add_text_delta("half")
    failed = broken.failed(Error(code="E", message="m"))
    assert failed.status is RunStatus.Failed
    assert failed.content == []
    response.create_message_builder()  # never created: does not hold the response open
    done = response.completed()
    assert done.output is not None
    assert [m.id for m in done.output] == [error.id, broken.id]
    assert [m.status for m in done.output] == ["completed", "failed"]


def test_usage_merges() -> None:
    response = ResponseBuilder()
    response.created()
    response.set_usage({"input_tokens": 10, "details": [{"model": "a"}]})
    response.set_usage({"output_tokens": 4, "details": [{"model": "b"}]})
    response.set_usage({"input_tokens": 12})
    assert response.completed().usage == {
        "input_tokens": 12,
        "output_tokens": 4,
        "details": [{"model": "a"}, {"model": "b"}],
    }


def test_unknown_role_type_or_content_type_is_a_value_error() -> None:
    response = ResponseBuilder()
    response.created()
    with pytest.raises(ValueError, match="robot"):
        response.create_message_builder(role="robot")
    with pytest.raises(ValueError, match="chat"):
        response.create_message_builder(message_type="chat")
    message = response.create_message_builder()
    with pytest.raises(ValueError, match="unknown content type 'video'"):
        message.create_content_builder("video")


def test_text_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builders, "MAX_TEXT_LENGTH", 5)
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder()
    message.created()
    text = message.create_content_builder()
    text.add_text_delta("abc")
    number = response.next_sequence_number
    with pytest.raises(ValueError, match="would exceed 5 characters"):
        text.add_text_delta("def")
    assert response.next_sequence_number == number
    assert _text(text.complete()) == "abc"


# --- illegal transitions -------------------------------------------------------------------------


def _live() -> tuple[ResponseBuilder, Any, Any]:
    """A created response with a created message and a started text content."""
    response = ResponseBuilder(response_id="response_t")
    response.created()
    message = response.create_message_builder()
    message.created()
    content = message.create_content_builder()
    content.add_text_delta("x")
    return response, message, content


def _fresh_response(r: ResponseBuilder) -> None:
    r.in_progress()


def _response_completed_twice(r: ResponseBuilder) -> None:
    r.created()
    r.completed()
    r.completed()


def _created_twice(r: ResponseBuilder) -> None:
    r.created()
    r.created()


def _in_progress_twice(r: ResponseBuilder) -> None:
    r.created()
    r.in_progress()
    r.in_progress()


def _created_after_in_progress(r: ResponseBuilder) -> None:
    r.created()
    r.in_progress()
    r.created()


def _in_progress_after_completed(r: ResponseBuilder) -> None:
    r.created()
    r.completed()
    r.in_progress()


def _completed_after_failed(r: ResponseBuilder) -> None:
    r.created()
    r.failed(Error(code="E", message="m"))
    r.completed()


def _canceled_after_completed(r: ResponseBuilder) -> None:
    r.created()
    r.completed()
    r.canceled()


def _failed_after_canceled(r: ResponseBuilder) -> None:
    r.created()
    r.canceled()
    r.failed(Error(code="E", message="m"))


def _completed_before_created(r: ResponseBuilder) -> None:
    r.completed()


def _message_before_response_created(r: ResponseBuilder) -> None:
    r.create_message_builder()


def _message_after_response_completed(r: ResponseBuilder) -> None:
    r.created()
    r.completed()
    r.create_message_builder()


def _usage_after_completed(r: ResponseBuilder) -> None:
    r.created()
    r.completed()
    r.set_usage({"input_tokens": 1})


def _response_completed_with_open_message(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().created()
    r.completed()


def _message_in_progress_before_created(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().in_progress()


def _message_complete_before_created(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().complete()


def _message_created_twice(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.created()


def _message_complete_twice(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.complete()
    m.complete()


def _message_in_progress_after_complete(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.complete()
    m.in_progress()


def _message_created_after_response_canceled(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    r.canceled()
    m.created()


def _message_complete_with_open_content(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.create_content_builder().add_text_delta("x")
    m.complete()


def _set_error_after_complete(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder(message_type="error")
    m.created()
    m.complete()
    m.set_error("E", "m")


def _delta_before_message_created(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().create_content_builder().add_text_delta("x")


def _delta_after_complete(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    c = m.create_content_builder()
    c.add_text_delta("x")
    c.complete()
    c.add_text_delta("y")


def _set_after_complete(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    c = m.create_content_builder("data")
    c.complete()
    c.set_data({"a": 1})


def _content_complete_twice(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    c = m.create_content_builder()
    c.complete()
    c.complete()


def _text_delta_on_data(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.create_content_builder("data").add_text_delta("x")


def _data_on_text(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.create_content_builder("text").set_data({"a": 1})


def _data_delta_on_image(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.create_content_builder("image").add_data_delta({"a": 1})


def _image_on_text(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.create_content_builder().set_image_url("u")


def _delta_after_message_completed(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    c = m.create_content_builder()
    m.complete()
    c.add_text_delta("x")


def _content_after_message_completed(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.complete()
    m.create_content_builder()


def _content_index_taken(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.create_content_builder(index=0)
    m.create_content_builder(index=0)


def _content_index_out_of_range(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().create_content_builder(index=1000)


def _content_index_negative(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().create_content_builder(index=-1)


def _add_content_index_taken(r: ResponseBuilder) -> None:
    r.created()
    m = r.create_message_builder()
    m.created()
    m.create_content_builder()
    m.add_content(TextContent(text="x", index=0))


def _add_content_before_created(r: ResponseBuilder) -> None:
    r.created()
    r.create_message_builder().add_content(TextContent(text="x"))


_ILLEGAL: list[tuple[Callable[[ResponseBuilder], None], str]] = [
    (
        _fresh_response,
        r"response response_t: cannot move from \(nothing emitted\) to 'in_progress'",
    ),
    (_response_completed_twice, "response response_t: cannot move from 'completed' to 'completed'"),
    (_created_twice, "cannot move from 'created' to 'created'"),
    (_in_progress_twice, "cannot move from 'in_progress' to 'in_progress'"),
    (_created_after_in_progress, "cannot move from 'in_progress' to 'created'"),
    (_in_progress_after_completed, "cannot move from 'completed' to 'in_progress'"),
    (_completed_after_failed, "cannot move from 'failed' to 'completed'"),
    (_canceled_after_completed, "cannot move from 'completed' to 'canceled'"),
    (_failed_after_canceled, "cannot move from 'canceled' to 'failed'"),
    (_completed_before_created, r"cannot move from \(nothing emitted\) to 'completed'"),
    (
        _message_before_response_created,
        "cannot create a message before response response_t is created",
    ),
    (
        _message_after_response_completed,
        "cannot create a message after response response_t is 'completed'",
    ),
    (_usage_after_completed, "cannot set usage after 'completed'"),
    (
        _response_completed_with_open_message,
        r"to 'completed' while message\(s\) msg_.* are not finished",
    ),
    (
        _message_in_progress_before_created,
        r"message msg_.*: cannot move from \(nothing emitted\) to 'in_progress'",
    ),
    (
        _message_complete_before_created,
        r"message msg_.*: cannot move from \(nothing emitted\) to 'completed'",
    ),
    (_message_created_twice, "message msg_.*: cannot move from 'created' to 'created'"),
    (_message_complete_twice, "message msg_.*: cannot move from 'completed' to 'completed'"),
    (_message_in_progress_after_complete, "cannot move from 'completed' to 'in_progress'"),
    (
        _message_created_after_response_canceled,
        "message msg_.*: cannot move to 'created' after response response_t is 'canceled'",
    ),
    (
        _message_complete_with_open_content,
        "message msg_.*: cannot move from 'created' to 'completed' while content 0 is not complete",
    ),
    (_set_error_after_complete, "cannot set the error after 'completed'"),
    (
        _delta_before_message_created,
        "content 0 of message msg_.*: cannot add_text_delta before message msg_.* is created",
    ),
    (_delta_after_complete, "content 0 of message msg_.*: add_text_delta after complete"),
    (_set_after_complete, "set_data after complete"),
    (_content_complete_twice, "complete after complete"),
    (_text_delta_on_data, "add_text_delta needs a text content, this one is data"),
    (_data_on_text, "set_data needs a data content, this one is text"),
    (_data_delta_on_image, "add_data_delta needs a data content, this one is image"),
    (_image_on_text, "set_image_url needs a image content, this one is text"),
    (_delta_after_message_completed, "cannot add_text_delta after message msg_.* is 'completed'"),
    (_content_after_message_completed, "cannot create content after 'completed'"),
    (_content_index_taken, "content index 0 is already used"),
    (_content_index_out_of_range, r"content index 1000 is outside 0\.\.999"),
    (_content_index_negative, "content index -1 is outside"),
    (_add_content_index_taken, "content index 0 is already used"),
    (_add_content_before_created, "cannot add content before message msg_.* is created"),
]


@pytest.mark.parametrize(
    ("scenario", "message"), _ILLEGAL, ids=[f.__name__.strip("_") for f, _ in _ILLEGAL]
)
def test_every_illegal_transition_raises(
    scenario: Callable[[ResponseBuilder], None], message: str
) -> None:
    response = ResponseBuilder(response_id="response_t")
    with pytest.raises(BuilderStateError, match=message) as info:
        scenario(response)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, StatusTransitionError)


def test_a_refused_call_changes_nothing() -> None:
    response, message, content = _live()
    number = response.next_sequence_number
    with pytest.raises(BuilderStateError):
        message.complete()
    with pytest.raises(BuilderStateError):
        response.completed()
    with pytest.raises(BuilderStateError):
        content.set_data({"a": 1})
    assert response.next_sequence_number == number
    assert (response.status, message.status, content.status) == (
        "created",
        "created",
        "in_progress",
    )
    content.add_text_delta("y")
    assert _text(content.complete()) == "xy"
    assert message.complete().status is RunStatus.Completed
    assert response.completed().sequence_number == number + 3


def test_a_value_the_model_refuses_changes_nothing() -> None:
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder()
    message.created()
    image = message.create_content_builder("image")
    number = response.next_sequence_number
    with pytest.raises(ValidationError, match="image_url"):
        image.set_image_url("x" * (MAX_TEXT_LENGTH + 1))
    assert response.next_sequence_number == number
    assert image.status is None
    assert image.set_image_url("u").sequence_number == number
    data = message.create_content_builder("data")
    data.set_data({"a": "b"})
    with pytest.raises(TypeError, match="add_data_delta needs a dict, not list"):
        data.add_data_delta(["not", "a", "dict"])  # type: ignore[arg-type]
    assert _data(data.complete()) == {"a": "b"}


# --- the status rules against a reference model --------------------------------------------------

_LIVE = {"created", "in_progress"}
#: Which builder a rule acts on: most often the newest (-1), as real streams do.
_PICK = st.sampled_from([-1, -1, -1, 0, 1, 2])


class _Ref:
    """What the status rules say, in plain Python: ``None`` until created, then a status."""

    def __init__(self) -> None:
        self.response: str | None = None
        self.messages: list[str | None] = []
        self.contents: list[tuple[int, list[str | None], list[str]]] = []

    def response_live(self) -> bool:
        return self.response in _LIVE

    def message_open(self, m: int) -> bool:
        return self.messages[m] in _LIVE


class BuilderMachine(RuleBasedStateMachine):
    """Random builder calls: each succeeds exactly when the reference allows it."""

    def __init__(self) -> None:
        super().__init__()
        self.builder = ResponseBuilder()
        self.ref = _Ref()
        self.messages: list[Any] = []
        self.contents: list[Any] = []
        self.number = 0
        self.steps = 0

    def _call(self, legal: bool, call: Callable[[], Any], status: str | None) -> bool:
        if not legal:
            with pytest.raises(BuilderStateError):
                call()
            assert self.builder.next_sequence_number == self.number
            return False
        event = call()
        if status is not None:
            assert event.sequence_number == self.number
            assert event.status == status
            self.number += 1
        assert self.builder.next_sequence_number == self.number
        return True

    @initialize(start=st.booleans())
    def start(self, start: bool) -> None:
        if start:
            self.move_response("created")

    @rule(status_to=st.sampled_from(["created", "in_progress"]))
    def advance_response(self, status_to: str) -> None:
        self.move_response(status_to)

    # Finishing the response ends the interesting part of a run: only after a few steps.
    @precondition(lambda self: self.steps >= 12)
    @rule(status_to=st.sampled_from(["completed", "failed", "canceled"]))
    def finish_response(self, status_to: str) -> None:
        self.move_response(status_to)

    def move_response(self, status_to: str) -> None:
        ref = self.ref
        allowed = {
            None: {"created"},
            "created": {"in_progress", "completed", "failed", "canceled"},
            "in_progress": {"completed", "failed", "canceled"},
        }.get(ref.response, set())
        legal = status_to in allowed
        if status_to == "completed":
            legal = legal and not any(ref.message_open(m) for m in range(len(ref.messages)))
        calls: dict[str, Callable[[], Any]] = {
            "created": self.builder.created,
            "in_progress": self.builder.in_progress,
            "completed": self.builder.completed,
            "failed": lambda: self.builder.failed(Error(code="E", message="m")),
            "canceled": self.builder.canceled,
        }
        if self._call(legal, calls[status_to], status_to):
            ref.response = status_to

    @precondition(
        lambda self: len(self.messages) < 3 and (self.ref.response_live() or self.steps % 4 == 0)
    )
    @rule()
    def new_message(self) -> None:
        call = self.builder.create_message_builder
        if self._call(self.ref.response_live(), call, None):
            self.messages = list(self.builder.message_builders)
            self.ref.messages.append(None)

    @precondition(lambda self: self.messages)
    @rule(pick=_PICK, status_to=st.sampled_from(["created", "in_progress"]))
    def advance_message(self, pick: int, status_to: str) -> None:
        self.move_message(pick, status_to)

    @precondition(lambda self: self.messages and self.steps >= 6)
    @rule(
        pick=_PICK,
        status_to=st.sampled_from(["completed", "completed", "failed", "canceled"]),
    )
    def finish_message(self, pick: int, status_to: str) -> None:
        self.move_message(pick, status_to)

    def move_message(self, pick: int, status_to: str) -> None:
        m = pick % len(self.messages)
        ref = self.ref
        allowed = {
            None: {"created"},
            "created": {"in_progress", "completed", "failed", "canceled"},
            "in_progress": {"completed", "failed", "canceled"},
        }.get(ref.messages[m], set())
        legal = ref.response_live() and status_to in allowed
        if status_to == "completed":
            legal = legal and not any(
                mi == m and status == "in_progress"
                for mi, status_box, _ in ref.contents
                for status in status_box
            )
        builder = self.messages[m]
        calls: dict[str, Callable[[], Any]] = {
            "created": builder.created,
            "in_progress": builder.in_progress,
            "completed": builder.complete,
            "failed": lambda: builder.failed(Error(code="E", message="m")),
            "canceled": builder.canceled,
        }
        if self._call(legal, calls[status_to], status_to):
            ref.messages[m] = status_to

    @precondition(lambda self: self.messages and len(self.contents) < 4)
    @rule(pick=_PICK)
    def new_content(self, pick: int) -> None:
        m = pick % len(self.messages)
        legal = self.ref.response_live() and self.ref.messages[m] not in TERMINAL
        if self._call(legal, self.messages[m].create_content_builder, None):
            self.contents.append(self.messages[m].content_builders[-1])
            self.ref.contents.append((m, [None], []))

    def _content_legal(self, c: int) -> bool:
        m, status_box, _ = self.ref.contents[c]
        return (
            self.ref.response_live()
            and self.ref.messages[m] in _LIVE
            and status_box[0] != "completed"
        )

    @precondition(lambda self: self.contents)
    @rule(pick=_PICK, text=st.text(max_size=3))
    def write_delta(self, pick: int, text: str) -> None:
        c = pick % len(self.contents)
        _, status_box, parts = self.ref.contents[c]
        builder = self.contents[c]
        if self._call(self._content_legal(c), lambda: builder.add_text_delta(text), "in_progress"):
            status_box[0] = "in_progress"
            parts.append(text)

    @precondition(lambda self: self.contents)
    @rule(pick=_PICK)
    def complete_content(self, pick: int) -> None:
        c = pick % len(self.contents)
        m, status_box, parts = self.ref.contents[c]
        builder = self.contents[c]
        if self._call(self._content_legal(c), builder.complete, "completed"):
            status_box[0] = "completed"
            done = self.messages[m].snapshot()
            [stored] = [item for item in done.content or [] if item.index == builder.index]
            assert _text(stored) == "".join(parts)

    @invariant()
    def statuses_agree(self) -> None:
        self.steps += 1
        assert self.builder.status == self.ref.response
        assert [m.status for m in self.messages] == self.ref.messages
        assert [c.status for c in self.contents] == [box[0] for _, box, _ in self.ref.contents]

    def teardown(self) -> None:
        snapshot = self.builder.snapshot()
        finished = [
            b.id for b, s in zip(self.messages, self.ref.messages, strict=True) if s in TERMINAL
        ]
        assert [m.id for m in snapshot.output or []] == finished


TERMINAL = {"completed", "failed", "canceled"}

BuilderMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestBuilderMachine = BuilderMachine.TestCase


def test_set_error_refuses_what_would_break_the_message_later() -> None:
    response = ResponseBuilder()
    response.created()
    message = response.create_message_builder(Role.ASSISTANT, MessageType.ERROR)
    message.created()
    with pytest.raises(TypeError, match="set_error needs a str"):
        message.set_error(500, None)  # type: ignore[arg-type]
    message.set_error("E500", "the tool broke")
    done = message.complete()
    assert (done.code, done.message, str(done.status)) == ("E500", "the tool broke", "completed")
    final = response.completed()
    assert final.output is not None
    assert [m.id for m in final.output] == [message.id]
