"""The HTTP transport of the LLM providers, against a scripted server on 127.0.0.1.

Most tests drive :class:`HTTPProvider` with :class:`EchoAPI`, a minimal
:class:`~openstarry.providers.wire.WireAPI` defined here, so they test the
transport alone (retries, timeouts, streaming, keys); the real translators
are driven end to end in ``test_provider_agent_runs.py``.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_llm_server import FakeLLMServer, Reply, sse
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import Session, UserTurn
from openstarry.agent.registry import tool_set_fingerprint
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.protocol import ContentSegment, ProviderResponse, ToolCall
from openstarry.providers import create_provider
from openstarry.providers.anthropic import AnthropicAPI
from openstarry.providers.http import HTTPProvider, SSEDecoder, SSEError, TransportOptions
from openstarry.providers.openai_chat import OpenAIChatAPI
from openstarry.providers.wire import ToolNameMap
from openstarry.tools import resolve_tools

KEY = "sk-test-Zq8vK3secretVALUE-0042"
KEY_ENV = "OPENSTARRY_TEST_HTTP_KEY"
#: A bound on each test's waits, so a broken transport fails instead of hanging.
HANG = 10


# --- a minimal API, so the transport is tested alone ---------------------------------------------


class EchoAssembler:
    """Events ``{"text": ...}``, ``{"call": {...}}`` and ``{"done": true}``."""

    def __init__(self, names: ToolNameMap) -> None:
        self.names = names
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self._done = False

    def feed(self, event: str | None, data: str) -> str | None:
        item = json.loads(data)
        if item.get("done"):
            self._done = True
        if "call" in item:
            self.calls.append(item["call"])
        text = item.get("text")
        if text:
            self.text.append(text)
        return text  # type: ignore[no-any-return]

    @property
    def done(self) -> bool:
        return self._done

    def finish(self) -> ProviderResponse:
        text = "".join(self.text)
        if not self._done:
            text += " [the answer was cut short]"
        return EchoAPI.response(text, self.calls, self.names)


class EchoAPI:
    """The smallest WireAPI: ``{"text", "calls"}`` answers; records what it translated."""

    name = "echo-http"
    default_base_url = "https://echo.invalid/v1"
    default_api_key_env = KEY_ENV

    def __init__(self) -> None:
        self.translated: list[list[str]] = []
        self.options_seen: list[dict[str, Any]] = []

    def path(self, model: str, *, stream: bool) -> str:
        return f"/models/{model}:{'stream' if stream else 'generate'}"

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def build_request(
        self,
        prompt: str,
        context: AgentContext,
        *,
        model: str,
        options: Mapping[str, Any],
        stream: bool,
        names: ToolNameMap,
    ) -> dict[str, Any]:
        self.options_seen.append(dict(options))
        body: dict[str, Any] = {"model": model, "prompt": prompt, "stream": stream, **options}
        if context.tools:
            declared = [names.wire(name) for name in context.tools]
            self.translated.append(declared)
            body["tools"] = declared
        return body

    @staticmethod
    def response(text: str, calls: list[dict[str, Any]], names: ToolNameMap) -> ProviderResponse:
        segments = [ContentSegment(type="text", text=text)] if text else []
        segments += [
            ContentSegment(
                type="tool_call",
                tool_call=ToolCall(id=c.get("id"), name=names.local(c["name"]), args=c["args"]),
            )
            for c in calls
        ]
        return ProviderResponse(segments=segments, metadata={"model": "echo-1"})

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        return self.response(body["text"], body.get("calls", []), names)

    def stream(self, names: ToolNameMap) -> EchoAssembler:
        return EchoAssembler(names)

    def error_message(self, status: int, body: Any) -> str:
        if isinstance(body, dict):
            return str(body.get("error", {}).get("message", body))
        return str(body)


def answer(text: str = "Hello.", **extra: Any) -> Reply:
    return Reply(json={"text": text, **extra})


def streamed(*texts: str, done: bool = True, cut: bool = False, **kw: Any) -> Reply:
    events = [sse({"text": t}) for t in texts]
    if done:
        events.append(sse({"done": True}))
    return Reply(events=events, cut=cut, **kw)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def provider(server: FakeLLMServer, **options: Any) -> HTTPProvider:
    """An EchoAPI provider on the fake server; fast retries unless told otherwise."""
    options.setdefault("retryBackoff", 0.01)
    options.setdefault("stream", False)
    return HTTPProvider(EchoAPI(), "echo-1", base_url=server.url + "/v1", options=options)


def context(tools: Mapping[str, Tool] | None = None) -> tuple[AgentContext, list[str]]:
    """A context whose memory holds the prompt, and the list its text deltas go to."""
    deltas: list[str] = []
    session = Session("s")
    session.memory.append(UserTurn("Query weather in Taipei"))
    ctx = AgentContext(tools=tools or {}, session=session, text_sink=deltas.append)
    return ctx, deltas


async def generate(p: HTTPProvider, tools: Mapping[str, Tool] | None = None) -> Any:
    ctx, _ = context(tools)
    with anyio.fail_after(HANG):
        return await p.generate("Query weather in Taipei", ctx)


def texts(response: Any) -> str:
    return "".join(s.text or "" for s in response.segments)


# --- success, and what is sent -------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_plain_answer_and_the_request_it_came_from(server: FakeLLMServer, key: str) -> None:
    server.script("/v1/models/echo-1:generate", answer("The weather is fine."))
    p = HTTPProvider(
        EchoAPI(),
        "echo-1",
        base_url=server.url + "/v1",
        api_key_env=KEY_ENV,
        options={"temperature": 0.2, "stream": False},
    )
    response = await generate(p)
    assert texts(response) == "The weather is fine."
    assert response.metadata["model"] == "echo-1"
    assert response.metadata["tools_fingerprint"] == tool_set_fingerprint({})
    assert response.metadata["latency_ms"] >= 0
    (request,) = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/models/echo-1:generate"
    assert request.headers["authorization"] == f"Bearer {key}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("openstarry/")
    assert request.json == {
        "model": "echo-1",
        "prompt": "Query weather in Taipei",
        "stream": False,
        "temperature": 0.2,
    }


@pytest.mark.anyio
async def test_transport_options_do_not_reach_the_translator(server: FakeLLMServer) -> None:
    server.script(None, answer())
    api = EchoAPI()
    p = HTTPProvider(
        api,
        "m",
        base_url=server.url,
        options={"stream": False, "timeout": 5, "max_retries": 1, "retryBackoff": 0.1, "top_p": 1},
    )
    assert p.transport == TransportOptions(
        stream=False, timeout=5.0, max_retries=1, retry_backoff=0.1
    )
    await generate(p)
    # Built twice: once when the provider was made (to check the options), then the call.
    assert api.options_seen == [{"top_p": 1}, {"top_p": 1}]


@pytest.mark.anyio
@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
async def test_a_body_that_is_not_json_is_refused_before_sending(
    server: FakeLLMServer, value: Any
) -> None:
    p = provider(server, temperature=value)
    with pytest.raises(ProviderError, match="cannot be sent as JSON"):
        await generate(p)
    assert server.requests == []


@pytest.mark.anyio
async def test_tool_declarations_are_translated_once_per_tool_set(server: FakeLLMServer) -> None:
    tools = resolve_tools(["get_weather", "fs.read"], allowed_paths=["."])
    other = resolve_tools(["get_weather"])
    server.script(None, answer(), answer(), answer(), answer())
    api = EchoAPI()
    p = provider(server)
    p.api = api
    first = await generate(p, tools)
    second = await generate(p, dict(reversed(list(tools.items()))))
    third = await generate(p, other)
    fourth = await generate(p, tools)
    # Built with the tools once per tool set (the first body, to learn the tool keys).
    assert api.translated == [["get_weather", "fs_read"], ["get_weather"]]
    bodies = [r.json for r in server.requests]
    assert (
        bodies[0]["tools"] == bodies[1]["tools"] == bodies[3]["tools"] == ["get_weather", "fs_read"]
    )
    assert bodies[2]["tools"] == ["get_weather"]
    fp = tool_set_fingerprint(tools)
    assert first.metadata["tools_fingerprint"] == second.metadata["tools_fingerprint"] == fp
    assert fourth.metadata["tools_fingerprint"] == fp
    assert third.metadata["tools_fingerprint"] == tool_set_fingerprint(other) != fp
    assert len(p.tool_sets) == 2


@pytest.mark.anyio
async def test_a_translator_may_return_the_cores_response(server: FakeLLMServer) -> None:
    class CoreEchoAPI(EchoAPI):
        def parse_response(self, body: Any, names: ToolNameMap) -> Any:
            return super().parse_response(body, names).to_core()

    server.script(None, answer("core"))
    p = HTTPProvider(CoreEchoAPI(), "m", base_url=server.url, options={"stream": False})
    response = await generate(p)
    assert texts(response) == "core"
    assert response.metadata["model"] == "echo-1"
    assert response.metadata["tools_fingerprint"].startswith("ts_")


@pytest.mark.anyio
async def test_tool_calls_come_back_with_the_agents_names(server: FakeLLMServer) -> None:
    tools = resolve_tools(["fs.read"], allowed_paths=["."])
    server.script(
        None,
        answer("", calls=[{"id": "c1", "name": "fs_read", "args": {"path": "a.txt"}}]),
    )
    response = await generate(provider(server), tools)
    (segment,) = response.segments
    assert segment.tool_call.name == "fs.read"
    assert segment.tool_call.id == "c1"
    assert segment.tool_call.args == {"path": "a.txt"}


# --- retries -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_429_with_retry_after_waits_then_succeeds(server: FakeLLMServer) -> None:
    server.script(
        None, Reply(429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "1"})
    )
    server.script(None, answer("after the wait"))
    response = await generate(provider(server, retryBackoff=0))
    assert texts(response) == "after the wait"
    first, second = server.requests
    # Loosely: the server's Retry-After, not the (zero) backoff, set the wait.
    assert second.time - first.time >= 0.9


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["code", "type"])
async def test_a_429_out_of_quota_is_not_retried(server: FakeLLMServer, field: str) -> None:
    """Waiting does not refill an account: OpenAI's insufficient_quota fails at once."""
    error = {"message": "You exceeded your current quota", field: "insufficient_quota"}
    server.script(None, Reply(429, json={"error": error}), answer("never"))
    with pytest.raises(ProviderError, match=r"HTTP 429 .*exceeded your current quota"):
        await generate(provider(server))
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_retry_after_as_a_date_and_in_milliseconds(server: FakeLLMServer) -> None:
    past = format_datetime(datetime.now(timezone.utc) - timedelta(seconds=5), usegmt=True)
    server.script(
        None,
        Reply(429, headers={"Retry-After": past}),
        Reply(503, headers={"retry-after-ms": "10", "Retry-After": "50"}),
        answer("third time"),
    )
    response = await generate(provider(server))
    assert texts(response) == "third time"
    assert len(server.requests) == 3


