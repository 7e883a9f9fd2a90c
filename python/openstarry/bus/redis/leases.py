"""The leases: the partitions this consumer owns, taken toward an even share of them,
renewed, and handed on when it stops or holds more than its share.

Each take of a lease is a new epoch (its value is ``consumer|epoch``, ``take.lua``):
the commits and journal writes of what was delivered under a lease name its value,
and Redis refuses them once the lease holds another, so a consumer frozen past its
lease and thawed changes nothing. Each lease also has a deadline on this process's
monotonic clock (when the renewal that last answered was sent, plus the lease's
time): before it, the lease is surely this consumer's, and :meth:`Leases.owns`
answers with no round trip; after it (a process that was frozen), it asks Redis.
"""

from __future__ import annotations

import math
import time
import zlib
from collections import deque

import anyio

from openstarry.bus.redis.state import RETRYABLE, Streams, log

__all__: list[str] = []


class Leases:
    """The partitions this consumer owns: taken toward an even share, renewed, handed on."""

    __slots__ = ("deadline", "draining", "lock", "owned", "reclaim", "streams", "value")

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        #: Held while leases are renewed, taken or freed: a stop frees them only
        #: once no balance is under way, and no balance takes one after.
        self.lock = anyio.Lock()
        self.owned: set[int] = set()
        #: Owned partitions beyond this consumer's share: freed once nothing of theirs is held.
        self.draining: set[int] = set()
        #: Partitions just taken, whose pending entries are still to be reclaimed.
        self.reclaim: deque[int] = deque()
        #: Each owned partition's lease value (``consumer|epoch``).
        self.value: dict[int, str] = {}
        #: Until when (``time.monotonic()``) each owned partition's lease surely holds.
        self.deadline: dict[int, float] = {}

    def clear(self) -> None:
        self.owned.clear()
        self.draining.clear()
        self.reclaim.clear()
        self.value.clear()
        self.deadline.clear()

    def key(self, partition: int) -> str:
        streams = self.streams
        return streams.layout.lease(streams.group, partition)

    def keys(self, partition: int) -> list[str]:
        """The lease of ``partition`` and its epoch counter, as the scripts take them."""
        streams = self.streams
        layout = streams.layout
        return [layout.lease(streams.group, partition), layout.epoch(streams.group, partition)]

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
        consumers = streams.layout.consumers(streams.group)
        pipe = client.pipeline(transaction=False)
        pipe.zadd(consumers, {consumer: now})
        pipe.zremrangebyscore(consumers, "-inf", now - ttl)
        pipe.zcard(consumers)
        live = max(1, (await pipe.execute())[2])
        for p in sorted(self.owned):
            value = self.value.get(p)
            if value is None:
                continue  # lost meanwhile (a run that found it so, while this one awaited)
            sent = time.monotonic()
            renewed = await scripts["renew"](
                keys=self.keys(p), args=[value, ttl, value.rpartition("|")[2]]
            )
            if renewed:
                self.deadline[p] = sent + streams.claim_idle
            elif self.value.get(p) == value:
                self.lost(p)
        share = math.ceil(partitions / live)
        if len(self.owned) < share:
            start = zlib.crc32(consumer.encode()) % partitions
            for i in range(partitions):
                p = (start + i) % partitions
                if len(self.owned) >= share:
                    break
                if p in self.owned:
                    continue
                sent = time.monotonic()
                taken = await scripts["take"](keys=self.keys(p), args=[consumer, ttl])
                if taken:
                    self.owned.add(p)
                    self.value[p] = taken.decode() if isinstance(taken, bytes) else str(taken)
                    self.deadline[p] = sent + streams.claim_idle
                    self.reclaim.append(p)
        elif len(self.owned) > share:
            for p in sorted(self.owned)[share:]:
                self.draining.add(p)
        held = streams.held
        partition_of_key = streams._partition_of_key
        deliveries = streams._deliveries
        for p in list(self.draining):
            if deliveries.reading and p in deliveries.partitions_read:
                continue  # a read on its way may still deliver its entries: next time
            if not any(partition_of_key[d.stream] == p for d in held.values()):
                # Its commits go first: they name this lease, refused once it is freed.
                await streams.flush()
                value = self.value.get(p)
                if value is not None:
                    await scripts["free"](keys=[self.key(p)], args=[value])
                self.forget(p)

    async def free(self) -> None:
        """Free every lease and leave the live consumers (a clean stop)."""
        streams = self.streams
        client = streams._client
        if client is None:
            return
        async with self.lock:
            try:
                for p, value in list(self.value.items()):
                    await streams._scripts["free"](keys=[self.key(p)], args=[value])
                await client.zrem(streams.layout.consumers(streams.group), streams.consumer)
            except RETRYABLE:
                pass  # the leases expire by themselves
            self.clear()

    def forget(self, p: int) -> None:
        """No longer own partition ``p`` (freed, or lost)."""
        self.owned.discard(p)
        self.draining.discard(p)
        self.value.pop(p, None)
        self.deadline.pop(p, None)

    def lost(self, p: int) -> None:
        """Partition ``p``'s lease was found to hold another value: what this consumer
        still holds of it is not its own any more (the new owner reclaims it, and this
        one's commits of it are refused); it is dropped, unanswered."""
        log.warning("redis: lost the lease of partition %d", p)
        self.forget(p)
        self.streams._durable.drop_partition(p)

    async def owns(self, partition: int, value: str | None) -> bool:
        """Whether the lease of ``partition`` still holds ``value``, so that what was
        delivered under it may be started: at once before the lease's deadline, else
        asked of Redis (a process that was frozen, a renewal that is late)."""
        if value is None or self.value.get(partition) != value:
            return False
        if time.monotonic() < self.deadline.get(partition, 0.0):
            return True
        streams = self.streams
        keys = self.keys(partition)
        owner, epoch = await streams._retrying(lambda: streams._client.mget(keys))
        if owner is not None and owner.decode() == value:
            return True  # (the deadline moves with the next renewal)
        if owner is None and epoch is not None and epoch.decode() == value.rpartition("|")[2]:
            return True  # lapsed, and nobody took it since: the next renewal takes it back
        if self.value.get(partition) == value:
            self.lost(partition)
        return False
