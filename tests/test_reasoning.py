"""The model's reasoning: a ``reasoning`` segment, kept in memory, handed back, shown as messages.

The core codec and the protocol model take the segment type (spec 000's other
types unchanged); each HTTP provider's translation is covered by its fixture
tests (``response_thinking.json``, ``response_mixed.json``,
``response_thoughts.json`` and their streams). Here: the Responses API gets its
reasoning items back, and an agent run over HTTP against a fake Anthropic
server shows ``reasoning`` messages and sends the thinking back next round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from fake_llm_server import FakeLLMServer, Reply
from openstarry import core
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import AssistantTurn, Session, ToolOutcome, UserTurn
from openstarry.api.client import AgentClient
from openstarry.api.models import AgentRequest, MessageType, RunStatus
from openstarry.assembly import agent_from_manifest
from openstarry.manifest import parse_manifest
from openstarry.protocol import ContentSegment
from openstarry.providers.openai_responses import OpenAIResponsesAPI
from openstarry.providers.wire import ToolNameMap
from test_api_http import serving

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
KEY_ENV = "OPENSTARRY_TEST_REASONING_KEY"
HANG = 10.0
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_core_round_trips_a_reasoning_segment() -> None:
    wire = (
        b'{"segments":[{"type":"reasoning","text":"Think.","signature":"s=="},'
        b'{"type":"reasoning","text":"","data":"enc"},{"type":"text","text":"4"}]}'
    )
    response = core.decode_response(wire)
    first, hidden, _ = response.segments
    assert (first.type, first.text, first.signature) == ("reasoning", "Think.", "s==")
    assert (hidden.text, hidden.data, hidden.signature) == ("", "enc", None)
    assert core.encode_response(response) == wire
    made = core.ContentSegment("reasoning", text="Think.", signature="s==")
    assert made == first
    assert "signature='s=='" in repr(made) or 'signature="s=="' in repr(made)
    with pytest.raises(ValueError, match="a reasoning segment needs text"):
        core.ContentSegment("reasoning", signature="s")
    with pytest.raises(core.DecodeError):
        core.decode_response(b'{"segments":[{"type":"reasoning","signature":"s"}]}')


def test_the_protocol_model_takes_a_reasoning_segment() -> None:
    segment = ContentSegment(type="reasoning", text="", data="enc", signature="rs_1")
    assert segment.to_core().data == "enc"
    assert ContentSegment.from_core(segment.to_core()) == segment
    with pytest.raises(ValidationError, match="a reasoning segment needs text"):
        ContentSegment(type="reasoning", signature="s")


def test_the_responses_api_gets_its_reasoning_items_back_before_the_turn() -> None:
    call = core.ToolCall("get_weather", {"location": "Taipei"}, "call_1")
    mine = core.ContentSegment("reasoning", text="Look it up.", signature="rs_1", data="gAAA")
    foreign = core.ContentSegment("reasoning", text="", signature=SIGNATURE)
    session = Session("s")
    session.memory.extend(
        [
            UserTurn("weather?"),
            AssistantTurn("", (call,), (mine, foreign)),
            ToolOutcome("call_1", "get_weather", True, result="sunny"),
            AssistantTurn("Sunny.", (), (core.ContentSegment("reasoning", text="x"),)),
        ]
    )
    body = OpenAIResponsesAPI().build_request(
        "weather?",
        AgentContext(tools={}, session=session),
        model="o4-mini",
        options={},
        stream=False,
        names=ToolNameMap(()),
    )
    assert [item["type"] for item in body["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert body["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Look it up."}],
        "encrypted_content": "gAAA",
    }


def anthropic_message(*blocks: dict[str, Any]) -> Reply:
    return Reply(
        json={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": list(blocks),
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 7},
        }
    )


def make_agent(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(KEY_ENV, "k")
    data = json.loads(EXAMPLE.read_text())
    data["provider"] = {
        "name": "anthropic",
        "model": "claude-sonnet-4-5",
        "baseUrl": url + "/v1",
        "apiKeyEnv": KEY_ENV,
        "options": {"stream": False, "retryBackoff": 0.01},
    }
    (tmp_path / "workspace").mkdir(exist_ok=True)
    return agent_from_manifest(parse_manifest(data, base_dir=tmp_path))


def request(text: str, session_id: str) -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "input": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "session_id": session_id,
        }
    )


@pytest.mark.anyio
async def test_thinking_is_a_reasoning_message_and_goes_back_next_round(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thinking = {"type": "thinking", "thinking": "2 + 2 is 4.", "signature": SIGNATURE}
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgB"}
    server.script(
        None,
        anthropic_message(thinking, redacted, {"type": "text", "text": "4."}),
        anthropic_message({"type": "text", "text": "8."}),
    )
    agent = make_agent(server.url, tmp_path, monkeypatch)
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            first = await client.run(request("2 + 2?", "s1"))
            assert first.status is RunStatus.Completed
            output = first.output or []
            assert [m.type for m in output] == [
                MessageType.REASONING,
                MessageType.REASONING,
                MessageType.MESSAGE,
            ]
            shown = [[c.text for c in m.content or ()] for m in output]  # type: ignore[union-attr]
            # The signature and the encrypted thinking are the provider's, not shown.
            assert shown == [["2 + 2 is 4."], [""], ["4."]]
            assert SIGNATURE not in first.model_dump_json()
            second = await client.run(request("times 2?", "s1"))
            assert second.status is RunStatus.Completed
    sent = server.requests[1].json["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [thinking, redacted, {"type": "text", "text": "4."}],
    }
