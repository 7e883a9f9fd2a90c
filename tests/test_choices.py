"""``n`` from 2 to 5: independent runs on private copies of the session's memory.

A real server (uvicorn on 127.0.0.1) runs an agent on OpenAI Chat
Completions, answered by the fake model server on loopback with a different
text for each request it gets.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest

from fake_llm_server import FakeLLMServer, Recorded, Reply, chat_answer
from openstarry.api.client import AgentClient, ApiError
from openstarry.api.models import AgentRequest, MessageType, RunStatus
from test_api_http import serving
from test_client_tools_and_approvals import make_agent

HANG = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request(text: str, session_id: str, **fields: Any) -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "input": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "session_id": session_id,
            **fields,
        }
    )


def said(record: Recorded) -> list[str]:
    """The texts of the messages a Chat Completions request sent."""
    return [m["content"] for m in record.json["messages"] if isinstance(m.get("content"), str)]


@pytest.mark.anyio
async def test_n_runs_choices_apart_and_keeps_only_the_first(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = itertools.count(1)

    def answer(record: Recorded) -> Reply:
        return chat_answer(f"answer {next(counter)}")

    server.handler = answer
    agent = make_agent(server.url, tmp_path, monkeypatch)
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            first = await client.run(request("hello", "s1"))
            assert first.status is RunStatus.Completed
            many = await client.run(request("pick a number", "s1", n=3))
            assert many.status is RunStatus.Completed
            output = many.output or []
            assert [m.type for m in output] == [MessageType.MESSAGE] * 3
            assert [(m.metadata or {}).get("choice") for m in output] == [0, 1, 2]
            texts = [m.get_text_content() for m in output]
            assert len(set(texts)) == 3
            assert many.metadata == {"choices": ["completed"] * 3}
            assert many.usage is not None
            assert many.usage["total_tokens"] == 36
            # Each choice saw the session as it was, and none of the others.
            choice_requests = server.requests[1:4]
            for record in choice_requests:
                assert said(record)[-3:] == ["hello", "answer 1", "pick a number"]
            after = await client.run(request("and then?", "s1"))
            assert after.status is RunStatus.Completed
    # Only the first choice went into the session's memory.
    history = said(server.requests[4])
    assert texts[0] in history
    assert not {texts[1], texts[2]} & set(history)
    assert history.count("pick a number") == 1
    assert not [sid for sid in agent.loop.sessions if "~choice" in sid]


@pytest.mark.anyio
async def test_n_is_refused_where_a_choice_could_wait_for_the_client(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {"approval": {"tools": ["fs.write"]}}
    agent = make_agent(server.url, tmp_path, monkeypatch, **data)
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            with pytest.raises(ApiError) as refused:
                await client.run(request("hello", "s1", n=2))
    assert refused.value.status == 422
    assert refused.value.code == "unsupported_n"
    assert "approval" in str(refused.value)
    assert server.requests == []
