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
  per input handled, effects included; ``workers_cpu_us_per_event`` and
  ``producers_cpu_us_per_event``, the same for the worker and producer
  processes (``/proc``, Linux; the producers' up to the last handled event);
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
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benches.redis_cluster import wait_balanced
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


@dataclass(frozen=True)
class Settings:
    """The bus's settings, the same for every process of one run."""

    url: str
    partitions: int = 8
    maxlen: int = 10_000
    claim_idle: float = 2.0
    sessions: int = 256
    #: Effects each input's handler publishes.
    outputs: int = 0

    def options(self) -> dict[str, Any]:
        return {
            "name": NAME,
            "partitions": self.partitions,
            "maxlen": self.maxlen,
            "claim_idle": self.claim_idle,
        }


def _producer(
    settings: Settings, index: int, events: list[Event], ready: Any, start: Any, results: Any
) -> None:
    async def main() -> dict[str, int]:
        async with EventBus.from_url(settings.url, consume=False, **settings.options()) as bus:
            backend: Any = bus.backend
            ready.put(index)
            start.wait()
            answers = await backend.asend_many(events)
            metrics = backend.metrics()
        return {
            "accepted": sum(answers),
            "duplicates": len(answers) - sum(answers),
            "refused_full": metrics["refused_full"],
            "reconnects": metrics["reconnects"],
        }

    results.put(asyncio.run(main()))


def _worker(settings: Settings, index: int, handled: Any, stop: Any) -> None:
    outputs = settings.outputs

    async def main() -> None:
        bus = EventBus.from_url(
            settings.url, group=GROUP, consumer=f"worker-{index}", **settings.options()
        )
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


class Round:
    """Producer processes started, connected, their events made, waiting for :meth:`Rig.go`."""

    def __init__(self, rig: Rig, producers: int, events: int) -> None:
        context = rig.context
        self.events = events
        self.start = context.Event()
        self.results: Any = context.Queue()
        ready: Any = context.Queue()
        share, extra = divmod(events, producers)
        made = 0
        self.processes = []
        for i in range(producers):
            n = share + (i < extra)
            batch = inputs(rig.rounds * 1000 + i, n, rig.settings.sessions)
            made += n
            process = context.Process(
                target=_producer,
                args=(rig.settings, i, batch, ready, self.start, self.results),
                daemon=True,
            )
            process.start()
            self.processes.append(process)
        for _ in range(producers):
            ready.get(timeout=60)
        self.target = rig.handled() + events
        rig.rounds += 1

    def answers(self) -> list[dict[str, int]]:
        out = [self.results.get(timeout=60) for _ in self.processes]
        for process in self.processes:
            process.join(timeout=15)
        return out

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join()


class Rig:
    """Worker processes on one Redis, kept between rounds of producers."""

    def __init__(self, settings: Settings, workers: int) -> None:
        self.settings = settings
        self.context = multiprocessing.get_context("spawn")
        self.stop = self.context.Event()
        self.counters = [self.context.Value("q", 0, lock=False) for _ in range(workers)]
        self.workers = [
            self.context.Process(
                target=_worker, args=(settings, i, self.counters[i], self.stop), daemon=True
            )
            for i in range(workers)
        ]
        self.rounds = 0

    def handled(self) -> int:
        return sum(int(c.value) for c in self.counters)

    def start(self) -> None:
        client = redis.Redis.from_url(self.settings.url)
        client.flushall()
        for process in self.workers:
            process.start()
        try:
            wait_balanced(client, NAME, GROUP, self.settings.partitions, len(self.workers))
        finally:
            client.close()

    def prepare(self, producers: int, events: int) -> Round:
        return Round(self, producers, events)

    def go(self, trial: Round, timeout: float = 300.0) -> None:
        """Start the round's producers; return once the workers have handled its events."""
        deadline = time.perf_counter() + timeout
        trial.start.set()
        while self.handled() < trial.target:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.handled()} of {trial.target} handled")
            time.sleep(0.001)

    def close(self) -> None:
        self.stop.set()
        for process in self.workers:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()

    def __enter__(self) -> Rig:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a process of this machine has used (Linux), else 0."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One load run on ``args.url``; the figures the module's docstring lists."""
    settings = Settings(
        url=args.url,
        partitions=args.partitions,
        maxlen=args.maxlen,
        claim_idle=args.claim_idle,
        sessions=args.sessions,
        outputs=args.outputs,
    )
    client = redis.Redis.from_url(args.url)
    handled = 0
    with Rig(settings, args.workers) as rig:
        trial = rig.prepare(args.producers, args.events)
        try:
            client.config_resetstat()
            cpu = _cpu(client)
            workers_cpu = sum(_process_cpu(w.pid) for w in rig.workers)
            producers_cpu = sum(_process_cpu(p.pid) for p in trial.processes)
            started = time.perf_counter()
            # A run that stalls is reported as such: handled < events.
            with contextlib.suppress(TimeoutError):
                rig.go(trial, timeout=args.timeout)
            elapsed = time.perf_counter() - started
            cpu = _cpu(client) - cpu
            workers_cpu = sum(_process_cpu(w.pid) for w in rig.workers) - workers_cpu
            producers_cpu = sum(_process_cpu(p.pid) for p in trial.processes) - producers_cpu
            stats: Any = client.info("commandstats")
            answers = trial.answers()
            time.sleep(0.5)  # an input handled twice would show now
            handled = rig.handled()
        finally:
            trial.close()
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
        "seconds": round_(elapsed),
        "events_per_s": int(args.events / elapsed) if handled >= args.events else 0,
        "redis_cpu_us_per_event": round_(cpu / max(1, handled) * 1e6),
        "workers_cpu_us_per_event": round_(workers_cpu / max(1, handled) * 1e6),
        "producers_cpu_us_per_event": round_(producers_cpu / max(1, handled) * 1e6),
        "script_calls": script["calls"],
        "script_us_per_call": script["us_per_call"],
        "accepted": sum(a["accepted"] for a in answers),
        "duplicates": sum(a["duplicates"] for a in answers),
        "refused_full": sum(a["refused_full"] for a in answers),
        "reconnects": sum(a["reconnects"] for a in answers),
        "commands": commands,
    }


def round_(value: float) -> float:
    return float(f"{value:.3g}")


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
    p.add_argument(
        "--cluster",
        type=int,
        default=None,
        metavar="N",
        help="start a Redis Cluster of N masters (no replicas), print its URL and hold it "
        "until interrupted (the bus does not speak redis+cluster:// yet)",
    )
    return p


def hold_cluster(masters: int) -> int:
    """Start a cluster of ``masters`` masters, print its URL, and stop it on Ctrl-C/SIGTERM.

    Only a launcher for now: once the bus speaks ``redis+cluster://``, ``main`` runs the
    load on this URL as it does on ``--url``.
    """
    import signal

    from benches.redis_cluster_rig import cluster_url

    if masters < 3:
        print("redis_load: --cluster needs at least 3 masters", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with cluster_url(masters) as url:
        print(json.dumps({"cluster": url}), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if min(args.producers, args.workers, args.events) < 1:
        print("redis_load: --producers, --workers and --events must be >= 1", file=sys.stderr)
        return 2
    if args.cluster is not None:
        return hold_cluster(args.cluster)
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
