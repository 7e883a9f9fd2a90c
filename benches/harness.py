"""How every benchmark is run and labelled, so ``ratios.py`` can pair them up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol


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
    role: Literal["openstarry", "baseline", "floor", "report"] = "baseline",
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
