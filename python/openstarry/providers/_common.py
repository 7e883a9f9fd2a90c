"""What the API translators share: reading an answer into segments, and saying what went wrong.

:mod:`openstarry.providers.openai_chat`,
:mod:`~openstarry.providers.openai_responses`, :mod:`~openstarry.providers.anthropic`
and :mod:`~openstarry.providers.gemini` read their APIs' answers by the same
rules (spec 000 section 7), so the rules live here once:

- :class:`Segments` collects an answer's segments in order: the model's text
  (adjacent pieces joined), its tool calls (arguments parsed by
  :func:`parse_arguments`, a call without an id given one), and openstarry's
  notes about what could not be used (text starting :data:`NOTE_PREFIX`, also
  listed in ``metadata["errors"]``).
- :func:`loads` reads JSON strictly (``NaN`` and ``Infinity`` refused);
  :func:`quote` shows a bounded piece of an unusable value.
- :func:`count` and :func:`total` read token counts from a ``usage`` object.
- :func:`clean` and :func:`redact` keep keys out of error messages;
  :func:`error_body` reads an error response's body as JSON when it is;
  :func:`reported_error` makes the error an API reports inside a response a
  :class:`TransientProviderError` when asking again may help.
- :func:`extras` gives the fields a tool call carries beyond its id, name and
  arguments (the thought signatures some APIs want back).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any, Final

from openstarry import core
from openstarry.errors import ProviderError
from openstarry.protocol import ContentSegment, ProviderResponse, ToolCall

__all__ = [
    "ERROR_CHARS",
    "NOTE_PREFIX",
    "OBSERVATION_PREFIX",
    "QUOTE_CHARS",
    "TRANSIENT_ERRORS",
    "Segments",
    "TransientProviderError",
    "clean",
    "count",
    "error_body",
    "extras",
    "loads",
    "parse_arguments",
    "quote",
    "redact",
    "reported_error",
    "total",
]

#: How a text segment that openstarry wrote, not the model, starts.
NOTE_PREFIX: Final = "[openstarry]"
#: What precedes a system observation sent as the user's text (Anthropic, Gemini).
OBSERVATION_PREFIX: Final = "System observation: "
#: How much of an unusable value a note quotes.
QUOTE_CHARS: Final = 200
#: How much of an API's error message is repeated.
ERROR_CHARS: Final = 1000

# What would give a key away if an error message repeated it: OpenAI's (also
# masked but for its end, "sk-proj-****abcd") and Anthropic's ("sk-ant-..."),
# Google's ("AIza..."), and any bearer token.
_SECRETS = re.compile(r"\bsk-[A-Za-z0-9*_\-]+|AIza[0-9A-Za-z_\-]{10,}|(?i:bearer)\s+\S+")


# --- values ------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: str | bytes, *, constants: bool = False) -> Any:
    """JSON as data, read by the core. What the core refuses goes to Python's ``json``,
    which reads a lone surrogate (and, with ``constants``, ``NaN`` and ``Infinity``,
    which JSON does not have but answers have carried) or says why it is not JSON.

    Raises:
        ValueError: for data that is not JSON.
        RecursionError: for JSON nested too deeply for Python's parser.
    """
    try:
        return core.json_loads(data.encode() if isinstance(data, str) else data)
    except ValueError:
        if constants:
            return json.loads(data)
        return json.loads(data, parse_constant=_refuse_constant)


def quote(value: Any) -> str:
    """``value`` (its ``repr`` unless it is text) cut to :data:`QUOTE_CHARS`, quoted."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > QUOTE_CHARS:
        text = text[:QUOTE_CHARS] + "..."
    return repr(text)


def parse_arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as an object: ``None`` and blank text are ``{}``, text is parsed.

    Raises:
        ValueError: saying why they cannot be an object, to follow "its arguments"
            (``are not valid JSON (...)``, ``are a JSON list, not an object``).
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise ValueError(f"are a JSON {type(raw).__name__}, not an object")
    if not raw.strip():
        return {}
    try:
        value = loads(raw)
    except RecursionError:
        raise ValueError("are nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"are not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"are a JSON {type(value).__name__}, not an object")
    return value


