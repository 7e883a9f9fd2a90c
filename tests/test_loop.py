"""ExecutionLoop: the think-act loop of spec 000 section 5, with the events of spec 002.

Every test drives a real :class:`EventBus` and :class:`ExecutionLoop` with providers
and tools defined here, collects every event the bus dispatches, and asserts on
them. Waits are bounded by :data:`HANG` only as a guard against a hang; no test
asserts on wall time.
"""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG, running
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import LoopLimits, RunResult
from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.core import ContentSegment, Event, ProviderResponse, ToolCall
from openstarry.errors import AgentPainException, ProviderError, ToolError
from openstarry.events import OUTPUT_AGENT_MESSAGE, EventType

USER_MESSAGE = EventType.USER_MESSAGE.value
SYSTEM_COMMAND = EventType.SYSTEM_COMMAND.value
TICK_START = EventType.TICK_START.value
STATE_CHANGE = EventType.STATE_CHANGE.value
ERROR = EventType.ERROR.value
TOOL_CALL = EventType.TOOL_CALL.value
TOOL_RESULT = EventType.TOOL_RESULT.value
AGENT_MESSAGE = OUTPUT_AGENT_MESSAGE
SOURCE = "agent:openstarry"


# ----------------------------------------------------------------------------- helpers


def text(value: str) -> ContentSegment:
    return ContentSegment("text", text=value)


def call(name: str, args: Any = None, call_id: str | None = None) -> ContentSegment:
    return ContentSegment("tool_call", tool_call=ToolCall(name, args, call_id))


def response(*segments: ContentSegment, metadata: Any = None) -> ProviderResponse:
    return ProviderResponse(list(segments), metadata)


@dataclass(frozen=True)
class Seen:
    """What the provider was shown on one call."""

    prompt: str
    round: int
    session_id: str
    trace_id: str
    memory: list[MemoryEntry]
    tools: list[str]


Reply = Callable[[str, AgentContext], Any]


