"""The Redis Cluster rig of openstarry.redis_server: real redis-server processes, nothing faked.

A 6-node cluster (3 masters, 3 replicas) starts in about 2.3 s here; a killed
master's replica takes over about 2.2 s after its death with the default
``cluster-node-timeout`` of 1000 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from openstarry.redis_server import (
    SLOTS,
    RedisClusterServer,
    key_slot,
    parse_cluster_nodes,
)
from redis_support import NEEDS_REDIS_SERVER

redis = pytest.importorskip("redis")
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster  # noqa: E402
from redis.cluster import RedisCluster  # noqa: E402

pytestmark = NEEDS_REDIS_SERVER

KEY = "{openstarry:3}:stream"


def alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    with RedisClusterServer(tmp_path_factory.mktemp("cluster")) as server:
        yield server


def test_every_slot_is_served_once_and_each_master_has_its_replica(
    cluster: RedisClusterServer,
) -> None:
    masters = cluster.masters()
    assert len(masters) == 3
    covered = sorted(r for m in masters for r in m.slots)
    assert covered[0][0] == 0
    assert covered[-1][1] == SLOTS - 1
    assert sum(last - first + 1 for first, last in covered) == SLOTS
    for master in masters:
        replicas = cluster.replicas_of(master)
        assert len(replicas) == 1
        assert replicas[0].role == "replica"
    assert len(cluster.nodes) == 6
    assert cluster.url.startswith("redis+cluster://")
    seeds = cluster.url.removeprefix("redis+cluster://").split(",")
    assert set(seeds) == {m.address for m in masters}
    assert cluster.master_for_key(KEY).serves(key_slot(KEY))
    assert key_slot("{openstarry:3}:a") == key_slot("{openstarry:3}:b")


def test_a_key_set_on_its_node_reads_through_the_cluster_clients(
    cluster: RedisClusterServer,
) -> None:
    node = cluster.master_for_key(KEY)
    direct = redis.Redis(port=node.port)
    try:
        direct.set(KEY, b"on its node")
    finally:
        direct.close()
    client = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        assert client.get(KEY) == b"on its node"
        assert client.keyslot(KEY) == key_slot(KEY)  # type: ignore[no-untyped-call]
    finally:
        client.close()

    async def read() -> bytes:
        aclient = AsyncRedisCluster(host="127.0.0.1", port=cluster.ports[-1])
        try:
            value = await aclient.get(KEY)
            assert isinstance(value, bytes)
            return value
        finally:
            await aclient.aclose()

    assert asyncio.run(read()) == b"on its node"


def test_a_killed_master_is_replaced_by_its_replica_and_stop_leaves_nothing(
    tmp_path: Path,
) -> None:
    server = RedisClusterServer(tmp_path)
    server.start()
    try:
        pids = server.pids
        assert len(pids) == 6
        master = server.master_for_key(KEY)
        (heir,) = server.replicas_of(master)
        killed = server.kill_master(master.port)
        assert not alive(pids[master.port])
        port, promoted = server.wait_failover(master.port, timeout=20)
        assert port == heir.port
        assert 0 < promoted - killed < 20
        assert server.master_for_key(KEY).port == heir.port
        client = RedisCluster(host="127.0.0.1", port=heir.port)
        try:
            client.set(KEY, b"after the failover")
            assert client.get(KEY) == b"after the failover"
        finally:
            client.close()
        server.restart_node(master.port)
        (back,) = [n for n in server.nodes if n.port == master.port]
        assert back.role == "replica"
        assert back.master_id == server.master_for_key(KEY).node_id
        pids = server.pids
        assert len(pids) == 6
    finally:
        server.stop()
    assert server.pids == {}
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(alive(pid) for pid in pids.values())


def test_a_start_that_fails_midway_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openstarry.redis_server as rig

    server = RedisClusterServer(tmp_path, timeout=5)
    started: list[int] = []

    def failing_create(server: RedisClusterServer) -> None:
        started.extend(server.pids.values())
        raise RuntimeError("redis-cli failed")

    monkeypatch.setattr(rig, "_create", failing_create)
    with pytest.raises(RuntimeError, match="redis-cli failed"):
        server.start()
    assert len(started) == 6
    assert server.pids == {}
    assert not any(alive(pid) for pid in started)


def test_cluster_nodes_lines_are_parsed() -> None:
    text = (
        "aa 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-bb]\n"
        "bb 127.0.0.1:7002@17002 slave aa 0 0 1 connected\n"
        "cc 127.0.0.1:7003@17003 master,fail - 0 0 2 disconnected\n"
    )
    a, b, c = parse_cluster_nodes(text)
    assert a.role == "master"
    assert a.slots == ((0, 5460), (7000, 7000))
    assert a.serves(7000)
    assert not a.serves(5461)
    assert (b.role, b.master_id, b.slots) == ("replica", "aa", ())
    assert "fail" in c.flags
    assert not c.connected
