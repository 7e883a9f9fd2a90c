"""The weather example, run whole through each HTTP provider against a scripted server.

For each API (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages,
Gemini), the fake server on 127.0.0.1 answers the agent's first request with
that API's documented shape of "some text and a ``get_weather`` call", and its
second with the final text, whole or streamed. The run must end with that text,
and the second request must carry the tool's result paired with its call the
way that API pairs them (by ``tool_call_id``, ``call_id``, ``tool_use_id``, or
by name and order for Gemini).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from fake_llm_server import FakeLLMServer, Recorded, Reply, chat_answer, sse
from openstarry.agent.registry import tool_set_fingerprint
from openstarry.assembly import agent_from_manifest
from openstarry.core import Event
from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA
from openstarry.manifest import AgentManifest, parse_manifest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
KEY_ENV = "OPENSTARRY_TEST_AGENT_RUN_KEY"
KEY = "test-key-for-the-weather-run"
FIRST_TEXT = "Sure, let me check."
FINAL_TEXT = "The weather in Taipei is 25°C, Sunny."
ARGS_JSON = '{"location": "Taipei"}'


def chunked(text: str) -> list[str]:
    """``text`` in three pieces, as a stream would bring it."""
    third = max(len(text) // 3, 1)
    return [text[:third], text[third : 2 * third], text[2 * third :]]


# --- OpenAI Chat Completions ---------------------------------------------------------------------


def chat_whole(text: str, call: bool) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if call:
        message["tool_calls"] = [
            {
                "id": "call_Wx1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ARGS_JSON},
            }
        ]
    return Reply(
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4.1-2025-04-14",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if call else "stop",
                }
            ],
            "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99},
        }
    )


def chat_streamed(text: str, call: bool) -> Reply:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1741569952,
                "model": "gpt-4.1-2025-04-14",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in chunked(text)]
    if call:
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_Wx1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in ('{"location', '": "Tai', 'pei"}')
        ]
    events.append(chunk({}, "tool_calls" if call else "stop"))
    events.append(
        sse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1741569952,
                "model": "gpt-4.1-2025-04-14",
                "choices": [],
                "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99},
            }
        )
    )
    events.append(sse("[DONE]"))
    return Reply(events=events)


def chat_paired(second: Recorded) -> str:
    messages = second.json["messages"]
    (asked,) = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    (call,) = asked["tool_calls"]
    assert call["id"] == "call_Wx1"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Taipei"}
    (result,) = [m for m in messages if m["role"] == "tool"]
    assert result["tool_call_id"] == "call_Wx1"
    assert messages.index(result) == messages.index(asked) + 1
    return str(result["content"])


# --- OpenAI Responses ----------------------------------------------------------------------------


def _responses_output(text: str, call: bool) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]
    if call:
        output.append(
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_Rs1",
                "name": "get_weather",
                "arguments": ARGS_JSON,
                "status": "completed",
            }
        )
    return output


def _response(text: str, call: bool, status: str = "completed") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1741476542,
        "status": status,
        "model": "gpt-4.1-2025-04-14",
        "output": _responses_output(text, call) if status == "completed" else [],
        "usage": {"input_tokens": 36, "output_tokens": 87, "total_tokens": 123},
    }


def responses_whole(text: str, call: bool) -> Reply:
    return Reply(json=_response(text, call))


def responses_streamed(text: str, call: bool) -> Reply:
    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    message = _responses_output(text, False)[0]
    events = [
        event("response.created", response=_response("", call, "in_progress")),
        event(
            "response.output_item.added",
            output_index=0,
            item={**message, "status": "in_progress", "content": []},
        ),
        event(
            "response.content_part.added",
            item_id="msg_1",
            output_index=0,
            content_index=0,
            part={"type": "output_text", "text": "", "annotations": []},
        ),
    ]
    events += [
        event(
            "response.output_text.delta",
            item_id="msg_1",
            output_index=0,
            content_index=0,
            delta=piece,
        )
        for piece in chunked(text)
    ]
    events += [
        event(
            "response.output_text.done", item_id="msg_1", output_index=0, content_index=0, text=text
        ),
        event(
            "response.content_part.done",
            item_id="msg_1",
            output_index=0,
            content_index=0,
            part={"type": "output_text", "text": text, "annotations": []},
        ),
        event("response.output_item.done", output_index=0, item=message),
    ]
    if call:
        item = _responses_output(text, True)[1]
        events += [
            event(
                "response.output_item.added",
                output_index=1,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            event(
                "response.function_call_arguments.delta",
                item_id="fc_1",
                output_index=1,
                delta='{"location": ',
            ),
            event(
                "response.function_call_arguments.delta",
                item_id="fc_1",
                output_index=1,
                delta='"Taipei"}',
            ),
            event(
                "response.function_call_arguments.done",
                item_id="fc_1",
                output_index=1,
                arguments=ARGS_JSON,
            ),
            event("response.output_item.done", output_index=1, item=item),
        ]
    events.append(event("response.completed", response=_response(text, call)))
    return Reply(events=events)


def responses_paired(second: Recorded) -> str:
    items = second.json["input"]
    (call,) = [i for i in items if i.get("type") == "function_call"]
    assert call["call_id"] == "call_Rs1"
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"location": "Taipei"}
    (result,) = [i for i in items if i.get("type") == "function_call_output"]
    assert result["call_id"] == "call_Rs1"
    assert items.index(result) > items.index(call)
    return str(result["output"])


# --- Anthropic Messages --------------------------------------------------------------------------


def _anthropic_message(text: str, call: bool) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if call:
        content.append(
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "get_weather",
                "input": {"location": "Taipei"},
            }
        )
    return {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": "tool_use" if call else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 384, "output_tokens": 62},
    }


def anthropic_whole(text: str, call: bool) -> Reply:
    return Reply(json=_anthropic_message(text, call))


def anthropic_streamed(text: str, call: bool) -> Reply:
    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    whole = _anthropic_message(text, call)
    start = {
        **whole,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 384, "output_tokens": 1},
    }
    events = [
        event("message_start", message=start),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("ping"),
    ]
    events += [
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
        for piece in chunked(text)
    ]
    events.append(event("content_block_stop", index=0))
    if call:
        use = whole["content"][1]
        events.append(event("content_block_start", index=1, content_block={**use, "input": {}}))
        events += [
            event(
                "content_block_delta",
                index=1,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
            for piece in ("", '{"location": ', '"Taipei"}')
        ]
        events.append(event("content_block_stop", index=1))
    events += [
        event(
            "message_delta",
            delta={"stop_reason": whole["stop_reason"], "stop_sequence": None},
            usage={"output_tokens": 62},
        ),
        event("message_stop"),
    ]
    return Reply(events=events)


def anthropic_paired(second: Recorded) -> str:
    messages = second.json["messages"]
    asked = next(
        m
        for m in messages
        if m["role"] == "assistant"
        and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in m["content"])
    )
    (use,) = [b for b in asked["content"] if b["type"] == "tool_use"]
    assert use == {
        "type": "tool_use",
        "id": "toolu_01A09q90qw90lq917835lq9",
        "name": "get_weather",
        "input": {"location": "Taipei"},
    }
    answer = messages[messages.index(asked) + 1]
    assert answer["role"] == "user"
    first = answer["content"][0]  # Anthropic: the results come first in the next user turn
    assert first["type"] == "tool_result"
    assert first["tool_use_id"] == "toolu_01A09q90qw90lq917835lq9"
    assert not first.get("is_error", False)
    content = first["content"]
    return content if isinstance(content, str) else json.dumps(content)


# --- Gemini --------------------------------------------------------------------------------------


def _gemini(parts: list[dict[str, Any]], finish: str | None, usage: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-2.5-flash"}
    if usage:
        body["usageMetadata"] = {
            "promptTokenCount": 70,
            "candidatesTokenCount": 12,
            "totalTokenCount": 82,
        }
    return body


_GEMINI_CALL = {"functionCall": {"name": "get_weather", "args": {"location": "Taipei"}}}


def gemini_whole(text: str, call: bool) -> Reply:
    parts: list[dict[str, Any]] = [{"text": text}] + ([_GEMINI_CALL] if call else [])
    return Reply(json=_gemini(parts, "STOP", usage=True))


def gemini_streamed(text: str, call: bool) -> Reply:
    pieces = chunked(text)
    events = [sse(_gemini([{"text": piece}], None, usage=False)) for piece in pieces[:-1]]
    last: list[dict[str, Any]] = [{"text": pieces[-1]}] + ([_GEMINI_CALL] if call else [])
    events.append(sse(_gemini(last, "STOP", usage=True)))
    return Reply(events=events)


def gemini_paired(second: Recorded) -> str:
    contents = second.json["contents"]
    asked = next(
        c for c in contents if c["role"] == "model" and any("functionCall" in p for p in c["parts"])
    )
    (call,) = [p["functionCall"] for p in asked["parts"] if "functionCall" in p]
    assert call["name"] == "get_weather"
    assert call["args"] == {"location": "Taipei"}
    answer = contents[contents.index(asked) + 1]
    assert answer["role"] == "user"
    (response,) = [p["functionResponse"] for p in answer["parts"] if "functionResponse" in p]
    assert response["name"] == "get_weather"  # Gemini pairs by name and order
    if "id" in call or "id" in response:
        assert response.get("id") == call.get("id")
    return json.dumps(response["response"])


# --- the runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class API:
    name: str
    model: str
    key_header: str
    whole: Callable[[str, bool], Reply]
    streamed: Callable[[str, bool], Reply]
    paired: Callable[[Recorded], str]
    path: Callable[[bool], str]


APIS = [
    API(
        "openai",
        "gpt-4.1",
        "authorization",
        chat_whole,
        chat_streamed,
        chat_paired,
        lambda stream: "/v1/chat/completions",
    ),
    API(
        "openai-responses",
        "gpt-4.1",
        "authorization",
        responses_whole,
        responses_streamed,
        responses_paired,
        lambda stream: "/v1/responses",
    ),
    API(
        "anthropic",
        "claude-sonnet-4-5",
        "x-api-key",
        anthropic_whole,
        anthropic_streamed,
        anthropic_paired,
        lambda stream: "/v1/messages",
    ),
    API(
        "gemini",
        "gemini-2.5-flash",
        "x-goog-api-key",
        gemini_whole,
        gemini_streamed,
        gemini_paired,
        lambda stream: (
            "/v1/models/gemini-2.5-flash:"
            + ("streamGenerateContent?alt=sse" if stream else "generateContent")
        ),
    ),
]


def manifest_for(api: API, base_url: str, *, stream: bool) -> AgentManifest:
    data = json.loads(EXAMPLE.read_text())
    data["provider"] = {
        "name": api.name,
        "model": api.model,
        "baseUrl": base_url,
        "apiKeyEnv": KEY_ENV,
        "options": {"stream": stream, "retryBackoff": 0.01},
    }
    return parse_manifest(data, base_dir=EXAMPLE.parent)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS, ids=[api.name for api in APIS])
async def test_the_weather_run(
    api: API, stream: bool, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    reply = api.streamed if stream else api.whole
    server.script(None, reply(FIRST_TEXT, True), reply(FINAL_TEXT, False))
    agent = agent_from_manifest(manifest_for(api, server.url + "/v1", stream=stream))
    deltas: list[Event] = []
    said: list[Event] = []
    with anyio.fail_after(10):
        async with agent:
            agent.bus.subscribe(OUTPUT_AGENT_MESSAGE_DELTA, deltas.append)
            agent.bus.subscribe(OUTPUT_AGENT_MESSAGE, said.append)
            result = await agent.ask("Query weather in Taipei")
            await agent.bus.wait_idle()
    assert result.error is None, result.error
    assert result.replies == [FIRST_TEXT, FINAL_TEXT]
    first, second = server.requests
    assert first.path == second.path == api.path(stream)
    assert KEY in first.headers[api.key_header]
    # The first request offers get_weather; the second carries its result, paired with the call.
    assert "get_weather" in json.dumps(first.json)
    assert "Query weather in Taipei" in json.dumps(first.json)
    result_text = api.paired(second)
    assert "Taipei" in result_text
    assert "Sunny" in result_text
    if stream:
        assert "".join(e.payload["text"] for e in deltas) == FIRST_TEXT + FINAL_TEXT
    else:
        assert deltas == []
    # The tool declarations were translated once and sent again as they were.
    assert first.json["tools"] == second.json["tools"]
    assert agent.provider.tool_set_reuses == 1  # type: ignore[attr-defined]  # the second call
    fingerprint = tool_set_fingerprint(agent.tools)
    assert [e.payload["metadata"]["tools_fingerprint"] for e in said] == [fingerprint] * 2


#: A bound on any one wait, so a broken component fails a test instead of hanging it.
HANG = 10.0


@pytest.mark.anyio
async def test_issue6_unparseable_llm_output_is_pain_or_a_note_and_the_agent_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the real provider and loop: a body that is not JSON ends that run with an
    error (AgentPainException), invalid JSON arguments become a text note and run no tool,
    and the agent answers the next input."""
    from openstarry.manifest import parse_manifest

    monkeypatch.setenv(KEY_ENV, "k-conformance")
    broken_call = chat_answer("")
    broken_call.json["choices"][0]["message"]["tool_calls"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location": "Tai'},
        }
    ]
    broken_call.json["choices"][0]["finish_reason"] = "tool_calls"
    with FakeLLMServer() as server:
        server.script(
            None,
            Reply(body=b"<html>not json</html>", headers={"Content-Type": "application/json"}),
            broken_call,
            chat_answer("Still here."),
        )
        data = json.loads(EXAMPLE.read_text(encoding="utf-8"))
        data["provider"] = {
            "name": "openai",
            "model": "gpt-4.1",
            "baseUrl": server.url + "/v1",
            "apiKeyEnv": KEY_ENV,
            "options": {"stream": False, "retryBackoff": 0.01},
        }
        agent = agent_from_manifest(parse_manifest(data, base_dir=EXAMPLE.parent))
        ran: list[Event] = []
        with anyio.fail_after(HANG):
            async with agent:
                agent.bus.subscribe("EXEC:TOOL_CALL", ran.append)
                pain = await agent.ask("Query weather in Taipei")
                noted = await agent.ask("Query weather in Taipei")
                after = await agent.ask("Hello?")
                await agent.bus.wait_idle()
    assert pain.error is not None
    assert pain.error["code"] == "AGENT_PAIN", pain.error
    assert noted.error is None, noted.error
    assert len(noted.replies) == 1
    assert "get_weather" in noted.replies[0]
    assert "JSON" in noted.replies[0] or "json" in noted.replies[0]
    assert ran == []  # the broken call ran nothing
    assert after.error is None
    assert after.replies == ["Still here."]


