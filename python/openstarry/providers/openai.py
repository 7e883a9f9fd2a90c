"""OpenAI's two APIs, both directions: Chat Completions and Responses (spec 000 sections 2 to 4, 7).

:class:`OpenAIChatAPI` (provider name ``openai``) speaks ``POST /chat/completions``,
which OpenAI and most servers that call themselves OpenAI-compatible (Ollama,
vLLM, llama.cpp's server, through ``provider.baseUrl``) understand.
:class:`OpenAIResponsesAPI` (``openai-responses``) speaks ``POST /responses``.
Both are :class:`~openstarry.providers.wire.WireAPI` objects: pure translation,
no I/O; :class:`openstarry.providers.http.HTTPProvider` sends what they build and
hands them what comes back.

Upstream
    ``context.instructions`` becomes the leading ``system`` message (Chat) or
    ``instructions`` (Responses). Each tool of ``context.tools`` becomes a
    ``function`` tool under its API-legal name (``fs.read`` is sent as
    ``fs_read``, see :class:`~openstarry.providers.wire.ToolNameMap`); the
    Responses API gets ``"strict": false``, as openstarry's tool schemas are
    plain JSON Schema, not the subset strict mode demands. No tools, no
    ``tools`` key. The memory becomes the message list (see
    :func:`openstarry.providers._memory.conversation`): each assistant turn's
    calls are followed by one result per call, paired by id, a failure sent as
    ``{"error": {"code", "message", "source"}}``. A system observation is sent
    as a ``system`` message (Chat: every OpenAI model and most compatible
    servers take one mid-conversation; pass ``observation_role="user"`` for a
    server whose chat template allows only a leading system message) or a
    ``developer`` message (Responses, which takes it anywhere in ``input``).
    The prompt is the memory's last user turn (the loop puts it there) and is
    not sent twice; an assistant turn with no text and no calls is left out of
    the Responses ``input`` (Chat keeps it, as ``""``, for chat templates that
    want user and assistant to alternate).

    ``provider.options`` pass through into the body as they are (``temperature``,
    ``top_p``, ``max_tokens``, ``tool_choice``, ``parallel_tool_calls``,
    ``seed``, ``reasoning_effort``, ...), except the keys openstarry sets itself
    (:attr:`OpenAIChatAPI.reserved_options`), which are refused with a
    :class:`~openstarry.errors.ManifestError`. For the Responses API,
    ``max_tokens`` is sent as its ``max_output_tokens``.

Downstream
    A response becomes a :class:`~openstarry.protocol.ProviderResponse`: Chat's
    text, then its tool calls in order; Responses' output items in their order.
    Arguments arrive as JSON text and are parsed; a call without an id gets a
    UUID. ``metadata`` holds ``id``, ``model``, ``finish_reason`` (Chat) or
    ``status`` and ``incomplete_reason`` (Responses), and ``usage`` as
    ``{"input_tokens", "output_tokens", "total_tokens", "raw"}``; each only
    when the API sent it. An answer with nothing in it is one empty text
    segment, so the loop still ends the turn with a message.

    What cannot be used follows spec 000 section 7 by one rule. When the API's
    own structure is broken (not a JSON object, no ``choices``, a ``message``
    that is not an object, a stream that sent nothing), there is nothing to show
    and :class:`~openstarry.errors.AgentPainException` is raised. When the model's
    output is partly unusable, the rest is kept and each unusable part becomes a
    text segment that says what it was, starting ``[openstarry]``, and is listed
    in ``metadata["errors"]``: a tool call whose arguments are not a JSON object
    (the call is not made), a call or output item or content part of a type
    openstarry does not handle (the model's ``reasoning`` items are left out
    silently), an answer the API stopped at the token limit or its content
    filter, a stream cut off before the API said it was done (the text so far
    is kept, ``metadata["truncated"]`` is true, and no call of it is made).
    A refusal becomes the text ``The model refused to answer: <reason>`` with
    ``metadata["refused"]`` true. An error the API reports inside a 200
    response or a stream raises :class:`~openstarry.errors.ProviderError`. Only
    the first of several choices (``n``) is read.

Streaming
    :meth:`OpenAIChatAPI.stream` and :meth:`OpenAIResponsesAPI.stream` return
    assemblers that take the server-sent events one by one, return each piece of
    text as it arrives, and finish into the same ``ProviderResponse`` the whole
    response would have given. A Chat stream is complete once ``[DONE]`` or a
    ``finish_reason`` came; a Responses stream once ``response.completed`` (or
    ``response.incomplete``) came. A stream may bring at most
    :data:`MAX_STREAM_CHARS` characters and :data:`MAX_STREAM_TOOL_CALLS` calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, Literal

from openstarry.agent.memory import AssistantTurn, Observation, UserTurn
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.protocol import ContentSegment, ProviderResponse
from openstarry.providers._common import (
    NOTE_PREFIX,
    QUOTE_CHARS,
    Segments,
    clean,
    count,
    error_body,
    parse_arguments,
    quote,
    redact,
    reported_error,
)
from openstarry.providers._memory import (
    ToolExchange,
    arguments_json,
    conversation,
    outcome_text,
)

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext
    from openstarry.providers.wire import StreamAssembler, ToolNameMap

__all__ = [
    "MAX_STREAM_CHARS",
    "MAX_STREAM_TOOL_CALLS",
    "NOTE_PREFIX",
    "OpenAIChatAPI",
    "OpenAIResponsesAPI",
]

#: The most characters (text, refusal, tool names and arguments) one streamed
#: response may bring; more raises ``AgentPainException`` rather than fill memory.
MAX_STREAM_CHARS: Final = 8 * 1024 * 1024
#: The most tool calls (or output items) one streamed response may open.
MAX_STREAM_TOOL_CALLS: Final = 512

_OPENAI_BASE_URL = "https://api.openai.com/v1"
_OPENAI_KEY_ENV = "OPENAI_API_KEY"

ObservationRole = Literal["system", "developer", "user"]
_OBSERVATION_ROLES: tuple[ObservationRole, ...] = ("system", "developer", "user")


# --- shared: the parts of an answer, and turning them into a ProviderResponse ---------------------


@dataclass(slots=True)
class _Text:
    """Text of the answer: the model's (``text``), a refusal, or a note of openstarry's."""

    kind: Literal["text", "refusal", "note"]
    #: The text; for a note, what it says without :data:`NOTE_PREFIX`.
    text: str


@dataclass(slots=True)
class _Call:
    """A function call as the API sent it; ``arguments`` not parsed yet."""

    id: str | None
    name: str
    arguments: Any


_Part = _Text | _Call


def _observation_role(role: str) -> ObservationRole:
    for known in _OBSERVATION_ROLES:
        if role == known:
            return known
    raise ValueError(f"observation_role must be 'system', 'developer' or 'user', not {role!r}")


def _unhandled(what: str, kind: Any, outcome: str = "it was left out") -> _Text:
    shown = repr(kind)
    if len(shown) > QUOTE_CHARS:
        shown = shown[:QUOTE_CHARS] + "..."
    return _note(f"The {what} of type {shown}, which openstarry does not handle; {outcome}.")


def _note(message: str) -> _Text:
    return _Text("note", message)


def _response(
    parts: list[_Part], names: ToolNameMap, metadata: dict[str, Any], *, truncated: bool = False
) -> ProviderResponse:
    """The ``ProviderResponse`` of an answer's parts, in order (see the module's docstring)."""
    segments = Segments()
    for part in parts:
        if isinstance(part, _Call):
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


def _stop_notes(reason: str | None) -> list[_Part]:
    """What the API's reason for stopping says about the answer, when it is not whole."""
    if reason in ("length", "max_output_tokens"):
        return [
            _note(
                f"The answer stopped at the model's output token limit ({reason}); "
                "it may be incomplete."
            )
        ]
    if reason == "content_filter":
        return [_note("The API's content filter withheld the answer, or part of it.")]
    return []


