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
from openstarry.errors import ManifestError
from openstarry.protocol import ProviderResponse
from openstarry.providers._common import OBSERVATION_PREFIX, extras
from openstarry.providers._gemini_response import (
    MAX_STREAM_CHARS,
    REFUSAL_REASONS,
    SIGNATURE_FIELD,
    GeminiStream,
    error_message,
    normalise_usage,
    parse_response,
)
from openstarry.providers._gemini_schema import MAX_SCHEMA_DEPTH, gemini_schema
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
#: Google's placeholder for a function call of the current turn that has no signature.
SKIP_THOUGHT_SIGNATURE: Final = "skip_thought_signature_validator"


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
        return parse_response(body, names)

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
