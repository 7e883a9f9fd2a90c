"""The Redis bus under load: P producer processes and W worker processes on one Redis,
or on a Redis Cluster.

    python -m benches.redis_load --producers 4 --workers 2 --events 200000
    python -m benches.redis_load --url redis://10.0.0.5:6379/0 --producers 8 --workers 8
    python -m benches.redis_load --cluster 3 --producers 6 --workers 6 --events 600000
    python -m benches.redis_load --url redis+cluster://10.0.0.5:7000 --producers 8 --workers 8

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
- ``handled``: inputs handled (an input handled twice would show here);
- ``nodes``: one entry per master (one on a single server), by the first
  partition it holds: its ``address``, its ``partitions``, the ``events`` its
  partitions' streams carried (the sum of their ``XINFO STREAM``
  ``entries-added``, inputs and effects), their ``share`` of all, its
  ``events_per_s``, its ``xadd_calls`` and ``evalsha_calls`` (``INFO
  commandstats``: the XADDs its flush scripts ran), its Redis CPU
  (``cpu_s``, ``INFO cpu`` user + system) and ``cpu_us_per_event`` (that CPU
  over the events it carried).

Without ``--url`` it starts its own ``redis-server`` (in memory) and stops it;
with ``--cluster N`` it starts a Redis Cluster of N masters (no replicas, in
memory, on this machine), runs the same load on it (24 partitions unless
``--partitions``, 8 on each of 3 masters) and stops it, and also prints the
per-master figures as a table on stderr. ``--maxlen`` lowers the streams'
bound to reach it sooner. The redis-server processes share this machine's
cores with the producers and workers: a cluster shows its scaling only where
there are cores for every master beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.cluster

from benches.redis_cluster import wait_balanced
from openstarry.bus import EventBus
from openstarry.bus.redis.keys import Layout, cluster_nodes, default_partitions, is_cluster_url
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
    #: 0: the bus's default for the URL (8 on one server, 24 on a cluster).
    partitions: int = 0
    maxlen: int = 10_000
    claim_idle: float = 2.0
    sessions: int = 256
    #: Effects each input's handler publishes.
    outputs: int = 0
    #: The workers keep the id of every input they handle (:meth:`Rig.seen`).
    track: bool = False

    def __post_init__(self) -> None:
        if self.partitions <= 0:
            object.__setattr__(self, "partitions", default_partitions(self.url))

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


def _worker(settings: Settings, index: int, handled: Any, stop: Any, ids: Any) -> None:
    outputs = settings.outputs
    kept: list[str] = []

    async def main() -> None:
        bus = EventBus.from_url(
            settings.url, group=GROUP, consumer=f"worker-{index}", **settings.options()
        )
        seen = 0
        keep = kept.append if settings.track else None

        def handle(event: Event) -> None:
            nonlocal seen
            seen += 1
            handled.value = seen
            if keep is not None:
                keep(event.id)
            for i in range(outputs):
                bus.publish(event.child("OUTPUT:TEXT", {"text": f"answer {i}"}, source="worker"))

        bus.subscribe("INPUT:*", handle)
        async with bus:
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(main())
    if settings.track:
        ids.put(kept)


class Round:
    """Producer processes started, connected, their events made, waiting for :meth:`Rig.go`."""

    def __init__(self, rig: Rig, producers: int, events: int) -> None:
        context = rig.context
        self.events = events
        self.start = context.Event()
        self.results: Any = context.Queue()
        ready: Any = context.Queue()
        share, extra = divmod(events, producers)
        self.processes = []
        #: The ids of the round's inputs (with ``Settings.track``).
        self.ids: list[str] = []
        for i in range(producers):
            n = share + (i < extra)
            batch = inputs(rig.rounds * 1000 + i, n, rig.settings.sessions)
            if rig.settings.track:
                self.ids += [e.id for e in batch]
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
        self._ids: Any = self.context.Queue()
        self.workers = [
            self.context.Process(
                target=_worker,
                args=(settings, i, self.counters[i], self.stop, self._ids),
                daemon=True,
            )
            for i in range(workers)
        ]
        self.rounds = 0
        #: Every input id the workers handled, as often as handled (``Settings.track``;
        #: filled by :meth:`close`).
        self.seen: Counter[str] = Counter()

    def handled(self) -> int:
        return sum(int(c.value) for c in self.counters)

    def start(self) -> None:
        nodes = Nodes(self.settings.url, NAME, self.settings.partitions)
        try:
            nodes.flushall()
            for process in self.workers:
                process.start()
            wait_balanced(
                nodes.client,
                NAME,
                GROUP,
                self.settings.partitions,
                len(self.workers),
                cluster=nodes.cluster,
            )
        finally:
            nodes.close()

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
        if self.settings.track:
            for process in self.workers:
                if process.pid is not None:
                    with contextlib.suppress(queue.Empty):
                        self.seen.update(self._ids.get(timeout=15))
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


@dataclass(frozen=True)
class Sample:
    """One master's counters at one moment (:meth:`Nodes.sample`)."""

    #: Redis's CPU seconds, user + system (``INFO cpu``).
    cpu: float
    #: Entries ever added to the streams of the partitions it holds (``entries-added``).
    added: int
    #: ``INFO commandstats`` calls of ``XADD`` (scripts' included) and ``EVALSHA``.
    xadd: int
    evalsha: int


