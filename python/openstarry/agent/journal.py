"""A durable run: its completed steps recorded as they complete, replayed when it runs again.

On a bus whose backend keeps journals (Redis: :meth:`EventBus.journal
<openstarry.bus.EventBus.journal>`), a run records each step that has
completed before its next one starts:

- a **model response** that asked for tools (a final answer needs no record:
  the run commits right after it), before any of its tools runs;
- each **tool call's outcome** (an approval's answer with it: a denied call's
  outcome is its denial), with what the core observed about the call.

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

import json
from typing import Any, Protocol

from openstarry.agent.memory import Observation, ToolFailure, ToolOutcome
from openstarry.core import ProviderResponse, decode_response, encode_response

__all__ = ["BusJournal", "RunJournal"]

#: A step's first byte: a model response (then its round, a newline and the
#: response's JSON), or a tool call's outcome (then its JSON).
_RESPONSE = b"R"
_OUTCOME = b"T"


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

    __slots__ = ("input_id", "journal", "outcomes", "responses")

    def __init__(self, journal: BusJournal, input_id: str) -> None:
        self.journal = journal
        self.input_id = input_id
        #: Recorded model responses, by round.
        self.responses: dict[int, bytes] = {}
        #: Recorded outcomes (and observations), by tool call id.
        self.outcomes: dict[str, tuple[ToolOutcome, list[Observation]]] = {}
        for step in journal.steps:
            kind = step[:1]
            if kind == _RESPONSE:
                head, _, body = step[1:].partition(b"\n")
                self.responses[int(head)] = body
            elif kind == _OUTCOME:
                outcome, observed = _outcome_from(json.loads(step[1:]))
                self.outcomes[outcome.tool_call_id] = (outcome, observed)

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
