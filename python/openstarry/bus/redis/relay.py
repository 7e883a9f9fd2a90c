"""The relay of a Redis Cluster: effects committed in one partition, bound for another.

A handled entry's acknowledgement and its effects are committed by one script,
and on a cluster a script touches the keys of one partition only. An effect
bound for another partition (a handler that answers in another session) is
therefore appended to the committing partition's relay stream (``x``), with
the acknowledgement, atomically; the owner of that partition then publishes it
where it belongs, through that partition's outbox (deduplicated there by its
id, so a relay sent twice, by a consumer that died before it deleted the
entry, arrives once), and deletes it from the relay stream.
"""

from __future__ import annotations

import anyio

from openstarry.bus.redis.keys import event_value
from openstarry.bus.redis.leases import Leases
from openstarry.bus.redis.outbox import Outboxes
from openstarry.bus.redis.state import RETRYABLE, SLOT_MOVING, Streams, log
from openstarry.core import Event, decode_event

__all__: list[str] = []

#: Relay entries taken from a partition at a time.
_RELAY_BATCH = 256


class Relay:
    """Moves the owned partitions' relay streams into the partitions they name."""

    __slots__ = ("leases", "outboxes", "streams")

    def __init__(self, streams: Streams, outboxes: Outboxes, leases: Leases) -> None:
        self.streams = streams
        self.outboxes = outboxes
        self.leases = leases

    async def run(self) -> None:
        streams = self.streams
        idle = 0.0
        while not streams._stopping:
            owned = sorted(self.leases.owned)
            try:
                moved = await self._relay(owned) if owned else 0
            except (*RETRYABLE, *SLOT_MOVING) as exc:
                streams.reconnects += 1
                log.warning("redis: %s; relaying again", exc)
                moved = 0
                idle = 0.1
            if moved:
                idle = 0.0
                await anyio.sleep(0)
            else:
                idle = min(0.05, max(0.002, idle * 2))
                await anyio.sleep(idle)

    async def _relay(self, owned: list[int]) -> int:
        streams = self.streams
        client = streams._client
        layout = streams.layout
        pipe = client.pipeline(transaction=False)
        for p in owned:
            pipe.xrange(layout.relay(p), "-", "+", count=_RELAY_BATCH)
        moved = 0
        for p, entries in zip(owned, await pipe.execute(), strict=True):
            if not entries:
                continue
            events: list[Event] = []
            for _, fields in entries:
                try:
                    events.append(decode_event(event_value(fields)))
                except ValueError:  # written by the flush script from an encoded event
                    log.error("redis: an undecodable relay entry in partition %d, dropped", p)
            if events:
                await self.outboxes.asend_many(events, relay=True)
            await client.xdel(layout.relay(p), *[entry for entry, _ in entries])
            moved += len(entries)
        return moved
