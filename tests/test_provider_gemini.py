"""The Gemini ``generateContent`` translation, both directions, against the documented shapes.

The fixtures in ``tests/fixtures/providers/gemini`` hold request and response
bodies in the form of the Gemini API reference (``generateContent``,
function calling, ``streamGenerateContent?alt=sse``, errors), each with the
exact body or ``ProviderResponse`` openstarry must make.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_harness import running
from openstarry import core, tool
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
from openstarry.protocol import ProviderResponse, ToolCall
from openstarry.providers import _gemini_response, gemini
from openstarry.providers._memory import MISSING_OUTCOME
from openstarry.providers.anthropic import OBSERVATION_PREFIX
from openstarry.providers.gemini import SKIP_THOUGHT_SIGNATURE, GeminiAPI, gemini_schema
from openstarry.providers.wire import ToolNameMap, WireAPI

FIXTURES = Path(__file__).parent / "fixtures" / "providers" / "gemini"
API = GeminiAPI()
PROMPT = "Weather in Taipei, and read notes.txt"
MODEL = "gemini-2.5-flash"
SIGNATURE = "Q2lZQnZqejJFdXZ0UnY="


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


class Clock(Tool):
    name = "clock"
    description = "The time."

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return "noon"


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


def signed_call(name: str, args: dict[str, Any], call_id: str, signature: str) -> core.ToolCall:
    """A call as the loop keeps it after a Gemini answer: the signature rides on the core object."""
    wire = {"id": call_id, "name": name, "args": args, "thoughtSignature": signature}
    return ToolCall.model_validate(wire).to_core()


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
                    signed_call("get_weather", {"location": "Taipei"}, "call_1", SIGNATURE),
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
    api: GeminiAPI = API,
) -> dict[str, Any]:
    return api.build_request(
        prompt,
        context,
        model=MODEL,
        options=options or {},
        stream=stream,
        names=ToolNameMap.of(context.tools),
    )


def chunk(
    parts: list[dict[str, Any]] | None = None, finish: str | None = None, **extra: Any
) -> tuple[None, str]:
    candidate: dict[str, Any] = {"index": 0}
    if parts is not None:
        candidate["content"] = {"role": "model", "parts": parts}
    if finish is not None:
        candidate["finishReason"] = finish
    return None, json.dumps({"candidates": [candidate], **extra})


def feed_all(events: Sequence[tuple[str | None, str]]) -> tuple[gemini.GeminiStream, list[str]]:
    assembler = API.stream(NAMES)
    deltas = []
    for event, data in events:
        piece = assembler.feed(event, data)
        if piece is not None:
            deltas.append(piece)
    return assembler, deltas


def parse(*parts: Any, finish: str | None = "STOP", **candidate: Any) -> ProviderResponse:
    body = {"candidates": [{"content": {"role": "model", "parts": list(parts)}, **candidate}]}
    if finish is not None:
        body["candidates"][0]["finishReason"] = finish
    return API.parse_response(body, NAMES)


def texts(response: ProviderResponse) -> list[str]:
    return [s.text for s in response.segments if s.text is not None and s.type != "reasoning"]


def calls(response: ProviderResponse) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [
        (s.tool_call.id, s.tool_call.name, s.tool_call.args)
        for s in response.segments
        if s.tool_call is not None
    ]


def without_ids(dumped: dict[str, Any]) -> dict[str, Any]:
    for segment in dumped["segments"]:
        if "toolCall" in segment:
            segment["toolCall"]["id"] = "<uuid>"
    return dumped


# --- the API's description ----------------------------------------------------------------------


def test_it_is_a_wire_api_with_geminis_defaults() -> None:
    api: WireAPI = API
    assert api.name == "gemini"
    assert api.default_base_url == "https://generativelanguage.googleapis.com/v1beta"
    assert api.default_api_key_env == "GEMINI_API_KEY"
    assert API.api_key_envs == ("GEMINI_API_KEY", "GOOGLE_API_KEY")


@pytest.mark.parametrize(
    ("model", "stream", "path"),
    [
        ("gemini-2.5-flash", False, "/models/gemini-2.5-flash:generateContent"),
        ("gemini-2.5-flash", True, "/models/gemini-2.5-flash:streamGenerateContent?alt=sse"),
        ("models/gemini-2.0-flash", False, "/models/gemini-2.0-flash:generateContent"),
        ("tunedModels/my-model-7", False, "/tunedModels/my-model-7:generateContent"),
        ("../../v1/files?x", False, "/models/..%2F..%2Fv1%2Ffiles%3Fx:generateContent"),
    ],
)
def test_path(model: str, stream: bool, path: str) -> None:
    assert API.path(model, stream=stream) == path


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_is_refused(model: str) -> None:
    with pytest.raises(ManifestError, match=r"provider\.model is required") as info:
        API.path(model, stream=False)
    assert info.value.field == "provider.model"


def test_the_key_goes_in_a_header_never_in_the_path() -> None:
    assert API.headers("AIza-secret") == {
        "x-goog-api-key": "AIza-secret",
        "content-type": "application/json",
    }
    assert API.headers(None) == {"content-type": "application/json"}
    assert "key=" not in API.path(MODEL, stream=True)


# --- upstream: contents --------------------------------------------------------------------------


def test_conversation_request_matches_the_fixture() -> None:
    body = build(conversation(), options={"temperature": 0.2})
    assert body == load("request_conversation.json")["expected"]
    json.dumps(body)


def test_streaming_changes_the_path_not_the_body() -> None:
    assert build(conversation(), stream=True) == build(conversation())


def test_the_prompt_is_the_last_user_turn_and_not_repeated() -> None:
    body = build(context_of([UserTurn(PROMPT)]))
    assert body["contents"] == [{"role": "user", "parts": [{"text": PROMPT}]}]
    assert "systemInstruction" not in body
    assert "generationConfig" not in body


def test_a_prompt_missing_from_memory_is_added() -> None:
    assert build(context_of([]), prompt="hi")["contents"] == [
        {"role": "user", "parts": [{"text": "hi"}]}
    ]


def test_a_current_call_without_signature_gets_the_placeholder_on_the_first_call_only() -> None:
    entries: list[MemoryEntry] = [
        UserTurn("earlier"),
        AssistantTurn("", (core.ToolCall("get_weather", {"location": "A"}, "old"),)),
        ToolOutcome("old", "get_weather", True, result=1),
        UserTurn("now"),
        AssistantTurn(
            "",
            (
                core.ToolCall("get_weather", {"location": "B"}, "c1"),
                core.ToolCall("get_weather", {"location": "C"}, "c2"),
            ),
        ),
        ToolOutcome("c1", "get_weather", True, result=2),
        ToolOutcome("c2", "get_weather", True, result=3),
    ]
    contents = build(context_of(entries), prompt="now")["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user", "model", "user"]
    old_call = contents[1]["parts"][0]
    assert "thoughtSignature" not in old_call  # only the current turn is checked by Gemini
    first, second = contents[3]["parts"]
    assert first["thoughtSignature"] == SKIP_THOUGHT_SIGNATURE
    assert "thoughtSignature" not in second
    quiet = GeminiAPI()
    quiet.skip_thought_signature = None
    assert (
        "thoughtSignature"
        not in build(context_of(entries), prompt="now", api=quiet)["contents"][3]["parts"][0]
    )


def test_responses_follow_the_call_order_and_observations_come_after() -> None:
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn(
                "",
                (
                    core.ToolCall("get_weather", {"location": "A"}, "a"),
                    core.ToolCall("fs.read", {"path": "B"}, "b"),
                ),
            ),
            ToolOutcome("b", "fs.read", True, result="text of B"),
            Observation("watch out"),
            ToolOutcome("a", "get_weather", True, result=None),
            UserTurn("next"),
        ]
    )
    contents = build(context, prompt="next")["contents"]
    assert contents[2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "get_weather", "id": "a", "response": {"result": None}}},
            {
                "functionResponse": {
                    "name": "fs_read",
                    "id": "b",
                    "response": {"result": "text of B"},
                }
            },
            {"text": OBSERVATION_PREFIX + "watch out"},
            {"text": "next"},
        ],
    }


def test_a_call_without_outcome_gets_an_error_and_a_stray_outcome_becomes_text() -> None:
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn("", (core.ToolCall("get_weather", {}, "c1"),)),
            ToolOutcome("zz", "fs.read", False, error=ToolFailure("E", "bad", "tool")),
        ]
    )
    missing = {"code": MISSING_OUTCOME, "message": "the call got no result", "source": "core"}
    assert build(context, prompt="go")["contents"][2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "id": "c1", "response": {"error": missing}}},
        {
            "text": OBSERVATION_PREFIX + "A result of tool 'fs.read' (call zz) that answers no "
            'tool call of this turn: {"error": {"code": "E", "message": "bad", "source": "tool"}}'
        },
    ]


def test_results_that_are_not_json_are_sent_as_text() -> None:
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn("", (core.ToolCall("get_weather", {}, "c1"),)),
            ToolOutcome("c1", "get_weather", True, result={"when": uuid.UUID(int=1)}),
        ]
    )
    response = build(context, prompt="go")["contents"][2]["parts"][0]["functionResponse"]
    assert response["response"] == {"result": {"when": "00000000-0000-0000-0000-000000000001"}}


def test_same_role_contents_merge_and_blank_turns_vanish() -> None:
    context = context_of([UserTurn("one"), AssistantTurn(""), UserTurn("two")])
    assert build(context, prompt="two")["contents"] == [
        {"role": "user", "parts": [{"text": "one"}, {"text": "two"}]}
    ]


# --- upstream: options ---------------------------------------------------------------------------


def test_options_go_into_generation_config_and_request_fields() -> None:
    safety = [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH"}]
    body = build(
        context_of([UserTurn(PROMPT)]),
        options={
            "generationConfig": {"temperature": 1.0, "topK": 3},
            "temperature": 0.3,
            "maxOutputTokens": 256,
            "thinkingConfig": {"thinkingBudget": 0},
            "safety_settings": safety,
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        },
    )
    assert body["generationConfig"] == {
        "temperature": 0.3,
        "topK": 3,
        "maxOutputTokens": 256,
        "thinkingConfig": {"thinkingBudget": 0},
    }
    assert body["safetySettings"] == safety
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


@pytest.mark.parametrize(
    "key", ["model", "contents", "tools", "systemInstruction", "system_instruction"]
)
def test_options_cannot_override_what_openstarry_builds(key: str) -> None:
    with pytest.raises(ManifestError, match=f"provider.options.{key} is set by openstarry") as info:
        build(context_of([UserTurn(PROMPT)]), options={key: {}})
    assert info.value.field == f"provider.options.{key}"


def test_generation_config_must_be_an_object() -> None:
    with pytest.raises(ManifestError, match="generationConfig must be an object, not list"):
        build(context_of([UserTurn(PROMPT)]), options={"generationConfig": []})


# --- upstream: tools and schemas -----------------------------------------------------------------


def test_parameters_without_a_type_are_declared_an_object() -> None:
    class Loose(ReadFile):
        parameters = MappingProxyType({"properties": {"path": {"type": "string"}}})

    [declaration] = build(context_of([UserTurn("t")], tools={"fs.read": Loose()}), prompt="t")[
        "tools"
    ][0]["functionDeclarations"]
    assert declaration["parameters"] == {
        "type": "object",
        "properties": {"path": {"type": "string"}},
    }


def test_a_tool_without_parameters_is_declared_without_them() -> None:
    body = build(context_of([UserTurn("t")], tools={"clock": Clock()}), prompt="t")
    assert body["tools"] == [
        {"functionDeclarations": [{"name": "clock", "description": "The time."}]}
    ]
    assert "tools" not in build(context_of([UserTurn("t")], tools={}), prompt="t")


class Point(BaseModel):
    x: int
    next: list[Point] | None = None


def test_a_decorated_tools_schema_becomes_geminis_subset() -> None:
    @tool
    def plot(
        title: str,
        size: int | None = None,
        style: Literal["line", "bar"] = "line",
        start: Point | None = None,
        extra: dict[str, int] | None = None,
    ) -> str:
        """Plot points.

        Args:
            title: The title.
            size: The size.
        """
        return title

    assert gemini_schema(plot.describe()["parameters"]) == {
        "type": "object",
        "properties": {
            "title": {"type": "string", "description": "The title."},
            "size": {"type": "integer", "nullable": True, "description": "The size."},
            "style": {"type": "string", "enum": ["line", "bar"], "description": 'Default: "line".'},
            "start": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer"},
                    "next": {
                        "type": "array",
                        "items": {"type": "object", "description": "(a Point again; not expanded)"},
                        "nullable": True,
                    },
                },
                "required": ["x"],
                "nullable": True,
            },
            "extra": {"type": "object", "nullable": True},
        },
        "required": ["title"],
    }


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": ["string", "null"]}, {"type": "string", "nullable": True}),
        (
            {"type": ["string", "integer"], "description": "Id."},
            {"anyOf": [{"type": "string"}, {"type": "integer"}], "description": "Id."},
        ),
        ({"const": "on"}, {"type": "string", "enum": ["on"]}),
        (
            {"type": "integer", "enum": [1, 2, None]},
            {"type": "integer", "description": "One of: 1, 2.", "nullable": True},
        ),
        (
            {"oneOf": [{"type": "string"}, {"type": "number", "format": "double"}]},
            {"anyOf": [{"type": "string"}, {"type": "number", "format": "double"}]},
        ),
        (
            {
                "allOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "boolean"}}, "required": ["b", "zz"]},
                ],
                "description": "Both.",
            },
            {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
                "required": ["a", "b"],
                "description": "Both.",
            },
        ),
        (
            {"type": "string", "format": "uri", "minLength": 1, "title": "Url", "examples": ["x"]},
            {"type": "string", "minLength": 1},
        ),
        ({"type": "string", "format": "date-time"}, {"type": "string", "format": "date-time"}),
        (
            {"type": "integer", "format": "int64", "exclusiveMinimum": 0},
            {"type": "integer", "format": "int64"},
        ),
        (
            {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
            {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
        ),
        (
            {"type": "array", "prefixItems": [{"type": "number"}]},
            {"type": "array", "items": {"type": "number"}},
        ),
        (
            {
                "type": "object",
                "properties": {"p": {"$ref": "#/definitions/P", "description": "Here."}},
                "definitions": {"P": {"type": "string", "description": "A P."}},
                "patternProperties": {"^x": {}},
                "not": {"type": "null"},
                "uniqueItems": True,
            },
            {"type": "object", "properties": {"p": {"type": "string", "description": "Here."}}},
        ),
        ({"$ref": "https://example.com/schema"}, {}),
        ({"type": "null"}, {"nullable": True}),
        ({"type": "number", "minimum": 0, "maximum": True}, {"type": "number", "minimum": 0}),
        (
            {"type": "string", "description": {"en": "x"}, "pattern": "^a", "maxLength": "9"},
            {"type": "string", "pattern": "^a"},
        ),
    ],
)
def test_schema_conversion(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    assert gemini_schema(schema) == expected


def test_schema_conversion_is_bounded_in_depth() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    converted = gemini_schema(schema)
    depth = 0
    while "items" in converted:
        converted = converted["items"]
        depth += 1
    assert depth <= gemini.MAX_SCHEMA_DEPTH + 1


def test_a_self_referencing_root_is_cut() -> None:
    schema = {
        "type": "object",
        "properties": {"child": {"$ref": "#"}, "name": {"type": "string"}},
    }
    assert gemini_schema(schema)["properties"]["child"]["properties"]["child"] == {
        "type": "object",
        "description": "(a # again; not expanded)",
    }


# --- downstream ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "response_text.json",
        "response_function_call.json",
        "response_parallel.json",
        "response_mixed.json",
        "response_thoughts.json",
    ],
)
def test_response_fixture_becomes_the_expected_provider_response(name: str) -> None:
    fixture = load(name)
    response = API.parse_response(fixture["response"], NAMES)
    dumped = response.model_dump(mode="json", by_alias=True)
    expected = fixture["expected"]
    if "<uuid>" in json.dumps(expected):
        for call_id, _, _ in calls(response):
            assert call_id is not None
            assert uuid.UUID(call_id).version == 4
        dumped = without_ids(dumped)
    assert dumped == expected
    response.to_core()


def test_ids_given_to_calls_without_one_are_distinct() -> None:
    part = {"functionCall": {"name": "get_weather", "args": {}}}
    ids = [c[0] for c in calls(parse(part, part))]
    assert len(set(ids)) == 2


@pytest.mark.parametrize("name", ["stream_text.json", "stream_mixed.json", "stream_thoughts.json"])
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


def test_a_signature_survives_the_loop_into_the_next_request() -> None:
    response = API.parse_response(load("response_parallel.json")["response"], NAMES)
    core_calls = tuple(s.tool_call for s in response.to_core().segments if s.tool_call)
    context = context_of(
        [
            UserTurn("go"),
            AssistantTurn("", core_calls),
            ToolOutcome("8f2b1c0d", "get_weather", True, result="sunny"),
            ToolOutcome("3a9e7d21", "fs.read", True, result="notes"),
        ]
    )
    assert build(context, prompt="go")["contents"][1]["parts"] == [
        {
            "functionCall": {
                "name": "get_weather",
                "args": {"location": "Taipei"},
                "id": "8f2b1c0d",
            },
            "thoughtSignature": "Q2lZQnZqejJFdXZ0UnY=",
        },
        {"functionCall": {"name": "fs_read", "args": {"path": "notes.txt"}, "id": "3a9e7d21"}},
    ]


def test_thoughts_are_reasoning_bare_signatures_are_not_shown_and_text_parts_join() -> None:
    response = parse(
        {"text": "plan...", "thought": True},
        {"text": "Hello, "},
        {"text": "world."},
        {"thoughtSignature": "c2ln"},
    )
    assert response.model_dump(mode="json", by_alias=True)["segments"] == [
        {"type": "reasoning", "text": "plan..."},
        {"type": "text", "text": "Hello, world."},
    ]


def test_inline_media_becomes_a_media_segment() -> None:
    response = parse(
        {"text": "Here:"},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"text": "Done."},
    )
    assert response.model_dump(mode="json", by_alias=True)["segments"] == [
        {"type": "text", "text": "Here:"},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
        {"type": "text", "text": "Done."},
    ]


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        (
            {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
            "The answer held a part of type 'executableCode', which openstarry does not handle; "
            "it was left out.",
        ),
        (
            {"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}},
            "The answer held a part of type 'inlineData', which openstarry does not handle; "
            "it was left out.",
        ),
        (
            {"functionCall": {"name": "fs_read", "args": '{"path": '}},
            "The model called tool 'fs.read', but its arguments are not valid JSON (Expecting "
            "value: line 1 column 10 (char 9)): '{\"path\": '. The call was not made.",
        ),
        (
            {"functionCall": {"name": "fs_read", "args": [1]}},
            "The model called tool 'fs.read', but its arguments are a JSON list, not an object: "
            "'[1]'. The call was not made.",
        ),
        (
            {"functionCall": {"args": {}}},
            "The model made a tool call without a tool name: \"{'functionCall': {'args': {}}}\"; "
            "it was not made.",
        ),
        (
            {"functionCall": "x"},
            "The model made a tool call without a tool name: \"{'functionCall': 'x'}\"; "
            "it was not made.",
        ),
        ({"text": 5}, "The answer held a text part without text: \"{'text': 5}\"."),
        (7, "The answer held a part that is not an object: '7'; it was left out."),
    ],
)
def test_unreadable_parts_become_notes(part: Any, expected: str) -> None:
    response = parse(part)
    assert calls(response) == []
    assert texts(response) == ["[openstarry] " + expected]
    assert response.metadata == {"stop_reason": "STOP", "errors": ["[openstarry] " + expected]}


def test_arguments_given_as_json_text_are_parsed() -> None:
    response = parse({"functionCall": {"id": "i", "name": "fs_read", "args": '{"path": "a"}'}})
    assert calls(response) == [("i", "fs.read", {"path": "a"})]


def test_a_blocked_prompt_is_a_refusal_with_its_reason() -> None:
    body = {
        "promptFeedback": {
            "blockReason": "SAFETY",
            "safetyRatings": [
                {
                    "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                    "probability": "HIGH",
                    "blocked": True,
                },
                {"category": "HARM_CATEGORY_HARASSMENT", "probability": "NEGLIGIBLE"},
            ],
        },
        "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        "modelVersion": "gemini-2.5-flash",
    }
    response = API.parse_response(body, NAMES)
    assert texts(response) == [
        "The model refused to answer: the prompt was blocked "
        "(SAFETY; blocked for HARM_CATEGORY_DANGEROUS_CONTENT)."
    ]
    assert response.metadata == {
        "model": "gemini-2.5-flash",
        "block_reason": "SAFETY",
        "usage": {
            "input_tokens": 9,
            "output_tokens": None,
            "total_tokens": 9,
            "raw": {"promptTokenCount": 9, "totalTokenCount": 9},
        },
        "refused": True,
    }


@pytest.mark.parametrize("reason", sorted(gemini.REFUSAL_REASONS))
def test_a_refused_candidate_says_so_and_runs_no_tool(reason: str) -> None:
    response = parse(
        {"functionCall": {"id": "i", "name": "fs_read", "args": {}}},
        finish=reason,
        finishMessage="Blocked by policy.",
    )
    assert calls(response) == []
    assert texts(response) == [
        f"The model refused to answer: finishReason {reason}; Blocked by policy."
    ]
    assert response.metadata == {"stop_reason": reason, "refused": True}


def test_a_refusal_after_some_text_keeps_the_text() -> None:
    response = parse({"text": "Once upon"}, finish="RECITATION")
    assert texts(response) == ["Once upon", "The model refused to answer: finishReason RECITATION."]


def test_an_answer_stopped_at_the_token_limit_says_it_may_be_incomplete() -> None:
    assert texts(parse({"text": "The answer is"}, finish="MAX_TOKENS")) == [
        "The answer is",
        "[openstarry] The answer stopped at the model's output token limit (MAX_TOKENS); "
        "it may be incomplete.",
    ]


def test_no_content_with_another_finish_reason_is_named() -> None:
    body = {
        "candidates": [
            {
                "finishReason": "MALFORMED_FUNCTION_CALL",
                "finishMessage": "Malformed function call: x",
            }
        ]
    }
    assert texts(API.parse_response(body, NAMES)) == [
        "[openstarry] The model gave no answer (finishReason MALFORMED_FUNCTION_CALL; "
        "Malformed function call: x)."
    ]


def test_usage_counts_the_api_left_out_are_none() -> None:
    assert gemini.normalise_usage({"candidatesTokenCount": 3, "thoughtsTokenCount": 2}) == {
        "input_tokens": None,
        "output_tokens": 5,
        "total_tokens": None,
        "raw": {"candidatesTokenCount": 3, "thoughtsTokenCount": 2},
    }


def test_no_content_with_stop_is_one_empty_text_segment() -> None:
    response = API.parse_response({"candidates": [{"finishReason": "STOP"}]}, NAMES)
    assert response.model_dump(mode="json", by_alias=True) == {
        "segments": [{"type": "text", "text": ""}],
        "metadata": {"stop_reason": "STOP"},
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "not a JSON object but list"),
        ({}, "has no candidates and no reason"),
        ({"candidates": []}, "has no candidates and no reason"),
        ({"candidates": [3]}, "first candidate is not an object"),
        ({"candidates": [{"content": {"parts": "x"}}]}, "content.parts is not a list"),
    ],
)
def test_a_body_that_is_not_a_response_is_agent_pain(body: Any, message: str) -> None:
    with pytest.raises(AgentPainException, match=message):
        API.parse_response(body, NAMES)


def test_an_error_body_is_a_provider_error() -> None:
    body = {"error": {"code": 500, "message": "Internal error", "status": "INTERNAL"}}
    with pytest.raises(ProviderError, match=r"\(INTERNAL\): Internal error"):
        API.parse_response(body, NAMES)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
_PART = st.dictionaries(
    st.sampled_from(["text", "functionCall", "thought", "thoughtSignature", "inlineData", "x"]),
    _JSON,
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        _JSON,
        st.fixed_dictionaries(
            {
                "candidates": st.lists(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "content": st.fixed_dictionaries(
                                {"parts": st.lists(_PART | _JSON, max_size=4)}
                            )
                            | _JSON,
                            "finishReason": st.sampled_from(["STOP", "SAFETY", "OTHER"]) | _JSON,
                            "safetyRatings": _JSON,
                        },
                    )
                    | _JSON,
                    max_size=2,
                )
            },
            optional={"promptFeedback": _JSON, "usageMetadata": _JSON, "modelVersion": _JSON},
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


def test_a_cut_stream_keeps_its_text_and_runs_no_tool() -> None:
    assembler, deltas = feed_all(
        [
            chunk([{"text": "Let me "}], modelVersion="m"),
            chunk(
                [{"text": "check."}, {"functionCall": {"id": "a", "name": "fs_read", "args": {}}}]
            ),
        ]
    )
    assert not assembler.done
    assert deltas == ["Let me ", "check."]
    response = assembler.finish()
    notes = [
        "[openstarry] The call of tool 'fs.read' was cut off with the response; it was not made.",
        "[openstarry] The response was cut off before the API said it was complete.",
    ]
    assert calls(response) == []
    assert texts(response) == ["Let me check.", *notes]
    assert response.metadata == {"model": "m", "truncated": True, "errors": notes}


def test_a_stream_cut_after_only_text_says_so() -> None:
    assembler, _ = feed_all([chunk([{"text": "Hi"}])])
    assert texts(assembler.finish()) == [
        "Hi",
        "[openstarry] The response was cut off before the API said it was complete.",
    ]


@pytest.mark.parametrize("events", [[], [(None, "")], [(None, "{}")]])
def test_a_stream_without_a_response_is_agent_pain(events: list[tuple[None, str]]) -> None:
    assembler, _ = feed_all(events)
    with pytest.raises(AgentPainException, match="ended before the response began"):
        assembler.finish()


def test_a_blocked_prompt_ends_the_stream_with_a_refusal() -> None:
    assembler, _ = feed_all(
        [(None, json.dumps({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}))]
    )
    assert assembler.done
    assert texts(assembler.finish()) == [
        "The model refused to answer: the prompt was blocked (PROHIBITED_CONTENT)."
    ]


def test_thought_text_is_no_delta() -> None:
    assembler, deltas = feed_all(
        [chunk([{"text": "hmm", "thought": True}]), chunk([{"text": "Yes."}], finish="STOP")]
    )
    assert deltas == ["Yes."]
    assert texts(assembler.finish()) == ["Yes."]


def test_an_error_chunk_is_a_provider_error() -> None:
    assembler = API.stream(NAMES)
    assembler.feed(*chunk([{"text": "a"}]))
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    with pytest.raises(ProviderError, match=r"^Gemini API error \(UNAVAILABLE\): The model is"):
        assembler.feed(None, json.dumps(error))


@pytest.mark.parametrize(
    "data", ["{not json", "[1, 2]", '{"candidates": [7]}', "[" * 100_000, '{"a": Infinity}']
)
def test_a_chunk_that_is_not_a_response_is_agent_pain(data: str) -> None:
    with pytest.raises(AgentPainException, match="streamed Gemini chunk"):
        API.stream(NAMES).feed(None, data)


def test_a_stream_past_the_limit_is_agent_pain(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stream reads its bound where it is defined, beside the response reader.
    monkeypatch.setattr(_gemini_response, "MAX_STREAM_CHARS", 200)
    assembler = API.stream(NAMES)
    assembler.feed(*chunk([{"text": "a"}]))
    with pytest.raises(AgentPainException, match="exceeds 200 characters"):
        assembler.feed(*chunk([{"text": "x" * 150}]))


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", load("errors.json")["cases"], ids=lambda c: str(c["status"]))
def test_error_messages(case: dict[str, Any]) -> None:
    assert API.error_message(case["status"], case["body"]) == case["message"]
    if not isinstance(case["body"], str):
        raw = json.dumps(case["body"]).encode()
        assert API.error_message(case["status"], raw) == case["message"]


@pytest.mark.parametrize("body", [None, 5, {"error": "x"}, b"", []])
def test_error_messages_of_odd_bodies_name_the_status(body: Any) -> None:
    assert API.error_message(502, body) == "Gemini API error 502"


# --- through the execution loop ------------------------------------------------------------------


class WireProvider:
    """A provider that builds each request with the API and answers with scripted bodies."""

    name = "gemini-wire"

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        names = ToolNameMap.of(context.tools)
        body = API.build_request(
            prompt, context, model=MODEL, options={}, stream=False, names=names
        )
        self.requests.append(json.loads(json.dumps(body)))  # what would go on the wire
        return API.parse_response(self.answers[len(self.requests) - 1], names)


class FailingRead(ReadFile):
    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise ToolError(f"{args['path']}: no such file", code="ENOENT")


@pytest.mark.anyio
async def test_a_turn_through_the_loop_answers_each_call_in_order_with_its_signature() -> None:
    first = load("response_mixed.json")["response"]
    second = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "25°C; no notes.txt."}]},
                "finishReason": "STOP",
            }
        ]
    }
    provider = WireProvider([first, second])
    async with running(provider, [Weather(), FailingRead()]) as harness:
        result = await harness.ask(PROMPT)
    assert result.error is None
    assert result.replies == ["Sure, let me check.", "25°C; no notes.txt."]
    contents = provider.requests[1]["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == first["candidates"][0]["content"]["parts"]
    assert contents[2]["parts"] == [
        {
            "functionResponse": {
                "name": "get_weather",
                "id": "c1",
                "response": {"result": {"location": "Taipei", "temperature": 25}},
            }
        },
        {
            "functionResponse": {
                "name": "fs_read",
                "id": "c2",
                "response": {
                    "error": {
                        "code": "ENOENT",
                        "message": "notes.txt: no such file",
                        "source": "tool",
                    }
                },
            }
        },
    ]
