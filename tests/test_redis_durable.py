"""State written with the commit, fenced by the lease; runs' journals (a real redis-server).

In one process, each part on its own: a commit under a lease that moved on
writes nothing; a session's memory is carried by the commit of its input and
read back before that commit is answered; a ``/reset`` goes with its own
commit; a run's journal is recorded step by step, refused once the lease has
moved on, deleted by the commit. The faults across processes (SIGSTOP,
kill -9) are in ``test_exactly_once_state.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry import AgentContext, tool
from openstarry.agent import Agent
from openstarry.bus import EventBus, open_journal
from openstarry.bus.redis.keys import partition_of
from openstarry.core import Event, encode_event
from openstarry.errors import LeaseLost
from openstarry.redis_server import RedisClusterServer, RedisServer
from openstarry.stores import RedisStore
from openstarry.testing import FunctionProvider, ScriptedProvider, tool_call
from redis_support import NEEDS_REDIS_SERVER, running_redis

pytestmark = [pytest.mark.anyio, NEEDS_REDIS_SERVER]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path, aof=False) as server:
        yield server


def _input(text: str, session: str = "s1") -> Event:
    return Event.new("INPUT:USER_MESSAGE", {"text": text}, source="test", session_id=session)


async def _until(predicate: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


def _holding(bus: EventBus) -> Any:
    """A handler that holds what it is given (done when the test releases it)."""

    def hold(event: Event) -> None:
        bus.hold(event)

    return hold


async def _delivered(bus: EventBus, event: Event) -> tuple[Any, Any]:
    """Publish ``event`` to ``bus``, whose worker holds its inputs; once it is delivered
    and held there, the bus's backend and the event's delivery."""
    await bus.apublish(event)
    return await _held(bus, event)


async def _held(bus: EventBus, event: Event) -> tuple[Any, Any]:
    """Wait until ``event`` is delivered and held by ``bus``'s worker; its backend, delivery."""
    backend: Any = bus.backend
    await _until(lambda: event in backend.held)
    return backend, backend.held[event]


async def test_a_commit_under_a_lease_that_moved_on_writes_nothing(redis: RedisServer) -> None:
    """A worker that held an entry while another took its partition (it was frozen)
    commits nothing of it: no acknowledgement, no effect, no state; the entry stays
    pending for the new owner."""
    seen: list[Event] = []
    async with EventBus.from_url(redis.url, group="g", consumer="a", claim_idle=1.0) as bus:

        def handle(event: Event) -> None:
            bus.hold(event)  # (as the execution loop does: done when released)
            seen.append(event)

        bus.subscribe("INPUT:*", handle)
        question = _input("hello")
        await bus.apublish(question)
        await _until(lambda: bool(seen))
        backend, delivery = await _held(bus, question)
        partition = backend._partition_of_key[delivery.stream]
        client = backend._client
        lease = backend.layout.lease("g", partition)
        # Another consumer takes the partition (a new epoch), as after a freeze.
        await client.set(lease, "b|999")
        with bus.effects_of(question):
            await bus.apublish(question.child("OUTPUT:AGENT_MESSAGE", {"text": "late"}, source="t"))
        assert backend.stage(question, "{openstarry}:probe", b"written")
        assert backend.staged("{openstarry}:probe") == (True, None)
        bus.release(question)
        await bus.backend.flush()  # type: ignore[union-attr]
        metrics = backend.metrics()
        assert metrics["fenced"] == 1
        assert await client.get("{openstarry}:probe") is None
        assert backend.staged("{openstarry}:probe") == (False, None)
        pending = await client.xpending(delivery.stream.decode(), "g")
        assert pending["pending"] == 1  # for the partition's owner to reclaim
        texts = [json.loads(w)["payload"].get("text") async for _, w in backend.history()]
        assert "late" not in texts
        await client.set(lease, delivery.lease)  # (so that the stop frees it cleanly)


