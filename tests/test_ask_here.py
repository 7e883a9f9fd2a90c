"""An ``ask`` on a free session is served in the asking task.

When the session has no run and nothing queued, and the input reaches it at
once (the bus is idle and only the loop takes inputs), ``ExecutionLoop.ask``
serves the run itself instead of waking the session's worker. These tests
check that it is then the same run as a worker's: inputs sent meanwhile wait
their turn, ``/stop``, the provider deadline and leaving the loop stop it, and
cancelling the asker stops it as ``/stop`` would. They also check that
cancelling an ``ask`` whose input waits behind another run drops that input.
Waits are bounded by :data:`HANG` only as a guard against a hang.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import pytest

from agent_harness import (
    AGENT_MESSAGE,
    HANG,
    STATE_CHANGE,
    Blocking,
    HangingProvider,
    outcomes,
    states,
    until,
)
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
from openstarry.agent.memory import UserTurn
from openstarry.agent.store import InMemoryStore
from openstarry.agent.taskscope import RunScope
from openstarry.agent.tools import tool
from openstarry.bus import EventBus
from openstarry.core import Event, ProviderResponse
from openstarry.testing import FunctionProvider, ScriptedProvider, text, tool_call


class Recorder:
    """A provider that notes each call's prompt and task, and waits at ``gate`` on "wait"."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = anyio.Event()
        self.waiting = anyio.Event()

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        self.calls.append((prompt, anyio.get_current_task().id))
        if prompt == "go" and not context.tool_results:
            return tool_call("slow", {})
        if prompt == "wait":
            self.waiting.set()
            await self.gate.wait()
        return text(f"answer to {prompt}")


class Loop:
    """A loop on its own bus, recording its state changes and replies (not its inputs)."""

    def __init__(self, bus: EventBus, loop: ExecutionLoop, events: list[Event]) -> None:
        self.bus = bus
        self.loop = loop
        self.events = events


@asynccontextmanager
async def serving(provider: Any, *tools: Any, **options: Any) -> AsyncIterator[Loop]:
    async with EventBus() as bus:
        events: list[Event] = []
        # Not "*": a subscriber to inputs would take them through the queue.
        bus.subscribe(STATE_CHANGE, events.append)
        bus.subscribe(AGENT_MESSAGE, events.append)
        async with ExecutionLoop(bus, provider, tools, **options) as loop:
            yield Loop(bus, loop, events)


def task_id() -> int:
    return anyio.get_current_task().id


async def ask_cancelled_once_started(loop: ExecutionLoop, slow: Blocking) -> None:
    """``ask("go")`` in session ``s``, its caller cancelled once the ``slow`` tool has started."""
    with anyio.CancelScope() as scope:

        async def cancel_once_started() -> None:
            await slow.started.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_started)
            await loop.ask("go", session_id="s")
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_an_ask_on_a_free_session_runs_in_the_asking_task() -> None:
    provider = Recorder()
    with anyio.fail_after(HANG):
        async with serving(provider) as h:
            first = await h.loop.ask("one", session_id="s")
            # The first run's events for the subscribers are dispatched first:
            # an input is served at once only when nothing is queued before it.
            await h.bus.wait_idle()
            second = await h.loop.ask("two", session_id="s")
            metrics = h.loop.metrics()
            await h.bus.wait_idle()
    assert [first.replies, second.replies] == [["answer to one"], ["answer to two"]]
    assert provider.calls == [("one", task_id()), ("two", task_id())]
    # No worker was started or parked for the session.
    assert metrics["loop"]["idle_workers"] == 0
    assert metrics["loop"]["running"] == 0
    assert metrics["bus"]["published"] >= 2  # the inputs are counted as published
    assert states(h.events) == [("IDLE", "THINKING"), ("THINKING", "IDLE")] * 2
    assert [e.trace_id for e in h.events if e.type == AGENT_MESSAGE] == [
        first.trace_id,
        second.trace_id,
    ]
    memory = h.loop.session("s").memory
    assert len(memory) == 4


