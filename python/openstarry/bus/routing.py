"""Subscriptions and the routing table: which handlers an event type reaches.

A pattern is an exact type (``"EXEC:TOOL_CALL"``), a namespace (``"EXEC:*"``)
or ``"*"``. :class:`Routes` keeps, for each type seen, the handlers it
reaches (resolved once, refreshed when a subscription changes) and the
dispatch count of that type.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from openstarry.core import Event

__all__ = ["Handler", "Subscription", "describe_exception"]

#: A handler takes the event; it may be a plain function or a coroutine function.
Handler = Callable[[Event], "Awaitable[None] | None"]


class Subscription:
    """What :meth:`EventBus.subscribe` returns; :meth:`cancel` ends the subscription."""

    __slots__ = ("_routes", "handler", "is_async", "pattern")

    def __init__(self, routes: Routes, pattern: str, handler: Handler) -> None:
        #: ``None`` once cancelled (the dispatcher skips it mid-dispatch).
        self._routes: Routes | None = routes
        self.pattern = pattern
        self.handler = handler
        self.is_async = inspect.iscoroutinefunction(handler)

    def cancel(self) -> None:
        """Stop delivering events to the handler; calling it again does nothing."""
        routes, self._routes = self._routes, None
        if routes is not None:
            routes.remove(self)

    def __repr__(self) -> str:
        return f"<Subscription {self.pattern!r} -> {name_of(self.handler)}>"


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"``, even for an exception whose ``str()`` raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message cannot be printed)"


def name_of(handler: object) -> str:
    name = getattr(handler, "__qualname__", None)
    if isinstance(name, str):
        return name
    try:
        return repr(handler)
    except Exception:
        return type(handler).__qualname__


#: Past this many distinct event types, the route cache starts over and the
#: per-type counts go under ``"*"`` (types are open-ended: a peer could send new
#: ones forever).
_MAX_TYPES = 1024


def check_pattern(pattern: str) -> None:
    namespace, colon, name = pattern.partition(":")
    if pattern == "*" or (colon and namespace and name and "*" not in namespace):
        if "*" in name and name != "*":
            raise ValueError(f"pattern {pattern!r}: '*' stands only for a whole name (NAMESPACE:*)")
        return
    raise ValueError(
        f"pattern {pattern!r}: expected TYPE like 'INPUT:USER_MESSAGE', 'NAMESPACE:*' or '*'"
    )


class Routes:
    """Who an event type reaches: the subscriptions in order, and a route cached per type.

    A cached entry is ``[route, dispatched, sole, outcome]``: the dispatcher
    counts an event in the entry it looked up anyway (the counts move to
    :attr:`dispatched` when the cache is cleared), ``sole`` is the handler of a
    route of one plain function, which the dispatcher calls without the
    general loop, and ``outcome`` what the handles of the type's events answer
    when no handler raises. The
    dispatcher binds :attr:`by_type` once and calls :meth:`of` only on a miss,
    so the cache is cleared in place, never replaced.
    """

    __slots__ = ("by_type", "dispatched", "subscriptions")

    def __init__(self) -> None:
        self.subscriptions: list[Subscription] = []
        self.by_type: dict[str, list[Any]] = {}
        #: Events dispatched by type, except those counted in ``by_type`` since its last clear.
        self.dispatched: dict[str, int] = {}

    def add(self, subscription: Subscription) -> None:
        self.subscriptions.append(subscription)
        self._clear()

    def remove(self, subscription: Subscription) -> None:
        self.subscriptions = [s for s in self.subscriptions if s is not subscription]
        self._clear()

    def of(self, event_type: str) -> list[Any]:
        """The entry of ``event_type``, computed and cached."""
        namespace = event_type.partition(":")[0] + ":*"
        route = tuple(
            s
            for s in self.subscriptions
            if s.pattern == event_type or s.pattern == namespace or s.pattern == "*"
        )
        if len(self.by_type) >= _MAX_TYPES:
            self._clear()
        sole = route[0].handler if len(route) == 1 and not route[0].is_async else None
        outcome = "handled" if route else "no_subscriber"
        entry = self.by_type[event_type] = [route, 0, sole, outcome]
        return entry

    def counts(self) -> dict[str, int]:
        """Events dispatched by type (past 1,024 types, the others under ``"*"``)."""
        return _fold(dict(self.dispatched), self.by_type)

    def _clear(self) -> None:
        _fold(self.dispatched, self.by_type)
        self.by_type.clear()


def _fold(counts: dict[str, int], entries: dict[str, list[Any]]) -> dict[str, int]:
    for event_type, entry in entries.items():
        n = entry[1]
        if not n:
            continue
        if event_type in counts or len(counts) < _MAX_TYPES:
            counts[event_type] = counts.get(event_type, 0) + n
        else:
            counts["*"] = counts.get("*", 0) + n
    return counts