async def test_an_entry_left_pending_with_nobody_to_run_it_is_run_by_its_partitions_owner(
    redis: RedisServer,
) -> None:
    """A consumer frozen past its lease and thawed may read its old partition once more
    before it learns it lost it: what it read is pending under its name, and it will
    never commit it. The partition's owner finds such entries (every ``claim_idle``)
    and runs them; what it holds itself is not touched."""
    seen: list[str] = []
    holding: list[Event] = []
    async with EventBus.from_url(redis.url, group="g", consumer="a", claim_idle=0.5) as bus:

        def handle(event: Event) -> None:
            seen.append(str(event.payload["text"]))
            if event.payload["text"] == "long":
                bus.hold(event)  # a run longer than a sweep: not taken for stranded
                holding.append(event)

        bus.subscribe("INPUT:*", handle)
        backend: Any = bus.backend
        await _until(lambda: len(backend.metrics()["partitions"]) == backend.partitions)
        await bus.apublish(_input("long"))
        await _until(lambda: bool(holding))
        stray = _input("read by a thawed consumer", session="s2")
        key = backend.layout.stream(partition_of("s2", backend.partitions), stray.priority)
        client = backend._client
        # The ghost reads the entry in the same transaction that adds it: the owner's
        # blocked read never sees it.
        async with client.pipeline(transaction=True) as pipe:
            pipe.xadd(key, {"e": encode_event(stray)})
            pipe.xreadgroup("g", "ghost", {key: ">"}, count=1)
            _, read = await pipe.execute()
        assert read, "the ghost read the entry"
        assert read[0][1], "the ghost read the entry"
        await _until(lambda: "read by a thawed consumer" in seen, timeout=10)
        assert backend.metrics()["stranded"] == 1
        assert seen.count("long") == 1  # held by its owner: left alone
        await anyio.sleep(1.2)  # more sweeps: nothing else is found
        assert backend.metrics()["stranded"] == 1
        bus.release(holding[0])
        await backend.flush()
        for p in range(backend.partitions):
            for stream in backend.layout.streams(p):
                assert (await client.xpending(stream, "g"))["pending"] == 0


async def test_the_state_a_commit_carries_is_written_with_it_and_read_back_before(
    redis: RedisServer,
) -> None:
    """The value staged on a delivery is read back at once, written by its commit only."""
    async with EventBus.from_url(redis.url, group="g", consumer="a", claim_idle=1.0) as bus:
        bus.subscribe("INPUT:*", _holding(bus))
        question = _input("hello")
        backend, _ = await _delivered(bus, question)
        assert backend.stage(question, "{openstarry}:k", b"one", ["one"])
        assert backend.stage(question, "{openstarry}:k", b"two", ["two"])  # the last one wins
        assert backend.staged("{openstarry}:k") == (True, ["two"])
        assert await backend._client.get("{openstarry}:k") is None  # not before the commit
        assert not backend.stage(_input("never delivered"), "{openstarry}:k", b"x")
        bus.release(question)
        await bus.backend.flush()  # type: ignore[union-attr]
        assert await backend._client.get("{openstarry}:k") == b"two"
        assert backend.staged("{openstarry}:k") == (False, None)


