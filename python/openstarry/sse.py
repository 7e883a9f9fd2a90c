"""Server-sent events read from a byte stream, as the HTML standard defines them.

One reader for both ends of openstarry that consume a ``text/event-stream``:
the HTTP providers (an LLM API's streamed answer) and the Agent API client
(an openstarry server's events). Each wraps it to raise its own exception
and pick its own bounds; neither has a parser of its own.

Rules the reader keeps:

- **Bytes to text.** The stream is UTF-8, the only encoding the format has;
  an invalid sequence becomes U+FFFD, a code point split across two chunks is
  read whole, and a byte order mark is dropped at the start of the stream
  (and only there).
- **Lines.** A line ends at CRLF, LF or CR, and at nothing else. Not
  ``str.splitlines``, which httpx's ``iter_lines`` follows: it also breaks at
  U+2028, U+2029, U+0085 and a few control characters, which JSON leaves raw
  inside strings, and so would cut an event that carries one in two. A CRLF
  split across two chunks ends one line, not two, so a CR that ends a chunk
  is held back until the next chunk (or :meth:`LineReader.close`) shows
  whether an LF follows.
- **Fields.** A line starting with ``:`` is a comment. Otherwise the field's
  name is what comes before the first ``:`` (the whole line without one) and
  its value what comes after, less one leading space. ``data`` lines add to
  the event's data, joined by LF; ``event`` names the event (empty means
  unnamed); ``id`` sets the last event id, which stays for the events after
  it, unless the value holds a NUL; ``retry`` and unknown fields are ignored
  (neither end reconnects on the server's schedule). A blank line dispatches
  the event, unless it had no ``data`` line. An event still open when the
  stream ends is dropped, as is an unfinished last line.
- **Bounds.** A line longer than ``max_line`` characters, and an event whose
  data (with the LFs that join its lines) grows past ``max_event``, raise the
  error its owner chose, as soon as the excess is read: an endless line does
  not fill memory before it is refused.
- **Linear time.** An unfinished line is kept in the pieces it came in and
  joined once, when it ends: a 4 MiB line in 1,460-byte chunks costs what the
  same bytes as short lines cost (``benches/test_bench_linear.py`` measures
  both in one run).

This module imports nothing of openstarry, so every layer may use it.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

__all__ = [
    "MAX_EVENT",
    "MAX_LINE",
    "EventParser",
    "LineReader",
    "SSEReader",
    "ServerSentEvent",
]

#: The longest line read by default, in characters.
MAX_LINE: Final = 4 * 1024 * 1024
#: The most data one event may carry by default, in characters.
MAX_EVENT: Final = 8 * 1024 * 1024

#: What a reader raises for a stream beyond its bounds: called with the message.
ErrorFactory = Callable[[str], Exception]

#: The line ends of server-sent events: CRLF, CR or LF, and nothing else.
_LINE_END: Final = re.compile(r"\r\n|\r|\n")


class ServerSentEvent(NamedTuple):
    """One dispatched event.

    Attributes:
        data: The ``data`` lines, joined by LF.
        event: The ``event`` field, or ``None`` when the event has none (or an empty one).
        id: The last event id the stream set, at this event or before it; ``None`` before any.
    """

    data: str
    event: str | None = None
    id: str | None = None


class LineReader:
    """Splits a stream's bytes into lines (see the module's rules).

    Args:
        max_line: The longest line, in characters.
        error: Makes the exception raised for a line beyond the bound.

    Raises:
        Exception: what ``error`` makes, from :meth:`feed` or :meth:`close`, for a line
            longer than ``max_line``.
    """

    __slots__ = ("_cr", "_decoder", "_error", "_pending", "_pending_size", "max_line")

    def __init__(self, max_line: int = MAX_LINE, *, error: ErrorFactory = ValueError) -> None:
        self.max_line = max_line
        self._error = error
        # utf-8-sig drops a byte order mark at the start, even one split across chunks.
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        # The unfinished last line, in the pieces it came in: joined once it ends,
        # so a long line arriving in many chunks is read in linear time.
        self._pending: list[str] = []
        self._pending_size = 0
        # The text read ended in CR: the line before it is in _pending, and an LF
        # at the start of the next chunk belongs to the same line end.
        self._cr = False

    def feed(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes, in order, without their ends."""
        return self._split(self._decoder.decode(chunk), final=False)

    def close(self) -> list[str]:
        """The end of the stream: the lines a held-back CR ends (an unfinished line is dropped)."""
        lines = self._split(self._decoder.decode(b"", final=True), final=True)
        self._pending, self._pending_size = [], 0
        return lines

    def _split(self, text: str, *, final: bool) -> list[str]:
        if not (final or self._cr or "\n" in text or "\r" in text):
            # The line goes on: nothing before it needs reading again.
            if text:
                self._pending.append(text)
                self._pending_size += len(text)
                self._check(self._pending_size)
            return []
        if self._cr:
            text = "\r" + text
            self._cr = False
        if self._pending:
            text = "".join(self._pending) + text
        # A CR at the end may be the first half of a CRLF: wait for the next chunk.
        if not final and text.endswith("\r"):
            self._cr = True
            text = text[:-1]
        lines = _LINE_END.split(text)
        rest = lines.pop()
        if lines:
            self._check(max(map(len, lines)))
        self._check(len(rest))
        keep = rest and not final
        self._pending = [rest] if keep else []
        self._pending_size = len(rest) if keep else 0
        return lines

    def _check(self, size: int) -> None:
        if size > self.max_line:
            raise self._error(f"a server-sent event line is longer than {self.max_line} characters")