def _usage(raw: Any, input_key: str, output_key: str) -> dict[str, Any] | None:
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


def _metadata(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _object(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise AgentPainException(f"{what} is {type(body).__name__}, not a JSON object")
    return body


def _event_json(data: str, what: str) -> Mapping[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise AgentPainException(f"{what}: an event that is not JSON: {quote(data)}") from None
    return _object(value, f"{what}: an event")


def _merge_options(
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


def _tool_descriptions(context: AgentContext) -> list[dict[str, Any]]:
    return [tool.describe() for tool in context.tools.values()]


# --- error bodies -----------------------------------------------------------------------------


def _error_message(status: int, body: Any) -> str:
    """``HTTP 401: <message> (type ..., code ...)``, from any of the error shapes servers use."""
    body = error_body(body)
    message: str | None = None
    details: list[str] = []
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            # An error event is its own error object; its type says only "error".
            own = error is body
            message = _string(error.get("message")) or _string(error.get("detail"))
            for key in ("type", "code", "param"):
                value = error.get(key)
                if own and key == "type" and value == "error":
                    continue
                if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                    details.append(f"{key} {value}")
        elif isinstance(error, str):
            message = error
        if message is None:
            message = _string(body.get("detail")) or _string(body.get("message"))
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


def _api_error(body: Mapping[str, Any], what: str) -> None:
    """Raise ``ProviderError`` for an error the API put in a 200 response or a stream."""
    error = body.get("error")
    if error:
        message = f"{what} reported an error: {_error_message(200, body)}"
        raise reported_error(message, error)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# --- Chat Completions ----------------------------------------------------------------------------

_CHAT = "the Chat Completions response"

_CHAT_RESERVED: Mapping[str, str] = {
    "model": "the model is provider.model",
    "messages": "openstarry builds them from the instructions and the session's memory",
    "tools": "openstarry sends the agent's tools",
    "functions": "openstarry sends the agent's tools",
    "stream": "openstarry chooses whether to stream",
    "stream_options": "openstarry sets them when it streams",
}


class OpenAIChatAPI:
    """OpenAI Chat Completions (``POST {baseUrl}/chat/completions``), provider name ``openai``.

    Also the API of Ollama, vLLM, llama.cpp's server and other OpenAI-compatible
    servers: point ``provider.baseUrl`` at them.

    Args:
        observation_role: The role of the message a system observation is sent
            as: ``"system"`` (the default; OpenAI's models take it anywhere),
            ``"developer"`` (OpenAI's newer name for it), or ``"user"`` for a
            server whose chat template refuses a system message after the first.
    """

    name = "openai"
    default_base_url = _OPENAI_BASE_URL
    default_api_key_env = _OPENAI_KEY_ENV
    #: The body keys ``provider.options`` may not set, with the reason each is refused.
    reserved_options: Mapping[str, str] = _CHAT_RESERVED

    def __init__(self, *, observation_role: ObservationRole = "system") -> None:
        self.observation_role = _observation_role(observation_role)

    def path(self, model: str, *, stream: bool) -> str:
        """``/chat/completions``, streamed or not."""
        return "/chat/completions"

    def headers(self, api_key: str | None) -> dict[str, str]:
        """``Authorization: Bearer <key>``; nothing without a key (a local server)."""
        return _headers(api_key)

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
        """The ``/chat/completions`` body (see the module's docstring).

        Raises:
            ManifestError: an option openstarry sets itself (:attr:`reserved_options`).
        """
        messages: list[dict[str, Any]] = []
        if context.instructions:
            messages.append({"role": "system", "content": context.instructions})
        for step in conversation(context.memory, prompt):
            if isinstance(step, UserTurn):
                messages.append({"role": "user", "content": step.text})
            elif isinstance(step, AssistantTurn):
                messages.append({"role": "assistant", "content": step.text})
            elif isinstance(step, ToolExchange):
                messages.append(
                    {
                        "role": "assistant",
                        "content": step.text or None,
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {
                                    "name": names.wire(call.name),
                                    "arguments": arguments_json(call),
                                },
                            }
                            for call in step.calls
                        ],
                    }
                )
                messages.extend(
                    {
                        "role": "tool",
                        "tool_call_id": outcome.tool_call_id,
                        "content": outcome_text(outcome),
                    }
                    for outcome in step.outcomes
                )
            else:
                messages.append({"role": self.observation_role, "content": step.text})
        body: dict[str, Any] = {"model": model, "messages": messages}
        tools = _tool_descriptions(context)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": names.wire(tool["name"]),
                        "description": tool["description"],
                        "parameters": tool["parameters"],
                    },
                }
                for tool in tools
            ]
        _merge_options(body, options, self.reserved_options)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        """A ``chat.completion`` object as a ``ProviderResponse``; only the first choice counts.

        Raises:
            AgentPainException: the body is not a chat completion (no choices, no message).
            ProviderError: the body is an error.
        """
        body = _object(body, _CHAT)
        _api_error(body, _CHAT)
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise AgentPainException(f"{_CHAT} has no choices")
        choice = _object(choices[0], f"{_CHAT}: choices[0]")
        message = _object(choice.get("message"), f"{_CHAT}: choices[0].message")
        parts: list[_Part] = []
        content = message.get("content")
        if isinstance(content, list):
            parts.extend(_chat_content_part(part) for part in content)
        elif isinstance(content, str):
            parts.append(_Text("text", content))
        elif content is not None:
            raise AgentPainException(
                f"{_CHAT}: choices[0].message.content is {type(content).__name__}, not text"
            )
        refusal = message.get("refusal")
        if isinstance(refusal, str):
            parts.append(_Text("refusal", refusal))
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise AgentPainException(
                f"{_CHAT}: choices[0].message.tool_calls is {type(tool_calls).__name__}, not a list"
            )
        parts.extend(_chat_call(call) for call in tool_calls or ())
        legacy = message.get("function_call")
        if not tool_calls and isinstance(legacy, Mapping):
            parts.append(_chat_call({"type": "function", "function": legacy}))
        finish_reason = _string(choice.get("finish_reason"))
        parts.extend(_stop_notes(finish_reason))
        metadata = _metadata(
            id=_string(body.get("id")),
            model=_string(body.get("model")),
            finish_reason=finish_reason,
            usage=_usage(body.get("usage"), "prompt_tokens", "completion_tokens"),
        )
        return _response(parts, names, metadata)

    def stream(self, names: ToolNameMap) -> StreamAssembler:
        """An assembler for ``chat.completion.chunk`` events, ended by ``[DONE]``."""
        return _ChatStream(names)

    def error_message(self, status: int, body: Any) -> str:
        """``HTTP <status>: <error.message> (type ..., code ..., param ...)``, keys redacted."""
        return _error_message(status, body)


