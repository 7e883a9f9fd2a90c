"""OpenAI Chat Completions and Responses translation, both directions, against fixture files.

The fixtures under ``tests/fixtures/providers/openai_chat`` and
``openai_responses`` hold request and response bodies in the shapes of the API
reference: each ``request_*.json`` a memory and the exact body openstarry must
send for it; each ``response_*.json`` a body and the exact ``ProviderResponse``
it must become; each ``stream_*.json`` the server-sent events of the same
answer streamed, with the text deltas they must yield; ``errors.json`` error
bodies and what openstarry says of each.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import openstarry.providers._openai as openai_module
from agent_harness import running
from fake_llm_server import chunk
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.core import ToolCall
from openstarry.errors import AgentPainException, ManifestError, ProviderError, ToolError
from openstarry.protocol import ProviderResponse
from openstarry.providers._common import NOTE_PREFIX
from openstarry.providers._memory import (
    MISSING_OUTCOME,
    ToolExchange,
    conversation,
    outcome_object,
    outcome_text,
)
from openstarry.providers.openai_chat import OpenAIChatAPI
from openstarry.providers.openai_responses import OpenAIResponsesAPI
from openstarry.providers.wire import StreamAssembler, ToolNameMap, WireAPI

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
CHAT = FIXTURES / "openai_chat"
RESPONSES = FIXTURES / "openai_responses"

APIS: dict[str, tuple[WireAPI, Path]] = {
    "chat": (OpenAIChatAPI(), CHAT),
    "responses": (OpenAIResponsesAPI(), RESPONSES),
}
NAMES = ToolNameMap(["get_weather", "fs.read"])


def _load(folder: Path, name: str) -> Any:
    return json.loads((folder / name).read_text(encoding="utf-8"))


class _Tool(Tool):
    """A tool the translators only describe, never run."""

    def __init__(self, name: str, description: str, parameters: Mapping[str, Any]) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise AssertionError("translation never runs a tool")


def _entry(raw: Mapping[str, Any]) -> MemoryEntry:
    role = raw["role"]
    if role == "user":
        return UserTurn(raw["text"])
    if role == "assistant":
        calls = tuple(ToolCall(c["name"], c["args"], id=c["id"]) for c in raw.get("tool_calls", ()))
        return AssistantTurn(raw["text"], calls)
    if role == "tool":
        error = raw.get("error")
        return ToolOutcome(
            raw["tool_call_id"],
            raw["name"],
            raw["success"],
            raw.get("result"),
            ToolFailure(**error) if error else None,
        )
    assert role == "system"
    return Observation(raw["text"])


def _context(
    memory: Iterable[MemoryEntry] = (),
    *,
    tools: Iterable[Mapping[str, Any]] = (),
    instructions: str | None = None,
) -> AgentContext:
    session = Session("s1")
    session.memory.extend(list(memory))
    return AgentContext(
        tools={t["name"]: _Tool(t["name"], t["description"], t["parameters"]) for t in tools},
        session=session,
        instructions=instructions,
    )


def _scenario(folder: Path) -> tuple[dict[str, Any], AgentContext]:
    fixture = _load(folder, "request_conversation.json")
    context = _context(
        (_entry(e) for e in fixture["memory"]),
        tools=fixture["tools"],
        instructions=fixture["instructions"],
    )
    return fixture, context


def _request(
    api: WireAPI,
    prompt: str,
    context: AgentContext,
    *,
    options: Mapping[str, Any] | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    return api.build_request(
        prompt,
        context,
        model="gpt-4.1",
        options=options or {},
        stream=stream,
        names=ToolNameMap.of(context.tools),
    )


def _dump(response: ProviderResponse) -> Any:
    return response.model_dump(mode="json", by_alias=True)


def _data(data: Any) -> str:
    return data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))


def _feed(assembler: StreamAssembler, events: Iterable[Mapping[str, Any]]) -> list[str]:
    deltas = []
    for event in events:
        delta = assembler.feed(event["event"], _data(event["data"]))
        if delta is not None:
            deltas.append(delta)
    return deltas


def _texts(response: ProviderResponse) -> list[str]:
    return [s.text for s in response.segments if s.type == "text" and s.text is not None]


def _calls(response: ProviderResponse) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [
        (s.tool_call.id, s.tool_call.name, s.tool_call.args)
        for s in response.segments
        if s.tool_call is not None
    ]


def _completion(message: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4.1",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, **extra}],
    }


def _response_body(*output: Any, status: str = "completed") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "error": None,
        "model": "gpt-4.1",
        "output": list(output),
    }


def _fcall(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


# --- names -----------------------------------------------------------------------------------


def test_dotted_tool_names_round_trip() -> None:
    names = ToolNameMap(["fs.read", "get_weather", "weather:get"])
    assert names.wire("fs.read") == "fs_read"
    assert names.local("fs_read") == "fs.read"
    assert names.wire("weather:get") == "weather_get"
    assert names.local("weather_get") == "weather:get"
    assert names.local(names.wire("get_weather")) == "get_weather"


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_names_go_out_as_wire_names_and_come_back(which: str) -> None:
    api, folder = APIS[which]
    fixture, context = _scenario(folder)
    body = json.dumps(_request(api, fixture["prompt"], context))
    assert '"fs_read"' in body
    assert '"fs.read"' not in body
    parsed = api.parse_response(
        _load(folder, "response_parallel_tool_calls.json")["response"], NAMES
    )
    assert [name for _, name, _ in _calls(parsed)] == ["get_weather", "fs.read"]


# --- upstream --------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_request_matches_fixture(which: str) -> None:
    api, folder = APIS[which]
    fixture, context = _scenario(folder)
    body = _request(api, fixture["prompt"], context, options=fixture["options"])
    assert body == fixture["request"]
    # The body is JSON as it stands (what httpx sends).
    assert json.loads(json.dumps(body)) == fixture["request"]


def test_chat_stream_request_asks_for_usage() -> None:
    fixture, context = _scenario(CHAT)
    body = _request(OpenAIChatAPI(), fixture["prompt"], context, stream=True)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == fixture["request"]["messages"]


def test_responses_stream_request_sets_stream_only() -> None:
    fixture, context = _scenario(RESPONSES)
    body = _request(OpenAIResponsesAPI(), fixture["prompt"], context, stream=True)
    assert body["stream"] is True
    assert "stream_options" not in body
    assert body["input"] == fixture["request"]["input"]


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_no_tools_no_instructions_leave_their_keys_out(which: str) -> None:
    api, _ = APIS[which]
    body = _request(api, "hi", _context([UserTurn("hi")]))
    assert "tools" not in body
    assert "instructions" not in body
    assert "stream" not in body
    messages = body["messages" if which == "chat" else "input"]
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"] == "hi"


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_prompt_missing_from_memory_is_added_once(which: str) -> None:
    api, _ = APIS[which]
    key = "messages" if which == "chat" else "input"
    empty = _request(api, "hello", _context())
    assert [(m["role"], m["content"]) for m in empty[key]] == [("user", "hello")]
    stale = _request(api, "second", _context([UserTurn("first"), AssistantTurn("ok")]))
    assert [(m["role"], m["content"]) for m in stale[key]] == [
        ("user", "first"),
        ("assistant", "ok"),
        ("user", "second"),
    ]


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_reserved_options_are_refused(which: str) -> None:
    api, _ = APIS[which]
    reserved = api.reserved_options  # type: ignore[attr-defined]
    assert {"model", "tools", "stream"} <= set(reserved)
    for key in reserved:
        with pytest.raises(ManifestError, match=rf"provider\.options\.{key} cannot be set") as info:
            _request(api, "hi", _context(), options={key: "x"})
        assert info.value.field == f"provider.options.{key}"
    with pytest.raises(ManifestError, match="keys must be strings"):
        _request(api, "hi", _context(), options={1: "x"})  # type: ignore[dict-item]


def test_options_pass_through() -> None:
    options = {"temperature": 0, "top_p": 0.5, "tool_choice": "required", "seed": 7, "n": 1}
    body = _request(OpenAIChatAPI(), "hi", _context(), options=options)
    assert {k: body[k] for k in options} == options
    body = _request(OpenAIResponsesAPI(), "hi", _context(), options={"max_tokens": 99})
    assert body["max_output_tokens"] == 99
    assert "max_tokens" not in body
    with pytest.raises(ManifestError, match="both max_tokens and max_output_tokens"):
        _request(
            OpenAIResponsesAPI(),
            "hi",
            _context(),
            options={"max_tokens": 1, "max_output_tokens": 2},
        )


def test_observation_role_is_configurable() -> None:
    context = _context([UserTurn("hi"), Observation("note")])
    body = _request(OpenAIChatAPI(observation_role="user"), "hi", context)
    assert body["messages"][-1] == {"role": "user", "content": "note"}
    body = _request(OpenAIResponsesAPI(observation_role="system"), "hi", context)
    assert body["input"][-1] == {"type": "message", "role": "system", "content": "note"}
    with pytest.raises(ValueError, match="observation_role must be"):
        OpenAIChatAPI(observation_role="tool")  # type: ignore[arg-type]


def test_empty_assistant_text_is_left_out_of_responses_input() -> None:
    context = _context([UserTurn("a"), AssistantTurn(""), UserTurn("b")])
    items = _request(OpenAIResponsesAPI(), "b", context)["input"]
    assert [(i["role"], i["content"]) for i in items] == [("user", "a"), ("user", "b")]
    chat = _request(OpenAIChatAPI(), "b", context)["messages"]
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]


def test_assistant_calls_without_text_send_null_content() -> None:
    call = ToolCall("get_weather", {"location": "Oslo"}, id="c1")
    context = _context(
        [UserTurn("w"), AssistantTurn("", (call,)), ToolOutcome("c1", "get_weather", True, "7°C")]
    )
    chat = _request(OpenAIChatAPI(), "w", context)["messages"]
    assert chat[1]["content"] is None
    assert chat[2] == {"role": "tool", "tool_call_id": "c1", "content": "7°C"}
    items = _request(OpenAIResponsesAPI(), "w", context)["input"]
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]


def test_call_without_outcome_still_gets_an_answer() -> None:
    call = ToolCall("get_weather", {}, id="c1")
    context = _context([UserTurn("w"), AssistantTurn("", (call,))])
    messages = _request(OpenAIChatAPI(), "w", context)["messages"]
    assert messages[-1]["role"] == "tool"
    assert json.loads(messages[-1]["content"])["error"]["code"] == MISSING_OUTCOME


# --- downstream: whole responses ---------------------------------------------------------------

RESPONSE_FIXTURES = [
    "response_text.json",
    "response_tool_call.json",
    "response_parallel_tool_calls.json",
    "response_mixed.json",
    "response_refusal.json",
]


@pytest.mark.parametrize("name", RESPONSE_FIXTURES)
@pytest.mark.parametrize("which", ["chat", "responses"])
def test_response_matches_fixture(which: str, name: str) -> None:
    api, folder = APIS[which]
    fixture = _load(folder, name)
    parsed = api.parse_response(fixture["response"], NAMES)
    assert _dump(parsed) == fixture["expected"]
    # What the loop does with it: the core accepts it as it is.
    assert len(parsed.to_core().segments) == len(fixture["expected"]["segments"])


def test_chat_call_without_id_gets_a_uuid() -> None:
    body = _completion(
        {
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"location": "Oslo"}},
                }
            ],
        }
    )
    [(call_id, name, args)] = _calls(OpenAIChatAPI().parse_response(body, NAMES))
    assert call_id is not None
    assert uuid.UUID(call_id).version == 4
    assert (name, args) == ("get_weather", {"location": "Oslo"})


def test_chat_content_parts_and_legacy_function_call() -> None:
    body = _completion(
        {
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "function_call": {"name": "fs_read", "arguments": '{"path": "x"}'},
        }
    )
    parsed = OpenAIChatAPI().parse_response(body, NAMES)
    assert _texts(parsed) == ["a", "b"]
    assert [(n, a) for _, n, a in _calls(parsed)] == [("fs.read", {"path": "x"})]


def test_empty_answer_is_one_empty_text_segment() -> None:
    parsed = OpenAIChatAPI().parse_response(_completion({"content": ""}), NAMES)
    assert _dump(parsed)["segments"] == [{"type": "text", "text": ""}]
    parsed = OpenAIResponsesAPI().parse_response(_response_body(), NAMES)
    assert _dump(parsed)["segments"] == [{"type": "text", "text": ""}]


# --- section 7: what cannot be used ------------------------------------------------------------

BAD_ARGUMENTS = ['{"location": "Tai', "[1, 2]", '"Taipei"', "NaN", "{" * 5000 + "}" * 5000]


@pytest.mark.parametrize("arguments", BAD_ARGUMENTS)
def test_chat_invalid_arguments_become_a_note_and_other_calls_stay(arguments: str) -> None:
    body = _completion(
        {
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "fs_read", "arguments": '{"path": "a"}'},
                },
            ],
        }
    )
    parsed = OpenAIChatAPI().parse_response(body, NAMES)
    assert [s.type for s in parsed.segments] == ["text", "text", "tool_call"]
    note = _texts(parsed)[1]
    assert note.startswith(f"{NOTE_PREFIX} The model called tool 'get_weather', but its arguments")
    assert note.endswith("The call was not made.")
    assert len(note) < 400  # the raw arguments are quoted, clipped
    assert _calls(parsed) == [("c2", "fs.read", {"path": "a"})]
    assert parsed.metadata["errors"] == [note]


def test_arguments_deeper_than_the_core_carries_become_a_note() -> None:
    deep = '{"a": ' * 100 + "1" + "}" * 100
    body = _completion(
        {
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": deep},
                }
            ]
        }
    )
    parsed = OpenAIChatAPI().parse_response(body, NAMES)
    [note] = _texts(parsed)
    assert note.startswith(
        f"{NOTE_PREFIX} The model called tool 'get_weather', but openstarry "
        "cannot carry its arguments (nesting deeper than"
    )
    assert _calls(parsed) == []
    parsed.to_core()  # what the loop does: no error left for it


def test_responses_invalid_arguments_become_a_note() -> None:
    body = _response_body(_fcall("c1", "get_weather", '{"location": '), status="incomplete")
    body["incomplete_details"] = {"reason": "max_output_tokens"}
    parsed = OpenAIResponsesAPI().parse_response(body, NAMES)
    note, limit = _texts(parsed)
    assert "are not valid JSON" in note
    assert limit == (
        f"{NOTE_PREFIX} The answer stopped at the model's output token limit "
        "(max_output_tokens); it may be incomplete."
    )
    assert _calls(parsed) == []
    assert parsed.metadata["status"] == "incomplete"
    assert parsed.metadata["incomplete_reason"] == "max_output_tokens"


@pytest.mark.parametrize(
    ("reason", "note"),
    [
        ("length", "stopped at the model's output token limit (length)"),
        ("content_filter", "The API's content filter withheld the answer"),
    ],
)
def test_chat_answer_cut_by_the_api_says_so(reason: str, note: str) -> None:
    body = _completion({"content": "Part of"}, finish_reason=reason)
    parsed = OpenAIChatAPI().parse_response(body, NAMES)
    text, said = _texts(parsed)
    assert text == "Part of"
    assert note in said
    assert parsed.metadata["errors"] == [said]
    assembler = OpenAIChatAPI().stream(NAMES)
    assembler.feed(None, _data({"choices": [{"index": 0, "delta": {"content": "Part of"}}]}))
    assembler.feed(None, _data({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
    assert _dump(assembler.finish())["segments"] == _dump(parsed)["segments"]


def test_unknown_types_become_notes() -> None:
    chat = OpenAIChatAPI().parse_response(
        _completion(
            {
                "content": [{"type": "text", "text": "hi"}, {"type": "audio", "data": "x"}],
                "tool_calls": [
                    {"id": "c1", "type": "custom", "custom": {"name": "grep", "input": "x"}}
                ],
            }
        ),
        NAMES,
    )
    assert _texts(chat) == [
        "hi",
        f"{NOTE_PREFIX} The answer held a content part of type 'audio', which openstarry "
        "does not handle; it was left out.",
        f"{NOTE_PREFIX} The model made a call of type 'custom', which openstarry does not "
        "handle; it was not made.",
    ]
    responses = OpenAIResponsesAPI().parse_response(
        _response_body(
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_audio", "data": "x"},
                    {"type": "output_text", "text": "ok"},
                ],
            },
            {"type": "function_call", "call_id": "c1", "arguments": "{}"},
        ),
        NAMES,
    )
    texts = _texts(responses)
    assert texts[0] == (
        f"{NOTE_PREFIX} The response held an output item of type 'web_search_call', which "
        "openstarry does not handle; it was left out."
    )
    assert "content part of type 'output_audio'" in texts[1]
    assert texts[2] == "ok"
    assert "without a tool name" in texts[3]
    assert len(responses.metadata["errors"]) == 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "is list, not a JSON object"),
        ({"object": "chat.completion"}, "has no choices"),
        ({"choices": []}, "has no choices"),
        ({"choices": "x"}, "has no choices"),
        ({"choices": [None]}, r"choices\[0\] is NoneType"),
        ({"choices": [{"index": 0, "finish_reason": "stop"}]}, r"choices\[0\]\.message is"),
        ({"choices": [{"message": {"content": 5}}]}, "content is int, not text"),
        ({"choices": [{"message": {"tool_calls": {}}}]}, "tool_calls is dict, not a list"),
    ],
)
def test_chat_broken_envelope_is_agent_pain(body: Any, message: str) -> None:
    with pytest.raises(AgentPainException, match=message):
        OpenAIChatAPI().parse_response(body, NAMES)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("oops", "is str, not a JSON object"),
        ({"id": "resp_1", "status": "completed"}, "has no output list"),
        (_response_body(status="in_progress"), r"not finished \(status in_progress\)"),
    ],
)
def test_responses_broken_envelope_is_agent_pain(body: Any, message: str) -> None:
    with pytest.raises(AgentPainException, match=message):
        OpenAIResponsesAPI().parse_response(body, NAMES)


def test_errors_inside_a_response_are_provider_errors() -> None:
    error = {"message": "The server had an error", "type": "server_error", "code": None}
    with pytest.raises(ProviderError, match="reported an error: HTTP 200: The server had an error"):
        OpenAIChatAPI().parse_response({"error": error}, NAMES)
    failed = _response_body(status="failed")
    failed["error"] = {"code": "server_error", "message": "Something went wrong"}
    with pytest.raises(ProviderError, match="failed: HTTP 200: Something went wrong"):
        OpenAIResponsesAPI().parse_response(failed, NAMES)
    with pytest.raises(ProviderError, match="failed without saying why"):
        OpenAIResponsesAPI().parse_response(_response_body(status="failed"), NAMES)


# --- streaming -------------------------------------------------------------------------------

STREAM_FIXTURES = ["stream_text.json", "stream_parallel_tool_calls.json", "stream_mixed.json"]


@pytest.mark.parametrize("name", STREAM_FIXTURES)
@pytest.mark.parametrize("which", ["chat", "responses"])
def test_stream_gives_the_same_response_and_its_deltas(which: str, name: str) -> None:
    api, folder = APIS[which]
    fixture = _load(folder, name)
    whole = _load(folder, fixture["same_as"])
    assembler = api.stream(NAMES)
    assert not assembler.done
    assert _feed(assembler, fixture["events"]) == fixture["deltas"]
    assert assembler.done
    streamed = assembler.finish()
    assert _dump(streamed) == whole["expected"]
    assert _dump(streamed) == _dump(api.parse_response(whole["response"], NAMES))


@pytest.mark.parametrize("name", STREAM_FIXTURES)
def test_responses_stream_assembles_items_when_completed_lists_none(name: str) -> None:
    fixture = _load(RESPONSES, name)
    whole = _load(RESPONSES, fixture["same_as"])
    events = fixture["events"]
    assert events[-1]["event"] == "response.completed"
    events[-1]["data"]["response"]["output"] = []
    assembler = OpenAIResponsesAPI().stream(NAMES)
    _feed(assembler, events)
    assert _dump(assembler.finish()) == whole["expected"]


def test_responses_stream_from_deltas_alone() -> None:
    """Only the delta events and the completion: the items are built from the pieces."""
    fixture = _load(RESPONSES, "stream_mixed.json")
    kept = [
        e
        for e in fixture["events"]
        if e["event"] != "response.output_item.done"
        and not e["event"].endswith(".done")
        and e["event"] != "response.content_part.added"
    ]
    kept[-1]["data"]["response"]["output"] = []
    assembler = OpenAIResponsesAPI().stream(NAMES)
    _feed(assembler, kept)
    parsed = assembler.finish()
    assert _texts(parsed) == ["Sure, let me check."]
    assert _calls(parsed) == [("call_mix_1", "get_weather", {"location": "Taipei"})]


def test_chat_stream_cut_off_keeps_text_and_makes_no_call() -> None:
    fixture = _load(CHAT, "stream_mixed.json")
    cut = fixture["events"][:-4]  # mid-arguments: no finish_reason, usage or [DONE]
    assembler = OpenAIChatAPI().stream(NAMES)
    assert _feed(assembler, cut) == fixture["deltas"]
    assert not assembler.done
    parsed = assembler.finish()
    assert _calls(parsed) == []
    assert _texts(parsed) == [
        "Sure, let me check.",
        f"{NOTE_PREFIX} The call of tool 'get_weather' was cut off with the response; "
        "it was not made.",
        f"{NOTE_PREFIX} The response was cut off before the API said it was complete.",
    ]
    assert parsed.metadata["truncated"] is True
    assert parsed.metadata["errors"] == _texts(parsed)[1:]
    assert "finish_reason" not in parsed.metadata


def test_chat_stream_without_done_marker_is_complete_after_finish_reason() -> None:
    fixture = _load(CHAT, "stream_mixed.json")
    assembler = OpenAIChatAPI().stream(NAMES)
    _feed(assembler, fixture["events"][:-2])  # finish_reason came; usage and [DONE] did not
    assert assembler.done
    parsed = assembler.finish()
    assert _calls(parsed) == [("call_Qx1", "get_weather", {"location": "Taipei"})]
    assert "usage" not in parsed.metadata
    assert "truncated" not in parsed.metadata


def test_responses_stream_cut_off_keeps_text_and_makes_no_call() -> None:
    fixture = _load(RESPONSES, "stream_mixed.json")
    events = fixture["events"]
    cut = events[
        : next(
            i for i, e in enumerate(events) if e["event"] == "response.function_call_arguments.done"
        )
    ]
    assembler = OpenAIResponsesAPI().stream(NAMES)
    assert _feed(assembler, cut) == fixture["deltas"]
    assert not assembler.done
    parsed = assembler.finish()
    assert _calls(parsed) == []
    assert _texts(parsed)[0] == "Sure, let me check."
    assert "'get_weather' was cut off" in _texts(parsed)[1]
    assert parsed.metadata["truncated"] is True
    assert parsed.metadata["status"] == "in_progress"
    assert parsed.metadata["id"] == "resp_68b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5"


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_stream_with_nothing_in_it_is_agent_pain(which: str) -> None:
    api, _ = APIS[which]
    assembler = api.stream(NAMES)
    assert assembler.feed(None, "") is None
    with pytest.raises(AgentPainException, match="ended before any part of the response arrived"):
        assembler.finish()


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_stream_event_that_is_not_json_is_agent_pain(which: str) -> None:
    api, _ = APIS[which]
    with pytest.raises(
        AgentPainException, match=re.escape("""stream: an event that is not JSON: '{"id":'""")
    ):
        api.stream(NAMES).feed(None, '{"id": ')


def test_stream_refusals() -> None:
    chat = OpenAIChatAPI().stream(NAMES)
    for piece in ["I'm sorry, ", "I can't help with that request."]:
        assert (
            chat.feed(
                None, _data({"id": "c", "choices": [{"index": 0, "delta": {"refusal": piece}}]})
            )
            is None
        )
    chat.feed(None, "[DONE]")
    expected = "The model refused to answer: I'm sorry, I can't help with that request."
    parsed = chat.finish()
    assert _texts(parsed) == [expected]
    assert parsed.metadata["refused"] is True
    responses = OpenAIResponsesAPI().stream(NAMES)
    for piece in ["I'm sorry, ", "I can't help with that request."]:
        responses.feed(
            "response.refusal.delta",
            _data(
                {
                    "type": "response.refusal.delta",
                    "item_id": "m",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece,
                }
            ),
        )
    responses.feed(
        "response.completed", _data({"type": "response.completed", "response": _response_body()})
    )
    assert _texts(responses.finish()) == [expected]


def test_chat_stream_tolerates_servers_without_indexes() -> None:
    """Some compatible servers send each call whole, without ``index``, arguments as an object."""
    assembler = OpenAIChatAPI().stream(NAMES)
    chunk = {
        "id": "c",
        "model": "llama3.2",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "id": "a",
                            "function": {"name": "get_weather", "arguments": {"location": "Oslo"}},
                        },
                        {"id": "b", "function": {"name": "fs_read", "arguments": '{"path": '}},
                    ]
                },
            }
        ],
    }
    assembler.feed(None, _data(chunk))
    assembler.feed(
        None,
        _data(
            {
                "id": "c",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"function": {"arguments": '"x"}'}}]},
                        "finish_reason": "tool_calls",
                    }
                ],
            }
        ),
    )
    assert assembler.done
    assert _calls(assembler.finish()) == [
        ("a", "get_weather", {"location": "Oslo"}),
        ("b", "fs.read", {"path": "x"}),
    ]


def test_chat_stream_ignores_other_choices() -> None:
    assembler = OpenAIChatAPI().stream(NAMES)
    assert (
        assembler.feed(
            None,
            _data(
                {
                    "choices": [
                        {"index": 1, "delta": {"content": "no"}},
                        {"index": 0, "delta": {"content": "yes"}},
                    ]
                }
            ),
        )
        == "yes"
    )


def test_stream_errors_are_provider_errors() -> None:
    error = {"error": {"message": "overloaded", "type": "server_error"}}
    with pytest.raises(
        ProviderError,
        match="Chat Completions stream reported an error: "
        r"HTTP 200: overloaded \(type server_error\)",
    ):
        OpenAIChatAPI().stream(NAMES).feed(None, _data(error))
    event = {
        "type": "error",
        "code": "server_error",
        "message": "The server had an error",
        "param": None,
        "sequence_number": 3,
    }
    with pytest.raises(
        ProviderError, match=r"HTTP 200: The server had an error \(code server_error\)"
    ):
        OpenAIResponsesAPI().stream(NAMES).feed("error", _data(event))
    failed = _response_body(status="failed")
    failed["error"] = {"code": "rate_limit_exceeded", "message": "Slow down"}
    with pytest.raises(ProviderError, match="failed: HTTP 200: Slow down"):
        OpenAIResponsesAPI().stream(NAMES).feed(
            "response.failed", _data({"type": "response.failed", "response": failed})
        )


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_stream_size_is_bounded(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_module, "MAX_STREAM_CHARS", 10)
    api, _ = APIS[which]
    assembler = api.stream(NAMES)
    piece: dict[str, Any]
    if which == "chat":
        piece = {"choices": [{"index": 0, "delta": {"content": "123456"}}]}
    else:
        piece = {
            "type": "response.output_text.delta",
            "output_index": 0,
            "content_index": 0,
            "delta": "123456",
        }
    assembler.feed(None, _data(piece))
    with pytest.raises(AgentPainException, match="longer than 10 characters"):
        assembler.feed(None, _data(piece))


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_stream_tool_calls_are_bounded(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_module, "MAX_STREAM_TOOL_CALLS", 2)
    api, _ = APIS[which]
    assembler = api.stream(NAMES)

    def call(i: int) -> dict[str, Any]:
        if which == "chat":
            return {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": i, "id": f"c{i}", "function": {"name": "get_weather"}}
                            ]
                        },
                    }
                ]
            }
        return {
            "type": "response.output_item.added",
            "output_index": i,
            "item": _fcall(f"c{i}", "get_weather", ""),
        }

    assembler.feed(None, _data(call(0)))
    assembler.feed(None, _data(call(1)))
    with pytest.raises(AgentPainException, match="more than 2"):
        assembler.feed(None, _data(call(2)))


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["chat", "responses"])
def test_error_messages_match_fixture(which: str) -> None:
    api, folder = APIS[which]
    for case in _load(folder, "errors.json")["cases"]:
        assert api.error_message(case["status"], case["body"]) == case["message"]
        if case["body"] is not None:
            raw = _data(case["body"])
            assert api.error_message(case["status"], raw) == case["message"]
            assert api.error_message(case["status"], raw.encode()) == case["message"]


def test_error_messages_never_repeat_keys() -> None:
    body = {
        "error": {
            "message": "bad header Authorization: Bearer sk-live-123 for key sk-abc_DEF-9",
            "code": "invalid_api_key",
        }
    }
    message = OpenAIChatAPI().error_message(401, body)
    assert "sk-" not in message
    assert "live-123" not in message
    assert message == (
        "HTTP 401: bad header Authorization: [redacted] for key [redacted] (code invalid_api_key)"
    )
    assert OpenAIChatAPI().error_message(599, b"") == "HTTP 599: no error message"
    assert OpenAIChatAPI().error_message(500, "x" * 5000).endswith("x...")
    assert len(OpenAIChatAPI().error_message(500, "x" * 5000)) < 1100


def test_headers_and_paths() -> None:
    chat, responses = OpenAIChatAPI(), OpenAIResponsesAPI()
    assert chat.headers("sk-test") == {"Authorization": "Bearer sk-test"}
    assert chat.headers(None) == {}
    assert chat.path("gpt-4.1", stream=True) == "/chat/completions"
    assert responses.path("gpt-4.1", stream=False) == "/responses"
    assert (chat.name, responses.name) == ("openai", "openai-responses")
    for api in (chat, responses):
        assert api.default_base_url == "https://api.openai.com/v1"
        assert api.default_api_key_env == "OPENAI_API_KEY"


# --- the shared memory helpers --------------------------------------------------------------


def test_conversation_pairs_outcomes_by_id() -> None:
    a = ToolCall("get_weather", {"location": "A"}, id="a")
    b = ToolCall("fs.read", {"path": "b"}, id="b")
    out_a = ToolOutcome("a", "get_weather", True, {"t": 1})
    out_b = ToolOutcome("b", "fs.read", False, error=ToolFailure("ENOENT", "no b", "fs.read"))
    seen = Observation("seen")
    steps = conversation(
        [UserTurn("q"), AssistantTurn("t", (a, b)), out_b, seen, out_a, AssistantTurn("done")],
        "q",
    )
    assert steps == [
        UserTurn("q"),
        ToolExchange("t", (a, b), (out_a, out_b)),
        seen,
        AssistantTurn("done"),
    ]


def test_conversation_repairs_what_apis_refuse() -> None:
    a = ToolCall("get_weather", {}, id="a")
    stray = ToolOutcome("zzz", "fs.read", True, "text")
    twice = ToolOutcome("a", "get_weather", True, 2)
    steps = conversation(
        [
            stray,
            UserTurn("q"),
            AssistantTurn("", (a,)),
            ToolOutcome("a", "get_weather", True, 1),
            twice,
            AssistantTurn("", (ToolCall("x", {}, id="lost"),)),
        ],
        None,
    )
    assert steps[0] == Observation(
        "A result of tool 'fs.read' (call zzz) that answers no tool call of this turn: text"
    )
    assert isinstance(steps[2], ToolExchange)
    assert steps[3] == Observation(
        "A result of tool 'get_weather' (call a) that answers no tool call of this turn: 2"
    )
    last = steps[4]
    assert isinstance(last, ToolExchange)
    [missing] = last.outcomes
    assert (missing.tool_call_id, missing.success) == ("lost", False)
    assert missing.error is not None
    assert missing.error.code == MISSING_OUTCOME


def test_outcome_text_and_object() -> None:
    ok = ToolOutcome("a", "t", True, {"temp": "25°C"})
    assert outcome_text(ok) == '{"temp": "25°C"}'
    assert outcome_text(ToolOutcome("a", "t", True, "plain")) == "plain"
    assert outcome_text(ToolOutcome("a", "t", True, None)) == "null"
    failed = ToolOutcome("a", "t", False, error=ToolFailure("E", "m", "s"))
    assert outcome_object(failed) == {"error": {"code": "E", "message": "m", "source": "s"}}
    assert json.loads(outcome_text(failed)) == outcome_object(failed)
    assert outcome_object(ok) == {"result": {"temp": "25°C"}}


# --- through the execution loop ----------------------------------------------------------------


class _Weather(Tool):
    name = "get_weather"
    description = "The current weather of a city."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"location": {"type": "string"}}}

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return {"location": args["location"], "summary": "25°C, Sunny"}


class _Read(Tool):
    name = "fs.read"
    description = "Read a text file."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"path": {"type": "string"}}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise ToolError(f"{args['path']} does not exist", code="ENOENT")


class _Translating:
    """A provider doing what an HTTP provider does but the I/O: build, then parse a canned body."""

    name = "translating"

    def __init__(self, api: WireAPI, bodies: list[Any]) -> None:
        self.api = api
        self.bodies = bodies
        self.requests: list[dict[str, Any]] = []

    async def generate(self, prompt: str, context: AgentContext) -> Any:
        names = ToolNameMap.of(context.tools)
        request = self.api.build_request(
            prompt, context, model="gpt-4.1", options={}, stream=False, names=names
        )
        self.requests.append(json.loads(json.dumps(request)))
        return self.api.parse_response(self.bodies.pop(0), names)


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["chat", "responses"])
async def test_a_turn_through_the_loop(which: str) -> None:
    api, folder = APIS[which]
    calls = _load(folder, "response_parallel_tool_calls.json")["response"]
    answer = _load(folder, "response_text.json")["response"]
    provider = _Translating(api, [calls, answer])
    async with running(provider, [_Weather(), _Read()]) as harness:
        result = await harness.ask("Weather in Taipei, and notes.txt?")
    assert result.error is None
    assert result.replies == [_texts(api.parse_response(answer, NAMES))[0]]
    first, second = provider.requests
    if which == "chat":
        assert first["messages"] == [
            {"role": "user", "content": "Weather in Taipei, and notes.txt?"}
        ]
        assistant, weather, read = second["messages"][1:4]
        assert [c["function"]["name"] for c in assistant["tool_calls"]] == [
            "get_weather",
            "fs_read",
        ]
        assert (weather["tool_call_id"], read["tool_call_id"]) == ("call_62136354", "call_62136355")
        outputs = [weather["content"], read["content"]]
    else:
        assert first["input"] == [
            {"type": "message", "role": "user", "content": "Weather in Taipei, and notes.txt?"}
        ]
        items = second["input"][1:]
        assert [i["type"] for i in items] == ["function_call"] * 2 + ["function_call_output"] * 2
        assert [i["name"] for i in items[:2]] == ["get_weather", "fs_read"]
        assert [i["call_id"] for i in items[2:]] == ["call_weather_1", "call_read_2"]
        outputs = [i["output"] for i in items[2:]]
    assert json.loads(outputs[0]) == {"location": "Taipei", "summary": "25°C, Sunny"}
    assert json.loads(outputs[1])["error"]["code"] == "ENOENT"
    assert "notes.txt does not exist" in json.loads(outputs[1])["error"]["message"]


# --- anything at all -------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


_ITEM = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "reasoning", "x"]) | _JSON},
    optional={
        "content": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["output_text", "refusal", "text"]) | _JSON},
                optional={"text": _JSON, "refusal": _JSON},
            ),
            max_size=2,
        )
        | _JSON,
        "name": st.sampled_from(["get_weather", "fs_read"]) | _JSON,
        "call_id": _JSON,
        "arguments": st.sampled_from(["{}", '{"a":1}', "{"]) | _JSON,
    },
)


def _shaped(kind: str) -> st.SearchStrategy[Any]:
    """Bodies that look like the API's, with any value anywhere."""
    if kind == "responses":
        return st.fixed_dictionaries(
            {"output": st.lists(_ITEM, max_size=3) | _JSON},
            optional={
                "status": st.sampled_from(["completed", "incomplete", "failed"]) | _JSON,
                "error": _JSON,
                "usage": _JSON,
                "incomplete_details": _JSON,
            },
        )
    message = st.fixed_dictionaries(
        {},
        optional={
            "content": _JSON,
            "refusal": _JSON,
            "function_call": _JSON,
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "function": st.fixed_dictionaries(
                            {},
                            optional={
                                "name": st.sampled_from(["get_weather", "fs_read"]) | _JSON,
                                "arguments": _JSON,
                            },
                        )
                        | _JSON
                    },
                    optional={"id": _JSON, "type": _JSON, "index": _JSON},
                ),
                max_size=3,
            )
            | _JSON,
        },
    )
    choice = st.fixed_dictionaries(
        {},
        optional={
            "message": message | _JSON,
            "delta": message | _JSON,
            "index": st.just(0) | _JSON,
            "finish_reason": _JSON,
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "choices": st.lists(choice, max_size=2) | _JSON,
            "usage": _JSON,
            "error": _JSON,
            "id": _JSON,
        },
    )


