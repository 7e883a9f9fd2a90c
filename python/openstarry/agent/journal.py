"""A durable run: its completed steps recorded as they complete, replayed when it runs again.

On a bus whose backend keeps journals (Redis: :meth:`EventBus.journal
<openstarry.bus.EventBus.journal>`), a run records each step that has
completed before its next one starts:

- a **model response** that asked for tools (a final answer needs no record:
  the run commits right after it), before any of its tools runs;
- each **tool call's outcome** (a denied call's outcome is its denial), with
  what the core observed about the call;
- an **approval request** once it is published (it is published at once, not
  with the run's commit: its client must see it while the run waits), and the
  **approval's answer** (``/approve ID`` or ``/deny ID``, which any worker of
  the session's partition records here before acknowledging it). A run that
  waits for an approval thus survives a restart of every worker: handled
  again, it replays up to the wait, and the answer, recorded or still to
  come, resumes it.

When a worker dies in the middle of a run, its input is handled again, on any
worker, from the start: the run reads its journal and replays what it holds
(the recorded response instead of calling the model, the recorded outcome
instead of running the tool), then goes on live from the first step not
recorded. A tool whose outcome was recorded never runs again. A tool that was
running when the worker died has no outcome recorded, and runs again: a tool
with side effects makes them safe to repeat with
:attr:`AgentContext.idempotency_key <openstarry.agent.AgentContext.idempotency_key>`,
the same on every attempt at the call.

The run's events are its input's effects, committed with its acknowledgement
(all or nothing): a replayed run publishes them once, as if it had run once.
The journal is deleted by that commit.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from openstarry.agent.memory import Observation, ToolFailure, ToolOutcome
from openstarry.core import ProviderResponse, decode_response, encode_response

__all__ = ["BusJournal", "RunJournal", "approval_id", "record_answer", "run_of_approval"]

#: A step's first byte: a model response (then its round, a newline and the
#: response's JSON), a tool call's outcome (then its JSON), an approval request
#: published (then its id), an approval's answer (then its JSON).
_RESPONSE = b"R"
_OUTCOME = b"T"
_ANNOUNCED = b"W"
_ANSWER = b"Y"


class BusJournal(Protocol):
    """What a bus backend's journal offers (see :meth:`EventBus.journal`)."""

    steps: list[bytes]

    async def record(self, step: bytes) -> None: ...


