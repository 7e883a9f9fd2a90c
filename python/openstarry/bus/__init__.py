"""The event bus: publish and subscribe over the Rust priority queue and dedup window.

``EventBus`` is where every event of an agent passes: inputs from transports,
the execution loop's kernel and exec events, errors. Publishing puts an event in
an :class:`~openstarry.core.EventQueue` (priority 0 first, FIFO within a
priority) after the :class:`~openstarry.core.DedupWindow` has checked its id; one
dispatcher task takes the events out in priority order and calls the handlers
subscribed to their type.

    async with EventBus() as bus:
        bus.subscribe("INPUT:*", on_input)
        event = Event.new("INPUT:USER_MESSAGE", {"text": "hi"}, source="cli", session_id="s1")
        outcome = await bus.publish(event)  # "handled" once on_input has returned

Rules the bus keeps:

- **Priority end to end.** The dispatcher takes the waiting events out of the
  queue in batches (one call into Rust per batch, not per event), and a
  priority-0 event published while handlers run still overtakes every
  lower-priority event waiting, in the queue or in the batch.
- **Idempotency.** An event whose id was seen within the window is dropped
  (``publish`` returns a falsy handle) and counted in ``metrics()["duplicates"]``.
- **Handled, on request.** ``publish`` returns a :class:`Published` handle;
  ``await`` it to wait until the event's handlers have finished. Nothing is
  made for waiting until something awaits.
- **One wake-up per batch.** Publishing wakes the dispatcher only when it is
  asleep; a burst of publishes costs one wake-up, and the dispatcher then
  drains the queue without sleeping.
- **Handlers never kill the bus.** A handler that raises becomes a
  ``KERNEL:ERROR`` event (a child of the event it was handling, so it keeps the
  ``traceId`` and ``sessionId``) and dispatch goes on.
- **Handlers run one at a time, in order.** The dispatcher awaits an async
  handler before it dispatches the next event, so a handler should be short;
  long work (a whole agent run) belongs in a task the handler starts, as the
  execution loop does.

Publish from the thread that runs the event loop. Trace propagation is the
events' own: :meth:`Event.child <openstarry.core.Event.child>` keeps the trace
and session and records the parent.

**Backends.** By default the events wait in this process (the Rust queue and
dedup window above). Given a :class:`BusBackend`, such as the Redis Streams one
of :mod:`openstarry.bus.redis` (``EventBus.from_url("redis://...")``), a
published event goes to the backend, which may be shared by many processes,
and the backend feeds the dispatcher the events it fetched. Handlers,
subscriptions, metrics and the execution loop do not know which backend runs;
what a remote backend adds is acknowledgement: an event it delivered counts as
handled once its handlers have returned and every :meth:`EventBus.hold` on it
has been released. What its handling publishes (from its handlers, or inside
:meth:`EventBus.effects_of` for work that outlives them) is its *effects*: a
remote backend holds them back and commits them together with the event's
acknowledgement, so that a crash leaves either both or neither.

The package, by seam: :mod:`~openstarry.bus.eventbus` (the bus: subscribe,
publish, lifecycle, metrics), :mod:`~openstarry.bus.dispatch` (the dispatcher),
:mod:`~openstarry.bus.routing` (subscriptions and the routing table),
:mod:`~openstarry.bus.backend` (the backend seam and its registry by URL
scheme), :mod:`~openstarry.bus.remote` (publishing to a backend),
:mod:`~openstarry.bus.signals` and :mod:`~openstarry.bus.handles`. The Redis
backend is :mod:`openstarry.bus.redis`; the bus never imports it.
"""

from __future__ import annotations

from openstarry._core import Published
from openstarry.bus.backend import (
    BackendFactory,
    BusBackend,
    BusHost,
    backend_for_url,
    follow_session,
    open_journal,
    register_backend,
)
from openstarry.bus.eventbus import Emit, EventBus
from openstarry.bus.handles import Outcome
from openstarry.bus.routing import Handler, Subscription, describe_exception
from openstarry.bus.signals import Signal, signal_factory

__all__ = [
    "BackendFactory",
    "BusBackend",
    "BusHost",
    "Emit",
    "EventBus",
    "Handler",
    "Outcome",
    "Published",
    "Signal",
    "Subscription",
    "backend_for_url",
    "describe_exception",
    "follow_session",
    "open_journal",
    "register_backend",
    "signal_factory",
]
