"""Calls that wait for the client over HTTP: client-declared tools and approvals.

A real server (uvicorn on 127.0.0.1) runs an agent whose provider is OpenAI
Chat Completions, answered by the fake model server on loopback. The model
calls a tool the request declared (the client runs it) or a tool the manifest
says needs approval; the response ends ``incomplete``, naming what it waits
for; the client's next request on the same session carries the output or the
answer, and the run goes on to the model's answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from fake_llm_server import FakeLLMServer, Reply, chat_answer
from openstarry.api.client import AgentClient, ApiError
from openstarry.api.models import AgentRequest, MessageType, RunStatus
from openstarry.assembly import agent_from_manifest
from openstarry.manifest import parse_manifest
from test_api_http import serving

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
KEY_ENV = "OPENSTARRY_TEST_CLIENT_TOOLS_KEY"
HANG = 10.0

GET_TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def calls(name: str, args: dict[str, Any], call_id: str = "call_1") -> Reply:
    """A Chat Completions answer that calls one tool."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }
    return Reply(
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4.1",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        }
    )


def make_agent(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: Any) -> Any:
    monkeypatch.setenv(KEY_ENV, "k")
    data = json.loads(EXAMPLE.read_text())
    data["provider"] = {
        "name": "openai",
        "model": "gpt-4.1",
        "baseUrl": url + "/v1",
        "apiKeyEnv": KEY_ENV,
        "options": {"stream": False, "retryBackoff": 0.01},
    }
    (tmp_path / "workspace").mkdir(exist_ok=True)
    data.update(extra)
    return agent_from_manifest(parse_manifest(data, base_dir=tmp_path))


def request(text: str, session_id: str, **fields: Any) -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "input": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "session_id": session_id,
            **fields,
        }
    )


def answer(kind: MessageType, data: dict[str, Any], session_id: str) -> AgentRequest:
    role = "tool" if kind is MessageType.FUNCTION_CALL_OUTPUT else "user"
    return AgentRequest.model_validate(
        {
            "input": [
                {"type": kind.value, "role": role, "content": [{"type": "data", "data": data}]}
            ],
            "session_id": session_id,
        }
    )


def types_of(response: Any) -> list[str]:
    return [m.type.value for m in response.output or ()]


