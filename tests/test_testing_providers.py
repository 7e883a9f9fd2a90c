"""openstarry.testing: the scripted and function-backed providers users' tests rely on."""

from __future__ import annotations

import inspect
import json
from typing import Any

import anyio
import pytest

import openstarry.testing
from agent_harness import context
from openstarry import protocol
from openstarry.agent.interfaces import AgentContext, Provider
from openstarry.agent.memory import AssistantTurn, Session, ToolOutcome, UserTurn
from openstarry.core import ContentSegment, ProviderResponse, ToolCall, encode_response
from openstarry.errors import DecodeError, OpenStarryError
from openstarry.testing import (
    FunctionProvider,
    ProviderCall,
    ScriptedProvider,
    ScriptExhausted,
    text,
    tool_call,
    tool_calls,
)


def _context(round: int = 1) -> AgentContext:
    session = Session("s-1")
    session.memory.append(UserTurn("hello"))
    return AgentContext(tools={}, session=session, trace_id="t-1", round=round)


def _wire(response: ProviderResponse) -> Any:
    return json.loads(encode_response(response))


# --- helpers --------------------------------------------------------------------------------


def test_text() -> None:
    assert text("hi") == ProviderResponse([ContentSegment("text", text="hi")])
    assert text("hi", metadata={"m": 1}).metadata == {"m": 1}


def test_tool_call() -> None:
    response = tool_call("get_weather", {"location": "Taipei"}, id="c1", text="Sure, let me check.")
    assert _wire(response) == {
        "segments": [
            {"type": "text", "text": "Sure, let me check."},
            {
                "type": "tool_call",
                "toolCall": {"id": "c1", "name": "get_weather", "args": {"location": "Taipei"}},
            },
        ]
    }
    bare = tool_call("ping")
    [segment] = bare.segments
    assert segment.tool_call is not None
    assert (segment.tool_call.name, segment.tool_call.args) == ("ping", {})
    assert segment.tool_call.id  # a fresh UUID


def test_tool_calls_in_order() -> None:
    given = ToolCall("c", {"z": 1}, id="id-c")
    response = tool_calls([("a", {"x": 1}), ("b", None, "id-b"), given], "checking")
    assert [s.type for s in response.segments] == ["text", "tool_call", "tool_call", "tool_call"]
    assert response.segments[0].text == "checking"
    calls = [s.tool_call for s in response.segments[1:]]
    assert [(c.name, c.args) for c in calls if c is not None] == [
        ("a", {"x": 1}),
        ("b", {}),
        ("c", {"z": 1}),
    ]
    assert calls[1] is not None
    assert calls[1].id == "id-b"
    assert calls[2] == given
    assert tool_calls([]).segments == []


# --- ScriptedProvider -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_scripted_answers_in_order_one_per_call() -> None:
    async def later(prompt: str, context: AgentContext) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return {"segments": [{"type": "text", "text": f"async {prompt} r{context.round}"}]}

    provider = ScriptedProvider(
        [
            "plain",
            tool_call("get_weather", {"location": "Taipei"}, id="c1"),
            {"segments": [{"type": "tool_call", "toolCall": {"name": "x", "args": '{"a": 1}'}}]},
            lambda prompt, context: f"sync {prompt}",
            later,
        ]
    )
    assert provider.name == "scripted"
    assert provider.remaining == 5
    context = _context()
    answers = [await provider.generate(f"p{i}", context) for i in range(5)]
    assert answers[0] == text("plain")
    assert answers[1] == tool_call("get_weather", {"location": "Taipei"}, id="c1")
    [segment] = answers[2].segments
    assert segment.tool_call is not None
    assert (segment.tool_call.name, segment.tool_call.args) == ("x", {"a": 1})
    assert answers[3] == text("sync p3")
    assert answers[4] == text("async p4 r1")
    assert provider.remaining == 0


