"""The backend seam: what a backend does for the bus, what it may ask of the bus,
and the registry that finds a backend by the scheme of a URL.

The bus never imports a backend. A backend makes itself known in one of two ways:

- by the ``openstarry.bus_backends`` entry point group, one entry per URL scheme,
  naming its factory (openstarry's own Redis backend registers ``redis``,
  ``rediss``, ``unix`` and ``redis+cluster`` this way, in ``pyproject.toml``),
  so that ``EventBus.from_url("redis://...")`` finds it without anything imported first;
- or by calling :func:`register_backend` when its module is imported (a backend
  of your own, in a program that imports it before making the bus).

This is how fsspec finds its filesystems and SQLAlchemy its dialects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from openstarry.core import Event

__all__ = [
    "BackendFactory",
    "BusBackend",
    "BusHost",
    "backend_for_url",
    "open_journal",
    "register_backend",
]

#: The entry point group that backends register their URL schemes in.
ENTRY_POINTS = "openstarry.bus_backends"


class BusHost(Protocol):
    """What a backend may ask of the bus it runs for (:class:`~openstarry.bus.EventBus`)."""

    @property
    def closed(self) -> bool:
        """Whether the bus refuses new events (it is closing or closed)."""

    def feed(self, events: Sequence[Event]) -> None:
        """Queue events the backend delivered, in order (see :meth:`EventBus.feed`)."""

    def __len__(self) -> int:
        """Events waiting for dispatch."""


@runtime_checkable
class BusBackend(Protocol):
    """Where a bus's events live between publish and dispatch when they leave the process.

    A backend takes what the bus publishes (:meth:`send`, :meth:`asend`) and,
    while the bus runs (:meth:`running`), pushes the events it delivers to this
    process into the bus's queue with :meth:`EventBus.feed`. The bus tells it
    when a delivered event is done (:meth:`done`): handled, failed (a handler
    raised) or handed back (not handled: to be delivered again, here or elsewhere).
    """

    def send(self, event: Event, cause: Event | None = None) -> None:
        """Take ``event`` for publishing without waiting.

        ``cause`` is the delivered event whose handling publishes it: the
        backend may hold ``event`` back until ``cause`` is done, and commit
        both together (nothing of a cause that is not handled is published).

        Raises:
            QueueFull: the backend's outgoing buffer is full.
        """

    async def asend(self, event: Event, cause: Event | None = None) -> bool:
        """Publish ``event`` and wait for the answer: ``False`` for a duplicate id.

        With a held ``cause`` it does not wait: the event is taken (``True``)
        and committed with ``cause``.
        """

    def running(self, bus: BusHost) -> AbstractAsyncContextManager[object]:
        """Connect and deliver to ``bus`` while the context is entered; flush on leaving."""

    def done(self, event: Event, outcome: str) -> None:
        """A delivered event is finished: ``"handled"``, ``"failed"`` or ``"returned"``."""

    async def flush(self) -> None:
        """Wait until what was sent so far has reached the backend."""

    def metrics(self) -> dict[str, Any]:
        """The backend's own counters."""


async def open_journal(backend: BusBackend | None, event: Event, run_id: str | None = None) -> Any:
    """The journal of the work on ``event``, where the backend keeps journals, else ``None``.

    ``run_id``: instead, the journal of another event of the same session, which
    ``event``'s handling records a step in (an approval's answer, for the run
    that waits for it); it is that run's commit that deletes it.

    A backend that keeps them (Redis: ``RedisStreams.journal``) answers for an
    event it delivered to this process: an object with ``steps``, what earlier
    attempts at the work recorded (bytes, oldest first), and ``await
    record(step)``, which returns once the backend holds the step. The journal
    is deleted with the event's commit.

    Raises:
        LeaseLost: the backend leases its partitions, and the lease ``event`` was
            delivered under holds another worker now (this process was frozen or
            cut off past it): the new owner runs it; this process must not.
    """
    journal = getattr(backend, "journal", None)
    if journal is None:
        return None
    return await (journal(event) if run_id is None else journal(event, run_id))


def follow_session(
    backend: BusBackend | None,
    session_id: str,
    handler: Callable[[list[Event], bool], None],
) -> AbstractAsyncContextManager[None] | None:
    """Follow what is committed in ``session_id``'s partition, whoever runs it, where the
    backend can (Redis: ``RedisStreams.follower``), else ``None``.

    Inside the returned context, ``handler(events, caught_up)`` is called after each
    read of the partition, with its events in the order of their streams (every
    session of the partition: filter them). ``caught_up`` says that the read holds
    all that was committed there before it: a commit it holds any of, it holds
    whole. Whatever is published after the context is entered is seen. The
    process that published an input (``openstarry serve``) sees its run's events
    this way when another worker of the group runs it.
    """
    follower = getattr(backend, "follower", None)
    if follower is None:
        return None
    context: AbstractAsyncContextManager[None] = follower.follow(session_id, handler)
    return context


class BackendFactory(Protocol):
    """Makes a backend for a URL: what a scheme's entry point (or :func:`register_backend`) names.

    ``group`` and ``consumer`` name the consumer group and this consumer in it
    (``None``: the backend's defaults); ``consume=False`` makes a producer
    only; other keyword arguments are the backend's own options.
    """

    def __call__(
        self,
        url: str,
        *,
        group: str | None,
        consumer: str | None,
        consume: bool,
        **options: Any,
    ) -> BusBackend: ...


_registry: dict[str, BackendFactory] = {}
_lock = threading.Lock()


def register_backend(factory: BackendFactory, *schemes: str) -> None:
    """Make ``factory`` the backend of URLs with these schemes (``"redis"``: ``redis://...``).

    A scheme registered again is taken by the later factory.

    Raises:
        ValueError: no scheme, or one that is empty or not lower case.
    """
    if not schemes:
        raise ValueError("register_backend needs at least one URL scheme")
    for scheme in schemes:
        if not scheme or scheme != scheme.lower() or "://" in scheme:
            raise ValueError(f"a URL scheme is lower case, without '://': {scheme!r}")
    with _lock:
        for scheme in schemes:
            _registry[scheme] = factory


def _from_entry_points(scheme: str) -> BackendFactory | None:
    """The factory the ``openstarry.bus_backends`` entry point of ``scheme`` names, loaded."""
    for entry in entry_points(group=ENTRY_POINTS, name=scheme):
        factory: BackendFactory = entry.load()  # an ImportError names the missing extra
        with _lock:
            _registry.setdefault(scheme, factory)
            return _registry[scheme]
    return None


def backend_for_url(
    url: str,
    *,
    group: str | None = None,
    consumer: str | None = None,
    consume: bool = True,
    **options: Any,
) -> BusBackend:
    """The backend that the scheme of ``url`` names, made for ``url``.

    Raises:
        ValueError: a URL without a scheme, or a scheme no backend registered.
        ImportError: the backend's extra is not installed (``pip install 'openstarry[redis]'``).
    """
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or not scheme:
        raise ValueError(f"bus URL {url!r}: expected scheme://..., such as redis://host:port/db")
    factory = _registry.get(scheme) or _from_entry_points(scheme)
    if factory is None:
        known = sorted(set(_registry) | {e.name for e in entry_points(group=ENTRY_POINTS)})
        raise ValueError(
            f"bus URL {url!r}: no backend for {scheme}:// (known: local:, "
            + ", ".join(f"{name}://" for name in known)
            + ")"
        )
    return factory(url, group=group, consumer=consumer, consume=consume, **options)
