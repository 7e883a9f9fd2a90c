"""Pydantic models of the openstarry wire protocol (spec 000 section 3, spec 002).

The models validate and serialise the JSON that flows between the core, its
providers and tools, and the transports:

- :class:`ToolCall`, :class:`ContentSegment` and :class:`ProviderResponse`: what a
  provider's ``generate`` returns (spec 000 section 3).
- :class:`EventEnvelope`: the event envelope of spec 002 section 1.
- One payload model per event type (spec 002 section 3), found by type in
  :data:`PAYLOAD_MODELS` and parsed by :func:`parse_payload`.

Field names are the wire's camelCase names (``mimeType``, ``toolCallId``) on
input and output; in Python the fields have snake_case names (``mime_type``,
``tool_call_id``), and either spelling is accepted when building a model::

    >>> seg = ContentSegment(type="image", data="aGk=", mime_type="image/png")
    >>> seg.model_dump_json()
    '{"type":"image","data":"aGk=","mimeType":"image/png"}'

Optional fields that are ``None`` are left out of the output, as the spec's
optional (``?``) fields are absent rather than ``null``.

The Rust core (:mod:`openstarry.core`) has its own, faster classes for the
provider response and the envelope. Each model here converts to its core
counterpart with ``to_core()`` and back with ``from_core()``; unknown wire fields,
which both keep, survive the trip. The models apply the core decoders' rules
(the stricter ``dict`` type of ``ToolCall.args`` aside), so a model that
validates converts, within the core's size and nesting limits.

:func:`json_schema` exports every model as JSON Schema, for other languages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import ComputedFieldInfo, FieldInfo
from pydantic.json_schema import models_json_schema
from pydantic_core import InitErrorDetails, PydanticCustomError

from openstarry import core
from openstarry.events import (
    OUTPUT_AGENT_MESSAGE,
    OUTPUT_AGENT_MESSAGE_DELTA,
    AgentState,
    EventType,
)

__all__ = [
    "OUTPUT_AGENT_MESSAGE",
    "PAYLOAD_MODELS",
    "AgentMessage",
    "AgentMessageDelta",
    "AgentState",
    "ContentSegment",
    "EventEnvelope",
    "EventType",
    "KernelError",
    "ProviderResponse",
    "SegmentType",
    "Signal",
    "StateChange",
    "SystemCommand",
    "TickStart",
    "ToolCall",
    "ToolCallPayload",
    "ToolErrorInfo",
    "ToolResultPayload",
    "UserMessage",
    "json_schema",
    "parse_payload",
]

#: What a :class:`ContentSegment` carries (spec 000 ``ContentType``, plus
#: ``"reasoning"``: the model's thinking, which readers of spec 000 may skip).
SegmentType = Literal["text", "image", "audio", "video", "ui", "tool_call", "reasoning"]

#: The field each segment type requires, by wire name (as the Rust core's
#: ``SegmentType::required_field``). ``null`` counts as absent.
_REQUIRED_FIELD: Mapping[str, str] = MappingProxyType(
    {
        "text": "text",
        "image": "data",
        "audio": "data",
        "video": "data",
        "ui": "ui",
        "tool_call": "toolCall",
        "reasoning": "text",
    }
)

#: ``NAMESPACE:NAME``: capitals, digits and ``_``, each part starting with a
#: capital (the Rust core's ``is_event_type``).
_EVENT_TYPE_PATTERN = r"^[A-Z][A-Z0-9_]*:[A-Z][A-Z0-9_]*$"

#: The largest timestamp the core accepts (an ``i64``).
_MAX_TIMESTAMP = 2**63 - 1

_JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _is_none(value: Any) -> bool:
    return value is None


def _optional(**kwargs: Any) -> Any:
    """A field that defaults to ``None`` and is left out of the output when ``None``."""
    return Field(default=None, exclude_if=_is_none, **kwargs)


def _error_at(
    model: type[BaseModel], loc: tuple[str | int, ...], kind: str, message: str, value: Any
) -> ValidationError:
    """A validation error placed on ``loc`` (a wire path) rather than on the whole model."""
    return ValidationError.from_exception_data(
        model.__name__,
        [InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)],
    )


def _title(name: str, info: FieldInfo | ComputedFieldInfo) -> str:
    """A schema title from a field's name: ``tool_call_id`` becomes ``Tool call id``."""
    return name.replace("_", " ").strip().capitalize()


