"""A sample spec 002 envelope and deeply nested values, for the tests of the Rust core."""

from __future__ import annotations

import copy
import json
from typing import Any

ENVELOPE = {
    "id": "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f",
    "timestamp": 1730000000000,
    "traceId": "t-1",
    "source": "src",
    "sessionId": "s-1",
    "priority": 2,
    "type": "INPUT:USER_MESSAGE",
    "payload": {"text": "hi"},
}


def envelope_wire(**changes: Any) -> dict[str, Any]:
    """A deep copy of ``ENVELOPE`` with ``changes`` replacing or adding fields."""
    wire = copy.deepcopy(ENVELOPE)
    wire.update(changes)
    return wire


def envelope_line(**changes: Any) -> bytes:
    """``envelope_wire(**changes)`` as compact JSON bytes."""
    return json.dumps(envelope_wire(**changes), separators=(",", ":")).encode()


def nested(levels: int) -> Any:
    """``[[[...0...]]]``, ``levels`` lists deep."""
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


class Sentinel:
    """An object whose collection a weak reference can watch."""
