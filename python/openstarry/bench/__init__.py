"""``openstarry bench``: the agent layer's speed beside pure-Python baselines, in one process.

``openstarry bench latency`` is the dispatch-latency benchmark: open loop at
fixed arrival rates, percentiles to p99.99 from an HDR histogram, JSON and a
plot (:mod:`openstarry.bench.latency`). ``openstarry bench bus`` and
``openstarry bench loop`` print the figures below (plain ``openstarry bench``
prints them all), on asyncio:

- **bus latency**: the time from ``publish`` to the start of the handler, one
  event at a time (the publisher yields until the handler has run), as p50 and
  p99. The baseline is the usual pure-Python bus: an ``asyncio.PriorityQueue``
  of ``(priority, sequence, event)``, a set and a deque for de-duplication, and a
  dispatcher task routing by type.
- **bus throughput**: a burst of events published without yielding, then
  dispatched, per second; same baseline.
- **loop overhead per turn**: one user turn through the execution loop with a
  provider that answers at once and one no-op tool call: two provider calls,
  one tool call, and the turn's eleven events through the bus. The baseline is
  the same three calls made directly, with no events, so the difference is
  what the loop adds. On asyncio, and on trio when it is installed.
- **turn cost against the sessions kept**: the same turn, each in a new
  session, with the session table full (100 to 100,000 sessions), so every
  turn forgets the least recently used one: the cost stays flat.

Timings vary with the machine and its load; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import time
from collections.abc import Sequence
from typing import Any

import anyio

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, LoopLimits
from openstarry.agent.memory import Session
from openstarry.bench.baseline import PurePythonBus
from openstarry.bus import EventBus
from openstarry.core import ContentSegment, Event, ProviderResponse, ToolCall

__all__ = [
    "PurePythonBus",
    "bench_bus_latency",
    "bench_bus_throughput",
    "bench_loop_turn",
    "bench_turn_vs_sessions",
    "describe_extension",
    "extension_build",
    "run",
]

_perf_ns = time.perf_counter_ns


def _percentiles(samples: list[int]) -> dict[str, float]:
    ordered = sorted(samples)
    n = len(ordered)
    return {
        "p50_us": ordered[n // 2] / 1000,
        "p99_us": ordered[min(n - 1, int(n * 0.99))] / 1000,
        "max_us": ordered[-1] / 1000,
    }


def _events(n: int) -> list[Event]:
    return [Event.new("BENCH:PING", None, source="bench", session_id="s") for _ in range(n)]


async def _latency(bus: Any, n: int, warmup: int) -> list[int]:
    samples: list[int] = []
    sent = [0]

    def handler(event: Event) -> None:
        samples.append(_perf_ns() - sent[0])

    bus.subscribe("BENCH:PING", handler)
    for i, event in enumerate(_events(n + warmup)):
        if i == warmup:
            samples.clear()
        expected = len(samples) + 1
        sent[0] = _perf_ns()
        bus.publish(event)
        while len(samples) < expected:
            await asyncio.sleep(0)
    if len(samples) != n:
        raise AssertionError(f"{len(samples)} of {n} events reached the handler")
    return samples


def bench_bus_latency(n: int = 20_000, warmup: int = 1_000) -> dict[str, dict[str, float]]:
    """Publish-to-handler latency of :class:`EventBus` and of the pure-Python bus."""

    async def ours() -> list[int]:
        async with EventBus() as bus:
            return await _latency(bus, n, warmup)

    async def baseline() -> list[int]:
        async with PurePythonBus() as bus:
            return await _latency(bus, n, warmup)

    return {
        "openstarry": _percentiles(asyncio.run(ours())),
        "baseline": _percentiles(asyncio.run(baseline())),
    }


async def _burst(bus: Any, n: int) -> float:
    count = [0]

    def handler(event: Event) -> None:
        count[0] += 1

    bus.subscribe("BENCH:PING", handler)
    events = _events(n)
    start = _perf_ns()
    for event in events:
        bus.publish(event)
    await bus.wait_idle()
    elapsed = _perf_ns() - start
    if count[0] != n:
        raise AssertionError(f"{count[0]} of {n} events reached the handler")
    return n / (elapsed / 1e9)


def bench_bus_throughput(n: int = 100_000) -> dict[str, float]:
    """Events per second through publish and dispatch: :class:`EventBus` and the pure-Python bus."""

    async def ours() -> float:
        async with EventBus(capacity=None) as bus:
            return await _burst(bus, n)

    async def baseline() -> float:
        async with PurePythonBus() as bus:
            return await _burst(bus, n)

    return {"openstarry": asyncio.run(ours()), "baseline": asyncio.run(baseline())}


class _NoOp(Tool):
    name = "noop"
    description = "Does nothing."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return None


class _Instant:
    """A provider that answers at once: a tool call on round 1, text on round 2."""

    name = "instant"

    def __init__(self) -> None:
        self._call = ProviderResponse(
            [ContentSegment("tool_call", tool_call=ToolCall("noop", {}, "call_1"))]
        )
        self._done = ProviderResponse([ContentSegment("text", text="done")])

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        return self._call if context.round == 1 else self._done


def bench_loop_turn(
    n: int = 2_000, warmup: int = 200, backend: str = "asyncio"
) -> dict[str, float]:
    """Time per user turn: through :class:`ExecutionLoop`, and the same calls made directly."""
    tool = _NoOp()
    provider = _Instant()

    async def ours() -> float:
        async with EventBus() as bus, ExecutionLoop(bus, provider, [tool], memory_window=4) as loop:
            for _ in range(warmup):
                await loop.ask("ping", session_id="bench")
            await bus.wait_idle()
            start = _perf_ns()
            for _ in range(n):
                result = await loop.ask("ping", session_id="bench")
            await bus.wait_idle()
            elapsed = _perf_ns() - start
            if result.replies != ["done"] or result.error is not None:
                raise AssertionError(f"unexpected turn result {result}")
            return elapsed / n / 1000

    async def direct() -> float:
        context = AgentContext({"noop": tool}, Session("bench"))
        start = _perf_ns()
        for _ in range(n):
            context.round = 1
            first = await provider.generate("ping", context)
            call = first.segments[0].tool_call
            assert call is not None
            await tool.run(tool.validate(call.args), context)
            context.round = 2
            await provider.generate("ping", context)
        return (_perf_ns() - start) / n / 1000

    ours_us: float = anyio.run(ours, backend=backend)
    direct_us: float = anyio.run(direct, backend=backend)
    return {"turn_us": ours_us, "direct_us": direct_us, "overhead_us": ours_us - direct_us}


def bench_turn_vs_sessions(
    counts: Sequence[int] = (100, 1_000, 10_000, 100_000), n: int = 1_000
) -> dict[int, float]:
    """Microseconds per turn, each in a new session, with ``count`` sessions kept (a full table).

    Every turn makes a session and so forgets the least recently used one.
    """
    tool = _NoOp()
    provider = _Instant()

    async def one(count: int) -> float:
        limits = LoopLimits(max_sessions=count)
        async with (
            EventBus() as bus,
            ExecutionLoop(bus, provider, [tool], memory_window=4, limits=limits) as loop,
        ):
            for index in range(count):
                loop.session(f"kept-{index}")
            for index in range(n // 10):
                await loop.ask("ping", session_id=f"warm-{index}")
            await bus.wait_idle()
            start = _perf_ns()
            for index in range(n):
                result = await loop.ask("ping", session_id=f"new-{index}")
            await bus.wait_idle()
            elapsed = _perf_ns() - start
            if result.replies != ["done"] or result.error is not None:
                raise AssertionError(f"unexpected turn result {result}")
            if len(loop.sessions) != count:
                raise AssertionError(f"{len(loop.sessions)} sessions kept, not {count}")
            return elapsed / n / 1000

    return {count: anyio.run(one, count) for count in counts}


def _print_bus(scale: int) -> None:
    latency = bench_bus_latency(20_000 // scale, 1_000 // scale)
    ours, base = latency["openstarry"], latency["baseline"]
    print("bus latency, publish to handler (asyncio):")
    for key in ("p50_us", "p99_us"):
        print(
            f"  {key[:3]}: openstarry {ours[key]:6.2f} us   pure Python {base[key]:6.2f} us"
            f"   ratio {base[key] / ours[key]:.2f}x"
        )
    throughput = bench_bus_throughput(100_000 // scale)
    print(
        f"bus throughput: openstarry {throughput['openstarry'] / 1e6:.2f} M events/s"
        f"   pure Python {throughput['baseline'] / 1e6:.2f} M events/s"
        f"   ratio {throughput['openstarry'] / throughput['baseline']:.2f}x"
    )


def _print_loop(scale: int) -> None:
    backends = ["asyncio"] + (["trio"] if importlib.util.find_spec("trio") else [])
    for backend in backends:
        turn = bench_loop_turn(2_000 // scale, 200 // scale, backend)
        print(
            f"loop turn on {backend} (2 provider calls, 1 tool call, 11 events): "
            f"{turn['turn_us']:.1f} us   direct calls {turn['direct_us']:.1f} us"
            f"   overhead {turn['overhead_us']:.1f} us"
        )
    per_count = bench_turn_vs_sessions(n=1_000 // scale)
    print("loop turn in a new session with the session table full (asyncio):")
    smallest = min(per_count.values())
    for count, turn_us in per_count.items():
        print(f"  {count:>7,} sessions: {turn_us:7.1f} us   {turn_us / smallest:.2f}x the cheapest")


def extension_build(filename: str | None = None) -> str:
    """Which build of the Rust extension a file is: ``"abi3"`` or ``"version-specific"``.

    Told from the file's name (by default the loaded extension's), as the
    interpreter tells which file it can load: ``_core.abi3.so`` (Linux, macOS)
    or ``_core.pyd`` (Windows) is the stable-ABI build, one file for every
    CPython >= 3.10 (``make wheel``, the fallback wheel); a name that carries
    one CPython's tag, ``_core.cpython-311-x86_64-linux-gnu.so`` or
    ``_core.cp311-win_amd64.pyd``, is the version-specific build (``make dev``,
    ``make wheel-version``, the wheels pip picks on CPython 3.10 to 3.14),
    which reads lists, tuples and reference counts inline.
    """
    if filename is None:
        from openstarry import _core

        filename = _core.__file__
    name = os.path.basename(filename)
    return "abi3" if name.endswith(".abi3.so") or name == "_core.pyd" else "version-specific"


def describe_extension() -> str:
    """One line: the loaded extension's build and file (``make bench`` prints it)."""
    from openstarry import _core

    name = os.path.basename(_core.__file__)
    return f"openstarry extension: {extension_build(name)} build ({name})"


def run(args: argparse.Namespace) -> int:
    """Run what the parsed ``openstarry bench`` command line asks for; returns the exit status.

    ``args.figures`` is ``"latency"``, ``"bus"``, ``"loop"``, or ``None`` for
    the bus and loop figures together.
    """
    figures = getattr(args, "figures", None)
    if figures == "latency":
        from openstarry.bench.command import run_latency

        return run_latency(args)
    scale = 10 if getattr(args, "quick", False) else 1
    print(describe_extension())
    if figures in (None, "bus"):
        _print_bus(scale)
    if figures in (None, "loop"):
        _print_loop(scale)
    return 0
