"""What the agent answers: a response, and any streamed event read back (spec 003).

A :class:`AgentResponse` is the object a run's stream opens and ends with: its
status (``created``, ``in_progress``, then a terminal one), and when complete
its ``output`` messages (:mod:`openstarry.api.messages`) and ``usage``.
:func:`parse_event` reads one event of a stream (an SSE ``data:`` line) back
into its model, whichever of response, message or content it is.

Built on :mod:`openstarry.api.wire` and :mod:`openstarry.api.messages`;
:mod:`openstarry.api.models` re-exports all of it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from openstarry.api.messages import AnyContent, Message, parse_content
from openstarry.api.wire import (
    Event,
    IdText,
    InvalidEventError,
    RunStatus,
    as_object,
    new_response_id,
)

__all__ = ["AgentResponse", "BaseResponse", "parse_event"]


# --- responses ------------------------------------------------------------------------------------


class BaseResponse(Event):
    """A response: the run's status, and when complete its ``output`` and ``usage``."""

    id: IdText = Field(default_factory=new_response_id)
    object: Literal["response"] = "response"
    status: RunStatus | None = RunStatus.Created
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    output: list[Message] | None = None
    usage: dict[str, Any] | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _fresh_id_for_none(cls, value: Any) -> Any:
        return new_response_id() if value is None else value

    def add_new_message(self, message: Message) -> None:
        """Append ``message`` to :attr:`output`."""
        self.output = [*(self.output or []), message]


class AgentResponse(BaseResponse):
    """The agent's response; ``session_id`` names the conversation it belongs to.

    ``metadata`` (openstarry's, absent when empty) says what the client should
    know beyond the spec's fields: on an ``incomplete`` response the calls it
    waits for (``{"waiting_for": {"function_call": [call ids],
    "mcp_approval_request": [approval ids]}}``), and the generation
    parameters the provider could not use (``"dropped_parameters"``).
    """

    session_id: str | None = None
    metadata: dict[str, Any] | None = None


# --- parsing --------------------------------------------------------------------------------------


def parse_event(
    data: bytes | bytearray | str | Mapping[str, Any],
) -> AgentResponse | Message | AnyContent:
    """One streamed event (an SSE ``data:`` line) as its model, chosen by ``object``.

    ``"response"`` gives an :class:`AgentResponse`, ``"message"`` a
    :class:`Message`, ``"content"`` the content model its ``type`` names.

    Raises:
        InvalidEventError: the data is not JSON, its ``object`` is missing or
            unknown, or it does not fit its model.
    """
    obj = as_object(data, "event")
    kind = obj.get("object")
    model: type[AgentResponse] | type[Message]
    if kind == "content":
        return parse_content(obj)
    if kind == "response":
        model = AgentResponse
    elif kind == "message":
        model = Message
    else:
        raise InvalidEventError(
            f"invalid event: 'object' must be 'response', 'message' or 'content', not {kind!r}",
            code="invalid_event",
            errors=[{"loc": "object", "msg": "unknown object", "type": "literal_error"}],
        )
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise InvalidEventError._from_validation("event", e, code="invalid_event") from None
