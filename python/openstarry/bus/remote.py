"""The publishing side of a bus on a remote backend: the local window first, then the backend.

What a task publishes goes with its cause (the delivered event it is
handling, see :meth:`~openstarry.bus.EventBus.effects_of`); the counts are the bus's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from openstarry._core import Published
from openstarry.bus.backend import BusBackend
from openstarry.bus.dispatch import Dispatcher
from openstarry.bus.handles import CAUSE, refused_handle, sent_handle
from openstarry.core import Event, EventQueue, Ingestor, IngestResult


class RemotePublisher:
    """The publishing side of a bus on a remote backend: the local window, then the backend.

    What a task publishes goes with its cause (the delivered event it is
    handling, see :meth:`EventBus.effects_of`); the counts are the bus's own.
    """

    __slots__ = ("backend", "bus")

    def __init__(self, bus: Dispatcher, backend: BusBackend) -> None:
        self.bus = bus
        self.backend = backend

    def send(self, event: Event) -> Published:
        bus = self.bus
        dedup = bus._dedup
        if dedup is not None and event.id in dedup:
            bus._duplicates += 1
            return refused_handle(event)
        self.backend.send(event, CAUSE.get())  # QueueFull before the window records the id
        if dedup is not None:
            dedup.check_and_insert(event.id)
        bus._published += 1
        return sent_handle(event)

    async def asend(self, event: Event) -> Published:
        bus = self.bus
        dedup = bus._dedup
        if dedup is not None and not dedup.check_and_insert(event.id):
            bus._duplicates += 1
            return refused_handle(event)
        if await self.backend.asend(event, CAUSE.get()):
            bus._published += 1
            return sent_handle(event)
        return refused_handle(event)  # counted by the backend's metrics

    def ingest(self, data: bytes | bytearray | memoryview | Sequence[bytes]) -> IngestResult:
        bus = self.bus
        scratch = EventQueue(None)
        result = Ingestor(scratch, bus._dedup).ingest(data)
        cause = CAUSE.get()
        for event in scratch.pop_many(len(scratch)):
            self.backend.send(event, cause)
        bus._duplicates += result.duplicates
        bus._published += result.accepted
        return result
