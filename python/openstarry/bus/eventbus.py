"""The event bus: publish and subscribe over the Rust priority queue and dedup window.

:class:`EventBus` is the public face of :mod:`openstarry.bus` (whose docstring
says the rules it keeps): subscribing, publishing (one call into Rust on the
fast path), ingestion, a remote backend's deliveries and holds, its
lifecycle and metrics. The dispatcher it runs is :mod:`openstarry.bus.dispatch`.
"""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from functools import partial
from typing import Any, Protocol

import anyio
import anyio.abc

import openstarry.bus.handles as _handles
from openstarry._core import Published
from openstarry._lifecycle import Lifecycle
from openstarry.bus.backend import BusBackend, backend_for_url
from openstarry.bus.dispatch import (
    NOT_RUNNING,
    dispatch_loop,
    handler_failed,
    notice_new,
    queued_depths,
    set_asleep,
)
from openstarry.bus.handles import CAUSE, not_an_event, refused_handle
from openstarry.bus.remote import RemotePublisher
from openstarry.bus.routing import Handler, Routes, Subscription, check_pattern
from openstarry.bus.signals import Signal, signal_factory
from openstarry.core import DedupWindow, Emitter, Event, EventQueue, Ingestor, IngestResult
from openstarry.errors import QueueClosed, QueueFull

__all__ = ["Emit", "EventBus"]


def _publish_watched(bus: EventBus, event: Event) -> Published:
    """:meth:`publish` while ``_watch`` is set: the dispatcher sleeps or holds a
    batch, or the bus is closing or remote."""
    queue = bus._queue
    if type(event) is not Event:
        raise TypeError(not_an_event(event))
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
            return refused_handle(event)
        if bus._asleep:
            bus._watch = False
            set_asleep(bus, False)
            bus._wake.set()
        return handle
    capacity = bus._capacity
    if capacity is not None and len(queue) + len(bus._batch) >= capacity:
        raise QueueFull(f"the bus holds {capacity} events")
    dedup = bus._dedup
    if dedup is not None and not dedup.check_and_insert(event.id):
        bus._duplicates += 1
        return refused_handle(event)
    handle = Published(event)
    handle._at = _handles._perf_ns()
    priority = event.priority
    if not notice_new(bus, handle, priority):
        queue.push(handle, priority)
    bus._published += 1
    return handle


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


def _emitter_of(bus: EventBus) -> Emitter | None:
    """The bus's :class:`~openstarry.core.Emitter` over its current queue (none when remote)."""
    if bus._remote is not None:
        return None
    routes = bus._routes
    return Emitter(bus._queue, bus._dedup, routes.by_type, routes.of, bus.publish)


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

    _remote: RemotePublisher | None

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
        self._remote = None if backend is None else RemotePublisher(self, backend)
        #: Holds on delivered events (a remote backend's): the dispatch is one,
        #: each :meth:`hold` another; the event is done when they are all released.
        self._holds: dict[Event, int] = {}
        #: How a held event ends when not "handled": "failed" or "returned".
        self._outcomes: dict[Event, str] = {}
        self.source = source
        #: The ExecutionLoop that serves this bus's INPUT events, while one runs:
        #: a second would answer every input again.
        self.input_owner: object | None = None
        self._routes = Routes()
        # Dispatcher state: it sleeps on _wake only when _asleep is set. The
        # signals are made for the running backend in __aenter__.
        self.new_signal: Callable[[], Signal] = anyio.Event
        self._wake: Signal = NOT_RUNNING
        self._asleep = False
        #: What the dispatcher has taken out of the queue and not yet started,
        #: in reverse (the next at the end).
        self._batch: list[Any] = []
        #: Set while a publish must tell the dispatcher: it sleeps, or it holds
        #: a batch that a more urgent event must overtake.
        self._watch = backend is not None
        self._idle: Signal = NOT_RUNNING
        self._room: Signal = NOT_RUNNING
        self._room_waiters = 0
        self._task_group: anyio.abc.TaskGroup | None = None
        self._dispatcher: int | None = None
        self._stopped: Signal = NOT_RUNNING
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

        ``None``, ``""`` or ``"local:"`` is the in-process bus. Any other URL
        names a backend by its scheme (see :mod:`openstarry.bus.backend`):
        ``redis://host:port/db`` (or ``rediss://``, ``unix://``) is the Redis
        Streams backend and ``redis+cluster://host:port[,host:port...]`` the same
        on a Redis Cluster (:mod:`openstarry.bus.redis`, the ``[redis]`` extra).
        The backend's consumer group is ``group`` and this process's consumer
        name ``consumer`` (the backend's defaults when ``None``); with
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
        backend = backend_for_url(url, group=group, consumer=consumer, consume=consume, **options)
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
        set_asleep(self, True)
        self._watch = True
        try:
            async with AsyncExitStack() as stack:
                task_group = await stack.enter_async_context(anyio.create_task_group())
                self._task_group = task_group
                task_group.start_soon(dispatch_loop, self, name="openstarry.bus dispatcher")
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
        check_pattern(pattern)
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
            raise TypeError(not_an_event(event)) from None
        except QueueFull:
            raise QueueFull(f"the bus holds {self._capacity} events") from None
        except QueueClosed:
            raise QueueClosed("the bus is closed") from None
        if handle is None:
            self._duplicates += 1
            return refused_handle(event)
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
            handler_failed(self, event, subscription, exc)
        return True

    async def apublish(self, event: Event) -> Published:
        """:meth:`publish`, waiting for room when the bus is at capacity.

        On a remote backend it waits for the backend's answer: a falsy handle
        when any producer published the id within the backend's window.
        """
        remote = self._remote
        if remote is not None:
            if type(event) is not Event:
                raise TypeError(not_an_event(event))
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
            notice_new(self, None, 0)  # the priorities are not known: any may be urgent
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
            notice_new(self, None, min(event.priority for event in events))

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
        token = CAUSE.set(event if event in self._holds else None)
        try:
            yield
        finally:
            CAUSE.reset(token)

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
            "depth": queued_depths(self),
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
