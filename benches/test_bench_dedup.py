"""DedupWindow.check_and_insert against set + deque windows in Python, one call per id."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from benches.baselines import CountDedup, TimeDedup
from benches.data import ids, with_repeats
from benches.harness import Benchmark, measure
from openstarry.core import DedupWindow

N = 10_000
#: The window holds this many ids; setup fills it first, so every round runs at
#: steady state, evicting one old id for each new one.
MAX_ENTRIES = 5_000
WINDOW_MS = 60_000
ROUNDS = 100
GROUP = "dedup: check_and_insert, UUID4 ids, 10% repeats (per call)"


@pytest.fixture(scope="module")
def warm() -> list[str]:
    return ids(MAX_ENTRIES, seed=2)


@pytest.fixture(scope="module")
def stream() -> list[str]:
    return with_repeats(ids(N, seed=3), 0.10, seed=4)


def _run(check: Callable[[str], bool], stream: list[str]) -> int:
    kept = 0
    for id_ in stream:
        if check(id_):
            kept += 1
    return kept


def _openstarry(warm: list[str]) -> DedupWindow:
    window = DedupWindow(window_ms=WINDOW_MS, max_entries=MAX_ENTRIES)
    window.check_and_insert_many(warm)
    return window


def _count(warm: list[str]) -> CountDedup:
    window = CountDedup(MAX_ENTRIES)
    for id_ in warm:
        window.check_and_insert(id_)
    return window


def _time(warm: list[str]) -> TimeDedup:
    window = TimeDedup(WINDOW_MS, MAX_ENTRIES)
    for id_ in warm:
        window.check_and_insert(id_)
    return window


def _expected(stream: list[str]) -> int:
    return len(set(stream))


def _arriving(stream: list[str]) -> list[str]:
    """New string objects with the same text, as ids decoded off the wire are.

    Reusing one list across rounds would hand the Python baselines ids whose
    hash ``str`` has already computed and cached.
    """
    return [id_.encode().decode() for id_ in stream]


def test_openstarry(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    assert _run(_openstarry(warm).check_and_insert, stream) == _expected(stream)
    measure(
        benchmark,
        _run,
        group=GROUP,
        label="DedupWindow (60 s, 5000 ids)",
        ops=N,
        rounds=ROUNDS,
        role="openstarry",
        setup=lambda: ((_openstarry(warm).check_and_insert, _arriving(stream)), {}),
    )


def test_floor(benchmark: Benchmark, stream: list[str]) -> None:
    measure(
        benchmark,
        _run,
        group=GROUP,
        label="the loop alone (C no-op check: len)",
        ops=N,
        rounds=ROUNDS,
        role="floor",
        setup=lambda: ((len, _arriving(stream)), {}),
        note="The loop that drives one call per id, timed with a C no-op callee.",
    )


def test_count_window(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    assert _run(_count(warm).check_and_insert, stream) == _expected(stream)
    measure(
        benchmark,
        _run,
        group=GROUP,
        label="set + deque, 5000 ids",
        ops=N,
        rounds=ROUNDS,
        target=3.0,
        setup=lambda: ((_count(warm).check_and_insert, _arriving(stream)), {}),
    )


def test_time_window(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    assert _run(_time(warm).check_and_insert, stream) == _expected(stream)
    measure(
        benchmark,
        _run,
        group=GROUP,
        label="set + deque, 60 s (time.time()) and 5000 ids",
        ops=N,
        rounds=ROUNDS,
        target=5.0,
        setup=lambda: ((_time(warm).check_and_insert, _arriving(stream)), {}),
    )
