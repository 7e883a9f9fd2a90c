"""``openstarry tail`` and ``bus info`` on a Redis Cluster (and ``bus info`` on one server).

A real cluster of three masters (no replicas: quicker to start) on loopback
ports, started once for the module; each test writes its entries straight
into the streams of its own bus (``--name``), as the bus would have left them
(``Layout(..., cluster=True)``: a hash tag per partition, 8 partitions per
master of the 24), and runs the real command line.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openstarry.core import Event, decode_event, encode_event
from openstarry.redis_server import RedisClusterServer, RedisServer
from redis_support import NEEDS_REDIS_SERVER

redis = pytest.importorskip("redis")
from redis.cluster import RedisCluster  # noqa: E402

from openstarry.bus.redis.keys import Layout, partition_of  # noqa: E402

pytestmark = NEEDS_REDIS_SERVER

OPENSTARRY = [sys.executable, "-m", "openstarry.cli"]
PARTITIONS = 24


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    with RedisClusterServer(tmp_path_factory.mktemp("cluster"), masters=3, replicas=0) as started:
        yield started


@pytest.fixture(scope="module")
def client(rig: RedisClusterServer) -> Iterator[Any]:
    started = RedisCluster(host="127.0.0.1", port=rig.masters()[0].port)
    yield started
    started.close()


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*OPENSTARRY, *args], capture_output=True, timeout=timeout)


def _fill(client: Any, name: str, n: int, *, start: int = 0) -> list[tuple[str, Event]]:
    """``n`` events of 100 sessions, written into their partitions' streams: (stream, event)."""
    layout = Layout(name, PARTITIONS, cluster=True)
    written = []
    pipe = client.pipeline()
    for i in range(start, start + n):
        session = f"s{i % 100}"
        event = Event.new(
            "INPUT:USER_MESSAGE",
            {"text": str(i)},
            source="test",
            session_id=session,
            priority=i % 6,
        )
        stream = layout.stream(partition_of(session, PARTITIONS), i % 6)
        pipe.xadd(stream, {"e": encode_event(event)})
        written.append((stream, event))
    pipe.execute()
    return written


def _stats(rig: RedisClusterServer, command: str) -> dict[int, int]:
    """Calls of ``command`` (a ``commandstats`` name) on each master, by port."""
    calls = {}
    for master in rig.masters():
        node = redis.Redis(host="127.0.0.1", port=master.port)
        calls[master.port] = int(
            node.info("commandstats").get(f"cmdstat_{command}", {"calls": 0})["calls"]
        )
        node.close()
    return calls


def _entry(entry_id: bytes) -> tuple[int, int]:
    ms, seq = entry_id.split(b"-")
    return int(ms), int(seq)


def test_tail_prints_a_cluster_s_history_once_in_entry_order(
    rig: RedisClusterServer, client: Any
) -> None:
    written = _fill(client, "hist", 600)
    streams = {stream for stream, _ in written}
    assert len({key.split(":s:")[1].split(":")[0] for key in streams}) == PARTITIONS
    # Each event's stream and entry id, as Redis stored them.
    where: dict[str, tuple[str, tuple[int, int]]] = {}
    for stream in streams:
        for entry_id, fields in client.xrange(stream):
            where[decode_event(fields[b"e"]).id] = (stream, _entry(entry_id))
    xrange_before = _stats(rig, "xrange")

    done = _run(["tail", "--bus", rig.url, "--name", "hist", "--count", "600", "--timeout", "5"])

    assert done.returncode == 0, done.stderr
    printed = [decode_event(line).id for line in done.stdout.splitlines()]
    assert sorted(printed) == sorted(event.id for _, event in written)  # each exactly once
    ids = [where[event_id][1] for event_id in printed]
    assert ids == sorted(ids)  # merged by entry id, so in entry order within each stream too
    # The first pages: one XRANGE per stream (each holds under a page), 48 on each master.
    xrange_after = _stats(rig, "xrange")
    assert {port: xrange_after[port] - xrange_before[port] for port in xrange_after} == {
        port: 48 for port in xrange_after
    }