@pytest.mark.anyio
async def test_a_500_then_success(server: FakeLLMServer) -> None:
    server.script(None, Reply(500, json={"error": {"message": "boom"}}), answer("ok"))
    response = await generate(provider(server))
    assert texts(response) == "ok"
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_400_is_not_retried_and_its_message_is_surfaced(server: FakeLLMServer) -> None:
    server.script(None, Reply(400, json={"error": {"message": "unknown field 'foo'"}}), answer())
    with pytest.raises(ProviderError) as caught:
        await generate(provider(server))
    text = str(caught.value)
    assert "HTTP 400" in text
    assert "unknown field 'foo'" in text
    assert "echo-http" in text
    assert len(server.requests) == 1
    assert server.pending() == 1


@pytest.mark.anyio
async def test_retries_exhausted(server: FakeLLMServer) -> None:
    server.script(None, *[Reply(503, json={"error": {"message": "overloaded"}})] * 3)
    with pytest.raises(ProviderError, match=r"HTTP 503 .*overloaded.*gave up after 3 attempts"):
        await generate(provider(server, maxRetries=2))
    assert len(server.requests) == 3


@pytest.mark.anyio
async def test_a_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    p = HTTPProvider(
        EchoAPI(),
        "m",
        base_url=f"http://127.0.0.1:{port}",
        options={"stream": False, "maxRetries": 1, "retryBackoff": 0},
    )
    with pytest.raises(
        ProviderError,
        match=r"connection to http://127\.0\.0\.1:\d+/models/m:generate failed.*2 attempts",
    ):
        await generate(p)


