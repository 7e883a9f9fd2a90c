"""The outbox: what this process sends to Redis, in order, through the flush script.

Publishes, commits, acknowledgements and dead letters wait here and go in
flushes of at most :data:`_FLUSH_EVENTS` events, pipelined on one connection;
at the bound a refused producer backs off and probes (see :meth:`Outbox.run`).
"""

from __future__ import annotations

import operator
import random
import zlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import anyio

from openstarry.bus.redis.keys import PRIORITIES
from openstarry.bus.redis.lua import FLUSH
from openstarry.bus.redis.records import Answers, Delivery, Outgoing
from openstarry.bus.redis.state import RETRYABLE, SLOT_MOVING, Streams, log, redis_errors
from openstarry.bus.redis.wire import SHORT_STRINGS, msgpack_array, msgpack_fields, msgpack_str_head
from openstarry.core import Event, encode_event
from openstarry.errors import QueueFull

__all__: list[str] = []

#: The wire bytes of a fetched entry ``(stream, entry id, wire)``.
WIRE_OF = operator.itemgetter(2)
#: The event of a delivered ``(event, delivery)``.
EVENT_OF = operator.itemgetter(0)

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
READ_AHEAD = 32


class Outbox:
    """What this process sends, in order, until the flush script has answered for it.

    Publishes, commits (a handled entry's XACK with the effects of its handling)
    and dead letters wait in one queue; handled entries without effects wait
    by stream, to be acknowledged with one XACK per stream. One task runs them
    through the flush script, up to 1,024 operations at a time. The counts are
    the backend's.
    """

    __slots__ = (
        "acks",
        "acks_from",
        "bases",
        "conn",
        "flights",
        "flushed",
        "flushes",
        "in_flight",
        "keys",
        "limit",
        "moving",
        "node",
        "numbered",
        "partition",
        "queue",
        "settles",
        "streams",
        "unacked",
        "wake",
    )

    def __init__(self, streams: Streams, partition: int | None = None) -> None:
        self.streams = streams
        #: The partition whose operations this outbox sends (a cluster: one per
        #: partition, each flush one script on its node), or ``None`` for all of them.
        self.partition = partition
        self.conn: Any = None
        self.node: Any = None
        self.queue: deque[Outgoing] = deque()
        #: Handled entries without effects, by stream, waiting for their XACK.
        self.acks: dict[bytes, list[bytes]] = {}
        self.unacked = 0
        self.wake: anyio.Event = anyio.Event()
        self.flushed: anyio.Event = anyio.Event()
        self.in_flight = 0  # operations taken by the flush under way
        #: The flushes sent and not yet answered: their operations, the command.
        self.flights: deque[tuple[list[Outgoing], Any]] = deque()
        self.flushes = 0
        #: Acknowledgements, commits and dead letters queued so far: each is numbered
        #: (:attr:`Outgoing.settle`), so that a sweep can wait for those before a mark.
        self.settles = 0
        #: The number of the first acknowledgement waiting in :attr:`acks`.
        self.acks_from = 0
        #: The stream keys, by partition * 6 + priority, as the blob carries them.
        layout = streams.layout
        self.keys = [
            msgpack_fields(layout.stream(p, r))
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
        #: Whether the last flush was refused because its slot is moving (a resharding):
        #: said once, until a flush is answered again.
        self.moving = False

    def publish(self, event: Event) -> Outgoing:
        """A publish: the event's fields and the publish's own number."""
        op = self.publish_op(event)
        self.numbered = number = self.numbered + 1
        digits = b"%d" % number
        op.op = "P"
        op.blob = b"".join((op.blob, SHORT_STRINGS[len(digits)], digits))
        op.fields = 4
        op.effects = 1
        return op

    def publish_op(self, event: Event) -> Outgoing:
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
                SHORT_STRINGS[n] if n < 256 else msgpack_str_head(n),
                event_id,
                self.keys[base + event.priority],
                SHORT_STRINGS[m] if m < 256 else msgpack_str_head(m),
                wire,
            )
        )
        return Outgoing("E", blob, 3)

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
        answers = op.waiter = Answers(1)
        self.queue.append(op)
        self._wake()
        await answers.signal.wait()
        return op.accepted

    async def asend_many(self, events: Sequence[Event]) -> list[bool]:
        answers = Answers(len(events))
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

    def _take(self) -> list[Outgoing]:
        """The operations of the next flush: the oldest waiting, then the acknowledgements.

        They carry at most :attr:`limit` events (at least one operation).
        """
        outgoing = self.queue
        ops: list[Outgoing] = []
        room = self.limit
        while outgoing and (room > 0 or not ops):
            op = outgoing.popleft()
            ops.append(op)
            room -= op.effects or 1
        if self.unacked:
            acks, self.acks, self.unacked = self.acks, {}, 0
            for stream, entries in acks.items():
                blob = msgpack_fields(stream, b",".join(entries))
                op = Outgoing("A", blob, 2, len(entries))
                op.settle = self.acks_from
                ops.append(op)
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
        sha = streams._scripts["flush"].sha
        dead = streams.layout.dead(self.partition or 0)
        replicas = streams.min_replicas
        wait = ("WAIT", replicas, streams.replica_timeout_ms)
        conn = await self._connect()
        in_flight: deque[tuple[list[Outgoing], Any]] = deque()
        self.flights = in_flight
        refused: list[Outgoing] = []
        heard = 0  # the last flush whose refusal this process has heard of
        broken = False
        backoff = 0.0  # the last pause's bound; 0 while no flush is refused
        taken = 0  # publishes accepted by the flushes answered with a refusal
        try:
            while True:
                while (
                    len(in_flight) < (2 if self.limit >= _FLUSH_EVENTS and not replicas else 1)
                    and not refused
                    and (outgoing or self.unacked)
                ):
                    ops = self._take()
                    self.flushes += 1
                    args = self._args(ops, self.flushes, heard)
                    command = ("EVALSHA", sha, 1, dead, *args)
                    # With min_replicas, each flush is followed by a WAIT on its connection.
                    packed = (
                        conn.pack_commands([command, wait])
                        if replicas
                        else conn.pack_command(*command)
                    )
                    in_flight.append((ops, packed))
                    self.in_flight += len(ops)
                    if not broken:
                        try:
                            await conn.send_packed_command(packed, check_health=False)
                        except RETRYABLE:
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
                    if replicas:
                        await self._replicated(conn, wait)
                except (*RETRYABLE, *SLOT_MOVING, redis_errors.NoScriptError) as exc:
                    streams.reconnects += 1
                    conn = await self._send_again(conn, in_flight, exc)
                    broken = False
                    continue
                in_flight.popleft()
                self.in_flight -= len(ops)
                if self.moving:
                    self.moving = False
                    log.info("redis: partition %s answers again", self.partition)
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
                await self._release()

    async def _connect(self) -> Any:
        """A connection of the flusher's own: to the server, or to the node of its partition."""
        client = self.streams._client
        if self.partition is None:
            self.conn = await client.connection_pool.get_connection()
        else:
            # A connection of the flusher's own, not the node's pool: the cluster
            # client closes a node's pooled connections when it looks the slots up
            # again, whoever is using them.
            self.node = node = client.get_node_from_key(self.streams.layout.dead(self.partition))
            self.conn = node.connection_class(**node.connection_kwargs)
        return self.conn

    async def _release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        await conn.disconnect()
        if self.partition is None:
            await self.streams._client.connection_pool.release(conn)

    async def _replicated(self, conn: Any, wait: tuple[str, int, int]) -> None:
        """Read a flush's ``WAIT``; while fewer replicas have it, wait again (and say so)."""
        replicas = wait[1]
        got = int(await conn.read_response(timeout=_FLUSH_TIMEOUT))
        waited = 0.0
        while got < replicas:
            waited += wait[2] / 1000
            if waited >= 5 and waited % 5 < wait[2] / 1000:
                log.warning(
                    "redis: a flush reached %d of %d replicas after %.0f s; its publishes wait",
                    got,
                    replicas,
                    waited,
                )
            await conn.send_command(*wait, check_health=False)
            got = int(await conn.read_response(timeout=_FLUSH_TIMEOUT))

    async def _send_again(
        self, conn: Any, in_flight: deque[tuple[Any, Any]], exc: Exception
    ) -> Any:
        """Reconnect (with backoff) and send the flushes in flight again, in order.

        On a cluster the partition's node is looked up again first: after a
        failover (or a slot moved) it is another server, which may lack the
        script (``SCRIPT LOAD`` is not replicated): it is loaded again. While
        the partition's slot is moving to another master (``TRYAGAIN``, or
        ``ASK``: a resharding), a flush cannot run anywhere (its keys are on
        two nodes): it goes again to the same node after a pause, until the
        slot has moved and the node answers ``MOVED``.
        Returns the connection the flushes went on.
        """
        streams = self.streams
        delay = 0.05
        while True:
            moving = _slot_moving(exc)
            if moving and self.moving:
                log.debug("redis: %s; sending %d flushes again", _said(exc), len(in_flight))
            else:
                log.warning("redis: %s; sending %d flushes again", _said(exc), len(in_flight))
            self.moving = self.moving or moving
            try:
                await self._release()
                if self.partition is not None:
                    await anyio.sleep(delay)  # a failover takes a node timeout or more
                    if not moving:
                        await streams._client.nodes_manager.initialize()
                conn = await self._connect()
                if (self.partition is not None and not moving) or isinstance(
                    exc, redis_errors.NoScriptError
                ):
                    await streams._client.script_load(FLUSH)
                for _, packed in in_flight:
                    await conn.send_packed_command(packed, check_health=False)
                return conn
            except (*RETRYABLE, *SLOT_MOVING, redis_errors.RedisClusterException) as again:
                # (RedisClusterException: looking the slots up found no node to answer,
                # as during a failover under load; the cluster answered a moment ago.)
                exc = again
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _args(self, ops: list[Outgoing], flush: int, heard: int) -> list[bytes | str | int]:
        streams = self.streams
        partition = self.partition
        return [
            streams.window_ms,
            streams.maxlen,
            # Sent again as it is when its answer is lost: the same token.
            f"{streams.token}:{flush}"
            if partition is None
            else f"{streams.token}:{partition}:{flush}",
            streams.group,
            "".join([op.op for op in ops]),
            streams.layout.prefix(partition or 0),
            b"".join([msgpack_array(sum([op.fields for op in ops])), *[op.blob for op in ops]]),
            streams.token,
            flush,
            heard,
            # On a cluster, effects bound for another partition go to this one's relay stream.
            0 if partition is None else 1,
        ]

    def _answer(self, ops: list[Outgoing], results: list[int]) -> list[Outgoing]:
        """Count a flush's answers; returns the operations refused (a full stream)."""
        streams = self.streams
        full: list[Outgoing] = []
        for op, result in zip(ops, results, strict=True):
            code = op.op
            if code == "P":
                if result < 0:
                    full.append(op)
                    continue
                if op.relay:
                    # An effect committed in another partition, counted there: it
                    # arrived now (1), or with an earlier relay of it (0).
                    streams.relayed += 1
                elif result == 1:
                    streams.sent += 1
                else:
                    streams.duplicates += 1
                if op.waiter is not None:
                    op.accepted = result == 1
                    op.waiter.answered()
            elif code == "A":
                streams.acked += op.effects
                streams.skipped_handled += op.effects - result
            elif code == "C":  # never refused: a full stream must be able to drain
                if op.delivery is not None:
                    streams._durable.committed(op.delivery)
                if result == -3:  # fenced: the entry's partition has another owner now
                    streams.fenced += 1
                    continue
                streams.acked += 1
                if result == -2:
                    streams.skipped_handled += 1
                else:
                    streams.sent += result
                    streams.duplicates += op.effects - result
            else:  # "D": 0 when the entry was acknowledged before
                streams.dead_lettered += result
        return full

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a handled delivery without effects (one XACK per stream and flush)."""
        entries = self.acks.get(delivery.stream)
        if entries is None:
            self.acks[delivery.stream] = [delivery.entry]
        else:
            entries.append(delivery.entry)
        self.unacked += 1
        self.settles += 1
        if self.unacked == 1:  # else woken already: the flusher takes them all at once
            self.acks_from = self.settles
            self._wake()

    def commit(self, delivery: Delivery) -> None:
        """Commit a handled delivery: its XACK, its effects and the state it wrote, at
        once, fenced by the lease it was delivered under."""
        streams = self.streams
        effects = delivery.effects or []
        state = delivery.state or []
        partition = streams._partition_of_key[delivery.stream]
        blob = msgpack_fields(
            delivery.stream,
            delivery.entry,
            b"%d" % len(effects),
            b"%d" % len(state),
            streams.layout.lease(streams.group, partition),
            delivery.lease or "",
        )
        blob = b"".join(
            [blob, *[effect.blob for effect in effects], *[msgpack_fields(*kv) for kv in state]]
        )
        delivery.effects = None
        op = Outgoing("C", blob, 6 + 3 * len(effects) + 2 * len(state), len(effects))
        if state:
            op.delivery = delivery
        op.settle = self.settles = self.settles + 1
        self.queue.append(op)
        self._wake()

    def dead_letter(
        self, event: Event | None, delivery: Delivery, reason: str, wire: bytes = b""
    ) -> None:
        fields = msgpack_fields(
            delivery.stream,
            delivery.entry,
            encode_event(event) if event is not None else wire,
            reason,
        )
        op = Outgoing("D", fields, 4)
        op.settle = self.settles = self.settles + 1
        self.queue.append(op)
        self._wake()


def _slot_moving(exc: BaseException) -> bool:
    """Whether ``exc`` says that a flush's slot is moving between masters (``TRYAGAIN``,
    ``ASK``): the slot's owner is still the one the client knows."""
    if isinstance(exc, redis_errors.MovedError):
        return False
    return isinstance(exc, (redis_errors.TryAgainError, redis_errors.AskError))


