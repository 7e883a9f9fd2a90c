"""Slash commands: a user's line that starts with ``/`` (spec 000 section 1).

Two kinds:

- the built-ins: ``/help``, ``/reset``, ``/stop``, ``/quit``, ``/metrics``;
- a tool, run directly without asking the provider: ``/read notes.txt`` runs
  ``fs.read`` with ``{"path": "notes.txt"}``. The command is a tool's full name
  (``/fs.read``) or the part after its last dot when only one tool ends that
  way (``/read``).

Arguments are split like a shell line (quotes group words). ``key=value`` sets
one argument by name; the other words fill the tool's parameters in the order
of its JSON Schema. For a parameter that accepts text, a value is the text as
written (``path=2024`` is ``"2024"``); otherwise it is read as JSON when it
parses (``count=3`` is a number, ``tags=["a"]`` a list) and as text if not. A line whose arguments
start with ``{`` is one JSON object of arguments.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openstarry.agent.interfaces import Tool
from openstarry.core import Event
from openstarry.errors import ToolArgumentsError
from openstarry.events import EventType

__all__ = [
    "BUILTIN_COMMANDS",
    "InvalidCommand",
    "SlashCommand",
    "find_tool",
    "help_text",
    "parse_line",
    "parse_tool_args",
    "system_command",
    "user_message",
]

#: The built-in commands and what each does, as ``/help`` shows them.
BUILTIN_COMMANDS: Mapping[str, str] = {
    "help": "list the commands and the tools",
    "reset": "stop the current run, forget this session's memory and lift a lock-out",
    "stop": "cancel the run in progress (and drop the inputs queued behind it)",
    "quit": "stop and end this session",
    "metrics": "show the event bus and loop metrics",
    "approve": "approve the tool call an approval request names: /approve APPROVAL_ID",
    "deny": "deny it: /deny APPROVAL_ID [reason]",
}


@dataclass(frozen=True, slots=True)
class SlashCommand:
    """A parsed ``/name rest of the line``."""

    name: str
    argline: str

    @property
    def is_builtin(self) -> bool:
        return self.name in BUILTIN_COMMANDS


def parse_line(line: str) -> SlashCommand | None:
    """The command in ``line``, or ``None`` when it is not a slash command.

    A line of only ``/`` or one starting with ``//`` is ordinary text.
    """
    first = line[:1]
    if first != "/" and not first.isspace():
        return None  # most lines: no slash, no leading blank
    text = line.strip()
    if len(text) < 2 or text[0] != "/" or text[1] == "/" or text[1].isspace():
        return None
    name, *rest = text[1:].split(None, 1)
    return SlashCommand(name, rest[0].strip() if rest else "")


def find_tool(name: str, tools: Mapping[str, Tool]) -> Tool | None:
    """The tool a command names.

    Its exact name first, else the one tool whose last dotted part is ``name``.
    """
    tool = tools.get(name)
    if tool is not None:
        return tool
    matches = [t for key, t in tools.items() if key.rsplit(".", 1)[-1] == name]
    return matches[0] if len(matches) == 1 else None


def _takes_text(schema: Any) -> bool:
    """Whether a parameter's schema accepts a string (directly or in a union)."""
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    if "enum" in schema and any(isinstance(v, str) for v in schema["enum"]):
        return True
    return any(_takes_text(branch) for key in ("anyOf", "oneOf") for branch in schema.get(key, ()))


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
    except RecursionError:
        raise ToolArgumentsError(f"a value is nested too deeply: {text[:40]}...") from None


