"""How the offline provider reads a prompt: clauses into requests (weather, read, list, write).

:class:`~openstarry.providers.default.DefaultProvider` asks :func:`parse` for
the requests in a prompt and decides what to do with them (which tool, what
to answer); this module only reads. The prompt is split into clauses (never
inside quotes), each clause matched against the patterns of one kind of
request, and a clause with no request of its own may continue the one before
it. Every pattern is bounded so a hostile prompt costs linear time:
:data:`MAX_REQUEST_CHARS` caps what is read at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["GREETING", "MAX_REQUEST_CHARS", "Request", "parse"]

#: Longer prompts are not parsed for requests (they get the fallback reply): the
#: patterns may take time quadratic in the length of what they scan.
MAX_REQUEST_CHARS: Final = 1000


@dataclass(frozen=True, slots=True)
class Request:
    """One recognised request: its kind and its arguments (by canonical name)."""

    kind: str
    args: Mapping[str, str]

    @property
    def complete(self) -> bool:
        """Whether every argument but a text to write is there and not empty."""
        return bool(self.args.get("location" if self.kind == "weather" else "path"))


# --- the patterns -------------------------------------------------------------------------
#
# The prompt is split into clauses at "and", "then", ";", "&" and sentence ends
# (never inside quotes), and each clause is matched against the patterns of one
# kind of request. A clause with no request of its own may continue the one
# before it: "weather in Taipei and in Tokyo", "read a.txt and b.txt".

_I = re.IGNORECASE
_QUOTED_RE = r"\"[^\"]*\"|(?<!\w)'[^']*'(?!\w)|`[^`]*`|“[^”]*”"
_QUOTED = re.compile(_QUOTED_RE)
_PATH = rf"(?:{_QUOTED_RE}|\S+)"
# Single characters and lookarounds only, so a long run of spaces costs linear time;
# the clauses are stripped afterwards ("and then" leaves an empty one, dropped).
_SEPARATOR = re.compile(r";|&|(?<!\S)(?:and|then)(?!\S)|(?<=[.!?])\s", _I)
_LEADING_FILLER = re.compile(
    r"^(?:(?:please|pls|and|also|then|now|ok|okay|so|hey|hi|hello)\b[\s,]*"
    r"|(?:can|could|would|will)\s+you\s+(?:please\s+)?"
    r"|i(?:'d|\s+would)\s+like\s+(?:you\s+)?to\s+|i\s+want\s+(?:you\s+)?to\s+)",
    _I,
)
_TRAILING_WORD = re.compile(r"(?<![^\s,])(?:please|pls|thanks|thank\s+you|for\s+me)$", _I)
_TRAILING_CHARS = " \t\r\n.?!,;:"
_TRAILING_TIME = re.compile(
    r"(?:\s+(?:for\s+)?(?:today|tomorrow|tonight|now|right\s+now|currently|"
    r"this\s+(?:morning|afternoon|evening|week|weekend)|at\s+the\s+moment|please))+$",
    _I,
)
#: A prompt that starts with a greeting: the fallback reply says hello back.
GREETING = re.compile(r"^(?:hi|hello|hey|good\s+(?:morning|afternoon|evening))\b", _I)

_WEATHER_WORD = re.compile(r"\b(?:weather|forecast|temperature)\b", _I)
_WEATHER_PREPOSITION = re.compile(
    r"\b(?:weather|forecast|temperature)\b.*?\b(?:in|for|of)\s+(?P<loc>.+)$", _I
)
_WEATHER_SUFFIX = re.compile(
    r"^(?:(?:what's|whats|what\s+is|how's|hows|how\s+is|show(?:\s+me)?|get|check|"
    r"tell\s+me|give\s+me|query|look\s+up)\s+)?(?:the\s+)?(?:current\s+)?"
    r"(?P<loc>.+?)(?:'s)?\s+(?:weather|forecast|temperature)"
    r"(?:\s+(?:forecast|report|like|now|today))*$",
    _I,
)
_NOT_A_PLACE = frozenset(
    {
        "what",
        "what's",
        "whats",
        "how",
        "how's",
        "hows",
        "is",
        "the",
        "a",
        "tell",
        "show",
        "get",
        "check",
        "give",
        "me",
        "it",
        "query",
        "current",
        "today",
        "tomorrow",
        "now",
    }
)

_WRITE = (
    re.compile(
        rf"^(?:write|save|put|store)\s+(?P<content>{_QUOTED_RE}|.+?)\s+(?:to|into|in)\s+"
        rf"(?:the\s+)?(?:file\s+)?(?P<path>{_PATH})$",
        _I,
    ),
    re.compile(
        rf"^write\s+(?:to\s+)?(?:the\s+)?(?:file\s+)?(?P<path>{_PATH})\s*:\s*(?P<content>.+)$",
        _I,
    ),
    re.compile(
        rf"^(?:create|make)\s+(?:a\s+|the\s+)?(?:new\s+)?(?:file\s+)?(?:called\s+|named\s+)?"
        rf"(?P<path>{_PATH})\s+(?:with|containing|saying)\s+(?:the\s+)?(?:content\s+|text\s+)?"
        rf"(?P<content>.+)$",
        _I,
    ),
)
_WRITE_VERB = re.compile(r"^(?:write|save|put|store|create|make)\b", _I)

_LISTING = r"(?:files|entries|contents|directory|dir|folder|everything)"
_WHERE = r"(?:\s+(?:in|of|under|inside|from)\s+(?P<path>.+?))?"
_LIST = (
    re.compile(rf"^(?:ls|dir)(?:\s+(?P<path>{_PATH}))?$", _I),
    re.compile(
        rf"^list(?:\s+(?:all\s+)?(?:of\s+)?(?:the\s+)?{_LISTING}"
        rf"(?:\s+and\s+(?:folders|directories|dirs))?)?{_WHERE}$",
        _I,
    ),
    re.compile(rf"^list\s+(?:the\s+)?(?P<path>{_PATH})$", _I),
    re.compile(
        rf"^(?:show|display|get|give)(?:\s+me)?\s+(?:all\s+)?(?:of\s+)?(?:the\s+)?"
        rf"(?:files|entries|directory\s+listing|listing){_WHERE}$",
        _I,
    ),
    re.compile(r"^(?:what|which)\s+files\b.*?(?:\b(?:in|under|inside)\s+(?P<path>.+?))?$", _I),
)
_WHATS_IN = re.compile(
    rf"^(?:what's|whats|what\s+is)\s+(?:(?:in|inside)\s+(?:the\s+)?(?P<path>{_PATH}|.+)|(?P<here>here|there))$",
    _I,
)
_READ = (
    re.compile(
        rf"^(?:read|cat|open)\s+(?:me\s+)?(?:the\s+)?(?:contents?\s+of\s+)?(?:the\s+)?"
        rf"(?:file\s+)?(?P<path>{_PATH})(?:\s+file)?$",
        _I,
    ),
    re.compile(
        rf"^(?:show|display|print|view|get|give)(?:\s+me)?\s+(?:the\s+)?(?:contents?\s+of\s+)?"
        rf"(?:the\s+)?(?P<file>file\s+)?(?P<path>{_PATH})$",
        _I,
    ),
)
_WORKSPACE = frozenset(
    {
        "workspace",
        "my workspace",
        "current directory",
        "current folder",
        "this directory",
        "this folder",
        "here",
        "there",
        "root",
        ".",
        "./",
    }
)
_CONTINUATION_BLOCKLIST = frozenset(
    {
        "tell",
        "what",
        "how",
        "show",
        "please",
        "i",
        "you",
        "can",
        "could",
        "do",
        "give",
        "make",
        "list",
        "read",
        "write",
        "cat",
        "open",
        "also",
        "then",
        "is",
        "are",
        "it",
    }
)


#: How many following clauses the text of one write request may span.
_MAX_MERGED = 8


def parse(prompt: str) -> list[Request]:
    """The requests in ``prompt``, in order (none in a prompt too long to be a request)."""
    if len(prompt) > MAX_REQUEST_CHARS:
        return []
    requests: list[Request] = []
    clauses = _clauses(prompt)
    index = 0
    while index < len(clauses):
        start, end = clauses[index]
        clause = _clean(prompt[start:end])
        # An unquoted text to write may hold a separator: take clauses until the target
        # shows, a few at most (unbounded, a prompt of many "put ;" costs cubic time).
        if _WRITE_VERB.match(clause) and _match_write(clause) is None:
            for later in range(index + 1, min(len(clauses), index + 1 + _MAX_MERGED)):
                merged = _clean(prompt[start : clauses[later][1]])
                if _match_write(merged) is not None:
                    clause, index = merged, later
                    break
        request = _match(clause)
        if request is None and requests:
            request = _continue(requests[-1], clause)
        if request is not None:
            requests.append(request)
        index += 1
    return requests


def _clauses(prompt: str) -> list[tuple[int, int]]:
    """The (start, end) of each clause of ``prompt``, split at separators outside quotes."""
    masked = _QUOTED.sub(
        lambda m: m.group()[0] + "x" * (len(m.group()) - 2) + m.group()[-1], prompt
    )
    spans: list[tuple[int, int]] = []
    start = 0
    for separator in _SEPARATOR.finditer(masked):
        spans.append((start, separator.start()))
        start = separator.end()
    spans.append((start, len(prompt)))
    return [(s, e) for s, e in spans if prompt[s:e].strip()]


#: A quoted text, kept as written, or a run of whitespace, which becomes one space.
_SPACING = re.compile(rf"({_QUOTED_RE})|\s+")


def _clean(clause: str) -> str:
    # One space between words outside quotes: the patterns below stay linear in
    # the length of the clause however the user spaces it.
    clause = _SPACING.sub(lambda m: m.group(1) or " ", clause).strip()
    previous = None
    while previous != clause:
        previous = clause
        clause = _LEADING_FILLER.sub("", clause).strip()
        clause = _TRAILING_WORD.sub("", clause.rstrip(_TRAILING_CHARS)).rstrip(_TRAILING_CHARS)
    return clause


def _match(clause: str) -> Request | None:
    # Files first: "read weather.txt" and 'write "weather" to a.txt' are about files.
    write = _match_write(clause)
    if write is not None:
        return write
    for pattern in _LIST:
        m = pattern.match(clause)
        if m:
            return Request("list", {"path": _directory(m.group("path"))})
    m = _WHATS_IN.match(clause)
    if m:
        path = m.group("path")
        if path is not None and _looks_like_file(path):
            return Request("read", {"path": _unquote(path)})
        return Request("list", {"path": _directory(path)})
    for pattern in _READ:
        m = pattern.match(clause)
        if m and (
            "file" not in pattern.groupindex or m.group("file") or _looks_like_file(m.group("path"))
        ):
            return Request("read", {"path": _unquote(m.group("path"))})
    if _WEATHER_WORD.search(clause):
        return Request("weather", _location(clause))
    return None


def _match_write(clause: str) -> Request | None:
    for pattern in _WRITE:
        m = pattern.match(clause)
        if m:
            return Request(
                "write",
                {"path": _unquote(m.group("path")), "content": _unquote(m.group("content"))},
            )
    return None


def _continue(previous: Request, clause: str) -> Request | None:
    """``clause`` as one more request of ``previous``'s kind: another place, another file."""
    words = clause.split()
    if not words or len(words) > 4:
        return None
    if previous.kind == "weather":
        place = re.sub(r"^(?:in|for|of)\s+", "", clause, flags=_I)
        place = re.sub(r"\s+(?:too|as\s+well|also)$", "", place, flags=_I)
        if place and place.split()[0].lower() not in _CONTINUATION_BLOCKLIST:
            location = _place(place)
            if location:
                return Request("weather", {"location": location})
    if previous.kind == "read" and len(words) == 1 and _looks_like_file(clause):
        return Request("read", {"path": _unquote(clause)})
    return None


