"""A running bus and execution loop that records every event, for the agent tests.

Also the scripted provider, the tools and the small event helpers that the tests of
the loop, its sessions and its tool execution share.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, RunResult
from openstarry.agent.memory import MemoryEntry, Observation, Session, ToolOutcome
from openstarry.bus import EventBus
from openstarry.core import ContentSegment, Event, ProviderResponse, ToolCall
from openstarry.events import OUTPUT_AGENT_MESSAGE, AgentState, EventType
from openstarry.protocol import PAYLOAD_MODELS, parse_payload

#: A bound on any one wait, so that a broken loop fails a test instead of hanging it.
HANG = 5


class Echo(Tool):
    """An async tool with one untyped parameter ``x``; returns its arguments."""

    name = "echo"

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"x": {}}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return args


@dataclass
class Harness:
    """The bus, the loop, and every event dispatched so far, in order."""

    bus: EventBus
    loop: ExecutionLoop
    events: list[Event]

    async def ask(self, line: str, session_id: str = "s") -> RunResult:
        """One turn, then wait until the bus has dispatched all it caused."""
        with anyio.fail_after(HANG):
            result = await self.loop.ask(line, session_id=session_id)
            await self.bus.wait_idle()
        return result

    async def publish(self, event: Event) -> None:
        with anyio.fail_after(HANG):
            await self.bus.apublish(event)
            await self.bus.wait_idle()

    def trace(self, trace_id: str) -> list[Event]:
        return [e for e in self.events if e.trace_id == trace_id]

    def of(self, event_type: str, trace_id: str | None = None) -> list[Event]:
        return [
            e
            for e in self.events
            if e.type == event_type and (trace_id is None or e.trace_id == trace_id)
        ]


@asynccontextmanager
async def running(
    provider: Any,
    tools: Iterable[Tool] | Mapping[str, Tool] = (),
    *,
    capacity: int | None = 65536,
    **options: Any,
) -> AsyncIterator[Harness]:
    """A bus of ``capacity`` and an ``ExecutionLoop(bus, provider, tools, **options)``."""
    async with EventBus(capacity=capacity) as bus:
        events: list[Event] = []
        bus.subscribe("*", events.append)
        async with ExecutionLoop(bus, provider, tools, **options) as loop:
            yield Harness(bus, loop, events)


USER_MESSAGE = EventType.USER_MESSAGE.value
SYSTEM_COMMAND = EventType.SYSTEM_COMMAND.value
TICK_START = EventType.TICK_START.value
STATE_CHANGE = EventType.STATE_CHANGE.value
ERROR = EventType.ERROR.value
TOOL_CALL = EventType.TOOL_CALL.value
TOOL_RESULT = EventType.TOOL_RESULT.value
AGENT_MESSAGE = OUTPUT_AGENT_MESSAGE
SOURCE = "agent:openstarry"


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


def validate_payload(event: Event) -> None:
    """Validate ``event``'s payload against the protocol model of its type (spec 002)."""
    model = PAYLOAD_MODELS[event.type]
    model.model_validate(event.payload)


class Gate(Tool):
    """An async tool that waits for ``release``."""

    name = "gate"

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        await self.release.wait()
        return "released"


class UnprintableError(Exception):
    """An exception whose ``str()`` raises, as a faulty ``__str__`` does."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        raise AttributeError("message")  # e.g. `return self.message` on an unset attribute


def filler(i: int) -> Event:
    return Event.new("X:FILL", {"i": i}, source="test", session_id="filler")


def conformance_problems(events: Sequence[Event], inputs: Iterable[str]) -> list[str]:
    """What in ``events`` (all dispatched, in order) breaks spec 002 or the loop's promises.

    Every event not in ``inputs`` (ids of the events the test published) must fit its
    payload model, and have a ``parentId`` naming an event dispatched earlier with the
    same ``traceId`` and ``sessionId``. Per trace, the ``KERNEL:STATE_CHANGE`` events
    chain: each ``from`` is the previous ``to``, starting and ending at ``IDLE``.
    """
    given = set(inputs)
    problems: list[str] = []
    seen: dict[str, Event] = {}
    chains: dict[str, list[tuple[str, str]]] = {}
    for event in events:
        if event.id not in given:
            where = f"{event.type} {event.payload!r:.120}"
            try:
                parse_payload(event.type, event.payload)
            except ValueError as exc:
                problems.append(f"payload of {where}: {exc}")
            parent = seen.get(event.parent_id) if event.parent_id is not None else None
            if parent is None:
                problems.append(f"parent of {where} was not dispatched before it")
            elif (parent.trace_id, parent.session_id) != (event.trace_id, event.session_id):
                problems.append(f"{where} left its parent's trace or session")
            if event.type == STATE_CHANGE:
                pair = (event.payload["from"], event.payload["to"])
                chains.setdefault(event.trace_id, []).append(pair)
        seen[event.id] = event
    for trace_id, chain in chains.items():
        state = AgentState.IDLE.value
        for from_, to in chain:
            if from_ != state:
                problems.append(f"trace {trace_id}: state changes do not chain: {chain}")
                break
            state = to
        else:
            if state != AgentState.IDLE.value:
                problems.append(f"trace {trace_id}: the run does not end IDLE: {chain}")
    return problems


def state_chain(events: Iterable[Event], trace_id: str) -> list[tuple[str, str]]:
    return [
        (e.payload["from"], e.payload["to"])
        for e in events
        if e.type == STATE_CHANGE and e.trace_id == trace_id
    ]


async def until(condition: Callable[[], bool]) -> None:
    """Yield until ``condition()`` holds (bounded by the caller's HANG guard)."""
    while not condition():
        await anyio.lowlevel.checkpoint()


def context(tools: Any = None) -> AgentContext:
    """A context of session ``s``, trace ``t``, round 1, with ``tools`` (none by default)."""
    return AgentContext(tools=tools or {}, session=Session("s"), trace_id="t", round=1)


def manifest_file(folder: Path, data: dict[str, Any]) -> Path:
    """``folder/agent.json`` holding ``data`` under an identity named "ux"."""
    path = folder / "agent.json"
    path.write_text(json.dumps({"identity": {"name": "ux"}, **data}), encoding="utf-8")
    return path
