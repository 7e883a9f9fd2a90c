"""The event bus: publish and subscribe over the Rust priority queue and dedup window.

``EventBus`` is where every event of an agent passes: inputs from transports,
the execution loop's kernel and exec events, errors. Publishing puts an event in
an :class:`~openstarry.core.EventQueue` (priority 0 first, FIFO within a
priority) after the :class:`~openstarry.core.DedupWindow` has checked its id; one
dispatcher task takes the events out in priority order and calls the handlers
subscribed to their type.

    async with EventBus() as bus:
        bus.subscribe("INPUT:*", on_input)
        event = Event.new("INPUT:USER_MESSAGE", {"text": "hi"}, source="cli", session_id="s1")
        outcome = await bus.publish(event)  # "handled" once on_input has returned

Rules the bus keeps:

- **Priority end to end.** The dispatcher takes the waiting events out of the
  queue in batches (one call into Rust per batch, not per event), and a
  priority-0 event published while handlers run still overtakes every
  lower-priority event waiting, in the queue or in the batch.
- **Idempotency.** An event whose id was seen within the window is dropped
  (``publish`` returns a falsy handle) and counted in ``metrics()["duplicates"]``.
- **Handled, on request.** ``publish`` returns a :class:`Published` handle;
  ``await`` it to wait until the event's handlers have finished. Nothing is
  made for waiting until something awaits.
- **One wake-up per batch.** Publishing wakes the dispatcher only when it is
  asleep; a burst of publishes costs one wake-up, and the dispatcher then
  drains the queue without sleeping.
- **Handlers never kill the bus.** A handler that raises becomes a
  ``KERNEL:ERROR`` event (a child of the event it was handling, so it keeps the
  ``traceId`` and ``sessionId``) and dispatch goes on.
- **Handlers run one at a time, in order.** The dispatcher awaits an async
  handler before it dispatches the next event, so a handler should be short;
  long work (a whole agent run) belongs in a task the handler starts, as the
  execution loop does.

Publish from the thread that runs the event loop. Trace propagation is the
events' own: :meth:`Event.child <openstarry.core.Event.child>` keeps the trace
and session and records the parent.

**Backends.** By default the events wait in this process (the Rust queue and
dedup window above). Given a :class:`BusBackend`, such as the Redis Streams one
of :mod:`openstarry.redis_streams` (``EventBus.from_url("redis://...")``), a
published event goes to the backend, which may be shared by many processes,
and the backend feeds the dispatcher the events it fetched. Handlers,
subscriptions, metrics and the execution loop do not know which backend runs;
what a remote backend adds is acknowledgement: an event it delivered counts as
handled once its handlers have returned and every :meth:`EventBus.hold` on it
has been released. What its handling publishes (from its handlers, or inside
:meth:`EventBus.effects_of` for work that outlives them) is its *effects*: a
remote backend holds them back and commits them together with the event's
acknowledgement, so that a crash leaves either both or neither.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from contextvars import ContextVar
from functools import partial
from typing import Any, Literal, Protocol, runtime_checkable

import anyio
import anyio.abc

from openstarry._core import Published, _install_published_hooks
from openstarry._lifecycle import Lifecycle
from openstarry.core import DedupWindow, Emitter, Event, EventQueue, Ingestor, IngestResult
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import EventType

__all__ = [
    "BusBackend",
    "EventBus",
    "Handler",
    "Outcome",
    "Published",
    "Signal",
    "Subscription",
    "describe_exception",
    "signal_factory",
]

log = logging.getLogger("openstarry.bus")

#: The delivered event whose handling runs in this task: what the task
#: publishes are its effects (a remote backend commits them with its acknowledgement).
_CAUSE: ContextVar[Event | None] = ContextVar("openstarry_bus_cause", default=None)

#: A handler takes the event; it may be a plain function or a coroutine function.
Handler = Callable[[Event], "Awaitable[None] | None"]

_perf_ns = time.perf_counter_ns
_ERROR = EventType.ERROR.value


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


@runtime_checkable
class BusBackend(Protocol):
    """Where a bus's events live between publish and dispatch when they leave the process.

    A backend takes what the bus publishes (:meth:`send`, :meth:`asend`) and,
    while the bus runs (:meth:`running`), pushes the events it delivers to this
    process into the bus's queue with :meth:`EventBus.feed`. The bus tells it
    when a delivered event is done (:meth:`done`): handled, failed (a handler
    raised) or handed back (not handled: to be delivered again, here or elsewhere).
    """

    def send(self, event: Event, cause: Event | None = None) -> None:
        """Take ``event`` for publishing without waiting.

        ``cause`` is the delivered event whose handling publishes it: the
        backend may hold ``event`` back until ``cause`` is done, and commit
        both together (nothing of a cause that is not handled is published).

        Raises:
            QueueFull: the backend's outgoing buffer is full.
        """

    async def asend(self, event: Event, cause: Event | None = None) -> bool:
        """Publish ``event`` and wait for the answer: ``False`` for a duplicate id.

        With a held ``cause`` it does not wait: the event is taken (``True``)
        and committed with ``cause``.
        """

    def running(self, bus: EventBus) -> AbstractAsyncContextManager[object]:
        """Connect and deliver to ``bus`` while the context is entered; flush on leaving."""

    def done(self, event: Event, outcome: str) -> None:
        """A delivered event is finished: ``"handled"``, ``"failed"`` or ``"returned"``."""

    async def flush(self) -> None:
        """Wait until what was sent so far has reached the backend."""

    def metrics(self) -> dict[str, Any]:
        """The backend's own counters."""


