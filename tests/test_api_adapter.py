"""The loop -> Agent API stream adapter (openstarry.api.adapter) over a real agent."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry.agent.interfaces import AgentContext
from openstarry.agent.runtime import Agent
from openstarry.api import adapter as adapter_module
from openstarry.api.adapter import RESPONSE_END, check_request, collect_run, open_run
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    Content,
    DataContent,
    ImageContent,
    InvalidRequestError,
    Message,
    TextContent,
    parse_request,
)
from openstarry.assembly import agent_from_manifest
from openstarry.core import Event, ProviderResponse
from openstarry.events import OUTPUT_AGENT_MESSAGE
from openstarry.testing import FunctionProvider, ScriptedProvider, text, tool_call
from openstarry.tools import resolve_tools

WEATHER = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
HANG = 5

WireEvent = AgentResponse | Message | Content


def request(text_: str = "Query weather in Taipei", **fields: Any) -> AgentRequest:
    body = {"input": [{"role": "user", "content": [{"type": "text", "text": text_}]}], **fields}
    return parse_request(json.dumps(body))


async def run_all(agent: Agent, req: AgentRequest) -> list[WireEvent]:
    with anyio.fail_after(HANG):
        async with open_run(agent, req) as run:
            return [event async for event in run]


def shape(events: Sequence[WireEvent]) -> list[tuple[str, str, str]]:
    """(object, status, type or role) of each event: the sequence's outline."""
    out: list[tuple[str, str, str]] = []
    for event in events:
        kind = event.type.value if isinstance(event, Message) else getattr(event, "type", "")
        out.append((event.object, str(event.status), str(kind)))
    return out


@pytest.mark.anyio
async def test_weather_run_streams_the_spec_sequence() -> None:
    async with agent_from_manifest(WEATHER) as agent:
        said: list[Event] = []
        agent.bus.subscribe(OUTPUT_AGENT_MESSAGE, said.append)
        events = await run_all(agent, request(session_id="alice"))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert shape(events) == [
        ("response", "created", ""),
        ("response", "in_progress", ""),
        ("message", "created", "message"),
        ("content", "in_progress", "text"),
        ("content", "completed", "text"),
        ("message", "completed", "message"),
        ("message", "created", "function_call"),
        ("content", "completed", "data"),
        ("message", "completed", "function_call"),
        ("message", "created", "function_call_output"),
        ("content", "completed", "data"),
        ("message", "completed", "function_call_output"),
        ("message", "created", "message"),
        ("content", "in_progress", "text"),
        ("content", "completed", "text"),
        ("message", "completed", "message"),
        ("response", "completed", ""),
    ]
    final = events[-1]
    assert isinstance(final, AgentResponse)
    assert final.session_id == "alice"
    assert all(e.session_id == "alice" for e in events if isinstance(e, AgentResponse))
    assert final.output is not None
    assert [m.type.value for m in final.output] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    first, call, output, answer = final.output
    assert first.get_text_content() == "Sure, let me check."
    assert answer.get_text_content() == "The weather in Taipei is 25°C, Sunny."
    assert [str(m.role) for m in final.output] == ["assistant", "assistant", "tool", "assistant"]
    assert call.content is not None
    assert output.content is not None
    call_data = call.content[0]
    assert isinstance(call_data, DataContent)
    assert call_data.data is not None
    assert call_data.data["name"] == "get_weather"
    assert json.loads(call_data.data["arguments"]) == {"location": "Taipei"}
    out_data = output.content[0]
    assert isinstance(out_data, DataContent)
    assert out_data.data is not None
    assert out_data.data["call_id"] == call_data.data["call_id"]
    assert json.loads(out_data.data["output"])["summary"] == "25°C, Sunny"
    # Content events name their message; the text delta carries the whole text.
    delta = events[3]
    assert isinstance(delta, TextContent)
    assert delta.delta is True
    message = events[2]
    assert isinstance(message, Message)
    assert delta.msg_id == message.id
    assert delta.text == "Sure, let me check."
    # Usage: the provider's metadata.usage of each response, summed.
    usages = [e.payload["metadata"]["usage"] for e in said]
    assert len(usages) == 2
    assert final.usage == {
        key: sum(u[key] for u in usages)
        for key in ("input_tokens", "output_tokens", "total_tokens")
    }
    assert final.usage["input_tokens"] > 0


