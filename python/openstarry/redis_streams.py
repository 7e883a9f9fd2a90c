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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import os
import random
import socket
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import sniffio

from openstarry.core import Event, EventQueue, Ingestor, encode_event
from openstarry.errors import QueueClosed, QueueFull

if TYPE_CHECKING:
    from openstarry.bus import EventBus

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised by the smoke test without extras
    raise ImportError(
        "the Redis bus needs redis-py with hiredis: pip install 'openstarry[redis]'"
    ) from exc

__all__ = ["RedisStreams", "partition_of", "stream_key"]

log = logging.getLogger("openstarry.redis_streams")

PRIORITIES = range(6)

#: Errors after which a connection is retried with backoff.
_RETRY = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    OSError,
)

# One script per flush: publishes ("P"), commits ("C": a handled entry's XACK and
# the effects of its handling), acknowledgements ("A": handled entries without
# effects, one XACK per stream) and dead letters ("D"), in order, atomically.
# Their fields travel in one blob, a msgpack array of strings (a few arguments per
# flush, not thousands: the client's per-argument encoding dominated; the script
# reads it with one cmsgpack.unpack, not field by field); every key shares the
# hash tag of the one declared key, so a Redis Cluster keeps them on its node.
#
# The group's pending-entries list is the record of what is not yet handled: a
# commit's XACK answers 0 when the entry was acknowledged before (by this
# consumer's retried flush, or by another consumer that ran it too), and then
# the commit publishes nothing.
#
# The duplicate window: the ids published in each `window` ms live in one hash
# ({name}:ids:B, B = server time / window); an id is known while it is in the
# current or the previous hash, so for at least `window` ms and less than twice
# that. The whole flush looks its ids up in two HMGETs and records the new ones
# in one HSET (a key per id would cost a write and an expiry each).
_FLUSH = r"""
local call, byte = redis.call, string.byte
local window = tonumber(ARGV[1])
local maxlen = tonumber(ARGV[2])
local token = ARGV[3]
local group = ARGV[4]
local ops = ARGV[5]
local prefix = ARGV[6]
local producer = ARGV[8]
-- A flush sent before this producer heard that an earlier one was refused for a
-- full stream has its new publishes refused: publishes keep their order.
local hold = prefix .. 'hold:' .. producer
local flush = tonumber(ARGV[9])
local held = call('GET', hold)
local blocked = held and tonumber(held) > tonumber(ARGV[10])
local refused = false
-- Every operation's fields, one flat msgpack array of strings (one C call to read).
local t = cmsgpack.unpack(ARGV[7])
local out = {}

-- Each operation's code and where its fields start, gathering the ids to look up.
local codes = {byte(ops, 1, -1)}
local starts = {}
local ids, nids = {}, 0
local known = {}
local P, C, A = byte('P'), byte('C'), byte('A')
local k = 1
for i = 1, #codes do
  local op = codes[i]
  starts[i] = k
  if op == P then -- id, stream, wire, the publish's own number
    local id = t[k]
    if known[id] == nil then
      known[id] = false
      nids = nids + 1
      ids[nids] = id
    end
    k = k + 4
  elseif op == C then -- stream, entry, n, then n times id, stream, wire
    local n = tonumber(t[k + 2])
    k = k + 3
    for j = 1, n do
      local id = t[k]
      if known[id] == nil then
        known[id] = false
        nids = nids + 1
        ids[nids] = id
      end
      k = k + 3
    end
  elseif op == A then -- stream, entry ids joined by commas
    k = k + 2
  else -- 'D': stream, entry, wire, reason
    k = k + 4
  end
end

local now = call('TIME')
local bucket = math.floor((tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)) / window)
local current = prefix .. 'ids:' .. bucket
local previous = prefix .. 'ids:' .. (bucket - 1)
for c = 1, nids, 1000 do
  local last = math.min(c + 999, nids)
  local a = call('HMGET', current, unpack(ids, c, last))
  local b = call('HMGET', previous, unpack(ids, c, last))
  for j = 1, last - c + 1 do
    local v = a[j] or b[j]
    if v then known[ids[c + j - 1]] = v end
  end
end

-- The bound counts what is not handled yet: past maxlen, the entries every
-- group has handled go first (whole nodes of the stream, oldest first, down to
-- 90 %; entry by entry when no whole node could go). Each entry is trimmed
-- once, and a stream full of unhandled entries costs a few O(1) commands to
-- find so, once per stream and flush: no scan, whatever the backlog.
local function trim(skey, len)
  local ok, groups = pcall(call, 'XINFO', 'GROUPS', skey)
  if not ok or #groups == 0 then return len end
  local safe = nil
  local sms, sseq
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    local cand
    local p = call('XPENDING', skey, f['name'])
    if tonumber(p[1]) > 0 then
      cand = p[2]
    else
      local ms, seq = string.match(f['last-delivered-id'], "^(%d+)-(%d+)$")
      cand = ms .. '-' .. (tonumber(seq) + 1)
    end
    local cms, cseq = string.match(cand, "^(%d+)-(%d+)$")
    cms, cseq = tonumber(cms), tonumber(cseq)
    if safe == nil or cms < sms or (cms == sms and cseq < sseq) then
      safe, sms, sseq = cand, cms, cseq
    end
  end
  local need = len - math.floor(maxlen * 0.9)
  local freed = call('XTRIM', skey, 'MINID', '~', safe, 'LIMIT', need)
  if freed == 0 then freed = call('XTRIM', skey, 'MINID', safe) end
  return len - freed
end

-- Stream lengths, read once per script and kept up to date; a stream found full
-- is not looked at again in this flush.
local lens, full = {}, {}
local function has_room(skey)
  local len = lens[skey]
  if len == nil then len = call('XLEN', skey) end
  if len >= maxlen and not full[skey] then
    len = trim(skey, len)
    if len >= maxlen then full[skey] = true end
  end
  lens[skey] = len
  return len < maxlen
end

local fresh, nfresh = {}, 0

for i = 1, #codes do
  local op = codes[i]
  local f = starts[i]
  if op == P then
    local id = t[f]
    local seen = known[id]
    local skey = t[f + 1]
    local mine = producer .. '#' .. t[f + 3]
    local len = lens[skey]
    if seen == mine then
      out[i] = 1 -- this very publish, sent again (its answer was lost): accepted then
      known[id] = true -- a second time in this flush is a duplicate
    elseif seen then
      out[i] = 0
    elseif blocked then
      out[i] = -1
    elseif (len and len < maxlen) or has_room(skey) then
      call('XADD', skey, '*', 'e', t[f + 2])
      lens[skey] = lens[skey] + 1
      known[id] = true
      nfresh = nfresh + 2
      fresh[nfresh - 1] = id
      fresh[nfresh] = mine
      out[i] = 1
    else
      out[i] = -1
      refused = true
    end
  elseif op == C then
    -- Never refused for room: the effects of a handled entry are appended with
    -- its acknowledgement, so a full stream can always drain.
    if call('XACK', t[f], group, t[f + 1]) == 0 then
      out[i] = -2 -- acknowledged before: its effects were committed then
    else
      local n = tonumber(t[f + 2])
      local fresh_effects = 0
      for j = 1, n do
        local e = f + 3 * j
        local id, skey = t[e], t[e + 1]
        if not known[id] then
          if lens[skey] == nil or lens[skey] >= maxlen then has_room(skey) end
          call('XADD', skey, '*', 'e', t[e + 2])
          lens[skey] = lens[skey] + 1
          known[id] = true
          nfresh = nfresh + 2
          fresh[nfresh - 1] = id
          fresh[nfresh] = token
          fresh_effects = fresh_effects + 1
        end
      end
      out[i] = fresh_effects
    end
  elseif op == A then
    local entries = {}
    for entry in string.gmatch(t[f + 1], '[^,]+') do entries[#entries + 1] = entry end
    local n = 0
    for c = 1, #entries, 1000 do
      n = n + call('XACK', t[f], group, unpack(entries, c, math.min(c + 999, #entries)))
    end
    out[i] = n
  else -- 'D': dead letter, unless acknowledged before
    if call('XACK', t[f], group, t[f + 1]) == 1 then
      call('XADD', prefix .. 'dead', '*', 'e', t[f + 2], 'reason', t[f + 3],
        'stream', t[f], 'entry', t[f + 1])
      out[i] = 1
    else
      out[i] = 0
    end
  end
end

for c = 1, #fresh, 1000 do
  call('HSET', current, unpack(fresh, c, math.min(c + 999, #fresh)))
end
if refused then
  call('SET', hold, flush, 'PX', 600000)
end
if #fresh > 0 then
  call('PEXPIREAT', current, (bucket + 2) * window)
  -- Freed in the background: a window's ids may be many.
  call('UNLINK', prefix .. 'ids:' .. (bucket - 2))
end
return out
"""