async def test_an_agents_memory_goes_with_its_commits_not_by_saves_of_its_own(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On its bus's Redis the store never saves by itself: each run's memory goes with
    its input's commit; inputs of one session run back to back see each other's turns
    before those commits are answered, and a ``/reset`` deletes with its own commit."""

    async def no_plain_saves(*args: Any) -> None:
        raise AssertionError("a plain save on the bus's own Redis: not fenced")

    monkeypatch.setattr(RedisStore, "save", no_plain_saves)
    monkeypatch.setattr(RedisStore, "delete", no_plain_saves)
    answers: list[Event] = []
    bus = EventBus.from_url(redis.url, group="g", consumer="w", claim_idle=1.0)
    bus.subscribe("OUTPUT:AGENT_MESSAGE", answers.append)
    store = RedisStore(redis.url)
    async with EventBus.from_url(redis.url, consume=False) as producer:
        backend: Any = producer.backend
        inputs = [_input(f"turn {i}", session="s") for i in range(1, 21)]
        assert all(await backend.asend_many(inputs))
    async with bus, Agent(ScriptedProvider(["ok"], cycle=True), bus=bus, store=store):
        await _until(lambda: len(answers) == 20)
        await bus.backend.flush()  # type: ignore[union-attr]
        saved = await store.load("s")
        assert saved is not None
        assert [e["text"] for e in saved if e["role"] == "user"] == [
            f"turn {i}" for i in range(1, 21)
        ]
        await bus.apublish(_input("/reset", session="s"))
        await _until(lambda: len(answers) == 21)
        await bus.backend.flush()  # type: ignore[union-attr]
        assert await store.load("s") is None


async def test_a_journal_records_steps_refuses_them_once_the_lease_moved_and_goes_with_the_commit(
    redis: RedisServer,
) -> None:
    async with EventBus.from_url(redis.url, group="g", consumer="a", claim_idle=1.0) as bus:
        bus.subscribe("INPUT:*", _holding(bus))
        question = _input("hello")
        backend, delivery = await _delivered(bus, question)
        journal = await open_journal(bus.backend, question)
        assert journal is not None
        assert journal.steps == []
        await journal.record(b"step one")
        await journal.record(b"step two")
        client = backend._client
        assert await client.lrange(journal.key, 0, -1) == [b"step one", b"step two"]
        assert await open_journal(bus.backend, _input("not delivered here")) is None
        bus.release(question)
        await bus.backend.flush()  # type: ignore[union-attr]
        assert await client.exists(journal.key) == 0  # deleted by the commit

        second = _input("again")
        backend, delivery = await _delivered(bus, second)
        journal = await open_journal(bus.backend, second)
        partition = backend._partition_of_key[delivery.stream]
        await client.set(backend.layout.lease("g", partition), "b|999")
        with pytest.raises(LeaseLost):
            await journal.record(b"too late")
        assert await client.exists(journal.key) == 0
        with pytest.raises(LeaseLost):  # dropped: its new owner runs it
            await open_journal(bus.backend, second)
        bus.release(second)
        await bus.backend.flush()  # type: ignore[union-attr]
        assert backend.metrics()["acked"] == 1  # the first only


@pytest.fixture(params=["one node", "cluster"])
def bus_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A Redis server's URL, or a 3-master Redis Cluster's."""
    if request.param == "one node":
        with running_redis(tmp_path, aof=False) as server:
            yield server.url
    else:
        with RedisClusterServer(tmp_path / "cluster", masters=3, replicas=0) as rig:
            yield rig.url


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_run_handed_over_mid_tool_replays_what_completed(bus_url: str) -> None:
    """A worker stopped while a run's second tool runs hands the run back; the worker
    that takes it over replays the first response, the first tool's outcome and the
    second response from the journal, runs the second tool again (it was in flight,
    with the same idempotency key) and the third once, and answers once."""
    runs: dict[str, list[str | None]] = {"one": [], "two": [], "three": []}
    second_started = anyio.Event()
    calls = 0

    def counting(name: str) -> Any:
        async def run(context: AgentContext) -> str:
            runs[name].append(context.idempotency_key)
            if name == "two" and len(runs["two"]) == 1:
                second_started.set()
                await anyio.sleep_forever()  # stopped here, by its worker's stop
            return f"{name} done"

        run.__name__ = run.__qualname__ = name
        run.__doc__ = f"Tool {name}."
        return tool(run)

    def model(prompt: str, context: AgentContext) -> Any:
        nonlocal calls
        calls += 1
        return (
            tool_call(("one", "two", "three")[context.round - 1], {})
            if context.round <= 3
            else "all done"
        )

    tools = [counting(name) for name in ("one", "two", "three")]
    answers: list[Event] = []
    question = _input("go", session="durable")
    async with EventBus.from_url(bus_url, consume=False) as producer:
        await producer.apublish(question)
    first = EventBus.from_url(bus_url, group="g", consumer="a", claim_idle=1.0)
    async with first, Agent(FunctionProvider(model), tools, bus=first):
        with anyio.fail_after(20):
            await second_started.wait()
    assert calls == 2
    second = EventBus.from_url(bus_url, group="g", consumer="b", claim_idle=1.0)
    second.subscribe("OUTPUT:AGENT_MESSAGE", answers.append)
    async with second, Agent(FunctionProvider(model), tools, bus=second):
        await _until(lambda: any(a.payload.get("final") for a in answers))
    assert len(runs["one"]) == 1
    assert len(runs["two"]) == 2
    assert runs["two"][0] == runs["two"][1]  # the same key on both attempts
    assert runs["two"][0] is not None
    assert runs["two"][0].startswith(f"{question.id}/")
    assert len(runs["three"]) == 1
    assert calls == 4  # rounds 1 and 2 replayed: the model asked for rounds 3 and 4 only
    finals = [a for a in answers if a.payload.get("final")]
    assert [f.payload["text"] for f in finals] == ["all done"]
