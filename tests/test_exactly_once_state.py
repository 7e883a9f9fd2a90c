"""Exactly-once state (issue 39): what a stalled or crashed worker leaves of a session.

Answers are exactly-once already (a run's events are committed with its input's
acknowledgement, by one script). These tests ask the same of the state a run
leaves behind, with real ``redis-server`` processes and real workers started by
the ``openstarry worker`` command:

- a worker frozen (``SIGSTOP``) past its lease while it holds runs, then let go
  on (``SIGCONT``), neither doubles nor loses a turn of any session's memory:
  each session remembers each of its user turns once, in order;
- a run killed (``kill -9``) in the middle of its second of three tools resumes
  on another worker without running its first tool again, and answers once;
- on a Redis Cluster (3 masters, 3 replicas), a worker frozen past its lease
  while a master is killed and replaced keeps every session's memory whole too.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry._redisurl import cluster_nodes, is_cluster_url
from openstarry.bus.redis.keys import Layout, partition_of
from openstarry.core import encode_event
from openstarry.redis_server import RedisClusterServer, RedisServer
from openstarry.stores import RedisStore
from redis_support import NEEDS_REDIS_SERVER, running_redis
from test_redis_bus import (
    OPENSTARRY,
    _assert_each_answered_once,
    _input,
    _outputs,
    _run,
    _wait_answered,
)

pytest.importorskip("redis")

pytestmark = [NEEDS_REDIS_SERVER]


#: The bus's name and its consumer group (the commands' defaults).
NAME = GROUP = "openstarry"
#: Seconds a worker's leases last (``OPENSTARRY_CLAIM_IDLE``).
LEASE = 1.0
#: Seconds a worker stays frozen: well past its lease, so another worker takes its runs.
FREEZE = 4.0
#: Read and unacknowledged entries that make a worker one worth freezing.
HELD = 10
SESSIONS = 40
TURNS = 6


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:  # with its append-only file
        yield server


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"identity": {"name": "w"}, "provider": {"name": "default"}}))
    return path


# -- workers and the bus's Redis -------------------------------------------------------


def _worker(
    manifest: Path, url: str, consumer: str, *extra: str, pythonpath: Path | None = None
) -> subprocess.Popen[bytes]:
    """A worker of ``manifest``'s agent; what it says on standard error goes to
    ``CONSUMER.log`` beside the manifest."""
    env = {**os.environ, "OPENSTARRY_CLAIM_IDLE": str(LEASE)}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    with (manifest.parent / f"{consumer}.log").open("wb") as log:
        return subprocess.Popen(
            [*OPENSTARRY, "worker", str(manifest), "--bus", url, "--consumer", consumer, *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )


def _stop(workers: Mapping[str, subprocess.Popen[bytes]]) -> dict[str, int | None]:
    """Let each worker go on (one may be frozen), then SIGTERM it; the exit statuses
    (``None`` for one that had ended before, ``-9`` for one killed after 30 s of not
    stopping)."""
    running = {name: w.poll() is None for name, w in workers.items()}
    for name, worker in workers.items():
        if running[name]:
            worker.send_signal(signal.SIGCONT)
            worker.send_signal(signal.SIGTERM)
    codes: dict[str, int | None] = {}
    for name, worker in workers.items():
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait(timeout=10)
        codes[name] = code if running[name] else None
    return codes


def _assert_stopped_cleanly(codes: Mapping[str, int | None], logs: Path) -> None:
    """Each worker ran until its SIGTERM and then exited 0; the end of the log of any that
    did not (``None``: it had ended on its own)."""
    wrong = {name: code for name, code in codes.items() if code != 0}
    said = "\n".join(
        f"{name}: ...\n" + "\n".join((logs / f"{name}.log").read_text().splitlines()[-12:])
        for name in wrong
    )
    assert not wrong, f"workers that did not stop cleanly: {wrong}; the ends of their logs:\n{said}"


def _client(url: str) -> Any:
    """A plain (blocking) client of the bus's Redis, or of its cluster."""
    if is_cluster_url(url):
        from redis.cluster import RedisCluster

        [(host, port), *_], options = cluster_nodes(url)
        return RedisCluster(host=host, port=port, **options)
    import redis

    return redis.Redis.from_url(url)


def _wait_consumers(client: Any, layout: Layout, count: int, timeout: float = 30) -> None:
    """Until ``count`` workers have joined the group (bounded: a start that failed is told)."""
    deadline = time.monotonic() + timeout
    while client.zcard(layout.consumers(GROUP)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} workers joined in {timeout} s"
        time.sleep(0.05)