def _chat_content_part(part: Any) -> _Part:
    """A part of a ``content`` list, as some compatible servers send content."""
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return _Text("text", part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return _Text("refusal", part["refusal"])
    else:
        kind = type(part).__name__
    return _unhandled("answer held a content part", kind)


def _chat_call(call: Any) -> _Part:
    if not isinstance(call, Mapping):
        return _note(f"The answer held a tool call that is not an object: {quote(call)}.")
    kind = call.get("type") or "function"  # some compatible servers send null
    if kind != "function":
        return _unhandled("model made a call", kind, "it was not made")
    function = call.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        return _note(
            f"The model made a tool call without a tool name: {quote(call)}; it was not made."
        )
    assert isinstance(function, Mapping)
    return _Call(_string(call.get("id")), name, function.get("arguments"))


@dataclass(slots=True)
class _StreamedCall:
    """A tool call being assembled from ``delta.tool_calls`` pieces."""

    id: str | None = None
    kind: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    whole_arguments: Any = None

    def _arguments(self) -> Any:
        return self.whole_arguments if self.whole_arguments is not None else "".join(self.arguments)

    def complete(self) -> bool:
        """Whether the call has its name and arguments that parse: nothing more can join it."""
        if not self.name or (self.whole_arguments is None and not self.arguments):
            return False
        try:
            parse_arguments(self._arguments())
        except ValueError:
            return False
        return True

    def part(self) -> _Part:
        arguments = self._arguments()
        return _chat_call(
            {
                "id": self.id,
                "type": self.kind,
                "function": {"name": self.name, "arguments": arguments},
            }
        )


class _ChatStream:
    """Assembles ``chat.completion.chunk`` events (the first choice) into one response.

    Complete once ``[DONE]`` or a ``finish_reason`` arrived: the answer is whole
    then, only the usage chunk may be missing. Without either, :meth:`finish`
    keeps the text so far and makes none of the calls (see the module's docstring).
    """

    def __init__(self, names: ToolNameMap) -> None:
        self._names = names
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, _StreamedCall] = {}
        self._last_index: int | None = None
        #: A tool call index the server gave to a second call: where its pieces go now.
        self._reused: dict[int, int] = {}
        self._id: str | None = None
        self._model: str | None = None
        self._finish_reason: str | None = None
        self._usage: Any = None
        self._done_marker = False
        self._received = False
        self._chars = 0

    @property
    def done(self) -> bool:
        return self._done_marker or self._finish_reason is not None

    def feed(self, event: str | None, data: str) -> str | None:
        data = data.strip()
        if not data:
            return None
        if data == "[DONE]":
            self._done_marker = True
            return None
        chunk = _event_json(data, "the Chat Completions stream")
        _api_error(chunk, "the Chat Completions stream")
        self._received = True
        self._id = self._id or _string(chunk.get("id"))
        self._model = self._model or _string(chunk.get("model"))
        if isinstance(chunk.get("usage"), Mapping):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return None
        said: list[str] = []
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue  # only the first choice counts, as in parse_response
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                content = delta.get("content")
                if isinstance(content, str) and content:
                    self._grow(content)
                    self._text.append(content)
                    said.append(content)
                refusal = delta.get("refusal")
                if isinstance(refusal, str) and refusal:
                    self._grow(refusal)
                    self._refusal.append(refusal)
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    for piece in calls:
                        self._add_call_piece(piece)
                legacy = delta.get("function_call")
                if isinstance(legacy, Mapping):
                    self._add_call_piece({"index": 0, "type": "function", "function": legacy})
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish_reason = reason
        return "".join(said) or None

    def _grow(self, piece: str) -> None:
        self._chars += len(piece)
        if self._chars > MAX_STREAM_CHARS:
            raise AgentPainException(
                f"the streamed response is longer than {MAX_STREAM_CHARS} characters"
            )

    def _add_call_piece(self, piece: Any) -> None:
        if not isinstance(piece, Mapping):
            raise AgentPainException(
                f"{_CHAT}: a tool call delta that is not an object: {quote(piece)}"
            )
        index = piece.get("index")
        piece_id = _string(piece.get("id"))
        if not isinstance(index, int) or isinstance(index, bool):
            # Servers that leave the index out: a new id starts a call, else the last goes on.
            last = self._last_index
            if last is not None and (piece_id is None or piece_id == self._calls[last].id):
                index = last
            else:
                index = max(self._calls, default=-1) + 1
        else:
            index = self._reused.get(index, index)
            held = self._calls.get(index)
            if (
                held is not None
                and piece_id is not None
                and held.id not in (None, piece_id)
                and held.complete()
            ):
                # Servers that give every parallel call index 0 (Ollama, some vLLM
                # parsers): a new id at the index of a finished call starts a call;
                # later pieces of that index without an id go on with it.
                wire_index = piece["index"]
                index = self._reused[wire_index] = max(self._calls) + 1
        call = self._calls.get(index)
        if call is None:
            if len(self._calls) >= MAX_STREAM_TOOL_CALLS:
                raise AgentPainException(
                    f"the streamed response opened more than {MAX_STREAM_TOOL_CALLS} tool calls"
                )
            call = self._calls[index] = _StreamedCall()
        self._last_index = index
        if piece_id is not None and call.id is None:
            call.id = piece_id
        kind = piece.get("type")
        if isinstance(kind, str) and kind:
            call.kind = kind
        function = piece.get("function")
        if isinstance(function, Mapping):
            name = function.get("name")
            # OpenAI sends the name whole, once; a server that repeats it adds nothing.
            if isinstance(name, str) and name and name != call.name:
                self._grow(name)
                call.name += name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                self._grow(arguments)
                call.arguments.append(arguments)
            elif isinstance(arguments, Mapping):
                call.whole_arguments = arguments

    def finish(self) -> ProviderResponse:
        if not self._received:
            raise AgentPainException(
                "the Chat Completions stream ended before any part of the response arrived"
            )
        parts: list[_Part] = [_Text("text", "".join(self._text))]
        if self._refusal:
            parts.append(_Text("refusal", "".join(self._refusal)))
        parts.extend(self._calls[i].part() for i in sorted(self._calls))
        parts.extend(_stop_notes(self._finish_reason))
        metadata = _metadata(
            id=self._id,
            model=self._model,
            finish_reason=self._finish_reason,
            usage=_usage(self._usage, "prompt_tokens", "completion_tokens"),
        )
        return _response(parts, self._names, metadata, truncated=not self.done)


