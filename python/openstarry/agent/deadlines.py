"""Provider-call deadlines: one watcher task for every session, no timer per call.

A provider call must answer within ``provider_timeout`` seconds, or its run ends
with ``PROVIDER_TIMEOUT``. Arming a timer for every call (a cancel scope's
deadline) costs a timer handle set and cancelled twice a round; here a call
costs a heap push and two attribute writes:

- :meth:`Deadlines.begin` records the call's deadline and tags its session
  with the call's number; :meth:`Deadlines.end` clears the tag.
- One watcher task sleeps until the earliest deadline. A deadline whose call
  has ended is dropped; one whose call is still running cancels its session's
  run scope (the run then reports the timeout). Under steady traffic it wakes
  about once per timeout, whatever the rate of calls.

Finished calls are dropped from the heap as new ones come, so it holds about
one entry per call in progress; it is rebuilt without them if it grows past
twice that (a hung call at the top keeping many finished ones behind it).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from openstarry.bus import Signal

if TYPE_CHECKING:
    from openstarry.agent.sessions import SessionRuntime

__all__ = ["Deadlines"]

#: Below this many entries the heap is never rebuilt.
_COMPACT_FLOOR = 64


class Deadlines:
    """The deadlines of the provider calls in progress, and the task that enforces them.

    Args:
        clock: The clock deadlines are read on (the event loop's time).
    """

    __slots__ = ("_active", "_clock", "_heap", "_idle", "_new_signal", "_next", "_sleep")

    def __init__(self, clock: Callable[[], float] = anyio.current_time) -> None:
        self._clock = clock
        # (deadline, call number, session): a call is in progress while its
        # session's ``calling`` is its number.
        self._heap: list[tuple[float, int, SessionRuntime]] = []
        self._next = 0
        self._active = 0
        #: The watcher waits on it when there is nothing to watch.
        self._idle: Signal | None = None
        #: The watcher's sleep, cancelled when an earlier deadline comes in.
        self._sleep: tuple[float, anyio.CancelScope] | None = None
        self._new_signal: Callable[[], Signal] = anyio.Event

    def begin(self, rt: SessionRuntime, timeout: float) -> None:
        """A provider call of ``rt``'s run starts now; it must end within ``timeout`` s."""
        heap = self._heap
        # Drop the calls that have ended from the top (usually this session's last one).
        while heap and heap[0][2].calling != heap[0][1]:
            heapq.heappop(heap)
        self._next = number = self._next + 1
        rt.calling = number
        self._active += 1
        deadline = self._clock() + timeout
        heapq.heappush(heap, (deadline, number, rt))
        if len(heap) > _COMPACT_FLOOR and len(heap) > 2 * self._active:
            heap[:] = [entry for entry in heap if entry[2].calling == entry[1]]
            heapq.heapify(heap)
        if self._idle is not None:
            self._idle.set()
            self._idle = None
        else:
            sleep = self._sleep
            if sleep is not None and deadline < sleep[0]:
                sleep[1].cancel()  # a shorter timeout than the one it sleeps for

    def end(self, rt: SessionRuntime) -> None:
        """The provider call of ``rt``'s run has ended (answered, failed or cancelled)."""
        if rt.calling:
            rt.calling = 0
            self._active -= 1

    async def watch(self, new_signal: Callable[[], Signal]) -> None:
        """Cancel the run of every call still in progress at its deadline; runs until cancelled."""
        self._new_signal = new_signal
        heap = self._heap
        clock = self._clock
        try:
            while True:
                if not heap:
                    idle = self._idle = new_signal()
                    await idle.wait()
                    continue
                # The top's deadline, whether its call has ended or not: popping
                # ended calls here would leave the heap empty after every quick
                # call and wake this task for the next one.
                deadline, number, rt = heap[0]
                if clock() < deadline:
                    with anyio.CancelScope(deadline=deadline) as scope:
                        self._sleep = (deadline, scope)
                        await anyio.sleep_forever()
                    self._sleep = None
                    continue
                heapq.heappop(heap)
                if rt.calling == number:
                    self.end(rt)
                    scope = rt.scope
                    if scope is not None:
                        scope.cancel()
        finally:
            self._idle = None
            self._sleep = None

    def __len__(self) -> int:
        """Provider calls in progress."""
        return self._active
