"""From one run's spec 002 bus events to spec 003's response, message and content events.

    translator = RunTranslator(ResponseBuilder(session_id="s"))
    translator.start()                        # response created, in_progress
    translator.translate(event)               # each bus event of the run, in order
    final = translator.end(result)            # the terminal response event
    events = list(translator.out)             # numbered, in the order they happened

:class:`~openstarry.api.adapter.RunStream` follows a run on the bus and feeds
its events here; this module knows nothing of the bus or the loop. Rules the
translation keeps:

- the response ``created``, then ``in_progress``;
- the agent's text: a message (role ``assistant``, type ``message``) whose text
  content streams as deltas, from the ``OUTPUT:AGENT_MESSAGE_DELTA`` events of a
  streaming provider or, without them, the whole text as one delta; then the
  completed content (its text is the ``OUTPUT:AGENT_MESSAGE``'s, the record)
  and the completed message. Deltas of a new provider round (their ``round``)
  start a new message. Image, audio and UI segments follow the text as more
  content items of the same message;
- each ``EXEC:TOOL_CALL``: a ``function_call`` message (role ``assistant``)
  whose data content is ``{"call_id", "name", "arguments"}`` with the
  arguments as JSON text, as AgentScope Runtime sends them;
- each ``EXEC:TOOL_RESULT``: a ``function_call_output`` message (role ``tool``)
  whose data content is ``{"call_id", "name", "output"}``, the output being the
  result as JSON text (``{"error": {"code", "message", "source"}}`` for a
  failed call);
- a call to a remote MCP server's tool (its ``EXEC:TOOL_CALL`` names a
  ``serverLabel``) is an ``mcp_call`` message instead, whose data also holds
  ``server_label``; before the first ``mcp_call`` of each server in the
  response, an ``mcp_list_tools`` message (role ``assistant``) whose data
  content is ``{"server_label", "tools": [{"name", "description",
  "input_schema"}]}``: the server's tools as the agent has them then, by
  their names on the server (given by the translator's ``server_tools``);
- each ``EXEC:APPROVAL_REQUEST``: an ``mcp_approval_request`` message (role
  ``assistant``) whose data content is ``{"id", "call_id", "name",
  "arguments", "server_label"?}``; the client answers it with an
  ``mcp_approval_response`` naming that ``id``;
- each ``KERNEL:ERROR``: an ``error`` message with ``code`` and ``message``;
- the provider's reasoning (segments of type ``reasoning``): a ``reasoning``
  message (role ``assistant``) whose text content is the reasoning or its
  summary, one per segment, before the round's text message; when the text
  streamed, right after it. Signatures and encrypted reasoning are not sent;
- ``EXEC:AWAITING`` (the run waits for its client): the response ends
  ``incomplete``, its ``metadata.waiting_for`` naming the call ids whose
  ``function_call_output`` and the approval ids whose ``mcp_approval_response``
  the client's next request on the session must carry
  (:meth:`RunTranslator.waiting`);
- a request refused before any run (a slash command of a tool that needs
  approval): the response ``created``, then ``rejected`` with its ``error``
  (:meth:`RunTranslator.rejected`);
- generation parameters the provider dropped (its responses'
  ``metadata.droppedParameters``) are named in the response's
  ``metadata.dropped_parameters``;
- a tool call, a tool result, an error or the end closes the message whose text
  was streaming, with what it said so far (``failed`` on an error, ``canceled``
  when the run was stopped);
- the end: the response ``completed`` (with its ``output`` and ``usage``: the
  loop's count when it has one, which includes responses that only called
  tools, else the sum of the ``metadata.usage`` of the run's messages);
  ``failed`` with ``error`` when the run ended on an error; ``canceled`` when it
  was stopped or its result is unknown.

Events whose payload is not a JSON object are skipped.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from openstarry.agent.loop import add_usage
from openstarry.api.models import (
    AgentResponse,
    AudioContent,
    Content,
    ContentType,
    DataContent,
    Error,
    FileContent,
    FunctionCall,
    FunctionCallOutput,
    ImageContent,
    Message,
    MessageType,
    Role,
    RunStatus,
)
from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA, EventType

if TYPE_CHECKING:
    from openstarry.agent.loop import RunResult
    from openstarry.api.builders import ContentBuilder, MessageBuilder, ResponseBuilder
    from openstarry.core import Event

__all__ = ["RunTranslator", "WireEvent", "run_status"]

_TOOL_CALL = EventType.TOOL_CALL.value
_TOOL_RESULT = EventType.TOOL_RESULT.value
_ERROR = EventType.ERROR.value
_APPROVAL_REQUEST = "EXEC:APPROVAL_REQUEST"

WireEvent = AgentResponse | Message | Content


def run_status(result: RunResult) -> RunStatus:
    """The response status a finished run ends with: canceled, failed or completed."""
    if result.stopped:
        return RunStatus.Canceled
    if result.error is not None:
        return RunStatus.Failed
    return RunStatus.Completed


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(str(value), ensure_ascii=False)


def _segment_content(segment: Mapping[str, Any]) -> Content | None:
    """The content item of a non-text segment of an ``OUTPUT:AGENT_MESSAGE``."""
    kind = segment.get("type")
    data = segment.get("data")
    mime = segment.get("mimeType")
    if kind in ("text", "reasoning"):
        return None
    if kind == "image" and isinstance(data, str):
        if data.startswith(("http://", "https://", "data:")):
            return ImageContent(image_url=data)
        return ImageContent(image_url=f"data:{mime or 'image/png'};base64,{data}")
    if kind == "audio" and isinstance(data, str):
        audio_format = mime.rpartition("/")[2] if isinstance(mime, str) else None
        return AudioContent(data=data, format=audio_format)
    if kind == "video" and isinstance(data, str):
        return FileContent(file_data=data, filename=f"video.{(mime or '/mp4').rpartition('/')[2]}")
    if kind == "ui":
        return DataContent(data={"ui": segment.get("ui")})
    return DataContent(data=dict(segment))


class _OpenText:
    """The assistant message whose text is streaming in, in one provider round."""

    __slots__ = ("content", "message", "round", "streamed")

    def __init__(self, message: MessageBuilder, content: ContentBuilder, round_no: int) -> None:
        self.message = message
        self.content = content
        self.round = round_no
        self.streamed: list[str] = []


class RunTranslator:
    """Turns one run's bus events into its response's events, through ``builder``.

    Attributes:
        out: The events made and not yet taken, oldest first; the caller pops them.
    """

    def __init__(
        self,
        builder: ResponseBuilder,
        server_tools: Callable[[str], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._builder = builder
        self._server_tools = server_tools
        self._listed: set[str] = set()
        self.out: deque[WireEvent] = deque()
        self._open: _OpenText | None = None
        self._usage: dict[str, Any] | None = None

    def start(self) -> None:
        """The response's ``created`` and ``in_progress`` events."""
        self.out.append(self._builder.created())
        self.out.append(self._builder.in_progress())

    def translate(self, event: Event) -> None:
        """The events one bus event of the run makes (none for the kinds it does not know)."""
        kind = event.type
        payload = event.payload
        if not isinstance(payload, dict):
            return
        if kind == OUTPUT_AGENT_MESSAGE_DELTA:
            self._delta(payload)
        elif kind == OUTPUT_AGENT_MESSAGE:
            self._said(payload)
        elif kind == _TOOL_CALL:
            self._close_open()
            call = FunctionCall(
                call_id=str(payload.get("toolCallId", "")),
                name=str(payload.get("name", "")),
                arguments=_json_text(payload.get("args", {})),
            )
            label = payload.get("serverLabel")
            if isinstance(label, str):
                self._list_tools(label)
                data = {**call.to_wire(), "server_label": label}
                self._data_message(Role.ASSISTANT, MessageType.MCP_TOOL_CALL, data)
            else:
                self._data_message(Role.ASSISTANT, MessageType.FUNCTION_CALL, call.to_wire())
        elif kind == _APPROVAL_REQUEST:
            self._close_open()
            request: dict[str, Any] = {
                "id": str(payload.get("approvalId", "")),
                "call_id": str(payload.get("toolCallId", "")),
                "name": str(payload.get("name", "")),
                "arguments": _json_text(payload.get("args", {})),
            }
            if isinstance(payload.get("serverLabel"), str):
                request["server_label"] = payload["serverLabel"]
            self._data_message(Role.ASSISTANT, MessageType.MCP_APPROVAL_REQUEST, request)
        elif kind == _TOOL_RESULT:
            self._close_open()
            output = (
                payload.get("result") if payload.get("success") else {"error": payload.get("error")}
            )
            result = FunctionCallOutput(
                call_id=str(payload.get("toolCallId", "")),
                name=str(payload.get("name", "")),
                output=_json_text(output),
            )
            self._data_message(Role.TOOL, MessageType.FUNCTION_CALL_OUTPUT, result.to_wire())
        elif kind == _ERROR:
            error = Error(
                code=str(payload.get("code", "ERROR")), message=str(payload.get("message", ""))
            )
            self._close_open(failed=error)
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.ERROR)
            message.set_error(error.code, error.message)
            self.out.append(message.created())
            self.out.append(message.complete())

    def end(self, result: RunResult | None) -> AgentResponse:
        """The response's terminal event, for the run's ``result`` (``None``: unknown, canceled).

        It is also the last of :attr:`out`.
        """
        status = run_status(result) if result is not None else RunStatus.Canceled
        if result is not None and result.usage:
            # The loop's count includes responses that only called tools.
            self._usage = result.usage
        error: Error | None = None
        if status is RunStatus.Failed:
            assert result is not None
            assert result.error is not None
            error = Error(
                code=str(result.error.get("code", "ERROR")),
                message=str(result.error.get("message", "")),
            )
        self._close_open(failed=error, canceled=status is RunStatus.Canceled)
        if self._usage:
            self._builder.set_usage(self._usage)
        if error is not None:
            final = self._builder.failed(error)
        elif status is RunStatus.Canceled:
            final = self._builder.canceled()
        else:
            final = self._builder.completed()
        self.out.append(final)
        return final

    def rejected(self, error: Error) -> AgentResponse:
        """A request refused before any run: the response ``created``, then ``rejected``.

        Used instead of :meth:`start`; returns the terminal event.
        """
        self.out.append(self._builder.created())
        final = self._builder.end(RunStatus.Rejected, error)
        self.out.append(final)
        return final

    def waiting(self, payload: Mapping[str, Any]) -> AgentResponse:
        """The ``incomplete`` terminal event of a run that now waits for its client.

        ``payload`` is the ``EXEC:AWAITING``'s: the call ids and approval ids
        waited for, named in the response's ``metadata.waiting_for``.
        """
        self._close_open()
        if self._usage:
            self._builder.set_usage(self._usage)
        call_ids = payload.get("callIds")
        approval_ids = payload.get("approvalIds")
        metadata = dict(self._builder.metadata or {})
        metadata["waiting_for"] = {
            MessageType.FUNCTION_CALL.value: list(call_ids) if isinstance(call_ids, list) else [],
            MessageType.MCP_APPROVAL_REQUEST.value: (
                list(approval_ids) if isinstance(approval_ids, list) else []
            ),
        }
        self._builder.metadata = metadata
        final = self._builder.end(RunStatus.Incomplete)
        self.out.append(final)
        return final

    def _delta(self, payload: dict[str, Any]) -> None:
        text = payload.get("text")
        round_no = payload.get("round")
        if not isinstance(text, str) or not text:
            return
        current = self._open
        if current is not None and current.round != round_no:
            self._close_open()
            current = None
        if current is None:
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.MESSAGE)
            self.out.append(message.created())
            content = message.create_content_builder(ContentType.TEXT)
            current = self._open = _OpenText(
                message, content, round_no if isinstance(round_no, int) else 0
            )
        current.streamed.append(text)
        self.out.append(current.content.add_text_delta(text))

    def _said(self, payload: dict[str, Any]) -> None:
        metadata = payload.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("usage"), dict):
            self._usage = add_usage(self._usage, metadata["usage"])
        if isinstance(metadata, dict) and isinstance(metadata.get("droppedParameters"), list):
            known = dict(self._builder.metadata or {})
            dropped = list(known.get("dropped_parameters", []))
            dropped += [p for p in metadata["droppedParameters"] if p not in dropped]
            known["dropped_parameters"] = dropped
            self._builder.metadata = known
        text = payload.get("text")
        text = text if isinstance(text, str) else ""
        segments = payload.get("segments")
        segments = (
            [s for s in segments if isinstance(s, dict)] if isinstance(segments, list) else []
        )
        reasoning = [s for s in segments if s.get("type") == "reasoning"]
        shown = [item for item in map(_segment_content, segments) if item is not None]
        current, self._open = self._open, None
        if current is None:
            self._reasoning(reasoning)
            if reasoning and not text and not shown:
                return  # only reasoning this round (before its tool calls): no empty message
        content: ContentBuilder | None
        if current is not None:
            message, content = current.message, current.content
            streamed = "".join(current.streamed)
        else:
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.MESSAGE)
            self.out.append(message.created())
            content = message.create_content_builder(ContentType.TEXT) if text else None
            streamed = ""
        if content is not None:
            # The message's text is the record; the deltas were its preview.
            if text.startswith(streamed):
                if len(text) > len(streamed) or not streamed:
                    self.out.append(content.add_text_delta(text[len(streamed) :]))
            else:
                self.out.append(content.set_text(text))
            self.out.append(content.complete())
        for item in shown:
            self.out.append(message.add_content(item))
        self.out.append(message.complete())
        if current is not None:
            self._reasoning(reasoning)

    def _reasoning(self, segments: list[dict[str, Any]]) -> None:
        """One ``reasoning`` message per reasoning segment, its text as a text content."""
        for segment in segments:
            message = self._builder.create_message_builder(Role.ASSISTANT, MessageType.REASONING)
            self.out.append(message.created())
            content = message.create_content_builder(ContentType.TEXT)
            text = segment.get("text")
            if isinstance(text, str) and text:
                self.out.append(content.add_text_delta(text))
            self.out.append(content.complete())
            self.out.append(message.complete())

    def _list_tools(self, label: str) -> None:
        """The ``mcp_list_tools`` message of a server, once per response."""
        if label in self._listed or self._server_tools is None:
            return
        self._listed.add(label)
        data = {"server_label": label, "tools": self._server_tools(label)}
        self._data_message(Role.ASSISTANT, MessageType.MCP_LIST_TOOLS, data)

    def _data_message(self, role: Role, message_type: MessageType, data: dict[str, Any]) -> None:
        """A whole message of one data content: created, the content, completed."""
        message = self._builder.create_message_builder(role, message_type)
        self.out.append(message.created())
        self.out.append(message.add_content(DataContent(data=data)))
        self.out.append(message.complete())

    def _close_open(self, *, failed: Error | None = None, canceled: bool = False) -> None:
        """End the message whose text was streaming: with what it said so far."""
        current, self._open = self._open, None
        if current is None:
            return
        self.out.append(current.content.complete())
        if failed is not None:
            self.out.append(current.message.failed(failed))
        elif canceled:
            self.out.append(current.message.canceled())
        else:
            self.out.append(current.message.complete())
