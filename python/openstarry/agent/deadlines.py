"""Call deadlines: one watcher task for every provider and tool call, no timer per call.

A provider call must answer within ``provider_timeout`` seconds, or its run ends
with ``PROVIDER_TIMEOUT``; a tool call within ``tool_timeout``, or it is
cancelled and fails with ``TIMEOUT``. Arming a timer for every call (a cancel
scope's deadline) costs a timer handle set and cancelled each time; here a call
costs a heap push and two attribute writes:

- :meth:`Deadlines.begin` records the call's deadline and tags what it watches
  (a :class:`Watched`: a session's run, a tool call) with the call's number;
  :meth:`Deadlines.end` clears the tag.
- One watcher task sleeps until the earliest deadline. A deadline whose call
  has ended is dropped; one whose call is still running cancels the watched
  scope (the run then reports the timeout, the tool call its ``TIMEOUT``).
  Under steady traffic it wakes about once per (shortest) timeout, whatever
  the rate of calls.

Finished calls are dropped from the heap as new ones come, so it holds about
one entry per call in progress; it is rebuilt without them if it grows past
twice that (a hung call at the top keeping many finished ones behind it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from openstarry.bus import Signal

__all__ = ["Deadlines", "ToolCallWatch", "Watched"]


class _Cancellable(Protocol):
    def cancel(self, reason: str | None = None) -> None: ...


class Watched(Protocol):
    """What a deadline watches: the number of its call in progress, and the scope to cancel."""

    calling: int

    @property
    def scope(self) -> _Cancellable | None: ...


class ToolCallWatch:
    """One tool call's :class:`Watched`: the cancel scope it runs in."""

    __slots__ = ("calling", "scope")

    def __init__(self, scope: Any) -> None:
        self.calling = 0
        self.scope = scope


#: Below this many entries the heap is never rebuilt.
_COMPACT_FLOOR = 64


class Deadlines:
    """The deadlines of the provider calls in progress, and the task that enforces them.

    Args:
        clock: The clock deadlines are read on (the event loop's time).
    """

    __slots__ = (
        "_active",
        "_began",
        "_clock",
        "_heap",
        "_idle",
        "_new_signal",
        "_next",
        "_shortest",
        "_sleep",
    )

    def __init__(self, clock: Callable[[], float] = anyio.current_time) -> None:
        self._clock = clock
        # (deadline, call number, watched): a call is in progress while its
        # watched ``calling`` is its number.
        self._heap: list[tuple[float, int, Watched]] = []
        self._next = 0
        self._active = 0
        #: The shortest timeout seen: the watcher never sleeps longer.
        self._shortest = math.inf
        #: A call began since the watcher last looked.
        self._began = False
        #: The watcher waits on it when there is nothing to watch.
        self._idle: Signal | None = None
        #: The watcher's sleep, cancelled when an earlier deadline comes in.
        self._sleep: tuple[float, anyio.CancelScope] | None = None
        self._new_signal: Callable[[], Signal] = anyio.Event

    def begin(self, rt: Watched, timeout: float) -> None:
        """A call watched by ``rt`` starts now; it must end within ``timeout`` s."""
        heap = self._heap
        # Drop the calls that have ended from the top (usually this session's last one).
        while heap and heap[0][2].calling != heap[0][1]:
            heapq.heappop(heap)
        self._next = number = self._next + 1
        rt.calling = number
        self._active += 1
        deadline = self._clock() + timeout
        if timeout < self._shortest:
            self._shortest = timeout
        self._began = True
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
                sleep[1].cancel()  # a timeout shorter than any before

    def end(self, rt: Watched) -> None:
        """The call watched by ``rt`` has ended (answered, failed or cancelled)."""
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
                while heap and heap[0][2].calling != heap[0][1]:
                    heapq.heappop(heap)  # ended
                if not heap and not self._began:
                    # Nothing began for a whole period: wait for the next call.
                    idle = self._idle = new_signal()
                    await idle.wait()
                    continue
                self._began = False
                now = clock()
                deadline = heap[0][0] if heap else math.inf
                if now < deadline:
                    # Never longer than the shortest timeout: any call that
                    # starts meanwhile ends after this wake-up, so the sleep is
                    # not cut short for it (see begin). While calls keep coming
                    # (most end before this task runs again) it wakes once per
                    # that timeout, not once per call.
                    wake = min(deadline, now + self._shortest)
                    with anyio.CancelScope(deadline=wake) as sleep:
                        self._sleep = (wake, sleep)
                        await anyio.sleep_forever()
                    self._sleep = None
                    continue
                deadline, number, rt = heapq.heappop(heap)
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
