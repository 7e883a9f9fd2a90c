"""The replay buffer of one response: its events as SSE frames, for its readers and reconnects.

A run belongs to the server, not to a connection: its events go into a
:class:`ResponseRecord` as SSE frames (``id: <response id>:<seq>``), and every reader,
the first connection or a reconnect with ``Last-Event-ID``, reads them from
there, live until the response ends. The buffer is bounded
(:class:`~openstarry.api.limits.ServerLimits`' ``replay_events`` and
``replay_bytes``) for what it keeps for reconnects, never for a reader that keeps
up: a frame an attached reader has not been sent stays, unless that reader has
fallen ``max_unsent_bytes`` behind. A reconnect asking for frames already
dropped gets :class:`ReaderGone`.

It knows nothing of HTTP: :mod:`openstarry.api.streams` sends its frames on a
connection, :mod:`openstarry.api.runs` fills it from a run.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import anyio

from openstarry.api.models import AgentResponse, Error, RunStatus

if TYPE_CHECKING:
    from openstarry.api.adapter import RunStream
    from openstarry.api.limits import ServerLimits


#: Characters that JSON leaves raw in strings but that line readers built on
#: ``str.splitlines`` (httpx's ``iter_lines``, for one) take for line ends.
_LINE_BREAKERS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _sse_safe(data: str) -> str:
    """``data``, a JSON text, with its U+0085, U+2028 and U+2029 written as ``\\u`` escapes.

    JSON escapes CR and LF, so an event is one ``data:`` line for an SSE reader;
    these three it leaves raw, and a client that splits lines the way
    ``str.splitlines`` does would cut the event in two. Outside strings JSON
    has no such characters, so the escaped text parses to the same value.
    """
    if data.isascii():
        return data
    return data.translate(_LINE_BREAKERS)


class ReaderGone(Exception):
    """The events a reader asked for are no longer in the buffer."""


class ResponseRecord:
    """One response: its events as SSE frames, kept for readers and reconnects."""

    def __init__(self, response_id: str, session_id: str, limits: ServerLimits) -> None:
        self.id = response_id
        self.session_id = session_id
        self._limits = limits
        #: (sequence number, SSE frame), oldest first.
        self.frames: deque[tuple[int, bytes]] = deque()
        self.size = 0
        #: The highest sequence number dropped from the buffer (-1: none).
        self.dropped = -1
        self.last_seq = -1
        self.final: AgentResponse | None = None
        self.done = False
        self.finished_at: float | None = None
        #: Each attached reader's position: the last sequence number it was sent.
        self.cursors: dict[object, int] = {}
        #: Bumped when the last reader leaves: a stale grace timer does nothing.
        self.detach_epoch = 0
        self.run: RunStream | None = None
        self.cancel_requested = False
        #: Stopped to make room for a new run (see ``RunsApi._make_room``).
        self.evicted = False
        #: Why the server stopped the run, for its final event (``None``: it did not).
        self.stop_reason: Error | None = None
        self._changed = anyio.Event()

    @property
    def readers(self) -> int:
        return len(self.cursors)

    def append(self, seq: int, data: str) -> None:
        """Buffer an event; drop the oldest past the bounds.

        Past ``replay_events`` / ``replay_bytes`` the oldest events go, unless an
        attached reader has not been sent them yet: those stay until it has
        (a single event larger than the bounds included: it is sent live, and
        only its replay is refused). A reader more than ``max_unsent_bytes``
        behind is cut off. Nothing is added once the response has ended.
        """
        if self.done:
            return
        frame = f"id: {self.id}:{seq}\ndata: {_sse_safe(data)}\n\n".encode()
        self.frames.append((seq, frame))
        self.size += len(frame)
        self.last_seq = seq
        self.trim()
        self._notify()

    def trim(self) -> None:
        """Drop the oldest events past the bounds that no attached reader still needs."""
        limits = self._limits
        frames = self.frames
        while frames and (len(frames) > limits.replay_events or self.size > limits.replay_bytes):
            old_seq, old = frames[0]
            # A frame a reader still needs stays, unless that reader is so far
            # behind that what it has not been sent passes max_unsent_bytes.
            needed = bool(self.cursors) and old_seq > min(self.cursors.values())
            if needed and self.size - len(old) <= limits.max_unsent_bytes:
                break
            frames.popleft()
            self.size -= len(old)
            self.dropped = old_seq

    def _over_bounds(self) -> bool:
        limits = self._limits
        return len(self.frames) > limits.replay_events or self.size > limits.replay_bytes

    def finish(self) -> None:
        self.done = True
        self.finished_at = time.monotonic()
        self._notify()

    def with_stop_reason(self, response: AgentResponse) -> AgentResponse:
        """``response`` with the server's reason for stopping it as its error, when
        the server stopped it (shutdown, room for a new run) and it ended ``canceled``."""
        if (
            self.stop_reason is None
            or response.status is not RunStatus.Canceled
            or response.error is not None
        ):
            return response
        return response.model_copy(update={"error": self.stop_reason})

    def end_now(self, status: RunStatus, error: Error) -> None:
        """End the response here with a final event of ``status`` (its run is left behind)."""
        if self.done:
            return
        self.final = AgentResponse(
            id=self.id,
            session_id=self.session_id,
            status=status,
            error=error,
            output=[],
            sequence_number=self.last_seq + 1,
        )
        self.append(self.last_seq + 1, self.final.wire_json())
        self.finish()

    def cancel(self) -> None:
        """Stop the run (it ends ``canceled``); before it has opened, as soon as it does."""
        self.cancel_requested = True
        if self.run is not None:
            self.run.cancel()

    async def wait_done(self) -> None:
        """Wait until the response has ended."""
        while not self.done:
            await self._changed.wait()

    def _frames_after(self, seq: int) -> list[tuple[int, bytes]]:
        """The buffered frames after ``seq``, read from the newest back.

        A reader that keeps up needs the newest one or two: reading from the
        newest costs what is new, where a scan from the oldest would cost the
        whole buffer on each event, quadratic over a long run.
        """
        batch: list[tuple[int, bytes]] = []
        for item in reversed(self.frames):
            if item[0] <= seq:
                break
            batch.append(item)
        batch.reverse()
        return batch

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def frames_after(
        self, seq: int, heartbeat: float, reader: object | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The frames after sequence number ``seq``, live until the response ends.

        ``reader``, an attached reader's token, has its position kept up to date.

        Raises:
            ReaderGone: a frame after ``seq`` has been dropped from the buffer (also
                raised while streaming, when a slow reader falls that far behind).
        """
        while True:
            changed = self._changed
            if seq < self.dropped:
                raise ReaderGone(
                    f"events after {seq} of {self.id} are no longer buffered "
                    f"(the oldest kept is {self.dropped + 1})"
                )
            batch = self._frames_after(seq)
            if batch:
                for s, frame in batch:
                    yield frame
                    seq = s
                    if reader is not None and reader in self.cursors:
                        self.cursors[reader] = s
                if reader is not None and self._over_bounds():
                    self.trim()  # what only this reader still needed can go now
                continue
            if self.done:
                return
            with anyio.move_on_after(heartbeat) as scope:
                await changed.wait()
            if scope.cancelled_caught:
                yield b": keep-alive\n\n"
