"""What the loop says on the bus: replies, errors, and events that may be dropped.

Two ways to publish, chosen by who pays when the bus is full:

- a run's own events are awaited with :meth:`EventBus.apublish
  <openstarry.bus.EventBus.apublish>`, which waits for room: they are never dropped;
- what sync code says (a handler's reply to a command, a text delta, the
  answer to another agent's call) cannot wait: :meth:`Outbox.publish_or_drop`
  drops it on a full bus and counts it in ``events_dropped``.

A ``KERNEL:ERROR`` is also recorded on the result of the input it answers,
when someone waits for it, so that :class:`~openstarry.agent.results.RunResult`
and the bus tell the same story.
"""

from __future__ import annotations

from typing import Any

from openstarry.agent.results import RunResult, Waiters
from openstarry.bus import EventBus
from openstarry.core import Event, EventRef
from openstarry.errors import QueueClosed
from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_RUN_END, EventType

__all__ = ["Outbox"]

_ERROR = EventType.ERROR.value


class Outbox:
    """Publishes the loop's replies and errors as children of the events they answer."""

    __slots__ = ("bus", "dropped", "source", "waiters")

    def __init__(self, bus: EventBus, source: str, waiters: Waiters) -> None:
        self.bus = bus
        self.source = source
        self.waiters = waiters
        #: Events dropped on a full bus.
        self.dropped = 0

    def publish_or_drop(self, event: Event) -> None:
        """Publish from sync code; a full bus drops the event rather than block the caller."""
        try:
            self.bus.publish(event)
        except QueueClosed:
            raise
        except Exception:  # QueueFull: counted by the bus metrics' depth; nothing else to do
            self.dropped += 1

    def say(self, event: Event, text: str, *, command: str, data: Any = None) -> None:
        """A final ``OUTPUT:AGENT_MESSAGE`` answering a built-in command."""
        metadata: dict[str, Any] = {"command": command}
        if data is not None:
            metadata["data"] = data
        self.publish_or_drop(
            event.child(
                OUTPUT_AGENT_MESSAGE,
                {
                    "text": text,
                    "segments": [{"type": "text", "text": text}],
                    "final": True,
                    "metadata": metadata,
                },
                source=self.source,
            )
        )
        result = self.waiters.result(event.id)
        if result is not None:
            result.replies.append(text)
        self.ended(event)  # the command's answer is its run

    def ended(self, event: Event, *, stopped: bool = False) -> None:
        """An input that did not run (a command, an input dropped by ``/stop``) has ended:
        ``OUTPUT:RUN_END`` for an asker in another process, if the input asks for it.
        (A run reports its own end, :func:`openstarry.agent.runs.serve_input`.)"""
        payload = event.payload
        if isinstance(payload, dict) and payload.get("reportEnd") is True:
            end = {"stopped": stopped, "error": None, "usage": None}
            with self.bus.effects_of(event):
                self.publish_or_drop(
                    event.child(OUTPUT_RUN_END, end, source=self.source, priority=5)
                )

    def error(self, parent: Event | EventRef, code: str, message: str) -> None:
        """A ``KERNEL:ERROR`` from a handler (an input refused before any run)."""
        payload = {"code": code, "message": message, "source": self.source}
        result = self.waiters.result(parent.id)
        if result is not None:
            result.error = payload
        self.publish_or_drop(parent.child(_ERROR, payload, source=self.source))

    async def fail(
        self, parent: Event | EventRef, code: str, message: str, result: RunResult | None
    ) -> None:
        """A ``KERNEL:ERROR`` that ends (part of) a run: recorded on its result, never dropped."""
        payload = {"code": code, "message": message, "source": self.source}
        if result is not None:
            result.error = payload
        await self.bus.apublish(parent.child(_ERROR, payload, source=self.source))
