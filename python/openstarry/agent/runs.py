"""How the loop serves one input of a session, by the bus it runs on and its store.

- **The local bus**: the :class:`~openstarry.agent.turn.Turn` alone; no
  acknowledgement, no effects held back.
- **A store**: the session's memory is loaded before the turn and saved after
  it (unless a ``/reset`` deleted it meanwhile), the save shielded from a stop.
- **A remote bus**: the run's events are its input's effects, published with
  its acknowledgement, all or nothing; a run stopped or timed out is finished
  inside them, in a scope of its own, and a run cut short by the agent
  stopping is handed back for another worker to run. Where the backend keeps
  journals (Redis) the run is durable (:mod:`openstarry.agent.journal`), and
  a store that commits with the bus (:class:`~openstarry.stores.RedisStore` on
  the bus's Redis) has the session's memory written by that same commit, so a
  worker frozen past its lease and thawed changes nothing. An input whose
  partition has another owner by the time its run would start is not run here.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio

from openstarry.agent.journal import RunJournal
from openstarry.agent.results import RunResult
from openstarry.agent.sessions import SessionRuntime
from openstarry.agent.store import SessionStore, memory_from_data, memory_to_data
from openstarry.agent.taskscope import CancelScopeLike
from openstarry.agent.turn import Turn, TurnHost
from openstarry.bus import open_journal
from openstarry.core import Event, EventRef
from openstarry.errors import LeaseLost
from openstarry.events import OUTPUT_RUN_END

__all__ = ["RunHost", "serve_input"]


class RunHost(TurnHost, Protocol):
    """What serving an input uses of the loop, beyond what its turn does."""

    store: SessionStore | None
    _new_scope: Callable[..., CancelScopeLike]
    _open: bool


def serve_input(
    loop: RunHost, rt: SessionRuntime, event: Event | EventRef, text: str | None = None
) -> Coroutine[Any, Any, None]:
    """Serve one input of a session to its end (the session's worker, or its asker, awaits it).

    ``text`` is the input's, when ``event`` is an ``EventRef`` (an input its
    asker handed over without making it: ``Emitter.take_ref``).
    """
    if loop.bus.backend is None:
        store = None if rt.ephemeral else loop.store
        if store is None:
            return Turn(loop, rt, event, text).run()
        return _run_stored(loop, store, rt, event, text)
    assert isinstance(event, Event), "an input of a remote bus is an Event"
    return _run_remote(loop, rt, event)


async def _run_stored(
    loop: RunHost,
    store: SessionStore,
    rt: SessionRuntime,
    event: Event | EventRef,
    text: str | None = None,
    journal: RunJournal | None = None,
) -> None:
    """A run between loading its session from the store and saving it back (with the
    commit of its input, where the store commits with the bus)."""
    memory = rt.session.memory
    enter_scope = rt.enter_scope
    if enter_scope is not None:
        # A store may enter scopes of its own and wait: the run's scope first.
        enter_scope()
        rt.enter_scope = None
    load_with = getattr(store, "load_with", None)
    data = await (
        store.load(rt.session.id) if load_with is None else load_with(loop.bus, rt.session.id)
    )
    memory.clear()
    if data:
        memory.extend(memory_from_data(data))
    epoch = rt.epoch
    lost = False
    try:
        await Turn(loop, rt, event, text, journal).run()
    except LeaseLost:
        lost = True
        raise
    finally:
        if rt.epoch == epoch and not lost:  # a /reset meanwhile deleted it
            data = memory_to_data(memory)
            save_with = getattr(store, "save_with", None)
            if save_with is None or not save_with(loop.bus, event, rt.session.id, data):
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await store.save(rt.session.id, data)


async def _run_remote(loop: RunHost, rt: SessionRuntime, event: Event) -> None:
    """A run on a remote bus, whose events are the effects of its input."""
    bus = loop.bus
    store = None if rt.ephemeral else loop.store
    handled = loop._open
    report, own = _report(loop, event)
    try:
        # (LeaseLost: its partition has another owner now, this worker was frozen.)
        kept = await open_journal(bus.backend, event)
        journal = None if kept is None else RunJournal(kept, event.id)
        # On a remote bus the run's events are the input's effects: they
        # are published with its acknowledgement, atomically. So a run
        # stopped or timed out is finished here, inside them, in a scope
        # of its own rather than in the worker's.
        with bus.effects_of(event):
            worker_scope = rt.live_scope
            try:
                with loop._new_scope() as rt.live_scope:
                    if store is None:
                        await Turn(loop, rt, event, None, journal).run()
                    else:
                        await _run_stored(loop, store, rt, event, None, journal)
            finally:
                rt.live_scope = worker_scope
            stopped, rt.stopped_turn = rt.stopped_turn, None
            if stopped is not None:
                await stopped.finish_stopped()
            if report is not None:
                payload = {"stopped": report.stopped, "error": report.error, "usage": report.usage}
                end = event.child(OUTPUT_RUN_END, payload, source=loop.source, priority=5)
                await bus.apublish(end)
    except LeaseLost:
        # The run is its partition's new owner's: handed back, nothing of this
        # attempt committed, not even an acknowledgement.
        handled = False
    finally:
        if own:
            loop._waiters.forget(event.id)
        # A run cut short by the agent stopping is handed back (another
        # worker runs it); a run that ended, or was /stop-ped, is handled.
        bus.release(event, handled=handled and loop._open)


def _report(loop: RunHost, event: Event) -> tuple[RunResult | None, bool]:
    """The result to report at the end of the run (``OUTPUT:RUN_END``), when its input
    asks for it: the one its local asker waits on, else one filled for the report (and
    whether it is that one, to forget)."""
    payload = event.payload
    if not isinstance(payload, dict) or payload.get("reportEnd") is not True:
        return None, False
    waiters = loop._waiters
    result = waiters.result(event.id)
    if result is not None:
        return result, False
    result = RunResult(event.trace_id)
    waiters.add(event.id, result, None)
    return result, True
