"""The agent layer's measurements (``openstarry bench``), run small for their correctness checks.

``make bench`` runs ``openstarry bench`` at full size and prints the figures;
under ``make test`` these tests only prove that every measured event reached its
handler and every measured turn ended as it should. They assert nothing on time.
"""

from __future__ import annotations

import pytest

from openstarry.bench import (
    bench_bus_latency,
    bench_bus_throughput,
    bench_loop_turn,
    bench_turn_vs_sessions,
)
from openstarry.cli import main


def test_bus_latency_measures_every_event() -> None:
    figures = bench_bus_latency(n=200, warmup=20)
    for side in ("openstarry", "baseline"):
        assert 0 < figures[side]["p50_us"] <= figures[side]["p99_us"] <= figures[side]["max_us"]


def test_bus_throughput_dispatches_every_event() -> None:
    figures = bench_bus_throughput(n=2_000)
    assert figures["openstarry"] > 0
    assert figures["baseline"] > 0


def test_loop_turn_completes_each_turn() -> None:
    figures = bench_loop_turn(n=50, warmup=5)
    assert figures["turn_us"] > 0
    assert figures["direct_us"] > 0


def test_bench_command_prints_the_three_measurements(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "bus latency" in out
    assert "bus throughput" in out
    assert "loop turn" in out


def test_turn_vs_sessions_keeps_the_table_full() -> None:
    figures = bench_turn_vs_sessions(counts=(10, 1_000), n=20)
    assert set(figures) == {10, 1_000}
    assert all(turn_us > 0 for turn_us in figures.values())
