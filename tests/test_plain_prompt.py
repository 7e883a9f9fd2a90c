"""The plain prompt's parts without a terminal: keys, the line editor, drawing, output.

The prompt at a real terminal is tested in ``test_plain_prompt_pty.py``.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from openstarry.cli.prompt import (
    KeyDecoder,
    LineEditor,
    Screen,
    _Output,
    display_width,
    render,
    usable,
)


def test_keys_come_out_whole_however_the_bytes_are_cut() -> None:
    data = "a€\x1b[Ab\x1b[3~\x1bOH\x1b[1;5C\r".encode()
    whole = KeyDecoder().feed(data)
    assert whole == ["a", "€", "up", "b", "delete", "home", "word-right", "enter"]
    for size in (1, 2, 3):
        decoder = KeyDecoder()
        keys: list[str] = []
        for i in range(0, len(data), size):
            keys += decoder.feed(data[i : i + size])
        assert keys == whole, size


def test_control_keys_are_named_and_unknown_ones_dropped() -> None:
    keys = KeyDecoder().feed(b"\t\x7f\x08\x01\x05\x03\x04\x15\x0b\x17\x0c\x1a\x07\x1b[99zq\x1bx")
    assert keys == [
        "tab",
        "backspace",
        "backspace",
        "home",
        "end",
        "ctrl-c",
        "ctrl-d",
        "kill-start",
        "kill-end",
        "kill-word",
        "clear",
        "suspend",
        "q",  # BEL and an unknown CSI sequence are dropped, never inserted
        "x",  # Alt+x: the ESC is dropped
    ]


def test_bytes_that_are_not_utf8_become_a_replacement_character() -> None:
    assert KeyDecoder().feed(b"a\xffb") == ["a", "\ufffd", "b"]


def test_the_editor_inserts_deletes_and_moves_by_character_and_word() -> None:
    editor = LineEditor()
    editor.insert("hello big world")
    assert editor.key("word-left")
    assert editor.cursor == len("hello big ")
    editor.key("kill-word")
    assert (editor.text, editor.cursor) == ("hello world", len("hello "))
    editor.key("backspace")
    editor.key("left")
    editor.key("delete")
    assert editor.text == "hellworld"
    editor.key("home")
    editor.key("kill-end")
    assert (editor.text, editor.cursor) == ("", 0)
    editor.key("backspace")  # at the start: nothing to delete
    assert editor.text == ""
    assert not editor.key("no-such-key")


def test_history_recalls_lines_and_keeps_the_draft() -> None:
    editor = LineEditor()
    for line in ("one", "two", "two", "  "):
        editor.insert(line)
        assert editor.accept() == line
    assert editor.history == ["one", "two"]  # no repeat, no blank line
    editor.insert("draft")
    editor.key("up")
    assert editor.text == "two"
    editor.key("up")
    editor.key("up")
    assert (editor.text, editor.cursor) == ("one", 3)
    editor.key("down")
    editor.key("down")
    assert editor.text == "draft"


def test_tab_completes_a_name_or_its_common_start_and_lists_the_rest() -> None:
    editor = LineEditor(names=lambda: ["get_weather", "fs.read", "fs.write", "help"])
    editor.insert("/get")
    assert editor.complete() == []
    assert editor.text == "/get_weather"
    editor.clear()
    editor.insert("/fs")
    assert editor.complete() == []
    assert editor.text == "/fs."  # extended to the common start first,
    assert editor.complete() == ["fs.read", "fs.write"]  # then the candidates listed
    assert editor.text == "/fs."
    editor.clear()
    for line in ("hello", "/get_weather Tai", "//x", "/nothing"):
        editor.insert(line)
        assert editor.complete() == []
        assert editor.text == line
        editor.clear()


def test_the_line_scrolls_sideways_and_never_wraps() -> None:
    text = "x" * 50 + "界" * 30  # 110 columns of text
    line, start = render("> ", text, len(text), 40, 0)
    shown = line.split("> ", 1)[1].split("\r", 1)[0]
    assert display_width("> " + shown) <= 39
    assert shown.endswith("界")  # the cursor's end is in view
    assert line.startswith("\r\x1b[K> ")
    assert line.endswith(f"\r\x1b[{2 + display_width(shown)}C")
    # Back at the start, the view follows the cursor.
    line, start = render("> ", text, 0, 40, start)
    assert start == 0
    assert line.split("> ", 1)[1].startswith("x" * 20)
    assert line.endswith("\r\x1b[2C")
    assert render("", "", 0, 40, 0)[0] == "\r\x1b[K\r"


class _Tty(io.StringIO):
    def __init__(self, tty: bool = True) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def fileno(self) -> int:
        return 0


def test_output_is_drawn_above_the_line_being_typed() -> None:
    out = _Tty()
    screen = Screen("> ", stdin=_Tty(), stdout=out)
    screen.editor.insert("half")
    screen.draw()
    stream: Any = _Output(screen, out)
    stream.write("agent> Sure")
    assert out.getvalue() == "\r\x1b[K> half\r\x1b[6C"  # a partial line waits
    stream.write(", let me check.\nmore")
    stream.flush()
    assert out.getvalue() == (
        "\r\x1b[K> half\r\x1b[6C"
        "\r\x1b[Kagent> Sure, let me check.\n\r\x1b[K> half\r\x1b[6C"
        "\r\x1b[Kmore\n\r\x1b[K> half\r\x1b[6C"
    )
    screen.hide()
    stream.write("after\n")
    assert out.getvalue().endswith("\r\x1b[Kafter\n")


def test_usable_only_with_a_terminal_at_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    expected = sys.platform != "win32"
    assert usable(_Tty(), _Tty()) is expected
    assert not usable(_Tty(False), _Tty())
    assert not usable(_Tty(), _Tty(False))
    monkeypatch.setenv("TERM", "dumb")
    assert not usable(_Tty(), _Tty())