# Renew a lease; one that lapsed while no other consumer took it is taken back
# (this consumer was only slow: what it holds is still its own).
_RENEW = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""

_FREE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def partition_of(session_id: str, partitions: int) -> int:
    """The partition of a session: the same in every process (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % partitions


def stream_key(name: str, partition: int, priority: int) -> str:
    """The stream of one partition at one priority."""
    return f"{{{name}}}:s:{partition}:{priority}"


class _Delivery:
    """One stream entry delivered to this consumer, until it is done."""

    __slots__ = ("attempts", "effects", "entry", "stream", "twins")

    def __init__(self, stream: bytes, entry: bytes) -> None:
        self.stream = stream
        self.entry = entry
        self.attempts = 0
        #: What its handling published, held back until its commit (made on the first).
        self.effects: list[_Outgoing] | None = None
        #: Other entries that hold the same envelope, delivered while this one
        #: was held: the same event, acknowledged with this one once it is
        #: handled or dead-lettered (made on the first).
        self.twins: list[_Delivery] | None = None


class _Outgoing:
    """One operation waiting for the next flush: its code and its fields, encoded."""

    __slots__ = ("accepted", "blob", "effects", "fields", "op", "waiter")

    def __init__(self, op: str, blob: bytes, fields: int, effects: int = 0) -> None:
        self.op = op
        self.blob = blob
        #: The fields the blob holds.
        self.fields = fields
        #: The publishes a commit carries; the entries an acknowledgement carries;
        #: a publish's 1.
        self.effects = effects
        #: Who awaits the answer of a publish, and the answer.
        self.waiter: _Answers | None = None
        self.accepted = False


class _Answers:
    """The answers awaited by one ``asend`` or ``asend_many``: one signal for them all."""

    __slots__ = ("left", "signal")

    def __init__(self, left: int) -> None:
        self.left = left
        self.signal = anyio.Event()

    def answered(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.signal.set()


#: msgpack's header of a string of each length up to 255 (fixstr, then str 8).
_SHORT = [bytes((0xA0 | n,)) if n < 32 else bytes((0xD9, n)) for n in range(256)]


def _head(n: int) -> bytes:
    """msgpack's header of a string of ``n`` bytes."""
    if n < 256:
        return _SHORT[n]
    if n < 65536:
        return b"\xda" + n.to_bytes(2, "big")
    return b"\xdb" + n.to_bytes(4, "big")


