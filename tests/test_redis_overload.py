"""The Redis bus at its bound: producers that outrun the workers, against a real redis-server.

Spec 002 must hold when the streams are full: every input handled exactly
once, every publish counted exactly (accepted, duplicate or waiting for room:
never a wrong answer), the workers' own outputs never blocking the
acknowledgement of the inputs that caused them, and no timeout, reconnect or
lost lease from mere load.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry.bus import EventBus
from openstarry.bus.redis import partition_of, stream_key
from openstarry.bus.redis.leases import Leases
from openstarry.core import Event, encode_event
from openstarry.redis_server import RedisClusterServer, RedisServer
from openstarry.stores import RedisStore
from redis_support import NEEDS_REDIS_SERVER

pytestmark = [
    pytest.mark.anyio,
    NEEDS_REDIS_SERVER,
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["one node", "cluster"])
def bus_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """One redis-server, or a Redis Cluster of three masters: the same tests on each."""
    if request.param == "one node":
        server = RedisServer(tmp_path, aof=False)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    else:
        with RedisClusterServer(tmp_path / "cluster", masters=3, replicas=0) as cluster:
            yield cluster


def _input(text: str, session: str) -> Event:
    return Event.new("INPUT:USER_MESSAGE", {"text": text}, source="test", session_id=session)


async def _until(predicate: Any, timeout: float = 60.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


#: A small bound and two partitions: the streams fill within a second.
BOUND: dict[str, Any] = {"maxlen": 200, "partitions": 2}
PRODUCERS = 4
PER_PRODUCER = 1500
#: Events one producer publishes that another publishes too (exact duplicates).
SHARED = 100
#: Outputs each handled input publishes as effects of it (an agent's answer, its states).
OUTPUTS = 3


async def test_producers_outrunning_the_workers_lose_nothing_and_count_exactly(
    bus_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Four producers against two workers whose handlers publish three outputs each:
    the streams reach their bound (the producers are refused and wait), yet every
    input is handled exactly once, every output committed and handled exactly once,
    every publish answered exactly, and nothing logs a timeout or a lost lease."""
    caplog.set_level(logging.WARNING, logger="openstarry.bus.redis")
    batches = [
        [_input(f"p{p}-{i}", session=f"s{i % 50}") for i in range(PER_PRODUCER)]
        for p in range(PRODUCERS)
    ]
    shared = [_input(f"shared-{i}", session=f"s{i % 50}") for i in range(SHARED)]
    # Producers 0 and 1 both publish the shared events, each in its own order.
    batches[0][100:100] = shared
    batches[1][700:700] = shared[::-1]
    inputs: Counter[str] = Counter()
    outputs: Counter[str] = Counter()
    answers: list[list[bool]] = [[] for _ in range(PRODUCERS)]

    def worker_bus(name: str) -> EventBus:
        bus = EventBus.from_url(bus_server.url, group="g", consumer=name, claim_idle=2.0, **BOUND)

        def on_input(event: Event) -> None:
            inputs[event.id] += 1
            for i in range(OUTPUTS):
                bus.publish(event.child("OUTPUT:TEXT", {"text": f"out {i}"}, source=name))

        bus.subscribe("INPUT:*", on_input)

        def on_output(event: Event) -> None:
            outputs[event.id] += 1

        bus.subscribe("OUTPUT:*", on_output)
        return bus

    url = bus_server.url
    producers = [EventBus.from_url(url, consume=False, **BOUND) for _ in range(PRODUCERS)]
    async with worker_bus("w1") as w1, worker_bus("w2") as w2:
        workers = [w1.backend, w2.backend]
        await _until(
            lambda: all(len(w.metrics()["partitions"]) == 1 for w in workers)  # type: ignore[union-attr]
        )
        async with anyio.create_task_group() as tasks:
            for index, bus in enumerate(producers):

                async def produce(index: int = index, bus: EventBus = bus) -> None:
                    async with bus:
                        backend: Any = bus.backend
                        answers[index] = await backend.asend_many(batches[index])

                tasks.start_soon(produce)
        total = PRODUCERS * PER_PRODUCER + SHARED
        await _until(lambda: len(inputs) == total and len(outputs) == OUTPUTS * total)
        await w1.wait_idle()
        await w2.wait_idle()
        metrics = [w.metrics() for w in workers]  # type: ignore[union-attr]
    refused = sum(p.backend.metrics()["refused_full"] for p in producers)  # type: ignore[union-attr]
    assert refused > 0, "the streams never reached their bound: the test proves nothing"
    assert len(inputs) == total
    assert max(inputs.values()) == 1
    assert len(outputs) == OUTPUTS * total
    assert max(outputs.values()) == 1
    # Every answer exact: each producer's own events accepted; of the shared
    # events, each accepted by exactly one of the two producers.
    shared_ids = {e.id for e in shared}
    pairs = [
        (event.id, answer)
        for batch, batch_answers in zip(batches, answers, strict=True)
        for event, answer in zip(batch, batch_answers, strict=True)
    ]
    assert all(answer for event_id, answer in pairs if event_id not in shared_ids)
    accepted_shared = sum(answer for event_id, answer in pairs if event_id in shared_ids)
    assert sum(map(len, answers)) == total + SHARED
    assert sum(sum(a) for a in answers) == total
    assert accepted_shared == SHARED
    assert sum(m["acked"] for m in metrics) == total * (1 + OUTPUTS)
    assert sum(m["reconnects"] for m in metrics) == 0
    assert not [r.getMessage() for r in caplog.records], "a timeout, reconnect or lost lease"