_RESPONSES_EVENTS = [
    "response.created",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.refusal.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.completed",
    "response.incomplete",
]


def _events(kind: str) -> st.SearchStrategy[Any]:
    """Stream events that look like the API's, with any value anywhere."""
    if kind == "chat":
        return _shaped("chat")
    index = st.integers(min_value=-1, max_value=3) | _JSON
    return st.fixed_dictionaries(
        {"type": st.sampled_from(_RESPONSES_EVENTS) | _JSON},
        optional={
            "output_index": index,
            "content_index": index,
            "item_id": _JSON,
            "delta": st.text(max_size=5) | _JSON,
            "text": _JSON,
            "refusal": _JSON,
            "arguments": st.sampled_from(["{}", '{"a": 1}', "{"]) | _JSON,
            "item": _ITEM | _JSON,
            "part": _JSON,
            "response": _shaped("responses") | _JSON,
        },
    )


@pytest.mark.parametrize("which", ["chat", "responses"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_body_gives_a_response_or_a_clear_error(which: str, data: st.DataObject) -> None:
    api, _ = APIS[which]
    body = data.draw(_shaped(which) | _JSON)
    failures: list[str] = []
    try:
        api.parse_response(body, NAMES).to_core()
    except (AgentPainException, ProviderError) as exc:
        failures.append(str(exc))
    assembler = api.stream(NAMES)
    events = data.draw(st.lists(_events(which) | _JSON, max_size=6))
    try:
        for event in events:
            assembler.feed(None, json.dumps(event))
        assembler.finish().to_core()
    except (AgentPainException, ProviderError) as exc:
        failures.append(str(exc))
    # Any other exception fails the test; these two always say what went wrong.
    assert all(failures)


def test_parallel_calls_that_reuse_index_zero_stay_separate() -> None:
    """Ollama (and others) stream every parallel call with ``index: 0``; each has its own id.

    They were merged into one call named ``read_fileread_file`` whose arguments
    did not parse, so neither call was made.
    """
    stream = OpenAIChatAPI().stream(ToolNameMap(["read.file"]))
    for call_id, path in (("call_a", "a.txt"), ("call_b", "b.txt")):
        piece = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
        }
        stream.feed(None, chunk({"role": "assistant", "tool_calls": [piece]}))
    stream.feed(None, chunk({}, "tool_calls"))
    stream.feed(None, "[DONE]")
    response = stream.finish()
    calls = [s.tool_call for s in response.segments if s.tool_call is not None]
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_a", "read.file", {"path": "a.txt"}),
        ("call_b", "read.file", {"path": "b.txt"}),
    ]
    assert "errors" not in (response.metadata or {})


