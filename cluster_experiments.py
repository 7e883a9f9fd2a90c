"""The experiments behind CLUSTER_NOTES.md, against a real cluster of RedisClusterServer.

    PYTHONPATH=python python cluster_experiments.py [a b c d e]

Each section prints what it saw; CLUSTER_NOTES.md quotes the output.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.asyncio.cluster import ClusterNode as AsyncNode
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from openstarry.redis_server import RedisClusterServer, key_slot

SCRIPT = """
redis.call('XADD', KEYS[1], '*', 'v', ARGV[1])
return redis.call('XLEN', KEYS[1])
"""


def client(rig: RedisClusterServer, **kw: Any) -> RedisCluster:
    return RedisCluster(host="127.0.0.1", port=rig.ports[0], **kw)


async def ready(rig: RedisClusterServer, **kw: Any) -> RedisCluster:
    c = client(rig, **kw)
    await c.initialize()  # the slot map: get_node_from_key needs it
    return c


def port_of(node: AsyncNode) -> int:
    return int(node.port)


# -- a. scripts ---------------------------------------------------------------------------------


async def a(rig: RedisClusterServer) -> None:
    c = client(rig)
    keys = [f"{{openstarry:{p}}}:in" for p in range(8)]
    print("slots:", {k: key_slot(k) for k in keys})
    # SCRIPT LOAD goes to every primary (command flag PRIMARIES); the answer is one sha.
    sha = await c.script_load(SCRIPT)
    for m in rig.masters():
        r = redis.Redis(port=m.port)
        print("script exists on", m.port, r.script_exists(sha))
        r.close()
    # EVALSHA routes by its keys: redis-py's _determine_slot reads numkeys and the keys.
    for k in keys[:3]:
        n = await c.evalsha(sha, 1, k, "x")
        print("evalsha", k, "->", n, "on master", rig.master_for_key(k).port)
    # Keys of two slots in one EVALSHA: refused by the client before sending.
    try:
        await c.evalsha(sha, 2, keys[0], keys[1], "x")
    except Exception as e:
        print("evalsha over two slots:", type(e).__name__, e)
    # Keys of one hash tag, several keys: fine.
    print(
        "evalsha two keys one tag:",
        await c.evalsha(sha, 2, "{openstarry:3}:in", "{openstarry:3}:out", "y"),
    )
    # NOSCRIPT: flush the scripts on the node of {openstarry:3} only.
    node = rig.master_for_key("{openstarry:3}:in")
    r = redis.Redis(port=node.port)
    r.script_flush()
    try:
        await c.evalsha(sha, 1, "{openstarry:3}:in", "z")
    except Exception as e:
        print("evalsha after SCRIPT FLUSH on its node:", type(e).__name__, e)
    # A Script object: evalsha, and on NoScriptError script_load (to every primary) + again.
    script = c.register_script(SCRIPT)
    print("Script object after flush:", await script(keys=["{openstarry:3}:in"], args=["w"]))
    print("script exists again on", node.port, r.script_exists(sha))
    r.close()
    # Functions (Redis 7): FUNCTION LOAD to every primary, FCALL routed by its keys.
    lib = (
        "#!lua name=openstarry\n"
        "redis.register_function('os_len', function(keys, args)"
        " return redis.call('XLEN', keys[1]) end)"
    )
    await c.function_load(lib, replace=True)
    for m in rig.masters():
        r = redis.Redis(port=m.port)
        print("function on", m.port, bool(r.function_list("openstarry")))
        r.close()
    print("fcall:", await c.fcall("os_len", 1, "{openstarry:3}:in"))
    # Running on a chosen node: target_nodes skips key routing (and retries).
    chosen = c.get_node_from_key("{openstarry:3}:in")
    print(
        "evalsha target_nodes:",
        await c.execute_command("EVALSHA", sha, 1, "{openstarry:3}:in", "t", target_nodes=chosen),
    )
    await c.aclose()


# -- b. reads of many partitions ----------------------------------------------------------------


class Counting:
    """Counts writes to the socket per port: one per round trip of a pipeline."""

    def __init__(self) -> None:
        self.sends: collections.Counter[int] = collections.Counter()
        self.original = Connection.send_packed_command

    def __enter__(self) -> Counting:
        counter = self

        async def send(conn: Connection, command: Any, check_health: bool = True) -> None:
            counter.sends[conn.port] += 1
            await counter.original(conn, command, check_health)

        Connection.send_packed_command = send  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Connection.send_packed_command = self.original  # type: ignore[method-assign]


async def b(rig: RedisClusterServer) -> None:
    c = client(rig)
    streams = [f"{{openstarry:{p}}}:in" for p in range(8)]
    for s in streams:
        await c.delete(s)
        await c.xgroup_create(s, "g", id="0", mkstream=True)
        for i in range(20):
            await c.xadd(s, {"v": str(i)})
    by_node = collections.Counter(rig.master_for_key(s).port for s in streams)
    print("partitions per master:", dict(by_node))
    # Two streams of two slots in one XREADGROUP.
    try:
        await c.xreadgroup("g", "w", {streams[0]: ">", streams[1]: ">"}, count=1)
    except Exception as e:
        print("xreadgroup over two slots (client):", type(e).__name__, e)
    same = [s for s in streams if rig.master_for_key(s).port == rig.master_for_key(streams[0]).port]
    r = redis.Redis(port=rig.master_for_key(same[0]).port)
    try:
        r.xreadgroup("g", "w", {same[0]: ">", same[1]: ">"}, count=1)
    except Exception as e:
        print("xreadgroup over two slots of one node (server):", type(e).__name__, e)
    r.close()
    # A pipeline of 8 XREADGROUPs (one per partition, COUNT 5, no BLOCK).
    for _ in range(3):  # warm: connections made, slots known
        p = c.pipeline()
        for s in streams:
            p.xreadgroup("g", "warm", {s: "0"}, count=1)
        await p.execute()
    with Counting() as counting:
        p = c.pipeline()
        for s in streams:
            p.xreadgroup("g", "w", {s: ">"}, count=5)
        got = await p.execute()
    print("pipeline sends per port:", dict(counting.sends), "entries:", [len(x[0][1]) for x in got])
    # XREADGROUP has movable keys: redis-py asks the server (COMMAND GETKEYS, one round trip
    # to the default node, awaited one at a time) for each one's slot. target_nodes skips it.
    nodes = {s: c.get_node_from_key(s) for s in streams}
    with Counting() as counting:
        p = c.pipeline()
        for s in streams:
            p.execute_command(
                "XREADGROUP", "GROUP", "g", "w", "COUNT", 5, "STREAMS", s, "0", target_nodes=nodes[s]
            )
        got = await p.execute()
    print("pipeline with target_nodes, sends per port:", dict(counting.sends), got[0][0][0])
    started = time.perf_counter()
    for _ in range(500):
        p = c.pipeline()
        for s in streams:
            p.execute_command(
                "XREADGROUP", "GROUP", "g", "w", "COUNT", 5, "STREAMS", s, ">", target_nodes=nodes[s]
            )
        await p.execute()
    print(f"pipeline of 8 with target_nodes: {(time.perf_counter() - started) / 500 * 1e6:.0f} us")
    rounds = 500
    started = time.perf_counter()
    for _ in range(rounds):
        p = c.pipeline()
        for s in streams:
            p.xreadgroup("g", "w", {s: ">"}, count=5)
        await p.execute()
    pipe_us = (time.perf_counter() - started) / rounds * 1e6
    started = time.perf_counter()
    for _ in range(rounds):
        for s in streams:
            await c.xreadgroup("g", "w", {s: ">"}, count=5)
    seq_us = (time.perf_counter() - started) / rounds * 1e6
    started = time.perf_counter()
    for _ in range(rounds):
        await asyncio.gather(*(c.xreadgroup("g", "w", {s: ">"}, count=5) for s in streams))
    gather_us = (time.perf_counter() - started) / rounds * 1e6
    print(
        f"8 XREADGROUP (empty answers): pipeline {pipe_us:.0f} us, "
        f"8 awaited one by one {seq_us:.0f} us, gather {gather_us:.0f} us"
    )
    # BLOCK inside a pipeline: it holds that node's connection for the batch.
    p = c.pipeline()
    p.xreadgroup("g", "w", {streams[0]: ">"}, count=5, block=500)
    p.xlen(streams[0])
    started = time.perf_counter()
    print("pipeline [XREADGROUP BLOCK 500 on empty, XLEN]:", await p.execute(), end=" ")
    print(f"took {(time.perf_counter() - started) * 1000:.0f} ms")
    # One blocking XREADGROUP per partition, all at once: a connection each (pool: 100/node).
    started = time.perf_counter()

    async def late() -> None:
        await asyncio.sleep(0.2)
        await c.xadd(streams[5], {"v": "late"})

    reads = [c.xreadgroup("g", "w", {s: ">"}, count=5, block=1000) for s in streams]
    got, _ = await asyncio.gather(asyncio.gather(*reads), late())
    print(
        "8 blocking XREADGROUPs at once:",
        [len(x[0][1]) if x else 0 for x in got],
        f"{(time.perf_counter() - started) * 1000:.0f} ms",
    )
    for n in c.get_primaries():
        print("connections to", n.port, len(n._connections))
    await c.aclose()


# -- c. failover ----------------------------------------------------------------------------------


async def c_(rig: RedisClusterServer, label: str, **kw: Any) -> None:
    cl = client(rig, **kw)
    key = "{openstarry:3}:in"
    await cl.set(key, "0")
    node = rig.master_for_key(key)
    errors: list[tuple[float, str]] = []
    killed = rig.kill_master(node.port)
    ok_at = None
    loop_deadline = time.monotonic() + 20
    while time.monotonic() < loop_deadline:
        t0 = time.monotonic()
        try:
            await cl.set(key, "1")
            ok_at = time.monotonic()
            break
        except Exception as e:
            errors.append((round(t0 - killed, 2), f"{type(e).__name__}: {str(e)[:60]}"))
            await asyncio.sleep(0.05)
    kinds = collections.Counter(e for _, e in errors)
    print(f"[{label}] first good SET {ok_at - killed if ok_at else None:.2f} s after the kill")
    for kind, n in kinds.items():
        first = next(t for t, e in errors if e == kind)
        print(f"   {n} x {kind} (first at +{first} s)")
    # Another slot, on a master that stays up, during the window:
    port, when = rig.wait_failover(node.port)
    print(f"   rig: failover seen {when - killed:.2f} s after the kill (new master {port})")
    print("   client's node for the key now:", cl.get_node_from_key(key).port)
    await cl.aclose()
    rig.restart_node(node.port)


async def c_others(rig: RedisClusterServer) -> None:
    """What happens to keys of *other* masters while one is dead."""
    cl = client(rig, retry=Retry(NoBackoff(), 0))
    key = "{openstarry:3}:in"
    node = rig.master_for_key(key)
    other = next(f"{{openstarry:{p}}}:in" for p in range(16) if rig.master_for_key(f"{{openstarry:{p}}}:in").port != node.port)
    await cl.set(other, "0")
    killed = rig.kill_master(node.port)
    timeline: list[tuple[float, str]] = []
    while time.monotonic() - killed < 6:
        try:
            await cl.set(other, "1")
            r = "ok"
        except Exception as e:
            r = type(e).__name__
        if not timeline or timeline[-1][1] != r:
            timeline.append((round(time.monotonic() - killed, 2), r))
        await asyncio.sleep(0.02)
    print("[other slot, no retry] SET on a live master's key:", timeline)
    rig.wait_failover(node.port)
    await cl.aclose()
    rig.restart_node(node.port)


async def c(rig: RedisClusterServer) -> None:
    await c_(rig, "defaults (retry: 3 x exp backoff)")
    await c_(rig, "no retry", retry=Retry(NoBackoff(), 0))
    await c_(
        rig,
        "retry 20 x exp backoff 10..500 ms",
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.01), 20),
    )
    await c_others(rig)


# -- d. WAIT -------------------------------------------------------------------------------------


async def d(rig: RedisClusterServer) -> None:
    cl = await ready(rig)
    key = "{openstarry:3}:in"
    node = cl.get_node_from_key(key)
    print("key's master:", node.port, "default node:", cl.get_default_node().port)
    await cl.xadd(key, {"v": "1"})
    print("WAIT on the key's node:", await cl.execute_command("WAIT", 1, 100, target_nodes=node))
    print("cl.wait(1, 100) (no target):", await cl.wait(1, 100))
    with Counting() as counting:
        p = cl.pipeline()
        p.xadd(key, {"v": "2"})
        p.execute_command("WAIT", 1, 100)
        try:
            print("pipeline [XADD, WAIT]:", await p.execute(), dict(counting.sends))
        except Exception as e:
            print("pipeline [XADD, WAIT]:", type(e).__name__, e)
    with Counting() as counting:
        p = cl.pipeline()
        p.xadd(key, {"v": "2"})
        p.execute_command("WAIT", 1, 100, target_nodes=node)
        print("pipeline [XADD, WAIT target_nodes]:", await p.execute(), dict(counting.sends))
    try:
        await cl.eval("return redis.call('WAIT', 1, 100)", 1, key)
    except Exception as e:
        print("WAIT in a script:", type(e).__name__, e)
    # The durable publish: the script, then WAIT, on one connection of that node.
    sha = await cl.script_load(SCRIPT)
    conn = node.acquire_connection()
    try:
        await conn.send_packed_command(
            conn.pack_commands([("EVALSHA", sha, 1, key, "x"), ("WAIT", 1, 100)])
        )
        print("one connection [EVALSHA, WAIT]:", [await conn.read_response() for _ in range(2)])
    finally:
        node.release(conn)
    # A replica down: WAIT returns how many acknowledged, after its timeout.
    (replica,) = rig.replicas_of(rig.master_for_key(key))
    rig.kill_node(replica.port)
    await cl.xadd(key, {"v": "3"})
    started = time.perf_counter()
    n = await cl.execute_command("WAIT", 1, 200, target_nodes=node)
    print(f"WAIT with the replica dead: {n} after {(time.perf_counter() - started) * 1000:.0f} ms")
    rig.restart_node(replica.port)
    await cl.aclose()


# -- e. pitfalls ----------------------------------------------------------------------------------


async def e(rig: RedisClusterServer) -> None:
    cl = await ready(rig, decode_responses=True)
    key = "{openstarry:3}:in"
    await cl.delete(key)
    await cl.xgroup_create(key, "g", id="0", mkstream=True)
    await cl.xadd(key, {"v": "1"})
    await cl.xreadgroup("g", "a", {key: ">"})
    print("xautoclaim:", await cl.xautoclaim(key, "g", "b", min_idle_time=0))
    print("xinfo groups:", await cl.xinfo_groups(key))
    print("xinfo consumers:", await cl.xinfo_consumers(key, "g"))
    print("client_id() (no target):", await cl.client_id())
    # CLIENT UNBLOCK: the blocked read's connection id, on that node.
    node = cl.get_node_from_key(key)
    conn = node.acquire_connection()
    await conn.send_command("CLIENT", "ID")
    cid = await conn.read_response()
    await conn.send_command("XREADGROUP", "GROUP", "g", "a", "BLOCK", 5000, "STREAMS", key, ">")
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    print("CLIENT UNBLOCK (no target):", await cl.client_unblock(cid))
    print(
        "CLIENT UNBLOCK on its node:",
        await cl.execute_command("CLIENT UNBLOCK", cid, target_nodes=node),
    )
    print("blocked read answered:", await conn.read_response(), end=" ")
    print(f"after {(time.perf_counter() - started) * 1000:.0f} ms")
    node.release(conn)
    keys = [k async for k in cl.scan_iter(match="{openstarry:*")]
    print("scan_iter over the cluster:", sorted(keys)[:4], len(keys))
    print("keys(): ", len(await cl.keys("*")))
    print("pubsub:", hasattr(cl, "pubsub"))
    await cl.aclose()


async def main(sections: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        with RedisClusterServer(Path(folder)) as rig:
            print(f"6-node cluster up in {time.monotonic() - started:.2f} s: {rig.timings}")
            for name in sections:
                print(f"== {name}")
                await {"a": a, "b": b, "c": c, "d": d, "e": e}[name](rig)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or ["a", "b", "d", "e", "c"]))


# Scripts and functions on a replica (CLUSTER_NOTES.md, a):
#     a = redis.Redis(port=master.port); b = redis.Redis(port=its_replica.port)
#     sha = a.script_load("return 1")
#     a.function_load("#!lua name=x\nredis.register_function('f', function() return 1 end)")
#     time.sleep(0.3)
#     b.script_exists(sha) -> [False]; bool(b.function_list("x")) -> True
