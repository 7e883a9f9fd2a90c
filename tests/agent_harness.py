"""A running bus and execution loop that records every event, for the agent tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, RunResult
from openstarry.bus import EventBus
from openstarry.core import Event

#: A bound on any one wait, so that a broken loop fails a test instead of hanging it.
HANG = 5


class Echo(Tool):
    """An async tool with one untyped parameter ``x``; returns its arguments."""

    name = "echo"

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"x": {}}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return args


@dataclass
class Harness:
    """The bus, the loop, and every event dispatched so far, in order."""

    bus: EventBus
    loop: ExecutionLoop
    events: list[Event]

    async def ask(self, line: str, session_id: str = "s") -> RunResult:
        """One turn, then wait until the bus has dispatched all it caused."""
        with anyio.fail_after(HANG):
            result = await self.loop.ask(line, session_id=session_id)
            await self.bus.wait_idle()
        return result

    async def publish(self, event: Event) -> None:
        with anyio.fail_after(HANG):
            await self.bus.apublish(event)
            await self.bus.wait_idle()

    def trace(self, trace_id: str) -> list[Event]:
        return [e for e in self.events if e.trace_id == trace_id]

    def of(self, event_type: str, trace_id: str | None = None) -> list[Event]:
        return [
            e
            for e in self.events
            if e.type == event_type and (trace_id is None or e.trace_id == trace_id)
        ]


@asynccontextmanager
async def running(
    provider: Any,
    tools: Iterable[Tool] | Mapping[str, Tool] = (),
    *,
    capacity: int | None = 65536,
    **options: Any,
) -> AsyncIterator[Harness]:
    """A bus of ``capacity`` and an ``ExecutionLoop(bus, provider, tools, **options)``."""
    async with EventBus(capacity=capacity) as bus:
        events: list[Event] = []
        bus.subscribe("*", events.append)
        async with ExecutionLoop(bus, provider, tools, **options) as loop:
            yield Harness(bus, loop, events)
