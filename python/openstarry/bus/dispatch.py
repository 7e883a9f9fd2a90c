"""The dispatcher: the one task that takes events out of the queue and calls their handlers.

:class:`Dispatcher` names the state the dispatcher shares with the publishing
side of :class:`~openstarry.bus.EventBus` (which has it: a protocol, not a base
class), and :func:`dispatch_loop` is the task: a batch out of the Rust queue in
one call, each event's handlers in order, a priority-0 event published
meanwhile overtaking the rest of the batch (:func:`notice_new`), a handler's
exception turned into a ``KERNEL:ERROR``, a delivered event's holds released
to its backend.
"""

from __future__ import annotations

import inspect
import logging
from array import array
from typing import Any, Protocol

import anyio

import openstarry.bus.handles as _handles
from openstarry._core import Published
from openstarry.bus.backend import BusBackend
from openstarry.bus.handles import CAUSE, priority_of
from openstarry.bus.routing import Routes, Subscription, describe_exception, name_of
from openstarry.bus.signals import Signal
from openstarry.core import DedupWindow, Emitter, Event, EventQueue
from openstarry.errors import QueueClosed, QueueFull
from openstarry.events import EventType

log = logging.getLogger("openstarry.bus")

_ERROR = EventType.ERROR.value

#: The most events the dispatcher takes out of the queue in one call.
_BATCH = 256


class _NotRunning:
    """The bus's signals before ``__aenter__``: setting one is harmless, waiting is an error."""

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return False

    async def wait(self) -> None:
        raise RuntimeError("the bus is not running: use `async with EventBus() as bus`")


NOT_RUNNING = _NotRunning()


def _stop_pending(bus: Dispatcher, current: Any, batch: list[Any]) -> None:
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
                queue.push(item, priority_of(item))
            except QueueFull:  # an ingested burst filled it meanwhile: the item is lost
                if type(item) is Published:
                    item._finish("stopped")


def notice_new(bus: Dispatcher, item: Published | None, priority: int) -> bool:
    """Tell the dispatcher of new events (``_watch`` is set): did ``item`` go in its batch?

    A sleeping dispatcher is woken. One holding a batch must still let a
    more urgent event overtake the rest of it: a published ``item`` more
    urgent than the batch's last goes into the batch, after what is as
    urgent (FIFO), and ``True`` says it is not to be queued. Events pushed
    in bulk (``item`` is ``None``, ``priority`` the most urgent of theirs)
    merge the whole queue into the batch.
    """
    if bus._asleep:
        set_asleep(bus, False)
        bus._watch = bus._closing or bus._remote is not None
        bus._wake.set()
        return False
    batch = bus._batch
    if not batch or priority >= priority_of(batch[0]):
        return False  # it comes after the whole batch anyway
    if item is None:
        waiting = batch[::-1] + bus._queue.pop_many(len(bus._queue))
        waiting.sort(key=priority_of)  # stable: FIFO within a priority
        batch[:] = waiting[::-1]
        return False
    i = 1
    while i < len(batch) and priority_of(batch[i]) > priority:
        i += 1
    batch.insert(i, item)
    return True


def queued_depths(bus: Dispatcher) -> list[int]:
    """Events waiting at each priority: in the queue and in the dispatcher's batch."""
    depths = bus._queue.depths()
    for item in bus._batch:
        depths[priority_of(item)] += 1
    return depths


def _make_room(bus: Dispatcher) -> None:
    """Wake the publishers waiting for room (the dispatcher is about to yield).

    They can only run once the dispatcher yields, so it tells them then,
    not after every event.
    """
    if bus._room_waiters:
        bus._room.set()
        bus._room = bus.new_signal()


def handler_failed(
    bus: Dispatcher, event: Event, subscription: Subscription, exc: Exception
) -> None:
    """A handler raised: count it and publish a ``KERNEL:ERROR`` (logged, for an error handler)."""
    bus._handler_errors += 1
    handler = name_of(subscription.handler)
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
    token = CAUSE.set(None)
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
        CAUSE.reset(token)


def set_asleep(bus: Dispatcher, asleep: bool) -> None:
    """Record whether the dispatcher sleeps, for the bus and for its emitter alike."""
    bus._asleep = asleep
    if bus._emitter is not None:
        bus._emitter.asleep = asleep