def parse_tool_args(tool: Tool, argline: str) -> dict[str, Any]:
    """The arguments of ``/tool argline`` for ``tool`` (see the module's rules).

    Raises:
        ToolArgumentsError: unbalanced quotes, a JSON object that does not parse,
            more words than the tool has parameters, or an argument given twice.
    """
    if argline.startswith("{"):
        try:
            parsed = json.loads(argline)
        except ValueError as exc:
            raise ToolArgumentsError(
                f"/{tool.name}: arguments are not a JSON object: {exc}"
            ) from None
        except RecursionError:
            raise ToolArgumentsError(f"/{tool.name}: arguments are nested too deeply") from None
        if not isinstance(parsed, dict):
            raise ToolArgumentsError(f"/{tool.name}: arguments must be a JSON object")
        return {str(key): value for key, value in parsed.items()}
    try:
        words = shlex.split(argline)
    except ValueError as exc:
        raise ToolArgumentsError(f"/{tool.name}: {exc}") from None
    names = list(tool.parameters.get("properties", {}))
    args: dict[str, Any] = {}
    positional: list[str] = []
    for word in words:
        key, eq, value = word.partition("=")
        if eq and key in names:
            if key in args:
                raise ToolArgumentsError(f"/{tool.name}: argument {key!r} given twice")
            prop = tool.parameters.get("properties", {}).get(key, {})
            # A parameter that takes text gets the value as written ("2024", "true").
            args[key] = value if _takes_text(prop) else _value(value)
        else:
            positional.append(word)
    free = [n for n in names if n not in args]
    if len(positional) > len(free):
        last = tool.parameters.get("properties", {}).get(free[-1], {}) if free else {}
        if free and free[-1] == names[-1] and _takes_text(last):
            # The last parameter takes the rest of the line: `/write notes.txt hello world`.
            positional[len(free) - 1 :] = [" ".join(positional[len(free) - 1 :])]
        else:
            if not free:
                raise ToolArgumentsError(
                    f"/{tool.name} takes no words here: give key=value pairs or a JSON object"
                )
            noun = "word" if len(positional) == 1 else "words"
            kind = "parameter" if len(free) == 1 else "parameters"
            raise ToolArgumentsError(
                f"/{tool.name}: {len(positional)} {noun} for {len(free)} {kind} {free}"
            )
    for key, word in zip(free, positional, strict=False):
        prop = tool.parameters.get("properties", {}).get(key, {})
        # A parameter that takes text gets the word as written, even when it looks like JSON.
        args[key] = word if _takes_text(prop) else _value(word)
    return args


def help_text(tools: Mapping[str, Tool]) -> str:
    """What ``/help`` answers: the built-in commands, then the tools a slash line runs."""
    lines = ["Commands:"]
    lines += [f"  /{key:<8} {text}" for key, text in BUILTIN_COMMANDS.items()]
    if tools:
        lines.append("Tools (run one directly with /name args):")
        lines += [f"  /{t.name:<8} {t.description}" for t in tools.values()]
    return "\n".join(lines)


_USER_MESSAGE = EventType.USER_MESSAGE.value


class InvalidCommand(ValueError):
    """An ``INPUT:SYSTEM_COMMAND`` the loop cannot run; ``code`` is its ``KERNEL:ERROR`` code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def system_command(payload: Any) -> tuple[str, list[str]]:
    """The built-in command an ``INPUT:SYSTEM_COMMAND`` payload names, and its arguments.

    Raises:
        InvalidCommand: ``INVALID_INPUT`` for a payload not of the form
            ``{"command": str, "args": [...]}``, ``UNKNOWN_COMMAND`` for a
            command that is not built in.
    """
    name = payload.get("command") if isinstance(payload, dict) else None
    args = payload.get("args", []) if isinstance(payload, dict) else []
    if not isinstance(name, str) or not isinstance(args, list):
        raise InvalidCommand(
            "INVALID_INPUT", "INPUT:SYSTEM_COMMAND needs {'command': str, 'args': [str]}"
        )
    name = name.lstrip("/")
    if name not in BUILTIN_COMMANDS:
        raise InvalidCommand(
            "UNKNOWN_COMMAND",
            f"unknown system command {name!r}; known: {sorted(BUILTIN_COMMANDS)}",
        )
    return name, [str(a) for a in args]


def user_message(
    text: str,
    session_id: str,
    source: str,
    priority: int | None,
    extra: Mapping[str, Any] | None = None,
    trace_id: str | None = None,
) -> Event:
    """The ``INPUT:USER_MESSAGE`` of a line of text (the loop's submit, start and ask)."""
    payload: dict[str, Any] = {"text": text, "mimeType": "text/plain"}
    if extra:
        payload.update({k: v for k, v in extra.items() if k not in payload})
    return Event.new(
        _USER_MESSAGE,
        payload,
        source=source,
        session_id=session_id,
        priority=priority,
        trace_id=trace_id,
    )