class FakeProvider:
    """Answers from a script (one item per call) or a function; records every call.

    An item that is an exception is raised; anything else is returned as is.
    """

    name = "fake"

    def __init__(self, *script: Any, reply: Reply | None = None) -> None:
        self.script = list(script)
        self.reply = reply
        self.calls: list[Seen] = []

    async def generate(self, prompt: str, context: AgentContext) -> Any:
        self.calls.append(
            Seen(
                prompt,
                context.round,
                context.session_id,
                context.trace_id,
                list(context.memory),
                list(context.tools),
            )
        )
        await anyio.lowlevel.checkpoint()
        if self.reply is not None:
            answer = self.reply(prompt, context)
        else:
            assert len(self.calls) <= len(self.script), "the provider was called too often"
            answer = self.script[len(self.calls) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer


class HangingProvider:
    """Never answers; records whether it was cancelled."""

    name = "hanging"

    def __init__(self) -> None:
        self.cancelled = False

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


def schema(*names: str, types: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An object schema of the named parameters (strings unless ``types`` says), all required."""
    types = types or {}
    return {
        "type": "object",
        "properties": {n: {"type": types.get(n, "string")} for n in names},
        "required": list(names),
    }


class Weather(Tool):
    """The tool of spec 000 section 5 (synchronous: it runs in a worker thread)."""

    name = "get_weather"
    description = "Get the current weather of a city."
    parameters = schema("location")

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.contexts: list[AgentContext] = []
        self.rounds: list[int] = []

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.calls.append(args)
        self.contexts.append(context)
        self.rounds.append(context.round)
        return {"location": args["location"], "forecast": "25°C, Sunny"}


class Echo(Tool):
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


class Raises(Tool):
    """Raises the given exception, from ``def run`` or ``async def run``."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.name = name
        self.exc = exc
        self.calls = 0

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.calls += 1
        raise self.exc


class AsyncRaises(Raises):
    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        raise self.exc


class Returns(Tool):
    """Returns the given value."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return self.value


class Blocking(Tool):
    """An async tool that waits for ``release``; records its start and its cancellation."""

    def __init__(self, name: str = "slow") -> None:
        self.name = name
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.cancelled = False
        self.finished = False

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        self.finished = True
        return "released"


def states(events: Sequence[Event]) -> list[tuple[str, str]]:
    return [(e.payload["from"], e.payload["to"]) for e in events if e.type == STATE_CHANGE]


def last_state(events: Sequence[Event]) -> dict[str, Any]:
    changes = [e for e in events if e.type == STATE_CHANGE]
    assert changes
    payload: dict[str, Any] = changes[-1].payload
    return payload


def outcomes(memory: Iterable[MemoryEntry]) -> list[ToolOutcome]:
    return [m for m in memory if isinstance(m, ToolOutcome)]


def observations(memory: Iterable[MemoryEntry]) -> list[str]:
    return [m.text for m in memory if isinstance(m, Observation)]


def then_say(first: ProviderResponse | dict[str, Any], final: str) -> FakeProvider:
    """A provider that answers ``first`` and then ``final`` as text."""
    return FakeProvider(first, response(text(final)))


def slow_on_go(first: ProviderResponse | None = None) -> FakeProvider:
    """A provider that calls the ``slow`` tool on round 1 of "go", and answers any other turn."""

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "go" and context.round == 1:
            return first if first is not None else response(call("slow", {}))
        return response(text(f"answer to {prompt}"))

    return FakeProvider(reply=reply)


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
async def test_a_tool_call_without_id_gets_one_and_the_result_matches_it() -> None:
    provider = then_say(response(call("get_weather", {"location": "Taipei"})), "Sunny.")
    async with running(provider, [Weather()]) as h:
        result = await h.ask("weather?")
    [tool_call] = h.of(TOOL_CALL)
    [tool_result] = h.of(TOOL_RESULT)
    call_id = tool_call.payload["toolCallId"]
    assert isinstance(call_id, str)
    assert call_id
    assert tool_result.payload["toolCallId"] == call_id
    assert outcomes(provider.calls[1].memory)[0].tool_call_id == call_id
    # A response with only a tool call says nothing: one message, the final one.
    assert result.replies == ["Sunny."]
    assert [e.payload["final"] for e in h.of(AGENT_MESSAGE)] == [True]


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
        Echo("fs.read", schema("path")),
        Echo("fs.write", schema("path", "text")),
        Echo("calc.add", schema("a", "b", types={"a": "number", "b": "number"})),
        Echo("fs.list", schema()),
        Echo("db.list", schema()),
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
async def test_reset_clears_memory_and_unlocks() -> None:
    provider = FakeProvider(response(text("one")), response(text("two")))
    async with running(provider) as h:
        await h.ask("first")
        session = h.loop.session("s")
        assert len(session.memory) == 2
        session.locked = True
        session.failure_streak = 7
        result = await h.ask("/reset")
        assert result.replies == ["Session reset: memory cleared."]
        assert list(session.memory) == []
        assert session.locked is False
        assert session.failure_streak == 0
        again = await h.ask("second")
    assert again.replies == ["two"]
    assert again.error is None
    assert provider.calls[1].memory == [UserTurn("second")]
    [message] = [e for e in h.of(AGENT_MESSAGE) if e.payload.get("metadata")]
    assert message.payload["metadata"] == {"command": "reset"}


@pytest.mark.anyio
async def test_stop_when_idle_says_so() -> None:
    provider = FakeProvider()
    async with running(provider) as h:
        result = await h.ask("/stop")
    assert result.replies == ["Stopped."]
    assert result.error is None
    assert [e.type for e in h.events] == [USER_MESSAGE, AGENT_MESSAGE]
    assert h.events[1].payload["metadata"] == {"command": "stop"}
    assert provider.calls == []


@pytest.mark.anyio
async def test_quit_removes_the_session_and_calls_the_hooks() -> None:
    provider = FakeProvider(response(text("hello")))
    quitted: list[str] = []
    async with running(provider) as h:
        h.loop.on_quit(quitted.append)
        await h.ask("hi", session_id="q")
        await h.ask("hi", session_id="other")
        assert set(h.loop.sessions) == {"q", "other"}
        result = await h.ask("/quit", session_id="q")
        assert result.replies == ["Goodbye."]
        assert set(h.loop.sessions) == {"other"}
    assert quitted == ["q"]
    assert h.of(AGENT_MESSAGE)[-1].payload["metadata"] == {"command": "quit"}


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


# ------------------------------------------------- 3. failures are told, not raised


@pytest.mark.anyio
async def test_unknown_tool_is_fed_back_and_the_provider_sees_it() -> None:
    provider = then_say(response(call("get_wether", {"location": "Taipei"}, "c1")), "Oops.")
    weather = Weather()
    async with running(provider, [weather]) as h:
        result = await h.ask("weather?")
    assert result.error is None
    assert result.replies == ["Oops."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "c1"
    assert tool_result.payload["success"] is False
    error = tool_result.payload["error"]
    assert error["code"] == "TOOL_NOT_FOUND"
    assert error["source"] == "core"
    assert "get_wether" in error["message"]
    assert weather.calls == []
    # Called again, and shown the observation and the failed outcome.
    assert len(provider.calls) == 2
    seen = provider.calls[1].memory
    [observation] = observations(seen)
    assert "get_wether" in observation
    assert "get_weather" in observation  # the tools that do exist
    [outcome] = outcomes(seen)
    assert outcome == ToolOutcome(
        "c1", "get_wether", False, error=ToolFailure("TOOL_NOT_FOUND", error["message"], "core")
    )
    assert last_state(h.events) == {"from": "THINKING", "to": "IDLE"}


@pytest.mark.anyio
async def test_invalid_arguments_are_fed_back() -> None:
    provider = then_say(response(call("get_weather", {"city": "Taipei"}, "c1")), "Let me fix that.")
    weather = Weather()
    async with running(provider, [weather]) as h:
        result = await h.ask("weather?")
    assert result.error is None
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "INVALID_ARGUMENTS"
    assert "location" in tool_result.payload["error"]["message"]
    assert weather.calls == []
    seen = provider.calls[1].memory
    [observation] = observations(seen)
    assert "get_weather" in observation
    assert "location" in observation
    assert outcomes(seen)[0].error is not None
    assert outcomes(seen)[0].error.code == "INVALID_ARGUMENTS"  # type: ignore[union-attr]


FAILURES = [
    pytest.param(
        ToolError("Operation not permitted", code="EPERM"),
        "EPERM",
        "Operation not permitted",
        id="tool-error",
    ),
    pytest.param(RuntimeError("boom"), "TOOL_ERROR", "RuntimeError: boom", id="exception"),
    pytest.param(
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        "ENOENT",
        "No such file or directory",
        id="enoent",
    ),
    pytest.param(
        PermissionError(errno.EACCES, "Permission denied", "secret.txt"),
        "EACCES",
        "Permission denied",
        id="eacces",
    ),
    # A TimeoutError of the tool's own (a socket's, say) is an exception it raised,
    # not the loop's tool timeout: it did not run for tool_timeout seconds.
    pytest.param(
        TimeoutError("read timed out"),
        "TOOL_ERROR",
        "TimeoutError: read timed out",
        id="own-timeout-error",
    ),
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("exc", "code", "message"), FAILURES)
@pytest.mark.anyio
async def test_a_tool_that_raises_becomes_a_failed_result(
    exc: Exception, code: str, message: str, is_async: bool
) -> None:
    tool = AsyncRaises("risky", exc) if is_async else Raises("risky", exc)
    assert tool.is_async is is_async
    provider = then_say(response(call("risky", {}, "c1")), "It failed.")
    async with running(provider, [tool]) as h:
        result = await h.ask("try it")
    assert result.error is None
    assert result.replies == ["It failed."]
    assert tool.calls == 1
    [tool_result] = h.of(TOOL_RESULT)
    failure = {"code": code, "message": message, "source": "tool"}
    assert tool_result.payload == {
        "toolCallId": "c1",
        "name": "risky",
        "success": False,
        "error": failure,
    }
    assert outcomes(provider.calls[1].memory) == [
        ToolOutcome("c1", "risky", False, error=ToolFailure(code, message, "tool"))
    ]


class RaisingValidate(Tool):
    """A tool whose own ``validate`` fails with something other than ToolArgumentsError."""

    name = "picky"

    def __init__(self) -> None:
        self.ran = False

    def validate(self, args: Any) -> dict[str, Any]:
        raise KeyError("unit")

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.ran = True
        return "ran"


@pytest.mark.anyio
async def test_a_tool_whose_validate_raises_is_a_failed_result_not_a_crash() -> None:
    provider = then_say(response(call("picky", {}, "c1")), "It refused.")
    picky = RaisingValidate()
    async with running(provider, [picky, Weather()]) as h:
        result = await h.ask("go")
        # The loop is still serving: another session gets its answer.
        other = await h.ask("/get_weather Taipei", session_id="other")
    assert result.error is None
    assert result.replies == ["It refused."]
    assert picky.ran is False
    [tool_result, _] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "c1"
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] in {"INVALID_ARGUMENTS", "TOOL_ERROR"}
    assert other.error is None


@pytest.mark.parametrize(
    "value", [object(), {"when": threading.Event()}, float("nan")], ids=["object", "nested", "nan"]
)
@pytest.mark.anyio
async def test_a_result_that_is_not_json_is_invalid_result(value: Any) -> None:
    provider = then_say(response(call("odd", {}, "c1")), "Hm.")
    async with running(provider, [Returns("odd", value)]) as h:
        result = await h.ask("go")
    assert result.error is None
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "c1"
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "INVALID_RESULT"
    assert tool_result.payload["error"]["source"] == "core"
    [outcome] = outcomes(provider.calls[1].memory)
    assert outcome.success is False
    assert outcome.error is not None
    assert outcome.error.code == "INVALID_RESULT"


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
async def test_tool_timeout_cancels_the_tool() -> None:
    slow = Blocking()
    cancelled_before_round_2: list[bool] = []

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            return response(call("slow", {}, "c1"))
        cancelled_before_round_2.append(slow.cancelled)
        return response(text("Too slow."))

    provider = FakeProvider(reply=reply)
    async with running(provider, [slow], limits=LoopLimits(tool_timeout=0.05)) as h:
        result = await h.ask("go")
    assert result.error is None
    assert result.replies == ["Too slow."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "TIMEOUT"
    assert tool_result.payload["error"]["source"] == "core"
    assert slow.started.is_set()
    assert slow.cancelled is True
    assert slow.finished is False
    assert cancelled_before_round_2 == [True]
    assert outcomes(provider.calls[1].memory)[0].error is not None


class BlockingSync(Tool):
    """A synchronous tool (worker thread) that blocks until released."""

    name = "sync_slow"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.done = threading.Event()

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        try:
            self.release.wait(HANG)
            return "late"
        finally:
            self.done.set()


@pytest.mark.anyio
async def test_tool_timeout_of_a_sync_tool() -> None:
    tool = BlockingSync()
    provider = then_say(response(call("sync_slow", {}, "c1")), "Too slow.")
    async with running(provider, [tool], limits=LoopLimits(tool_timeout=0.05)) as h:
        try:
            result = await h.ask("go")
        finally:
            tool.release.set()
            await anyio.to_thread.run_sync(tool.done.wait, HANG)
    assert result.replies == ["Too slow."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["error"]["code"] == "TIMEOUT"


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


class Meet(Tool):
    """Two calls that each wait for the other to have started: sequential runs deadlock.

    The call with ``last`` also waits for its peer to finish, so it finishes last.
    """

    name = "meet"
    parameters = schema("me", "peer")

    def __init__(self) -> None:
        self.started = {"a": anyio.Event(), "b": anyio.Event()}
        self.finished = {"a": anyio.Event(), "b": anyio.Event()}
        self.order: list[str] = []

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        me, peer = args["me"], args["peer"]
        self.started[me].set()
        await self.started[peer].wait()
        if args.get("last"):
            await self.finished[peer].wait()
        self.order.append(me)
        self.finished[me].set()
        return f"{me} met {peer}"


@pytest.mark.anyio
async def test_tool_calls_of_one_response_run_concurrently_and_report_in_call_order() -> None:
    meet = Meet()
    provider = then_say(
        response(
            call("meet", {"me": "a", "peer": "b", "last": True}, "c1"),
            call("meet", {"me": "b", "peer": "a"}, "c2"),
        ),
        "Both met.",
    )
    async with running(provider, [meet]) as h:
        result = await h.ask("meet")  # deadlocks (and fails after HANG) if run one by one
    assert result.error is None
    assert meet.order == ["b", "a"]  # the first call finished last ...
    # ... and still its events and outcome come first.
    assert [e.payload["toolCallId"] for e in h.of(TOOL_CALL)] == ["c1", "c2"]
    assert [e.payload["toolCallId"] for e in h.of(TOOL_RESULT)] == ["c1", "c2"]
    assert [e.payload["result"] for e in h.of(TOOL_RESULT)] == ["a met b", "b met a"]
    types = [e.type for e in h.events]
    assert types.index(TOOL_RESULT) > len(types) - 1 - types[::-1].index(TOOL_CALL)
    assert [o.tool_call_id for o in outcomes(provider.calls[1].memory)] == ["c1", "c2"]
    calls, results = h.of(TOOL_CALL), h.of(TOOL_RESULT)
    assert [r.parent_id for r in results] == [c.id for c in calls]


class Counting(Tool):
    """Counts how many of its calls run at once."""

    name = "count"
    parameters = schema("n", types={"n": "integer"})

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.active += 1
        self.peak = max(self.peak, self.active)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        self.active -= 1
        return args["n"]


@pytest.mark.parametrize(("cap", "peak"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.anyio
async def test_max_concurrent_tools(cap: int, peak: int) -> None:
    counting = Counting()
    provider = then_say(response(*(call("count", {"n": n}, f"c{n}") for n in range(3))), "Counted.")
    limits = LoopLimits(max_concurrent_tools=cap)
    async with running(provider, [counting], limits=limits) as h:
        result = await h.ask("count")
    assert result.error is None
    assert counting.peak == peak
    assert [e.payload["result"] for e in h.of(TOOL_RESULT)] == [0, 1, 2]
    assert [e.payload["toolCallId"] for e in h.of(TOOL_RESULT)] == ["c0", "c1", "c2"]


# ------------------------------------------------------ 5. repeated failures, lock-out


@pytest.mark.anyio
async def test_three_identical_failing_calls_add_a_warning() -> None:
    broken = Raises("broken", RuntimeError("nope"))
    provider = FakeProvider(
        response(call("broken", {"x": 1})),
        response(call("broken", {"x": 1})),
        response(call("broken", {"x": 1})),
        response(text("I give up.")),
    )
    async with running(provider, [broken]) as h:
        result = await h.ask("try")
    assert result.error is None
    assert broken.calls == 3
    assert observations(provider.calls[2].memory) == []
    [warning] = observations(provider.calls[3].memory)
    assert "broken" in warning
    assert "3 times" in warning
    assert h.loop.sessions["s"].failure_streak == 3
    assert h.loop.sessions["s"].locked is False


@pytest.mark.anyio
async def test_different_failing_calls_add_no_warning() -> None:
    broken = Raises("broken", RuntimeError("nope"))
    provider = FakeProvider(
        response(call("broken", {"x": 1})),
        response(call("broken", {"x": 2})),
        response(call("broken", {"x": 3})),
        response(text("I give up.")),
    )
    async with running(provider, [broken]) as h:
        await h.ask("try")
    assert observations(h.loop.sessions["s"].memory) == []


def failing_provider(plan: Mapping[str, int]) -> FakeProvider:
    """For prompt p, call the broken tool in the first plan[p] rounds, then answer."""

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round <= plan.get(prompt, 0):
            return response(call("broken", {"round": context.round}))
        if prompt == "weather" and context.round == 1:
            return response(call("get_weather", {"location": "Taipei"}))
        return response(text(f"answer to {prompt}"))

    return FakeProvider(reply=reply)


@pytest.mark.anyio
async def test_failure_streak_locks_the_session_until_reset() -> None:
    provider = failing_provider({"break": 10})
    broken = Raises("broken", RuntimeError("nope"))
    weather = Weather()
    limits = LoopLimits(max_failure_streak=3)
    async with running(provider, [broken, weather], limits=limits) as h:
        result = await h.ask("break")
        session = h.loop.sessions["s"]
        assert result.error is not None
        assert result.error["code"] == "SESSION_LOCKED"
        assert broken.calls == 3
        assert len(provider.calls) == 3
        assert session.locked is True
        assert last_state(h.trace(result.trace_id)) == {"from": "EXECUTING", "to": "IDLE"}
        [error] = h.of(ERROR, result.trace_id)
        assert error.parent_id == h.of(TICK_START, result.trace_id)[-1].id

        # Locked: inputs and slash tools are refused without calling anyone.
        refused = await h.ask("hello")
        assert refused.error is not None
        assert refused.error["code"] == "SESSION_LOCKED"
        assert refused.replies == []
        assert len(provider.calls) == 3
        assert h.of(TICK_START, refused.trace_id) == []
        [error] = h.of(ERROR, refused.trace_id)
        assert error.parent_id == h.of(USER_MESSAGE, refused.trace_id)[0].id
        slash = await h.ask("/get_weather Taipei")
        assert slash.error is not None
        assert slash.error["code"] == "SESSION_LOCKED"
        assert weather.calls == []

        # Another session is not locked.
        other = await h.ask("hello", session_id="other")
        assert other.replies == ["answer to hello"]

        await h.ask("/reset")
        assert session.locked is False
        answered = await h.ask("hello")
    assert answered.error is None
    assert answered.replies == ["answer to hello"]


@pytest.mark.anyio
async def test_failure_streak_counts_across_inputs_and_a_success_resets_it() -> None:
    provider = failing_provider({"fail twice": 2, "fail once": 1})
    broken = Raises("broken", RuntimeError("nope"))
    limits = LoopLimits(max_failure_streak=3)
    async with running(provider, [broken, Weather()], limits=limits) as h:
        first = await h.ask("fail twice")
        assert first.error is None
        assert h.loop.sessions["s"].failure_streak == 2
        await h.ask("weather")  # a successful tool call resets the streak
        assert h.loop.sessions["s"].failure_streak == 0
        await h.ask("fail twice")
        assert h.loop.sessions["s"].locked is False
        locked = await h.ask("fail once")
    assert locked.error is not None
    assert locked.error["code"] == "SESSION_LOCKED"
    assert h.loop.sessions["s"].locked is True
    # The run stopped at the locking round: the provider was not asked again.
    assert [c.round for c in provider.calls if c.trace_id == locked.trace_id] == [1]


@pytest.mark.anyio
async def test_a_success_between_identical_failures_breaks_the_row() -> None:
    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round <= {"fail twice": 2, "fail once": 1}.get(prompt, 0):
            return response(call("broken", {"x": 1}))
        return response(text("done"))

    provider = FakeProvider(reply=reply)
    broken = Raises("broken", RuntimeError("nope"))
    async with running(provider, [broken, Weather()]) as h:
        await h.ask("fail twice")
        session = h.loop.sessions["s"]
        assert session.failure_streak == 2
        # A successful call (here a slash command) ends the row of failures ...
        slash = await h.ask("/get_weather Taipei")
        assert slash.error is None
        assert session.failure_streak == 0
        # ... so one more identical failure is the first of a new row, not the third.
        await h.ask("fail once")
    assert broken.calls == 3
    assert session.failure_streak == 1
    assert observations(session.memory) == []


# ---------------------------------------------------------------- 6. /stop mid-run


@pytest.mark.parametrize("how", ["system-command", "slash-line"])
@pytest.mark.anyio
async def test_stop_cancels_a_slow_tool_and_the_session_goes_on(how: str) -> None:
    slow = Blocking()

    provider = slow_on_go(response(text("Working on it."), call("slow", {}, "c1")))
    results: dict[str, RunResult] = {}
    async with running(provider, [slow]) as h:

        async def run() -> None:
            results["go"] = await h.loop.ask("go", session_id="s")

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await slow.started.wait()
                if how == "system-command":
                    stop = h.loop.command("stop", session_id="s")
                    assert stop.priority == 0
                else:
                    stop = h.loop.submit("/stop", session_id="s")
            await h.bus.wait_idle()
        after = await h.ask("hello")

    result = results["go"]
    assert result.stopped is True
    assert result.error is None
    assert result.replies == ["Working on it."]
    assert slow.cancelled is True
    assert slow.finished is False
    trace = h.trace(result.trace_id)
    assert [e for e in trace if e.type == TOOL_RESULT] == []
    assert last_state(trace) == {"from": "EXECUTING", "to": "IDLE", "reason": "stopped"}
    [stopped] = [e for e in h.events if e.type == AGENT_MESSAGE and e.parent_id == stop.id]
    assert stopped.payload["text"] == "Stopped."
    assert h.loop.runs_stopped == 1
    # The session answers the next input normally.
    assert after.stopped is False
    assert after.error is None
    assert after.replies == ["answer to hello"]
    assert states(h.trace(after.trace_id)) == [("IDLE", "THINKING"), ("THINKING", "IDLE")]
    assert h.loop.sessions["s"].state.value == "IDLE"


@pytest.mark.anyio
async def test_stop_drops_the_inputs_waiting_behind_the_run() -> None:
    slow = Blocking()

    provider = slow_on_go()
    results: dict[str, RunResult] = {}
    async with running(provider, [slow]) as h:

        async def run(line: str) -> None:
            results[line] = await h.loop.ask(line, session_id="s")

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "go")
                await slow.started.wait()
                tg.start_soon(run, "queued")
                while len(h.of(USER_MESSAGE)) < 2:  # "queued" now waits behind "go"
                    await anyio.lowlevel.checkpoint()
                stop = h.loop.command("stop", session_id="s")
            await h.bus.wait_idle()
    assert results["go"].stopped is True
    assert results["queued"].stopped is True
    assert results["queued"].replies == []
    assert [c.prompt for c in provider.calls] == ["go"]
    [stopped] = [e for e in h.events if e.type == AGENT_MESSAGE and e.parent_id == stop.id]
    assert stopped.payload["text"] == "Stopped. Dropped 1 waiting input(s)."


@pytest.mark.anyio
async def test_stop_while_the_provider_thinks() -> None:
    provider = HangingProvider()
    results: dict[str, RunResult] = {}
    async with running(provider) as h:

        async def run() -> None:
            results["go"] = await h.loop.ask("go", session_id="s")

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                while not h.of(STATE_CHANGE):
                    await anyio.lowlevel.checkpoint()
                h.loop.command("stop", session_id="s")
            await h.bus.wait_idle()
    result = results["go"]
    assert result.stopped is True
    assert result.error is None  # a stop is not a provider timeout
    assert provider.cancelled is True
    assert h.of(ERROR) == []
    assert last_state(h.events) == {"from": "THINKING", "to": "IDLE", "reason": "stopped"}
    assert h.loop.runs_stopped == 1


@pytest.mark.anyio
async def test_inputs_past_max_pending_are_refused_as_busy() -> None:
    slow = Blocking()

    provider = slow_on_go()
    results: dict[str, RunResult] = {}
    async with running(provider, [slow], limits=LoopLimits(max_pending_inputs=1)) as h:

        async def run(line: str) -> None:
            results[line] = await h.loop.ask(line, session_id="s")

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "go")
                await slow.started.wait()
                tg.start_soon(run, "second")
                while len(h.of(USER_MESSAGE)) < 2:
                    await anyio.lowlevel.checkpoint()
                tg.start_soon(run, "third")
                while "third" not in results:
                    await anyio.lowlevel.checkpoint()
                slow.release.set()
            await h.bus.wait_idle()
    assert results["third"].error is not None
    assert results["third"].error["code"] == "SESSION_BUSY"
    assert results["go"].replies == ["answer to go"]
    assert results["second"].replies == ["answer to second"]
    assert [c.prompt for c in provider.calls] == ["go", "go", "second"]


# ------------------------------------------------------------ 7. isolated sessions


def two_session_provider() -> FakeProvider:
    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            if context.session_id == "A":
                return response(call("slow", {}))
            return response(call("get_weather", {"location": "Taipei"}))
        return response(text(f"{context.session_id}: done"))

    return FakeProvider(reply=reply)


async def check_sessions_are_isolated(limits: LoopLimits) -> None:
    slow = Blocking()
    provider = two_session_provider()
    results: dict[str, RunResult] = {}
    async with running(provider, [slow, Weather()], limits=limits) as h:

        async def run_a() -> None:
            results["A"] = await h.loop.ask("slow one", session_id="A")

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_a)
                await slow.started.wait()
                results["B"] = await h.loop.ask("quick one", session_id="B")
                # B is done while A is still blocked in its tool.
                assert "A" not in results
                assert not slow.finished
                assert h.loop.sessions["A"].state.value == "EXECUTING"
                slow.release.set()
            await h.bus.wait_idle()

    assert results["B"].replies == ["B: done"]
    assert results["A"].replies == ["A: done"]
    assert results["A"].trace_id != results["B"].trace_id
    memory_a = list(h.loop.sessions["A"].memory)
    memory_b = list(h.loop.sessions["B"].memory)
    assert [m for m in memory_a if isinstance(m, UserTurn)] == [UserTurn("slow one")]
    assert [m for m in memory_b if isinstance(m, UserTurn)] == [UserTurn("quick one")]
    assert [o.name for o in outcomes(memory_a)] == ["slow"]
    assert [o.name for o in outcomes(memory_b)] == ["get_weather"]
    for result, session_id in ((results["A"], "A"), (results["B"], "B")):
        assert {e.session_id for e in h.trace(result.trace_id)} == {session_id}


@pytest.mark.anyio
async def test_a_slow_session_does_not_block_another() -> None:
    await check_sessions_are_isolated(LoopLimits())


@pytest.mark.anyio
async def test_a_slow_session_does_not_block_another_at_one_tool_at_a_time() -> None:
    # max_concurrent_tools is a limit of a run ("LoopLimits: the limits of a run"), and
    # "a slow session never holds up another" (the loop's docstring).
    await check_sessions_are_isolated(LoopLimits(max_concurrent_tools=1))


# ----------------------------------------------------------------- 8. memory window


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


# ----------------------------------------------------------------- 9. invalid inputs


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


# ------------------------------------------- memory keeps every call paired with its answer


def assert_calls_answered_in_order(memory: Iterable[MemoryEntry]) -> None:
    """Each assistant turn's calls are followed at once by their outcomes, in call order."""
    entries = list(memory)
    for i, entry in enumerate(entries):
        if isinstance(entry, AssistantTurn) and entry.tool_calls:
            answers = entries[i + 1 : i + 1 + len(entry.tool_calls)]
            assert [a.tool_call_id for a in answers if isinstance(a, ToolOutcome)] == [
                c.id for c in entry.tool_calls
            ], entries


@pytest.mark.anyio
async def test_round_limit_answers_the_calls_it_does_not_run() -> None:
    provider = FakeProvider(
        reply=lambda prompt, context: response(call("get_weather", {"location": "Taipei"}))
    )
    async with running(provider, [Weather()], limits=LoopLimits(max_tool_rounds=1)) as h:
        await h.ask("loop forever")
    memory = h.loop.sessions["s"].memory
    assert_calls_answered_in_order(memory)
    last = outcomes(memory)[-1]
    assert last.success is False
    assert last.error is not None
    assert last.error.code == "TOOL_ROUND_LIMIT"


@pytest.mark.anyio
async def test_a_stopped_run_answers_its_open_calls() -> None:
    slow = Blocking()
    provider = FakeProvider(reply=lambda prompt, context: response(call("slow", {}, "c1")))
    async with running(provider, [slow]) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go")
                await slow.started.wait()
                h.loop.command("stop", session_id="s")
    memory = h.loop.sessions["s"].memory
    assert_calls_answered_in_order(memory)
    [outcome] = outcomes(memory)
    assert outcome.tool_call_id == "c1"
    assert outcome.error is not None
    assert outcome.error.code == "CANCELLED"


@pytest.mark.anyio
async def test_observations_follow_the_outcomes_of_their_round() -> None:
    provider = then_say(
        response(call("nope", {}, "n1"), call("get_weather", {"location": "Taipei"}, "w1")),
        "done",
    )
    async with running(provider, [Weather()]) as h:
        await h.ask("go")
    memory = list(h.loop.sessions["s"].memory)
    assert_calls_answered_in_order(memory)
    kinds = [type(m).__name__ for m in memory]
    assert kinds == [
        "UserTurn",
        "AssistantTurn",
        "ToolOutcome",
        "ToolOutcome",
        "Observation",
        "AssistantTurn",
    ]


@pytest.mark.anyio
async def test_a_success_breaks_the_row_of_identical_failures() -> None:
    broken = Raises("broken", ToolError("no", code="EIO"))
    async with running(FakeProvider(), [broken, Weather()]) as h:
        for line in ["/broken x=1", "/broken x=1", "/get_weather Taipei", "/broken x=1"]:
            await h.ask(line)
    assert not any("times in a row" in o for o in observations(h.loop.sessions["s"].memory))


class CooperativeSync(Tool):
    """A sync tool that checks for cancellation while it works, as the Tool docs advise."""

    name = "crunch"

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        try:
            while True:
                threading.Event().wait(0.005)
                anyio.from_thread.check_cancelled()
        except BaseException:
            self.stopped.set()
            raise


@pytest.mark.anyio
async def test_a_sync_tool_that_checks_for_cancellation_stops_at_the_timeout() -> None:
    crunch = CooperativeSync()
    provider = then_say(response(call("crunch", {}, "k1")), "gave up")
    limits = LoopLimits(tool_timeout=0.05)
    async with running(provider, [crunch], limits=limits) as h:
        result = await h.ask("go")
        with anyio.fail_after(HANG):
            await anyio.to_thread.run_sync(crunch.stopped.wait)
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["error"]["code"] == "TIMEOUT"
    assert result.replies == ["gave up"]
    assert crunch.stopped.is_set()


@pytest.mark.anyio
async def test_idle_workers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import openstarry.agent.loop as loop_module

    monkeypatch.setattr(loop_module, "_MAX_IDLE_WORKERS", 2)
    provider = FakeProvider(reply=lambda prompt, context: response(text(f"re: {prompt}")))
    async with running(provider) as h:
        for i in range(5):
            result = await h.ask(f"hi {i}", session_id=f"s{i}")
            assert result.replies == [f"re: hi {i}"]
        await anyio.wait_all_tasks_blocked()
        workers = [rt for rt in h.loop._sessions.values() if rt.running]
        assert len(workers) == 2
        # A session whose worker exited gets a new one on its next input.
        assert (await h.ask("again", session_id="s0")).replies == ["re: again"]


@pytest.mark.anyio
async def test_quit_ends_the_sessions_idle_worker() -> None:
    provider = FakeProvider(reply=lambda prompt, context: response(text("ok")))
    async with running(provider) as h:
        await h.ask("hi", session_id="q")
        rt = h.loop._sessions["q"]
        assert rt.running
        await h.ask("/quit", session_id="q")
        await anyio.wait_all_tasks_blocked()
        assert not rt.running
        assert "q" not in h.loop.sessions


@pytest.mark.anyio
async def test_commands_for_unknown_sessions_create_none() -> None:
    provider = FakeProvider(reply=lambda prompt, context: response(text("ok")))
    async with running(provider, limits=LoopLimits(max_sessions=2)) as h:
        await h.ask("hi", session_id="real")
        for i, command in enumerate(["/help", "/metrics", "/stop", "/reset", "/quit"] * 4):
            result = await h.ask(command, session_id=f"ghost-{i}")
            assert result.replies, command
        assert set(h.loop.sessions) == {"real"}
        assert [m.text for m in h.loop.sessions["real"].memory if isinstance(m, UserTurn)] == ["hi"]