class _NotRunning:
    """The bus's signals before ``__aenter__``: setting one is harmless, waiting is an error."""

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return False

    async def wait(self) -> None:
        raise RuntimeError("the bus is not running: use `async with EventBus() as bus`")


_NOT_RUNNING = _NotRunning()

#: How the handling of a published event ended, as awaiting its :class:`Published` answers.
Outcome = Literal["handled", "failed", "no_subscriber", "duplicate", "stopped"]

#: The state of a handle sent to a remote backend (not an outcome: see :meth:`Published.handled`).
_REMOTE = "remote"


async def _await_handle(handle: Published) -> Outcome:
    """What awaiting a :class:`Published` handle runs (``await handle``, ``handle.handled()``).

    Nothing is made for waiting until something awaits: the first awaiter
    stores a signal in the handle, which the dispatcher sets with the outcome.
    """
    state = handle._state
    if type(state) is str:
        if state == _REMOTE:
            raise RuntimeError(
                "an event published to a remote backend is handled by its consumers, "
                "out of this bus's sight: there is nothing to await"
            )
        return state  # type: ignore[return-value]
    if state is None:
        state = signal_factory()()
        handle._state = state
    await state.wait()
    outcome = handle._state
    if type(outcome) is str:
        return outcome  # type: ignore[return-value]
    return "stopped"  # woken by a bus that stopped: the event is still queued


_install_published_hooks(_await_handle, lambda: _perf_ns())


def _refused(event: Event) -> Published:
    handle = Published(event)
    handle._finish("duplicate")
    return handle


def _sent(event: Event) -> Published:
    handle = Published(event)
    handle._finish(_REMOTE)
    return handle


def _not_an_event(thing: object) -> str:
    return f"publish takes an openstarry.core.Event, not {type(thing).__name__}"


def _priority_of(item: Any) -> int:
    """The priority of a queued item: a :class:`Published` or an ingested or fed event."""
    event = item.event if type(item) is Published else item
    priority: int = event.priority
    return priority


def _stop_pending(bus: EventBus, current: Any, batch: list[Any]) -> None:
    """The dispatcher stops: settle what it had not finished.

    ``current`` (the item whose handlers were running, or the last dispatched)
    is final. The rest of the batch goes back to the queue, in front of what
    is still queued, so that a bus entered again dispatches it in order; their
    awaiters are woken (they answer ``"stopped"`` and may await again). When
    the queue is closed, nothing will dispatch them: their outcome is final.
    """
    if type(current) is Published and type(current._state) is not str:
        current._finish("stopped")
    queue = bus._queue
    left = batch[::-1] + queue.pop_many(len(queue))
    batch.clear()
    bus._batch = []
    for item in left:
        if type(item) is not Published:
            continue
        state = item._state
        if queue.closed:
            item._finish("stopped")
        elif state is not None and type(state) is not str:
            item._state = None
            state.set()
    if not queue.closed:
        for item in left:
            try:
                queue.push(item, _priority_of(item))
            except QueueFull:  # an ingested burst filled it meanwhile: the item is lost
                if type(item) is Published:
                    item._finish("stopped")


def _notice(bus: EventBus, item: Published | None, priority: int) -> bool:
    """Tell the dispatcher of new events (``_watch`` is set): did ``item`` go in its batch?

    A sleeping dispatcher is woken. One holding a batch must still let a
    more urgent event overtake the rest of it: a published ``item`` more
    urgent than the batch's last goes into the batch, after what is as
    urgent (FIFO), and ``True`` says it is not to be queued. Events pushed
    in bulk (``item`` is ``None``, ``priority`` the most urgent of theirs)
    merge the whole queue into the batch.
    """
    if bus._asleep:
        _set_asleep(bus, False)
        bus._watch = bus._closing or bus._remote is not None
        bus._wake.set()
        return False
    batch = bus._batch
    if not batch or priority >= _priority_of(batch[0]):
        return False  # it comes after the whole batch anyway
    if item is None:
        waiting = batch[::-1] + bus._queue.pop_many(len(bus._queue))
        waiting.sort(key=_priority_of)  # stable: FIFO within a priority
        batch[:] = waiting[::-1]
        return False
    i = 1
    while i < len(batch) and _priority_of(batch[i]) > priority:
        i += 1
    batch.insert(i, item)
    return True


def _depths(bus: EventBus) -> list[int]:
    """Events waiting at each priority: in the queue and in the dispatcher's batch."""
    depths = bus._queue.depths()
    for item in bus._batch:
        depths[_priority_of(item)] += 1
    return depths


def _make_room(bus: EventBus) -> None:
    """Wake the publishers waiting for room (the dispatcher is about to yield).

    They can only run once the dispatcher yields, so it tells them then,
    not after every event.
    """
    if bus._room_waiters:
        bus._room.set()
        bus._room = bus.new_signal()


class Subscription:
    """What :meth:`EventBus.subscribe` returns; :meth:`cancel` ends the subscription."""

    __slots__ = ("_routes", "handler", "is_async", "pattern")

    def __init__(self, routes: _Routes, pattern: str, handler: Handler) -> None:
        #: ``None`` once cancelled (the dispatcher skips it mid-dispatch).
        self._routes: _Routes | None = routes
        self.pattern = pattern
        self.handler = handler
        self.is_async = inspect.iscoroutinefunction(handler)

    def cancel(self) -> None:
        """Stop delivering events to the handler; calling it again does nothing."""
        routes, self._routes = self._routes, None
        if routes is not None:
            routes.remove(self)

    def __repr__(self) -> str:
        return f"<Subscription {self.pattern!r} -> {_name_of(self.handler)}>"


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"``, even for an exception whose ``str()`` raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message cannot be printed)"


