"""NDJSON bytes to popped events: Ingestor + pop_many against a Python pipeline."""

from __future__ import annotations

from typing import Any

import pytest

from benches.baselines import TimeDedup, python_drain, python_ingest
from benches.data import envelopes, with_repeats
from benches.harness import Benchmark, measure
from openstarry.core import DedupWindow, Event, EventQueue, Ingestor

N = 10_000
WINDOW_MS = 60_000
MAX_ENTRIES = 100_000
ROUNDS = 50
GROUP = "ingest: 10,000 NDJSON lines, 10% duplicates, to popped events (per line)"


@pytest.fixture(scope="module")
def batch() -> bytes:
    lines = with_repeats(envelopes(N, seed=6), 0.10, seed=7)
    return b"\n".join(lines) + b"\n"


def _openstarry(ingestor: Ingestor, batch: bytes) -> tuple[int, list[Event]]:
    result = ingestor.ingest(batch)
    pop_many = ingestor.queue.pop_many
    events: list[Event] = []
    while chunk := pop_many(65_536):
        events += chunk
    return result.accepted, events


def _python(dedup: TimeDedup, batch: bytes) -> tuple[int, list[Any]]:
    heap: list[tuple[int, int, Any]] = []
    result = python_ingest(batch, dedup, heap)
    return result.accepted, python_drain(heap)


def _fresh_ingestor() -> Ingestor:
    return Ingestor(EventQueue(), DedupWindow(window_ms=WINDOW_MS, max_entries=MAX_ENTRIES))


def test_openstarry(benchmark: Benchmark, batch: bytes) -> None:
    accepted, events = _openstarry(_fresh_ingestor(), batch)
    py_accepted, py_events = _python(TimeDedup(WINDOW_MS, MAX_ENTRIES), batch)
    assert accepted == py_accepted == len(events)
    assert [e.id for e in events] == [d["id"] for d in py_events]
    measure(
        benchmark,
        _openstarry,
        group=GROUP,
        label="Ingestor.ingest + pop_many",
        ops=N,
        rounds=ROUNDS,
        role="openstarry",
        setup=lambda: ((_fresh_ingestor(), batch), {}),
    )


def test_python(benchmark: Benchmark, batch: bytes) -> None:
    measure(
        benchmark,
        _python,
        group=GROUP,
        label="orjson + validation + set/deque dedup + heapq",
        ops=N,
        rounds=ROUNDS,
        target=15.0,
        setup=lambda: ((TimeDedup(WINDOW_MS, MAX_ENTRIES), batch), {}),
    )
