"""Regression tests for defects found by an adversarial review of the LLM provider adapters.

Each test names what went wrong; the translators are driven as they are (no
mocks), the HTTP transport against the scripted server on 127.0.0.1.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_llm_server import FakeLLMServer, Reply, sse
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import AssistantTurn, MemoryEntry, Session, ToolOutcome, UserTurn
from openstarry.core import ToolCall as CoreToolCall
from openstarry.errors import ManifestError, ProviderError
from openstarry.providers import create_provider
from openstarry.providers._common import TransientProviderError
from openstarry.providers._memory import ToolExchange, conversation
from openstarry.providers.anthropic import AnthropicAPI
from openstarry.providers.gemini import GeminiAPI
from openstarry.providers.http import HTTPProvider, SSEDecoder
from openstarry.providers.openai_chat import OpenAIChatAPI
from openstarry.providers.openai_responses import OpenAIResponsesAPI
from openstarry.providers.wire import ToolNameMap

KEY_ENV = "OPENSTARRY_TEST_HARDENING_KEY"
SECRET = "sk-test-Hardening0secretVALUE"
#: A bound on each test's waits, so a broken transport fails instead of hanging.
HANG = 10


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


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


def context() -> AgentContext:
    session = Session("s")
    session.memory.append(UserTurn("Hi"))
    return AgentContext(tools={}, session=session)


async def generate(p: HTTPProvider) -> Any:
    with anyio.fail_after(HANG):
        return await p.generate("Hi", context())


CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-test",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}
    ],
}


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps(
        {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


# --- Chat Completions streams from servers that reuse a tool call's index -----------------------


def test_parallel_calls_that_reuse_index_zero_stay_separate() -> None:
    """Ollama (and others) stream every parallel call with ``index: 0``; each has its own id.

    They were merged into one call named ``read_fileread_file`` whose arguments
    did not parse, so neither call was made.
    """
    stream = OpenAIChatAPI().stream(ToolNameMap(["read.file"]))
    for call_id, path in (("call_a", "a.txt"), ("call_b", "b.txt")):
        piece = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
        }
        stream.feed(None, chunk({"role": "assistant", "tool_calls": [piece]}))
    stream.feed(None, chunk({}, "tool_calls"))
    stream.feed(None, "[DONE]")
    response = stream.finish()
    calls = [s.tool_call for s in response.segments if s.tool_call is not None]
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_a", "read.file", {"path": "a.txt"}),
        ("call_b", "read.file", {"path": "b.txt"}),
    ]
    assert "errors" not in (response.metadata or {})


def test_a_reused_index_keeps_its_later_pieces_with_the_newest_call() -> None:
    """After a new id reuses an index, pieces of that index without an id continue the new call."""
    stream = OpenAIChatAPI().stream(ToolNameMap(["f", "g"]))
    pieces = [
        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"x":'}},
        {"index": 0, "function": {"arguments": " 1}"}},
        {"index": 0, "id": "call_2", "function": {"name": "g", "arguments": '{"y":'}},
        {"index": 0, "function": {"arguments": " 2}"}},
    ]
    for piece in pieces:
        stream.feed(None, chunk({"tool_calls": [piece]}))
    stream.feed(None, chunk({}, "tool_calls"))
    calls = [s.tool_call for s in stream.finish().segments if s.tool_call is not None]
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_1", "f", {"x": 1}),
        ("call_2", "g", {"y": 2}),
    ]


# --- the API key ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_key_with_a_stray_line_break_is_sent_trimmed(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key read from a file often ends in ``\\r`` or ``\\n``: it was sent as it was, and h11
    refused the header with an error that quoted the key (``b'Bearer sk-...\\r'``)."""
    monkeypatch.setenv(KEY_ENV, f"  {SECRET}\r\n")
    server.script("/v1/chat/completions", Reply(json=CHAT_ANSWER))
    response = await generate(chat_provider(server))
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
        await generate(chat_provider(server))
    message = str(caught.value)
    assert KEY_ENV in message
    assert SECRET[:10] not in message
    assert SECRET[10:] not in message
    assert repr(SECRET[:10] + bad)[1:-1] not in message
    assert server.requests == []


# --- redirects -----------------------------------------------------------------------------------


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
        await generate(chat_provider(server))
    message = str(caught.value)
    assert "301" in message
    assert "https://api.example.com/v1/chat/completions" in message
    assert "baseUrl" in message
    assert "pw" not in message
    assert "token" not in message
    assert len(server.requests) == 1  # not retried


