"""What awaiting a :class:`~openstarry.core.Published` handle answers, and the handles
the bus makes itself (a duplicate, an event sent to a remote backend)."""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any, Literal

from openstarry._core import Published, _install_published_hooks
from openstarry.bus.signals import signal_factory
from openstarry.core import Event

__all__ = ["Outcome"]

#: The bus's clock (publish and dispatch times), one for the whole package.
_perf_ns = time.perf_counter_ns

#: The delivered event whose handling runs in this task: what the task
#: publishes are its effects (a remote backend commits them with its acknowledgement).
CAUSE: ContextVar[Event | None] = ContextVar("openstarry_bus_cause", default=None)

#: How the handling of a published event ended, as awaiting its :class:`Published` answers.
Outcome = Literal["handled", "failed", "no_subscriber", "duplicate", "stopped"]

#: The state of a handle sent to a remote backend (not an outcome: see :meth:`Published.handled`).
_REMOTE = "remote"


async def _await_handle(handle: Published) -> Outcome:
    """What awaiting a :class:`Published` handle runs (``await handle``, ``handle.handled()``).

    Nothing is made for waiting until something awaits: the first awaiter
    stores a signal in the handle, which the dispatcher sets with the outcome.
    """
    state = handle._state
    if type(state) is str:
        if state == _REMOTE:
            raise RuntimeError(
                "an event published to a remote backend is handled by its consumers, "
                "out of this bus's sight: there is nothing to await"
            )
        return state  # type: ignore[return-value]
    if state is None:
        state = signal_factory()()
        handle._state = state
    await state.wait()
    outcome = handle._state
    if type(outcome) is str:
        return outcome  # type: ignore[return-value]
    return "stopped"  # woken by a bus that stopped: the event is still queued


_install_published_hooks(_await_handle, lambda: _perf_ns())


def refused_handle(event: Event) -> Published:
    handle = Published(event)
    handle._finish("duplicate")
    return handle


def sent_handle(event: Event) -> Published:
    handle = Published(event)
    handle._finish(_REMOTE)
    return handle


def not_an_event(thing: object) -> str:
    return f"publish takes an openstarry.core.Event, not {type(thing).__name__}"


def priority_of(item: Any) -> int:
    """The priority of a queued item: a :class:`Published` or an ingested or fed event."""
    event = item.event if type(item) is Published else item
    priority: int = event.priority
    return priority
