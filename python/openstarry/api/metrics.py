"""``GET /metrics``: an agent's bus, loop, tools and provider in the Prometheus text format.

``prometheus-client`` comes with the ``[http]`` extra and is imported at the
first scrape, not when the server starts. What is exported (every name starts
``openstarry_``; times in seconds):

- ``events_published_total``, ``events_dispatched_total{type}``,
  ``events_duplicates_total``, ``events_invalid_total``,
  ``handler_errors_total``: :meth:`EventBus.metrics() <openstarry.bus.EventBus.metrics>`;
- ``queue_depth{priority}``: events waiting at each priority, 0..5;
- ``dispatch_latency_seconds``: a histogram of publish-to-dispatch latency,
  fed from the bus's recent samples at each scrape (samples overwritten
  between two scrapes are missing from it: the bus keeps the last 4,096);
- ``tool_calls_total{tool}``, ``tool_failures_total{tool}``: from the
  ``EXEC:TOOL_CALL`` and ``EXEC:TOOL_RESULT`` events on the bus;
- ``provider_call_duration_seconds{provider}`` (histogram) and
  ``provider_tokens_total{provider,kind}`` (``kind``: ``input``, ``output``),
  timed around the provider's ``generate`` and read from its response's
  ``metadata.usage``;
- ``runs_in_flight``, ``sessions``, ``runs_completed_total``,
  ``runs_stopped_total``: the execution loop.

:class:`AgentMetrics` is the collector; ``GET /metrics.json`` serves the same
numbers as plain JSON (``bus.metrics()``, the loop's, tools and provider calls)
for the console's charts.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from openstarry.core import Event
from openstarry.events import EventType

if TYPE_CHECKING:
    from types import TracebackType

    from openstarry.agent.interfaces import AgentContext, Provider
    from openstarry.agent.runtime import Agent
    from openstarry.core import ProviderResponse

__all__ = ["AgentMetrics", "TimedProvider"]

#: Histogram bounds of dispatch latency, seconds (10 us to 1 s).
DISPATCH_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1, 1.0)
#: Histogram bounds of provider calls, seconds.
PROVIDER_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: Tools and providers counted by name, at most (names past it count as ``"*"``).
_MAX_NAMES = 1024


class _Histogram:
    """Cumulative bucket counts and a sum, as Prometheus keeps them."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)


def _named(table: dict[str, Any], name: str, default: Any) -> Any:
    if name not in table and len(table) >= _MAX_NAMES:
        name = "*"
    return table.setdefault(name, default)


class TimedProvider:
    """A provider that times each ``generate`` and reads its token usage for :class:`AgentMetrics`.

    It forwards ``async with`` to the provider it wraps, when that provider is
    an async context manager.
    """

    def __init__(self, inner: Provider, metrics: AgentMetrics) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self._metrics = metrics

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        start = time.perf_counter()
        response: ProviderResponse | None = None
        try:
            response = await self.inner.generate(prompt, context)
            return response
        finally:
            metadata = getattr(response, "metadata", None)
            usage = metadata.get("usage") if isinstance(metadata, dict) else None
            self._metrics.provider_call(
                self.name, time.perf_counter() - start, usage if isinstance(usage, dict) else None
            )

    def __getattr__(self, name: str) -> Any:
        # Anything else (a model name, options) is the wrapped provider's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def __aenter__(self) -> TimedProvider:
        if isinstance(self.inner, AbstractAsyncContextManager):
            await self.inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if isinstance(self.inner, AbstractAsyncContextManager):
            suppress: bool | None = await self.inner.__aexit__(exc_type, exc, tb)
            return suppress
        return None


