"""The bus over Redis Streams, against a real redis-server each test starts and stops.

Spec 002 across processes: priority across the cluster, idempotency across
producers, trace inheritance, per-session order; shared sessions; the
``worker``, ``publish`` and ``tail`` commands; and the faults a cluster must
survive with nothing lost and nothing handled twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry.agent import Agent
from openstarry.bus import EventBus
from openstarry.core import Event, decode_event, encode_event
from openstarry.redis_server import RedisServer
from openstarry.stores import RedisStore, SQLiteStore, open_store
from openstarry.testing import ScriptedProvider
from redis_support import NEEDS_REDIS_SERVER, running_redis

pytestmark = [
    pytest.mark.anyio,
    NEEDS_REDIS_SERVER,
]

#: Short enough that a dead worker's partitions move within a test.
FAST: dict[str, Any] = {"claim_idle": 1.0}
OPENSTARRY = [sys.executable, "-m", "openstarry.cli"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:  # with its append-only file, unlike conftest's
        yield server


def _input(text: str, session: str = "s1", priority: int | None = None) -> Event:
    return Event.new(
        "INPUT:USER_MESSAGE", {"text": text}, source="test", session_id=session, priority=priority
    )


async def _until(predicate: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


# -- spec 002 over Redis ---------------------------------------------------------------


async def test_publish_then_consume_with_priority_over_the_backlog(redis: RedisServer) -> None:
    """A priority-0 event published behind a backlog already in Redis is handled first."""
    async with EventBus.from_url(redis.url, consume=False) as producer:
        for i in range(200):
            producer.publish(_input(f"low {i}", session=f"s{i % 7}", priority=5))
        await producer.apublish(_input("urgent", session="s3", priority=0))
        await producer.wait_idle()
    seen: list[Event] = []
    async with EventBus.from_url(redis.url, group="g", consumer="c1", batch=16, **FAST) as bus:
        bus.subscribe("*", seen.append)
        await _until(lambda: len(seen) == 201)
    assert seen[0].payload["text"] == "urgent"
    # Per-session order: each session's events in publish order.
    for s in range(7):
        texts = [e.payload["text"] for e in seen[1:] if e.session_id == f"s{s}"]
        assert texts == [f"low {i}" for i in range(200) if i % 7 == s]
    assert bus.metrics()["backend"]["acked"] == 201


async def test_idempotency_across_producers_is_atomic_on_the_server(redis: RedisServer) -> None:
    event = _input("once")
    async with (
        EventBus.from_url(redis.url, consume=False) as a,
        EventBus.from_url(redis.url, consume=False) as b,
    ):
        first = await a.apublish(event)
        second = await b.apublish(event)
        b.publish(event)  # the sync path: refused on the server, counted
        await b.wait_idle()
        assert (bool(first), bool(second)) == (True, False)
        assert b.metrics()["duplicates"] == 2
        # The local window is the first filter: no round trip for a repeat.
        assert not a.publish(event)
    seen: list[Event] = []
    async with EventBus.from_url(redis.url, **FAST) as bus:
        bus.subscribe("*", seen.append)
        await _until(lambda: bus.metrics()["backend"]["acked"] == 1)
    assert [e.id for e in seen] == [event.id]


async def test_the_servers_duplicate_window_lasts_between_one_and_two_windows(
    redis: RedisServer,
) -> None:
    """An id is refused for at least ``dedup_window`` after its publish, and is
    new again once twice that has passed (ids live in one hash per window)."""
    event = _input("windowed")
    options: dict[str, Any] = {"consume": False, "dedup": False, "dedup_window": 0.3}
    async with EventBus.from_url(redis.url, **options) as bus:
        backend: Any = bus.backend
        assert await backend.asend_many([event, event]) == [True, False]  # one flush
        published = time.monotonic()
        refused = 0
        while time.monotonic() - published < 0.25:
            refused += not await bus.apublish(event)
        assert refused > 0
        assert backend.metrics()["sent"] == 1
        await anyio.sleep(max(0.0, published + 0.65 - time.monotonic()))
        assert await bus.apublish(event)  # accepted: the handle is truthy
        client: Any = backend._client
        windows = await client.keys("{openstarry}:ids:*")
    assert 1 <= len(windows) <= 2  # older windows are unlinked


async def test_a_second_commit_of_an_acknowledged_entry_publishes_nothing(
    redis: RedisServer,
) -> None:
    """Two consumers that both ran an entry (a lease lost to a stalled process):
    the commit whose XACK finds the entry acknowledged publishes no effect."""
    from openstarry.bus.redis.records import Delivery

    seen: list[Event] = []
    async with EventBus.from_url(redis.url, **FAST) as bus:

        def handle(event: Event) -> None:
            seen.append(event)
            bus.publish(event.child("OUTPUT:AGENT_MESSAGE", {"text": "first"}, source="t"))

        bus.subscribe("INPUT:*", handle)
        await bus.apublish(_input("twice"))
        backend: Any = bus.backend
        await _until(lambda: backend.metrics()["acked"] == 2)  # the input, its answer
        (entry,) = [e async for e, w in backend.history() if decode_event(w).id == seen[0].id]
        client: Any = backend._client
        (stream,) = [k for k in backend._partition_of_key if await client.xrange(k, entry, entry)]
        # Under the same lease: the XACK is what refuses it (a moved lease would too).
        late = Delivery(
            stream, entry.encode(), backend._leases.value[backend._partition_of_key[stream]]
        )
        answer = seen[0].child("OUTPUT:AGENT_MESSAGE", {"text": "second"}, source="t")
        late.effects = [backend._outbox.publish_op(answer)]
        backend._outbox.commit(late)
        await backend.flush()
        texts = [decode_event(w).payload.get("text") async for _, w in backend.history()]
        metrics = backend.metrics()
    assert texts.count("first") == 1
    assert "second" not in texts
    assert metrics["skipped_handled"] == 1


async def test_trace_survives_the_trip(redis: RedisServer) -> None:
    parent = _input("parent")
    child = parent.child(
        "EXEC:TOOL_CALL", {"toolCallId": "c", "name": "t", "callDepth": 3}, source="x"
    )
    async with EventBus.from_url(redis.url, consume=False) as producer:
        await producer.apublish(child)
    seen: list[Event] = []
    async with EventBus.from_url(redis.url, **FAST) as bus:
        bus.subscribe("*", seen.append)
        await _until(lambda: len(seen) == 1)
    (got,) = seen
    assert (got.trace_id, got.parent_id, got.session_id) == (
        parent.trace_id,
        parent.id,
        parent.session_id,
    )
    assert got.payload["callDepth"] == 3


async def test_sessions_spread_over_consumers_and_never_run_on_two(redis: RedisServer) -> None:
    owners: dict[str, set[str]] = {}
    counts = {"c1": 0, "c2": 0}

    def handler(name: str) -> Any:
        def handle(event: Event) -> None:
            owners.setdefault(event.session_id, set()).add(name)
            counts[name] += 1

        return handle

    async with (
        EventBus.from_url(redis.url, group="g", consumer="c1", **FAST) as one,
        EventBus.from_url(redis.url, group="g", consumer="c2", **FAST) as two,
    ):
        one.subscribe("*", handler("c1"))
        two.subscribe("*", handler("c2"))
        await _until(lambda: len(one.backend.metrics()["partitions"]) == 4)  # type: ignore[union-attr]
        await _until(lambda: len(two.backend.metrics()["partitions"]) == 4)  # type: ignore[union-attr]
        for i in range(400):
            one.publish(_input(str(i), session=f"s{i % 40}"))
        await _until(lambda: sum(counts.values()) == 400)
    assert all(len(names) == 1 for names in owners.values())
    assert counts["c1"] > 0
    assert counts["c2"] > 0


async def test_the_redis_bus_says_it_needs_asyncio_on_trio() -> None:
    """On trio the Redis backend refuses plainly (redis-py's client is asyncio's)."""
    bus = EventBus.from_url("redis://127.0.0.1:1/0")

    async def enter() -> None:
        async with bus:
            pass

    def on_trio() -> None:
        anyio.run(enter, backend="trio")

    with pytest.raises(BaseException) as info:  # noqa: PT011 - may come in the bus's task group
        await anyio.to_thread.run_sync(on_trio)
    assert "runs on asyncio only" in repr(info.value) + repr(getattr(info.value, "exceptions", ""))


async def test_effects_are_committed_with_the_acknowledgement(redis: RedisServer) -> None:
    """What handling an event publishes reaches Redis only with its acknowledgement,
    in one script; an attempt that failed publishes nothing."""
    gate = anyio.Event()
    held: list[Event] = []

    async def later(bus: EventBus, event: Event) -> None:
        with bus.effects_of(event):
            bus.publish(event.child("OUTPUT:AGENT_MESSAGE", {"text": "answer"}, source="t"))
            await gate.wait()
        bus.release(event)

    async with (
        EventBus.from_url(redis.url, **FAST) as bus,
        anyio.create_task_group() as tg,
    ):
        attempts: list[int] = []

        def handle(event: Event) -> None:
            if event.payload["text"] == "flaky" and len(attempts) < 1:
                attempts.append(1)
                bus.publish(event.child("OUTPUT:AGENT_MESSAGE", {"text": "lost"}, source="t"))
                raise RuntimeError("fails once")
            if event.payload["text"] == "slow" and bus.hold(event):
                held.append(event)
                tg.start_soon(later, bus, event)

        bus.subscribe("INPUT:*", handle)
        await bus.apublish(_input("slow"))
        await bus.apublish(_input("flaky", session="s2"))
        backend: Any = bus.backend
        await _until(lambda: len(held) == 1 and backend.metrics()["acked"] >= 2)
        history = [decode_event(w) async for _, w in backend.history()]
        assert [e.type for e in history].count("OUTPUT:AGENT_MESSAGE") == 0  # held back
        gate.set()
        await _until(lambda: backend.metrics()["acked"] >= 4)  # + the answer, delivered
        history = [decode_event(w) async for _, w in backend.history()]
    answers = [e for e in history if e.type == "OUTPUT:AGENT_MESSAGE"]
    assert [(e.payload["text"], e.parent_id) for e in answers] == [("answer", held[0].id)]


def test_from_url_local_and_errors() -> None:
    assert EventBus.from_url(None).backend is None
    assert EventBus.from_url("local:").backend is None
    with pytest.raises(ValueError, match=r"no backend for nats:// \(known: local:, redis://"):
        EventBus.from_url("nats://x")


# -- poison and bounds -----------------------------------------------------------------


async def test_one_read_of_many_streams_matches_each_event_to_its_entry(
    redis: RedisServer,
) -> None:
    """Entries written before the worker starts, over two partitions and three
    priorities, with an invalid envelope and one envelope written twice: every
    valid entry is handled in priority order and acknowledged, the invalid one
    goes to the dead-letter stream, and the envelope written twice runs once,
    its second entry acknowledged with the first (none left pending until the
    partition changes owner)."""
    import redis.asyncio as aioredis

    from openstarry.bus.redis import partition_of, stream_key

    events = [
        _input(f"{session}-{priority}", session=session, priority=priority)
        for priority in (4, 1, 3)
        for session in ("left", "right")
    ]
    twice = events[0]
    client = aioredis.Redis.from_url(redis.url)
    for p in range(8):
        for r in range(6):
            await client.xgroup_create(stream_key("openstarry", p, r), "g", id="0", mkstream=True)
    for event in [*events, twice]:
        key = stream_key("openstarry", partition_of(event.session_id, 8), event.priority)
        await client.xadd(key, {"e": encode_event(event)})
    bad = stream_key("openstarry", partition_of("left", 8), 1)
    await client.xadd(bad, {"e": b'{"not": "an envelope"}'})
    seen: list[tuple[int, str]] = []
    async with EventBus.from_url(redis.url, group="g", **FAST) as bus:
        bus.subscribe("INPUT:*", lambda event: seen.append((event.priority, event.payload["text"])))
        backend: Any = bus.backend
        await _until(
            lambda: (
                len(seen) >= len(events)
                and backend.metrics()["dead_lettered"] == 1
                and backend.metrics()["twins"] == 1
            )
        )
        await bus.wait_idle()
        await backend.flush()
        pending = [
            (await client.xpending(stream_key("openstarry", p, r), "g"))["pending"]
            for p in range(8)
            for r in range(6)
        ]
    dead: Any = await client.xrange("{openstarry}:dead")
    await client.aclose()
    priorities = [priority for priority, _ in seen[: len(events)]]
    assert priorities == sorted(priorities)  # one read: priority first
    assert sorted(text for _, text in seen) == sorted(e.payload["text"] for e in events)
    assert sum(pending) == 0  # the second entry of the same envelope went with the first
    assert [entry[1][b"reason"] for entry in dead] == [b"invalid envelope"]


async def test_poison_goes_to_dead_letter_and_the_session_goes_on(redis: RedisServer) -> None:
    handled: list[str] = []

    def handle(event: Event) -> None:
        if event.payload["text"] == "poison":
            raise RuntimeError("always fails")
        handled.append(event.payload["text"])

    async with EventBus.from_url(redis.url, max_deliveries=3, **FAST) as bus:
        bus.subscribe("INPUT:*", handle)
        for text in ("a", "poison", "b"):
            await bus.apublish(_input(text))
        await _until(lambda: bus.metrics()["backend"]["dead_lettered"] == 1 and len(handled) == 2)
        await bus.wait_idle()
    assert handled == ["a", "b"]
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis.url)
    dead: Any = await client.xrange("{openstarry}:dead")
    await client.aclose()
    assert len(dead) == 1
    assert decode_event(dead[0][1][b"e"]).payload["text"] == "poison"
    assert dead[0][1][b"reason"] == b"handler failed"


async def test_a_full_stream_makes_the_producer_wait_and_loses_nothing(redis: RedisServer) -> None:
    """Bounded streams: past maxlen a publish waits for handled entries to be trimmed."""
    seen: list[Event] = []
    async with (
        EventBus.from_url(redis.url, consume=False, maxlen=20, partitions=1) as producer,
        anyio.create_task_group() as tg,
    ):

        async def produce() -> None:
            for i in range(60):
                await producer.apublish(_input(str(i)))

        tg.start_soon(produce)
        backend: Any = producer.backend
        await _until(lambda: backend.metrics()["refused_full"] > 0)
        async with EventBus.from_url(redis.url, maxlen=20, partitions=1, **FAST) as bus:
            bus.subscribe("*", seen.append)
            await _until(lambda: len(seen) == 60)
    assert [e.payload["text"] for e in seen] == [str(i) for i in range(60)]


async def test_a_long_full_stream_is_trimmed_by_nodes_of_handled_entries(
    redis: RedisServer,
) -> None:
    """Past maxlen, whole nodes of handled entries go first; an unhandled entry never."""
    options: dict[str, Any] = {"maxlen": 1000, "partitions": 1}
    seen: list[Event] = []
    async with EventBus.from_url(redis.url, **options, **FAST) as bus:
        bus.subscribe("*", seen.append)
        backend: Any = bus.backend
        assert all(await backend.asend_many([_input(f"a{i}") for i in range(1000)]))
        await _until(lambda: backend.metrics()["acked"] == 1000)
    async with EventBus.from_url(redis.url, consume=False, **options) as producer:
        backend = producer.backend
        later = [_input(f"b{i}") for i in range(300)]
        assert all(await backend.asend_many(later))  # room made, nobody consuming
        history = [decode_event(w).payload["text"] async for _, w in backend.history()]
        metrics = backend.metrics()
    assert metrics["refused_full"] == 0
    assert len(history) <= 1000
    assert history[-300:] == [f"b{i}" for i in range(300)]
    # What went was the oldest handled entries, in whole nodes of the stream.
    assert history[0] != "a0"
    assert history[:-300] == [f"a{i}" for i in range(1300 - len(history), 1000)]


# -- shared sessions ------------------------------------------------------------------


async def test_session_stores_keep_history(redis: RedisServer, tmp_path: Path) -> None:
    for store in (SQLiteStore(tmp_path / "s.db"), RedisStore(redis.url)):
        for turn in ("one", "two"):
            # A new agent each turn: a restart, or another worker.
            provider = ScriptedProvider(["ok"])
            async with Agent(provider, store=store) as agent:
                await agent.ask(turn, session_id="s")
        async with Agent(ScriptedProvider(["ok"]), store=store) as agent:
            await agent.ask("three", session_id="s")
            texts = [getattr(e, "text", None) for e in agent.loop.session("s").memory]
        assert texts == ["one", "ok", "two", "ok", "three", "ok"]
    assert open_store("memory") is None
    assert isinstance(open_store(f"sqlite:///{tmp_path}/x.db"), SQLiteStore)


# -- the commands ---------------------------------------------------------------------


def _envelopes(n: int, sessions: int = 5) -> bytes:
    return b"".join(
        encode_event(_input(f"hello {i}", session=f"s{i % sessions}")) + b"\n" for i in range(n)
    )


def _run(
    args: list[str], stdin: bytes = b"", timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(OPENSTARRY + args, input=stdin, capture_output=True, timeout=timeout)


def _worker(manifest: Path, url: str, consumer: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OPENSTARRY_CLAIM_IDLE": "1"}
    return subprocess.Popen(
        [*OPENSTARRY, "worker", str(manifest), "--bus", url, "--consumer", consumer],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"identity": {"name": "w"}, "provider": {"name": "default"}}))
    return path


def _outputs(url: str, count: int, timeout: float = 30) -> list[Event]:
    done = _run(
        [
            "tail",
            "--bus",
            url,
            "--type",
            "OUTPUT:AGENT_MESSAGE",
            "--count",
            str(count),
            "--timeout",
            str(timeout),
        ],
        timeout=timeout + 30,
    )
    assert done.returncode == 0, done.stderr
    return [decode_event(line) for line in done.stdout.splitlines()]


def _answered(url: str) -> list[str]:
    """The input each final answer names as its cause, from the whole retained history."""
    done = _run(["tail", "--bus", url, "--type", "OUTPUT:AGENT_MESSAGE", "--timeout", "0.5"])
    return [decode_event(line).parent_id or "" for line in done.stdout.splitlines()]


def _wait_answered(url: str, count: int, timeout: float = 60) -> None:
    """Until ``count`` distinct inputs have an answer (bounded: the assertions come after)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(set(_answered(url))) < count:
        time.sleep(0.5)