#: Per API, how many of the weather run's streamed events arrive before the connection drops,
#: and the text they carry: the text and part of the tool call (Gemini sends a call whole in
#: its last chunk, so two of its three text pieces).
CUT_AFTER = {
    "openai": (6, "Sure, let me check."),
    "openai-responses": (11, "Sure, let me check."),
    "anthropic": (10, "Sure, let me check."),
    "gemini": (2, "Sure, let me"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("api_name", list(CUT_AFTER))
async def test_issue6_each_http_provider_retries_429_and_500_and_survives_a_cut_stream(
    api_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through each real adapter, the transport and the loop: a 429 with ``Retry-After`` and
    a 500 are retried, a stream cut in the middle of a tool call keeps the text, runs no
    tool and says the answer was cut; the next input is answered."""
    from test_provider_agent_runs import APIS, FIRST_TEXT, KEY, manifest_for
    from test_provider_agent_runs import KEY_ENV as RUNS_KEY_ENV

    api = next(a for a in APIS if a.name == api_name)
    monkeypatch.setenv(RUNS_KEY_ENV, KEY)
    whole = api.streamed(FIRST_TEXT, True)
    assert whole.events is not None
    count, delivered = CUT_AFTER[api_name]
    cut = Reply(events=list(whole.events[:count]), cut=True)
    with FakeLLMServer() as server:
        server.script(
            None,
            Reply(429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "0"}),
            Reply(500, json={"error": {"message": "boom"}}),
            cut,
            api.streamed(FINAL_TEXT, False),
        )
        agent = agent_from_manifest(manifest_for(api, server.url + "/v1", stream=True))
        ran: list[Event] = []
        with anyio.fail_after(HANG):
            async with agent:
                agent.bus.subscribe("EXEC:TOOL_CALL", ran.append)
                first = await agent.ask("Query weather in Taipei")
                second = await agent.ask("And now?")
                await agent.bus.wait_idle()
        paths = server.paths()
    assert first.error is None, first.error
    assert len(first.replies) == 1
    assert first.replies[0].startswith(delivered)
    assert "cut" in first.replies[0][len(delivered) :]
    assert ran == []
    assert second.error is None, second.error
    assert second.replies == [FINAL_TEXT]
    assert len(paths) == 4
    assert len(set(paths)) == 1
