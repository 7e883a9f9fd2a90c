"""Sessions of the execution loop: scheduling, per-session workers, parking and idle eviction.

How inputs of many sessions are served: one run at a time per session, sessions side
by side, ``max_sessions`` and the inputs pending behind a run, idle workers parked and
evicted, and what ``/stop``, ``/reset`` and ``/quit`` do to a session and its run.
Waits are bounded by :data:`HANG` only as a guard against a hang.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import (
    AGENT_MESSAGE,
    ERROR,
    HANG,
    STATE_CHANGE,
    SYSTEM_COMMAND,
    TOOL_RESULT,
    USER_MESSAGE,
    Blocking,
    Echo,
    FakeProvider,
    Gate,
    HangingProvider,
    Weather,
    call,
    conformance_problems,
    filler,
    last_state,
    outcomes,
    response,
    running,
    slow_on_go,
    state_chain,
    states,
    text,
    until,
)
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
from openstarry.agent.memory import UserTurn
from openstarry.bus import EventBus
from openstarry.core import Event, ProviderResponse
from openstarry.testing import FunctionProvider, tool_call
from openstarry.testing import text as text_response


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


@pytest.mark.anyio
async def test_idle_workers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import openstarry.agent.sessions as sessions_module

    monkeypatch.setattr(sessions_module, "_MAX_IDLE_WORKERS", 2)
    provider = FakeProvider(reply=lambda prompt, context: response(text(f"re: {prompt}")))
    async with running(provider) as h:
        for i in range(5):
            result = await h.ask(f"hi {i}", session_id=f"s{i}")
            assert result.replies == [f"re: hi {i}"]
        await anyio.wait_all_tasks_blocked()
        workers = [rt for rt in h.loop._sessions._by_id.values() if rt.running]
        assert len(workers) == 2
        # A session whose worker exited gets a new one on its next input.
        assert (await h.ask("again", session_id="s0")).replies == ["re: again"]


@pytest.mark.anyio
async def test_quit_ends_the_sessions_idle_worker() -> None:
    provider = FakeProvider(reply=lambda prompt, context: response(text("ok")))
    async with running(provider) as h:
        await h.ask("hi", session_id="q")
        rt = h.loop._sessions._by_id["q"]
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


@pytest.mark.anyio
async def test_reset_during_a_tool_call_leaves_memory_empty() -> None:
    """/reset during a tool call leaves memory empty even after the cancelled run winds
    down, so the next provider call sees only the new user turn and never an orphan
    tool outcome (which OpenAI- and Anthropic-style adapters would reject)."""
    gate = Gate()

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "go":
            return tool_call("gate", {}, id="c1")
        return text_response("fresh")

    provider = FunctionProvider(reply)
    async with running(provider, [gate]) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go")
                await gate.started.wait()
                h.loop.command("reset", session_id="s")
        after_reset = list(h.loop.sessions["s"].memory)
        await h.ask("hello")
    assert after_reset == []
    assert [type(m).__name__ for m in provider.calls[-1].memory] == ["UserTurn"]


class Hook(Tool):
    """An async tool that awaits ``action`` (set by the test) and returns "ok"."""

    name = "hook"

    def __init__(self) -> None:
        self.action: Callable[[], Awaitable[None]] | None = None

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        if self.action is not None:
            await self.action()
        return "ok"


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
        lambda prompt, context: (
            tool_call("gate", {}) if context.round == 1 else text_response("done")
        )
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
            for rt in h.loop._sessions._idle_workers
            if h.loop._sessions.find(rt.session.id) is not rt
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
            tool_call("echo", {"x": prompt})
            if context.round == 1
            else text_response(f"re: {prompt}")
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
        assert len(h.loop._sessions._idle_workers) <= 256
        assert len(h.loop._waiters) == 0
        turns = {sum(isinstance(m, UserTurn) for m in s.memory) for s in h.loop.sessions.values()}
        assert turns == {2}
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
            return tool_call("hook", {}) if context.round == 1 else text_response("done")

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
            tool_call("waits", {})
            if prompt == "go" and context.round == 1
            else text_response("fresh")
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
            tool_call("gate", {})
            if prompt == "go" and context.round == 1
            else text_response(prompt)
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
