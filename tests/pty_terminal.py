"""A program in a real pseudo-terminal (pexpect), read as a screen (pyte).

Shared by the prompt's terminal tests (``test_terminal_pty.py`` for the
``[cli]`` prompt, ``test_plain_prompt_pty.py`` for the plain one). Every wait
is bounded by ``HANG``; nothing asserts on time.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "weather-agent" / "agent.json"
#: A bound on any one wait, so a broken prompt fails a test instead of hanging it.
HANG = 20.0
ROWS, COLS = 30, 100


def openstarry_command() -> list[str]:
    """The ``openstarry`` script beside this Python, or ``python -m openstarry.cli``."""
    script = shutil.which("openstarry", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "openstarry.cli"]


class Terminal:
    """A program in a pseudo-terminal, its output fed to a terminal emulator."""

    def __init__(
        self, argv: list[str], env: dict[str, str], rows: int = ROWS, cols: int = COLS
    ) -> None:
        # Imported here: a module that uses this one skips itself when they are missing.
        pexpect: Any = importlib.import_module("pexpect")
        pyte: Any = importlib.import_module("pyte")
        self._pexpect = pexpect
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.Stream(self.screen)
        self.raw = ""
        self.child = pexpect.spawn(
            argv[0], argv[1:], env=env, dimensions=(rows, cols), encoding="utf-8", timeout=HANG
        )

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def dump(self) -> str:
        return "\n".join(f"|{line}" for line in self.lines())

    def _pump(self) -> bool:
        try:
            chunk = self.child.read_nonblocking(65536, timeout=0.1)
        except self._pexpect.TIMEOUT:
            return True
        except self._pexpect.EOF:
            return False
        self.raw += chunk
        self.stream.feed(chunk)
        return True

    def wait(self, check: Callable[[list[str]], bool], what: str) -> list[str]:
        deadline = time.monotonic() + HANG
        while not check(self.lines()):
            alive = self._pump()
            if not alive and not check(self.lines()):
                pytest.fail(f"the program ended before {what}:\n{self.dump()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {HANG} s:\n{self.dump()}")
        return self.lines()

    def wait_text(self, text: str) -> list[str]:
        return self.wait(lambda lines: any(text in line for line in lines), repr(text))

    def input_line(self) -> str:
        """The line the cursor is on: the one being edited."""
        row: int = self.screen.cursor.y
        return self.lines()[row]

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def wait_end(self) -> int:
        """The exit status once the program ended (fails the test past ``HANG``)."""
        deadline = time.monotonic() + HANG
        while self._pump():
            if time.monotonic() > deadline:
                self.child.kill(9)
                pytest.fail(f"the program did not end:\n{self.dump()}")
        self.child.close()
        status: int = self.child.exitstatus
        return status

    def leave(self) -> int:
        """Ctrl-D, then the exit status once the program ended."""
        self.send("\x04")
        return self.wait_end()

    def close(self) -> None:
        if self.child.isalive():
            self.child.kill(9)
        self.child.close(force=True)
