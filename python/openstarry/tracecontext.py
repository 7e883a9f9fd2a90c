"""W3C Trace Context (``traceparent``) for openstarry trace ids; standard library only.

An openstarry ``traceId`` is a UUID: its 128 bits are the W3C trace id, so a
trace that leaves openstarry (an MCP call, an OpenTelemetry span) and comes
back keeps one id. Any other trace id maps to a digest of it.

Spans have ids known without OpenTelemetry too: the span an event opens (a
run's ``INPUT:USER_MESSAGE``, a round's ``KERNEL:TICK_START``, an
``EXEC:TOOL_CALL``) has the span id :func:`event_span_id` of the event's id,
which :mod:`openstarry.otel` gives it. While the loop asks the provider, or
runs a tool, :data:`current_event` names that event, and
:func:`current_traceparent` is the ``traceparent`` of a call made from there:
the HTTP providers send it to the model API, and MCP calls to the agent they
call, so their spans become children of the provider's or the tool's span.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import uuid

__all__ = [
    "MAX_CALL_DEPTH",
    "META_DEPTH",
    "META_TRACE",
    "current_event",
    "current_traceparent",
    "event_span_id",
    "parse_traceparent",
    "span_id_of",
    "traceparent",
    "w3c_trace_id",
]

#: ``(traceId, event id)`` of the event whose span the current task works in:
#: the round's ``KERNEL:TICK_START`` while the provider answers, the
#: ``EXEC:TOOL_CALL`` while its tool runs; ``None`` outside a run.
current_event: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "openstarry_current_event", default=None
)

#: The deepest agent-to-agent call an agent serves (spec 004 section 4): a user's input
#: is depth 1's caller, a call made while serving depth ``d`` is ``d + 1``, and a
#: call deeper than this is refused, so a cycle of agents stops (MCP and A2A alike).
MAX_CALL_DEPTH = 5
#: The keys a call's trace id and depth travel under in a message's metadata (MCP's
#: ``params._meta``, A2A's ``message.metadata``).
META_TRACE = "openstarry/traceId"
META_DEPTH = "openstarry/depth"

_HEX = frozenset("0123456789abcdef")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def w3c_trace_id(trace_id: str) -> str:
    """The W3C trace id (32 lowercase hex digits) of an openstarry ``traceId``."""
    digits = trace_id.replace("-", "").lower()
    if len(digits) == 32 and _HEX.issuperset(digits) and digits != "0" * 32:
        return digits
    return hashlib.sha256(trace_id.encode()).hexdigest()[:32]


def span_id_of(key: str) -> str:
    """A W3C span id (16 hex digits, never all zeros) derived from ``key``."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return digest if digest != "0" * 16 else "0" * 15 + "1"


def traceparent(trace_id: str, parent: str) -> str:
    """The ``traceparent`` value of a call in ``trace_id`` made by span ``parent`` (16 hex)."""
    return f"00-{w3c_trace_id(trace_id)}-{parent}-01"


def parse_traceparent(value: object) -> tuple[str, str] | None:
    """``(trace id as a UUID, parent span id)`` of a ``traceparent``; ``None`` if malformed."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower())
    if match is None or match[1] == "ff" or match[2] == "0" * 32 or match[3] == "0" * 16:
        return None
    return str(uuid.UUID(hex=match[2])), match[3]


def event_span_id(event_id: str) -> str:
    """The span id (16 hex digits) of the span that the event ``event_id`` opens."""
    return span_id_of(event_id)


def current_traceparent() -> str | None:
    """The ``traceparent`` of a call made now, from the span of :data:`current_event`.

    ``None`` outside a run's provider call or tool call.
    """
    work = current_event.get()
    if work is None:
        return None
    return traceparent(work[0], event_span_id(work[1]))