@pytest.mark.anyio
async def test_a_wait_beyond_the_deadline_fails_at_once(server: FakeLLMServer) -> None:
    server.script(None, Reply(429, headers={"Retry-After": "30"}), answer())
    ctx, _ = context()
    p = provider(server)
    with anyio.fail_after(5):
        start = anyio.current_time()
        with pytest.raises(ProviderError, match="after the provider's deadline"):
            await p.generate("hi", ctx)
        assert anyio.current_time() - start < 4
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_retry_wait_is_cancellable(server: FakeLLMServer) -> None:
    # 5 s: within the test's own deadline (HANG), so the provider does wait.
    server.script(None, Reply(429, headers={"Retry-After": "5"}), answer())
    ctx, _ = context()
    p = provider(server)
    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.generate, "hi", ctx)
            while not server.requests:
                await anyio.sleep(0.01)
            await anyio.sleep(0.05)
            start = anyio.current_time()
            tg.cancel_scope.cancel()
        assert anyio.current_time() - start < 4
    assert len(server.requests) == 1


# --- timeouts, sizes -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_server_silent_past_the_timeout(server: FakeLLMServer) -> None:
    server.script(None, Reply(delay=3, json={"text": "too late"}), answer())
    with pytest.raises(ProviderError, match=r"no answer from .* within 0\.3 s"):
        await generate(provider(server, timeout=0.3))
    assert len(server.requests) == 1  # a timeout is not retried


@pytest.mark.anyio
async def test_a_response_beyond_the_size_cap(server: FakeLLMServer) -> None:
    server.script(None, answer("x" * 5000))
    with pytest.raises(ProviderError, match="more than 2048 bytes"):
        await generate(provider(server, maxResponseBytes=2048))


@pytest.mark.anyio
async def test_an_answer_that_is_not_json_is_pain(server: FakeLLMServer) -> None:
    server.script(None, Reply(body=b"<html>gateway</html>"))
    with pytest.raises(AgentPainException, match="not JSON"):
        await generate(provider(server))


# --- streaming -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stream_deltas_reach_the_context(server: FakeLLMServer) -> None:
    server.script("/v1/models/echo-1:stream", streamed("The weather ", "in Taipei ", "is sunny."))
    ctx, deltas = context()
    p = provider(server, stream=True)
    with anyio.fail_after(HANG):
        response = await p.generate("hi", ctx)
    # One delta per network read: the pieces may come joined, never lost or reordered.
    assert "".join(deltas) == "The weather in Taipei is sunny."
    assert all(deltas)
    assert texts(response) == "The weather in Taipei is sunny."
    (request,) = server.requests
    assert request.headers["accept"] == "text/event-stream"
    assert request.json["stream"] is True