@pytest.mark.anyio
async def test_inputs_sent_during_a_run_served_here_wait_their_turn() -> None:
    provider = Recorder()
    results: dict[str, RunResult] = {}
    with anyio.fail_after(HANG):
        async with serving(provider) as h:

            async def ask(prompt: str) -> None:
                results[prompt] = await h.loop.ask(prompt, session_id="s")

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "wait")
                await provider.waiting.wait()
                later = h.loop.start("later", session_id="s")
                tg.start_soon(ask, "last")
                await until(lambda: len(h.loop._sessions.find("s").pending) == 2)  # type: ignore[union-attr]
                assert [prompt for prompt, _ in provider.calls] == ["wait"]
                provider.gate.set()
                results["later"] = await later.wait()
            metrics = h.loop.metrics()
    assert [prompt for prompt, _ in provider.calls] == ["wait", "later", "last"]
    assert {k: r.replies for k, r in results.items()} == {
        "wait": ["answer to wait"],
        "later": ["answer to later"],
        "last": ["answer to last"],
    }
    # The two that queued were served by the session's worker, one task for both.
    (_, asker), (_, worker), (_, worker_again) = provider.calls
    assert worker == worker_again != asker
    assert metrics["loop"]["idle_workers"] == 1
    prompts = [entry.text for entry in h.loop.session("s").memory if hasattr(entry, "text")]
    assert prompts[::2] == ["wait", "later", "last"]


@pytest.mark.anyio
async def test_a_parked_worker_serves_what_queued_behind_a_run_served_here() -> None:
    provider = Recorder()
    with anyio.fail_after(HANG):
        async with serving(provider) as h:
            # start() hands its input to the session's worker, which then parks.
            await h.loop.start("first", session_id="s").wait()
            assert h.loop.metrics()["loop"]["idle_workers"] == 1
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(h.loop.ask, "wait", session_id="s"))
                await provider.waiting.wait()
                # The session is busy: its parked worker is not counted idle.
                assert h.loop.metrics()["loop"]["idle_workers"] == 0
                after = h.loop.start("after", session_id="s")
                provider.gate.set()
                result = await after.wait()
            assert h.loop.metrics()["loop"]["idle_workers"] == 1
    assert result.replies == ["answer to after"]
    (_, worker), (_, asker), (_, worker_again) = provider.calls
    assert worker == worker_again != asker


@pytest.mark.anyio
async def test_cancelling_an_ask_served_here_stops_its_run() -> None:
    provider = Recorder()
    slow = Blocking()
    with anyio.fail_after(HANG):
        async with serving(provider, slow) as h:
            await ask_cancelled_once_started(h.loop, slow)
            assert slow.cancelled
            stopped = h.loop.runs_stopped
            again = await h.loop.ask("again", session_id="s")
            await h.bus.wait_idle()
    assert stopped == 1
    assert again.replies == ["answer to again"]
    # The stopped call has its answer in memory; the state went back to idle.
    [outcome] = outcomes(h.loop.session("s").memory)
    assert (outcome.success, outcome.error.code if outcome.error else None) == (
        False,
        "CANCELLED",
    )
    changes = [e.payload for e in h.events if e.type == STATE_CHANGE]
    assert {"from": "EXECUTING", "to": "IDLE", "reason": "stopped"} in changes


@pytest.mark.anyio
async def test_a_stop_reaches_a_run_served_here() -> None:
    provider = Recorder()
    slow = Blocking()
    with anyio.fail_after(HANG):
        async with serving(provider, slow) as h, anyio.create_task_group() as tg:

            async def stop_once_started() -> None:
                await slow.started.wait()
                h.loop.command("stop", session_id="s")

            tg.start_soon(stop_once_started)
            result = await h.loop.ask("go", session_id="s")
    assert result.stopped
    assert slow.cancelled
    assert h.loop.runs_stopped == 1


@pytest.mark.anyio
async def test_the_provider_deadline_ends_a_run_served_here() -> None:
    provider = HangingProvider()
    with anyio.fail_after(HANG):
        async with serving(provider, limits=LoopLimits(provider_timeout=0.05)) as h:
            result = await h.loop.ask("hello", session_id="s")
    assert provider.cancelled
    assert result.error is not None
    assert result.error["code"] == "PROVIDER_TIMEOUT"
    assert not result.stopped


@pytest.mark.anyio
async def test_a_stateless_ask_served_here_leaves_no_session() -> None:
    provider = Recorder()
    with anyio.fail_after(HANG):
        async with serving(provider) as h:
            result = await h.loop.ask("hello", session_id=None)
            sessions = dict(h.loop._sessions.sessions)
    assert result.replies == ["answer to hello"]
    assert provider.calls == [("hello", task_id())]
    assert sessions == {}


@pytest.mark.anyio
async def test_leaving_the_loop_stops_a_run_served_here_and_waits_for_it() -> None:
    provider = Recorder()
    slow = Blocking()
    results: list[RunResult] = []
    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg, EventBus() as bus:
            async with ExecutionLoop(bus, provider, [slow]) as loop:

                async def ask() -> None:
                    results.append(await loop.ask("go", session_id="s"))

                tg.start_soon(ask)
                await slow.started.wait()
            # Leaving waited for the run to end.
            assert slow.cancelled
            await until(lambda: bool(results))
    [result] = results
    assert result.stopped