def count(usage: Mapping[str, Any], key: str) -> int | None:
    """The token count ``usage[key]``; ``None`` when it is absent or not an integer."""
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def total(*counts: int | None) -> int | None:
    """The sum of the counts the API gave; ``None`` when it gave none."""
    given = [c for c in counts if c is not None]
    return sum(given) if given else None


def extras(call: Any) -> Mapping[str, Any]:
    """The fields of a tool call beyond ``id``, ``name`` and ``args`` (the core keeps them)."""
    extra = getattr(call, "model_extra", None)
    if isinstance(extra, Mapping):
        return extra
    if not isinstance(call, core.ToolCall):
        return {}
    try:
        encoded = core.encode_response(
            core.ProviderResponse([core.ContentSegment("tool_call", tool_call=call)])
        )
        wire = json.loads(encoded)["segments"][0]["toolCall"]
    except (ValueError, KeyError, IndexError, TypeError):
        return {}
    return {k: v for k, v in wire.items() if k not in ("id", "name", "args")}


# --- error messages ----------------------------------------------------------------------------


def redact(text: str) -> str:
    """``text`` with anything that looks like a key replaced by ``[redacted]``."""
    return _SECRETS.sub("[redacted]", text)


def clean(text: str, limit: int = ERROR_CHARS) -> str:
    """``text`` redacted and cut to ``limit`` characters, for an error message."""
    text = redact(text)
    if len(text) > limit:
        text = text[:limit] + "..."
    return text


def error_body(body: Any) -> Any:
    """An error response's body as JSON data when it is JSON, else as text (bytes decoded)."""
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body).decode("utf-8", "replace")
    if isinstance(body, str):
        with contextlib.suppress(ValueError, RecursionError):
            return json.loads(body)
    return body


class TransientProviderError(ProviderError):
    """An error an API reported inside a response that may pass when asked again.

    Anthropic's ``overloaded_error`` in a stream that began with a 200, say.
    :class:`openstarry.providers.http.HTTPProvider` tries again when it comes
    before any of the answer's text was passed on, as it does for a 529.
    """


#: The error types, codes and statuses that say the API may answer when asked again:
#: Anthropic's, OpenAI's and Gemini's (``error.type``, ``error.code``, ``error.status``).
TRANSIENT_ERRORS: Final = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "server_error",
        "rate_limit_exceeded",
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "INTERNAL",
        "DEADLINE_EXCEEDED",
    }
)
_TRANSIENT_STATUSES: Final = frozenset({429, 500, 502, 503, 504, 529})


def reported_error(message: str, error: Any) -> ProviderError:
    """The exception for an error object an API put in a response or a stream.

    Args:
        message: What to say (keys already blanked out).
        error: The API's error object (``{"type", "code", "status", ...}``).

    Returns:
        A :class:`TransientProviderError` when the error's type, code or status
        is one of :data:`TRANSIENT_ERRORS` (or an HTTP status worth retrying),
        else a :class:`~openstarry.errors.ProviderError`.
    """
    if isinstance(error, Mapping):
        for key in ("type", "code", "status"):
            value = error.get(key)
            if isinstance(value, str) and value in TRANSIENT_ERRORS:
                return TransientProviderError(message)
            if isinstance(value, int) and value in _TRANSIENT_STATUSES:
                return TransientProviderError(message)
    return ProviderError(message)


# --- the answer --------------------------------------------------------------------------------


