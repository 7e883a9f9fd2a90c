"""One-shot wake-up signals for the bus and the loop, the cheapest for the running backend.

The dispatcher and the execution loop sleep on a signal and are woken by a
publish; they make one for every sleep, so :func:`signal_factory` looks up the
running library once and hands back a constructor: a signal bound to the
running asyncio loop, one of trio's own, or ``anyio.Event``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import Any, Protocol

import anyio

__all__ = ["Signal", "signal_factory"]


class Signal(Protocol):
    """A one-shot wake-up: on asyncio a signal bound to the loop, on trio ``trio.Event``."""

    def set(self) -> object: ...
    def is_set(self) -> bool: ...
    def wait(self) -> Awaitable[object]: ...


class _Done:
    """An awaitable that is done at once: the wait for a signal already set."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that yields nothing


_DONE = _Done()
#: Waits a signal keeps before it drops the cancelled ones.
_PRUNE_AT = 8


class _Wakeup:
    """A one-shot signal on asyncio: ``asyncio.Event`` without its lock, deque and lookups.

    ``asyncio.Event`` takes a global lock the first time each event is waited
    for, and looks up the running loop on every wait (a ``getpid`` system call
    each time). This one is bound to its loop when made. :meth:`wait` hands out
    the future itself, without a coroutine around it: a wait that is cancelled
    leaves its cancelled future behind, which :meth:`set` skips and a later
    wait drops once the waits have doubled since the last time.
    """

    __slots__ = ("_flag", "_loop", "_prune_at", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._flag = False
        self._waiters: list[asyncio.Future[None]] | None = None
        self._prune_at = _PRUNE_AT

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        waiters = self._waiters
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            waiters.clear()

    def is_set(self) -> bool:
        return self._flag

    def wait(self) -> Awaitable[None]:
        if self._flag:
            return _DONE
        waiter: asyncio.Future[None] = self._loop.create_future()
        waiters = self._waiters
        if waiters is None:
            self._waiters = [waiter]
        else:
            if len(waiters) >= self._prune_at:
                # Dropped when their number doubles: many waiting at once
                # (producers waiting for room) cost each wait O(1) on average.
                waiters[:] = [w for w in waiters if not w.done()]
                self._prune_at = max(_PRUNE_AT, 2 * len(waiters))
            waiters.append(waiter)
        return waiter


class _TrioWakeup:
    """A one-shot signal on trio: ``trio.Event`` without its parking lot.

    The waiting tasks are kept in a list and rescheduled by :meth:`set`; a
    wait that is cancelled takes its task out. Waiting on a set signal is a
    checkpoint, as ``trio.Event.wait`` is. ``trio.lowlevel`` is bound to the
    class by :func:`signal_factory`, on trio only.
    """

    __slots__ = ("_flag", "_tasks")

    lowlevel: Any = None

    def __init__(self) -> None:
        self._flag = False
        self._tasks: list[Any] = []

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        tasks = self._tasks
        if tasks:
            reschedule = self.lowlevel.reschedule
            for task in tasks:
                reschedule(task)
            tasks.clear()

    def is_set(self) -> bool:
        return self._flag

    async def wait(self) -> None:
        lowlevel = self.lowlevel
        if self._flag:
            await lowlevel.checkpoint()
            return
        task = lowlevel.current_task()
        tasks = self._tasks
        tasks.append(task)
        succeeded = lowlevel.Abort.SUCCEEDED

        def abort(raise_cancel: object) -> Any:
            tasks.remove(task)
            return succeeded

        await lowlevel.wait_task_rescheduled(abort)


def signal_factory() -> Callable[[], Signal]:
    """The cheapest one-shot event for the running backend.

    ``anyio.Event()`` looks up the running library on every creation; the bus
    and the loop create one for every sleep, so they look once. On asyncio, a
    signal bound to the running loop (anyio's cancellation reaches its wait
    like any other await); on trio, one of trio's own tasks and reschedules.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        try:
            import trio.lowlevel  # only when running on trio

            trio.lowlevel.current_task()
        except (ImportError, RuntimeError):  # no event loop at all: anyio says so when waited on
            return anyio.Event
        _TrioWakeup.lowlevel = trio.lowlevel
        return _TrioWakeup
    return partial(_Wakeup, loop)
