"""Reading a Redis Streams bus in entry-id order, a bounded page at a time (``openstarry tail``).

    client = connect("redis://localhost:6379/0")
    cursors: dict[str, str] = {}
    async for entry_id, wire in read_history(client, keys, cursors, start="1732700000000-0"):
        ...                                      # the retained history, oldest first
    entries = await read_new(client, cursors, 0.5)   # then what came after it

Rules it keeps:

- **No reply grows with the backlog.** Every call reads at most ``page``
  entries of each stream it names (``XRANGE key start + COUNT page``,
  ``XREAD COUNT page``): it costs the server O(log N + page) whether a stream
  holds ten entries or ten thousand, and its reply arrives well within the
  client's socket timeout on a busy server. (One ``XRANGE - +`` of a stream of
  10,000 entries, 48 times, is what made ``tail`` time out on a busy bus.)
- **History is merged as it is read.** Each stream holds one page in memory
  (at most ``streams x page`` entries in all, whatever the history's length);
  the smallest entry id among the pages' heads comes next; a stream's next
  page is read when its page runs out. The first pages of every stream come in
  one round trip (a pipeline), so the first entry is out at once, and a reader
  that stops early (``tail --count``) has read a few pages, not the history.
- **Cursors join history to follow.** ``cursors`` holds the last entry id taken
  from each stream (or the id just before ``start`` for a stream not read
  yet), so :func:`read_new` goes on exactly where :func:`read_history` ended:
  nothing twice, nothing skipped. Entry ids are ordered within a stream, not
  across streams: :func:`read_new` orders each reply's entries by id.

On a Redis Cluster (``redis+cluster://``, :func:`connect` answers a
``RedisCluster`` client) the same rules hold, and no command names keys of two
slots: the first pages are one pipeline of single-stream ``XRANGE`` s, which
the cluster client sends as one batch per node, concurrently (one round trip
per node); :func:`read_new` reads each partition's streams (one hash tag, one
slot) with one ``XREAD``, all of them in one pipeline whose commands name
their node (``target_nodes``, so the client does not ask the server where an
``XREAD``'s keys are: ``COMMAND GETKEYS`` would cost a round trip per
command). A cluster has no blocking read across slots, so :func:`read_new`
reads without blocking and, while nothing came, reads again every
:data:`POLL` seconds until its timeout.

The client must answer bytes in RESP2 (``decode_responses=False``, redis-py's
default protocol), as :func:`connect` and
:class:`~openstarry.bus.redis.RedisStreams` make it.
"""

from __future__ import annotations

import asyncio
import heapq
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff, NoBackoff
except ImportError as exc:  # pragma: no cover - exercised by the smoke test without extras
    raise ImportError(
        "reading the Redis bus needs redis-py with hiredis: pip install 'openstarry[redis]'"
    ) from exc

from openstarry.bus.redis.keys import (
    Layout,
    cluster_nodes,
    default_partitions,
    is_cluster_url,
    partitions_key,
)
from openstarry.errors import PartitionMismatch

__all__ = [
    "ERRORS",
    "PAGE",
    "POLL",
    "agree_on_partitions",
    "bus_layout",
    "connect",
    "entry_after",
    "entry_before",
    "parse_entry_id",
    "ping",
    "read_ends",
    "read_history",
    "read_new",
    "recorded_partitions",
]

#: Entries read from one stream per call: a call stays well under a millisecond
#: of server time, and 48 streams' pages (about 6 MB of envelopes) bound the memory.
PAGE = 256

#: The longest wait of one blocking read, under the client's socket timeout (5 s).
MAX_BLOCK = 2.0

#: Seconds between two reads of :func:`read_new` on a cluster while nothing comes.
POLL = 0.1

#: What a lost or unreachable Redis raises: a refused or lost connection, no
#: answer in time, and on a cluster no node to be reached, the cluster down
#: (while a failover is under way), or a slot between two masters (a
#: resharding: ``TRYAGAIN``, and redirections past the client's limit).
ERRORS: tuple[type[Exception], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.RedisClusterException,
    redis_errors.ClusterError,  # ClusterDownError, "TTL exhausted" (redirections)
    redis_errors.TryAgainError,
    redis_errors.AskError,  # MovedError too
)

#: What a read on a cluster answers while its slot moves between masters: read again.
_SLOT_MOVING = (
    redis_errors.TryAgainError,
    redis_errors.AskError,  # MovedError too: followed by the client, unless past its limit
    redis_errors.ClusterError,  # "TTL exhausted": redirections past the client's limit
)  # (ClusterDownError, a ClusterError too, is raised: the cluster is down)

_MAX_PART = (1 << 64) - 1
_ENTRY_ID = re.compile(r"(\d+)(?:-(\d+))?")