@pytest.mark.anyio
async def test_a_client_tool_waits_for_its_output_and_the_run_goes_on(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script(
        None, calls("get_time", {"city": "Taipei"}), chat_answer("It is 10:00 in Taipei.")
    )
    agent = make_agent(server.url, tmp_path, monkeypatch)
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            first = await client.run(request("What time is it in Taipei?", "s1", tools=[GET_TIME]))
            assert first.status is RunStatus.Incomplete
            assert first.metadata == {
                "waiting_for": {"function_call": ["call_1"], "mcp_approval_request": []}
            }
            (call,) = [m for m in first.output or () if m.type is MessageType.FUNCTION_CALL]
            data = call.content[0].data  # type: ignore[index,union-attr]
            assert data == {
                "call_id": "call_1",
                "name": "get_time",
                "arguments": '{"city": "Taipei"}',
            }
            # Unknown and missing ids are refused, naming them.
            with pytest.raises(ApiError) as unknown:
                await client.run(
                    answer(
                        MessageType.FUNCTION_CALL_OUTPUT, {"call_id": "nope", "output": "x"}, "s1"
                    )
                )
            assert unknown.value.status == 422
            assert unknown.value.code == "unknown_call_id"
            assert "nope" in unknown.value.message
            with pytest.raises(ApiError) as missing:
                await client.run(request("Never mind.", "s1"))
            assert missing.value.code == "missing_call_output"
            assert "call_1" in missing.value.message
            second = await client.run(
                answer(
                    MessageType.FUNCTION_CALL_OUTPUT,
                    {"call_id": "call_1", "output": "10:00"},
                    "s1",
                )
            )
    assert second.status is RunStatus.Completed
    assert types_of(second) == ["function_call_output", "message"]
    assert second.output[-1].get_text_content() == "It is 10:00 in Taipei."  # type: ignore[index]
    upstream_first, upstream_second = server.requests
    offered = [t["function"]["name"] for t in upstream_first.json["tools"]]
    assert "get_time" in offered
    assert "get_weather" in offered
    (result,) = [m for m in upstream_second.json["messages"] if m["role"] == "tool"]
    assert result["tool_call_id"] == "call_1"
    assert "10:00" in result["content"]


@pytest.mark.anyio
async def test_the_client_helper_runs_local_functions_until_the_run_ends(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script(None, calls("get_time", {"city": "Oslo"}), chat_answer("Noon in Oslo."))
    agent = make_agent(server.url, tmp_path, monkeypatch)
    asked: list[str] = []

    def get_time(city: str) -> dict[str, str]:
        asked.append(city)
        return {"time": "12:00"}

    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            final = await client.run_with_tools(
                request("Time in Oslo?", "s2", tools=[GET_TIME]), {"get_time": get_time}
            )
    assert final.status is RunStatus.Completed
    assert asked == ["Oslo"]
    assert final.output[-1].get_text_content() == "Noon in Oslo."  # type: ignore[index]
    (result,) = [m for m in server.requests[1].json["messages"] if m["role"] == "tool"]
    assert json.loads(result["content"]) == {"time": "12:00"}


@pytest.mark.anyio
async def test_a_declared_tool_named_like_the_agents_is_refused(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(server.url, tmp_path, monkeypatch)
    clash = {**GET_TIME, "function": {**GET_TIME["function"], "name": "get_weather"}}
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            with pytest.raises(ApiError) as refused:
                await client.run(request("hi", "s3", tools=[clash]))
    assert refused.value.status == 422
    assert refused.value.code == "tool_name_clash"
    assert "get_weather" in refused.value.message
    assert server.requests == []


@pytest.mark.anyio
async def test_a_call_that_needs_approval_runs_when_approved_and_not_when_denied(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script(
        None,
        calls("fs.write", {"path": "a.txt", "content": "hello"}, "call_w1"),
        chat_answer("Written."),
        calls("fs.write", {"path": "b.txt", "content": "bye"}, "call_w2"),
        chat_answer("I was not allowed to write it."),
    )
    agent = make_agent(server.url, tmp_path, monkeypatch, approval={"tools": ["fs.write"]})
    workspace = tmp_path / "workspace"
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            first = await client.run(request("Write hello to a.txt", "s4"))
            assert first.status is RunStatus.Incomplete
            assert "mcp_approval_request" in types_of(first)
            (approval_id,) = first.metadata["waiting_for"]["mcp_approval_request"]  # type: ignore[index]
            (asked,) = [m for m in first.output or () if m.type is MessageType.MCP_APPROVAL_REQUEST]
            data: Any = asked.content[0].data  # type: ignore[index,union-attr]
            assert data["id"] == approval_id
            assert data["name"] == "fs.write"
            assert json.loads(data["arguments"]) == {"path": "a.txt", "content": "hello"}
            assert not (workspace / "a.txt").exists()
            approved = await client.run(
                answer(
                    MessageType.MCP_APPROVAL_RESPONSE,
                    {"approval_request_id": approval_id, "approve": True},
                    "s4",
                )
            )
            assert approved.status is RunStatus.Completed
            assert (workspace / "a.txt").read_text() == "hello"
            assert approved.output[-1].get_text_content() == "Written."  # type: ignore[index]

            # Denied through the client helper: the tool never runs, the model hears why.
            denied = await client.run_with_tools(
                request("Write bye to b.txt", "s4"),
                {},
                approve=lambda req: (False, "not today"),
            )
    assert denied.status is RunStatus.Completed
    assert denied.output[-1].get_text_content() == "I was not allowed to write it."  # type: ignore[index]
    assert not (workspace / "b.txt").exists()
    told = json.dumps(server.requests[3].json["messages"])
    assert "denied" in told
    assert "not today" in told


@pytest.mark.anyio
async def test_a_slash_command_of_a_tool_that_needs_approval_is_rejected(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reachable over HTTP at all only when api.expose_tools lists it and it is not private.
    agent = make_agent(
        server.url,
        tmp_path,
        monkeypatch,
        approval={"tools": ["fs.write"]},
        api={"expose_tools": ["fs.write"]},
        mcp={"expose_tools": ["get_weather", "fs.read"], "private_tools": []},
    )
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            events = [e async for e in client.stream(request("/fs.write a.txt hello", "s5"))]
    statuses = [e.status.value for e in events if e.object == "response" and e.status]
    assert statuses == ["created", "rejected"]
    final = events[-1]
    assert final.error is not None
    assert final.error.code == "approval_required"
    assert not (tmp_path / "workspace" / "a.txt").exists()
    assert server.requests == []


@pytest.mark.anyio
async def test_at_the_terminal_a_typed_y_or_n_answers_the_waiting_approval(
    server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt asks ``Allow fs.write {...}? [y/N]``; the next line answers it."""
    from openstarry.cli.terminal import _answer_approval, _ask_approval

    server.script(
        None,
        calls("fs.write", {"path": "t.txt", "content": "yes"}, "call_t1"),
        chat_answer("Done."),
    )
    agent = make_agent(server.url, tmp_path, monkeypatch, approval={"tools": ["fs.write"]})
    asked: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: asked.append(" ".join(map(str, a))))
    with anyio.fail_after(HANG):
        async with agent:
            agent.bus.subscribe("EXEC:APPROVAL_REQUEST", lambda e: _ask_approval(e, "term"))
            assert not _answer_approval(agent, "term", "y")  # nothing waits yet
            run = agent.loop.start("write yes to t.txt", session_id="term")
            while not agent.loop.waits.pending("term"):
                await anyio.sleep(0.01)
            assert _answer_approval(agent, "term", "y")
            result = await run.wait()
    assert result.replies[-1] == "Done."
    assert (tmp_path / "workspace" / "t.txt").read_text() == "yes"
    assert any(line.startswith("Allow fs.write") and "[y/N]" in line for line in asked)
