"""The Gemini API's ``generateContent``, both directions (spec 000 section 2).

:class:`GeminiAPI` is the :class:`~openstarry.providers.wire.WireAPI` of
``"provider": {"name": "gemini"}``. It does no I/O:
:class:`openstarry.providers.http.HTTPProvider` sends what it builds and hands
it what comes back. The key travels in the ``x-goog-api-key`` header, never in
the URL; it is read from ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY``.

Upstream
    ``context.instructions`` becomes ``systemInstruction``; the tools become
    ``functionDeclarations`` under their API-legal names, their ``parameters``
    translated by :func:`gemini_schema` into the OpenAPI subset Gemini accepts.
    The session memory, read as :func:`openstarry.providers._memory.conversation`
    steps, becomes ``contents``: the user's turns and the system observations
    (text starting :data:`OBSERVATION_PREFIX`) in ``user`` contents, the
    assistant's text and ``functionCall`` parts in ``model`` contents, and each
    call's outcome as a ``functionResponse`` part (``{"result": ...}`` or
    ``{"error": {"code", "message", "source"}}``) in the next ``user`` content,
    in the order of the calls and before the observations: Gemini pairs
    responses with calls by order and name, and the call's id goes along.
    Consecutive contents of one role are merged and blank text is left out. A
    call without an outcome gets a failed one, an outcome without its call
    becomes an observation. ``provider.options`` go into ``generationConfig``
    (see :func:`split_options`).

    Gemini 3 wants the ``thoughtSignature`` of its function calls back: it is
    kept on the openstarry ``toolCall`` (its :data:`SIGNATURE_FIELD` field,
    which the core keeps) and returned with the call. The first call of a step
    of the current turn that has none (one made by another provider) gets
    Google's documented placeholder :data:`SKIP_THOUGHT_SIGNATURE` (set
    :attr:`GeminiAPI.skip_thought_signature` to ``None`` to send none).

Downstream
    ``text`` parts (adjacent ones joined) and ``functionCall`` parts become
    segments in their order; a call without an id gets a UUID; an
    ``inlineData`` image, audio or video becomes a segment of that type;
    thought summaries (parts with ``thought: true``, given when
    ``provider.options`` has ``"thinkingConfig": {"includeThoughts": true}``)
    become ``reasoning`` segments (adjacent ones joined, a ``thoughtSignature``
    as their ``signature``); they are not sent back, as Gemini does not need
    them (the signatures it checks ride on the function calls). ``metadata``
    holds ``id`` (``responseId``), ``model`` (``modelVersion``),
    ``stop_reason`` (``finishReason``),
    ``block_reason`` and ``usage`` as ``{input_tokens, output_tokens,
    total_tokens, raw}``. What cannot be used follows spec 000 section 7 as the
    Anthropic and OpenAI translations do:

    - A part of a kind openstarry does not handle, a ``functionCall`` without a
      name or whose ``args`` are not a JSON object, an answer stopped at
      ``MAX_TOKENS``, no content with another unusual finish reason
      (``MALFORMED_FUNCTION_CALL``...): a note (a text segment starting
      ``[openstarry]``, also listed in ``metadata["errors"]``); the rest of the
      answer is kept.
    - A refusal (``promptFeedback.blockReason``, or a finish reason of
      :data:`REFUSAL_REASONS`): the tool calls are dropped and the text says
      ``The model refused to answer: ...`` with the reason, the blocked safety
      categories and Gemini's message; ``metadata["refused"]`` is true.
    - A stream that ends before a ``finishReason``: the text received is kept,
      each call becomes a note, a last note says the answer was cut off, and
      ``metadata["truncated"]`` is true.
    - An answer with nothing in it is one empty text segment.
    - A body that is not a response (not an object, no candidates and no block
      reason) or a stream with no chunk of one:
      :class:`~openstarry.errors.AgentPainException`. An ``error`` object in a
      body or a stream: :class:`~openstarry.errors.ProviderError`.

Streaming
    :meth:`GeminiAPI.stream` returns a :class:`GeminiStream`: each ``data:``
    line of ``streamGenerateContent?alt=sse`` is a ``GenerateContentResponse``
    chunk; text parts are joined and returned as they arrive, function calls
    arrive whole, the last chunk carries ``finishReason`` and the usage. It
    finishes into the same ``ProviderResponse`` as the whole response would
    give. A stream may bring at most :data:`MAX_STREAM_CHARS` characters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote as url_quote

from openstarry.agent.memory import AssistantTurn, Observation, UserTurn
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.protocol import ContentSegment, ProviderResponse, SegmentType
from openstarry.providers._common import (
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
from openstarry.providers._memory import ToolExchange, conversation, outcome_object

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext
    from openstarry.providers.wire import ToolNameMap

__all__ = [
    "MAX_SCHEMA_DEPTH",
    "MAX_STREAM_CHARS",
    "REFUSAL_REASONS",
    "RESERVED_OPTIONS",
    "SIGNATURE_FIELD",
    "SKIP_THOUGHT_SIGNATURE",
    "GeminiAPI",
    "GeminiStream",
    "contents_of",
    "error_message",
    "function_declaration",
    "gemini_schema",
    "normalise_usage",
    "split_options",
]

#: Request keys openstarry builds itself; ``provider.options`` may not set them.
RESERVED_OPTIONS: Final = frozenset(
    {"model", "contents", "tools", "systemInstruction", "system_instruction"}
)
#: Options that are request fields of their own; every other option goes into ``generationConfig``.
_TOP_LEVEL_OPTIONS: Final = {
    "safetySettings": "safetySettings",
    "safety_settings": "safetySettings",
    "toolConfig": "toolConfig",
    "tool_config": "toolConfig",
    "cachedContent": "cachedContent",
    "cached_content": "cachedContent",
    "labels": "labels",
}
_GENERATION_CONFIG: Final = ("generationConfig", "generation_config")
#: The finish reasons that mean the model declined to answer.
REFUSAL_REASONS: Final = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
_QUIET_REASONS: Final = frozenset({"STOP", "FINISH_REASON_UNSPECIFIED"})
#: Google's placeholder for a function call of the current turn that has no signature.
SKIP_THOUGHT_SIGNATURE: Final = "skip_thought_signature_validator"
#: The extra ``toolCall`` field that carries Gemini's thought signature.
SIGNATURE_FIELD: Final = "thoughtSignature"
#: The most event data one streamed response may carry, in characters.
MAX_STREAM_CHARS: Final = 64 * 1024 * 1024
#: How deep :func:`gemini_schema` follows nested schemas and references.
MAX_SCHEMA_DEPTH: Final = 32

_MEDIA_SEGMENTS: Final[Mapping[str, SegmentType]] = {
    "image": "image",
    "audio": "audio",
    "video": "video",
}
_PART_FLAGS: Final = frozenset({"thought", "thoughtSignature", "partMetadata"})


class GeminiAPI:
    """The Gemini API's ``generateContent`` as a :class:`~openstarry.providers.wire.WireAPI`."""

    name: str = "gemini"
    default_base_url: str = "https://generativelanguage.googleapis.com/v1beta"
    default_api_key_env: str = "GEMINI_API_KEY"
    #: The variables to try for the key, in order, when ``provider.apiKeyEnv`` is
    #: absent (Google's own SDKs read both).
    api_key_envs: tuple[str, ...] = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    #: What a current-turn function call without a thought signature is sent with.
    skip_thought_signature: str | None = SKIP_THOUGHT_SIGNATURE

    #: A request's generation parameters and the ``generationConfig`` fields they become.
    generation_options: Mapping[str, str] = {
        "temperature": "temperature",
        "top_p": "topP",
        "max_tokens": "maxOutputTokens",
        "stop": "stopSequences",
        "seed": "seed",
        "frequency_penalty": "frequencyPenalty",
        "presence_penalty": "presencePenalty",
    }

    def path(self, model: str, *, stream: bool) -> str:
        """``/models/{model}:generateContent``, or ``:streamGenerateContent?alt=sse``.

        ``model`` may be given with its ``models/`` prefix; a tuned model keeps
        its ``tunedModels/`` one.

        Raises:
            ManifestError: for an empty model.
        """
        if not model or not model.strip():
            raise ManifestError(
                "provider.model is required for the gemini provider", field="provider.model"
            )
        collection = "models"
        name = model.removeprefix("models/")
        if name.startswith("tunedModels/"):
            collection, name = "tunedModels", name.removeprefix("tunedModels/")
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/{collection}/{url_quote(name, safe='-._~')}:{method}"

    def headers(self, api_key: str | None) -> dict[str, str]:
        """``x-goog-api-key`` (when there is a key) and ``content-type``."""
        headers = {"content-type": "application/json"}
        if api_key:
            headers["x-goog-api-key"] = api_key
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
        """The ``GenerateContentRequest`` body for the agent's context.

        ``options`` (the manifest's ``provider.options``) go into
        ``generationConfig`` (``temperature``, ``maxOutputTokens``,
        ``thinkingConfig``...), merged over an explicit ``generationConfig``
        option; ``safetySettings``, ``toolConfig``, ``cachedContent`` and
        ``labels`` are request fields of their own. The model is in the path
        and streaming is the path's too.

        Raises:
            ManifestError: when ``options`` sets a key openstarry builds itself
                (:data:`RESERVED_OPTIONS`), or ``generationConfig`` is not an object.
        """
        top, generation = split_options(options)
        body: dict[str, Any] = {}
        if context.instructions:
            body["systemInstruction"] = {"parts": [{"text": context.instructions}]}
        body["contents"] = contents_of(
            context.memory, prompt, names, skip_signature=self.skip_thought_signature
        )
        declarations = [
            function_declaration(tool.describe(), names) for tool in context.tools.values()
        ]
        if declarations:
            body["tools"] = [{"functionDeclarations": declarations}]
        body.update(top)
        if generation:
            body["generationConfig"] = generation
        return body

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        """A ``GenerateContentResponse`` as a ``ProviderResponse``.

        Raises:
            AgentPainException: when ``body`` is not a response (spec 000 section 7).
            ProviderError: when ``body`` is an error object.
        """
        return _parse_response(body, names)

    def stream(self, names: ToolNameMap) -> GeminiStream:
        """A fresh assembler for one streamed response."""
        return GeminiStream(names)

    def error_message(self, status: int, body: Any) -> str:
        """``Gemini API error 400 (INVALID_ARGUMENT): ...``, from an error response.

        Only the API's status and message are quoted; anything that looks like
        a key is blanked out.
        """
        return error_message(status, body)


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``provider.options`` as (request fields, ``generationConfig``).

    Raises:
        ManifestError: naming a reserved key, with ``field="provider.options.<key>"``.
    """
    top: dict[str, Any] = {}
    generation: dict[str, Any] = {}
    for key in _GENERATION_CONFIG:
        if key in options:
            value = options[key]
            if not isinstance(value, Mapping):
                raise ManifestError(
                    f"provider.options.{key} must be an object, not {type(value).__name__}",
                    field=f"provider.options.{key}",
                )
            generation.update(value)
    for key, value in options.items():
        if key in RESERVED_OPTIONS:
            hint = " (use the manifest's instructions)" if "nstruction" in key else ""
            raise ManifestError(
                f"provider.options.{key} is set by openstarry and cannot be overridden{hint}",
                field=f"provider.options.{key}",
            )
        if key in _GENERATION_CONFIG:
            continue
        if key in _TOP_LEVEL_OPTIONS:
            top[_TOP_LEVEL_OPTIONS[key]] = value
        else:
            generation[key] = value
    return top, generation


# --- upstream: tools ---------------------------------------------------------------------------


def function_declaration(described: Mapping[str, Any], names: ToolNameMap) -> dict[str, Any]:
    """One ``functionDeclaration`` from ``Tool.describe()``.

    A tool without parameters gets no ``parameters`` (Gemini refuses an object
    schema with no properties).
    """
    declaration: dict[str, Any] = {"name": names.wire(str(described["name"]))}
    description = described.get("description")
    if description:
        declaration["description"] = str(description)
    parameters = gemini_schema(described.get("parameters") or {})
    if parameters.get("properties"):
        parameters.setdefault("type", "object")
        declaration["parameters"] = parameters
    return declaration


#: The Schema fields Gemini's ``parameters`` accept that openstarry copies as they are.
_TEXT_FIELDS: Final = frozenset({"description", "pattern"})
_NUMBER_FIELDS: Final = frozenset(
    {
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
    }
)
_FORMATS: Final = {
    "string": frozenset({"enum", "date-time"}),
    "number": frozenset({"float", "double"}),
    "integer": frozenset({"int32", "int64"}),
}
_NULLABLE_ONLY: Final = {"nullable": True}


def gemini_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON Schema as the OpenAPI 3.0 subset Gemini's ``parameters`` accept.

    - ``$ref`` is inlined (``#/$defs/...``, ``#/definitions/...``, any local
      pointer); a reference back into itself is cut to ``{"type": "object"}``
      with a description saying so. ``allOf`` is merged into one schema.
    - ``oneOf`` becomes ``anyOf``; a ``null`` alternative, a ``"null"`` in a
      ``type`` list or ``null`` among the ``enum`` values becomes
      ``nullable: true``; a ``type`` list of several types becomes ``anyOf``.
    - ``const`` becomes a one-value ``enum``. Gemini's ``enum`` holds strings
      only: an enum of other values is dropped and its values are listed in
      the description. ``default`` is dropped and stated in the description.
    - ``format`` is kept only where Gemini supports it (``date-time`` and
      ``enum`` for strings, ``float``/``double``, ``int32``/``int64``).
    - ``required`` keeps only names in ``properties``. An object without
      ``properties`` (a free-form map) stays ``{"type": "object"}``.
    - Everything else Gemini refuses is dropped: ``$schema``, ``$id``,
      ``$defs``, ``additionalProperties``, ``patternProperties``, ``title``,
      ``examples``, ``exclusiveMinimum``/``exclusiveMaximum``, ``multipleOf``,
      ``uniqueItems``, ``not``, ``if``/``then``/``else``, ``prefixItems`` and
      the like. The tool still validates its arguments against its full schema.
    """
    return _SchemaConverter(schema).convert(schema, 0, ())


