"""A griffe extension: openstarry's docstrings, written for readers of the source, as Markdown.

The docstrings are Google style with a few reStructuredText habits that read
well in a terminal (``help()``, an editor's hover) but that Markdown does not
know: cross-reference roles (``:class:`~openstarry.bus.EventBus```) and
paragraphs that end in ``::`` before an indented literal block. This extension
rewrites those two, and nothing else, before mkdocstrings renders a docstring:
a role becomes inline code of the name it shows (the last dotted part after
``~``), and a closing ``::`` becomes ``:`` (the indented block that follows is
already a Markdown code block).

It also reads the ``#:`` comments above a module's or class's attribute (Sphinx's
doc-comments, as ``_core.pyi`` and ``events.py`` write them) as that attribute's
docstring, when it has none.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

# :class:`~a.b.C`, :meth:`C.m`, :data:`X`, :mod:`a.b`, :attr:`x <a.b.x>`, ...
_ROLE = re.compile(r":(?:py:)?[a-z]+:`(?P<text>[^`]+)`")


def _role_text(match: re.Match[str]) -> str:
    text = match.group("text")
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<[^>]+>", text)
    if explicit:
        text = explicit.group("title")
    elif text.startswith("~"):
        text = text[1:].rpartition(".")[2]
    return f"`{text}`"


def markdown_of(docstring: str) -> str:
    """``docstring`` with its reStructuredText roles and ``::`` markers made Markdown."""
    text = _ROLE.sub(_role_text, docstring)
    lines = []
    for line in text.split("\n"):
        stripped = line.rstrip()
        if stripped.endswith("::"):
            head = stripped[:-2].rstrip()
            # "Example::" reads "Example:"; a line of "::" alone disappears.
            line = f"{head}:" if head else ""
        lines.append(line)
    return "\n".join(lines)


# An attribute's line: `NAME: type`, `NAME = value`, `NAME: type = value`.
_ATTRIBUTE = re.compile(r"^\s*[A-Za-z_]\w*\s*(?::|=)")


def doc_comment(lines: list[str], lineno: int) -> str | None:
    """The ``#:`` comment lines above line ``lineno`` (from 1), joined; ``None`` if none.

    A comment above a group of attributes, with no blank line between them,
    documents each (``#: Highest and lowest priorities`` above two constants).
    """
    found: list[str] = []
    index = lineno - 2
    while index >= 0 and _ATTRIBUTE.match(lines[index]):
        index -= 1
    while index >= 0 and lines[index].strip().startswith("#:"):
        found.append(lines[index].strip()[2:].strip())
        index -= 1
    return "\n".join(reversed(found)) or None


class RestToMarkdown(griffe.Extension):
    """Rewrites each docstring once the object tree is built; reads ``#:`` doc-comments."""

    def __init__(self) -> None:
        super().__init__()
        self._sources: dict[Path, list[str]] = {}

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        path = attr.filepath
        if not isinstance(path, Path) or not path.is_file():
            return
        if path not in self._sources:
            self._sources[path] = path.read_text(encoding="utf-8").split("\n")
        comment = doc_comment(self._sources[path], attr.lineno)
        if comment is not None:
            attr.docstring = griffe.Docstring(comment, lineno=attr.lineno, parent=attr)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