class Nodes:
    """The masters of a Redis the load runs on: the one server, or each master of a
    cluster with the partitions of the bus it holds; what each did between two samples.

    A partition's keys are all on one master (one hash tag each on a cluster), so
    the entries added to its streams are the events that master carried.
    """

    def __init__(self, url: str, name: str, partitions: int) -> None:
        self.cluster = is_cluster_url(url)
        self.layout = layout = Layout(name, partitions, cluster=self.cluster)
        held: dict[str, list[int]] = {}
        self.masters: dict[str, redis.Redis] = {}
        if self.cluster:
            seeds, options = cluster_nodes(url)
            node_class: Any = redis.cluster.ClusterNode  # redis-py's cluster is untyped
            client: Any = redis.cluster.RedisCluster(
                startup_nodes=[node_class(host, port) for host, port in seeds], **options
            )
            self.client: Any = client
            for p in range(partitions):
                node = client.get_node_from_key(layout.dead(p))
                held.setdefault(node.name, []).append(p)
                self.masters[node.name] = client.get_redis_connection(node)
        else:
            self.client = redis.Redis.from_url(url)
            kwargs = self.client.connection_pool.connection_kwargs
            address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
            held[address] = list(range(partitions))
            self.masters[address] = self.client
        #: The partitions each master holds, by master (``host:port``), by first partition.
        self.held = dict(sorted(held.items(), key=lambda item: item[1][0]))

    def flushall(self) -> None:
        for client in self.masters.values():
            client.flushall()

    def reset_stats(self) -> None:
        """``CONFIG RESETSTAT`` on every master (the ``commands`` figures start again)."""
        for client in self.masters.values():
            client.config_resetstat()

    def sample(self) -> dict[str, Sample]:
        """Every master's counters now."""
        out = {}
        for address, partitions in self.held.items():
            client = self.masters[address]
            pipe: Any = client.pipeline(transaction=False)
            for p in partitions:
                for key in self.layout.streams(p):
                    pipe.execute_command("XINFO", "STREAM", key)
            added = 0
            for reply in pipe.execute(raise_on_error=False):
                if isinstance(reply, dict):  # a stream not made yet answers an error
                    added += int(reply[b"entries-added"])
            stats: Any = client.info("commandstats")
            out[address] = Sample(
                cpu=_cpu(client),
                added=added,
                xadd=int(stats.get("cmdstat_xadd", {}).get("calls", 0)),
                evalsha=int(stats.get("cmdstat_evalsha", {}).get("calls", 0)),
            )
        return out

    def commands(self) -> dict[str, dict[str, float]]:
        """Every command's calls and microseconds per call, over all masters."""
        calls: Counter[str] = Counter()
        usec: Counter[str] = Counter()
        for client in self.masters.values():
            stats: Any = client.info("commandstats")
            for name, s in stats.items():
                command = name.removeprefix("cmdstat_")
                calls[command] += int(s["calls"])
                usec[command] += int(s["usec"])
        return {
            c: {"calls": calls[c], "us_per_call": round(usec[c] / max(1, calls[c]), 2)}
            for c in calls
        }

    def per_node(
        self, before: dict[str, Sample], after: dict[str, Sample], seconds: float
    ) -> list[dict[str, Any]]:
        """Each master's share of the work between two samples (see the module's ``nodes``)."""
        events = {a: after[a].added - before[a].added for a in self.held}
        total = max(1, sum(events.values()))
        out = []
        for address, partitions in self.held.items():
            cpu = after[address].cpu - before[address].cpu
            out.append(
                {
                    "address": address,
                    "partitions": len(partitions),
                    "events": events[address],
                    "share": round(events[address] / total, 4),
                    "events_per_s": int(events[address] / seconds) if seconds > 0 else 0,
                    "xadd_calls": after[address].xadd - before[address].xadd,
                    "evalsha_calls": after[address].evalsha - before[address].evalsha,
                    "cpu_s": round_(cpu),
                    "cpu_us_per_event": round_(cpu / max(1, events[address]) * 1e6),
                }
            )
        return out

    def close(self) -> None:
        self.client.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One load run on ``args.url``; the figures the module's docstring lists."""
    settings = Settings(
        url=args.url,
        partitions=args.partitions or 0,
        maxlen=args.maxlen,
        claim_idle=args.claim_idle,
        sessions=args.sessions,
        outputs=args.outputs,
    )
    handled = 0
    with Rig(settings, args.workers) as rig:
        nodes = Nodes(args.url, NAME, settings.partitions)
        trial = rig.prepare(args.producers, args.events)
        try:
            nodes.reset_stats()
            before = nodes.sample()
            workers_cpu = sum(_process_cpu(w.pid) for w in rig.workers)
            producers_cpu = sum(_process_cpu(p.pid) for p in trial.processes)
            started = time.perf_counter()
            # A run that stalls is reported as such: handled < events.
            with contextlib.suppress(TimeoutError):
                rig.go(trial, timeout=args.timeout)
            elapsed = time.perf_counter() - started
            after = nodes.sample()
            workers_cpu = sum(_process_cpu(w.pid) for w in rig.workers) - workers_cpu
            producers_cpu = sum(_process_cpu(p.pid) for p in trial.processes) - producers_cpu
            commands = nodes.commands()
            answers = trial.answers()
            time.sleep(0.5)  # an input handled twice would show now
            handled = rig.handled()
        finally:
            trial.close()
            nodes.close()
    cpu = sum(after[a].cpu - before[a].cpu for a in after)
    script = commands.get("evalsha", {"calls": 0, "us_per_call": 0.0})
    return {
        "producers": args.producers,
        "workers": args.workers,
        "events": args.events,
        "outputs": args.outputs,
        "maxlen": args.maxlen,
        "partitions": settings.partitions,
        "masters": len(nodes.held),
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
        "nodes": nodes.per_node(before, after, elapsed),
        "commands": commands,
    }