class _Wire(BaseModel):
    """The shared configuration: camelCase on the wire, either spelling on input."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        field_title_generator=_title,
        # NaN and infinity go out as the literals the core refuses (ValueError),
        # never silently as null.
        ser_json_inf_nan="constants",
    )


# --- spec 000 section 3: the provider response --------------------------------------------------


class ToolCall(_Wire):
    """An agent's intent to run a tool (spec 000 section 3A); wire name ``toolCall``.

    As in the Rust core: ``args`` given as ``null`` is ``{}``, and ``args`` given
    as a JSON string (as some LLM APIs send them) is parsed and must hold a JSON
    object; an empty ``id`` counts as absent. Unknown wire fields are kept.

    The core's ``ToolCall`` always has an id: :meth:`to_core` of a call without
    one gets a fresh UUID v4, which :meth:`from_core` then carries back.
    """

    model_config = ConfigDict(extra="allow")

    id: str | None = _optional(
        description="Tracks the call and matches its result; a provider generates a UUID when "
        "its LLM gives none."
    )
    name: str = Field(min_length=1, description="The registered tool's name, exactly.")
    args: dict[str, Any] = Field(default_factory=dict, description="The arguments: a JSON object.")

    @field_validator("id", mode="before")
    @classmethod
    def _empty_id_is_absent(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_json_text(cls, value: Any) -> Any:
        if value is None:
            return {}
        if isinstance(value, (str, bytes, bytearray)):
            try:
                parsed = json.loads(value)
            except ValueError as e:
                raise PydanticCustomError(
                    "args_json", "a string that is not valid JSON: {error}", {"error": str(e)}
                ) from None
            if not isinstance(parsed, dict):
                raise PydanticCustomError(
                    "args_json",
                    "a string must hold a JSON object, not {kind}",
                    {"kind": type(parsed).__name__},
                )
            return parsed
        return value

    def to_core(self) -> core.ToolCall:
        """The Rust core's :class:`openstarry.core.ToolCall` (with a fresh id if this has none)."""
        wrapped = b'{"segments":[{"type":"tool_call","toolCall":%s}]}' % self._json()
        call = core.decode_response(wrapped).segments[0].tool_call
        assert call is not None  # a tool_call segment always has one
        return call

    @classmethod
    def from_core(cls, obj: core.ToolCall) -> ToolCall:
        """The model of a core :class:`openstarry.core.ToolCall`, unknown wire fields included."""
        call = ContentSegment.from_core(core.ContentSegment("tool_call", tool_call=obj)).tool_call
        assert call is not None
        return call

    def _json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class ContentSegment(_Wire):
    """One part of a provider response (spec 000 section 3B).

    Each type needs its field, as the Rust core checks: ``text`` for
    ``"text"``; ``data`` (Base64 or a URL) for ``"image"``, ``"audio"`` and
    ``"video"``; ``toolCall`` for ``"tool_call"``; ``ui`` for ``"ui"``;
    ``text`` (possibly empty) for ``"reasoning"``, which may also carry an
    opaque ``signature`` and encrypted ``data`` for the provider. A
    missing one is a validation error on that field (``"a text segment needs
    text"``). Other fields may be present too. Unknown wire fields are kept.
    """

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": kind}}, "required": ["type"]},
                    "then": {"required": [field], "properties": {field: {"not": {"type": "null"}}}},
                }
                for kind, field in _REQUIRED_FIELD.items()
            ]
        },
    )

    type: SegmentType = Field(description="What the segment carries.")
    text: str | None = _optional(description='For types "text" and "reasoning".')
    data: str | None = _optional(
        description='For types "image", "audio" and "video": Base64 data or a URL;'
        ' for "reasoning": reasoning the provider keeps encrypted.'
    )
    mime_type: str | None = _optional(description='The media type, such as "image/png".')
    signature: str | None = _optional(
        description='For type "reasoning": the opaque proof its provider asks back.'
    )
    tool_call: ToolCall | None = _optional(description='For type "tool_call".')
    ui: Any = _optional(description='For type "ui": components for the frontend to render.')

    @model_validator(mode="after")
    def _has_its_field(self) -> ContentSegment:
        field = _REQUIRED_FIELD[self.type]
        python_name = "tool_call" if field == "toolCall" else field
        if getattr(self, python_name) is None:
            raise _error_at(
                ContentSegment,
                (field,),
                "segment_field_missing",
                f"{_article(self.type)} {self.type} segment needs {field}",
                None,
            )
        return self

    def to_core(self) -> core.ContentSegment:
        """The Rust core's :class:`openstarry.core.ContentSegment`."""
        return core.decode_response(b'{"segments":[%s]}' % self._json()).segments[0]

    @classmethod
    def from_core(cls, obj: core.ContentSegment) -> ContentSegment:
        """The model of a core :class:`openstarry.core.ContentSegment`, unknown fields included."""
        return ProviderResponse.from_core(core.ProviderResponse([obj])).segments[0]

    def _json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class ProviderResponse(_Wire):
    """What a provider's ``generate`` returns (spec 000 section 3B).

    Example (spec 000 section 5)::

        ProviderResponse.model_validate_json(
            '{"segments": [{"type": "text", "text": "Sure, let me check."},'
            ' {"type": "tool_call", "toolCall": {"name": "get_weather",'
            ' "args": {"location": "Taipei"}}}]}'
        )
    """

    model_config = ConfigDict(extra="allow")

    segments: list[ContentSegment] = Field(
        description="Ordered: the agent may speak, show images and call tools in one response."
    )
    metadata: Any = _optional(description="Such as token usage or model latency.")

    def to_core(self) -> core.ProviderResponse:
        """The Rust core's :class:`openstarry.core.ProviderResponse`."""
        return core.decode_response(self.model_dump_json(by_alias=True).encode())

    @classmethod
    def from_core(cls, obj: core.ProviderResponse) -> ProviderResponse:
        """The model of a core :class:`openstarry.core.ProviderResponse`, unknown fields kept."""
        return cls.model_validate_json(core.encode_response(obj), by_alias=True, by_name=False)


