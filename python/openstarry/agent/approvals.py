"""``/approve ID`` and ``/deny ID [reason]``: a person's answer to an approval request.

The loop runs them as built-in commands of the session (from a user message, or
an ``INPUT:SYSTEM_COMMAND``). On the local bus an answer wakes the wait of that
id. On a bus that keeps journals (Redis), the id names the durable run that
waits (:func:`~openstarry.agent.journal.run_of_approval`): the answer is first
recorded in that run's journal, under the command's own lease, and only then
acknowledged. The run waiting on this worker is woken; a run that no worker runs
at the moment (every worker restarted) finds the answer when it is handled
again; a run still replaying up to its wait gets it kept until it opens the wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openstarry.agent.journal import record_answer, run_of_approval
from openstarry.agent.outbox import Outbox
from openstarry.agent.waits import Answer, Waits
from openstarry.bus import EventBus, open_journal
from openstarry.core import Event
from openstarry.errors import LeaseLost

__all__ = ["answer_approval"]


def answer_approval(
    event: Event,
    name: str,
    args: list[str],
    bus: EventBus,
    waits: Waits,
    outbox: Outbox,
    start_soon: Callable[..., Any] | None,
) -> None:
    """Run ``/approve ID`` or ``/deny ID [reason]`` (``name`` and ``args``), sent as ``event``.

    ``start_soon`` starts the recording in the loop's task group (``None``: the
    loop has stopped, and the wait, if any, is answered here).
    """
    if not args:
        outbox.error(event, "INVALID_INPUT", f"/{name} needs an approval id")
        return
    answer = Answer(approve=name == "approve", reason=" ".join(args[1:]) or None)
    run_id = run_of_approval(args[0])
    if run_id is not None and start_soon is not None and bus.hold(event):
        start_soon(_record, event, name, args[0], run_id, answer, bus, waits, outbox)
        return
    _answered(event, name, args[0], answer, waits, outbox, recorded=False)


async def _record(
    event: Event,
    name: str,
    approval: str,
    run_id: str,
    answer: Answer,
    bus: EventBus,
    waits: Waits,
    outbox: Outbox,
) -> None:
    """Record the answer in the waiting run's journal, then answer (the event is held)."""
    try:
        with bus.effects_of(event):
            journal = await open_journal(bus.backend, event, run_id)
            if journal is not None:
                await record_answer(journal, approval, answer.approve, answer.reason)
            _answered(event, name, approval, answer, waits, outbox, recorded=journal is not None)
    except LeaseLost:
        pass  # the partition's new owner handles the command
    finally:
        bus.release(event)


def _answered(
    event: Event,
    name: str,
    approval: str,
    answer: Answer,
    waits: Waits,
    outbox: Outbox,
    *,
    recorded: bool,
) -> None:
    """Wake the wait (or keep the answer for it, when it was recorded); say what happened."""
    found = waits.answer(event.session_id, approval, answer)
    if not found and recorded:
        # Its run has not reached the wait yet (it replays up to it): kept for it.
        waits.keep(event.session_id, approval, answer)
    verb = "Approved" if answer.approve else "Denied"
    if found or recorded:
        outbox.say(event, f"{verb}: {approval}.", command=name)
    else:
        outbox.error(
            event, "UNKNOWN_APPROVAL", f"session {event.session_id!r} waits for no {approval}"
        )
