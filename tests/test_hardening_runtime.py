"""Hardening tests for a long-running agent: resource growth, event conformance,
integration of the parts, and races of /stop, /reset and loop exit.

Each test guards one behaviour of the runtime over many turns, sessions or
races. Tests whose docstring starts with "(Regression guard, passes.)" pass on
the current code and guard something subtle (the conformance sweep across every
path, the integration paths); every other test names a defect found by review
and fails until it is fixed.

Waits are bounded by :data:`HANG` only as a guard against a hang; no test
asserts on wall time.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG, Echo, running
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
from openstarry.agent.memory import AssistantTurn, MemoryEntry, ToolOutcome, UserTurn
from openstarry.agent.runtime import Agent
from openstarry.bus import EventBus
from openstarry.core import (
    DedupWindow,
    Event,
    EventQueue,
    Ingestor,
    ProviderResponse,
    decode_event,
    encode_event,
)
from openstarry.errors import AgentPainException
from openstarry.events import OUTPUT_AGENT_MESSAGE, AgentState, EventType
from openstarry.protocol import parse_payload
from openstarry.testing import FunctionProvider, text, tool_call

USER_MESSAGE = EventType.USER_MESSAGE.value
SYSTEM_COMMAND = EventType.SYSTEM_COMMAND.value
STATE_CHANGE = EventType.STATE_CHANGE.value
ERROR = EventType.ERROR.value
TOOL_RESULT = EventType.TOOL_RESULT.value

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"


# ----------------------------------------------------------------------------- helpers


class Fail(Tool):
    """An async tool that always raises."""

    name = "fail"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise RuntimeError("broken")


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


class Hook(Tool):
    """An async tool that awaits ``action`` (set by the test) and returns "ok"."""

    name = "hook"

    def __init__(self) -> None:
        self.action: Callable[[], Awaitable[None]] | None = None

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        if self.action is not None:
            await self.action()
        return "ok"


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


async def until(condition: Callable[[], bool]) -> None:
    """Yield until ``condition()`` holds (bounded by the caller's HANG guard)."""
    while not condition():
        await anyio.lowlevel.checkpoint()


# ======================================================= 1. resource growth over many turns


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
        left = len(h.loop._waiting) + len(h.loop._done)
        with anyio.fail_after(HANG):
            late = await pending[-1].wait()
    assert left == 0, f"{left} entries kept for runs that have ended"
    assert late.replies == ["re: turn 19"]


@pytest.mark.anyio
async def test_the_session_table_shrinks_back_to_max_sessions_after_a_burst() -> None:
    """Sessions created while every session was busy may exceed ``max_sessions``; once
    they are idle, new sessions evict enough of them to bring the table back to
    ``max_sessions``, instead of evicting one per new session and staying over the
    limit for the life of the agent."""
    release = anyio.Event()

    async def reply(prompt: str, context: AgentContext) -> str:
        if prompt == "burst":
            await release.wait()
        return "ok"

    async with running(FunctionProvider(reply), limits=LoopLimits(max_sessions=4)) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(h.ask, "burst", f"burst-{i}")
                await until(lambda: len(h.loop.sessions) == 12)
                release.set()
        for i in range(3):
            await h.ask("later", f"later-{i}")
        kept = len(h.loop.sessions)
    assert kept <= 4, f"{kept} sessions kept with max_sessions=4 and all of them idle"


@pytest.mark.anyio
async def test_quit_during_a_run_leaves_no_worker_parked_for_the_forgotten_session() -> None:
    """``/quit`` while the session's run is in progress ends that run and its worker:
    no worker stays parked for a session the loop has forgotten (holding its memory
    and one of the idle-worker slots until 256 other sessions push it out)."""
    gate = Gate()
    provider = FunctionProvider(
        lambda prompt, context: tool_call("gate", {}) if context.round == 1 else text("done")
    )
    async with running(provider, [gate]) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go", "q")
                await gate.started.wait()
                h.loop.command("quit", session_id="q")
            await h.bus.wait_idle()
            await anyio.wait_all_tasks_blocked()
        assert "q" not in h.loop.sessions
        orphans = [
            rt.session.id
            for rt in h.loop._idle_workers
            if h.loop._sessions.get(rt.session.id) is not rt
        ]
    assert orphans == [], "a worker is parked for a session that has quit"


@pytest.mark.anyio
async def test_many_sessions_interleaving_stay_bounded_and_conform() -> None:
    """(Regression guard, passes.) 300 sessions (past the 256 idle-worker cap) of three
    turns each, with a tool round per turn, interleave: every turn gets its own answer,
    every event conforms, the parked workers stay within the cap, the loop keeps no
    per-input state after the waits, and memory holds only the turns of its window."""
    provider = FunctionProvider(
        lambda prompt, context: (
            tool_call("echo", {"x": prompt}) if context.round == 1 else text(f"re: {prompt}")
        )
    )
    inputs: set[str] = set()
    async with running(provider, [Echo()], memory_window=2) as h:

        async def session(i: int) -> None:
            for turn in range(3):
                pending = h.loop.start(f"{i}.{turn}", session_id=f"s{i}")
                inputs.add(pending.event.id)
                result = await pending.wait()
                assert result.replies == [f"re: {i}.{turn}"]

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                for i in range(300):
                    tg.start_soon(session, i)
            await h.bus.wait_idle()
        assert len(h.loop._idle_workers) <= 256
        assert len(h.loop._waiting) == len(h.loop._done) == 0
        turns = {sum(isinstance(m, UserTurn) for m in s.memory) for s in h.loop.sessions.values()}
        assert turns == {2}
    assert conformance_problems(h.events, inputs) == []


# ============================================ 2. every event of every path conforms to spec 002


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
            return tool_call("echo", {"x": 1}, text="checking") if first else text("done")
        if prompt == "unknown":
            return tool_call("nope", {}) if first else text("done")
        if prompt == "forever":
            return tool_call("echo", {"x": context.round})
        if prompt == "fail":
            return tool_call("fail", {})
        if prompt == "gate":
            return tool_call("gate", {}) if first else text("done")
        if prompt == "pain":
            raise AgentPainException("cannot parse")
        if prompt == "boom":
            raise RuntimeError("the model is down")
        if prompt == "slow":
            await anyio.sleep_forever()
        return text(f"re: {prompt}")

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


@pytest.mark.parametrize("blocked", ["state-change", "tick"])
@pytest.mark.anyio
async def test_a_stop_while_a_run_waits_for_room_on_the_bus_keeps_its_events_consistent(
    blocked: str,
) -> None:
    """A /stop that cancels a run while it waits for room on a full bus (to publish a
    KERNEL:STATE_CHANGE or a KERNEL:TICK_START) leaves the run's events consistent:
    the state changes still chain (the state the run records is the one it announced)
    and the final STATE_CHANGE to IDLE names a parent that was dispatched (never the
    tick that could not be published)."""
    capacity = 8
    entered = anyio.Event()
    release = anyio.Event()
    hook = Hook()
    loops: list[ExecutionLoop] = []

    async with EventBus(capacity=capacity) as bus:

        async def sabotage() -> None:
            """/stop goes out but is held; then the bus is filled (one slot left for
            the tool's TOOL_RESULT in the tick case)."""
            await bus.wait_idle()
            loops[0].command("stop", session_id="s")
            await entered.wait()
            leave = 1 if blocked == "tick" else 0
            i = 0
            while len(bus) < capacity - leave:
                bus.publish(filler(i))
                i += 1

        async def reply(prompt: str, context: AgentContext) -> ProviderResponse:
            if blocked == "state-change":
                await sabotage()  # the next event of the run is STATE_CHANGE to EXECUTING
            return tool_call("hook", {}) if context.round == 1 else text("done")

        if blocked == "tick":
            hook.action = sabotage  # the next events are TOOL_RESULT, then TICK_START 2

        async def hold(event: Event) -> None:
            entered.set()
            await release.wait()

        events: list[Event] = []
        bus.subscribe("*", events.append)
        bus.subscribe(SYSTEM_COMMAND, hold)  # before the loop's handler of /stop
        results: list[RunResult] = []
        async with ExecutionLoop(bus, FunctionProvider(reply), [hook]) as loop:
            loops.append(loop)
            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tg:

                    async def go() -> None:
                        results.append(await loop.ask("go", session_id="s"))

                    tg.start_soon(go)
                    await until(lambda: bus._room_waiters > 0)
                    release.set()
                await bus.wait_idle()
    [result] = results
    run = [e for e in events if e.trace_id == result.trace_id]
    assert conformance_problems(run, [run[0].id]) == []


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


# ================================================================ 3. integration of the parts


@pytest.mark.anyio
async def test_a_manifest_agent_driven_by_ingested_ndjson_serves_every_session() -> None:
    """(Regression guard, passes.) ``Agent.from_manifest`` with ``bus.ingest`` of an
    NDJSON batch of INPUT:USER_MESSAGE lines for two sessions (plus a repeated line,
    dropped by the dedup window) serves each input once, in its session, with
    conforming events; the built-in /help answers at once."""
    agent = Agent.from_manifest(EXAMPLE)
    lines = [
        ("a", "Query weather in Taipei"),
        ("b", "list files"),
        ("a", "/read notes.txt"),
        ("b", "/help"),
    ]
    inputs = [
        Event.new(USER_MESSAGE, {"text": line}, source="ndjson", session_id=session)
        for session, line in lines
    ]
    data = b"".join(encode_event(e) + b"\n" for e in [*inputs, inputs[0]])
    async with agent:
        events: list[Event] = []
        agent.bus.subscribe("*", events.append)
        ingested = agent.bus.ingest(data)
        with anyio.fail_after(HANG):
            await until(lambda: agent.loop.runs_completed == 3)
            await agent.bus.wait_idle()
    assert (ingested.accepted, ingested.duplicates, list(ingested.invalid)) == (4, 1, [])
    assert conformance_problems(events, [e.id for e in inputs]) == []
    finals = {
        e.trace_id: e.payload["text"]
        for e in events
        if e.type == OUTPUT_AGENT_MESSAGE and e.payload["final"]
    }
    assert finals[inputs[0].trace_id] == "The weather in Taipei is 25°C, Sunny."
    assert "notes.txt" in finals[inputs[1].trace_id]
    assert finals[inputs[3].trace_id].startswith("Commands:")
    [read] = [e for e in events if e.type == TOOL_RESULT and e.trace_id == inputs[2].trace_id]
    assert read.payload["success"] is True
    assert {agent.loop.sessions[s].id for s in ("a", "b")} == {"a", "b"}


@pytest.mark.anyio
async def test_two_agents_on_one_bus_do_not_both_answer_an_input() -> None:
    """Two agents given the same bus do not both serve every input: an input asked
    through one of them gets one final answer, or sharing the bus is refused when the
    second agent starts. (Today both loops subscribe to INPUT:USER_MESSAGE, so the user
    gets two answers, two runs share one traceId and ``Agent(bus=...)`` says nothing of
    it.)"""
    async with EventBus() as bus:
        events: list[Event] = []
        bus.subscribe("*", events.append)
        first = Agent(FunctionProvider(lambda prompt, context: "from a"), name="a", bus=bus)
        second = Agent(FunctionProvider(lambda prompt, context: "from b"), name="b", bus=bus)
        async with first:
            try:
                await second.__aenter__()
            except RuntimeError:
                return  # refused: the documented alternative
            try:
                with anyio.fail_after(HANG):
                    result = await first.ask("hi", session_id="s")
                    await bus.wait_idle()
            finally:
                await second.__aexit__(None, None, None)
    finals = [
        e.source
        for e in events
        if e.type == OUTPUT_AGENT_MESSAGE and e.trace_id == result.trace_id and e.payload["final"]
    ]
    assert finals == ["agent:a"], f"one input answered by {finals}"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cli_events_from_a_piped_session_reingest_cleanly(
    backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(Regression guard, passes.) ``openstarry run --events`` fed through a pipe with
    /reset, /stop, built-ins, an unknown command, a slash tool and /quit prints one
    envelope a line that ``Ingestor`` takes back with no invalid line and no duplicate,
    and every event the agent emitted conforms."""
    from openstarry.cli import main

    script = [
        "Query weather in Taipei",
        "/reset",
        "list files",
        "/stop",
        "/metrics",
        "/help",
        "/nope",
        "/read notes.txt",
        "what did I ask?",
        "/quit",
        "never read",
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(script) + "\n"))
    code = main(["run", str(EXAMPLE), "--events", "--backend", backend])
    out = capsys.readouterr().out
    assert code == 1  # /nope ends with a KERNEL:ERROR
    ingestor = Ingestor(EventQueue(None), DedupWindow(60_000, 10_000))
    result = ingestor.ingest(out.encode())
    lines = out.splitlines()
    assert (result.accepted, result.duplicates, list(result.invalid)) == (len(lines), 0, [])
    events = [decode_event(line.encode()) for line in lines]
    inputs = [e.id for e in events if e.type in (USER_MESSAGE, SYSTEM_COMMAND)]
    typed = [e.payload.get("text") or "/" + e.payload["command"] for e in events if e.id in inputs]
    assert typed == script[:-1]
    assert conformance_problems(events, inputs) == []
    assert {e.session_id for e in events} == {"cli"}


# ================================================================ 4. races and loop exit


@pytest.mark.anyio
async def test_reset_as_a_tool_result_arrives_leaves_memory_empty() -> None:
    """A /reset dispatched just as a tool's result is on its way back to the run (the
    run's task is already woken) leaves the session's memory empty: the cancelled run
    writes nothing after the reset, so the next provider call sees only the new user
    turn, never an orphan ToolOutcome whose call was cleared (which OpenAI- and
    Anthropic-style adapters reject)."""
    go = anyio.Event()
    entered = anyio.Event()

    class Waits(Tool):
        name = "waits"

        async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
            entered.set()
            await go.wait()
            return "ok"

    provider = FunctionProvider(
        lambda prompt, context: (
            tool_call("waits", {}) if prompt == "go" and context.round == 1 else text("fresh")
        )
    )
    async with running(provider, [Waits()]) as h:
        h.bus.subscribe("X:SYNC", lambda event: go.set())
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go")
                await entered.wait()
                # One dispatcher step: the tool's result is released, then /reset.
                h.bus.publish(Event.new("X:SYNC", {}, source="test", session_id="x", priority=0))
                h.loop.command("reset", session_id="s")
            await h.bus.wait_idle()
        after_reset = [type(m).__name__ for m in h.loop.sessions["s"].memory]
        await h.ask("hello")
    assert after_reset == []
    assert [type(m).__name__ for m in provider.calls[-1].memory] == ["UserTurn"]


@pytest.mark.parametrize("command", ["stop", "reset"])
@pytest.mark.anyio
async def test_a_command_as_the_answer_arrives_keeps_the_run_consistent(command: str) -> None:
    """(Regression guard, passes.) A /stop or /reset dispatched just as the provider's
    answer is on its way back either stops the run or lets it finish, but its result
    and its state changes agree, and the session answers the next input."""
    go = anyio.Event()
    entered = anyio.Event()

    async def reply(prompt: str, context: AgentContext) -> str:
        if prompt == "go":
            entered.set()
            await go.wait()
            return "answer"
        return f"re: {prompt}"

    async with running(FunctionProvider(reply)) as h:
        h.bus.subscribe("X:SYNC", lambda event: go.set())
        results: list[RunResult] = []
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:

                async def first() -> None:
                    results.append(await h.loop.ask("go", session_id="s"))

                tg.start_soon(first)
                await entered.wait()
                h.bus.publish(Event.new("X:SYNC", {}, source="test", session_id="x", priority=0))
                h.loop.command(command, session_id="s")
            await h.bus.wait_idle()
        after = await h.ask("next")
    [result] = results
    chain = state_chain(h.events, result.trace_id)
    assert chain[0] == ("IDLE", "THINKING")
    assert chain[-1][1] == "IDLE"
    assert result.stopped is (result.replies == [])
    assert after.replies == ["re: next"]


@pytest.mark.anyio
async def test_reset_then_an_immediate_input_starts_from_empty_memory() -> None:
    """(Regression guard, passes.) /reset during a run, with the next input published
    right behind it (before the bus dispatches either), cancels the run and the input
    runs next with nothing but its own turn in memory."""
    gate = Gate()
    provider = FunctionProvider(
        lambda prompt, context: (
            tool_call("gate", {}) if prompt == "go" and context.round == 1 else text(prompt)
        )
    )
    async with running(provider, [gate]) as h:
        await h.ask("before")
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go")
                await gate.started.wait()
                h.loop.command("reset", session_id="s")
                after = h.loop.start("after", session_id="s")
            result = await after.wait()
            await h.bus.wait_idle()
    assert result.replies == ["after"]
    assert provider.calls[-1].memory == (UserTurn("after"),)


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


@pytest.mark.anyio
async def test_an_ask_waiting_for_room_is_not_published_after_the_loop_has_left() -> None:
    """An ``ask`` whose input is still waiting for room on a full bus when the loop is
    left returns ``stopped`` and its input is never published afterwards, so no other
    loop on the bus (or this one entered again) serves an input its caller was told
    had stopped."""
    entered = anyio.Event()
    release = anyio.Event()
    results: list[RunResult] = []
    async with EventBus(capacity=1) as bus:

        async def hold(event: Event) -> None:
            entered.set()
            await release.wait()

        events: list[Event] = []
        bus.subscribe("*", events.append)
        bus.subscribe("X:HOLD", hold)
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                async with ExecutionLoop(bus, FunctionProvider(lambda p, c: "hi")) as loop:
                    bus.publish(Event.new("X:HOLD", {}, source="test", session_id="x"))
                    await entered.wait()
                    bus.publish(filler(0))  # the bus is full

                    async def ask() -> None:
                        results.append(await loop.ask("hello", session_id="s"))

                    tg.start_soon(ask)
                    await until(lambda: bus._room_waiters > 0)
                release.set()
            await bus.wait_idle()
    assert [r.stopped for r in results] == [True]
    assert [e.type for e in events if e.type == USER_MESSAGE] == []
