"""``TaskScope``: the cancel scope of a run served in its asker's task on asyncio.

It must cancel as anyio's scope does where a run can tell: at the task's wait,
never while the task runs, not inside a shield entered within it, and leave a
cancellation of the task from elsewhere to go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import anyio
import pytest

from openstarry.agent.taskscope import TaskScope, run_scope_factory

needs_uncancel = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="TaskScope needs Task.uncancel (3.11); before it a run gets anyio's scope",
)


def cancelling(task: asyncio.Task[Any]) -> int:
    """The task's pending cancellations (``Task.cancelling``, 3.11)."""
    if sys.version_info >= (3, 11):
        return task.cancelling()
    return 0  # pragma: no cover - these tests skip before 3.11


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@needs_uncancel
@pytest.mark.anyio
async def test_a_cancel_from_another_task_ends_the_wait_and_is_swallowed() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    reached = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(asyncio.sleep, 0)  # another task, which then cancels
        with scope:
            asyncio.get_running_loop().call_soon(scope.cancel)
            await anyio.sleep(5)
            reached.append("after the wait")
    assert reached == []
    assert scope.cancel_called
    assert scope.cancelled_caught
    task = asyncio.current_task()
    assert task is not None
    assert cancelling(task) == 0
    await anyio.sleep(0)  # no cancellation is left behind


@needs_uncancel
@pytest.mark.anyio
async def test_a_cancel_from_inside_lands_at_the_next_wait() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    steps = []
    with scope:
        scope.cancel()
        steps.append("ran on")  # not interrupted: the task was running
        await anyio.sleep(5)
        steps.append("after the wait")
    assert steps == ["ran on"]
    assert scope.cancelled_caught


@needs_uncancel
@pytest.mark.anyio
async def test_a_shield_entered_within_holds_the_cancel_back_until_it_ends() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    steps = []
    with scope:
        with anyio.CancelScope(shield=True):
            asyncio.get_running_loop().call_soon(scope.cancel)
            await anyio.sleep(0.05)
            steps.append("the shielded wait ended")
        await anyio.sleep(5)
        steps.append("after the wait")
    assert steps == ["the shielded wait ended"]
    assert scope.cancelled_caught


@needs_uncancel
@pytest.mark.anyio
async def test_a_shield_around_the_scope_does_not_hold_it_back() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    with anyio.CancelScope(shield=True), scope:
        asyncio.get_running_loop().call_soon(scope.cancel)
        await anyio.sleep(5)
    assert scope.cancelled_caught


@needs_uncancel
@pytest.mark.anyio
async def test_the_callers_cancellation_goes_on_through_it() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    with anyio.CancelScope() as outer:
        with scope:
            asyncio.get_running_loop().call_soon(outer.cancel)
            await anyio.sleep(5)
        pytest.fail("the caller's cancellation was swallowed")
    assert outer.cancelled_caught
    assert not scope.cancel_called
    assert not scope.cancelled_caught


@needs_uncancel
@pytest.mark.anyio
async def test_an_anyio_cancel_at_the_same_time_still_lands_at_the_next_wait() -> None:
    loop = asyncio.get_running_loop()
    scope = TaskScope(loop)
    with anyio.CancelScope() as outer:
        with scope:

            def both() -> None:
                scope.cancel()
                outer.cancel()

            loop.call_soon(both)
            await anyio.sleep(5)
        # anyio's cancellation is level-triggered: it is delivered again.
        await anyio.sleep(5)
        pytest.fail("the caller's cancellation was lost")
    assert outer.cancelled_caught


@needs_uncancel
@pytest.mark.anyio
async def test_a_native_cancel_at_the_same_time_goes_on_through_it() -> None:
    loop = asyncio.get_running_loop()
    scope = TaskScope(loop)
    task = asyncio.current_task()
    assert task is not None

    def both() -> None:
        scope.cancel()
        task.cancel()

    loop.call_soon(both)
    with pytest.raises(asyncio.CancelledError), scope:
        await anyio.sleep(5)
    assert not scope.cancelled_caught
    assert cancelling(task) == 1  # the native cancellation, for the caller to take back
    if sys.version_info >= (3, 11):
        task.uncancel()


@needs_uncancel
@pytest.mark.anyio
async def test_a_cancel_the_body_swallows_leaves_nothing_pending() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    with scope:
        asyncio.get_running_loop().call_soon(scope.cancel)
        # A body that swallows it (a defect, but it must not leak).
        with contextlib.suppress(asyncio.CancelledError):
            await anyio.sleep(5)
    assert not scope.cancelled_caught
    task = asyncio.current_task()
    assert task is not None
    assert cancelling(task) == 0
    await anyio.sleep(0)


@needs_uncancel
@pytest.mark.anyio
async def test_a_body_that_swallows_the_cancel_is_cancelled_again_at_its_next_wait() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    steps = []
    with scope:
        asyncio.get_running_loop().call_soon(scope.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await anyio.sleep(5)
        steps.append("swallowed once")
        await anyio.sleep(5)  # cancelled again, as anyio's scope would
        steps.append("after the second wait")
    assert steps == ["swallowed once"]
    assert scope.cancelled_caught
    task = asyncio.current_task()
    assert task is not None
    assert cancelling(task) == 0


class CountingScope(TaskScope):
    """A TaskScope that counts how often it looks at its task."""

    __slots__ = ("looks",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.looks = 0

    def _deliver(self) -> None:
        self.looks += 1
        super()._deliver()


@needs_uncancel
@pytest.mark.anyio
async def test_a_wait_inside_a_shield_is_not_polled_and_the_cancel_lands_as_it_ends() -> None:
    scope = CountingScope(asyncio.get_running_loop())
    steps = []
    with scope:
        with anyio.CancelScope(shield=True):
            asyncio.get_running_loop().call_soon(scope.cancel)
            await anyio.sleep(0.2)
            looks_while_shielded = scope.looks
        steps.append("left the shield")
        await anyio.lowlevel.checkpoint()  # the very next wait is cancelled
        steps.append("after the checkpoint")
    assert steps == ["left the shield"]
    assert scope.cancelled_caught
    # Once when cancelled, not once for every turn of the event loop in 0.2 s.
    assert looks_while_shielded <= 2


@needs_uncancel
@pytest.mark.anyio
async def test_a_callers_cancel_already_pending_stays_the_callers() -> None:
    loop = asyncio.get_running_loop()
    scope = TaskScope(loop)
    with anyio.CancelScope() as outer:
        with scope:

            def both() -> None:
                outer.cancel()  # the caller's, while the task is ready to run
                scope.cancel()  # and this one in the same turn of the loop

            loop.call_soon(both)
            while True:
                await asyncio.sleep(0)  # never waits on a future
    assert outer.cancelled_caught
    assert not scope.cancelled_caught


@needs_uncancel
@pytest.mark.anyio
async def test_a_cancel_after_leaving_does_nothing_and_it_enters_once() -> None:
    scope = TaskScope(asyncio.get_running_loop())
    with scope:
        pass
    scope.cancel()
    await anyio.sleep(0)
    assert not scope.cancelled_caught
    with pytest.raises(RuntimeError, match="entered once"), scope:
        pass


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@needs_uncancel
@pytest.mark.anyio
async def test_the_factory_gives_the_backends_scope(anyio_backend: str) -> None:
    scope = run_scope_factory()()
    if anyio_backend == "trio":
        import trio

        assert isinstance(scope, trio.CancelScope)
    elif sys.version_info >= (3, 11):
        assert isinstance(scope, TaskScope)
    else:
        assert isinstance(scope, type(anyio.CancelScope()))