@pytest.mark.anyio
async def test_cancelling_an_ask_drops_its_input_waiting_behind_another_run() -> None:
    provider = Recorder()
    with anyio.fail_after(HANG):
        async with serving(provider) as h:
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(h.loop.ask, "wait", session_id="s"))
                await provider.waiting.wait()
                with anyio.CancelScope() as scope:

                    async def cancel_once_queued() -> None:
                        await until(lambda: h.loop.metrics()["loop"]["waiting"] == 1)
                        scope.cancel()

                    tg.start_soon(cancel_once_queued)
                    await h.loop.ask("dropped", session_id="s")
                assert scope.cancelled_caught
                assert h.loop.metrics()["loop"]["waiting"] == 0
                provider.gate.set()
            again = await h.loop.ask("again", session_id="s")
    assert [prompt for prompt, _ in provider.calls] == ["wait", "again"]
    assert again.replies == ["answer to again"]


@pytest.mark.anyio
async def test_cancelling_an_ask_stops_its_run_in_the_sessions_worker() -> None:
    provider = Recorder()
    slow = Blocking()
    with anyio.fail_after(HANG):
        async with serving(provider, slow) as h:
            # A subscriber to inputs: they go through the queue, and a worker serves them.
            h.bus.subscribe("INPUT:USER_MESSAGE", lambda event: None)
            await ask_cancelled_once_started(h.loop, slow)
            await until(lambda: h.loop.runs_stopped == 1)
            again = await h.loop.ask("again", session_id="s")
    assert slow.cancelled
    [(_, worker), (_, worker_again)] = provider.calls
    assert worker == worker_again != task_id()
    assert again.replies == ["answer to again"]
    [outcome] = outcomes(h.loop.session("s").memory)
    assert outcome.error is not None
    assert outcome.error.code == "CANCELLED"


class SlowStore(InMemoryStore):
    """Loads a session after a wait, saying when it starts loading."""

    def __init__(self) -> None:
        super().__init__()
        self.loading = anyio.Event()

    async def load(self, session_id: str) -> list[dict[str, Any]] | None:
        self.loading.set()
        await anyio.sleep(HANG)
        return await super().load(session_id)


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["stop", "leaving the loop"])
async def test_a_run_served_here_stopped_while_its_session_loads_ends_stopped(how: str) -> None:
    provider = Recorder()
    store = SlowStore()
    results: list[RunResult] = []
    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg, EventBus() as bus:
            async with ExecutionLoop(bus, provider, [], store=store) as loop:

                async def ask() -> None:
                    results.append(await loop.ask("hi", session_id="s"))

                tg.start_soon(ask)
                await store.loading.wait()
                if how == "stop":
                    loop.command("stop", session_id="s")
                    await until(lambda: bool(results))
            await until(lambda: bool(results))
    [result] = results
    assert result.stopped
    assert result.replies == []
    assert provider.calls == []  # the run never began
    assert "s" not in store.sessions  # nothing was saved for it


class Swallower:
    """A provider that swallows the first cancellation of its wait, then waits again."""

    name = "swallower"

    def __init__(self) -> None:
        self.started = anyio.Event()

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        self.started.set()
        with contextlib.suppress(anyio.get_cancelled_exc_class()):
            await anyio.sleep(HANG)
        await anyio.sleep(HANG)
        return text("finished anyway")


@pytest.mark.anyio
async def test_a_stop_reaches_a_run_served_here_that_swallows_one_cancellation() -> None:
    provider = Swallower()
    with anyio.fail_after(HANG):
        async with serving(provider) as h, anyio.create_task_group() as tg:

            async def stop_once_started() -> None:
                await provider.started.wait()
                h.loop.command("stop", session_id="s")

            tg.start_soon(stop_once_started)
            result = await h.loop.ask("hi", session_id="s")
    assert result.stopped
    assert result.replies == []


@pytest.mark.anyio
async def test_an_ask_on_a_remote_bus_makes_no_local_session() -> None:
    from test_bus import _RecordingBackend

    provider = Recorder()
    limits = LoopLimits(max_sessions=2)
    async with (
        EventBus(backend=_RecordingBackend()) as bus,
        ExecutionLoop(bus, provider, [], limits=limits) as loop,
    ):
        for session_id in ("a", "b"):
            loop.session(session_id).memory.append(UserTurn(f"remember {session_id}"))
        # Served by whichever consumer the backend gives it to; not waited for here.
        with anyio.move_on_after(0.05):
            await loop.ask("hi", session_id="elsewhere")
        sessions = sorted(loop.sessions)
    assert sessions == ["a", "b"]
    assert provider.calls == []


