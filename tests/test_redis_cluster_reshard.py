"""A Redis Cluster resharded live under the bus: slots moved between masters, and a master
added and given slots, while producers publish and workers answer.

The slots moved are those that hold the bus's partitions (each partition's keys share
its hash tag, one slot), moved a few keys at a time with a pause between batches, so
that flushes, reads, leases and the relay meet the slot half moved (``ASK``,
``TRYAGAIN``), then moved (``MOVED``). Every input is answered exactly once, and no
worker stops or restarts.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.redis_server import RedisClusterServer
from redis_support import NEEDS_REDIS_SERVER

pytest.importorskip("redis")
from openstarry.bus.redis import RedisStreams
from openstarry.bus.redis.keys import Layout, key_slot, partition_of
from test_redis_cluster import _Answering, _input

pytestmark = [pytest.mark.anyio, NEEDS_REDIS_SERVER]

PARTITIONS = 24
LAYOUT = Layout("openstarry", PARTITIONS, cluster=True)
#: The slot of each partition's keys.
SLOT_OF = {p: key_slot(LAYOUT.dead(p)) for p in range(PARTITIONS)}
#: The slot of the keys no partition owns (the consumers of a group, the partition count).
SHARED_SLOT = key_slot(LAYOUT.partitions_key())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterServer]:
    with RedisClusterServer(tmp_path / "cluster", masters=3, replicas=0) as server:
        yield server


async def _answered_under(
    rig: RedisClusterServer, reshard: Callable[[], None]
) -> tuple[list[str], Counter[str], Counter[str], list[Any]]:
    """Two workers answer what a producer publishes (about 1,000 inputs a second) while
    ``reshard`` runs in a thread, from 1 s in; the producer goes on 1 s after it ends.
    Returns what was accepted, how often each input was handled and answered, and the
    workers' backends (for their counters)."""
    accepted: list[str] = []
    resharded = threading.Event()
    failed: list[BaseException] = []

    def run_reshard() -> None:
        time.sleep(1.0)
        try:
            reshard()
        except BaseException as exc:  # the test says what failed, after the bus stopped
            failed.append(exc)
        finally:
            resharded.set()

    async with (
        EventBus.from_url(rig.url, group="g", consumer="w1", claim_idle=3) as w1,
        EventBus.from_url(rig.url, group="g", consumer="w2", claim_idle=3) as w2,
        EventBus.from_url(rig.url, consume=False) as producer,
    ):
        one, two = _Answering(w1), _Answering(w2)
        one.subscribe()
        two.subscribe()
        backend = producer.backend
        assert isinstance(backend, RedisStreams)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(anyio.to_thread.run_sync, run_reshard)
            i = 0
            ended: float | None = None
            while ended is None or time.monotonic() - ended < 1.0:
                batch = [_input(j, sessions=240) for j in range(i, i + 20)]
                i += 20
                for event, ok in zip(batch, await backend.asend_many(batch), strict=True):
                    if ok:
                        accepted.append(event.id)
                await anyio.sleep(0.02)
                if ended is None and resharded.is_set():
                    ended = time.monotonic()
        assert not failed, failed
        with anyio.fail_after(60):
            while not set(accepted) <= set(one.answers + two.answers):
                await anyio.sleep(0.05)
        await anyio.sleep(1.0)  # nothing more arrives
        handled = one.handled + two.handled
        answers = one.answers + two.answers
        owned = [*w1.metrics()["backend"]["partitions"], *w2.metrics()["backend"]["partitions"]]
        assert sorted(owned) == list(range(PARTITIONS))  # both still run, sharing them all
    return accepted, handled, answers, [w1.backend, w2.backend]


def _redirections(rig: RedisClusterServer) -> Counter[str]:
    """What the masters answered the bus with while slots moved (``INFO errorstats``):
    ``MOVED``, ``ASK``, ``TRYAGAIN``; and ``ASKING``: the ``ASK`` s followed."""
    import redis

    seen: Counter[str] = Counter()
    for node in rig.masters():
        client = redis.Redis(port=node.port)
        try:
            errors = client.info("errorstats")
            commands = client.info("commandstats")
        finally:
            client.close()
        for kind in ("MOVED", "ASK", "TRYAGAIN"):
            seen[kind] += int(errors.get(f"errorstat_{kind}", {}).get("count", 0))
        seen["ASKING"] += int(commands.get("cmdstat_asking", {}).get("calls", 0))
    return seen


async def test_slots_moved_under_load_answer_each_input_once(
    cluster: RedisClusterServer,
) -> None:
    first, second, third = cluster.masters()
    on_first = [p for p in range(PARTITIONS) if first.serves(SLOT_OF[p])]
    assert len(on_first) == 8

    def reshard() -> None:
        # The first master's partitions to the second, a few keys at a time; then half
        # of them on to the third (a slot moved twice), and the keys no partition owns.
        cluster.move_slots([SLOT_OF[p] for p in on_first], second, batch=2, pause=0.05)
        cluster.move_slots([SLOT_OF[p] for p in on_first[::2]], third, batch=2, pause=0.05)
        cluster.move_slots([SHARED_SLOT], third, batch=1, pause=0.05)

    accepted, handled, answers, _ = await _answered_under(cluster, reshard)
    assert len(accepted) > 1000
    assert set(handled) == set(accepted)
    assert set(handled.values()) == {1}
    assert set(answers.values()) == {1}
    for p in on_first:  # where the partitions live now
        assert cluster.master_for_slot(SLOT_OF[p]).port == (
            third.port if p in on_first[::2] else second.port
        )
    now = next(m for m in cluster.nodes if m.port == first.port)
    assert not any(now.serves(SLOT_OF[p]) for p in range(PARTITIONS))
    met = _redirections(cluster)
    print("redirections met:", dict(met))
    assert met["MOVED"]
    assert met["ASK"]
    assert met["TRYAGAIN"]
    assert met["ASKING"]  # ASK followed


