"""The ``openstarry run`` prompt at a terminal without the ``[cli]`` extra.

Standard library only: the terminal is put in non-canonical mode (``termios``)
and the prompt edits and draws the line itself, so it needs a POSIX terminal
(:func:`usable` says whether this one will do). The ``[cli]`` extra's prompt
(:mod:`openstarry.cli.terminal`) adds a saved history, path completion and
formatted output.

Rules this module keeps:

- The terminal does not echo: the prompt draws the line being typed on the
  last screen line, and when Enter is pressed leaves it there once (the
  session's ``INPUT:USER_MESSAGE`` is then not printed again by the caller).
- Output never lands inside the line being typed: while a :class:`Screen` is
  open, ``sys.stdout`` and ``sys.stderr`` go through it; each complete line
  written is drawn above the input line, which is drawn again below it. A
  partial line waits for its end (or a ``flush``, which ends it).
- The input line is always one screen line: text longer than the terminal is
  wide scrolls sideways, so clearing that line is all a redraw needs.
- The terminal's settings are restored on leaving, whatever the way out, and
  around Ctrl-Z (the shell gets a sane terminal while the program is stopped).

Keys: printable text is inserted; Enter sends the line; Backspace, Delete,
Left, Right, Home, End (and Ctrl-B, Ctrl-F, Ctrl-A, Ctrl-E, Ctrl-H), Ctrl-U,
Ctrl-K and Ctrl-W edit it; Up and Down (Ctrl-P, Ctrl-N) recall the lines of
this run; Tab completes ``/commands`` and tool names (several candidates: the
common start, then the list above the line); Ctrl-L clears the screen. Ctrl-C
and Ctrl-D work as at the ``[cli]`` prompt: Ctrl-C clears a line with text,
stops a running turn, and on an empty line asks before a second one leaves;
Ctrl-D on an empty line leaves. Other control keys and escape sequences are
ignored, never inserted.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import signal
import sys
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

import anyio

try:
    import termios
except ImportError:  # Windows: no termios, the line-at-a-time prompt stays
    termios = None  # type: ignore[assignment]

__all__ = [
    "ASK_LEAVE",
    "STOP",
    "KeyDecoder",
    "LineEditor",
    "Screen",
    "display_width",
    "usable",
]

#: What :meth:`Screen.read_line` returns for Ctrl-C while a turn runs.
STOP = "\x00stop"
#: What it returns for a first Ctrl-C on an empty line with nothing running.
ASK_LEAVE = "\x00ask"

#: Keys as :class:`KeyDecoder` names them (text is passed on as itself).
_CONTROL_KEYS = {
    "\r": "enter",
    "\n": "enter",
    "\x7f": "backspace",
    "\x08": "backspace",
    "\t": "tab",
    "\x01": "home",
    "\x05": "end",
    "\x02": "left",
    "\x06": "right",
    "\x10": "up",
    "\x0e": "down",
    "\x0b": "kill-end",
    "\x15": "kill-start",
    "\x17": "kill-word",
    "\x03": "ctrl-c",
    "\x04": "ctrl-d",
    "\x0c": "clear",
    "\x1a": "suspend",
}
#: Escape sequences (after ``ESC [`` or ``ESC O``) by their parameters and final byte.
_SEQUENCES = {
    "A": "up",
    "B": "down",
    "C": "right",
    "D": "left",
    "H": "home",
    "F": "end",
    "1~": "home",
    "7~": "home",
    "4~": "end",
    "8~": "end",
    "3~": "delete",
    "1;5C": "word-right",
    "1;5D": "word-left",
    "1;3C": "word-right",
    "1;3D": "word-left",
}


def usable(stdin: TextIO | None = None, stdout: TextIO | None = None) -> bool:
    """Whether the plain prompt can run here.

    Both ends must be a terminal, ``termios`` must import (POSIX), and
    ``TERM`` must not be ``dumb`` (a terminal that cannot clear a line).
    """
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    if termios is None or os.environ.get("TERM", "") == "dumb":
        return False
    try:
        return stdin.isatty() and stdout.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def display_width(text: str) -> int:
    """The columns ``text`` takes at a terminal (wide East Asian characters take two)."""
    return sum(_char_width(c) for c in text)


class KeyDecoder:
    """Bytes from a terminal in, keys out: text characters and named keys.

    UTF-8 is decoded incrementally and an escape sequence cut between two reads
    waits for its end, so keys come out whole whatever the reads' sizes.
    """

    def __init__(self, encoding: str = "utf-8") -> None:
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> list[str]:
        """The keys in ``data`` (and in what earlier calls left unfinished)."""
        text = self._pending + self._decoder.decode(data)
        self._pending = ""
        keys: list[str] = []
        i = 0
        while i < len(text):
            char = text[i]
            if char != "\x1b":
                i += 1
                if char in _CONTROL_KEYS:
                    keys.append(_CONTROL_KEYS[char])
                elif char >= " " and char != "\x7f" and not ("\x80" <= char <= "\x9f"):
                    keys.append(char)
                continue
            end = _sequence_end(text, i)
            if end is None:  # cut between reads: wait for the rest
                self._pending = text[i:]
                break
            name = _SEQUENCES.get(text[i + 2 : end]) if end > i + 2 else None
            if name is not None:
                keys.append(name)
            i = end
        return keys


def _sequence_end(text: str, start: int) -> int | None:
    """Where the escape sequence at ``start`` ends (exclusive); ``None`` when cut short."""
    if start + 1 >= len(text):
        return None
    kind = text[start + 1]
    if kind == "O":  # SS3: one more character
        return start + 3 if start + 2 < len(text) else None
    if kind != "[":  # Alt+key or a lone Escape: drop the ESC only
        return start + 1
    for j in range(start + 2, len(text)):
        if "\x40" <= text[j] <= "\x7e":  # a CSI sequence's final byte
            return j + 1
    return None


class LineEditor:
    """The line being typed: its text, the cursor and this run's history.

    Args:
        names: The words Tab completes after ``/`` (read at each Tab).
    """

    def __init__(self, names: Callable[[], Iterable[str]] = lambda: ()) -> None:
        self.names = names
        self.text = ""
        self.cursor = 0
        self.history: list[str] = []
        self._recalled: int | None = None  # the history line shown, None: the draft
        self._draft = ""

    def insert(self, chars: str) -> None:
        self.text = self.text[: self.cursor] + chars + self.text[self.cursor :]
        self.cursor += len(chars)

    def accept(self) -> str:
        """The line as typed; the editor starts a new, empty one."""
        line = self.text
        if line.strip() and (not self.history or self.history[-1] != line):
            self.history.append(line)
        self.text, self.cursor, self._recalled, self._draft = "", 0, None, ""
        return line

    def clear(self) -> None:
        self.text, self.cursor, self._recalled = "", 0, None

    def key(self, key: str) -> bool:
        """Apply an editing key; False when ``key`` is not one."""
        text, cursor = self.text, self.cursor
        if key == "backspace":
            if cursor:
                self.text, self.cursor = text[: cursor - 1] + text[cursor:], cursor - 1
        elif key == "delete":
            self.text = text[:cursor] + text[cursor + 1 :]
        elif key == "left":
            self.cursor = max(cursor - 1, 0)
        elif key == "right":
            self.cursor = min(cursor + 1, len(text))
        elif key == "home":
            self.cursor = 0
        elif key == "end":
            self.cursor = len(text)
        elif key == "word-left":
            self.cursor = _word_start(text, cursor)
        elif key == "word-right":
            self.cursor = _word_end(text, cursor)
        elif key == "kill-start":
            self.text, self.cursor = text[cursor:], 0
        elif key == "kill-end":
            self.text = text[:cursor]
        elif key == "kill-word":
            start = _word_start(text, cursor)
            self.text, self.cursor = text[:start] + text[cursor:], start
        elif key in ("up", "down"):
            self._recall(-1 if key == "up" else 1)
        else:
            return False
        return True

    def _recall(self, step: int) -> None:
        if not self.history:
            return
        at = len(self.history) if self._recalled is None else self._recalled
        at = min(max(at + step, 0), len(self.history))
        if self._recalled is None:
            self._draft = self.text
        if at == len(self.history):
            self.text, self._recalled = self._draft, None
        else:
            self.text, self._recalled = self.history[at], at
        self.cursor = len(self.text)

    def complete(self) -> list[str]:
        """Tab: complete the ``/name`` before the cursor.

        Returns:
            The candidates when several remain after extending to their common
            start (for the caller to list); otherwise an empty list.
        """
        before = self.text[: self.cursor]
        if not before.startswith("/") or before.startswith("//") or " " in before:
            return []
        word = before[1:]
        matches = sorted({n for n in self.names() if n.startswith(word)})
        if not matches:
            return []
        common = matches[0]
        for match in matches[1:]:
            while not match.startswith(common):
                common = common[:-1]
        if len(common) > len(word):
            self.insert(common[len(word) :])
            return []
        return matches if len(matches) > 1 else []


def _word_start(text: str, cursor: int) -> int:
    i = cursor
    while i > 0 and text[i - 1].isspace():
        i -= 1
    while i > 0 and not text[i - 1].isspace():
        i -= 1
    return i


def _word_end(text: str, cursor: int) -> int:
    i = cursor
    while i < len(text) and text[i].isspace():
        i += 1
    while i < len(text) and not text[i].isspace():
        i += 1
    return i


def render(prompt: str, text: str, cursor: int, columns: int, start: int) -> tuple[str, int]:
    """The input line as drawn in ``columns`` columns, and the new scroll start.

    ``start`` is the first character shown last time; it moves just enough to
    keep the cursor on screen. The line fits in ``columns - 1`` columns, so the
    terminal never wraps it.
    """
    room = max(columns - display_width(prompt) - 1, 8)
    start = min(start, cursor)
    while display_width(text[start:cursor]) > room:
        start += 1
    shown, used = [], 0
    for char in text[start:]:
        width = _char_width(char)
        if used + width > room:
            break
        shown.append(char)
        used += width
    column = display_width(prompt) + display_width(text[start:cursor])
    move = f"\r\x1b[{column}C" if column else "\r"
    return f"\r\x1b[K{prompt}{''.join(shown)}{move}", start


class _Output(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a :class:`Screen` is open."""

    def __init__(self, screen: Screen, real: TextIO) -> None:
        self._screen = screen
        self._real = real
        self._partial = ""

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._real.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._real.errors

    def isatty(self) -> bool:
        return self._real.isatty()

    def fileno(self) -> int:
        return self._real.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._screen.lock:
            self._partial += text
            if "\n" in self._partial:
                lines, _, self._partial = self._partial.rpartition("\n")
                self._screen.above(self._real, lines + "\n")
        return len(text)

    def flush(self) -> None:
        with self._screen.lock:
            if self._partial:
                lines, self._partial = self._partial, ""
                self._screen.above(self._real, lines + "\n")
            else:
                self._real.flush()


