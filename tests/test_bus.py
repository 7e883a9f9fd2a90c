"""EventBus: publish/subscribe over the Rust priority queue and dedup window, on asyncio and trio.

Every test bounds its waiting with ``anyio.fail_after`` (a hang is a failure, never a
timing assertion); ordering is controlled with events the test sets itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

import openstarry.bus as bus_module
import openstarry.bus.handles as bus_handles
from agent_harness import HANG, UnprintableError
from openstarry.bus import BusHost, EventBus, Published, Subscription
from openstarry.core import DedupWindow, Event, EventRef, encode_event
from openstarry.errors import QueueClosed, QueueFull

#: Generous bound on a whole test's waiting; never a timing assertion.
TIMEOUT = 30

USER = "INPUT:USER_MESSAGE"
ERROR = "KERNEL:ERROR"


def ev(
    n: int = 0,
    *,
    type_: str = USER,
    priority: int = 2,
    session: str = "s1",
    trace: str | None = None,
) -> Event:
    return Event.new(
        type_, {"n": n}, source="test", session_id=session, priority=priority, trace_id=trace
    )


def n_of(event: Event) -> int:
    payload = event.payload
    assert isinstance(payload, dict)
    value = payload["n"]
    assert isinstance(value, int)
    return value


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Gate:
    """Blocks the dispatcher inside a handler until the test releases it."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def block(self) -> None:
        self.entered.set()
        await self.release.wait()


async def block_dispatcher(bus: EventBus, gate: Gate, *, priority: int = 5) -> Event:
    """Publish an INPUT:SIGNAL whose handler blocks on ``gate``; return once it is blocked."""

    async def blocker(event: Event) -> None:
        await gate.block()

    sub = bus.subscribe("INPUT:SIGNAL", blocker)
    blocker_event = ev(-1, type_="INPUT:SIGNAL", priority=priority)
    assert bus.publish(blocker_event)
    await gate.entered.wait()
    sub.cancel()
    return blocker_event


class _CountingSignal:
    """Wraps the dispatcher's wake-up signal and counts ``set()`` calls."""

    def __init__(self, inner: Any, owner: CountingBus) -> None:
        self._inner = inner
        self._owner = owner

    def set(self) -> None:
        self._owner.wake_sets += 1
        self._inner.set()

    def is_set(self) -> bool:
        result: bool = self._inner.is_set()
        return result

    async def wait(self) -> None:
        await self._inner.wait()


class CountingBus(EventBus):
    """An EventBus that counts wake-ups: each assignment of ``_wake`` is one sleep of the
    dispatcher (it makes a fresh signal every time it goes to sleep) and each ``set()``
    on it is one wake-up."""

    def __init__(self, **kwargs: Any) -> None:
        self.wake_assignments = 0
        self.wake_sets = 0
        super().__init__(**kwargs)

    @property
    def _wake(self) -> Any:
        return self._counted_wake

    @_wake.setter
    def _wake(self, value: Any) -> None:
        self.wake_assignments += 1
        self._counted_wake = _CountingSignal(value, self)


# --- construction and patterns -------------------------------------------------------------


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="latency_samples"):
        EventBus(latency_samples=0)
    with pytest.raises(TypeError, match="dedup"):
        EventBus(dedup="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dedup"):
        EventBus(dedup=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "pattern",
    [
        "",
        "INPUT",
        "INPUT:",
        ":USER_MESSAGE",
        ":",
        ":*",
        "**",
        "*:*",
        "*:USER_MESSAGE",
        "IN*:USER_MESSAGE",
        "INPUT:USER*",
        "INPUT:*MESSAGE",
        "INPUT:**",
    ],
)
def test_bad_patterns_raise_value_error(pattern: str) -> None:
    bus = EventBus()
    with pytest.raises(ValueError, match="pattern"):
        bus.subscribe(pattern, lambda event: None)
    assert bus._routes.subscriptions == []


@pytest.mark.parametrize("pattern", ["INPUT:USER_MESSAGE", "INPUT:*", "*", "KERNEL:ERROR"])
def test_good_patterns_are_accepted(pattern: str) -> None:
    bus = EventBus()

    def handler(event: Event) -> None:
        pass

    sub = bus.subscribe(pattern, handler)
    assert isinstance(sub, Subscription)
    assert sub.pattern == pattern
    assert sub.handler is handler


# --- publishing: argument and lifecycle errors ----------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "thing",
    [None, "INPUT:USER_MESSAGE", {"type": USER}, b"{}", 42],
)
async def test_publish_non_event_is_type_error(thing: Any) -> None:
    async with EventBus() as bus:
        with pytest.raises(TypeError, match="Event"):
            bus.publish(thing)
        with pytest.raises(TypeError, match="Event"):
            await bus.apublish(thing)
        assert bus.metrics()["published"] == 0


@pytest.mark.anyio
async def test_publish_event_dict_and_wire_bytes_are_type_errors() -> None:
    event = ev()
    async with EventBus() as bus:
        with pytest.raises(TypeError):
            bus.publish(event.to_dict())  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            bus.publish(encode_event(event))  # type: ignore[arg-type]
        # The real event is still new to the window: the failed calls recorded nothing.
        assert bus.publish(event)


@pytest.mark.anyio
async def test_publish_after_aclose_is_queue_closed() -> None:
    seen: list[Event] = []
    async with EventBus() as bus:
        bus.subscribe("*", seen.append)
        assert not bus.closed
        await bus.aclose()
        assert bus.closed
        with pytest.raises(QueueClosed):
            bus.publish(ev(1))
        with pytest.raises(QueueClosed):
            await bus.apublish(ev(2))
        await bus.aclose()  # a second close does nothing
    with pytest.raises(QueueClosed):
        bus.publish(ev(3))
    assert seen == []
    assert bus.metrics()["published"] == 0


@pytest.mark.anyio
async def test_reentering_a_running_bus_is_an_error() -> None:
    async with EventBus() as bus:
        with pytest.raises(RuntimeError, match="already running"):
            await bus.__aenter__()


@pytest.mark.anyio
async def test_events_published_before_start_are_dispatched_once_running() -> None:
    seen: list[int] = []
    bus = EventBus()
    bus.subscribe("*", lambda event: seen.append(n_of(event)))
    for i in range(3):
        assert bus.publish(ev(i))
    assert len(bus) == 3
    with anyio.fail_after(TIMEOUT):
        async with bus:
            await bus.wait_idle()
            assert seen == [0, 1, 2]


# --- subscribing and routing ----------------------------------------------------------------


@pytest.mark.anyio
async def test_exact_namespace_and_star_routing() -> None:
    got: dict[str, list[str]] = {"exact": [], "input": [], "exec": [], "all": []}
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: got["exact"].append(e.type))
        bus.subscribe("INPUT:*", lambda e: got["input"].append(e.type))
        bus.subscribe("EXEC:*", lambda e: got["exec"].append(e.type))
        bus.subscribe("*", lambda e: got["all"].append(e.type))
        types = [USER, "INPUT:SIGNAL", "EXEC:TOOL_CALL", "KERNEL:TICK_START", "INPUTS:OTHER"]
        with anyio.fail_after(TIMEOUT):
            for t in types:
                bus.publish(ev(type_=t))
            await bus.wait_idle()
    assert got["exact"] == [USER]
    # "INPUT:*" is the INPUT namespace only, not a prefix match on "INPUTS".
    assert got["input"] == [USER, "INPUT:SIGNAL"]
    assert got["exec"] == ["EXEC:TOOL_CALL"]
    assert got["all"] == types


@pytest.mark.anyio
async def test_handler_order_is_subscription_order_across_patterns() -> None:
    calls: list[tuple[str, int]] = []

    def sync_handler(name: str) -> Callable[[Event], None]:
        return lambda e: calls.append((name, n_of(e)))

    def async_handler(name: str) -> Callable[[Event], Any]:
        async def handler(e: Event) -> None:
            await anyio.lowlevel.checkpoint()
            calls.append((name, n_of(e)))

        return handler

    async with EventBus() as bus:
        bus.subscribe("*", sync_handler("a"))
        bus.subscribe(USER, async_handler("b"))
        bus.subscribe("INPUT:*", sync_handler("c"))
        bus.subscribe(USER, async_handler("d"))
        bus.subscribe("*", sync_handler("e"))
        with anyio.fail_after(TIMEOUT):
            bus.publish(ev(1))
            bus.publish(ev(2))
            await bus.wait_idle()
    assert calls == [(name, n) for n in (1, 2) for name in "abcde"]


@pytest.mark.anyio
async def test_sync_and_async_handlers_receive_the_event() -> None:
    got: list[tuple[str, str]] = []

    def plain(event: Event) -> None:
        got.append(("plain", event.id))

    async def coroutine(event: Event) -> None:
        await anyio.lowlevel.checkpoint()
        got.append(("coroutine", event.id))

    class Owner:
        async def method(self, event: Event) -> None:
            await anyio.lowlevel.checkpoint()
            got.append(("method", event.id))

    async def tagged(tag: str, event: Event) -> None:
        await anyio.lowlevel.checkpoint()
        got.append((tag, event.id))

    event = ev()
    async with EventBus() as bus:
        bus.subscribe(USER, plain)
        bus.subscribe(USER, coroutine)
        bus.subscribe(USER, Owner().method)
        bus.subscribe(USER, functools.partial(tagged, "partial"))
        with anyio.fail_after(TIMEOUT):
            bus.publish(event)
            await bus.wait_idle()
    assert got == [
        ("plain", event.id),
        ("coroutine", event.id),
        ("method", event.id),
        ("partial", event.id),
    ]