# --- spec 002 section 1: the envelope -----------------------------------------------------------


class EventEnvelope(_Wire):
    """The event envelope of spec 002 section 1, validated as the Rust core does.

    ``type`` is any ``NAMESPACE:NAME`` in capitals: the eight
    :class:`EventType` values, openstarry's ``OUTPUT:AGENT_MESSAGE``, or a type
    of your own. ``payload`` is free-form here; :meth:`payload_model` parses it
    for the types in :data:`PAYLOAD_MODELS`. A pydantic model given as the
    payload is stored as its JSON-ready dict.

    Unknown wire fields are kept (in ``model_extra``), as the core's
    ``Event.extra`` keeps them, and survive :meth:`to_core` and :meth:`from_core`.
    """

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, description="A UUID v4.")
    timestamp: int = Field(
        strict=True, ge=0, le=_MAX_TIMESTAMP, description="Unix time in milliseconds."
    )
    trace_id: str = Field(min_length=1, description="Shared by every event of one request chain.")
    source: str = Field(
        min_length=1, description='The emitting component, such as "transport-websocket-01".'
    )
    session_id: str = Field(min_length=1, description="Isolates users from each other.")
    priority: int = Field(
        strict=True, ge=0, le=5, description="0 (highest, system-critical) to 5 (background)."
    )
    type: str = Field(
        pattern=_EVENT_TYPE_PATTERN, description='NAMESPACE:NAME, such as "INPUT:USER_MESSAGE".'
    )
    payload: Any = Field(
        description="The event's data (null allowed, but present); its shape depends on the type."
    )
    parent_id: str | None = _optional(
        min_length=1, description="The id of the event that caused this one."
    )

    @field_validator("payload", mode="before")
    @classmethod
    def _model_payload_as_dict(cls, value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True)
        return value

    def payload_model(self) -> BaseModel | None:
        """The payload parsed into its model, or ``None`` for a type without one.

        Raises:
            pydantic.ValidationError: the payload does not fit its type's model.
        """
        model = PAYLOAD_MODELS.get(self.type)
        return None if model is None else model.model_validate(self.payload)

    def to_core(self) -> core.Event:
        """The Rust core's :class:`openstarry.core.Event` (unknown fields in its ``extra``)."""
        return core.decode_event(self.model_dump_json(by_alias=True).encode())

    @classmethod
    def from_core(cls, event: core.Event) -> EventEnvelope:
        """The model of a core :class:`openstarry.core.Event`, unknown fields included."""
        return cls.model_validate_json(core.encode_event(event), by_alias=True, by_name=False)


# --- spec 002 section 3: the payloads -----------------------------------------------------------


class _Payload(_Wire):
    model_config = ConfigDict(extra="forbid")


class UserMessage(_Payload):
    """The payload of ``INPUT:USER_MESSAGE``: what the user said (spec 002 section 3.1)."""

    text: str = Field(description="The user's message.")
    mime_type: str = Field(default="text/plain", description="The media type of the text.")
    metadata: dict[str, Any] | None = _optional(
        description='Free-form, such as {"platform": "discord"}.'
    )
    traceparent: str | None = _optional(
        description="The W3C traceparent of the caller's span, when the input came with one "
        "in the run's trace (an HTTP request's header): the run's spans are its children."
    )


