"""The Anthropic Messages API (``POST /v1/messages``), both directions (spec 000 section 2).

:class:`AnthropicAPI` is the :class:`~openstarry.providers.wire.WireAPI` of
``"provider": {"name": "anthropic"}``. It does no I/O:
:class:`openstarry.providers.http.HTTPProvider` sends what it builds and hands
it what comes back.

Upstream
    ``context.instructions`` becomes ``system``; each tool becomes
    ``{name, description, input_schema}`` under its API-legal name (``fs.read``
    is sent as ``fs_read``). The session memory, read as
    :func:`openstarry.providers._memory.conversation` steps, becomes
    alternating ``user``/``assistant`` messages: an assistant turn is its text
    and one ``tool_use`` block per call; the outcomes of those calls open the
    next user message as ``tool_result`` blocks paired by id (a failure with
    ``is_error``), as the API requires, followed by the system observations
    (text blocks starting :data:`OBSERVATION_PREFIX`) and the user's next words.
    Consecutive messages of one role are merged and blank text is left out (the
    API refuses both). A call without an outcome gets a failed one, an outcome
    without its call becomes an observation, so the API never sees a
    ``tool_use`` without its result or the reverse. Call ids are made legal
    (``[A-Za-z0-9_-]``) the same way for a call and its result.
    ``provider.options`` go into the body as they are (``max_tokens``, which
    defaults to :data:`DEFAULT_MAX_TOKENS`, ``temperature``, ``tool_choice``,
    ``thinking``...), except :data:`RESERVED_OPTIONS`.

Downstream
    ``text`` and ``tool_use`` blocks become segments in their order; ``metadata``
    holds ``id``, ``model``, ``stop_reason`` and ``usage`` as ``{input_tokens,
    output_tokens, total_tokens, raw}``. What cannot be used follows spec 000
    section 7 as the OpenAI translations do:

    - ``thinking`` blocks become ``reasoning`` segments (the thinking as
      ``text``, its ``signature``), ``redacted_thinking`` blocks ``reasoning``
      segments with empty text and the encrypted ``data``. The loop keeps them
      in the session's memory and the next request hands each assistant
      turn's back, before its text and calls, as the API wants in a tool-use
      loop with extended thinking on (reasoning without a signature or data,
      from another provider, is not sent). Memory written by older versions,
      whose thinking rode on the first call's :data:`THINKING_FIELD`, is
      still sent back.
    - A block of a type openstarry does not handle, a ``tool_use`` without a
      name or whose input is not a JSON object, an answer stopped at
      ``max_tokens``: a note (a text segment starting :data:`NOTE_PREFIX`, also
      listed in ``metadata["errors"]``); the rest of the answer is kept, so the
      model reads the note next round and can correct itself.
    - ``stop_reason: "refusal"``: the tool calls are dropped and the text says
      ``The model refused to answer: ...``; ``metadata["refused"]`` is true.
    - A stream that ends before ``message_stop``: the text received is kept,
      each call becomes a note (a cut-off answer must not act), a last note
      says the answer was cut off, and ``metadata["truncated"]`` is true.
    - An answer with nothing in it is one empty text segment.
    - A body that is not a message (not an object, no ``content`` list), or a
      stream with no event of one: :class:`~openstarry.errors.AgentPainException`.
      An error object in a 200 body or an ``error`` event in a stream:
      :class:`~openstarry.errors.ProviderError` with the API's error type and
      message.

Streaming
    :meth:`AnthropicAPI.stream` returns an :class:`AnthropicStream`, which
    rebuilds the message from the events (``message_start``,
    ``content_block_start``, ``content_block_delta`` with ``text_delta``,
    ``input_json_delta``, ``thinking_delta`` or ``signature_delta``,
    ``content_block_stop``, ``message_delta``, ``message_stop``; ``ping`` and
    event types it does not know are passed over), returns each piece of text
    as it arrives, and finishes into the same ``ProviderResponse`` as the whole
    message would give. A stream may bring at most :data:`MAX_STREAM_CHARS`
    characters of event data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from openstarry import core
from openstarry.agent.memory import AssistantTurn, Observation, ToolOutcome
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.protocol import ProviderResponse
from openstarry.providers._common import (
    NOTE_PREFIX,
    OBSERVATION_PREFIX,
    Segments,
    clean,
    count,
    error_body,
    extras,
    loads,
    quote,
    reported_error,
    total,
)
from openstarry.providers._memory import ToolExchange, conversation, outcome_text

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext
    from openstarry.providers.wire import ToolNameMap

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "MAX_STREAM_CHARS",
    "NOTE_PREFIX",
    "OBSERVATION_PREFIX",
    "RESERVED_OPTIONS",
    "THINKING_FIELD",
    "AnthropicAPI",
    "AnthropicStream",
    "check_options",
    "error_message",
    "messages_of",
    "normalise_usage",
    "tool_declaration",
]

#: The ``anthropic-version`` header openstarry speaks.
ANTHROPIC_VERSION: Final = "2023-06-01"
#: ``max_tokens`` when ``provider.options`` does not set it (the API requires one).
DEFAULT_MAX_TOKENS: Final = 4096
#: Body keys openstarry builds itself; ``provider.options`` may not set them.
RESERVED_OPTIONS: Final = frozenset({"model", "messages", "system", "tools", "stream"})
#: The most event data one streamed response may carry, in characters.
MAX_STREAM_CHARS: Final = 64 * 1024 * 1024
#: The extra ``toolCall`` field that carried thinking blocks in memory before
#: ``reasoning`` segments; still read.
THINKING_FIELD: Final = "anthropicThinking"

_TOOL_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class AnthropicAPI:
    """Anthropic's Messages API as a :class:`~openstarry.providers.wire.WireAPI`."""

    name: str = "anthropic"
    default_base_url: str = "https://api.anthropic.com/v1"
    default_api_key_env: str = "ANTHROPIC_API_KEY"
    #: The variables to try for the key, in order, when ``provider.apiKeyEnv`` is absent.
    api_key_envs: tuple[str, ...] = ("ANTHROPIC_API_KEY",)

    #: A request's generation parameters and the body fields they become (the
    #: Messages API has no seed or penalties).
    generation_options: Final[Mapping[str, str]] = {
        "temperature": "temperature",
        "top_p": "top_p",
        "max_tokens": "max_tokens",
        "stop": "stop_sequences",
    }

    def path(self, model: str, *, stream: bool) -> str:
        """``/messages``: the model and streaming are chosen in the body."""
        return "/messages"

    def headers(self, api_key: str | None) -> dict[str, str]:
        """``x-api-key`` (when there is a key), ``anthropic-version`` and ``content-type``."""
        headers = {"anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def build_request(
        self,
        prompt: str,
        context: AgentContext,
        *,
        model: str,
        options: Mapping[str, Any],
        stream: bool,
        names: ToolNameMap,
    ) -> dict[str, Any]:
        """The Messages request body for the agent's context.

        ``options`` (the manifest's ``provider.options``) are added to the body
        as they are, ``max_tokens`` defaulting to :data:`DEFAULT_MAX_TOKENS`.

        Raises:
            ManifestError: when ``options`` sets a key openstarry builds itself
                (:data:`RESERVED_OPTIONS`), or ``model`` is empty.
        """
        if not model:
            raise ManifestError(
                "provider.model is required for the anthropic provider", field="provider.model"
            )
        check_options(options)
        body: dict[str, Any] = {"model": model, "max_tokens": DEFAULT_MAX_TOKENS}
        body.update(options)
        if context.instructions:
            body["system"] = context.instructions
        body["messages"] = messages_of(context.memory, prompt, names)
        tools = [tool_declaration(tool.describe(), names) for tool in context.tools.values()]
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return body

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        """A Messages response body as a ``ProviderResponse``.

        Raises:
            AgentPainException: when ``body`` is not a message (spec 000 section 7).
            ProviderError: when ``body`` is an error object.
        """
        return _parse_message(body, names)

    def stream(self, names: ToolNameMap) -> AnthropicStream:
        """A fresh assembler for one streamed response."""
        return AnthropicStream(names)

    def error_message(self, status: int, body: Any) -> str:
        """``Anthropic API error 429 (rate_limit_error): ...``, from an error response.

        Only the API's error type, message and request id are quoted; anything
        that looks like a key is blanked out.
        """
        return error_message(status, body)


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse ``provider.options`` keys that would replace what openstarry builds.

    Raises:
        ManifestError: naming the key, with ``field="provider.options.<key>"``.
    """
    for key in options:
        if key in RESERVED_OPTIONS:
            hint = " (use the manifest's instructions)" if key == "system" else ""
            raise ManifestError(
                f"provider.options.{key} is set by openstarry and cannot be overridden{hint}",
                field=f"provider.options.{key}",
            )
    max_tokens = options.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ManifestError(
            f"provider.options.max_tokens must be a positive integer, not {max_tokens!r}",
            field="provider.options.max_tokens",
        )


# --- upstream ---------------------------------------------------------------------------------


def tool_declaration(described: Mapping[str, Any], names: ToolNameMap) -> dict[str, Any]:
    """One entry of ``tools``: ``{name, description, input_schema}`` from ``Tool.describe()``."""
    schema = dict(described.get("parameters") or {})
    schema.setdefault("type", "object")
    declaration: dict[str, Any] = {"name": names.wire(str(described["name"]))}
    description = described.get("description")
    if description:
        declaration["description"] = str(description)
    declaration["input_schema"] = schema
    return declaration


def messages_of(memory: Sequence[Any], prompt: str, names: ToolNameMap) -> list[dict[str, Any]]:
    """The ``messages`` list for a session's memory (see the module's description).

    The memory is read as :func:`openstarry.providers._memory.conversation`
    steps: each assistant turn with calls comes with one outcome per call, the
    prompt is not repeated when it is the memory's last user turn (and added
    when it is not).
    """
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for step in conversation(memory, prompt):
        if isinstance(step, ToolExchange):
            add("assistant", _assistant_blocks(step.text, step.calls, names, step.reasoning))
            # Right after the tool_use blocks, so the results open the next user message.
            add("user", [_tool_result(outcome) for outcome in step.outcomes])
        elif isinstance(step, AssistantTurn):
            add("assistant", _assistant_blocks(step.text, (), names, step.reasoning))
        elif isinstance(step, Observation):
            add("user", [{"type": "text", "text": OBSERVATION_PREFIX + step.text}])
        elif step.text.strip():  # a user turn; the API refuses blank text
            add("user", [{"type": "text", "text": step.text}])
    return messages


def _thinking_block(segment: core.ContentSegment) -> dict[str, Any] | None:
    """The ``thinking`` or ``redacted_thinking`` block of a ``reasoning`` segment, if it has one."""
    if segment.signature:
        return {"type": "thinking", "thinking": segment.text or "", "signature": segment.signature}
    if segment.data:
        return {"type": "redacted_thinking", "data": segment.data}
    return None


def _assistant_blocks(
    text: str,
    calls: Sequence[core.ToolCall],
    names: ToolNameMap,
    reasoning: Sequence[core.ContentSegment] = (),
) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [b for b in map(_thinking_block, reasoning) if b is not None]
    if calls and not blocks:
        thinking = extras(calls[0]).get(THINKING_FIELD)
        if isinstance(thinking, list):
            blocks.extend(b for b in thinking if isinstance(b, dict))
    if text.strip():  # the API refuses empty or blank text blocks
        blocks.append({"type": "text", "text": text})
    for call in calls:
        args = call.args
        blocks.append(
            {
                "type": "tool_use",
                "id": _wire_id(call.id),
                "name": names.wire(call.name),
                "input": dict(args) if isinstance(args, Mapping) else {},
            }
        )
    return blocks


def _tool_result(outcome: ToolOutcome) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _wire_id(outcome.tool_call_id)}
    text = outcome_text(outcome)
    if text:  # an empty result is a tool_result without content
        block["content"] = text
    if not outcome.success:
        block["is_error"] = True
    return block


def _wire_id(call_id: str) -> str:
    """A call id as the API accepts it (``[A-Za-z0-9_-]+``), the same for a call and its result."""
    return _TOOL_ID_CHARS.sub("_", call_id) or "call"


# --- downstream -------------------------------------------------------------------------------


def _stop_note(reason: Any) -> str | None:
    """What a ``stop_reason`` says about an answer that is not whole."""
    if reason == "max_tokens":
        return (
            "The answer stopped at the model's output token limit (max_tokens); "
            "it may be incomplete."
        )
    if reason == "model_context_window_exceeded":
        return (
            "The answer stopped at the model's context window "
            "(model_context_window_exceeded); it may be incomplete."
        )
    return None


def _parse_message(body: Any, names: ToolNameMap, *, truncated: bool = False) -> ProviderResponse:
    if not isinstance(body, Mapping):
        raise AgentPainException(
            f"the Anthropic response is not a JSON object but {type(body).__name__}"
        )
    if body.get("type") == "error":
        raise ProviderError(error_message(200, body))
    content = body.get("content")
    if not isinstance(content, list):
        raise AgentPainException("the Anthropic response has no content list")
    segments = Segments()
    segments.truncated = truncated
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping) or not isinstance(kind, str):
            segments.note(
                f"The answer held a content block without a type: {quote(block)}; it was left out."
            )
        elif kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                segments.text(text)
            else:
                segments.note(f"The answer held a text block without text: {quote(block)}.")
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                segments.note(
                    f"The model made a tool call without a tool name: {quote(block)}; "
                    "it was not made."
                )
            elif truncated:
                segments.cut(names.local(name))  # a cut-off answer must not act
            else:
                segments.tool_call(block.get("id"), names.local(name), block.get("input"))
        elif kind == "thinking":
            thought, signature = block.get("thinking"), block.get("signature")
            segments.reasoning(
                thought if isinstance(thought, str) else "",
                signature=signature if isinstance(signature, str) and signature else None,
            )
        elif kind == "redacted_thinking":
            data = block.get("data")
            segments.reasoning("", data=data if isinstance(data, str) and data else None)
        else:
            segments.note(
                f"The answer held a content block of type {kind!r}, which openstarry does not "
                "handle; it was left out."
            )
    stop_reason = body.get("stop_reason")
    if stop_reason == "refusal" and not truncated:
        segments.refusal("Anthropic's safety classifiers stopped the answer (stop_reason refusal)")
    note = _stop_note(stop_reason)
    if note is not None:
        segments.note(note)
    return segments.response(_metadata(body))


def _metadata(body: Mapping[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key in ("id", "model", "stop_reason"):
        value = body.get(key)
        if value is not None:
            metadata[key] = value
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        metadata["usage"] = normalise_usage(usage)
    return metadata


def normalise_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """``{input_tokens, output_tokens, total_tokens, raw}`` from Anthropic's ``usage``.

    ``input_tokens`` counts every prompt token: Anthropic's ``input_tokens``
    plus the tokens written to and read from its prompt cache. A count the
    API did not give is ``None``.
    """
    prompt = total(
        count(usage, "input_tokens"),
        count(usage, "cache_creation_input_tokens"),
        count(usage, "cache_read_input_tokens"),
    )
    output = count(usage, "output_tokens")
    return {
        "input_tokens": prompt,
        "output_tokens": output,
        "total_tokens": prompt + output if prompt is not None and output is not None else None,
        "raw": dict(usage),
    }


class AnthropicStream:
    """Assembles a streamed Messages response (``"stream": true``) from its events.

    It rebuilds the message the non-streamed API would have returned (the
    ``message_start`` message, each content block from its start and deltas,
    ``stop_reason`` and ``usage`` from ``message_delta``), so :meth:`finish` gives
    the same ``ProviderResponse`` as :meth:`AnthropicAPI.parse_response`.
    """

    def __init__(self, names: ToolNameMap) -> None:
        self._names = names
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        # The text and thinking of each block, in the pieces they came in: joined
        # when the block ends, so a long answer is assembled in linear time.
        self._pieces: dict[tuple[int, str], list[str]] = {}
        self._done = False
        self._chars = 0

    @property
    def done(self) -> bool:
        """Whether ``message_stop`` has arrived."""
        return self._done

    def feed(self, event: str | None, data: str) -> str | None:
        """Take one server-sent event; returns the text it adds, if any.

        Raises:
            ProviderError: for an ``error`` event.
            AgentPainException: for an event that is not JSON, or a stream past
                :data:`MAX_STREAM_CHARS`.
        """
        self._chars += len(data)
        if self._chars > MAX_STREAM_CHARS:
            raise AgentPainException(
                f"the streamed Anthropic response exceeds {MAX_STREAM_CHARS} characters"
            )
        if not data.strip() or self._done:
            return None
        try:
            payload = loads(data)
        except (ValueError, RecursionError) as exc:
            raise AgentPainException(
                f"a streamed Anthropic event ({event or 'unnamed'}) is not JSON: {exc}"
            ) from None
        if not isinstance(payload, dict):
            raise AgentPainException(
                f"a streamed Anthropic event ({event or 'unnamed'}) is not a JSON object"
            )
        kind = payload.get("type") or event
        if kind == "message_start":
            message = payload.get("message")
            self._message = dict(message) if isinstance(message, Mapping) else {}
            usage = self._message.get("usage")
            if isinstance(usage, Mapping):
                self._message["usage"] = dict(usage)  # updated by message_delta
        elif kind == "content_block_start":
            index, block = payload.get("index"), payload.get("content_block")
            if isinstance(index, int) and isinstance(block, Mapping):
                self._blocks[index] = dict(block)
                if block.get("type") == "tool_use":
                    self._json[index] = []
                text = block.get("text")
                if block.get("type") == "text" and isinstance(text, str) and text:
                    return text
        elif kind == "content_block_delta":
            return self._delta(payload)
        elif kind == "content_block_stop":
            index = payload.get("index")
            if isinstance(index, int):
                self._close(index)
        elif kind == "message_delta":
            message = self._message if self._message is not None else {}
            self._message = message
            delta = payload.get("delta")
            if isinstance(delta, Mapping):
                message.update(delta)
            usage = payload.get("usage")
            if isinstance(usage, Mapping):
                # message_delta's counts are cumulative: they replace message_start's.
                merged = message.get("usage")
                merged = dict(merged) if isinstance(merged, Mapping) else {}
                merged.update({k: v for k, v in usage.items() if v is not None})
                message["usage"] = merged
        elif kind == "message_stop":
            self._done = True
        elif kind == "error":
            raise reported_error(error_message(None, payload), payload.get("error"))
        # ping, and event types added to the API later: nothing to assemble.
        return None

    def _delta(self, payload: Mapping[str, Any]) -> str | None:
        index, delta = payload.get("index"), payload.get("delta")
        if not isinstance(index, int) or not isinstance(delta, Mapping):
            return None
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if isinstance(text, str) and block.get("type") == "text":
                self._pieces.setdefault((index, "text"), []).append(text)
                return text or None
        elif kind == "input_json_delta":
            part = delta.get("partial_json")
            if isinstance(part, str):
                self._json.setdefault(index, []).append(part)
        elif kind == "thinking_delta":
            part = delta.get("thinking")
            if isinstance(part, str):
                self._pieces.setdefault((index, "thinking"), []).append(part)
        elif kind == "signature_delta":
            signature = delta.get("signature")
            if isinstance(signature, str):
                block["signature"] = signature
        return None

    def _close(self, index: int) -> None:
        parts = self._json.pop(index, None)
        block = self._blocks.get(index)
        if parts is not None and block is not None:
            raw = "".join(parts)
            if raw.strip():
                block["input"] = raw
        for field in ("text", "thinking"):
            pieces = self._pieces.pop((index, field), None)
            if pieces and block is not None:
                block[field] = str(block.get(field) or "") + "".join(pieces)

    def finish(self) -> ProviderResponse:
        """The whole response (see the module's description for a cut-off stream).

        Raises:
            AgentPainException: when no event of a response arrived.
        """
        if self._message is None and not self._blocks:
            raise AgentPainException("the Anthropic stream ended before the response began")
        for index in {*self._json, *(i for i, _ in self._pieces)}:
            self._close(index)
        message = dict(self._message or {})
        message["content"] = [self._blocks[i] for i in sorted(self._blocks)]
        return _parse_message(message, self._names, truncated=not self._done)


# --- errors -----------------------------------------------------------------------------------


def error_message(status: int | None, body: Any) -> str:
    """What an Anthropic error body says: type, message and request id, keys blanked out."""
    prefix = "Anthropic API error" if status is None else f"Anthropic API error {status}"
    body = error_body(body)
    if isinstance(body, str):
        excerpt = " ".join(body.split())
        return f"{prefix}: {clean(excerpt)}" if excerpt else prefix
    if not isinstance(body, Mapping):
        return prefix
    error = body.get("error")
    if isinstance(error, Mapping):
        kind, message = error.get("type"), error.get("message")
    else:
        kind, message = body.get("type"), error if isinstance(error, str) else None
    text = prefix
    if isinstance(kind, str) and kind and kind != "error":
        text += f" ({clean(kind)})"
    if isinstance(message, str) and message:
        text += f": {clean(message)}"
    request_id = body.get("request_id")
    if isinstance(request_id, str) and request_id:
        text += f" [request {clean(request_id)}]"
    return text
