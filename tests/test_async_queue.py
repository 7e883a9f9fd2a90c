"""AsyncEventQueue on asyncio and trio: asyncio.Queue semantics over the Rust EventQueue."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import anyio
import pytest

from openstarry._asyncqueue import AsyncEventQueue
from openstarry._core import DedupWindow, Event, EventQueue, Ingestor
from openstarry.errors import OpenStarryError, QueueClosed, QueueEmpty, QueueFull

pytestmark = pytest.mark.anyio

#: Generous bound on a whole test's waiting; never a timing assertion.
TIMEOUT = 30


def event(priority: int) -> Event:
    return Event.new(
        "INPUT:USER_MESSAGE", {"text": "hi"}, source="t", session_id="s", priority=priority
    )


def drain(q: AsyncEventQueue[Any]) -> list[Any]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


# --- Construction and sizes -----------------------------------------------------------


async def test_unbounded_by_default() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    assert q.maxsize == 0
    assert q.empty()
    assert not q.full()
    assert q.qsize() == 0
    for i in range(1000):
        q.put_nowait(i, 3)
    assert q.qsize() == 1000
    assert not q.full()


@pytest.mark.parametrize("maxsize", [0, -1, -100])
async def test_maxsize_zero_or_less_is_unbounded(maxsize: int) -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(maxsize)
    assert q.maxsize == 0
    assert q.queue.capacity is None


async def test_bounded_sizes() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(2)
    assert q.maxsize == 2
    q.put_nowait("a", 1)
    assert (q.qsize(), q.empty(), q.full()) == (1, False, False)
    q.put_nowait("b", 1)
    assert (q.qsize(), q.empty(), q.full()) == (2, False, True)


async def test_passes_its_arguments_to_the_event_queue() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(5, overflow="shed", starvation_limit=3)
    assert isinstance(q.queue, EventQueue)
    assert (q.queue.capacity, q.queue.overflow, q.queue.starvation_limit) == (5, "shed", 3)


async def test_wraps_an_existing_queue() -> None:
    inner = EventQueue(capacity=3)
    inner.push("already there", 4)
    q: AsyncEventQueue[Any] = AsyncEventQueue(queue=inner)
    assert q.queue is inner
    assert q.maxsize == 3
    await q.put("new", 0)
    assert len(inner) == 2
    assert await q.get() == "new"
    assert await q.get() == "already there"
    # Items queued before wrapping count for join too.
    q.task_done()
    q.task_done()
    with pytest.raises(ValueError, match="task_done"):
        q.task_done()


@pytest.mark.parametrize("kwargs", [{"maxsize": 3}, {"overflow": "shed"}, {"starvation_limit": 2}])
async def test_queue_and_other_arguments_conflict(kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        AsyncEventQueue(queue=EventQueue(), **kwargs)


async def test_repr_names_the_state() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(4)
    q.put_nowait("a", 1)
    text = repr(q)
    assert "AsyncEventQueue" in text
    assert "maxsize=4" in text
    assert "qsize=1" in text


# --- Order ----------------------------------------------------------------------------


async def test_get_serves_by_priority_then_fifo() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    pushes = [(5, "a"), (0, "b"), (3, "c"), (0, "d"), (1, "e"), (5, "f")]
    for priority, name in pushes:
        await q.put(name, priority)
    got = [await q.get() for _ in pushes]
    assert got == ["b", "d", "e", "c", "a", "f"]


async def test_an_event_takes_its_own_priority() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    low, high, mid = event(5), event(0), event(2)
    await q.put(low)
    q.put_nowait(high)
    await q.put(mid)
    assert [await q.get() for _ in range(3)] == [high, mid, low]
    await q.put(low, 0)  # an explicit priority wins
    await q.put(high)
    assert q.get_nowait() is low


async def test_put_validates_like_the_event_queue() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    with pytest.raises(TypeError):
        await q.put("not an event")
    with pytest.raises(TypeError):
        q.put_nowait(None, 1)
    with pytest.raises(ValueError, match="priority"):
        await q.put("x", 6)
    assert q.empty()


async def test_starvation_limit_applies_to_get() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(starvation_limit=2)
    await q.put("low", 5)
    for i in range(4):
        await q.put(i, 0)
    assert [await q.get() for _ in range(5)] == [0, 1, "low", 2, 3]


# --- Nowait errors --------------------------------------------------------------------


async def test_put_nowait_on_a_full_queue_raises_queue_full() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(1)
    q.put_nowait("a", 0)
    with pytest.raises(asyncio.QueueFull) as info:
        q.put_nowait("b", 0)
    assert isinstance(info.value, QueueFull)
    assert isinstance(info.value, OpenStarryError)
    assert q.qsize() == 1


async def test_get_nowait_on_an_empty_queue_raises_queue_empty() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    with pytest.raises(asyncio.QueueEmpty) as info:
        q.get_nowait()
    assert isinstance(info.value, QueueEmpty)
    assert isinstance(info.value, OpenStarryError)


# --- Waiting --------------------------------------------------------------------------


async def test_get_waits_until_a_put() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    got: list[Any] = []

    async def getter() -> None:
        got.append(await q.get())

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter)
            await anyio.wait_all_tasks_blocked()
            assert got == []
            await q.put("x", 2)
    assert got == ["x"]
    assert q.empty()


async def test_put_waits_while_full_and_resumes_after_a_get() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(1)
    await q.put("a", 0)
    done: list[str] = []

    async def putter() -> None:
        await q.put("b", 0)
        done.append("b")

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(putter)
            await anyio.wait_all_tasks_blocked()
            assert done == []
            assert q.qsize() == 1
            assert await q.get() == "a"
        assert done == ["b"]
        assert await q.get() == "b"


async def test_waiting_getters_are_served_in_arrival_order() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    got: list[tuple[int, Any]] = []

    async def getter(n: int) -> None:
        got.append((n, await q.get()))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(getter, n)
                await anyio.wait_all_tasks_blocked()
            for item in "abcd":
                await q.put(item, 3)
                await anyio.wait_all_tasks_blocked()
    assert got == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]


async def test_waiting_putters_are_served_in_arrival_order() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(1)
    await q.put("first", 0)

    async def putter(n: int) -> None:
        await q.put(n, 0)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(putter, n)
                await anyio.wait_all_tasks_blocked()
            got = []
            for _ in range(5):
                got.append(await q.get())
                await anyio.wait_all_tasks_blocked()
    assert got == ["first", 0, 1, 2, 3]


async def test_shed_put_never_waits_and_returns_what_was_dropped() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(2, overflow="shed")
    assert await q.put("a", 1) is None
    assert await q.put("b", 4) is None
    assert await q.put("c", 0) == "b"
    assert await q.put("d", 5) == "d"
    assert q.put_nowait("e", 5) == "e"
    assert q.queue.shed_count == 3
    assert drain(q) == ["c", "a"]


# --- Cancellation ---------------------------------------------------------------------


async def test_a_cancelled_getter_loses_no_item() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    got: list[Any] = []

    async def getter(scope: anyio.CancelScope) -> None:
        with scope:
            got.append(await q.get())

    first, second = anyio.CancelScope(), anyio.CancelScope()
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter, first)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(getter, second)
            await anyio.wait_all_tasks_blocked()
            first.cancel()
            await anyio.wait_all_tasks_blocked()
            await q.put("x", 1)
    assert got == ["x"]
    assert second.cancel_called is False
    assert q.empty()


async def test_a_getter_cancelled_after_its_wake_up_passes_it_on() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    got: list[Any] = []
    closed: list[int] = []

    async def getter(n: int, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                got.append(await q.get())
            except QueueClosed:
                closed.append(n)

    first, second = anyio.CancelScope(), anyio.CancelScope()
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter, 1, first)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(getter, 2, second)
            await anyio.wait_all_tasks_blocked()
            # Wake the first getter and cancel it before it runs.
            q.put_nowait("x", 1)
            first.cancel()
            await anyio.wait_all_tasks_blocked()
            q.close()
    # The item went to exactly one getter: the first if it ran before the
    # cancellation landed (trio may let it), otherwise the second.
    assert got == ["x"]
    assert closed in ([], [2])
    assert q.empty()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_asyncio_getter_cancelled_after_its_wake_up_passes_it_on() -> None:
    # Task.cancel() lands even when the wake-up already arrived (anyio's cancel
    # scopes wait for the next checkpoint instead), so this is the sure way to
    # take the pass-on path.
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    with anyio.fail_after(TIMEOUT):
        first = asyncio.ensure_future(q.get())
        await anyio.wait_all_tasks_blocked()
        second = asyncio.ensure_future(q.get())
        await anyio.wait_all_tasks_blocked()
        q.put_nowait("x", 1)  # wakes the first getter...
        first.cancel()  # ...which is cancelled before it runs
        assert await second == "x"
        with pytest.raises(asyncio.CancelledError):
            await first
    assert q.empty()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_asyncio_putter_cancelled_after_its_wake_up_passes_it_on() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(1)
    q.put_nowait("a", 0)
    with anyio.fail_after(TIMEOUT):
        first = asyncio.ensure_future(q.put("b", 0))
        await anyio.wait_all_tasks_blocked()
        second = asyncio.ensure_future(q.put("c", 0))
        await anyio.wait_all_tasks_blocked()
        assert q.get_nowait() == "a"  # wakes the first putter...
        first.cancel()  # ...which is cancelled before it runs
        assert await second is None
        with pytest.raises(asyncio.CancelledError):
            await first
    assert drain(q) == ["c"]


async def test_a_cancelled_putter_loses_no_wake_up() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(1)
    await q.put("a", 0)
    put: list[str] = []

    async def putter(item: str, scope: anyio.CancelScope) -> None:
        with scope:
            await q.put(item, 0)
            put.append(item)

    first, second = anyio.CancelScope(), anyio.CancelScope()
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(putter, "b", first)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(putter, "c", second)
            await anyio.wait_all_tasks_blocked()
            assert q.get_nowait() == "a"  # wakes the first putter...
            first.cancel()  # ...which is cancelled before it runs
            await anyio.wait_all_tasks_blocked()
            if not put:  # the wake-up went on to the second putter
                assert q.qsize() == 1
            else:  # the first put landed before the cancellation
                q.get_nowait()
                await anyio.wait_all_tasks_blocked()
    assert len(put) in (1, 2)
    assert put[-1] == "c"
    assert q.get_nowait() == "c"


async def test_many_cancelled_getters_then_items() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    got: list[Any] = []
    scopes = [anyio.CancelScope() for _ in range(10)]

    async def getter(scope: anyio.CancelScope) -> None:
        with scope:
            got.append(await q.get())

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for scope in scopes:
                tg.start_soon(getter, scope)
            await anyio.wait_all_tasks_blocked()
            for i, scope in enumerate(scopes):
                if i % 2 == 0:
                    scope.cancel()
            for i in range(5):
                q.put_nowait(i, 2)
            await anyio.wait_all_tasks_blocked()
    assert sorted(got) == [0, 1, 2, 3, 4]


# --- Task accounting ------------------------------------------------------------------


async def test_join_returns_at_once_when_nothing_is_unfinished() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    with anyio.fail_after(TIMEOUT):
        await q.join()


async def test_join_waits_for_every_task_done() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    for i in range(3):
        await q.put(i, 1)
    joined: list[bool] = []

    async def joiner() -> None:
        await q.join()
        joined.append(True)

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(joiner)
            tg.start_soon(joiner)
            for _ in range(3):
                await anyio.wait_all_tasks_blocked()
                assert joined == []
                await q.get()
                await anyio.wait_all_tasks_blocked()
                assert joined == []  # got, but not yet done
                q.task_done()
    assert joined == [True, True]
    with pytest.raises(ValueError, match="too many"):
        q.task_done()


async def test_task_done_too_many_times() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    with pytest.raises(ValueError, match="task_done"):
        q.task_done()
    await q.put("a", 0)
    await q.get()
    q.task_done()
    with pytest.raises(ValueError, match="task_done"):
        q.task_done()


async def test_a_shed_item_counts_as_done() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(1, overflow="shed")
    await q.put("a", 5)
    assert await q.put("b", 0) == "a"
    assert await q.put("c", 3) == "c"
    assert await q.get() == "b"
    q.task_done()
    with anyio.fail_after(TIMEOUT):
        await q.join()
    with pytest.raises(ValueError, match="task_done"):
        q.task_done()


# --- Close ----------------------------------------------------------------------------


async def test_close_lets_consumers_drain_then_raises() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    await q.put("a", 3)
    await q.put("b", 1)
    q.close()
    assert q.closed
    assert q.queue.closed
    with pytest.raises(QueueClosed):
        await q.put("c", 0)
    with pytest.raises(QueueClosed):
        q.put_nowait("c", 0)
    assert await q.get() == "b"
    assert q.get_nowait() == "a"
    with pytest.raises(QueueClosed):
        await q.get()
    with pytest.raises(QueueClosed):
        q.get_nowait()


async def test_close_wakes_waiting_getters_and_putters() -> None:
    empty: AsyncEventQueue[Any] = AsyncEventQueue()
    full: AsyncEventQueue[Any] = AsyncEventQueue(1)
    await full.put("x", 0)
    outcomes: list[str] = []

    async def getter() -> None:
        with pytest.raises(QueueClosed):
            await empty.get()
        outcomes.append("get")

    async def putter() -> None:
        with pytest.raises(QueueClosed):
            await full.put("y", 0)
        outcomes.append("put")

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(getter)
                tg.start_soon(putter)
            await anyio.wait_all_tasks_blocked()
            empty.close()
            full.close()
    assert sorted(outcomes) == ["get"] * 3 + ["put"] * 3
    assert full.get_nowait() == "x"  # what was queued survives the close


# --- Many tasks -----------------------------------------------------------------------


@pytest.mark.parametrize("maxsize", [0, 1, 16])
async def test_many_producers_and_consumers_count_every_item_once(maxsize: int) -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(maxsize)
    producers, consumers, per_producer = 5, 4, 400
    rng = random.Random(maxsize)
    priorities = [[rng.randrange(6) for _ in range(per_producer)] for _ in range(producers)]
    got: list[list[tuple[int, int]]] = [[] for _ in range(consumers)]

    async def produce(p: int) -> None:
        for i, priority in enumerate(priorities[p]):
            if i % 3 == 0:
                try:
                    q.put_nowait((p, i), priority)
                    continue
                except QueueFull:
                    pass
            await q.put((p, i), priority)

    async def consume(c: int) -> None:
        while True:
            try:
                item = await q.get()
            except QueueClosed:
                return
            got[c].append(item)
            q.task_done()
            if len(got[c]) % 7 == 0:
                await anyio.sleep(0)  # let other tasks interleave

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            for c in range(consumers):
                tg.start_soon(consume, c)
            async with anyio.create_task_group() as ptg:
                for p in range(producers):
                    ptg.start_soon(produce, p)
            await q.join()
            q.close()
    everything = Counter(item for items in got for item in items)
    assert everything == Counter((p, i) for p in range(producers) for i in range(per_producer))
    # Each lane is FIFO: what one consumer saw of one producer's lane is in order.
    for items in got:
        last: dict[tuple[int, int], int] = {}
        for p, i in items:
            key = (p, priorities[p][i])
            assert last.get(key, -1) < i
            last[key] = i


# --- Plain event loops ----------------------------------------------------------------


async def _ping_pong() -> list[Any]:
    """A consumer and a producer through a queue of one slot, on whatever loop runs this."""
    q: AsyncEventQueue[Any] = AsyncEventQueue(1)
    got: list[Any] = []

    async def consume() -> None:
        while True:
            try:
                got.append(await q.get())
            except QueueClosed:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        for i, p in enumerate([3, 0, 5, 1, 2]):
            await q.put(i, p)
        await anyio.wait_all_tasks_blocked()
        q.close()
    return got


def test_works_under_plain_asyncio_run() -> None:
    assert asyncio.run(_ping_pong()) == [0, 1, 2, 3, 4]


def test_works_under_plain_trio_run() -> None:
    import trio

    assert trio.run(_ping_pong) == [0, 1, 2, 3, 4]


# --- Without anyio --------------------------------------------------------------------


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_works_on_asyncio_without_anyio() -> None:
    out = run_python(
        """
        import sys
        sys.modules["anyio"] = None  # makes `import anyio` raise ImportError

        import asyncio
        import openstarry._asyncqueue as m
        from openstarry._asyncqueue import AsyncEventQueue
        from openstarry.errors import QueueClosed

        async def main():
            q: AsyncEventQueue[Any] = AsyncEventQueue(1)
            got = []

            async def consume():
                while True:
                    try:
                        got.append(await q.get())
                    except QueueClosed:
                        return
                    q.task_done()

            task = asyncio.create_task(consume())
            for i, p in enumerate([3, 0, 5, 1]):
                await q.put(i, p)  # waits while full
            await asyncio.wait_for(q.join(), 30)
            q.close()
            await asyncio.wait_for(task, 30)
            assert got == [0, 1, 2, 3], got
            assert m._waker_factory is asyncio.Event, m._waker_factory

        asyncio.run(main())
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_importing_does_not_import_anyio() -> None:
    out = run_python(
        """
        import sys
        import openstarry
        before = "anyio" in sys.modules
        import openstarry._asyncqueue
        print(("anyio" in sys.modules) == before)
        """
    )
    assert out.strip() == "True"