@pytest.mark.anyio
async def test_a_stream_arriving_in_bursts_is_read_once_per_read_interval(
    server: FakeLLMServer,
) -> None:
    """streamReadInterval: pieces that come within the interval are read, parsed and passed
    on together; with 0 each read goes on as it comes. Nothing is lost either way."""
    pieces = [f"w{i} " for i in range(40)]
    events: list[Any] = []
    for i, piece in enumerate(pieces):
        events.append(sse({"text": piece}))
        if i % 10 == 9:
            events.append(0.02)  # four bursts, 20 ms apart
    events.append(sse({"done": True}))
    seen = []
    for interval in (0.0, 0.5):
        server.script("/v1/models/echo-1:stream", Reply(events=list(events)))
        ctx, deltas = context()
        p = provider(server, stream=True, streamReadInterval=interval)
        with anyio.fail_after(HANG):
            response = await p.generate("hi", ctx)
        assert "".join(deltas) == "".join(pieces) == texts(response)
        seen.append(len(deltas))
    each, held = seen
    assert each >= 4  # at least one read per burst
    assert held <= 2  # the first read, then the rest together after half a second


@pytest.mark.anyio
async def test_streaming_is_the_default(server: FakeLLMServer) -> None:
    server.script(None, streamed("hi"))
    p = HTTPProvider(EchoAPI(), "m", base_url=server.url)
    assert p.transport.stream is True
    assert texts(await generate(p)) == "hi"


@pytest.mark.anyio
async def test_a_stream_cut_after_text_is_finished_not_retried(server: FakeLLMServer) -> None:
    server.script(None, streamed("The weather ", "in Tai", done=False, cut=True), answer())
    ctx, deltas = context()
    with anyio.fail_after(HANG):
        response = await provider(server, stream=True).generate("hi", ctx)
    assert "".join(deltas) == "The weather in Tai"
    assert all(deltas)
    # Spec 000 section 7: the assembler's finish says what happened.
    assert texts(response) == "The weather in Tai [the answer was cut short]"
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_cut_after_the_api_said_done_is_a_whole_answer(server: FakeLLMServer) -> None:
    server.script(None, streamed("all ", "there", cut=True), answer())
    response = await generate(provider(server, stream=True))
    assert texts(response) == "all there"
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_stream_cut_before_any_text_is_retried(server: FakeLLMServer) -> None:
    call = {"call": {"id": "c1", "name": "get_weather", "args": {"location": "Taipei"}}}
    cut = Reply(events=[sse(call)], cut=True)
    server.script(None, cut, streamed("whole"))
    ctx, deltas = context()
    with anyio.fail_after(HANG):
        response = await provider(server, stream=True).generate("hi", ctx)
    assert texts(response) == "whole"
    assert deltas == ["whole"]
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_stream_cut_on_the_last_attempt_is_finished(server: FakeLLMServer) -> None:
    server.script(None, Reply(events=[], cut=True), Reply(events=[sse({"note": 1})], cut=False))
    response = await generate(provider(server, stream=True, maxRetries=1))
    assert texts(response) == " [the answer was cut short]"
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_stream_that_stalls_after_text(server: FakeLLMServer) -> None:
    # The second event would come long after the read timeout.
    server.script(None, Reply(events=[sse({"text": "partial"}), 3.0, sse({"text": "late"})]))
    ctx, deltas = context()
    with anyio.fail_after(HANG):
        response = await provider(server, stream=True, timeout=0.3).generate("hi", ctx)
    assert deltas == ["partial"]
    assert texts(response) == "partial [the answer was cut short]"
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_stream_that_stalls_before_text(server: FakeLLMServer) -> None:
    server.script(None, Reply(events=[b": hello\n\n", 3.0, sse({"text": "late"})]), answer())
    with pytest.raises(ProviderError, match=r"stalled for 0\.3 s"):
        await generate(provider(server, stream=True, timeout=0.3))
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_json_answer_to_a_streamed_request_is_read_whole(server: FakeLLMServer) -> None:
    server.script(None, answer("no stream here"))
    ctx, deltas = context()
    with anyio.fail_after(HANG):
        response = await provider(server, stream=True).generate("hi", ctx)
    assert texts(response) == "no stream here"
    assert deltas == []


@pytest.mark.anyio
async def test_a_stream_beyond_the_size_cap(server: FakeLLMServer) -> None:
    server.script(None, streamed(*["y" * 500] * 10))
    with pytest.raises(ProviderError, match="more than 2048 bytes"):
        await generate(provider(server, stream=True, maxResponseBytes=2048))