def _assert_each_answered_once(url: str, data: bytes) -> None:
    """Every input of ``data`` has exactly one final answer: none lost, none twice."""
    answered = _answered(url)
    inputs = [decode_event(line).id for line in data.splitlines()]
    errors = _run(["tail", "--bus", url, "--type", "KERNEL:ERROR", "--timeout", "0.5"])
    assert sorted(answered) == sorted(inputs), errors.stdout[:3000]


def test_publish_worker_tail_and_sigterm(
    redis: RedisServer, manifest: Path, tmp_path: Path
) -> None:
    data = _envelopes(10)
    (tmp_path / "in.ndjson").write_bytes(data)
    # Published before any worker: the group a worker creates reads from the start.
    done = _run(["publish", "--bus", redis.url, str(tmp_path / "in.ndjson")])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"accepted": 10, "duplicates": 0, "invalid": 0}
    worker = _worker(manifest, redis.url, "w1")
    try:
        outputs = _outputs(redis.url, 10)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    assert len(outputs) == 10  # tail follows every stream: none missed
    inputs = {e.id: e for e in (decode_event(line) for line in data.splitlines())}
    for out in outputs:
        cause = inputs[out.parent_id or ""]
        assert (out.trace_id, out.session_id) == (cause.trace_id, cause.session_id)
    assert sorted(_answered(redis.url)) == sorted(inputs)