# ----------------------------------------------------------- ingestion, fairness, typing

LINE = (
    b'{"id":"e1","timestamp":1,"traceId":"t","source":"s","sessionId":"x",'
    b'"priority":2,"type":"INPUT:SIGNAL","payload":null}\n'
)


async def test_ingest_wakes_a_waiting_get_and_counts_for_join() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue(100)
    ingestor = Ingestor(q.queue, DedupWindow())
    got: list[Any] = []

    async def consumer() -> None:
        got.append(await q.get())
        q.task_done()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer)
            await anyio.wait_all_tasks_blocked()
            result = q.ingest(ingestor, LINE)
            assert result.accepted == 1
        await q.join()
    assert [e.id for e in got] == ["e1"]


async def test_ingest_refuses_an_ingestor_of_another_queue() -> None:
    with pytest.raises(ValueError, match="another queue"):
        AsyncEventQueue().ingest(Ingestor(EventQueue()), LINE)


async def test_woken_getters_that_lose_their_items_keep_their_turns() -> None:
    q: AsyncEventQueue[Any] = AsyncEventQueue()
    order: list[tuple[int, Any]] = []

    async def getter(n: int) -> None:
        order.append((n, await q.get()))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for n in (1, 2, 3):
                tg.start_soon(getter, n)
                await anyio.wait_all_tasks_blocked()
            q.put_nowait("a", 0)
            q.put_nowait("b", 0)  # wakes getters 1 and 2 ...
            q.get_nowait()
            q.get_nowait()  # ... whose items this task takes first
            await anyio.wait_all_tasks_blocked()
            for item in "xyz":
                q.put_nowait(item, 0)
                await anyio.wait_all_tasks_blocked()
    assert order == [(1, "x"), (2, "y"), (3, "z")]


def test_is_generic_like_asyncio_queue() -> None:
    q: AsyncEventQueue[str] = AsyncEventQueue[str]()
    q.put_nowait("x", 1)
    assert q.get_nowait() == "x"