# -- a provider that completes at once: the run's scope entered only if it waits


class Scopes:
    """Records the run scopes a loop's asks are served in."""

    def __init__(self, loop: ExecutionLoop) -> None:
        self.made: list[RunScope] = []
        sessions = loop._sessions
        new = sessions._here_scope

        def record() -> RunScope:
            scope = new()
            self.made.append(scope)
            return scope

        sessions._here_scope = record


@tool
async def add_one(x: int) -> int:
    """Add one to x (completes at once)."""
    return x + 1


def adding(prompt: str, context: AgentContext) -> ProviderResponse:
    if not context.tool_results:
        return tool_call("add_one", {"x": 1})
    return text(f"got {context.tool_results[0].result}")


@pytest.mark.anyio
async def test_a_run_that_never_waits_is_served_without_entering_its_scope() -> None:
    provider = FunctionProvider(adding)
    assert provider.completes_at_once
    with anyio.fail_after(HANG):
        async with serving(provider, add_one) as h:
            scopes = Scopes(h.loop)
            result = await h.loop.ask("add", session_id="s")
            await h.bus.wait_idle()
    assert result.replies == ["got 2"]
    [scope] = scopes.made
    assert not scope.entered
    # The run's events as ever (the test's subscribers see its state changes).
    assert states(h.events) == [
        ("IDLE", "THINKING"),
        ("THINKING", "EXECUTING"),
        ("EXECUTING", "THINKING"),
        ("THINKING", "IDLE"),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["stop", "cancelling the asker"])
async def test_a_stop_reaches_an_at_once_providers_answer_waiting_in_a_scope_of_its_own(
    how: str,
) -> None:
    """A function answer that returns an awaitable: the test provider waits first
    at a plain checkpoint, so the run's scope is entered before the answer
    enters a scope of its own (trio leaves scopes in order)."""
    started = anyio.Event()
    cancelled: list[bool] = []

    async def answer() -> ProviderResponse:
        started.set()
        try:
            with anyio.fail_after(HANG):
                await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise
        return text("never")

    provider = FunctionProvider(lambda prompt, context: answer() if prompt == "hi" else "fine")
    results: list[RunResult] = []
    with anyio.fail_after(HANG):
        async with serving(provider) as h, anyio.create_task_group() as tg:
            scopes = Scopes(h.loop)
            with anyio.CancelScope() as asker:

                async def stop_once_started() -> None:
                    await started.wait()
                    if how == "stop":
                        h.loop.command("stop", session_id="s")
                    else:
                        asker.cancel()

                tg.start_soon(stop_once_started)
                results.append(await h.loop.ask("hi", session_id="s"))
            again = await h.loop.ask("again", session_id="s") if how == "stop" else None
    assert cancelled == [True]
    [scope, *_] = scopes.made
    assert scope.entered
    if how == "stop":
        assert results[0].stopped
        assert results[0].replies == []
        assert again is not None
        assert again.replies == ["fine"]
    else:
        assert asker.cancelled_caught
        assert results == []
    assert h.loop.runs_stopped == 1


@pytest.mark.anyio
async def test_a_stop_reaches_a_waiting_tool_under_an_at_once_provider() -> None:
    """The run enters its scope before a tool call that can wait (the tool's
    timeout is a scope of its own)."""
    slow = Blocking()
    provider = ScriptedProvider([tool_call("slow", {}), "done"], cycle=True)
    with anyio.fail_after(HANG):
        async with serving(provider, slow) as h, anyio.create_task_group() as tg:
            scopes = Scopes(h.loop)

            async def stop_once_started() -> None:
                await slow.started.wait()
                h.loop.command("stop", session_id="s")

            tg.start_soon(stop_once_started)
            result = await h.loop.ask("go", session_id="s")
    assert result.stopped
    assert slow.cancelled
    [scope] = scopes.made
    assert scope.entered
    assert scope.cancelled_caught
    [outcome] = outcomes(h.loop.session("s").memory)
    assert outcome.error is not None
    assert outcome.error.code == "CANCELLED"


@pytest.mark.anyio
async def test_the_provider_deadline_ends_an_at_once_providers_answer_that_waits() -> None:
    async def hang() -> ProviderResponse:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    provider = FunctionProvider(lambda prompt, context: hang())
    with anyio.fail_after(HANG):
        async with serving(provider, limits=LoopLimits(provider_timeout=0.05)) as h:
            result = await h.loop.ask("hello", session_id="s")
    assert result.error is not None
    assert result.error["code"] == "PROVIDER_TIMEOUT"
