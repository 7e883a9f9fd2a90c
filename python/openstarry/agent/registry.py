"""Tool-set fingerprints and the schema cache (spec 000 section 6A, "Registry & Caching").

A provider whose API can hold tool declarations server-side (a context cache,
an uploaded ``tools_id``) uploads a tool set once and refers to it afterwards;
one whose API cannot still translates each tool set once. Both need to know
when "the same tools" come round again:

- :func:`tool_set_fingerprint` names a tool set by its content: the SHA-256 of
  the canonical JSON of every tool's name, description and parameters. It does
  not depend on the order of the tools nor of any schema's keys, and is the
  same in every process and on every machine.
- :class:`SchemaCache` keeps a bounded number of translated or uploaded forms,
  keyed by ``(api name, fingerprint)``, least recently used out first::

      cache: SchemaCache[str] = SchemaCache()
      tools_id = await cache.aget_or_create(
          SchemaCache.key_for("gemini", context.tools),
          lambda: upload(context.tools),  # runs once per tool set
      )
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio

if TYPE_CHECKING:
    from openstarry.agent.interfaces import Tool

__all__ = ["FINGERPRINT_PREFIX", "CacheKey", "SchemaCache", "tool_set_fingerprint"]

#: What every fingerprint starts with, so one is recognisable in logs and keys.
FINGERPRINT_PREFIX = "ts_"

#: ``(api name, tool-set fingerprint)``.
CacheKey = tuple[str, str]

V = TypeVar("V")


def _tools_of(tools: Mapping[str, Tool] | Iterable[Tool]) -> list[Tool]:
    return list(tools.values() if isinstance(tools, Mapping) else tools)


def canonical_tool_set(tools: Mapping[str, Tool] | Iterable[Tool]) -> bytes:
    """The canonical JSON that :func:`tool_set_fingerprint` hashes.

    A list of ``{"description", "name", "parameters"}`` objects sorted by name,
    keys sorted at every depth, no whitespace, UTF-8 (non-ASCII text kept as it
    is, not escaped; a lone surrogate encoded as its code point).

    Raises:
        ValueError: when two tools share a name, or a schema holds NaN or infinity.
        TypeError: when a schema holds something JSON cannot represent.
    """
    described: dict[str, dict[str, Any]] = {}
    for tool in _tools_of(tools):
        entry = tool.describe()
        name = entry["name"]
        if name in described:
            raise ValueError(f"two tools are named {name!r}: a tool set needs unique names")
        described[name] = {
            "name": name,
            "description": entry.get("description", ""),
            "parameters": entry.get("parameters", {}),
        }
    ordered = [described[name] for name in sorted(described)]
    try:
        text = json.dumps(
            ordered, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        bad = _first_unserialisable(ordered)
        raise type(exc)(f"tool {bad!r}: its schema is not plain JSON ({exc})") from exc
    # A lone surrogate (from bytes read with surrogateescape) is kept as its code.
    return text.encode("utf-8", "surrogatepass")


def _first_unserialisable(entries: list[dict[str, Any]]) -> str:
    for entry in entries:
        try:
            json.dumps(entry, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):
            return str(entry["name"])
    return "?"


def tool_set_fingerprint(tools: Mapping[str, Tool] | Iterable[Tool]) -> str:
    """A stable name for a tool set: ``"ts_"`` and the SHA-256 (hex) of :func:`canonical_tool_set`.

    Equal for the same tools in any order (and schemas with their keys in any
    order), in any process; different when any tool's name, description or
    parameters differ, or a tool is added or removed. For a mapping, the tools
    are its values (their own names count, not the keys).

    Raises:
        ValueError: when two tools share a name, or a schema holds NaN or infinity.
        TypeError: when a schema holds something JSON cannot represent.
    """
    return FINGERPRINT_PREFIX + hashlib.sha256(canonical_tool_set(tools)).hexdigest()


class _Flight:
    """One creation in progress, that other tasks asking for its key wait on."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = anyio.Event()