class SystemCommand(_Payload):
    """The payload of ``INPUT:SYSTEM_COMMAND``, such as ``/stop`` or ``/reset``.

    A leading ``/`` of ``command`` is accepted and stripped: ``"/stop"`` and
    ``"stop"`` are the same command. The command is one word; its arguments go
    in ``args`` (:meth:`from_text` splits a typed line).
    """

    command: str = Field(description='The command\'s name, such as "stop" or "reset".')
    args: list[str] = Field(default_factory=list, description="The command's arguments.")

    @field_validator("command")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        command = value.removeprefix("/")
        if not command:
            raise PydanticCustomError("command", "a command needs a name")
        if any(c.isspace() for c in command):
            raise PydanticCustomError("command", "a command is one word; put its arguments in args")
        return command

    @classmethod
    def from_text(cls, line: str) -> SystemCommand:
        """Split a typed line, ``"/read notes.txt"``, at whitespace into command and args."""
        words = line.split()
        if not words:
            raise _error_at(cls, ("command",), "command", "a command needs a name", line)
        return cls(command=words[0], args=words[1:])


class Signal(_Payload):
    """The payload of ``INPUT:SIGNAL``: a trigger from a sensor or an external webhook."""

    name: str = Field(min_length=1, description="What was signalled.")
    data: Any = _optional(description="Free-form data of the signal.")


class TickStart(_Payload):
    """The payload of ``KERNEL:TICK_START``: the execution loop begins a round."""

    round: int = Field(strict=True, ge=0, description="The round's number.")


class StateChange(_Payload):
    """The payload of ``KERNEL:STATE_CHANGE``, such as ``IDLE`` to ``THINKING``.

    The wire name of :attr:`from_` is ``from``; build one with
    ``StateChange(from_=AgentState.IDLE, to=AgentState.THINKING)``.
    """

    from_: AgentState = Field(
        validation_alias="from", serialization_alias="from", description="The state left."
    )
    to: AgentState = Field(description="The state entered.")
    reason: str | None = _optional(description="Why the state changed.")


class KernelError(_Payload):
    """The payload of ``KERNEL:ERROR``: the core's standardised error output."""

    code: str = Field(description="A short machine-readable code.")
    message: str = Field(description="What went wrong, for people.")
    source: str = Field(description="The component at fault.")
    details: Any = _optional(description="Free-form details.")


class ToolCallPayload(_Payload):
    """The payload of ``EXEC:TOOL_CALL``: the agent asks for a tool to run."""

    tool_call_id: str = Field(min_length=1, description="The id of the tool call.")
    name: str = Field(min_length=1, description="The tool's name.")
    args: Any = Field(
        description=(
            "The arguments, as the provider gave them: an object, unless the provider "
            "erred (spec 000 types them `any`; the call then fails with INVALID_ARGUMENTS)."
        )
    )
    call_depth: int | None = _optional(
        ge=0,
        strict=True,
        description="For a call from another agent (MCP): how many agent-to-agent calls deep "
        "it is (spec 004 section 4); absent for the agent's own calls.",
    )
    traceparent: str | None = _optional(
        description="For a call from another agent: the W3C traceparent of the caller's span "
        "(its MCP call), whose child the call's span is; absent for the agent's own calls.",
    )


class ToolErrorInfo(_Payload):
    """The ``error`` object of an ``EXEC:TOOL_RESULT`` payload (spec 002 section 3.2)."""

    code: str = Field(description='A short machine-readable code, such as "EPERM".')
    message: str = Field(description="What went wrong, for people.")
    source: str = Field(description='The failing component, such as "fs-plugin".')