def _name_of(handler: object) -> str:
    name = getattr(handler, "__qualname__", None)
    if isinstance(name, str):
        return name
    try:
        return repr(handler)
    except Exception:
        return type(handler).__qualname__


#: Past this many distinct event types, the route cache starts over and the
#: per-type counts go under ``"*"`` (types are open-ended: a peer could send new
#: ones forever).
_MAX_TYPES = 1024

#: The most events the dispatcher takes out of the queue in one call.
_BATCH = 256


def _check_pattern(pattern: str) -> None:
    namespace, colon, name = pattern.partition(":")
    if pattern == "*" or (colon and namespace and name and "*" not in namespace):
        if "*" in name and name != "*":
            raise ValueError(f"pattern {pattern!r}: '*' stands only for a whole name (NAMESPACE:*)")
        return
    raise ValueError(
        f"pattern {pattern!r}: expected TYPE like 'INPUT:USER_MESSAGE', 'NAMESPACE:*' or '*'"
    )


class _Routes:
    """Who an event type reaches: the subscriptions in order, and a route cached per type.

    A cached entry is ``[route, dispatched, sole, outcome]``: the dispatcher
    counts an event in the entry it looked up anyway (the counts move to
    :attr:`dispatched` when the cache is cleared), ``sole`` is the handler of a
    route of one plain function, which the dispatcher calls without the
    general loop, and ``outcome`` what the handles of the type's events answer
    when no handler raises. The
    dispatcher binds :attr:`by_type` once and calls :meth:`of` only on a miss,
    so the cache is cleared in place, never replaced.
    """

    __slots__ = ("by_type", "dispatched", "subscriptions")

    def __init__(self) -> None:
        self.subscriptions: list[Subscription] = []
        self.by_type: dict[str, list[Any]] = {}
        #: Events dispatched by type, except those counted in ``by_type`` since its last clear.
        self.dispatched: dict[str, int] = {}

    def add(self, subscription: Subscription) -> None:
        self.subscriptions.append(subscription)
        self._clear()

    def remove(self, subscription: Subscription) -> None:
        self.subscriptions = [s for s in self.subscriptions if s is not subscription]
        self._clear()

    def of(self, event_type: str) -> list[Any]:
        """The entry of ``event_type``, computed and cached."""
        namespace = event_type.partition(":")[0] + ":*"
        route = tuple(
            s
            for s in self.subscriptions
            if s.pattern == event_type or s.pattern == namespace or s.pattern == "*"
        )
        if len(self.by_type) >= _MAX_TYPES:
            self._clear()
        sole = route[0].handler if len(route) == 1 and not route[0].is_async else None
        outcome = "handled" if route else "no_subscriber"
        entry = self.by_type[event_type] = [route, 0, sole, outcome]
        return entry

    def counts(self) -> dict[str, int]:
        """Events dispatched by type (past 1,024 types, the others under ``"*"``)."""
        return _fold(dict(self.dispatched), self.by_type)

    def _clear(self) -> None:
        _fold(self.dispatched, self.by_type)
        self.by_type.clear()


def _fold(counts: dict[str, int], entries: dict[str, list[Any]]) -> dict[str, int]:
    for event_type, entry in entries.items():
        n = entry[1]
        if not n:
            continue
        if event_type in counts or len(counts) < _MAX_TYPES:
            counts[event_type] = counts.get(event_type, 0) + n
        else:
            counts["*"] = counts.get("*", 0) + n
    return counts


def _publish_watched(bus: EventBus, event: Event) -> Published:
    """:meth:`publish` while ``_watch`` is set: the dispatcher sleeps or holds a
    batch, or the bus is closing or remote."""
    queue = bus._queue
    if type(event) is not Event:
        raise TypeError(_not_an_event(event))
    if bus._closing:
        raise QueueClosed("the bus is closed")
    if bus._remote is not None:
        return bus._remote.send(event)
    if not bus._batch:
        # No batch to overtake: queue it as publish does, and wake a sleeping dispatcher.
        try:
            # A wake-up: always measured.
            handle = bus._publish_event(event, bus._dedup, 1)
        except QueueFull:
            raise QueueFull(f"the bus holds {bus._capacity} events") from None
        if handle is None:
            bus._duplicates += 1
            return _refused(event)
        if bus._asleep:
            bus._watch = False
            _set_asleep(bus, False)
            bus._wake.set()
        return handle
    capacity = bus._capacity
    if capacity is not None and len(queue) + len(bus._batch) >= capacity:
        raise QueueFull(f"the bus holds {capacity} events")
    dedup = bus._dedup
    if dedup is not None and not dedup.check_and_insert(event.id):
        bus._duplicates += 1
        return _refused(event)
    handle = Published(event)
    handle._at = _perf_ns()
    priority = event.priority
    if not _notice(bus, handle, priority):
        queue.push(handle, priority)
    bus._published += 1
    return handle


