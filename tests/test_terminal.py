"""openstarry.cli.terminal: the rich output, the completion and the history place of the prompt."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prompt_toolkit", reason="the [cli] extra is in requirements-dev.txt")

from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from rich.console import Console

from openstarry.cli.terminal import RichPrinter, SlashCompleter, history_path
from openstarry.core import Event, decode_event, encode_event
from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA, EventType

COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-7]|38;[0-9;]+|9[0-7])(?:;[0-9;]*)?m")


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _event(kind: str, payload: dict[str, Any], timestamp: int | None = None) -> Event:
    event = Event.new(kind, payload, source="test", session_id="s")
    if timestamp is None:
        return event
    wire = json.loads(encode_event(event))
    wire["timestamp"] = timestamp
    return decode_event(json.dumps(wire).encode())


def _printer(*, colour: bool = True, **kwargs: Any) -> tuple[RichPrinter, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=colour, width=80, highlight=False)
    return RichPrinter(console, **kwargs), out


def test_streamed_text_is_shown_live_then_printed_once_as_markdown() -> None:
    redraws: list[str] = []
    printer, out = _printer(echo_input=False)
    printer.on_stream = lambda: redraws.append(printer.streaming)
    for piece in ("# Title\n\n", "some **bold", "** text"):
        printer(_event(OUTPUT_AGENT_MESSAGE_DELTA, {"text": piece, "round": 1}))
    assert redraws[-1] == "# Title\n\nsome **bold** text"
    assert out.getvalue() == ""  # nothing printed while it streams
    printer(_event(OUTPUT_AGENT_MESSAGE, {"text": "# Title\n\nsome **bold** text", "final": True}))
    text = out.getvalue()
    assert "Title" in text
    assert "**" not in text  # rendered, not raw Markdown
    assert text.count("some") == 1
    assert printer.streaming == ""
    assert redraws[-1] == ""


def test_the_stream_tail_keeps_the_last_lines() -> None:
    printer, _ = _printer(on_stream=lambda: None)
    printer(
        _event(OUTPUT_AGENT_MESSAGE_DELTA, {"text": "\n".join(map(str, range(20))), "round": 1})
    )
    assert printer.stream_tail(3) == "17\n18\n19"


def test_tool_lines_are_dimmed_with_their_duration_and_long_results_cut() -> None:
    printer, out = _printer()
    printer(_event(EventType.TOOL_CALL, {"toolCallId": "c1", "name": "t", "args": {}}, 1_000))
    result = {"toolCallId": "c1", "name": "t", "success": True, "result": "x" * 1000}
    printer(_event(EventType.TOOL_RESULT, result, 1_042))
    text = out.getvalue()
    assert "\x1b[2m" in text  # dim
    plain = _plain(text).replace("\n", "")
    assert "← t 42 ms: " in plain
    assert "(700 more characters)" in plain
    assert "x" * 301 not in plain


def test_errors_are_red_with_their_code_and_counted() -> None:
    printer, out = _printer()
    printer(_event(EventType.ERROR, {"code": "UNKNOWN_COMMAND", "message": "no", "source": "x"}))
    assert printer.errors == 1
    assert COLOUR.search(out.getvalue())
    assert "KERNEL:ERROR" in out.getvalue()
    assert "UNKNOWN_COMMAND: no" in out.getvalue()


def test_no_color_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    printer, out = _printer()
    printer(_event(EventType.ERROR, {"code": "E", "message": "m", "source": "x"}))
    printer(_event(EventType.TOOL_CALL, {"toolCallId": "c", "name": "t", "args": {}}))
    assert "KERNEL:ERROR E: m" in _plain(out.getvalue())
    assert not COLOUR.search(out.getvalue())


def test_metrics_are_a_small_table() -> None:
    printer, out = _printer(colour=False)
    data = {
        "bus": {
            "published": 3,
            "dispatched": {"INPUT:USER_MESSAGE": 2, "KERNEL:TICK_START": 1},
            "depth": [0, 1, 0, 0, 0, 0],
            "latency_us": {"count": 3, "p50": 12.4, "p99": 80.2, "max": 81},
        },
        "loop": {"running": 0, "waiting": 0, "runs_completed": 2},
    }
    payload = {"text": "{...}", "final": True, "metadata": {"command": "metrics", "data": data}}
    printer(_event(OUTPUT_AGENT_MESSAGE, payload))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert any(re.match(r"INPUT:USER_MESSAGE\s+2$", line) for line in lines)
    assert any("p0:0  p1:1" in line for line in lines)
    assert any("p50 12 µs  p99 80 µs" in line for line in lines)
    assert "{" not in out.getvalue()
    assert len(lines) < 10


def test_history_lives_in_the_data_folder_per_agent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert history_path("weather-agent") == tmp_path / "openstarry" / "history" / "weather-agent"
    assert history_path("../a b").parent == tmp_path / "openstarry" / "history"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert history_path("x").parent.parent.parent == Path.home() / ".local" / "share"


def _completions(completer: SlashCompleter, text: str) -> list[str]:
    return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]


def test_completion_of_commands_tools_and_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "a.txt").write_text("a")
    (root / "nothing.md").write_text("b")
    (tmp_path / "outside.txt").write_text("c")
    tools = {"get_weather": object(), "fs.read": object(), "fs.list": object()}
    completer = SlashCompleter(["help", "stop"], lambda: tools, [root])
    assert _completions(completer, "/get_") == ["/get_weather"]
    assert _completions(completer, "/") == [
        "/fs.list",
        "/fs.read",
        "/get_weather",
        "/help",
        "/list",
        "/read",
        "/stop",
    ]
    assert _completions(completer, "/read no") == ["notes/", "nothing.md"]
    assert _completions(completer, "/fs.read notes/") == ["notes/a.txt"]
    assert _completions(completer, "/read path=notes/a") == ["notes/a.txt"]
    assert _completions(completer, "/read ../") == []  # outside the allowed folder
    assert _completions(completer, f"/read {tmp_path}/") == []
    assert _completions(completer, f"/read {root}/no") == [f"{root}/notes/", f"{root}/nothing.md"]
    assert _completions(completer, "/get_weather Tai") == []  # not an fs.* tool
    assert _completions(completer, "plain text") == []
