"""Progress of a tool call that takes a while: ``EXEC:TOOL_PROGRESS`` events.

A tool calls :meth:`AgentContext.emit_progress
<openstarry.agent.interfaces.AgentContext.emit_progress>` while it runs (an A2A
agent called as a tool does, for each piece of its answer). The executor sets
:data:`~openstarry.agent.interfaces.TOOL_PROGRESS` around each call, so the
progress knows its call; :class:`ProgressSender` makes the event, a child of
the call's ``EXEC:TOOL_CALL`` in the run's trace, and publishes it. Progress is
a preview: a full bus drops it rather than make the tool wait, and the call's
``EXEC:TOOL_RESULT`` carries the whole outcome.
"""

from __future__ import annotations

import logging
from typing import Any

from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.errors import QueueFull
from openstarry.events import EXEC_TOOL_PROGRESS
from openstarry.tracecontext import current_event

__all__ = ["ProgressSender"]

log = logging.getLogger(__name__)


class ProgressSender:
    """Publishes the progress of the calls one executor runs, as ``source``."""

    __slots__ = ("bus", "dropped", "source")

    def __init__(self, bus: EventBus, source: str) -> None:
        self.bus = bus
        self.source = source
        #: Progress events a full bus dropped.
        self.dropped = 0

    def send(self, session_id: str, call_id: str, name: str, fields: dict[str, Any]) -> None:
        """Publish an ``EXEC:TOOL_PROGRESS`` of the call ``call_id`` (the tool ``name``).

        Raises:
            TypeError, ValueError: ``fields`` holds what an event cannot carry.
        """
        running = current_event.get()  # the call's EXEC:TOOL_CALL, while its tool runs
        trace_id, parent_id = running if running is not None else (None, None)
        event = Event.new(
            EXEC_TOOL_PROGRESS,
            {**fields, "toolCallId": call_id, "name": name},
            source=self.source,
            session_id=session_id,
            trace_id=trace_id,
            parent_id=parent_id,
        )
        try:
            self.bus.publish(event)
        except QueueFull:
            self.dropped += 1
            log.debug("the bus is full: a progress event of %s was dropped", name)
