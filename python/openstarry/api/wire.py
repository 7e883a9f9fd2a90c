"""The ground every Agent API model stands on: limits, enums, ids, errors and the two bases.

The models of spec 003 are split by what they describe: :mod:`openstarry.api.messages`
(messages and their content items, the things a stream carries),
:mod:`openstarry.api.requests` (what a client sends) and
:mod:`openstarry.api.responses` (what the agent answers, and reading a streamed
event back). All of them are built on this module, which imports none of them:

- the limits every model keeps (:data:`MAX_TEXT_LENGTH`, :data:`MAX_CONTENT_ITEMS`);
- the wire enums (:class:`Role`, :class:`MessageType`, :class:`RunStatus`,
  :class:`ContentType`) and the fresh ids (``response_...``, ``msg_...``);
- the errors (:class:`ProtocolError` and its two kinds, :class:`StatusTransitionError`)
  and :class:`Error`, an error as it goes on the wire;
- :class:`WireModel`, the base of every model (how it goes on the wire), and
  :class:`Event`, the base of every streamed object (its status lifecycle).

:mod:`openstarry.api.models` re-exports all of it: import from there (or from
:mod:`openstarry.api`) rather than from here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openstarry.errors import OpenStarryError

__all__ = [
    "MAX_CONTENT_ITEMS",
    "MAX_SESSION_ID_LENGTH",
    "MAX_TEXT_LENGTH",
    "TERMINAL_STATUSES",
    "ContentType",
    "Error",
    "Event",
    "InvalidEventError",
    "InvalidRequestError",
    "MessageType",
    "ProtocolError",
    "Role",
    "RunStatus",
    "StatusTransitionError",
    "WireModel",
    "new_message_id",
    "new_response_id",
]

#: The most content items one message may hold.
MAX_CONTENT_ITEMS = 1_000
#: The most characters in one string of content (text, URL, base64 data): 8 MiB.
MAX_TEXT_LENGTH = 8 * 1024 * 1024
#: The most validation problems an error message lists (the rest are counted).
_MAX_LISTED_ERRORS = 10
#: The most characters of an id or a name.
MAX_ID_LENGTH = 1_024


# --- enums ----------------------------------------------------------------------------------------


class _WireEnum(str, Enum):
    """A string enum whose ``str()`` is its wire value."""

    def __str__(self) -> str:
        return str(self.value)


class Role(_WireEnum):
    """Who wrote a message."""

    ASSISTANT = "assistant"
    USER = "user"
    SYSTEM = "system"
    TOOL = "tool"


class MessageType(_WireEnum):
    """What a message carries."""

    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"
    PLUGIN_CALL = "plugin_call"
    PLUGIN_CALL_OUTPUT = "plugin_call_output"
    COMPONENT_CALL = "component_call"
    COMPONENT_CALL_OUTPUT = "component_call_output"
    MCP_LIST_TOOLS = "mcp_list_tools"
    MCP_APPROVAL_REQUEST = "mcp_approval_request"
    MCP_TOOL_CALL = "mcp_call"
    MCP_APPROVAL_RESPONSE = "mcp_approval_response"
    REASONING = "reasoning"
    HEARTBEAT = "heartbeat"
    ERROR = "error"


class RunStatus(_WireEnum):
    """The lifecycle status of a response, message or content (member names as in spec 003)."""

    Created = "created"
    InProgress = "in_progress"
    Completed = "completed"
    Canceled = "canceled"
    Failed = "failed"
    Rejected = "rejected"
    Unknown = "unknown"
    Queued = "queued"
    Incomplete = "incomplete"


class ContentType(_WireEnum):
    """The kind of a content item: the ``type`` that selects its model."""

    TEXT = "text"
    IMAGE = "image"
    DATA = "data"
    AUDIO = "audio"
    FILE = "file"
    REFUSAL = "refusal"


#: The statuses after which an object changes no more.
TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(
    {
        RunStatus.Completed,
        RunStatus.Failed,
        RunStatus.Canceled,
        RunStatus.Rejected,
        RunStatus.Incomplete,
    }
)

#: How far along the lifecycle a status is; a status never moves to a lower rank.
_STATUS_RANK: Mapping[RunStatus, int] = {
    RunStatus.Unknown: 0,
    RunStatus.Queued: 0,
    RunStatus.Created: 1,
    RunStatus.InProgress: 2,
    **dict.fromkeys(TERMINAL_STATUSES, 3),
}


def new_response_id() -> str:
    """A fresh response id: ``response_`` and a UUID."""
    return f"response_{uuid.uuid4()}"


def new_message_id() -> str:
    """A fresh message id: ``msg_`` and a UUID."""
    return f"msg_{uuid.uuid4()}"


# --- errors ---------------------------------------------------------------------------------------


class StatusTransitionError(OpenStarryError, ValueError):
    """An object was asked to move to a status its current status forbids.

    For instance ``completed`` after ``failed``, or ``created`` after ``in_progress``.
    """


class ProtocolError(OpenStarryError, ValueError):
    """JSON that is not a valid Agent API object.

    Attributes:
        code: A short machine-readable code: ``"invalid_json"`` (not JSON at all),
            ``"request_too_large"`` or ``"invalid_request"`` / ``"invalid_event"``
            (JSON that does not fit the schema).
        errors: One dict per problem, each with ``loc`` (the dotted path of the
            field, such as ``"input.0.content.0.type"``), ``msg`` and ``type``.
        http_status: The HTTP status a server answers with: 400 for invalid JSON,
            413 for a request too large, 422 for a schema violation.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        errors: list[dict[str, str]] | None = None,
        http_status: int = 422,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.errors: list[dict[str, str]] = errors or []
        self.http_status = http_status

    def to_error(self) -> Error:
        """The :class:`Error` body that reports this problem on the wire."""
        return Error(code=self.code, message=str(self))

    @classmethod
    def _from_validation(cls, what: str, err: ValidationError, *, code: str) -> ProtocolError:
        problems = [
            {
                "loc": ".".join(str(part) for part in e["loc"]) or "(root)",
                "msg": e["msg"],
                "type": e["type"],
            }
            for e in err.errors(include_url=False, include_input=False)
        ]
        if any(p["type"] == "json_invalid" for p in problems):
            code, status = "invalid_json", 400
        else:
            status = 422
        listed = "; ".join(f"{p['loc']}: {p['msg']}" for p in problems[:_MAX_LISTED_ERRORS])
        more = len(problems) - _MAX_LISTED_ERRORS
        if more > 0:
            listed += f"; and {more} more"
        noun = "problem" if len(problems) == 1 else "problems"
        return cls(
            f"invalid {what} ({len(problems)} {noun}): {listed}",
            code=code,
            errors=problems,
            http_status=status,
        )


