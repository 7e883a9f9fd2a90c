"""The Redis bus measured end to end: a producer, Redis, and consumers in their own processes.

Used by ``test_bench_redis.py``. Each consumer is a separate process (spawned,
so it shares nothing with the benchmark's), counting the events its no-op
handler saw into a shared counter the benchmark reads:

- ``openstarry``: an :class:`~openstarry.bus.EventBus` on the Redis backend
  (partition leases, one ``Ingestor`` call per fetched batch, one read
  ahead, the handled entries acknowledged with one ``XACK`` per stream in one
  script per flush);
- ``plain``: what one writes with redis-py alone: ``XREADGROUP`` over the same
  streams, ``json.loads`` per entry, and the read's entries acknowledged in one
  round trip (a pipeline of one ``XACK`` per stream), as ``redis_agents.py`` does.

The producer is openstarry's, in the benchmark's process, for both.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from openstarry.bus import EventBus
from openstarry.bus.redis import PRIORITIES, stream_key
from openstarry.bus.redis.keys import Layout
from openstarry.core import Event, encode_event

NAME = "bench"
GROUP = "bench"
PARTITIONS = 8
#: Leases renewed every 0.2 s: two consumers share the partitions quickly.
CLAIM_IDLE = 0.6


def events(n: int, sessions: int = 64) -> list[Event]:
    """``n`` fresh inputs over ``sessions`` sessions (fresh ids: no repeat for the window)."""
    return [
        Event.new(
            "INPUT:USER_MESSAGE",
            {"text": f"hello {i}"},
            source="bench",
            session_id=f"s{i % sessions}",
        )
        for i in range(n)
    ]


async def produce(url: str, batch: Sequence[Event]) -> None:
    """Publish ``batch`` with openstarry's producer and wait for every answer."""
    async with EventBus.from_url(url, consume=False, name=NAME, partitions=PARTITIONS) as bus:
        backend: Any = bus.backend
        accepted = await backend.asend_many(batch)
    assert all(accepted)


def _consume(mode: str, url: str, consumer: str, counter: Any, stop: Any) -> None:
    """A consumer process's body."""
    if mode == "openstarry":
        asyncio.run(_openstarry_consumer(url, consumer, counter, stop))
    else:
        asyncio.run(_plain_consumer(url, consumer, counter, stop))


async def _openstarry_consumer(url: str, consumer: str, counter: Any, stop: Any) -> None:
    bus = EventBus.from_url(
        url,
        group=GROUP,
        consumer=consumer,
        name=NAME,
        partitions=PARTITIONS,
        claim_idle=CLAIM_IDLE,
    )
    seen = 0

    def handle(event: Event) -> None:
        nonlocal seen
        seen += 1
        counter.value = seen

    bus.subscribe("*", handle)
    async with bus:
        while not stop.is_set():
            await asyncio.sleep(0.05)


async def _plain_consumer(url: str, consumer: str, counter: Any, stop: Any) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    keys = [stream_key(NAME, p, r) for p in range(PARTITIONS) for r in PRIORITIES]
    for key in keys:
        try:
            await client.xgroup_create(key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
    streams: dict[Any, Any] = dict.fromkeys(keys, ">")
    seen = 0
    while not stop.is_set():
        reply: Any = await client.xreadgroup(GROUP, consumer, streams, count=256, block=50)
        if not reply:
            continue
        # The read's acknowledgements in one round trip: an XACK per stream, pipelined.
        acks = client.pipeline(transaction=False)
        for stream, entries in reply:
            for _, fields in entries:
                json.loads(fields[b"e"])
            acks.xack(stream, GROUP, *[entry for entry, _ in entries])
            seen += len(entries)
        await acks.execute()
        counter.value = seen
    await client.aclose()


class Consumers:
    """Consumer processes of one kind, and the total they have handled."""

    def __init__(self, mode: str, url: str, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.counters = [context.Value("q", 0, lock=False) for _ in range(count)]
        self.processes = [
            context.Process(
                target=_consume,
                args=(mode, url, f"{mode}-{i}", self.counters[i], self.stop),
                daemon=True,
            )
            for i in range(count)
        ]
        self.mode = mode
        self.url = url

    def handled(self) -> int:
        return sum(int(c.value) for c in self.counters)

    def wait_for(self, total: int, timeout: float = 120.0) -> None:
        """Until the consumers have handled ``total`` events, looking every millisecond.

        A round takes hundreds of milliseconds, so the 1 ms step costs under
        0.5% of it; a tighter loop would take CPU from the processes measured,
        which share the machine's cores with this one.
        """
        deadline = time.monotonic() + timeout
        while self.handled() < total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.mode}: {self.handled()} of {total} handled")
            time.sleep(0.001)

    def start(self) -> None:
        for process in self.processes:
            process.start()
        if self.mode == "openstarry":
            self._wait_balanced()
        # Warm up: every consumer connected and reading.
        total = 64 * len(self.processes)
        asyncio.run(produce(self.url, events(total)))
        self.wait_for(total)

    def _wait_balanced(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            wait_balanced(client, NAME, GROUP, PARTITIONS, len(self.processes))
        finally:
            client.close()

    def close(self) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
                process.join()


def wait_balanced(
    client: Any,
    name: str,
    group: str,
    partitions: int,
    consumers: int,
    timeout: float = 30,
    *,
    cluster: bool = False,
) -> None:
    """Until the partitions are shared evenly between the leases of ``consumers`` consumers.

    ``client`` is a ``redis.Redis``, or with ``cluster`` a ``redis.cluster.RedisCluster``
    (the leases are then spread over the masters, one hash tag per partition).
    """
    layout = Layout(name, partitions, cluster=cluster)
    keys = [layout.lease(group, p) for p in range(partitions)]
    read = client.mget_nonatomic if cluster else client.mget
    share = -(-partitions // consumers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = read(keys)
        if all(owners):
            counts: dict[Any, int] = {}
            for owner in owners:
                # A lease is ``consumer|epoch``, each take of it a new epoch: count consumers.
                bar = b"|" if isinstance(owner, bytes) else "|"
                consumer = owner.rpartition(bar)[0] or owner
                counts[consumer] = counts.get(consumer, 0) + 1
            if len(counts) == consumers and max(counts.values()) <= share:
                return
        time.sleep(0.05)
    raise TimeoutError("the consumers did not share the partitions")


@contextmanager
def consumers(mode: str, url: str, count: int) -> Iterator[Consumers]:
    """``count`` consumer processes of ``mode`` on a flushed Redis, warmed up."""
    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()
    group = Consumers(mode, url, count)
    try:
        group.start()
        yield group
    finally:
        group.close()


def redis_benchmark_xadd(port: int, requests: int) -> float:
    """``redis-benchmark``'s rate of pipelined ``XADD`` (64 deep) of one envelope, per second."""
    wire = encode_event(events(1)[0]).decode()
    done = subprocess.run(
        [
            "redis-benchmark",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-n",
            str(requests),
            "-P",
            "64",
            "-q",
            "XADD",
            "bench:ceiling",
            "*",
            "e",
            wire,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    rates = re.findall(r"([\d.]+) requests per second", done.stdout)
    if not rates:
        raise RuntimeError(f"redis-benchmark said: {done.stdout[-500:]!r}")
    return float(rates[-1])