def _no_backend(event: Event, outcome: str) -> None:
    """Where a hold's end goes on the local bus: it takes none (holds are a backend's)."""
    raise AssertionError("a hold on a bus without a backend")


class Dispatcher(Protocol):
    """What the dispatcher reads and writes of its bus (an :class:`~openstarry.bus.EventBus`):
    the state it shares with the publishing side."""

    _queue: EventQueue
    _batch: list[Any]
    _routes: Routes
    _dedup: DedupWindow | None
    _capacity: int | None
    _emitter: Emitter | None
    backend: BusBackend | None
    source: str
    new_signal: Any
    _wake: Signal
    _idle: Signal
    _room: Signal
    _stopped: Signal
    _asleep: bool
    _watch: bool
    _closing: bool
    _room_waiters: int
    _dispatcher: int | None
    _holds: dict[Event, int]
    _outcomes: dict[Event, str]
    _latency: array[int]
    _latency_count: int
    _published: int
    _duplicates: int
    _handler_errors: int
    _errors_dropped: int

    @property
    def _remote(self) -> object | None:
        """The publishing side on a remote backend (``None`` on the local bus)."""

    def publish(self, event: Event) -> Published: ...


async def dispatch_loop(bus: Dispatcher) -> None:
    """The dispatcher: runs in its own task until the bus closes (or it is cancelled)."""
    pop_many = bus._queue.pop_many
    routes = bus._routes.by_type
    route_of = bus._routes.of
    latency = bus._latency
    size = len(latency)
    new_signal = bus.new_signal
    holds = bus._holds
    outcomes = bus._outcomes
    handle_type = Published
    # A remote bus publishes through its backend: always the careful way.
    careful = bus._remote is not None
    backend_done = bus.backend.done if bus.backend is not None else _no_backend
    bus._dispatcher = anyio.get_current_task().id
    batch: list[Any] = bus._batch
    item: Any = None
    try:
        while True:
            if not batch:
                # One call takes a batch; notice_new keeps priority across it.
                batch = pop_many(_BATCH)
                if not batch:
                    bus._batch = batch
                    if bus._closing:
                        return
                    if bus._room_waiters:
                        _make_room(bus)
                    bus._wake = new_signal()
                    bus._watch = True
                    set_asleep(bus, True)
                    bus._idle.set()
                    await bus._wake.wait()
                    continue
                batch.reverse()
                bus._batch = batch
                bus._watch = len(batch) > 1 or careful
            item = batch.pop()
            if type(item) is handle_type:
                event = item.event
                at = item._at
                if at is not None:  # a sampled event
                    count = bus._latency_count
                    latency[count % size] = _handles._perf_ns() - at
                    bus._latency_count = count + 1
            else:
                event = item  # ingested or fed: no handle, no latency sample
            entry = routes.get(event.type)
            if entry is None:
                entry = route_of(event.type)
            entry[1] += 1
            route: tuple[Subscription, ...] = entry[0]
            # A delivered event's handlers publish its effects (remote backends).
            cause = CAUSE.set(event) if holds and event in holds else None
            outcome = entry[3]
            sole = entry[2]
            if sole is not None:  # one plain function: no loop, no cancelled check
                try:
                    returned = sole(event)
                    # A callable object or a lambda may return an awaitable.
                    if returned is not None and inspect.isawaitable(returned):
                        _make_room(bus)
                        await returned
                except Exception as exc:
                    outcome = "failed"
                    handler_failed(bus, event, route[0], exc)
                    if event in holds:
                        outcomes[event] = "failed"
            else:
                for subscription in route:
                    if subscription._routes is None:  # cancelled during this dispatch
                        continue
                    try:
                        if subscription.is_async:
                            _make_room(bus)
                            await subscription.handler(event)  # type: ignore[misc]
                        else:
                            returned = subscription.handler(event)
                            if returned is not None and inspect.isawaitable(returned):
                                _make_room(bus)
                                await returned
                    except Exception as exc:
                        outcome = "failed"
                        handler_failed(bus, event, subscription, exc)
                        if event in holds:
                            outcomes[event] = "failed"
            if cause is not None:
                CAUSE.reset(cause)
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
        _stop_pending(bus, item, batch)
        bus._idle.set()
        bus._stopped.set()