# --- Responses -----------------------------------------------------------------------------------

_RESPONSES = "the Responses API response"

_RESPONSES_RESERVED: Mapping[str, str] = {
    "model": "the model is provider.model",
    "input": "openstarry builds it from the session's memory",
    "instructions": "they are the manifest's instructions",
    "tools": "openstarry sends the agent's tools",
    "stream": "openstarry chooses whether to stream",
    "previous_response_id": "openstarry sends the whole conversation on every request",
    "conversation": "openstarry sends the whole conversation on every request",
}

#: Output items that carry nothing for the agent to say or do (the model's reasoning).
_SILENT_ITEMS = frozenset({"reasoning"})


class OpenAIResponsesAPI:
    """OpenAI Responses (``POST {baseUrl}/responses``), provider name ``openai-responses``.

    Args:
        observation_role: The role of the message a system observation is sent
            as: ``"developer"`` (the default), ``"system"`` or ``"user"``.
    """

    name = "openai-responses"
    default_base_url = _OPENAI_BASE_URL
    default_api_key_env = _OPENAI_KEY_ENV
    #: The body keys ``provider.options`` may not set, with the reason each is refused.
    reserved_options: Mapping[str, str] = _RESPONSES_RESERVED

    def __init__(self, *, observation_role: ObservationRole = "developer") -> None:
        self.observation_role = _observation_role(observation_role)

    def path(self, model: str, *, stream: bool) -> str:
        """``/responses``, streamed or not."""
        return "/responses"

    def headers(self, api_key: str | None) -> dict[str, str]:
        """``Authorization: Bearer <key>``; nothing without a key."""
        return _headers(api_key)

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
        """The ``/responses`` body (see the module's docstring).

        Raises:
            ManifestError: an option openstarry sets itself (:attr:`reserved_options`),
                or both ``max_tokens`` and ``max_output_tokens``.
        """
        items: list[dict[str, Any]] = []
        for step in conversation(context.memory, prompt):
            if isinstance(step, UserTurn):
                items.append(_message("user", step.text))
            elif isinstance(step, AssistantTurn):
                if step.text:  # an empty message item says nothing
                    items.append(_message("assistant", step.text))
            elif isinstance(step, ToolExchange):
                if step.text:
                    items.append(_message("assistant", step.text))
                items.extend(
                    {
                        "type": "function_call",
                        "call_id": call.id,
                        "name": names.wire(call.name),
                        "arguments": arguments_json(call),
                    }
                    for call in step.calls
                )
                items.extend(
                    {
                        "type": "function_call_output",
                        "call_id": outcome.tool_call_id,
                        "output": outcome_text(outcome),
                    }
                    for outcome in step.outcomes
                )
            else:
                assert isinstance(step, Observation)
                items.append(_message(self.observation_role, step.text))
        body: dict[str, Any] = {"model": model}
        if context.instructions:
            body["instructions"] = context.instructions
        body["input"] = items
        tools = _tool_descriptions(context)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": names.wire(tool["name"]),
                    "description": tool["description"],
                    "parameters": tool["parameters"],
                    "strict": False,
                }
                for tool in tools
            ]
        if "max_tokens" in options:
            if "max_output_tokens" in options:
                raise ManifestError(
                    "provider.options has both max_tokens and max_output_tokens; "
                    "the Responses API takes max_output_tokens",
                    field="provider.options.max_tokens",
                )
            options = {
                ("max_output_tokens" if key == "max_tokens" else key): value
                for key, value in options.items()
            }
        _merge_options(body, options, self.reserved_options)
        if stream:
            body["stream"] = True
        return body

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        """A ``response`` object as a ``ProviderResponse``, its output items in order.

        Raises:
            AgentPainException: the body is not a response, or not a finished one.
            ProviderError: the response failed, or the body is an error.
        """
        body = _object(body, _RESPONSES)
        status = _string(body.get("status"))
        if status == "failed" or body.get("error"):
            raise ProviderError(_failed(body))
        if status in ("queued", "in_progress"):
            raise AgentPainException(f"{_RESPONSES} is not finished (status {status})")
        output = body.get("output")
        if not isinstance(output, list):
            raise AgentPainException(f"{_RESPONSES} has no output list")
        parts: list[_Part] = []
        for item in output:
            parts.extend(_output_item(item))
        metadata = _responses_metadata(body)
        parts.extend(_stop_notes(metadata.get("incomplete_reason")))
        return _response(parts, names, metadata)

    def stream(self, names: ToolNameMap) -> StreamAssembler:
        """An assembler for the ``response.*`` events, ended by ``response.completed``."""
        return _ResponsesStream(self, names)

    def error_message(self, status: int, body: Any) -> str:
        """``HTTP <status>: <error.message> (type ..., code ..., param ...)``, keys redacted."""
        return _error_message(status, body)