@pytest.mark.anyio
async def test_async_callable_object_handler_is_awaited() -> None:
    """``Handler`` is ``Callable[[Event], Awaitable[None] | None]``: a callable whose call
    returns an awaitable is a handler, and its awaitable must be awaited."""
    got: list[str] = []

    class AsyncCallable:
        async def __call__(self, event: Event) -> None:
            got.append(event.id)

    event = ev()
    async with EventBus() as bus:
        bus.subscribe(USER, AsyncCallable())
        with anyio.fail_after(TIMEOUT):
            bus.publish(event)
            await bus.wait_idle()
    assert got == [event.id]


@pytest.mark.anyio
async def test_async_handlers_run_one_at_a_time() -> None:
    active = 0
    most = 0
    log: list[str] = []

    async def slow(event: Event) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        log.append(f"start {n_of(event)}")
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        log.append(f"end {n_of(event)}")
        active -= 1

    async with EventBus() as bus:
        bus.subscribe(USER, slow)
        with anyio.fail_after(TIMEOUT):
            for i in range(3):
                bus.publish(ev(i))
            await bus.wait_idle()
    assert most == 1
    assert log == ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"]


@pytest.mark.anyio
async def test_subscription_cancel_stops_delivery() -> None:
    kept: list[int] = []
    dropped: list[int] = []
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: kept.append(n_of(e)))
        sub = bus.subscribe(USER, lambda e: dropped.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            bus.publish(ev(1))  # builds and caches the route
            await bus.wait_idle()
            sub.cancel()
            sub.cancel()  # idempotent
            bus.publish(ev(2))
            await bus.wait_idle()
            # A handler subscribed after the route was cached gets later events.
            late: list[int] = []
            bus.subscribe(USER, lambda e: late.append(n_of(e)))
            bus.publish(ev(3))
            await bus.wait_idle()
    assert kept == [1, 2, 3]
    assert dropped == [1]
    assert late == [3]


@pytest.mark.anyio
async def test_cancel_removes_only_that_subscription_of_a_repeated_handler() -> None:
    seen: list[int] = []

    def handler(event: Event) -> None:
        seen.append(n_of(event))

    async with EventBus() as bus:
        first = bus.subscribe(USER, handler)
        bus.subscribe(USER, handler)
        with anyio.fail_after(TIMEOUT):
            bus.publish(ev(1))
            await bus.wait_idle()
            first.cancel()
            bus.publish(ev(2))
            await bus.wait_idle()
    assert seen == [1, 1, 2]


@pytest.mark.anyio
async def test_one_shot_handler_cancels_itself() -> None:
    seen: list[int] = []
    subs: list[Subscription] = []

    def once(event: Event) -> None:
        seen.append(n_of(event))
        subs[0].cancel()

    async with EventBus() as bus:
        subs.append(bus.subscribe(USER, once))
        with anyio.fail_after(TIMEOUT):
            for i in range(3):
                bus.publish(ev(i))
            await bus.wait_idle()
    assert seen == [0]


# --- priority end to end -------------------------------------------------------------------


@pytest.mark.anyio
async def test_dispatch_order_is_priority_then_fifo() -> None:
    order: list[tuple[int, int]] = []
    gate = Gate()
    priorities = [3, 1, 5, 2, 1, 4, 0, 3, 2, 5, 0, 4, 1]
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: order.append((e.priority, n_of(e))))
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            for i, p in enumerate(priorities):
                assert bus.publish(ev(i, priority=p))
            # Everything waits, counted per priority.
            assert bus.metrics()["depth"] == [priorities.count(p) for p in range(6)]
            assert len(bus) == len(priorities)
            gate.release.set()
            await bus.wait_idle()
            assert bus.metrics()["depth"] == [0] * 6
    assert order == sorted((p, i) for i, p in enumerate(priorities))


@pytest.mark.anyio
async def test_priority_zero_published_later_overtakes_waiting_events() -> None:
    order: list[int] = []
    gate = Gate()
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: order.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            bus.publish(ev(1, priority=1))
            bus.publish(ev(2, priority=3))
            bus.publish(ev(3, priority=5))
            bus.publish(ev(4, priority=0))  # last published, first dispatched
            gate.release.set()
            await bus.wait_idle()
    assert order == [4, 1, 2, 3]


@pytest.mark.anyio
async def test_priority_zero_published_by_a_handler_overtakes_waiting_events() -> None:
    order: list[int] = []
    gate = Gate()
    async with EventBus() as bus:

        def handler(event: Event) -> None:
            order.append(n_of(event))
            if n_of(event) == 1:
                bus.publish(ev(99, priority=0))

        bus.subscribe(USER, handler)
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            for i in range(1, 5):
                bus.publish(ev(i, priority=3))
            gate.release.set()
            await bus.wait_idle()
    assert order == [1, 99, 2, 3, 4]


# --- dedup ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_repeated_ids_are_dropped_and_counted() -> None:
    seen: list[str] = []
    event = ev()
    async with EventBus() as bus:
        bus.subscribe("*", lambda e: seen.append(e.id))
        with anyio.fail_after(TIMEOUT):
            assert bus.publish(event)
            assert not bus.publish(event)  # still queued
            await bus.wait_idle()
            assert not bus.publish(event)  # already dispatched
            assert not await bus.apublish(event)
            # An equal envelope rebuilt from the wire has the same id: a duplicate too.
            rebuilt = Event(
                id=event.id,
                timestamp=event.timestamp,
                trace_id=event.trace_id,
                source="elsewhere",
                session_id=event.session_id,
                priority=0,
                type=USER,
                payload={"n": 7},
            )
            assert not bus.publish(rebuilt)
            await bus.wait_idle()
            metrics = bus.metrics()
    assert seen == [event.id]
    assert metrics["duplicates"] == 4
    assert metrics["published"] == 1
    assert metrics["dispatched"] == {USER: 1}


@pytest.mark.anyio
async def test_dedup_false_disables_dedup() -> None:
    seen: list[str] = []
    event = ev()
    async with EventBus(dedup=False) as bus:
        bus.subscribe("*", lambda e: seen.append(e.id))
        with anyio.fail_after(TIMEOUT):
            assert bus.publish(event)
            assert bus.publish(event)
            await bus.wait_idle()
            result = bus.ingest(encode_event(event) + b"\n" + encode_event(event) + b"\n")
            assert result.accepted == 2
            assert result.duplicates == 0
            await bus.wait_idle()
            metrics = bus.metrics()
    assert seen == [event.id] * 4
    assert metrics["duplicates"] == 0
    assert metrics["published"] == 4


@pytest.mark.anyio
async def test_shared_dedup_window() -> None:
    window = DedupWindow(60_000, 1000)
    seeded = ev(0)
    assert window.check_and_insert(seeded.id)
    first = ev(1)
    seen_a: list[str] = []
    seen_b: list[str] = []
    async with EventBus(dedup=window) as bus_a, EventBus(dedup=window) as bus_b:
        bus_a.subscribe("*", lambda e: seen_a.append(e.id))
        bus_b.subscribe("*", lambda e: seen_b.append(e.id))
        with anyio.fail_after(TIMEOUT):
            assert not bus_a.publish(seeded)  # seen before the bus existed
            assert bus_a.publish(first)
            assert first.id in window  # the bus records in the window it was given
            assert not bus_b.publish(first)
            result = bus_b.ingest(encode_event(first) + b"\n")
            assert result.accepted == 0
            assert result.duplicates == 1
            await bus_a.wait_idle()
            await bus_b.wait_idle()
    assert seen_a == [first.id]
    assert seen_b == []
    assert bus_a.metrics()["duplicates"] == 1
    assert bus_b.metrics()["duplicates"] == 2


@pytest.mark.anyio
async def test_restored_window_snapshot_keeps_dropping() -> None:
    event = ev()
    window = DedupWindow(60_000, 1000)
    window.check_and_insert(event.id)
    restored = DedupWindow.restore(window.snapshot())
    async with EventBus(dedup=restored) as bus:
        assert not bus.publish(event)
        assert bus.metrics()["duplicates"] == 1


@pytest.mark.anyio
async def test_id_seen_longer_ago_than_the_window_is_not_a_duplicate() -> None:
    """Spec 002: duplicates are discarded "within a sliding window". An id first seen
    longer ago than ``window_ms`` is new again (``DedupWindow.check_and_insert`` and the
    ingest path both accept it), so ``publish`` must accept it as well."""
    stale = ev(1)
    window = DedupWindow(60_000, 1000)
    assert window.check_and_insert(stale.id, now_ms=wall_ms() - 120_000)
    seen: list[str] = []
    async with EventBus(dedup=window) as bus:
        bus.subscribe("*", lambda e: seen.append(e.id))
        with anyio.fail_after(TIMEOUT):
            assert bus.publish(stale)
            await bus.wait_idle()
    assert seen == [stale.id]
    assert bus.metrics()["duplicates"] == 0


@pytest.mark.anyio
async def test_ingest_accepts_an_id_seen_longer_ago_than_the_window() -> None:
    stale = ev(1)
    window = DedupWindow(60_000, 1000)
    assert window.check_and_insert(stale.id, now_ms=wall_ms() - 120_000)
    seen: list[str] = []
    async with EventBus(dedup=window) as bus:
        bus.subscribe("*", lambda e: seen.append(e.id))
        with anyio.fail_after(TIMEOUT):
            result = bus.ingest(encode_event(stale) + b"\n")
            assert result.accepted == 1
            await bus.wait_idle()
    assert seen == [stale.id]


@pytest.mark.anyio
async def test_queue_full_does_not_record_the_id() -> None:
    gate = Gate()
    event = ev(3)
    seen: list[int] = []
    async with EventBus(capacity=2) as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            assert bus.publish(ev(1))
            assert bus.publish(ev(2))
            with pytest.raises(QueueFull):
                bus.publish(event)
            assert len(bus) == 2
            assert bus.metrics()["published"] == 3  # the blocker and two events
            assert bus.metrics()["duplicates"] == 0
            gate.release.set()
            await bus.wait_idle()
            assert bus.publish(event)  # a retry is not a duplicate
            await bus.wait_idle()
    assert seen == [1, 2, 3]


