"""What a worker's runs write beside their effects: sessions' memory and runs' journals,
both fenced by the partition's lease.

- **State in the commit.** A run's writes (a session's memory) are staged on the
  delivery of its input and carried by the commit that acknowledges it
  (``flush.lua``): written if, and only if, that commit is accepted. Until it is
  answered, the value staged is what this worker reads for the key
  (:meth:`Durable.pending`): the next input of the session, run before the
  commit of the one before it was answered, sees the memory it left.
- **Journals.** Each completed step of a run (a model response, a tool's
  outcome) is appended to the journal of its input (``{tag}:run:EVENT_ID``) as
  it completes (``journal.lua``, refused once the lease has moved on); the run
  handled again after a crash, on any worker, reads them back and replays them.
  The input's commit deletes the journal; one whose input never commits
  expires :data:`JOURNAL_TTL` seconds after its last step.
"""

from __future__ import annotations

from typing import Any

import anyio

from openstarry.bus.redis.lua import JOURNAL
from openstarry.bus.redis.records import Delivery
from openstarry.bus.redis.state import RETRYABLE, SLOT_MOVING, Streams, log, redis_errors
from openstarry.core import Event
from openstarry.errors import LeaseLost

__all__: list[str] = []

#: Steps a run's journal holds at most (each model response that asked for tools,
#: each tool's outcome): past it, the run goes on unjournaled (and says so).
JOURNAL_STEPS = 4096
#: Bytes one step may have at most.
JOURNAL_STEP_BYTES = 8 << 20
#: Seconds a journal lives after its last step, when its input never commits.
JOURNAL_TTL = 7 * 24 * 3600
#: Journal writes one pipeline carries at most.
_JOURNAL_BATCH = 256


class _Step:
    """One journal write waiting for the writer: its keys and arguments, then its answer."""

    __slots__ = ("answer", "args", "done", "keys")

    def __init__(self, keys: list[str], args: list[Any]) -> None:
        self.keys = keys
        self.args = args
        self.done = anyio.Event()
        self.answer = 0


class Durable:
    """The state staged on deliveries, and the journals of the runs this worker serves."""

    __slots__ = ("pending", "steps", "streams", "wake")

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        #: The value staged for each key, by the delivery whose commit carries it, until
        #: that commit is answered: ``key -> (delivery, value, data)``.
        self.pending: dict[str, tuple[Delivery, bytes, Any]] = {}
        #: Journal writes waiting for the writer.
        self.steps: list[_Step] = []
        self.wake = anyio.Event()

    async def append(self, keys: list[str], args: list[Any]) -> int:
        """Run ``journal.lua`` for one step, with the other runs' steps of the moment:
        the writer sends what waits in one pipeline (a round trip for them all, and
        one connection however many runs are recording)."""
        step = _Step(keys, args)
        self.steps.append(step)
        self.wake.set()
        await step.done.wait()
        return step.answer

    async def run(self) -> None:
        """Send the waiting journal writes, a pipeline at a time, until the backend stops.

        A pipeline whose answer is lost is sent again whole: a step appended twice
        is read back once (steps are keyed by round and by tool call)."""
        streams = self.streams
        script = streams._scripts["journal"]
        while True:
            await self.wake.wait()
            self.wake = anyio.Event()
            batch, self.steps = self.steps, []
            while batch:
                taken, batch = batch[:_JOURNAL_BATCH], batch[_JOURNAL_BATCH:]

                async def send(taken: list[_Step] = taken) -> list[Any]:
                    client = streams._client
                    pipe = client.pipeline(transaction=False)
                    for step in taken:
                        # (A cluster's pipeline refuses its evalsha method, not the command:
                        # each step goes to the node of its keys' slot.)
                        pipe.execute_command(
                            "EVALSHA", script.sha, len(step.keys), *step.keys, *step.args
                        )
                    answers: list[Any] = await pipe.execute(raise_on_error=False)
                    if any(isinstance(a, redis_errors.NoScriptError) for a in answers):
                        # A node that lacks it (a replica promoted since it was loaded).
                        await client.script_load(JOURNAL)
                        raise redis_errors.ConnectionError("the journal script was loaded again")
                    for answer in answers:
                        if isinstance(answer, (*RETRYABLE, *SLOT_MOVING)):
                            raise answer  # sent again whole, once reconnected
                    return answers

                answers = await streams._retrying(send)
                for step, answer in zip(taken, answers, strict=True):
                    if isinstance(answer, Exception):
                        log.warning("redis: a journal write was refused: %s", answer)
                        step.answer = -3
                    else:
                        step.answer = int(answer)
                    step.done.set()

    def stage(self, event: Event, key: str, value: bytes, data: Any = None) -> bool:
        """Write ``key`` with the commit of ``event`` (an empty value deletes it).

        ``data`` is what :meth:`read` answers for the key meanwhile. Returns
        ``False`` when ``event`` is not a delivery this worker holds (nothing staged).

        Raises:
            LeaseLost: ``event`` was delivered under a lease that was lost since.
        """
        delivery = self.streams.held.get(event)
        if delivery is None:
            return False
        if delivery.lease is None:
            raise LeaseLost(f"the lease of event {event.id}'s partition was lost")
        if delivery.state is None:
            delivery.state = [(key, value)]
        else:
            delivery.state = [kv for kv in delivery.state if kv[0] != key]
            delivery.state.append((key, value))
        self.pending[key] = (delivery, value, data)
        return True

    def read(self, key: str) -> tuple[bool, Any]:
        """``(True, data)`` for a key staged and not yet committed, else ``(False, None)``."""
        staged = self.pending.get(key)
        if staged is None:
            return False, None
        return True, staged[2]

    def committed(self, delivery: Delivery) -> None:
        """The commit of ``delivery`` was answered (or will never be sent): what it staged
        is read from Redis from now on."""
        pending = self.pending
        for key, _ in delivery.state or ():
            staged = pending.get(key)
            if staged is not None and staged[0] is delivery:
                del pending[key]

    def drop_partition(self, partition: int) -> None:
        """The lease of ``partition`` was lost: what this worker holds of it is dropped."""
        partition_of_key = self.streams._partition_of_key
        for delivery in self.streams.held.values():
            if partition_of_key[delivery.stream] == partition:
                self.committed(delivery)
                delivery.lease = None

    async def journal(self, event: Event, run_id: str | None = None) -> RedisJournal | None:
        """The journal of the run of ``event`` (a delivery this worker holds), its steps
        read; ``None`` for an event not delivered here.

        ``run_id``: the journal of another input of the same session (what an
        approval's answer, ``event``, records for the run that waits for it),
        written under ``event``'s lease and left to that run's commit to delete.

        Raises:
            LeaseLost: the lease ``event`` was delivered under is not this worker's
                any more (checked with Redis once the lease's deadline has passed).
        """
        streams = self.streams
        delivery = streams.held.get(event)
        if delivery is None:
            return None
        partition = streams._partition_of_key[delivery.stream]
        if not await streams._leases.owns(partition, delivery.lease):
            raise LeaseLost(f"the lease of event {event.id}'s partition is another worker's")
        if run_id is not None and run_id != event.id:
            key = streams.layout.journal(partition, run_id)
            return RedisJournal(self, event, delivery, key, [], own=False)
        key = streams.layout.journal(partition, event.id)
        steps: list[bytes] = []
        if delivery.attempts:
            # Delivered before (to a consumer that died, or a handler that failed):
            # what that attempt recorded. A first delivery has nothing to read.
            client = streams._client
            steps = list(await streams._retrying(lambda: client.lrange(key, 0, -1)))
        journal = RedisJournal(self, event, delivery, key, steps)
        if steps:
            self.stage(event, key, b"")  # deleted by the input's commit
        return journal


