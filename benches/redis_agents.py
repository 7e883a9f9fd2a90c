"""Agents over the Redis bus as a user runs them: ``openstarry worker`` and ``openstarry publish``.

    python -m benches.redis_agents --inputs 50000 --publishers 4 --workers 2

Starts a ``redis-server`` (in memory), ``--workers`` processes of
``openstarry worker`` on the example weather agent, then ``--publishers``
processes of ``openstarry publish`` at once, each with its share of
``--inputs`` questions (priority 2, over ``--sessions`` sessions). An observer
(a consumer group of its own, reading every stream, so that the bus keeps
each answer until it has read it) counts the final answers
(``OUTPUT:AGENT_MESSAGE`` with the weather) by the input whose trace it
continues (each input starts a trace of its own). It prints one
line of JSON:

- ``answers_per_s``: inputs answered per second, from the publishers' start
  to the last answer;
- ``answered``, ``answered_twice``, ``unanswered``: every input must be
  answered exactly once;
- ``published``: the publishers' own counts (``accepted``, ``duplicates``,
  ``invalid``), summed: ``accepted`` must equal ``--inputs``;
- ``redis_idle_after_s``: how long after the last answer Redis's CPU fell
  under 5 % of a core (sampled every 0.5 s);
- ``worker_exits``: the workers' exit statuses after SIGTERM (0 each).

It exits 1 if an input was not answered exactly once or a count is off.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from openstarry.bus.redis import PRIORITIES, stream_key
from openstarry.core import Event, decode_event, encode_event
from openstarry.redis_server import RedisServer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
CITIES = ("Paris", "Taipei", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Tokyo")


def questions(n: int, sessions: int) -> list[Event]:
    return [
        Event.new(
            "INPUT:USER_MESSAGE",
            {"text": f"What's the weather in {CITIES[i % len(CITIES)]}?"},
            source="cli",
            session_id=f"user-{i % sessions}",
            priority=2,
        )
        for i in range(n)
    ]


class Observer(threading.Thread):
    """A consumer group of its own over every stream: the final answers, by cause."""

    def __init__(self, url: str, partitions: int) -> None:
        super().__init__(daemon=True)
        # No socket timeout: a read blocks for 200 ms at most, and a busy Redis is
        # what is measured, not a fault.
        self.client = redis.Redis.from_url(url, socket_timeout=None)
        self.keys = [stream_key("openstarry", p, r) for p in range(partitions) for r in PRIORITIES]
        for key in self.keys:
            self.client.xgroup_create(key, "observer", id="0", mkstream=True)
        self.answers: dict[str, int] = {}
        self.last = time.perf_counter()
        self.stopped = threading.Event()

    def run(self) -> None:
        streams: dict[Any, Any] = dict.fromkeys(self.keys, ">")
        while not self.stopped.is_set():
            reply: Any = self.client.xreadgroup("observer", "o", streams, count=200, block=200)
            for stream, entries in reply or ():
                for _, fields in entries:
                    wire = fields.get(b"e", b"")
                    if b'"OUTPUT:AGENT_MESSAGE"' in wire and b"The weather in" in wire:
                        trace = decode_event(wire).trace_id
                        self.answers[trace] = self.answers.get(trace, 0) + 1
                        self.last = time.perf_counter()
                if entries:
                    self.client.xack(stream, "observer", *[entry for entry, _ in entries])


def _cpu(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _leases(client: redis.Redis, workers: int, timeout: float = 60) -> None:
    keys = [f"{{openstarry}}:lease:openstarry:{p}" for p in range(8)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = client.mget(keys)
        if all(owners) and len(set(owners)) == workers:
            return
        time.sleep(0.1)
    raise TimeoutError("the workers did not share the partitions")


def run(args: argparse.Namespace, url: str, folder: Path) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    observer = Observer(url, 8)
    observer.start()
    command = [sys.executable, "-m", "openstarry.cli"]
    env = {**os.environ, "OPENSTARRY_CLAIM_IDLE": "10"}
    logs = [open(folder / f"worker-{i}.log", "wb") for i in range(args.workers)]  # noqa: SIM115
    workers = [
        subprocess.Popen(
            [*command, "worker", str(args.manifest), "--bus", url, "--consumer", f"w{i}"],
            stdout=subprocess.DEVNULL,
            stderr=logs[i],
            env=env,
        )
        for i in range(args.workers)
    ]
    inputs = questions(args.inputs, args.sessions)
    files = []
    for i in range(args.publishers):
        path = folder / f"in-{i}.ndjson"
        path.write_bytes(b"".join(encode_event(e) + b"\n" for e in inputs[i :: args.publishers]))
        files.append(path)
    try:
        _leases(client, args.workers)
        cpu_before = _cpu(client)
        started = time.perf_counter()
        publishers = [
            subprocess.Popen(
                [*command, "publish", "--bus", url, str(path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for path in files
        ]
        while len(observer.answers) < args.inputs:
            if time.perf_counter() - max(observer.last, started) > args.stall:
                break
            time.sleep(0.05)
        last = observer.last
        outs = [p.communicate(timeout=120) for p in publishers]
        published: dict[str, int] = {"accepted": 0, "duplicates": 0, "invalid": 0}
        for out, err in outs:
            try:
                for key, value in json.loads(out).items():
                    published[key] += value
            except ValueError:
                print(f"a publisher said: {err.decode()[-2000:]}", file=sys.stderr)
        # Redis idle again: under 5 % of a core over half a second.
        idle_after = None
        previous, at = _cpu(client), time.perf_counter()
        while time.perf_counter() - last < 60:
            time.sleep(0.5)
            now_cpu, now = _cpu(client), time.perf_counter()
            if (now_cpu - previous) / (now - at) < 0.05:
                idle_after = round(at - last, 1)
                break
            previous, at = now_cpu, now
        cpu = _cpu(client) - cpu_before
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        exits = []
        for worker in workers:
            try:
                exits.append(worker.wait(timeout=60))
            except subprocess.TimeoutExpired:
                worker.kill()
                exits.append(worker.wait())
        for log in logs:
            log.close()
        observer.stopped.set()
        observer.join(timeout=5)
    answers = observer.answers
    wanted = {e.trace_id for e in inputs}
    elapsed = last - started
    return {
        "inputs": args.inputs,
        "publishers": args.publishers,
        "workers": args.workers,
        "answered": sum(1 for i in wanted if i in answers),
        "answered_twice": sum(1 for i in wanted if answers.get(i, 0) > 1),
        "unanswered": sum(1 for i in wanted if i not in answers),
        "seconds": round(elapsed, 2),
        "answers_per_s": round(len(answers) / elapsed) if elapsed > 0 else 0,
        "redis_cpu_s": round(cpu, 2),
        "redis_idle_after_s": idle_after,
        "published": published,
        "worker_exits": exits,
        "worker_log_tail": [
            (folder / f"worker-{i}.log").read_text(errors="replace")[-500:]
            for i in range(args.workers)
        ],
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benches.redis_agents", description=__doc__)
    p.add_argument("--inputs", type=int, default=8000)
    p.add_argument("--publishers", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sessions", type=int, default=400)
    p.add_argument("--manifest", type=Path, default=EXAMPLE)
    p.add_argument("--stall", type=float, default=60.0, help="give up after S s without an answer")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = RedisServer(folder, aof=False)
        server.start()
        print(f"redis_agents: redis-server at {server.url}", file=sys.stderr, flush=True)
        try:
            result = run(args, server.url, folder)
        finally:
            server.stop()
    print(json.dumps(result))
    ok = (
        result["answered"] == args.inputs
        and result["answered_twice"] == 0
        and result["published"]["accepted"] == args.inputs
        and all(code == 0 for code in result["worker_exits"])
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
