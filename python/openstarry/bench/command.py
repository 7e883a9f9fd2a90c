"""``openstarry bench latency`` from its parsed command line: run, print, write the files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from openstarry.bench.latency import (
    BenchError,
    bench_dispatch_latency,
    check_bus,
    check_rates,
    format_table,
    load_handler,
    write_json,
)

__all__ = ["run_latency"]


def _check_output(path: Path | None, option: str) -> None:
    if path is None:
        return
    if path.is_dir():
        raise BenchError(f"{option} {path}: is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise BenchError(f"{option} {path}: no directory {parent}")


def run_latency(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` describes; 0 on success, 2 for a run that cannot be made.

    Everything that can be checked before the run is: the rates, the handler,
    the buses, matplotlib for ``--plot``, the output directories.
    """
    prog = "openstarry bench latency"
    json_path: Path | None = args.json
    plot_path: Path | None = args.plot
    buses = ["openstarry", *(args.against or [])]
    try:
        check_rates(args.rates, args.duration)
        for bus in buses:
            check_bus(bus)
        _check_output(json_path, "--json")
        _check_output(plot_path, "--plot")
        if plot_path is not None:
            from openstarry.bench.plot import check_matplotlib

            check_matplotlib()
        handler = load_handler(args.handler_spec) if args.handler_spec else None
        results = bench_dispatch_latency(
            args.rates,
            args.duration,
            handler=handler,
            handler_name=args.handler_spec or "no-op",
            buses=buses,
            progress=sys.stderr,
        )
    except BenchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"dispatch latency, open loop: {args.duration:g} s per rate, handler {results[0].handler}; "
        "microseconds from each event's intended send time to the end of its handler"
    )
    print(format_table(results))
    try:
        if json_path is not None:
            write_json(results, json_path)
            print(f"wrote {json_path}")
        if plot_path is not None:
            from openstarry.bench.plot import plot_latency

            plot_latency(results, plot_path)
            print(f"wrote {plot_path}")
    except OSError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
