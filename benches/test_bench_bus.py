"""EventBus against the pure-Python asyncio bus: a burst published, then dispatched.

Each round makes fresh events (untimed), then times one ``asyncio.run``: enter
the bus, subscribe one plain-function handler, publish every event without
yielding, wait until all have been dispatched, leave. Both buses de-duplicate
ids (a window of 100,000) and route by type to the handler; openstarry's
``publish`` returns an awaitable :class:`~openstarry.bus.Published` handle for
each event. The per-event time is the round's time over the events.
"""

from __future__ import annotations

import asyncio
from typing import Any

from benches.harness import Benchmark, measure
from openstarry.bench import PurePythonBus
from openstarry.bus import EventBus
from openstarry.core import Event

N = 20_000
ROUNDS = 40
GROUP = "bus: publish a burst + dispatch it, asyncio (per event)"


def _fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
    events = [Event.new("BENCH:PING", None, source="bench", session_id="s") for _ in range(N)]
    return (events,), {}


async def _burst(bus: Any, events: list[Event]) -> int:
    count = [0]

    def handler(event: Event) -> None:
        count[0] += 1

    async with bus:
        bus.subscribe("BENCH:PING", handler)
        for event in events:
            bus.publish(event)
        await bus.wait_idle()
    return count[0]


def _openstarry(events: list[Event]) -> int:
    return asyncio.run(_burst(EventBus(capacity=None), events))


def _pure_python(events: list[Event]) -> int:
    return asyncio.run(_burst(PurePythonBus(), events))


def test_every_event_reaches_the_handler_on_both_buses() -> None:
    """Untimed: each side dispatches every event of a burst exactly once."""
    (events,), _ = _fresh()
    assert _openstarry(events) == N
    (events,), _ = _fresh()
    assert _pure_python(events) == N


def test_bus_openstarry(benchmark: Benchmark) -> None:
    measure(
        benchmark,
        _openstarry,
        group=GROUP,
        label="EventBus (Rust queue + dedup window, batched dispatch)",
        ops=N,
        rounds=ROUNDS,
        setup=_fresh,
        role="openstarry",
        note=(
            f"{N:,} events published without yielding, then wait_idle(); one plain-function "
            "handler; dedup on (100,000 ids); each publish returns a Published handle."
        ),
    )


def test_bus_pure_python(benchmark: Benchmark) -> None:
    measure(
        benchmark,
        _pure_python,
        group=GROUP,
        label="pure-Python asyncio bus",
        ops=N,
        rounds=ROUNDS,
        setup=_fresh,
        target=2.0,
        note=(
            "openstarry.bench.PurePythonBus: asyncio.PriorityQueue of (priority, seq, event), "
            "set + deque dedup window of 100,000 ids, a dispatcher task routing by type."
        ),
    )
