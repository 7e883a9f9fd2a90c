"""What a benchmark or a long test of an agent needs: stateless asks, bounded recording,
endless scripts, ``context.tool_results``, and call deadlines kept by one watcher.

- ``Agent.ask(session_id=None)`` runs from no history and leaves no session behind,
  whether the run completes, fails, is refused before it runs, or many run at once;
  with a store, a stateless run is neither loaded nor saved.
- The test providers keep the last ``record`` calls (100 by default; 0 for none,
  ``None`` for all), and count every call.
- ``ScriptedProvider(cycle=True)`` starts its script over instead of running out.
- ``context.tool_results`` is empty on a run's first round and holds the previous
  round's outcomes (failed ones too) on the next.
- :class:`~openstarry.agent.deadlines.Deadlines` cancels a call still running at its
  deadline, leaves an ended one alone, and keeps its heap small.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agent_harness import HANG
from openstarry import Agent, tool
from openstarry.agent.deadlines import Deadlines, ToolCallWatch
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.limits import LoopLimits
from openstarry.agent.memory import Session, ToolOutcome, UserTurn
from openstarry.agent.store import SessionStore
from openstarry.core import ProviderResponse
from openstarry.testing import (
    DEFAULT_RECORD,
    FunctionProvider,
    ScriptedProvider,
    ScriptExhausted,
    text,
    tool_call,
)


@tool
async def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


def adder(prompt: str, context: AgentContext) -> ProviderResponse:
    """Calls add_one on the first round; answers with its result on the next."""
    if not context.tool_results:
        return tool_call("add_one", {"x": int(prompt)})
    [outcome] = context.tool_results
    return text(f"{outcome.result}" if outcome.success else f"failed: {outcome.error}")


def _context(round: int = 1) -> AgentContext:
    session = Session("s")
    session.memory.append(UserTurn("hello"))
    return AgentContext(tools={}, session=session, round=round)


# --- stateless ask ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_stateless_ask_starts_from_no_history_and_leaves_no_session() -> None:
    seen: list[int] = []

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        seen.append(len(context.memory))
        return adder(prompt, context)

    async with Agent(FunctionProvider(model), [add_one]) as agent:
        with anyio.fail_after(HANG):
            kept = await agent.ask("1")
            first = await agent.ask("2", session_id=None)
            second = await agent.ask("3", session_id=None)
        assert (kept.replies, first.replies, second.replies) == (["2"], ["3"], ["4"])
        # Each stateless run saw only its own turn: the prompt, then the call and outcome.
        assert seen == [1, 3, 1, 3, 1, 3]
        with anyio.fail_after(HANG):
            while set(agent.loop.sessions) != {"default"}:
                await anyio.sleep(0.001)
        assert len(agent.loop.session("default").memory) == 4


@pytest.mark.anyio
async def test_stateless_runs_side_by_side_use_sessions_of_their_own() -> None:
    async def slow(prompt: str, context: AgentContext) -> ProviderResponse:
        await anyio.sleep(0.01)
        return text(f"{context.session_id.startswith('stateless-')} {len(context.memory)}")

    async with Agent(FunctionProvider(slow)) as agent:
        results: list[Any] = []

        async def one(i: int) -> None:
            results.append(await agent.ask(str(i), session_id=None))

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as group:
                for i in range(20):
                    group.start_soon(one, i)
            while agent.loop.sessions:
                await anyio.sleep(0.001)
        assert [r.replies for r in results] == [["True 1"]] * 20
        assert len({r.trace_id for r in results}) == 20
        assert agent.loop.metrics()["loop"]["sessions"] == 0


@pytest.mark.anyio
async def test_a_stateless_input_refused_before_it_runs_leaves_no_session() -> None:
    async with Agent(FunctionProvider(adder), [add_one]) as agent:
        with anyio.fail_after(HANG):
            result = await agent.ask("/help", session_id=None)
        assert "Commands:" in result.text
        assert not agent.loop.sessions


@pytest.mark.anyio
async def test_a_failed_stateless_run_leaves_no_session() -> None:
    def broken(prompt: str, context: AgentContext) -> ProviderResponse:
        raise RuntimeError("model down")

    async with Agent(FunctionProvider(broken)) as agent:
        with anyio.fail_after(HANG):
            result = await agent.ask("hi", session_id=None)
            while agent.loop.sessions:
                await anyio.sleep(0.001)
        assert result.error is not None
        assert result.error["code"] == "PROVIDER_ERROR"


class _CountingStore(SessionStore):
    """A store in memory that counts loads and saves."""

    def __init__(self) -> None:
        self.data: dict[str, list[dict[str, Any]]] = {}
        self.loads: list[str] = []
        self.saves: list[str] = []

    async def load(self, session_id: str) -> list[dict[str, Any]] | None:
        self.loads.append(session_id)
        return self.data.get(session_id)

    async def save(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        self.saves.append(session_id)
        self.data[session_id] = entries

    async def delete(self, session_id: str) -> None:
        self.data.pop(session_id, None)


@pytest.mark.anyio
async def test_a_stateless_run_is_neither_loaded_from_nor_saved_to_the_store() -> None:
    store = _CountingStore()
    async with Agent(FunctionProvider(adder), [add_one], store=store) as agent:
        with anyio.fail_after(HANG):
            assert (await agent.ask("1", session_id=None)).replies == ["2"]
            assert (await agent.ask("5", session_id="kept")).replies == ["6"]
    assert store.loads == store.saves == ["kept"]


# --- recording -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_providers_keep_the_last_calls_only() -> None:
    provider = FunctionProvider(lambda p, c: text(p), record=3)
    for i in range(10):
        await provider.generate(str(i), _context())
    assert [call.prompt for call in provider.calls] == ["7", "8", "9"]
    assert provider.call_count == 10

    default = ScriptedProvider(["x"], cycle=True)
    for _ in range(DEFAULT_RECORD + 5):
        await default.generate("p", _context())
    assert len(default.calls) == DEFAULT_RECORD == 100
    assert default.call_count == DEFAULT_RECORD + 5


@pytest.mark.anyio
async def test_record_0_keeps_none_and_none_keeps_all() -> None:
    silent = FunctionProvider(lambda p, c: "ok", record=0)
    everything = ScriptedProvider(["ok"], cycle=True, record=None)
    for _ in range(150):
        await silent.generate("p", _context())
        await everything.generate("p", _context())
    assert len(silent.calls) == 0
    assert silent.call_count == 150
    assert len(everything.calls) == everything.call_count == 150


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_record_must_be_a_count(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="record"):
        FunctionProvider(lambda p, c: "ok", record=bad)
    with pytest.raises((TypeError, ValueError), match="record"):
        ScriptedProvider(["ok"], record=bad)


# --- cycle -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_cycling_script_starts_over() -> None:
    provider = ScriptedProvider(["one", "two", "three"], cycle=True)
    answers = [await provider.generate("p", _context()) for _ in range(7)]
    assert [a.segments[0].text for a in answers] == ["one", "two", "three"] * 2 + ["one"]
    assert provider.remaining == 2
    assert repr(provider) == "ScriptedProvider(name='scripted', remaining=2, cycle=True)"


@pytest.mark.anyio
async def test_a_script_that_does_not_cycle_still_runs_out() -> None:
    provider = ScriptedProvider(["one"])
    await provider.generate("p", _context())
    with pytest.raises(ScriptExhausted, match="call 2"):
        await provider.generate("p", _context())


def test_an_empty_script_cannot_cycle() -> None:
    with pytest.raises(ValueError, match="at least one response"):
        ScriptedProvider([], cycle=True)


@pytest.mark.anyio
async def test_a_cycling_script_serves_an_agent_turn_after_turn() -> None:
    provider = ScriptedProvider([tool_call("add_one", {"x": 1}), "done"], cycle=True, record=0)
    async with Agent(provider, [add_one], memory_window=1) as agent:
        with anyio.fail_after(HANG):
            for _ in range(5):
                assert (await agent.ask("go")).replies == ["done"]
    assert provider.call_count == 10
    assert not provider.calls


# --- context.tool_results ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_tool_results_are_the_previous_rounds_outcomes() -> None:
    seen: list[tuple[int, tuple[ToolOutcome, ...]]] = []

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        seen.append((context.round, context.tool_results))
        if context.round == 1:
            return tool_call("add_one", {"x": 1}, id="a")
        if context.round == 2:
            return tool_call("add_one", {"x": "not a number"}, id="b")
        return text("done")

    async with Agent(FunctionProvider(model), [add_one]) as agent:
        with anyio.fail_after(HANG):
            await agent.ask("go")
            await agent.ask("again")
    rounds = [(r, [(o.tool_call_id, o.success, o.result) for o in results]) for r, results in seen]
    assert rounds[:3] == [(1, []), (2, [("a", True, 2)]), (3, [("b", False, None)])]
    # The next input starts again from none, though memory holds the earlier calls.
    assert rounds[3] == (1, [])
    failed = seen[2][1][0]
    assert failed.error is not None
    assert failed.error.code == "INVALID_ARGUMENTS"


@pytest.mark.anyio
async def test_tool_results_are_the_runs_record_whatever_the_provider_does_to_memory() -> None:
    """A provider that rewrites the session's memory (a summarizer, say) still hears
    what its calls returned: the run keeps the outcomes itself."""
    seen: list[tuple[int, list[tuple[str, bool]]]] = []

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round > 1:
            context.memory.clear()  # the outcome is no longer in memory
            assert context.memory.tool_results() == ()
        seen.append((context.round, [(o.tool_call_id, o.success) for o in context.tool_results]))
        if context.round == 1:
            return tool_call("add_one", {"x": 1}, id="a")
        return text("done")

    async with Agent(FunctionProvider(model), [add_one]) as agent:
        with anyio.fail_after(HANG):
            result = await agent.ask("go")
            assert result.replies == ["done"]
            await agent.ask("again")  # round 1 of a new input: none
    assert seen[:2] == [(1, []), (2, [("a", True)])]
    assert seen[2] == (1, [])


@pytest.mark.anyio
async def test_tool_results_follow_the_rounds_when_memory_is_left_alone() -> None:
    observed: list[tuple[tuple[ToolOutcome, ...], tuple[ToolOutcome, ...]]] = []

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        observed.append((context.tool_results, context.memory.tool_results()))
        if context.round < 3:
            return tool_call("add_one", {"x": context.round}, id=f"c{context.round}")
        return text("done")

    async with Agent(FunctionProvider(model), [add_one]) as agent:
        with anyio.fail_after(HANG):
            await agent.ask("go")
    assert [len(kept) for kept, _ in observed] == [0, 1, 1]
    assert all(kept == scanned for kept, scanned in observed)  # the record is what memory says


def test_tool_results_outside_a_run_are_empty() -> None:
    assert _context().tool_results == ()
    assert AgentContext(tools={}, session=Session("empty")).tool_results == ()


# --- deadlines -------------------------------------------------------------------------------


class _Cancelled:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self, reason: str | None = None) -> None:
        self.cancels += 1


@pytest.mark.anyio
async def test_the_watcher_cancels_a_call_still_running_at_its_deadline() -> None:
    deadlines = Deadlines()
    running, ended = ToolCallWatch(_Cancelled()), ToolCallWatch(_Cancelled())
    async with anyio.create_task_group() as group:
        group.start_soon(deadlines.watch, anyio.Event)
        deadlines.begin(ended, 0.01)
        deadlines.begin(running, 0.02)
        deadlines.end(ended)
        assert len(deadlines) == 1
        with anyio.fail_after(HANG):
            while not running.scope.cancels:
                await anyio.sleep(0.005)
        group.cancel_scope.cancel()
    assert (running.scope.cancels, ended.scope.cancels) == (1, 0)
    assert len(deadlines) == 0


@pytest.mark.anyio
async def test_a_shorter_timeout_wakes_a_watcher_sleeping_for_a_longer_one() -> None:
    deadlines = Deadlines()
    long_call, short_call = ToolCallWatch(_Cancelled()), ToolCallWatch(_Cancelled())
    async with anyio.create_task_group() as group:
        group.start_soon(deadlines.watch, anyio.Event)
        deadlines.begin(long_call, 3600)
        await anyio.sleep(0.01)  # the watcher now sleeps for the hour
        deadlines.begin(short_call, 0.01)
        with anyio.fail_after(HANG):
            while not short_call.scope.cancels:
                await anyio.sleep(0.005)
        group.cancel_scope.cancel()
    assert long_call.scope.cancels == 0


def test_ended_calls_are_not_kept() -> None:
    deadlines = Deadlines(clock=lambda: 0.0)
    hung = ToolCallWatch(_Cancelled())
    deadlines.begin(hung, 1.0)
    for _ in range(1_000):
        quick = ToolCallWatch(_Cancelled())
        deadlines.begin(quick, 5.0)
        deadlines.end(quick)
    assert len(deadlines) == 1
    deadlines.end(hung)
    assert len(deadlines) == 0


@pytest.mark.anyio
async def test_a_busy_watcher_wakes_once_per_timeout_not_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps = 0
    sleep_forever = anyio.sleep_forever

    async def counted() -> None:
        nonlocal sleeps
        sleeps += 1
        await sleep_forever()

    monkeypatch.setattr(anyio, "sleep_forever", counted)  # what the watcher sleeps in
    deadlines = Deadlines()
    async with anyio.create_task_group() as group:
        group.start_soon(deadlines.watch, anyio.Event)
        for _ in range(200):
            call = ToolCallWatch(_Cancelled())
            deadlines.begin(call, 60.0)
            await anyio.sleep(0)  # the watcher may run
            deadlines.end(call)
        group.cancel_scope.cancel()
    assert 1 <= sleeps <= 2


@pytest.mark.anyio
async def test_a_tool_past_its_timeout_fails_and_the_run_goes_on() -> None:
    @tool
    async def nap() -> str:
        """Sleeps an hour."""
        await anyio.sleep(3600)
        return "rested"

    provider = ScriptedProvider([tool_call("nap"), "woke"])
    limits = LoopLimits(tool_timeout=0.05)
    async with Agent(provider, [nap], limits=limits) as agent:
        with anyio.fail_after(HANG):
            result = await agent.ask("nap")
    assert result.replies == ["woke"]
    [outcome] = [c for c in provider.calls[1].memory if isinstance(c, ToolOutcome)]
    assert outcome.error is not None
    assert outcome.error.code == "TIMEOUT"


@pytest.mark.anyio
async def test_a_loop_signal_wakes_its_waiters_after_cancelled_waits() -> None:
    from openstarry.agent.results import wakeup_factory

    signal = wakeup_factory()()
    for _ in range(20):  # waits given up: they must not keep the next one from waking
        with anyio.move_on_after(0):
            await signal.wait()
    assert not signal.is_set()
    # The futures of waits given up are dropped as more pile up (asyncio's signal).
    assert len(getattr(signal, "_waiters", None) or ()) <= 8
    woken: list[int] = []

    async def waiter(n: int) -> None:
        await signal.wait()
        woken.append(n)

    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, 1)
            tg.start_soon(waiter, 2)
            await anyio.sleep(0.01)
            signal.set()
        await signal.wait()  # set: returns at once
    assert sorted(woken) == [1, 2]
    assert signal.is_set()
    pending = getattr(signal, "_waiters", None)
    assert not pending  # nothing kept once set