def test_publish_counts_bad_input_and_sends_none_of_it(redis: RedisServer) -> None:
    good = encode_event(_input("fine"))
    lines = [
        good,
        b"not json",
        b'{"id": 1, "type": "INPUT:USER_MESSAGE"}',
        b'{"id":"' + b"x" * (2 << 20) + b'"}',
        good,
    ]
    done = _run(["publish", "--bus", redis.url], stdin=b"\n".join(lines) + b"\n")
    assert done.returncode == 1
    assert json.loads(done.stdout) == {"accepted": 1, "duplicates": 1, "invalid": 3}
    for n in (2, 3, 4):
        assert f"line {n}:".encode() in done.stderr
    tail = _run(["tail", "--bus", redis.url, "--timeout", "0.2"])
    assert len(tail.stdout.splitlines()) == 1


def test_name_and_partitions_flags_pick_the_bus(redis: RedisServer) -> None:
    """--name and --partitions name one bus on a shared Redis; other names do not see it."""
    own = ["--name", "other", "--partitions", "2"]
    done = _run(["publish", "--bus", redis.url, *own], stdin=_envelopes(3))
    assert json.loads(done.stdout)["accepted"] == 3
    mine = _run(["tail", "--bus", redis.url, *own, "--timeout", "0.2"])
    default = _run(["tail", "--bus", redis.url, "--timeout", "0.2"])
    assert (len(mine.stdout.splitlines()), len(default.stdout.splitlines())) == (3, 0)