class AgentMetrics:
    """Counts what happens on an agent's bus and at its provider; a Prometheus collector.

    Build it before the agent starts: it subscribes to the bus's tool events and
    wraps the agent's provider in a :class:`TimedProvider`.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.tool_calls: dict[str, int] = {}
        self.tool_failures: dict[str, int] = {}
        self.provider_calls: dict[str, _Histogram] = {}
        self.provider_tokens: dict[str, dict[str, int]] = {}
        self.dispatch = _Histogram(DISPATCH_BUCKETS)
        self._latency_mark = 0
        agent.bus.subscribe(EventType.TOOL_CALL.value, self._on_tool_call)
        agent.bus.subscribe(EventType.TOOL_RESULT.value, self._on_tool_result)
        if not isinstance(agent.loop.provider, TimedProvider):
            agent.loop.provider = TimedProvider(agent.loop.provider, self)

    # -- feeding -----------------------------------------------------------

    def _on_tool_call(self, event: Event) -> None:
        name = _tool_name(event)
        self.tool_calls[name] = _named(self.tool_calls, name, 0) + 1

    def _on_tool_result(self, event: Event) -> None:
        payload = event.payload
        if isinstance(payload, dict) and payload.get("success") is False:
            name = _tool_name(event)
            self.tool_failures[name] = _named(self.tool_failures, name, 0) + 1

    def provider_call(self, name: str, seconds: float, usage: dict[str, Any] | None) -> None:
        """Record one provider call: its duration and, when reported, its tokens."""
        _named(self.provider_calls, name, _Histogram(PROVIDER_BUCKETS)).observe(seconds)
        if usage is not None:
            tokens = _named(self.provider_tokens, name, {"input": 0, "output": 0})
            for kind in ("input", "output"):
                value = usage.get(f"{kind}_tokens")
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    tokens[kind] += value

    def _drain_latency(self) -> None:
        self._latency_mark, samples = self.agent.bus.latency_since(self._latency_mark)
        observe = self.dispatch.observe
        for ns in samples:
            observe(ns / 1e9)

    # -- reading -----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything as plain JSON data (``GET /metrics.json``)."""
        loop = self.agent.loop.metrics()
        return {
            "time": time.time(),
            "bus": loop["bus"],
            "loop": loop["loop"],
            "tools": {
                name: {"calls": n, "failures": self.tool_failures.get(name, 0)}
                for name, n in self.tool_calls.items()
            },
            "providers": {
                name: {
                    "calls": h.count,
                    "seconds": h.sum,
                    "tokens": self.provider_tokens.get(name, {"input": 0, "output": 0}),
                }
                for name, h in self.provider_calls.items()
            },
        }

    def collect(self) -> Iterator[Any]:
        """The metric families (the ``prometheus_client`` collector protocol)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        self._drain_latency()
        loop = self.agent.loop.metrics()
        bus, runs = loop["bus"], loop["loop"]
        for name, value, doc in (
            ("events_published", bus["published"], "Events accepted by the bus."),
            ("events_duplicates", bus["duplicates"], "Events dropped as repeated ids."),
            ("events_invalid", bus.get("invalid", 0), "Ingested lines refused as invalid."),
            ("handler_errors", bus["handler_errors"], "Handler exceptions made KERNEL:ERROR."),
            ("runs_completed", runs.get("runs_completed", 0), "Runs that completed."),
            ("runs_stopped", runs.get("runs_stopped", 0), "Runs that were stopped."),
        ):
            yield CounterMetricFamily(f"openstarry_{name}", doc, value=value)
        dispatched = CounterMetricFamily(
            "openstarry_events_dispatched", "Events dispatched, by type.", labels=["type"]
        )
        for event_type, count in sorted(bus["dispatched"].items()):
            dispatched.add_metric([event_type], count)
        yield dispatched
        depth = GaugeMetricFamily(
            "openstarry_queue_depth", "Events waiting, by priority.", labels=["priority"]
        )
        for priority, count in enumerate(bus["depth"]):
            depth.add_metric([str(priority)], count)
        yield depth
        yield HistogramMetricFamily(
            "openstarry_dispatch_latency_seconds",
            "Publish-to-dispatch latency of the bus.",
            buckets=self.dispatch.buckets(),
            sum_value=self.dispatch.sum,
        )
        calls = CounterMetricFamily(
            "openstarry_tool_calls", "Tool calls, by tool.", labels=["tool"]
        )
        failures = CounterMetricFamily(
            "openstarry_tool_failures", "Tool calls that failed, by tool.", labels=["tool"]
        )
        for name in sorted(self.tool_calls):
            calls.add_metric([name], self.tool_calls[name])
            failures.add_metric([name], self.tool_failures.get(name, 0))
        yield calls
        yield failures
        latency = HistogramMetricFamily(
            "openstarry_provider_call_duration_seconds",
            "Provider calls (generate), by provider.",
            labels=["provider"],
        )
        tokens = CounterMetricFamily(
            "openstarry_provider_tokens",
            "Tokens the provider reported, by provider and kind (input, output).",
            labels=["provider", "kind"],
        )
        for name in sorted(self.provider_calls):
            histogram = self.provider_calls[name]
            latency.add_metric([name], histogram.buckets(), histogram.sum)
            for kind, value in self.provider_tokens.get(name, {}).items():
                tokens.add_metric([name, kind], value)
        yield latency
        yield tokens
        yield GaugeMetricFamily(
            "openstarry_runs_in_flight", "Runs in progress.", value=runs.get("running", 0)
        )
        yield GaugeMetricFamily(
            "openstarry_sessions", "Sessions the agent holds.", value=runs.get("sessions", 0)
        )

    def exposition(self) -> bytes:
        """The Prometheus text format of :meth:`collect`."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)


def _tool_name(event: Event) -> str:
    payload = event.payload
    name = payload.get("name") if isinstance(payload, dict) else None
    return name if isinstance(name, str) else "?"
