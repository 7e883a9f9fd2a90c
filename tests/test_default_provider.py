"""The offline default provider and the provider registry.

Each test builds the context the execution loop would: a session whose memory
holds the user's turn and, from the second round on, the assistant's tool calls
and their outcomes (or the core's observations), then checks the provider's
response segment by segment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

import openstarry.providers as providers
from agent_harness import context
from openstarry.agent.interfaces import AgentContext, Provider, Tool
from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.core import ContentSegment, ProviderResponse, ToolCall, encode_response
from openstarry.errors import ManifestError
from openstarry.providers import (
    DefaultProvider,
    create_provider,
    provider_names,
    register_provider,
)
from openstarry.providers.default import ACKNOWLEDGEMENT, MAX_REQUEST_CHARS
from openstarry.tools import resolve_tools

pytestmark = pytest.mark.anyio

TAIPEI = {
    "location": "Taipei",
    "temperature": 25,
    "unit": "celsius",
    "condition": "Sunny",
    "summary": "25°C, Sunny",
}


class _Tool(Tool):
    """A tool that is never run here: the provider only reads its name and schema."""

    def __init__(self, name: str, *properties: str) -> None:
        self.name = name
        self.parameters = {
            "type": "object",
            "properties": {p: {"type": "string"} for p in properties},
            "required": list(properties),
        }

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise AssertionError("the provider never runs a tool")


def _tools(*names: str) -> dict[str, Tool]:
    known = {
        "get_weather": _Tool("get_weather", "location"),
        "fs.read": _Tool("fs.read", "path"),
        "fs.list": _Tool("fs.list", "path"),
        "fs.write": _Tool("fs.write", "path", "content"),
    }
    return {name: known.get(name, _Tool(name)) for name in names}


ALL_TOOLS = ("get_weather", "fs.read", "fs.list", "fs.write")


def _context(
    prompt: str | None,
    *,
    tools: Mapping[str, Tool] | None = None,
    entries: Sequence[MemoryEntry] = (),
    round: int = 1,
    trace_id: str = "trace-1",
) -> AgentContext:
    session = Session("session-1")
    if prompt is not None:
        session.memory.append(UserTurn(prompt))
    session.memory.extend(entries)
    return AgentContext(
        tools=_tools(*ALL_TOOLS) if tools is None else tools,
        session=session,
        trace_id=trace_id,
        round=round,
    )


def _calls(response: ProviderResponse) -> list[ToolCall]:
    return [s.tool_call for s in response.segments if s.tool_call is not None]


def _texts(response: ProviderResponse) -> list[str]:
    return [s.text for s in response.segments if s.text is not None]


def _only_text(response: ProviderResponse) -> str:
    """The one text segment of a final answer, checking that it is the whole response."""
    assert [s.type for s in response.segments] == ["text"]
    text = response.segments[0].text
    assert text is not None
    return text


async def _first_round(prompt: str, **kwargs: Any) -> tuple[AgentContext, ProviderResponse]:
    context = _context(prompt, **kwargs)
    return context, await DefaultProvider().generate(prompt, context)


async def _second_round(
    prompt: str, outcomes: Sequence[Any], *, tools: Mapping[str, Tool] | None = None
) -> tuple[list[ToolCall], ProviderResponse]:
    """Run round 1, record its calls and the given results as the loop would, run round 2.

    Each item of ``outcomes`` is a result (success), a ToolFailure, or an Observation.
    """
    context, first = await _first_round(prompt, tools=tools)
    calls = _calls(first)
    assert len(calls) == len(outcomes)
    context.memory.append(AssistantTurn(_texts(first)[0], tuple(calls)))
    for call, outcome in zip(calls, outcomes, strict=True):
        if isinstance(outcome, Observation):
            context.memory.append(outcome)
        elif isinstance(outcome, ToolFailure):
            context.memory.append(ToolOutcome(call.id, call.name, False, error=outcome))
        else:
            context.memory.append(ToolOutcome(call.id, call.name, True, result=outcome))
    context.round = 2
    return calls, await DefaultProvider().generate(prompt, context)


# --- spec 000 section 5 ---------------------------------------------------------------------


async def test_the_think_act_sequence_of_spec_000_section_5() -> None:
    prompt = "Query weather in Taipei."
    provider = DefaultProvider()
    context = _context(prompt, tools=_tools("get_weather"))

    first = await provider.generate(prompt, context)
    [call] = _calls(first)
    assert call.id.startswith("call_")
    assert first.segments == [
        ContentSegment("text", text="Sure, let me check."),
        ContentSegment(
            "tool_call", tool_call=ToolCall("get_weather", {"location": "Taipei"}, id=call.id)
        ),
    ]
    wire = json.loads(encode_response(first))
    del wire["segments"][1]["toolCall"]["id"]
    assert wire["segments"] == [
        {"type": "text", "text": "Sure, let me check."},
        {"type": "tool_call", "toolCall": {"name": "get_weather", "args": {"location": "Taipei"}}},
    ]

    context.memory.append(AssistantTurn("Sure, let me check.", (call,)))
    context.memory.append(ToolOutcome(call.id, "get_weather", True, result=TAIPEI))
    context.round = 2
    final = await provider.generate(prompt, context)
    assert _only_text(final) == "The weather in Taipei is 25°C, Sunny."
    assert _calls(final) == []


async def test_metadata_reports_provider_model_and_word_counts() -> None:
    prompt = "Query weather in Taipei"
    _, response = await _first_round(prompt)
    # Input: the prompt (4 words) and the memory's user turn (4 words). Output: the
    # acknowledgement (4 words), the tool name (1) and its args' JSON (2 words).
    assert response.metadata == {
        "provider": "default",
        "model": "offline",
        "usage": {"input_tokens": 8, "output_tokens": 7, "total_tokens": 15},
    }
    custom = await DefaultProvider(model="tiny").generate("hi", _context("hi"))
    assert custom.metadata["model"] == "tiny"


# --- recognising requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Query weather in Taipei", [("get_weather", {"location": "Taipei"})]),
        ("weather in Taipei", [("get_weather", {"location": "Taipei"})]),
        ("weather for Taipei", [("get_weather", {"location": "Taipei"})]),
        ("Taipei weather", [("get_weather", {"location": "Taipei"})]),
        ("Tokyo's weather?", [("get_weather", {"location": "Tokyo"})]),
        ("what's the weather like in New York?", [("get_weather", {"location": "New York"})]),
        ('weather in "San Francisco" today', [("get_weather", {"location": "San Francisco"})]),
        (
            "Hi, what's the temperature in Paris, France?",
            [("get_weather", {"location": "Paris, France"})],
        ),
        (
            "can you please tell me the weather for taipei",
            [("get_weather", {"location": "taipei"})],
        ),
        ("read notes.txt", [("fs.read", {"path": "notes.txt"})]),
        ("show me the file a/b.md", [("fs.read", {"path": "a/b.md"})]),
        ("cat x", [("fs.read", {"path": "x"})]),
        ('read "my notes.txt" please', [("fs.read", {"path": "my notes.txt"})]),
        ("read weather.txt", [("fs.read", {"path": "weather.txt"})]),
        ("what's in notes.txt?", [("fs.read", {"path": "notes.txt"})]),
        ("list files", [("fs.list", {"path": "."})]),
        ("list files in docs", [("fs.list", {"path": "docs"})]),
        ("what's in the workspace", [("fs.list", {"path": "."})]),
        ("list the files in the docs folder", [("fs.list", {"path": "docs"})]),
        ("show me the files in src", [("fs.list", {"path": "src"})]),
        ("what files are there?", [("fs.list", {"path": "."})]),
        ("ls docs", [("fs.list", {"path": "docs"})]),
        ('write "hello" to notes.txt', [("fs.write", {"path": "notes.txt", "content": "hello"})]),
        ("write hello to notes.txt", [("fs.write", {"path": "notes.txt", "content": "hello"})]),
        (
            'write "salt and pepper; then rest" to a.txt',
            [("fs.write", {"path": "a.txt", "content": "salt and pepper; then rest"})],
        ),
        (
            "write salt and pepper to spice.txt",
            [("fs.write", {"path": "spice.txt", "content": "salt and pepper"})],
        ),
        (
            "create a file todo.md with buy milk",
            [("fs.write", {"path": "todo.md", "content": "buy milk"})],
        ),
        (
            "weather in Taipei and in Tokyo",
            [
                ("get_weather", {"location": "Taipei"}),
                ("get_weather", {"location": "Tokyo"}),
            ],
        ),
        (
            "weather in Taipei and New York",
            [
                ("get_weather", {"location": "Taipei"}),
                ("get_weather", {"location": "New York"}),
            ],
        ),
        (
            "read a.txt and b.txt",
            [
                ("fs.read", {"path": "a.txt"}),
                ("fs.read", {"path": "b.txt"}),
            ],
        ),
        (
            "read notes.txt, then list files in docs",
            [
                ("fs.read", {"path": "notes.txt"}),
                ("fs.list", {"path": "docs"}),
            ],
        ),
        ("weather in Taipei and tell me a joke", [("get_weather", {"location": "Taipei"})]),
    ],
)
async def test_requests_become_tool_calls(
    prompt: str, expected: list[tuple[str, dict[str, str]]]
) -> None:
    _, response = await _first_round(prompt)
    assert _texts(response) == [ACKNOWLEDGEMENT] == ["Sure, let me check."]
    assert [s.type for s in response.segments] == ["text"] + ["tool_call"] * len(expected)
    calls = _calls(response)
    assert [(c.name, c.args) for c in calls] == expected
    assert len({c.id for c in calls}) == len(calls)


async def test_long_prompts_are_not_parsed_for_requests() -> None:
    spaced = "weather in" + " " * (MAX_REQUEST_CHARS - 20) + "Taipei"
    _, response = await _first_round(spaced)
    assert [(c.name, c.args) for c in _calls(response)] == [("get_weather", {"location": "Taipei"})]
    too_long = "weather in Taipei " + "x" * MAX_REQUEST_CHARS
    _, response = await _first_round(too_long)
    assert "offline default provider" in _only_text(response)


async def test_only_tools_the_agent_has_are_called() -> None:
    _, response = await _first_round("weather in Taipei and read a.txt", tools=_tools("fs.read"))
    assert [(c.name, c.args) for c in _calls(response)] == [("fs.read", {"path": "a.txt"})]


async def test_a_request_for_a_missing_tool_is_explained() -> None:
    _, response = await _first_round("weather in Taipei", tools=_tools("fs.read", "ping"))
    text = _only_text(response)
    assert text.startswith("I can't check the weather here: this agent has no get_weather tool.")
    assert '- read a file with fs.read: "read notes.txt"' in text
    assert "Other tools this agent has: ping." in text


async def test_weather_without_a_place_asks_for_one() -> None:
    _, response = await _first_round("how's the weather today?")
    assert _only_text(response) == (
        'Which location would you like the weather for? Try "weather in Taipei".'
    )


async def test_arguments_follow_the_tools_schema_names() -> None:
    tools = {"get_weather": _Tool("get_weather", "city")}
    _, response = await _first_round("weather in Taipei", tools=tools)
    assert [(c.name, c.args) for c in _calls(response)] == [("get_weather", {"city": "Taipei"})]


# --- answering from outcomes ----------------------------------------------------------------


async def test_several_outcomes_are_answered_in_call_order() -> None:
    tokyo = {"location": "Tokyo", "temperature": 18, "unit": "celsius", "condition": "Cloudy"}
    _, final = await _second_round("weather in Taipei and Tokyo", [TAIPEI, tokyo])
    assert _only_text(final) == (
        "The weather in Taipei is 25°C, Sunny.\nThe weather in Tokyo is 18°C, Cloudy."
    )


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"temperature": 77, "unit": "fahrenheit"}, "The weather in Taipei is 77°F."),
        ("Rainy, 20°C.", "The weather in Taipei is Rainy, 20°C."),
        ({"location": "Taipei City", "summary": "Hot"}, "The weather in Taipei City is Hot."),
    ],
)
async def test_weather_results_of_other_shapes(result: Any, expected: str) -> None:
    _, final = await _second_round("weather in Taipei", [result])
    assert _only_text(final) == expected


async def test_a_read_file_is_quoted() -> None:
    _, final = await _second_round("read notes.txt", ["buy milk\ncall mum\n"])
    assert _only_text(final) == "Here is notes.txt:\nbuy milk\ncall mum\n"
    _, empty = await _second_round("read notes.txt", [""])
    assert _only_text(empty) == "notes.txt is empty."


async def test_a_long_file_is_cut_at_a_line_break() -> None:
    body = "".join(f"line {i:03}\n" for i in range(100))  # 9 characters a line
    provider = DefaultProvider(options={"maxQuoteChars": 50})
    context, first = await _first_round("read big.txt")
    [call] = _calls(first)
    context.memory.append(AssistantTurn("Sure, let me check.", (call,)))
    context.memory.append(ToolOutcome(call.id, "fs.read", True, result=body))
    text = _only_text(await provider.generate("read big.txt", context))
    assert text == (
        "Here is big.txt:\nline 000\nline 001\nline 002\nline 003\nline 004\n"
        f"… ({len(body) - 44} more characters not shown)"
    )


async def test_a_listing_names_the_entries() -> None:
    _, final = await _second_round("list files in docs", [["a.md", "b.md"]])
    assert _only_text(final) == "docs contains 2 entries: a.md, b.md."
    entries = [{"name": "src", "type": "directory"}, {"name": "README.md", "type": "file"}]
    _, final = await _second_round("list files", [{"entries": entries}])
    assert _only_text(final) == "The workspace contains 2 entries: src/, README.md."
    _, final = await _second_round("list files", [[]])
    assert _only_text(final) == "The workspace is empty."


async def test_a_write_is_confirmed() -> None:
    _, final = await _second_round('write "hello" to notes.txt', [None])
    assert _only_text(final) == "Wrote 5 characters to notes.txt."


async def test_a_failed_tool_is_reported_with_its_reason() -> None:
    failure = ToolFailure("ENOENT", "No such file: notes.txt.", "fs")
    _, final = await _second_round("read notes.txt", [failure])
    assert _only_text(final) == "The fs.read tool failed: No such file: notes.txt (ENOENT)."


async def test_an_observation_ends_the_turn_with_an_explanation() -> None:
    # The provider asked for a tool the core could not run: the core says so
    # instead of an outcome, and the provider must not try again.
    observation = Observation("Tool 'get_weather' does not exist")
    _, final = await _second_round("weather in Taipei", [observation])
    assert _only_text(final) == (
        "I could not complete the request: Tool 'get_weather' does not exist."
    )


async def test_bad_arguments_observation_and_a_success_are_both_reported() -> None:
    bad_args = Observation("fs.read: missing required argument(s): ['path'].")
    _, final = await _second_round("weather in Taipei and read a.txt", [TAIPEI, bad_args])
    assert _only_text(final) == (
        "The weather in Taipei is 25°C, Sunny.\n"
        "I could not complete the request: fs.read: missing required argument(s): ['path']."
    )


async def test_a_failure_the_core_also_observed_is_reported_once() -> None:
    # What the execution loop records for an unknown tool and for bad arguments:
    # an observation for the provider, and a failed outcome with the same message.
    unknown = ToolCall("get_wether", {"location": "Taipei"}, id="call_1")
    bad = ToolCall("fs.read", {}, id="call_2")
    missing = "Tool 'get_wether' does not exist. Available tools: get_weather, fs.read."
    invalid = "fs.read: missing required argument(s): ['path']"
    entries: list[MemoryEntry] = [
        AssistantTurn("Sure, let me check.", (unknown, bad)),
        Observation(missing),
        ToolOutcome(
            "call_1", "get_wether", False, error=ToolFailure("TOOL_NOT_FOUND", missing, "core")
        ),
        Observation(
            f'Invalid arguments for fs.read: {invalid}. Its parameters: {{"type": "object"}}'
        ),
        ToolOutcome(
            "call_2", "fs.read", False, error=ToolFailure("INVALID_ARGUMENTS", invalid, "core")
        ),
    ]
    final = await DefaultProvider().generate("x", _context("x", entries=entries, round=2))
    assert _only_text(final) == (
        "The get_wether tool failed: Tool 'get_wether' does not exist. "
        "Available tools: get_weather, fs.read (TOOL_NOT_FOUND).\n"
        "The fs.read tool failed: missing required argument(s): ['path'] (INVALID_ARGUMENTS)."
    )


async def test_a_call_without_outcome_or_observation_still_ends_the_turn() -> None:
    context, first = await _first_round("weather in Taipei")
    context.memory.append(AssistantTurn("Sure, let me check.", tuple(_calls(first))))
    final = await DefaultProvider().generate("weather in Taipei", context)
    assert _only_text(final) == "I got no result from get_weather."


async def test_outcomes_without_the_assistant_turn_are_answered() -> None:
    outcome = ToolOutcome("call_x", "get_weather", True, result=TAIPEI)
    context = _context("weather in Taipei", entries=[outcome], round=2)
    final = await DefaultProvider().generate("weather in Taipei", context)
    assert _only_text(final) == "The weather in Taipei is 25°C, Sunny."


async def test_an_unknown_tools_result_is_shown_as_json() -> None:
    call = ToolCall("ping", {}, id="call_1")
    entries: list[MemoryEntry] = [
        AssistantTurn("", (call,)),
        ToolOutcome("call_1", "ping", True, result={"ok": True, "ms": 3}),
    ]
    final = await DefaultProvider().generate("ping", _context("ping", entries=entries, round=2))
    assert _only_text(final) == 'ping returned: {"ms": 3, "ok": true}'


async def test_a_previous_turns_outcomes_do_not_answer_a_new_input() -> None:
    call = ToolCall("get_weather", {"location": "Taipei"}, id="call_old")
    entries: list[MemoryEntry] = [
        AssistantTurn("Sure, let me check.", (call,)),
        ToolOutcome("call_old", "get_weather", True, result=TAIPEI),
        AssistantTurn("The weather in Taipei is 25°C, Sunny."),
        UserTurn("read notes.txt"),
    ]
    context = _context("weather in Taipei", entries=entries)
    response = await DefaultProvider().generate("read notes.txt", context)
    assert [(c.name, c.args) for c in _calls(response)] == [("fs.read", {"path": "notes.txt"})]
    assert _calls(response)[0].id != "call_old"


# --- anything else --------------------------------------------------------------------------


async def test_the_fallback_lists_what_the_tools_allow() -> None:
    _, response = await _first_round("tell me a joke", tools=_tools(*ALL_TOOLS, "zeta", "alpha"))
    assert _only_text(response) == (
        "I am openstarry's offline default provider: I need no key and no network, "
        "and I understand a few simple requests.\n"
        "With this agent's tools I can:\n"
        '- check the weather with get_weather: "weather in Taipei"\n'
        '- read a file with fs.read: "read notes.txt"\n'
        '- list files with fs.list: "list files in docs"\n'
        '- write a file with fs.write: "write "hello" to notes.txt"\n'
        "Other tools this agent has: alpha, zeta.\n"
        "Configure a model provider in agent.json for open conversation."
    )


async def test_the_fallback_without_tools() -> None:
    _, response = await _first_round("Hello there", tools={})
    text = _only_text(response)
    assert text.startswith("Hello!\nI am openstarry's offline default provider")
    assert "This agent has no tools, so this reply is all I can do." in text
    assert "Sure, let me check." not in text


# --- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt", ["weather in Taipei and Tokyo", "list files", "tell me a joke", "what's the weather"]
)
async def test_the_same_input_gives_the_same_response(prompt: str) -> None:
    _, one = await _first_round(prompt)
    _, two = await _first_round(prompt)
    assert one == two
    assert encode_response(one) == encode_response(two)


async def test_call_ids_differ_between_turns_and_traces() -> None:
    _, first = await _first_round("weather in Taipei")
    _, other_trace = await _first_round("weather in Taipei", trace_id="trace-2")
    later = _context(
        "weather in Taipei", entries=[AssistantTurn("hi"), UserTurn("weather in Taipei")]
    )
    again = await DefaultProvider().generate("weather in Taipei", later)
    ids = {_calls(r)[0].id for r in (first, other_trace, again)}
    assert len(ids) == 3


# --- construction and registry --------------------------------------------------------------


def test_the_provider_is_a_provider() -> None:
    provider = DefaultProvider()
    assert isinstance(provider, Provider)
    assert provider.name == "default"
    assert provider.model == "offline"


def test_unknown_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"'apiKey', 'temperature'; known: maxQuoteChars"):
        DefaultProvider(options={"temperature": 0.2, "apiKey": "x", "maxQuoteChars": 5})
    for bad in (0, True, "10"):
        with pytest.raises(ValueError, match="maxQuoteChars"):
            DefaultProvider(options={"maxQuoteChars": bad})


def _config(name: str, **fields: Any) -> SimpleNamespace:
    values: dict[str, Any] = {"model": None, "options": None, "base_url": None, "api_key_env": None}
    return SimpleNamespace(name=name, **{**values, **fields})


def test_create_provider_makes_the_default_provider() -> None:
    provider = create_provider(_config("default", model="m", options={"maxQuoteChars": 9}))
    assert isinstance(provider, DefaultProvider)
    assert (provider.model, provider.max_quote_chars) == ("m", 9)
    assert "default" in provider_names()


def test_create_provider_takes_the_manifests_provider_section() -> None:
    from openstarry.manifest import ProviderConfig

    section = {"name": "default", "model": "m", "options": {"maxQuoteChars": 9}}
    provider = create_provider(ProviderConfig.model_validate(section))
    assert isinstance(provider, DefaultProvider)
    assert (provider.model, provider.max_quote_chars) == ("m", 9)
    with pytest.raises(ManifestError) as info:
        create_provider(ProviderConfig.model_validate({"options": {"colour": "blue"}}))
    assert info.value.field == "provider.options"


def test_create_provider_refuses_an_unknown_name() -> None:
    with pytest.raises(ManifestError, match=r"unknown provider 'gpt'; known: .*default") as info:
        create_provider(_config("gpt"))
    assert info.value.field == "provider.name"


def test_bad_default_options_are_a_manifest_error() -> None:
    with pytest.raises(ManifestError, match="'colour'") as info:
        create_provider(_config("default", options={"colour": "blue"}))
    assert info.value.field == "provider.options"


def test_register_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "_FACTORIES", dict(providers._FACTORIES))
    seen: list[Any] = []

    def factory(config: Any) -> Provider:
        seen.append(config)
        return DefaultProvider(model=f"echo-{config.model}")

    register_provider("echo", factory)
    config = _config("echo", model="1")
    provider = create_provider(config)
    assert seen == [config]
    assert isinstance(provider, DefaultProvider)
    assert provider.model == "echo-1"
    assert provider_names() == (
        "anthropic",
        "default",
        "echo",
        "gemini",
        "openai",
        "openai-responses",
    )

    with pytest.raises(ValueError, match="non-empty"):
        register_provider(" ", factory)
    with pytest.raises(TypeError, match="callable"):
        register_provider("x", "not a factory")  # type: ignore[arg-type]


def test_the_default_provider_answers_a_maximal_prompt_quickly() -> None:
    """The default provider parses a prompt of maximal length (``MAX_REQUEST_CHARS``)
    without catastrophic regex backtracking, so one request cannot stall the event
    loop for every session. Run in a subprocess (killed on timeout); the 5 s bound
    is only a hang guard, a normal answer takes milliseconds."""
    code = textwrap.dedent(
        """
        import asyncio
        from openstarry.agent.interfaces import AgentContext
        from openstarry.agent.memory import Memory, Session
        from openstarry.providers.default import DefaultProvider
        from openstarry.tools import fs_tools

        tools = {t.name: t for t in fs_tools(["."])}
        context = AgentContext(tools, Session("s", Memory()), "a", "t", 1)
        prompt = "write " + " " * 990 + "x"
        asyncio.run(DefaultProvider().generate(prompt, context))
        """
    )
    try:
        subprocess.run([sys.executable, "-c", code], timeout=5, check=True, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("DefaultProvider.generate blocked for over 5 s on a 997-character prompt")


def test_the_default_provider_tries_a_bounded_number_of_write_merges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt of many clauses that start like a write ("put ;" x 166) is parsed in
    linear work: each clause tries a bounded number of merges with the next ones,
    where trying them all cost cubic time (0.4 s of blocked event loop)."""
    # The default provider's prompt parser lives in its own module.
    from openstarry.providers import _default_parser as parser

    calls = 0
    match_write = parser._match_write

    def counting(clause: str) -> Any:
        nonlocal calls
        calls += 1
        return match_write(clause)

    monkeypatch.setattr(parser, "_match_write", counting)
    parser.parse("put ;" * 166)
    assert calls <= 166 * (parser._MAX_MERGED + 2)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "prompt", ['"\xa0" weather', 'check "\u2003" forecast', '"\u3000"\'s weather'], ids=repr
)
async def test_default_provider_answers_a_quoted_unicode_space_before_weather(prompt: str) -> None:
    """The default provider answers every prompt, odd whitespace in quotes included.

    A quoted non-breaking or ideographic space where a place would be leaves a
    "location" of whitespace that ``str.strip`` with an ASCII set keeps; the
    provider must still answer (here: ask for a location) instead of raising
    ``IndexError`` from ``location.split()[0]``.
    """
    tools = resolve_tools(["get_weather"])
    response = await DefaultProvider().generate(prompt, context(tools))
    assert response.segments
    assert response.segments[0].text


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("openai", {"messages": []}, "provider.options.messages"),
        ("openai-responses", {"input": "x"}, "provider.options.input"),
        ("anthropic", {"system": "be brief"}, "provider.options.system"),
        ("anthropic", {"max_tokens": 0}, "provider.options.max_tokens"),
        ("gemini", {"contents": []}, "provider.options.contents"),
        ("gemini", {"generationConfig": 3}, "provider.options.generationConfig"),
    ],
)
def test_options_the_translator_refuses_fail_when_the_provider_is_made(
    name: str, options: dict[str, Any], field: str
) -> None:
    """They failed at the agent's first input instead, as a PROVIDER_ERROR of that run, though
    ``create_provider`` promises a ManifestError for a configuration it cannot use."""
    config = SimpleNamespace(name=name, model="m", options=options, base_url=None, api_key_env=None)
    with pytest.raises(ManifestError) as caught:
        create_provider(config)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "prompt", ["Query weather in Taipei", "read notes.txt", "hello there", "x" * 5000]
)
def test_it_completes_at_once_as_it_says(prompt: str) -> None:
    """``completes_at_once``: its generate answers without waiting, on the first
    round and on the one after the tools came back."""
    provider = DefaultProvider()
    assert provider.completes_at_once is True
    context = _context(prompt)
    answer = provider.generate(prompt, context)
    with pytest.raises(StopIteration) as given:
        answer.send(None)
    response = given.value.value
    assert isinstance(response, ProviderResponse)
    for call in _calls(response):
        context.memory.append(ToolOutcome(call.id, call.name, True, "a result"))
    context.round = 2
    with pytest.raises(StopIteration):
        provider.generate(prompt, context).send(None)
