"""The benchmarks' own tooling: ``benches/harness.py``'s alternating rounds and ``ratios.py``.

Nothing here times anything real: a fake clock gives the durations, and the
pytest-benchmark run in a subprocess does trivial work; what is asserted is
the order in which the sides ran and what the run's JSON holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from benches.harness import Benchmark, Side, alternate, measure_alternating
from benches.ratios import TOLERANCE, Entry, _entries, main, table

ROOT = Path(__file__).resolve().parent.parent


class FakeClock:
    """A timer whose time moves only when a side's setup or run moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sides_take_turns_with_setup_untimed_and_warmup_dropped() -> None:
    clock = FakeClock()
    log: list[str] = []

    def side(name: str, cost: float) -> Side:
        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            log.append(f"setup {name}")
            clock.now += 1_000.0  # setup is slow, and must not be counted
            return (name,), {"cost": cost}

        def run(got: str, *, cost: float) -> None:
            assert got == name
            log.append(f"run {name}")
            clock.now += cost + len([e for e in log if e == f"run {name}"])

        return Side(name, run, label=name, ops=1, setup=setup)

    times = alternate(
        [side("a", 10.0), side("b", 100.0), side("c", 1_000.0)],
        rounds=3,
        warmup_rounds=2,
        timer=clock,
    )

    one_round = ["setup a", "run a", "setup b", "run b", "setup c", "run c"]
    assert log == one_round * 5
    # The n-th run of a side costs its cost + n: runs 1 and 2 were the warm-up.
    assert times == [[13.0, 14.0, 15.0], [103.0, 104.0, 105.0], [1_003.0, 1_004.0, 1_005.0]]


def test_a_side_without_setup_runs_without_arguments() -> None:
    calls: list[tuple[Any, ...]] = []
    times = alternate(
        [Side("a", lambda *args: calls.append(args), label="a", ops=1)],
        rounds=2,
        warmup_rounds=0,
        timer=FakeClock(),
    )
    assert calls == [(), ()]
    assert times == [[0.0, 0.0]]


def test_a_block_of_rounds_of_each_side_in_turn() -> None:
    clock = FakeClock()
    log: list[str] = []

    def side(name: str) -> Side:
        def run() -> None:
            log.append(name)
            clock.now += 1.0

        return Side(name, run, label=name, ops=1)

    times = alternate([side("a"), side("b")], rounds=4, warmup_rounds=1, timer=clock, block=2)
    # 5 rounds a side (1 of warm-up), 2 in a row; the last block is what is left.
    assert log == ["a", "a", "b", "b", "a", "a", "b", "b", "a", "b"]
    assert times == [[1.0] * 4, [1.0] * 4]
    with pytest.raises(ValueError, match="block"):
        alternate([side("a")], rounds=1, warmup_rounds=0, timer=clock, block=0)


BENCH_FILE = """
import time
from pathlib import Path

import pytest

from benches.harness import Side, measure_alternating

LOG = Path(__file__).with_name("calls.log")


def work(name: str, n: int) -> None:
    with LOG.open("a") as log:
        log.write(name + "\\n")
    sum(range(n))


@pytest.mark.benchmark(timer=time.process_time)
def test_pair(benchmark):
    measure_alternating(
        benchmark,
        [
            Side("fast", work, label="fast side", ops=10,
                 setup=lambda: (("fast", 1_000), {}), role="openstarry"),
            Side("slow", work, label="slow side", ops=10,
                 setup=lambda: (("slow", 100_000), {}), ceiling=1.3, note="a note"),
        ],
        group="pair group",
        rounds={rounds},
    )
"""


