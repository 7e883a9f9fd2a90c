"""The plain ``openstarry run`` prompt (no ``[cli]`` extra) in a real pseudo-terminal.

The program runs with ``prompt_toolkit`` made unimportable, as after a plain
``pip install openstarry``; its output is read as a screen (pyte). Every wait
is bounded by ``HANG``; nothing asserts on time. The key handling itself is
tested without a terminal in ``test_plain_prompt.py``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pty_terminal import EXAMPLE, ROOT, Terminal

pytest.importorskip("pexpect", reason="pexpect is in requirements-dev.txt")
pytest.importorskip("pyte", reason="pyte is in requirements-dev.txt")

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="pexpect.spawn needs a POSIX pseudo-terminal"
)

#: ``openstarry run MANIFEST`` as it runs without the [cli] extra.
WITHOUT_CLI = (
    "import sys; sys.modules['prompt_toolkit'] = None\n"
    "from openstarry.cli import main\n"
    "sys.exit(main(['run', sys.argv[1]]))\n"
)


def _env(data_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_DATA_HOME": str(data_home),
        "TERM": "xterm-256color",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }


def _prompt_ready(lines: list[str]) -> bool:
    """The [cli] hint is shown, and the prompt below it."""
    return any("openstarry[cli]" in line for line in lines) and ">" in lines


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    started: list[Terminal] = []

    def spawn(manifest: Path = EXAMPLE) -> Terminal:
        argv = [sys.executable, "-c", WITHOUT_CLI, str(manifest)]
        terminal = Terminal(argv, _env(tmp_path / "data"))
        started.append(terminal)
        terminal.wait(_prompt_ready, "the plain prompt and the [cli] hint")
        return terminal

    yield spawn
    for terminal in started:
        terminal.close()


def test_a_typed_line_appears_once_and_the_next_prompt_stays_out_of_the_output(
    start: Callable[..., Terminal],
) -> None:
    """Issue 29: the plain prompt showed the line twice (``> …`` then ``you> …``) and
    drew the next ``>`` inside the agent's output (``agent> Sure, let me check.>``)."""
    terminal = start()
    terminal.send("What's the weather in Paris?\r")
    lines = terminal.wait_text("The weather in Paris is 13°C, Rainy.")
    assert [line for line in lines if "What's the weather" in line] == [
        "> What's the weather in Paris?"
    ], terminal.dump()
    assert not any(line.startswith("you>") for line in lines), terminal.dump()
    assert [line for line in lines if "agent>" in line] == [
        "agent> Sure, let me check.",
        "agent> The weather in Paris is 13°C, Rainy.",
    ], terminal.dump()
    # The fresh prompt is the line being edited, below the answer.
    terminal.wait(lambda _: terminal.input_line() == ">", "the next prompt")
    assert terminal.screen.cursor.y > lines.index("agent> The weather in Paris is 13°C, Rainy.")
    assert terminal.leave() == 0


