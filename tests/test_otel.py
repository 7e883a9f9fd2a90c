"""OpenTelemetry spans from the bus (openstarry.otel) and W3C traceparent (openstarry.tracecontext).

Spans go to the SDK's in-memory exporter; the span tree of the spec 000 section 5
weather run is checked whole, then the hops out of a run: the HTTP provider's
``traceparent`` and an MCP call to another agent. ``openstarry serve --otel`` is
run as processes (a caller, the agent it calls, a fake model server) exporting
with the console exporter, and the trace they give is checked whole.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

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


# -- openstarry serve --otel: one trace across two processes and a model server ---------------


def _spans_in(path: Path) -> list[dict[str, Any]]:
    """The spans the console exporter wrote: JSON objects whose first line is ``{``
    (uvicorn's access log shares the stream)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    spans: list[dict[str, Any]] = []
    at = 0
    while at < len(lines):
        if lines[at].rstrip("\n") != "{":
            at += 1
            continue
        end = lines.index("}\n", at)
        spans.append(json.loads("".join(lines[at : end + 1])))
        at = end + 1
    return spans


def _hex(value: str | None) -> str | None:
    return None if value is None else value.removeprefix("0x")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _otel_env(service: str) -> dict[str, str]:
    from mcp_fixtures import helpers

    env = helpers.environment()
    env.update(
        OTEL_TRACES_EXPORTER="console",
        OTEL_SERVICE_NAME=service,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    return env


def test_serve_otel_gives_one_trace_from_the_request_to_the_model_and_the_called_agent(
    tmp_path: Path,
) -> None:
    """``openstarry serve --otel`` and ``openstarry mcp --http --otel``, each exporting to
    its stdout (``OTEL_TRACES_EXPORTER=console``), with a fake model server: a request that
    carries a ``traceparent`` gives one trace. The turn is a child of the request's span,
    the model server is sent the round's span, and the called agent's spans nest under
    the caller's ``openstarry.mcp.call`` span (through the MCP SDK's own client and
    server spans)."""
    import httpx

    from fake_llm_server import FakeLLMServer, chat_answer
    from mcp_fixtures import helpers

    callee_dir = tmp_path / "callee"
    callee_dir.mkdir()
    callee_manifest = helpers.write_manifest(callee_dir)
    callee_out = tmp_path / "callee-spans.json"
    caller_out = tmp_path / "caller-spans.json"
    calls_peer = chat_answer("")
    calls_peer.json["choices"][0]["message"]["tool_calls"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "peer_get_weather", "arguments": '{"location": "Paris"}'},
        }
    ]
    calls_peer.json["choices"][0]["finish_reason"] = "tool_calls"
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    client_span = "00f067aa0ba902b7"
    with (
        FakeLLMServer() as model,
        callee_out.open("w") as callee_stdout,
        caller_out.open("w") as caller_stdout,
    ):
        model.script(None, calls_peer, chat_answer("Rainy in Paris, says the peer."))
        callee = subprocess.Popen(
            helpers.server_command(callee_manifest, "--http", "--port", "0", "--otel"),
            stdin=subprocess.DEVNULL,
            stdout=callee_stdout,
            stderr=subprocess.PIPE,
            env=_otel_env("callee"),
        )
        try:
            lines = helpers.Lines(callee.stderr)
            url = None
            while url is None:
                line = lines.next()
                assert line is not None, lines.join()
                found = re.search(r"serving .* on (http://\S+)", line)
                url = found.group(1) if found else None
            caller_manifest = tmp_path / "caller.json"
            caller_manifest.write_text(
                json.dumps(
                    {
                        "identity": {"name": "caller"},
                        "provider": {
                            "name": "openai",
                            "model": "gpt-4.1",
                            "baseUrl": model.url + "/v1",
                            "options": {"stream": False},
                        },
                        "tools": [],
                        "limits": {"toolTimeout": 20},
                        "mcp": {"servers": [{"name": "peer", "url": url}]},
                    }
                ),
                encoding="utf-8",
            )
            port = _free_port()
            serve = ["serve", str(caller_manifest), "--port", str(port), "--otel"]
            caller = subprocess.Popen(
                [sys.executable, "-m", "openstarry.cli", *serve],
                stdin=subprocess.DEVNULL,
                stdout=caller_stdout,
                stderr=subprocess.PIPE,
                env=_otel_env("caller"),
            )
            try:
                caller_err = helpers.Lines(caller.stderr)
                base = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert caller.poll() is None, caller_err.join()
                    assert time.monotonic() < deadline, "openstarry serve did not come up"
                    time.sleep(0.05)
                answer = httpx.post(
                    f"{base}/process",
                    json={
                        "input": [
                            {"role": "user", "content": [{"type": "text", "text": "Paris?"}]}
                        ],
                        "stream": False,
                    },
                    headers={"traceparent": f"00-{client_trace}-{client_span}-01"},
                    timeout=60,
                )
                assert answer.status_code == 200, answer.text
                assert "Rainy in Paris" in answer.text
            finally:
                status = helpers.stop(caller)
                said = caller_err.join()
                assert caller.stderr is not None
                caller.stderr.close()
                assert status == 0, said
        finally:
            helpers.stop(callee)
            assert callee.stderr is not None
            callee.stderr.close()
    caller_spans = _spans_in(caller_out)
    callee_spans = _spans_in(callee_out)
    spans = caller_spans + callee_spans
    by_id = {_hex(s["context"]["span_id"]): s for s in spans}
    # One trace, the request's: every span of the run, the SDK's of the call too (its
    # spans of the connection itself, discover, list, listen, are traces of their own).
    in_run = [s for s in spans if s["name"].startswith("openstarry.") or "tools/call" in s["name"]]
    assert len(in_run) == 7, [s["name"] for s in spans]
    assert {_hex(s["context"]["trace_id"]) for s in in_run} == {client_trace}
    assert {s["resource"]["attributes"]["service.name"] for s in caller_spans} == {"caller"}
    assert {s["resource"]["attributes"]["service.name"] for s in callee_spans} == {"callee"}
    names = [s["name"] for s in caller_spans]
    [turn] = [s for s in caller_spans if s["name"] == "openstarry.turn"]
    assert _hex(turn["parent_id"]) == client_span, names
    rounds = [s for s in caller_spans if s["name"] == "openstarry.provider"]
    assert len(rounds) == 2
    for round_span in rounds:
        assert _hex(round_span["parent_id"]) == _hex(turn["context"]["span_id"])
    # The model server was sent each round's span as the parent.
    sent = [parse_traceparent(r.headers.get("traceparent")) for r in model.requests]
    assert [(str(uuid.UUID(client_trace)), _hex(r["context"]["span_id"])) for r in rounds] == sent
    [call] = [s for s in caller_spans if s["name"] == "openstarry.mcp.call"]
    assert _hex(call["parent_id"]) == _hex(turn["context"]["span_id"])
    # The called agent's span nests under the caller's MCP call span.
    [served] = [s for s in callee_spans if s["name"] == "openstarry.tool"]
    assert served["attributes"]["openstarry.tool.name"] == "get_weather"
    ancestors = []
    span: dict[str, Any] | None = served
    while span is not None:
        ancestors.append(span["name"])
        parent = _hex(span["parent_id"])
        span = by_id.get(parent) if parent is not None else None
    # Between them, the MCP SDK's own spans (its client's and its server's).
    assert ancestors[-2:] == ["openstarry.mcp.call", "openstarry.turn"], ancestors


# -- --otel: the OTEL_* variables ------------------------------------------------------------


def test_the_otel_variables_choose_the_exporter_and_the_service_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from openstarry.otel import tracer_provider_from_env

    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    out = io.StringIO()
    provider = tracer_provider_from_env(service_name="weather-agent", console=out)
    provider.get_tracer("t").start_span("hello").end()
    provider.shutdown()
    [span] = [json.loads(out.getvalue())]
    assert span["name"] == "hello"
    assert span["resource"]["attributes"]["service.name"] == "weather-agent"
    # OTEL_SERVICE_NAME wins over the agent's name; "none" exports nothing.
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    quiet = tracer_provider_from_env(service_name="weather-agent", console=out)
    assert quiet.resource.attributes["service.name"] == "from-env"
    quiet.get_tracer("t").start_span("unseen").end()
    quiet.shutdown()
    assert "unseen" not in out.getvalue()


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({}, "pip install opentelemetry-exporter-otlp-proto-grpc"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "pip install opentelemetry-exporter-otlp-proto-http",
        ),
        ({"OTEL_TRACES_EXPORTER": "console,nosuch"}, "'nosuch', which is not installed"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "is not an OTLP protocol"),
    ],
)
def test_serve_otel_with_an_exporter_that_is_not_installed_says_so_in_one_line(
    variables: dict[str, str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default exporter is OTLP, whose package is not a dependency of the extra:
    ``--otel`` then exits 2 with one line naming the package, before serving anything."""
    from openstarry import cli

    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["serve", str(WEATHER), "--port", "1", "--otel"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("openstarry serve: --otel: ")
    assert said in err


@pytest.mark.parametrize(
    "command",
    [["mcp", str(WEATHER)], ["worker", str(WEATHER), "--bus", "redis://127.0.0.1:1/0"]],
)
def test_mcp_and_worker_take_otel_too(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--otel`` is read before anything starts (here: an exporter nobody provides)."""
    from openstarry import cli

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "nosuch")
    assert cli.main([*command, "--otel"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"openstarry {command[0]}: --otel: OTEL_TRACES_EXPORTER names the exporter 'nosuch', "
        "which is not installed: install the package that provides the 'nosuch' traces "
        "exporter (or set OTEL_TRACES_EXPORTER=console, or none)\n"
    )
