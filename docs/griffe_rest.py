"""A griffe extension: openstarry's docstrings, written for readers of the source, as Markdown.

The docstrings are Google style with a few reStructuredText habits that read
well in a terminal (``help()``, an editor's hover) but that Markdown does not
know: cross-reference roles (``:class:`~openstarry.bus.EventBus```) and
paragraphs that end in ``::`` before an indented literal block. This extension
rewrites those two, and nothing else, before mkdocstrings renders a docstring:
a role becomes inline code of the name it shows (the last dotted part after
``~``), and a closing ``::`` becomes ``:`` (the indented block that follows is
already a Markdown code block).
"""

from __future__ import annotations

import re
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


class RestToMarkdown(griffe.Extension):
    """Rewrites each docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
