"""What OpenAI's two APIs share, so each module holds only its own wire format.

:mod:`openstarry.providers.openai_chat` (Chat Completions) and
:mod:`openstarry.providers.openai_responses` (Responses) read different JSON by
the same rules, kept here once:

- An answer is read into :data:`Part` objects in order: the model's text, a
  refusal, a note of openstarry's, a function call whose arguments are still
  as the API sent them. :func:`provider_response` makes them a
  :class:`~openstarry.protocol.ProviderResponse` by spec 000 section 7: a
  refusal becomes ``The model refused to answer: <reason>`` with
  ``metadata["refused"]`` true, a note a text segment starting
  :data:`~openstarry.providers._common.NOTE_PREFIX`, and the calls of an answer
  cut off are not made.
- :func:`stop_notes` says when the API stopped at its token limit or content
  filter; :func:`token_usage` gives usage as ``{"input_tokens",
  "output_tokens", "total_tokens", "raw"}``; :func:`metadata_of` keeps only the
  fields the API sent.
- :func:`describe_error` reads every error shape servers use into ``HTTP
  <status>: <message> (type ..., code ..., param ...)``, keys redacted;
  :func:`raise_reported_error` raises the error an API puts inside a 200
  response or a stream.
- :func:`merge_options` passes ``provider.options`` into the body as they are,
  refusing the keys openstarry sets itself with a
  :class:`~openstarry.errors.ManifestError`.
- A streamed response brings at most :data:`MAX_STREAM_CHARS` characters and
  opens at most :data:`MAX_STREAM_TOOL_CALLS` calls (or output items, or
  content parts); :class:`StreamBudget` holds a stream to both, reading them
  from this module at each check, so one setting bounds both APIs.
- Both APIs default to OpenAI's base URL and ``OPENAI_API_KEY``, sent as
  ``Authorization: Bearer``; without a key (a local server), no header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, Literal

from openstarry.errors import AgentPainException, ManifestError
from openstarry.protocol import ContentSegment, ProviderResponse
from openstarry.providers._common import (
    QUOTE_CHARS,
    Segments,
    clean,
    count,
    error_body,
    loads,
    quote,
    redact,
    reported_error,
)

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext
    from openstarry.providers.wire import ToolNameMap

#: The most characters (text, refusal, tool names and arguments) one streamed
#: response may bring; more raises ``AgentPainException`` rather than fill memory.
MAX_STREAM_CHARS: Final = 8 * 1024 * 1024
#: The most tool calls (or output items) one streamed response may open.
MAX_STREAM_TOOL_CALLS: Final = 512

OPENAI_BASE_URL: Final = "https://api.openai.com/v1"
OPENAI_KEY_ENV: Final = "OPENAI_API_KEY"

ObservationRole = Literal["system", "developer", "user"]
_OBSERVATION_ROLES: tuple[ObservationRole, ...] = ("system", "developer", "user")


# --- the parts of an answer, and turning them into a ProviderResponse ---------------------


@dataclass(slots=True)
class Text:
    """Text of the answer: the model's (``text``), a refusal, or a note of openstarry's."""

    kind: Literal["text", "refusal", "note"]
    #: The text; for a note, what it says without :data:`NOTE_PREFIX`.
    text: str


@dataclass(slots=True)
class Call:
    """A function call as the API sent it; ``arguments`` not parsed yet."""

    id: str | None
    name: str
    arguments: Any


@dataclass(slots=True)
class Reasoning:
    """The model's reasoning or its summary, and what the API wants back of it.

    ``signature`` is the API's handle on it (the Responses API's reasoning
    item id), ``data`` its encrypted reasoning, when the API gave them.
    """

    text: str
    signature: str | None = None
    data: str | None = None


Part = Text | Call | Reasoning


def check_observation_role(role: str) -> ObservationRole:
    for known in _OBSERVATION_ROLES:
        if role == known:
            return known
    raise ValueError(f"observation_role must be 'system', 'developer' or 'user', not {role!r}")


def unhandled(what: str, kind: Any, outcome: str = "it was left out") -> Text:
    shown = repr(kind)
    if len(shown) > QUOTE_CHARS:
        shown = shown[:QUOTE_CHARS] + "..."
    return note(f"The {what} of type {shown}, which openstarry does not handle; {outcome}.")


def note(message: str) -> Text:
    return Text("note", message)


def provider_response(
    parts: list[Part], names: ToolNameMap, metadata: dict[str, Any], *, truncated: bool = False
) -> ProviderResponse:
    """The ``ProviderResponse`` of an answer's parts, in order (see the module's docstring)."""
    segments = Segments()
    for part in parts:
        if isinstance(part, Reasoning):
            segments.reasoning(part.text, signature=part.signature, data=part.data)
        elif isinstance(part, Call):
            name = names.local(part.name)
            if truncated:
                segments.cut(name)  # a cut-off answer must not act
            else:
                segments.tool_call(part.id, name, part.arguments)
        elif part.kind == "refusal":
            segments.refused = True
            reason = part.text.strip()
            text = (
                f"The model refused to answer: {reason}"
                if reason
                else "The model refused to answer."
            )
            segments.add(ContentSegment(type="text", text=text))
        elif part.kind == "note":
            segments.note(part.text)
        elif part.text:
            segments.add(ContentSegment(type="text", text=part.text))
    segments.truncated = truncated
    return segments.response(metadata)


def stop_notes(reason: str | None) -> list[Part]:
    """What the API's reason for stopping says about the answer, when it is not whole."""
    if reason in ("length", "max_output_tokens"):
        return [
            note(
                f"The answer stopped at the model's output token limit ({reason}); "
                "it may be incomplete."
            )
        ]
    if reason == "content_filter":
        return [note("The API's content filter withheld the answer, or part of it.")]
    return []


