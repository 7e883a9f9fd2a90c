"""W3C Trace Context (``traceparent``) for openstarry trace ids; standard library only.

An openstarry ``traceId`` is a UUID: its 128 bits are the W3C trace id, so a
trace that leaves openstarry (an MCP call, an OpenTelemetry span) and comes
back keeps one id. Any other trace id maps to a digest of it.
"""

from __future__ import annotations

import hashlib
import re
import uuid

__all__ = ["parse_traceparent", "span_id_of", "traceparent", "w3c_trace_id"]

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