# --- keys ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_key_never_shows_in_errors_reprs_or_logs(
    server: FakeLLMServer, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"Incorrect API key provided: {key}"}}
    server.script(None, Reply(429, json=echo, headers={"Retry-After": "0"}), Reply(401, json=echo))
    p = HTTPProvider(
        EchoAPI(), "m", api_key_env=KEY_ENV, base_url=server.url, options={"stream": False}
    )
    with pytest.raises(ProviderError) as caught:
        await generate(p)
    assert server.requests[0].headers["authorization"] == f"Bearer {key}"
    message = str(caught.value)
    assert "HTTP 401" in message
    assert "Incorrect API key provided: [redacted]" in message
    assert KEY_ENV in message  # where the key comes from: its variable's name
    assert key not in message
    assert key not in repr(caught.value)
    assert key not in repr(p)
    assert key not in repr(vars(p))
    assert "[redacted]" in caplog.text  # the retry was logged, redacted
    assert key not in caplog.text


@pytest.mark.anyio
async def test_a_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    p = HTTPProvider(EchoAPI(), "m")
    with pytest.raises(ProviderError, match=f"set the environment variable {KEY_ENV}"):
        await generate(p)
    monkeypatch.setenv("MY_OWN_KEY_VARIABLE", "")
    p = HTTPProvider(EchoAPI(), "m", api_key_env="MY_OWN_KEY_VARIABLE")
    with pytest.raises(ProviderError, match="MY_OWN_KEY_VARIABLE"):
        await generate(p)


@pytest.mark.anyio
async def test_a_custom_base_url_needs_no_key(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    server.script("/custom/prefix/models/m:generate", answer("local"))
    p = HTTPProvider(
        EchoAPI(), "m", base_url=server.url + "/custom/prefix/", options={"stream": False}
    )
    assert texts(await generate(p)) == "local"
    (request,) = server.requests
    assert request.path == "/custom/prefix/models/m:generate"
    assert "authorization" not in request.headers


@pytest.mark.anyio
async def test_the_apis_own_variables_are_tried_in_order(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = EchoAPI()
    api.api_key_envs = ("OPENSTARRY_TEST_FIRST_KEY", "OPENSTARRY_TEST_SECOND_KEY")  # type: ignore[attr-defined]
    monkeypatch.delenv("OPENSTARRY_TEST_FIRST_KEY", raising=False)
    monkeypatch.delenv("OPENSTARRY_TEST_SECOND_KEY", raising=False)
    p = HTTPProvider(api, "m", options={"stream": False})
    with pytest.raises(
        ProviderError, match="OPENSTARRY_TEST_FIRST_KEY or OPENSTARRY_TEST_SECOND_KEY"
    ):
        await generate(p)
    monkeypatch.setenv("OPENSTARRY_TEST_SECOND_KEY", "second-key")
    server.script(None, answer(), answer())
    p = HTTPProvider(api, "m", base_url=server.url, options={"stream": False})
    await generate(p)
    monkeypatch.setenv("OPENSTARRY_TEST_FIRST_KEY", "first-key")
    await generate(p)
    auth = [r.headers["authorization"] for r in server.requests]
    assert auth == ["Bearer second-key", "Bearer first-key"]


# --- an OpenAI-compatible local server (Ollama, vLLM, llama.cpp) ----------------------------------

OLLAMA_ANSWER = {
    "id": "chatcmpl-353",
    "object": "chat.completion",
    "created": 1731000000,
    "model": "llama3.2",
    "system_fingerprint": "fp_ollama",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello from a local model."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 26, "completion_tokens": 7, "total_tokens": 33},
}


def ollama_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse(
        {
            "id": "chatcmpl-353",
            "object": "chat.completion.chunk",
            "created": 1731000000,
            "model": "llama3.2",
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_ollama_style_server_with_no_key(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if stream:
        events = [
            ollama_chunk({"role": "assistant", "content": "Hello from "}),
            ollama_chunk({"role": "assistant", "content": "a local model."}),
            ollama_chunk({"role": "assistant", "content": ""}, "stop"),
            sse("[DONE]"),
        ]
        server.script("/v1/chat/completions", Reply(events=events))
    else:
        server.script("/v1/chat/completions", Reply(json=OLLAMA_ANSWER))
    p = create_provider(
        config(
            name="openai",
            model="llama3.2",
            base_url=server.url + "/v1",
            options={"stream": stream, "temperature": 0},
        )
    )
    assert isinstance(p, HTTPProvider)
    ctx, deltas = context()
    with anyio.fail_after(HANG):
        response = await p.generate("Query weather in Taipei", ctx)
    assert texts(response) == "Hello from a local model."
    assert "".join(deltas) == ("Hello from a local model." if stream else "")
    assert all(deltas)
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert "authorization" not in request.headers
    assert request.json["model"] == "llama3.2"
    assert request.json["temperature"] == 0
    assert request.json["messages"][-1] == {"role": "user", "content": "Query weather in Taipei"}
    assert bool(request.json.get("stream")) is stream


# --- connections ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_open_provider_keeps_one_client(server: FakeLLMServer) -> None:
    server.script(None, answer("1"), answer("2"), answer("3"), answer("4"))
    p = provider(server)
    async with p:
        await generate(p)
        await generate(p)
    await p.aclose()  # closing twice is harmless
    await generate(p)
    await generate(p)
    ports = [r.client_port for r in server.requests]
    assert ports[0] == ports[1]  # one pooled connection while open
    assert len({ports[1], ports[2], ports[3]}) == 3  # a client per call otherwise


# --- configuration -------------------------------------------------------------------------------


def config(**fields: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "name": "openai",
        "model": "gpt-test",
        "options": {},
        "base_url": None,
        "api_key_env": None,
    }
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"model": None}, "provider.model", "needs a model"),
        ({"model": " "}, "provider.model", "needs a model"),
        ({"base_url": "ftp://x"}, "provider.baseUrl", "http:// or https://"),
        ({"base_url": "localhost:11434"}, "provider.baseUrl", "http:// or https://"),
        ({"api_key_env": ""}, "provider.apiKeyEnv", "name an environment variable"),
        ({"options": {"stream": "yes"}}, "provider.options.stream", "true or false"),
        ({"options": {"timeout": 0}}, "provider.options.timeout", "number of seconds"),
        (
            {"options": {"streamReadInterval": 2}},
            "provider.options.streamReadInterval",
            "from 0 to 1",
        ),
        ({"options": {"timeout": float("nan")}}, "provider.options.timeout", "number of seconds"),
        ({"options": {"maxRetries": 11}}, "provider.options.maxRetries", "0 to 10"),
        ({"options": {"max_retries": True}}, "provider.options.maxRetries", "0 to 10"),
        ({"options": {"retryBackoff": -1}}, "provider.options.retryBackoff", "from 0"),
        ({"options": {"maxResponseBytes": 10}}, "provider.options.maxResponseBytes", "1024"),
        (
            {"options": {"maxRetries": 1, "max_retries": 2}},
            "provider.options.maxRetries",
            "not both",
        ),
    ],
)
def test_bad_configurations_name_their_field(
    fields: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ManifestError, match=message) as caught:
        create_provider(config(**fields))
    assert caught.value.field == field


def test_the_four_names_are_registered() -> None:
    from openstarry.providers import provider_names

    assert {"openai", "openai-responses", "anthropic", "gemini"} <= set(provider_names())


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )


