"""The pure-Python baseline of the bus figures: what a bus in plain asyncio looks like."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Callable

from openstarry.core import Event

__all__ = ["PurePythonBus"]


class PurePythonBus:
    """The baseline: what a bus in plain asyncio looks like."""

    def __init__(self, window: int = 100_000) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, Event]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._seen: set[str] = set()
        self._order: deque[str] = deque()
        self._window = window
        self._handlers: dict[str, list[Callable[[Event], None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, event_type: str, handler: Callable[[Event], None]) -> None:
        self._handlers.setdefault(event_type, []).append(handler)

    def publish(self, event: Event) -> bool:
        event_id = event.id
        if event_id in self._seen:
            return False
        self._seen.add(event_id)
        self._order.append(event_id)
        if len(self._order) > self._window:
            self._seen.discard(self._order.popleft())
        self._queue.put_nowait((event.priority, next(self._seq), event))
        return True

    async def _dispatch(self) -> None:
        while True:
            _, _, event = await self._queue.get()
            for handler in self._handlers.get(event.type, ()):
                handler(event)

    async def __aenter__(self) -> PurePythonBus:
        self._task = asyncio.get_running_loop().create_task(self._dispatch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_idle(self) -> None:
        while not self._queue.empty():
            await asyncio.sleep(0)
        await asyncio.sleep(0)
