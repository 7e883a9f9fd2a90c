"""OpenAI Chat Completions, both directions (spec 000 sections 2 to 4, 7).

:class:`OpenAIChatAPI` (provider name ``openai``) speaks ``POST /chat/completions``,
which OpenAI and most servers that call themselves OpenAI-compatible (Ollama,
vLLM, llama.cpp's server, through ``provider.baseUrl``) understand. It is a
:class:`~openstarry.providers.wire.WireAPI`: pure translation, no I/O;
:class:`openstarry.providers.http.HTTPProvider` sends what it builds and hands
it what comes back. What it shares with the Responses API
(:mod:`openstarry.providers.openai_responses`) is in
:mod:`openstarry.providers._openai`.

Upstream
    ``context.instructions`` becomes the leading ``system`` message. Each tool
    of ``context.tools`` becomes a ``function`` tool under its API-legal name
    (``fs.read`` is sent as ``fs_read``, see
    :class:`~openstarry.providers.wire.ToolNameMap`). No tools, no ``tools``
    key. The memory becomes the message list (see
    :func:`openstarry.providers._memory.conversation`): each assistant turn's
    calls are followed by one ``tool`` message per call, paired by id, a
    failure sent as ``{"error": {"code", "message", "source"}}``. A system
    observation is sent as a ``system`` message (every OpenAI model and most
    compatible servers take one mid-conversation; pass
    ``observation_role="user"`` for a server whose chat template allows only a
    leading system message). The prompt is the memory's last user turn (the
    loop puts it there) and is not sent twice; an assistant turn with no text
    and no calls is kept, as ``""``, for chat templates that want user and
    assistant to alternate.

    ``provider.options`` pass through into the body as they are
    (``temperature``, ``top_p``, ``max_tokens``, ``tool_choice``,
    ``parallel_tool_calls``, ``seed``, ``reasoning_effort``, ...), except the
    keys openstarry sets itself (:attr:`OpenAIChatAPI.reserved_options`), which
    are refused with a :class:`~openstarry.errors.ManifestError`.

Downstream
    A response becomes a :class:`~openstarry.protocol.ProviderResponse`: the
    text, then the tool calls in order (a legacy ``function_call`` when there
    are none). Arguments arrive as JSON text and are parsed; a call without an
    id gets a UUID. ``metadata`` holds ``id``, ``model``, ``finish_reason`` and
    ``usage`` as ``{"input_tokens", "output_tokens", "total_tokens", "raw"}``;
    each only when the API sent it. An answer with nothing in it is one empty
    text segment, so the loop still ends the turn with a message. Only the
    first of several choices (``n``) is read.

    What cannot be used follows spec 000 section 7 by one rule. When the API's
    own structure is broken (not a JSON object, no ``choices``, a ``message``
    that is not an object, a stream that sent nothing), there is nothing to show
    and :class:`~openstarry.errors.AgentPainException` is raised. When the model's
    output is partly unusable, the rest is kept and each unusable part becomes a
    text segment that says what it was, starting ``[openstarry]``, and is listed
    in ``metadata["errors"]``: a tool call whose arguments are not a JSON object
    (the call is not made), a call or content part of a type openstarry does
    not handle, an answer the API stopped at the token limit or its content
    filter, a stream cut off before the API said it was done (the text so far
    is kept, ``metadata["truncated"]`` is true, and no call of it is made).
    A refusal becomes the text ``The model refused to answer: <reason>`` with
    ``metadata["refused"]`` true. An error the API reports inside a 200
    response or a stream raises :class:`~openstarry.errors.ProviderError`.

Streaming
    :meth:`OpenAIChatAPI.stream` returns an assembler that takes the
    ``chat.completion.chunk`` events one by one, returns each piece of text as
    it arrives, and finishes into the same ``ProviderResponse`` the whole
    response would have given. The stream is complete once ``[DONE]`` or a
    ``finish_reason`` came. It may bring at most
    :data:`~openstarry.providers._openai.MAX_STREAM_CHARS` characters and
    :data:`~openstarry.providers._openai.MAX_STREAM_TOOL_CALLS` calls. Servers
    that leave out a call's index, or give every parallel call index 0, still
    get one call per id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from openstarry.agent.memory import AssistantTurn, UserTurn
from openstarry.errors import AgentPainException
from openstarry.protocol import ProviderResponse
from openstarry.providers._common import parse_arguments, quote
from openstarry.providers._memory import ToolExchange, arguments_json, conversation, outcome_text
from openstarry.providers._openai import (
    Call,
    ObservationRole,
    OpenAIWireAPI,
    Part,
    StreamBudget,
    Text,
    event_json,
    json_object,
    merge_options,
    metadata_of,
    nonempty_str,
    note,
    provider_response,
    raise_reported_error,
    stop_notes,
    token_usage,
    tool_descriptions,
    unhandled,
)

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext
    from openstarry.providers.wire import StreamAssembler, ToolNameMap

__all__ = ["OpenAIChatAPI"]


_CHAT = "the Chat Completions response"

_CHAT_RESERVED: Mapping[str, str] = {
    "model": "the model is provider.model",
    "messages": "openstarry builds them from the instructions and the session's memory",
    "tools": "openstarry sends the agent's tools",
    "functions": "openstarry sends the agent's tools",
    "stream": "openstarry chooses whether to stream",
    "stream_options": "openstarry sets them when it streams",
}


class OpenAIChatAPI(OpenAIWireAPI):
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
    #: The body keys ``provider.options`` may not set, with the reason each is refused.
    reserved_options: Mapping[str, str] = _CHAT_RESERVED

    #: A request's generation parameters and the body fields they become.
    generation_options: Mapping[str, str] = {
        "temperature": "temperature",
        "top_p": "top_p",
        "max_tokens": "max_completion_tokens",
        "stop": "stop",
        "seed": "seed",
        "frequency_penalty": "frequency_penalty",
        "presence_penalty": "presence_penalty",
    }

    def __init__(self, *, observation_role: ObservationRole = "system") -> None:
        super().__init__(observation_role=observation_role)

    def path(self, model: str, *, stream: bool) -> str:
        """``/chat/completions``, streamed or not."""
        return "/chat/completions"

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
        tools = tool_descriptions(context)
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
        merge_options(body, options, self.reserved_options)
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
        body = json_object(body, _CHAT)
        raise_reported_error(body, _CHAT)
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise AgentPainException(f"{_CHAT} has no choices")
        choice = json_object(choices[0], f"{_CHAT}: choices[0]")
        message = json_object(choice.get("message"), f"{_CHAT}: choices[0].message")
        parts: list[Part] = []
        content = message.get("content")
        if isinstance(content, list):
            parts.extend(_chat_content_part(part) for part in content)
        elif isinstance(content, str):
            parts.append(Text("text", content))
        elif content is not None:
            raise AgentPainException(
                f"{_CHAT}: choices[0].message.content is {type(content).__name__}, not text"
            )
        refusal = message.get("refusal")
        if isinstance(refusal, str):
            parts.append(Text("refusal", refusal))
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise AgentPainException(
                f"{_CHAT}: choices[0].message.tool_calls is {type(tool_calls).__name__}, not a list"
            )
        parts.extend(_chat_call(call) for call in tool_calls or ())
        legacy = message.get("function_call")
        if not tool_calls and isinstance(legacy, Mapping):
            parts.append(_chat_call({"type": "function", "function": legacy}))
        finish_reason = nonempty_str(choice.get("finish_reason"))
        parts.extend(stop_notes(finish_reason))
        metadata = metadata_of(
            id=nonempty_str(body.get("id")),
            model=nonempty_str(body.get("model")),
            finish_reason=finish_reason,
            usage=token_usage(body.get("usage"), "prompt_tokens", "completion_tokens"),
        )
        return provider_response(parts, names, metadata)

    def stream(self, names: ToolNameMap) -> StreamAssembler:
        """An assembler for ``chat.completion.chunk`` events, ended by ``[DONE]``."""
        return _ChatStream(names)


def _chat_content_part(part: Any) -> Part:
    """A part of a ``content`` list, as some compatible servers send content."""
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return Text("text", part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return Text("refusal", part["refusal"])
    else:
        kind = type(part).__name__
    return unhandled("answer held a content part", kind)


def _chat_call(call: Any) -> Part:
    if not isinstance(call, Mapping):
        return note(f"The answer held a tool call that is not an object: {quote(call)}.")
    kind = call.get("type") or "function"  # some compatible servers send null
    if kind != "function":
        return unhandled("model made a call", kind, "it was not made")
    function = call.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        return note(
            f"The model made a tool call without a tool name: {quote(call)}; it was not made."
        )
    assert isinstance(function, Mapping)
    return Call(nonempty_str(call.get("id")), name, function.get("arguments"))


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

    def part(self) -> Part:
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
        self._budget = StreamBudget()

    #: The Rust core's fast path for this stream (:class:`~openstarry.providers.http.SSEDecoder`):
    #: a run of chunks that carry text alone arrives joined, through :meth:`text`.
    text_dialect = "openai-chat"

    @property
    def done(self) -> bool:
        return self._done_marker or self._finish_reason is not None

    def text(self, content: str) -> str:
        """The joined text of chunks that carry nothing else, read by the Rust core; these
        come only after a chunk read in full (:meth:`feed`) named the answer's id and model."""
        self._budget.grow(content)
        self._text.append(content)
        self._received = True
        return content

    def feed(self, event: str | None, data: str) -> str | None:
        data = data.strip()
        if not data:
            return None
        if data == "[DONE]":
            self._done_marker = True
            return None
        chunk = event_json(data, "the Chat Completions stream")
        raise_reported_error(chunk, "the Chat Completions stream")
        self._received = True
        self._id = self._id or nonempty_str(chunk.get("id"))
        self._model = self._model or nonempty_str(chunk.get("model"))
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
                    self._budget.grow(content)
                    self._text.append(content)
                    said.append(content)
                refusal = delta.get("refusal")
                if isinstance(refusal, str) and refusal:
                    self._budget.grow(refusal)
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

    def _add_call_piece(self, piece: Any) -> None:
        if not isinstance(piece, Mapping):
            raise AgentPainException(
                f"{_CHAT}: a tool call delta that is not an object: {quote(piece)}"
            )
        index = piece.get("index")
        piece_id = nonempty_str(piece.get("id"))
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
            self._budget.open(len(self._calls), "tool calls")
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
                self._budget.grow(name)
                call.name += name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                self._budget.grow(arguments)
                call.arguments.append(arguments)
            elif isinstance(arguments, Mapping):
                call.whole_arguments = arguments

    def finish(self) -> ProviderResponse:
        if not self._received:
            raise AgentPainException(
                "the Chat Completions stream ended before any part of the response arrived"
            )
        parts: list[Part] = [Text("text", "".join(self._text))]
        if self._refusal:
            parts.append(Text("refusal", "".join(self._refusal)))
        parts.extend(self._calls[i].part() for i in sorted(self._calls))
        parts.extend(stop_notes(self._finish_reason))
        metadata = metadata_of(
            id=self._id,
            model=self._model,
            finish_reason=self._finish_reason,
            usage=token_usage(self._usage, "prompt_tokens", "completion_tokens"),
        )
        return provider_response(parts, self._names, metadata, truncated=not self.done)
