"""Following sessions' partitions outside the consumer group: the events of runs that
any worker of the group may be running, for the process that published their inputs
and waits for their answers (``openstarry serve`` beside ``openstarry worker`` s).

A consumer group hands each partition's entries to the one consumer that owns it, so a
process that publishes an input whose partition another worker owns never sees that
run's events through the group. The follower reads them as ``openstarry tail`` does
(``XREAD``, no group, no acknowledgement): each followed partition's streams from the
moment it was first followed, one read for all of them (a blocking read on one server,
polled on a cluster), every event handed to the partition's followers. A partition is
read only while someone follows one of its sessions.

Its reads see only what was committed: a run's events arrive together, with the
commit of its input, in order within each stream (and a reply that names every
stream with room to spare, ``caught_up``, holds all of a commit it holds any of).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from openstarry.bus.redis.keys import partition_of
from openstarry.bus.redis.reader import ERRORS, parse_entry_id, read_ends, read_new
from openstarry.bus.redis.state import Streams, log
from openstarry.core import Event, decode_event
from openstarry.errors import DecodeError, QueueClosed

__all__: list[str] = []

#: Seconds one read waits for entries: a partition followed meanwhile joins the next.
_WAIT = 0.2

#: Entries read from one stream per read.
_PAGE = 512

#: ``handler(events, caught_up)``: a read's events of the partition, in stream order.
FollowHandler = Callable[[list[Event], bool], None]


class Follower:
    """The partitions followed, their cursors, and the task that reads them."""

    __slots__ = ("cursors", "handlers", "streams", "wake")

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        #: Each followed partition's followers.
        self.handlers: dict[int, list[FollowHandler]] = {}
        #: The last entry read of each followed stream.
        self.cursors: dict[str, str] = {}
        self.wake = anyio.Event()

    @asynccontextmanager
    async def follow(self, session_id: str, handler: FollowHandler) -> AsyncIterator[None]:
        """Hand ``handler`` every event committed in ``session_id``'s partition from now
        on, until the context is left. Whatever is published after entering is seen."""
        streams = self.streams
        if streams._client is None:
            raise QueueClosed("the Redis bus is not running: use `async with bus`")
        partition = partition_of(session_id, streams.partitions)
        keys = streams.layout.streams(partition)
        if partition not in self.handlers:
            ends = await streams._retrying(lambda: read_ends(streams._client, keys))
            for key, end in ends.items():
                # Followed meanwhile by another: the earlier cursor serves both.
                self.cursors.setdefault(key, end)
        self.handlers.setdefault(partition, []).append(handler)
        self.wake.set()
        try:
            yield
        finally:
            followers = self.handlers.get(partition)
            if followers is not None:
                followers.remove(handler)
                if not followers:
                    del self.handlers[partition]
                    for key in keys:
                        self.cursors.pop(key, None)

    async def run(self) -> None:
        """Read the followed partitions until the backend stops."""
        streams = self.streams
        while not streams._stopping:
            if not self.cursors:
                self.wake = anyio.Event()
                await self.wake.wait()
                continue
            cursors = dict(self.cursors)
            full: set[str] = set()
            try:
                entries = await read_new(streams._client, cursors, _WAIT, page=_PAGE, full=full)
            except ERRORS as exc:
                log.warning("redis: following: %s; reading again", exc)
                await anyio.sleep(0.2)
                continue
            for key, cursor in cursors.items():
                now = self.cursors.get(key)
                if now is not None and parse_entry_id(cursor) > parse_entry_id(now):
                    self.cursors[key] = cursor
            self._hand_out(entries, full)

    def _hand_out(self, entries: list[tuple[str, bytes]], full: set[str]) -> None:
        streams = self.streams
        by_partition: dict[int, list[Event]] = {}
        for _, wire in entries:
            try:
                event = decode_event(wire)
            except DecodeError:
                continue  # the consumers dead-letter it; no follower waits for it
            partition = partition_of(event.session_id, streams.partitions)
            by_partition.setdefault(partition, []).append(event)
        layout = streams.layout
        for partition, followers in list(self.handlers.items()):
            events = by_partition.get(partition, [])
            # Each of its streams returned less than a page: the read holds all that was
            # committed there before it, so a commit it holds any of, it holds whole.
            caught_up = full.isdisjoint(layout.streams(partition))
            for handler in list(followers):
                handler(events, caught_up)