def test_importing_the_registry_does_not_import_httpx() -> None:
    done = run_python(
        "import sys, openstarry.providers as p\n"
        "assert 'openai' in p.provider_names()\n"
        "assert 'httpx' not in sys.modules, 'httpx was imported'\n"
        "assert 'openstarry.providers.http' not in sys.modules\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_httpx_a_provider_needs_it_only_behind_a_proxy() -> None:
    """openstarry's own transport needs no httpx; a proxy's transport does, and says so."""
    done = run_python(
        "import os, sys, types\n"
        "sys.modules['httpx'] = None  # as if it were not installed\n"
        "from openstarry.providers import create_provider\n"
        "config = types.SimpleNamespace(name='anthropic', model='m', options={},"
        " base_url=None, api_key_env=None)\n"
        "print(type(create_provider(config)).__name__)\n"
        "os.environ['HTTPS_PROXY'] = 'http://127.0.0.1:9'\n"
        "try:\n"
        "    create_provider(config)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("HTTPProvider\n")
    assert "pip install 'openstarry[http]'" in done.stdout
    assert "anthropic" in done.stdout
    assert "proxy" in done.stdout


# --- server-sent events --------------------------------------------------------------------------


def decode(*chunks: bytes, **bounds: int) -> list[tuple[str | None, str]]:
    decoder = SSEDecoder(
        bounds.get("max_line", SSEDecoder().max_line),
        bounds.get("max_event", SSEDecoder().max_event),
    )
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    return events + decoder.close()


def test_sse_line_endings_and_multi_line_data() -> None:
    stream = b"event: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata:3\rdata:  4\r\r: comment\n\ndata: 5\n\n"
    expected = [("a", "1\n2"), (None, "3\n 4"), (None, "5")]
    assert decode(stream) == expected
    # Byte by byte: a CRLF split across chunks counts once.
    assert decode(*[stream[i : i + 1] for i in range(len(stream))]) == expected


def test_sse_fields_and_edge_cases() -> None:
    assert decode(b"\xef\xbb\xbfdata: bom\n\n") == [(None, "bom")]
    assert decode(b"event: ping\n\n") == []  # no data: nothing to dispatch
    assert decode(b"data\n\n") == [(None, "")]
    assert decode(b"id: 7\nretry: 10\nfoo: bar\ndata: x\n\n") == [(None, "x")]
    assert decode(b"data: open at the end") == []  # an unfinished event is dropped
    assert decode(b"data: ok\n\ndata: cut") == [(None, "ok")]
    assert decode(b"data: \xe6\x97", b"\xa5\n\n") == [(None, "\u65e5")]  # a split code point
    assert decode(b"data: x\n\r") == [(None, "x")]  # a final CR ends the line


def test_sse_bounds() -> None:
    with pytest.raises(SSEError, match="longer than 16"):
        decode(b"data: " + b"x" * 20, max_line=16)
    with pytest.raises(SSEError, match="longer than 16"):
        decode(b"data: " + b"x" * 20 + b"\n\n", max_line=16)
    with pytest.raises(SSEError, match="more than 10"):
        decode(b"data: 123456\ndata: 123456\n\n", max_event=10)
    assert issubclass(SSEError, ProviderError)


SECRET = "sk-test-Hardening0secretVALUE"


def chat_provider(server: FakeLLMServer, **options: Any) -> HTTPProvider:
    options.setdefault("stream", False)
    options.setdefault("retryBackoff", 0.01)
    return HTTPProvider(
        OpenAIChatAPI(),
        "gpt-test",
        base_url=server.url + "/v1",
        api_key_env=KEY_ENV,
        options=options,
    )


def hi_context() -> AgentContext:
    session = Session("s")
    session.memory.append(UserTurn("Hi"))
    return AgentContext(tools={}, session=session)


async def generate_hi(p: HTTPProvider) -> Any:
    with anyio.fail_after(HANG):
        return await p.generate("Hi", hi_context())


CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-test",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}
    ],
}


