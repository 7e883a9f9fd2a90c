"""Ingest an NDJSON file of spec 002 envelopes and show what the Rust core made of it.

Usage::

    openstarry demo FILE
    python -m openstarry.cli.demo FILE [--events N]

The demo decodes, validates and de-duplicates every line with
:class:`openstarry.core.Ingestor`, reports the lines it refused and why, pops
the queued events in priority order, and then measures ingestion throughput on
a generated batch of fresh envelopes built from the file's valid ones. It needs
nothing beyond the standard library and openstarry itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openstarry.core import DecodeError, DedupWindow, Event, EventQueue, Ingestor, decode_event

__all__ = ["add_demo_command", "main"]

#: How many events one ``pop_many`` call may return while draining.
_DRAIN_CHUNK = 65_536


def _lines(data: bytes) -> list[bytes]:
    """The file's lines as the ingestor counts them (a final newline ends the last line)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _drain(queue: EventQueue) -> list[Event]:
    events: list[Event] = []
    while batch := queue.pop_many(_DRAIN_CHUNK):
        events.extend(batch)
    return events


def _short(id_: str | None) -> str:
    return "" if id_ is None else id_[:8]


def _report_file(path: Path, data: bytes) -> list[Event]:
    """Ingest the file, print what happened to each line and the events in pop order."""
    queue = EventQueue()
    result = Ingestor(queue, DedupWindow()).ingest(data)
    total = len(_lines(data))
    print(
        f"{path}: {total} lines -> {result.accepted} accepted, "
        f"{result.duplicates} duplicates dropped, {len(result.invalid)} invalid"
    )
    for index, message in result.invalid:
        print(f"  line {index + 1}: {message}")
    if result.rejected:  # only a bounded or closed queue refuses events
        print(f"  refused by the queue: lines {', '.join(str(i + 1) for i in result.rejected)}")

    events = _drain(queue)
    print(f"\nPopped in priority order (0 first, FIFO within a priority): {len(events)} events")
    width = max((len(e.type) for e in events), default=4)
    session_width = max((len(e.session_id) for e in events), default=7)
    print(f"  P  {'TYPE':<{width}}  {'SESSION':<{session_width}}  TRACE     ID        PARENT")
    for e in events:
        row = (
            f"  {e.priority}  {e.type:<{width}}  {e.session_id:<{session_width}}  "
            f"{_short(e.trace_id):<8}  {_short(e.id):<8}  {_short(e.parent_id)}"
        )
        print(row.rstrip())
    return events


def _templates(data: bytes) -> list[tuple[bytes, bytes]]:
    """(line, id as wire bytes) for each distinct valid envelope of the file."""
    seen: set[str] = set()
    out: list[tuple[bytes, bytes]] = []
    for line in _lines(data):
        try:
            event = decode_event(line.rstrip(b"\r"))
        except DecodeError:
            continue
        wire_id = event.id.encode()
        if event.id in seen or wire_id not in line:
            continue  # a duplicate, or an id written with escapes: not worth rewriting
        seen.add(event.id)
        out.append((line.rstrip(b"\r"), wire_id))
    return out


def _uuid4s(count: int) -> list[bytes]:
    """``count`` random UUID v4 strings as bytes; ``uuid.uuid4()`` one by one is slower."""
    hexes = os.urandom(16 * count).hex()
    out = []
    for i in range(0, 32 * count, 32):
        h = hexes[i : i + 32]
        variant = "89ab"[int(h[16], 16) & 3]
        out.append(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}".encode())
    return out


def _fresh_batch(templates: Sequence[tuple[bytes, bytes]], count: int) -> bytes:
    """``count`` envelopes cycling through the templates, each with a new UUID v4 id."""
    n = len(templates)
    lines = [
        line.replace(old_id, new_id)
        for (line, old_id), new_id in zip(
            (templates[i % n] for i in range(count)), _uuid4s(count), strict=True
        )
    ]
    return b"\n".join(lines) + b"\n"


def _measure(data: bytes, count: int, *, repeats: int = 3) -> None:
    templates = _templates(data)
    if not templates:
        print("\nThroughput: no valid envelope in the file to build a batch from")
        return
    start = time.perf_counter()
    batch = _fresh_batch(templates, count)
    built = time.perf_counter() - start
    megabytes = len(batch) / 1e6
    print(
        f"\nThroughput: {count:,} fresh envelopes ({megabytes:.1f} MB of NDJSON, "
        f"built from the file's {len(templates)} valid ones in {built:.2f} s), best of {repeats}"
    )
    best_ingest = best_drain = float("inf")
    for _ in range(repeats):
        queue = EventQueue()
        ingestor = Ingestor(queue, DedupWindow(max_entries=max(count, 1)))
        start = time.perf_counter()
        result = ingestor.ingest(batch)
        middle = time.perf_counter()
        drained = len(_drain(queue))
        end = time.perf_counter()
        if result.accepted != count or drained != count:
            print(
                f"  unexpected: {result.accepted} accepted, {drained} popped of {count}",
                file=sys.stderr,
            )
        best_ingest = min(best_ingest, middle - start)
        best_drain = min(best_drain, end - middle)
    print(
        f"  {'ingest (decode, validate, dedup, enqueue)':<42} {best_ingest * 1e3:7.1f} ms"
        f"  {count / best_ingest / 1e6:6.2f} M events/s  {megabytes / best_ingest:6.0f} MB/s"
    )
    print(
        f"  {'drain (pop_many)':<42} {best_drain * 1e3:7.1f} ms"
        f"  {count / best_drain / 1e6:6.2f} M events/s"
    )


def add_demo_command(commands: Any) -> None:
    """Add ``demo`` to the ``openstarry`` parser."""
    demo = commands.add_parser("demo", help="the Rust ingestion demo on an NDJSON file")
    demo.add_argument("path", help="NDJSON file, one envelope a line")
    demo.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    return main([args.path], prog="openstarry demo")


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m openstarry.cli.demo") -> int:
    """Run the demo; returns the process exit status (2: the file cannot be read)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Ingest an NDJSON file of spec 002 envelopes with openstarry's Rust core.",
    )
    parser.add_argument("file", type=Path, help="NDJSON file, one envelope a line")
    parser.add_argument(
        "--events",
        type=int,
        default=200_000,
        metavar="N",
        help="size of the generated throughput batch (default: 200000; 0 to skip)",
    )
    args = parser.parse_args(argv)
    path: Path = args.file
    try:
        data = path.read_bytes()
    except OSError as e:
        print(f"{prog}: cannot read {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    _report_file(path, data)
    if args.events > 0:
        _measure(data, args.events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
