"""ExecutionLoop: the think-act loop of spec 000 section 5, with the events of spec 002.

The loop itself: its lifecycle, its inputs (``submit``, ``ask``, ``start``), slash
and built-in commands, think-act rounds, state changes, provider errors and timeouts,
and usage. Sessions and tool execution have their own modules (test_sessions.py,
test_tool_execution.py). Every test drives a real :class:`EventBus` and
:class:`ExecutionLoop` with the providers and tools of ``agent_harness``, collects
every event the bus dispatches, and asserts on them. Waits are bounded by :data:`HANG`
only as a guard against a hang; no test asserts on wall time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import (
    AGENT_MESSAGE,
    ERROR,
    HANG,
    SOURCE,
    STATE_CHANGE,
    SYSTEM_COMMAND,
    TICK_START,
    TOOL_CALL,
    TOOL_RESULT,
    USER_MESSAGE,
    Echo,
    FakeProvider,
    Gate,
    HangingProvider,
    Weather,
    call,
    conformance_problems,
    filler,
    last_state,
    observations,
    outcomes,
    response,
    running,
    schema,
    state_chain,
    states,
    text,
    then_say,
    until,
    validate_payload,
)
from openstarry.agent.commands import parse_tool_args
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
from openstarry.agent.memory import AssistantTurn, MemoryEntry, ToolOutcome, UserTurn
from openstarry.agent.tools import tool
from openstarry.bus import EventBus
from openstarry.core import ContentSegment, Event, ProviderResponse, ToolCall
from openstarry.errors import AgentPainException, ProviderError, ToolArgumentsError
from openstarry.events import AgentState
from openstarry.protocol import parse_payload
from openstarry.testing import FunctionProvider, ScriptedProvider, tool_call
from openstarry.testing import text as text_response
from openstarry.tools import resolve_tools

# ----------------------------------------------------------------------------- helpers


class SyncEcho(Tool):
    """A synchronous tool that returns the arguments it got."""

    def __init__(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.description = f"echo for {name}"
        if parameters is not None:
            self.parameters = parameters
        self.calls: list[dict[str, Any]] = []

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.calls.append(args)
        return {"echo": args}


# ------------------------------------------------------ 1. the sequence of spec 000 §5


@pytest.mark.anyio
async def test_query_weather_in_taipei_event_by_event() -> None:
    weather = Weather()
    provider = FakeProvider(
        response(
            text("Sure, let me check."),
            call("get_weather", {"location": "Taipei"}, "call_abc123"),
        ),
        response(text("It is 25°C and sunny in Taipei.")),
    )
    async with running(provider, [weather]) as h:
        result = await h.ask("Query weather in Taipei", session_id="s1")

    events = h.events
    assert [e.type for e in events] == [
        USER_MESSAGE,
        TICK_START,
        STATE_CHANGE,
        AGENT_MESSAGE,
        STATE_CHANGE,
        TOOL_CALL,
        TOOL_RESULT,
        TICK_START,
        STATE_CHANGE,
        AGENT_MESSAGE,
        STATE_CHANGE,
    ]
    (
        inp,
        tick1,
        thinking,
        said,
        executing,
        tool_call,
        tool_result,
        tick2,
        rethinking,
        answer,
        idle,
    ) = events

    # One trace, one session, distinct ids; the loop is the source of what it emits.
    assert result.trace_id == inp.trace_id
    assert {e.trace_id for e in events} == {inp.trace_id}
    assert {e.session_id for e in events} == {"s1"}
    assert len({e.id for e in events}) == len(events)
    assert {e.source for e in events[1:]} == {SOURCE}

    # Parent links: ticks and messages -> input; state changes and calls -> their tick;
    # the result -> its call.
    assert inp.parent_id is None
    assert tick1.parent_id == inp.id
    assert tick2.parent_id == inp.id
    assert said.parent_id == inp.id
    assert answer.parent_id == inp.id
    assert thinking.parent_id == tick1.id
    assert executing.parent_id == tick1.id
    assert tool_call.parent_id == tick1.id
    assert tool_result.parent_id == tool_call.id
    assert rethinking.parent_id == tick2.id
    assert idle.parent_id == tick2.id

    # Payloads.
    assert inp.payload["text"] == "Query weather in Taipei"
    assert tick1.payload == {"round": 1}
    assert tick2.payload == {"round": 2}
    assert thinking.payload == {"from": "IDLE", "to": "THINKING"}
    assert executing.payload == {"from": "THINKING", "to": "EXECUTING"}
    assert rethinking.payload == {"from": "EXECUTING", "to": "THINKING"}
    assert idle.payload == {"from": "THINKING", "to": "IDLE"}
    assert said.payload["text"] == "Sure, let me check."
    assert said.payload["segments"] == [{"type": "text", "text": "Sure, let me check."}]
    assert said.payload["final"] is False
    assert answer.payload["text"] == "It is 25°C and sunny in Taipei."
    assert answer.payload["final"] is True
    assert tool_call.payload == {
        "toolCallId": "call_abc123",
        "name": "get_weather",
        "args": {"location": "Taipei"},
    }
    assert tool_result.payload == {
        "toolCallId": "call_abc123",
        "name": "get_weather",
        "success": True,
        "result": {"location": "Taipei", "forecast": "25°C, Sunny"},
    }

    # The run's result.
    assert result.replies == ["Sure, let me check.", "It is 25°C and sunny in Taipei."]
    assert result.stopped is False
    assert result.error is None

    # The provider: the same prompt each round, the tools in its context, and the
    # tool's outcome already in memory when it was called the second time.
    assert [(c.prompt, c.round, c.session_id, c.trace_id) for c in provider.calls] == [
        ("Query weather in Taipei", 1, "s1", inp.trace_id),
        ("Query weather in Taipei", 2, "s1", inp.trace_id),
    ]
    assert provider.calls[0].tools == ["get_weather"]
    assert provider.calls[0].memory == [UserTurn("Query weather in Taipei")]
    the_call = ToolCall("get_weather", {"location": "Taipei"}, "call_abc123")
    outcome = ToolOutcome(
        "call_abc123", "get_weather", True, {"location": "Taipei", "forecast": "25°C, Sunny"}
    )
    assert provider.calls[1].memory == [
        UserTurn("Query weather in Taipei"),
        AssistantTurn("Sure, let me check.", (the_call,)),
        outcome,
    ]

    # The tool ran once, with the run's context.
    assert weather.calls == [{"location": "Taipei"}]
    assert weather.contexts[0].trace_id == inp.trace_id
    assert weather.contexts[0].session_id == "s1"
    assert weather.rounds == [1]

    session = h.loop.sessions["s1"]
    assert list(session.memory) == [
        *provider.calls[1].memory,
        AssistantTurn("It is 25°C and sunny in Taipei."),
    ]
    assert session.state.value == "IDLE"
    assert h.loop.runs_completed == 1


@pytest.mark.anyio
async def test_a_plain_answer_is_one_round() -> None:
    provider = FakeProvider(response(text("Hello!")))
    async with running(provider) as h:
        result = await h.ask("hi")
    assert [e.type for e in h.events] == [
        USER_MESSAGE,
        TICK_START,
        STATE_CHANGE,
        AGENT_MESSAGE,
        STATE_CHANGE,
    ]
    assert states(h.events) == [("IDLE", "THINKING"), ("THINKING", "IDLE")]
    assert result.text == "Hello!"


# ----------------------------------------------------------------- 2. slash commands


def slash_tools() -> list[Tool]:
    return [
        Weather(),
        SyncEcho("fs.read", schema("path")),
        SyncEcho("fs.write", schema("path", "text")),
        SyncEcho("calc.add", schema("a", "b", types={"a": "number", "b": "number"})),
        SyncEcho("fs.list", schema()),
        SyncEcho("db.list", schema()),
    ]


@pytest.mark.anyio
async def test_slash_tool_runs_without_the_provider() -> None:
    provider = FakeProvider()
    weather = Weather()
    async with running(provider, [weather]) as h:
        result = await h.ask("/get_weather Taipei")
    assert provider.calls == []
    assert [e.type for e in h.events] == [
        USER_MESSAGE,
        STATE_CHANGE,
        TOOL_CALL,
        TOOL_RESULT,
        STATE_CHANGE,
    ]
    inp, executing, tool_call, tool_result, idle = h.events
    assert {e.trace_id for e in h.events} == {inp.trace_id}
    assert states(h.events) == [("IDLE", "EXECUTING"), ("EXECUTING", "IDLE")]
    # No tick: the state changes and the call hang off the input.
    assert executing.parent_id == inp.id
    assert idle.parent_id == inp.id
    assert tool_call.parent_id == inp.id
    assert tool_result.parent_id == tool_call.id
    assert tool_call.payload["name"] == "get_weather"
    assert tool_call.payload["args"] == {"location": "Taipei"}
    assert tool_result.payload["toolCallId"] == tool_call.payload["toolCallId"]
    assert tool_result.payload["success"] is True
    assert tool_result.payload["result"] == {"location": "Taipei", "forecast": "25°C, Sunny"}
    assert weather.calls == [{"location": "Taipei"}]
    assert weather.rounds == [0]
    assert result.error is None
    assert result.stopped is False


@pytest.mark.parametrize(
    ("line", "tool", "args"),
    [
        ("/get_weather Taipei", "get_weather", {"location": "Taipei"}),
        ("/get_weather location=Taipei", "get_weather", {"location": "Taipei"}),
        ('/get_weather "New Taipei City"', "get_weather", {"location": "New Taipei City"}),
        ("/get_weather New Taipei City", "get_weather", {"location": "New Taipei City"}),
        ('/get_weather {"location": "Taipei"}', "get_weather", {"location": "Taipei"}),
        ("/read notes.txt", "fs.read", {"path": "notes.txt"}),
        ("/fs.read notes.txt", "fs.read", {"path": "notes.txt"}),
        # A string parameter keeps the word as written, even when it looks like JSON.
        ("/read 123", "fs.read", {"path": "123"}),
        (
            "/write notes.txt hello big world",
            "fs.write",
            {"path": "notes.txt", "text": "hello big world"},
        ),
        (
            "/write 'my notes.txt' \"two words\"",
            "fs.write",
            {"path": "my notes.txt", "text": "two words"},
        ),
        ("/write text=hi path=a.txt", "fs.write", {"path": "a.txt", "text": "hi"}),
        ("/write a.txt text=hi", "fs.write", {"path": "a.txt", "text": "hi"}),
        ("/add 1 2", "calc.add", {"a": 1, "b": 2}),
        ("/add b=3 1.5", "calc.add", {"a": 1.5, "b": 3}),
        ('/calc.add {"a": 1, "b": 2}', "calc.add", {"a": 1, "b": 2}),
    ],
)
@pytest.mark.anyio
async def test_slash_arguments_are_parsed(line: str, tool: str, args: dict[str, Any]) -> None:
    provider = FakeProvider()
    tools = slash_tools()
    async with running(provider, tools) as h:
        result = await h.ask(line)
    assert provider.calls == []
    assert result.error is None
    [tool_call] = h.of(TOOL_CALL)
    assert tool_call.payload["name"] == tool
    assert tool_call.payload["args"] == args
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is True
    ran = {t.name: t for t in tools}[tool]
    assert ran.calls == [args]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "line",
    ["/list", "/list everything", "/nosuch", "/nosuch with args", "/fs", "/read.fs notes.txt"],
)
@pytest.mark.anyio
async def test_unknown_or_ambiguous_command_is_an_error(line: str) -> None:
    provider = FakeProvider()
    tools = slash_tools()
    async with running(provider, tools) as h:
        result = await h.ask(line)
    assert provider.calls == []
    assert result.error is not None
    assert result.error["code"] == "UNKNOWN_COMMAND"
    inp = h.of(USER_MESSAGE)[0]
    [error] = h.of(ERROR)
    assert error.payload == result.error
    assert error.parent_id == inp.id
    assert error.trace_id == inp.trace_id
    assert error.session_id == inp.session_id
    assert h.of(TOOL_CALL) == []
    assert all(not t.calls for t in tools)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "line",
    ["/add 1 2 3", "/get_weather", '/write "unbalanced', "/add {not json", "/add a=1 a=2"],
)
@pytest.mark.anyio
async def test_slash_arguments_that_do_not_parse_or_validate_fail_the_tool_result(
    line: str,
) -> None:
    provider = FakeProvider()
    tools = slash_tools()
    async with running(provider, tools) as h:
        result = await h.ask(line)
    assert provider.calls == []
    assert result.error is None
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "INVALID_ARGUMENTS"
    assert all(not t.calls for t in tools)  # type: ignore[attr-defined]
    # A slash command is the user's own: its failure is not an observation for the provider.
    assert observations(h.loop.sessions["s"].memory) == []
    assert last_state(h.events) == {"from": "EXECUTING", "to": "IDLE"}


@pytest.mark.anyio
async def test_help_lists_the_commands_and_the_tools() -> None:
    provider = FakeProvider()
    async with running(provider, slash_tools()) as h:
        result = await h.ask("/help")
        command = h.loop.command("help", session_id="s")
        with anyio.fail_after(HANG):
            await h.bus.wait_idle()
    assert provider.calls == []
    [reply] = result.replies
    for name in ("/help", "/reset", "/stop", "/quit", "/metrics"):
        assert name in reply
    for name in ("/get_weather", "/fs.read", "/fs.write", "/calc.add"):
        assert name in reply
    assert "Get the current weather of a city." in reply
    messages = h.of(AGENT_MESSAGE)
    assert len(messages) == 2
    assert messages[0].payload["text"] == reply
    assert messages[0].payload["metadata"] == {"command": "help"}
    assert messages[0].parent_id == h.of(USER_MESSAGE)[0].id
    # The system command is answered the same way, as a child of the command.
    assert messages[1].payload["text"] == reply
    assert messages[1].parent_id == command.id
    assert messages[1].trace_id == command.trace_id
    assert h.of(TICK_START) == []
    assert h.of(STATE_CHANGE) == []


@pytest.mark.anyio
async def test_metrics_reports_data() -> None:
    provider = FakeProvider(response(text("hello")))
    async with running(provider) as h:
        await h.ask("hi")
        result = await h.ask("/metrics")
    [reply] = result.replies
    message = h.of(AGENT_MESSAGE)[-1]
    metadata = message.payload["metadata"]
    assert metadata["command"] == "metrics"
    data = metadata["data"]
    assert data["loop"]["runs_completed"] == 1
    assert data["loop"]["sessions"] == 1
    assert data["loop"]["runs_stopped"] == 0
    assert data["bus"]["published"] >= 6
    assert data["bus"]["dispatched"][USER_MESSAGE] == 2
    assert json.loads(reply)["loop"] == data["loop"]


#: The events of a turn that calls one tool and then answers, by type.
A_TURN_S_EVENTS = {
    USER_MESSAGE: 1,
    TICK_START: 2,
    STATE_CHANGE: 4,
    TOOL_CALL: 1,
    TOOL_RESULT: 1,
    AGENT_MESSAGE: 1,
}


@pytest.mark.anyio
async def test_a_run_nobody_watches_counts_its_events_without_queueing_them() -> None:
    """With only the loop on the bus, the run's events are emitted at once: counted
    as published and dispatched by type, never queued, and the input is handed to
    the session without the dispatcher."""

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        return tool_call("echo", {"text": "x"}) if not context.tool_results else text_response("ok")

    async with EventBus() as bus, ExecutionLoop(bus, FunctionProvider(model), [Echo()]) as loop:
        with anyio.fail_after(HANG):
            await bus.wait_idle()
            result = await loop.ask("hi", session_id="s")
            assert len(bus) == 0
            metrics = bus.metrics()
    assert result.replies == ["ok"]
    assert metrics["dispatched"] == A_TURN_S_EVENTS
    assert metrics["published"] == 10
    assert metrics["latency_us"]["count"] == 0  # nothing went through the queue


@pytest.mark.parametrize(
    "watched", [TICK_START, STATE_CHANGE, TOOL_CALL, TOOL_RESULT, AGENT_MESSAGE]
)
@pytest.mark.anyio
async def test_a_subscriber_to_one_kind_of_a_run_s_events_gets_them_whole(watched: str) -> None:
    """The tick and the change to THINKING (and a lone call) are emitted unmade in
    one call when nobody reads them, the other changes, the result and the reply
    unmade one by one; a subscriber to any one kind gets its events made, with
    their payloads, and the counts stay the same."""

    @tool
    async def add_one(x: int) -> int:
        """Completes at once: its call is made in one step (execute_at_once)."""
        return x + 1

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        return tool_call("add_one", {"x": 1}) if not context.tool_results else text_response("ok")

    seen: list[Event] = []
    provider = FunctionProvider(model)
    async with EventBus() as bus, ExecutionLoop(bus, provider, [add_one]) as loop:
        bus.subscribe(watched, seen.append)
        with anyio.fail_after(HANG):
            await bus.wait_idle()
            result = await loop.ask("hi", session_id="s")
            await bus.wait_idle()
            metrics = bus.metrics()
    assert result.replies == ["ok"]
    assert metrics["dispatched"] == A_TURN_S_EVENTS
    assert {e.trace_id for e in seen} == {result.trace_id}
    if watched == TICK_START:
        assert [e.payload for e in seen] == [{"round": 1}, {"round": 2}]
    elif watched == STATE_CHANGE:
        assert states(seen) == [
            ("IDLE", "THINKING"),
            ("THINKING", "EXECUTING"),
            ("EXECUTING", "THINKING"),
            ("THINKING", "IDLE"),
        ]
    elif watched == TOOL_CALL:
        [made] = seen
        assert made.payload["name"] == "add_one"
        assert made.payload["args"] == {"x": 1}
        assert isinstance(made.payload["toolCallId"], str)
    elif watched == TOOL_RESULT:
        [made] = seen
        assert made.payload["name"] == "add_one"
        assert made.payload["success"] is True
        assert made.payload["result"] == 2
    else:
        [made] = seen
        assert made.payload["text"] == "ok"
        assert made.payload["final"] is True
        assert made.payload["segments"] == [{"type": "text", "text": "ok"}]


@pytest.mark.anyio
async def test_a_subscriber_added_during_a_run_gets_the_events_that_follow() -> None:
    seen: list[Event] = []
    subscribed = anyio.Event()
    go_on = anyio.Event()

    async def model(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            subscribed.set()
            await go_on.wait()
            return tool_call("echo", {"text": "x"})
        return text_response("ok")

    async with EventBus() as bus, ExecutionLoop(bus, FunctionProvider(model), [Echo()]) as loop:
        with anyio.fail_after(HANG):
            pending = loop.start("hi", session_id="s")
            await subscribed.wait()
            bus.subscribe("*", seen.append)
            go_on.set()
            await pending.wait()
            await bus.wait_idle()
    states = [(e.payload["from"], e.payload["to"]) for e in seen if e.type == STATE_CHANGE]
    assert [e.type for e in seen if e.type != STATE_CHANGE] == [
        TOOL_CALL,
        TOOL_RESULT,
        TICK_START,
        AGENT_MESSAGE,
    ]
    assert states == [("THINKING", "EXECUTING"), ("EXECUTING", "THINKING"), ("THINKING", "IDLE")]
    call, outcome = (e for e in seen if e.type in (TOOL_CALL, TOOL_RESULT))
    assert outcome.parent_id == call.id


# ------------------------------------------------- 3. failures are told, not raised


@pytest.mark.parametrize(
    ("failure", "code", "message"),
    [
        pytest.param(AgentPainException("cannot parse"), "AGENT_PAIN", "cannot parse", id="pain"),
        pytest.param(
            RuntimeError("api down"), "PROVIDER_ERROR", "RuntimeError: api down", id="error"
        ),
        pytest.param(
            ProviderError("quota"), "PROVIDER_ERROR", "ProviderError: quota", id="provider"
        ),
        pytest.param(42, "AGENT_PAIN", "int", id="int"),
        pytest.param(None, "AGENT_PAIN", "NoneType", id="none"),
        pytest.param("text", "AGENT_PAIN", "str", id="str"),
        pytest.param({"segments": [{"type": "bogus"}]}, "AGENT_PAIN", "", id="bad-dict"),
        pytest.param({"segments": "no"}, "AGENT_PAIN", "", id="bad-segments"),
    ],
)
@pytest.mark.anyio
async def test_a_failing_provider_ends_the_run_with_an_error(
    failure: Any, code: str, message: str
) -> None:
    provider = FakeProvider(failure, response(text("Better now.")))
    async with running(provider, [Weather()]) as h:
        result = await h.ask("hi")
        trace = h.trace(result.trace_id)
        again = await h.ask("hi again")
    assert result.error is not None
    assert result.error["code"] == code
    assert message in result.error["message"]
    assert result.error["source"] == SOURCE
    assert result.replies == []
    assert result.stopped is False
    [error] = [e for e in trace if e.type == ERROR]
    assert error.payload == result.error
    [tick] = [e for e in trace if e.type == TICK_START]
    assert error.parent_id == tick.id
    assert [e for e in trace if e.type in (AGENT_MESSAGE, TOOL_CALL)] == []
    assert states(trace) == [("IDLE", "THINKING"), ("THINKING", "IDLE")]
    assert h.loop.sessions["s"].state.value == "IDLE"
    # The session goes on.
    assert again.error is None
    assert again.replies == ["Better now."]


@pytest.mark.anyio
async def test_a_provider_may_answer_in_wire_form() -> None:
    provider = FakeProvider(
        {
            "segments": [
                {"type": "text", "text": "Sure, let me check."},
                {
                    "type": "tool_call",
                    "toolCall": {"id": "w1", "name": "get_weather", "args": {"location": "Taipei"}},
                },
            ],
            "metadata": {"tokens": 7},
        },
        {"segments": [{"type": "text", "text": "25°C, Sunny."}]},
    )
    weather = Weather()
    async with running(provider, [weather]) as h:
        result = await h.ask("Query weather in Taipei")
    assert result.error is None
    assert result.replies == ["Sure, let me check.", "25°C, Sunny."]
    assert weather.calls == [{"location": "Taipei"}]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "w1"
    assert tool_result.payload["success"] is True
    assert h.of(AGENT_MESSAGE)[0].payload["metadata"] == {"tokens": 7}
    assert outcomes(provider.calls[1].memory)[0].tool_call_id == "w1"


# ----------------------------------------------------------------------- 4. limits


@pytest.mark.anyio
async def test_tool_round_limit() -> None:
    provider = FakeProvider(
        reply=lambda prompt, context: response(
            text(f"round {context.round}"), call("get_weather", {"location": "Taipei"})
        )
    )
    weather = Weather()
    async with running(provider, [weather], limits=LoopLimits(max_tool_rounds=2)) as h:
        result = await h.ask("loop forever")
    assert len(provider.calls) == 3
    assert len(weather.calls) == 2
    assert len(h.of(TOOL_RESULT)) == 2
    assert [e.payload["round"] for e in h.of(TICK_START)] == [1, 2, 3]
    assert result.error is not None
    assert result.error["code"] == "TOOL_ROUND_LIMIT"
    [error] = h.of(ERROR)
    assert error.parent_id == h.of(TICK_START)[2].id
    assert result.replies == ["round 1", "round 2", "round 3"]
    assert last_state(h.events) == {"from": "THINKING", "to": "IDLE"}
    assert any("2 tool rounds" in o for o in observations(h.loop.sessions["s"].memory))


@pytest.mark.anyio
async def test_provider_timeout() -> None:
    provider = HangingProvider()
    async with running(provider, limits=LoopLimits(provider_timeout=0.05)) as h:
        result = await h.ask("hello?")
    assert result.error is not None
    assert result.error["code"] == "PROVIDER_TIMEOUT"
    assert provider.cancelled is True
    assert result.stopped is False
    assert h.of(AGENT_MESSAGE) == []
    assert states(h.events) == [("IDLE", "THINKING"), ("THINKING", "IDLE")]
    assert h.loop.sessions["s"].state.value == "IDLE"
    [error] = h.of(ERROR)
    assert error.payload == result.error
    assert error.parent_id == h.of(TICK_START)[0].id


class Answers:
    """A provider whose ``generate`` raises ``answer`` (an exception) or returns it."""

    name = "answers"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def generate(self, prompt: str, context: AgentContext) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "code", "message"),
    [
        (RuntimeError("api down"), "PROVIDER_ERROR", "RuntimeError: api down"),
        (AgentPainException("cannot parse"), "AGENT_PAIN", "cannot parse"),
        (42, "AGENT_PAIN", "int"),
    ],
)
@pytest.mark.anyio
async def test_a_provider_that_raises_or_answers_no_response_ends_the_run(
    answer: Any, code: str, message: str
) -> None:
    async with running(Answers(answer)) as h:
        result = await h.ask("hi")
    assert result.error is not None
    assert result.error["code"] == code
    assert message in result.error["message"]
    assert states(h.events) == [("IDLE", "THINKING"), ("THINKING", "IDLE")]


class Sleeps(Tool):
    """An async tool that takes a little while."""

    name = "nap"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        await anyio.sleep(0.5)  # longer than the provider timeout below
        return "rested"


@pytest.mark.anyio
async def test_the_provider_timeout_does_not_apply_to_tools() -> None:
    provider = then_say(response(call("nap", {})), "Rested.")
    limits = LoopLimits(provider_timeout=0.25)
    async with running(provider, [Sleeps()], limits=limits) as h:
        result = await h.ask("nap")
    assert result.error is None
    assert result.replies == ["Rested."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is True


# ----------------------------------------------------------------- 5. memory window


@pytest.mark.anyio
async def test_memory_window_keeps_the_last_user_turns() -> None:
    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "three" and context.round == 1:
            return response(call("get_weather", {"location": "Taipei"}, "w3"))
        return response(text(f"re: {prompt}"))

    provider = FakeProvider(reply=reply)
    async with running(provider, [Weather()], memory_window=2) as h:
        for line in ("one", "two", "three"):
            await h.ask(line)
        memory = list(h.loop.sessions["s"].memory)
        assert [m for m in memory if isinstance(m, UserTurn)] == [
            UserTurn("two"),
            UserTurn("three"),
        ]
        assert memory[:2] == [UserTurn("two"), AssistantTurn("re: two")]
        await h.ask("four")
        memory = list(h.loop.sessions["s"].memory)
    # The turn with a tool call is kept whole: the call and its outcome together.
    assert memory[0] == UserTurn("three")
    assert isinstance(memory[1], AssistantTurn)
    assert memory[1].tool_calls[0].id == "w3"
    assert isinstance(memory[2], ToolOutcome)
    assert memory[2].tool_call_id == "w3"
    assert memory[3:] == [AssistantTurn("re: three"), UserTurn("four"), AssistantTurn("re: four")]
    assert provider.calls[-1].memory == [*memory[:-1]]


# ----------------------------------------------------------------- 6. invalid inputs


@pytest.mark.parametrize(
    "payload",
    [{"txt": "hi"}, {"text": 5}, {"text": None}, None, ["hi"], "hi", 3],
    ids=["no-text", "int-text", "null-text", "null", "list", "str", "int"],
)
@pytest.mark.anyio
async def test_user_message_without_text_is_invalid_input(payload: Any) -> None:
    provider = FakeProvider()
    async with running(provider) as h:
        event = Event.new(USER_MESSAGE, payload, source="cli", session_id="s")
        await h.publish(event)
    assert provider.calls == []
    [error] = h.of(ERROR)
    assert error.payload["code"] == "INVALID_INPUT"
    assert error.parent_id == event.id
    assert error.trace_id == event.trace_id
    assert error.session_id == "s"
    assert [e.type for e in h.events] == [USER_MESSAGE, ERROR]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"command": "explode"}, "UNKNOWN_COMMAND"),
        ({"command": "/explode", "args": []}, "UNKNOWN_COMMAND"),
        ({"command": "get_weather", "args": ["Taipei"]}, "UNKNOWN_COMMAND"),
        ({"command": 5}, "INVALID_INPUT"),
        ({"command": "stop", "args": "now"}, "INVALID_INPUT"),
        ({}, "INVALID_INPUT"),
        (None, "INVALID_INPUT"),
    ],
)
@pytest.mark.anyio
async def test_bad_system_commands(payload: Any, code: str) -> None:
    provider = FakeProvider()
    weather = Weather()
    async with running(provider, [weather]) as h:
        event = Event.new(SYSTEM_COMMAND, payload, source="cli", session_id="s", priority=0)
        await h.publish(event)
    assert provider.calls == []
    assert weather.calls == []
    [error] = h.of(ERROR)
    assert error.payload["code"] == code
    assert error.parent_id == event.id
    assert error.priority == 0
    assert [e.type for e in h.events] == [SYSTEM_COMMAND, ERROR]


@pytest.mark.parametrize("line", ["//not a command", "/ spaced", "/"])
@pytest.mark.anyio
async def test_lines_that_are_not_commands_go_to_the_provider(line: str) -> None:
    provider = FakeProvider(response(text("ok")))
    async with running(provider) as h:
        result = await h.ask(line)
    assert result.replies == ["ok"]
    assert [c.prompt for c in provider.calls] == [line]


@pytest.mark.anyio
async def test_submit_starts_a_run_like_ask() -> None:
    provider = FakeProvider(response(text("ok")))
    async with running(provider) as h:
        event = h.loop.submit("hi", session_id="s")
        with anyio.fail_after(HANG):
            while not h.of(STATE_CHANGE) or last_state(h.events)["to"] != "IDLE":
                await h.bus.wait_idle()
                await anyio.sleep(0.001)
    assert {e.trace_id for e in h.events} == {event.trace_id}
    assert h.of(AGENT_MESSAGE)[0].payload["text"] == "ok"


# ------------------------------------ 7. text deltas, the tool retrieval hook, usage


@pytest.mark.anyio
async def test_text_deltas_become_events_before_the_message() -> None:
    kept: list[AgentContext] = []

    async def streaming(prompt: str, context: AgentContext) -> Any:
        kept.append(context)
        context.emit_text_delta("Hel")
        context.emit_text_delta("")  # nothing to say: no event
        context.emit_text_delta("lo")
        return text_response("Hello")

    async with running(FunctionProvider(streaming), []) as h:
        result = await h.ask("hi")
        kept[0].emit_text_delta("late")  # after generate returned: dropped
        await h.bus.wait_idle()
    assert result.text == "Hello"
    deltas = h.of("OUTPUT:AGENT_MESSAGE_DELTA")
    assert [d.payload for d in deltas] == [{"text": "Hel", "round": 1}, {"text": "lo", "round": 1}]
    (tick,) = h.of("KERNEL:TICK_START")
    assert all(d.parent_id == tick.id for d in deltas)
    types = [e.type for e in h.events]
    assert types.index("OUTPUT:AGENT_MESSAGE_DELTA") < types.index("OUTPUT:AGENT_MESSAGE")
    for d in deltas:
        validate_payload(d)


@pytest.mark.anyio
async def test_a_delta_that_is_not_text_fails_the_provider_call() -> None:
    async def bad(prompt: str, context: AgentContext) -> Any:
        context.emit_text_delta(b"bytes")  # type: ignore[arg-type]
        return text_response("never")

    async with running(FunctionProvider(bad), []) as h:
        await h.ask("hi")
    (error,) = h.of("KERNEL:ERROR")
    assert error.payload["code"] == "PROVIDER_ERROR"
    assert "must be a str" in error.payload["message"]


class Picker:
    """Picks the tools whose name appears in the query, then the rest by name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> Sequence[str]:
        self.calls.append((query, limit))
        hits = [name for name in tools if name in query]
        return ([*hits, "not-a-tool", *sorted(tools)])[: limit + 1]


