"""The Anthropic Messages translation, both directions, against the API's documented shapes.

The fixtures in ``tests/fixtures/providers/anthropic`` hold request and response
bodies in the form of Anthropic's API reference (messages, tool use, streaming,
errors), each with the exact body or ``ProviderResponse`` openstarry must make.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_harness import running
from openstarry import core
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
from openstarry.errors import AgentPainException, ManifestError, ProviderError, ToolError
from openstarry.protocol import ProviderResponse
from openstarry.providers import anthropic
from openstarry.providers._memory import MISSING_OUTCOME
from openstarry.providers.anthropic import (
    DEFAULT_MAX_TOKENS,
    OBSERVATION_PREFIX,
    THINKING_FIELD,
    AnthropicAPI,
)
from openstarry.providers.wire import ToolNameMap, WireAPI

FIXTURES = Path(__file__).parent / "fixtures" / "providers" / "anthropic"
API = AnthropicAPI()
PROMPT = "Weather in Taipei, and read notes.txt"
MODEL = "claude-sonnet-4-5"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return data


class Weather(Tool):
    name = "get_weather"
    description = "Get the current weather in a given location."
    parameters = MappingProxyType(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city, e.g. Taipei"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["location"],
            "additionalProperties": False,
        }
    )

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return {"location": args["location"], "temperature": 25}


class ReadFile(Tool):
    name = "fs.read"
    description = "Read a text file."
    parameters = MappingProxyType(
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Relative path"}},
            "required": ["path"],
        }
    )

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return "notes"


TOOLS: dict[str, Tool] = {"get_weather": Weather(), "fs.read": ReadFile()}
NAMES = ToolNameMap.of(TOOLS)
WARNING = (
    'Warning: fs.read has failed 3 times in a row with the same arguments {"path": "notes.txt"}. '
    "Do not call it that way again; try something else or answer the user."
)


def context_of(
    entries: list[MemoryEntry], *, instructions: str | None = None, tools: Any = None
) -> AgentContext:
    session = Session("s")
    session.memory.extend(entries)
    return AgentContext(
        tools=TOOLS if tools is None else tools, session=session, instructions=instructions
    )


def conversation() -> AgentContext:
    """An earlier exchange, then a turn with two calls, their outcomes and an observation."""
    return context_of(
        [
            UserTurn("Hello"),
            AssistantTurn("Hi! How can I help?"),
            UserTurn(PROMPT),
            AssistantTurn(
                "Sure, let me check.",
                (
                    core.ToolCall("get_weather", {"location": "Taipei"}, "call_1"),
                    core.ToolCall("fs.read", {"path": "notes.txt"}, "call_2"),
                ),
            ),
            ToolOutcome(
                "call_1",
                "get_weather",
                True,
                result={
                    "location": "Taipei",
                    "temperature": 25,
                    "unit": "celsius",
                    "condition": "Sunny",
                },
            ),
            ToolOutcome(
                "call_2",
                "fs.read",
                False,
                error=ToolFailure("ENOENT", "notes.txt: no such file", "tool"),
            ),
            Observation(WARNING),
        ],
        instructions="You are a weather agent.",
    )


def build(
    context: AgentContext,
    *,
    prompt: str = PROMPT,
    options: dict[str, Any] | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    return API.build_request(
        prompt,
        context,
        model=MODEL,
        options=options or {},
        stream=stream,
        names=ToolNameMap.of(context.tools),
    )


def feed_all(
    events: Sequence[tuple[str | None, str]],
) -> tuple[anthropic.AnthropicStream, list[str]]:
    assembler = API.stream(NAMES)
    deltas = []
    for event, data in events:
        delta = assembler.feed(event, data)
        if delta is not None:
            deltas.append(delta)
    return assembler, deltas


def event(data: dict[str, Any]) -> tuple[str, str]:
    return str(data["type"]), json.dumps(data)


def message_start(**usage: int) -> tuple[str, str]:
    return event(
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage or {"input_tokens": 10, "output_tokens": 1},
            },
        }
    )


def block_start(index: int, block: dict[str, Any]) -> tuple[str, str]:
    return event({"type": "content_block_start", "index": index, "content_block": block})


def delta(index: int, **fields: Any) -> tuple[str, str]:
    return event({"type": "content_block_delta", "index": index, "delta": fields})


def block_stop(index: int) -> tuple[str, str]:
    return event({"type": "content_block_stop", "index": index})


def message_end(stop_reason: str = "end_turn") -> list[tuple[str, str]]:
    return [
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 20},
            }
        ),
        event({"type": "message_stop"}),
    ]


def texts(response: ProviderResponse) -> list[str]:
    return [s.text for s in response.segments if s.text is not None and s.type != "reasoning"]


def calls(response: ProviderResponse) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [
        (s.tool_call.id, s.tool_call.name, s.tool_call.args)
        for s in response.segments
        if s.tool_call is not None
    ]


# --- the API's description ----------------------------------------------------------------------


def test_it_is_a_wire_api_with_anthropics_defaults() -> None:
    api: WireAPI = API
    assert api.name == "anthropic"
    assert api.default_base_url == "https://api.anthropic.com/v1"
    assert api.default_api_key_env == "ANTHROPIC_API_KEY"
    assert api.path(MODEL, stream=False) == api.path(MODEL, stream=True) == "/messages"


def test_headers_carry_the_key_and_version() -> None:
    assert API.headers("sk-ant-test") == {
        "x-api-key": "sk-ant-test",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    assert "x-api-key" not in API.headers(None)
    assert "x-api-key" not in API.headers("")


# --- upstream ------------------------------------------------------------------------------------


def test_conversation_request_matches_the_fixture() -> None:
    body = build(conversation(), options={"temperature": 0.2})
    assert body == load("request_conversation.json")["expected"]
    json.dumps(body)  # what the HTTP provider sends must be JSON


def test_streaming_adds_stream_true_and_nothing_else() -> None:
    plain = build(conversation())
    streamed = build(conversation(), stream=True)
    assert streamed.pop("stream") is True
    assert streamed == plain


def test_the_prompt_is_the_last_user_turn_and_not_repeated() -> None:
    body = build(context_of([UserTurn(PROMPT)]))
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    assert "system" not in body
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS


def test_a_prompt_missing_from_memory_is_added() -> None:
    body = build(context_of([]), prompt="hi")
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_no_tools_means_no_tools_key() -> None:
    assert "tools" not in build(context_of([UserTurn(PROMPT)], tools={}))


def test_tool_results_come_first_then_observations_then_the_next_user_words() -> None:
    context = context_of(
        [
            UserTurn("first"),
            AssistantTurn("", (core.ToolCall("get_weather", {"location": "Oslo"}, "c1"),)),
            ToolOutcome("c1", "get_weather", True, result="5°C"),
            Observation("the run stopped at the tool round limit"),
            UserTurn("second"),
        ]
    )
    messages = build(context, prompt="second")["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    # Empty assistant text is left out: the API refuses empty text blocks.
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"location": "Oslo"}}
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "5°C"},
        {"type": "text", "text": OBSERVATION_PREFIX + "the run stopped at the tool round limit"},
        {"type": "text", "text": "second"},
    ]


def test_outcomes_pair_by_id_in_call_order_whatever_their_order_in_memory() -> None:
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn(
                "x",
                (
                    core.ToolCall("get_weather", {"location": "A"}, "a"),
                    core.ToolCall("get_weather", {"location": "B"}, "b"),
                ),
            ),
            ToolOutcome("b", "get_weather", True, result=2),
            ToolOutcome("a", "get_weather", True, result=1),
        ]
    )
    results = build(context, prompt="go")["messages"][2]["content"]
    assert [(r["tool_use_id"], r["content"]) for r in results] == [("a", "1"), ("b", "2")]


def test_a_call_without_outcome_gets_an_error_result_and_a_stray_outcome_becomes_text() -> None:
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn("", (core.ToolCall("get_weather", {}, "c1"),)),
            ToolOutcome("zz", "fs.read", True, result={"a": 1}),
        ]
    )
    messages = build(context, prompt="go")["messages"]
    missing = {
        "error": {"code": MISSING_OUTCOME, "message": "the call got no result", "source": "core"}
    }
    assert messages[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "c1",
            "content": json.dumps(missing),
            "is_error": True,
        },
        {
            "type": "text",
            "text": OBSERVATION_PREFIX + "A result of tool 'fs.read' (call zz) that answers no "
            'tool call of this turn: {"a": 1}',
        },
    ]


def test_call_ids_are_made_legal_the_same_way_for_the_call_and_its_result() -> None:
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn("", (core.ToolCall("fs.read", {"path": "a"}, "call:1.x"),)),
            ToolOutcome("call:1.x", "fs.read", True, result=""),
        ]
    )
    messages = build(context, prompt="go")["messages"]
    assert messages[1]["content"][0]["id"] == "call_1_x"
    assert messages[1]["content"][0]["name"] == "fs_read"
    # An empty result is a tool_result without content.
    assert messages[2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1_x"}]


def test_same_role_messages_merge_and_blank_turns_vanish() -> None:
    context = context_of(
        [
            UserTurn("one"),
            AssistantTurn("   "),
            UserTurn("two"),
            Observation("note"),
        ]
    )
    messages = build(context, prompt="two")["messages"]
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "one"},
                {"type": "text", "text": "two"},
                {"type": "text", "text": OBSERVATION_PREFIX + "note"},
            ],
        }
    ]


def test_options_go_into_the_body_and_max_tokens_can_be_set() -> None:
    body = build(
        context_of([UserTurn(PROMPT)]),
        options={"max_tokens": 100, "tool_choice": {"type": "auto"}, "top_k": 5},
    )
    assert body["max_tokens"] == 100
    assert body["tool_choice"] == {"type": "auto"}
    assert body["top_k"] == 5


@pytest.mark.parametrize("key", ["model", "messages", "system", "tools", "stream"])
def test_options_cannot_override_what_openstarry_builds(key: str) -> None:
    with pytest.raises(ManifestError, match=f"provider.options.{key}") as info:
        build(context_of([UserTurn(PROMPT)]), options={key: "x"})
    assert info.value.field == f"provider.options.{key}"


@pytest.mark.parametrize("value", [0, -1, "100", True, 1.5])
def test_max_tokens_must_be_a_positive_integer(value: Any) -> None:
    with pytest.raises(ManifestError, match="max_tokens must be a positive integer"):
        build(context_of([UserTurn(PROMPT)]), options={"max_tokens": value})


def test_an_empty_model_is_refused() -> None:
    with pytest.raises(ManifestError, match=r"provider\.model is required"):
        API.build_request(PROMPT, conversation(), model="", options={}, stream=False, names=NAMES)


def test_colliding_and_dotted_names_round_trip() -> None:
    class Named(ReadFile):
        def __init__(self, name: str) -> None:
            self.name = name

    tools: dict[str, Tool] = {n: Named(n) for n in ("fs.read", "fs_read", "weather:get")}
    names = ToolNameMap.of(tools)
    wire = [t["name"] for t in build(context_of([UserTurn("x")], tools=tools))["tools"]]
    assert wire == ["fs_read", "fs_read_2", "weather_get"]
    body = {
        "content": [
            {"type": "tool_use", "id": f"t{i}", "name": w, "input": {}} for i, w in enumerate(wire)
        ]
    }
    assert [c[1] for c in calls(API.parse_response(body, names))] == list(tools)


# --- downstream ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "response_text.json",
        "response_tool_use.json",
        "response_mixed.json",
        "response_parallel.json",
        "response_thinking.json",
    ],
)
def test_response_fixture_becomes_the_expected_provider_response(name: str) -> None:
    fixture = load(name)
    response = API.parse_response(fixture["response"], NAMES)
    assert response.model_dump(mode="json", by_alias=True) == fixture["expected"]
    assert response.to_core() == ProviderResponse.model_validate(fixture["expected"]).to_core()


@pytest.mark.parametrize(
    "name", ["stream_text.json", "stream_parallel.json", "stream_thinking.json"]
)
def test_stream_fixture_assembles_the_non_streamed_response(name: str) -> None:
    fixture = load(name)
    assembler = API.stream(NAMES)
    deltas = []
    for item in fixture["events"]:
        assert not assembler.done
        piece = assembler.feed(item["event"], json.dumps(item["data"]))
        if piece is not None:
            deltas.append(piece)
    assert assembler.done
    assert deltas == fixture["deltas"]
    same = load(fixture["same_as"])
    streamed = assembler.finish()
    assert streamed == API.parse_response(same["response"], NAMES)
    assert streamed.model_dump(mode="json", by_alias=True) == same["expected"]


def test_thinking_goes_back_from_memory_before_the_text_and_calls() -> None:
    fixture = load("response_thinking.json")
    thinking, redacted = fixture["response"]["content"][:2]
    response = API.parse_response(fixture["response"], NAMES).to_core()
    reasoning = tuple(s for s in response.segments if s.type == "reasoning")
    core_calls = tuple(s.tool_call for s in response.segments if s.tool_call is not None)
    context = context_of(
        [
            UserTurn("w"),
            AssistantTurn("Let me check.", core_calls, reasoning),
            ToolOutcome("toolu_01A", "get_weather", True, result="sunny"),
            AssistantTurn("Sunny.", (), (core.ContentSegment("reasoning", text="unsigned"),)),
        ]
    )
    messages = build(context, prompt="w")["messages"]
    assert messages[1]["content"] == [
        thinking,
        redacted,
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": "toolu_01A",
            "name": "get_weather",
            "input": {"location": "Taipei"},
        },
    ]
    # Reasoning without a signature (another provider's) is not sent.
    assert messages[3]["content"] == [{"type": "text", "text": "Sunny."}]


def test_thinking_of_older_memory_on_the_first_call_still_goes_back() -> None:
    thinking = {"type": "thinking", "thinking": "Check.", "signature": "EqQBCg=="}
    call = core.ToolCall("get_weather", {"location": "X"}, "toolu_9")
    carried = (
        core.decode_response(
            json.dumps(
                {
                    "segments": [
                        {
                            "type": "tool_call",
                            "toolCall": {
                                "id": call.id,
                                "name": call.name,
                                "args": call.args,
                                THINKING_FIELD: [thinking],
                            },
                        }
                    ]
                }
            ).encode()
        )
        .segments[0]
        .tool_call
    )
    assert carried is not None
    context = context_of(
        [
            UserTurn("w"),
            AssistantTurn("", (carried,)),
            ToolOutcome("toolu_9", "get_weather", True, result="sunny"),
        ]
    )
    assert build(context, prompt="w")["messages"][1]["content"][0] == thinking


def test_an_unknown_block_becomes_a_note_and_the_rest_is_kept() -> None:
    body = {
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "tool_use", "id": "t1", "name": "fs_read", "input": {"path": "a"}},
        ],
        "stop_reason": "tool_use",
    }
    response = API.parse_response(body, NAMES)
    assert [s.type for s in response.segments] == ["text", "text", "tool_call"]
    note = (
        "[openstarry] The answer held a content block of type 'web_search_tool_result', "
        "which openstarry does not handle; it was left out."
    )
    assert texts(response)[1] == note
    assert calls(response) == [("t1", "fs.read", {"path": "a"})]
    assert response.metadata == {"stop_reason": "tool_use", "errors": [note]}


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            {"type": "tool_use", "id": "t", "name": "fs_read", "input": '{"path": '},
            "The model called tool 'fs.read', but its arguments are not valid JSON (Expecting "
            "value: line 1 column 10 (char 9)): '{\"path\": '. The call was not made.",
        ),
        (
            {"type": "tool_use", "id": "t", "name": "fs_read", "input": [1, 2]},
            "The model called tool 'fs.read', but its arguments are a JSON list, not an object: "
            "'[1, 2]'. The call was not made.",
        ),
        (
            {"type": "tool_use", "id": "t", "name": "fs_read", "input": '{"x": NaN}'},
            "The model called tool 'fs.read', but its arguments are not valid JSON (NaN is not "
            "JSON): '{\"x\": NaN}'. The call was not made.",
        ),
        (
            {"type": "tool_use", "id": "t", "input": {}},
            "The model made a tool call without a tool name: "
            "\"{'type': 'tool_use', 'id': 't', 'input': {}}\"; it was not made.",
        ),
        (
            {"type": "text"},
            "The answer held a text block without text: \"{'type': 'text'}\".",
        ),
        (
            {"text": "typeless"},
            "The answer held a content block without a type: \"{'text': 'typeless'}\"; "
            "it was left out.",
        ),
        (
            "just a string",
            "The answer held a content block without a type: 'just a string'; it was left out.",
        ),
    ],
)
def test_unreadable_blocks_become_notes(block: Any, expected: str) -> None:
    response = API.parse_response({"content": [block]}, NAMES)
    assert calls(response) == []
    assert texts(response) == ["[openstarry] " + expected]
    assert response.metadata == {"errors": ["[openstarry] " + expected]}


def test_arguments_nested_deeper_than_the_core_allows_become_a_note() -> None:
    deep: Any = {}
    for _ in range(200):
        deep = {"a": deep}
    body = {"content": [{"type": "tool_use", "id": "t", "name": "fs_read", "input": deep}]}
    [note] = texts(API.parse_response(body, NAMES))
    assert note.startswith(
        "[openstarry] The model called tool 'fs.read', but openstarry cannot carry its arguments"
    )


def test_input_given_as_json_text_is_parsed_and_a_missing_id_gets_a_uuid() -> None:
    body = {"content": [{"type": "tool_use", "name": "fs_read", "input": '{"path": "a"}'}]}
    [(call_id, name, args)] = calls(API.parse_response(body, NAMES))
    assert (name, args) == ("fs.read", {"path": "a"})
    assert call_id is not None
    assert len(call_id) == 36


def test_a_refusal_says_so_and_runs_no_tool() -> None:
    body = {
        "id": "msg_r",
        "content": [
            {"type": "text", "text": "I"},
            {"type": "tool_use", "id": "t", "name": "fs_read", "input": {}},
        ],
        "stop_reason": "refusal",
    }
    response = API.parse_response(body, NAMES)
    assert calls(response) == []
    assert texts(response) == [
        "I",
        "The model refused to answer: Anthropic's safety classifiers stopped the answer "
        "(stop_reason refusal).",
    ]
    assert response.metadata == {"id": "msg_r", "stop_reason": "refusal", "refused": True}


@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
def test_an_answer_stopped_at_a_limit_says_it_may_be_incomplete(reason: str) -> None:
    body = {"content": [{"type": "text", "text": "The answer is"}], "stop_reason": reason}
    response = API.parse_response(body, NAMES)
    assert texts(response)[0] == "The answer is"
    assert texts(response)[1].startswith("[openstarry] The answer stopped at the model's")
    assert texts(response)[1].endswith(f"({reason}); it may be incomplete.")


def test_usage_counts_the_api_left_out_are_none() -> None:
    assert anthropic.normalise_usage({"output_tokens": 5, "service_tier": "standard"}) == {
        "input_tokens": None,
        "output_tokens": 5,
        "total_tokens": None,
        "raw": {"output_tokens": 5, "service_tier": "standard"},
    }
    assert anthropic.normalise_usage({"cache_read_input_tokens": 7, "output_tokens": True}) == {
        "input_tokens": 7,
        "output_tokens": None,
        "total_tokens": None,
        "raw": {"cache_read_input_tokens": 7, "output_tokens": True},
    }


def test_an_empty_answer_is_one_empty_text_segment() -> None:
    response = API.parse_response({"content": [], "stop_reason": "end_turn"}, NAMES)
    assert response.model_dump(mode="json", by_alias=True)["segments"] == [
        {"type": "text", "text": ""}
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "not a JSON object but list"),
        ("text", "not a JSON object but str"),
        ({}, "has no content list"),
        ({"content": None}, "has no content list"),
        ({"content": {"type": "text"}}, "has no content list"),
    ],
)
def test_a_body_that_is_not_a_message_is_agent_pain(body: Any, message: str) -> None:
    with pytest.raises(AgentPainException, match=message):
        API.parse_response(body, NAMES)


def test_an_error_body_in_a_success_response_is_a_provider_error() -> None:
    body = {"type": "error", "error": {"type": "api_error", "message": "Internal"}}
    with pytest.raises(ProviderError, match=r"\(api_error\): Internal"):
        API.parse_response(body, NAMES)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
_BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "thinking", "image", "?"])},
    optional={"text": _JSON, "name": _JSON, "id": _JSON, "input": _JSON},
)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        _JSON,
        st.fixed_dictionaries(
            {"content": st.lists(_BLOCK | _JSON, max_size=4)},
            optional={"stop_reason": _JSON, "usage": _JSON, "model": _JSON, "id": _JSON},
        ),
    )
)
def test_any_body_is_a_response_or_agent_pain(body: Any) -> None:
    try:
        response = API.parse_response(body, NAMES)
    except (AgentPainException, ProviderError) as exc:
        message = str(exc)
    else:
        response.to_core()  # whatever comes out, the core accepts
        return
    assert message  # any other exception fails the test; these two say what went wrong


# --- streaming -----------------------------------------------------------------------------------


def test_invalid_streamed_arguments_become_a_note_and_other_calls_stand() -> None:
    assembler, deltas = feed_all(
        [
            message_start(),
            block_start(0, {"type": "tool_use", "id": "t1", "name": "fs_read", "input": {}}),
            delta(0, type="input_json_delta", partial_json='{"path": "a"'),
            delta(0, type="input_json_delta", partial_json=", oops}"),
            block_stop(0),
            block_start(1, {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}}),
            delta(1, type="input_json_delta", partial_json='{"location": "B"}'),
            block_stop(1),
            *message_end("tool_use"),
        ]
    )
    assert deltas == []
    response = assembler.finish()
    assert calls(response) == [("t2", "get_weather", {"location": "B"})]
    assert texts(response)[0].startswith(
        "[openstarry] The model called tool 'fs.read', but its arguments are not valid JSON"
    )


def test_a_tool_call_without_input_deltas_has_no_arguments() -> None:
    assembler, _ = feed_all(
        [
            message_start(),
            block_start(0, {"type": "tool_use", "id": "t1", "name": "fs_read", "input": {}}),
            block_stop(0),
            *message_end("tool_use"),
        ]
    )
    assert calls(assembler.finish()) == [("t1", "fs.read", {})]


def test_a_cut_stream_keeps_its_text_and_runs_no_tool() -> None:
    assembler, deltas = feed_all(
        [
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            delta(0, type="text_delta", text="Let me "),
            delta(0, type="text_delta", text="check"),
            block_stop(0),
            block_start(1, {"type": "tool_use", "id": "t1", "name": "fs_read", "input": {}}),
            delta(1, type="input_json_delta", partial_json='{"pa'),
        ]
    )
    assert not assembler.done
    assert deltas == ["Let me ", "check"]
    response = assembler.finish()
    assert calls(response) == []
    notes = [
        "[openstarry] The call of tool 'fs.read' was cut off with the response; it was not made.",
        "[openstarry] The response was cut off before the API said it was complete.",
    ]
    assert texts(response) == ["Let me check", *notes]
    assert response.metadata == {
        "id": "msg_1",
        "model": "claude-x",
        "usage": {
            "input_tokens": 10,
            "output_tokens": 1,
            "total_tokens": 11,
            "raw": {"input_tokens": 10, "output_tokens": 1},
        },
        "truncated": True,
        "errors": notes,
    }


def test_a_stream_cut_before_message_stop_is_truncated_even_when_blocks_closed() -> None:
    assembler, _ = feed_all(
        [
            message_start(),
            block_start(0, {"type": "text", "text": "Done."}),
            block_stop(0),
            message_end()[0],
        ]
    )
    assert texts(assembler.finish()) == [
        "Done.",
        "[openstarry] The response was cut off before the API said it was complete.",
    ]


def test_an_empty_stream_is_agent_pain() -> None:
    assembler, _ = feed_all([("ping", '{"type": "ping"}'), (None, "")])
    with pytest.raises(AgentPainException, match="ended before the response began"):
        assembler.finish()


def test_an_error_event_is_a_provider_error() -> None:
    assembler = API.stream(NAMES)
    assembler.feed(*message_start())
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(
        ProviderError, match=r"^Anthropic API error \(overloaded_error\): Overloaded$"
    ):
        assembler.feed("error", json.dumps(error))


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", "[" * 100_000, '{"a": NaN}'])
def test_an_event_that_is_not_a_json_object_is_agent_pain(data: str) -> None:
    with pytest.raises(AgentPainException, match="content_block_delta"):
        API.stream(NAMES).feed("content_block_delta", data)


def test_thinking_and_unknown_deltas_and_events_are_assembled_quietly() -> None:
    assembler, deltas = feed_all(
        [
            message_start(),
            block_start(0, {"type": "thinking", "thinking": ""}),
            delta(0, type="thinking_delta", thinking="Let me think"),
            delta(0, type="signature_delta", signature="EqQB"),
            block_stop(0),
            block_start(1, {"type": "text", "text": ""}),
            delta(1, type="citations_delta", citation={}),
            delta(1, type="text_delta", text="Answer."),
            block_stop(1),
            event({"type": "some_future_event"}),
            *message_end(),
        ]
    )
    assert deltas == ["Answer."]
    response = assembler.finish()
    assert texts(response) == ["Answer."]
    assert response.metadata is not None
    assert response.metadata["usage"]["output_tokens"] == 20


def test_events_after_message_stop_are_ignored() -> None:
    assembler, _ = feed_all(
        [message_start(), block_start(0, {"type": "text", "text": "A"}), *message_end()]
    )
    assert assembler.feed(*delta(0, type="text_delta", text="late")) is None
    assert texts(assembler.finish()) == ["A"]


def test_a_stream_past_the_limit_is_agent_pain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anthropic, "MAX_STREAM_CHARS", 400)
    assembler = API.stream(NAMES)
    assembler.feed(*message_start())
    with pytest.raises(AgentPainException, match="exceeds 400 characters"):
        assembler.feed(*delta(0, type="text_delta", text="x" * 200))


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", load("errors.json")["cases"], ids=lambda c: str(c["status"]))
def test_error_messages(case: dict[str, Any]) -> None:
    assert API.error_message(case["status"], case["body"]) == case["message"]
    if not isinstance(case["body"], (str, type(None))):
        raw = json.dumps(case["body"]).encode()
        assert API.error_message(case["status"], raw) == case["message"]


def test_error_messages_are_bounded() -> None:
    body = {"type": "error", "error": {"type": "api_error", "message": "x" * 10_000}}
    assert len(API.error_message(500, body)) < 1100


# --- through the execution loop ------------------------------------------------------------------


class WireProvider:
    """A provider that builds each request with the API and answers with scripted bodies."""

    name = "anthropic-wire"

    def __init__(self, answers: list[dict[str, Any]], *, stream: bool = False) -> None:
        self.answers = answers
        self.stream = stream
        self.requests: list[dict[str, Any]] = []

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        names = ToolNameMap.of(context.tools)
        body = API.build_request(
            prompt, context, model=MODEL, options={}, stream=self.stream, names=names
        )
        self.requests.append(json.loads(json.dumps(body)))  # what would go on the wire
        return API.parse_response(self.answers[len(self.requests) - 1], names)


class FailingRead(ReadFile):
    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise ToolError(f"{args['path']}: no such file", code="ENOENT")


@pytest.mark.anyio
async def test_a_turn_through_the_loop_pairs_each_result_with_its_call() -> None:
    first = load("response_parallel.json")["response"]
    second = {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "25°C in Taipei; notes.txt does not exist."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 700, "output_tokens": 12},
    }
    provider = WireProvider([first, second])
    async with running(provider, [Weather(), FailingRead()]) as harness:
        result = await harness.ask("Weather in Taipei, and read notes.txt")
    assert result.error is None
    assert result.replies == [
        "I'll check the weather and read your notes.",
        "25°C in Taipei; notes.txt does not exist.",
    ]
    assert len(provider.requests) == 2
    messages = provider.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == first["content"]  # the answer, as the model gave it
    results = messages[2]["content"]
    assert [r["tool_use_id"] for r in results] == [
        "toolu_01A09q90qw90lq917835lq9",
        "toolu_01B8K2dY7f3r0xQe9Zc4mN5p",
    ]
    assert "is_error" not in results[0]
    assert json.loads(results[0]["content"]) == {"location": "Taipei", "temperature": 25}
    assert results[1]["is_error"] is True
    assert json.loads(results[1]["content"])["error"]["code"] == "ENOENT"