def _message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def _failed(response: Mapping[str, Any]) -> str:
    error = response.get("error")
    if isinstance(error, Mapping):
        return f"{_RESPONSES} failed: {_error_message(200, {'error': error})}"
    return f"{_RESPONSES} failed without saying why"


def _responses_metadata(response: Mapping[str, Any]) -> dict[str, Any]:
    details = response.get("incomplete_details")
    return _metadata(
        id=_string(response.get("id")),
        model=_string(response.get("model")),
        status=_string(response.get("status")),
        incomplete_reason=_string(details.get("reason")) if isinstance(details, Mapping) else None,
        usage=_usage(response.get("usage"), "input_tokens", "output_tokens"),
    )


def _output_item(item: Any) -> list[_Part]:
    if not isinstance(item, Mapping):
        return [_note(f"The response held an output item that is not an object: {quote(item)}.")]
    kind = item.get("type")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            return [_Text("text", content)]
        if not isinstance(content, list):
            return []
        return [_message_part(part) for part in content]
    if kind == "function_call":
        name = item.get("name")
        if not isinstance(name, str) or not name:
            return [
                _note(
                    f"The model made a function call without a tool name: {quote(item)}; "
                    "it was not made."
                )
            ]
        call_id = _string(item.get("call_id")) or _string(item.get("id"))
        return [_Call(call_id, name, item.get("arguments"))]
    if isinstance(kind, str) and kind in _SILENT_ITEMS:
        return []
    return [_unhandled("response held an output item", kind)]