# --- emit: publishing without a handle ----------------------------------------------------


@pytest.mark.anyio
async def test_emit_on_an_idle_bus_dispatches_an_event_nobody_subscribes_to_at_once() -> None:
    async with EventBus(capacity=1) as bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()  # the dispatcher sleeps, nothing is queued
            tick = ev(2, type_="KERNEL:TICK_START")
            assert bus.emit(tick, tick.type) is True
            assert len(bus) == 0  # not queued
            metrics = bus.metrics()
            assert metrics["dispatched"] == {"KERNEL:TICK_START": 1}
            assert metrics["published"] == 1
            assert metrics["latency_us"]["count"] == 0
            assert bus.emit(tick, tick.type) is False  # a duplicate
            assert not bus.publish(tick)  # the window knows its id
            assert bus.metrics()["duplicates"] == 2
            with pytest.raises(ValueError, match="is not the event's type"):
                bus.emit(ev(3, type_="KERNEL:TICK_START"), "KERNEL:OTHER")


@pytest.mark.anyio
async def test_emit_while_anything_could_come_first_publishes_the_event() -> None:
    """Behind a busy dispatcher an event takes its turn: a handler that subscribes
    meanwhile gets it, as it would get a published one."""
    seen: list[int] = []
    async with EventBus(capacity=2) as bus:
        gate = Gate()
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)  # the dispatcher is busy
            tick = ev(1, type_="KERNEL:TICK_START")
            assert bus.emit(tick, tick.type) is True
            assert len(bus) == 1  # queued, nobody subscribes yet
            bus.subscribe("KERNEL:*", lambda e: seen.append(n_of(e)))
            assert bus.publish(ev(2))  # the bus is full now
            second = ev(3, type_="KERNEL:TICK_START")
            with pytest.raises(QueueFull):
                bus.emit(second, second.type)
            gate.release.set()
            await bus.wait_idle()
    assert seen == [1]
    assert bus.metrics()["dispatched"] == {"INPUT:SIGNAL": 1, "KERNEL:TICK_START": 1, USER: 1}


@pytest.mark.anyio
async def test_emitter_note_makes_an_event_only_for_someone_who_could_see_it() -> None:
    """``Emitter.note``: an event nobody subscribes to on an idle bus is counted and
    its id minted through the window, as ``child`` does, and no event is made; one
    that is subscribed to, or could come behind another, is made and published."""
    seen: list[Event] = []
    async with EventBus(capacity=2) as bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            emitter = bus.emitter
            assert emitter is not None
            parent = ev(1)
            assert emitter.note(parent, "KERNEL:STATE_CHANGE", {"to": "THINKING"}, "me") is True
            assert len(bus) == 0
            metrics = bus.metrics()
            assert metrics["dispatched"] == {"KERNEL:STATE_CHANGE": 1}
            assert metrics["published"] == 1
            assert metrics["duplicates"] == 0
            bus.subscribe("KERNEL:STATE_CHANGE", seen.append)
            assert emitter.note(parent, "KERNEL:STATE_CHANGE", {"to": "IDLE"}, "me") is True
            await bus.wait_idle()
            gate = Gate()
            await block_dispatcher(bus, gate)  # busy: the event takes its turn
            assert emitter.note(parent, "KERNEL:TICK_START", {"round": 1}, "me") is True
            assert len(bus) == 1
            gate.release.set()
            await bus.wait_idle()
    assert [(e.type, e.payload, e.parent_id, e.trace_id, e.source) for e in seen] == [
        ("KERNEL:STATE_CHANGE", {"to": "IDLE"}, parent.id, parent.trace_id, "me")
    ]
    assert bus.metrics()["dispatched"]["KERNEL:STATE_CHANGE"] == 2
    assert bus.metrics()["dispatched"]["KERNEL:TICK_START"] == 1
    with pytest.raises(QueueClosed):
        emitter.note(parent, "KERNEL:STATE_CHANGE", {"to": "IDLE"}, "me")


def reusing(event_id: str) -> Event:
    """An event of another trace and session that reuses ``event_id``."""
    return Event(
        id=event_id,
        timestamp=1,
        trace_id="t",
        source="x",
        session_id="s",
        priority=2,
        type="KERNEL:TICK_START",
    )


@pytest.mark.anyio
async def test_emitter_mark_stands_an_event_ref_for_an_event_nobody_could_see() -> None:
    """``Emitter.mark``: unsubscribed on an idle bus, the event is counted and its id
    goes through the window (a later event of that id is a duplicate), and an
    ``EventRef`` with its id, trace, session, source, priority and type stands for
    it; its children are real events that name it as their parent. Subscribed
    to, or behind other events, it is made, published and returned."""
    seen: list[Event] = []
    async with EventBus(capacity=8) as bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            emitter = bus.emitter
            assert emitter is not None
            parent = Event.new(USER, {"text": "hi"}, source="user", session_id="s-1", priority=1)
            tick = emitter.mark(parent, "KERNEL:TICK_START", {"round": 1}, "agent")
            assert isinstance(tick, EventRef)
            assert len(bus) == 0
            assert uuid.UUID(tick.id).version == 4
            assert (tick.trace_id, tick.session_id, tick.source, tick.priority, tick.type) == (
                parent.trace_id,
                "s-1",
                "agent",
                1,
                "KERNEL:TICK_START",
            )
            assert bus.metrics()["dispatched"] == {"KERNEL:TICK_START": 1}
            assert bus.metrics()["published"] == 1
            # Its id went through the window: an event that reuses it is a duplicate.
            assert not bus.publish(reusing(tick.id))
            assert bus.metrics()["duplicates"] == 1
            # An EventRef is a parent as an Event is, for the Emitter and for child().
            call = emitter.mark(tick, "EXEC:TOOL_CALL", {"name": "f"}, "agent")
            assert isinstance(call, EventRef)
            assert call.trace_id == parent.trace_id
            assert call.session_id == "s-1"
            bus.subscribe("EXEC:*", seen.append)
            result = emitter.child(call, "EXEC:TOOL_RESULT", {"ok": True}, "agent")
            made = call.child("EXEC:TOOL_RESULT", {"ok": False}, priority=4)
            assert bus.publish(made)  # accepted: truthy
            assert emitter.note(call, "EXEC:TOOL_RESULT", {"n": 3}, "agent") is True
            await bus.wait_idle()
            # Subscribed to (on an idle bus): the event is made, published and returned.
            subscribed = emitter.mark(tick, "EXEC:TOOL_CALL", {"name": "g"}, "agent")
            assert type(subscribed) is Event
            await bus.wait_idle()
            # Behind another event, it takes its turn: made and queued.
            gate = Gate()
            await block_dispatcher(bus, gate)
            behind = emitter.mark(parent, "KERNEL:TICK_START", {"round": 2}, "agent")
            assert type(behind) is Event
            assert len(bus) == 1
            gate.release.set()
            await bus.wait_idle()
            with pytest.raises(TypeError, match="Event or EventRef"):
                emitter.mark("not an event", "KERNEL:TICK_START", {}, "agent")  # type: ignore[arg-type]
    # (The three results were queued together: dispatched by priority, 4 last.)
    got = [(e.type, e.payload, e.parent_id, e.trace_id, e.session_id, e.priority) for e in seen]
    assert got == [
        ("EXEC:TOOL_RESULT", {"ok": True}, call.id, parent.trace_id, "s-1", 1),
        ("EXEC:TOOL_RESULT", {"n": 3}, call.id, parent.trace_id, "s-1", 1),
        ("EXEC:TOOL_RESULT", {"ok": False}, call.id, parent.trace_id, "s-1", 4),
        ("EXEC:TOOL_CALL", {"name": "g"}, tick.id, parent.trace_id, "s-1", 1),
    ]
    assert result.payload == {"ok": True}
    assert bus.metrics()["dispatched"]["KERNEL:TICK_START"] == 2
    with pytest.raises(QueueClosed):
        emitter.mark(parent, "KERNEL:TICK_START", {"round": 3}, "agent")


TICK, STATE = "KERNEL:TICK_START", "KERNEL:STATE_CHANGE"