class ToolResultPayload(_Payload):
    """The payload of ``EXEC:TOOL_RESULT`` (spec 002 section 3.2).

    A failure (``success`` false) must carry ``error``; a success must not.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"success": {"const": False}}, "required": ["success"]},
                    "then": {
                        "required": ["error"],
                        "properties": {"error": {"not": {"type": "null"}}},
                    },
                },
                {
                    "if": {"properties": {"success": {"const": True}}, "required": ["success"]},
                    "then": {"properties": {"error": {"type": "null"}}},
                },
            ]
        }
    )

    tool_call_id: str = Field(min_length=1, description="The id of the call this answers.")
    name: str | None = _optional(description="The tool's name.")
    success: bool = Field(strict=True, description="Whether the tool succeeded.")
    result: Any = _optional(description="What the tool returned, on success.")
    error: ToolErrorInfo | None = _optional(description="Why the tool failed, on failure.")

    @model_validator(mode="after")
    def _error_matches_success(self) -> ToolResultPayload:
        if not self.success and self.error is None:
            raise _error_at(
                ToolResultPayload,
                ("error",),
                "tool_result_error",
                "a failed tool result (success false) needs error",
                None,
            )
        if self.success and self.error is not None:
            raise _error_at(
                ToolResultPayload,
                ("error",),
                "tool_result_error",
                "a successful tool result (success true) has no error",
                self.error.model_dump(),
            )
        return self


class AgentMessage(_Payload):
    """The payload of ``OUTPUT:AGENT_MESSAGE``, openstarry's one type beyond spec 002.

    What the agent says to the session: the text of a provider response (and
    its image, audio, video and UI segments), or the answer of a built-in slash
    command. ``final`` marks the last message of a turn.
    """

    text: str = Field(default="", description="The text segments, joined.")
    segments: list[ContentSegment] = Field(
        default_factory=list, description="The segments shown to the user."
    )
    metadata: Any = _optional(description="The provider response's metadata.")
    final: bool = Field(default=False, strict=True, description="Whether this ends the turn.")


class AgentMessageDelta(_Payload):
    """The payload of ``OUTPUT:AGENT_MESSAGE_DELTA``: a piece of text as a provider streams it."""

    text: str = Field(min_length=1, description="The text this piece adds.")
    round: int = Field(ge=1, strict=True, description="The provider call it belongs to.")


#: The payload model of each known event type, by its wire string: the eight
#: :class:`EventType` values, :data:`OUTPUT_AGENT_MESSAGE` and
#: :data:`OUTPUT_AGENT_MESSAGE_DELTA`. An
#: :class:`EventType` member looks its type up too.
PAYLOAD_MODELS: Mapping[str, type[BaseModel]] = MappingProxyType(
    {
        EventType.USER_MESSAGE.value: UserMessage,
        EventType.SYSTEM_COMMAND.value: SystemCommand,
        EventType.SIGNAL.value: Signal,
        EventType.TICK_START.value: TickStart,
        EventType.STATE_CHANGE.value: StateChange,
        EventType.ERROR.value: KernelError,
        EventType.TOOL_CALL.value: ToolCallPayload,
        EventType.TOOL_RESULT.value: ToolResultPayload,
        OUTPUT_AGENT_MESSAGE: AgentMessage,
        OUTPUT_AGENT_MESSAGE_DELTA: AgentMessageDelta,
    }
)


def parse_payload(event_type: str, payload: Any) -> BaseModel:
    """Parse ``payload`` into the model of ``event_type`` (see :data:`PAYLOAD_MODELS`).

    ``payload`` is the decoded JSON (a dict) or already a model instance. For
    a typed result, call the model directly: ``UserMessage.model_validate(p)``.

    Raises:
        ValueError: ``event_type`` has no payload model.
        pydantic.ValidationError: the payload does not fit the model (also a
            ``ValueError``).
    """
    model = PAYLOAD_MODELS.get(event_type)
    if model is None:
        known = ", ".join(PAYLOAD_MODELS)
        raise ValueError(f"no payload model for event type {event_type!r}; known types: {known}")
    return model.model_validate(payload)


#: Every model :func:`json_schema` exports, in the order of the spec.
_SCHEMA_MODELS: tuple[type[BaseModel], ...] = (
    ToolCall,
    ContentSegment,
    ProviderResponse,
    EventEnvelope,
    *PAYLOAD_MODELS.values(),
    ToolErrorInfo,
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every model of this module, in one document.

    Each model is under ``$defs`` by its class name (``"#/$defs/UserMessage"``),
    referring to the others there. ``x-payloads`` maps each event type of
    :data:`PAYLOAD_MODELS` to the reference of its payload's schema. Every model
    also gives its own schema with ``Model.model_json_schema()``.
    """
    _, document = models_json_schema(
        [(model, "validation") for model in _SCHEMA_MODELS],
        title="openstarry protocol",
        description="The wire protocol of openstarry: spec 000 section 3 and spec 002.",
    )
    return {
        "$schema": _JSON_SCHEMA_DIALECT,
        **document,
        "x-payloads": {
            event_type: {"$ref": f"#/$defs/{model.__name__}"}
            for event_type, model in PAYLOAD_MODELS.items()
        },
    }