def _handler_failed(
    bus: EventBus, event: Event, subscription: Subscription, exc: Exception
) -> None:
    """A handler raised: count it and publish a ``KERNEL:ERROR`` (logged, for an error handler)."""
    bus._handler_errors += 1
    handler = _name_of(subscription.handler)
    if event.type == _ERROR:
        # An error handler that fails must not start a storm of errors.
        log.error("KERNEL:ERROR handler %s failed: %s", handler, describe_exception(exc))
        bus._errors_dropped += 1
        return
    error = event.child(
        _ERROR,
        {
            "code": "HANDLER_ERROR",
            "message": describe_exception(exc),
            "source": handler,
            "details": {"eventId": event.id, "eventType": event.type},
        },
        source=bus.source,
        priority=1,
    )
    # Published at once, not as an effect: it must outlive a failed attempt.
    token = _CAUSE.set(None)
    try:
        bus.publish(error)
    except (QueueFull, QueueClosed):
        log.error(
            "handler %s failed on %s and the bus could not take the error: %s",
            handler,
            event.type,
            describe_exception(exc),
        )
        bus._errors_dropped += 1
    finally:
        _CAUSE.reset(token)


class Emit(Protocol):
    """What :attr:`EventBus.emit` gives: ``emit(event, event_type, skip=None) -> bool``."""

    def __call__(
        self, event: Event, event_type: str, skip: Subscription | None = None, /
    ) -> bool: ...


def _emit_remote(
    bus: EventBus, event: Event, event_type: str, skip: Subscription | None = None
) -> bool:
    """:meth:`EventBus.emit` on a remote backend: a publish."""
    return bool(bus.publish(event))


def _set_asleep(bus: EventBus, asleep: bool) -> None:
    """Record whether the dispatcher sleeps, for the bus and for its emitter alike."""
    bus._asleep = asleep
    if bus._emitter is not None:
        bus._emitter.asleep = asleep


def _emitter_of(bus: EventBus) -> Emitter | None:
    """The bus's :class:`~openstarry.core.Emitter` over its current queue (none when remote)."""
    if bus._remote is not None:
        return None
    routes = bus._routes
    return Emitter(bus._queue, bus._dedup, routes.by_type, routes.of, bus.publish)


def _no_backend(event: Event, outcome: str) -> None:
    """Where a hold's end goes on the local bus: it takes none (holds are a backend's)."""
    raise AssertionError("a hold on a bus without a backend")


class _RemotePublisher:
    """The publishing side of a bus on a remote backend: the local window, then the backend.

    What a task publishes goes with its cause (the delivered event it is
    handling, see :meth:`EventBus.effects_of`); the counts are the bus's own.
    """

    __slots__ = ("backend", "bus")

    def __init__(self, bus: EventBus, backend: BusBackend) -> None:
        self.bus = bus
        self.backend = backend

    def send(self, event: Event) -> Published:
        bus = self.bus
        dedup = bus._dedup
        if dedup is not None and event.id in dedup:
            bus._duplicates += 1
            return _refused(event)
        self.backend.send(event, _CAUSE.get())  # QueueFull before the window records the id
        if dedup is not None:
            dedup.check_and_insert(event.id)
        bus._published += 1
        return _sent(event)

    async def asend(self, event: Event) -> Published:
        bus = self.bus
        dedup = bus._dedup
        if dedup is not None and not dedup.check_and_insert(event.id):
            bus._duplicates += 1
            return _refused(event)
        if await self.backend.asend(event, _CAUSE.get()):
            bus._published += 1
            return _sent(event)
        return _refused(event)  # counted by the backend's metrics

    def ingest(self, data: bytes | bytearray | memoryview | Sequence[bytes]) -> IngestResult:
        bus = self.bus
        scratch = EventQueue(None)
        result = Ingestor(scratch, bus._dedup).ingest(data)
        cause = _CAUSE.get()
        for event in scratch.pop_many(len(scratch)):
            self.backend.send(event, cause)
        bus._duplicates += result.duplicates
        bus._published += result.accepted
        return result


