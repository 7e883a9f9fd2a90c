"""OpenAI Responses, both directions (spec 000 sections 2 to 4, 7).

:class:`OpenAIResponsesAPI` (provider name ``openai-responses``) speaks ``POST
/responses``. It is a :class:`~openstarry.providers.wire.WireAPI`: pure
translation, no I/O; :class:`openstarry.providers.http.HTTPProvider` sends what
it builds and hands it what comes back. What it shares with Chat Completions
(:mod:`openstarry.providers.openai_chat`) is in
:mod:`openstarry.providers._openai`.

Upstream
    ``context.instructions`` becomes ``instructions``. Each tool of
    ``context.tools`` becomes a ``function`` tool under its API-legal name
    (``fs.read`` is sent as ``fs_read``, see
    :class:`~openstarry.providers.wire.ToolNameMap`), with ``"strict": false``,
    as openstarry's tool schemas are plain JSON Schema, not the subset strict
    mode demands. No tools, no ``tools`` key. The memory becomes the ``input``
    items (see :func:`openstarry.providers._memory.conversation`): each
    assistant turn's ``function_call`` items are followed by one
    ``function_call_output`` per call, paired by id, a failure sent as
    ``{"error": {"code", "message", "source"}}``. A system observation is sent
    as a ``developer`` message, which the API takes anywhere in ``input``. The
    prompt is the memory's last user turn (the loop puts it there) and is not
    sent twice; an assistant turn with no text and no calls is left out.

    ``provider.options`` pass through into the body as they are, except the
    keys openstarry sets itself (:attr:`OpenAIResponsesAPI.reserved_options`),
    which are refused with a :class:`~openstarry.errors.ManifestError`;
    ``max_tokens`` is sent as ``max_output_tokens``.

Downstream
    A response becomes a :class:`~openstarry.protocol.ProviderResponse`: its
    output items in their order. Arguments arrive as JSON text and are parsed;
    a call without an id gets a UUID. ``metadata`` holds ``id``, ``model``,
    ``status``, ``incomplete_reason`` and ``usage`` as ``{"input_tokens",
    "output_tokens", "total_tokens", "raw"}``; each only when the API sent it.
    An answer with nothing in it is one empty text segment.

    A ``reasoning`` item becomes a ``reasoning`` segment: its summaries'
    text (empty when the request asked for none: ``provider.options``
    ``"reasoning": {"summary": "auto"}``), the item's id as ``signature`` and
    its ``encrypted_content`` as ``data`` (given when ``provider.options`` has
    ``"include": ["reasoning.encrypted_content"]``, as with ``"store":
    false``). The next request hands each assistant turn's reasoning items
    back before its message and calls, as the API wants for reasoning models
    calling tools; only items with an ``rs_`` id (this API's) are sent.

    What cannot be used follows spec 000 section 7 by one rule. When the API's
    own structure is broken (not a JSON object, no ``output`` list, a response
    not finished, a stream that sent nothing), there is nothing to show and
    :class:`~openstarry.errors.AgentPainException` is raised. When the model's
    output is partly unusable, the rest is kept and each unusable part becomes
    a text segment that says what it was, starting ``[openstarry]``, and is
    listed in ``metadata["errors"]``: a call whose arguments are not a JSON
    object (the call is not made), an output item or content part of a type
    openstarry does not handle, an answer the API stopped at the token limit or its content
    filter, a stream cut off before the API said it was done (the text so far
    is kept, ``metadata["truncated"]`` is true, and no call of it is made). A
    refusal becomes the text ``The model refused to answer: <reason>`` with
    ``metadata["refused"]`` true. A failed response, or an error the API
    reports inside a 200 response or a stream, raises
    :class:`~openstarry.errors.ProviderError`.

Streaming
    :meth:`OpenAIResponsesAPI.stream` returns an assembler that takes the
    ``response.*`` events one by one, returns each piece of text as it
    arrives, and finishes into the same ``ProviderResponse`` the whole
    response would have given. The stream is complete once
    ``response.completed`` (or ``response.incomplete``) came. It may bring at
    most :data:`~openstarry.providers._openai.MAX_STREAM_CHARS` characters and
    :data:`~openstarry.providers._openai.MAX_STREAM_TOOL_CALLS` output items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from openstarry.agent.memory import AssistantTurn, Observation, UserTurn
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.protocol import ProviderResponse
from openstarry.providers._common import quote, reported_error
from openstarry.providers._memory import ToolExchange, arguments_json, conversation, outcome_text
from openstarry.providers._openai import (
    Call,
    ObservationRole,
    OpenAIWireAPI,
    Part,
    Reasoning,
    StreamBudget,
    Text,
    describe_error,
    event_json,
    json_object,
    merge_options,
    metadata_of,
    nonempty_str,
    note,
    provider_response,
    stop_notes,
    token_usage,
    tool_descriptions,
    unhandled,
)

if TYPE_CHECKING:
    from openstarry import core
    from openstarry.agent.interfaces import AgentContext
    from openstarry.providers.wire import StreamAssembler, ToolNameMap

__all__ = ["OpenAIResponsesAPI"]


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

#: How the Responses API's reasoning item ids begin: only those are handed back.
REASONING_ID_PREFIX: Final = "rs_"


class OpenAIResponsesAPI(OpenAIWireAPI):
    """OpenAI Responses (``POST {baseUrl}/responses``), provider name ``openai-responses``.

    Args:
        observation_role: The role of the message a system observation is sent
            as: ``"developer"`` (the default), ``"system"`` or ``"user"``.
    """

    name = "openai-responses"
    #: The body keys ``provider.options`` may not set, with the reason each is refused.
    reserved_options: Mapping[str, str] = _RESPONSES_RESERVED

    #: A request's generation parameters and the body fields they become (the
    #: Responses API has no stop, seed or penalties).
    generation_options: Mapping[str, str] = {
        "temperature": "temperature",
        "top_p": "top_p",
        "max_tokens": "max_output_tokens",
    }

    def __init__(self, *, observation_role: ObservationRole = "developer") -> None:
        super().__init__(observation_role=observation_role)

    def path(self, model: str, *, stream: bool) -> str:
        """``/responses``, streamed or not."""
        return "/responses"

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
                    items.extend(_reasoning_items(step.reasoning))
                    items.append(_message("assistant", step.text))
            elif isinstance(step, ToolExchange):
                items.extend(_reasoning_items(step.reasoning))
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
        tools = tool_descriptions(context)
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
        merge_options(body, options, self.reserved_options)
        if stream:
            body["stream"] = True
        return body

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        """A ``response`` object as a ``ProviderResponse``, its output items in order.

        Raises:
            AgentPainException: the body is not a response, or not a finished one.
            ProviderError: the response failed, or the body is an error.
        """
        body = json_object(body, _RESPONSES)
        status = nonempty_str(body.get("status"))
        if status == "failed" or body.get("error"):
            raise ProviderError(_failed(body))
        if status in ("queued", "in_progress"):
            raise AgentPainException(f"{_RESPONSES} is not finished (status {status})")
        output = body.get("output")
        if not isinstance(output, list):
            raise AgentPainException(f"{_RESPONSES} has no output list")
        parts: list[Part] = []
        for item in output:
            parts.extend(_output_item(item))
        metadata = _responses_metadata(body)
        parts.extend(stop_notes(metadata.get("incomplete_reason")))
        return provider_response(parts, names, metadata)

    def stream(self, names: ToolNameMap) -> StreamAssembler:
        """An assembler for the ``response.*`` events, ended by ``response.completed``."""
        return _ResponsesStream(self, names)


def _reasoning_items(segments: Sequence[core.ContentSegment]) -> list[dict[str, Any]]:
    """The reasoning items to hand back: those this API made (an ``rs_`` id), as it sent them."""
    items: list[dict[str, Any]] = []
    for segment in segments:
        item_id = segment.signature
        if not item_id or not item_id.startswith(REASONING_ID_PREFIX):
            continue
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": item_id,
            "summary": [{"type": "summary_text", "text": segment.text}] if segment.text else [],
        }
        if segment.data:
            item["encrypted_content"] = segment.data
        items.append(item)
    return items


def _reasoning_part(item: Mapping[str, Any]) -> Reasoning:
    summary = item.get("summary")
    texts = [
        part["text"]
        for part in (summary if isinstance(summary, list) else ())
        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
    ]
    return Reasoning(
        "\n\n".join(texts),
        signature=nonempty_str(item.get("id")),
        data=nonempty_str(item.get("encrypted_content")),
    )


def _message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def _failed(response: Mapping[str, Any]) -> str:
    error = response.get("error")
    if isinstance(error, Mapping):
        return f"{_RESPONSES} failed: {describe_error(200, {'error': error})}"
    return f"{_RESPONSES} failed without saying why"


def _responses_metadata(response: Mapping[str, Any]) -> dict[str, Any]:
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    return metadata_of(
        id=nonempty_str(response.get("id")),
        model=nonempty_str(response.get("model")),
        status=nonempty_str(response.get("status")),
        incomplete_reason=nonempty_str(reason),
        usage=token_usage(response.get("usage"), "input_tokens", "output_tokens"),
    )


def _output_item(item: Any) -> list[Part]:
    if not isinstance(item, Mapping):
        return [note(f"The response held an output item that is not an object: {quote(item)}.")]
    kind = item.get("type")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            return [Text("text", content)]
        if not isinstance(content, list):
            return []
        return [_message_part(part) for part in content]
    if kind == "function_call":
        name = item.get("name")
        if not isinstance(name, str) or not name:
            return [
                note(
                    f"The model made a function call without a tool name: {quote(item)}; "
                    "it was not made."
                )
            ]
        call_id = nonempty_str(item.get("call_id")) or nonempty_str(item.get("id"))
        return [Call(call_id, name, item.get("arguments"))]
    if kind == "reasoning":
        return [_reasoning_part(item)]
    return [unhandled("response held an output item", kind)]


def _message_part(part: Any) -> Part:
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind == "output_text" and isinstance(part.get("text"), str):
            return Text("text", part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return Text("refusal", part["refusal"])
    else:
        kind = type(part).__name__
    return unhandled("answer held a content part", kind)


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
        self._budget = StreamBudget()

    @property
    def done(self) -> bool:
        return self._final is not None

    def feed(self, event: str | None, data: str) -> str | None:
        data = data.strip()
        if not data or data == "[DONE]":
            return None
        payload = event_json(data, "the Responses API stream")
        kind = payload.get("type") or event
        self._received = True
        if kind == "error":
            raise reported_error(
                f"the Responses API stream reported an error: {describe_error(200, payload)}",
                payload,
            )
        response = payload.get("response")
        if kind == "response.failed":
            failed = response if isinstance(response, Mapping) else {}
            raise reported_error(_failed(failed), failed.get("error"))
        if kind in ("response.completed", "response.incomplete"):
            self._final = json_object(response, f"the Responses API stream: {kind}.response")
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
            self._budget.grow(delta)
            part = self._part(payload, "output_text")
            _grow_field(part, "text", delta)
            return delta or None
        if kind == "response.output_text.done" and isinstance(payload.get("text"), str):
            self._part(payload, "output_text")["text"] = payload["text"]
        elif kind == "response.refusal.delta" and isinstance(delta, str):
            self._budget.grow(delta)
            part = self._part(payload, "refusal")
            _grow_field(part, "refusal", delta)
        elif kind == "response.refusal.done" and isinstance(payload.get("refusal"), str):
            self._part(payload, "refusal")["refusal"] = payload["refusal"]
        elif kind == "response.function_call_arguments.delta" and isinstance(delta, str):
            self._budget.grow(delta)
            item = self._item(payload, "function_call")
            _grow_field(item, "arguments", delta)
        elif kind == "response.function_call_arguments.done" and isinstance(
            payload.get("arguments"), str
        ):
            self._item(payload, "function_call")["arguments"] = payload["arguments"]
        return None

    def _item(self, payload: Mapping[str, Any], kind: str) -> dict[str, Any]:
        """The item an event is about: by ``output_index``, else by ``item_id``, else a new one."""
        index = payload.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool):
            item_id = payload.get("item_id")
            found = [i for i, item in self._items.items() if item_id and item.get("id") == item_id]
            index = found[0] if found else max(self._items, default=-1) + 1
        item = self._items.get(index)
        if item is None:
            self._budget.open(len(self._items), "output items")
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
        self._budget.open(index, "content parts", verb="has")
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
        parts: list[Part] = []
        for item in self._assembled():
            parts.extend(_output_item(item))
        metadata = _responses_metadata(self._started)
        return provider_response(parts, self._names, metadata, truncated=True)


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
