"""OpenTelemetry spans from the bus (openstarry.otel) and W3C traceparent (openstarry.tracecontext).

Spans go to the SDK's in-memory exporter; the span tree of the spec 000 section 5
weather run is checked whole.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from openstarry.agent.runtime import Agent
from openstarry.assembly import agent_from_manifest
from openstarry.mcp.guard import TraceContext, trace_from_headers, trace_from_meta
from openstarry.otel import instrument
from openstarry.testing import ScriptedProvider, text, tool_call
from openstarry.tracecontext import parse_traceparent, traceparent, w3c_trace_id

WEATHER = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
ROOT = Path(__file__).resolve().parent.parent


def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


@pytest.mark.anyio
async def test_the_weather_run_is_one_trace_with_the_tool_call_under_the_turn() -> None:
    provider, exporter = traced()
    agent = agent_from_manifest(WEATHER)
    tracing = instrument(agent, provider)
    async with agent:
        result = await agent.ask("Query weather in Taipei")
        await agent.bus.wait_idle()
    tracing.close()
    assert result.text.endswith("The weather in Taipei is 25°C, Sunny.")
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {int(w3c_trace_id(result.trace_id), 16)}
    [turn] = by_name(spans, "openstarry.turn")
    [tool] = by_name(spans, "openstarry.tool")
    providers = by_name(spans, "openstarry.provider")
    assert len(spans) == 4
    assert turn.parent is None
    assert tool.parent is not None
    assert tool.parent.span_id == turn.context.span_id
    assert tool.attributes is not None
    assert tool.attributes["openstarry.tool.name"] == "get_weather"
    assert tool.status.status_code is StatusCode.UNSET
    assert [p.attributes["openstarry.round"] for p in providers if p.attributes] == [1, 2]
    for call in providers:
        assert call.parent is not None
        assert call.parent.span_id == turn.context.span_id
        assert call.kind is SpanKind.CLIENT
        assert call.attributes is not None
        assert call.attributes["gen_ai.system"] == "default"
    # Each span lies within its parent's time; the tool runs between the two provider calls.
    for span in (tool, *providers):
        assert span.start_time is not None
        assert turn.start_time is not None
        assert span.end_time is not None
        assert turn.end_time is not None
        assert turn.start_time <= span.start_time <= span.end_time <= turn.end_time
    assert providers[0].end_time is not None
    assert tool.start_time is not None
    assert providers[0].end_time <= tool.start_time
    assert providers[1].attributes is not None
    tokens = providers[1].attributes["gen_ai.usage.output_tokens"]
    assert isinstance(tokens, int)
    assert tokens > 0


@pytest.mark.anyio
async def test_a_failed_tool_sets_its_span_status_to_error() -> None:
    provider, exporter = traced()
    agent = Agent(ScriptedProvider([tool_call("missing", {}), text("gave up")]))
    tracing = instrument(agent, provider)
    async with agent:
        await agent.ask("try")
        await agent.bus.wait_idle()
    tracing.close()
    [tool] = by_name(exporter.get_finished_spans(), "openstarry.tool")
    assert tool.status.status_code is StatusCode.ERROR


def test_traceparent_carries_the_openstarry_trace() -> None:
    trace = str(uuid.uuid4())
    assert w3c_trace_id(trace) == trace.replace("-", "")
    assert len(w3c_trace_id("not-a-uuid")) == 32
    context = TraceContext(trace, 2)
    header = context.headers()["traceparent"]
    parsed = parse_traceparent(header)
    assert parsed is not None
    assert parsed[0] == trace
    assert context.meta()["traceparent"] == header
    # A caller that sends only traceparent (another framework) keeps its trace.
    other = "4bf92f3577b34da6a3ce929d0e0e4736"
    value = traceparent(other, "00f067aa0ba902b7")
    from_headers = trace_from_headers({"Traceparent": value})
    assert from_headers is not None
    assert from_headers.trace_id == str(uuid.UUID(hex=other))
    assert from_headers.depth == 1
    from_meta = trace_from_meta({"traceparent": value})
    assert from_meta is not None
    assert from_meta.trace_id == from_headers.trace_id
    # The openstarry header wins over traceparent; a malformed one is ignored.
    both = trace_from_headers({"X-OpenStarry-Trace-ID": "mine", "traceparent": value})
    assert both is not None
    assert both.trace_id == "mine"
    assert trace_from_headers({"traceparent": "00-zz-00f067aa0ba902b7-01"}) is None
    assert parse_traceparent("00-" + "0" * 32 + "-00f067aa0ba902b7-01") is None


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def test_nothing_of_opentelemetry_is_imported_without_the_extra() -> None:
    done = run_python(
        f"""
        import sys, anyio
        import openstarry, openstarry.assembly, openstarry.api.server, openstarry.mcp.guard
        from openstarry.assembly import agent_from_manifest

        async def main():
            async with agent_from_manifest({str(WEATHER)!r}) as agent:
                await agent.ask("Query weather in Taipei")

        anyio.run(main)
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print("loaded:", loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout


def test_without_the_extra_the_import_error_names_it() -> None:
    done = run_python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        try:
            import openstarry.otel
        except ImportError as exc:
            print("error:", exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'openstarry[otel]'" in done.stdout
