"""The pure-Python code each openstarry piece is measured against.

Each baseline does the same job as the Rust piece, written the way a careful
Python programmer would: C-implemented containers (``deque``, ``set``,
``heapq``), ``__slots__``, bound methods hoisted out of loops.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable
from heapq import heappop, heappush
from itertools import count
from typing import Annotated, Any

import msgspec
import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

LANES = 6

# ---------------------------------------------------------------------------- queue


class SixDequeQueue:
    """Six FIFO lanes, priority 0 served first: the design of EventQueue, in Python."""

    __slots__ = ("_lanes",)

    def __init__(self) -> None:
        self._lanes: tuple[deque[Any], ...] = tuple(deque() for _ in range(LANES))

    def push(self, item: Any, priority: int) -> None:
        self._lanes[priority].append(item)

    def pop(self) -> Any:
        for lane in self._lanes:
            if lane:
                return lane.popleft()
        return None

    def push_many(self, items: Iterable[Any]) -> None:
        """Queue items that carry their own ``priority`` attribute, as events do."""
        lanes = self._lanes
        for item in items:
            lanes[item.priority].append(item)

    def pop_many(self, n: int) -> list[Any]:
        """Up to ``n`` items in priority order, whole lanes moved at C speed."""
        out: list[Any] = []
        for lane in self._lanes:
            want = n - len(out)
            if want <= 0:
                break
            if len(lane) <= want:
                out.extend(lane)
                lane.clear()
            else:
                popleft = lane.popleft
                out.extend([popleft() for _ in range(want)])
        return out


# ---------------------------------------------------------------------------- dedup


class CountDedup:
    """Seen-id window bounded by entry count: a set for lookups, a deque for eviction order."""

    __slots__ = ("_max", "_order", "_seen")

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._seen: set[str] = set()
        self._order: deque[str] = deque()

    def check_and_insert(self, id_: str) -> bool:
        seen = self._seen
        if id_ in seen:
            return False
        seen.add(id_)
        order = self._order
        order.append(id_)
        if len(order) > self._max:
            seen.discard(order.popleft())
        return True

    def check_and_insert_many(self, ids: Iterable[str]) -> list[bool]:
        """``check_and_insert`` for each id, the loop inside one method with names hoisted."""
        seen = self._seen
        order = self._order
        add, append, popleft, discard = seen.add, order.append, order.popleft, seen.discard
        limit = self._max
        out: list[bool] = []
        keep = out.append
        for id_ in ids:
            if id_ in seen:
                keep(False)
                continue
            add(id_)
            append(id_)
            if len(order) > limit:
                discard(popleft())
            keep(True)
        return out


class TimeDedup:
    """The same window also bounded by time, as DedupWindow is: entries older
    than ``window_ms`` are expired from the front of the deque on every call."""

    __slots__ = ("_max", "_order", "_seen", "_window")

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self._window = window_ms / 1000.0
        self._max = max_entries
        self._seen: set[str] = set()
        self._order: deque[tuple[float, str]] = deque()

    def check_and_insert(self, id_: str) -> bool:
        now = time.time()
        order = self._order
        seen = self._seen
        cutoff = now - self._window
        while order and order[0][0] <= cutoff:
            seen.discard(order.popleft()[1])
        if id_ in seen:
            return False
        seen.add(id_)
        order.append((now, id_))
        if len(order) > self._max:
            seen.discard(order.popleft()[1])
        return True

    def check_and_insert_at(self, id_: str, now: float) -> bool:
        """The same at a given time, so a batch reads the clock once, as the Ingestor does."""
        order = self._order
        seen = self._seen
        cutoff = now - self._window
        while order and order[0][0] <= cutoff:
            seen.discard(order.popleft()[1])
        if id_ in seen:
            return False
        seen.add(id_)
        order.append((now, id_))
        if len(order) > self._max:
            seen.discard(order.popleft()[1])
        return True


# ---------------------------------------------------------------------------- decode

# The core's rule for ``type``: NAMESPACE:NAME, capitals, digits and ``_``.
TYPE_PATTERN = r"^[A-Z][A-Z0-9_]*:[A-Z][A-Z0-9_]*\Z"
_TYPE_RE = re.compile(TYPE_PATTERN)

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class EnvelopeAny(msgspec.Struct, rename="camel", frozen=True):
    """The envelope validated as the core validates it, payload decoded to Python objects."""

    id: NonEmpty
    timestamp: Annotated[int, msgspec.Meta(ge=0)]
    trace_id: NonEmpty
    source: NonEmpty
    session_id: NonEmpty
    priority: Annotated[int, msgspec.Meta(ge=0, le=5)]
    type: Annotated[str, msgspec.Meta(pattern=TYPE_PATTERN)]
    payload: Any
    parent_id: NonEmpty | None = None


class EnvelopeRaw(msgspec.Struct, rename="camel", frozen=True):
    """The same, payload kept as raw JSON bytes (msgspec's equivalent of lazy)."""

    id: NonEmpty
    timestamp: Annotated[int, msgspec.Meta(ge=0)]
    trace_id: NonEmpty
    source: NonEmpty
    session_id: NonEmpty
    priority: Annotated[int, msgspec.Meta(ge=0, le=5)]
    type: Annotated[str, msgspec.Meta(pattern=TYPE_PATTERN)]
    payload: msgspec.Raw
    parent_id: NonEmpty | None = None


class EnvelopeModel(BaseModel):
    """The envelope as a strict pydantic v2 model with the wire's camelCase aliases."""

    model_config = ConfigDict(strict=True, frozen=True, alias_generator=to_camel)

    id: str = Field(min_length=1)
    timestamp: int = Field(ge=0)
    trace_id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    session_id: str = Field(min_length=1)
    priority: int = Field(ge=0, le=5)
    type: str = Field(pattern=TYPE_PATTERN.replace(r"\Z", "$"))
    payload: Any
    parent_id: str | None = Field(default=None, min_length=1)


# ---------------------------------------------------------------------------- ingest

_NON_EMPTY = ("id", "traceId", "source", "sessionId")


def validate_envelope(obj: Any) -> str | None:
    """The core's header checks on a decoded JSON object; the error message, or ``None``."""
    if type(obj) is not dict:
        return "an event must be a JSON object"
    for name in _NON_EMPTY:
        value = obj.get(name)
        if type(value) is not str or not value:
            return f"field {name!r}: missing or not a non-empty string"
    ts = obj.get("timestamp")
    if type(ts) is not int or ts < 0:
        return "field 'timestamp': expected a non-negative integer"
    priority = obj.get("priority")
    if type(priority) is not int or not 0 <= priority <= 5:
        return "field 'priority': expected an integer 0..5"
    type_ = obj.get("type")
    if type(type_) is not str or _TYPE_RE.match(type_) is None:
        return "field 'type': not NAMESPACE:NAME in capitals"
    if "payload" not in obj:
        return "field 'payload': missing required field"
    if "parentId" in obj:
        parent = obj["parentId"]
        if type(parent) is not str or not parent:
            return "field 'parentId': must be a non-empty string"
    return None


class PythonIngestResult:
    __slots__ = ("accepted", "duplicates", "invalid")

    def __init__(self) -> None:
        self.accepted = 0
        self.duplicates = 0
        self.invalid: list[tuple[int, str]] = []


def python_ingest(
    data: bytes, dedup: TimeDedup, heap: list[tuple[int, int, Any]]
) -> PythonIngestResult:
    """NDJSON to a heap: orjson per line, the core's validation, set/deque dedup, heappush."""
    result = PythonIngestResult()
    seq = count()
    now = time.time()
    check = dedup.check_and_insert_at
    loads = orjson.loads
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    for index, line in enumerate(lines):
        try:
            obj = loads(line)
        except orjson.JSONDecodeError as e:
            result.invalid.append((index, str(e)))
            continue
        error = validate_envelope(obj)
        if error is not None:
            result.invalid.append((index, error))
        elif check(obj["id"], now):
            heappush(heap, (obj["priority"], next(seq), obj))
            result.accepted += 1
        else:
            result.duplicates += 1
    return result


def python_drain(heap: list[tuple[int, int, Any]]) -> list[Any]:
    """Pop every item, priority order then arrival order."""
    return [heappop(heap)[2] for _ in range(len(heap))]
