"""The trace an HTTP request to the Agent API carries, for the run it starts.

A request to ``openstarry serve`` may carry ``X-OpenStarry-Trace-ID`` or a W3C
``traceparent`` (from an agent or a service written with another framework);
the run it starts then continues that trace: its events' ``traceId`` is the
header's (a ``traceparent``'s trace id as a UUID, the openstarry header winning
when both come). :class:`TraceContextMiddleware` reads the headers into
:data:`incoming_trace`, a context variable that the run's task inherits, and
:class:`~openstarry.api.adapter.RunStream` starts the run with it; a malformed
header is ignored (the run gets a trace of its own).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from openstarry.tracecontext import parse_traceparent

__all__ = ["TraceContextMiddleware", "incoming_trace", "trace_of_headers"]

#: The trace of the HTTP request being served, ``None`` when it carries none.
incoming_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "openstarry_incoming_trace", default=None
)

_MAX_TRACE = 128

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def trace_of_headers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The trace id of raw ASGI headers: ``X-OpenStarry-Trace-ID``, else ``traceparent``."""
    ours: str | None = None
    w3c: str | None = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"x-openstarry-trace-id":
            text = value.decode("latin-1").strip()
            if 0 < len(text) <= _MAX_TRACE and text.isprintable():
                ours = text
        elif lowered == b"traceparent":
            parsed = parse_traceparent(value.decode("latin-1"))
            if parsed is not None:
                w3c = parsed[0]
    return ours or w3c


class TraceContextMiddleware:
    """ASGI middleware: sets :data:`incoming_trace` from the request's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        token = incoming_trace.set(trace_of_headers(scope.get("headers") or []))
        try:
            await self.app(scope, receive, send)
        finally:
            incoming_trace.reset(token)
