"""MCP over Streamable HTTP in production: idle sessions closed, a session cap, duplicate
JSON-RPC ids answered with an error, and a bearer key.

Driven in process through the app's ASGI interface with raw JSON-RPC (the
handshake era: ``initialize`` opens a session, ``Mcp-Session-Id`` names it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pydantic
import pytest

from mcp_fixtures import helpers
from mcp_fixtures.tools import gate
from openstarry import tool
from openstarry._http import BearerAuth, WrongKeys
from openstarry.agent.runtime import Agent
from openstarry.assembly import agent_from_manifest
from openstarry.mcp.server import MAX_SESSIONS, SESSION_IDLE_TIMEOUT, AgentMcpServer
from openstarry.testing import ScriptedProvider

HANG = 10
pytestmark = pytest.mark.anyio
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the SDK's session manager runs on asyncio here


@asynccontextmanager
async def mcp_http(tmp_path: Path, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with agent_from_manifest(helpers.write_manifest(tmp_path)) as agent:
        app = AgentMcpServer(agent).http_app(json_response=True, **options)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://127.0.0.1:8765",
                headers=HEADERS,
                timeout=HANG,
            ) as http,
        ):
            yield http


def request(method: str, request_id: Any, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


async def open_session(http: httpx.AsyncClient) -> httpx.Response:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    }
    return await http.post("/mcp", json=request("initialize", 0, params))


async def session(http: httpx.AsyncClient) -> dict[str, str]:
    opened = await open_session(http)
    assert opened.status_code == 200, opened.text
    headers = {
        "mcp-session-id": opened.headers["mcp-session-id"],
        "mcp-protocol-version": opened.json()["result"]["protocolVersion"],
    }
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post("/mcp", json=note, headers=headers)).status_code == 202
    return headers


async def test_the_idle_timeout_and_the_session_cap_are_set(tmp_path: Path) -> None:
    async with agent_from_manifest(helpers.write_manifest(tmp_path)) as agent:
        server = AgentMcpServer(agent)
        server.http_app()
        manager = server.server._session_manager
        assert manager is not None
        assert manager.session_idle_timeout == SESSION_IDLE_TIMEOUT == 600
        assert manager.max_sessions == MAX_SESSIONS == 256


async def test_an_idle_session_is_closed_and_the_cap_refuses_one_more(tmp_path: Path) -> None:
    async with mcp_http(tmp_path, session_idle_timeout=0.5, max_sessions=2) as http:
        first = await session(http)
        await session(http)
        refused = await open_session(http)
        assert refused.status_code == 503
        with anyio.fail_after(HANG):
            while True:  # the idle sessions are closed: room again
                await anyio.sleep(0.2)
                if (await open_session(http)).status_code == 200:
                    break
        gone = await http.post("/mcp", json=request("tools/list", 1), headers=first)
        assert gone.status_code == 404


async def test_requests_reusing_a_running_id_are_answered_with_an_error(tmp_path: Path) -> None:
    """Eight concurrent calls with one id in one session: the first runs, the seven others
    are answered at once with ``-32600``; nobody waits unanswered."""
    gate.reset()
    assert gate.entered is not None
    assert gate.opened is not None
    async with mcp_http(tmp_path) as http:
        headers = await session(http)
        answers: list[httpx.Response] = []

        async def call() -> None:
            body = request("tools/call", 7, {"name": "gate", "arguments": {}})
            answers.append(await http.post("/mcp", json=body, headers=headers))

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(call)
                await gate.entered.wait()
                for _ in range(7):
                    tasks.start_soon(call)
                while len(answers) < 7:
                    await anyio.sleep(0.01)
                gate.opened.set()
            # Once answered, the id may be used again.
            again = await http.post(
                "/mcp", json=request("tools/call", 7, {"name": "whoami"}), headers=headers
            )
    refused = [a for a in answers if a.status_code == 409]
    assert len(refused) == 7
    for answer in refused:
        assert answer.json()["id"] == 7
        assert answer.json()["error"]["code"] == -32600
    [ran] = [a for a in answers if a.status_code == 200]
    assert ran.json()["result"]["content"][0]["text"] == "opened"
    assert again.status_code == 200
    assert again.json()["result"]["structuredContent"]["callDepth"] == 1


async def test_a_key_guards_every_request(tmp_path: Path) -> None:
    async with mcp_http(tmp_path, api_key="k3y") as http:
        missing = await open_session(http)
        http.headers["authorization"] = "Bearer wrong"
        wrong = await open_session(http)
        http.headers["authorization"] = "Bearer k3y"
        right = await open_session(http)
    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert json.loads(refused.content)["code"] == "unauthorized"
    assert right.status_code == 200


async def test_wrong_keys_in_a_row_are_slowed_down(tmp_path: Path) -> None:
    """A key cannot be guessed at the server's full speed: past five wrong keys in a
    row from one address, its tries are answered 429 (Retry-After) until its wait is
    over, the right key included; after the wait, the right key is let in again."""
    clock = [0.0]
    book = WrongKeys(free_attempts=5, max_delay=60, clock=lambda: clock[0])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"in"})

    guarded = BearerAuth(app, "k3y", wrong_keys=book)
    transport = httpx.ASGITransport(app=guarded, client=("10.0.0.7", 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://mcp") as http:
        wrong = {"authorization": "Bearer guess"}
        codes = [(await http.post("/mcp", headers=wrong)).status_code for _ in range(5)]
        assert codes == [401] * 5
        slowed = await http.post("/mcp", headers={"authorization": "Bearer k3y"})
        assert slowed.status_code == 429
        assert int(slowed.headers["retry-after"]) >= 1
        clock[0] += 2  # the first wait (1 s) is over
        right = await http.post("/mcp", headers={"authorization": "Bearer k3y"})
        assert right.status_code == 200
        assert book.wait("10.0.0.7") == 0  # the right key starts the count again


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


@tool
def forecast(city: str) -> Forecast:
    """Tomorrow's weather."""
    return Forecast(city=city, celsius=20.5)