@pytest.mark.anyio
async def test_emitter_mark_unread_emits_both_events_unmade_or_nothing() -> None:
    """``Emitter.mark_unread``: on an idle bus with nobody subscribed to either
    type (or only ``skip`` to the first), both events are dispatched unmade, as
    ``mark`` and ``note`` dispatch them (counted, their ids through the window),
    and an ``EventRef`` stands for the first. With a subscriber to either, or
    events ahead of them, nothing is emitted and it answers ``None``."""
    seen: list[Event] = []
    async with EventBus(capacity=8) as bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            emitter = bus.emitter
            assert emitter is not None
            parent = Event.new(USER, {"text": "hi"}, source="user", session_id="s-1", priority=1)
            tick = emitter.mark_unread(parent, "KERNEL:TICK_START", "KERNEL:STATE_CHANGE", "agent")
            assert isinstance(tick, EventRef)
            assert uuid.UUID(tick.id).version == 4
            assert (tick.trace_id, tick.session_id, tick.source, tick.priority, tick.type) == (
                parent.trace_id,
                "s-1",
                "agent",
                1,
                "KERNEL:TICK_START",
            )
            assert len(bus) == 0
            metrics = bus.metrics()
            assert metrics["dispatched"] == {"KERNEL:TICK_START": 1, "KERNEL:STATE_CHANGE": 1}
            assert metrics["published"] == 2
            # The first's id went through the window: an event reusing it is a duplicate.
            assert not bus.publish(reusing(tick.id))
            # No second type: the first alone.
            alone = emitter.mark_unread(tick, "EXEC:TOOL_CALL", None, "agent")
            assert isinstance(alone, EventRef)
            assert alone.trace_id == parent.trace_id
            assert bus.metrics()["dispatched"]["EXEC:TOOL_CALL"] == 1
            # Only `skip` subscribes to the first: it counts as nobody.
            own = bus.subscribe("EXEC:TOOL_CALL", seen.append)
            assert isinstance(emitter.mark_unread(tick, "EXEC:TOOL_CALL", None, "a", own), EventRef)
            assert bus.metrics()["dispatched"]["EXEC:TOOL_CALL"] == 2
            # A subscriber to the first, or to the second: nothing emitted.
            before = bus.metrics()["dispatched"]
            assert emitter.mark_unread(tick, "EXEC:TOOL_CALL", None, "agent") is None
            state = bus.subscribe("KERNEL:STATE_CHANGE", seen.append)
            assert emitter.mark_unread(parent, TICK, STATE, "a") is None
            assert bus.metrics()["dispatched"] == before
            state.cancel()
            # Events ahead of them: nothing emitted either.
            gate = Gate()
            await block_dispatcher(bus, gate)
            assert emitter.mark_unread(parent, TICK, STATE, "a") is None
            gate.release.set()
            await bus.wait_idle()
            after = bus.metrics()["dispatched"]
            assert [after[t] for t in ("KERNEL:TICK_START", "KERNEL:STATE_CHANGE")] == [1, 1]
            with pytest.raises(TypeError, match="Event or EventRef"):
                emitter.mark_unread("not an event", "KERNEL:TICK_START", None, "a")  # type: ignore[arg-type]
    assert seen == []
    with pytest.raises(QueueClosed):
        emitter.mark_unread(parent, "KERNEL:TICK_START", "KERNEL:STATE_CHANGE", "agent")


@pytest.mark.anyio
async def test_emitter_note_unread_counts_an_event_nobody_reads_or_does_nothing() -> None:
    """``Emitter.note_unread``: on an idle bus with nobody subscribed, an event of
    the type is counted as ``note`` counts it, unmade; with a subscriber, or
    events ahead of it, nothing is emitted and it answers ``False``."""
    seen: list[Event] = []
    async with EventBus(capacity=8) as bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            emitter = bus.emitter
            assert emitter is not None
            assert emitter.note_unread(STATE) is True
            assert emitter.note_unread(STATE) is True
            assert len(bus) == 0
            metrics = bus.metrics()
            assert metrics["dispatched"] == {STATE: 2}
            assert metrics["published"] == 2
            bus.subscribe(STATE, seen.append)
            assert emitter.note_unread(STATE) is False
            gate = Gate()
            await block_dispatcher(bus, gate)
            assert emitter.note_unread(TICK) is False
            gate.release.set()
            await bus.wait_idle()
            assert bus.metrics()["dispatched"][STATE] == 2
            assert TICK not in bus.metrics()["dispatched"]
    assert seen == []
    with pytest.raises(QueueClosed):
        emitter.note_unread(TICK)


@pytest.mark.anyio
async def test_a_subscriber_a_handler_adds_gets_the_events_emitted_behind_its_event() -> None:
    seen: list[str] = []
    async with EventBus() as bus:

        def subscribe_on_first(event: Event) -> None:
            seen.append("subscribed")
            bus.subscribe("KERNEL:STATE_CHANGE", lambda e: seen.append(f"state {n_of(e)}"))

        bus.subscribe("KERNEL:TICK_START", subscribe_on_first)
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            tick = ev(1, type_="KERNEL:TICK_START")
            assert bus.emit(tick, tick.type)  # routed: queued, the dispatcher woken
            change = ev(2, type_="KERNEL:STATE_CHANGE")
            assert bus.emit(change, change.type)  # nobody listens yet, but the tick comes first
            await bus.wait_idle()
    assert seen == ["subscribed", "state 2"]


@pytest.mark.anyio
async def test_emit_of_a_subscribed_event_publishes_it() -> None:
    seen: list[int] = []
    async with EventBus(capacity=1) as bus:
        bus.subscribe("KERNEL:*", lambda e: seen.append(n_of(e)))
        gate = Gate()
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            first, second = ev(1, type_="KERNEL:TICK_START"), ev(2, type_="KERNEL:TICK_START")
            assert bus.emit(first, first.type) is True
            with pytest.raises(QueueFull):  # it takes room like any publish
                bus.emit(second, second.type)
            gate.release.set()
            await bus.wait_idle()
            assert bus.emit(first, first.type) is False
            assert bus.emit(second, second.type) is True
            await bus.wait_idle()
    assert seen == [1, 2]


@pytest.mark.anyio
async def test_emit_skips_the_one_subscription_it_is_told_to_skip() -> None:
    seen: list[tuple[str, int]] = []
    async with EventBus() as bus:
        own = bus.subscribe("EXEC:TOOL_CALL", lambda e: seen.append(("own", n_of(e))))
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            call = ev(1, type_="EXEC:TOOL_CALL")
            assert bus.emit(call, call.type, own)  # only the skipped one listens: not queued
            assert len(bus) == 0
            other = bus.subscribe("EXEC:*", lambda e: seen.append(("other", n_of(e))))
            call = ev(2, type_="EXEC:TOOL_CALL")
            assert bus.emit(call, call.type, own)  # someone else listens: both get it
            await bus.wait_idle()
            other.cancel()
    assert seen == [("own", 2), ("other", 2)]
    assert bus.metrics()["dispatched"] == {"EXEC:TOOL_CALL": 2}


def test_a_wakeup_keeps_its_cancelled_waits_in_proportion_to_the_live_ones() -> None:
    """Cancelled waits are dropped when the waits have doubled since the last time,
    so many live waiters (producers waiting for room) do not make each wait rescan them
    all, and a signal waited on and cancelled forever stays small."""

    async def main() -> tuple[list[int], int, int]:
        signal = bus_module.signal_factory()()
        sizes = []
        live = [asyncio.ensure_future(_wait(signal)) for _ in range(100)]
        await asyncio.sleep(0)
        for _ in range(2_000):
            waiting = asyncio.ensure_future(_wait(signal))
            await asyncio.sleep(0)
            waiting.cancel()
            await asyncio.sleep(0)
            sizes.append(len(signal._waiters))  # type: ignore[attr-defined]
        signal.set()
        woken = sum(await asyncio.gather(*live))
        return sizes, woken, signal._prune_at  # type: ignore[attr-defined]

    async def _wait(signal: Any) -> int:
        await signal.wait()
        return 1

    sizes, woken, prune_at = asyncio.run(main())
    assert woken == 100
    assert prune_at >= 2 * 100  # the next drop waits until the waits have doubled
    assert max(sizes) <= 2 * 100 + 1
    assert min(sizes[-100:]) >= 100  # the live waits are never dropped


@pytest.mark.anyio
async def test_a_signal_wakes_its_waiters_and_forgets_a_cancelled_one() -> None:
    signal = bus_module.signal_factory()()
    woken: list[str] = []

    async def wait(name: str, scope: anyio.CancelScope | None = None) -> None:
        if scope is None:
            await signal.wait()
        else:
            with scope:
                await signal.wait()
        woken.append(name if scope is None or not scope.cancelled_caught else f"{name} cancelled")

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()
            tg.start_soon(wait, "first")
            tg.start_soon(wait, "second", scope)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert woken == ["second cancelled"]
            assert not signal.is_set()
            signal.set()
        await signal.wait()  # already set: returns at once
    assert woken == ["second cancelled", "first"]
    assert signal.is_set()


def test_a_bus_and_its_emitter_are_collected_together() -> None:
    """The bus's emitter refers back to the bus (its publish): the cycle collector frees both."""
    bus = EventBus()
    assert bus.emit.__self__ is bus._emitter  # type: ignore[attr-defined]
    ref = weakref.ref(bus)
    del bus
    gc.collect()
    assert ref() is None


@pytest.mark.anyio
async def test_emit_after_aclose_and_of_a_non_event_raise() -> None:
    async with EventBus() as bus:
        with pytest.raises(TypeError, match=r"publish takes an openstarry\.core\.Event"):
            bus.emit({"type": "KERNEL:TICK_START"}, "KERNEL:TICK_START")  # type: ignore[arg-type]
        await bus.aclose()
        tick = ev(1, type_="KERNEL:TICK_START")
        with pytest.raises(QueueClosed):
            bus.emit(tick, tick.type)
        with pytest.raises(QueueClosed):
            bus.emit(ev(2), USER)
    assert bus.metrics()["published"] == 0


# --- deliver: a sole handler called at once on an idle bus ------------------------------


@pytest.mark.anyio
async def test_deliver_on_an_idle_bus_calls_the_sole_handler_at_once() -> None:
    seen: list[int] = []
    async with EventBus() as bus:
        sub = bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            event = ev(1)
            assert bus.deliver(event, USER, sub) is True
            assert seen == [1]  # before deliver returned, in this task
            assert len(bus) == 0
            assert bus.deliver(event, USER, sub) is False  # a duplicate
            assert seen == [1]
            metrics = bus.metrics()
    assert metrics["published"] == 1
    assert metrics["duplicates"] == 1
    assert metrics["dispatched"] == {USER: 1}
    assert metrics["latency_us"]["count"] == 0


