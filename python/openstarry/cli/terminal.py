"""The ``openstarry run`` prompt and output at a terminal: prompt_toolkit and rich.

Both come with the ``[cli]`` extra (``pip install 'openstarry[cli]'``); they
cost about 150 ms to import, so the CLI imports this module only at a terminal.
Without them the CLI keeps its plain prompt and says how to get this one.

Rules this module keeps:

- Output never lands inside the line being typed: while the prompt is up,
  everything printed goes through prompt_toolkit's ``patch_stdout``, which
  draws it above the input line and redraws the line below it.
- The text a provider streams (``OUTPUT:AGENT_MESSAGE_DELTA``) is shown as it
  comes in a live area above the input line (its last lines), then printed once,
  as Markdown, when the whole message arrives.
- A typed line is shown once: the prompt leaves it on the screen, so the
  session's ``INPUT:USER_MESSAGE`` is not printed again.
- ``NO_COLOR`` (any non-empty value) turns colour off in both libraries.
- Ctrl-C on a line with text clears it; with a turn running, it sends ``/stop``
  (priority 0); on an empty line with nothing running it asks again, and a
  second Ctrl-C leaves. Ctrl-D on an empty line leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console
from rich.live import Live
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from openstarry.agent.execution import APPROVAL_REQUEST
from openstarry.agent.waits import APPROVAL, Answer
from openstarry.core import Event
from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA, EventType

__all__ = [
    "PathCompleter",
    "RichPrinter",
    "SlashCompleter",
    "history_path",
    "metrics_table",
    "prompt_loop",
]

#: A tool result longer than this (as shown, in characters) is cut with a note.
RESULT_LIMIT = 300
#: Lines of streamed text the live area shows (the last ones).
STREAM_LINES = 8


def history_path(agent_name: str) -> Path:
    """Where the prompt keeps an agent's input history.

    ``$XDG_DATA_HOME/openstarry/history/<agent>`` (``~/.local/share`` when unset;
    ``%LOCALAPPDATA%`` on Windows). The agent's name is made safe for a file name.
    """
    base = os.environ.get("XDG_DATA_HOME")
    if not base and sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
    root = Path(base) if base else Path.home() / ".local" / "share"
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", agent_name).strip("._") or "agent"
    return root / "openstarry" / "history" / safe


def _cut(text: str, limit: int = RESULT_LIMIT) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def _shown(value: Any) -> str:
    return value.strip() if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def metrics_table(metrics: Mapping[str, Any]) -> Table:
    """``/metrics`` as a small table: counts per type, depth per priority, latency."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    bus = metrics.get("bus", {})
    for kind, count in sorted(bus.get("dispatched", {}).items()):
        table.add_row(kind, str(count))
    depth = bus.get("depth", [])
    table.add_row("queue depth", "  ".join(f"p{i}:{d}" for i, d in enumerate(depth)))
    latency = bus.get("latency_us", {})
    if latency.get("count"):
        table.add_row(
            "latency",
            f"p50 {latency.get('p50', 0):.0f} µs  p99 {latency.get('p99', 0):.0f} µs"
            f"  ({latency['count']} events)",
        )
    extra = {k: bus[k] for k in ("published", "duplicates", "handler_errors") if k in bus}
    loop = metrics.get("loop", {})
    extra.update({k: v for k, v in loop.items() if k in ("running", "waiting", "runs_completed")})
    table.add_row("counts", "  ".join(f"{k} {v}" for k, v in extra.items()))
    return table