# --- bounded work on large streams ---------------------------------------------------------------


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
    """The fast path for chunks without a line break must still honour a CR held back."""
    decoder = SSEDecoder()
    got = decoder.feed(b"data: a\r")
    got += decoder.feed(b"\ndata: b")
    got += decoder.feed(b"cd")
    got += decoder.feed(b"\r")
    got += decoder.feed(b"\r")
    assert got == []  # the second CR may yet be the first half of a CRLF
    got += decoder.feed(b"x")
    assert got == [(None, "a\nbcd")]


def test_a_server_that_renames_a_call_mid_stream_still_makes_one_call() -> None:
    """A new id at an index whose call is not finished yet is the same call, as before."""
    stream = OpenAIChatAPI().stream(ToolNameMap(["f"]))
    pieces = [
        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"x":'}},
        {"index": 0, "id": "call_1b", "function": {"arguments": " 1}"}},
    ]
    for piece in pieces:
        stream.feed(None, chunk({"tool_calls": [piece]}))
    stream.feed(None, chunk({}, "tool_calls"))
    calls = [s.tool_call for s in stream.finish().segments if s.tool_call is not None]
    assert [(c.id, c.name, c.args) for c in calls] == [("call_1", "f", {"x": 1})]


# --- calls of one answer that share an id --------------------------------------------------------


def test_an_answer_whose_calls_share_an_id_gets_distinct_ids() -> None:
    """DeepSeek, GLM and Kimi's Anthropic endpoint give parallel calls one id; kept as they came,
    every later request of the session held two calls with one id, which all four APIs refuse."""
    names = ToolNameMap(["get_weather"])
    chat = OpenAIChatAPI().parse_response(
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_0",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": f'{{"c": "{c}"}}'},
                            }
                            for c in ("Paris", "Oslo")
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        },
        names,
    )
    anthropic = AnthropicAPI().parse_response(
        {
            "type": "message",
            "content": [
                {"type": "tool_use", "id": "grep:3", "name": "get_weather", "input": {"c": c}}
                for c in ("Paris", "Oslo")
            ],
            "stop_reason": "tool_use",
        },
        names,
    )
    for response, first in ((chat, "call_0"), (anthropic, "grep:3")):
        calls = [s.tool_call for s in response.segments if s.tool_call is not None]
        assert [(c.id, c.args) for c in calls] == [
            (first, {"c": "Paris"}),
            (f"{first}_2", {"c": "Oslo"}),
        ]


def test_memory_whose_calls_share_an_id_is_sent_with_distinct_ids_paired_in_order() -> None:
    """Memory written before (or by another provider) may hold such a turn: each outcome went
    to the last call of the id, the first call got a made-up failure, and a result was lost."""
    calls = (
        CoreToolCall("get_weather", {"c": "Paris"}, "call_0"),
        CoreToolCall("get_time", {"c": "Oslo"}, "call_0"),
    )
    memory: list[MemoryEntry] = [
        UserTurn("Weather in Paris, time in Oslo?"),
        AssistantTurn("", calls),
        ToolOutcome("call_0", "get_weather", True, "sunny"),
        ToolOutcome("call_0", "get_time", True, "12:00"),
    ]
    (_, exchange) = conversation(memory, "Weather in Paris, time in Oslo?")
    assert isinstance(exchange, ToolExchange)
    assert [(c.id, c.name) for c in exchange.calls] == [
        ("call_0", "get_weather"),
        ("call_0_2", "get_time"),
    ]
    assert [(o.tool_call_id, o.result) for o in exchange.outcomes] == [
        ("call_0", "sunny"),
        ("call_0_2", "12:00"),
    ]
    session = Session("s")
    for entry in memory:
        session.memory.append(entry)
    ctx = AgentContext(tools={}, session=session)
    body = OpenAIChatAPI().build_request(
        "Weather in Paris, time in Oslo?",
        ctx,
        model="m",
        options={},
        stream=False,
        names=ToolNameMap(["get_weather", "get_time"]),
    )
    sent = [m for m in body["messages"] if m["role"] in ("assistant", "tool")]
    assert [c["id"] for c in sent[0]["tool_calls"]] == ["call_0", "call_0_2"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[1:]] == [
        ("call_0", "sunny"),
        ("call_0_2", "12:00"),
    ]