@pytest.mark.anyio
async def test_deliver_declines_when_anything_could_come_first() -> None:
    seen: list[str] = []
    async with EventBus() as bus:
        sub = bus.subscribe(USER, lambda e: seen.append("sole"))
        gate = Gate()
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)  # the dispatcher is busy
            event = ev(1)
            assert bus.deliver(event, USER, sub) is None
            gate.release.set()
            await bus.wait_idle()
            assert bus.publish(ev(2, priority=5))
            assert bus.deliver(event, USER, sub) is None  # something is queued
            await bus.wait_idle()
            other = bus.subscribe("INPUT:*", lambda e: seen.append("other"))
            assert bus.deliver(event, USER, sub) is None  # not the only handler
            other.cancel()

            async def handler(e: Event) -> None:
                seen.append("async")

            async_sub = bus.subscribe("INPUT:OTHER", handler)
            other_event = ev(3, type_="INPUT:OTHER")
            # Not a plain function:
            assert bus.deliver(other_event, "INPUT:OTHER", async_sub) is None
            assert bus.publish(event)  # nothing above recorded its id
            await bus.wait_idle()
    assert seen == ["sole", "sole"]


@pytest.mark.anyio
async def test_deliver_reports_a_failing_handler_as_dispatch_does() -> None:
    errors: list[Any] = []
    async with EventBus() as bus:

        def boom(event: Event) -> None:
            raise RuntimeError("no")

        sub = bus.subscribe(USER, boom)
        bus.subscribe(ERROR, lambda e: errors.append(e.payload))
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            assert bus.deliver(ev(1), USER, sub) is True
            await bus.wait_idle()
    assert [(e["code"], e["message"]) for e in errors] == [("HANDLER_ERROR", "RuntimeError: no")]
    assert bus.metrics()["handler_errors"] == 1


# --- apublish and capacity -----------------------------------------------------------------


@pytest.mark.anyio
async def test_apublish_waits_for_room_then_completes() -> None:
    gate = Gate()
    order: list[int] = []
    results: list[Published] = []
    async with EventBus(capacity=2) as bus:
        bus.subscribe(USER, lambda e: order.append(n_of(e)))

        async def waiting_publisher() -> None:
            results.append(await bus.apublish(ev(3)))

        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            assert bus.publish(ev(1))
            assert bus.publish(ev(2))
            with pytest.raises(QueueFull):
                bus.publish(ev(0))
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting_publisher)
                await anyio.wait_all_tasks_blocked()
                assert results == []  # still waiting for room
                assert len(bus) == 2
                gate.release.set()
            assert [bool(r) for r in results] == [True]
            await bus.wait_idle()
    assert order == [1, 2, 3]


@pytest.mark.anyio
async def test_many_apublish_waiters_all_get_in() -> None:
    gate = Gate()
    seen: list[int] = []
    async with EventBus(capacity=1) as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            assert bus.publish(ev(0))
            async with anyio.create_task_group() as tg:
                for i in range(1, 6):
                    tg.start_soon(bus.apublish, ev(i))
                await anyio.wait_all_tasks_blocked()
                assert seen == []
                gate.release.set()
            await bus.wait_idle()
    assert sorted(seen) == list(range(6))
    assert seen[0] == 0


@pytest.mark.anyio
async def test_apublish_waiting_for_room_gets_queue_closed_on_aclose() -> None:
    gate = Gate()
    outcome: list[str] = []
    seen: list[int] = []
    async with EventBus(capacity=1) as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))

        async def waiting_publisher() -> None:
            try:
                await bus.apublish(ev(2))
            except QueueClosed:
                outcome.append("closed")
            else:
                outcome.append("published")

        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            assert bus.publish(ev(1))
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting_publisher)
                await anyio.wait_all_tasks_blocked()
                assert outcome == []
                tg.start_soon(bus.aclose)
                await anyio.wait_all_tasks_blocked()
                assert outcome == ["closed"]
                gate.release.set()
    assert seen == [1]  # what was accepted is drained, the refused event is not


# --- child events and trace propagation ----------------------------------------------------


@pytest.mark.anyio
async def test_child_events_inherit_trace_and_session() -> None:
    calls: list[Event] = []
    results: list[Event] = []
    root = ev(1, session="session-42", trace="trace-42")
    async with EventBus() as bus:

        async def on_input(event: Event) -> None:
            await bus.apublish(event.child("EXEC:TOOL_CALL", {"n": 2}))

        def on_call(event: Event) -> None:
            calls.append(event)
            bus.publish(event.child("EXEC:TOOL_RESULT", {"n": 3}, priority=0))

        bus.subscribe("INPUT:*", on_input)
        bus.subscribe("EXEC:TOOL_CALL", on_call)
        bus.subscribe("EXEC:TOOL_RESULT", results.append)
        with anyio.fail_after(TIMEOUT):
            bus.publish(root)
            await bus.wait_idle()
    assert len(calls) == 1
    assert len(results) == 1
    call, result = calls[0], results[0]
    for child, parent in ((call, root), (result, call)):
        assert child.trace_id == "trace-42"
        assert child.session_id == "session-42"
        assert child.parent_id == parent.id
        assert child.id != parent.id
        assert child.to_dict()["traceId"] == "trace-42"
        assert child.to_dict()["sessionId"] == "session-42"
    assert result.priority == 0
    assert bus.metrics()["dispatched"] == {USER: 1, "EXEC:TOOL_CALL": 1, "EXEC:TOOL_RESULT": 1}


# --- handler errors ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("is_async", [False, True])
async def test_handler_error_becomes_kernel_error_and_bus_keeps_running(is_async: bool) -> None:
    errors: list[Event] = []
    after: list[int] = []
    source_event = ev(1, session="sess-e", trace="trace-e", priority=3)

    def boom(event: Event) -> None:
        if n_of(event) == 1:
            raise ValueError("boom")

    async def aboom(event: Event) -> None:
        await anyio.lowlevel.checkpoint()
        boom(event)

    async with EventBus(source="bus-under-test") as bus:
        bus.subscribe(USER, aboom if is_async else boom)
        bus.subscribe(USER, lambda e: after.append(n_of(e)))  # runs despite the failure
        bus.subscribe(ERROR, errors.append)
        with anyio.fail_after(TIMEOUT):
            assert bus.publish(source_event)
            await bus.wait_idle()
            assert bus.publish(ev(2))  # still dispatching
            await bus.wait_idle()
            metrics = bus.metrics()
    assert after == [1, 2]
    assert len(errors) == 1
    error = errors[0]
    assert error.type == ERROR
    assert error.trace_id == "trace-e"
    assert error.session_id == "sess-e"
    assert error.parent_id == source_event.id
    assert error.source == "bus-under-test"
    payload = error.payload
    assert payload["code"] == "HANDLER_ERROR"
    assert payload["message"] == "ValueError: boom"
    assert payload["source"].endswith("aboom" if is_async else "boom")
    assert payload["details"] == {"eventId": source_event.id, "eventType": USER}
    assert metrics["handler_errors"] == 1
    assert metrics["errors_dropped"] == 0
    assert metrics["dispatched"] == {USER: 2, ERROR: 1}


@pytest.mark.anyio
async def test_error_handler_that_raises_does_not_produce_another_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error_calls: list[Event] = []

    def boom(event: Event) -> None:
        raise RuntimeError("handler")

    def bad_error_handler(event: Event) -> None:
        error_calls.append(event)
        raise RuntimeError("error handler")

    caplog.set_level(logging.ERROR, logger="openstarry.bus")
    async with EventBus() as bus:
        bus.subscribe(USER, boom)
        bus.subscribe(ERROR, bad_error_handler)
        with anyio.fail_after(TIMEOUT):
            # An error raised from a handler, whose own handler fails.
            bus.publish(ev(1))
            await bus.wait_idle()
            # A KERNEL:ERROR published directly, whose handler fails.
            bus.publish(ev(2, type_=ERROR))
            await bus.wait_idle()
            assert bus.publish(ev(3, type_="INPUT:SIGNAL"))  # the bus still takes events
            await bus.wait_idle()
            metrics = bus.metrics()
    assert len(error_calls) == 2
    assert metrics["dispatched"] == {USER: 1, ERROR: 2, "INPUT:SIGNAL": 1}
    assert metrics["handler_errors"] == 3
    assert metrics["errors_dropped"] == 2
    assert any(r.name == "openstarry.bus" and r.levelno == logging.ERROR for r in caplog.records)


@pytest.mark.anyio
async def test_handler_error_when_the_bus_is_full_is_dropped_and_counted() -> None:
    gate = Gate()
    seen: list[str] = []
    async with EventBus(capacity=1) as bus:

        async def fails_after_gate(event: Event) -> None:
            await gate.block()
            raise ValueError("late")

        bus.subscribe("INPUT:SIGNAL", fails_after_gate)
        bus.subscribe("*", lambda e: seen.append(e.type))
        with anyio.fail_after(TIMEOUT):
            bus.publish(ev(0, type_="INPUT:SIGNAL"))
            await gate.entered.wait()
            assert bus.publish(ev(1))  # the queue is now full
            gate.release.set()
            await bus.wait_idle()
            metrics = bus.metrics()
    assert seen == ["INPUT:SIGNAL", USER]
    assert metrics["handler_errors"] == 1
    assert metrics["errors_dropped"] == 1
    assert ERROR not in metrics["dispatched"]


# --- aclose --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_aclose_drains_what_was_accepted() -> None:
    gate = Gate()
    seen: list[int] = []
    refused: list[int] = []
    async with EventBus() as bus:

        def handler(event: Event) -> None:
            seen.append(n_of(event))
            try:
                bus.publish(ev(100 + n_of(event)))
            except QueueClosed:
                refused.append(n_of(event))

        bus.subscribe(USER, handler)
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            for i in range(5):
                assert bus.publish(ev(i, priority=i % 3))
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus.aclose)
                await anyio.wait_all_tasks_blocked()
                assert bus.closed
                with pytest.raises(QueueClosed):
                    bus.publish(ev(50))
                assert seen == []  # aclose is still waiting on the drain
                gate.release.set()
            # aclose returned: every accepted event was dispatched.
            assert len(bus) == 0
    assert seen == [0, 3, 1, 4, 2]
    assert refused == seen