class RichPrinter:
    """Prints a session's events for a person at a terminal, with rich.

    Args:
        console: Where to print.
        echo_input: Print the user's messages (not at the prompt, which shows them).
        on_stream: Called when the streamed text changes; ``None`` shows it in a
            rich ``Live`` area instead (when no prompt is up).
    """

    def __init__(
        self,
        console: Console,
        *,
        echo_input: bool = True,
        on_stream: Callable[[], None] | None = None,
    ) -> None:
        self.console = console
        self.echo_input = echo_input
        self.on_stream = on_stream
        self.errors = 0
        self.streaming = ""
        self._calls: dict[str, int] = {}
        self._live: Live | None = None

    def stream_tail(self, lines: int = STREAM_LINES) -> str:
        """The last ``lines`` lines of the text being streamed."""
        return "\n".join(self.streaming.splitlines()[-lines:])

    def _stream(self, text: str) -> None:
        self.streaming += text
        if self.on_stream is not None:
            self.on_stream()
            return
        if self._live is None:
            self._live = Live(console=self.console, transient=True, auto_refresh=False)
            self._live.start()
        self._live.update(Text(self.stream_tail()), refresh=True)

    def _end_stream(self) -> None:
        self.streaming = ""
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif self.on_stream is not None:
            self.on_stream()

    def __call__(self, event: Event) -> None:
        kind = event.type
        payload = event.payload
        print_ = self.console.print
        if kind == OUTPUT_AGENT_MESSAGE_DELTA:
            self._stream(str(payload.get("text", "")))
        elif kind == EventType.USER_MESSAGE:
            if self.echo_input:
                print_(Text(f"> {payload.get('text', '')}", style="bold"))
        elif kind == OUTPUT_AGENT_MESSAGE:
            self._end_stream()
            self._message(payload)
        elif kind == EventType.TOOL_CALL:
            self._calls[str(payload.get("toolCallId"))] = event.timestamp
            args = _cut(_shown(payload.get("args", {})), 120)
            print_(Text(f"  → {payload.get('name', '')} {args}", style="dim"))
        elif kind == EventType.TOOL_RESULT:
            started = self._calls.pop(str(payload.get("toolCallId")), None)
            took = f" {event.timestamp - started} ms" if started is not None else ""
            name = payload.get("name", "")
            if payload.get("success"):
                shown = _cut(_shown(payload.get("result")))
                print_(Text(f"  ← {name}{took}: {shown}", style="dim"))
            else:
                error = payload.get("error") or {}
                failed = f"  ← {name} failed{took}: {error.get('code')}: {error.get('message')}"
                print_(Text(failed, style="red"))
        elif kind == EventType.ERROR:
            self.errors += 1
            self._end_stream()
            error_line = Text("KERNEL:ERROR ", style="bold red")
            error_line.append(f"{payload.get('code')}: {payload.get('message')}", style="red")
            print_(error_line)

    def _message(self, payload: Mapping[str, Any]) -> None:
        text = str(payload.get("text", ""))
        metadata = payload.get("metadata")
        command = metadata.get("command") if isinstance(metadata, dict) else None
        if command == "metrics" and isinstance(metadata, dict) and "data" in metadata:
            self.console.print(metrics_table(metadata["data"]))
        elif command is not None:  # a built-in's answer is laid out already
            self.console.print(Text(text))
        elif text.strip():
            self.console.print(Markdown(text))


