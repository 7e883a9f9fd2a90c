"""The ``openstarry worker``, ``publish`` and ``tail`` commands: an agent over a shared bus.

    openstarry worker MANIFEST --bus redis://localhost:6379/0 [--group G] [--consumer C]
    openstarry publish --bus redis://localhost:6379/0 [FILE]        # NDJSON envelopes
    openstarry tail --bus redis://localhost:6379/0 [--type PATTERN] [--count N] [--timeout S]
                    [--since WHEN | --from-end]

All three take ``--bus`` (one Redis server, ``redis://host:port/db``, or a
Redis Cluster, ``redis+cluster://host:port[,host:port...]``), ``--name`` (the
bus's key prefix, default ``openstarry``) and ``--partitions`` (default 8 on
one server, 24 on a cluster): the processes of one bus must agree on both,
since a session's partition is ``crc32(sessionId) % partitions``. A
``"bus"`` object in ``agent.json`` does not reach these commands (``worker
--bus`` runs on its command line's bus, not the manifest's): give every
process of a bus the same values on its command line.

A worker consumes the bus as one consumer of its group and publishes its
outputs back onto it; SIGTERM (or SIGINT) finishes what it has fetched, hands
back the runs it had not finished (another worker of the group takes them over
at once) and exits 0 (130 after SIGINT). ``publish`` prints one JSON line
``{"accepted": N, "duplicates": N, "invalid": N}`` and exits 1 if a line was
invalid (each invalid line is named on standard error, and never reaches the
bus); while the bus's streams are full it says so once, and Ctrl-C ends it at
once with its counts so far (and ``"unsent": N``). The bus records its
partition count at its first use: a process that gives another is refused.
``tail`` prints the bus's retained history as NDJSON, then follows new events:
it reads a page of each stream at a time, merged by entry id as it goes
(:mod:`openstarry.bus.redis.reader`), so it starts printing at once and holds
a few pages whatever the history's length; ``--count`` stops it as soon as it
has printed N events. ``--since`` starts it at a time (ISO-8601; the Redis
server's clock stamps each entry), at a Redis entry id, or after an event (by
its id, found by reading the history from its start); ``--from-end`` skips the
history. A lost or unreachable Redis ends ``tail`` with one line on standard
error and exit status 1. ``bus info`` shows where the bus's partitions live
and what they hold (:mod:`openstarry.cli.businfo`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from contextlib import aclosing
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import anyio

from openstarry.bus import EventBus
from openstarry.cli.busargs import (
    bus_arguments,
    bus_options,
    count,
    durability_argument,
    redacted,
)
from openstarry.cli.tracing import trace_agent
from openstarry.core import DedupWindow, Event, EventQueue, Ingestor, decode_event

__all__ = ["add_commands"]

#: The longest line ``publish`` takes (as the bus's own decoder).
MAX_LINE_BYTES = 1 << 20


def add_commands(commands: Any) -> None:
    """Add ``worker``, ``publish``, ``tail`` and ``bus info`` to the ``openstarry`` parser."""
    worker = commands.add_parser("worker", help="run an agent as a consumer of a shared bus")
    worker.add_argument("manifest", help="path of the agent.json manifest")
    bus_arguments(worker)
    worker.add_argument("--group", default=None, help="the consumer group (default: openstarry)")
    worker.add_argument("--consumer", default=None, help="this worker's name (default: host-pid)")
    worker.add_argument(
        "--otel",
        action="store_true",
        help="trace the agent's runs with OpenTelemetry, as the OTEL_* environment variables "
        "say (needs openstarry[otel]; see openstarry serve --help)",
    )
    durability_argument(worker)
    worker.set_defaults(handler=lambda args: anyio.run(_worker, args))

    publish = commands.add_parser("publish", help="publish NDJSON envelopes onto a shared bus")
    bus_arguments(publish)
    durability_argument(publish)
    publish.add_argument("file", nargs="?", help="NDJSON file (default: standard input)")
    publish.set_defaults(handler=lambda args: anyio.run(_publish, args))

    tail = commands.add_parser(
        "tail",
        help="print a shared bus's history, then follow it",
        description="Print the bus's retained history as NDJSON, oldest first, then follow "
        "new events. The history is read a page at a time, so printing starts at once "
        "on a bus of any length.",
    )
    bus_arguments(tail)
    tail.add_argument("--type", default="*", metavar="PATTERN", help="TYPE, NAMESPACE:* or *")
    tail.add_argument(
        "--count", type=count, default=None, metavar="N", help="stop after N matching events"
    )
    tail.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="stop after S seconds without a match",
    )
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--since",
        type=_since,
        default=None,
        metavar="WHEN",
        help="start at a time (ISO-8601, e.g. 2026-11-27T14:05:00Z; without an offset, "
        "local time), at a Redis entry id (MS-SEQ: at or after it, in every stream), or "
        "after an event (its id: the events that came after it)",
    )
    start.add_argument(
        "--from-end",
        action="store_true",
        help="skip the history: only events published from now on",
    )
    tail.set_defaults(handler=lambda args: anyio.run(_tail, args))

    from openstarry.cli.businfo import add_info_command

    add_info_command(commands, bus_arguments)


#: ``OPENSTARRY_CLAIM_IDLE``: seconds before a dead worker's partitions move, by default.
CLAIM_IDLE = 10.0


def claim_idle() -> float:
    """``OPENSTARRY_CLAIM_IDLE`` (seconds, more than 0), or :data:`CLAIM_IDLE` when unset.

    Raises:
        ValueError: not a finite number of seconds more than 0.
    """
    text = os.environ.get("OPENSTARRY_CLAIM_IDLE", "").strip()
    if not text:
        return CLAIM_IDLE
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(
            f"OPENSTARRY_CLAIM_IDLE: expected seconds, a number more than 0, not {text!r}"
        )
    return value


async def _worker(args: argparse.Namespace) -> int:
    from openstarry.assembly import agent_from_manifest

    bus = EventBus.from_url(
        args.bus,
        group=args.group,
        consumer=args.consumer,
        claim_idle=claim_idle(),  # checked by the command before it starts
        **bus_options(args),
    )
    agent = agent_from_manifest(args.manifest, bus=bus)
    trace_agent(args, agent)  # --otel
    received = signal.SIGTERM
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with bus, agent:
            print(
                f"openstarry worker: {agent.name} consuming {args.bus} as "
                f"{bus.backend.consumer} in group {bus.backend.group}",  # type: ignore[union-attr]
                file=sys.stderr,
                flush=True,
            )
            async for signum in signals:
                received = signum
                break
    # Ctrl-C ends with 130, as a shell expects; SIGTERM, a service's stop, with 0.
    return 130 if received == signal.SIGINT else 0


#: Seconds without an accepted publish, while the streams refuse, before ``publish`` says so.
BLOCKED_NOTICE = 2.0


def _read_input(path: str | None) -> bytes:
    """The bytes ``publish`` sends: the file's, or standard input's.

    Raises:
        ValueError: the file cannot be read, in one line.
    """
    if not path:
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


async def _publish(args: argparse.Namespace) -> int:
    # Made first: without the [redis] extra, that is said before any input is read.
    bus = EventBus.from_url(args.bus, consume=False, dedup=False, **bus_options(args))
    try:
        data = _read_input(args.file)
    except ValueError as exc:
        print(f"openstarry publish: {exc}", file=sys.stderr)
        return 2
    scratch = EventQueue(None)
    # The file's own repeats are counted here; every other producer's, in Redis.
    result = Ingestor(
        scratch, DedupWindow(60_000, 1_000_000), max_line_bytes=MAX_LINE_BYTES
    ).ingest(data)
    for line, message in result.invalid:
        print(f"openstarry publish: line {line + 1}: {message}", file=sys.stderr)
    events: list[Event] = scratch.pop_many(len(scratch))
    interrupted = False
    async with bus:
        backend: Any = bus.backend
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            async with anyio.create_task_group() as tasks:

                async def on_interrupt() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        backend.discard_unsent()  # the rest never reaches the bus
                        tasks.cancel_scope.cancel()

                tasks.start_soon(on_interrupt)
                tasks.start_soon(_tell_when_blocked, backend)
                if events:
                    await backend.asend_many(events)
                tasks.cancel_scope.cancel()
    counts = {
        "accepted": backend.sent,
        "duplicates": result.duplicates + backend.duplicates,
        "invalid": len(result.invalid),
    }
    if interrupted:
        counts["unsent"] = len(events) - backend.sent - backend.duplicates
    print(json.dumps(counts), flush=True)
    if interrupted:
        return 130
    return 1 if result.invalid else 0


async def _tell_when_blocked(backend: Any) -> None:
    """Say once, on standard error, which streams hold ``publish`` back, and why."""
    progress = (backend.sent, backend.duplicates)
    still = 0.0
    while True:
        await anyio.sleep(0.5)
        now = (backend.sent, backend.duplicates)
        still = still + 0.5 if now == progress and backend.refused_full else 0.0
        progress = now
        if still < BLOCKED_NOTICE:
            continue
        full = await backend.full_streams()
        if not full:
            continue
        names = ", ".join(f"{key} ({length:,} entries)" for key, length in full)
        print(
            f"openstarry publish: waiting: the bus's streams are at their bound "
            f"(maxlen {backend.maxlen:,}): {names}; publishing resumes as workers "
            "drain them",
            file=sys.stderr,
            flush=True,
        )
        return


def _matcher(pattern: str) -> Any:
    if pattern == "*":
        return lambda kind: True
    if pattern.endswith(":*"):
        prefix = pattern[:-1]
        return lambda kind: kind.startswith(prefix)
    return lambda kind: kind == pattern


class _Since(NamedTuple):
    """Where ``tail --since`` starts: an entry id (inclusive), or after an event."""

    start: str
    after_event: str | None = None


#: A Redis entry id: ``MS-SEQ``, or ``MS`` alone.
_ENTRY_ID = re.compile(r"(\d+)(?:-(\d+))?")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _since(text: str) -> _Since:
    """``--since``: an entry id, an ISO-8601 time, or else an event id (in that order)."""
    text = text.strip()
    if not text:
        raise argparse.ArgumentTypeError("give a time, a Redis entry id or an event id")
    entry = _ENTRY_ID.fullmatch(text)
    if entry is not None:
        ms, seq = int(entry[1]), int(entry[2] or 0)
        if max(ms, seq) >= 1 << 64:
            raise argparse.ArgumentTypeError(f"a Redis entry id's parts are under 2**64: {text}")
        return _Since(f"{ms}-{seq}")
    if re.match(r"\d{4}-\d{2}-\d{2}", text):
        # Python 3.10's fromisoformat takes no "Z".
        iso = text[:-1] + "+00:00" if text[-1] in "zZ" else text
        try:
            moment = datetime.fromisoformat(iso)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not an ISO-8601 time: {text!r} (e.g. 2026-11-27T14:05:00Z)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.astimezone()  # this machine's local time
        ms = (moment - _EPOCH) // timedelta(milliseconds=1)
        if ms < 0:
            raise argparse.ArgumentTypeError(f"a time from 1970 on, not {text}")
        return _Since(f"{ms}-0")
    return _Since("-", after_event=text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds are 0 or more, not {text}")
    return value


def _event_id(wire: bytes) -> str | None:
    try:
        return decode_event(wire).id
    except ValueError:
        return None


async def _tail(args: argparse.Namespace) -> int:
    from openstarry.bus.redis.reader import (
        ERRORS,
        bus_layout,
        connect,
        read_ends,
        read_history,
        read_new,
    )

    matches = _matcher(args.type)
    left = args.count
    out = sys.stdout.buffer
    since: _Since = args.since or _Since("-")

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

    client = connect(args.bus)
    cursors: dict[str, str] = {}
    reading = "reading the history"
    try:
        layout = await bus_layout(client, args.bus, args.name, args.partitions)
        keys = [key for p in range(layout.partitions) for key in layout.streams(p)]
        if args.from_end:
            cursors = await read_ends(client, keys)
        else:
            after = since.after_event
            async with aclosing(read_history(client, keys, cursors, start=since.start)) as history:
                async for _, wire in history:
                    if after is not None:
                        if _event_id(wire) == after:
                            after = None
                        continue
                    if show(wire) and left is not None:
                        left -= 1
                        if left <= 0:
                            return 0
            if after is not None:
                print(
                    f"openstarry tail: --since: no event {after!r} in the bus's retained history",
                    file=sys.stderr,
                )
                return 1
        reading = "following the bus"
        step = 0.5 if args.timeout is None else min(0.5, args.timeout)
        deadline = None if args.timeout is None else anyio.current_time() + args.timeout
        while deadline is None or anyio.current_time() < deadline:
            for _, wire in await read_new(client, cursors, step):
                if show(wire):
                    if deadline is not None:
                        deadline = anyio.current_time() + args.timeout
                    if left is not None:
                        left -= 1
                        if left <= 0:
                            return 0
        return 0
    except ERRORS as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"openstarry tail: {reading} on {redacted(args.bus)}: {text}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`tail | head`): stop quietly, as `cat` does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        with anyio.move_on_after(2, shield=True):
            await client.aclose()
