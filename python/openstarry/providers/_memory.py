"""A session's memory in the shape the LLM APIs need: each tool call paired with its outcome.

Every API openstarry speaks wants the same thing from the memory of
:mod:`openstarry.agent.memory`: the user's turns, the assistant's turns, and for
each assistant turn that asked for tools, the outcome of every one of its calls
answered by the call's id, before anything else is said. :func:`conversation`
walks the memory once and returns those steps, so each translator
(OpenAI Chat Completions and Responses, Anthropic, Gemini) only renders them:

- :class:`~openstarry.agent.memory.UserTurn`, as in memory;
- :class:`~openstarry.agent.memory.AssistantTurn` without tool calls, as in memory;
- :class:`ToolExchange`: an assistant turn with its calls and exactly one
  outcome per call, in the calls' order;
- :class:`~openstarry.agent.memory.Observation`, as in memory.

The loop keeps memory in that order already; :func:`conversation` also repairs
what the APIs would refuse outright, so a request is never rejected for the
memory's sake: a call without an outcome gets a failed one
(:data:`MISSING_OUTCOME`), an outcome that answers no call of the turn
before it becomes an observation that says what it was, and calls of one turn
that share an id (some servers give parallel calls the same one) are told
apart with a suffix (``call_1``, ``call_1_2``), their outcomes paired in order.

:func:`outcome_text` and :func:`outcome_object` give an outcome as the text or
the JSON object an API carries a tool result in; :func:`arguments_json` gives a
call's arguments as the JSON text OpenAI's APIs carry them in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.core import ContentSegment, ToolCall
from openstarry.protocol import ToolCall as WireToolCall

__all__ = [
    "MISSING_OUTCOME",
    "Step",
    "ToolExchange",
    "arguments_json",
    "conversation",
    "outcome_object",
    "outcome_text",
    "unique_ids",
]

#: The ``error.code`` of the outcome :func:`conversation` gives a call that has none in memory.
MISSING_OUTCOME = "NO_OUTCOME"


@dataclass(frozen=True, slots=True)
class ToolExchange:
    """An assistant turn that asked for tools, and the outcome of each call.

    Attributes:
        text: What the assistant said with the calls (may be empty).
        calls: The calls, in the order the assistant made them.
        outcomes: One outcome per call, in the same order; ``outcomes[i]``
            answers ``calls[i]`` (its ``tool_call_id`` is ``calls[i].id``).
        reasoning: The turn's ``reasoning`` segments (see
            :class:`~openstarry.agent.memory.AssistantTurn`).
    """

    text: str
    calls: tuple[ToolCall, ...]
    outcomes: tuple[ToolOutcome, ...]
    reasoning: tuple[ContentSegment, ...] = ()


#: One step of a conversation, as :func:`conversation` returns them.
Step = UserTurn | AssistantTurn | ToolExchange | Observation


def conversation(memory: Iterable[MemoryEntry], prompt: str | None = None) -> list[Step]:
    """The memory as steps an API can take as they are, oldest first.

    Each assistant turn with tool calls becomes a :class:`ToolExchange` holding
    the outcomes that follow it in memory (up to the next user or assistant
    turn), matched to its calls by id (outcomes sharing an id answer the calls
    with that id in order; such calls get distinct ids, see
    :func:`unique_ids`). Observations in that stretch come right
    after the exchange, in their order. A call that no outcome answers gets a
    failed outcome with code :data:`MISSING_OUTCOME`; an outcome that answers
    no call of its turn (or a second outcome of the same call) becomes an
    :class:`~openstarry.agent.memory.Observation` saying what the tool returned,
    so nothing of the memory is lost and no API sees a result without its call.

    Args:
        memory: The session's memory (any iterable of its entries).
        prompt: The input being answered. The loop appends it to memory as a
            user turn before calling the provider, so it is there already; when
            the memory's last user turn says something else (or there is none,
            as when a provider is called on its own), a user turn with
            ``prompt`` is added at the end. ``None`` adds nothing.

    Returns:
        The steps, oldest first.
    """
    steps: list[Step] = []
    # The exchange being filled: its step index, the slots of its calls by id
    # (several for an id the calls share), and outcomes so far.
    open_index = -1
    open_calls: dict[str, list[int]] = {}
    open_outcomes: list[ToolOutcome | None] = []
    pending: list[Observation] = []
    last_user: str | None = None

    def close() -> None:
        nonlocal open_index
        if open_index >= 0:
            exchange = steps[open_index]
            assert isinstance(exchange, ToolExchange)
            outcomes = tuple(
                outcome if outcome is not None else _missing(call)
                for call, outcome in zip(exchange.calls, open_outcomes, strict=True)
            )
            steps[open_index] = ToolExchange(
                exchange.text, exchange.calls, outcomes, exchange.reasoning
            )
            open_index = -1
            open_calls.clear()
            open_outcomes.clear()
        steps.extend(pending)
        pending.clear()

    for entry in memory:
        if isinstance(entry, ToolOutcome):
            slots = open_calls.get(entry.tool_call_id)
            if not slots:
                orphan = Observation(_orphan_text(entry))
                if open_index >= 0:
                    pending.append(orphan)
                else:
                    steps.append(orphan)
            else:
                slot = slots.pop(0)
                exchange = steps[open_index]
                assert isinstance(exchange, ToolExchange)
                call_id = exchange.calls[slot].id
                if call_id != entry.tool_call_id:  # a call given a distinct id
                    entry = dataclasses.replace(entry, tool_call_id=call_id)
                open_outcomes[slot] = entry
        elif isinstance(entry, Observation):
            if open_index >= 0:
                pending.append(entry)
            else:
                steps.append(entry)
        else:
            close()
            if isinstance(entry, UserTurn):
                last_user = entry.text
                steps.append(entry)
            elif entry.tool_calls:
                open_index = len(steps)
                for i, call in enumerate(entry.tool_calls):
                    open_calls.setdefault(call.id, []).append(i)
                open_outcomes.extend([None] * len(entry.tool_calls))
                steps.append(
                    ToolExchange(entry.text, unique_ids(entry.tool_calls), (), entry.reasoning)
                )
            else:
                steps.append(entry)
    close()
    if prompt is not None and last_user != prompt:
        steps.append(UserTurn(prompt))
    return steps


def unique_ids(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """``calls`` with distinct ids: a repeated id gets a suffix (``call_1_2``).

    Every API refuses one turn whose calls share an id; some servers send them
    so (DeepSeek and GLM for parallel calls, say).
    """
    taken = {call.id for call in calls}
    if len(taken) == len(calls):
        return tuple(calls)
    seen: set[str] = set()
    out: list[ToolCall] = []
    for call in calls:
        if call.id in seen:
            n = 2
            while f"{call.id}_{n}" in taken:
                n += 1
            new_id = f"{call.id}_{n}"
            taken.add(new_id)
            call = WireToolCall.from_core(call).model_copy(update={"id": new_id}).to_core()
        seen.add(call.id)
        out.append(call)
    return tuple(out)


def outcome_object(outcome: ToolOutcome) -> dict[str, Any]:
    """An outcome as a JSON object: ``{"result": ...}``, or ``{"error": {...}}`` on failure.

    The error holds ``code``, ``message`` and ``source``. For an API that wants
    the result as an object (Gemini's ``functionResponse``).
    """
    if outcome.success:
        return {"result": outcome.result}
    return {"error": _failure(outcome).to_dict()}


def outcome_text(outcome: ToolOutcome) -> str:
    """An outcome as the text an API carries a tool result in.

    A successful string result is itself; any other result is its JSON. A
    failure is the JSON of :func:`outcome_object`:
    ``{"error": {"code": ..., "message": ..., "source": ...}}``.
    """
    if outcome.success:
        if isinstance(outcome.result, str):
            return outcome.result
        return _json(outcome.result)
    return _json(outcome_object(outcome))


def arguments_json(call: ToolCall) -> str:
    """A call's arguments as JSON text (``{"path": "notes.txt"}``)."""
    return _json(call.args)


def _json(value: Any) -> str:
    # default=str: memory holds what tools returned, which the loop has checked
    # is JSON; anything else is still better said than dropped.
    return json.dumps(value, ensure_ascii=False, default=str)


def _failure(outcome: ToolOutcome) -> ToolFailure:
    return outcome.error or ToolFailure("TOOL_ERROR", "the tool failed", "core")


def _missing(call: ToolCall) -> ToolOutcome:
    failure = ToolFailure(MISSING_OUTCOME, "the call got no result", "core")
    return ToolOutcome(call.id, call.name, False, error=failure)


def _orphan_text(outcome: ToolOutcome) -> str:
    return (
        f"A result of tool {outcome.name!r} (call {outcome.tool_call_id}) that answers no "
        f"tool call of this turn: {outcome_text(outcome)}"
    )