@tool
def counts(words: str) -> dict[str, int]:
    """Count the words."""
    return {word: words.split().count(word) for word in words.split()}


@tool
def echo(words: str) -> str:
    """Say it back."""
    return words


async def test_a_tool_that_says_what_it_returns_declares_an_output_schema() -> None:
    """tools/list: a tool whose return annotation is an object (a pydantic model, a
    dict[str, ...]) has that as its outputSchema; one returning text declares none."""
    agent = Agent(ScriptedProvider(["ok"]), tools=[forecast, counts, echo])
    async with agent:
        listed = AgentMcpServer(agent, expose=["forecast", "counts", "echo"]).exposed_tools()
    schemas = {t.name: t.output_schema for t in listed}
    assert schemas["echo"] is None
    assert schemas["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    forecast_schema = schemas["forecast"]
    assert forecast_schema is not None
    assert forecast_schema["type"] == "object"
    assert set(forecast_schema["properties"]) == {"city", "celsius"}
    assert forecast_schema["required"] == ["city", "celsius"]


async def test_a_tool_that_returns_a_model_answers_with_its_fields() -> None:
    """A pydantic model (or a dataclass) returned by a tool is its fields, the object its
    outputSchema describes, not an INVALID_RESULT failure."""
    from openstarry.agent.interfaces import AgentContext
    from openstarry.agent.memory import ToolOutcome
    from openstarry.core import ProviderResponse
    from openstarry.testing import FunctionProvider, text, tool_call

    seen: list[ToolOutcome] = []

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            return tool_call("forecast", {"city": "Oslo"})
        outcome = context.memory[-1]
        assert isinstance(outcome, ToolOutcome)
        seen.append(outcome)
        return text("ok")

    async with Agent(FunctionProvider(model), tools=[forecast]) as agent:
        await agent.ask("tomorrow?")
    [outcome] = seen
    assert outcome.success
    assert outcome.result == {"city": "Oslo", "celsius": 20.5}
