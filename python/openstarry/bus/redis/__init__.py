"""The event bus over Redis Streams: many producers, many workers, one bus.

    async with EventBus.from_url("redis://localhost:6379/0", group="agents") as bus:
        bus.subscribe("INPUT:*", on_input)
        await bus.apublish(event)

Needs the ``[redis]`` extra (redis-py's asyncio client with hiredis) and runs
on asyncio (redis-py's client does not run on trio: entering the bus on trio
raises a ``RuntimeError`` that says so; the local bus runs on both).

Layout (every key shares the hash tag ``{name}``, so a Redis Cluster keeps them
on one node and the scripts stay atomic):

- ``{name}:s:P:R``: the stream of partition ``P`` (``crc32(sessionId) % partitions``)
  at priority ``R`` (0..5); each entry holds one envelope, the spec 002 wire
  bytes, under the field ``e``;
- ``{name}:ids:B``: the event ids published in the ``B``-th dedup window of
  the server's clock (a hash: id → the flush that published it);
- ``{name}:hold:PRODUCER``: the last flush of a producer refused for a full
  stream (the flushes it sent behind that one are refused too, to keep order);
- ``{name}:lease:GROUP:P``: which consumer of the group owns partition ``P``;
- ``{name}:consumers:GROUP``: the group's live consumers (a sorted set of heartbeats);
- ``{name}:dead``: the dead-letter stream.

Rules it keeps (spec 002 across processes):

- **Priority across the cluster.** A consumer reads every priority's stream
  in one ``XREADGROUP`` and the batch is decoded, checked and ordered by one
  Rust :class:`~openstarry.core.Ingestor` call; it fetches again only when what
  it holds runs low (reading at most one batch ahead of the one being
  dispatched), so a priority-0 event published behind a backlog overtakes
  the backlog still in Redis.
- **Idempotency across producers.** Publishing runs one Lua script that checks
  the ids and appends the entries atomically, the way JetStream's duplicate
  window works: a batch's ids are looked up in the current and the previous
  window's hash (two ``HMGET``), the new ones appended (``XADD``) and recorded
  (one ``HSET``), so an id is refused for at least ``dedup_window`` seconds
  after it was published, and less than twice that. The bus's local
  :class:`~openstarry.core.DedupWindow` is the cheap first filter.
- **At-least-once delivery, exactly-once effects.** An entry is
  acknowledged only once its handlers returned and every
  :meth:`~openstarry.bus.EventBus.hold` was released. What its handling
  published (its handlers', and a run's events: see
  :meth:`~openstarry.bus.EventBus.effects_of`) is held back in this process
  and committed by the same script that acknowledges the entry: all of it or
  none of it, whatever moment a ``kill -9`` strikes. The group's
  pending-entries list is the record of what is not yet handled: a handled
  entry is acknowledged, so it is never redelivered nor reclaimed; if two
  consumers ever run the same entry (a lease lost to a stalled process), the
  second commit's ``XACK`` answers that it was acknowledged before, and the
  commit publishes nothing. Handled entries without effects are acknowledged
  with one ``XACK`` per stream and flush. An attempt that failed (a handler
  raised) or was handed back commits nothing: its effects are dropped with it.
- **Per-session order.** A session's events live in one partition, and a
  partition is owned by one consumer of a group at a time (a lease renewed
  every third of ``claim_idle``): its events are handled in publish order (per
  priority) and never by two consumers at once; the partitions spread evenly
  over the live consumers.
- **Reclaim.** A consumer that dies stops renewing its leases; after
  ``claim_idle`` seconds (10 s by default) a live consumer takes the partition
  and ``XAUTOCLAIM`` s every entry still pending there. A consumer that stops
  cleanly hands back what it held and frees its leases at once.
- **Poison.** An event whose handler raises is delivered again, at most
  ``max_deliveries`` times (3) counting redeliveries after a crash; then it is
  moved to ``{name}:dead`` with the reason and acknowledged, and its session
  goes on. A retry is queued behind what this consumer already fetched at the
  event's priority: events of the same session and priority fetched before
  the failure (at most one read, ``batch`` entries per stream) are handled
  before the retry. Sessions whose order must hold across failures should
  not let handlers raise (the execution loop never does: a failed run ends
  in a ``KERNEL:ERROR`` and counts as handled).
- **Back-pressure, never silent loss.** Each stream holds at most ``maxlen``
  entries that a group has not handled (10,000: up to 480,000 events across
  the 8 partitions and 6 priorities). When a stream is full, the script trims
  only entries every group has handled (oldest first, whole nodes of the
  stream down to 90 %, or entry by entry when no whole node can go: each
  entry trimmed once, amortised O(1)); if none can go, the publish is refused,
  at the cost of a few O(1) commands, once per stream and flush (the flush
  sent behind a refused one has its publishes refused too, so publishes keep
  their order). The producer then pauses (exponential backoff from 2 ms to
  100 ms, with full jitter) and sends a small flush first, growing back as
  flushes pass: :meth:`~openstarry.bus.EventBus.apublish` waits,
  :meth:`~openstarry.bus.EventBus.publish` keeps the event in its bounded
  outgoing buffer (raising ``QueueFull`` when that is full). A commit is never
  refused: the effects of a handled entry go in with its acknowledgement
  whatever the streams' lengths, so the workers' own outputs can never block
  the acknowledgements that make room. Handled entries stay in the stream, the
  retained history ``openstarry tail`` prints, until this bound pushes them out.
- **Bounded work per call.** A flush script carries at most 256 events
  (publishes and commits' effects), about a millisecond of Redis's one
  thread; a read asks each stream for its share of ``batch`` entries.
- **Reconnects.** A lost connection (a Redis restart) is retried with
  exponential backoff (50 ms to 2 s); a flush whose answer was lost is sent
  again as it was: each publish carries its own number (the producer's token
  and a sequence number), recorded with its id, so a publish sent again (in
  the same flush or a later one) is answered accepted, not as a duplicate,
  while another publish of the same id is a duplicate; a retried commit finds
  its entry acknowledged already and publishes nothing twice.

The package, by seam: :mod:`~openstarry.bus.redis.streams` (the backend: settings,
connection, life), :mod:`~openstarry.bus.redis.outbox` (what is sent, through the
flush script), :mod:`~openstarry.bus.redis.leases` (the partitions this consumer
owns), :mod:`~openstarry.bus.redis.deliveries` (what was fetched, held until done),
:mod:`~openstarry.bus.redis.keys` (key names, partitions), the Lua scripts in
``scripts/*.lua`` (:mod:`~openstarry.bus.redis.lua`) and
:mod:`~openstarry.bus.redis.reader` (paging through the streams, for ``tail``).
It registers itself as the bus's backend for ``redis://``, ``rediss://``,
``unix://`` and ``redis+cluster://`` (``rediss+cluster://``) URLs (the
``openstarry.bus_backends`` entry points, and :func:`~openstarry.bus.register_backend`
when imported).
"""

from __future__ import annotations

from typing import Any

from openstarry._redisurl import REDIS_SCHEMES, check_redis_url
from openstarry.bus.backend import register_backend
from openstarry.bus.redis.keys import PRIORITIES, partition_of, stream_key
from openstarry.bus.redis.streams import RedisStreams

__all__ = ["PRIORITIES", "RedisStreams", "from_url", "partition_of", "stream_key"]

#: The URL schemes this backend serves.
SCHEMES = REDIS_SCHEMES


def from_url(
    url: str,
    *,
    group: str | None = None,
    consumer: str | None = None,
    consume: bool = True,
    **options: Any,
) -> RedisStreams:
    """The Redis Streams backend for ``url`` (what ``EventBus.from_url`` calls for ``redis://``).

    Raises:
        ValueError: a URL that cannot name a server: one that does not
            parse, a port out of range, a database that is not a number.
    """
    check_redis_url(url)
    return RedisStreams(url, group=group, consumer=consumer, consume=consume, **options)


register_backend(from_url, *SCHEMES)
