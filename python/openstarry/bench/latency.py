"""``openstarry bench latency``: dispatch latency at fixed arrival rates, open loop.

For each rate, events are published on a fixed schedule: event ``i`` is *due*
at ``start + i / rate``. Its latency runs from that intended send time to the
end of its handler, and is recorded in a :class:`~openstarry._core.LatencyRecorder`
(an HDR histogram in Rust; the clock is read in Rust too, in the same call).

**No coordinated omission.** A closed-loop benchmark sends the next event when
the last one is done, so a stall delays the sending and hides itself: the
events that should have been sent during it are never measured. Here the
schedule does not wait. When the sender gets to run late (the dispatcher was
busy, the handler blocked the event loop, the process was descheduled), it
publishes at once every event whose time has come, and each one's latency
still counts from its own intended time, delay included. That is how wrk2 and
HdrHistogram measure servers.

How a run ends: the schedule lasts ``duration`` seconds; then the bus drains.
A run is cut off ``duration + max(duration, 10 s)`` after it began: the events
still waiting then are recorded with the time they had waited so far (their
latency is at least that) and counted as ``unfinished``, and the handler is
not called for them. At most :data:`MAX_BACKLOG` events wait at once (bubus's
own bound is lower): past that the sender waits, and the wait counts in the
latencies.

The buses:

- ``openstarry``: :class:`~openstarry.bus.EventBus`, as users create it (the
  dedup window on);
- ``pure-python``: :class:`~openstarry.bench.PurePythonBus`, the usual asyncio
  bus of a priority queue, a set and a dispatcher task;
- ``bubus``: ``bubus.EventBus`` (installed separately: ``pip install bubus``).

All three run one event's handler at a time: an ``async`` handler is awaited
before the next event is dispatched, so a handler that sleeps 1 ms caps the
bus at about 1,000 events/s whether it calls ``time.sleep`` or awaits
``asyncio.sleep``, and at higher rates the events queue (and their latency
grows with the queue).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio

from openstarry._core import LatencyRecorder
from openstarry.bench.baseline import PurePythonBus
from openstarry.bus import EventBus
from openstarry.core import Event

__all__ = [
    "BUSES",
    "MAX_BACKLOG",
    "BenchError",
    "RateResult",
    "bench_dispatch_latency",
    "format_table",
    "knee",
    "load_handler",
    "results_json",
]

#: The buses a run can measure, as ``--against`` names them.
BUSES = ("openstarry", "pure-python", "bubus")
#: The most events waiting for their handler at once; past it the sender waits.
MAX_BACKLOG = 100_000
#: The highest rate accepted, in events per second.
MAX_RATE = 10_000_000
#: The longest schedule accepted, in seconds.
MAX_DURATION = 3_600.0
#: The latency at which a rate counts as past the knee: 1 ms, in microseconds.
KNEE_US = 1_000.0
#: A run is cut off ``duration + max(duration, MIN_DRAIN_S)`` seconds after it began.
MIN_DRAIN_S = 10.0
#: Events sent and drained before each measured run, not recorded.
WARMUP_EVENTS = 20
#: A handler still running this many seconds after its event (in the warm-up)
#: or after the run's cut-off is taken to never return, and abandoned.
STUCK_S = 5.0

_NS = 1_000_000_000
_TYPE = "BENCH:PING"
#: When the next event is due within this, the sender yields to the event loop
#: until it is; a longer wait is slept, less this margin, as an idle
#: application's event loop sleeps until something arrives. The margin absorbs
#: a timed sleep's overshoot (the selector counts whole milliseconds).
_SPIN_NS = 2_000_000
_PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)


class BenchError(ValueError):
    """A benchmark that cannot run as asked: the message says why."""


Handler = Callable[[Any], Any]


@dataclass
class RateResult:
    """One bus at one rate: what was sent, what was handled, and the latency percentiles.

    Latencies are in microseconds, from each event's intended send time to the
    end of its handler.
    """

    bus: str
    handler: str
    rate_per_s: int
    duration_s: float
    sent: int
    handled: int
    unfinished: int
    errors: int
    achieved_per_s: float
    p50_us: float
    p90_us: float
    p99_us: float
    p99_9_us: float
    p99_99_us: float
    max_us: float
    mean_us: float
    first_error: str | None = None
    #: The lowest rate of this bus's run whose p99 is over 1 ms (``None``: none).
    knee_per_s: int | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        """The result as plain data (one object of ``--json``'s list)."""
        return asdict(self)


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def load_handler(spec: str) -> Handler:
    """The callable named by ``MODULE:FUNCTION`` (``FUNCTION`` may be dotted: ``Class.method``).

    The current directory is searched first, as for ``python -m``. The
    callable must take one positional argument, the event.

    Raises:
        BenchError: a malformed spec, a module that cannot be imported, a
            missing attribute, or something that is not a one-argument callable.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name.strip() or not attribute.strip():
        raise BenchError(
            f"--handler {spec!r}: expected MODULE:FUNCTION, e.g. myapp.handlers:on_ping"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise BenchError(f"--handler {spec!r}: no module named {missing!r}") from None
        raise BenchError(f"--handler {spec!r}: importing {module_name!r} failed: {exc}") from None
    except Exception as exc:
        raise BenchError(
            f"--handler {spec!r}: importing {module_name!r} failed: {_describe(exc)}"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise BenchError(
                f"--handler {spec!r}: {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise BenchError(
            f"--handler {spec!r}: {attribute} is not callable (it is of type "
            f"{type(target).__name__})"
        )
    try:
        inspect.signature(target).bind(None)
    except TypeError:
        raise BenchError(
            f"--handler {spec!r}: {attribute} must take one argument (the event)"
        ) from None
    except ValueError:
        pass  # no signature to check (some builtins): the first call will tell
    return target  # type: ignore[no-any-return]


def _is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (a callable object's async __call__)
    )


class _Run:
    """One measured run's state, shared by the sender and the handler wrapper."""

    def __init__(self, recorder: LatencyRecorder) -> None:
        self.recorder = recorder
        self.intended: deque[int] = deque()
        self.deadline = 2**62
        self.sending_done = False
        self.overdue = False
        self.unfinished = 0
        self.errors = 0
        self.first_error: str | None = None
        self.end_ns = 0
        self.max_backlog = MAX_BACKLOG
        #: A handler never returned: the run was abandoned.
        self.stuck = False
        self.done = asyncio.get_running_loop().create_future()

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = _describe(exc)

    def wrap(self, handler: Handler | None) -> Handler:
        """What the bus calls for each event: the handler, then the recording."""
        pop = self.intended.popleft
        intended = self.intended
        record_since = self.recorder.record_since
        now_ns = LatencyRecorder.now_ns
        run = self

        # The handlers run one at a time, in the order published: the event
        # finishing is the oldest in `intended`, taken off once its handler is
        # done (so that an empty `intended` means nothing is in progress).
        def finish() -> None:
            due = pop()
            if due + record_since(due) > run.deadline and not run.overdue:
                run.overdue = True
            if not intended and run.sending_done and not run.done.done():
                run.end_ns = now_ns()
                run.done.set_result(None)

        if handler is None:

            def on_event(event: Any) -> None:
                if run.overdue:
                    run.unfinished += 1
                finish()

            return on_event

        if _is_async(handler):

            async def on_event_async(event: Any) -> None:
                if run.overdue:
                    run.unfinished += 1
                else:
                    try:
                        await handler(event)
                    except Exception as exc:
                        run.failed(exc)
                finish()

            return on_event_async

        def on_event_sync(event: Any) -> None:
            if run.overdue:
                run.unfinished += 1
            else:
                try:
                    returned = handler(event)
                    if returned is not None and inspect.isawaitable(returned):
                        if inspect.iscoroutine(returned):
                            returned.close()
                        raise TypeError("the handler returned an awaitable: make it an async def")
                except Exception as exc:
                    run.failed(exc)
            finish()

        return on_event_sync


# -- the buses -------------------------------------------------------------


class _AwaitingPurePythonBus(PurePythonBus):
    """:class:`PurePythonBus`, awaiting an async handler before the next event."""

    async def _dispatch(self) -> None:
        while True:
            _, _, event = await self._queue.get()
            for handler in self._handlers.get(event.type, ()):
                returned: Any = handler(event)
                if returned is not None:
                    await returned


Sender = Callable[[], object]


@asynccontextmanager
async def _on_bus(bus: Any, on_event: Handler) -> AsyncIterator[Sender]:
    """The sender of a bus with ``publish`` and ``subscribe``: one new event a call."""
    async with bus:
        bus.subscribe(_TYPE, on_event)
        publish = bus.publish
        new = Event.new

        def send() -> object:
            return publish(new(_TYPE, None, source="bench", session_id="bench"))

        yield send


def _openstarry(on_event: Handler) -> AbstractAsyncContextManager[Sender]:
    # No capacity: the sender keeps the backlog under MAX_BACKLOG itself.
    return _on_bus(EventBus(capacity=None), on_event)


def _pure_python(on_event: Handler) -> AbstractAsyncContextManager[Sender]:
    return _on_bus(_AwaitingPurePythonBus(), on_event)


_bubus_names = itertools.count()


@asynccontextmanager
async def _bubus(on_event: Handler) -> AsyncIterator[Sender]:
    bubus: Any = importlib.import_module("bubus")

    class BenchPing(bubus.BaseEvent[None]):  # type: ignore[misc]
        """The event bubus dispatches (its type is the class name)."""

    bus = bubus.EventBus(name=f"openstarry_bench_{os.getpid()}_{next(_bubus_names)}")
    bus.on("BenchPing", on_event)
    dispatch = bus.dispatch

    def send() -> object:
        return dispatch(BenchPing())

    try:
        yield send
    finally:
        await bus.stop(clear=True)


#: Each bus: how to open it, and the most events it lets wait at once
#: (bubus refuses a dispatch past 50 queued or 100 pending events).
_TARGETS: dict[str, tuple[Callable[[Handler], Any], int]] = {
    "openstarry": (_openstarry, MAX_BACKLOG),
    "pure-python": (_pure_python, MAX_BACKLOG),
    "bubus": (_bubus, 40),
}


def check_bus(name: str) -> None:
    """Raise :class:`BenchError` when the bus ``name`` cannot be measured here."""
    if name not in BUSES:
        raise BenchError(f"unknown bus {name!r}: expected one of {', '.join(BUSES)}")
    if name == "bubus" and importlib.util.find_spec("bubus") is None:
        raise BenchError("--against bubus: bubus is not installed (pip install bubus)")


# -- the progress bar --------------------------------------------------------


class _Progress:
    """A one-line progress bar on a terminal; nothing at all on anything else."""

    WIDTH = 30

    def __init__(self, stream: TextIO | None, total_s: float) -> None:
        self.stream = stream if stream is not None and _isatty(stream) else None
        self.total_s = max(total_s, 1e-9)
        self.done_s = 0.0
        self._next = 0

    def update(self, label: str, run_s: float) -> None:
        """Show ``label`` with ``run_s`` seconds of the current run's schedule done."""
        if self.stream is None:
            return
        now = time.monotonic_ns()
        if now < self._next:
            return
        self._next = now + 100_000_000
        fraction = min(1.0, (self.done_s + run_s) / self.total_s)
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{label:<34} [{bar}] {fraction:4.0%}")
        self.stream.flush()

    def finish_run(self, duration_s: float) -> None:
        self.done_s += duration_s
        self._next = 0

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\r" + " " * (34 + self.WIDTH + 8) + "\r")
            self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


# -- one run -----------------------------------------------------------------


async def _warm_up(run: _Run, send: Sender) -> bool:
    """Send up to :data:`WARMUP_EVENTS` events one at a time, for at most 0.2 s.

    Returns ``False`` when a handler has not returned :data:`STUCK_S` seconds
    after its event was sent.
    """
    now_ns = LatencyRecorder.now_ns
    until = now_ns() + 200_000_000
    for _ in range(WARMUP_EVENTS):
        sent = now_ns()
        run.intended.append(sent)
        send()
        while run.intended:
            if now_ns() - sent > STUCK_S * _NS:
                return False
            await asyncio.sleep(0 if now_ns() - sent < _SPIN_NS else 0.001)
        if now_ns() > until:
            break
    return True


async def _send_and_drain(
    run: _Run, send: Sender, rate: int, duration: float, progress: _Progress, label: str
) -> tuple[int, int]:
    """Send the schedule open loop, then wait until every event is handled or cut off.

    Returns when the schedule began (ns) and how many events were sent. A
    handler still running :data:`STUCK_S` seconds past the run's cut-off is
    abandoned: its event and those behind it count as unfinished, each with
    the latency it had reached (``run.stuck`` says so).
    """
    recorder = run.recorder
    now_ns = LatencyRecorder.now_ns
    intended = run.intended
    append = intended.append
    total = max(1, round(rate * duration))
    duration_ns = int(duration * _NS)
    max_backlog = run.max_backlog
    start = now_ns()
    run.deadline = start + duration_ns + max(duration_ns, int(MIN_DRAIN_S * _NS))
    sent = 0
    # The events handled by the last time any was, and when: a backlog that
    # stays full with none handled for STUCK_S means a handler that never returns.
    handled_before, handled_at = 0, start
    while sent < total and not run.overdue:
        now = now_ns()
        due = min(total, (now - start) * rate // _NS + 1)
        stop = min(due, sent + max_backlog - len(intended))
        while sent < stop:
            append(start + sent * _NS // rate)
            send()
            sent += 1
        progress.update(label, (now - start) / _NS)
        if sent >= total:
            break
        if sent < due:  # the backlog is full: let the bus work
            await asyncio.sleep(0)
            handled = sent - len(intended)
            if handled != handled_before:
                handled_before, handled_at = handled, now
            elif now - handled_at > STUCK_S * _NS:
                break  # nothing handled for that long: the handler is stuck
            continue
        wait = start + sent * _NS // rate - now_ns()
        await asyncio.sleep((wait - _SPIN_NS) / _NS if wait > _SPIN_NS else 0)
    if sent < total:
        # Cut off while sending: the events due but never sent waited this long.
        for i in range(sent, total):
            recorder.record_since(start + i * _NS // rate)
        run.unfinished += total - sent
    run.sending_done = True
    if intended:
        progress.update(f"{label}: draining", duration)
        left_s = (run.deadline - now_ns()) / _NS + STUCK_S
        try:
            await asyncio.wait_for(asyncio.shield(run.done), max(left_s, STUCK_S))
        except TimeoutError:
            run.stuck = True
            for due_ns in intended:
                recorder.record_since(due_ns)
            run.unfinished += len(intended)
            intended.clear()
            run.end_ns = now_ns()
    else:
        run.end_ns = now_ns()
    return start, sent


async def _measure(
    bus: str,
    rate: int,
    duration: float,
    handler: Handler | None,
    handler_name: str,
    progress: _Progress,
) -> RateResult:
    opener, max_backlog = _TARGETS[bus]
    recorder = LatencyRecorder()
    run = _Run(recorder)
    run.max_backlog = max_backlog
    label = f"{bus} at {rate:,}/s"
    warmed = True
    start = sent = 0
    # A handler that never returns would keep the bus from closing: the bus is
    # then left by cancelling it, which cancels the handler.
    with anyio.CancelScope() as scope:
        async with opener(run.wrap(handler)) as send:
            warmed = await _warm_up(run, send)
            if warmed:
                recorder.reset()
                run.errors, run.first_error = 0, None
                start, sent = await _send_and_drain(run, send, rate, duration, progress, label)
            if not warmed or run.stuck:
                scope.cancel()
    if not warmed:
        raise BenchError(
            f"{handler_name} has not returned {STUCK_S:g} s after its event, "
            "before the measurement began: it never returns, or is too slow to measure"
        )
    if run.stuck and run.first_error is None:
        run.first_error = (
            f"{handler_name} had not returned {STUCK_S:g} s after the run's cut-off: "
            "the events still waiting were abandoned"
        )
    progress.finish_run(duration)
    elapsed_s = max(duration, (run.end_ns - start) / _NS)
    handled = recorder.count - run.unfinished
    p50, p90, p99, p99_9, p99_99 = (recorder.value_at_percentile(p) / 1000 for p in _PERCENTILES)
    return RateResult(
        bus=bus,
        handler=handler_name,
        rate_per_s=rate,
        duration_s=duration,
        sent=sent,
        handled=handled,
        unfinished=run.unfinished,
        errors=run.errors,
        achieved_per_s=handled / elapsed_s,
        max_us=recorder.max / 1000,
        mean_us=recorder.mean / 1000,
        first_error=run.first_error,
        p50_us=p50,
        p90_us=p90,
        p99_us=p99,
        p99_9_us=p99_9,
        p99_99_us=p99_99,
    )


def knee(results: Iterable[RateResult], bus: str = "openstarry") -> int | None:
    """The lowest rate at which ``bus``'s p99 is over 1 ms; ``None`` when no rate's is."""
    over = [r.rate_per_s for r in results if r.bus == bus and r.p99_us > KNEE_US]
    return min(over) if over else None


def check_rates(rates: Sequence[int], duration: float) -> list[int]:
    """The rates sorted, without repeats; :class:`BenchError` for a bad rate or duration."""
    if not rates:
        raise BenchError("give at least one rate")
    for rate in rates:
        if not 1 <= rate <= MAX_RATE:
            raise BenchError(f"rate {rate}: expected 1 to {MAX_RATE:,} events/s")
    if not 0 < duration <= MAX_DURATION:
        raise BenchError(
            f"duration {duration}: expected more than 0 and at most {MAX_DURATION:g} s"
        )
    return sorted(set(rates))


def bench_dispatch_latency(
    rates: Sequence[int],
    duration: float,
    *,
    handler: Handler | None = None,
    handler_name: str | None = None,
    buses: Sequence[str] = ("openstarry",),
    progress: TextIO | None = None,
) -> list[RateResult]:
    """Measure each bus at each rate, open loop; one :class:`RateResult` per bus and rate.

    ``handler`` (sync or async, called with each event) is what is measured;
    ``None`` measures the bus alone with a no-op. ``progress``, when it is a
    terminal, shows a progress bar. The rates run from the lowest up, each
    bus in turn at each rate; ``knee_per_s`` is filled in on every result.
    It runs its own asyncio event loop: call it from synchronous code.

    Raises:
        BenchError: a bad rate or duration, or a bus that cannot run here.
    """
    ordered = check_rates(rates, duration)
    names = list(dict.fromkeys(buses))
    for name in names:
        check_bus(name)
    label = handler_name or (
        "no-op" if handler is None else str(getattr(handler, "__qualname__", handler))
    )
    bar = _Progress(progress, duration * len(ordered) * len(names))

    async def main() -> list[RateResult]:
        results = []
        for rate in ordered:
            for name in names:
                results.append(await _measure(name, rate, duration, handler, label, bar))
        return results

    try:
        results = asyncio.run(main())
    finally:
        bar.close()
    for result in results:
        result.knee_per_s = knee(results, result.bus)
    return results


# -- output ------------------------------------------------------------------


def _us(value: float) -> str:
    if value >= 100_000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


#: The percentiles reported, as (title, RateResult field).
PERCENTILES = (
    ("p50", "p50_us"),
    ("p90", "p90_us"),
    ("p99", "p99_us"),
    ("p99.9", "p99_9_us"),
    ("p99.99", "p99_99_us"),
    ("max", "max_us"),
)


def format_table(results: Sequence[RateResult]) -> str:
    """The results as a text table, latencies in microseconds, then each bus's knee."""
    buses = list(dict.fromkeys(r.bus for r in results))
    width = max(len("bus"), *(len(name) for name in buses))
    head = f"{'bus':<{width}} {'rate/s':>10} {'achieved/s':>11}" + "".join(
        f" {title + ' us':>11}" for title, _ in PERCENTILES
    )
    lines = [head]
    for r in results:
        row = f"{r.bus:<{width}} {r.rate_per_s:>10,} {r.achieved_per_s:>11,.0f}"
        row += "".join(f" {_us(getattr(r, key)):>11}" for _, key in PERCENTILES)
        notes = []
        if r.unfinished:
            notes.append(f"{r.unfinished:,} unfinished at the time limit")
        if r.errors:
            notes.append(f"{r.errors:,} handler errors, first: {r.first_error}")
        elif r.first_error is not None:
            notes.append(r.first_error)  # a handler that never returned
        lines.append(row + ("   (" + "; ".join(notes) + ")" if notes else ""))
    top = max(r.rate_per_s for r in results) if results else 0
    for name in buses:
        at = knee(results, name)
        where = f"{at:,}/s" if at is not None else f"none up to {top:,}/s"
        lines.append(f"knee of {name} (lowest rate with p99 over 1 ms): {where}")
    return "\n".join(lines)


def results_json(results: Sequence[RateResult]) -> str:
    """The results as a JSON list, one object per bus and rate."""
    return json.dumps([r.as_json() for r in results], indent=2) + "\n"


def write_json(results: Sequence[RateResult], path: Path) -> None:
    """Write :func:`results_json` to ``path``."""
    path.write_text(results_json(results), encoding="utf-8")