def token_usage(raw: Any, input_key: str, output_key: str) -> dict[str, Any] | None:
    """Token usage as ``{"input_tokens", "output_tokens", "total_tokens", "raw"}``."""
    if not isinstance(raw, Mapping):
        return None
    used_in, used_out = count(raw, input_key), count(raw, output_key)
    total = count(raw, "total_tokens")
    if total is None and used_in is not None and used_out is not None:
        total = used_in + used_out
    return {
        "input_tokens": used_in,
        "output_tokens": used_out,
        "total_tokens": total,
        "raw": dict(raw),
    }


def metadata_of(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def nonempty_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def json_object(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise AgentPainException(f"{what} is {type(body).__name__}, not a JSON object")
    return body


def event_json(data: str, what: str) -> Mapping[str, Any]:
    try:
        value = loads(data, constants=True)
    except (ValueError, RecursionError):
        raise AgentPainException(f"{what}: an event that is not JSON: {quote(data)}") from None
    return json_object(value, f"{what}: an event")


def merge_options(
    body: dict[str, Any], options: Mapping[str, Any], reserved: Mapping[str, str]
) -> None:
    for key, value in options.items():
        if not isinstance(key, str):
            raise ManifestError(
                f"provider.options keys must be strings, not {key!r}", field="provider.options"
            )
        if key in reserved:
            raise ManifestError(
                f"provider.options.{key} cannot be set: {reserved[key]}",
                field=f"provider.options.{key}",
            )
        body[key] = value


def tool_descriptions(context: AgentContext) -> list[dict[str, Any]]:
    return [tool.describe() for tool in context.tools.values()]


# --- error bodies -----------------------------------------------------------------------------


def describe_error(status: int, body: Any) -> str:
    """``HTTP 401: <message> (type ..., code ...)``, from any of the error shapes servers use."""
    body = error_body(body)
    message: str | None = None
    details: list[str] = []
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            # An error event is its own error object; its type says only "error".
            own = error is body
            message = nonempty_str(error.get("message")) or nonempty_str(error.get("detail"))
            for key in ("type", "code", "param"):
                value = error.get(key)
                if own and key == "type" and value == "error":
                    continue
                if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                    details.append(f"{key} {value}")
        elif isinstance(error, str):
            message = error
        if message is None:
            message = nonempty_str(body.get("detail")) or nonempty_str(body.get("message"))
    elif isinstance(body, str) and body.strip():
        message = " ".join(body.split())
    if message is None:
        try:
            message = HTTPStatus(status).phrase
        except ValueError:
            message = "no error message"
    message = clean(message)
    suffix = f" ({', '.join(redact(d) for d in details)})" if details else ""
    return f"HTTP {status}: {message}{suffix}"


def raise_reported_error(body: Mapping[str, Any], what: str) -> None:
    """Raise ``ProviderError`` for an error the API put in a 200 response or a stream."""
    error = body.get("error")
    if error:
        message = f"{what} reported an error: {describe_error(200, body)}"
        raise reported_error(message, error)


def bearer_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# --- what both translators are -------------------------------------------------------------------


class OpenAIWireAPI:
    """What both OpenAI translators share as :class:`~openstarry.providers.wire.WireAPI` objects.

    OpenAI's base URL and ``OPENAI_API_KEY`` by default, the key sent as
    ``Authorization: Bearer`` (no header without one: a local server), the role a
    system observation is sent as, and the error messages.

    Args:
        observation_role: ``"system"``, ``"developer"`` or ``"user"``.
    """

    default_base_url = OPENAI_BASE_URL
    default_api_key_env = OPENAI_KEY_ENV

    def __init__(self, *, observation_role: ObservationRole) -> None:
        self.observation_role = check_observation_role(observation_role)

    def headers(self, api_key: str | None) -> dict[str, str]:
        """``Authorization: Bearer <key>``; nothing without a key (a local server)."""
        return bearer_headers(api_key)

    def error_message(self, status: int, body: Any) -> str:
        """``HTTP <status>: <error.message> (type ..., code ..., param ...)``, keys redacted."""
        return describe_error(status, body)


# --- the bounds of a streamed response -----------------------------------------------------------


class StreamBudget:
    """What one streamed response has brought so far, held to this module's bounds."""

    __slots__ = ("chars",)

    def __init__(self) -> None:
        self.chars = 0

    def grow(self, piece: str) -> None:
        """Count ``piece`` (text, a refusal, a tool's name or arguments) against the bound.

        Raises:
            AgentPainException: the response is now longer than the bound.
        """
        self.chars += len(piece)
        if self.chars > MAX_STREAM_CHARS:
            raise AgentPainException(
                f"the streamed response is longer than {MAX_STREAM_CHARS} characters"
            )

    @staticmethod
    def open(held: int, what: str, *, verb: str = "opened") -> None:
        """Allow one more of ``what`` (tool calls, output items...) beside the ``held`` ones.

        Raises:
            AgentPainException: ``held`` is already :data:`MAX_STREAM_TOOL_CALLS`.
        """
        if held >= MAX_STREAM_TOOL_CALLS:
            raise AgentPainException(
                f"the streamed response {verb} more than {MAX_STREAM_TOOL_CALLS} {what}"
            )