async def test_a_flush_sent_again_is_answered_as_the_first_time(redis: RedisServer) -> None:
    """A flush whose answer was lost is sent again as it was: each publish in it is
    answered as it was then (accepted stays accepted, even behind this producer's
    hold), and a later flush carrying a refused publish again accepts it once."""
    async with EventBus.from_url(redis.url, consume=False, maxlen=10, partitions=1) as bus:
        backend: Any = bus.backend
        outbox = backend._outbox
        sha = backend._scripts["flush"].sha
        client = backend._client
        events = [_input(str(i), session="s") for i in range(15)]
        ops = [outbox.publish(e) for e in events]

        async def flush(number: int, heard: int, sent: list[Any]) -> list[int]:
            args = outbox._args(sent, number, heard)
            return list(await client.evalsha(sha, 1, backend.layout.dead(0), *args))

        first = await flush(1, 0, ops)
        assert first == [1] * 10 + [-1] * 5  # the bound: 10
        # The same flush again (its answer lost): the same answers, though the
        # producer's hold now refuses what flushes sent before it heard of it publish.
        assert await flush(1, 0, ops) == first
        # Sent again in a later flush, after hearing of the refusal: the ten are
        # its own (accepted, not duplicates), the five still wait for room.
        assert await flush(2, 1, ops) == first
        # Another publish of the same event (a new publish, not a retry) is a duplicate.
        again = [outbox.publish(events[0])]
        assert await flush(3, 1, again) == [0]
        assert await client.xlen(stream_key("openstarry", 0, 2)) == 10


async def _read_blocked(client: Any) -> None:
    """Until a client of the server is blocked in an ``XREADGROUP`` (``CLIENT LIST``)."""
    with anyio.fail_after(10):
        while True:
            clients = await client.client_list()
            if any(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "") for c in clients):
                return
            await anyio.sleep(0.01)


async def test_a_stop_frees_its_leases_only_once_no_read_can_deliver(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event published right after a stopping worker freed its leases is not handed
    to that worker by a read still blocked in Redis: the next worker handles it."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis.url)
    late = _input("late", session="s")
    key = stream_key("openstarry", partition_of("s", 8), late.priority)
    first = EventBus.from_url(redis.url, group="g", consumer="first", claim_idle=1.0)
    async with first:
        backend: Any = first.backend
        await _until(lambda: len(backend.metrics()["partitions"]) == 8)
        await _read_blocked(client)  # its read is now blocked in Redis, waiting for entries
        free = Leases.free

        async def free_then_publish(leases: Leases) -> None:
            await free(leases)
            await client.xadd(key, {"e": encode_event(late)})
            await anyio.sleep(0.3)  # a read still blocked would have taken it by now

        monkeypatch.setattr(Leases, "free", free_then_publish)
    pending: Any = await client.xpending(key, "g")
    assert pending["pending"] == 0, "a stopped worker holds an entry it will never handle"
    seen: list[Event] = []
    async with EventBus.from_url(redis.url, group="g", consumer="second", claim_idle=1.0) as bus:
        bus.subscribe("INPUT:*", seen.append)
        await _until(lambda: len(seen) == 1, timeout=10)
    await client.aclose()
    assert seen[0].id == late.id


async def test_the_session_store_bounds_its_connections(redis: RedisServer) -> None:
    """Hundreds of sessions saved at once through a store of four connections: every
    save lands, and the store never holds more than four connections."""
    import redis.asyncio as aioredis

    store = RedisStore(redis.url, concurrency=4)
    observer = aioredis.Redis.from_url(redis.url)
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            clients: Any = await observer.client_list()
            most = max(most, len(clients) - 1)  # less the observer's own
            await anyio.sleep(0.005)

    async with store, anyio.create_task_group() as tasks:
        tasks.start_soon(watch)
        async with anyio.create_task_group() as saves:
            for i in range(300):
                saves.start_soon(store.save, f"s{i}", [{"text": "x" * 2000, "i": i}])
        tasks.cancel_scope.cancel()
    async with store:
        loaded = [await store.load(f"s{i}") for i in range(0, 300, 37)]
    await observer.aclose()
    assert [entries[0]["i"] for entries in loaded if entries] == list(range(0, 300, 37))
    assert 1 <= most <= 4
    with pytest.raises(ValueError, match="concurrency"):
        RedisStore(redis.url, concurrency=0)


async def test_a_worker_answers_every_input_it_fetched_past_the_sessions_queue(
    bus_server: Any,
) -> None:
    """More inputs for one session than ``max_pending_inputs`` reach a worker at once:
    on a Redis bus each is answered in turn (the inputs it fetched are its own to
    answer; the bus bounds what it holds), none refused with ``KERNEL:ERROR``."""
    from openstarry.agent import Agent, LoopLimits
    from openstarry.testing import ScriptedProvider

    inputs = [_input(f"question {i}", session="busy") for i in range(30)]
    answers: list[Event] = []
    errors: list[Event] = []
    async with EventBus.from_url(bus_server.url, consume=False) as producer:
        backend: Any = producer.backend
        assert all(await backend.asend_many(inputs))
    bus = EventBus.from_url(bus_server.url, group="g", consumer="w", claim_idle=1.0, max_held=100)
    bus.subscribe("OUTPUT:AGENT_MESSAGE", answers.append)
    bus.subscribe("KERNEL:ERROR", errors.append)
    provider = ScriptedProvider(["ok"], cycle=True)
    async with bus, Agent(provider, bus=bus, limits=LoopLimits(max_pending_inputs=2)):
        await _until(lambda: len(answers) == len(inputs) or bool(errors), timeout=30)
    assert not errors, errors[0].payload
    assert [a.parent_id for a in answers] == [e.id for e in inputs]
