"""The Redis Streams backend of the bus: its settings, its connection and its life.

:class:`RedisStreams` holds what its three parts share (see
:mod:`openstarry.bus.redis` for the rules they keep): the outbox
(:mod:`~openstarry.bus.redis.outbox`), the leases
(:mod:`~openstarry.bus.redis.leases`) and the deliveries
(:mod:`~openstarry.bus.redis.deliveries`); and what runs write beside their effects,
fenced like their commits (:mod:`~openstarry.bus.redis.durable`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from openstarry.bus.backend import BusHost
from openstarry.bus.redis.deliveries import Deliveries
from openstarry.bus.redis.durable import Durable, RedisJournal
from openstarry.bus.redis.follow import Follower
from openstarry.bus.redis.keys import Layout, cluster_nodes, default_partitions, is_cluster_url
from openstarry.bus.redis.leases import Leases
from openstarry.bus.redis.lua import FLUSH, FREE, JOURNAL, RENEW, TAKE
from openstarry.bus.redis.outbox import Outbox, Outboxes
from openstarry.bus.redis.reader import agree_on_partitions, read_history, read_new
from openstarry.bus.redis.records import Delivery
from openstarry.bus.redis.relay import Relay
from openstarry.bus.redis.state import (
    RETRYABLE,
    SLOT_MOVING,
    aioredis,
    log,
    redis_errors,
    tls_refusal,
)
from openstarry.core import Event
from openstarry.errors import QueueClosed

__all__ = ["RedisStreams"]


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
        partitions: Partitions of the sessions (fixed for the life of the data):
            8 by default on one server, 24 on a cluster (``redis+cluster://``).
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
        min_replicas: Replicas that must hold a flush before its publishes are
            answered (``WAIT``, after each flush): an accepted publish then
            survives the loss of its master. 0 (the default) answers at once;
            Redis replicates asynchronously, so a failover may lose the last
            writes (see the Redis guide, "Failover and durability").
        replica_timeout: Seconds each ``WAIT`` waits for the replicas before it
            is sent again (publishes wait while fewer replicas answer).
    """

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        consumer: str | None = None,
        consume: bool = True,
        name: str = "openstarry",
        partitions: int | None = None,
        maxlen: int = 10_000,
        dedup_window: float = 60.0,
        claim_idle: float = 10.0,
        max_deliveries: int = 3,
        batch: int = 256,
        buffer: int = 65_536,
        max_held: int = 65_536,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        if partitions is None:
            partitions = default_partitions(url)
        if partitions < 1 or maxlen < 10 or max_deliveries < 1 or batch < 1 or max_held < 1:
            raise ValueError(
                "partitions, max_deliveries, batch and max_held must be >= 1, maxlen >= 10"
            )
        if not 0 <= min_replicas <= 16 or not 0.001 <= replica_timeout <= 60:
            raise ValueError("min_replicas must be in [0, 16], replica_timeout in [0.001, 60] s")
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
        self.min_replicas = min_replicas
        self.replica_timeout_ms = int(replica_timeout * 1000)
        self.cluster = is_cluster_url(url)
        if self.cluster:
            cluster_nodes(url)  # a URL without nodes is refused now, not at the first connection
        self.layout = Layout(name, partitions, cluster=self.cluster)
        #: The partition of each stream key, as Redis replies name them.
        self._partition_of_key = {
            key.encode(): p for p in range(partitions) for key in self.layout.streams(p)
        }
        #: Identifies this producer's flushes, so that a retried flush is not a duplicate.
        self.token = uuid.uuid4().hex[:16]
        self._client: Any = None
        self._bus: BusHost | None = None
        self._stopping = False
        self._scripts: dict[str, Any] = {}
        self.held: dict[Event, Delivery] = {}
        #: One outbox on one server; one per partition on a cluster (a script per partition).
        self._outbox: Outbox | Outboxes = Outboxes(self) if self.cluster else Outbox(self)
        self._leases = Leases(self)
        self._deliveries = Deliveries(self, self._outbox, self._leases)
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
        self.relayed = 0
        #: Commits refused because their partition's lease had moved on.
        self.fenced = 0
        #: Pending entries found held by nobody here (see ``Deliveries.sweep``), fed again.
        self.stranded = 0
        self._durable = Durable(self)
        #: Reads sessions' partitions outside the group (``openstarry.bus.follow_session``).
        self.follower = Follower(self)

    def _outboxes(self) -> list[Outbox]:
        outbox = self._outbox
        return outbox.all if isinstance(outbox, Outboxes) else [outbox]

    def _connect(self) -> Any:
        """A client of the server, or of the cluster (which finds each key's node)."""
        options: dict[str, Any] = {
            "decode_responses": False,
            "health_check_interval": 0,
            "socket_keepalive": True,
        }
        if not self.cluster:
            return aioredis.Redis.from_url(self.url, **options)
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes, url_options = cluster_nodes(self.url)
        del options["health_check_interval"]
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            **{**url_options, **options},
        )

    # -- life ------------------------------------------------------------

    @asynccontextmanager
    async def running(self, bus: BusHost) -> AsyncIterator[RedisStreams]:
        """Connect, create the group (reading from the start), publish and consume for ``bus``."""
        if not _on_asyncio():
            raise RuntimeError(
                "the Redis bus runs on asyncio only (redis-py's client does not run on "
                "trio); on trio use the local bus"
            )
        self._bus = bus
        self._stopping = False
        outbox, leases, deliveries = self._outbox, self._leases, self._deliveries
        for each in self._outboxes():
            each.wake = anyio.Event()
            each.flushed = anyio.Event()
        deliveries.finished = anyio.Event()
        deliveries.reader = None
        client = self._connect()
        self._client = client
        try:
            self._scripts = {
                "flush": client.register_script(FLUSH),
                "renew": client.register_script(RENEW),
                "free": client.register_script(FREE),
                "take": client.register_script(TAKE),
                "journal": client.register_script(JOURNAL),
            }
            if self.cluster:
                await self._retrying(client.initialize)  # the slots, before any node is named
            # Every process of a bus counts its partitions alike: recorded at first use.
            await self._retrying(functools.partial(agree_on_partitions, client, self.layout))
            # The flusher sends the script by its hash: loaded (on every master) before it starts.
            await self._retrying(functools.partial(client.script_load, FLUSH))
            await self._retrying(functools.partial(client.script_load, JOURNAL))
            if self.consume:
                await self._retrying(deliveries.create_groups)
            async with anyio.create_task_group() as tasks:
                for each in self._outboxes():
                    tasks.start_soon(each.run, name="openstarry.redis flusher")
                tasks.start_soon(self.follower.run, name="openstarry.redis follower")
                if self.consume:
                    tasks.start_soon(leases.run, name="openstarry.redis leases")
                    tasks.start_soon(self._durable.run, name="openstarry.redis journal")
                    if isinstance(outbox, Outboxes):
                        relay = Relay(self, outbox, leases)
                        tasks.start_soon(relay.run, name="openstarry.redis relay")
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
            self._durable.pending.clear()
            self._durable.steps.clear()
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
            except (*RETRYABLE, *SLOT_MOVING, redis_errors.RedisClusterException) as exc:
                refused = tls_refusal(exc)
                if refused is not None:  # no retry mends a certificate
                    where = (
                        "rediss+cluster://HOST:PORT[,...]" if self.cluster else "rediss://HOST:PORT"
                    )
                    raise redis_errors.ConnectionError(
                        f"redis: {refused}. With a CA of your own, name it in the URL: "
                        f"{where}?ssl_ca_certs=/path/to/ca.pem"
                    ) from exc
                if not isinstance(exc, (*RETRYABLE, *SLOT_MOVING)):
                    raise  # no seed node of the cluster answers (as before: not retried)
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

    def discard_unsent(self) -> int:
        """Drop the publishes not yet sent to Redis; returns how many (``publish`` on Ctrl-C).

        Those in flight are still answered; the dropped ones were never on
        the bus, and whoever awaits them is not answered.
        """
        dropped = 0
        for outbox in self._outboxes():
            dropped += len(outbox.queue)
            outbox.queue.clear()
        return dropped

    async def full_streams(self) -> list[tuple[str, int]]:
        """The streams at their bound (``maxlen``) and their lengths: what holds a producer back."""
        if self._client is None:
            raise QueueClosed("the Redis bus is not running: use `async with bus`")
        full = []
        for partition in range(self.partitions):
            for key in self.layout.streams(partition):
                length = int(await self._client.xlen(key))
                if length >= self.maxlen:
                    full.append((key, length))
        return full

    # -- deliveries ------------------------------------------------------

    def done(self, event: Event, outcome: str) -> None:
        delivery = self._deliveries.held.pop(event, None)
        if delivery is None:
            return
        if (
            outcome == "handled"
            and delivery.effects is None
            and delivery.twins is None
            and delivery.state is None
            and delivery.lease is not None
        ):
            # The common case: handled without effects, acknowledged by stream.
            self._outbox.ack(delivery)
            return
        self._deliveries.settle(event, delivery, outcome)

    # -- what runs write: state in the commit, journals, ownership ------

    def stage(self, event: Event, key: str, value: bytes, data: Any = None) -> bool:
        """Write ``key`` (``value``; empty: delete it) with the commit of ``event``, if it
        commits: only then, atomically with its acknowledgement and effects.

        Until the commit is answered, :meth:`staged` answers ``data`` for the key.
        Returns ``False`` when ``event`` is not a delivery this worker holds.

        Raises:
            LeaseLost: ``event`` was delivered under a lease that was lost since.
        """
        return self._durable.stage(event, key, value, data)

    def staged(self, key: str) -> tuple[bool, Any]:
        """``(True, data)`` while a write of ``key`` waits for its commit, else ``(False, _)``."""
        return self._durable.read(key)

    async def journal(self, event: Event, run_id: str | None = None) -> RedisJournal | None:
        """The journal of the run of ``event``, with the steps earlier attempts recorded.

        ``None`` for an event this worker does not hold (not delivered here).
        ``run_id`` names another input of the same session whose journal ``event``'s
        handling writes to (an approval's answer, for the run waiting for it).

        Raises:
            LeaseLost: the lease ``event`` was delivered under holds another worker
                now (this one was frozen, or cut off, past it): it must not be run
                here. Asked of Redis only once the lease's deadline has passed.
        """
        return await self._durable.journal(event, run_id)

    # -- reading the streams (openstarry tail) ---------------------------

    def history(
        self, cursors: dict[str, str] | None = None, *, start: str = "-"
    ) -> AsyncIterator[tuple[str, bytes]]:
        """The entries the streams retain, oldest first: ``(entry id, wire bytes)``.

        Read a page of each stream at a time and merged by entry id as it
        goes (:func:`openstarry.bus.redis.reader.read_history`): the first entry
        comes after one round trip and memory stays bounded, whatever the
        length of the history.

        Args:
            cursors: Filled with the last entry id taken from each stream, for
                :meth:`follow`.
            start: ``"-"`` (the oldest) or an entry id ``MS-SEQ``: entries at
                or after it.
        """
        keys = [key for p in range(self.partitions) for key in self.layout.streams(p)]
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
        for p in range(self.partitions):
            for key in self.layout.streams(p):
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
            "relayed": self.relayed,
            "fenced": self.fenced,
            "stranded": self.stranded,
            "outgoing": sum(len(outbox.queue) for outbox in self._outboxes()),
            "holding": len(self._deliveries.held),
            "partitions": sorted(self._leases.owned),
        }


def _on_asyncio() -> bool:
    """Whether the caller runs in an asyncio event loop (anyio's asyncio backend)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