class RedisJournal:
    """The completed steps of one run, recorded in the bus's Redis as they complete.

    :attr:`steps` are those recorded by earlier attempts at the run (oldest
    first), read when it started; :meth:`record` appends one.
    """

    __slots__ = ("delivery", "durable", "event", "full", "key", "own", "steps")

    def __init__(
        self,
        durable: Durable,
        event: Event,
        delivery: Delivery,
        key: str,
        steps: list[bytes],
        *,
        own: bool = True,
    ) -> None:
        self.durable = durable
        self.event = event
        self.delivery = delivery
        self.key = key
        self.steps = steps
        self.full = False
        #: The journal of ``event``'s own run (deleted by its commit), or of another's.
        self.own = own

    async def record(self, step: bytes) -> None:
        """Append ``step`` once Redis holds it (fenced by the run's lease).

        Raises:
            LeaseLost: the partition's lease holds another consumer now (this
                worker was frozen or cut off past it): the run is its new
                owner's, and this attempt must stop.
        """
        if self.full:
            return
        if len(step) > JOURNAL_STEP_BYTES:
            log.warning(
                "redis: a step of %d bytes is past the journal's bound (%d): run %s goes on "
                "unjournaled",
                len(step),
                JOURNAL_STEP_BYTES,
                self.event.id,
            )
            self.full = True
            return
        durable = self.durable
        streams = durable.streams
        delivery = self.delivery
        lease = delivery.lease
        if lease is None:
            raise LeaseLost(f"the lease of run {self.event.id}'s partition was lost")
        partition = streams._partition_of_key[delivery.stream]
        keys = [self.key, *streams._leases.keys(partition)]
        args = [lease, step, JOURNAL_STEPS, JOURNAL_TTL * 1000]
        answer = await durable.append(keys, args)
        if answer == -1:
            if streams._leases.value.get(partition) == lease:
                streams._leases.lost(partition)
            raise LeaseLost(f"the lease of run {self.event.id}'s partition moved on")
        if answer == -3:
            raise RuntimeError(f"Redis refused a step of run {self.event.id}'s journal")
        if answer == -2:
            log.warning(
                "redis: run %s has %d journaled steps, the bound: it goes on unjournaled",
                self.event.id,
                JOURNAL_STEPS,
            )
            self.full = True
            return
        self.steps.append(step)
        if answer == 1 and self.own:
            durable.stage(self.event, self.key, b"")  # deleted by the input's commit
