"""OpenTelemetry spans from the bus (openstarry.otel) and W3C traceparent (openstarry.tracecontext).

Spans go to the SDK's in-memory exporter; the span tree of the spec 000 section 5
weather run is checked whole, then the hops out of a run: the HTTP provider's
``traceparent`` and an MCP call to another agent.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import anyio
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


# -- traces end to end: the provider's calls and other agents' spans ---------------------------


@pytest.mark.anyio
async def test_an_http_provider_sends_the_rounds_span_as_traceparent() -> None:
    """Defect: the HTTP providers sent no ``traceparent``, so a model gateway's
    spans could not join the turn's trace. Each request now names the round's
    ``openstarry.provider`` span as its parent, in the run's trace."""
    from fake_llm_server import FakeLLMServer, chat_answer
    from openstarry.manifest import parse_manifest

    provider, exporter = traced()
    data = json.loads(WEATHER.read_text(encoding="utf-8"))
    with FakeLLMServer() as server:
        server.script(None, chat_answer("Hello there."))
        data["provider"] = {
            "name": "openai",
            "model": "gpt-4.1",
            "baseUrl": server.url + "/v1",
            "options": {"stream": False},
        }
        agent = agent_from_manifest(parse_manifest(data, base_dir=WEATHER.parent))
        tracing = instrument(agent, provider)
        with anyio.fail_after(30):
            async with agent:
                result = await agent.ask("Hi")
                await agent.bus.wait_idle()
        tracing.close()
        [request] = server.requests
    assert result.text == "Hello there."
    [round_span] = by_name(exporter.get_finished_spans(), "openstarry.provider")
    parsed = parse_traceparent(request.headers.get("traceparent"))
    assert parsed is not None, request.headers
    trace, parent = parsed
    assert w3c_trace_id(trace) == w3c_trace_id(result.trace_id)
    assert int(parent, 16) == round_span.context.span_id
    assert round_span.context.trace_id == int(w3c_trace_id(result.trace_id), 16)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # serve_http runs on asyncio
async def test_a_called_agents_spans_are_children_of_the_callers_mcp_call_span(
    tmp_path: Path,
) -> None:
    """Defect: an agent serving an MCP call put its spans in the caller's trace,
    but as a root of their own (``openstarry.tool`` with no parent), so a trace
    viewer showed two trees. The call's ``traceparent`` names the caller's
    ``openstarry.mcp.call`` span, and the served call's span is its child."""
    from mcp_fixtures import helpers
    from openstarry.manifest import McpServerConfig
    from openstarry.mcp.client import McpToolset
    from openstarry.mcp.server import serve_http

    provider, exporter = traced()
    callee = agent_from_manifest(helpers.write_manifest(tmp_path))
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    listening.setblocking(False)
    url = f"http://127.0.0.1:{listening.getsockname()[1]}/mcp"
    caller = Agent(
        ScriptedProvider([tool_call("peer.get_weather", {"location": "Paris"}), text("done")]),
        toolsets=[McpToolset([McpServerConfig(name="peer", url=url)], default_timeout=30)],
    )
    callee_tracing = instrument(callee, provider)
    caller_tracing = instrument(caller, provider)
    with anyio.fail_after(60):
        async with callee, anyio.create_task_group() as serving:
            serving.start_soon(lambda: serve_http(callee, sock=listening, announce=False))
            async with caller:
                result = await caller.ask("weather in Paris, from the peer")
                await caller.bus.wait_idle()
            await callee.bus.wait_idle()
            serving.cancel_scope.cancel()
    listening.close()  # serve_http leaves a socket it was given open
    caller_tracing.close()
    callee_tracing.close()
    assert result.text == "done"
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {int(w3c_trace_id(result.trace_id), 16)}
    [call] = by_name(spans, "openstarry.mcp.call")
    [served] = by_name(spans, "openstarry.tool")
    [turn] = by_name(spans, "openstarry.turn")
    assert served.kind is SpanKind.SERVER
    assert served.attributes is not None
    assert served.attributes["openstarry.tool.name"] == "get_weather"
    assert served.parent is not None
    assert served.parent.span_id == call.context.span_id
    assert call.parent is not None
    assert call.parent.span_id == turn.context.span_id


def test_a_requests_traceparent_is_the_runs_parent_only_in_the_runs_trace() -> None:
    from openstarry.api.tracecontext import trace_context_of_headers

    value = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    trace, parent = trace_context_of_headers([(b"traceparent", value)])
    assert trace == str(uuid.UUID("4bf92f3577b34da6a3ce929d0e0e4736"))
    assert parent == value.decode()
    # X-OpenStarry-Trace-ID names another trace: the run is in it, with no parent.
    other = [(b"x-openstarry-trace-id", b"mine"), (b"traceparent", value)]
    assert trace_context_of_headers(other) == ("mine", None)
    same = [(b"x-openstarry-trace-id", trace.encode()), (b"traceparent", value)]
    assert trace_context_of_headers(same) == (trace, value.decode())
    assert trace_context_of_headers([(b"traceparent", b"00-zz-01")]) == (None, None)