class SchemaCache(Generic[V]):
    """A bounded LRU map from ``(api name, tool-set fingerprint)`` to what a provider made of it.

    The form is whatever the provider derives once per tool set: translated
    declarations, or the id a server returned for an upload. Lookups and
    insertions are thread-safe. :meth:`aget_or_create` runs an async factory
    (an upload) once per key even when several tasks of one event loop ask at
    the same time: the others wait for it, and if it fails or is cancelled the
    next of them tries again. Tasks of event loops in other threads do not
    wait for it (an event loop cannot wait on another's signal): each thread
    makes its own, and the first stored wins.

    Args:
        max_entries: How many forms it keeps; the least recently used is dropped
            to make room.

    Attributes:
        hits: Lookups that found their key.
        misses: Lookups that did not (each ran, or waited for, a factory).
        evictions: Entries dropped to make room.
    """

    def __init__(self, max_entries: int = 64) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int of at least 1, not {max_entries!r}")
        self.max_entries = max_entries
        self._entries: OrderedDict[CacheKey, V] = OrderedDict()
        self._lock = threading.Lock()
        # Creations in progress, per key and per thread (one event loop each).
        self._flights: dict[tuple[CacheKey, int], _Flight] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @staticmethod
    def key_for(api: str, tools: Mapping[str, Tool] | Iterable[Tool]) -> CacheKey:
        """The key of ``tools`` for ``api``: ``(api, tool_set_fingerprint(tools))``."""
        return (api, tool_set_fingerprint(tools))

    def get(self, key: CacheKey) -> V | None:
        """The value of ``key`` (now the most recently used), or None; counts a hit or a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
            self.misses += 1
            return None

    def put(self, key: CacheKey, value: V) -> None:
        """Store ``value`` under ``key`` as the most recently used, evicting beyond the bound."""
        with self._lock:
            self._store(key, value)

    def _store(self, key: CacheKey, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1

    def get_or_create(self, key: CacheKey, factory: Callable[[], V]) -> V:
        """The value of ``key``, made by ``factory()`` and stored if absent.

        ``factory`` runs outside the lock; when two threads race on one key,
        the first value stored wins and both get it. An exception from
        ``factory`` propagates and nothing is stored.
        """
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
            self.misses += 1
        value = factory()
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            self._store(key, value)
            return value

    async def aget_or_create(self, key: CacheKey, factory: Callable[[], Awaitable[V]]) -> V:
        """The value of ``key``, made by ``await factory()`` and stored if absent.

        Within one event loop the factory runs once per key at a time: a task
        asking while another is creating waits for it. When the creator fails
        or is cancelled, nothing is stored, its exception goes to it alone, and
        a waiting task makes its own attempt. An event loop in another thread
        does not wait for this one's creation: it runs its own factory, and
        when both finish the value stored first is kept and returned to both.
        """
        counted = False
        flight_key = (key, threading.get_ident())
        while True:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    if not counted:
                        self.hits += 1
                    return self._entries[key]
                if not counted:
                    self.misses += 1
                    counted = True
                flight = self._flights.get(flight_key)
                if flight is None:
                    flight = self._flights[flight_key] = _Flight()
                    owner = True
                else:
                    owner = False
            if not owner:
                await flight.done.wait()
                continue
            try:
                value = await factory()
                with self._lock:
                    if key in self._entries:  # stored meanwhile by another thread
                        self._entries.move_to_end(key)
                        value = self._entries[key]
                    else:
                        self._store(key, value)
                return value
            finally:
                with self._lock:
                    del self._flights[flight_key]
                flight.done.set()

    def discard(self, key: CacheKey) -> None:
        """Forget ``key`` (say, when the server dropped an upload); nothing if absent."""
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()

    def keys(self) -> list[CacheKey]:
        """The keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"<SchemaCache {len(self)}/{self.max_entries} hits={self.hits} "
            f"misses={self.misses} evictions={self.evictions}>"
        )
