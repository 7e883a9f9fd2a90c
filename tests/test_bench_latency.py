"""``openstarry bench latency``: the open-loop dispatch-latency benchmark and its recorder.

What is asserted on latencies are lower bounds that sleeping guarantees (a
handler that sleeps 1 ms takes at least 1 ms), never how fast this machine is.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry import cli
from openstarry._core import LatencyRecorder
from openstarry.bench import latency
from openstarry.bench.latency import BenchError, RateResult, bench_dispatch_latency, load_handler

ROOT = Path(__file__).resolve().parent.parent
COMMAND = (
    "openstarry bench latency --rates 1000,10000,100000 --duration 3 --json out.json --plot out.png"
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIELDS = {
    "bus",
    "handler",
    "rate_per_s",
    "duration_s",
    "sent",
    "handled",
    "unfinished",
    "errors",
    "achieved_per_s",
    "p50_us",
    "p90_us",
    "p99_us",
    "p99_9_us",
    "p99_99_us",
    "max_us",
    "mean_us",
    "first_error",
    "knee_per_s",
}


def sleep_1ms(event: object) -> None:
    time.sleep(0.001)


async def sleep_1ms_async(event: object) -> None:
    await asyncio.sleep(0.001)


def _percentiles(row: dict[str, Any] | RateResult) -> list[float]:
    data = row if isinstance(row, dict) else row.as_json()
    return [data[k] for k in ("p50_us", "p90_us", "p99_us", "p99_9_us", "p99_99_us", "max_us")]


# -- the recorder -------------------------------------------------------------


def test_recorder_percentiles_are_within_its_precision() -> None:
    recorder = LatencyRecorder()
    for value in range(1, 10_001):
        recorder.record(value * 1_000)
    assert recorder.count == len(recorder) == 10_000
    for percentile, exact in ((50, 5_000_000), (99, 9_900_000), (99.9, 9_990_000)):
        got = recorder.value_at_percentile(percentile)
        assert abs(got - exact) <= exact // 1000, (percentile, got)
    assert recorder.min == 1_000
    assert 10_000_000 <= recorder.max <= 10_010_000
    assert abs(recorder.mean - 5_000_500) <= 5_000
    recorder.reset()
    assert recorder.count == 0
    assert recorder.value_at_percentile(99) == 0


def test_recorder_clamps_values_past_its_highest_and_counts_them() -> None:
    recorder = LatencyRecorder(highest_ns=1_000_000, significant_figures=2)
    recorder.record(5)
    recorder.record(10**15)
    assert recorder.count == 2
    assert recorder.saturated == 1
    assert recorder.highest_ns == 1_000_000
    assert recorder.significant_figures == 2
    assert 1_000_000 <= recorder.max < 1_010_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"highest_ns": 1}, "highest_ns must be at least 2"),
        ({"highest_ns": -5}, "highest_ns must not be negative"),
        ({"significant_figures": 0}, "significant_figures must be 1 to 5"),
        ({"significant_figures": 6}, "significant_figures must be 1 to 5"),
    ],
)
def test_recorder_refuses_bad_bounds(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LatencyRecorder(**kwargs)


def test_recorder_refuses_bad_values() -> None:
    recorder = LatencyRecorder()
    with pytest.raises(ValueError, match="ns must not be negative"):
        recorder.record(-1)
    with pytest.raises(ValueError, match="intended_ns must not be negative"):
        recorder.record_since(-1)
    for bad in (-1.0, 100.01, float("nan")):
        with pytest.raises(ValueError, match="percentile must be between 0 and 100"):
            recorder.value_at_percentile(bad)
    assert recorder.count == 0


def test_record_since_measures_from_the_intended_time_on_its_own_clock() -> None:
    recorder = LatencyRecorder()
    intended = LatencyRecorder.now_ns()
    time.sleep(0.002)
    latency_ns = recorder.record_since(intended)
    assert latency_ns >= 2_000_000
    assert recorder.count == 1
    assert recorder.max >= 2_000_000
    # An intended time still to come records no latency (not a negative one).
    assert recorder.record_since(LatencyRecorder.now_ns() + 10**12) == 0


def test_the_recorder_clock_runs_at_the_rate_of_pythons_monotonic_clock() -> None:
    # Intervals nest: the Rust clock's outer interval holds Python's inner one.
    outer_start = LatencyRecorder.now_ns()
    inner_start = time.monotonic_ns()
    time.sleep(0.02)
    inner = time.monotonic_ns() - inner_start
    outer = LatencyRecorder.now_ns() - outer_start
    assert outer >= inner >= 20_000_000
    inner_start = time.perf_counter_ns()
    outer_start = LatencyRecorder.now_ns()
    time.sleep(0.02)
    outer = LatencyRecorder.now_ns() - outer_start
    inner = time.perf_counter_ns() - inner_start
    assert inner >= outer >= 20_000_000


# -- the command line -----------------------------------------------------------


def test_the_documented_command_line_writes_the_json_and_the_png(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "openstarry.cli", *shlex.split(COMMAND)[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    # Not a terminal: no progress bar.
    assert completed.stderr == ""
    assert "knee of openstarry" in completed.stdout
    rows = json.loads((tmp_path / "out.json").read_text())
    assert [row["rate_per_s"] for row in rows] == [1000, 10000, 100000]
    knees = set()
    for row in rows:
        assert set(row) == FIELDS
        assert row["bus"] == "openstarry"
        assert row["handler"] == "no-op"
        assert row["duration_s"] == 3.0
        assert row["handled"] + row["unfinished"] == row["rate_per_s"] * 3
        assert row["errors"] == 0
        assert row["achieved_per_s"] > 0
        values = _percentiles(row)
        assert values == sorted(values)
        assert values[0] > 0
        knees.add(row["knee_per_s"])
    assert len(knees) == 1
    knee = knees.pop()
    over = [row["rate_per_s"] for row in rows if row["p99_us"] > 1000]
    assert knee == (min(over) if over else None)
    assert (tmp_path / "out.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_handler_sleeping_1ms_queues_at_2000_per_second() -> None:
    results = bench_dispatch_latency([2000, 200], 1.0, handler=sleep_1ms)
    low, high = results  # the rates run from the lowest up
    assert (low.rate_per_s, high.rate_per_s) == (200, 2000)
    for result in results:
        assert result.errors == 0
        assert result.unfinished == 0
        assert result.handled == result.rate_per_s
        assert result.p50_us >= 1000
    # One event at a time, each at least 1 ms: at most 1,000 a second.
    assert high.achieved_per_s < 1100
    # 2,000 events due within 1 s take at least 2 s: the late ones wait about a second.
    assert high.p99_us >= 900_000
    assert high.p99_us > 10 * low.p99_us
    assert low.knee_per_s == high.knee_per_s == 200


def test_an_async_handler_is_awaited_before_the_next_event() -> None:
    # An async handler that sleeps 1 ms holds up the dispatch just as a sync one does.
    (result,) = bench_dispatch_latency([2000], 0.5, handler=sleep_1ms_async)
    assert result.errors == 0
    assert result.handled == 1000
    assert result.p50_us >= 1000
    assert result.achieved_per_s < 1100


def test_a_stall_counts_for_every_event_due_during_it() -> None:
    # One 50 ms stall at 1,000 events/s: the ~50 events due meanwhile wait for it,
    # so well over 1 % of the 500 waited 25 ms or more. A closed loop would
    # have measured one slow event and sent the others after the stall.
    calls = [0]

    def stalls_once(event: object) -> None:
        calls[0] += 1
        if calls[0] == 100:
            time.sleep(0.05)

    (result,) = bench_dispatch_latency([1000], 0.5, handler=stalls_once)
    assert result.handled == 500
    assert result.p99_us >= 25_000
    assert result.max_us >= 50_000


def test_a_run_is_cut_off_and_its_waiting_events_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(latency, "MIN_DRAIN_S", 0.2)

    def slow(event: object) -> None:
        time.sleep(0.01)

    (result,) = bench_dispatch_latency([1000], 0.1, handler=slow)
    assert result.unfinished > 0
    assert result.handled + result.unfinished == 100
    assert result.handled < 100
    # The cut-off events waited at least until the time limit, 0.2 s after the schedule.
    assert result.max_us >= 200_000
    assert f"{result.unfinished:,} unfinished at the time limit" in latency.format_table([result])


@pytest.mark.parametrize("bus", ["openstarry", "pure-python"])
def test_a_handler_that_stops_returning_is_abandoned_and_the_run_ends(
    monkeypatch: pytest.MonkeyPatch, bus: str
) -> None:
    monkeypatch.setattr(latency, "MIN_DRAIN_S", 0.1)
    monkeypatch.setattr(latency, "STUCK_S", 0.2)
    calls = [0]

    async def hangs_after_the_warm_up(event: object) -> None:
        calls[0] += 1
        if calls[0] > latency.WARMUP_EVENTS + 10:
            await anyio.sleep_forever()  # cancelled when the bus is left

    (result,) = bench_dispatch_latency(
        [1000], 0.1, handler=hangs_after_the_warm_up, handler_name="hangs", buses=[bus]
    )
    assert result.handled == 10
    assert result.handled + result.unfinished == 100
    assert result.first_error is not None
    assert result.first_error.startswith("hangs had not returned 0.2 s after the run's cut-off")
    # The abandoned events, nine in ten, were due within the 0.1 s schedule and waited
    # until its cut-off and the grace after it (0.4 s from its start): 0.3 s at least.
    assert result.p50_us >= 300_000
    assert result.first_error in latency.format_table([result])


def test_a_slow_handler_that_keeps_up_its_pace_is_not_taken_for_stuck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 10 ms a handler, 1,000 events/s: the backlog of 50 stays full from the
    # start, yet events keep being handled, so the sender goes on until the
    # run's cut-off (0.5 + 1.5 s), well past the 0.2 s without progress that
    # would mean a handler that never returns.
    monkeypatch.setattr(latency, "MIN_DRAIN_S", 1.5)
    monkeypatch.setattr(latency, "STUCK_S", 0.2)
    opener, _ = latency._TARGETS["openstarry"]
    monkeypatch.setitem(latency._TARGETS, "openstarry", (opener, 50))

    async def slow(event: object) -> None:
        await anyio.sleep(0.01)

    (result,) = bench_dispatch_latency([1000], 0.5, handler=slow, handler_name="slow")
    assert result.first_error is None
    assert result.sent >= 170  # cut off at 0.7 s it would have sent about 120
    assert result.handled + result.unfinished == 500


def test_a_handler_that_never_returns_fails_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(latency, "STUCK_S", 0.2)

    async def never(event: object) -> None:
        await anyio.sleep_forever()

    with pytest.raises(BenchError, match=r"never has not returned 0\.2 s after its event"):
        bench_dispatch_latency([1000], 0.1, handler=never, handler_name="never")


def test_handler_errors_are_counted_and_the_run_goes_on() -> None:
    def fails(event: object) -> None:
        raise RuntimeError("boom")

    results = bench_dispatch_latency(
        [1000], 0.1, handler=fails, buses=["openstarry", "pure-python"]
    )
    assert [r.bus for r in results] == ["openstarry", "pure-python"]
    for result in results:
        assert result.errors == result.handled == 100
        assert result.first_error == "RuntimeError: boom"
    assert "100 handler errors, first: RuntimeError: boom" in latency.format_table(results)


def test_the_same_schedule_runs_on_the_pure_python_bus_beside() -> None:
    results = bench_dispatch_latency(
        [500, 1000], 0.2, handler=sleep_1ms_async, buses=["openstarry", "pure-python"]
    )
    assert [(r.rate_per_s, r.bus) for r in results] == [
        (500, "openstarry"),
        (500, "pure-python"),
        (1000, "openstarry"),
        (1000, "pure-python"),
    ]
    for result in results:
        assert result.handled == result.rate_per_s // 5
        assert result.p50_us >= 1000  # the async handler was awaited
    table = latency.format_table(results)
    assert "knee of openstarry" in table
    assert "knee of pure-python" in table


@pytest.mark.skipif(importlib.util.find_spec("bubus") is None, reason="bubus is not installed")
def test_the_same_schedule_runs_on_bubus_beside() -> None:
    results = bench_dispatch_latency([200], 0.2, handler=sleep_1ms, buses=["openstarry", "bubus"])
    assert [r.bus for r in results] == ["openstarry", "bubus"]
    for result in results:
        assert result.handled == 40
        assert result.p50_us >= 1000


def test_against_bubus_when_it_is_not_installed_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bubus" else real(name, *a)
    )
    assert cli.main(["bench", "latency", "--rates", "100", "--against", "bubus"]) == 2
    err = capsys.readouterr().err
    assert "bubus is not installed (pip install bubus)" in err


def test_plot_without_matplotlib_says_so_before_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    out = tmp_path / "out.png"
    assert cli.main(["bench", "latency", "--rates", "100", "--plot", str(out)]) == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib" in captured.err
    assert "pip install 'openstarry[bench]'" in captured.err
    assert captured.out == ""  # nothing was run
    assert not out.exists()


def test_outputs_in_a_missing_directory_are_refused_before_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "nowhere" / "out.json"
    assert cli.main(["bench", "latency", "--rates", "100", "--json", str(target)]) == 2
    assert "no directory" in capsys.readouterr().err


# -- --handler ----------------------------------------------------------------------


@pytest.fixture
def handlers_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a module of handlers, as the current directory."""
    (tmp_path / "bench_handlers_mod.py").write_text(
        "import time\n"
        "CALLS = []\n"
        "def on_ping(event):\n"
        "    CALLS.append(event.type)\n"
        "async def on_ping_async(event):\n"
        "    CALLS.append(event.type)\n"
        "NOT_A_FUNCTION = 42\n"
        "def two_arguments(a, b):\n"
        "    pass\n"
        "class Holder:\n"
        "    @staticmethod\n"
        "    def on_ping(event):\n"
        "        CALLS.append('holder')\n"
    )
    (tmp_path / "bench_broken_mod.py").write_text("raise RuntimeError('broken on import')\n")
    (tmp_path / "bench_needs_missing_mod.py").write_text("import bench_needs_no_such_dependency\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in ("bench_handlers_mod", "bench_broken_mod", "bench_needs_missing_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


@pytest.mark.usefixtures("handlers_dir")
@pytest.mark.parametrize("name", ["on_ping", "on_ping_async", "Holder.on_ping"])
def test_the_users_handler_is_measured(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"bench_handlers_mod:{name}"
    status = cli.main(
        [
            "bench",
            "latency",
            "--rates",
            "500",
            "--duration",
            "0.1",
            "--handler",
            spec,
            "--json",
            "r.json",
        ]
    )
    assert status == 0, capsys.readouterr().err
    module = sys.modules["bench_handlers_mod"]
    # The warm-up events and the 50 measured ones all reached it.
    assert len(module.CALLS) >= 50
    (row,) = json.loads(Path("r.json").read_text())
    assert row["handler"] == spec
    assert row["handled"] == 50
    assert spec in capsys.readouterr().out


@pytest.mark.usefixtures("handlers_dir")
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bench_handlers_mod", "expected MODULE:FUNCTION"),
        (":on_ping", "expected MODULE:FUNCTION"),
        ("bench_handlers_mod:", "expected MODULE:FUNCTION"),
        ("no_such_module_here:f", "no module named 'no_such_module_here'"),
        (
            "bench_broken_mod:f",
            "importing 'bench_broken_mod' failed: RuntimeError: broken on import",
        ),
        ("bench_handlers_mod:missing", "'bench_handlers_mod' has no attribute 'missing'"),
        ("bench_handlers_mod:NOT_A_FUNCTION", "NOT_A_FUNCTION is not callable (it is of type int)"),
        ("bench_needs_missing_mod:f", "importing 'bench_needs_missing_mod' failed: No module"),
        ("bench_handlers_mod:two_arguments", "must take one argument (the event)"),
    ],
)
def test_a_bad_handler_is_a_clear_error(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_handler(spec)
    assert cli.main(["bench", "latency", "--rates", "100", "--handler", spec]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


# -- the progress bar -----------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only() -> None:
    terminal = _Terminal()
    bench_dispatch_latency([1000], 0.3, progress=terminal)
    shown = terminal.getvalue()
    assert "\r" in shown
    assert "openstarry at 1,000/s" in shown
    assert "%" in shown
    assert shown.endswith("\r")  # the line is cleared at the end
    pipe = io.StringIO()
    bench_dispatch_latency([1000], 0.1, progress=pipe)
    assert pipe.getvalue() == ""


# -- checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rates", "duration", "message"),
    [
        ([], 1.0, "at least one rate"),
        ([0], 1.0, "rate 0"),
        ([latency.MAX_RATE + 1], 1.0, "rate 10000001"),
        ([100], 0.0, "duration 0.0"),
        ([100], 4000.0, "duration 4000.0"),
    ],
)
def test_bad_rates_and_durations_are_refused(
    rates: list[int], duration: float, message: str
) -> None:
    with pytest.raises(BenchError, match=message):
        bench_dispatch_latency(rates, duration)


def test_unknown_bus_is_refused() -> None:
    with pytest.raises(BenchError, match="unknown bus 'kafka'"):
        bench_dispatch_latency([100], 0.1, buses=["kafka"])


def test_knee_is_the_lowest_rate_whose_p99_is_over_1ms() -> None:
    def row(rate: int, p99: float, bus: str = "openstarry") -> RateResult:
        return RateResult(
            bus, "no-op", rate, 1.0, rate, rate, 0, 0, rate, 1, 1, p99, p99, p99, p99, 1
        )

    rows = [row(100, 10), row(1000, 1500), row(500, 1001), row(200, 999), row(50, 5000, "bubus")]
    assert latency.knee(rows) == 500
    assert latency.knee(rows, "bubus") == 50
    assert latency.knee([row(100, 1000)]) is None  # at 1 ms exactly, not over it
    assert "none up to 100/s" in latency.format_table([row(100, 1000)])