@pytest.mark.anyio
async def test_leaving_the_context_drains_a_burst() -> None:
    seen: list[int] = []

    async def handler(event: Event) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append(n_of(event))

    with anyio.fail_after(TIMEOUT):
        async with EventBus() as bus:
            bus.subscribe(USER, handler)
            for i in range(200):
                bus.publish(ev(i))
    assert seen == list(range(200))
    assert bus.metrics()["dispatched"] == {USER: 200}


@pytest.mark.anyio
async def test_handler_error_during_drain_is_dropped_and_counted() -> None:
    gate = Gate()
    async with EventBus() as bus:

        def boom(event: Event) -> None:
            raise ValueError("during drain")

        bus.subscribe(USER, boom)
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            bus.publish(ev(1))
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus.aclose)
                await anyio.wait_all_tasks_blocked()
                gate.release.set()
    metrics = bus.metrics()
    assert metrics["dispatched"] == {"INPUT:SIGNAL": 1, USER: 1}
    assert metrics["handler_errors"] == 1
    assert metrics["errors_dropped"] == 1


# --- wait_idle -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_wait_idle_requires_a_running_bus() -> None:
    bus = EventBus()
    with pytest.raises(RuntimeError, match="not running"):
        await bus.wait_idle()


@pytest.mark.anyio
async def test_wait_idle_semantics() -> None:
    gate = Gate()
    seen: list[int] = []
    async with EventBus() as bus:

        def chain(event: Event) -> None:
            seen.append(n_of(event))
            if n_of(event) < 5:
                bus.publish(event.child(USER, {"n": n_of(event) + 1}))

        bus.subscribe(USER, chain)
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()  # nothing published: returns at once
            # Events published by handlers are waited for too.
            bus.publish(ev(0))
            await bus.wait_idle()
            assert seen == [0, 1, 2, 3, 4, 5]
            # Waiters do not return while a handler is still running.
            done: list[str] = []

            async def waiter(name: str) -> None:
                await bus.wait_idle()
                done.append(name)

            await block_dispatcher(bus, gate)
            bus.publish(ev(10))
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter, "a")
                tg.start_soon(waiter, "b")
                await anyio.wait_all_tasks_blocked()
                assert done == []
                gate.release.set()
            assert sorted(done) == ["a", "b"]
            assert seen[-1] == 10
            assert len(bus) == 0
        await bus.aclose()
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()  # a stopped bus is idle


# --- ingest --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("as_list", [False, True])
async def test_ingest_dispatches_valid_lines_and_counts_duplicates(as_list: bool) -> None:
    seen: list[int] = []
    published = ev(0)
    low = ev(1, priority=3)
    high = ev(2, priority=1)
    lines = [
        encode_event(low),
        encode_event(high),
        b"this is not json",
        encode_event(low),  # repeated within the batch
        encode_event(published),  # published earlier through publish()
    ]
    async with EventBus(latency_every=1) as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            assert bus.publish(published)
            await bus.wait_idle()  # the dispatcher is asleep: ingest must wake it
            result = bus.ingest(lines if as_list else b"".join(line + b"\n" for line in lines))
            assert result.accepted == 2
            assert result.duplicates == 2
            assert [index for index, _ in result.invalid] == [2]
            assert result.rejected == []
            await bus.wait_idle()
            metrics = bus.metrics()
    assert seen == [0, 2, 1]  # priority 1 before priority 3
    assert metrics["published"] == 3
    assert metrics["duplicates"] == 2
    assert metrics["dispatched"] == {USER: 3}
    # Ingested events have no dispatch-latency sample.
    assert metrics["latency_us"]["count"] == 1


@pytest.mark.anyio
async def test_ingested_ids_are_duplicates_for_publish() -> None:
    event = ev()
    async with EventBus() as bus:
        assert bus.ingest(encode_event(event) + b"\n").accepted == 1
        assert not bus.publish(event)
        assert bus.metrics()["duplicates"] == 1


@pytest.mark.anyio
async def test_ingest_into_a_closed_bus_is_rejected() -> None:
    async with EventBus() as bus:
        await bus.aclose()
        result = bus.ingest(encode_event(ev()) + b"\n")
        assert result.accepted == 0
        assert result.rejected == [0]
        assert bus.metrics()["published"] == 0


# --- one wake-up per batch -----------------------------------------------------------------


@pytest.mark.anyio
async def test_one_wake_up_per_burst() -> None:
    n = 100
    sleeps_seen: list[int] = []
    bus = CountingBus()
    async with bus:
        bus.subscribe(USER, lambda e: sleeps_seen.append(bus.wake_assignments))
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()  # the dispatcher sleeps
            sleeps, sets = bus.wake_assignments, bus.wake_sets
            for i in range(n):  # a burst, without yielding
                assert bus.publish(ev(i))
            assert bus.wake_sets == sets + 1  # only the first publish woke it
            await bus.wait_idle()
            assert bus.metrics()["dispatched"] == {USER: n}
            # It drained the whole burst without sleeping, then slept once.
            assert sleeps_seen == [sleeps] * n
            assert bus.wake_assignments == sleeps + 1
            assert bus.wake_sets == sets + 1


@pytest.mark.anyio
async def test_one_wake_up_per_ingested_batch() -> None:
    lines = b"".join(encode_event(ev(i)) + b"\n" for i in range(50))
    bus = CountingBus()
    async with bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            sleeps, sets = bus.wake_assignments, bus.wake_sets
            assert bus.ingest(lines).accepted == 50
            assert bus.wake_sets == sets + 1
            await bus.wait_idle()
            assert bus.wake_assignments == sleeps + 1
            assert bus.metrics()["dispatched"] == {USER: 50}


@pytest.mark.anyio
async def test_publishing_to_a_busy_dispatcher_costs_no_wake_up() -> None:
    gate = Gate()
    bus = CountingBus()
    async with bus:
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            sleeps, sets = bus.wake_assignments, bus.wake_sets
            for i in range(20):
                bus.publish(ev(i))
            assert bus.wake_sets == sets  # awake: nobody to wake
            gate.release.set()
            await bus.wait_idle()
            assert bus.wake_assignments == sleeps + 1
            assert bus.wake_sets == sets
            assert bus.metrics()["dispatched"] == {"INPUT:SIGNAL": 1, USER: 20}


@pytest.mark.anyio
async def test_wake_up_counter_sees_separate_batches() -> None:
    """The instrument itself: publishes separated by idle periods wake the dispatcher each time."""
    bus = CountingBus()
    async with bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            sleeps, sets = bus.wake_assignments, bus.wake_sets
            for i in range(5):
                bus.publish(ev(i))
                await bus.wait_idle()
            assert bus.wake_sets == sets + 5
            assert bus.wake_assignments == sleeps + 5


# --- metrics -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_metrics_counters_and_depth() -> None:
    gate = Gate()
    async with EventBus() as bus:
        fresh = bus.metrics()
        assert fresh["published"] == 0
        assert fresh["duplicates"] == 0
        assert fresh["dispatched"] == {}
        assert fresh["depth"] == [0] * 6
        assert fresh["handler_errors"] == 0
        assert fresh["errors_dropped"] == 0
        assert fresh["latency_us"] == {"count": 0, "p50": None, "p99": None, "max": None}
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)
            repeated = ev(0, priority=0)
            bus.publish(repeated)
            bus.publish(repeated)
            bus.publish(ev(1, priority=4))
            bus.publish(ev(2, priority=4, type_="EXEC:TOOL_CALL"))
            bus.publish(ev(3, priority=5, type_="EXEC:TOOL_RESULT"))
            bus.publish(ev(4, priority=0, type_="EXEC:TOOL_CALL"))
            waiting = bus.metrics()
            assert waiting["depth"] == [2, 0, 0, 0, 2, 1]
            assert waiting["dispatched"] == {"INPUT:SIGNAL": 1}
            gate.release.set()
            await bus.wait_idle()
            done = bus.metrics()
    assert done["published"] == 6
    assert done["duplicates"] == 1
    assert done["depth"] == [0] * 6
    assert done["dispatched"] == {
        "INPUT:SIGNAL": 1,
        USER: 2,
        "EXEC:TOOL_CALL": 2,
        "EXEC:TOOL_RESULT": 1,
    }
    # metrics() returns a copy: mutating it changes nothing.
    done["dispatched"][USER] = 1000
    assert bus.metrics()["dispatched"][USER] == 2