def node_table(result: dict[str, Any]) -> str:
    """The per-master figures of a run, as a few lines of text."""
    lines = [
        f"{result['events_per_s']:,} inputs/s in all over {result['masters']} master(s), "
        f"{result['partitions']} partitions; Redis CPU {result['redis_cpu_us_per_event']} µs "
        "per input (all masters)",
        f"{'master':<22}{'partitions':>11}{'events':>10}{'share':>8}{'events/s':>11}"
        f"{'xadd':>10}{'cpu s':>8}{'cpu µs/event':>14}",
    ]
    for n in result["nodes"]:
        lines.append(
            f"{n['address']:<22}{n['partitions']:>11}{n['events']:>10}{n['share']:>8.3f}"
            f"{n['events_per_s']:>11,}{n['xadd_calls']:>10}{n['cpu_s']:>8}"
            f"{n['cpu_us_per_event']:>14}"
        )
    return "\n".join(lines)


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
    p.add_argument(
        "--partitions", type=int, default=None, help="default: 8 on one server, 24 on a cluster"
    )
    p.add_argument("--maxlen", type=int, default=10_000, help="the streams' bound")
    p.add_argument("--claim-idle", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=300.0, help="give up after S seconds")
    p.add_argument(
        "--cluster",
        type=int,
        default=None,
        metavar="N",
        help="start a Redis Cluster of N masters (at least 3, no replicas) here and run the "
        "load on it; prints the per-master figures too",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if min(args.producers, args.workers, args.events) < 1:
        print("redis_load: --producers, --workers and --events must be >= 1", file=sys.stderr)
        return 2
    if args.cluster is not None and (args.cluster < 3 or args.url is not None):
        print("redis_load: --cluster needs at least 3 masters, and no --url", file=sys.stderr)
        return 2
    if args.url is not None:
        result = run(args)
    else:
        with tempfile.TemporaryDirectory() as folder:
            if args.cluster is not None:
                from benches.redis_cluster_rig import start_cluster

                cluster = start_cluster(args.cluster, Path(folder))
                try:
                    args.url = cluster.url
                    result = run(args)
                finally:
                    cluster.stop()
            else:
                from openstarry.redis_server import RedisServer

                server = RedisServer(Path(folder), aof=False)
                server.start()
                try:
                    args.url = server.url
                    result = run(args)
                finally:
                    server.stop()
    if result["masters"] > 1:
        print(node_table(result), file=sys.stderr)
    print(json.dumps(result))
    ok = result["handled"] == args.events and result["accepted"] == args.events
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