# --- an error reported inside a stream -----------------------------------------------------------

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
    response = await generate(anthropic_provider(server))
    assert [s.text for s in response.segments] == ["Hi."]
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_lasting_error_in_a_stream_is_not_retried(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script("/v1/messages", Reply(events=[anthropic_error("invalid_request_error")]))
    with pytest.raises(ProviderError, match="invalid_request_error"):
        await generate(anthropic_provider(server))
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
        await generate(anthropic_provider(server))
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("api", "data", "transient"),
    [
        ("chat", {"error": {"type": "server_error", "message": "m"}}, True),
        ("chat", {"error": {"type": "invalid_request_error", "message": "m"}}, False),
        ("responses", {"type": "error", "code": "rate_limit_exceeded", "message": "m"}, True),
        (
            "responses",
            {"type": "response.failed", "response": {"error": {"code": "server_error"}}},
            True,
        ),
        ("gemini", {"error": {"code": 503, "status": "UNAVAILABLE", "message": "m"}}, True),
        ("gemini", {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "m"}}, False),
    ],
)
def test_stream_errors_say_whether_they_may_pass(api: str, data: Any, transient: bool) -> None:
    apis: dict[str, Any] = {
        "chat": OpenAIChatAPI(),
        "responses": OpenAIResponsesAPI(),
        "gemini": GeminiAPI(),
    }
    stream = apis[api].stream(ToolNameMap([]))
    with pytest.raises(ProviderError) as caught:
        stream.feed(None, json.dumps(data))
    assert isinstance(caught.value, TransientProviderError) is transient


# --- long streamed answers -----------------------------------------------------------------------


def _assembler_and_delta(api: str) -> tuple[Any, str]:
    piece = "a" * 50
    names = ToolNameMap(["f"])
    if api == "anthropic":
        stream: Any = AnthropicAPI().stream(names)
        stream.feed(None, json.dumps({"type": "message_start", "message": {"content": []}}))
        start = {"type": "content_block_start", "index": 0}
        stream.feed(None, json.dumps({**start, "content_block": {"type": "text", "text": ""}}))
        delta = {"type": "content_block_delta", "index": 0}
        return stream, json.dumps({**delta, "delta": {"type": "text_delta", "text": piece}})
    if api == "responses":
        stream = OpenAIResponsesAPI().stream(names)
        delta = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0}
        return stream, json.dumps({**delta, "delta": piece})
    if api == "responses-arguments":
        stream = OpenAIResponsesAPI().stream(names)
        delta = {"type": "response.function_call_arguments.delta", "output_index": 0}
        return stream, json.dumps({**delta, "delta": piece})
    stream = GeminiAPI().stream(names)
    return stream, json.dumps({"candidates": [{"content": {"parts": [{"text": piece}]}}]})


def _feed_all(api: str, times: int) -> Any:
    if api == "chat":
        stream: Any = OpenAIChatAPI().stream(ToolNameMap([]))
        event = chunk({"content": "a" * 50})
    else:
        stream, event = _assembler_and_delta(api)
    for _ in range(times):
        stream.feed(None, event)
    return stream


@pytest.mark.parametrize("api", ["anthropic", "responses", "responses-arguments", "gemini"])
def test_a_long_streamed_answer_is_assembled_whole(api: str) -> None:
    """Each delta was added to the text so far, copying it: 2 MB in 40,000 deltas took seconds
    of CPU on the event loop. That assembly is now linear is measured by ``make bench``
    (``benches/test_bench_linear.py``); here, what it assembles.
    """
    deltas = 40_000
    response = _feed_all(api, deltas).finish()  # cut off (no end event): the text so far is kept
    if api == "responses-arguments":
        # Only arguments, of a call whose item never arrived: a note, and no call to run.
        assert [segment.tool_call for segment in response.segments] == [None] * len(
            response.segments
        )
        assert "without a tool name" in (response.segments[0].text or "")
    else:
        assert response.segments[0].text == "a" * 50 * deltas


# --- the configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("openai", {"messages": []}, "provider.options.messages"),
        ("openai-responses", {"input": "x"}, "provider.options.input"),
        ("anthropic", {"system": "be brief"}, "provider.options.system"),
        ("anthropic", {"max_tokens": 0}, "provider.options.max_tokens"),
        ("gemini", {"contents": []}, "provider.options.contents"),
        ("gemini", {"generationConfig": 3}, "provider.options.generationConfig"),
    ],
)
def test_options_the_translator_refuses_fail_when_the_provider_is_made(
    name: str, options: dict[str, Any], field: str
) -> None:
    """They failed at the agent's first input instead, as a PROVIDER_ERROR of that run, though
    ``create_provider`` promises a ManifestError for a configuration it cannot use."""
    config = SimpleNamespace(name=name, model="m", options=options, base_url=None, api_key_env=None)
    with pytest.raises(ManifestError) as caught:
        create_provider(config)
    assert caught.value.field == field


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