def _array(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items."""
    return bytes((0x90 | n,)) if n < 16 else b"\xdd" + n.to_bytes(4, "big")


def _fields(*fields: bytes | str) -> bytes:
    """Fields for the flush script's blob: a msgpack string each."""
    out = []
    for f in fields:
        b = f.encode("utf-8", "surrogatepass") if isinstance(f, str) else f
        out.append(_head(len(b)))
        out.append(b)
    return b"".join(out)


#: The wire bytes of a fetched entry ``(stream, entry id, wire)``.
_WIRE = operator.itemgetter(2)
#: The event of a delivered ``(event, delivery)``.
_EVENT = operator.itemgetter(0)

#: Sessions whose partition the outbox remembers, at most.
_SESSIONS = 4096

#: Events a flush script carries at most: its publishes and the effects of its
#: commits (an acknowledgement counts one per stream). A script holds Redis's one
#: thread while it runs: at a few microseconds an event, this keeps each call
#: around a millisecond, so that no other client's command waits long behind it.
_FLUSH_EVENTS = 256
#: Events the first flush after a refusal carries (a probe: cheap for Redis when
#: the streams are still full); each flush answered without a refusal doubles it,
#: up to :data:`_FLUSH_EVENTS`.
_PROBE_EVENTS = 16
#: The pause after a flush refused for a full stream: exponential, from
#: ``_BACKOFF_MIN`` to ``_BACKOFF_MAX`` seconds, with full jitter (each pause is
#: drawn between none and that), so that waiting producers do not retry in step.
_BACKOFF_MIN = 0.002
_BACKOFF_MAX = 0.1
#: Seconds a flush's answer may take before its connection is taken for lost
#: (the flush is then sent again, and answered as it was the first time).
_FLUSH_TIMEOUT = 30.0
#: Events ``asend_many`` prepares before it lets a flush start on what it has.
_PREPARE = 512
#: Entries a read must bring for the next read to be sent before they are
#: dispatched (a few are dispatched sooner than a read travels; reading ahead
#: of them would only delay their handlers).
_READ_AHEAD = 32


class _Outbox:
    """What this process sends, in order, until the flush script has answered for it.

    Publishes, commits (a handled entry's XACK with the effects of its handling)
    and dead letters wait in one queue; handled entries without effects wait
    by stream, to be acknowledged with one XACK per stream. One task runs them
    through the flush script, up to 1,024 operations at a time. The counts are
    the backend's.
    """

    __slots__ = (
        "acks",
        "bases",
        "flushed",
        "flushes",
        "in_flight",
        "keys",
        "limit",
        "numbered",
        "queue",
        "streams",
        "unacked",
        "wake",
    )

    def __init__(self, streams: RedisStreams) -> None:
        self.streams = streams
        self.queue: deque[_Outgoing] = deque()
        #: Handled entries without effects, by stream, waiting for their XACK.
        self.acks: dict[bytes, list[bytes]] = {}
        self.unacked = 0
        self.wake: anyio.Event = anyio.Event()
        self.flushed: anyio.Event = anyio.Event()
        self.in_flight = 0  # operations taken by the flush under way
        self.flushes = 0
        #: The stream keys, by partition * 6 + priority, as the blob carries them.
        self.keys = [
            _fields(stream_key(streams.name, p, r))
            for p in range(streams.partitions)
            for r in PRIORITIES
        ]
        #: The first of each recent session's stream keys in :attr:`keys`.
        self.bases: dict[str, int] = {}
        #: Publishes numbered so far: a publish's number tells the flush script
        #: that an id recorded under it is this very publish, sent again.
        self.numbered = 0
        #: Events the next flush may carry (less than :data:`_FLUSH_EVENTS` after a refusal).
        self.limit = _FLUSH_EVENTS

    def publish(self, event: Event) -> _Outgoing:
        """A publish: the event's fields and the publish's own number."""
        op = self.publish_op(event)
        self.numbered = number = self.numbered + 1
        digits = b"%d" % number
        op.op = "P"
        op.blob = b"".join((op.blob, _SHORT[len(digits)], digits))
        op.fields = 4
        op.effects = 1
        return op

    def publish_op(self, event: Event) -> _Outgoing:
        """An event's fields (id, stream, wire bytes), as a commit carries its effects."""
        session = event.session_id
        base = self.bases.get(session)
        if base is None:
            base = self._base(session)
        event_id = event.id.encode("utf-8", "surrogatepass")
        wire = encode_event(event)
        n, m = len(event_id), len(wire)
        blob = b"".join(
            (
                _SHORT[n] if n < 256 else _head(n),
                event_id,
                self.keys[base + event.priority],
                _SHORT[m] if m < 256 else _head(m),
                wire,
            )
        )
        return _Outgoing("E", blob, 3)

    def _base(self, session: str) -> int:
        """Where a session's streams start in :attr:`keys` (remembered for the next)."""
        partition = zlib.crc32(session.encode("utf-8", "surrogatepass")) % self.streams.partitions
        bases = self.bases
        if len(bases) >= _SESSIONS:
            bases.clear()  # a bound, not a cache policy: recomputing is cheap
        base = bases[session] = partition * 6
        return base

    def _wake(self) -> None:
        wake = self.wake
        if not wake.is_set():
            wake.set()

    def send(self, event: Event) -> None:
        buffer = self.streams.buffer
        if len(self.queue) >= buffer:
            raise QueueFull(f"the Redis bus's outgoing buffer holds {buffer} events")
        self.queue.append(self.publish(event))
        self._wake()

    async def asend(self, event: Event) -> bool:
        while len(self.queue) >= self.streams.buffer:
            await self.flush()
        op = self.publish(event)
        answers = op.waiter = _Answers(1)
        self.queue.append(op)
        self._wake()
        await answers.signal.wait()
        return op.accepted

    async def asend_many(self, events: Sequence[Event]) -> list[bool]:
        answers = _Answers(len(events))
        ops = []
        outgoing = self.queue
        buffer = self.streams.buffer
        publish = self.publish
        for i, event in enumerate(events):
            if len(outgoing) >= buffer:
                self._wake()
                while len(outgoing) >= buffer:
                    await self.flush()
            elif i and i % _PREPARE == 0:
                # Let the flusher send what is ready while the rest is prepared.
                self._wake()
                await anyio.sleep(0)
            op = publish(event)
            op.waiter = answers
            outgoing.append(op)
            ops.append(op)
        self._wake()
        if ops:
            await answers.signal.wait()
        return [op.accepted for op in ops]

    async def flush(self) -> None:
        while (self.queue or self.unacked or self.in_flight) and self.streams._client is not None:
            flushed = self.flushed
            self._wake()
            await flushed.wait()

    def _take(self) -> list[_Outgoing]:
        """The operations of the next flush: the oldest waiting, then the acknowledgements.

        They carry at most :attr:`limit` events (at least one operation).
        """
        outgoing = self.queue
        ops: list[_Outgoing] = []
        room = self.limit
        while outgoing and (room > 0 or not ops):
            op = outgoing.popleft()
            ops.append(op)
            room -= op.effects or 1
        if self.unacked:
            acks, self.acks, self.unacked = self.acks, {}, 0
            for stream, entries in acks.items():
                blob = _fields(stream, b",".join(entries))
                ops.append(_Outgoing("A", blob, 2, len(entries)))
        return ops

    async def run(self) -> None:
        """Flush what waits, whenever something does.

        Up to two flush scripts are in flight on a connection of their own:
        Redis runs one while the next travels. A flush sent again (its answer
        was lost, or Redis lost the script) keeps its token and its place, and
        each of its publishes its number, so it is answered as it was the first
        time. When a flush is refused for a full stream, the publishes of the
        flush sent behind it are refused by the server too (this producer's
        hold key), and both go back to the front of the queue in order: what is
        published keeps its order. While the streams still take some of each
        flush, the next carries about as much as they took, after a
        millisecond; when they took none, the flusher pauses (exponential
        backoff with full jitter, 2 ms to 100 ms) and sends a small flush first
        (a probe), so that waiting costs Redis next to nothing. Each flush
        answered without a refusal doubles the next one's size, back to the
        full size.
        """
        streams = self.streams
        outgoing = self.queue
        client = streams._client
        pool = client.connection_pool
        sha = streams._scripts["flush"].sha
        dead = streams._key("dead")
        conn = await pool.get_connection()
        in_flight: deque[tuple[list[_Outgoing], Any]] = deque()
        refused: list[_Outgoing] = []
        heard = 0  # the last flush whose refusal this process has heard of
        broken = False
        backoff = 0.0  # the last pause's bound; 0 while no flush is refused
        taken = 0  # publishes accepted by the flushes answered with a refusal
        try:
            while True:
                while (
                    len(in_flight) < (2 if self.limit >= _FLUSH_EVENTS else 1)
                    and not refused
                    and (outgoing or self.unacked)
                ):
                    ops = self._take()
                    self.flushes += 1
                    args = self._args(ops, self.flushes, heard)
                    packed = conn.pack_command("EVALSHA", sha, 1, dead, *args)
                    in_flight.append((ops, packed))
                    self.in_flight += len(ops)
                    if not broken:
                        try:
                            await conn.send_packed_command(packed, check_health=False)
                        except _RETRY:
                            broken = True
                if not in_flight:
                    flushed, self.flushed = self.flushed, anyio.Event()
                    flushed.set()
                    self.wake = anyio.Event()
                    if not outgoing and not self.unacked:
                        await self.wake.wait()
                    continue
                ops, packed = in_flight[0]
                try:
                    if broken:
                        raise redis_errors.ConnectionError("the flush connection was lost")
                    results = await conn.read_response(timeout=_FLUSH_TIMEOUT)
                except (*_RETRY, redis_errors.NoScriptError) as exc:
                    streams.reconnects += 1
                    await self._send_again(conn, in_flight, exc)
                    broken = False
                    continue
                in_flight.popleft()
                self.in_flight -= len(ops)
                sent_before = streams.sent
                full = self._answer(ops, results)
                if full:
                    refused.extend(full)
                    heard = self.flushes  # every flush sent so far
                    taken += streams.sent - sent_before
                elif not refused:
                    backoff = 0.0
                    self.limit = min(_FLUSH_EVENTS, self.limit * 2)
                if refused and not in_flight:
                    # Back at the front, in order, and sent again: at once, as
                    # much as the streams just took, while they take some; after
                    # a pause growing with each flush they took none of, a probe.
                    outgoing.extendleft(reversed(refused))
                    streams.refused_full += len(refused)
                    refused = []
                    if taken:
                        backoff = 0.0
                        self.limit = max(_PROBE_EVENTS, min(_FLUSH_EVENTS, taken))
                        await anyio.sleep(_BACKOFF_MIN / 2)
                    else:
                        self.limit = _PROBE_EVENTS
                        backoff = min(_BACKOFF_MAX, max(_BACKOFF_MIN, backoff * 2))
                        streams.backoffs += 1
                        await anyio.sleep(random.uniform(0, backoff))
                    taken = 0
                flushed, self.flushed = self.flushed, anyio.Event()
                flushed.set()
        finally:
            self.in_flight = 0
            with anyio.CancelScope(shield=True):
                await conn.disconnect()
                await pool.release(conn)

    async def _send_again(
        self, conn: Any, in_flight: deque[tuple[Any, Any]], exc: Exception
    ) -> None:
        """Reconnect (with backoff) and send the flushes in flight again, in order."""
        streams = self.streams
        delay = 0.05
        while True:
            log.warning("redis: %s; sending %d flushes again", exc, len(in_flight))
            try:
                await conn.disconnect()
                if isinstance(exc, redis_errors.NoScriptError):
                    await streams._client.script_load(_FLUSH)
                for _, packed in in_flight:
                    await conn.send_packed_command(packed, check_health=False)
                return
            except _RETRY as again:
                exc = again
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _args(self, ops: list[_Outgoing], flush: int, heard: int) -> list[bytes | str | int]:
        streams = self.streams
        return [
            streams.window_ms,
            streams.maxlen,
            # Sent again as it is when its answer is lost: the same token.
            f"{streams.token}:{flush}",
            streams.group,
            "".join([op.op for op in ops]),
            streams._key(""),
            b"".join([_array(sum([op.fields for op in ops])), *[op.blob for op in ops]]),
            streams.token,
            flush,
            heard,
        ]

    def _answer(self, ops: list[_Outgoing], results: list[int]) -> list[_Outgoing]:
        """Count a flush's answers; returns the operations refused (a full stream)."""
        streams = self.streams
        full: list[_Outgoing] = []
        for op, result in zip(ops, results, strict=True):
            code = op.op
            if code == "P":
                if result == 1:
                    streams.sent += 1
                elif result == 0:
                    streams.duplicates += 1
                else:
                    full.append(op)
                    continue
                if op.waiter is not None:
                    op.accepted = result == 1
                    op.waiter.answered()
            elif code == "A":
                streams.acked += op.effects
                streams.skipped_handled += op.effects - result
            elif code == "C":  # never refused: a full stream must be able to drain
                streams.acked += 1
                if result == -2:
                    streams.skipped_handled += 1
                else:
                    streams.sent += result
                    streams.duplicates += op.effects - result
            else:  # "D": 0 when the entry was acknowledged before
                streams.dead_lettered += result
        return full

    def ack(self, delivery: _Delivery) -> None:
        """Acknowledge a handled delivery without effects (one XACK per stream and flush)."""
        entries = self.acks.get(delivery.stream)
        if entries is None:
            self.acks[delivery.stream] = [delivery.entry]
        else:
            entries.append(delivery.entry)
        self.unacked += 1
        if self.unacked == 1:  # else woken already: the flusher takes them all at once
            self._wake()

    def commit(self, delivery: _Delivery) -> None:
        """Commit a handled delivery: its XACK and its effects at once."""
        effects = delivery.effects or []
        blob = _fields(delivery.stream, delivery.entry, b"%d" % len(effects))
        blob = b"".join([blob, *[effect.blob for effect in effects]])
        delivery.effects = None
        self.queue.append(_Outgoing("C", blob, 3 + 3 * len(effects), len(effects)))
        self._wake()

    def dead_letter(
        self, event: Event | None, delivery: _Delivery, reason: str, wire: bytes = b""
    ) -> None:
        fields = _fields(
            delivery.stream,
            delivery.entry,
            encode_event(event) if event is not None else wire,
            reason,
        )
        self.queue.append(_Outgoing("D", fields, 4))
        self._wake()


class _Leases:
    """The partitions this consumer owns: taken toward an even share, renewed, handed on."""

    __slots__ = ("draining", "lock", "owned", "reclaim", "streams")

    def __init__(self, streams: RedisStreams) -> None:
        self.streams = streams
        #: Held while leases are renewed, taken or freed: a stop frees them only
        #: once no balance is under way, and no balance takes one after.
        self.lock = anyio.Lock()
        self.owned: set[int] = set()
        #: Owned partitions beyond this consumer's share: freed once nothing of theirs is held.
        self.draining: set[int] = set()
        #: Partitions just taken, whose pending entries are still to be reclaimed.
        self.reclaim: deque[int] = deque()

    def clear(self) -> None:
        self.owned.clear()
        self.draining.clear()
        self.reclaim.clear()

    def key(self, partition: int) -> str:
        streams = self.streams
        return streams._key(f"lease:{streams.group}:{partition}")

    async def run(self) -> None:
        """Balance every third of ``claim_idle`` until the backend stops."""
        streams = self.streams
        period = streams.claim_idle / 3
        while not streams._stopping:
            await streams._retrying(self.balance)
            await anyio.sleep(period)

    async def balance(self) -> None:
        """Renew this consumer's leases, then take or free partitions toward an even share."""
        async with self.lock:
            if not self.streams._stopping:
                await self._balance()

    async def _balance(self) -> None:
        streams = self.streams
        client = streams._client
        scripts = streams._scripts
        consumer = streams.consumer
        partitions = streams.partitions
        ttl = int(streams.claim_idle * 1000)
        now = int(time.time() * 1000)
        consumers = streams._key(f"consumers:{streams.group}")
        pipe = client.pipeline(transaction=False)
        pipe.zadd(consumers, {consumer: now})
        pipe.zremrangebyscore(consumers, "-inf", now - ttl)
        pipe.zcard(consumers)
        live = max(1, (await pipe.execute())[2])
        for p in sorted(self.owned):
            renewed = await scripts["renew"](keys=[self.key(p)], args=[consumer, ttl])
            if not renewed:
                log.warning("redis: lost the lease of partition %d", p)
                self.owned.discard(p)
        share = math.ceil(partitions / live)
        if len(self.owned) < share:
            start = zlib.crc32(consumer.encode()) % partitions
            for i in range(partitions):
                p = (start + i) % partitions
                if len(self.owned) >= share:
                    break
                if p in self.owned:
                    continue
                if await client.set(self.key(p), consumer, nx=True, px=ttl):
                    self.owned.add(p)
                    self.reclaim.append(p)
        elif len(self.owned) > share:
            for p in sorted(self.owned)[share:]:
                self.draining.add(p)
        held = streams._deliveries.held
        partition_of_key = streams._partition_of_key
        for p in list(self.draining):
            if not any(partition_of_key[d.stream] == p for d in held.values()):
                await scripts["free"](keys=[self.key(p)], args=[consumer])
                self.owned.discard(p)
                self.draining.discard(p)

    async def free(self) -> None:
        """Free every lease and leave the live consumers (a clean stop)."""
        streams = self.streams
        client = streams._client
        if client is None:
            return
        async with self.lock:
            await self._free(client)

    async def _free(self, client: Any) -> None:
        streams = self.streams
        try:
            for p in list(self.owned):
                await streams._scripts["free"](keys=[self.key(p)], args=[streams.consumer])
            await client.zrem(streams._key(f"consumers:{streams.group}"), streams.consumer)
        except _RETRY:
            pass  # the leases expire by themselves
        self.owned.clear()


class _Deliveries:
    """The entries delivered to this consumer: fetched or reclaimed, fed to the bus,
    held until the bus says they are done."""

    __slots__ = ("finished", "held", "ingestor", "reader", "reading", "scratch", "streams")

    def __init__(self, streams: RedisStreams) -> None:
        self.streams = streams
        self.held: dict[Event, _Delivery] = {}
        self.scratch = EventQueue(None)
        self.ingestor = Ingestor(self.scratch, None)
        #: The fetch connection's client id, for ``CLIENT UNBLOCK`` at a stop.
        self.reader: int | None = None
        #: Whether a read is on its way (sent, not yet answered).
        self.reading = False
        #: Set when the fetcher has stopped: no read of its can deliver more.
        self.finished = anyio.Event()

    async def create_groups(self) -> None:
        streams = self.streams
        pipe = streams._client.pipeline(transaction=False)
        for p in range(streams.partitions):
            for key in streams._streams_of(p):
                pipe.xgroup_create(key, streams.group, id="0", mkstream=True)
        for result in await pipe.execute(raise_on_error=False):
            if isinstance(result, Exception) and "BUSYGROUP" not in str(result):
                raise result

    def effect(self, event: Event, cause: Event | None) -> bool:
        """Hold ``event`` back as an effect of the delivery ``cause``, if it is one of ours."""
        if cause is None:
            return False
        delivery = self.held.get(cause)
        if delivery is None:
            return False
        op = self.streams._outbox.publish_op(event)
        if delivery.effects is None:
            delivery.effects = [op]
        else:
            delivery.effects.append(op)
        return True

    def done(self, event: Event, outcome: str) -> None:
        delivery = self.held.pop(event, None)
        if delivery is not None:
            self.settle(event, delivery, outcome)

    def settle(self, event: Event, delivery: _Delivery, outcome: str) -> None:
        """What becomes of a delivery the bus is done with."""
        outbox = self.streams._outbox
        if outcome == "handled":
            if delivery.effects:
                outbox.commit(delivery)
            else:
                outbox.ack(delivery)
            self._twins_done(delivery)
            return
        # A failed or handed-back attempt commits nothing: its effects go with it.
        delivery.effects = None
        if outcome == "failed":
            if delivery.attempts + 1 >= self.streams.max_deliveries:
                outbox.dead_letter(event, delivery, "handler failed")
                self._twins_done(delivery)
            else:
                # Delivered again at once, to keep the session's order.
                delivery.attempts += 1
                self.streams.retried += 1
                self.feed([(event, delivery)])
        # "returned": left pending; the partition's next owner reclaims it.

    def _twins_done(self, delivery: _Delivery) -> None:
        """Acknowledge the entries that held the same envelope as a settled delivery."""
        twins = delivery.twins
        if twins:
            delivery.twins = None
            outbox = self.streams._outbox
            for twin in twins:
                outbox.ack(twin)
            self.streams.twins += len(twins)

    def feed(self, items: Sequence[tuple[Event, _Delivery]]) -> None:
        bus = self.streams._bus
        if bus is None or not items or bus.closed:
            return  # not fed: left pending, reclaimed by the partition's next owner
        held = self.held
        fresh = list(map(_EVENT, items))
        size = len(held)
        if held.keys().isdisjoint(fresh):  # the common case, without a Python loop
            held.update(items)
            if len(held) != size + len(fresh):  # the batch holds one event twice
                for event in fresh:
                    held.pop(event, None)
        if len(held) != size + len(fresh):
            fresh = []
            for event, delivery in items:
                first = held.get(event)
                if first is not None:
                    # The same event held already: one delivery at a time, or its
                    # hold and effects would be lost. Another entry that holds the
                    # same envelope is answered with it (never left pending); the
                    # same entry (a reclaim of our own pending entry) is that one.
                    if first.entry != delivery.entry or first.stream != delivery.stream:
                        if first.twins is None:
                            first.twins = [delivery]
                        else:
                            first.twins.append(delivery)
                    continue
                held[event] = delivery
                fresh.append(event)
        if fresh:
            bus.feed(fresh)

    async def stop_reading(self) -> None:
        """Stop the fetcher, a read blocked in Redis included, and wait until it has.

        A blocking ``XREADGROUP`` still waiting in Redis would otherwise hand
        entries to this consumer after it freed its leases, and they would stay
        pending until the partition changed owner again: ``CLIENT UNBLOCK``
        ends it at once (what it delivered before is fed to the bus as usual).
        """
        client = self.streams._client
        while not self.finished.is_set():
            reader = self.reader
            if self.reading and reader is not None:
                # A lost connection: the fetcher sees the same error and stops.
                with contextlib.suppress(*_RETRY):
                    await client.client_unblock(reader)
            with anyio.move_on_after(0.05):
                await self.finished.wait()

    async def drain(self) -> None:
        """Wait (briefly) for what the bus holds of ours to be dispatched."""
        bus = self.streams._bus
        with anyio.move_on_after(5, shield=True):
            while bus is not None and self.held and len(bus) and not bus.closed:
                await anyio.sleep(0.01)

    async def run(self) -> None:
        """Fetch from the owned partitions whenever the bus runs low, reclaiming first.

        Reads go through a connection of their own, with the command packed
        once for the partitions owned (a read names every stream of them, and
        asks each for its share of ``batch`` entries, so that one read stays
        about ``batch`` entries of Redis's time whatever the partitions owned).
        When a read brings a batch (32 entries or more), the next read is sent
        before they are dispatched (one read ahead): its answer travels while
        the bus works.
        """
        try:
            await self._fetch()
        finally:
            self.reading = False
            self.finished.set()

    async def _fetch(self) -> None:
        streams = self.streams
        bus = streams._bus
        assert bus is not None
        leases = streams._leases
        low_water = streams.batch
        max_held = streams.max_held
        packed: Any = None
        reading: list[int] = []
        sent = False  # a read is on its way
        pool = streams._client.connection_pool
        conn = await pool.get_connection()
        try:
            while sent or not streams._stopping:
                if not sent:
                    if len(bus) >= low_water or len(self.held) >= max_held:
                        await anyio.sleep(0.001)
                        continue
                    if leases.reclaim:
                        await streams._retrying(lambda: self.reclaim_partition(leases.reclaim[0]))
                        leases.reclaim.popleft()
                        continue
                    readable = sorted(leases.owned - leases.draining)
                    if not readable:
                        await anyio.sleep(0.05)
                        continue
                    if readable != reading:
                        reading = readable
                        # Priority first: a reply lists the streams in this order, so
                        # a batch arrives as the Ingestor orders it (see deliver).
                        name = streams.name
                        keys = [stream_key(name, p, r) for r in PRIORITIES for p in readable]
                        count = max(16, -(-streams.batch // len(readable)))
                        packed = conn.pack_command(
                            *("XREADGROUP", "GROUP", streams.group, streams.consumer),
                            *("COUNT", count, "BLOCK", 500, "STREAMS"),
                            *keys,
                            *([">"] * len(keys)),
                        )
                try:
                    if not sent:
                        if self.reader is None:
                            await conn.send_command("CLIENT", "ID", check_health=False)
                            self.reader = int(await conn.read_response())
                        if streams._stopping:
                            continue
                        self.reading = True
                        await conn.send_packed_command(packed, check_health=False)
                    sent = False
                    reply = await conn.read_response()
                    self.reading = sent
                except redis_errors.ResponseError as exc:
                    self.reading = sent = False
                    if "NOGROUP" in str(exc):  # the streams were deleted under us
                        await streams._retrying(self.create_groups)
                        continue
                    raise
                except _RETRY as exc:
                    await conn.disconnect()
                    self.reader = None  # a new connection, a new id
                    self.reading = sent = False
                    streams.reconnects += 1
                    log.warning("redis: %s; reconnecting", exc)
                    await anyio.sleep(0.2)
                    continue
                if not reply:
                    continue
                # The reply as hiredis gives it (no dict per entry): by stream (a
                # map on RESP3, pairs on RESP2), [entry, [field, value, ...]] each;
                # "e" is the only field openstarry writes.
                entries = [
                    (stream, entry, fields[1] if fields[0] == b"e" else _field(fields))
                    for stream, stream_entries in (
                        reply.items() if isinstance(reply, dict) else reply
                    )
                    for entry, fields in stream_entries
                ]
                if (
                    len(entries) >= _READ_AHEAD
                    and not streams._stopping
                    and not leases.reclaim
                    and len(bus) < low_water
                    and len(self.held) < max_held
                    and sorted(leases.owned - leases.draining) == reading
                ):
                    try:
                        self.reading = True
                        await conn.send_packed_command(packed, check_health=False)
                        sent = True
                    except _RETRY:
                        self.reading = False
                        self.reader = None
                        await conn.disconnect()  # sent again, reconnected, next time
                self.feed(self.deliver(entries, attempts=None))
                # The bus dispatches what came before this task reads again.
                await anyio.sleep(0)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.disconnect()
                await pool.release(conn)

    async def reclaim_partition(self, partition: int) -> None:
        """Take every entry still pending in a partition just acquired (its previous
        owner died or stopped). What was handled is not pending: its XACK was
        committed with its effects."""
        streams = self.streams
        client = streams._client
        group, consumer = streams.group, streams.consumer
        for key in streams._streams_of(partition):
            stream = key.encode()
            cursor = "0-0"
            while True:
                reply = await client.xautoclaim(
                    key, group, consumer, min_idle_time=0, start_id=cursor, count=1000
                )
                cursor = _text(reply[0])
                entries = [
                    (stream, entry, fields.get(b"e", b"")) for entry, fields in reply[1] if fields
                ]
                deleted = reply[2] if len(reply) > 2 else []
                if deleted:
                    await client.xack(key, group, *deleted)
                if entries:
                    pending = await client.xpending_range(
                        key,
                        group,
                        min=entries[0][1],
                        max=entries[-1][1],
                        count=len(entries) + 1,
                        consumername=consumer,
                    )
                    counts = {p["message_id"]: int(p["times_delivered"]) for p in pending}
                    self.feed(self.deliver(entries, attempts=counts))
                if cursor == "0-0":
                    break

    def deliver(
        self,
        entries: Sequence[tuple[bytes, bytes, bytes]],
        attempts: dict[bytes, int] | None,
    ) -> list[tuple[Event, _Delivery]]:
        """Decode, check and order a fetched batch in one Ingestor call.

        ``entries`` are ``(stream, entry id, wire bytes)``; ``attempts``
        (deliveries so far, by entry) is given for reclaimed entries. Invalid
        envelopes and events delivered too often go to the dead-letter stream.
        Returns the events to dispatch, in dispatch order.
        """
        streams = self.streams
        scratch = self.scratch
        result = self.ingestor.ingest([wire for _, _, wire in entries])
        events = scratch.pop_many(len(scratch))
        streams.delivered += len(events)
        if (
            attempts is None
            and not result.invalid
            and len(events) == len(entries)
            # An event keeps the very bytes object it was decoded from.
            and all(map(operator.is_, map(encode_event, events), map(_WIRE, entries)))
        ):
            # A fresh read, in the order the Ingestor dispatches (priority first,
            # then as read): event i is entry i; first deliveries all.
            return [
                (event, _Delivery(stream, entry))
                for event, (stream, entry, _) in zip(events, entries, strict=True)
            ]
        return self._match(entries, attempts, result.invalid, events)

    def _match(
        self,
        entries: Sequence[tuple[bytes, bytes, bytes]],
        attempts: dict[bytes, int] | None,
        invalid_lines: Sequence[tuple[int, str]],
        events: list[Event],
    ) -> list[tuple[Event, _Delivery]]:
        """:meth:`deliver`'s general case: each event found by its bytes."""
        streams = self.streams
        outbox = streams._outbox
        invalid = {line for line, _ in invalid_lines} if invalid_lines else ()
        # An event keeps the very bytes it was decoded from: they find its entry
        # (a list only where one batch holds the same bytes twice).
        by_wire: dict[bytes, Any] = {}
        for i, (stream, entry, wire) in enumerate(entries):
            delivery = _Delivery(stream, entry)
            if invalid and i in invalid:
                outbox.dead_letter(None, delivery, "invalid envelope", wire)
                continue
            if attempts is not None:
                delivery.attempts = max(0, attempts.get(entry, 1) - 1)
            found = by_wire.get(wire)
            if found is None:
                by_wire[wire] = delivery
            elif type(found) is list:
                found.append(delivery)
            else:
                by_wire[wire] = [found, delivery]
        max_deliveries = streams.max_deliveries
        items: list[tuple[Event, _Delivery]] = []
        for event in events:
            found = by_wire[encode_event(event)]
            delivery = found.pop(0) if type(found) is list else found
            if delivery.attempts >= max_deliveries:
                outbox.dead_letter(event, delivery, "delivered too many times")
                continue
            items.append((event, delivery))
        return items


class RedisStreams:
    """A :class:`~openstarry.bus.BusBackend` on Redis Streams (see the module's rules).

    It holds the settings, the connection and the counters; three parts do the
    work: the outbox (what is sent, through the flush script), the leases (the
    partitions this consumer owns) and the deliveries (what was fetched or
    reclaimed, held until the bus is done with it).

    Args:
        url: ``redis://host:port/db`` (also ``rediss://``, ``unix://``).
        group: The consumer group: the consumers that share the work (default ``"openstarry"``).
        consumer: This consumer's name in the group (default: host name and process id).
        consume: Whether this bus consumes (a worker) or only publishes (a producer).
        name: The prefix of every key (the hash tag), to run several buses on one Redis.
        partitions: Partitions of the sessions (fixed for the life of the data).
        maxlen: Entries each stream holds at most.
        dedup_window: Seconds an id stays known to every producer, at least (and
            less than twice that: ids are kept in one hash per window).
        claim_idle: Seconds after which the partitions of a consumer that stopped
            renewing its leases are taken over, and their entries reclaimed.
        max_deliveries: Deliveries of an event whose handler keeps failing before
            it goes to the dead-letter stream.
        batch: Entries a read fetches, about (each stream read is asked for its share).
        buffer: Events waiting to be sent, at most (then ``publish`` raises ``QueueFull``).
        max_held: Events this consumer holds at most, fetched and not yet done
            (an agent's inputs waiting behind their session's run among them):
            it reads no more until it holds fewer. They wait in Redis instead.
    """

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        consumer: str | None = None,
        consume: bool = True,
        name: str = "openstarry",
        partitions: int = 8,
        maxlen: int = 10_000,
        dedup_window: float = 60.0,
        claim_idle: float = 10.0,
        max_deliveries: int = 3,
        batch: int = 256,
        buffer: int = 65_536,
        max_held: int = 65_536,
    ) -> None:
        if partitions < 1 or maxlen < 10 or max_deliveries < 1 or batch < 1 or max_held < 1:
            raise ValueError(
                "partitions, max_deliveries, batch and max_held must be >= 1, maxlen >= 10"
            )
        if not 0 < claim_idle <= 3600:
            raise ValueError(f"claim_idle must be in (0, 3600] seconds, not {claim_idle}")
        if not 0.001 <= dedup_window <= 86_400:
            raise ValueError(f"dedup_window must be in [0.001, 86400] seconds, not {dedup_window}")
        self.url = url
        self.group = group or "openstarry"
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.consume = consume
        self.name = name
        self.partitions = partitions
        self.maxlen = maxlen
        self.window_ms = int(dedup_window * 1000)
        self.claim_idle = claim_idle
        self.max_deliveries = max_deliveries
        self.batch = batch
        self.buffer = buffer
        self.max_held = max_held
        #: The partition of each stream key, as Redis replies name them.
        self._partition_of_key = {
            key.encode(): p for p in range(partitions) for key in self._streams_of(p)
        }
        #: Identifies this producer's flushes, so that a retried flush is not a duplicate.
        self.token = uuid.uuid4().hex[:16]
        self._client: Any = None
        self._bus: EventBus | None = None
        self._stopping = False
        self._scripts: dict[str, Any] = {}
        self._outbox = _Outbox(self)
        self._leases = _Leases(self)
        self._deliveries = _Deliveries(self)
        # Metrics.
        self.sent = 0
        self.duplicates = 0
        self.refused_full = 0
        self.backoffs = 0
        self.delivered = 0
        self.acked = 0
        self.skipped_handled = 0
        self.twins = 0
        self.retried = 0
        self.dead_lettered = 0
        self.reconnects = 0

    # -- keys ------------------------------------------------------------

    def _key(self, suffix: str) -> str:
        return f"{{{self.name}}}:{suffix}"

    def _streams_of(self, partition: int) -> list[str]:
        return [stream_key(self.name, partition, r) for r in PRIORITIES]

    # -- life ------------------------------------------------------------

    @asynccontextmanager
    async def running(self, bus: EventBus) -> AsyncIterator[RedisStreams]:
        """Connect, create the group (reading from the start), publish and consume for ``bus``."""
        if sniffio.current_async_library() != "asyncio":
            raise RuntimeError(
                "the Redis bus runs on asyncio only (redis-py's client does not run on "
                "trio); on trio use the local bus"
            )
        self._bus = bus
        self._stopping = False
        outbox, leases, deliveries = self._outbox, self._leases, self._deliveries
        outbox.wake = anyio.Event()
        outbox.flushed = anyio.Event()
        deliveries.finished = anyio.Event()
        deliveries.reader = None
        client = aioredis.Redis.from_url(
            self.url, decode_responses=False, health_check_interval=0, socket_keepalive=True
        )
        self._client = client
        try:
            self._scripts = {
                "flush": client.register_script(_FLUSH),
                "renew": client.register_script(_RENEW),
                "free": client.register_script(_FREE),
            }
            # The flusher sends the script by its hash: loaded before it starts.
            await self._retrying(functools.partial(client.script_load, _FLUSH))
            if self.consume:
                await self._retrying(deliveries.create_groups)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(outbox.run, name="openstarry.redis flusher")
                if self.consume:
                    tasks.start_soon(leases.run, name="openstarry.redis leases")
                    tasks.start_soon(deliveries.run, name="openstarry.redis fetcher")
                try:
                    yield self
                finally:
                    # Stop fetching (a read blocked in Redis too), let the bus
                    # dispatch what it holds (the bus drains after this context),
                    # hand back the rest, free leases.
                    self._stopping = True
                    if self.consume:
                        with anyio.move_on_after(10, shield=True):
                            await deliveries.stop_reading()
                    await deliveries.drain()
                    with anyio.move_on_after(10, shield=True):
                        await outbox.flush()
                        if self.consume:
                            await leases.free()
                    tasks.cancel_scope.cancel()
        finally:
            self._bus = None
            deliveries.held.clear()
            leases.clear()
            with anyio.move_on_after(2, shield=True):
                await client.aclose()
            self._client = None

    async def _retrying(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` until it succeeds, backing off on connection errors."""
        delay = 0.05
        while True:
            try:
                return await action()
            except _RETRY as exc:
                self.reconnects += 1
                log.warning("redis: %s; retrying in %.2f s", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)

    # -- publishing ------------------------------------------------------

    def send(self, event: Event, cause: Event | None = None) -> None:
        if self._client is None:
            raise QueueClosed("the Redis bus is not running: use `async with bus`")
        if self._deliveries.effect(event, cause):
            return
        self._outbox.send(event)

    async def asend(self, event: Event, cause: Event | None = None) -> bool:
        if self._client is None:
            raise QueueClosed("the Redis bus is not running: use `async with bus`")
        if self._deliveries.effect(event, cause):
            return True  # committed with its cause; a duplicate id is counted then
        return await self._outbox.asend(event)

    async def asend_many(self, events: Sequence[Event]) -> list[bool]:
        """:meth:`asend` for a batch: one wait for all their answers, in order."""
        if self._client is None:
            raise QueueClosed("the Redis bus is not running: use `async with bus`")
        return await self._outbox.asend_many(events)

    async def flush(self) -> None:
        await self._outbox.flush()

    # -- deliveries ------------------------------------------------------

    def done(self, event: Event, outcome: str) -> None:
        delivery = self._deliveries.held.pop(event, None)
        if delivery is None:
            return
        if outcome == "handled" and delivery.effects is None and delivery.twins is None:
            # The common case: handled without effects, acknowledged by stream.
            self._outbox.ack(delivery)
            return
        self._deliveries.settle(event, delivery, outcome)

    # -- reading the streams (openstarry tail) ---------------------------

    def history(
        self, cursors: dict[str, str] | None = None, *, start: str = "-"
    ) -> AsyncIterator[tuple[str, bytes]]:
        """The entries the streams retain, oldest first: ``(entry id, wire bytes)``.

        Read a page of each stream at a time and merged by entry id as it
        goes (:func:`openstarry.redis_reader.read_history`): the first entry
        comes after one round trip and memory stays bounded, whatever the
        length of the history.

        Args:
            cursors: Filled with the last entry id taken from each stream, for
                :meth:`follow`.
            start: ``"-"`` (the oldest) or an entry id ``MS-SEQ``: entries at
                or after it.
        """
        from openstarry.redis_reader import read_history

        keys = [key for p in range(self.partitions) for key in self._streams_of(p)]
        return read_history(self._reader(), keys, cursors, start=start)

    async def follow(self, cursors: dict[str, str], timeout: float) -> list[tuple[str, bytes]]:
        """Entries added after the ``cursors`` (the last entry id seen, by stream),
        waiting up to ``timeout`` seconds (2 at most); the cursors move past what
        is returned.

        Each stream has its own cursor (a stream missing from ``cursors`` is read
        from its start): entry ids are ordered within a stream, not across
        streams. A call returns at most a page (256 entries) per stream, in
        entry-id order.
        """
        from openstarry.redis_reader import read_new

        for p in range(self.partitions):
            for key in self._streams_of(p):
                cursors.setdefault(key, "0-0")
        return await read_new(self._reader(), cursors, timeout)

    def _reader(self) -> Any:
        if self._client is None:
            raise QueueClosed("the Redis bus is not running: use `async with bus`")
        return self._client

    # -- metrics ---------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "duplicates": self.duplicates,
            "refused_full": self.refused_full,
            "backoffs": self.backoffs,
            "delivered": self.delivered,
            "acked": self.acked,
            "skipped_handled": self.skipped_handled,
            "twins": self.twins,
            "retried": self.retried,
            "dead_lettered": self.dead_lettered,
            "reconnects": self.reconnects,
            "outgoing": len(self._outbox.queue),
            "holding": len(self._deliveries.held),
            "partitions": sorted(self._leases.owned),
        }


def _field(fields: Sequence[bytes]) -> bytes:
    """The ``e`` field of an entry's ``[field, value, ...]`` list (empty if none)."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == b"e":
            return fields[i + 1]
    return b""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