class EventBus(Lifecycle):
    """Publish/subscribe over the Rust priority queue, on asyncio or trio (through anyio).

    Args:
        capacity: The most events that may wait for dispatch. At capacity,
            :meth:`publish` raises :class:`~openstarry.errors.QueueFull` and
            :meth:`apublish` waits for room.
        dedup: The window that drops repeated ids: ``True`` (the default) for a
            window of 60 s and 100,000 ids, a :class:`~openstarry.core.DedupWindow`
            of your own (to share it, or restore it from a snapshot), or
            ``False`` to turn de-duplication off.
        source: The ``source`` of the ``KERNEL:ERROR`` events the bus emits.
        latency_samples: How many recent dispatch latencies the metrics keep.
        latency_every: Which events have their dispatch latency measured:
            every event that wakes the dispatcher, or is
            published while it works through a batch, and otherwise one
            published event in ``latency_every`` (16 by default; 1 measures
            every event). Reading the clock twice and recording the sample
            costs about a fifth of an event's way through the bus in a burst.
        backend: Where events go between publish and dispatch: ``None`` (the
            default) keeps them in this process; a :class:`BusBackend` (see
            :meth:`from_url`) shares them between processes. With a backend,
            ``capacity`` bounds what is fetched but not yet dispatched, and the
            dedup window is the cheap first filter before the backend's own.

    Entering it starts the dispatcher; leaving it dispatches every event already
    accepted, then stops (leaving on an exception cancels the dispatch instead).
    It can be entered again once it has exited: a closed bus starts with a fresh
    queue, and keeps its dedup window and its metrics.
    """

    def __init__(
        self,
        *,
        capacity: int | None = 65536,
        dedup: DedupWindow | bool = True,
        source: str = "openstarry.bus",
        latency_samples: int = 4096,
        latency_every: int = 16,
        backend: BusBackend | None = None,
    ) -> None:
        if latency_samples < 1:
            raise ValueError(f"latency_samples must be at least 1, not {latency_samples}")
        if latency_every < 1:
            raise ValueError(f"latency_every must be at least 1, not {latency_every}")
        self._latency_every = latency_every
        self._queue = EventQueue(capacity)
        self._publish_event = self._queue.publish  # publish's one call, bound once
        self._capacity = capacity
        self._dedup: DedupWindow | None
        if dedup is True:
            self._dedup = DedupWindow(60_000, 100_000)
        elif dedup is False:
            self._dedup = None
        elif isinstance(dedup, DedupWindow):
            self._dedup = dedup
        else:
            raise TypeError(f"dedup must be a DedupWindow or a bool, not {type(dedup).__name__}")
        self._ingestor: Ingestor | None = None
        if backend is not None and not isinstance(backend, BusBackend):
            raise TypeError(f"backend must be a BusBackend, not {type(backend).__name__}")
        #: The remote backend, or ``None`` for the local bus.
        self.backend = backend
        self._remote = None if backend is None else _RemotePublisher(self, backend)
        #: Holds on delivered events (a remote backend's): the dispatch is one,
        #: each :meth:`hold` another; the event is done when they are all released.
        self._holds: dict[Event, int] = {}
        #: How a held event ends when not "handled": "failed" or "returned".
        self._outcomes: dict[Event, str] = {}
        self.source = source
        #: The ExecutionLoop that serves this bus's INPUT events, while one runs:
        #: a second would answer every input again.
        self.input_owner: object | None = None
        self._routes = _Routes()
        # Dispatcher state: it sleeps on _wake only when _asleep is set. The
        # signals are made for the running backend in __aenter__.
        self.new_signal: Callable[[], Signal] = anyio.Event
        self._wake: Signal = _NOT_RUNNING
        self._asleep = False
        #: What the dispatcher has taken out of the queue and not yet started,
        #: in reverse (the next at the end).
        self._batch: list[Any] = []
        #: Set while a publish must tell the dispatcher: it sleeps, or it holds
        #: a batch that a more urgent event must overtake.
        self._watch = backend is not None
        self._idle: Signal = _NOT_RUNNING
        self._room: Signal = _NOT_RUNNING
        self._room_waiters = 0
        self._task_group: anyio.abc.TaskGroup | None = None
        self._dispatcher: int | None = None
        self._stopped: Signal = _NOT_RUNNING
        self._closing = False
        # Metrics.
        #: Accepted events, except those the queue counts (``EventQueue.publish``,
        #: ``push_unique``, ``admit``).
        self._published = 0
        self._duplicates = 0
        self._invalid = 0
        self._handler_errors = 0
        self._errors_dropped = 0
        self._latency = array("q", bytes(8 * latency_samples))
        self._latency_count = 0
        self._emitter = _emitter_of(self)

    @classmethod
    def from_url(
        cls,
        url: str | None,
        *,
        group: str | None = None,
        consumer: str | None = None,
        consume: bool = True,
        **options: Any,
    ) -> EventBus:
        """A bus on the backend a URL names.

        ``None``, ``""`` or ``"local:"`` is the in-process bus; ``redis://host:port/db``
        (or ``rediss://``, ``unix://``) is the Redis Streams backend of
        :mod:`openstarry.redis_streams` (the ``[redis]`` extra), whose consumer
        group is ``group`` (default ``"openstarry"``) and consumer name
        ``consumer`` (default: host name and process id). With
        ``consume=False`` the bus only publishes (a producer). Other keyword
        arguments go to the bus (``capacity``, ``dedup``, ...) or, when the
        bus does not take them, to the backend (``partitions``, ``maxlen``, ...).

        Raises:
            ValueError: an unknown scheme.
            ImportError: ``redis://`` without the ``[redis]`` extra.
        """
        bus_options = {
            key: options.pop(key)
            for key in ("capacity", "dedup", "source", "latency_samples", "latency_every")
            if key in options
        }
        if not url or url in ("local:", "local://"):
            if group is not None or consumer is not None or options:
                raise ValueError("group, consumer and backend options need a remote bus URL")
            return cls(**bus_options)
        scheme = url.partition("://")[0].lower()
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"bus URL {url!r}: expected redis://host:port/db or local:")
        from openstarry.redis_streams import RedisStreams

        backend = RedisStreams(url, group=group, consumer=consumer, consume=consume, **options)
        return cls(backend=backend, **bus_options)

    # -- lifecycle -------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[EventBus]:
        if self._closing:
            # Entered again after it was closed: a fresh queue; the dedup
            # window and the metrics carry on.
            self._published += self._queue.unique_pushed  # the old queue's count
            self._queue = EventQueue(self._capacity)
            self._publish_event = self._queue.publish
            if self._emitter is not None:
                self._duplicates += self._emitter.duplicates
            self._emitter = _emitter_of(self)
            self._ingestor = None
            self._closing = False
        new_signal = self.new_signal = signal_factory()
        self._wake, self._idle, self._room, self._stopped = (new_signal() for _ in range(4))
        # Asleep until the first publish: nothing is queued yet, so an event
        # may be delivered at once before the dispatcher has first run.
        _set_asleep(self, True)
        self._watch = True
        try:
            async with AsyncExitStack() as stack:
                task_group = await stack.enter_async_context(anyio.create_task_group())
                self._task_group = task_group
                task_group.start_soon(self._dispatch_loop, name="openstarry.bus dispatcher")
                if self.backend is not None:
                    # Entered after the dispatcher, left before it stops: the
                    # backend stops delivering, then what it delivered drains.
                    await stack.enter_async_context(self.backend.running(self))
                try:
                    yield self
                except BaseException:
                    task_group.cancel_scope.cancel()
                    raise
                # Left normally: what was accepted is dispatched before the bus
                # stops (cancelled while draining, the task group cancels the rest).
                await self.aclose()
        finally:
            self._task_group = None
            self._dispatcher = None
            self._holds.clear()
            self._outcomes.clear()

    async def aclose(self) -> None:
        """Refuse new events, dispatch every event already accepted, then stop the dispatcher.

        A handler that publishes during the drain gets
        :class:`~openstarry.errors.QueueClosed`, like any other publisher.
        """
        if not self._closing:
            self._closing = self._watch = True
            self._queue.close()
            self._wake.set()
            self._room.set()
        if self._task_group is not None and anyio.get_current_task().id != self._dispatcher:
            # (Called from a handler, the drain goes on once the handler returns.)
            await self._stopped.wait()

    @property
    def closed(self) -> bool:
        return self._closing

    # -- subscribing -----------------------------------------------------

    def subscribe(self, pattern: str, handler: Handler) -> Subscription:
        """Deliver to ``handler`` every event whose type matches ``pattern``.

        ``pattern`` is an exact type (``"EXEC:TOOL_CALL"``), a namespace
        (``"EXEC:*"``) or ``"*"`` for every event. Handlers of one event run in
        the order they subscribed.
        """
        _check_pattern(pattern)
        subscription = Subscription(self._routes, pattern, handler)
        self._routes.add(subscription)
        return subscription

    # -- publishing ------------------------------------------------------

    def publish(self, event: Event) -> Published:
        """Queue ``event`` for dispatch; a :class:`Published` handle on it.

        The handle is truthy when the event was accepted and falsy when its id
        is a duplicate (dropped); ``await`` it to wait until the event's
        handlers have finished (see :class:`Published` for what it answers).

        Raises:
            QueueFull: the bus holds ``capacity`` events (use :meth:`apublish` to wait).
            QueueClosed: after :meth:`aclose`.
            TypeError: ``event`` is not an :class:`~openstarry.core.Event`.
        """
        if self._watch:
            # The dispatcher sleeps or works through a batch, or the bus is
            # closing or remote: the careful way.
            return _publish_watched(self, event)
        # One call: refused when closed or full (before the window records the
        # id: a retry must not be a duplicate), then the window, then the queue
        # takes a new handle, its publish time read for one in latency_every.
        try:
            handle = self._publish_event(event, self._dedup, self._latency_every)
        except TypeError:
            raise TypeError(_not_an_event(event)) from None
        except QueueFull:
            raise QueueFull(f"the bus holds {self._capacity} events") from None
        except QueueClosed:
            raise QueueClosed("the bus is closed") from None
        if handle is None:
            self._duplicates += 1
            return _refused(event)
        return handle

    @property
    def emit(self) -> Emit:
        """``emit(event, event_type, skip=None)``: :meth:`publish` for a producer that
        wants no handle; True unless a duplicate.

        ``event_type`` must be ``event.type`` (given, it spares decoding it; a
        different one is a ``ValueError``). When nothing could come before the
        event (the bus is local and idle: the dispatcher sleeps, nothing is
        queued), an event nobody subscribes to (or only ``skip``, a handler
        that would ignore it) is dispatched at once: its id goes through the
        window and it is counted as published and dispatched, with nothing
        queued, no room taken and no latency sample. So a producer whose events nobody
        listens to (an agent's run with no stream open) pays no dispatch for
        them. Any other event is published as :meth:`publish` does. On the
        local bus it is one call into Rust (:class:`~openstarry.core.Emitter`);
        a producer may keep the function while the bus runs.

        Raises:
            QueueFull: a routed event, and the bus is at capacity.
            QueueClosed: after :meth:`aclose`.
            TypeError: ``event`` is not an :class:`~openstarry.core.Event`.
        """
        emitter = self._emitter
        if emitter is None:
            return partial(_emit_remote, self)
        return emitter.emit

    @property
    def emitter(self) -> Emitter | None:
        """The local bus's :class:`~openstarry.core.Emitter` while it runs (``None``
        on a remote backend): :meth:`emit` is its ``emit``, and its ``child``
        makes a caused event and emits it in one call."""
        return self._emitter

    def deliver(
        self, event: Event, event_type: str, subscription: Subscription, *, handle: bool = True
    ) -> bool | None:
        """Dispatch ``event`` at once, in the caller's task, when nothing could come before it.

        That is when the bus is local and idle (the dispatcher sleeps, nothing
        is queued) and ``subscription``, a plain function, is the only one for
        ``event_type`` (which must be ``event.type``): the event then goes
        through the window, is counted as published and dispatched, and the
        handler is called now, as the dispatcher would call it next (a handler
        that raises is reported as on dispatch, with a ``KERNEL:ERROR``); it
        takes no latency sample. A producer that owns such a handler (an
        agent's inputs) spares the event a trip through the queue and a
        wake-up of the dispatcher. Delivered, the event has reached its
        handler: an urgent event published after it can no longer overtake it.
        With ``handle=False`` the handler is not called: its owner handles
        the event itself, now, as the handler would (an agent serving an
        ``ask`` in the asking task).

        Returns:
            ``True`` when delivered, ``False`` for a duplicate id (not
            delivered), ``None`` when it cannot be delivered now: publish it.

        Raises:
            ValueError: ``event_type`` is not ``event.type``.
        """
        emitter = self._emitter
        if emitter is None or self._closing or self._remote is not None:
            return None
        taken = emitter.take(event, event_type, subscription)  # the checks, in Rust
        if not taken or not handle:
            return taken
        try:
            self._routes.by_type[event_type][2](event)
        except Exception as exc:
            _handler_failed(self, event, subscription, exc)
        return True

    async def apublish(self, event: Event) -> Published:
        """:meth:`publish`, waiting for room when the bus is at capacity.

        On a remote backend it waits for the backend's answer: a falsy handle
        when any producer published the id within the backend's window.
        """
        remote = self._remote
        if remote is not None:
            if type(event) is not Event:
                raise TypeError(_not_an_event(event))
            if self._closing:
                raise QueueClosed("the bus is closed")
            return await remote.asend(event)
        while True:
            try:
                return self.publish(event)
            except QueueFull:
                if self._closing:
                    raise QueueClosed("the bus is closed") from None
                self._room_waiters += 1
                try:
                    await self._room.wait()
                finally:
                    self._room_waiters -= 1

    def ingest(self, data: bytes | bytearray | memoryview | Sequence[bytes]) -> IngestResult:
        """Decode NDJSON envelopes (or a list of byte strings) straight into the bus.

        The Rust :class:`~openstarry.core.Ingestor` decodes, validates and
        de-duplicates the whole batch in one call; invalid lines are reported in
        the result, never raised. Ingested events have no dispatch-latency sample.
        On a remote backend the accepted events are sent to it.
        """
        if self._remote is not None:
            return self._remote.ingest(data)
        ingestor = self._ingestor
        if ingestor is None:
            ingestor = self._ingestor = Ingestor(self._queue, self._dedup)
        result = ingestor.ingest(data)
        self._duplicates += result.duplicates
        self._invalid += len(result.invalid)
        self._published += result.accepted
        if result.accepted and self._watch:
            _notice(self, None, 0)  # the priorities are not known: any may be urgent
        return result

    # -- a remote backend's deliveries -------------------------------------

    def feed(self, events: Sequence[Event]) -> None:
        """Queue events a backend delivered, in the order given (one call per batch).

        Each is held by its dispatch until its handlers have returned; the
        backend hears :meth:`BusBackend.done` once every hold is released.
        """
        if self._closing:
            raise QueueClosed("the bus is closed")
        self._holds.update(dict.fromkeys(events, 1))
        self._queue.push_many(events)
        if events and self._watch:
            _notice(self, None, min(event.priority for event in events))

    def hold(self, event: Event) -> bool:
        """Keep a delivered event from counting as handled until :meth:`release`.

        A handler that hands an event to longer work (the execution loop runs
        an input in a session's task) holds it, so that a remote backend
        acknowledges it only once that work is done. Returns whether a hold
        was taken (``False`` on the local bus, or for an event that was not
        delivered by the backend): release only what was held.
        """
        holds = self._holds
        count = holds.get(event)
        if count is None:
            return False
        holds[event] = count + 1
        return True

    @contextmanager
    def effects_of(self, event: Event) -> Iterator[None]:
        """Count what this task publishes inside the block as ``event``'s effects.

        The dispatcher does so for every handler; work that outlives its
        handler (a run in a session's task, which also :meth:`hold` s the
        event) does so itself. On a remote backend the effects of a delivered
        event are held back and committed atomically with its acknowledgement;
        elsewhere (the local bus, an event not delivered by the backend) this
        changes nothing.
        """
        token = _CAUSE.set(event if event in self._holds else None)
        try:
            yield
        finally:
            _CAUSE.reset(token)

    def release(self, event: Event, *, handled: bool = True) -> None:
        """Release a :meth:`hold`; ``handled=False`` hands the event back to the backend
        (it is delivered again, here or to another consumer), unless something
        else already failed it."""
        holds = self._holds
        count = holds.get(event)
        if count is None:
            return
        outcomes = self._outcomes
        if not handled and event not in outcomes:
            outcomes[event] = "returned"
        if count > 1:
            holds[event] = count - 1
        else:
            del holds[event]
            assert self.backend is not None
            self.backend.done(event, outcomes.pop(event, "handled"))

    async def wait_idle(self) -> None:
        """Wait until every event published so far has been dispatched.

        Events published by handlers meanwhile are waited for too. On a remote
        backend: until what this process published has reached the backend and
        what the backend delivered here has been dispatched.
        """
        if self.backend is not None:
            await self.backend.flush()
        if self._task_group is None:
            raise RuntimeError("the bus is not running: use `async with EventBus() as bus`")
        if anyio.get_current_task().id == self._dispatcher:
            raise RuntimeError("wait_idle() from a handler would wait for itself")
        while self._queue or not self._asleep:
            if self._stopped.is_set():
                return
            self._idle = self.new_signal() if self._idle.is_set() else self._idle
            await self._idle.wait()

    # -- dispatching -----------------------------------------------------

    async def _dispatch_loop(self) -> None:
        pop_many = self._queue.pop_many
        routes = self._routes.by_type
        route_of = self._routes.of
        latency = self._latency
        size = len(latency)
        new_signal = self.new_signal
        holds = self._holds
        outcomes = self._outcomes
        handle_type = Published
        # A remote bus publishes through its backend: always the careful way.
        careful = self._remote is not None
        backend_done = self.backend.done if self.backend is not None else _no_backend
        self._dispatcher = anyio.get_current_task().id
        batch: list[Any] = self._batch
        item: Any = None
        try:
            while True:
                if not batch:
                    # One call takes a batch; _notice keeps priority across it.
                    batch = pop_many(_BATCH)
                    if not batch:
                        self._batch = batch
                        if self._closing:
                            return
                        if self._room_waiters:
                            _make_room(self)
                        self._wake = new_signal()
                        self._watch = True
                        _set_asleep(self, True)
                        self._idle.set()
                        await self._wake.wait()
                        continue
                    batch.reverse()
                    self._batch = batch
                    self._watch = len(batch) > 1 or careful
                item = batch.pop()
                if type(item) is handle_type:
                    event = item.event
                    at = item._at
                    if at is not None:  # a sampled event
                        count = self._latency_count
                        latency[count % size] = _perf_ns() - at
                        self._latency_count = count + 1
                else:
                    event = item  # ingested or fed: no handle, no latency sample
                entry = routes.get(event.type)
                if entry is None:
                    entry = route_of(event.type)
                entry[1] += 1
                route: tuple[Subscription, ...] = entry[0]
                # A delivered event's handlers publish its effects (remote backends).
                cause = _CAUSE.set(event) if holds and event in holds else None
                outcome = entry[3]
                sole = entry[2]
                if sole is not None:  # one plain function: no loop, no cancelled check
                    try:
                        returned = sole(event)
                        # A callable object or a lambda may return an awaitable.
                        if returned is not None and inspect.isawaitable(returned):
                            _make_room(self)
                            await returned
                    except Exception as exc:
                        outcome = "failed"
                        _handler_failed(self, event, route[0], exc)
                        if event in holds:
                            outcomes[event] = "failed"
                else:
                    for subscription in route:
                        if subscription._routes is None:  # cancelled during this dispatch
                            continue
                        try:
                            if subscription.is_async:
                                _make_room(self)
                                await subscription.handler(event)  # type: ignore[misc]
                            else:
                                returned = subscription.handler(event)
                                if returned is not None and inspect.isawaitable(returned):
                                    _make_room(self)
                                    await returned
                        except Exception as exc:
                            outcome = "failed"
                            _handler_failed(self, event, subscription, exc)
                            if event in holds:
                                outcomes[event] = "failed"
                if cause is not None:
                    _CAUSE.reset(cause)
                    # release(event), inline: the dispatch's hold.
                    held = holds.get(event)
                    if held is not None:
                        if held > 1:
                            holds[event] = held - 1
                        else:
                            del holds[event]
                            backend_done(
                                event, outcomes.pop(event, "handled") if outcomes else "handled"
                            )
                if item is not event:
                    item._finish(outcome)  # and wakes its awaiters, if any
        finally:
            _stop_pending(self, item, batch)
            self._idle.set()
            self._stopped.set()

    # -- metrics ---------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Counters and gauges of the bus, as plain data.

        - ``published``: events accepted (by publish or ingest);
        - ``duplicates``: events dropped as repeated ids;
        - ``invalid``: ingested lines refused as invalid envelopes;
        - ``dispatched``: events dispatched, by type (past 1,024 types, the
          others are counted under ``"*"``);
        - ``depth``: events waiting at each priority, 0..5;
        - ``handler_errors``: handler exceptions turned into ``KERNEL:ERROR``;
        - ``errors_dropped``: ``KERNEL:ERROR`` events that could not be published;
        - ``latency_us``: publish-to-dispatch latency over the recent samples
          (``count``, ``p50``, ``p99``, ``max``), in microseconds: the
          events measured (see ``latency_every``), not every event published.
        """
        count = min(self._latency_count, len(self._latency))
        samples = sorted(self._latency[:count]) if count else []
        latency: dict[str, float | int | None] = {"count": self._latency_count}
        for name, q in (("p50", 0.50), ("p99", 0.99)):
            latency[name] = samples[min(count - 1, int(q * count))] / 1000 if samples else None
        latency["max"] = samples[-1] / 1000 if samples else None
        emitter = self._emitter
        metrics: dict[str, Any] = {
            "published": self._published + self._queue.unique_pushed,
            "duplicates": self._duplicates + (emitter.duplicates if emitter is not None else 0),
            "invalid": self._invalid,
            "dispatched": self._routes.counts(),
            "depth": _depths(self),
            "handler_errors": self._handler_errors,
            "errors_dropped": self._errors_dropped,
            "latency_us": latency,
        }
        if self.backend is not None:
            backend = self.backend.metrics()
            metrics["duplicates"] += backend.get("duplicates", 0)
            metrics["backend"] = backend
        return metrics

    def latency_since(self, mark: int) -> tuple[int, list[int]]:
        """The dispatch latencies (ns) recorded since ``mark``, and the new mark.

        ``mark`` is what the previous call returned (0 at first). For exporters
        that keep a cumulative histogram: only the last ``latency_samples``
        samples are kept, so a reader that calls less often gets those and the
        count of the samples it missed is the new mark minus the old, minus
        ``len(samples)``.
        """
        total = self._latency_count
        size = len(self._latency)
        new = min(total - mark, size) if total > mark else 0
        end = total % size
        samples = [self._latency[(end - new + i) % size] for i in range(new)]
        return total, samples

    def __len__(self) -> int:
        """Events waiting for dispatch."""
        return len(self._queue) + len(self._batch)