class Screen:
    """The terminal while the plain prompt is up: raw keys in, the input line drawn last.

    Use :meth:`output` around everything that prints while the prompt is up,
    and :meth:`read_line` to read lines. Nothing is changed at the terminal
    until :meth:`output` is entered, and all is restored when it exits.

    Args:
        prompt: Drawn before the line being typed.
        names: The words Tab completes after ``/``.
        stdin: The terminal's input (default ``sys.stdin``).
        stdout: The terminal's output (default ``sys.stdout``).
    """

    def __init__(
        self,
        prompt: str = "> ",
        *,
        names: Callable[[], Iterable[str]] = lambda: (),
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
    ) -> None:
        self.prompt = prompt
        self.editor = LineEditor(names=names)
        self.lock = threading.RLock()
        self._stdin = stdin if stdin is not None else sys.stdin
        self._stdout = stdout if stdout is not None else sys.stdout
        self._fd = self._stdin.fileno()
        self._decoder = KeyDecoder(getattr(self._stdin, "encoding", None) or "utf-8")
        self._keys: list[str] = []
        self._saved: list[Any] | None = None
        self._showing = False
        self._start = 0
        self._armed = False  # a Ctrl-C on an empty line now leaves
        self._eof = False

    # ------------------------------------------------------------ the terminal

    def _raw(self) -> None:
        assert termios is not None
        mode = termios.tcgetattr(self._fd)
        mode[0] &= ~(termios.IXON | termios.ICRNL | termios.INLCR | termios.IGNCR)
        mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
        mode[6][termios.VMIN] = 1
        mode[6][termios.VTIME] = 0
        termios.tcsetattr(self._fd, termios.TCSADRAIN, mode)

    def _restore(self) -> None:
        if termios is not None and self._saved is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)

    @contextlib.contextmanager
    def output(self) -> Iterator[None]:
        """Take the terminal: keys unechoed, ``sys.stdout``/``sys.stderr`` drawn above the line.

        The input line is drawn by the first :meth:`read_line`; on the way out
        it is cleared and the terminal's settings and streams are restored.
        """
        assert termios is not None, "the plain prompt needs termios (POSIX)"
        self._saved = termios.tcgetattr(self._fd)
        streams = sys.stdout, sys.stderr
        sys.stdout = _Output(self, streams[0])
        sys.stderr = _Output(self, streams[1])
        try:
            self._raw()
            yield
        finally:
            with self.lock:
                for patched in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        patched.flush()
                sys.stdout, sys.stderr = streams
                self.hide()
                self._restore()
                self._saved = None

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self._stdout.fileno()).columns
        except (OSError, ValueError):
            return 80

    def _write(self, text: str) -> None:
        self._stdout.write(text)
        self._stdout.flush()

    def draw(self) -> None:
        """Draw the input line (the prompt, the visible text, the cursor)."""
        with self.lock:
            editor = self.editor
            line, self._start = render(
                self.prompt, editor.text, editor.cursor, self._columns(), self._start
            )
            self._showing = True
            self._write(line)

    def hide(self) -> None:
        """Clear the input line, leaving the cursor at its start."""
        with self.lock:
            if self._showing:
                self._showing = False
                self._write("\r\x1b[K")

    def above(self, stream: TextIO, text: str) -> None:
        """Write ``text`` (whole lines) to ``stream`` above the input line."""
        with self.lock:
            showing = self._showing
            if showing:
                self._stdout.write("\r\x1b[K")
                self._stdout.flush()
            stream.write(text)
            stream.flush()
            if showing:
                self.draw()

    def _suspend(self) -> None:
        """Ctrl-Z: give the shell its terminal back until the program is resumed."""
        if not hasattr(signal, "SIGTSTP"):
            return
        self.hide()
        self._restore()
        os.kill(os.getpid(), signal.SIGTSTP)  # returns once resumed (SIGCONT)
        self._raw()
        self.draw()

    # ------------------------------------------------------------ reading

    async def _next_key(self) -> str | None:
        while not self._keys:
            if self._eof:
                return None
            await anyio.wait_readable(self._fd)
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                continue
            except OSError:  # the terminal went away
                data = b""
            if not data:
                self._eof = True
                return None
            self._keys.extend(self._decoder.feed(data))
        return self._keys.pop(0)

    async def read_line(self, *, running: Callable[[], bool] = lambda: False) -> str | None:
        """The next line typed; ``None`` to leave (Ctrl-D on an empty line, end of input).

        Returns :data:`STOP` for Ctrl-C while ``running()`` (a turn is in
        progress: asked at each Ctrl-C) and :data:`ASK_LEAVE` for a first Ctrl-C on an empty line;
        a second Ctrl-C then leaves. An accepted line stays on the screen after
        the prompt, and a fresh prompt is drawn below it.
        """
        editor = self.editor
        self.draw()
        while True:
            key = await self._next_key()
            if key is None:
                return None
            if key != "ctrl-c":
                self._armed = False
            with self.lock:
                if key == "enter":
                    line = editor.accept()
                    self._start = 0
                    self._write(f"\r\x1b[K{self.prompt}{line}\r\n")
                    self.draw()
                    return line
                if key == "ctrl-c":
                    if editor.text:
                        editor.clear()
                        self._armed = False
                    elif running():
                        self._armed = True
                        return STOP
                    elif self._armed:
                        return None
                    else:
                        self._armed = True
                        return ASK_LEAVE
                elif key == "ctrl-d":
                    if not editor.text:
                        return None
                    editor.key("delete")
                elif key == "tab":
                    candidates = editor.complete()
                    if candidates:
                        self.above(self._stdout, "  ".join(f"/{c}" for c in candidates) + "\n")
                elif key == "clear":
                    self._write("\x1b[H\x1b[2J")
                elif key == "suspend":
                    self._suspend()
                elif len(key) == 1:
                    editor.insert(key)
                else:
                    editor.key(key)
                self.draw()
