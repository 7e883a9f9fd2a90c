"""The leases: the partitions this consumer owns, taken toward an even share of them,
renewed, and handed on when it stops or holds more than its share."""

from __future__ import annotations

import math
import time
import zlib
from collections import deque
from typing import Any

import anyio

from openstarry.bus.redis.state import _RETRY, Streams, log

__all__: list[str] = []


class _Leases:
    """The partitions this consumer owns: taken toward an even share, renewed, handed on."""

    __slots__ = ("draining", "lock", "owned", "reclaim", "streams")

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

    def clear(self) -> None:
        self.owned.clear()
        self.draining.clear()
        self.reclaim.clear()

    def key(self, partition: int) -> str:
        streams = self.streams
        return streams.layout.lease(streams.group, partition)

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
        held = streams.held
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
            await client.zrem(streams.layout.consumers(streams.group), streams.consumer)
        except _RETRY:
            pass  # the leases expire by themselves
        self.owned.clear()