class InvalidRequestError(ProtocolError):
    """A request body that is not a valid :class:`AgentRequest` (see :func:`parse_request`)."""


class InvalidEventError(ProtocolError):
    """A streamed event that is not a valid response, message or content (:func:`parse_event`)."""


# --- the shared base ------------------------------------------------------------------------------


class WireModel(BaseModel):
    """The base of every Agent API model: strict about what it reads, compact on the wire."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict of this model as it goes on the wire (``None`` fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    def wire_json(self) -> str:
        """The JSON text of this model as it goes on the wire (``None`` fields left out)."""
        return self.model_dump_json(exclude_none=True)


_E = TypeVar("_E", bound="Event")

IdText = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]
#: The longest ``session_id`` of a request.
MAX_SESSION_ID_LENGTH = 128
#: A request's ``session_id``: 1 to 128 ASCII letters, digits, ``_``, ``-``, ``.``,
#: ``:`` or ``@`` (it goes into logs, events and headers: no spaces, no control characters).
SessionIdText = Annotated[
    str,
    Field(min_length=1, max_length=MAX_SESSION_ID_LENGTH, pattern=r"^[A-Za-z0-9_.:@-]+$"),
]
BoundedText = Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]


class Error(WireModel):
    """An error on the wire: a short machine-readable ``code`` and a human ``message``."""

    code: str
    message: str


# --- events ---------------------------------------------------------------------------------------


class Event(WireModel):
    """What every streamed object is: a response, a message or a content item.

    The status helpers move :attr:`status` forward and return ``self``. A status
    never moves back (``created`` after ``in_progress``) and never leaves a
    terminal status (:data:`TERMINAL_STATUSES`): both raise
    :class:`StatusTransitionError`. Setting the current non-terminal status again
    is allowed.
    """

    sequence_number: Annotated[int, Field(ge=0)] | None = None
    """The event's place in its stream, from 0 (``None`` outside a stream)."""
    object: str
    status: RunStatus | None = None
    error: Error | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether :attr:`status` is terminal."""
        return self.status in TERMINAL_STATUSES

    def _move_to(self, status: RunStatus) -> None:
        current = self.status
        if current is not None and (
            current in TERMINAL_STATUSES or _STATUS_RANK[status] < _STATUS_RANK[current]
        ):
            raise StatusTransitionError(
                f"{self._describe()}: cannot move from {current.value!r} to {status.value!r}"
            )
        self.status = status

    def _describe(self) -> str:
        ident = getattr(self, "id", None)
        return f"{self.object} {ident}" if ident else self.object

    def created(self: _E) -> _E:
        """Set the status to ``created``; returns ``self``."""
        self._move_to(RunStatus.Created)
        return self

    def in_progress(self: _E) -> _E:
        """Set the status to ``in_progress``; returns ``self``."""
        self._move_to(RunStatus.InProgress)
        return self

    def completed(self: _E) -> _E:
        """Set the status to ``completed``; returns ``self``."""
        self._move_to(RunStatus.Completed)
        return self

    def failed(self: _E, error: Error) -> _E:
        """Set the status to ``failed`` and record ``error``; returns ``self``."""
        self._move_to(RunStatus.Failed)
        self.error = error
        return self

    def rejected(self: _E) -> _E:
        """Set the status to ``rejected``; returns ``self``."""
        self._move_to(RunStatus.Rejected)
        return self

    def canceled(self: _E) -> _E:
        """Set the status to ``canceled``; returns ``self``."""
        self._move_to(RunStatus.Canceled)
        return self


# --- reading JSON ---------------------------------------------------------------------------------


def as_object(data: bytes | bytearray | str | Mapping[str, Any], what: str) -> dict[str, Any]:
    if isinstance(data, Mapping):
        return dict(data)
    try:
        parsed = json.loads(data)
    except ValueError as e:
        raise InvalidEventError(
            f"invalid {what}: not JSON: {e}",
            code="invalid_json",
            errors=[{"loc": "(root)", "msg": str(e), "type": "json_invalid"}],
            http_status=400,
        ) from None
    if not isinstance(parsed, dict):
        raise InvalidEventError(
            f"invalid {what}: a JSON object is needed, not {type(parsed).__name__}",
            code="invalid_event",
            errors=[{"loc": "(root)", "msg": "not a JSON object", "type": "model_type"}],
        )
    return parsed
