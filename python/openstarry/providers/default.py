"""The offline default provider: no key, no network, the same answer to the same input.

:class:`DefaultProvider` drives the whole think-act loop of spec 000 section 5
without a language model. It recognises a few plain requests and turns each into
a call of a tool the agent has:

========================================  ===============  =============================
request                                   tool             arguments
========================================  ===============  =============================
``weather in Taipei``, ``Tokyo weather``  ``get_weather``  ``{"location": "Taipei"}``
``read notes.txt``, ``cat x``             ``fs.read``      ``{"path": "notes.txt"}``
``list files in docs``                    ``fs.list``      ``{"path": "docs"}`` (``"."``)
``write "hi" to notes.txt``               ``fs.write``     ``{"path": ..., "content": ...}``
========================================  ===============  =============================

Its first answer to such a request is ``"Sure, let me check."`` followed by the
tool calls, in the order the requests came (``weather in Taipei and in Tokyo``
makes two calls). Once the outcomes are in memory it answers from them in plain
text with no tool call (``"The weather in Taipei is 25°C, Sunny."``), and it does
the same when the core fed back an observation instead (an unknown tool, bad
arguments): it never calls a tool twice in one turn, so a run ends in at most
two rounds. Anything else gets a reply that lists what it can do with the tools
at hand.

It has no model, so it ignores a request's generation parameters
(``context.generation``: ``temperature``, ``max_tokens``...), silently: its
answers do not depend on them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    ToolOutcome,
    UserTurn,
)
from openstarry.core import ContentSegment, ProviderResponse, ToolCall
from openstarry.providers._default_parser import GREETING, MAX_REQUEST_CHARS, Request, parse

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext, Tool

__all__ = ["ACKNOWLEDGEMENT", "MAX_REQUEST_CHARS", "DefaultProvider"]

#: The text segment that precedes the tool calls of a first answer (spec 000 section 5, step 5).
ACKNOWLEDGEMENT: Final = "Sure, let me check."

_MODEL: Final = "offline"
_ASK_LOCATION: Final = 'Which location would you like the weather for? Try "weather in Taipei".'
_DEFAULT_MAX_QUOTE_CHARS: Final = 2000
_MAX_LISTED_NAMES: Final = 50
_OPTIONS: Final = frozenset({"maxQuoteChars"})

# What each kind of request calls, by tool name in order of preference, and the
# names a tool's schema may give each argument.
_TOOL_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "weather": ("get_weather", "weather"),
    "read": ("fs.read", "read_file", "read"),
    "list": ("fs.list", "list_files", "list_dir", "ls"),
    "write": ("fs.write", "write_file", "write"),
}
_ARG_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "location": ("location", "city", "place", "query", "q"),
    "path": ("path", "file", "filename", "file_path"),
    "content": ("content", "text", "data"),
}
# How the fallback reply describes each kind of request.
_CAPABILITIES: Final[Mapping[str, tuple[str, str]]] = {
    "weather": ("check the weather", "weather in Taipei"),
    "read": ("read a file", "read notes.txt"),
    "list": ("list files", "list files in docs"),
    "write": ("write a file", 'write "hello" to notes.txt'),
}


class DefaultProvider:
    """openstarry's embedded provider: deterministic, offline, and able to call tools.

    Args:
        model: Reported as ``metadata["model"]``; ``"offline"`` when not given.
        options: ``{"maxQuoteChars": int}``, how much of a file's text an answer
            quotes (2000 characters by default).

    Raises:
        ValueError: for an option it does not know, naming it, or a bad value.

    Example::

        provider = DefaultProvider()
        response = await provider.generate("Query weather in Taipei", context)
        # [text "Sure, let me check.", tool_call get_weather {"location": "Taipei"}]
    """

    name: str = "default"

    def __init__(self, model: str | None = None, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ValueError(
                "unknown option(s) for the default provider: "
                f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(_OPTIONS))}"
            )
        max_quote = options.get("maxQuoteChars", _DEFAULT_MAX_QUOTE_CHARS)
        if isinstance(max_quote, bool) or not isinstance(max_quote, int) or max_quote < 1:
            raise ValueError(
                f"option 'maxQuoteChars' must be a positive integer, not {max_quote!r}"
            )
        self.model: str = model or _MODEL
        self.max_quote_chars: int = max_quote

    def __repr__(self) -> str:
        return f"DefaultProvider(model={self.model!r})"

    #: ``generate`` never waits (``Provider``'s ``completes_at_once``).
    completes_at_once = True

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        """Answer ``prompt``: tool calls for a recognised request, else text (see the module)."""
        segments = self._respond(prompt, context)
        return ProviderResponse(segments, metadata=self._metadata(prompt, context, segments))

    # --- deciding -----------------------------------------------------------------------------

    def _respond(self, prompt: str, context: AgentContext) -> list[ContentSegment]:
        turn = context.memory.current_turn()
        calls, feedback = _this_round(turn)
        if calls or feedback:
            # Tools were called this turn: answer from what came back, never call again.
            return [_text(self._final_answer(calls, feedback))]

        requests = parse(prompt)
        resolved = [
            (request, tool)
            for request in requests
            if request.complete and (tool := _find_tool(request.kind, context.tools)) is not None
        ]
        if resolved:
            segments = [_text(ACKNOWLEDGEMENT)]
            for index, (request, tool) in enumerate(resolved):
                args = _tool_args(request, tool)
                call_id = _call_id(context, index, tool.name, args)
                segments.append(
                    ContentSegment("tool_call", tool_call=ToolCall(tool.name, args, id=call_id))
                )
            return segments
        if any(r.kind == "weather" for r in requests) and _find_tool("weather", context.tools):
            return [_text(_ASK_LOCATION)]
        return [_text(_help(prompt, requests, context.tools))]

    def _final_answer(
        self, calls: Sequence[ToolCall], feedback: Sequence[ToolOutcome | Observation]
    ) -> str:
        outcomes = {e.tool_call_id: e for e in feedback if isinstance(e, ToolOutcome)}
        observations = [e for e in feedback if isinstance(e, Observation)]
        lines: list[str] = []
        unanswered: list[ToolCall] = []
        for call in calls:
            outcome = outcomes.pop(call.id, None)
            if outcome is None:
                unanswered.append(call)
            else:
                lines.append(self._describe(outcome, call.args))
        # Outcomes of calls no assistant entry shows (a loop that records only outcomes).
        lines.extend(self._describe(outcome, None) for outcome in outcomes.values())
        # The core may report a failure twice, as the outcome's error and as an
        # observation repeating it (with the tool's schema): say it once.
        reported = [
            e.error.message
            for e in feedback
            if isinstance(e, ToolOutcome) and e.error is not None and e.error.message.strip()
        ]
        lines.extend(
            _observed(observation)
            for observation in observations
            if not any(message in observation.text for message in reported)
        )
        if not observations:
            lines.extend(f"I got no result from {call.name}." for call in unanswered)
        return "\n".join(lines) if lines else "I have no tool results to report."

    def _describe(self, outcome: ToolOutcome, call_args: Any) -> str:
        args: Mapping[str, Any] = call_args if isinstance(call_args, Mapping) else {}
        if not outcome.success:
            error = outcome.error
            if error is None:
                return f"The {outcome.name} tool failed."
            reason = error.message.strip()
            # "fs.read: 'a.txt': No such file" is already about fs.read.
            reason = reason.removeprefix(f"{outcome.name}: ").strip().rstrip(".")
            reason = reason or "no reason given"
            code = f" ({error.code})" if error.code else ""
            return f"The {outcome.name} tool failed: {reason}{code}."
        kind = _kind_of(outcome.name)
        result = outcome.result
        if kind == "weather":
            return _weather_sentence(result, _arg(args, "location"))
        if kind == "read":
            return self._read_sentence(result, _arg(args, "path"))
        if kind == "list":
            return _list_sentence(result, _arg(args, "path") or ".")
        if kind == "write":
            return _write_sentence(result, _arg(args, "path"), _arg(args, "content"))
        if result is None:
            return f"{outcome.name} finished."
        return f"{outcome.name} returned: {self._clip(_compact(result))}"

    def _read_sentence(self, result: Any, path: str | None) -> str:
        if isinstance(result, Mapping):
            result = next((result[k] for k in ("content", "text", "data") if k in result), result)
        body = result if isinstance(result, str) else _compact(result)
        where = path or "The file"
        if not body.strip():
            return f"{where} is empty."
        return f"Here is {path or 'the file'}:\n{self._clip(body)}"

    def _clip(self, text: str) -> str:
        """``text`` cut to ``max_quote_chars``, at a line break when one is near, marked as cut."""
        limit = self.max_quote_chars
        if len(text) <= limit:
            return text
        cut = text.rfind("\n", 0, limit + 1)
        if cut < limit // 2:
            cut = limit
        rest = len(text) - cut
        return f"{text[:cut].rstrip()}\n… ({rest} more characters not shown)"

    # --- metadata -----------------------------------------------------------------------------

    def _metadata(
        self, prompt: str, context: AgentContext, segments: Sequence[ContentSegment]
    ) -> dict[str, Any]:
        input_words = _words(prompt) + sum(_entry_words(entry) for entry in context.memory)
        output_words = 0
        for segment in segments:
            if segment.text is not None:
                output_words += _words(segment.text)
            if segment.tool_call is not None:
                output_words += 1 + _words(_compact(segment.tool_call.args))
        return {
            "provider": self.name,
            "model": self.model,
            "usage": {
                "input_tokens": input_words,
                "output_tokens": output_words,
                "total_tokens": input_words + output_words,
            },
        }


# --- memory ---------------------------------------------------------------------------------


def _this_round(
    turn: Sequence[MemoryEntry],
) -> tuple[list[ToolCall], list[ToolOutcome | Observation]]:
    """The tool calls of the turn's latest assistant entry that made some, and what came after.

    With no such entry, every outcome and observation of the turn is feedback
    (a loop that does not record its assistant turns still ends).
    """
    start = 0
    calls: list[ToolCall] = []
    for index, entry in enumerate(turn):
        if isinstance(entry, AssistantTurn) and entry.tool_calls:
            start, calls = index + 1, list(entry.tool_calls)
    feedback = [e for e in turn[start:] if isinstance(e, (ToolOutcome, Observation))]
    return calls, feedback


def _entry_words(entry: MemoryEntry) -> int:
    if isinstance(entry, (UserTurn, Observation)):
        return _words(entry.text)
    if isinstance(entry, AssistantTurn):
        calls = sum(1 + _words(_compact(call.args)) for call in entry.tool_calls)
        return _words(entry.text) + calls
    if entry.success:
        return _words(_compact(entry.result))
    return _words(entry.error.message) if entry.error is not None else 0


def _observed(observation: Observation) -> str:
    text = observation.text.strip()
    if text and text[-1] not in ".!?":
        text += "."
    return f"I could not complete the request: {text or 'the core reported a problem.'}"


# --- answers --------------------------------------------------------------------------------


def _weather_sentence(result: Any, location: str | None) -> str:
    summary: str | None = None
    if isinstance(result, Mapping):
        location = str(result.get("location") or location or "") or None
        summary = str(result["summary"]) if result.get("summary") else None
        if summary is None:
            parts = []
            if result.get("temperature") is not None:
                parts.append(f"{result['temperature']}{_unit_symbol(result.get('unit'))}")
            if result.get("condition"):
                parts.append(str(result["condition"]))
            summary = ", ".join(parts) or _compact(result)
    elif isinstance(result, str):
        summary = result
    else:
        summary = _compact(result)
    summary = summary.strip().rstrip(".")
    if location:
        return f"The weather in {location} is {summary}."
    return f"The weather is {summary}."


def _unit_symbol(unit: Any) -> str:
    if not unit:
        return ""
    symbols = {"celsius": "°C", "c": "°C", "fahrenheit": "°F", "f": "°F", "kelvin": " K", "k": " K"}
    return symbols.get(str(unit).lower(), f" {unit}")


def _list_sentence(result: Any, path: str) -> str:
    if isinstance(result, Mapping):
        result = next(
            (result[k] for k in ("entries", "files", "items", "names") if k in result), result
        )
    where = "The workspace" if path in (".", "./", "") else path
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
        return f"{where}: {_compact(result)}"
    names = [_entry_name(item) for item in result]
    if not names:
        return f"{where} is empty."
    shown = ", ".join(names[:_MAX_LISTED_NAMES])
    if len(names) > _MAX_LISTED_NAMES:
        shown += f" and {len(names) - _MAX_LISTED_NAMES} more"
    noun = "entry" if len(names) == 1 else "entries"
    return f"{where} contains {len(names)} {noun}: {shown}."


def _entry_name(item: Any) -> str:
    if isinstance(item, Mapping) and "name" in item:
        name = str(item["name"])
        kind = str(item.get("type", "")).lower()
        is_dir = kind in ("dir", "directory", "folder") or item.get("is_dir") is True
        return name + "/" if is_dir and not name.endswith("/") else name
    return item if isinstance(item, str) else _compact(item)


def _write_sentence(result: Any, path: str | None, content: str | None) -> str:
    target = path or "the file"
    if isinstance(result, Mapping):
        for key in ("bytes", "bytesWritten", "bytes_written"):
            count = result.get(key)
            if isinstance(count, int) and not isinstance(count, bool):
                return f"Wrote {count} bytes to {target}."
    if content is not None:
        return f"Wrote {len(content)} characters to {target}."
    return f"Wrote {target}."


def _help(prompt: str, requests: Sequence[Request], tools: Mapping[str, Tool]) -> str:
    lines: list[str] = []
    if GREETING.match(prompt.strip()):
        lines.append("Hello!")
    missing = [r.kind for r in requests if _find_tool(r.kind, tools) is None]
    for kind in dict.fromkeys(missing):
        lines.append(
            f"I can't {_CAPABILITIES[kind][0]} here: this agent has no {_TOOL_NAMES[kind][0]} tool."
        )
    lines.append(
        "I am openstarry's offline default provider: I need no key and no network, "
        "and I understand a few simple requests."
    )
    driven: set[str] = set()
    usable: list[str] = []
    for kind, (what, example) in _CAPABILITIES.items():
        tool = _find_tool(kind, tools)
        if tool is not None:
            driven.add(tool.name)
            usable.append(f'- {what} with {tool.name}: "{example}"')
    if usable:
        lines.append("With this agent's tools I can:")
        lines.extend(usable)
    others = sorted(set(tools) - driven)
    if others:
        lines.append(f"Other tools this agent has: {', '.join(others)}.")
    if not tools:
        lines.append("This agent has no tools, so this reply is all I can do.")
    lines.append("Configure a model provider in agent.json for open conversation.")
    return "\n".join(lines)


# --- tools ----------------------------------------------------------------------------------


def _find_tool(kind: str, tools: Mapping[str, Tool]) -> Tool | None:
    for name in _TOOL_NAMES[kind]:
        tool = tools.get(name)
        if tool is not None:
            return tool
    return None


def _kind_of(tool_name: str) -> str | None:
    for kind, names in _TOOL_NAMES.items():
        if tool_name in names:
            return kind
    return None


def _tool_args(request: Request, tool: Tool) -> dict[str, str]:
    """The request's arguments, renamed to the names the tool's schema uses when they differ."""
    properties = tool.parameters.get("properties")
    args: dict[str, str] = {}
    for canonical, value in request.args.items():
        name = canonical
        if isinstance(properties, Mapping) and properties and canonical not in properties:
            name = next((n for n in _ARG_NAMES[canonical] if n in properties), canonical)
        args[name] = value
    return args


def _arg(args: Mapping[str, Any], canonical: str) -> str | None:
    for name in _ARG_NAMES[canonical]:
        value = args.get(name)
        if isinstance(value, str):
            return value
    return None


def _call_id(context: AgentContext, index: int, name: str, args: Mapping[str, str]) -> str:
    """A stable id: the same context and request give the same id, another turn another id."""
    key = json.dumps(
        [
            context.session_id,
            context.trace_id,
            context.round,
            len(context.memory),
            index,
            name,
            args,
        ],
        sort_keys=True,
        ensure_ascii=False,
    )
    return "call_" + hashlib.sha256(key.encode()).hexdigest()[:16]


# --- text helpers ---------------------------------------------------------------------------


def _text(text: str) -> ContentSegment:
    return ContentSegment("text", text=text)


def _words(text: str) -> int:
    return len(text.split())


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
