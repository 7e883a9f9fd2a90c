"""``RunScope``: a run's cancel scope, entered only once the run waits.

A run that never waits cannot be cancelled mid-way, so it enters no scope; a
run that waits enters the backend's scope at its first wait, before the wait
reaches the event loop, and is then cancelled as with a scope entered at the
start: a cancel before the wait lands at it, a cancel during it ends it and
is swallowed, a cancellation of the caller goes on. On asyncio and on trio.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG
from openstarry.agent.taskscope import RunScope, new_run_scope


def new_scope() -> RunScope:
    """The backend's run scope (made in a task of the backend)."""
    return new_run_scope()()


async def wait_forever() -> None:
    """A plain wait, in no cancel scope of its own (``anyio.sleep`` enters one on trio)."""
    await anyio.Event().wait()


async def serve(scope: RunScope, run: Any) -> None:
    """What ``Sessions.serve_here`` does with a run and its scope."""
    with scope:
        rest = scope.serve(run)
        if rest is not None:
            await rest


async def serve_cancelled_soon(scope: RunScope, run: Any) -> None:
    """:func:`serve`, the scope cancelled from another task 10 ms in."""
    async with anyio.create_task_group() as tg:

        async def stop_soon() -> None:
            await anyio.sleep(0.01)
            scope.cancel()

        tg.start_soon(stop_soon)
        await serve(scope, run)


@pytest.mark.anyio
async def test_a_run_that_never_waits_enters_no_scope() -> None:
    done: list[str] = []

    async def run() -> None:
        done.append("ran")

    scope = new_scope()
    await serve(scope, run())
    assert done == ["ran"]
    assert not scope.entered
    assert not scope.cancelled_caught


@pytest.mark.anyio
async def test_a_run_that_waits_enters_its_scope_and_a_cancel_ends_the_wait() -> None:
    scope = new_scope()
    waiting = anyio.Event()
    after: list[str] = []

    async def run() -> None:
        waiting.set()
        await wait_forever()
        after.append("woke")  # never: the cancel ends the run at its wait

    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg:

            async def stop_once_waiting() -> None:
                await waiting.wait()
                scope.cancel()

            tg.start_soon(stop_once_waiting)
            await serve(scope, run())
    assert scope.entered
    assert scope.cancel_called
    assert scope.cancelled_caught
    assert after == []


@pytest.mark.anyio
async def test_a_cancel_before_the_first_wait_lands_at_it() -> None:
    scope = new_scope()
    reached: list[str] = []

    async def run() -> None:
        scope.cancel()  # the run stops itself while it runs: nothing happens yet
        reached.append("after cancel")
        await anyio.lowlevel.checkpoint()
        reached.append("after the wait")  # never

    with anyio.fail_after(HANG):
        await serve(scope, run())
    assert reached == ["after cancel"]
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_a_cancel_of_a_run_that_never_waits_is_not_seen() -> None:
    scope = new_scope()

    async def run() -> None:
        scope.cancel()

    await serve(scope, run())
    # As with a real scope cancelled and left without a wait in between.
    assert scope.cancel_called
    assert not scope.entered
    assert not scope.cancelled_caught


@pytest.mark.anyio
async def test_scopes_the_run_enters_after_its_first_wait_nest_inside_it() -> None:
    scope = new_scope()

    async def run() -> None:
        await anyio.lowlevel.checkpoint()  # the run's scope is entered here
        with anyio.fail_after(HANG):
            await anyio.sleep_forever()  # its own scope inside: the run's cancel ends it

    await serve_cancelled_soon(scope, run())
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_the_run_entering_its_scope_before_its_own_scopes_keeps_their_order() -> None:
    scope = new_scope()

    async def run() -> None:
        scope.enter()  # before code that enters a scope of its own and waits
        with anyio.move_on_after(HANG):
            await anyio.sleep_forever()

    await serve_cancelled_soon(scope, run())
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_the_callers_cancellation_goes_on_through_it() -> None:
    with anyio.CancelScope() as outer:
        scope = new_scope()

        async def run() -> None:
            outer.cancel()
            await wait_forever()

        await serve(scope, run())
    assert outer.cancelled_caught
    assert scope.entered
    assert not scope.cancelled_caught


@pytest.mark.anyio
async def test_an_error_of_the_run_comes_out_whether_or_not_it_waited() -> None:
    async def at_once() -> None:
        raise ValueError("at once")

    async def after_a_wait() -> None:
        await anyio.lowlevel.checkpoint()
        raise ValueError("after a wait")

    for run, message in ((at_once, "at once"), (after_a_wait, "after a wait")):
        with pytest.raises(ValueError, match=message):
            await serve(new_scope(), run())


@pytest.mark.anyio
async def test_a_run_that_returns_after_many_waits_returns() -> None:
    steps: list[int] = []

    async def run() -> None:
        for i in range(5):
            await anyio.lowlevel.checkpoint()
            steps.append(i)

    scope = new_scope()
    await serve(scope, run())
    assert steps == [0, 1, 2, 3, 4]
    assert scope.entered
    assert not scope.cancelled_caught


@pytest.mark.anyio
async def test_a_first_wait_inside_the_runs_own_scope_defers_the_entry_to_a_later_wait(
    anyio_backend: str,
) -> None:
    """On trio the scope cannot be entered inside one the run entered after it
    started (scopes are left in order): it is entered at the next wait outside
    it, and a cancellation meanwhile lands there. On asyncio at the first wait."""
    scope = new_scope()
    reached: list[str] = []

    async def run() -> None:
        await anyio.sleep(0)  # trio: a wait inside trio.sleep's own scope
        reached.append("slept")
        scope.cancel()
        reached.append("cancelled")
        await wait_forever()  # the scope is entered here at the latest: the cancel lands
        reached.append("woke")  # never

    with anyio.fail_after(HANG):
        await serve(scope, run())
    assert reached == ["slept", "cancelled"]
    assert scope.entered
    assert scope.cancelled_caught
