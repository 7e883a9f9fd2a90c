"""The Redis bus: producer → Redis → 1 and 2 consumers, against a plain redis-py consumer.

Every benchmark starts its own ``redis-server`` (in memory, no AOF: the
engine's ceiling is what ``redis-benchmark`` measures on the same server) and
stops it. A round publishes ``N`` fresh events with openstarry's producer and
ends when the consumer processes have handled them all; per event, the median
round. The openstarry rows also say what fraction of ``redis-benchmark``'s
pipelined ``XADD`` rate they reach. The latency group publishes one event at a
time at a low rate and reports publish → handler p50 and p99.

Without ``--benchmark-enable`` each runs once, small, as a smoke test.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from benches import redis_cluster
from benches.harness import Benchmark, measure
from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.redis_server import RedisServer, redis_server_path

pytestmark = pytest.mark.skipif(
    redis_server_path() is None or shutil.which("redis-benchmark") is None,
    reason="redis-server and redis-benchmark are missing: `make bench` installs them",
)

N = 20_000
ROUNDS = 5
SMOKE_N = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), aof=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ceiling(server: RedisServer, request: pytest.FixtureRequest) -> float:
    """redis-benchmark's pipelined XADD rate on this server (events per second)."""
    enabled = request.config.getoption("benchmark_enable", False)
    return redis_cluster.redis_benchmark_xadd(server.port, 200_000 if enabled else 2_000)


def _throughput(
    benchmark: Benchmark, server: RedisServer, ceiling: float, mode: str, count: int
) -> None:
    disabled = bool(getattr(benchmark, "disabled", False))
    n = SMOKE_N if disabled else N
    with redis_cluster.consumers(mode, server.url, count) as group:

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (redis_cluster.events(n), group.handled() + n), {}

        def run(batch: list[Event], total: int) -> None:
            asyncio.run(redis_cluster.produce(server.url, batch))
            group.wait_for(total)

        ours = mode == "openstarry"
        plural = "consumer" if count == 1 else "consumers"
        started = time.perf_counter()
        measure(
            benchmark,
            run,
            group=f"redis: producer → Redis → {count} {plural} (per event)",
            label=f"openstarry worker bus x{count}" if ours else f"plain redis-py x{count}",
            ops=n,
            rounds=1 if disabled else ROUNDS,
            setup=setup,
            role="openstarry" if ours else "baseline",
            target=None if ours else 5.0,
            note="" if ours else "XREADGROUP (256 per read), json.loads per entry, XACK per entry",
        )
        elapsed = time.perf_counter() - started
        assert group.handled() >= n
    if ours:
        stats = getattr(benchmark, "stats", None)
        median = stats.stats.median if stats is not None else elapsed
        rate = n / median
        benchmark.extra_info["note"] = (
            f"{rate:,.0f} events/s = {rate / ceiling:.0%} of redis-benchmark's pipelined "
            f"XADD rate on the same server ({ceiling:,.0f}/s, 64 deep)."
        )


@pytest.mark.parametrize("count", [1, 2])
def test_openstarry_consumers(
    benchmark: Benchmark, server: RedisServer, ceiling: float, count: int
) -> None:
    _throughput(benchmark, server, ceiling, "openstarry", count)


@pytest.mark.parametrize("count", [1, 2])
def test_plain_redis_py_consumers(
    benchmark: Benchmark, server: RedisServer, ceiling: float, count: int
) -> None:
    _throughput(benchmark, server, ceiling, "plain", count)


async def _latencies(url: str, n: int, gap: float) -> list[float]:
    """Publish ``n`` events ``gap`` seconds apart; publish → handler time of each, seconds."""
    sent: dict[str, int] = {}
    got: list[float] = []
    arrived = anyio.Event()

    def handle(event: Event) -> None:
        got.append((time.perf_counter_ns() - sent[event.id]) / 1e9)
        arrived.set()

    options: dict[str, Any] = {"name": "latency", "claim_idle": 0.6}
    async with (
        EventBus.from_url(url, group="latency", consumer="c", **options) as consumer,
        EventBus.from_url(url, consume=False, **options) as producer,
    ):
        consumer.subscribe("*", handle)
        backend: Any = consumer.backend
        while len(backend.metrics()["partitions"]) < 8:
            await anyio.sleep(0.01)
        for i in range(n):
            event = Event.new(
                "INPUT:USER_MESSAGE", {"text": str(i)}, source="bench", session_id=f"s{i % 8}"
            )
            arrived = anyio.Event()
            sent[event.id] = time.perf_counter_ns()
            producer.publish(event)
            with anyio.fail_after(10):
                await arrived.wait()
            await anyio.sleep(gap)
    return got


def test_publish_to_handler_latency(benchmark: Benchmark, server: RedisServer) -> None:
    disabled = bool(getattr(benchmark, "disabled", False))
    n = 20 if disabled else 1_000
    samples: list[float] = []

    def run() -> None:
        samples[:] = asyncio.run(_latencies(server.url, n, 0.002))

    measure(
        benchmark,
        run,
        group="redis: publish → handler latency, one event at a time",
        label="openstarry",
        ops=n,
        rounds=1,
        role="report",
    )
    assert len(samples) == n
    cuts = statistics.quantiles(samples, n=100)
    p50, p99 = statistics.median(samples), cuts[98]
    benchmark.extra_info.update(p50=p50, p99=p99)
    benchmark.extra_info["note"] = (
        f"p50 {p50 * 1e6:.0f} µs, p99 {p99 * 1e6:.0f} µs over {n} events, one every 2 ms "
        "(producer and consumer buses in one process, sharing Redis on loopback)."
    )