def test_the_same_file_published_twice_at_once(
    redis: RedisServer, manifest: Path, tmp_path: Path
) -> None:
    data = _envelopes(300, sessions=30)
    path = tmp_path / "in.ndjson"
    path.write_bytes(data)
    producers = [
        subprocess.Popen(
            [*OPENSTARRY, "publish", "--bus", redis.url, str(path)], stdout=subprocess.PIPE
        )
        for _ in range(2)
    ]
    counts = [json.loads(p.communicate(timeout=60)[0]) for p in producers]
    assert sum(c["accepted"] for c in counts) == 300
    assert sum(c["duplicates"] for c in counts) == 300
    worker = _worker(manifest, redis.url, "w1")
    try:
        assert len(_outputs(redis.url, 300)) == 300
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    _assert_each_answered_once(redis.url, data)


def test_kill_9_mid_batch_with_a_second_worker(redis: RedisServer, manifest: Path) -> None:
    data = _envelopes(600, sessions=50)
    first = _worker(manifest, redis.url, "w1")
    time.sleep(1.5)
    assert _run(["publish", "--bus", redis.url], stdin=data).returncode == 0
    second = _worker(manifest, redis.url, "w2")
    try:
        _outputs(redis.url, 50)  # w1 is in the middle of the backlog
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        _wait_answered(redis.url, 600)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    # Nothing lost, nothing handled twice: a run's answer and its input's
    # acknowledgement are committed by one script, so the kill leaves both or neither.
    _assert_each_answered_once(redis.url, data)


def test_redis_restart_with_aof_loses_no_acknowledged_publish(
    redis: RedisServer, manifest: Path
) -> None:
    worker = _worker(manifest, redis.url, "w1")
    try:
        time.sleep(1.5)
        first = _envelopes(100, sessions=10)
        assert _run(["publish", "--bus", redis.url], stdin=first).returncode == 0
        redis.restart()
        second = b"".join(
            encode_event(_input(f"after {i}", session=f"t{i % 10}")) + b"\n" for i in range(100)
        )
        assert _run(["publish", "--bus", redis.url], stdin=second).returncode == 0
        _wait_answered(redis.url, 200)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    _assert_each_answered_once(redis.url, first + second)