@pytest.mark.anyio
async def test_latency_metrics_are_consistent() -> None:
    async with EventBus(latency_every=1) as bus:

        def boom(event: Event) -> None:
            if n_of(event) == 0:
                raise ValueError("one error event")

        bus.subscribe(USER, boom)
        with anyio.fail_after(TIMEOUT):
            for i in range(25):
                bus.publish(ev(i, priority=i % 6))
                if i % 7 == 0:
                    await bus.wait_idle()
            await bus.wait_idle()
            metrics = bus.metrics()
    latency = metrics["latency_us"]
    # Every published event (the bus's own KERNEL:ERROR too) has one sample.
    assert metrics["published"] == 26
    assert latency["count"] == metrics["published"]
    assert sum(metrics["dispatched"].values()) == 26
    p50, p99, top = latency["p50"], latency["p99"], latency["max"]
    for value in (p50, p99, top):
        assert isinstance(value, (int, float))
        assert value >= 0
    assert p50 <= p99 <= top


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("samples", "expected_max", "expected_p50"),
    [(4096, 9000.0, {7000.0, 8000.0}), (2, 8000.0, {7000.0, 8000.0})],
)
async def test_latency_from_a_controlled_clock(
    monkeypatch: pytest.MonkeyPatch,
    samples: int,
    expected_max: float,
    expected_p50: set[float],
) -> None:
    """With the bus's clock replaced, the latencies (publish to dispatch) are exact."""
    clock = [0]
    monkeypatch.setattr(bus_handles, "_perf_ns", lambda: clock[0])
    gate = Gate()
    async with EventBus(latency_samples=samples, latency_every=1) as bus:
        with anyio.fail_after(TIMEOUT):
            await block_dispatcher(bus, gate)  # published and dispatched at 0: latency 0
            for i in (1, 2, 3):
                clock[0] = i * 1_000_000  # published at 1, 2 and 3 ms
                bus.publish(ev(i))
            clock[0] = 10_000_000  # all dispatched at 10 ms: 9, 8 and 7 ms
            gate.release.set()
            await bus.wait_idle()
            latency = bus.metrics()["latency_us"]
    assert latency["count"] == 4
    assert latency["max"] == expected_max
    assert latency["p99"] == expected_max
    assert latency["p50"] in expected_p50


@pytest.mark.anyio
async def test_latency_is_measured_on_wake_ups_and_one_event_in_latency_every() -> None:
    """Events that wake the dispatcher are all measured; in a burst, one in ``latency_every``."""
    async with EventBus(latency_every=4) as bus:
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            for i in range(3):  # one at a time: each wakes the dispatcher
                bus.publish(ev(i))
                await bus.wait_idle()
            assert bus.metrics()["latency_us"]["count"] == 3
            for i in range(3, 19):  # a burst: the first wakes it, then published 4..19
                bus.publish(ev(i))
            await bus.wait_idle()
            metrics = bus.metrics()
    assert metrics["published"] == 19
    # Measured in the burst: the first (a wake-up), then the 8th, 12th and 16th published.
    assert metrics["latency_us"]["count"] == 3 + 1 + 3
    assert sum(metrics["dispatched"].values()) == 19


def test_latency_every_must_be_at_least_one() -> None:
    for bad in (0, -4):
        with pytest.raises(ValueError, match="latency_every"):
            EventBus(latency_every=bad)


@pytest.mark.anyio
async def test_aclose_from_a_handler_closes_without_deadlock() -> None:
    seen: list[str] = []
    with anyio.fail_after(5):
        async with EventBus() as bus:

            async def closer(event: Event) -> None:
                seen.append(event.type)
                await bus.aclose()  # must not wait for the dispatcher that runs it

            bus.subscribe("SYS:CLOSE", closer)
            bus.subscribe("APP:*", lambda e: seen.append(e.type))
            bus.publish(Event.new("SYS:CLOSE", None, source="t", session_id="s", priority=0))
            bus.publish(Event.new("APP:AFTER", None, source="t", session_id="s"))
            await bus.wait_idle()
    assert bus.closed
    # What was accepted before the close is still dispatched.
    assert seen == ["SYS:CLOSE", "APP:AFTER"]


def user_event(type_: str = "X:Y") -> Event:
    return Event.new(type_, {"n": 1}, source="test", session_id="s")


@pytest.mark.anyio
async def test_publish_to_a_closed_bus_does_not_record_the_id() -> None:
    """``publish`` into a closed bus raises QueueClosed before the dedup window records
    the event's id, so with a shared or restored DedupWindow the refused event can
    still be published on the next bus instead of being dropped as a duplicate."""
    window = DedupWindow(60_000, 1000)
    event = user_event()
    async with EventBus(dedup=window) as old:
        await old.aclose()
        with pytest.raises(QueueClosed):
            old.publish(event)
    assert event.id not in window
    async with EventBus(dedup=window) as new:
        assert new.publish(event)


@pytest.mark.anyio
async def test_a_cancelled_subscription_gets_no_more_events() -> None:
    """Once ``Subscription.cancel`` has returned, the handler is not called again, even
    for an event whose dispatch was already under way (the loop relies on this when it
    unsubscribes in ``__aexit__``)."""
    entered = anyio.Event()
    proceed = anyio.Event()
    late: list[str] = []

    async def first(event: Event) -> None:
        entered.set()
        await proceed.wait()

    async with EventBus() as bus:
        bus.subscribe("*", first)
        second = bus.subscribe("*", lambda event: late.append(event.type))
        bus.publish(user_event())
        with anyio.fail_after(HANG):
            await entered.wait()
            second.cancel()
            proceed.set()
            await bus.wait_idle()
    assert late == []


@pytest.mark.anyio
async def test_a_handler_error_that_cannot_be_printed_does_not_stop_the_bus() -> None:
    """A handler whose exception cannot be printed still becomes a KERNEL:ERROR with a
    fallback message, and the bus goes on dispatching later events."""
    seen: list[str] = []

    def bad(event: Event) -> None:
        if event.type == "X:BAD":
            raise UnprintableError(2)

    async with EventBus() as bus:
        bus.subscribe("*", bad)
        bus.subscribe("*", lambda event: seen.append(event.type))
        with anyio.fail_after(HANG):
            bus.publish(user_event("X:BAD"))
            await bus.wait_idle()
            bus.publish(user_event("X:GOOD"))
            await bus.wait_idle()
    assert seen == ["X:BAD", ERROR, "X:GOOD"]


@pytest.mark.anyio
async def test_cancelled_while_the_bus_drains_exits_its_task_group() -> None:
    """Cancelling the task while ``async with EventBus()`` drains on exit (a timeout, or
    Ctrl-C in the CLI) still exits the bus's task group, so the cancellation is caught
    by the scope that issued it and the task's cancel scope stack stays intact."""
    draining = anyio.Event()

    with anyio.CancelScope() as scope:

        async def slow(event: Event) -> None:
            with anyio.fail_after(HANG):
                while not bus.closed:  # the host task is now in aclose()
                    await anyio.lowlevel.checkpoint()
            draining.set()
            scope.cancel()
            await anyio.sleep_forever()

        async with EventBus() as bus:
            bus.subscribe("*", slow)
            bus.publish(user_event())
    assert draining.is_set()
    assert scope.cancelled_caught
    await anyio.lowlevel.checkpoint()  # the task's cancel scope stack is intact


@pytest.mark.anyio
async def test_wait_idle_from_a_handler_does_not_deadlock_the_bus() -> None:
    """``wait_idle`` called from a handler returns or raises RuntimeError at once
    instead of waiting for the dispatcher that is running it, so the bus never
    deadlocks on itself (as ``aclose`` already avoids)."""
    outcome: list[str] = []

    async def handler(event: Event) -> None:
        try:
            with anyio.fail_after(0.5):
                await bus.wait_idle()
            outcome.append("returned")
        except RuntimeError:
            outcome.append("refused")
        except TimeoutError:
            outcome.append("deadlocked")

    async with EventBus() as bus:
        bus.subscribe("*", handler)
        bus.publish(user_event())
        with anyio.fail_after(HANG):
            while not outcome:
                await anyio.sleep(0.01)
    assert outcome in (["returned"], ["refused"])


@pytest.mark.anyio
async def test_the_route_cache_does_not_grow_with_every_event_type_seen() -> None:
    """The bus's route cache stays bounded however many distinct event types pass
    through, so a peer sending ever new types cannot grow memory without bound."""
    async with EventBus() as bus:
        bus.subscribe("*", lambda event: None)
        with anyio.fail_after(HANG):
            for i in range(5000):
                bus.publish(user_event(f"X:T{i}"))
            await bus.wait_idle()
        cached = len(bus._routes.by_type)
    assert cached <= 1024


# --- lifecycle: entered again -------------------------------------------------------


def _lifecycle_event(n: int) -> Event:
    return Event.new("INPUT:USER_MESSAGE", {"n": n}, source="test", session_id="s")


@pytest.mark.anyio
async def test_a_bus_can_be_entered_again_after_it_exits() -> None:
    bus = EventBus()
    seen: list[int] = []
    bus.subscribe("INPUT:*", lambda event: seen.append(event.payload["n"]))
    first = _lifecycle_event(1)
    with anyio.fail_after(TIMEOUT):
        async with bus:
            assert bus.publish(first)
        assert bus.closed
        async with bus:
            assert not bus.closed
            assert not bus.publish(first)  # the dedup window carries on
            assert bus.publish(_lifecycle_event(2))
            await bus.wait_idle()
    assert seen == [1, 2]
    metrics = bus.metrics()
    assert metrics["published"] == 2
    assert metrics["duplicates"] == 1


@pytest.mark.anyio
async def test_a_bus_left_on_an_error_can_be_entered_again() -> None:
    bus = EventBus()
    seen: list[int] = []
    bus.subscribe("INPUT:*", lambda event: seen.append(event.payload["n"]))
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(LookupError):
            async with bus:
                raise LookupError("the body failed")
        async with bus:
            bus.publish(_lifecycle_event(3))
            await bus.wait_idle()
    assert seen == [3]


@pytest.mark.anyio
async def test_a_bus_publishes_before_it_runs_and_dispatches_once_entered() -> None:
    bus = EventBus()
    seen: list[int] = []
    bus.subscribe("INPUT:*", lambda event: seen.append(event.payload["n"]))
    assert bus.publish(_lifecycle_event(4))
    with anyio.fail_after(TIMEOUT):
        async with bus:
            await bus.wait_idle()
    assert seen == [4]


# --- the Published handle ------------------------------------------------------------------