@pytest.mark.anyio
async def test_provider_deltas_stream_and_the_message_text_is_the_record() -> None:
    async def streaming(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "prefix":
            for piece in ("Hello", ", "):
                context.emit_text_delta(piece)
                await anyio.sleep(0)
            return text("Hello, world!")
        context.emit_text_delta("Draft that was wrong")
        return text("Corrected answer")

    async with Agent(FunctionProvider(streaming)) as agent:
        events = await run_all(agent, request("prefix"))
        texts = [(e.delta, str(e.status), e.text) for e in events if isinstance(e, TextContent)]
        assert texts == [
            (True, "in_progress", "Hello"),
            (True, "in_progress", ", "),
            (True, "in_progress", "world!"),
            (False, "completed", "Hello, world!"),
        ]
        assert len([e for e in events if isinstance(e, Message)]) == 2  # one message

        events = await run_all(agent, request("other"))
        texts = [(e.delta, str(e.status), e.text) for e in events if isinstance(e, TextContent)]
        assert texts == [
            (True, "in_progress", "Draft that was wrong"),
            (False, "in_progress", "Corrected answer"),
            (False, "completed", "Corrected answer"),
        ]
        final = events[-1]
        assert isinstance(final, AgentResponse)
        assert final.output is not None
        assert final.output[0].get_text_content() == "Corrected answer"


@pytest.mark.anyio
async def test_a_provider_error_fails_the_response_with_an_error_message() -> None:
    async def breaks(prompt: str, context: AgentContext) -> ProviderResponse:
        context.emit_text_delta("Let me")
        raise RuntimeError("the model is down")

    async with Agent(FunctionProvider(breaks)) as agent:
        events = await run_all(agent, request("hi"))
    final = events[-1]
    assert isinstance(final, AgentResponse)
    assert str(final.status) == "failed"
    assert final.error is not None
    assert final.error.code == "PROVIDER_ERROR"
    assert "the model is down" in final.error.message
    assert final.output is not None
    started, error = final.output
    # The message that was streaming ends failed, with what it had said.
    assert str(started.status) == "failed"
    assert started.get_text_content() == "Let me"
    assert error.type.value == "error"
    assert error.code == "PROVIDER_ERROR"
    assert error.message is not None
    assert "the model is down" in error.message


@pytest.mark.anyio
async def test_a_failed_tool_call_is_a_function_call_output_with_the_error() -> None:
    provider = ScriptedProvider([tool_call("no_such_tool", {"x": 1}), text("Sorry.")])
    async with Agent(provider) as agent:
        final = await collect_run(agent, request("do it"))
    assert str(final.status) == "completed"
    assert final.output is not None
    output = next(m for m in final.output if m.type.value == "function_call_output")
    assert output.content is not None
    item = output.content[0]
    assert isinstance(item, DataContent)
    assert item.data is not None
    assert json.loads(item.data["output"])["error"]["code"] == "TOOL_NOT_FOUND"
    assert final.output[-1].get_text_content() == "Sorry."


class Blocker:
    """A provider that says something, then waits until it is cancelled."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def __call__(self, prompt: str, context: AgentContext) -> ProviderResponse:
        context.emit_text_delta("Thinking")
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")


@pytest.mark.anyio
async def test_cancel_stops_the_run_and_ends_the_response_canceled() -> None:
    blocker = Blocker()
    async with Agent(FunctionProvider(blocker)) as agent:
        with anyio.fail_after(HANG):
            async with open_run(agent, request("wait", session_id="s1")) as run:
                events: list[WireEvent] = []
                async for event in run:
                    events.append(event)
                    if isinstance(event, TextContent):
                        run.cancel()
            await blocker.cancelled.wait()
        assert run.result is not None
        assert run.result.stopped
        final = events[-1]
        assert isinstance(final, AgentResponse)
        assert str(final.status) == "canceled"
        assert final.output is not None
        assert [str(m.status) for m in final.output] == ["canceled"]
        assert final.output[0].get_text_content() == "Thinking"
        # The session serves the next request.
        agent.loop.provider = ScriptedProvider(["Back."])
        final = await collect_run(agent, request("again", session_id="s1"))
        assert str(final.status) == "completed"


@pytest.mark.anyio
async def test_leaving_the_stream_early_stops_the_run() -> None:
    blocker = Blocker()
    async with Agent(FunctionProvider(blocker)) as agent:
        with anyio.fail_after(HANG):
            async with open_run(agent, request("wait", session_id="s2")) as run:
                async for event in run:
                    if isinstance(event, TextContent):
                        break
            assert blocker.cancelled.is_set()  # stopped by the time the context is left
            assert run.result is not None
            assert run.result.stopped


@pytest.mark.anyio
async def test_the_session_carries_the_conversation() -> None:
    provider = ScriptedProvider(["First.", "Second."])
    async with Agent(provider) as agent:
        one = await collect_run(agent, request("one", session_id="chat"))
        two = await collect_run(agent, request("two", session_id="chat"))
        fresh = await run_all(agent, request("three"))
    assert one.session_id == two.session_id == "chat"
    # The second call saw the first turn in its memory.
    memory_texts = [getattr(entry, "text", None) for entry in provider.calls[1].memory]
    assert "one" in memory_texts
    assert "First." in memory_texts
    generated = fresh[0]
    assert isinstance(generated, AgentResponse)
    assert generated.session_id is not None
    assert generated.session_id.startswith("session_")


@pytest.mark.anyio
async def test_the_end_marker_follows_the_runs_events_on_the_bus() -> None:
    async with agent_from_manifest(WEATHER) as agent:
        seen: list[Event] = []
        agent.bus.subscribe("*", seen.append)
        async with open_run(agent, request()) as run:
            async for _ in run:
                pass
        await agent.bus.wait_idle()
    trace = [e for e in seen if e.trace_id == seen[0].trace_id]
    assert trace[-1].type == RESPONSE_END
    assert trace[-1].payload == {"responseId": run.response_id, "status": "completed"}


def test_check_request_takes_the_last_user_text() -> None:
    req = parse_request(
        json.dumps(
            {
                "input": [
                    {"role": "user", "content": [{"type": "text", "text": "old"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "reply"}]},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"role": "system", "content": [{"type": "text", "text": "ignored"}]},
                ]
            }
        )
    )
    assert check_request(req) == "a\nb"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (
            {"input": [{"role": "assistant", "content": [{"type": "text", "text": "x"}]}]},
            "invalid_request",
        ),
        ({"input": [{"role": "user", "content": [{"type": "text", "text": "  "}]}]}, "empty_input"),
        ({"input": [{"role": "user"}]}, "empty_input"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "image", "image_url": "https://x/y.png"}]}
                ]
            },
            "unsupported_content",
        ),
        (
            {
                "input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                "tools": [
                    {"type": "function", "function": {"name": "f", "description": "d"}},
                    {"type": "function", "function": {"name": "f", "description": "again"}},
                ],
            },
            "tool_name_clash",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "text", "text": "/reset"}]}], "n": 2},
            "unsupported_n",
        ),
        (
            {
                "input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                "n": 3,
                "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}],
            },
            "unsupported_n",
        ),
    ],
)
def test_check_request_refuses_what_the_agent_cannot_take(body: dict[str, Any], code: str) -> None:
    req = parse_request(json.dumps(body))
    with pytest.raises(InvalidRequestError) as caught:
        check_request(req)
    assert caught.value.code == code
    assert caught.value.http_status == 422


@pytest.mark.anyio
async def test_slash_commands_answer_through_the_stream() -> None:
    tools = resolve_tools(["get_weather"])
    async with Agent(ScriptedProvider([]), tools) as agent:
        direct = await collect_run(agent, request("/get_weather Taipei"))
        helped = await collect_run(agent, request("/help"))
    assert str(direct.status) == "completed"
    assert direct.output is not None
    assert [m.type.value for m in direct.output] == ["function_call", "function_call_output"]
    assert str(helped.status) == "completed"
    assert helped.output is not None
    (message,) = helped.output
    text_ = message.get_text_content()
    assert text_ is not None
    assert "/get_weather" in text_


@pytest.mark.anyio
async def test_image_and_ui_segments_become_content_items_of_the_message() -> None:
    answer = {
        "segments": [
            {"type": "text", "text": "Here is the chart."},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "ui", "ui": {"kind": "button", "label": "More"}},
        ]
    }
    async with Agent(ScriptedProvider([answer])) as agent:
        final = await collect_run(agent, request("chart"))
    assert final.output is not None
    (message,) = final.output
    assert message.content is not None
    text_item, image, ui = message.content
    assert isinstance(text_item, TextContent)
    assert text_item.text == "Here is the chart."
    assert isinstance(image, ImageContent)
    assert image.image_url == "data:image/png;base64,aGVsbG8="
    assert isinstance(ui, DataContent)
    assert ui.data == {"ui": {"kind": "button", "label": "More"}}
    assert [item.index for item in message.content] == [0, 1, 2]


def hi_body(text_: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": [{"type": "text", "text": text_}]}], **fields}


def hi_request(text_: str = "hi", **fields: Any) -> AgentRequest:
    return AgentRequest.model_validate(hi_body(text_, **fields))


async def break_inside(agent: Agent) -> None:
    """Raise ``KeyError`` in the body of ``open_run``, at its first event."""
    async with open_run(agent, hi_request(session_id="s")) as run:
        async for _ in run:
            raise KeyError("mine")


@pytest.mark.anyio
async def test_an_error_in_the_body_of_open_run_comes_out_as_itself() -> None:
    async with Agent(ScriptedProvider(["Fine."], cycle=True)) as agent:
        with pytest.raises(KeyError, match="mine"):
            await break_inside(agent)
        # The run was stopped (before or after its provider answered) and its
        # routing undone: the session answers again.
        with anyio.fail_after(HANG):
            final = await collect_run(agent, hi_request(session_id="s"))
    assert str(final.status) == "completed"
    assert final.output is not None
    assert final.output[-1].get_text_content() == "Fine."


@pytest.mark.anyio
async def test_running_the_adapter_keeps_no_agents_bus_alive() -> None:
    buses = []
    for _ in range(3):
        agent = Agent(ScriptedProvider(["Fine."]))
        async with agent:
            final = await collect_run(agent, hi_request())
        assert str(final.status) == "completed"
        buses.append(weakref.ref(agent.bus))
        del agent
    gc.collect()
    assert [ref() for ref in buses] == [None, None, None]
    assert len(adapter_module._ROUTERS) == 0


@pytest.mark.anyio
async def test_two_runs_of_one_trace_each_get_their_own_events() -> None:
    """Requests that carry the same trace (one agent calling itself over A2A, each hop
    joining the caller's trace; or two clients sending one trace header) run at once:
    each stream gets its own run's events, and ends with its own run."""
    from openstarry.api.tracecontext import incoming_trace

    gate = anyio.Event()

    async def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "first":
            await gate.wait()  # still running while the second starts and ends
        return text(f"answer to {prompt}")

    finals: dict[str, AgentResponse] = {}
    async with Agent(FunctionProvider(answer)) as agent:
        token = incoming_trace.set("11111111-2222-3333-4444-555555555555")
        try:

            async def one(words: str, session: str) -> None:
                async with open_run(agent, request(words, session_id=session)) as run:
                    events = [event async for event in run]
                final = events[-1]
                assert isinstance(final, AgentResponse)
                finals[words] = final

            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(one, "first", "a")
                    await anyio.sleep(0.05)
                    await one("second", "b")
                    gate.set()
        finally:
            incoming_trace.reset(token)
    for words in ("first", "second"):
        final = finals[words]
        assert str(final.status) == "completed"
        assert final.output is not None
        assert [m.get_text_content() for m in final.output] == [f"answer to {words}"]