class _SchemaConverter:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node: Any = self.root
        for token in ref[1:].split("/")[1:] if ref != "#" else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            else:
                return None
        return node

    def convert(self, node: Any, depth: int, refs: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(node, Mapping) or depth > MAX_SCHEMA_DEPTH:
            return {}
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = self.resolve(ref)
            if ref in refs:
                kind = target.get("type") if isinstance(target, Mapping) else None
                base: dict[str, Any] = {
                    "type": kind if isinstance(kind, str) and kind != "null" else "object",
                    "description": f"(a {ref.rsplit('/', 1)[-1]} again; not expanded)",
                }
            else:
                base = self.convert(target, depth + 1, (*refs, ref))
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return _merge(base, self.convert(siblings, depth + 1, refs)) if siblings else base
        all_of = node.get("allOf")
        if isinstance(all_of, list):
            merged: dict[str, Any] = {}
            for sub in all_of:
                merged = _merge(merged, self.convert(sub, depth + 1, refs))
            rest = {k: v for k, v in node.items() if k != "allOf"}
            return _merge(merged, self.convert(rest, depth + 1, refs))
        return self._plain(node, depth, refs)

    def _plain(self, node: Mapping[str, Any], depth: int, refs: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        nullable = False
        union = node.get("anyOf", node.get("oneOf"))
        if isinstance(union, list):
            subs = [self.convert(sub, depth + 1, refs) for sub in union]
            kept = [s for s in subs if s != _NULLABLE_ONLY]
            nullable = len(kept) < len(subs)
            if len(kept) == 1:
                out.update(kept[0])
            elif kept:
                out["anyOf"] = kept
        kind = node.get("type")
        if isinstance(kind, list):
            types = [t for t in kind if isinstance(t, str) and t != "null"]
            nullable = nullable or "null" in kind
            if len(types) == 1:
                out["type"] = types[0]
            elif types:
                out["anyOf"] = [{"type": t} for t in types]
        elif isinstance(kind, str):
            if kind == "null":
                nullable = True
            else:
                out["type"] = kind
        for key in _TEXT_FIELDS:
            value = node.get(key)
            if isinstance(value, str):
                out[key] = value
        for key in _NUMBER_FIELDS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = value
        values: Any = [node["const"]] if "const" in node else node.get("enum")
        if isinstance(values, list):
            if None in values:
                nullable = True
                values = [v for v in values if v is not None]
            if values and all(isinstance(v, str) for v in values):
                out["enum"] = values
                out.setdefault("type", "string")
            elif values:
                listed = ", ".join(json.dumps(v, ensure_ascii=False) for v in values)
                _describe(out, f"One of: {listed}.")
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            out["properties"] = {
                str(name): self.convert(sub, depth + 1, refs) for name, sub in properties.items()
            }
            required = node.get("required")
            if isinstance(required, list):
                present = [r for r in required if r in out["properties"]]
                if present:
                    out["required"] = present
        items = node.get("items")
        if isinstance(items, list):  # the tuple form of older drafts
            items = {"anyOf": items} if len(items) > 1 else (items[0] if items else None)
        if items is None and isinstance(node.get("prefixItems"), list):
            prefix = node["prefixItems"]
            items = {"anyOf": prefix} if len(prefix) > 1 else (prefix[0] if prefix else None)
        if isinstance(items, Mapping):
            out["items"] = self.convert(items, depth + 1, refs)
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS.get(out.get("type", ""), ()):
            out["format"] = fmt
        default = node.get("default")
        if default is not None:
            _describe(out, f"Default: {json.dumps(default, ensure_ascii=False, default=str)}.")
        if nullable:
            out["nullable"] = True
        return out


def _describe(out: dict[str, Any], sentence: str) -> None:
    description = out.get("description")
    out["description"] = f"{description} {sentence}" if description else sentence


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; properties and required lists are united."""
    merged = dict(base)
    for key, value in over.items():
        if key == "properties" and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        elif key == "required" and isinstance(merged.get(key), list):
            merged[key] = merged[key] + [r for r in value if r not in merged[key]]
        else:
            merged[key] = value
    return merged


# --- upstream: contents ------------------------------------------------------------------------


def contents_of(
    memory: Sequence[Any],
    prompt: str,
    names: ToolNameMap,
    *,
    skip_signature: str | None = SKIP_THOUGHT_SIGNATURE,
) -> list[dict[str, Any]]:
    """The ``contents`` list for a session's memory (see the module's description).

    The memory is read as :func:`openstarry.providers._memory.conversation`
    steps: each assistant turn with calls comes with one outcome per call, the
    prompt is not repeated when it is the memory's last user turn (and added
    when it is not).
    """
    steps = conversation(memory, prompt)
    # Gemini checks the thought signatures of the current turn only.
    current = max((i for i, s in enumerate(steps) if isinstance(s, UserTurn)), default=0)
    contents: list[dict[str, Any]] = []

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})

    for i, step in enumerate(steps):
        if isinstance(step, ToolExchange):
            parts = [{"text": step.text}] if step.text.strip() else []
            for n, call in enumerate(step.calls):
                part = _function_call_part(call, names)
                if SIGNATURE_FIELD not in part and n == 0 and i >= current and skip_signature:
                    part[SIGNATURE_FIELD] = skip_signature
                parts.append(part)
            add("model", parts)
            add(
                "user",
                [
                    {
                        "functionResponse": {
                            "name": names.wire(call.name),
                            "id": call.id,
                            "response": _json_ready(outcome_object(outcome)),
                        }
                    }
                    for call, outcome in zip(step.calls, step.outcomes, strict=True)
                ],
            )
        elif isinstance(step, AssistantTurn):
            if step.text.strip():  # Gemini refuses empty text parts
                add("model", [{"text": step.text}])
        elif isinstance(step, Observation):
            add("user", [{"text": OBSERVATION_PREFIX + step.text}])
        elif step.text.strip():
            add("user", [{"text": step.text}])
    return contents


def _function_call_part(call: Any, names: ToolNameMap) -> dict[str, Any]:
    args = call.args
    part: dict[str, Any] = {
        "functionCall": {
            "name": names.wire(call.name),
            "args": _json_ready(dict(args)) if isinstance(args, Mapping) else {},
            "id": call.id,
        }
    }
    signature = extras(call).get(SIGNATURE_FIELD)
    if isinstance(signature, str) and signature:
        part[SIGNATURE_FIELD] = signature
    return part


def _json_ready(value: Any) -> Any:
    """``value`` as plain JSON data (what is not JSON becomes its ``str``)."""
    try:
        return json.loads(json.dumps(value, ensure_ascii=False, default=str, allow_nan=False))
    except ValueError:  # NaN, infinity, or nested too deep
        return str(value)


# --- downstream --------------------------------------------------------------------------------


def _parse_response(body: Any, names: ToolNameMap, *, truncated: bool = False) -> ProviderResponse:
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
        return _parse_response(body, self._names, truncated=not self._done)


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