@pytest.mark.anyio
async def test_scripted_exception_items_are_raised_in_turn() -> None:
    failure = RuntimeError("model down")
    provider = ScriptedProvider([failure, lambda p, c: ValueError("from a function"), "after"])
    with pytest.raises(RuntimeError, match="model down") as info:
        await provider.generate("a", _context())
    assert info.value is failure
    with pytest.raises(ValueError, match="from a function"):
        await provider.generate("b", _context())
    assert await provider.generate("c", _context()) == text("after")
    assert [call.prompt for call in provider.calls] == ["a", "b", "c"]


@pytest.mark.anyio
async def test_scripted_function_that_raises_propagates() -> None:
    def boom(prompt: str, context: AgentContext) -> str:
        raise KeyError(prompt)

    provider = ScriptedProvider([boom])
    with pytest.raises(KeyError, match="p"):
        await provider.generate("p", _context())
    assert provider.remaining == 0


@pytest.mark.anyio
async def test_scripted_exhaustion_is_a_clear_error() -> None:
    provider = ScriptedProvider(["one", "two"], name="brain")
    await provider.generate("a", _context())
    await provider.generate("b", _context())
    with pytest.raises(ScriptExhausted) as info:
        await provider.generate("c", _context(round=3))
    message = str(info.value)
    assert "'brain' had 2 responses" in message
    assert "call 3" in message
    assert "'c'" in message
    assert "round 3" in message
    assert isinstance(info.value, AssertionError)
    assert isinstance(info.value, OpenStarryError)
    assert len(provider.calls) == 3
    with pytest.raises(ScriptExhausted, match="had 0 responses"):
        await ScriptedProvider([]).generate("x", _context())


@pytest.mark.anyio
async def test_scripted_records_prompt_memory_snapshot_and_round() -> None:
    provider = ScriptedProvider([tool_call("ping", id="c1"), "done"])
    context = _context(round=1)
    first = await provider.generate("ping it", context)
    call = first.segments[0].tool_call
    assert call is not None
    context.memory.append(AssistantTurn("", (call,)))
    context.memory.append(ToolOutcome("c1", "ping", True, result="pong"))
    context.round = 2
    await provider.generate("ping it", context)

    assert list(provider.calls) == [
        ProviderCall("ping it", (UserTurn("hello"),), 1),
        ProviderCall(
            "ping it",
            (
                UserTurn("hello"),
                AssistantTurn("", (call,)),
                ToolOutcome("c1", "ping", True, result="pong"),
            ),
            2,
        ),
    ]
    # A snapshot: later memory changes do not reach the recorded calls.
    context.memory.clear()
    prompt, memory, round = provider.calls[0]
    assert (prompt, memory, round) == ("ping it", (UserTurn("hello"),), 1)


