"""``openstarry bench``: its options and their limits (``bench latency``'s rates and duration).

The benchmarks themselves are :mod:`openstarry.bench`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = [
    "BENCH_DURATION",
    "BENCH_MAX_DURATION",
    "BENCH_MAX_RATE",
    "BENCH_MAX_RATES",
    "BENCH_RATES",
    "add_bench_arguments",
    "add_bench_command",
]


#: ``openstarry bench latency``'s rates and duration when none are given.
BENCH_RATES = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)
BENCH_DURATION = 2.0
#: Its limits (openstarry.bench.latency checks them too).
BENCH_MAX_RATE = 10_000_000
BENCH_MAX_DURATION = 3_600.0
BENCH_MAX_RATES = 100

_LATENCY_DESCRIPTION = """\
Dispatch latency of the in-process EventBus at fixed arrival rates, open loop.

For each rate, events are published on a fixed schedule (event i is due at
start + i/rate) for --duration seconds, then the bus drains. Each event's
latency runs from its intended send time to the end of its handler, so a
sender that falls behind publishes every event whose time has come and the
delay counts: no coordinated omission (as wrk2 and HdrHistogram measure).
Latencies go into an HDR histogram in Rust (3 significant figures).

Printed per rate: the achieved rate (events handled per second), p50, p90,
p99, p99.9, p99.99 and max in microseconds, and the knee: the lowest rate
whose p99 is over 1 ms. A run is cut off at duration + max(duration, 10 s);
the events still waiting then count as unfinished, with the time they had
waited as their latency.

Handlers run one at a time (an async handler is awaited before the next
event), so a handler that takes 1 ms caps any of the buses at ~1,000/s."""


def _rates(text: str) -> list[int]:
    rates = []
    for part in text.split(","):
        try:
            rate = int(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a rate: {part.strip()!r} (expected events per second, e.g. 1000,10000)"
            ) from None
        if not 1 <= rate <= BENCH_MAX_RATE:
            raise argparse.ArgumentTypeError(
                f"a rate is 1 to {BENCH_MAX_RATE:,} events per second, not {rate}"
            )
        rates.append(rate)
    if len(rates) > BENCH_MAX_RATES:
        raise argparse.ArgumentTypeError(f"at most {BENCH_MAX_RATES} rates, not {len(rates)}")
    return rates


def _duration(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= BENCH_MAX_DURATION:
        raise argparse.ArgumentTypeError(
            f"a duration is more than 0 and at most {BENCH_MAX_DURATION:g} seconds, not {text}"
        )
    return value


def add_bench_command(commands: Any) -> None:
    """Add ``bench`` to the ``openstarry`` parser."""
    bench = commands.add_parser(
        "bench",
        help="measure dispatch latency under load (bench latency), the bus and the loop",
        description="openstarry's benchmarks: 'bench latency' for dispatch latency at fixed "
        "arrival rates; 'bench bus' and 'bench loop' (or plain 'bench' for both) for the "
        "figures beside pure-Python baselines.",
    )
    add_bench_arguments(bench)
    bench.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    from openstarry.bench import run as run_bench

    return run_bench(args)


def add_bench_arguments(bench: argparse.ArgumentParser) -> None:
    """The options and sub-commands of ``openstarry bench`` (``figures`` names the one given)."""
    bench.add_argument(
        "--quick", action="store_true", help="a tenth of the iterations (bus and loop figures)"
    )
    figures = bench.add_subparsers(
        dest="figures",
        metavar="{latency,bus,loop}",
        help="what to measure (none: the bus and loop figures)",
    )
    latency = figures.add_parser(
        "latency",
        help="dispatch latency at fixed arrival rates, open loop, to p99.99",
        description=_LATENCY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    latency.add_argument(
        "--rates",
        type=_rates,
        default=list(BENCH_RATES),
        metavar="R1,R2,...",
        help=f"arrival rates, events per second (default: {','.join(str(r) for r in BENCH_RATES)})",
    )
    latency.add_argument(
        "--duration",
        type=_duration,
        default=BENCH_DURATION,
        metavar="S",
        help=f"seconds of schedule per rate (default: {BENCH_DURATION:g})",
    )
    latency.add_argument(
        "--handler",
        dest="handler_spec",
        metavar="MODULE:FUNCTION",
        help="measure this function (sync or async, called with each event) instead of a "
        "no-op; MODULE is imported with the current directory on the path",
    )
    latency.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the results as a JSON list, one object per bus and rate (units in the "
        "names: p99_us, achieved_per_s, ...)",
    )
    latency.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="write a PNG of the latency percentiles against rate (needs matplotlib: "
        "pip install 'openstarry[bench]')",
    )
    latency.add_argument(
        "--against",
        action="append",
        choices=["pure-python", "bubus"],
        help="run the same schedule on this bus too, side by side (repeatable): "
        "pure-python (a plain asyncio bus) or bubus (when installed)",
    )
    for name, text in (
        ("bus", "bus latency and throughput, closed loop, beside a pure-Python bus"),
        ("loop", "the execution loop's overhead per turn, and against the sessions kept"),
    ):
        command = figures.add_parser(name, help=text, description=text)
        # SUPPRESS: `bench --quick bus` keeps the --quick given before the name.
        command.add_argument(
            "--quick",
            action="store_true",
            default=argparse.SUPPRESS,
            help="a tenth of the iterations",
        )
