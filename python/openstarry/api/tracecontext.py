"""The trace an HTTP request to the Agent API carries, for the run it starts.

A request to ``openstarry serve`` may carry ``X-OpenStarry-Trace-ID`` or a W3C
``traceparent`` (from an agent or a service written with another framework);
the run it starts then continues that trace: its events' ``traceId`` is the
header's (a ``traceparent``'s trace id as a UUID, the openstarry header winning
when both come). :class:`TraceContextMiddleware` reads the headers into
:data:`incoming_trace`, a context variable that the run's task inherits, and
:class:`~openstarry.api.adapter.RunStream` starts the run with it; a malformed
header is ignored (the run gets a trace of its own).

A ``traceparent`` also names the caller's span: when the run is in that
trace, :data:`incoming_parent` holds the header, and the run's
``INPUT:USER_MESSAGE`` carries it in its payload (``"traceparent"``), so the
run's ``openstarry.turn`` span is a child of the caller's span
(:mod:`openstarry.otel`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from openstarry.tracecontext import parse_traceparent, w3c_trace_id

__all__ = [
    "TraceContextMiddleware",
    "incoming_depth",
    "incoming_parent",
    "incoming_trace",
    "trace_context_of_headers",
    "trace_of_headers",
]

#: The trace of the HTTP request being served, ``None`` when it carries none.
incoming_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "openstarry_incoming_trace", default=None
)
#: The request's ``traceparent`` (normalized) when the run is in its trace, else ``None``.
incoming_parent: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "openstarry_incoming_parent", default=None
)

#: How many agent-to-agent calls deep the request being served is (0: none; an A2A
#: message from another agent says so in its metadata, :mod:`openstarry.api.a2a`).
#: The run it starts has that ``call_depth``, so its own remote calls go one deeper.
incoming_depth: contextvars.ContextVar[int] = contextvars.ContextVar(
    "openstarry_incoming_depth", default=0
)

_MAX_TRACE = 128

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def trace_of_headers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The trace id of raw ASGI headers: ``X-OpenStarry-Trace-ID``, else ``traceparent``."""
    return trace_context_of_headers(headers)[0]


def trace_context_of_headers(
    headers: list[tuple[bytes, bytes]],
) -> tuple[str | None, str | None]:
    """``(trace id, caller's traceparent)`` of raw ASGI headers.

    The trace id as :func:`trace_of_headers`; the ``traceparent`` (normalized)
    when it is well formed and in that trace, else ``None``.
    """
    ours: str | None = None
    w3c: str | None = None
    parent: str | None = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"x-openstarry-trace-id":
            text = value.decode("latin-1").strip()
            if 0 < len(text) <= _MAX_TRACE and text.isprintable():
                ours = text
        elif lowered == b"traceparent":
            parsed = parse_traceparent(value.decode("latin-1"))
            if parsed is not None:
                w3c, span = parsed
                parent = f"00-{w3c_trace_id(w3c)}-{span}-01"
    trace = ours or w3c
    if trace is None or w3c is None or w3c_trace_id(trace) != w3c_trace_id(w3c):
        parent = None
    return trace, parent


class TraceContextMiddleware:
    """ASGI middleware: sets :data:`incoming_trace` from the request's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        trace, parent = trace_context_of_headers(scope.get("headers") or [])
        token = incoming_trace.set(trace)
        parent_token = incoming_parent.set(parent)
        try:
            await self.app(scope, receive, send)
        finally:
            incoming_parent.reset(parent_token)
            incoming_trace.reset(token)