def _tools(n: int) -> list[Tool]:
    out: list[Tool] = []
    for i in range(n):
        tool = Echo()
        tool.name = f"t{i:02d}"
        out.append(tool)
    return out


@pytest.mark.anyio
async def test_only_the_retrieved_tools_reach_the_provider() -> None:
    seen: list[list[str]] = []

    def brain(prompt: str, context: AgentContext) -> Any:
        seen.append(sorted(context.tools))
        if context.round == 1:
            return tool_call("t29", {"x": 1})  # not among those shown: still runs
        return text_response("ok")

    picker = Picker()
    async with running(FunctionProvider(brain), _tools(30), max_tools=3, retriever=picker) as h:
        result = await h.ask("use t17 and t23")
    assert result.text == "ok"
    assert picker.calls == [("use t17 and t23", 3)]
    assert seen[0] == ["t00", "t17", "t23"]  # at most 3, unknown names dropped
    assert seen[1] == seen[0]  # chosen once per input
    (outcome,) = h.of("EXEC:TOOL_RESULT")
    assert outcome.payload["success"] is True


@pytest.mark.anyio
async def test_no_retrieval_when_the_tools_fit() -> None:
    picker = Picker()
    seen: list[int] = []

    def brain(prompt: str, context: AgentContext) -> Any:
        seen.append(len(context.tools))
        return text_response("ok")

    async with running(FunctionProvider(brain), _tools(3), max_tools=3, retriever=picker) as h:
        await h.ask("hi")
    assert seen == [3]
    assert picker.calls == []