class RunJournal:
    """One run's journal: what earlier attempts recorded, and the recording of this one.

    Args:
        journal: The backend's journal of the run's input.
        input_id: The input's event id (the idempotency keys start with it).
    """

    __slots__ = ("announced", "answers", "input_id", "journal", "outcomes", "responses")

    def __init__(self, journal: BusJournal, input_id: str) -> None:
        self.journal = journal
        self.input_id = input_id
        #: Recorded model responses, by round.
        self.responses: dict[int, bytes] = {}
        #: Recorded outcomes (and observations), by tool call id.
        self.outcomes: dict[str, tuple[ToolOutcome, list[Observation]]] = {}
        #: The approval requests already published, by approval id.
        self.announced: set[str] = set()
        #: The approvals' answers recorded, by approval id: ``(approve, reason)``.
        self.answers: dict[str, tuple[bool, str | None]] = {}
        for step in journal.steps:
            kind = step[:1]
            if kind == _RESPONSE:
                head, _, body = step[1:].partition(b"\n")
                self.responses[int(head)] = body
            elif kind == _OUTCOME:
                outcome, observed = _outcome_from(json.loads(step[1:]))
                self.outcomes[outcome.tool_call_id] = (outcome, observed)
            elif kind == _ANNOUNCED:
                self.announced.add(step[1:].decode())
            elif kind == _ANSWER:
                data = json.loads(step[1:])
                reason = data.get("reason")
                self.answers[str(data["id"])] = (
                    data.get("approve") is True,
                    reason if isinstance(reason, str) else None,
                )

    @property
    def replaying(self) -> bool:
        """Whether earlier attempts recorded steps this one has not replayed yet."""
        return bool(self.responses or self.outcomes)

    def response(self, round_no: int) -> ProviderResponse | None:
        """The model response recorded for round ``round_no``, if one was."""
        body = self.responses.pop(round_no, None)
        return None if body is None else decode_response(body)

    async def record_response(self, round_no: int, response: ProviderResponse) -> None:
        """Record the response of round ``round_no`` (one that asked for tools)."""
        await self.journal.record(b"%s%d\n%s" % (_RESPONSE, round_no, encode_response(response)))

    def outcome(self, call_id: str) -> tuple[ToolOutcome, list[Observation]] | None:
        """The outcome recorded for tool call ``call_id``, and what was observed of it."""
        return self.outcomes.pop(call_id, None)

    async def record_outcome(self, outcome: ToolOutcome, observed: list[Observation]) -> None:
        """Record a tool call's outcome (a result JSON cannot carry is recorded as the
        ``INVALID_RESULT`` failure its event carries)."""
        data = _outcome_data(outcome, observed)
        try:
            step = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            failure = ToolFailure("INVALID_RESULT", f"the tool's result is not JSON: {exc}", "core")
            failed = ToolOutcome(outcome.tool_call_id, outcome.name, False, error=failure)
            step = json.dumps(_outcome_data(failed, observed), ensure_ascii=False).encode()
        await self.journal.record(_OUTCOME + step)

    def key(self, call_id: str) -> str:
        """The idempotency key of tool call ``call_id`` of this run: the same on every attempt."""
        return f"{self.input_id}/{call_id}"

    def approval_id(self, call_id: str) -> str:
        """The id of the approval of tool call ``call_id``: the same on every attempt, and
        it names the run (:func:`run_of_approval`), so an answer finds its journal."""
        return approval_id(self.input_id, call_id)

    async def record_announced(self, approval: str) -> None:
        """Record that the request of approval ``approval`` was published (a run handled
        again does not publish it twice)."""
        self.announced.add(approval)
        await self.journal.record(_ANNOUNCED + approval.encode())


def approval_id(run_id: str, call_id: str) -> str:
    """The approval id of tool call ``call_id`` of the durable run of input ``run_id``."""
    digest = hashlib.blake2b(call_id.encode("utf-8", "surrogatepass"), digest_size=8)
    return f"apr_{run_id}.{digest.hexdigest()}"


def run_of_approval(approval: str) -> str | None:
    """The input id an approval id of a durable run names (:func:`approval_id`), or ``None``."""
    if not approval.startswith("apr_"):
        return None
    run_id, dot, digest = approval[4:].rpartition(".")
    return run_id if dot and run_id and len(digest) == 16 else None


async def record_answer(
    journal: BusJournal, approval: str, approve: bool, reason: str | None
) -> None:
    """Record an approval's answer in the journal of the run that waits for it (the
    answer's own handling writes it there, before the answer is acknowledged)."""
    data = {"id": approval, "approve": approve, "reason": reason}
    await journal.record(_ANSWER + json.dumps(data, ensure_ascii=False).encode())


def _outcome_data(outcome: ToolOutcome, observed: list[Observation]) -> dict[str, Any]:
    error = outcome.error
    return {
        "id": outcome.tool_call_id,
        "name": outcome.name,
        "ok": outcome.success,
        "result": outcome.result,
        "error": None if error is None else error.to_dict(),
        "observed": [o.text for o in observed],
    }


def _outcome_from(data: dict[str, Any]) -> tuple[ToolOutcome, list[Observation]]:
    error = data.get("error")
    failure = (
        ToolFailure(str(error["code"]), str(error["message"]), str(error["source"]))
        if isinstance(error, dict)
        else None
    )
    outcome = ToolOutcome(
        str(data["id"]), str(data["name"]), bool(data["ok"]), data.get("result"), failure
    )
    return outcome, [Observation(str(text)) for text in data.get("observed") or ()]
