"""What a client sends: a request to run the agent, and the tools it declares (spec 003).

:class:`AgentRequest` is the body of ``POST /process``: input messages
(:mod:`openstarry.api.messages`), whether to stream the answer, the session it
continues, generation parameters, and the client's own tools (:class:`Tool`,
``"function"`` tools only). :func:`parse_request` reads one from a request body
and says, field by field, what is wrong with one that does not fit. The bounds
on a request (:data:`MAX_INPUT_MESSAGES`, :data:`MAX_TOOLS`,
:data:`MAX_REQUEST_BYTES`) are here.

Built on :mod:`openstarry.api.wire` and :mod:`openstarry.api.messages`;
:mod:`openstarry.api.models` re-exports all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from openstarry.api.messages import Message
from openstarry.api.wire import (
    MAX_ID_LENGTH,
    BoundedText,
    IdText,
    InvalidRequestError,
    SessionIdText,
    WireModel,
)

__all__ = [
    "MAX_INPUT_MESSAGES",
    "MAX_REQUEST_BYTES",
    "MAX_TOOLS",
    "AgentRequest",
    "BaseRequest",
    "FunctionParameters",
    "FunctionTool",
    "Tool",
    "parse_request",
]

#: The most messages one request's ``input`` may hold.
MAX_INPUT_MESSAGES = 1_000
#: The most tools one request may declare.
MAX_TOOLS = 1_000
#: The most bytes of JSON :func:`parse_request` reads: 32 MiB.
MAX_REQUEST_BYTES = 32 * 1024 * 1024


# --- tools ----------------------------------------------------------------------------------------


class FunctionParameters(WireModel):
    """The JSON Schema of a function's arguments; its ``type`` must be ``"object"``."""

    type: Literal["object"] = "object"
    properties: dict[str, Any] = Field(default_factory=dict)
    required: list[str] | None = None


class FunctionTool(WireModel):
    """A function a client offers the agent: a name, what it does, its parameters."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: BoundedText
    parameters: FunctionParameters | dict[str, Any] = Field(default_factory=FunctionParameters)


class Tool(WireModel):
    """A tool declared in a request. Only ``"function"`` tools exist; any other type is refused."""

    type: Literal["function"] = "function"
    function: FunctionTool

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        if value is None:
            return "function"
        if value != "function":
            raise PydanticCustomError(
                "tool_type",
                "unknown tool type {value}: openstarry supports only 'function'",
                {"value": repr(value)},
            )
        return value


# --- requests -------------------------------------------------------------------------------------


class BaseRequest(WireModel):
    """What a client sends: input messages, and whether to stream the answer."""

    input: Annotated[list[Message], Field(min_length=1, max_length=MAX_INPUT_MESSAGES)]
    stream: StrictBool = True
    id: Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None = None


class AgentRequest(BaseRequest):
    """A request to run the agent (``POST /process``).

    ``n`` must lie in 1..5. ``session_id`` carries a conversation across
    requests. Generation parameters are passed on to the agent's provider where
    it supports them.
    """

    model: Annotated[str, Field(max_length=256)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2, strict=True)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2, strict=True)] | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=5)] | None = 1
    seed: StrictInt | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    session_id: SessionIdText | None = None
    response_id: IdText | None = None


# --- parsing --------------------------------------------------------------------------------------


def parse_request(data: bytes | bytearray | str | Mapping[str, Any]) -> AgentRequest:
    """An :class:`AgentRequest` from a request body (JSON bytes or text) or a parsed dict.

    Raises:
        InvalidRequestError: the body is larger than :data:`MAX_REQUEST_BYTES`
            (``code`` ``"request_too_large"``), is not JSON (``"invalid_json"``), or
            does not fit the schema (``"invalid_request"``); the message lists
            each problem with its field path.
    """
    if isinstance(data, (bytes, bytearray, str)):
        size = len(data) if not isinstance(data, str) else len(data.encode("utf-8", "replace"))
        if size > MAX_REQUEST_BYTES:
            raise InvalidRequestError(
                f"request of {size} bytes is larger than the limit of {MAX_REQUEST_BYTES} bytes",
                code="request_too_large",
                http_status=413,
            )
        try:
            return AgentRequest.model_validate_json(data)
        except ValidationError as e:
            raise InvalidRequestError._from_validation(
                "request", e, code="invalid_request"
            ) from None
    if isinstance(data, Mapping):
        try:
            return AgentRequest.model_validate(dict(data))
        except ValidationError as e:
            raise InvalidRequestError._from_validation(
                "request", e, code="invalid_request"
            ) from None
    raise InvalidRequestError(
        f"a request must be a JSON object, not {type(data).__name__}",
        code="invalid_request",
        errors=[{"loc": "(root)", "msg": "not a JSON object", "type": "model_type"}],
    )
