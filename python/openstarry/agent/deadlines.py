"""Call deadlines: one watcher task for every provider and tool call, no timer per call.

A provider call must answer within ``provider_timeout`` seconds, or its run ends
with ``PROVIDER_TIMEOUT``; a tool call within ``tool_timeout``, or it is
cancelled and fails with ``TIMEOUT``. Arming a timer for every call (a cancel
scope's deadline) costs a timer handle set and cancelled each time; here a call
costs a clock read, an attribute write and a set insertion and removal:

- :meth:`Deadlines.begin` records the call's deadline on what it watches (a
  :class:`Watched`: a session's run, a tool call) and adds it to the calls in
  progress; :meth:`Deadlines.end` removes it.
- One watcher task wakes at the earliest deadline of the calls in progress,
  but never later than the shortest timeout seen from when it went to sleep,
  so a call that begins meanwhile never needs to wake it (its deadline is
  later). Awake, it cancels the watched scope of every call past its deadline
  (the run then reports the timeout, the tool call its ``TIMEOUT``). Under
  steady traffic it wakes about once per shortest timeout, whatever the rate
  of calls; with no call for a whole period it sleeps until the next one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from openstarry.bus import Signal

__all__ = ["Deadlines", "ToolCallWatch", "Watched", "clock_of_backend"]


class _Cancellable(Protocol):
    def cancel(self, reason: str | None = None) -> None: ...


class Watched(Protocol):
    """What a deadline watches: the deadline of its call in progress, and the scope to cancel.

    ``cancelled`` is set when the watcher cancels the scope.
    """

    deadline: float
    cancelled: bool

    @property
    def scope(self) -> _Cancellable | None: ...


class ToolCallWatch:
    """One tool call's :class:`Watched`: the cancel scope it runs in (and whether
    the watcher cancelled it, which the call's scope also says)."""

    __slots__ = ("cancelled", "deadline", "scope")

    def __init__(self, scope: Any) -> None:
        self.deadline = math.inf
        self.scope = scope
        self.cancelled = False


class Deadlines:
    """The deadlines of the calls in progress, and the task that enforces them.

    Args:
        clock: The clock deadlines are read on (the event loop's time).
    """

    __slots__ = ("_active", "_began", "_clock", "_idle", "_shortest", "_sleep")

    def __init__(self, clock: Callable[[], float] = anyio.current_time) -> None:
        self._clock = clock
        #: The calls in progress.
        self._active: set[Watched] = set()
        #: The shortest timeout seen: the watcher never sleeps longer.
        self._shortest = math.inf
        #: A call began since the watcher last looked.
        self._began = False
        #: The watcher waits on it when there is nothing to watch.
        self._idle: Signal | None = None
        #: The watcher's sleep: until when, and the scope that ends it early.
        self._sleep: tuple[float, anyio.CancelScope] | None = None

    def begin(self, watched: Watched, timeout: float) -> None:
        """A call watched by ``watched`` starts now; it must end within ``timeout`` s."""
        watched.deadline = deadline = self._clock() + timeout
        self._active.add(watched)
        self._began = True
        if timeout < self._shortest:
            self._shortest = timeout
            sleep = self._sleep
            if sleep is not None and deadline < sleep[0]:
                sleep[1].cancel()  # a timeout shorter than any before
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    def end(self, watched: Watched) -> None:
        """The call watched by ``watched`` has ended (answered, failed or cancelled)."""
        self._active.discard(watched)

    async def watch(self, new_signal: Callable[[], Signal]) -> None:
        """Cancel every call still in progress at its deadline; runs until cancelled."""
        active = self._active
        clock = self._clock
        try:
            while True:
                if not active and not self._began:
                    # Nothing began for a whole period: wait for the next call.
                    idle = self._idle = new_signal()
                    await idle.wait()
                    continue
                self._began = False
                now = clock()
                earliest = math.inf
                for watched in list(active):
                    if watched.deadline <= now:
                        active.discard(watched)
                        scope = watched.scope
                        if scope is not None:
                            watched.cancelled = True
                            scope.cancel()
                    elif watched.deadline < earliest:
                        earliest = watched.deadline
                wake = min(earliest, now + self._shortest)
                with anyio.CancelScope(deadline=wake) as sleep:
                    self._sleep = (wake, sleep)
                    await anyio.sleep_forever()
                self._sleep = None
        finally:
            self._idle = None
            self._sleep = None

    def __len__(self) -> int:
        """Calls in progress."""
        return len(self._active)


def clock_of_backend() -> Callable[[], float]:
    """The clock cancel-scope deadlines are read on: ``anyio.current_time``, looked up once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import trio  # only when running on trio

        # What anyio's trio backend reads (trio.current_time), without the
        # two frames between it and the run's clock.
        return trio.lowlevel.current_clock().current_time
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic  # what that loop's time() returns, without its frame
    return loop.time  # what anyio's asyncio backend reads
