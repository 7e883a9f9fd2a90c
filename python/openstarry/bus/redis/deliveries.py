"""The deliveries: the entries fetched (or reclaimed) for this consumer, fed to the bus,
held until the bus is done with them, then acknowledged, retried or dead-lettered."""

from __future__ import annotations

import contextlib
import operator
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio

from openstarry.bus.redis.keys import PRIORITIES, as_text, event_field, event_value
from openstarry.bus.redis.leases import Leases
from openstarry.bus.redis.outbox import EVENT_OF, READ_AHEAD, WIRE_OF, Outbox, Outboxes
from openstarry.bus.redis.records import Delivery
from openstarry.bus.redis.state import RETRYABLE, SLOT_MOVING, Streams, log, redis_errors
from openstarry.core import Event, EventQueue, Ingestor, encode_event

__all__: list[str] = []


class Deliveries:
    """The entries delivered to this consumer: fetched or reclaimed, fed to the bus,
    held until the bus says they are done."""

    __slots__ = (
        "finished",
        "held",
        "ingestor",
        "leases",
        "next_sweep",
        "outbox",
        "partitions_read",
        "reader",
        "reading",
        "scratch",
        "streams",
    )

    def __init__(self, streams: Streams, outbox: Outbox | Outboxes, leases: Leases) -> None:
        self.streams = streams
        self.outbox = outbox
        self.leases = leases
        #: The stream's own record of what it holds (cleared in place, never replaced).
        self.held: dict[Event, Delivery] = streams.held
        self.scratch = EventQueue(None)
        self.ingestor = Ingestor(self.scratch, None)
        #: The fetch connection's client id, for ``CLIENT UNBLOCK`` at a stop.
        self.reader: int | None = None
        #: Whether a read is on its way (sent, not yet answered).
        self.reading = False
        #: The partitions the reads on their way name: a lease is not freed while a
        #: read could still deliver its partition's entries here (they would be held
        #: by a consumer that no longer owns them, and its successor reclaimed before).
        self.partitions_read: frozenset[int] = frozenset()
        #: Set when the fetcher has stopped: no read of its can deliver more.
        self.finished = anyio.Event()
        #: When (``time.monotonic()``) the owned partitions are next swept for
        #: entries left pending with nobody to run them (:meth:`sweep`).
        self.next_sweep = time.monotonic() + streams.claim_idle

    async def create_groups(self) -> None:
        streams = self.streams
        pipe = streams._client.pipeline(transaction=False)
        for p in range(streams.partitions):
            for key in streams.layout.streams(p):
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
        op = self.outbox.publish_op(event)
        if delivery.effects is None:
            delivery.effects = [op]
        else:
            delivery.effects.append(op)
        return True

    def done(self, event: Event, outcome: str) -> None:
        delivery = self.held.pop(event, None)
        if delivery is not None:
            self.settle(event, delivery, outcome)

    def settle(self, event: Event, delivery: Delivery, outcome: str) -> None:
        """What becomes of a delivery the bus is done with."""
        outbox = self.outbox
        if delivery.lease is None:
            # Its partition's lease was lost: its new owner runs it; nothing is said of it here.
            self.streams._durable.committed(delivery)
            return
        if outcome == "handled":
            if delivery.effects or delivery.state:
                outbox.commit(delivery)
            else:
                outbox.ack(delivery)
            self._twins_done(delivery)
            return
        # A failed or handed-back attempt commits nothing: its effects and state go with it.
        delivery.effects = None
        if delivery.state is not None:
            self.streams._durable.committed(delivery)
            delivery.state = None
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

    def _twins_done(self, delivery: Delivery) -> None:
        """Acknowledge the entries that held the same envelope as a settled delivery."""
        twins = delivery.twins
        if twins:
            delivery.twins = None
            outbox = self.outbox
            for twin in twins:
                outbox.ack(twin)
            self.streams.twins += len(twins)

    def feed(self, items: Sequence[tuple[Event, Delivery]]) -> None:
        bus = self.streams._bus
        if bus is None or not items or bus.closed:
            return  # not fed: left pending, reclaimed by the partition's next owner
        held = self.held
        fresh = list(map(EVENT_OF, items))
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
                    elif delivery.lease is not None:
                        # Reclaimed by this consumer under the lease it holds now (taken
                        # again): its commit names that one.
                        first.lease = delivery.lease
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
                with contextlib.suppress(*RETRYABLE):
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
            if self.streams.cluster:
                await self._fetch_from_nodes()
            else:
                await self._fetch()
        finally:
            self.reading = False
            self.finished.set()

    async def _readable(self) -> list[int] | None:
        """The partitions to read now, or ``None`` (after a pause, or a reclaim) to ask again:
        the bus holds enough, this consumer holds ``max_held``, or it owns none."""
        streams = self.streams
        bus = streams._bus
        leases = self.leases
        if bus is None or len(bus) >= streams.batch or len(self.held) >= streams.max_held:
            await anyio.sleep(0.001)
            return None
        if leases.reclaim:
            await streams._retrying(lambda: self.reclaim_partition(leases.reclaim[0]))
            leases.reclaim.popleft()
            return None
        if time.monotonic() >= self.next_sweep:
            await streams._retrying(self.sweep)
            self.next_sweep = time.monotonic() + streams.claim_idle
            return None
        readable = sorted(leases.owned - leases.draining)
        if not readable:
            await anyio.sleep(0.05)
            return None
        return readable

    async def _fetch(self) -> None:
        streams = self.streams
        bus = streams._bus
        assert bus is not None
        leases = self.leases
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
                    readable = await self._readable()
                    if readable is None:
                        continue
                    if readable != reading:
                        reading = readable
                        self.partitions_read = frozenset(readable)
                        # Priority first: a reply lists the streams in this order, so
                        # a batch arrives as the Ingestor orders it (see deliver).
                        layout = streams.layout
                        keys = [layout.stream(p, r) for r in PRIORITIES for p in readable]
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
                except RETRYABLE as exc:
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
                    (stream, entry, fields[1] if fields[0] == b"e" else event_field(fields))
                    for stream, stream_entries in (
                        reply.items() if isinstance(reply, dict) else reply
                    )
                    for entry, fields in stream_entries
                ]
                if (
                    len(entries) >= READ_AHEAD
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
                    except RETRYABLE:
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

    async def _fetch_from_nodes(self) -> None:
        """:meth:`_fetch` on a Redis Cluster: one read per owned partition (its six
        streams share its slot), sent in one pipeline, one batch per node, all
        nodes at once. Reads do not block (a blocked read would hold its node's
        batch): when a round brings nothing, the next waits 1 ms, doubling up to
        50 ms while the partitions stay empty. Each read goes to the node the
        client's slot map names at that moment, so reads follow a slot moved (a
        resharding, a failover: ``MOVED``, and ``ASK`` while it moves); a read
        that fails (its slot half moved: ``TRYAGAIN``) is read again the next
        round, and the others' entries are delivered meanwhile."""
        streams = self.streams
        bus = streams._bus
        assert bus is not None
        client = streams._client
        idle = 0.0
        failing = False  # said once while reads keep failing
        while not streams._stopping:
            readable = await self._readable()
            if readable is None:
                continue
            count = max(16, -(-streams.batch // len(readable)))
            layout = streams.layout
            self.partitions_read = frozenset(readable)
            self.reading = True
            try:
                pipe = client.pipeline(transaction=False)
                for p in readable:
                    keys = layout.streams(p)
                    pipe.execute_command(
                        *("XREADGROUP", "GROUP", streams.group, streams.consumer),
                        *("COUNT", count, "STREAMS", *keys),
                        *([">"] * len(keys)),
                        target_nodes=client.get_node_from_key(keys[0]),
                    )
                # Each read answers for itself: one that fails must not drop the
                # entries the others delivered to this consumer (they would wait,
                # pending and unread, until a sweep found them).
                replies = await pipe.execute(raise_on_error=False)
                self.reading = False
            except (*RETRYABLE, *SLOT_MOVING) as exc:
                self.reading = False
                streams.reconnects += 1
                log.warning("redis: %s; reading again", exc)
                await anyio.sleep(0.1)
                continue
            except redis_errors.ResponseError as exc:
                self.reading = False
                if "NOGROUP" in str(exc):  # the streams were deleted under us
                    await streams._retrying(self.create_groups)
                    continue
                raise
            failed = [reply for reply in replies if isinstance(reply, Exception)]
            if failed:
                replies = [reply for reply in replies if not isinstance(reply, Exception)]
                await self._failed_reads(failed, failing)
            failing = bool(failed)
            entries = [
                (stream, entry, event_value(fields))
                for reply in replies
                if reply
                for stream, stream_entries in (reply.items() if isinstance(reply, dict) else reply)
                for entry, fields in stream_entries
            ]
            if not entries:
                idle = min(0.05, max(0.001, idle * 2))
                await anyio.sleep(0.05 if failing else idle)
                continue
            idle = 0.0
            self.feed(self.deliver(entries, attempts=None))
            await anyio.sleep(0)

    async def _failed_reads(self, failed: list[Exception], failing: bool) -> None:
        """Reads of a round that failed: read again next round (said once while they keep
        failing); streams deleted under us are made again; any other error is raised."""
        streams = self.streams
        for exc in failed:
            if "NOGROUP" in str(exc):  # the streams were deleted under us
                await streams._retrying(self.create_groups)
            elif not isinstance(exc, (*RETRYABLE, *SLOT_MOVING)):
                raise exc
        streams.reconnects += 1
        (log.debug if failing else log.warning)(
            "redis: %d reads failed (%s); reading them again", len(failed), failed[0]
        )

    async def reclaim_partition(self, partition: int) -> None:
        """Take every entry still pending in a partition just acquired (its previous
        owner died or stopped). What was handled is not pending: its XACK was
        committed with its effects."""
        streams = self.streams
        client = streams._client
        group, consumer = streams.group, streams.consumer
        for key in streams.layout.streams(partition):
            stream = key.encode()
            cursor = "0-0"
            while True:
                reply = await client.xautoclaim(
                    key, group, consumer, min_idle_time=0, start_id=cursor, count=1000
                )
                cursor = as_text(reply[0])
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

    async def sweep(self) -> None:
        """Feed again what is pending in the owned partitions and held by nobody here.

        An entry can be left pending with nobody to run it: one whose run found its
        lease lost, or whose commit was refused, before this consumer took the
        partition back (a new epoch); one that a consumer frozen past its lease read
        after the partition was taken over. A partition's owner looks, every
        ``claim_idle``: each stream's pending count, by consumer, in one round trip,
        against what it holds; only a stream where they differ is read entry by entry.
        What it settled before the snapshot of what it holds is answered first (a
        second at most, else this sweep is skipped), so that nothing it handled is
        taken for stranded; the fetcher runs this between two reads, so that nothing
        is on its way to it either.
        """
        streams = self.streams
        leases = self.leases
        owned = sorted(leases.owned - leases.draining)
        if not owned:
            return
        holding: set[tuple[bytes, bytes]] = set()
        for delivery in self.held.values():
            holding.add((delivery.stream, delivery.entry))
            for twin in delivery.twins or ():
                holding.add((twin.stream, twin.entry))
        held_in = Counter(stream for stream, _ in holding)
        outbox = self.outbox
        outboxes = outbox.all if isinstance(outbox, Outboxes) else [outbox]
        marks = [o.settles for o in outboxes]
        with anyio.move_on_after(1.0):
            while not all(map(_settled, outboxes, marks)):
                await anyio.sleep(0.005)
        if not all(map(_settled, outboxes, marks)):
            return  # the flushes are slow (Redis is): the next sweep
        client = streams._client
        group, consumer = streams.group, streams.consumer.encode()
        keys = [(p, key) for p in owned for key in streams.layout.streams(p)]
        pipe = client.pipeline(transaction=False)
        for _, key in keys:
            pipe.xpending(key, group)
        summaries = await pipe.execute()
        room = streams.max_held - len(self.held)
        for (p, key), summary in zip(keys, summaries, strict=True):
            stream = key.encode()
            by_consumer = {c["name"]: int(c["pending"]) for c in summary["consumers"]}
            mine = by_consumer.pop(consumer, 0)
            if room <= 0 or (not any(by_consumer.values()) and mine <= held_in[stream]):
                continue
            if not await leases.owns(p, leases.value.get(p)):
                continue  # lost meanwhile: its new owner sweeps it
            cursor = "-"
            while room > 0:
                page = await client.xpending_range(key, group, cursor, "+", 1000)
                if not page:
                    break
                cursor = "(" + as_text(page[-1]["message_id"])
                counts = {
                    row["message_id"]: int(row["times_delivered"]) + 1
                    for row in page
                    if (stream, row["message_id"]) not in holding
                }
                if counts:
                    ids = list(counts)[:room]
                    claimed = await client.xclaim(key, group, streams.consumer, 0, ids)
                    entries = [(stream, entry, fields.get(b"e", b"")) for entry, fields in claimed]
                    if entries:
                        streams.stranded += len(entries)
                        log.warning(
                            "redis: %d entries of %s were pending with nobody to run them; "
                            "running them",
                            len(entries),
                            key,
                        )
                        room -= len(entries)
                        self.feed(self.deliver(entries, attempts=counts))
                if len(page) < 1000:
                    break

    def deliver(
        self,
        entries: Sequence[tuple[bytes, bytes, bytes]],
        attempts: dict[bytes, int] | None,
    ) -> list[tuple[Event, Delivery]]:
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
            and all(map(operator.is_, map(encode_event, events), map(WIRE_OF, entries)))
        ):
            # A fresh read, in the order the Ingestor dispatches (priority first,
            # then as read): event i is entry i; first deliveries all.
            lease = self.leases.value.get
            partition_of_key = streams._partition_of_key
            return [
                (event, Delivery(stream, entry, lease(partition_of_key[stream])))
                for event, (stream, entry, _) in zip(events, entries, strict=True)
            ]
        return self._match(entries, attempts, result.invalid, events)

    def _match(
        self,
        entries: Sequence[tuple[bytes, bytes, bytes]],
        attempts: dict[bytes, int] | None,
        invalid_lines: Sequence[tuple[int, str]],
        events: list[Event],
    ) -> list[tuple[Event, Delivery]]:
        """:meth:`deliver`'s general case: each event found by its bytes."""
        streams = self.streams
        outbox = self.outbox
        invalid = {line for line, _ in invalid_lines} if invalid_lines else ()
        # An event keeps the very bytes it was decoded from: they find its entry
        # (a list only where one batch holds the same bytes twice).
        by_wire: dict[bytes, Any] = {}
        lease = self.leases.value.get
        partition_of_key = streams._partition_of_key
        for i, (stream, entry, wire) in enumerate(entries):
            delivery = Delivery(stream, entry, lease(partition_of_key[stream]))
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
        items: list[tuple[Event, Delivery]] = []
        for event in events:
            found = by_wire[encode_event(event)]
            delivery = found.pop(0) if type(found) is list else found
            if delivery.attempts >= max_deliveries:
                outbox.dead_letter(event, delivery, "delivered too many times")
                continue
            items.append((event, delivery))
        return items


def _settled(outbox: Outbox, mark: int) -> bool:
    """Whether every acknowledgement, commit and dead letter ``outbox`` queued before
    ``mark`` (a value of its ``settles``) has been answered by Redis: none waits, nor
    travels in a flush on its way."""
    if outbox.unacked and outbox.acks_from <= mark:
        return False
    if any(0 < op.settle <= mark for op in outbox.queue):
        return False
    return not any(0 < op.settle <= mark for ops, _ in outbox.flights for op in ops)
