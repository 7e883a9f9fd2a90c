"""DedupWindow against set + deque windows in Python: one call per id, then batches of 1,024."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from benches.baselines import CountDedup, TimeDedup
from benches.data import ids, with_repeats
from benches.harness import Benchmark, measure
from openstarry.core import DedupWindow

N = 200_000
#: The window holds this many ids; setup fills it first, so every round runs at
#: steady state, evicting one old id for each new one.
MAX_ENTRIES = 100_000
WINDOW_MS = 60_000
ROUNDS = 15
BATCH = 1_024
GROUP = "dedup: check_and_insert, 200,000 UUID4 ids, 10% repeats (per call)"
BATCH_GROUP = "dedup: check_and_insert_many, batches of 1,024, same ids (per id)"


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


def _run_batches(check_many: Callable[[list[str]], list[bool]], batches: list[list[str]]) -> int:
    kept = 0
    for batch in batches:
        kept += sum(check_many(batch))
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


def _arriving(stream: Sequence[str]) -> list[str]:
    """New string objects with the same text, as ids decoded off the wire are.

    Reusing one list across rounds would hand the Python baselines ids whose
    hash ``str`` has already computed and cached.
    """
    return [id_.encode().decode() for id_ in stream]


def _arriving_batches(stream: list[str]) -> list[list[str]]:
    fresh = _arriving(stream)
    return [fresh[i : i + BATCH] for i in range(0, len(fresh), BATCH)]


# ---------------------------------------------------------------- one call per id


def test_openstarry(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    assert _run(_openstarry(warm).check_and_insert, stream) == _expected(stream)
    measure(
        benchmark,
        _run,
        group=GROUP,
        label="DedupWindow (60 s, 100,000 ids)",
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
        label="set + deque, 100,000 ids",
        ops=N,
        rounds=ROUNDS,
        target=1.2,
        setup=lambda: ((_count(warm).check_and_insert, _arriving(stream)), {}),
    )


def test_time_window(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    assert _run(_time(warm).check_and_insert, stream) == _expected(stream)
    measure(
        benchmark,
        _run,
        group=GROUP,
        label="set + deque, 60 s (time.time()) and 100,000 ids",
        ops=N,
        rounds=ROUNDS,
        setup=lambda: ((_time(warm).check_and_insert, _arriving(stream)), {}),
        note=(
            "Also bounded by time, as DedupWindow is; no target: at 100,000 ids both "
            "sides pay the same cache misses, so its clock read no longer dominates."
        ),
    )


# ---------------------------------------------------------------- batches


def test_batch_openstarry(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    batches = _arriving_batches(stream)
    assert _run_batches(_openstarry(warm).check_and_insert_many, batches) == _expected(stream)
    measure(
        benchmark,
        _run_batches,
        group=BATCH_GROUP,
        label="DedupWindow.check_and_insert_many (60 s, 100,000 ids)",
        ops=N,
        rounds=ROUNDS,
        role="openstarry",
        setup=lambda: ((_openstarry(warm).check_and_insert_many, _arriving_batches(stream)), {}),
    )


def test_batch_count_window(benchmark: Benchmark, warm: list[str], stream: list[str]) -> None:
    measure(
        benchmark,
        _run,
        group=BATCH_GROUP,
        label="set + deque, 100,000 ids, one call per id",
        ops=N,
        rounds=ROUNDS,
        target=3.0,
        setup=lambda: ((_count(warm).check_and_insert, _arriving(stream)), {}),
    )


def test_batch_count_window_batch_method(
    benchmark: Benchmark, warm: list[str], stream: list[str]
) -> None:
    batches = _arriving_batches(stream)
    assert _run_batches(_count(warm).check_and_insert_many, batches) == _expected(stream)
    measure(
        benchmark,
        _run_batches,
        group=BATCH_GROUP,
        label="set + deque, 100,000 ids, Python check_and_insert_many",
        ops=N,
        rounds=ROUNDS,
        setup=lambda: ((_count(warm).check_and_insert_many, _arriving_batches(stream)), {}),
        note="A batch method in Python: the window's loop inside one method, names hoisted.",
    )