class Segments:
    """The segments of one answer in order, and what openstarry noted about it.

    Adjacent pieces of the model's text become one segment. A note is a text
    segment openstarry writes (starting :data:`NOTE_PREFIX`), also listed in
    ``metadata["errors"]``. An answer with nothing in it is one empty text
    segment, so the loop still ends the turn with a message.

    Attributes:
        items: The segments so far.
        errors: The notes so far.
        refused: The model declined to answer (``metadata["refused"]``).
        truncated: The answer was cut off (``metadata["truncated"]``, and a last note).
    """

    def __init__(self) -> None:
        self.items: list[ContentSegment] = []
        self.errors: list[str] = []
        self.refused = False
        self.truncated = False
        self._text_open = False
        self._ids: set[str] = set()

    def text(self, text: str) -> None:
        """A piece of the model's text, joined to the piece before it if that was text."""
        if not text:
            return
        if self._text_open:
            last = self.items[-1]
            self.items[-1] = ContentSegment(type="text", text=(last.text or "") + text)
        else:
            self.items.append(ContentSegment(type="text", text=text))
            self._text_open = True

    def note(self, message: str) -> None:
        """A note of openstarry's about the answer: ``[openstarry] <message>``."""
        text = f"{NOTE_PREFIX} {message}"
        self.errors.append(text)
        self.add(ContentSegment(type="text", text=text))

    def refusal(self, reason: str) -> None:
        """The model declined: its tool calls are dropped and ``reason`` is said."""
        self.items = [s for s in self.items if s.tool_call is None]
        self.refused = True
        text = f"The model refused to answer: {reason}"
        self.add(ContentSegment(type="text", text=text if text.endswith(".") else text + "."))

    def cut(self, name: str) -> None:
        """A call of an answer that was cut off: noted, not made."""
        self.note(f"The call of tool {name!r} was cut off with the response; it was not made.")

    def tool_call(
        self, call_id: Any, name: str, raw: Any, extra: Mapping[str, Any] | None = None
    ) -> None:
        """A call of tool ``name`` (the agent's name), or a note when it cannot be made.

        Args:
            call_id: The API's id for the call; a UUID when it gave none, and a
                suffix (``call_1_2``) when an earlier call of the answer has it:
                every API refuses a turn whose calls share an id.
            name: The agent's name of the tool.
            raw: The arguments as the API sent them (see :func:`parse_arguments`).
            extra: More fields for the ``toolCall`` (kept by the core).
        """
        try:
            args = parse_arguments(raw)
        except ValueError as exc:
            self.note(
                f"The model called tool {name!r}, but its arguments {exc}: {quote(raw)}. "
                "The call was not made."
            )
            return
        if not isinstance(call_id, str) or not call_id:
            call_id = str(uuid.uuid4())
        if call_id in self._ids:
            n = 2
            while f"{call_id}_{n}" in self._ids:
                n += 1
            call_id = f"{call_id}_{n}"
        call = ToolCall(id=call_id, name=name, args=args, **(extra or {}))
        try:
            # The loop hands the call to the core, whose limits (nesting) are stricter:
            # its constructor checks them (through the wire's JSON when the call has
            # fields of its own).
            if extra:
                call.to_core()
            else:
                core.ToolCall(name, args, call_id)
        except ValueError as exc:
            self.note(
                f"The model called tool {name!r}, but openstarry cannot carry its arguments "
                f"({exc}). The call was not made."
            )
            return
        self._ids.add(call_id)
        self.add(ContentSegment(type="tool_call", tool_call=call))

    def reasoning(
        self, text: str, *, signature: str | None = None, data: str | None = None
    ) -> None:
        """The model's reasoning (or its summary) and what the provider wants back of it."""
        self.add(ContentSegment(type="reasoning", text=text, signature=signature, data=data))

    def add(self, segment: ContentSegment) -> None:
        """A segment that is not the model's text (a tool call, an image, a note)."""
        self.items.append(segment)
        self._text_open = False

    def calls(self) -> list[ToolCall]:
        """The tool calls so far, in order."""
        return [s.tool_call for s in self.items if s.tool_call is not None]

    def response(self, metadata: dict[str, Any]) -> ProviderResponse:
        """The response; ``truncated``, ``refused`` and ``errors`` go into its ``metadata``."""
        if self.truncated:
            self.note("The response was cut off before the API said it was complete.")
            metadata["truncated"] = True
        if self.refused:
            metadata["refused"] = True
        if self.errors:
            metadata["errors"] = self.errors
        segments = self.items
        if not any(s.type != "reasoning" for s in segments):
            segments = [*segments, ContentSegment(type="text", text="")]
        return ProviderResponse(segments=segments, metadata=metadata)
