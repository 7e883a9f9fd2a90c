"""``openstarry tail`` and :mod:`openstarry.bus.redis.reader` on a bus with a long history.

Each test starts its own ``redis-server`` on a free loopback port and writes
the history straight into the bus's streams (``XADD``, pipelined), as a busy
bus would have left it: tens of thousands of handled events.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from openstarry.core import Event, decode_event, encode_event
from openstarry.redis_server import RedisServer
from redis_support import NEEDS_REDIS_SERVER

redis = pytest.importorskip("redis")
aioredis = pytest.importorskip("redis.asyncio")

from openstarry.bus.redis import PRIORITIES, partition_of, stream_key  # noqa: E402
from openstarry.bus.redis.reader import (  # noqa: E402
    entry_after,
    entry_before,
    read_ends,
    read_history,
    read_new,
)

pytestmark = NEEDS_REDIS_SERVER

OPENSTARRY = [sys.executable, "-m", "openstarry.cli"]
KEYS = [stream_key("openstarry", p, r) for p in range(8) for r in PRIORITIES]
#: What each input leaves on the bus, in order: the input and what its handling published.
KINDS = [
    ("INPUT:USER_MESSAGE", 2),
    ("KERNEL:STATE_CHANGE", 4),
    ("OUTPUT:AGENT_MESSAGE", 2),
    ("KERNEL:STATE_CHANGE", 4),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's asyncio client


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    started = RedisServer(tmp_path, aof=False)
    started.start()
    try:
        yield started
    finally:
        started.stop()


def _client(server: RedisServer) -> Any:
    return redis.Redis.from_url(server.url)


def _fill(server: RedisServer, n: int, *, sessions: int = 3, text: int = 400) -> list[Event]:
    """Write ``n`` events of ``sessions`` sessions straight into the streams, in order."""
    client = _client(server)
    events = []
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        kind, priority = KINDS[i % len(KINDS)]
        session = f"s{i // len(KINDS) % sessions}"
        event = Event.new(
            kind,
            {"text": f"{i} " + "x" * text},
            source="test",
            session_id=session,
            priority=priority,
        )
        events.append(event)
        pipe.xadd(
            stream_key("openstarry", partition_of(session, 8), priority), {"e": encode_event(event)}
        )
        if len(pipe) == 2000:
            pipe.execute()
    pipe.execute()
    client.close()
    return events


def _in_entry_order(server: RedisServer) -> list[Event]:
    """The reference: every stream read whole, merged by entry id (ties: in stream order).

    Entry ids order a stream's entries; across streams, entries of one
    millisecond have no order but this one.
    """
    client = _client(server)
    entries = [
        (tuple(map(int, entry.split(b"-"))), fields[b"e"])
        for key in KEYS
        for entry, fields in client.xrange(key)
    ]
    client.close()
    entries.sort(key=lambda item: item[0])
    return [decode_event(wire) for _, wire in entries]


def _xrange_calls(server: RedisServer) -> int:
    client = _client(server)
    stats = client.info("commandstats").get("cmdstat_xrange", {"calls": 0})
    client.close()
    return int(stats["calls"])


def _tail(
    server: RedisServer, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*OPENSTARRY, "tail", "--bus", server.url, *args],
        capture_output=True,
        timeout=timeout,
    )


def _ids(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [decode_event(line).id for line in done.stdout.splitlines()]


# -- the reader ------------------------------------------------------------------


def test_entry_ids_step_by_one() -> None:
    assert entry_after("5-7") == "5-8"
    assert entry_after(f"5-{(1 << 64) - 1}") == "6-0"
    assert entry_before("5-7") == "5-6"
    assert entry_before("5-0") == f"4-{(1 << 64) - 1}"
    assert entry_before("0-0") == "0-0"
    assert entry_after("12") == "12-1"
    with pytest.raises(ValueError, match="entry id"):
        entry_after("soon")


@pytest.mark.anyio
async def test_history_is_merged_in_entry_order_a_bounded_page_at_a_time(
    server: RedisServer,
) -> None:
    """A long history comes whole and in entry-id order, every call reading one page.

    The defect: ``history`` read each stream with one unpaged ``XRANGE - +``.
    """
    events = _fill(server, 30_000, sessions=5, text=20)
    expected = [e.id for e in _in_entry_order(server)]
    assert sorted(expected) == sorted(e.id for e in events)
    client = aioredis.Redis.from_url(server.url)
    lengths = {key: await client.xlen(key) for key in KEYS}
    page = 100
    before = _xrange_calls(server)
    cursors: dict[str, str] = {}
    seen = [
        (entry_id, wire) async for entry_id, wire in read_history(client, KEYS, cursors, page=page)
    ]
    assert [decode_event(wire).id for _, wire in seen] == expected
    ids = [tuple(map(int, entry_id.split("-"))) for entry_id, _ in seen]
    assert ids == sorted(ids)
    # One call per page: a stream of L entries takes L // page + 1 reads (the
    # last one short, or empty), however long the history.
    assert _xrange_calls(server) - before == sum(n // page + 1 for n in lengths.values())
    for key in KEYS:
        last = await client.xrevrange(key, count=1)
        assert cursors[key] == (last[0][0].decode() if last else "0-0")
    await client.aclose()


@pytest.mark.anyio
async def test_history_read_in_part_reads_only_the_first_pages(server: RedisServer) -> None:
    _fill(server, 20_000, text=20)
    client = aioredis.Redis.from_url(server.url)
    before = _xrange_calls(server)
    history = read_history(client, KEYS, page=64)
    firsts = [await anext(history) for _ in range(3)]
    await history.aclose()
    assert len(firsts) == 3
    assert _xrange_calls(server) - before == len(KEYS)  # the first page of each, no more
    await client.aclose()


@pytest.mark.anyio
async def test_follow_goes_on_where_history_ended(server: RedisServer) -> None:
    old = _fill(server, 500)
    client = aioredis.Redis.from_url(server.url)
    cursors: dict[str, str] = {}
    assert len([item async for item in read_history(client, KEYS, cursors, page=7)]) == 500
    assert await read_new(client, cursors, 0.05) == []
    new = _fill(server, 40)
    got = await read_new(client, cursors, 1.0)
    assert sorted(decode_event(wire).id for _, wire in got) == sorted(e.id for e in new)
    order = [tuple(map(int, entry_id.split("-"))) for entry_id, _ in got]
    assert order == sorted(order)
    assert await read_new(client, cursors, 0.05) == []
    # From the end: none of the history, only what comes next.
    ends = await read_ends(client, KEYS)
    assert await read_new(client, ends, 0.05) == []
    newer = _fill(server, 3)
    got = await read_new(client, ends, 1.0)
    assert sorted(decode_event(wire).id for _, wire in got) == sorted(e.id for e in newer)
    assert len(old) == 500
    await client.aclose()


# -- openstarry tail ----------------------------------------------------------------


def test_tail_count_on_a_long_history_prints_the_first_matches_at_once(
    server: RedisServer,
) -> None:
    """``tail --type 'OUTPUT:*' --count 2`` on 40,000 handled events prints two lines and stops.

    The defect: one unpaged ``XRANGE - +`` per stream, whose reply a busy
    server did not send in time (``redis.exceptions.TimeoutError`` and a
    60-line traceback). Here the server bounds a client's pending replies to
    2 MiB, as a server protects itself from a reader that asks too much: an
    unpaged read of a stream of 6,700 entries (over 3 MiB) is cut off.
    """
    _fill(server, 40_000)
    outputs = [e.id for e in _in_entry_order(server) if e.type.startswith("OUTPUT:")]
    client = _client(server)
    sizes = [[len(fields[b"e"]) for _, fields in client.xrange(key)] for key in KEYS]
    # One stream's whole history is over the bound; a page of every stream is under it.
    assert max(sum(stream) for stream in sizes) > 3 << 20
    assert sum(sum(stream[:256]) for stream in sizes) < 1 << 20
    client.config_set("client-output-buffer-limit", "normal 2mb 2mb 0")
    client.close()
    done = _tail(server, "--type", "OUTPUT:*", "--count", "2", "--timeout", "5")
    assert done.returncode == 0, done.stderr.decode()
    assert _ids(done) == outputs[:2]
    assert done.stderr == b""


def test_tail_since_a_time_an_entry_id_or_an_event(server: RedisServer) -> None:
    client = _client(server)
    base = 1_764_000_000_000  # 2025-11-24T16:00:00Z
    events = []
    for i in range(30):
        event = Event.new("OUTPUT:AGENT_MESSAGE", {"text": str(i)}, source="t", session_id=f"s{i}")
        events.append(event)
        # One entry a second, each in its session's stream, ids given: times are known.
        client.xadd(
            stream_key("openstarry", partition_of(f"s{i}", 8), 2),
            {"e": encode_event(event)},
            id=f"{base + 1000 * i}-0",
        )
    client.close()
    ids = [e.id for e in events]
    at = datetime.fromtimestamp((base + 20_000) / 1000, tz=timezone.utc)
    for since in (at.isoformat(), at.strftime("%Y-%m-%dT%H:%M:%SZ")):
        assert _ids(_tail(server, "--since", since, "--timeout", "0")) == ids[20:], since
    local = at.astimezone().replace(tzinfo=None).isoformat()  # no offset: local time
    assert _ids(_tail(server, "--since", local, "--timeout", "0")) == ids[20:]
    assert _ids(_tail(server, "--since", f"{base + 25_000}-0", "--timeout", "0")) == ids[25:]
    assert _ids(_tail(server, "--since", str(base + 25_001), "--timeout", "0")) == ids[26:]
    done = _tail(server, "--since", ids[9], "--count", "3", "--timeout", "0")
    assert _ids(done) == ids[10:13]  # the events after it


def test_tail_since_a_missing_event_says_so(server: RedisServer) -> None:
    _fill(server, 100)
    done = _tail(server, "--since", "no-such-event", "--timeout", "0")
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr.decode().strip() == (
        "openstarry tail: --since: no event 'no-such-event' in the bus's retained history"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "2026-13-45T10:00:00Z"], "not an ISO-8601 time: '2026-13-45T10:00:00Z'"),
        (["--since", "2026-11-27 nonsense"], "not an ISO-8601 time"),
        (["--since", " "], "give a time, a Redis entry id or an event id"),
        (["--since", f"{1 << 64}-0"], "parts are under 2**64"),
        (["--since", "1960-01-01T00:00:00Z"], "a time from 1970 on"),
        (["--since", "5-0", "--from-end"], "not allowed with argument --since"),
        (["--count", "0"], "at least 1, not 0"),
        (["--timeout", "-1"], "seconds are 0 or more"),
    ],
)
def test_tail_refuses_bad_arguments(args: list[str], message: str) -> None:
    done = subprocess.run(
        [*OPENSTARRY, "tail", "--bus", "redis://127.0.0.1:1/0", *args],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr.decode()
    assert b"Traceback" not in done.stderr


def test_tail_from_end_prints_only_new_events(server: RedisServer) -> None:
    old = {e.id for e in _fill(server, 20_000, text=20)}
    tail = subprocess.Popen(
        [*OPENSTARRY, "tail", "--bus", server.url, "--from-end", "--count", "1", "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    new: set[str] = set()
    try:
        # Publish until tail prints one (it may start reading after the first ones).
        deadline = time.monotonic() + 60
        while tail.poll() is None and time.monotonic() < deadline:
            new |= {e.id for e in _fill(server, 1)}
            time.sleep(0.1)
        out, err = tail.communicate(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert tail.returncode == 0, err.decode()
    lines = out.splitlines()
    assert len(lines) == 1
    assert decode_event(lines[0]).id in new
    assert decode_event(lines[0]).id not in old


def test_tail_into_a_closed_pipe_stops_quietly(server: RedisServer) -> None:
    _fill(server, 2_000)
    done = subprocess.run(
        [*OPENSTARRY[:1], "-c", _PIPE_CLOSED, server.url],
        capture_output=True,
        timeout=60,
    )
    assert json.loads(done.stdout) == {"status": 0, "stderr": ""}


# `openstarry tail | head -n 1`: the reader closes its end after one line.
_PIPE_CLOSED = """
import json, subprocess, sys
tail = subprocess.Popen([sys.executable, "-m", "openstarry.cli", "tail", "--bus", sys.argv[1],
                         "--timeout", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
tail.stdout.readline()
tail.stdout.close()
err = tail.stderr.read().decode()
print(json.dumps({"status": tail.wait(), "stderr": err}))
"""
