"""What every wire translator promises, whichever API it speaks.

Each test drives the four translators (OpenAI Chat Completions and Responses,
Anthropic Messages, Gemini) as they are, without a transport: calls that share
an id get distinct ones in both directions, errors reported inside a stream say
whether a retry may pass, and long streamed answers are assembled whole.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fake_llm_server import chunk
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import AssistantTurn, MemoryEntry, Session, ToolOutcome, UserTurn
from openstarry.core import ToolCall as CoreToolCall
from openstarry.errors import ProviderError
from openstarry.providers._common import TransientProviderError
from openstarry.providers._memory import ToolExchange, conversation
from openstarry.providers.anthropic import AnthropicAPI
from openstarry.providers.gemini import GeminiAPI
from openstarry.providers.openai_chat import OpenAIChatAPI
from openstarry.providers.openai_responses import OpenAIResponsesAPI
from openstarry.providers.wire import ToolNameMap


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
