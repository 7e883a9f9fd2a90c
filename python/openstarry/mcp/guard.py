"""The recursion guard of inter-agent MCP calls (spec 004 section 4).

Every MCP request openstarry sends carries its trace: over HTTP in the headers
:data:`TRACE_HEADER` and :data:`DEPTH_HEADER`, over stdio in the request's
``params._meta`` under :data:`META_TRACE` and :data:`META_DEPTH`. A call made by
a user's input has depth 1; a call made while serving a call of depth ``d``
keeps the trace id and has depth ``d + 1``. A server refuses a call whose depth
exceeds :data:`MAX_DEPTH`, so a cycle A -> B -> A -> ... stops at depth 6.

Depth is carried by each request, not counted by the server, so unrelated
callers never affect each other. This module needs only the standard library.

Beside them goes the W3C Trace Context ``traceparent`` (the header
:data:`TRACEPARENT_HEADER`, and ``_meta`` key :data:`META_TRACEPARENT`), so a
call to or from an agent written with another framework stays in one trace:
its trace id is the openstarry trace id's 32 hex digits (:func:`w3c_trace_id`),
its parent the span of the tool call that makes it (the ``EXEC:TOOL_CALL``'s
span, :func:`openstarry.tracecontext.event_span_id`), so the called agent's
spans are children of the caller's ``openstarry.mcp.call`` span.
A request that carries only a ``traceparent`` gets that trace, as a UUID.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from openstarry.errors import RecursionLimitExceeded
from openstarry.tracecontext import (
    MAX_CALL_DEPTH,
    META_DEPTH,
    META_TRACE,
    current_event,
    event_span_id,
    parse_traceparent,
    span_id_of,
    traceparent,
    w3c_trace_id,
)

__all__ = [
    "DEPTH_HEADER",
    "MAX_DEPTH",
    "RECURSION_LIMIT_EXCEEDED",
    "META_DEPTH",
    "META_TRACE",
    "TRACEPARENT_HEADER",
    "TRACE_HEADER",
    "META_TRACEPARENT",
    "TraceContext",
    "check_depth",
    "next_hop",
    "trace_from_headers",
    "trace_from_meta",
    "traceparent_of",
    "w3c_trace_id",
]

#: The HTTP header carrying the trace id (spec 004 section 4).
TRACE_HEADER = "X-OpenStarry-Trace-ID"
#: The HTTP header carrying the call's depth.
DEPTH_HEADER = "X-OpenStarry-Trace-Depth"
#: The W3C Trace Context header (and ``_meta`` key) sent beside the openstarry ones.
TRACEPARENT_HEADER = "traceparent"
META_TRACEPARENT = "traceparent"
# The ``params._meta`` keys carrying the trace id and the depth (stdio, or any
# transport): META_TRACE and META_DEPTH, shared with A2A (openstarry.tracecontext).
#: The deepest call an agent serves; a deeper one is refused.
MAX_DEPTH = MAX_CALL_DEPTH
#: The JSON-RPC error code of a call refused by the recursion guard (in the
#: implementation-defined server error range, clear of the codes MCP reserves).
RECURSION_LIMIT_EXCEEDED = -32050
_MAX_TRACE_LEN = 128
#: The largest depth a request may claim; beyond it the trace is malformed (no
#: real chain is that deep, and the refusal must be able to print the number).
_MAX_DEPTH_VALUE = 2**31 - 1
#: Characters of a malformed value that an error message repeats.
_SHOWN = 40


class TraceContext:
    """A call's trace id and depth (1 for the first hop), and the span making it.

    ``parent_span`` (16 hex digits) is the caller's span, the parent in the
    ``traceparent`` sent; ``None``: a span id derived from the hop.
    """

    __slots__ = ("depth", "parent_span", "trace_id")

    def __init__(self, trace_id: str, depth: int, parent_span: str | None = None) -> None:
        self.trace_id = trace_id
        self.depth = depth
        self.parent_span = parent_span

    def __repr__(self) -> str:
        return f"TraceContext(trace_id={self.trace_id!r}, depth={self.depth})"

    def headers(self) -> dict[str, str]:
        return {
            TRACE_HEADER: self.trace_id,
            DEPTH_HEADER: str(self.depth),
            TRACEPARENT_HEADER: traceparent_of(self),
        }

    def meta(self) -> dict[str, Any]:
        return {
            META_TRACE: self.trace_id,
            META_DEPTH: self.depth,
            META_TRACEPARENT: traceparent_of(self),
        }


def traceparent_of(trace: TraceContext) -> str:
    """The ``traceparent`` sent with a call: the trace's W3C id and the calling span's id."""
    parent = trace.parent_span or span_id_of(f"{trace.trace_id}/{trace.depth}")
    return traceparent(trace.trace_id, parent)


def _from_traceparent(value: object) -> str | None:
    parsed = parse_traceparent(value)
    return parsed[0] if parsed is not None else None


def next_hop(trace_id: str | None, call_depth: int) -> TraceContext:
    """The trace of a call made by a run at ``call_depth`` (0 for a user's input).

    ``trace_id`` is the run's (``AgentContext.trace_id``); a fresh one is made
    when it is empty. The calling span is that of the tool call being run
    (:data:`openstarry.tracecontext.current_event`), when it is in the trace.
    """
    if not trace_id:
        return TraceContext(str(uuid.uuid4()), max(call_depth, 0) + 1)
    work = current_event.get()
    parent = event_span_id(work[1]) if work is not None and work[0] == trace_id else None
    return TraceContext(trace_id, max(call_depth, 0) + 1, parent)


def _shown(value: Any) -> str:
    """A malformed value for an error message: its repr, cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_DEPTH_VALUE:
        return "a larger number"  # repr() of a huge int is slow, or raises past 4300 digits
    text = repr(value) if isinstance(value, (str, int, float, bool)) else type(value).__name__
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _parse(trace: Any, depth: Any, where: str) -> TraceContext | None:
    if trace is None and depth is None:
        return None
    if not isinstance(trace, str) or not trace or len(trace) > _MAX_TRACE_LEN:
        raise ValueError(f"{where}: the trace id must be a string of 1 to {_MAX_TRACE_LEN} chars")
    if not trace.isprintable():
        # Headers cannot carry control characters; _meta must not either (they
        # would go as they are into log lines and events).
        raise ValueError(f"{where}: the trace id must not hold control characters")
    if isinstance(depth, str):
        text = depth.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 10:
            raise ValueError(
                f"{where}: the depth must be a whole number of at least 1, not {_shown(depth)}"
            )
        depth = int(text)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= _MAX_DEPTH_VALUE:
        raise ValueError(
            f"{where}: the depth must be an integer from 1 to {_MAX_DEPTH_VALUE}, "
            f"not {_shown(depth)}"
        )
    return TraceContext(trace, depth)


def trace_from_headers(headers: Mapping[str, str]) -> TraceContext | None:
    """The trace an HTTP request carries, ``None`` when it carries none.

    A trace id without a depth counts as depth 1.

    Raises:
        ValueError: for a malformed trace id or depth.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    trace = lowered.get(TRACE_HEADER.lower())
    depth = lowered.get(DEPTH_HEADER.lower())
    if trace is None:
        trace = _from_traceparent(lowered.get(TRACEPARENT_HEADER))
    if trace is not None and depth is None:
        depth = "1"
    return _parse(trace, depth, "headers")


def trace_from_meta(meta: Mapping[str, Any] | None) -> TraceContext | None:
    """The trace a request's ``params._meta`` carries, ``None`` when it carries none.

    Raises:
        ValueError: for a malformed trace id or depth.
    """
    if not meta:
        return None
    trace = meta.get(META_TRACE)
    depth = meta.get(META_DEPTH)
    if trace is None:
        trace = _from_traceparent(meta.get(META_TRACEPARENT))
    if trace is not None and depth is None:
        depth = 1
    return _parse(trace, depth, "_meta")


def check_depth(trace: TraceContext) -> None:
    """Refuse a call deeper than :data:`MAX_DEPTH`.

    Raises:
        RecursionLimitExceeded: naming the trace and its depth.
    """
    if trace.depth > MAX_DEPTH:
        raise RecursionLimitExceeded(
            f"call depth {trace.depth} exceeds the limit of {MAX_DEPTH} "
            f"(trace {trace.trace_id}): refused to break a call cycle"
        )