def parse_entry_id(text: str) -> tuple[int, int]:
    """``"ms-seq"`` (or ``"ms"``, seq 0) as a pair of integers.

    Raises:
        ValueError: not an entry id, or a part over 2**64 - 1.
    """
    match = _ENTRY_ID.fullmatch(text)
    if match is None:
        raise ValueError(f"not a Redis entry id (MS-SEQ): {text!r}")
    ms, seq = int(match[1]), int(match[2] or 0)
    if ms > _MAX_PART or seq > _MAX_PART:
        raise ValueError(f"a Redis entry id's parts are at most 2**64 - 1: {text!r}")
    return ms, seq


def entry_after(entry_id: str) -> str:
    """The smallest entry id greater than ``entry_id``."""
    ms, seq = parse_entry_id(entry_id)
    return f"{ms + 1}-0" if seq == _MAX_PART else f"{ms}-{seq + 1}"


def entry_before(entry_id: str) -> str:
    """The greatest entry id smaller than ``entry_id`` (``"0-0"`` stays ``"0-0"``)."""
    ms, seq = parse_entry_id(entry_id)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{_MAX_PART}" if ms else "0-0"


def connect(url: str, *, timeout: float = 5.0, retries: int = 3) -> Any:
    """A client for reading: connect and socket timeouts of ``timeout`` seconds.

    A failed call is retried ``retries`` times (50 ms to 1 s apart), so a
    blip does not end a long ``tail``; ``retries=0`` reports it at once. A
    ``redis+cluster://host:port[,host:port...]`` URL gives a
    ``redis.asyncio.cluster.RedisCluster`` with the same settings, its nodes
    as the seeds (no connection is made before the first command).

    Raises:
        ValueError: a cluster URL without a valid node, or with an unknown option.
    """
    backoff = ExponentialBackoff(cap=1.0, base=0.05) if retries else NoBackoff()
    if is_cluster_url(url):
        nodes, options = cluster_nodes(url)
        try:
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                decode_responses=False,
                socket_connect_timeout=timeout,
                socket_timeout=timeout,
                retry=Retry(backoff, retries),
                **{key: _option(value) for key, value in options.items()},
            )
        except TypeError as exc:
            raise ValueError(f"Redis Cluster URL: an unknown option: {exc}") from None
    return aioredis.Redis.from_url(
        url,
        decode_responses=False,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(backoff, retries),
    )


async def ping(url: str, timeout: float = 5.0) -> None:
    """Connect to ``url`` and ``PING`` it once, within ``timeout`` seconds.

    Raises:
        redis.exceptions.ConnectionError: refused, unknown host, closed.
        redis.exceptions.TimeoutError: no answer within ``timeout``.
    """
    client = connect(url, timeout=timeout, retries=0)
    try:
        await client.ping()
    except redis_errors.RedisClusterException as exc:
        # No seed answered ("Redis Cluster cannot be connected"): as one server's refusal.
        raise redis_errors.ConnectionError(str(exc)) from exc
    finally:
        await client.aclose()


async def agree_on_partitions(client: Any, layout: Layout, *, record: bool = True) -> None:
    """Check that the bus at ``client`` has ``layout.partitions`` partitions.

    The first process of a bus records its count (``record``; a reader such
    as ``tail`` does not); every later one must give the same, since a
    session's partition is ``crc32(sessionId) % partitions``: a worker with
    another count would fetch some sessions' inputs and never see the others'.

    Raises:
        openstarry.errors.PartitionMismatch: the bus records another count.
    """
    if record:
        await client.set(layout.partitions_key(), layout.partitions, nx=True)
    count = await recorded_partitions(client, layout.name)
    if count is None or count == layout.partitions:
        return
    raise PartitionMismatch(
        f"the bus {layout.name!r} has {count} partitions, not {layout.partitions}: "
        f"give --partitions {count} (every process of a bus must agree)",
        recorded=count,
        given=layout.partitions,
    )


async def recorded_partitions(client: Any, name: str) -> int | None:
    """The partition count the bus called ``name`` recorded at its first use, if any."""
    value = await client.get(partitions_key(name))
    return None if value is None else int(value)


async def bus_layout(client: Any, url: str, name: str, partitions: int | None) -> Layout:
    """The layout of the bus a reader (``tail``, ``bus info``) is pointed at.

    ``partitions`` given must be the bus's own; not given, the bus's recorded
    count is taken (the default of the bus's kind for a bus never used).

    Raises:
        openstarry.errors.PartitionMismatch: ``partitions`` is not the bus's count.
    """
    recorded = await recorded_partitions(client, name)
    count = partitions or recorded or default_partitions(url)
    layout = Layout(name, count, cluster=is_cluster_url(url))
    await agree_on_partitions(client, layout, record=False)
    return layout


def _option(value: Any) -> Any:
    """A ``?option=value`` of a cluster URL as redis-py takes it: a bool, a number or text."""
    if not isinstance(value, str):
        return value
    lowered = value.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def _wire(fields: Any) -> bytes:
    wire: bytes = fields.get(b"e", b"") if isinstance(fields, dict) else b""
    return wire