class SlashCompleter(Completer):
    """Tab completion of ``/commands``, ``/tool`` names and ``fs.*`` paths.

    Args:
        commands: The built-in command names (``help``, ``stop``…).
        tools: The agent's tools by name (read at each completion, so tools
            that MCP servers add while the agent runs are offered too).
        roots: The directories ``fs.*`` tools may touch; the first is where a
            relative path starts.
    """

    def __init__(
        self, commands: Iterable[str], tools: Callable[[], Mapping[str, Any]], roots: Sequence[Path]
    ) -> None:
        self.commands = list(commands)
        self.tools = tools
        self.paths = PathCompleter(roots)

    def names(self) -> list[str]:
        """Every name after ``/``: built-ins, tools, and a tool's last dotted part when unique."""
        tools = list(self.tools())
        short = [t.rsplit(".", 1)[-1] for t in tools if "." in t]
        unique = [s for s in short if short.count(s) == 1 and s not in tools]
        return sorted(set(self.commands) | set(tools) | set(unique))

    def _tool_of(self, name: str) -> str | None:
        tools = list(self.tools())
        if name in tools:
            return name
        matches = [t for t in tools if t.rsplit(".", 1)[-1] == name]
        return matches[0] if len(matches) == 1 else None

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterator[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or text.startswith("//"):
            return
        if " " not in text:
            word = text[1:]
            for name in self.names():
                if name.startswith(word):
                    yield Completion(f"/{name}", start_position=-len(text))
            return
        tool = self._tool_of(text[1:].split(" ", 1)[0])
        if tool is None or not tool.startswith("fs."):
            return
        word = text.rsplit(" ", 1)[-1]
        if "=" in word:  # path=notes/
            word = word.split("=", 1)[1]
        yield from self.paths.complete(word)


class PathCompleter:
    """Paths inside the allowed directories, as the ``fs.*`` tools resolve them."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [Path(os.path.realpath(r)) for r in roots]

    def _inside(self, path: Path) -> bool:
        real = Path(os.path.realpath(path))
        return any(real == r or r in real.parents for r in self.roots)

    def complete(self, word: str) -> Iterator[Completion]:
        """The entries whose path starts with ``word``; a directory ends with ``/``."""
        if not self.roots:
            return
        head, _, stem = word.rpartition("/")
        if word.startswith("/"):
            folder = Path(head or "/")
        else:
            folder = self.roots[0] / head if head else self.roots[0]
        if not self._inside(folder):
            return
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        prefix = f"{head}/" if head or word.startswith("/") else ""
        for entry in entries:
            if not entry.name.startswith(stem) or (entry.name.startswith(".") and not stem):
                continue
            if not self._inside(Path(entry.path)):
                continue
            suffix = "/" if entry.is_dir() else ""
            yield Completion(
                f"{prefix}{entry.name}{suffix}",
                start_position=-len(word),
                display=entry.name + suffix,
            )


_STOP = "\x00stop"
_ASK_LEAVE = "\x00ask"


class _PromptState:
    def __init__(self) -> None:
        self.running = 0
        self.armed = False  # a Ctrl-C on an empty line now leaves


def _key_bindings(state: _PromptState) -> KeyBindings:
    keys = KeyBindings()

    @keys.add("c-c")
    def _interrupt(event: KeyPressEvent) -> None:
        buffer = event.app.current_buffer
        if buffer.text:
            buffer.reset()
            state.armed = False
        elif state.running:
            state.armed = True
            event.app.exit(result=_STOP)
        elif state.armed:
            event.app.exit(result=None)
        else:
            state.armed = True
            event.app.exit(result=_ASK_LEAVE)

    @keys.add("c-d")
    def _leave(event: KeyPressEvent) -> None:
        buffer = event.app.current_buffer
        if buffer.text:
            buffer.delete()
        else:
            event.app.exit(result=None)

    return keys


def make_console() -> Console:
    """A rich console on stdout (``NO_COLOR`` is honoured by rich itself)."""
    return Console(highlight=False, soft_wrap=False)


def _ask_approval(event: Event, session_id: str) -> None:
    """Ask at the prompt about a call that waits for approval (the next line answers)."""
    payload = event.payload
    if event.session_id == session_id and isinstance(payload, dict):
        args = _cut(json.dumps(payload.get("args"), ensure_ascii=False, default=str))
        print(f"Allow {payload.get('name')} {args}? [y/N]", flush=True)


def _answer_approval(agent: Any, session_id: str, text: str) -> bool:
    """Answer the session's oldest waiting approval with a typed line; False when none waits."""
    for wait in agent.loop.waits.pending(session_id):
        if wait.kind == APPROVAL:
            yes = text.lower() in ("y", "yes")
            agent.loop.waits.answer(session_id, wait.id, Answer(approve=yes))
            return True
    return False


async def prompt_loop(
    agent: Any,
    session_id: str,
    quit_requested: anyio.Event,
    *,
    printer: Any,
    history: Path | None = None,
) -> None:
    """Read lines with prompt_toolkit until ``/quit``, Ctrl-D or a second Ctrl-C.

    Turns run while the next line is typed; what they print goes above it.
    ``printer`` (a :class:`RichPrinter`, or the NDJSON printer of ``--events``)
    is already subscribed; a :class:`RichPrinter` gets its ``on_stream`` here.
    """
    from openstarry.agent.commands import BUILTIN_COMMANDS

    state = _PromptState()
    manifest = getattr(agent, "manifest", None)
    roots = manifest.allowed_paths() if manifest is not None else []
    path = history if history is not None else history_path(agent.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file_history: FileHistory | None = FileHistory(str(path))
    except OSError:
        file_history = None
    rich_printer = printer if isinstance(printer, RichPrinter) else None

    def message() -> FormattedText:
        parts: list[tuple[str, str]] = []
        if rich_printer is not None and rich_printer.streaming:
            parts.append(("", rich_printer.stream_tail() + "\n"))
        parts.append(("bold", "> "))
        return FormattedText(parts)

    def toolbar() -> FormattedText | None:
        if not state.running:
            return None
        return FormattedText([("", " running… Ctrl-C stops it ")])

    session: PromptSession[str] = PromptSession(
        message,
        history=file_history,
        completer=SlashCompleter(BUILTIN_COMMANDS, lambda: agent.tools, roots),
        complete_while_typing=False,
        key_bindings=_key_bindings(state),
        bottom_toolbar=toolbar,
        enable_history_search=False,
    )

    def redraw() -> None:
        app = session.app
        loop = getattr(app, "loop", None)
        if app.is_running and loop is not None:
            loop.call_soon_threadsafe(app.invalidate)

    if rich_printer is not None:
        rich_printer.on_stream = redraw

    def read() -> str | None:
        try:
            return session.prompt()
        except (EOFError, KeyboardInterrupt):
            return None

    async def follow(run: Any) -> None:
        try:
            await run.wait()
        finally:
            state.running -= 1
            redraw()

    print(
        f"{agent.name}: /help lists commands. Tab completes, ↑ recalls, "
        "Ctrl-C stops a turn, Ctrl-D leaves.",
        flush=True,
    )
    asking = agent.bus.subscribe(APPROVAL_REQUEST, lambda e: _ask_approval(e, session_id))
    with patch_stdout(raw=True), contextlib.ExitStack() as leaving:
        leaving.callback(asking.cancel)
        async with anyio.create_task_group() as runs:
            while not quit_requested.is_set():
                line = await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
                if line is None:
                    if state.running:  # leaving stops the turn in progress
                        agent.loop.command("/stop", session_id=session_id)
                    break
                if line == _STOP:
                    agent.loop.command("/stop", session_id=session_id)
                    continue
                if line == _ASK_LEAVE:
                    print("(Ctrl-C again or Ctrl-D to leave)", flush=True)
                    continue
                state.armed = False
                text = line.strip()
                if _answer_approval(agent, session_id, text):
                    continue
                if not text:
                    continue
                if text in ("/stop", "/reset", "/quit"):
                    agent.loop.command(text, session_id=session_id)
                    if text == "/quit":
                        break
                    continue
                state.running += 1
                runs.start_soon(follow, agent.loop.start(text, session_id=session_id))
