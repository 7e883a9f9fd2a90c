"""The ``openstarry worker``, ``publish`` and ``tail`` commands: an agent over a shared bus.

    openstarry worker MANIFEST --bus redis://localhost:6379/0 [--group G] [--consumer C]
    openstarry publish --bus redis://localhost:6379/0 [FILE]        # NDJSON envelopes
    openstarry tail --bus redis://localhost:6379/0 [--type PATTERN] [--count N] [--timeout S]

All three take ``--name`` (the bus's key prefix, default ``openstarry``) and
``--partitions`` (default 8): the processes of one bus must agree on both,
since a session's partition is ``crc32(sessionId) % partitions``. A
``"bus"`` object in ``agent.json`` does not reach these commands (``worker
--bus`` runs on its command line's bus, not the manifest's): give every
process of a bus the same values on its command line.

A worker consumes the bus as one consumer of its group and publishes its
outputs back onto it; SIGTERM (or SIGINT) finishes what it has fetched, hands
back the runs it had not finished (another worker of the group takes them
over at once) and exits 0. ``publish`` prints one JSON line
``{"accepted": N, "duplicates": N, "invalid": N}`` and exits 1 if a line was
invalid (each invalid line is named on standard error, and never reaches
the bus). ``tail`` prints the bus's retained history as NDJSON, then follows
new events.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import anyio

from openstarry.bus import EventBus
from openstarry.core import DedupWindow, Event, EventQueue, Ingestor, decode_event

__all__ = ["add_commands"]

#: The longest line ``publish`` takes (as the bus's own decoder).
MAX_LINE_BYTES = 1 << 20


def _bus_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bus``, ``--name`` and ``--partitions``: the same for every process of one bus."""
    parser.add_argument("--bus", required=True, metavar="URL", help="redis://host:port/db")
    parser.add_argument(
        "--name", default="openstarry", help="the bus's key prefix (default: openstarry)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=8,
        help="session partitions; every process of the bus must agree (default: 8)",
    )


def _bus_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"name": args.name, "partitions": args.partitions}


def add_commands(commands: Any) -> None:
    """Add ``worker``, ``publish`` and ``tail`` to the ``openstarry`` parser."""
    worker = commands.add_parser("worker", help="run an agent as a consumer of a shared bus")
    worker.add_argument("manifest", help="path of the agent.json manifest")
    _bus_arguments(worker)
    worker.add_argument("--group", default=None, help="the consumer group (default: openstarry)")
    worker.add_argument("--consumer", default=None, help="this worker's name (default: host-pid)")
    worker.add_argument(
        "--otel",
        action="store_true",
        help="trace the agent's runs with OpenTelemetry, as the OTEL_* environment variables "
        "say (needs openstarry[otel]; see openstarry serve --help)",
    )
    worker.set_defaults(handler=lambda args: anyio.run(_worker, args))

    publish = commands.add_parser("publish", help="publish NDJSON envelopes onto a shared bus")
    _bus_arguments(publish)
    publish.add_argument("file", nargs="?", help="NDJSON file (default: standard input)")
    publish.set_defaults(handler=lambda args: anyio.run(_publish, args))

    tail = commands.add_parser("tail", help="print a shared bus's history, then follow it")
    _bus_arguments(tail)
    tail.add_argument("--type", default="*", metavar="PATTERN", help="TYPE, NAMESPACE:* or *")
    tail.add_argument("--count", type=int, default=None, help="stop after N matching events")
    tail.add_argument(
        "--timeout", type=float, default=None, help="stop after S seconds without a match"
    )
    tail.set_defaults(handler=lambda args: anyio.run(_tail, args))


async def _worker(args: argparse.Namespace) -> int:
    from openstarry.assembly import agent_from_manifest

    # OPENSTARRY_CLAIM_IDLE: seconds before a dead worker's partitions move (default 10).
    claim_idle = float(os.environ.get("OPENSTARRY_CLAIM_IDLE") or 10)
    bus = EventBus.from_url(
        args.bus,
        group=args.group,
        consumer=args.consumer,
        claim_idle=claim_idle,
        **_bus_options(args),
    )
    agent = agent_from_manifest(args.manifest, bus=bus)
    tracer_provider = getattr(args, "tracer_provider", None)  # --otel, set up by cli.main
    if tracer_provider is not None:
        from openstarry.otel import instrument

        instrument(agent, tracer_provider)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with bus, agent:
            print(
                f"openstarry worker: {agent.name} consuming {args.bus} as "
                f"{bus.backend.consumer} in group {bus.backend.group}",  # type: ignore[union-attr]
                file=sys.stderr,
                flush=True,
            )
            async for _ in signals:
                break
    return 0


async def _publish(args: argparse.Namespace) -> int:
    if args.file:
        with open(args.file, "rb") as f:
            data = f.read()
    else:
        data = sys.stdin.buffer.read()
    scratch = EventQueue(None)
    # The file's own repeats are counted here; every other producer's, in Redis.
    result = Ingestor(
        scratch, DedupWindow(60_000, 1_000_000), max_line_bytes=MAX_LINE_BYTES
    ).ingest(data)
    for line, message in result.invalid:
        print(f"openstarry publish: line {line + 1}: {message}", file=sys.stderr)
    events: list[Event] = scratch.pop_many(len(scratch))
    bus = EventBus.from_url(args.bus, consume=False, dedup=False, **_bus_options(args))
    async with bus:
        backend: Any = bus.backend
        answers = await backend.asend_many(events) if events else []
    accepted = sum(answers)
    counts = {
        "accepted": accepted,
        "duplicates": result.duplicates + len(answers) - accepted,
        "invalid": len(result.invalid),
    }
    print(json.dumps(counts), flush=True)
    return 1 if result.invalid else 0


def _matcher(pattern: str) -> Any:
    if pattern == "*":
        return lambda kind: True
    if pattern.endswith(":*"):
        prefix = pattern[:-1]
        return lambda kind: kind.startswith(prefix)
    return lambda kind: kind == pattern


async def _tail(args: argparse.Namespace) -> int:
    from openstarry.redis_streams import RedisStreams

    matches = _matcher(args.type)
    left = args.count
    backend = RedisStreams(args.bus, consume=False, **_bus_options(args))
    out = sys.stdout.buffer

    def show(wire: bytes) -> bool:
        try:
            event = decode_event(wire)
        except ValueError:
            return False
        if not matches(event.type):
            return False
        out.write(wire + b"\n")
        out.flush()
        return True

    async with EventBus(backend=backend):
        cursors: dict[str, str] = {}
        for _, wire in await backend.history(cursors):
            if show(wire) and left is not None:
                left -= 1
                if left <= 0:
                    return 0
        waited = 0.0
        step = 0.5 if args.timeout is None else min(0.5, args.timeout)
        while args.timeout is None or waited < args.timeout:
            entries = await backend.follow(cursors, step)
            waited += step
            for _, wire in entries:
                if show(wire):
                    waited = 0.0
                    if left is not None:
                        left -= 1
                        if left <= 0:
                            return 0
    return 0