async def read_history(
    client: Any,
    keys: Sequence[str],
    cursors: dict[str, str] | None = None,
    *,
    start: str = "-",
    page: int = PAGE,
) -> AsyncGenerator[tuple[str, bytes], None]:
    """The entries of ``keys`` from ``start`` on, oldest first: ``(entry id, wire bytes)``.

    Args:
        client: A redis-py asyncio client answering bytes.
        keys: The streams, read together and merged by entry id.
        cursors: Filled with the last entry id taken from each stream (the id
            just before ``start`` where none was), for :func:`read_new`.
        start: ``"-"`` (the oldest entry) or an entry id ``MS-SEQ`` (``MS``
            alone is ``MS-0``): entries at or after it, in every stream.
        page: Entries read from one stream per call.
    """
    if page < 1:
        raise ValueError(f"page must be >= 1, not {page}")
    lowest = "0-0" if start == "-" else "{}-{}".format(*parse_entry_id(start))
    if cursors is None:
        cursors = {}
    before = entry_before(lowest)
    for key in keys:
        cursors[key] = before
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.xrange(key, lowest, "+", count=page)
        first: list[Any] = await pipe.execute()
    pages: list[deque[Any]] = [deque(entries) for entries in first]
    more = [len(entries) == page for entries in first]
    heads = [(*_order(entries[0][0]), i) for i, entries in enumerate(pages) if entries]
    heapq.heapify(heads)
    while heads:
        i = heads[0][2]
        entries = pages[i]
        entry, fields = entries.popleft()
        entry_id = entry.decode()
        cursors[keys[i]] = entry_id
        yield entry_id, _wire(fields)
        if not entries and more[i]:
            # The smallest head ran out: its stream's next entry may come before
            # every other head, so it is read before the merge goes on.
            entries.extend(await client.xrange(keys[i], entry_after(entry_id), "+", count=page))
            more[i] = len(entries) == page
        if entries:
            heapq.heapreplace(heads, (*_order(entries[0][0]), i))
        else:
            heapq.heappop(heads)


async def read_ends(client: Any, keys: Iterable[str]) -> dict[str, str]:
    """The last entry id of each stream (``"0-0"`` for an empty or missing one), in one round trip.

    As cursors for :func:`read_new`: only entries added from now on.
    """
    keys = list(keys)
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.xrevrange(key, "+", "-", count=1)
        last: list[Any] = await pipe.execute()
    return {
        key: entries[0][0].decode() if entries else "0-0"
        for key, entries in zip(keys, last, strict=True)
    }


async def read_new(
    client: Any,
    cursors: dict[str, str],
    timeout: float,
    *,
    page: int = PAGE,
    full: set[str] | None = None,
) -> list[tuple[str, bytes]]:
    """Entries added after the ``cursors``, ordered by id: at most ``page`` per stream.

    Waits up to ``timeout`` seconds (at most :data:`MAX_BLOCK`) when there are
    none yet; the cursors move past what is returned. ``full``, when given, is
    filled with the streams that returned a whole page (more may follow).
    """
    if isinstance(client, RedisCluster):
        reply = await _read_cluster(client, cursors, timeout, page)
    else:
        block = max(1, int(min(timeout, MAX_BLOCK) * 1000))
        reply = await client.xread(dict(cursors), count=page, block=block)
    found: list[tuple[int, int, bytes, bytes]] = []
    for stream, entries in reply or ():
        for entry, fields in entries:
            found.append((*_order(entry), entry, _wire(fields)))
        if entries:
            name = stream.decode() if isinstance(stream, bytes) else stream
            cursors[name] = entries[-1][0].decode()
            if full is not None and len(entries) >= page:
                full.add(name)
    found.sort(key=lambda item: item[:2])
    return [(entry.decode(), wire) for _, _, entry, wire in found]


async def _read_cluster(
    client: Any, cursors: dict[str, str], timeout: float, page: int
) -> list[Any]:
    """:func:`read_new`'s ``XREAD`` on a cluster: one per slot, in one pipeline, polled."""
    await client.initialize()  # get_node_from_key needs the slot map (a no-op once known)
    slots: dict[int, list[str]] = {}
    for key in cursors:
        slots.setdefault(client.keyslot(key), []).append(key)
    deadline = time.monotonic() + min(timeout, MAX_BLOCK)
    while True:
        async with client.pipeline() as pipe:
            for keys in slots.values():
                pipe.execute_command(
                    "XREAD",
                    "COUNT",
                    page,
                    "STREAMS",
                    *keys,
                    *(cursors[key] for key in keys),
                    target_nodes=client.get_node_from_key(keys[0]),
                )
            # A read whose slot is half moved (a resharding: TRYAGAIN) gives nothing this
            # round, and its cursors stay: read again at the next poll; the others' count.
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for answer in replies:
            if isinstance(answer, Exception) and (
                not isinstance(answer, _SLOT_MOVING)
                or isinstance(answer, redis_errors.ClusterDownError)
            ):
                raise answer
        reply = [
            stream
            for streams in replies
            if streams and not isinstance(streams, Exception)
            for stream in streams
        ]
        left = deadline - time.monotonic()
        if reply or left <= 0:
            return reply
        await asyncio.sleep(min(POLL, left))