def _message_part(part: Any) -> _Part:
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind == "output_text" and isinstance(part.get("text"), str):
            return _Text("text", part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return _Text("refusal", part["refusal"])
    else:
        kind = type(part).__name__
    return _unhandled("answer held a content part", kind)


class _ResponsesStream:
    """Assembles the Responses API's typed events into one response.

    ``response.completed`` (or ``response.incomplete``) carries the whole
    response, which is read as :meth:`OpenAIResponsesAPI.parse_response` reads
    it; the items assembled from the other events stand in when that response
    lists no output, and are what a cut-off stream keeps.
    """

    def __init__(self, api: OpenAIResponsesAPI, names: ToolNameMap) -> None:
        self._api = api
        self._names = names
        self._items: dict[int, dict[str, Any]] = {}
        self._final: Mapping[str, Any] | None = None
        self._started: Mapping[str, Any] = {}
        self._received = False
        self._chars = 0

    @property
    def done(self) -> bool:
        return self._final is not None

    def feed(self, event: str | None, data: str) -> str | None:
        data = data.strip()
        if not data or data == "[DONE]":
            return None
        payload = _event_json(data, "the Responses API stream")
        kind = payload.get("type") or event
        self._received = True
        if kind == "error":
            raise reported_error(
                f"the Responses API stream reported an error: {_error_message(200, payload)}",
                payload,
            )
        response = payload.get("response")
        if kind == "response.failed":
            failed = response if isinstance(response, Mapping) else {}
            raise reported_error(_failed(failed), failed.get("error"))
        if kind in ("response.completed", "response.incomplete"):
            self._final = _object(response, f"the Responses API stream: {kind}.response")
            return None
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if isinstance(response, Mapping):
                self._started = response
            return None
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = payload.get("item")
            if isinstance(item, Mapping):
                slot = self._item(payload, str(item.get("type", "")))
                slot.clear()
                slot.update(_copy_item(item))
            return None
        if kind == "response.content_part.added":
            part = payload.get("part")
            if isinstance(part, Mapping):
                self._part(payload, str(part.get("type", ""))).update(part)
            return None
        delta = payload.get("delta")
        if kind == "response.output_text.delta" and isinstance(delta, str):
            self._grow(delta)
            part = self._part(payload, "output_text")
            _grow_field(part, "text", delta)
            return delta or None
        if kind == "response.output_text.done" and isinstance(payload.get("text"), str):
            self._part(payload, "output_text")["text"] = payload["text"]
        elif kind == "response.refusal.delta" and isinstance(delta, str):
            self._grow(delta)
            part = self._part(payload, "refusal")
            _grow_field(part, "refusal", delta)
        elif kind == "response.refusal.done" and isinstance(payload.get("refusal"), str):
            self._part(payload, "refusal")["refusal"] = payload["refusal"]
        elif kind == "response.function_call_arguments.delta" and isinstance(delta, str):
            self._grow(delta)
            item = self._item(payload, "function_call")
            _grow_field(item, "arguments", delta)
        elif kind == "response.function_call_arguments.done" and isinstance(
            payload.get("arguments"), str
        ):
            self._item(payload, "function_call")["arguments"] = payload["arguments"]
        return None

    def _grow(self, piece: str) -> None:
        self._chars += len(piece)
        if self._chars > MAX_STREAM_CHARS:
            raise AgentPainException(
                f"the streamed response is longer than {MAX_STREAM_CHARS} characters"
            )

    def _item(self, payload: Mapping[str, Any], kind: str) -> dict[str, Any]:
        """The item an event is about: by ``output_index``, else by ``item_id``, else a new one."""
        index = payload.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool):
            item_id = payload.get("item_id")
            found = [i for i, item in self._items.items() if item_id and item.get("id") == item_id]
            index = found[0] if found else max(self._items, default=-1) + 1
        item = self._items.get(index)
        if item is None:
            if len(self._items) >= MAX_STREAM_TOOL_CALLS:
                raise AgentPainException(
                    f"the streamed response opened more than {MAX_STREAM_TOOL_CALLS} output items"
                )
            item = self._items[index] = {
                "type": "function_call" if kind == "function_call" else "message"
            }
        return item

    def _part(self, payload: Mapping[str, Any], kind: str) -> dict[str, Any]:
        """The content part of a message item an event is about, by ``content_index``."""
        item = self._item(payload, kind)
        content = item.get("content")
        if not isinstance(content, list):
            content = item["content"] = []
        index = payload.get("content_index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            index = max(len(content) - 1, 0)
        if index >= MAX_STREAM_TOOL_CALLS:
            raise AgentPainException(
                f"the streamed response has more than {MAX_STREAM_TOOL_CALLS} content parts"
            )
        while len(content) <= index:
            content.append({"type": kind})
        part = content[index]
        if not isinstance(part, dict):
            part = content[index] = {"type": kind}
        return part

    def _assembled(self) -> list[dict[str, Any]]:
        items = [self._items[i] for i in sorted(self._items)]
        for item in items:
            _join_field(item, "arguments")
            content = item.get("content")
            for part in content if isinstance(content, list) else ():
                if isinstance(part, dict):
                    _join_field(part, "text")
                    _join_field(part, "refusal")
        return items

    def finish(self) -> ProviderResponse:
        if self._final is not None:
            output = self._final.get("output")
            if isinstance(output, list) and output:
                return self._api.parse_response(self._final, self._names)
            return self._api.parse_response(
                {**self._final, "output": self._assembled()}, self._names
            )
        if not self._received:
            raise AgentPainException(
                "the Responses API stream ended before any part of the response arrived"
            )
        parts: list[_Part] = []
        for item in self._assembled():
            parts.extend(_output_item(item))
        metadata = _responses_metadata(self._started)
        return _response(parts, self._names, metadata, truncated=True)


class _Pieces(list[str]):
    """A streamed text field in the pieces it came in, joined when the item is read.

    Adding each delta to a string would copy the text so far each time: a long
    answer in many small deltas would take quadratic time.
    """


def _grow_field(holder: dict[str, Any], key: str, delta: str) -> None:
    """Add ``delta`` to the text field ``holder[key]``."""
    value = holder.get(key)
    if isinstance(value, _Pieces):
        value.append(delta)
    else:
        holder[key] = _Pieces((value if isinstance(value, str) else "", delta))


def _join_field(holder: dict[str, Any], key: str) -> None:
    value = holder.get(key)
    if isinstance(value, _Pieces):
        holder[key] = "".join(value)


def _copy_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an item whose content parts can grow without touching the event's."""
    copy = dict(item)
    content = copy.get("content")
    if isinstance(content, list):
        copy["content"] = [dict(p) if isinstance(p, Mapping) else p for p in content]
    return copy