@pytest.mark.anyio
async def test_awaiting_a_handle_waits_until_its_handlers_have_finished() -> None:
    gate = Gate()
    done: list[str] = []

    async def slow(event: Event) -> None:
        await gate.block()
        done.append("slow")

    async with EventBus() as bus:
        bus.subscribe(USER, slow)
        bus.subscribe(USER, lambda e: done.append("sync"))
        with anyio.fail_after(TIMEOUT):
            handle = bus.publish(ev(1))
            assert isinstance(handle, Published)
            assert handle
            assert handle.accepted
            assert handle.event.type == USER
            assert not handle.done()
            assert handle.outcome is None
            outcomes: list[str] = []

            async def waiter() -> None:
                outcomes.append(await handle)

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await gate.entered.wait()
                await anyio.wait_all_tasks_blocked()
                assert outcomes == []  # the first handler is still running
                gate.release.set()
            assert outcomes == ["handled"]
            assert done == ["slow", "sync"]  # both handlers ran before the await returned
            assert handle.done()
            assert handle.outcome == "handled"
            assert await handle.handled() == "handled"  # again, at once


@pytest.mark.anyio
async def test_a_handle_awaited_after_its_dispatch_answers_at_once() -> None:
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: None)
        with anyio.fail_after(TIMEOUT):
            handle = bus.publish(ev(1))
            await bus.wait_idle()
            assert handle.done()
            assert await handle == "handled"


@pytest.mark.anyio
async def test_a_duplicate_handle_is_falsy_and_answers_duplicate_at_once() -> None:
    seen: list[int] = []
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            event = ev(1)
            first = bus.publish(event)
            again = bus.publish(event)
            later = await bus.apublish(event)
            for duplicate in (again, later):
                assert not duplicate
                assert duplicate.accepted is False
                assert duplicate.done()
                assert duplicate.outcome == "duplicate"
                assert await duplicate == "duplicate"
                assert duplicate.event is event
            assert await first == "handled"
    assert seen == [1]


@pytest.mark.anyio
@pytest.mark.parametrize("is_async", [False, True])
async def test_a_handle_whose_handler_raised_answers_failed(is_async: bool) -> None:
    after: list[int] = []
    errors: list[Event] = []

    def boom(event: Event) -> None:
        raise ValueError("no")

    async def aboom(event: Event) -> None:
        raise ValueError("no")

    async with EventBus() as bus:
        bus.subscribe(USER, aboom if is_async else boom)
        bus.subscribe(USER, lambda e: after.append(n_of(e)))
        bus.subscribe(ERROR, errors.append)
        with anyio.fail_after(TIMEOUT):
            failing = bus.publish(ev(1))
            assert await failing == "failed"
            assert failing.outcome == "failed"
            await bus.wait_idle()
    assert after == [1]  # the next handler still ran
    [error] = errors
    assert error.parent_id == failing.event.id


@pytest.mark.anyio
async def test_a_handle_of_an_event_nobody_subscribed_to_answers_no_subscriber() -> None:
    async with EventBus() as bus:
        bus.subscribe("EXEC:*", lambda e: None)
        with anyio.fail_after(TIMEOUT):
            unrouted = bus.publish(ev(1))
            routed = bus.publish(ev(2, type_="EXEC:TOOL_CALL"))
            assert await unrouted == "no_subscriber"
            assert await routed == "handled"


@pytest.mark.anyio
async def test_several_tasks_awaiting_one_handle_all_get_its_outcome() -> None:
    gate = Gate()
    outcomes: list[str] = []
    async with EventBus() as bus:

        async def blocked(event: Event) -> None:
            await gate.block()

        bus.subscribe(USER, blocked)
        with anyio.fail_after(TIMEOUT):
            handle = bus.publish(ev(1))

            async def waiter() -> None:
                outcomes.append(await handle.handled())

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(waiter)
                await gate.entered.wait()
                await anyio.wait_all_tasks_blocked()
                assert outcomes == []
                gate.release.set()
    assert outcomes == ["handled"] * 3


@pytest.mark.anyio
async def test_the_bus_closing_dispatches_accepted_events_before_their_handles_answer() -> None:
    outcomes: list[str] = []
    seen: list[int] = []
    async with anyio.create_task_group() as tg, EventBus() as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        handles = [bus.publish(ev(i)) for i in range(3)]

        async def waiter(handle: Published) -> None:
            outcomes.append(await handle)

        for handle in handles:
            tg.start_soon(waiter, handle)
        await anyio.wait_all_tasks_blocked()
        # Left normally: aclose() dispatched everything accepted.
    assert seen == [0, 1, 2]
    assert outcomes == ["handled"] * 3


@pytest.mark.anyio
async def test_a_bus_left_on_an_error_answers_stopped_and_keeps_what_it_had_not_taken() -> None:
    gate = Gate()
    seen: list[int] = []
    bus = EventBus()
    bus.subscribe(USER, lambda e: seen.append(n_of(e)))
    outcomes: dict[str, str] = {}

    async def waiter(name: str, handle: Published) -> None:
        outcomes[name] = await handle

    async def run_and_fail(tg: anyio.abc.TaskGroup) -> Published:
        async with bus:
            await block_dispatcher(bus, gate)
            queued = bus.publish(ev(1))
            tg.start_soon(waiter, "queued", queued)
            await anyio.wait_all_tasks_blocked()
            raise LookupError(queued)  # the blocked handler is cancelled

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            with pytest.raises(LookupError) as failed:
                await run_and_fail(tg)
        queued = failed.value.args[0]
        assert outcomes == {"queued": "stopped"}
        assert not queued.done()  # still queued: the bus may run again
        assert seen == []
        assert bus.publish(ev(2))  # between runs: queued behind the one left
        async with bus:
            assert await queued == "handled"
            await bus.wait_idle()
    assert seen == [1, 2]


@pytest.mark.anyio
async def test_the_handle_of_an_event_whose_handlers_were_cancelled_answers_stopped() -> None:
    gate = Gate()
    bus = EventBus()

    async def blocked(event: Event) -> None:
        await gate.block()

    bus.subscribe(USER, blocked)

    async def run_and_fail() -> None:
        async with bus:
            await gate.entered.wait()
            raise LookupError("the body failed")

    handle = bus.publish(ev(1))
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(LookupError):
            await run_and_fail()
        assert handle.done()
        assert await handle == "stopped"


@pytest.mark.anyio
async def test_publish_and_apublish_return_handles_in_a_burst() -> None:
    n = 600  # more than two dispatcher batches
    seen: list[int] = []
    async with EventBus() as bus:
        bus.subscribe(USER, lambda e: seen.append(n_of(e)))
        with anyio.fail_after(TIMEOUT):
            handles = [bus.publish(ev(i)) for i in range(n)]
            handles.append(await bus.apublish(ev(n)))
            assert all(handles)
            assert [await h for h in handles] == ["handled"] * (n + 1)
    assert seen == list(range(n + 1))


class _RecordingBackend:
    """A remote backend that keeps what is sent (it never delivers)."""

    def __init__(self) -> None:
        self.sent: list[Event] = []

    def send(self, event: Event, cause: Event | None = None) -> None:
        self.sent.append(event)

    async def asend(self, event: Event, cause: Event | None = None) -> bool:
        self.sent.append(event)
        return True

    @contextlib.asynccontextmanager
    async def running(self, bus: BusHost) -> AsyncIterator[None]:
        yield

    def done(self, event: Event, outcome: str) -> None:
        pass

    async def flush(self) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {}


@pytest.mark.anyio
async def test_a_remote_handle_cannot_be_awaited_but_a_duplicate_can() -> None:
    backend = _RecordingBackend()
    async with EventBus(backend=backend) as bus:
        event = ev(1)
        sent = bus.publish(event)
        asent = await bus.apublish(ev(2))
        assert sent
        assert asent
        assert backend.sent == [event, asent.event]
        for handle in (sent, asent):
            assert handle.outcome is None
            with pytest.raises(RuntimeError, match="remote backend"):
                await handle
        duplicate = bus.publish(event)
        assert not duplicate
        assert await duplicate == "duplicate"


def test_a_handle_repr_names_the_event_and_its_state() -> None:
    event = ev(1)
    bus = EventBus()
    handle = bus.publish(event)
    assert repr(handle) == f"<Published {USER} {event.id} pending>"
    assert repr(bus.publish(event)) == f"<Published {USER} {event.id} duplicate>"


@pytest.mark.anyio
async def test_events_fed_during_a_batch_overtake_its_less_urgent_rest() -> None:
    order: list[int] = []
    gate = Gate()
    async with EventBus(backend=_RecordingBackend()) as bus:

        async def handler(event: Event) -> None:
            order.append(n_of(event))
            if n_of(event) == 1:
                await gate.block()

        bus.subscribe(USER, handler)
        with anyio.fail_after(TIMEOUT):
            # One batch: the dispatcher takes all three, then blocks in the first.
            bus.feed([ev(1, priority=3), ev(2, priority=3), ev(3, priority=4)])
            await gate.entered.wait()
            bus.feed([ev(4, priority=0), ev(5, priority=3)])
            gate.release.set()
            await bus.wait_idle()
    assert order == [1, 4, 2, 5, 3]


@pytest.mark.anyio
async def test_events_ingested_by_a_handler_overtake_the_less_urgent_rest_of_its_batch() -> None:
    order: list[int] = []
    async with EventBus() as bus:

        def handler(event: Event) -> None:
            order.append(n_of(event))
            if n_of(event) == 1:
                bus.ingest(encode_event(ev(9, priority=0)) + b"\n")

        bus.subscribe(USER, handler)
        with anyio.fail_after(TIMEOUT):
            await bus.wait_idle()
            for i, priority in ((1, 2), (2, 2), (3, 5)):  # one burst: one batch
                bus.publish(ev(i, priority=priority))
            await bus.wait_idle()
    assert order == [1, 9, 2, 3]