def _location(clause: str) -> dict[str, str]:
    trimmed = _TRAILING_TIME.sub("", clause)
    m = _WEATHER_PREPOSITION.search(trimmed)
    if m:
        location = _place(m.group("loc"))
        if location:
            return {"location": location}
    m = _WEATHER_SUFFIX.match(trimmed)
    if m:
        location = _place(m.group("loc"))
        if location and location.split()[0].lower() not in _NOT_A_PLACE:
            return {"location": location}
    return {}


def _place(text: str) -> str:
    text = _TRAILING_TIME.sub("", _unquote(text.strip()))
    previous = None
    while previous != text:  # any whitespace (Unicode too) and punctuation, in any order
        previous = text
        text = text.strip().strip("\"'`“”.,;:!?()[]")
    return text


def _directory(path: str | None) -> str:
    if path is None:
        return "."
    path = _unquote(path.strip())
    path = re.sub(r"^the\s+", "", path, flags=_I)
    path = re.sub(r"\s+(?:folder|directory|dir)$", "", path, flags=_I)
    if path.lower() in _WORKSPACE:
        return "."
    return path.rstrip("/") or "/"


def _looks_like_file(path: str) -> bool:
    path = path.strip()
    if _QUOTED.fullmatch(path):
        return True
    return " " not in path and (
        "/" in path or "\\" in path or re.search(r"\.\w{1,8}$", path) is not None
    )


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and _QUOTED.fullmatch(text):
        return text[1:-1]
    return text