def _run_bench(tmp_path: Path, rounds: int, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_pair_bench.py").write_text(BENCH_FILE.replace("{rounds}", str(rounds)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "pytest", "test_pair_bench.py", "-q", "-W", "error"]
    return subprocess.run(
        [*command, "-p", "no:randomly", "-p", "no:cacheprovider", *options],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_measure_alternating_records_one_entry_per_side(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = _run_bench(tmp_path, 6, "--benchmark-enable", f"--benchmark-json={out}")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # One warm-up round (max(1, 6 // 20)) and six timed ones, in turn.
    assert (tmp_path / "calls.log").read_text().split() == ["fast", "slow"] * 7

    run = json.loads(out.read_text())
    entries = {bench["name"]: bench for bench in run["benchmarks"]}
    assert set(entries) == {"test_pair::fast", "test_pair::slow"}
    for name, bench in entries.items():
        assert bench["group"] == "pair group"
        assert bench["stats"]["rounds"] == 6
        assert len(bench["stats"]["data"]) == 6
        assert bench["options"]["timer"] == "process_time", name
    fast, slow = entries["test_pair::fast"], entries["test_pair::slow"]
    assert fast["extra_info"] == {
        "label": "fast side",
        "role": "openstarry",
        "ops": 10,
        "target": None,
        "note": "",
        "alternated_with": ["test_pair::slow"],
    }
    assert slow["extra_info"]["role"] == "baseline"
    assert slow["extra_info"]["ceiling"] == 1.3
    assert slow["extra_info"]["alternated_with"] == ["test_pair::fast"]

    # ratios.py sets the two side by side as it does two separate tests.
    lines, tally = table(_entries(run))
    rows = [line for line in lines if line.startswith("| pair group |")]
    assert len(rows) == 1
    assert "| fast side | " in rows[0]
    assert "| slow side [1] | " in rows[0]
    assert "| ≤ 1.3x |" in rows[0]
    assert tally.targets == 1
    assert "[1] a note" in lines


def test_measure_alternating_runs_each_side_once_when_disabled(tmp_path: Path) -> None:
    proc = _run_bench(tmp_path, 6, "--benchmark-disable")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "calls.log").read_text().split() == ["fast", "slow"]


@pytest.mark.parametrize("names", [["a", "a"], ["a", "b", "a"]])
def test_sides_need_names_of_their_own(names: list[str]) -> None:
    ran: list[str] = []
    sides = [Side(n, ran.append, label=n, ops=1, setup=lambda: (("x",), {})) for n in names]
    with pytest.raises(ValueError, match="each side needs a name of its own"):
        measure_alternating(cast(Benchmark, None), sides, group="g", rounds=2)
    assert ran == []


def _row(role: str, per_op: float, target: float | None = None, spread: float = 0.0) -> Entry:
    return Entry("g", role, role, per_op, target, "", spread=spread)


def test_strict_fails_only_a_target_missed_by_more_than_the_stated_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    near = 10.0 * (1 - TOLERANCE / 2)  # short of 10x, within the spread
    lines, tally = table([_row("openstarry", 1.0, spread=0.05), _row("baseline", near, 10.0, 0.1)])
    (row,) = [line for line in lines if line.startswith("| g |")]
    assert "| ±15% |" in row  # the two sides' spreads, added up
    assert "within spread" in row
    assert (tally.targets, tally.met, tally.missed) == (1, 0, None)
    far = 10.0 * (1 - 2 * TOLERANCE)
    _, tally = table([_row("openstarry", 1.0), _row("baseline", far, 10.0)])
    assert tally.missed == ["g: openstarry vs baseline"]

    def run_of(baseline: float) -> Path:
        path = tmp_path / f"{baseline}.json"
        stats = {"median": 1.0, "iqr": 0.0}
        benches = [
            {"name": "a", "group": "g", "stats": stats, "extra_info": {"role": "openstarry"}},
            {
                "name": "b",
                "group": "g",
                "stats": {"median": baseline, "iqr": 0.0},
                "extra_info": {"role": "baseline", "target": 10.0},
            },
        ]
        path.write_text(json.dumps({"benchmarks": benches}))
        return path

    assert main([str(run_of(near)), "--strict"]) == 0
    assert main([str(run_of(far)), "--strict"]) == 1
    assert "- g: a vs b" in capsys.readouterr().out
    assert main([str(run_of(far))]) == 0  # without --strict, a report