def test_output_during_a_turn_lands_above_the_line_being_typed(
    start: Callable[..., Terminal], gated_manifest: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    terminal = start(gated_manifest)
    terminal.send(f"/wait_for {gate}\r")
    terminal.wait_text("-> wait_for")
    terminal.send("hello wor")
    terminal.wait(lambda _: terminal.input_line() == "> hello wor", "the half-typed line")
    gate.touch()
    lines = terminal.wait_text("gate opened")
    result = next(line for line in lines if "gate opened" in line)
    assert result == "  <- wait_for: gate opened", terminal.dump()
    # The line being typed is intact, below the output, and still editable.
    terminal.wait(lambda _: terminal.input_line() == "> hello wor", "the line redrawn")
    assert lines.index(result) < terminal.screen.cursor.y
    terminal.send("ld\r")
    terminal.wait_text("> hello world")
    assert terminal.leave() == 0


def test_tab_completes_a_tool_command_instead_of_inserting_spaces(
    start: Callable[..., Terminal],
) -> None:
    terminal = start()
    terminal.send("/get_\t")
    terminal.wait(lambda _: terminal.input_line() == "> /get_weather", "/get_weather completed")
    terminal.send(" Taipei\r")
    terminal.wait_text('"summary": "25°C, Sunny"')
    assert terminal.leave() == 0


def test_editing_keys_and_the_lines_of_this_run(start: Callable[..., Terminal]) -> None:
    terminal = start()
    terminal.send("/get_weather Taipei\r")
    terminal.wait_text('"summary": "25°C, Sunny"')
    terminal.send("\x1b[A")  # Up: the line sent last
    terminal.wait(lambda _: terminal.input_line() == "> /get_weather Taipei", "the recalled line")
    # Backspace six times, then Left twice and a character in the middle.
    terminal.send("\x7f" * 6 + "Pais\x1b[D\x1b[Dr")
    terminal.wait(lambda _: terminal.input_line() == "> /get_weather Paris", "the edited line")
    assert terminal.screen.cursor.x == len("> /get_weather Par")
    terminal.send("\x15")  # Ctrl-U: everything before the cursor goes
    terminal.wait(lambda _: terminal.input_line() == "> is", "the line cut")
    terminal.send("\x01/get_weather Par\r")  # Ctrl-A, then the rest
    terminal.wait_text('"summary": "13°C, Rainy"')
    assert terminal.leave() == 0


def test_a_line_wider_than_the_terminal_scrolls_and_is_sent_whole(
    start: Callable[..., Terminal],
) -> None:
    terminal = start()
    words = " ".join(f"w{i:03d}" for i in range(40))  # 159 characters, in 100 columns
    terminal.send(f"/get_weather {words}")
    terminal.wait(lambda _: terminal.input_line().endswith("w039"), "the end of the long line")
    shown = terminal.input_line()
    assert shown.startswith("> "), terminal.dump()
    assert len(shown) < 100, terminal.dump()
    terminal.send("\r")
    terminal.wait_text("  <- get_weather")
    # The sent line is on the screen once, whole (wrapped by the terminal).
    screen = "".join(terminal.screen.display)
    assert screen.count(f"> /get_weather {words}") == 1, terminal.dump()
    assert terminal.leave() == 0


def test_ctrl_c_stops_a_slow_tool_and_the_prompt_stays_usable(
    start: Callable[..., Terminal], gated_manifest: Path, tmp_path: Path
) -> None:
    terminal = start(gated_manifest)
    terminal.send(f"/wait_for {tmp_path / 'never'}\r")
    terminal.wait_text("-> wait_for")
    terminal.send("\x03")  # Ctrl-C
    terminal.wait_text("agent> Stopped.")
    terminal.send("/get_weather Taipei\r")
    terminal.wait_text('"summary": "25°C, Sunny"')
    assert not any("never opened" in line for line in terminal.lines())
    assert terminal.leave() == 0


def test_two_ctrl_c_on_an_empty_line_leave_and_the_terminal_is_restored(tmp_path: Path) -> None:
    # A shell runs the program, then prints the terminal's settings once it left.
    program = shlex.join([sys.executable, "-c", WITHOUT_CLI, str(EXAMPLE)])
    terminal = Terminal(
        [
            "/bin/sh",
            "-c",
            f"stty -a | tr ' ' '\\n' | grep -x -e -icanon -e -echo -e -isig;"
            f" {program}; echo exit=$?; stty -a",
        ],
        _env(tmp_path / "data"),
    )
    try:
        terminal.wait(_prompt_ready, "the plain prompt")
        before = terminal.lines()
        terminal.send("\x03")
        terminal.wait_text("(Ctrl-C again or Ctrl-D to leave)")
        terminal.send("\x03")
        assert terminal.wait_end() == 0
        lines = terminal.lines()
        assert "exit=0" in lines, terminal.dump()
        settings = " ".join(lines[lines.index("exit=0") :]).split()
        assert {"icanon", "echo", "isig"} <= set(settings), terminal.dump()
        assert not {"-icanon", "-echo", "-isig"} & set(settings), terminal.dump()
        assert not {"-icanon", "-echo", "-isig"} & set(before), "the terminal was raw already"
    finally:
        terminal.close()