async def test_a_master_added_and_rebalanced_under_load_answers_each_input_once(
    cluster: RedisClusterServer,
) -> None:
    added: list[int] = []

    def reshard() -> None:
        added.append(cluster.add_master(rebalance=True).port)

    accepted, handled, answers, _ = await _answered_under(cluster, reshard)
    assert len(accepted) > 1000
    assert set(handled) == set(accepted)
    assert set(handled.values()) == {1}
    assert set(answers.values()) == {1}
    masters = cluster.masters()
    assert len(masters) == 4
    on_new = [p for p in range(PARTITIONS) if cluster.master_for_slot(SLOT_OF[p]).port in added]
    assert on_new  # the new master holds some of the bus's partitions
    print(
        "partitions on the new master:", on_new, "redirections met:", dict(_redirections(cluster))
    )
    assert _redirections(cluster)["MOVED"]


def _on(port: int, *command: Any, asking: bool = False) -> Any:
    """One command to one node (after ``ASKING``: a slot it is importing)."""
    import redis

    client: Any = redis.Redis(port=port, decode_responses=True)
    try:
        if not asking:
            return client.execute_command(*command)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.execute_command(*command)
        return pipe.execute()[1]
    finally:
        client.close()


async def test_flushes_of_a_half_moved_partition_wait_and_land_whole(
    cluster: RedisClusterServer,
) -> None:
    """A partition's slot half moved: its streams on the new master, the rest (its lease,
    its duplicate window, its dead-letter stream, the script's one declared key) still on
    the old. A commit (an input's answer with its acknowledgement) and a publish are
    refused whole (nothing written on either node) and sent again until the slot has
    moved; then each lands once, whole, on the new master, and the bus never stopped."""
    session = "s1"
    p = partition_of(session, PARTITIONS)
    slot = SLOT_OF[p]
    source = cluster.master_for_slot(slot)
    target = next(m for m in cluster.masters() if m.port != source.port)
    held: list[Event] = []
    answers: list[str] = []

    def lengths(port: int, asking: bool = False) -> tuple[int, int]:
        """The partition's entries, and those its group holds pending."""
        total = pending = 0
        for key in LAYOUT.streams(p):
            total += _on(port, "XLEN", key, asking=asking)
            pending += _on(port, "XPENDING", key, "g", asking=asking)["pending"]
        return total, pending

    async with (
        EventBus.from_url(cluster.url, group="g", consumer="w") as worker,
        EventBus.from_url(cluster.url, consume=False) as producer,
    ):

        def on_input(event: Event) -> None:
            assert worker.hold(event)  # answered by the test, when it says
            held.append(event)

        worker.subscribe("INPUT:*", on_input)
        worker.subscribe("OUTPUT:*", lambda e: answers.append(e.parent_id or ""))
        backend = producer.backend
        assert isinstance(backend, RedisStreams)
        first = Event.new("INPUT:USER_MESSAGE", {"i": 1}, source="t", session_id=session)
        assert await backend.asend(first)
        with anyio.fail_after(20):
            while not held:
                await anyio.sleep(0.02)
        _on(source.port, "XADD", LAYOUT.dead(p), "*", "e", "an earlier dead letter")
        _on(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        _on(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        keys = _on(source.port, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
        streams = [key for key in keys if key in LAYOUT.streams(p)]
        assert len(streams) == 6
        _on(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *streams)
        assert lengths(target.port, asking=True) == (1, 1)
        # The held input's commit (its answer, in its session's partition) and a publish.
        with worker.effects_of(held[0]):
            worker.publish(held[0].child("OUTPUT:AGENT_MESSAGE", {"text": "ok"}, source="w"))
        worker.release(held[0])
        second = Event.new("INPUT:USER_MESSAGE", {"i": 2}, source="t", session_id=session)
        accepted: list[bool] = []
        async with anyio.create_task_group() as tasks:

            async def publish() -> None:
                accepted.append(await backend.asend(second))

            tasks.start_soon(publish)
            await anyio.sleep(1.5)
            assert not answers  # refused whole, waiting: nothing written on either node
            assert not accepted
            assert lengths(target.port, asking=True) == (1, 1)
            left = set(_on(source.port, "CLUSTER", "GETKEYSINSLOT", slot, 1000))
            assert not left & set(LAYOUT.streams(p))
            # The rest of the slot's keys, then the slot's new owner on every master.
            await anyio.to_thread.run_sync(lambda: cluster.move_slots([slot], target))
        assert accepted == [True]
        with anyio.fail_after(20):
            while len(held) < 2 or not answers:
                await anyio.sleep(0.02)
        worker.release(held[1])
        await anyio.sleep(0.5)
        assert answers == [first.id]
        assert [e.id for e in held] == [first.id, second.id]
        assert worker.metrics()["backend"]["fenced"] == 0
    assert cluster.master_for_slot(slot).port == target.port
    assert lengths(target.port) == (3, 0)  # two inputs and an answer, each once; all handled
