"""Gemini's answers read into a ``ProviderResponse``: whole (``generateContent``) or streamed.

The downstream half of :mod:`openstarry.providers.gemini` (its docstring says
what becomes of each part, refusal and truncation): :func:`parse_response`
reads a ``GenerateContentResponse``, :class:`GeminiStream` assembles the
chunks of ``streamGenerateContent?alt=sse`` into one and reads it the same
way, and :func:`error_message` words an error body. Building the request is
the other half, in :mod:`openstarry.providers.gemini`, which imports from
here (the thought signature's field name, :data:`SIGNATURE_FIELD`, is shared).
Import these names from :mod:`openstarry.providers.gemini`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from openstarry.errors import AgentPainException, ProviderError
from openstarry.protocol import ContentSegment, ProviderResponse, SegmentType
from openstarry.providers._common import (
    Segments,
    clean,
    count,
    error_body,
    loads,
    quote,
    reported_error,
    total,
)

if TYPE_CHECKING:
    from openstarry.providers.wire import ToolNameMap

__all__ = [
    "MAX_STREAM_CHARS",
    "REFUSAL_REASONS",
    "SIGNATURE_FIELD",
    "GeminiStream",
    "error_message",
    "normalise_usage",
    "parse_response",
]


#: The finish reasons that mean the model declined to answer.
REFUSAL_REASONS: Final = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
_QUIET_REASONS: Final = frozenset({"STOP", "FINISH_REASON_UNSPECIFIED"})
#: The extra ``toolCall`` field that carries Gemini's thought signature.
SIGNATURE_FIELD: Final = "thoughtSignature"
#: The most event data one streamed response may carry, in characters.
MAX_STREAM_CHARS: Final = 64 * 1024 * 1024

_MEDIA_SEGMENTS: Final[Mapping[str, SegmentType]] = {
    "image": "image",
    "audio": "audio",
    "video": "video",
}
_PART_FLAGS: Final = frozenset({"thought", "thoughtSignature", "partMetadata"})


def parse_response(body: Any, names: ToolNameMap, *, truncated: bool = False) -> ProviderResponse:
    """A ``GenerateContentResponse`` as a ``ProviderResponse`` (``truncated``: a cut stream)."""
    if not isinstance(body, Mapping):
        raise AgentPainException(
            f"the Gemini response is not a JSON object but {type(body).__name__}"
        )
    if isinstance(body.get("error"), Mapping):
        raise ProviderError(error_message(200, body))
    segments = Segments()
    candidates = body.get("candidates")
    feedback = body.get("promptFeedback")
    feedback = feedback if isinstance(feedback, Mapping) else {}
    if not candidates:
        block = feedback.get("blockReason")
        if not block:
            raise AgentPainException(
                "the Gemini response has no candidates and no reason for their absence"
            )
        segments.refusal(f"the prompt was blocked ({_why(str(block), feedback)})")
        return segments.response(_metadata(body, None))
    candidate = candidates[0] if isinstance(candidates, list) else None
    if not isinstance(candidate, Mapping):
        raise AgentPainException("the Gemini response's first candidate is not an object")
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    if parts is None:
        parts = []
    if not isinstance(parts, list):
        raise AgentPainException("the Gemini response's content.parts is not a list")
    segments.truncated = truncated
    for part in parts:
        _read_part(part, names, segments, truncated=truncated)
    finish = candidate.get("finishReason")
    if not isinstance(finish, str):
        finish = None
    if truncated or finish is None or finish in _QUIET_REASONS:
        pass
    elif finish in REFUSAL_REASONS:
        segments.refusal(f"finishReason {_why(finish, candidate)}")
    elif finish == "MAX_TOKENS":
        segments.note(
            "The answer stopped at the model's output token limit (MAX_TOKENS); "
            "it may be incomplete."
        )
    elif not segments.items:
        segments.note(f"The model gave no answer (finishReason {_why(finish, candidate)}).")
    return segments.response(_metadata(body, finish))


def _read_part(part: Any, names: ToolNameMap, segments: Segments, *, truncated: bool) -> None:
    if not isinstance(part, Mapping):
        segments.note(
            f"The answer held a part that is not an object: {quote(part)}; it was left out."
        )
        return
    if part.get("thought") is True:
        _thought(part, segments)
        return
    if "text" in part:
        text = part["text"]
        if isinstance(text, str):
            segments.text(text)
        else:
            segments.note(f"The answer held a text part without text: {quote(part)}.")
        return
    if "functionCall" in part:
        call = part["functionCall"]
        name = call.get("name") if isinstance(call, Mapping) else None
        if not isinstance(call, Mapping) or not isinstance(name, str) or not name:
            segments.note(
                f"The model made a tool call without a tool name: {quote(part)}; it was not made."
            )
        elif truncated:
            segments.cut(names.local(name))  # a cut-off answer must not act
        else:
            signature = part.get(SIGNATURE_FIELD)
            extras = (
                {SIGNATURE_FIELD: signature} if isinstance(signature, str) and signature else {}
            )
            segments.tool_call(call.get("id"), names.local(name), call.get("args"), extras)
        return
    inline = part.get("inlineData")
    if isinstance(inline, Mapping):
        mime, data = inline.get("mimeType"), inline.get("data")
        kind = _MEDIA_SEGMENTS.get(mime.partition("/")[0]) if isinstance(mime, str) else None
        if kind is not None and isinstance(data, str) and data:
            segments.add(ContentSegment(type=kind, data=data, mime_type=mime))
            return
    kinds = [k for k in part if k not in _PART_FLAGS]
    if not kinds:
        return  # only a thought signature: nothing to show
    segments.note(
        f"The answer held a part of type {kinds[0]!r}, which openstarry does not handle; "
        "it was left out."
    )


def _thought(part: Mapping[str, Any], segments: Segments) -> None:
    """A thought summary part: a ``reasoning`` segment, joined to a thought just before it."""
    text = part.get("text")
    text = text if isinstance(text, str) else ""
    signature = part.get(SIGNATURE_FIELD)
    signature = signature if isinstance(signature, str) and signature else None
    last = segments.items[-1] if segments.items else None
    if last is not None and last.type == "reasoning" and last.signature is None:
        segments.items[-1] = ContentSegment(
            type="reasoning", text=(last.text or "") + text, signature=signature
        )
        return
    segments.reasoning(text, signature=signature)


def _why(reason: str, source: Mapping[str, Any]) -> str:
    """``SAFETY; blocked for HARM_CATEGORY_X; <message>``: a reason and what backs it."""
    reasons = [reason]
    ratings = source.get("safetyRatings")
    if isinstance(ratings, list):
        blocked = [
            str(r.get("category"))
            for r in ratings
            if isinstance(r, Mapping) and r.get("blocked") and r.get("category")
        ]
        if blocked:
            reasons.append("blocked for " + ", ".join(blocked))
    for key in ("finishMessage", "blockReasonMessage"):
        message = source.get(key)
        if isinstance(message, str) and message:
            reasons.append(clean(message))
    return "; ".join(reasons)


def _metadata(body: Mapping[str, Any], finish: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    response_id = body.get("responseId")
    if isinstance(response_id, str):
        metadata["id"] = response_id
    model = body.get("modelVersion")
    if isinstance(model, str):
        metadata["model"] = model
    if finish is not None:
        metadata["stop_reason"] = finish
    feedback = body.get("promptFeedback")
    if isinstance(feedback, Mapping) and isinstance(feedback.get("blockReason"), str):
        metadata["block_reason"] = feedback["blockReason"]
    usage = body.get("usageMetadata")
    if isinstance(usage, Mapping):
        metadata["usage"] = normalise_usage(usage)
    return metadata


def normalise_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """``{input_tokens, output_tokens, total_tokens, raw}`` from Gemini's ``usageMetadata``.

    Input counts the prompt and tool-use prompt tokens, output the candidates'
    and thinking tokens; the total is Gemini's own when it gives one. A count
    the API did not give is ``None``.
    """
    prompt = total(count(usage, "promptTokenCount"), count(usage, "toolUsePromptTokenCount"))
    output = total(count(usage, "candidatesTokenCount"), count(usage, "thoughtsTokenCount"))
    whole = count(usage, "totalTokenCount")
    if whole is None and prompt is not None and output is not None:
        whole = prompt + output
    return {
        "input_tokens": prompt,
        "output_tokens": output,
        "total_tokens": whole,
        "raw": dict(usage),
    }


class GeminiStream:
    """Assembles a streamed response (``:streamGenerateContent?alt=sse``) from its chunks.

    Each ``data:`` line is a ``GenerateContentResponse`` holding the next parts:
    text parts are joined, function calls arrive whole, the last chunk carries
    the ``finishReason`` and the usage. :meth:`finish` rebuilds the response the
    non-streamed API would have returned and reads it as
    :meth:`GeminiAPI.parse_response` does.
    """

    def __init__(self, names: ToolNameMap) -> None:
        self._names = names
        self._parts: list[Any] = []
        # The text of the last part, in the pieces it came in: joined when another
        # part follows (or at the end), so a long answer is assembled in linear time.
        self._open_text: list[str] = []
        self._candidate: dict[str, Any] | None = None
        self._body: dict[str, Any] = {}
        self._done = False
        self._chars = 0

    @property
    def done(self) -> bool:
        """Whether a ``finishReason`` (or a prompt's ``blockReason``) has arrived."""
        return self._done

    def feed(self, event: str | None, data: str) -> str | None:
        """Take one server-sent event; returns the text it adds, if any.

        Raises:
            ProviderError: for a chunk holding an ``error``.
            AgentPainException: for a chunk that is not a JSON object, or a
                stream past :data:`MAX_STREAM_CHARS`.
        """
        self._chars += len(data)
        if self._chars > MAX_STREAM_CHARS:
            raise AgentPainException(
                f"the streamed Gemini response exceeds {MAX_STREAM_CHARS} characters"
            )
        if not data.strip():
            return None
        try:
            chunk = loads(data)
        except (ValueError, RecursionError) as exc:
            raise AgentPainException(f"a streamed Gemini chunk is not JSON: {exc}") from None
        if isinstance(chunk, list) and len(chunk) == 1:
            chunk = chunk[0]
        if not isinstance(chunk, Mapping):
            raise AgentPainException("a streamed Gemini chunk is not a JSON object")
        if isinstance(chunk.get("error"), Mapping):
            raise reported_error(error_message(None, chunk), chunk["error"])
        for key in ("responseId", "modelVersion", "usageMetadata"):
            if key in chunk:
                self._body[key] = chunk[key]
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, Mapping):
            self._body["promptFeedback"] = dict(feedback)
            if feedback.get("blockReason"):
                self._done = True
        candidates = chunk.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            return None
        candidate = candidates[0]
        if not isinstance(candidate, Mapping):
            raise AgentPainException("a streamed Gemini chunk's candidate is not an object")
        if self._candidate is None:
            self._candidate = {}
        for key, value in candidate.items():
            if key != "content":
                self._candidate[key] = value
        if candidate.get("finishReason"):
            self._done = True
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, Mapping) else None
        if not isinstance(parts, list):
            return None
        delta: list[str] = []
        for part in parts:
            if not isinstance(part, Mapping):
                self._close_text()
                self._parts.append(part)  # noted when the response is read
                continue
            text = part.get("text")
            if isinstance(text, str) and part.get("thought") is not True:
                delta.append(text)
            self._append(part)
        return "".join(delta) or None

    def _append(self, part: Mapping[str, Any]) -> None:
        last = self._parts[-1] if self._parts else None
        text = part.get("text")
        if (
            isinstance(last, dict)
            and isinstance(text, str)
            and isinstance(last.get("text"), str)
            and bool(last.get("thought")) == bool(part.get("thought"))
        ):
            self._open_text.append(text)
            if part.get(SIGNATURE_FIELD):
                last[SIGNATURE_FIELD] = part[SIGNATURE_FIELD]
        else:
            self._close_text()
            self._parts.append(dict(part))
            if isinstance(text, str):
                self._open_text.append(text)

    def _close_text(self) -> None:
        """Join the pieces of the last part's text into it."""
        if self._open_text and self._parts and isinstance(self._parts[-1], dict):
            self._parts[-1]["text"] = "".join(self._open_text)
        self._open_text = []

    def finish(self) -> ProviderResponse:
        """The whole response (see the module's description for a cut-off stream).

        Raises:
            AgentPainException: when no chunk of a response arrived.
        """
        if self._candidate is None and not self._body:
            raise AgentPainException("the Gemini stream ended before the response began")
        self._close_text()
        body = dict(self._body)
        if self._candidate is not None:
            candidate = dict(self._candidate)
            candidate["content"] = {"role": "model", "parts": self._parts}
            body["candidates"] = [candidate]
        elif not self._done:
            raise AgentPainException("the Gemini stream ended before the response began")
        return parse_response(body, self._names, truncated=not self._done)


# --- errors ------------------------------------------------------------------------------------


def error_message(status: int | None, body: Any) -> str:
    """What a Gemini error body says: its status and message, keys blanked out."""
    prefix = "Gemini API error" if status is None else f"Gemini API error {status}"
    body = error_body(body)
    if isinstance(body, str):
        excerpt = " ".join(body.split())
        return f"{prefix}: {clean(excerpt)}" if excerpt else prefix
    if isinstance(body, list) and body:
        body = body[0]  # generateContent errors sometimes come as a one-element array
    if not isinstance(body, Mapping):
        return prefix
    error = body.get("error")
    if not isinstance(error, Mapping):
        return prefix
    text = prefix
    kind = error.get("status")
    if isinstance(kind, str) and kind:
        text += f" ({clean(kind)})"
    message = error.get("message")
    if isinstance(message, str) and message:
        text += f": {clean(message)}"
    return text