@pytest.mark.anyio
async def test_a_key_with_a_stray_line_break_is_sent_trimmed(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key read from a file often ends in ``\\r`` or ``\\n``: it was sent as it was, and h11
    refused the header with an error that quoted the key (``b'Bearer sk-...\\r'``)."""
    monkeypatch.setenv(KEY_ENV, f"  {SECRET}\r\n")
    server.script("/v1/chat/completions", Reply(json=CHAT_ANSWER))
    response = await generate_hi(chat_provider(server))
    assert response.segments[0].text == "Hello."
    (request,) = server.requests
    assert request.headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "bad", ["\x7f", "\n", "\t", " inner", "é"], ids=["del", "newline", "tab", "space", "non-ascii"]
)
async def test_a_key_that_cannot_be_a_header_is_refused_without_showing_it(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET[:10] + bad + SECRET[10:])
    with pytest.raises(ProviderError) as caught:
        await generate_hi(chat_provider(server))
    message = str(caught.value)
    assert KEY_ENV in message
    assert SECRET[:10] not in message
    assert SECRET[10:] not in message
    assert repr(SECRET[:10] + bad)[1:-1] not in message
    assert server.requests == []


@pytest.mark.anyio
async def test_a_redirect_is_a_provider_error_that_says_where_to(server: FakeLLMServer) -> None:
    """A 301 (``http://`` to ``https://``, say) was read as a body, which is not JSON: an
    ``AgentPainException`` about the model's output, where the configuration is at fault."""
    server.script(
        "/v1/chat/completions",
        Reply(
            301,
            body=b"<html>Moved</html>",
            headers={
                "Location": "https://user:pw@api.example.com/v1/chat/completions?token=abc",
                "Content-Type": "text/html",
            },
        ),
    )
    with pytest.raises(ProviderError) as caught:
        await generate_hi(chat_provider(server))
    message = str(caught.value)
    assert "301" in message
    assert "https://api.example.com/v1/chat/completions" in message
    assert "baseUrl" in message
    assert "pw" not in message
    assert "token" not in message
    assert len(server.requests) == 1  # not retried


def _decode_in_chunks(payload: bytes) -> list[tuple[str | None, str]]:
    decoder = SSEDecoder()
    events: list[tuple[str | None, str]] = []
    for i in range(0, len(payload), 1460):
        events.extend(decoder.feed(payload[i : i + 1460]))
    return events


def test_a_long_sse_line_in_small_chunks_is_one_event() -> None:
    """Each chunk re-read the whole unfinished line: a 4 MiB event (one big tool call) in
    network-sized pieces took seconds of CPU, holding up every session on the event loop.

    That it now takes linear time is measured by ``make bench``
    (``benches/test_bench_linear.py``, the same bytes as 1 KiB events beside it); here,
    what it decodes.
    """
    size = 4 * 1024 * 1024 - 1024  # under the decoder's 4 MiB line limit
    long_line = b"data: " + b"x" * size + b"\n\n"
    short_lines = (b"data: " + b"x" * 1016 + b"\n\n") * (size // 1024)
    assert _decode_in_chunks(long_line) == [(None, "x" * size)]
    assert len(_decode_in_chunks(short_lines)) == size // 1024


def test_a_long_sse_line_split_before_its_crlf_is_one_line() -> None:
    """A CRLF split across two reads ends one line, not two; a CR ends its line at once."""
    decoder = SSEDecoder()
    got = decoder.feed(b"data: a\r")
    got += decoder.feed(b"\ndata: b")
    got += decoder.feed(b"cd")
    got += decoder.feed(b"\r")
    assert got == []
    got += decoder.feed(b"\r")
    assert got == [(None, "a\nbcd")]  # a blank line, whether an LF follows or not
    got += decoder.feed(b"\n")  # ...and the LF that does is not a second blank line
    got += decoder.feed(b"data: x\n\n")
    assert got == [(None, "a\nbcd"), (None, "x")]


ANTHROPIC_OK = [
    sse(
        {
            "type": "message_start",
            "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []},
        },
        "message_start",
    ),
    sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        "content_block_start",
    ),
    sse(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi."}},
        "content_block_delta",
    ),
    sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
    sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, "message_delta"),
    sse({"type": "message_stop"}, "message_stop"),
]


def anthropic_error(kind: str) -> bytes:
    return sse({"type": "error", "error": {"type": kind, "message": f"{kind} here"}}, "error")


def anthropic_provider(server: FakeLLMServer) -> HTTPProvider:
    return HTTPProvider(
        AnthropicAPI(),
        "claude-test",
        base_url=server.url + "/v1",
        api_key_env=KEY_ENV,
        options={"stream": True, "retryBackoff": 0.01, "maxRetries": 2},
    )


@pytest.mark.anyio
async def test_an_overloaded_error_at_the_start_of_a_stream_is_retried(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic may answer 200 and then send ``overloaded_error`` as the first event; that was
    a ProviderError that ended the run, where the same error as a 529 was retried."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script(
        "/v1/messages",
        Reply(events=[ANTHROPIC_OK[0], anthropic_error("overloaded_error")]),
        Reply(events=ANTHROPIC_OK),
    )
    response = await generate_hi(anthropic_provider(server))
    assert [s.text for s in response.segments] == ["Hi."]
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_lasting_error_in_a_stream_is_not_retried(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script("/v1/messages", Reply(events=[anthropic_error("invalid_request_error")]))
    with pytest.raises(ProviderError, match="invalid_request_error"):
        await generate_hi(anthropic_provider(server))
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_an_overloaded_error_after_text_is_not_retried(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listeners saw the text: a second answer would differ from what they saw."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script(
        "/v1/messages", Reply(events=[*ANTHROPIC_OK[:3], anthropic_error("overloaded_error")])
    )
    with pytest.raises(ProviderError, match="overloaded_error"):
        await generate_hi(anthropic_provider(server))
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_stream_cancelled_midway_leaves_nothing_behind(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script("/v1/messages", Reply(events=[*ANTHROPIC_OK[:3], 5.0, *ANTHROPIC_OK[3:]]))
    p = anthropic_provider(server)
    deltas: list[str] = []
    session = Session("s")
    session.memory.append(UserTurn("Hi"))
    ctx = AgentContext(tools={}, session=session)
    scope = anyio.CancelScope()

    def cancel_on_text(text: str) -> None:
        deltas.append(text)
        scope.cancel()  # a /stop while the answer streams in

    ctx.text_sink = cancel_on_text
    with anyio.fail_after(HANG):
        async with p:
            with scope:
                await p.generate("Hi", ctx)
    assert scope.cancelled_caught
    assert deltas == ["Hi."]
    gc.collect()  # a half-read body left behind would warn here (an error under pytest)


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from(["data: a", "data: bc", "event: x", ": c", "data", "", "id: 1"]),
        max_size=12,
    ),
    breaks=st.lists(st.sampled_from(["\n", "\r", "\r\n"]), min_size=12, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_sse_events_do_not_depend_on_how_the_bytes_are_cut(
    lines: list[str], breaks: list[str], cuts: list[int]
) -> None:
    """The fast path for a chunk without a line break keeps the decoder's answers the same."""
    text = "".join(line + brk for line, brk in zip(lines, breaks, strict=False)) + "\n\n"
    data = text.encode()
    whole = SSEDecoder()
    expected = whole.feed(data) + whole.close()
    pieces = SSEDecoder()
    got: list[tuple[str | None, str]] = []
    start = 0
    for cut in sorted({min(c, len(data)) for c in cuts}):
        got += pieces.feed(data[start:cut])
        start = cut
    got += pieces.feed(data[start:]) + pieces.close()
    assert got == expected


def test_the_chat_text_fast_path_reads_what_the_assembler_reads_in_full() -> None:
    """Chunks that carry text alone arrive joined (after a chunk that named the id and the
    model); the answer is the one the assembler makes of every chunk read in full."""
    from openstarry.core import encode_response
    from openstarry.providers.openai_chat import OpenAIChatAPI

    def chunk(delta: dict[str, Any], **extra: Any) -> bytes:
        body = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, **extra}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    stream = b"".join(
        [
            chunk({"role": "assistant", "content": ""}),
            *(chunk({"content": f"t{i} "}) for i in range(50)),
            chunk({"tool_calls": [{"index": 0, "id": "k", "function": {"name": "f"}}]}),
            chunk({"content": "after"}),
            chunk({}, finish_reason="stop"),
            b"data: [DONE]\n\n",
        ]
    )
    answers = []
    for text in (None, "openai-chat"):
        decoder = SSEDecoder(text=text)
        assembler = OpenAIChatAPI().stream(ToolNameMap(["f"]))
        items = [
            item for i in range(0, len(stream), 700) for item in decoder.feed(stream[i : i + 700])
        ]
        said = []
        for item in items:
            if isinstance(item, str):
                said.append(assembler.text(item))
            else:
                said.append(assembler.feed(*item) or "")
        answers.append(("".join(said), encode_response(_as_core_response(assembler.finish()))))
        if text is not None:
            assert any(isinstance(item, str) for item in items)
    assert answers[0] == answers[1]
    assert answers[0][0] == "".join(f"t{i} " for i in range(50)) + "after"


def _as_core_response(response: Any) -> Any:
    from openstarry.core import ProviderResponse as CoreResponse

    return response if isinstance(response, CoreResponse) else response.to_core()