@pytest.mark.anyio
async def test_a_failing_retriever_fails_the_run_not_the_loop() -> None:
    class Broken:
        def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> Sequence[str]:
            raise RuntimeError("index corrupt")

    async with running(
        ScriptedProvider([text_response("a")]), _tools(5), max_tools=2, retriever=Broken()
    ) as h:
        await h.ask("hi")
    (error,) = h.of("KERNEL:ERROR")
    assert error.payload["code"] == "INTERNAL_ERROR"
    assert "index corrupt" in error.payload["message"]


def test_max_tools_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tools"):
        ExecutionLoop(EventBus(), ScriptedProvider([]), [], max_tools=0)


@pytest.mark.anyio
async def test_usage_adds_up_over_every_response_of_a_run() -> None:
    provider = ScriptedProvider(
        [
            tool_call("echo", {"x": 1}, metadata={"usage": {"input_tokens": 10, "raw": {"a": 1}}}),
            text_response("done", metadata={"usage": {"input_tokens": 5, "output_tokens": 2}}),
        ]
    )
    async with running(provider, [Echo()]) as h:
        result = await h.ask("go")
        plain = await h.ask("/echo x=1")
    assert result.usage == {"input_tokens": 15, "output_tokens": 2, "raw": {"a": 1}}
    assert plain.usage is None


