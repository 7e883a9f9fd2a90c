"""The ``[cli]`` extra's ``openstarry run`` prompt in a real pseudo-terminal (pexpect), read as
a screen (pyte); the plain prompt's tests are in ``test_plain_prompt_pty.py``.

Every wait is bounded by ``HANG``; nothing asserts on time. Each test keeps its
history in its own data folder (``XDG_DATA_HOME``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pty_terminal import EXAMPLE, HANG, ROOT, Terminal, openstarry_command

pexpect = pytest.importorskip("pexpect", reason="pexpect is in requirements-dev.txt")
pyte = pytest.importorskip("pyte", reason="pyte is in requirements-dev.txt")
pytest.importorskip("prompt_toolkit", reason="the [cli] extra is in requirements-dev.txt")

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="pexpect.spawn needs a POSIX pseudo-terminal"
)


@pytest.fixture
def data_home(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def start(data_home: Path) -> Iterator[Callable[..., Terminal]]:
    started: list[Terminal] = []

    def spawn(manifest: Path = EXAMPLE, **extra_env: str) -> Terminal:
        env = {
            **{k: v for k, v in os.environ.items() if k != "NO_COLOR"},
            "XDG_DATA_HOME": str(data_home),
            "TERM": "xterm-256color",
            "PROMPT_TOOLKIT_NO_CPR": "1",  # pexpect does not answer cursor-position requests
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
            **extra_env,
        }
        terminal = Terminal([*openstarry_command(), "run", str(manifest)], env)
        started.append(terminal)
        terminal.wait(lambda lines: any(line.startswith(">") for line in lines), "prompt")
        return terminal

    yield spawn
    for terminal in started:
        terminal.close()


def test_a_typed_line_appears_once(start: Callable[..., Terminal]) -> None:
    terminal = start()
    terminal.send("Query weather in Taipei\r")
    lines = terminal.wait_text("The weather in Taipei is 25°C, Sunny.")
    assert [line for line in lines if "Query weather in Taipei" in line] == [
        "> Query weather in Taipei"
    ]
    assert not any(line.startswith("you>") for line in lines)
    assert terminal.leave() == 0


def test_output_during_a_turn_lands_above_the_line_being_typed(
    start: Callable[..., Terminal], gated_manifest: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    terminal = start(gated_manifest)
    terminal.send(f"/wait_for {gate}\r")
    terminal.wait_text("→ wait_for")
    terminal.send("hello wor")
    terminal.wait(lambda _: terminal.input_line() == "> hello wor", "the half-typed line")
    gate.touch()
    lines = terminal.wait_text("gate opened")
    result = next(line for line in lines if "gate opened" in line)
    assert result.startswith("  ← wait_for"), terminal.dump()
    assert "hello" not in result
    assert ">" not in result.replace("←", "")
    # The line being typed is intact, below the output, and still editable.
    terminal.wait(lambda _: terminal.input_line() == "> hello wor", "the line redrawn")
    assert lines.index(result) < terminal.screen.cursor.y
    terminal.send("ld\r")
    terminal.wait_text("> hello world")
    assert terminal.leave() == 0


def test_history_recalls_the_previous_runs_input(
    start: Callable[..., Terminal], data_home: Path
) -> None:
    first = start()
    first.send("/get_weather Taipei\r")
    first.wait_text("25°C")
    assert first.leave() == 0
    assert (data_home / "openstarry" / "history" / "weather-agent").is_file()

    second = start()
    second.send("\x1b[A")  # the Up arrow
    second.wait(lambda _: second.input_line() == "> /get_weather Taipei", "the recalled line")
    second.send("\r")
    second.wait(
        lambda lines: sum("25°C" in line for line in lines) == 1, "the recalled line's answer"
    )
    assert second.leave() == 0


def test_tab_completes_a_tool_command(start: Callable[..., Terminal]) -> None:
    terminal = start()
    terminal.send("/get_\t")
    terminal.wait(lambda _: terminal.input_line() == "> /get_weather", "/get_weather completed")
    terminal.send(" Taipei\r")
    terminal.wait_text("25°C, Sunny")
    assert terminal.leave() == 0


def test_tab_completes_a_path_inside_the_allowed_folder(start: Callable[..., Terminal]) -> None:
    terminal = start()
    terminal.send("/read no\t")
    terminal.wait(lambda _: terminal.input_line() == "> /read notes.txt", "notes.txt completed")
    terminal.send("\r")
    terminal.wait_text("Trip to Taipei")
    assert terminal.leave() == 0


def test_ctrl_c_stops_a_slow_tool_and_the_prompt_stays_usable(
    start: Callable[..., Terminal], gated_manifest: Path, tmp_path: Path
) -> None:
    terminal = start(gated_manifest)
    terminal.send(f"/wait_for {tmp_path / 'never'}\r")
    terminal.wait_text("→ wait_for")
    terminal.send("\x03")  # Ctrl-C
    terminal.wait_text("Stopped.")
    terminal.send("/get_weather Taipei\r")
    terminal.wait_text("25°C, Sunny")
    assert not any("never opened" in line for line in terminal.lines())
    assert terminal.leave() == 0


def test_two_ctrl_c_on_an_empty_line_leave(start: Callable[..., Terminal]) -> None:
    terminal = start()
    terminal.send("\x03")
    terminal.wait_text("Ctrl-C again")
    terminal.send("\x03")
    deadline = time.monotonic() + HANG
    while terminal._pump():
        assert time.monotonic() < deadline, terminal.dump()
    terminal.child.close()
    assert terminal.child.exitstatus == 0
