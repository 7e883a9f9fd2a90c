"""An ``asyncio.Queue``-style face for the Rust :class:`~openstarry.core.EventQueue`.

:class:`AsyncEventQueue` keeps the method names and semantics of
:class:`asyncio.Queue`, so a framework can swap its queue for this one, and adds
what the Rust queue brings: priorities 0..5, an overflow policy, aging, and a
close that lets consumers drain and stop.

It runs on asyncio and, through anyio, on trio. It imports nothing beyond the
standard library: its wake-up events are ``anyio.Event`` when anyio can be
imported and ``asyncio.Event`` otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Literal, Protocol, TypeVar

from openstarry._core import EventQueue, Ingestor, IngestResult
from openstarry.errors import QueueClosed, QueueEmpty, QueueFull

__all__ = ["AsyncEventQueue"]

T = TypeVar("T")


class _Waker(Protocol):
    """The part of ``anyio.Event`` and ``asyncio.Event`` this module uses."""

    def set(self) -> object: ...
    def is_set(self) -> bool: ...
    def wait(self) -> Awaitable[object]: ...


_waker_factory: Callable[[], _Waker] | None = None


def _new_waker() -> _Waker:
    """A one-shot wake-up event for the running event loop.

    anyio is imported here, on first use, rather than at module import, so that
    ``openstarry.core`` imports with the standard library alone.
    """
    global _waker_factory
    factory = _waker_factory
    if factory is None:
        try:
            import anyio
        except ImportError:
            # Without anyio only asyncio can be running: the stdlib event is the
            # one primitive available, and the ruff ban (which steers the rest of
            # openstarry to anyio) does not apply to this fallback.
            factory = asyncio.Event  # noqa: TID251
        else:
            factory = anyio.Event
        _waker_factory = factory
    return factory()


#: A waiter in line: its ticket (the order it first started waiting in) and its wake-up.
_Waiter = tuple[int, _Waker]
_tickets = itertools.count()


def _wake_next(waiters: deque[_Waiter]) -> None:
    """Wake the longest-waiting waiter, if any."""
    if waiters:
        waiters.popleft()[1].set()


async def _wait(waiters: deque[_Waiter], ticket: int | None) -> int:
    """Wait in line in ``waiters`` until woken; returns the waiter's ticket.

    A first wait (``ticket`` None) joins the end of the line. A waiter that was
    woken but lost its item to another task waits again with its ticket, back
    in the place its ticket gives it, so waiters keep their turns. A waiter
    cancelled after being woken passes its wake-up to the next one, so no
    wake-up is lost.
    """
    waiter = (next(_tickets) if ticket is None else ticket, _new_waker())
    if ticket is None or not waiters or waiters[-1][0] < ticket:
        waiters.append(waiter)
    else:
        # Rare: several woken waiters lost their items. Keep the line in ticket order.
        at = next(i for i, (t, _) in enumerate(waiters) if t > ticket)
        waiters.insert(at, waiter)
    try:
        await waiter[1].wait()
    except BaseException:
        try:
            waiters.remove(waiter)
        except ValueError:
            # Already woken: hand the wake-up on.
            _wake_next(waiters)
        raise
    return waiter[0]


class AsyncEventQueue(Generic[T]):
    """An ``asyncio.Queue``-compatible priority queue over the Rust ``EventQueue``.

    Items are served by priority (0 first), first in first out within a
    priority. ``put`` and ``get`` wait as :class:`asyncio.Queue`'s do; waiters
    are woken in the order they started waiting, and a cancelled waiter passes
    its wake-up on, so no item and no wake-up is lost.

    Like :class:`asyncio.Queue`, this wrapper belongs to one event loop and is
    not thread-safe; the underlying :attr:`queue` is. Wake-ups come from this
    wrapper's own methods: an item that a thread pushes into :attr:`queue`
    directly does not wake a waiting :meth:`get` (it is found by the next
    ``get``). To feed the queue from threads, consume it from threads too, with
    ``EventQueue.pop(timeout)``, or poll with :meth:`get_nowait`. Likewise, close
    it with :meth:`close`, not ``queue.close()``, so that waiters wake up, and
    feed it from an ``Ingestor`` through :meth:`ingest`.

    Task accounting (:meth:`task_done`, :meth:`join`) counts the items queued
    when the wrapper was made and those put through it; an item dropped by the
    ``"shed"`` policy counts as done, since nobody will get it.

    Args:
        maxsize: At most this many items; ``0`` or less for no bound.
        overflow: When full, ``"reject"`` makes :meth:`put` wait and
            :meth:`put_nowait` raise :class:`~openstarry.errors.QueueFull`;
            ``"shed"`` drops the lowest-priority, newest item (possibly the one
            being put) and returns it from the put, which never waits.
        starvation_limit: When set, a non-empty priority that has been passed
            over by this many consecutive gets is served next.
        queue: An existing ``EventQueue`` to wrap instead of making one; then
            the other arguments must keep their defaults.

    Raises:
        TypeError: ``queue`` given together with another argument.
    """

    def __init__(
        self,
        maxsize: int = 0,
        *,
        overflow: Literal["reject", "shed"] = "reject",
        starvation_limit: int | None = None,
        queue: EventQueue | None = None,
    ) -> None:
        if queue is None:
            queue = EventQueue(
                maxsize if maxsize > 0 else None,
                overflow=overflow,
                starvation_limit=starvation_limit,
            )
        elif maxsize != 0 or overflow != "reject" or starvation_limit is not None:
            raise TypeError("pass either queue or maxsize/overflow/starvation_limit, not both")
        self._queue = queue
        self._getters: deque[_Waiter] = deque()
        self._putters: deque[_Waiter] = deque()
        self._unfinished_tasks = len(queue)
        self._finished: _Waker | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} maxsize={self.maxsize} qsize={self.qsize()}"
            f" overflow={self._queue.overflow!r} closed={self._queue.closed}"
            f" getters={len(self._getters)} putters={len(self._putters)}"
            f" unfinished={self._unfinished_tasks}>"
        )

    @property
    def queue(self) -> EventQueue:
        """The underlying thread-safe ``EventQueue``."""
        return self._queue

    @property
    def maxsize(self) -> int:
        """The capacity; ``0`` when unbounded."""
        capacity = self._queue.capacity
        return 0 if capacity is None else capacity

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._queue.closed

    def qsize(self) -> int:
        """The number of items queued."""
        return len(self._queue)

    def empty(self) -> bool:
        """Whether no item is queued."""
        return not self._queue

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items (never, when unbounded)."""
        capacity = self._queue.capacity
        return capacity is not None and len(self._queue) >= capacity

    def put_nowait(self, item: T, priority: int | None = None) -> T | None:
        """Queue ``item`` without waiting; an ``Event`` takes its own priority by default.

        Returns:
            ``None``, or under the ``"shed"`` policy the item dropped to make room
            (possibly ``item`` itself).

        Raises:
            QueueFull: full under the ``"reject"`` policy (an :class:`asyncio.QueueFull`).
            QueueClosed: after :meth:`close`.
            ValueError: a priority outside 0..5.
            TypeError: ``item`` is ``None``, or not an ``Event`` and no priority given.
        """
        # Everything in the queue came in through put (typed T) or was there
        # when the wrapper was made (the caller's promise, by choosing T).
        shed: T | None = self._queue.push(item, priority)
        if shed is None:
            self._unfinished_tasks += 1
        # Under "shed" one item went in and one came out: the count is unchanged.
        _wake_next(self._getters)
        return shed

    async def put(self, item: T, priority: int | None = None) -> T | None:
        """Queue ``item``, waiting while the queue is full under the ``"reject"`` policy.

        Returns:
            As :meth:`put_nowait`.

        Raises:
            QueueClosed: the queue is closed, or gets closed while waiting.
        """
        ticket = None
        while True:
            try:
                return self.put_nowait(item, priority)
            except QueueFull:
                pass
            ticket = await _wait(self._putters, ticket)

    def get_nowait(self) -> T:
        """The next item, without waiting.

        Raises:
            QueueEmpty: no item is queued (an :class:`asyncio.QueueEmpty`).
            QueueClosed: no item is queued and the queue is closed, so none will be.
        """
        item: T | None = self._queue.pop()
        if item is None:
            if self._queue.closed:
                raise QueueClosed("the queue is closed and drained")
            raise QueueEmpty("the queue is empty")
        _wake_next(self._putters)
        return item

    async def get(self) -> T:
        """The next item, waiting for one if the queue is empty.

        Raises:
            QueueClosed: the queue is closed and drained.
        """
        ticket = None
        while True:
            try:
                return self.get_nowait()
            except QueueEmpty:
                pass
            ticket = await _wait(self._getters, ticket)

    def task_done(self) -> None:
        """Mark one item got earlier as processed, for :meth:`join`.

        Raises:
            ValueError: called more times than items were put.
        """
        if self._unfinished_tasks <= 0:
            raise ValueError("task_done() called too many times")
        self._unfinished_tasks -= 1
        if self._unfinished_tasks == 0 and self._finished is not None:
            self._finished.set()
            self._finished = None

    async def join(self) -> None:
        """Wait until every item put has been got and marked done with :meth:`task_done`."""
        if self._unfinished_tasks == 0:
            return
        if self._finished is None:
            self._finished = _new_waker()
        await self._finished.wait()

    def close(self) -> None:
        """Refuse further puts and wake every waiter.

        Waiting and later puts raise :class:`~openstarry.errors.QueueClosed`;
        gets still receive what is queued, then raise ``QueueClosed``.
        """
        self._queue.close()
        for waiters in (self._getters, self._putters):
            while waiters:
                _wake_next(waiters)

    def ingest(
        self,
        ingestor: Ingestor,
        data: bytes | bytearray | memoryview | Sequence[bytes],
        now_ms: int | None = None,
    ) -> IngestResult:
        """Run ``ingestor.ingest(data, now_ms)`` into this queue, then wake getters.

        Use this rather than calling the ingestor directly, which would leave
        waiting getters asleep and :meth:`join` uncounted: the accepted events
        count as put, and the items the ``"shed"`` policy dropped as done.

        Raises:
            ValueError: ``ingestor`` feeds another queue.
        """
        if ingestor.queue is not self._queue:
            raise ValueError("the ingestor feeds another queue")
        result = ingestor.ingest(data, now_ms)
        self._unfinished_tasks += result.accepted - len(result.shed)
        for _ in range(min(result.accepted, len(self._getters))):
            _wake_next(self._getters)
        return result