class EventParser:
    """Turns lines (without their ends) into events (see the module's rules).

    Args:
        max_event: The most data one event may carry, in characters.
        error: Makes the exception raised for an event beyond the bound.

    Attributes:
        last_id: The last event id the stream set (``None`` before any).

    Raises:
        Exception: what ``error`` makes, from :meth:`feed_line` or :meth:`feed_lines`,
            for an event whose data grows past ``max_event``.
    """

    __slots__ = ("_data", "_data_size", "_error", "_event", "last_id", "max_event")

    def __init__(self, max_event: int = MAX_EVENT, *, error: ErrorFactory = ValueError) -> None:
        self.max_event = max_event
        self.last_id: str | None = None
        self._error = error
        self._event: str | None = None
        self._data: list[str] = []
        self._data_size = 0

    def feed_line(self, line: str) -> ServerSentEvent | None:
        """Take one line; the event it dispatches, if it does."""
        events = self.feed_lines((line,))
        return events[0] if events else None

    def feed_lines(self, lines: Iterable[str]) -> list[ServerSentEvent]:
        """Take each of ``lines``; the events they dispatch, in order."""
        # One loop over a chunk's lines, with no call per line: a streamed answer
        # is tens of thousands of one-line events.
        events: list[ServerSentEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(ServerSentEvent("\n".join(data), self._event, self.last_id))
                    data = self._data = []
                    self._data_size = 0
                self._event = None
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data_size += len(value) + 1
                if self._data_size > self.max_event:
                    raise self._error(
                        f"a server-sent event carries more than {self.max_event} characters"
                    )
                data.append(value)
            elif name == "event":
                self._event = value or None
            elif name == "id" and "\0" not in value:
                self.last_id = value
        return events

    def reset(self) -> None:
        """Drop the event being read (the stream ended, or it was dispatched); keep ``last_id``."""
        self._event = None
        self._data = []
        self._data_size = 0


class SSEReader:
    """Server-sent events from a byte stream: a :class:`LineReader` feeding an :class:`EventParser`.

    Args:
        max_line: The longest line, in characters.
        max_event: The most data one event may carry, in characters.
        error: Makes the exception raised for a line or an event beyond its bound.
    """

    __slots__ = ("lines", "parser")

    def __init__(
        self,
        max_line: int = MAX_LINE,
        max_event: int = MAX_EVENT,
        *,
        error: ErrorFactory = ValueError,
    ) -> None:
        self.lines = LineReader(max_line, error=error)
        self.parser = EventParser(max_event, error=error)

    @property
    def last_id(self) -> str | None:
        """The last event id the stream set (``None`` before any)."""
        return self.parser.last_id

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events ``chunk`` completes, in order."""
        return self.parser.feed_lines(self.lines.feed(chunk))

    def close(self) -> list[ServerSentEvent]:
        """The end of the stream: the events its last bytes complete; an open event is dropped."""
        events = self.parser.feed_lines(self.lines.close())
        self.parser.reset()
        return events