def nested(levels: int) -> Any:
    """``[[[...1...]]]``, ``levels`` lists deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            ProviderResponse([ContentSegment("text", text="hi")], {"m": nested(62)}),
            id="metadata",
        ),
        pytest.param(ProviderResponse([ContentSegment("ui", ui={"m": nested(60)})]), id="ui"),
    ],
)
@pytest.mark.anyio
async def test_a_response_too_deep_for_an_event_ends_the_run_not_the_loop(
    answer: ProviderResponse,
) -> None:
    """A provider response nested too deep to fit in an OUTPUT:AGENT_MESSAGE ends
    only its own run with a KERNEL:ERROR; the loop keeps serving other sessions
    (spec 000 §7: a provider's failure is reported, not raised)."""
    provider = FunctionProvider(lambda prompt, context: answer if prompt == "bad" else "fine")
    async with running(provider) as h:
        bad = await h.ask("bad", session_id="a")
        good = await h.ask("good", session_id="b")
    assert bad.error is not None
    assert good.replies == ["fine"]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('/echo {"x": ' + "[" * 70 + "]" * 70 + "}", id="json-object-70-deep"),
        pytest.param("/echo x=" + "[" * 70 + "]" * 70, id="key-value-70-deep"),
        pytest.param("/echo x=" + "[" * 50_000 + "]" * 50_000, id="key-value-recursion"),
        pytest.param('/echo {"x": ' + "[" * 50_000 + "]" * 50_000 + "}", id="object-recursion"),
        pytest.param("/echo " + "[" * 50_000 + "]" * 50_000, id="positional-recursion"),
    ],
)
@pytest.mark.anyio
async def test_a_slash_line_with_deeply_nested_arguments_is_invalid_arguments(line: str) -> None:
    """A slash line whose arguments are nested too deep (for the JSON decoder or for a
    ToolCall) gets a failed EXEC:TOOL_RESULT with INVALID_ARGUMENTS, like any argument
    line that does not parse; whatever a user types, the session keeps working."""
    provider = FunctionProvider(lambda prompt, context: "fine")
    async with running(provider, [Echo()]) as h:
        await h.ask(line)
        after = await h.ask("hello")
    [result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert result.payload["success"] is False
    assert result.payload["error"]["code"] == "INVALID_ARGUMENTS"
    assert after.replies == ["fine"]


@pytest.mark.anyio
async def test_a_memory_window_of_one_keeps_the_last_turn() -> None:
    """``memory.window`` of 1, which the manifest allows, keeps exactly the latest user
    turn: the second input is answered and memory holds only that turn."""
    provider = FunctionProvider(lambda prompt, context: f"re: {prompt}")
    async with running(provider, memory_window=1) as h:
        await h.ask("one")
        second = await h.ask("two")
        memory = list(h.loop.sessions["s"].memory)
    assert second.replies == ["re: two"]
    assert [m for m in memory if isinstance(m, UserTurn)] == [UserTurn("two")]


@pytest.mark.anyio
async def test_a_small_bus_does_not_drop_the_state_changes_of_a_run() -> None:
    """On a bus with room for only two events, a run still publishes every
    KERNEL:STATE_CHANGE (waiting for room rather than dropping), so a subscriber
    tracking the agent's state sees each transition."""
    echo = Echo()
    provider = ScriptedProvider([tool_call("echo", {"x": 1}), text_response("done")])
    async with running(provider, [echo], capacity=2) as h:
        result = await h.ask("go")
        dropped = h.loop.metrics()["loop"]["events_dropped"]
    assert result.replies == ["done"]
    changes = [(e.payload["from"], e.payload["to"]) for e in h.events if e.type == STATE_CHANGE]
    assert changes == [
        ("IDLE", "THINKING"),
        ("THINKING", "EXECUTING"),
        ("EXECUTING", "THINKING"),
        ("THINKING", "IDLE"),
    ]
    assert dropped == 0


@pytest.mark.anyio
async def test_closing_the_bus_during_a_run_does_not_kill_the_loop() -> None:
    """Closing the bus while a run waits on a tool ends that run (its events have nowhere
    to go): ``ask`` returns and the loop exits cleanly, without an ExceptionGroup."""
    gate = Gate()
    provider = ScriptedProvider([tool_call("gate", {}), text_response("done")])
    results: list[RunResult] = []
    async with running(provider, [gate]) as h:

        async def go() -> None:
            results.append(await h.loop.ask("go"))

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(go)
                await gate.started.wait()
                await h.bus.aclose()
                gate.release.set()
    assert len(results) == 1


@pytest.mark.parametrize("when", ["before-enter", "after-exit"])
@pytest.mark.anyio
async def test_ask_on_a_loop_that_is_not_running_raises(when: str) -> None:
    """``ask`` on a loop that was never entered, or was already left, raises
    RuntimeError ("not running") at once instead of waiting forever for a run that
    nobody will start."""
    provider = FunctionProvider(lambda prompt, context: "hi")
    async with EventBus() as bus:
        loop = ExecutionLoop(bus, provider)
        if when == "after-exit":
            async with loop:
                assert (await loop.ask("first")).replies == ["hi"]
        with anyio.fail_after(0.5), pytest.raises(RuntimeError, match="not running"):
            await loop.ask("hello")


@pytest.mark.anyio
async def test_a_run_error_is_dispatched_after_the_events_it_descends_from() -> None:
    """Every event of a run, including a KERNEL:ERROR when the provider fails, is
    dispatched after its parent, and the error after the THINKING transition it ends,
    so transcripts and the CLI's ``--events`` show a failed turn in order."""

    def fail(prompt: str, context: AgentContext) -> ProviderResponse:
        raise RuntimeError("the model is down")

    async with running(FunctionProvider(fail)) as h:
        result = await h.ask("go")
    assert result.error is not None
    seen: set[str] = set()
    for event in h.events:
        assert event.parent_id is None or event.parent_id in seen, (event.type, event.parent_id)
        seen.add(event.id)
    types = [e.type for e in h.events]
    assert types.index(ERROR) > types.index(STATE_CHANGE)


@pytest.mark.anyio
async def test_every_event_of_a_run_with_non_object_args_matches_the_protocol() -> None:
    """Every event the loop emits validates against its protocol payload model (spec
    002), even when a provider's tool call has non-object ``args``, so consumers can
    validate the stream with the project's own models."""
    bad_call = ProviderResponse([ContentSegment("tool_call", tool_call=ToolCall("echo", [1]))])
    provider = ScriptedProvider([bad_call, text_response("done")])
    async with running(provider, [Echo()]) as h:
        await h.ask("go")
    # (A check of each event passes on none: the run's kinds of event are all there.)
    kinds = {e.type for e in h.events}
    assert kinds >= {"EXEC:TOOL_CALL", "EXEC:TOOL_RESULT", "OUTPUT:AGENT_MESSAGE"}
    for event in h.events:
        parse_payload(event.type, event.payload)


class Fail(Tool):
    """An async tool that always raises."""

    name = "fail"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise RuntimeError("broken")


def unanswered_calls(memory: Iterable[MemoryEntry]) -> list[str]:
    """Ids of tool calls in memory that no ToolOutcome answers."""
    entries = list(memory)
    answered = {e.tool_call_id for e in entries if isinstance(e, ToolOutcome)}
    return [
        call.id
        for e in entries
        if isinstance(e, AssistantTurn)
        for call in e.tool_calls
        if call.id not in answered
    ]


@pytest.mark.anyio
async def test_runs_started_and_never_waited_for_leave_nothing_behind() -> None:
    """Inputs sent with ``loop.start()`` whose ``PendingRun.wait()`` is never awaited
    (fire and forget: the caller follows the bus instead) leave no per-input state in
    the loop once their runs have ended, so a long-running agent does not grow by a
    RunResult and a Signal per input; a late ``wait()`` still returns the result."""
    provider = FunctionProvider(lambda prompt, context: f"re: {prompt}")
    async with running(provider) as h:
        pending = [h.loop.start(f"turn {i}", session_id="s") for i in range(20)]
        with anyio.fail_after(HANG):
            await until(lambda: h.loop.runs_completed == 20)
            await h.bus.wait_idle()
        left = len(h.loop._waiters)
        with anyio.fail_after(HANG):
            late = await pending[-1].wait()
    assert left == 0, f"{left} entries kept for runs that have ended"
    assert late.replies == ["re: turn 19"]


@pytest.mark.anyio
async def test_every_event_of_every_path_conforms() -> None:
    """(Regression guard, passes.) Across every path of the loop (a plain turn, tool
    rounds, an unknown tool, the round limit, a provider's AgentPainException and
    error, the provider timeout, a slash tool and an unknown slash command, every
    built-in typed and sent as INPUT:SYSTEM_COMMAND, an unknown system command, inputs
    with bad payloads, a locked session, /stop during a tool, /stop of queued inputs,
    SESSION_BUSY), every emitted event validates against its payload model, descends
    from an event dispatched earlier in the same trace and session, and each run's
    state changes chain from IDLE back to IDLE."""
    gate = Gate()

    async def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        first = context.round == 1
        if prompt == "tool":
            return tool_call("echo", {"x": 1}, text="checking") if first else text_response("done")
        if prompt == "unknown":
            return tool_call("nope", {}) if first else text_response("done")
        if prompt == "forever":
            return tool_call("echo", {"x": context.round})
        if prompt == "fail":
            return tool_call("fail", {})
        if prompt == "gate":
            return tool_call("gate", {}) if first else text_response("done")
        if prompt == "pain":
            raise AgentPainException("cannot parse")
        if prompt == "boom":
            raise RuntimeError("the model is down")
        if prompt == "slow":
            await anyio.sleep_forever()
        return text_response(f"re: {prompt}")

    limits = LoopLimits(
        max_tool_rounds=2, provider_timeout=0.05, max_failure_streak=2, max_pending_inputs=1
    )
    inputs: set[str] = set()
    async with running(FunctionProvider(reply), [Echo(), Fail(), gate], limits=limits) as h:

        async def ask(line: str, session_id: str = "s") -> RunResult:
            pending = h.loop.start(line, session_id=session_id)
            inputs.add(pending.event.id)
            with anyio.fail_after(HANG):
                result = await pending.wait()
                await h.bus.wait_idle()
            return result

        lines = ["hello", "tool", "unknown", "forever", "pain", "boom", "slow", "/echo x=1"]
        lines += ["/nope", "/help", "/metrics", "/stop", "/reset", "hello again"]
        codes = [(await ask(line)).error for line in lines]
        assert [c["code"] if c else None for c in codes] == [
            *(None, None, None, "TOOL_ROUND_LIMIT", "AGENT_PAIN", "PROVIDER_ERROR"),
            *("PROVIDER_TIMEOUT", None, "UNKNOWN_COMMAND", None, None, None, None, None),
        ]
        await ask("fail", "locked")
        locked = await ask("hi", "locked")
        assert locked.error is not None
        assert locked.error["code"] == "SESSION_LOCKED"
        await ask("/quit", "q")
        for name in ("stop", "reset", "help", "metrics", "bogus", "quit"):
            inputs.add(h.loop.command(name, session_id="c").id)
        for kind, payload in ((USER_MESSAGE, {"nottext": 1}), (SYSTEM_COMMAND, ["x"])):
            bad = Event.new(kind, payload, source="test", session_id="c")
            inputs.add(bad.id)
            await h.publish(bad)
        # /stop during a tool, with one input queued behind the run and one refused.
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                results: list[RunResult] = []

                async def queue(line: str) -> None:
                    results.append(await ask(line, "g"))

                tg.start_soon(queue, "gate")
                await gate.started.wait()
                tg.start_soon(queue, "queued")
                tg.start_soon(queue, "refused")
                await until(lambda: len(results) == 1)  # the refused one
                inputs.add(h.loop.command("stop", session_id="g").id)
            await h.bus.wait_idle()
        assert sorted((r.stopped, r.error is not None) for r in results) == [
            (False, True),
            (True, False),
            (True, False),
        ]
    assert conformance_problems(h.events, inputs) == []


@pytest.mark.anyio
async def test_a_provider_that_fails_at_once_is_not_reported_as_a_timeout() -> None:
    """A provider that raises at once ends the run with PROVIDER_ERROR (its own
    message), even when the bus is slow to take that KERNEL:ERROR: the provider
    deadline covers only the provider call, so a wait for room on the bus that outlasts
    ``provider_timeout`` does not turn the error into PROVIDER_TIMEOUT."""
    capacity = 4
    entered = anyio.Event()
    release = anyio.Event()
    timeout = 0.02

    async with EventBus(capacity=capacity) as bus:

        async def hold(event: Event) -> None:
            entered.set()
            await release.wait()

        async def reply(prompt: str, context: AgentContext) -> ProviderResponse:
            bus.publish(Event.new("X:HOLD", {}, source="test", session_id="x"))
            await entered.wait()
            i = 0
            while len(bus) < capacity:
                bus.publish(filler(i))
                i += 1
            raise RuntimeError("the model is down")

        events: list[Event] = []
        bus.subscribe("*", events.append)
        bus.subscribe("X:HOLD", hold)
        results: list[RunResult] = []
        limits = LoopLimits(provider_timeout=timeout)
        async with ExecutionLoop(bus, FunctionProvider(reply), limits=limits) as loop:
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:

                    async def go() -> None:
                        results.append(await loop.ask("go", session_id="s"))

                    tg.start_soon(go)
                    await until(lambda: bus._room_waiters > 0)
                    await anyio.sleep(timeout * 5)  # the bus stays full past the deadline
                    release.set()
                await bus.wait_idle()
    [result] = results
    assert result.error is not None
    assert result.error["code"] == "PROVIDER_ERROR", result.error
    errors = [e.payload["code"] for e in events if e.type == ERROR]
    assert errors == ["PROVIDER_ERROR"]


async def _leave_the_loop_mid_run() -> tuple[list[Event], ExecutionLoop, list[RunResult]]:
    """A run blocked in a tool, two inputs queued behind it, and the loop is left.

    Returns the events, the loop, and the three results in the order of the inputs.
    """
    gate = Gate()
    provider = FunctionProvider(
        lambda prompt, context: tool_call("gate", {}, id="c1") if context.round == 1 else "done"
    )
    results: dict[int, RunResult] = {}
    async with EventBus() as bus:
        events: list[Event] = []
        bus.subscribe("*", events.append)
        with anyio.fail_after(HANG):
            async with (
                anyio.create_task_group() as tg,
                ExecutionLoop(bus, provider, [gate]) as loop,
            ):

                async def ask(i: int) -> None:
                    results[i] = await loop.ask("go", session_id="s")

                tg.start_soon(ask, 0)
                await gate.started.wait()
                tg.start_soon(ask, 1)
                tg.start_soon(ask, 2)
                await anyio.wait_all_tasks_blocked()
            await bus.wait_idle()
    return events, loop, [results[i] for i in sorted(results)]


@pytest.mark.anyio
async def test_leaving_the_loop_returns_every_pending_ask_as_stopped() -> None:
    """(Regression guard, passes.) Leaving the loop while a run is in progress and
    inputs wait behind it returns every pending ``ask`` with ``stopped`` set, instead of
    leaving the callers waiting."""
    _, _, results = await _leave_the_loop_mid_run()
    assert [r.stopped for r in results] == [True, True, True]


@pytest.mark.anyio
async def test_leaving_the_loop_mid_run_ends_the_run_back_in_idle() -> None:
    """Leaving the loop while a run is in progress (the bus still open) ends that run as
    a /stop does: a KERNEL:STATE_CHANGE back to IDLE with a reason, and the session's
    state IDLE, so subscribers tracking the agent's state do not see it stuck in
    EXECUTING."""
    events, loop, results = await _leave_the_loop_mid_run()
    chain = state_chain(events, results[0].trace_id)
    assert chain[:2] == [("IDLE", "THINKING"), ("THINKING", "EXECUTING")]
    assert chain[-1][1] == "IDLE", chain
    assert loop.sessions["s"].state is AgentState.IDLE


@pytest.mark.anyio
async def test_leaving_the_loop_mid_run_answers_the_open_tool_calls() -> None:
    """Leaving the loop while a tool call is in progress gives that call an outcome in
    the session's memory (as /stop does with CANCELLED), so a loop entered again on the
    same sessions never hands a provider a call without its answer."""
    _, loop, _ = await _leave_the_loop_mid_run()
    assert unanswered_calls(loop.sessions["s"].memory) == []


class _HeldFullBus:
    """Fills a bus of capacity 1 behind a handler that holds its dispatcher until
    ``release`` is set; ``events`` records every event dispatched."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.events: list[Event] = []
        self.entered = anyio.Event()
        self.release = anyio.Event()
        bus.subscribe("*", self.events.append)
        bus.subscribe("X:HOLD", self._hold)

    async def _hold(self, event: Event) -> None:
        self.entered.set()
        await self.release.wait()

    async def fill(self) -> None:
        self.bus.publish(Event.new("X:HOLD", {}, source="test", session_id="x"))
        await self.entered.wait()
        self.bus.publish(filler(0))  # the bus is full

    def inputs(self) -> list[Event]:
        return [e for e in self.events if e.type == USER_MESSAGE]


@pytest.mark.anyio
async def test_an_ask_waiting_for_room_is_not_published_after_the_loop_has_left() -> None:
    """An ``ask`` whose input is still waiting for room on a full bus when the loop is
    left returns ``stopped`` and its input is never published afterwards, so no other
    loop on the bus (or this one entered again) serves an input its caller was told
    had stopped."""
    results: list[RunResult] = []
    async with EventBus(capacity=1) as bus:
        held = _HeldFullBus(bus)
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                async with ExecutionLoop(bus, FunctionProvider(lambda p, c: "hi")) as loop:
                    await held.fill()

                    async def ask() -> None:
                        results.append(await loop.ask("hello", session_id="s"))

                    tg.start_soon(ask)
                    await until(lambda: bus._room_waiters > 0)
                held.release.set()
            await bus.wait_idle()
    assert [r.stopped for r in results] == [True]
    assert held.inputs() == []


@pytest.mark.anyio
async def test_a_stateless_ask_given_up_while_waiting_for_room_leaves_no_session() -> None:
    """A stateless input that never reached the full bus (its caller stopped waiting
    for room) leaves no session behind; once there is room, nothing of it runs."""
    async with EventBus(capacity=1) as bus:
        held = _HeldFullBus(bus)
        with anyio.fail_after(HANG):
            async with ExecutionLoop(bus, FunctionProvider(lambda p, c: "hi")) as loop:
                await held.fill()
                pending = loop.start("hello", session_id=None)
                assert len(loop.sessions) == 1  # its session, until the input is given up
                with anyio.CancelScope() as scope:

                    async def give_up() -> None:
                        await until(lambda: bus._room_waiters > 0)
                        scope.cancel()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(give_up)
                        await pending.wait()
                assert scope.cancelled_caught
                assert not loop.sessions
                held.release.set()
                await bus.wait_idle()
                assert not loop.sessions
    assert held.inputs() == []


@pytest.mark.anyio
async def test_text_deltas_from_a_worker_thread(
    anyio_backend: str, request: pytest.FixtureRequest
) -> None:
    """A provider streaming through a sync SDK in a worker thread emits its deltas there.

    Publishing on the bus from that thread touched the event loop's signals
    from outside it: on trio the bus stopped dispatching (a hang); on asyncio
    it worked only because the thread's end woke the loop.
    """

    async def streaming(prompt: str, context: AgentContext) -> Any:
        def stream() -> None:
            for piece in ("Hel", "lo"):
                context.emit_text_delta(piece)

        await anyio.to_thread.run_sync(stream)
        return text_response("Hello")

    async with running(FunctionProvider(streaming), []) as h:
        with anyio.fail_after(HANG):
            result = await h.loop.ask("hi")
            await h.bus.wait_idle()
        assert result.text == "Hello"
        assert result.error is None
        deltas = [e.payload["text"] for e in h.of("OUTPUT:AGENT_MESSAGE_DELTA")]
        assert deltas == ["Hel", "lo"]


@pytest.mark.anyio
async def test_a_slow_retriever_does_not_stall_the_event_loop() -> None:
    """An embedding retriever calls its model synchronously (a network call).

    Called on the event loop, it froze every session, the bus and the
    transports until the model answered.
    """
    entered, gate = threading.Event(), threading.Event()
    released: list[bool] = []

    class Slow:
        def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> Sequence[str]:
            entered.set()
            # True only if the event loop went on meanwhile (HANG: generous, and the
            # wait ends as soon as the loop sets the gate).
            released.append(gate.wait(HANG))
            return list(tools)[:limit]

    provider = ScriptedProvider([text_response("a")])
    async with (
        running(provider, _tools(5), max_tools=2, retriever=Slow()) as h,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(h.ask, "hi")
        with anyio.fail_after(HANG):
            while not entered.is_set():
                await anyio.sleep(0.005)
        gate.set()
    assert released == [True]


@pytest.mark.parametrize("bad", [2.5, True, "3"])
def test_max_tools_must_be_an_int(bad: Any) -> None:
    """A float was accepted, then every input failed with INTERNAL_ERROR."""
    with pytest.raises((TypeError, ValueError), match="max_tools"):
        ExecutionLoop(EventBus(), ScriptedProvider([]), [], max_tools=bad)


@pytest.mark.parametrize(
    ("tool_name", "argline", "expected"),
    [
        ("fs.read", "path=2024", {"path": "2024"}),
        ("fs.read", 'path="17"', {"path": "17"}),
        ("fs.write", "notes.txt content=true", {"path": "notes.txt", "content": "true"}),
    ],
    ids=["number-like path", "quoted number", "boolean-like content"],
)
def test_slash_named_string_argument_is_taken_as_written(
    tmp_path: Path, tool_name: str, argline: str, expected: dict[str, Any]
) -> None:
    """``key=value`` for a string parameter gives the text as typed, as a positional word does.

    ``/read 2024`` reads the file ``2024``; ``/read path=2024`` must too, not
    turn the value into the integer 2024 that the tool then refuses.
    """
    tools = resolve_tools(["fs.read", "fs.write"], allowed_paths=[tmp_path])
    target = tools[tool_name]
    assert target.validate(parse_tool_args(target, argline)) == expected


def test_slash_word_for_an_optional_string_parameter_is_taken_as_written() -> None:
    """A word for a ``str | None`` parameter stays text, as for a plain ``str`` one.

    The schema of an optional string is ``anyOf: [string, null]``, with no
    top-level ``"type": "string"``; ``/greet 123`` must still pass the name
    ``"123"``, not the integer 123 that validation then refuses.
    """

    def greet(name: str | None = None) -> str:
        return f"hello {name}"

    wrapped = tool(greet)
    assert wrapped.validate(parse_tool_args(wrapped, "123")) == {"name": "123"}


class NoParams(Tool):
    name = "ping"
    parameters = MappingProxyType({"type": "object", "properties": {}})

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return "pong"


class OneParam(Tool):
    name = "echo"
    parameters = MappingProxyType({"type": "object", "properties": {"n": {"type": "integer"}}})

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return args


def test_words_for_a_tool_without_parameters_are_explained() -> None:
    with pytest.raises(ToolArgumentsError, match=r"/ping takes no words here: give key=value"):
        parse_tool_args(NoParams(), "hello")
    with pytest.raises(ToolArgumentsError, match=r"/echo: 2 words for 1 parameter \['n'\]"):
        parse_tool_args(OneParam(), "1 2")


# -- lifecycle: entered again ---------------------------------------------------


@pytest.mark.anyio
async def test_a_loop_can_be_entered_again_and_keeps_its_sessions() -> None:
    provider = ScriptedProvider([text_response("one"), text_response("two")])
    with anyio.fail_after(HANG):
        async with EventBus() as bus:
            loop = ExecutionLoop(bus, provider)
            async with loop:
                assert (await loop.ask("first", session_id="s")).text == "one"
            assert bus.input_owner is None
            with pytest.raises(RuntimeError, match="not running"):
                loop.start("between", session_id="s")
            async with loop:
                assert (await loop.ask("second", session_id="s")).text == "two"
    assert len(loop.session("s").memory) == 4  # two user turns, two answers


@pytest.mark.anyio
async def test_entering_a_running_loop_is_refused_and_leaves_it_running() -> None:
    provider = ScriptedProvider([text_response("still here")])
    with anyio.fail_after(HANG):
        async with EventBus() as bus, ExecutionLoop(bus, provider) as loop:
            with pytest.raises(RuntimeError, match="already running"):
                await loop.__aenter__()
            assert (await loop.ask("hi")).text == "still here"