def _said(exc: BaseException) -> str:
    """An error as a log line says it: a redirection named (redis-py keeps only
    ``slot host:port`` of ``MOVED``/``ASK``, and drops ``TRYAGAIN``)."""
    if isinstance(exc, redis_errors.MovedError):
        return f"MOVED {exc}"
    if isinstance(exc, redis_errors.AskError):
        return f"ASK {exc}"
    if isinstance(exc, redis_errors.TryAgainError):
        return f"TRYAGAIN {exc}"
    return str(exc)


class Outboxes:
    """A bus's outboxes on a Redis Cluster: one per partition, each flushing to its node.

    The same calls as one :class:`Outbox`, sent to the outbox of the event's
    partition (from its session) or the delivery's (from its stream). Each
    partition's operations keep their order; partitions go independently.
    """

    __slots__ = ("all", "partition_of_key", "partitions", "streams")

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self.partitions = streams.partitions
        self.all = [Outbox(streams, p) for p in range(streams.partitions)]
        self.partition_of_key = streams._partition_of_key

    def of(self, event: Event) -> Outbox:
        session = event.session_id.encode("utf-8", "surrogatepass")
        return self.all[zlib.crc32(session) % self.partitions]

    def of_delivery(self, delivery: Delivery) -> Outbox:
        return self.all[self.partition_of_key[delivery.stream]]

    @property
    def queued(self) -> int:
        return sum(len(outbox.queue) for outbox in self.all)

    def send(self, event: Event) -> None:
        self.of(event).send(event)

    async def asend(self, event: Event) -> bool:
        return await self.of(event).asend(event)

    async def asend_many(self, events: Sequence[Event], *, relay: bool = False) -> list[bool]:
        answers = Answers(len(events))
        ops = []
        for event in events:
            outbox = self.of(event)
            while len(outbox.queue) >= self.streams.buffer:
                await outbox.flush()
            op = outbox.publish(event)
            op.waiter = answers
            op.relay = relay
            outbox.queue.append(op)
            outbox._wake()
            ops.append(op)
        if ops:
            await answers.signal.wait()
        return [op.accepted for op in ops]

    async def flush(self) -> None:
        for outbox in self.all:
            await outbox.flush()

    def publish_op(self, event: Event) -> Outgoing:
        return self.all[0].publish_op(event)  # the fields name the stream: any outbox makes them

    def ack(self, delivery: Delivery) -> None:
        self.of_delivery(delivery).ack(delivery)

    def commit(self, delivery: Delivery) -> None:
        self.of_delivery(delivery).commit(delivery)

    def dead_letter(
        self, event: Event | None, delivery: Delivery, reason: str, wire: bytes = b""
    ) -> None:
        self.of_delivery(delivery).dead_letter(event, delivery, reason, wire)