def _held(client: Any, layout: Layout) -> Counter[tuple[str, int]]:
    """The entries each consumer has read and not acknowledged (the runs it holds), by
    consumer and partition."""
    pipe = client.pipeline(transaction=False)
    keys = [(p, key) for p in range(layout.partitions) for key in layout.streams(p)]
    for _, key in keys:
        pipe.xpending(key, GROUP)
    held: Counter[tuple[str, int]] = Counter()
    for (partition, _), summary in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(summary, dict):  # (a stream nobody has read yet has no group)
            for consumer in summary["consumers"]:
                held[consumer["name"].decode(), partition] += consumer["pending"]
    return held


def _by_consumer(held: Counter[tuple[str, int]]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for (consumer, _), count in held.items():
        totals[consumer] += count
    return totals


def _publish_and_freeze(
    url: str,
    path: Path,
    client: Any,
    layout: Layout,
    workers: Mapping[str, subprocess.Popen[bytes]],
    *extra: str,
) -> tuple[str, int]:
    """Publish the NDJSON file ``path`` and freeze (``SIGSTOP``) the worker that holds the
    most of it as soon as one holds ``HELD`` entries: while it runs them, before it
    acknowledges them. The name of the worker frozen, and how many entries it held."""
    publish = subprocess.Popen(
        [*OPENSTARRY, "publish", "--bus", url, *extra, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (name, count), *_ = _by_consumer(_held(client, layout)).most_common(1) or [("", 0)]
            if count >= HELD and name in workers:
                workers[name].send_signal(signal.SIGSTOP)
                break
            time.sleep(0.005)
        else:
            pytest.fail(f"no worker held {HELD} entries of the work published within 30 s")
        out, err = publish.communicate(timeout=60)
    finally:
        if publish.poll() is None:
            publish.kill()
            publish.wait(timeout=10)
    assert publish.returncode == 0, err
    assert json.loads(out)["accepted"] == len(path.read_bytes().splitlines())
    return name, count


def _turns(sessions: Iterable[str], turns: Iterable[int]) -> bytes:
    """An input per turn of each session (``turn N``), each session's in order."""
    turns = list(turns)
    return b"".join(
        encode_event(_input(f"turn {t}", session=s)) + b"\n" for s in sessions for t in turns
    )


def _remembered(url: str, sessions: Iterable[str]) -> dict[str, list[int]]:
    """The user turns each session's memory holds (``N`` of ``turn N``), oldest first."""

    async def load() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        async with RedisStore(url) as store:
            for session in sessions:
                entries = await store.load(session) or []
                found[session] = [
                    int(str(e["text"]).removeprefix("turn "))
                    for e in entries
                    if e.get("role") == "user"
                ]
        return found

    return anyio.run(load)


def _assert_each_turn_remembered_once(
    url: str, sessions: list[str], frozen: list[tuple[str, int]]
) -> None:
    remembered = _remembered(url, sessions)
    wrong = {s: turns for s, turns in remembered.items() if turns != list(range(1, TURNS + 1))}
    shown = dict(sorted(wrong.items())[:6])
    held = ", ".join(f"{name} holding {count}" for name, count in frozen)
    assert not wrong, (
        f"{len(wrong)} of {len(sessions)} sessions remember wrongly (frozen: {held}): {shown}"
    )


# -- a worker frozen past its lease ----------------------------------------------------


def test_a_worker_frozen_past_its_lease_neither_doubles_nor_loses_memory(
    redis: RedisServer, manifest: Path, tmp_path: Path
) -> None:
    """A process pause (a stop-the-world collection, a VM paused): the frozen worker's
    runs are taken over by the other; when it wakes, it must not write its stale runs'
    memory over theirs, nor add its turns a second time. Twice: the turns come in two
    waves, and a worker is frozen in the middle of each."""
    sessions = [f"s{i}" for i in range(SESSIONS)]
    half = TURNS // 2
    waves = [_turns(sessions, range(1, half + 1)), _turns(sessions, range(half + 1, TURNS + 1))]
    client = _client(redis.url)
    layout = Layout(NAME, 8)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    frozen: list[tuple[str, int]] = []
    try:
        for name in ("w1", "w2"):
            workers[name] = _worker(manifest, redis.url, name)
        _wait_consumers(client, layout, 2)
        for i, wave in enumerate(waves):
            path = tmp_path / f"wave{i}.ndjson"
            path.write_bytes(wave)
            frozen.append(_publish_and_freeze(redis.url, path, client, layout, workers))
            time.sleep(FREEZE)
            workers[frozen[-1][0]].send_signal(signal.SIGCONT)
        _wait_answered(redis.url, SESSIONS * TURNS, timeout=90)
    finally:
        client.close()
        codes = _stop(workers)
    _assert_each_answered_once(redis.url, b"".join(waves))
    _assert_each_turn_remembered_once(redis.url, sessions, frozen)
    _assert_stopped_cleanly(codes, manifest.parent)


# -- a run killed in the middle of its tools -------------------------------------------

#: Three tools, each recording its runs (the worker's pid, a line) in its own file
#: next to this module; the second blocks on its first run. And a provider that calls
#: them in order, one a round, reading how many have come back in the run's memory.
STEPS_MODULE = '''\
"""Three steps of one run, counted, for tests/test_exactly_once_state.py."""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import ToolOutcome
from openstarry.core import ProviderResponse
from openstarry.providers import register_provider
from openstarry.testing import FunctionProvider, text, tool_call

HERE = Path(__file__).resolve().parent
STEPS = ("step_one", "step_two", "step_three")


def _count(name: str) -> int:
    """Record a run of ``name``; how many runs were recorded before it."""
    path = HERE / f"{name}.count"
    before = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as f:
        f.write(f"{os.getpid()}\\n")
    return before


async def step_one() -> str:
    """The first step."""
    _count("step_one")
    return "one done"


async def step_two() -> str:
    """The second step: its first run blocks where asked to (its worker is killed meanwhile)."""
    if _count("step_two") == 0 and (HERE / "block").exists():
        await anyio.sleep(60)
    return "two done"


async def step_three() -> str:
    """The third step."""
    _count("step_three")
    return "three done"


def next_step(prompt: str, context: AgentContext) -> ProviderResponse:
    done = sum(isinstance(entry, ToolOutcome) for entry in context.memory.current_turn())
    if done < len(STEPS):
        return tool_call(STEPS[done], {}, id=f"call-{done + 1}")
    return text(f"all {len(STEPS)} steps done")


# No manifest field names a Python provider: a module that a manifest's tools import
# registers one under a name the manifest's provider then gives.
register_provider("three-steps", lambda config: FunctionProvider(next_step, name="three-steps"))
'''
STEPS = ("step_one", "step_two", "step_three")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _steps_agent(folder: Path, **manifest: Any) -> Path:
    """The three steps' module in ``folder`` and the manifest of their agent."""
    (folder / "exactly_once_steps.py").write_text(STEPS_MODULE)
    path = folder / "steps.json"
    path.write_text(
        json.dumps(
            {
                "identity": {"name": "steps"},
                "provider": {"name": "three-steps"},
                "tools": [f"exactly_once_steps:{step}" for step in STEPS],
                **manifest,
            }
        )
    )
    return path


def _steps_workers_asked(
    url: str,
    manifest: Path,
    client: Any,
    workers: dict[str, subprocess.Popen[bytes]],
    data: bytes,
) -> None:
    """Start two workers of the steps' agent (into ``workers``), then publish ``data``."""
    for name in ("w1", "w2"):
        workers[name] = _worker(manifest, url, name, pythonpath=manifest.parent)
    _wait_consumers(client, Layout(NAME, 8), 2)
    assert _run(["publish", "--bus", url], stdin=data).returncode == 0


def test_a_run_killed_mid_tool_resumes_without_repeating_completed_tools(
    redis: RedisServer, tmp_path: Path
) -> None:
    """One input, three tools, one per round; the worker running the second is killed
    (``kill -9``) while it runs. The other worker finishes the run: the first tool had
    completed and must not run again, nor the third twice; the second may (it was in
    flight); and the input is answered once, by the whole run."""
    manifest = _steps_agent(tmp_path)
    (tmp_path / "block").touch()
    data = encode_event(_input("run the three steps", session="steps")) + b"\n"
    client = _client(redis.url)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        _steps_workers_asked(redis.url, manifest, client, workers, data)
        deadline = time.monotonic() + 30
        while not _lines(tmp_path / "step_two.count"):
            assert time.monotonic() < deadline, {s: _lines(tmp_path / f"{s}.count") for s in STEPS}
            time.sleep(0.02)
        (pid,) = _lines(tmp_path / "step_two.count")
        (victim,) = [name for name, w in workers.items() if w.pid == int(pid)]
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(timeout=10)
        _wait_answered(redis.url, 1, timeout=30)
    finally:
        client.close()
        codes = _stop(workers)
    runs = {step: len(_lines(tmp_path / f"{step}.count")) for step in STEPS}
    assert (runs["step_one"], runs["step_three"]) == (1, 1), runs
    assert 1 <= runs["step_two"] <= 2, runs
    _assert_each_answered_once(redis.url, data)
    (answer,) = _outputs(redis.url, 1, timeout=5)
    assert answer.payload["text"] == "all 3 steps done"
    _assert_stopped_cleanly({n: c for n, c in codes.items() if n != victim}, tmp_path)


def test_a_run_waiting_for_approval_survives_a_restart_of_every_worker(
    redis: RedisServer, tmp_path: Path
) -> None:
    """The second of three tools needs approval. While the run waits for it, every
    worker is killed (``kill -9``) and new ones start; the approval, sent then as
    ``/approve ID``, resumes the run on a new worker: the first tool is not run
    again, the approval request is not published twice, and the input is answered
    once, after the second and third tools ran once each."""
    manifest = _steps_agent(tmp_path, approval={"tools": ["exactly_once_steps:step_two"]})
    question = encode_event(_input("run the three steps", session="steps")) + b"\n"
    client = _client(redis.url)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        _steps_workers_asked(redis.url, manifest, client, workers, question)
        requests = _run(
            [
                "tail",
                "--bus",
                redis.url,
                "--type",
                "EXEC:APPROVAL_REQUEST",
                "--count",
                "1",
                "--timeout",
                "30",
            ],
            timeout=60,
        )
        (request,) = [json.loads(line) for line in requests.stdout.splitlines()]
        approval = request["payload"]["approvalId"]
        assert _lines(tmp_path / "step_one.count") != []
        assert _lines(tmp_path / "step_two.count") == []
        for worker in workers.values():
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        workers.clear()
        for name in ("w3", "w4"):
            workers[name] = _worker(manifest, redis.url, name, pythonpath=tmp_path)
        approve = encode_event(_input(f"/approve {approval}", session="steps")) + b"\n"
        assert _run(["publish", "--bus", redis.url], stdin=approve).returncode == 0
        _wait_answered(redis.url, 2, timeout=30)
    finally:
        client.close()
        codes = _stop(workers)
    runs = {step: len(_lines(tmp_path / f"{step}.count")) for step in STEPS}
    assert runs == {"step_one": 1, "step_two": 1, "step_three": 1}, runs
    _assert_each_answered_once(redis.url, question + approve)
    texts = {a.parent_id: a.payload["text"] for a in _outputs(redis.url, 2, timeout=5)}
    assert texts[json.loads(question)["id"]] == "all 3 steps done"
    again = _run(["tail", "--bus", redis.url, "--type", "EXEC:APPROVAL_REQUEST", "--timeout", "1"])
    assert len(again.stdout.splitlines()) == 1  # published once, not again by the replay
    _assert_stopped_cleanly(codes, tmp_path)


# -- the same pause on a Redis Cluster, with a master killed ---------------------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_cluster_worker_frozen_past_its_lease_with_a_master_killed(
    manifest: Path, tmp_path: Path
) -> None:
    """The pause of the first test on 3 masters and their replicas, with the master of
    one of the frozen worker's partitions killed (``kill -9``) while it is frozen: its
    replica takes over. With ``--min-replicas 1`` nothing acknowledged is lost in the
    failover, so every turn must still be remembered once, in order."""
    sessions = [f"s{i}" for i in range(SESSIONS)]
    data = _turns(sessions, range(1, TURNS + 1))
    durable = ("--min-replicas", "1")
    with RedisClusterServer(tmp_path / "cluster", masters=3, replicas=1) as rig:
        url = rig.url
        layout = Layout(NAME, 24, cluster=True)
        client = _client(url)
        workers: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name in ("w1", "w2"):
                workers[name] = _worker(manifest, url, name, *durable)
            _wait_consumers(client, layout, 2)
            path = tmp_path / "turns.ndjson"
            path.write_bytes(data)
            frozen, held = _publish_and_freeze(url, path, client, layout, workers, *durable)
            started = time.monotonic()
            # The master of the partition of which the frozen worker holds the most.
            (_, partition), _ = max(
                (item for item in _held(client, layout).items() if item[0][0] == frozen),
                key=lambda item: item[1],
            )
            victim = rig.master_for_key(layout.stream(partition, 0))
            rig.kill_master(victim.port)
            rig.wait_failover(victim.port)
            rig.restart_node(victim.port)  # back as its heir's replica: --min-replicas 1 again
            time.sleep(max(0.0, started + FREEZE - time.monotonic()))
            workers[frozen].send_signal(signal.SIGCONT)
            _wait_answered(url, SESSIONS * TURNS, timeout=60)
        finally:
            client.close()
            codes = _stop(workers)
        _assert_each_answered_once(url, data)
        _assert_each_turn_remembered_once(url, sessions, [(frozen, held)])
    _assert_stopped_cleanly(codes, manifest.parent)


# -- openstarry serve on the Redis bus ---------------------------------------------------


def test_serve_runs_the_redis_bus_its_manifest_names(redis: RedisServer, tmp_path: Path) -> None:
    """A manifest whose ``bus`` is Redis: ``openstarry serve`` starts that bus with the
    agent (it refused every request with "the Redis bus is not running" before), answers
    over HTTP, and the session's memory goes to the bus's Redis with the commits."""
    import httpx

    from test_api_serve import serve_process

    manifest = tmp_path / "agent.json"
    manifest.write_text(
        json.dumps(
            {
                "identity": {"name": "w"},
                "provider": {"name": "default"},
                "tools": ["get_weather"],
                "bus": {"url": redis.url},
            }
        )
    )
    request = {
        "input": [
            {"role": "user", "type": "message", "content": [{"type": "text", "text": "Weather?"}]}
        ],
        "session_id": "http",
        "stream": False,
    }
    with serve_process(manifest) as (url, _):
        for _ in range(2):
            answer = httpx.post(f"{url}/process", json=request, timeout=30).json()
            assert answer["status"] == "completed", answer

    async def load() -> list[Any]:
        async with RedisStore(redis.url) as store:
            return await store.load("http") or []

    said = [e["text"] for e in anyio.run(load) if e.get("role") == "user"]
    assert said == ["Weather?", "Weather?"]


# -- serve beside workers ----------------------------------------------------------------


def _owner(client: Any, layout: Layout, session: str) -> str:
    """The consumer whose lease holds ``session``'s partition now ("" when none does)."""
    value = client.get(layout.lease(GROUP, partition_of(session, layout.partitions)))
    return value.decode().rpartition("|")[0] if value else ""


def _ask(url: str, session: str, text: str, timeout: float = 60) -> dict[str, Any]:
    import httpx

    request = {
        "input": [{"role": "user", "type": "message", "content": [{"type": "text", "text": text}]}],
        "session_id": session,
        "stream": False,
    }
    answer: dict[str, Any] = httpx.post(f"{url}/process", json=request, timeout=timeout).json()
    return answer


def _said(answer: dict[str, Any]) -> str:
    return " ".join(
        part["text"]
        for item in answer.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "text"
    )


def test_serve_beside_a_worker_answers_the_requests_the_worker_runs(
    redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``openstarry serve`` as one of two workers of a group: a request whose session's
    partition the other worker owns is run there, once, and its answer comes back over
    HTTP (the serve process follows the partition's streams for its run's events)."""
    from test_api_serve import TESTS, gated_manifest, serve_process

    manifest = gated_manifest(tmp_path)
    data = json.loads(manifest.read_text())
    data["bus"] = {"url": redis.url}
    manifest.write_text(json.dumps(data))
    monkeypatch.setenv("OPENSTARRY_CLAIM_IDLE", str(LEASE))
    client = _client(redis.url)
    layout = Layout(NAME, 8)
    worker: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with serve_process(manifest) as (url, _):
            worker["w1"] = _worker(manifest, redis.url, "w1", pythonpath=TESTS)
            _wait_consumers(client, layout, 2)
            sessions = [f"h{i}" for i in range(24)]
            deadline = time.monotonic() + 30
            # Balanced: the serve process (first) hands the worker its share.
            while not any(_owner(client, layout, s) == "w1" for s in sessions) or not all(
                _owner(client, layout, s) for s in sessions
            ):
                assert time.monotonic() < deadline, "the worker took no partition of theirs"
                time.sleep(0.05)
            theirs = [s for s in sessions if _owner(client, layout, s) == "w1"]
            for session in sessions:
                answer = _ask(url, session, "What is the weather in Paris?")
                assert answer["status"] == "completed", (session, answer)
                assert "The weather in Paris is" in _said(answer), answer

            # The worker killed (kill -9) while it runs a request of one of its sessions:
            # the request waits, the serve process takes the partition over once the
            # lease lapses, runs the input again, and the answer comes back, once.
            gate = tmp_path / "gate"
            session = theirs[0]
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                asked = pool.submit(_ask, url, session, f"/wait_for {gate}", 90)
                deadline = time.monotonic() + 30
                while not any(c == "w1" and n for (c, _), n in _held(client, layout).items()):
                    assert time.monotonic() < deadline, "the worker never held the request"
                    time.sleep(0.05)
                worker["w1"].kill()
                worker["w1"].wait()
                gate.touch()
                answer = asked.result(timeout=90)
            assert answer["status"] == "completed", answer
            assert "gate opened" in json.dumps(answer), json.dumps(answer)[:3000]
    finally:
        client.close()
        _stop(worker)