def test_a_reused_index_keeps_its_later_pieces_with_the_newest_call() -> None:
    """After a new id reuses an index, pieces of that index without an id continue the new call."""
    stream = OpenAIChatAPI().stream(ToolNameMap(["f", "g"]))
    pieces = [
        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"x":'}},
        {"index": 0, "function": {"arguments": " 1}"}},
        {"index": 0, "id": "call_2", "function": {"name": "g", "arguments": '{"y":'}},
        {"index": 0, "function": {"arguments": " 2}"}},
    ]
    for piece in pieces:
        stream.feed(None, chunk({"tool_calls": [piece]}))
    stream.feed(None, chunk({}, "tool_calls"))
    calls = [s.tool_call for s in stream.finish().segments if s.tool_call is not None]
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_1", "f", {"x": 1}),
        ("call_2", "g", {"y": 2}),
    ]


def test_a_server_that_renames_a_call_mid_stream_still_makes_one_call() -> None:
    """A new id at an index whose call is not finished yet is the same call, as before."""
    stream = OpenAIChatAPI().stream(ToolNameMap(["f"]))
    pieces = [
        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"x":'}},
        {"index": 0, "id": "call_1b", "function": {"arguments": " 1}"}},
    ]
    for piece in pieces:
        stream.feed(None, chunk({"tool_calls": [piece]}))
    stream.feed(None, chunk({}, "tool_calls"))
    calls = [s.tool_call for s in stream.finish().segments if s.tool_call is not None]
    assert [(c.id, c.name, c.args) for c in calls] == [("call_1", "f", {"x": 1})]
