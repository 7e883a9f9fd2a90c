"""The Redis bus under load: P producer processes and W worker processes on one Redis.

    python -m benches.redis_load --producers 4 --workers 2 --events 200000
    python -m benches.redis_load --url redis://10.0.0.5:6379/0 --producers 8 --workers 8

Each producer publishes its share of ``--events`` fresh inputs (priority 2,
over ``--sessions`` sessions) with openstarry's producer
(``asend_many``) as fast as Redis takes them; each worker is an
:class:`~openstarry.bus.EventBus` consumer whose handler publishes
``--outputs`` events per input as effects of it (0: a no-op handler; an agent
answers an input with about ten). The clock runs from the first publish to
the last input handled. It prints one line of JSON:

- ``events_per_s``: inputs handled per second;
- ``redis_cpu_us_per_event``: Redis's CPU time (``INFO cpu``, user + system)
  per input handled, effects included;
- ``script_us_per_call`` and ``script_calls``: the flush script's cost per
  call (``INFO commandstats``, ``evalsha``), and ``commands``: every command's
  calls and microseconds per call;
- ``accepted``, ``duplicates``, ``refused_full``, ``reconnects``: what the
  producers' answers said (every input must be accepted exactly once) and how
  often a flush was refused for a full stream or sent again;
- ``handled``: inputs handled (an input handled twice would show here).

Without ``--url`` it starts its own ``redis-server`` (in memory) and stops it.
``--maxlen`` lowers the streams' bound to reach it sooner.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from openstarry.bus import EventBus
from openstarry.core import Event

NAME = "load"
GROUP = "load"


def inputs(producer: int, n: int, sessions: int) -> list[Event]:
    """``n`` fresh inputs of one producer over ``sessions`` sessions, at priority 2."""
    return [
        Event.new(
            "INPUT:USER_MESSAGE",
            {"text": f"hello {producer}-{i}"},
            source=f"producer-{producer}",
            session_id=f"s{(producer * n + i) % sessions}",
            priority=2,
        )
        for i in range(n)
    ]


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": NAME,
        "partitions": args.partitions,
        "maxlen": args.maxlen,
        "claim_idle": args.claim_idle,
    }


def _producer(args: argparse.Namespace, index: int, n: int, start: Any, results: Any) -> None:
    batch = inputs(index, n, args.sessions)

    async def main() -> dict[str, int]:
        async with EventBus.from_url(args.url, consume=False, **_options(args)) as bus:
            backend: Any = bus.backend
            start.wait()
            answers = await backend.asend_many(batch)
            metrics = backend.metrics()
        return {
            "accepted": sum(answers),
            "duplicates": len(answers) - sum(answers),
            "refused_full": metrics["refused_full"],
            "reconnects": metrics["reconnects"],
        }

    results.put(asyncio.run(main()))


def _worker(args: argparse.Namespace, index: int, handled: Any, stop: Any) -> None:
    outputs = args.outputs

    async def main() -> None:
        bus = EventBus.from_url(args.url, group=GROUP, consumer=f"worker-{index}", **_options(args))
        seen = 0

        def handle(event: Event) -> None:
            nonlocal seen
            seen += 1
            handled.value = seen
            for i in range(outputs):
                bus.publish(event.child("OUTPUT:TEXT", {"text": f"answer {i}"}, source="worker"))

        bus.subscribe("INPUT:*", handle)
        async with bus:
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(main())


def _balanced(client: redis.Redis, args: argparse.Namespace, timeout: float = 30.0) -> None:
    keys = [f"{{{NAME}}}:lease:{GROUP}:{p}" for p in range(args.partitions)]
    share = -(-args.partitions // args.workers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = client.mget(keys)
        if all(owners):
            counts: dict[Any, int] = {}
            for owner in owners:
                counts[owner] = counts.get(owner, 0) + 1
            if len(counts) == args.workers and max(counts.values()) <= share:
                return
        time.sleep(0.05)
    raise TimeoutError("the workers did not share the partitions")


def _cpu(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One load run on ``args.url``; the figures the module's docstring lists."""
    context = multiprocessing.get_context("spawn")
    client = redis.Redis.from_url(args.url)
    client.flushall()
    stop = context.Event()
    counters = [context.Value("q", 0, lock=False) for _ in range(args.workers)]
    workers = [
        context.Process(target=_worker, args=(args, i, counters[i], stop), daemon=True)
        for i in range(args.workers)
    ]
    for process in workers:
        process.start()
    start = context.Event()
    results: Any = context.Queue()
    share, extra = divmod(args.events, args.producers)
    sizes = [share + (i < extra) for i in range(args.producers)]
    producers = [
        context.Process(target=_producer, args=(args, i, sizes[i], start, results), daemon=True)
        for i in range(args.producers)
    ]
    try:
        _balanced(client, args)
        for process in producers:
            process.start()
        time.sleep(1.0)  # every producer connected, its events made
        client.config_resetstat()
        cpu = _cpu(client)
        started = time.perf_counter()
        start.set()
        deadline = started + args.timeout
        handled = 0
        while handled < args.events:
            if time.perf_counter() > deadline:
                break
            time.sleep(0.002)
            handled = sum(int(c.value) for c in counters)
        elapsed = time.perf_counter() - started
        cpu = _cpu(client) - cpu
        stats: Any = client.info("commandstats")
        answers = [results.get(timeout=60) for _ in producers]
        time.sleep(0.5)  # an input handled twice would show now
        handled = sum(int(c.value) for c in counters)
    finally:
        stop.set()
        for process in [*producers, *workers]:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()
        client.close()
    commands = {
        name.removeprefix("cmdstat_"): {"calls": s["calls"], "us_per_call": s["usec_per_call"]}
        for name, s in stats.items()
    }
    script = commands.get("evalsha", {"calls": 0, "us_per_call": 0.0})
    return {
        "producers": args.producers,
        "workers": args.workers,
        "events": args.events,
        "outputs": args.outputs,
        "maxlen": args.maxlen,
        "handled": handled,
        "seconds": round(elapsed, 3),
        "events_per_s": round(args.events / elapsed) if handled >= args.events else 0,
        "redis_cpu_us_per_event": round(cpu / max(1, handled) * 1e6, 2),
        "script_calls": script["calls"],
        "script_us_per_call": script["us_per_call"],
        "accepted": sum(a["accepted"] for a in answers),
        "duplicates": sum(a["duplicates"] for a in answers),
        "refused_full": sum(a["refused_full"] for a in answers),
        "reconnects": sum(a["reconnects"] for a in answers),
        "commands": commands,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benches.redis_load", description=__doc__)
    p.add_argument("--url", default=None, help="a Redis to use (default: start one)")
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--events", type=int, default=100_000, help="inputs in all")
    p.add_argument("--outputs", type=int, default=0, help="effects each input's handler publishes")
    p.add_argument("--sessions", type=int, default=256)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--maxlen", type=int, default=10_000, help="the streams' bound")
    p.add_argument("--claim-idle", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=300.0, help="give up after S seconds")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if min(args.producers, args.workers, args.events) < 1:
        print("redis_load: --producers, --workers and --events must be >= 1", file=sys.stderr)
        return 2
    if args.url is not None:
        result = run(args)
    else:
        from openstarry.redis_server import RedisServer

        with tempfile.TemporaryDirectory() as folder:
            server = RedisServer(Path(folder), aof=False)
            server.start()
            try:
                args.url = server.url
                result = run(args)
            finally:
                server.stop()
    print(json.dumps(result))
    ok = result["handled"] == args.events and result["accepted"] == args.events
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
