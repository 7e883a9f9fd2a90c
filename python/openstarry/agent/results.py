"""How a run ends, and who waits for it.

:class:`RunResult` is what :meth:`ExecutionLoop.ask
<openstarry.agent.loop.ExecutionLoop.ask>` returns; :class:`PendingRun` is what
:meth:`~openstarry.agent.loop.ExecutionLoop.start` returns. :class:`Waiters`
keeps the runs someone waits for, by the id of their input event, until each
has ended: every input that is waited for is finished exactly once (completed,
failed, stopped, or refused before it ran), so no waiter hangs and nothing is
kept after the wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from openstarry.bus import Signal, signal_factory
from openstarry.core import Event

__all__ = ["PendingRun", "RunResult", "Waiters", "add_usage", "wakeup_factory"]


#: The loop's one-shot signal for the running backend: the bus's own.
wakeup_factory = signal_factory


@dataclass(slots=True)
class RunResult:
    """How one input ended, for :meth:`ExecutionLoop.ask <openstarry.agent.loop.ExecutionLoop.ask>`.

    Attributes:
        trace_id: The ``traceId`` shared by the run's events.
        replies: The text of each ``OUTPUT:AGENT_MESSAGE`` of the run, in order.
        stopped: The run was cancelled by ``/stop``, ``/reset`` or ``/quit``.
        error: The ``KERNEL:ERROR`` payload that ended the run, if one did.
        usage: The ``metadata.usage`` of every provider response of the run,
            added up (numbers summed, objects merged), or ``None`` when no
            provider reported any. It counts responses that only called tools,
            which publish no ``OUTPUT:AGENT_MESSAGE``.
    """

    trace_id: str
    replies: list[str] = field(default_factory=list)
    stopped: bool = False
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """The replies joined by newlines."""
        return "\n".join(self.replies)


def add_usage(total: dict[str, Any] | None, usage: Mapping[str, Any]) -> dict[str, Any]:
    """``usage`` added into ``total``: numbers summed, objects merged, anything else the latest."""
    result = dict(total or {})
    for key, value in usage.items():
        old = result.get(key)
        kind = type(value)
        if kind is int or kind is float:  # the common case, without the checks below
            summable = isinstance(old, (int, float)) and not isinstance(old, bool)
            result[key] = old + value if summable else value
        elif isinstance(value, bool) or not isinstance(value, (int, float, Mapping)):
            result[key] = value
        elif isinstance(value, Mapping):
            result[key] = add_usage(old if isinstance(old, dict) else None, value)
        elif isinstance(old, (int, float)) and not isinstance(old, bool):
            result[key] = old + value
        else:
            result[key] = value
    return result


class Waiters:
    """The results of the inputs someone waits for, and the signal that ends each wait."""

    __slots__ = ("_done", "_results")

    def __init__(self) -> None:
        self._results: dict[str, RunResult] = {}
        self._done: dict[str, Signal] = {}

    def add(self, event_id: str, result: RunResult, done: Signal | None) -> None:
        """Fill ``result`` for that input; ``done`` is set when it ends (``None``:
        the caller serves the run itself and needs no waking)."""
        self._results[event_id] = result
        if done is not None:
            self._done[event_id] = done

    def result(self, event_id: str) -> RunResult | None:
        """The result being filled for that input, if someone waits for it."""
        return self._results.get(event_id)

    def finish(self, event_id: str) -> None:
        """The input's run has ended: wake its waiter and forget it (the waiter holds both)."""
        self._results.pop(event_id, None)
        done = self._done.pop(event_id, None)
        if done is not None:
            done.set()

    def stop(self, event_id: str) -> None:
        """The input was dropped before it ran (``/stop``): its result says stopped."""
        result = self._results.get(event_id)
        if result is not None:
            result.stopped = True
        self.finish(event_id)

    def forget(self, event_id: str) -> None:
        self._results.pop(event_id, None)
        self._done.pop(event_id, None)

    def stop_all(self) -> None:
        """The loop is leaving: every wait ends, a run that had not ended as stopped."""
        for event_id, result in self._results.items():
            done = self._done.get(event_id)
            if done is None or not done.is_set():
                result.stopped = True  # (one served by its asker has no signal)
        for done in self._done.values():
            done.set()
        self._done.clear()
        self._results.clear()

    def __len__(self) -> int:
        """Inputs waited for (each holds a result and a signal until it ends)."""
        return max(len(self._results), len(self._done))


class PendingRun:
    """An input published by :meth:`ExecutionLoop.start
    <openstarry.agent.loop.ExecutionLoop.start>`; :meth:`wait` for its result."""

    __slots__ = (
        "_done",
        "_publish",
        "_published",
        "_waiters",
        "abandoned",
        "event",
        "keep",
        "result",
    )

    def __init__(
        self,
        event: Event,
        done: Signal,
        waiters: Waiters,
        publish: Callable[[Event], Awaitable[object]],
    ) -> None:
        self.event = event
        self.result = RunResult(event.trace_id)
        self._done = done
        self._waiters = waiters
        self._publish = publish
        self._published = True
        #: While true, a :meth:`wait` that is cancelled leaves the run waited
        #: for, so another task can wait for it later (a run that waits for
        #: its client across requests).
        self.keep = False
        #: Called when the input is given up before it reached the bus (its
        #: wait for room was cancelled): a stateless run forgets its session.
        self.abandoned: Callable[[], None] | None = None

    @property
    def ended(self) -> bool:
        """Whether the run has ended (completed, failed, stopped, refused): its result is final."""
        return self._done.is_set()

    async def wait(self) -> RunResult:
        """Wait until the run has ended (completed, failed or stopped) and return its result.

        An input the bus had no room for when it was started is published
        here first, once there is room.
        """
        try:
            if not self._published:
                await self._publish_unless_done()
            await self._done.wait()
        finally:
            if not self.keep or self._done.is_set():
                self._waiters.forget(self.event.id)
                if not self._published and self.abandoned is not None:
                    self.abandoned()
        return self.result

    async def _publish_unless_done(self) -> None:
        """Wait for room on the bus, unless the run ends first (the loop leaves)."""
        async with anyio.create_task_group() as task_group:

            async def publish() -> None:
                await self._publish(self.event)
                self._published = True
                task_group.cancel_scope.cancel()

            async def ended() -> None:
                await self._done.wait()
                task_group.cancel_scope.cancel()

            task_group.start_soon(publish)
            task_group.start_soon(ended)
