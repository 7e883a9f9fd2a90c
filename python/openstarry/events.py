"""The event types of spec 002 and the agent states, as plain constants.

This module imports nothing beyond the standard library; the pydantic models of
the payloads are in :mod:`openstarry.protocol`.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "EXEC_TOOL_PROGRESS",
    "OUTPUT_AGENT_MESSAGE",
    "OUTPUT_AGENT_MESSAGE_DELTA",
    "AgentState",
    "EventType",
    "namespace_of",
]


class EventType(str, Enum):
    """The eight event types of spec 002. Each member is also its wire string."""

    USER_MESSAGE = "INPUT:USER_MESSAGE"
    SYSTEM_COMMAND = "INPUT:SYSTEM_COMMAND"
    SIGNAL = "INPUT:SIGNAL"
    TICK_START = "KERNEL:TICK_START"
    STATE_CHANGE = "KERNEL:STATE_CHANGE"
    ERROR = "KERNEL:ERROR"
    TOOL_CALL = "EXEC:TOOL_CALL"
    TOOL_RESULT = "EXEC:TOOL_RESULT"

    def __str__(self) -> str:
        return self.value


#: openstarry's one event type beyond spec 002: what the agent says to the
#: session (the text, image and UI segments of a provider response, or the
#: answer of a built-in slash command). Its payload is
#: :class:`openstarry.protocol.AgentMessage`.
OUTPUT_AGENT_MESSAGE = "OUTPUT:AGENT_MESSAGE"

#: A piece of what the agent is saying, while a streaming provider answers
#: (``AgentContext.emit_text_delta``). The ``OUTPUT:AGENT_MESSAGE`` that follows
#: carries the whole text; deltas are for showing it as it comes. Its payload
#: is :class:`openstarry.protocol.AgentMessageDelta`.
OUTPUT_AGENT_MESSAGE_DELTA = "OUTPUT:AGENT_MESSAGE_DELTA"


#: How a tool call that takes a while is going (``AgentContext.emit_progress``): a
#: child of the call's ``EXEC:TOOL_CALL``, in the run's trace. Its payload is what
#: the tool said (by convention ``text``, a piece of a remote agent's answer, and
#: ``state``) with the call's ``toolCallId`` and ``name``. A preview: the call's
#: ``EXEC:TOOL_RESULT`` carries the whole outcome.
EXEC_TOOL_PROGRESS = "EXEC:TOOL_PROGRESS"


#: The end of a run, for whoever published its input and waits for it in another
#: process: on a remote bus, a run whose ``INPUT:USER_MESSAGE`` payload holds
#: ``"reportEnd": true`` ends with this event, committed with its other events
#: (``openstarry serve`` asks for it when the bus is shared with other workers). Its
#: payload: ``stopped`` (a bool), ``error`` (the ``KERNEL:ERROR`` payload that ended
#: the run, or null) and ``usage`` (the run's provider usage, added up, or null).
OUTPUT_RUN_END = "OUTPUT:RUN_END"


class AgentState(str, Enum):
    """The states of a session's execution loop (``KERNEL:STATE_CHANGE``)."""

    IDLE = "IDLE"
    THINKING = "THINKING"
    EXECUTING = "EXECUTING"

    def __str__(self) -> str:
        return self.value


def namespace_of(event_type: str) -> str:
    """``"INPUT"`` for ``"INPUT:USER_MESSAGE"``."""
    return event_type.partition(":")[0]