@pytest.mark.anyio
async def test_scripted_rejects_what_is_not_an_answer() -> None:
    provider = ScriptedProvider([42, {"segments": [{"type": "tool_call"}]}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not int"):
        await provider.generate("a", _context())
    with pytest.raises(DecodeError) as info:
        await provider.generate("b", _context())
    assert info.value.field is not None
    assert "toolCall" in info.value.field


def test_scripted_takes_any_iterable_once() -> None:
    provider = ScriptedProvider(iter(["a", "b"]))
    assert provider.remaining == 2
    assert repr(provider) == "ScriptedProvider(name='scripted', remaining=2)"


# --- FunctionProvider -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_function_provider_sync_and_async() -> None:
    def echo(prompt: str, context: AgentContext) -> str:
        return f"{prompt} / round {context.round}"

    sync_provider = FunctionProvider(echo)
    assert sync_provider.name == "function"
    assert await sync_provider.generate("hi", _context(2)) == text("hi / round 2")

    async def think(prompt: str, context: AgentContext) -> ProviderResponse:
        await anyio.sleep(0)
        return tool_call("get_weather", {"location": prompt}, id="c1")

    async_provider = FunctionProvider(think, name="thinker")
    assert async_provider.name == "thinker"
    response = await async_provider.generate("Taipei", _context())
    assert response == tool_call("get_weather", {"location": "Taipei"}, id="c1")
    assert list(async_provider.calls) == [ProviderCall("Taipei", (UserTurn("hello"),), 1)]


@pytest.mark.anyio
async def test_function_provider_generate_converts_awaits_and_records_every_answer() -> None:
    def at_once(prompt: str, context: AgentContext) -> ProviderResponse:
        return text(f"{prompt} now")

    provider = FunctionProvider(at_once)
    assert await provider.generate("hi", _context(3)) == text("hi now")
    assert provider.call_count == 1
    assert list(provider.calls) == [ProviderCall("hi", (UserTurn("hello"),), 3)]

    def plain(prompt: str, context: AgentContext) -> str:
        return "a str, converted"

    assert await FunctionProvider(plain).generate("hi", _context()) == text("a str, converted")

    async def waits(prompt: str, context: AgentContext) -> ProviderResponse:
        await anyio.sleep(0)
        return text("waited")

    awaited = FunctionProvider(waits)
    assert await awaited.generate("hi", _context()) == text("waited")
    assert await awaited.generate("again", _context()) == text("waited")
    assert awaited.call_count == 2

    def fails(prompt: str, context: AgentContext) -> ProviderResponse:
        raise LookupError("no model")

    with pytest.raises(LookupError, match="no model"):
        await FunctionProvider(fails).generate("hi", _context())


@pytest.mark.anyio
async def test_function_provider_dicts_and_exceptions() -> None:
    answers: list[Any] = [
        {"segments": [{"type": "text", "text": "wire"}], "metadata": {"k": 1}},
        RuntimeError("returned, then raised"),
    ]

    def next_answer(prompt: str, context: AgentContext) -> Any:
        return answers.pop(0)

    provider = FunctionProvider(next_answer)
    assert await provider.generate("a", _context()) == text("wire", metadata={"k": 1})
    with pytest.raises(RuntimeError, match="returned, then raised"):
        await provider.generate("b", _context())

    def fails(prompt: str, context: AgentContext) -> str:
        raise LookupError("no model")

    raising = FunctionProvider(fails)
    with pytest.raises(LookupError, match="no model"):
        await raising.generate("c", _context())
    assert [c.prompt for c in raising.calls] == ["c"]


@pytest.mark.anyio
async def test_function_provider_does_not_call_what_it_returns() -> None:
    def nested(prompt: str, context: AgentContext) -> Any:
        return lambda p, c: "nested"

    provider = FunctionProvider(nested)
    with pytest.raises(TypeError, match="an answer must be"):
        await provider.generate("a", _context())


def test_function_provider_needs_a_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        FunctionProvider("nope")  # type: ignore[arg-type]


# --- the module's public face ---------------------------------------------------------------


def test_the_test_providers_are_providers() -> None:
    assert isinstance(ScriptedProvider([]), Provider)
    assert isinstance(FunctionProvider(lambda p, c: ""), Provider)


@pytest.mark.parametrize("name", openstarry.testing.__all__)
def test_every_public_name_is_documented(name: str) -> None:
    obj = getattr(openstarry.testing, name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert inspect.getdoc(obj), name
    assert inspect.getdoc(openstarry.testing)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from openstarry.testing import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(openstarry.testing.__all__)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["scripted", "function"])
async def test_test_providers_accept_the_protocol_provider_response(kind: str) -> None:
    """ScriptedProvider and FunctionProvider take a pydantic ``protocol.ProviderResponse``.

    The loop accepts that model from any provider (it calls ``to_core()``), so
    the test providers must too, rather than fail with "an answer must be a
    ProviderResponse ..., not ProviderResponse".
    """
    answer: Any = protocol.ProviderResponse.model_validate(
        {"segments": [{"type": "text", "text": "hi"}]}
    )
    provider = (
        ScriptedProvider([answer]) if kind == "scripted" else FunctionProvider(lambda p, c: answer)
    )

    response = await provider.generate("x", context())

    assert response.segments[0].text == "hi"