def test_tail_from_the_end_on_a_cluster_prints_only_new_entries(
    rig: RedisClusterServer, client: Any
) -> None:
    _fill(client, "follow", 50)
    xread_before = sum(_stats(rig, "xread").values())
    getkeys_before = _stats(rig, "command|getkeys")
    tail = subprocess.Popen(
        [*OPENSTARRY, "tail", "--bus", rig.url, "--name", "follow", "--from-end", "--count", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while sum(_stats(rig, "xread").values()) == xread_before:  # following now
            assert tail.poll() is None, tail.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        new = _fill(client, "follow", 30, start=1000)
        out, err = tail.communicate(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert tail.returncode == 0, err
    printed = [decode_event(line).id for line in out.splitlines()]
    assert sorted(printed) == sorted(event.id for _, event in new)
    by_stream: dict[str, list[str]] = {}
    for stream, event in new:
        by_stream.setdefault(stream, []).append(event.id)
    for ids in by_stream.values():  # written in order: printed in that order
        assert [i for i in printed if i in ids] == ids
    # Every XREAD named its node: the client never asked where its keys were.
    assert _stats(rig, "command|getkeys") == getkeys_before


def test_bus_info_on_a_cluster(rig: RedisClusterServer, client: Any) -> None:
    layout = Layout("info", PARTITIONS, cluster=True)
    written = _fill(client, "info", 240)
    lengths = {stream: 0 for p in range(PARTITIONS) for stream in layout.streams(p)}
    for stream, _ in written:
        lengths[stream] += 1
    client.set(layout.lease("openstarry", 3), "worker-1")
    client.xgroup_create(layout.stream(3, 0), "openstarry", id="0", mkstream=True)
    client.xreadgroup("openstarry", "worker-1", {layout.stream(3, 0): ">"}, count=2)
    client.xadd(layout.dead(5), {"e": b"x", "reason": b"poison"})
    client.zadd(layout.consumers("openstarry"), {"worker-1": int(time.time() * 1000)})

    done = _run(["bus", "info", "--bus", rig.url, "--name", "info", "--json"])

    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["cluster"] is True
    assert len(info["partitions"]) == PARTITIONS
    assert len(info["nodes"]) == 3
    assert [len(node["partitions"]) for node in info["nodes"]] == [8, 8, 8]
    for part in info["partitions"]:
        p = part["partition"]
        assert part["tag"] == layout.tags[p]
        assert part["node"] == f"127.0.0.1:{rig.master_for_key(layout.tags[p]).port}"
        assert part["streams"] == [lengths[stream] for stream in layout.streams(p)]
        assert part["entries"] == sum(part["streams"])
        assert part["owner"] == ("worker-1" if p == 3 else None)
        assert part["pending"] == (min(2, lengths[layout.stream(3, 0)]) if p == 3 else 0)
        assert part["dead"] == (1 if p == 5 else 0)
    assert sum(node["entries"] for node in info["nodes"]) == 240
    assert sum(node["share"] for node in info["nodes"]) == pytest.approx(1.0)
    assert [c["consumer"] for c in info["consumers"]] == ["worker-1"]

    human = _run(["bus", "info", "--bus", rig.url, "--name", "info"])
    assert human.returncode == 0, human.stderr
    text = human.stdout.decode()
    assert "24 partitions on 3 node(s)" in text
    assert "worker-1" in text
    for node in info["nodes"]:
        assert node["node"] in text


def test_bus_info_on_one_server(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, aof=False)
    server.start()
    try:
        layout = Layout("openstarry", 8)
        single = redis.Redis.from_url(server.url)
        single.xadd(layout.stream(2, 0), {"e": b"x"})
        single.xadd(layout.stream(2, 4), {"e": b"y"})
        single.set(layout.lease("openstarry", 2), "w")
        single.close()
        done = _run(["bus", "info", "--bus", server.url, "--json"])
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["cluster"] is False
    assert [node["node"] for node in info["nodes"]] == [f"127.0.0.1:{server.port}"]
    assert info["nodes"][0]["partitions"] == list(range(8))
    part = info["partitions"][2]
    assert part["streams"] == [1, 0, 0, 0, 1, 0]
    assert (part["owner"], part["tag"], part["pending"], part["dead"]) == (
        "w",
        "{openstarry}",
        0,
        0,
    )
    assert sum(p["entries"] for p in info["partitions"]) == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("command", [["tail"], ["bus", "info"]])
@pytest.mark.parametrize("scheme", ["redis+cluster://127.0.0.1:{}", "redis://127.0.0.1:{}/0"])
def test_no_server_is_one_line_and_exit_1(command: list[str], scheme: str) -> None:
    url = scheme.format(_closed_port())
    done = _run([*command, "--bus", url])
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"openstarry {command[0]}: cannot reach Redis at {url} (--bus): ")
    assert done.stdout == b""


def test_a_cluster_url_without_a_port_is_refused_in_one_line() -> None:
    done = _run(["tail", "--bus", "redis+cluster://127.0.0.1"])
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert lines[-1] == (
        "openstarry tail: error: argument --bus: Redis Cluster URL: expected host:port, "
        "not '127.0.0.1': 'redis+cluster://127.0.0.1'"
    )
    assert "Traceback" not in done.stderr.decode()


def test_connect_gives_a_cluster_client_for_a_cluster_url() -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    from openstarry.bus.redis.reader import connect

    client = connect(
        "redis+cluster://u:s%40cret@10.0.0.1:7000,10.0.0.2:7001?require_full_coverage=no"
    )
    assert isinstance(client, AsyncRedisCluster)
    assert sorted(client.nodes_manager.startup_nodes) == ["10.0.0.1:7000", "10.0.0.2:7001"]
    assert client.nodes_manager.require_full_coverage is False
    options = client.nodes_manager.connection_kwargs
    assert (options["username"], options["password"]) == ("u", "s@cret")
    assert (options["socket_timeout"], options["decode_responses"]) == (5.0, False)
    with pytest.raises(ValueError, match="unknown option"):
        connect("redis+cluster://10.0.0.1:7000?no_such_option=1")
    assert not isinstance(connect("redis://10.0.0.1:7000/0"), AsyncRedisCluster)
