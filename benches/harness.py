"""How every benchmark is run and labelled, so ``ratios.py`` can pair them up."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pytest_benchmark.fixture import FixtureAlreadyUsed
from pytest_benchmark.stats import Metadata

#: What an entry is to ``ratios.py``: the group's reference, a baseline set
#: beside it, the group's driving loop alone, or figures in a note.
Role = Literal["openstarry", "baseline", "floor", "report"]


class Benchmark(Protocol):
    """The part of pytest-benchmark's ``benchmark`` fixture used here (it is untyped)."""

    group: str | None
    extra_info: dict[str, Any]

    def pedantic(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] = ...,
        kwargs: dict[str, Any] | None = ...,
        setup: Callable[[], Any] | None = ...,
        teardown: Callable[..., Any] | None = ...,
        rounds: int = ...,
        warmup_rounds: int = ...,
        iterations: int = ...,
    ) -> Any: ...


def measure(
    benchmark: Benchmark,
    run: Callable[..., object],
    *,
    group: str,
    label: str,
    ops: int,
    rounds: int,
    setup: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
    target: float | None = None,
    role: Role = "baseline",
    note: str = "",
) -> None:
    """Time ``run`` for ``rounds`` rounds, each doing ``ops`` operations.

    ``setup`` builds fresh state for each round outside the timing, so rounds
    never accumulate state. Each group has exactly one ``"openstarry"`` entry;
    a ``"baseline"`` with a ``target`` is expected to take at least that many
    times openstarry's time. A ``"floor"`` entry runs the group's driving loop
    with C no-op callees: what every median in the group pays for the loop alone.
    A ``"report"`` entry stands alone: its figures are in its note.
    """
    benchmark.group = group
    benchmark.extra_info.update(
        label=label,
        role=role,
        ops=ops,
        target=target,
        note=note,
    )
    benchmark.pedantic(run, setup=setup, rounds=rounds, warmup_rounds=max(1, rounds // 20))


@dataclass(frozen=True)
class Side:
    """One side of a comparison timed by :func:`measure_alternating`.

    ``run(*args, **kwargs)`` is timed once a round, ``ops`` operations each
    time, with the arguments ``setup()`` built for that round outside the
    timing. ``name`` tells the side's entry apart in pytest-benchmark's JSON
    (``test_name::name``); ``group``, when given, puts the side in another
    group than the call's (a control measured in the same rounds as the rows
    it bounds); the other fields mean what :func:`measure`'s do, and
    ``ceiling`` is a most ratio for a baseline (the same work on another
    backend), where ``target`` is a least one.
    """

    name: str
    run: Callable[..., object]
    label: str
    ops: int
    setup: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]] | None = None
    role: Role = "baseline"
    target: float | None = None
    ceiling: float | None = None
    note: str = ""
    group: str | None = None


def alternate(
    sides: Sequence[Side],
    *,
    rounds: int,
    warmup_rounds: int,
    timer: Callable[[], float],
    block: int = 1,
) -> list[list[float]]:
    """Each side's round times, the sides taking turns: A, B, A, B, ... (A, B, C, A, ...).

    Every round of one side is followed by a round of the next (or, with
    ``block``, every ``block`` rounds in a row: A, A, B, B, ...), so all of
    them run under the same load of the machine. The first ``warmup_rounds``
    rounds of each side are run and not kept. Each side's ``setup`` runs just
    before its own round, outside the timing.
    """
    if block < 1:
        raise ValueError("block must be at least 1")
    total = warmup_rounds + rounds
    times: list[list[float]] = [[] for _ in sides]
    run = [0] * len(sides)
    while run[0] < total:
        for i, (side, kept) in enumerate(zip(sides, times, strict=True)):
            for _ in range(min(block, total - run[i])):
                args, kwargs = side.setup() if side.setup is not None else ((), {})
                start = timer()
                side.run(*args, **kwargs)
                elapsed = timer() - start
                if run[i] >= warmup_rounds:
                    kept.append(elapsed)
                run[i] += 1
    return times


def measure_alternating(
    benchmark: Benchmark,
    sides: Sequence[Side],
    *,
    group: str,
    rounds: int,
    block: int = 1,
    extra_info: Callable[[Side], dict[str, Any]] | None = None,
) -> None:
    """Time ``sides`` in alternating rounds, one entry each in the run's JSON.

    Where :func:`measure` gives each side a test of its own, run seconds or
    minutes apart, here one test runs the sides in turn (:func:`alternate`),
    so a ratio between them compares rounds that ran under the same load of
    the machine: use it for rows whose sides are the same code or the same
    work on another backend, where the machine's load would otherwise swing
    the ratio more than the code does. The timer is the test's own
    (``pytest.mark.benchmark(timer=...)``, else pytest-benchmark's default),
    the warm-up ``max(1, rounds // 20)`` turns of each side as in
    :func:`measure`. Each side is recorded as its own pytest-benchmark entry
    (its median over its ``rounds`` rounds, with ``extra_info`` as
    :func:`measure` writes it), so ``ratios.py`` pairs them as it pairs
    separate tests. ``extra_info(side)``, when given, is called once the
    rounds are over and what it returns goes into that side's ``extra_info``
    (its ``note`` too): figures the rounds themselves gathered. With
    benchmarks disabled, each side runs once untimed, as a smoke test.
    """
    if len({side.name for side in sides}) != len(sides):
        raise ValueError("each side needs a name of its own")
    # pytest-benchmark times one callable per test; recording several entries
    # from one test takes its fixture's internals (5.x: ``_mode``, ``_timer``,
    # ``_add_stats``, ``stats.Metadata``). tests/test_bench_harness.py runs this
    # through pytest-benchmark and reads the JSON, so a release that moves
    # them fails there.
    fixture: Any = benchmark
    if fixture._mode:
        fixture.has_error = True
        raise FixtureAlreadyUsed(f"the benchmark fixture was already used in {fixture._mode} mode")
    fixture._mode = "measure_alternating(...)"
    benchmark.group = group
    try:
        if fixture.disabled:
            alternate(sides, rounds=1, warmup_rounds=0, timer=time.perf_counter)
            return
        timer = fixture._timer
        warmup_rounds = max(1, rounds // 20)
        times = alternate(
            sides, rounds=rounds, warmup_rounds=warmup_rounds, timer=timer, block=block
        )
    except BaseException:
        fixture.has_error = True
        raise
    for side, kept in zip(sides, times, strict=True):
        entry: Any = Metadata(  # type: ignore[no-untyped-call]
            fixture,
            iterations=1,
            options={"timer": timer, "rounds": rounds, "warmup_rounds": warmup_rounds},
        )
        entry.name = f"{fixture.name}::{side.name}"
        entry.fullname = f"{fixture.fullname}::{side.name}"
        entry.group = side.group or group
        entry.extra_info = dict(
            benchmark.extra_info,
            label=side.label,
            role=side.role,
            ops=side.ops,
            target=side.target,
            note=side.note,
            alternated_with=[f"{fixture.name}::{o.name}" for o in sides if o is not side],
        )
        if side.ceiling is not None:
            entry.extra_info["ceiling"] = side.ceiling
        if extra_info is not None:
            entry.extra_info.update(extra_info(side))
        for elapsed in kept:
            entry.update(elapsed)
        fixture._add_stats(entry)
