"""A tool that needs approval, called over MCP: the client's user is asked, in both eras.

On 2026-07-28 the call is answered with an ``InputRequiredResult`` (one form
elicitation) and runs once the client retries it with a yes; on 2025-11-25 the
server sends the form as an ``elicitation/create`` request. The official SDK's
client answers, and so does openstarry's own MCP client, with its user's answer
(:mod:`openstarry.mcp.approvals`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from mcp_fixtures import helpers
from mcp_fixtures.tools import TRANSFERS
from openstarry import Agent
from openstarry.agent.waits import Answer
from openstarry.assembly import agent_from_manifest, mcp_toolset
from openstarry.core import Event
from openstarry.manifest import McpServerConfig
from openstarry.mcp import AgentMcpServer
from openstarry.mcp.approvals import APPROVAL, REQUIRES_APPROVAL, ApprovalAnswers, asked_tool
from openstarry.testing import ScriptedProvider, text, tool_call

pytestmark = pytest.mark.anyio

HANG = 10
TOOLS = [*helpers.TOOLS, "mcp_fixtures.tools:transfer"]
EXPOSE = ["mcp_fixtures.tools:whoami", "mcp_fixtures.tools:transfer"]


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[AgentMcpServer, list[Event]]]:
    manifest = helpers.write_manifest(
        tmp_path,
        {"expose_tools": EXPOSE},
        tools=TOOLS,
        approval={"tools": ["mcp_fixtures.tools:transfer"], "timeout": 5},
    )
    async with agent_from_manifest(manifest) as agent:
        events: list[Event] = []
        agent.bus.subscribe("EXEC:*", events.append)
        yield AgentMcpServer(agent), events
        with anyio.fail_after(HANG):
            await agent.bus.wait_idle()


class Asked:
    """An elicitation callback that answers every form with ``answer`` and keeps what it saw."""

    def __init__(self, action: str, content: dict[str, Any] | None = None) -> None:
        self.action = action
        self.content = content
        self.forms: list[types.ElicitRequestParams] = []
        #: The request ids the forms came with (the input request's key on 2026-07-28).
        self.ids: list[Any] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.forms.append(params)
        self.ids.append(context.request_id)
        return types.ElicitResult(action=self.action, content=self.content)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_transfers() -> None:
    TRANSFERS.clear()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_listing_says_which_tool_needs_approval(tmp_path: Path, mode: str) -> None:
    async with serving(tmp_path) as (server, _), Client(server.server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert (tools["transfer"].meta or {}).get(REQUIRES_APPROVAL) is True
        assert REQUIRES_APPROVAL not in (tools["whoami"].meta or {})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_yes_runs_the_tool_once_with_the_form_naming_it(tmp_path: Path, mode: str) -> None:
    asked = Asked("accept", {"approve": True})
    async with (
        serving(tmp_path) as (server, events),
        Client(server.server, mode=mode, elicitation_callback=asked) as client,
    ):
        with anyio.fail_after(HANG):
            result = await client.call_tool("transfer", {"amount": 7})
        assert result.is_error is not True, result
        assert result.structured_content == {"moved": 7}
        assert TRANSFERS == [7]
        assert len(asked.forms) == 1
        form = asked.forms[0]
        assert isinstance(form, types.ElicitRequestFormParams)
        if mode == "legacy":  # a request of its own, its _meta naming the tool
            assert asked_tool(form) == "transfer"
        else:  # embedded in the InputRequiredResult, under its key
            assert asked.ids == [APPROVAL]
        assert "transfer" in form.message
        assert '"amount": 7' in form.message
        assert form.requested_schema["required"] == ["approve"]
    call = next(e for e in events if e.type == "EXEC:TOOL_CALL")
    assert call.payload["approval"] == {"approve": True, "by": call.source}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize(
    ("action", "content", "why"),
    [
        ("accept", {"approve": False, "reason": "not today"}, "not today"),
        ("decline", None, "declined"),
        ("cancel", None, "dismissed"),
    ],
)
async def test_a_no_runs_nothing_and_says_why(
    tmp_path: Path, mode: str, action: str, content: dict[str, Any] | None, why: str
) -> None:
    asked = Asked(action, content)
    async with (
        serving(tmp_path) as (server, _),
        Client(server.server, mode=mode, elicitation_callback=asked) as client,
    ):
        with anyio.fail_after(HANG):
            result = await client.call_tool("transfer", {"amount": 7})
    assert result.is_error is True
    assert (result.meta or {}).get("openstarry/error", {}).get("code") == "DENIED"
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert why in text.text
    assert TRANSFERS == []
    assert len(asked.forms) == 1


async def test_a_2026_call_without_an_answer_gets_the_input_request_and_runs_nothing(
    tmp_path: Path,
) -> None:
    """Driven by hand: the first answer is the InputRequiredResult itself."""
    async with serving(tmp_path) as (server, _), Client(server.server, mode="auto") as client:
        first = await client.session.call_tool("transfer", {"amount": 3}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert first.input_requests is not None
        assert list(first.input_requests) == [APPROVAL]
        assert TRANSFERS == []
        yes = types.ElicitResult(action="accept", content={"approve": True})
        done = await client.session.call_tool(
            "transfer", {"amount": 3}, input_responses={APPROVAL: yes}, allow_input_required=True
        )
        assert isinstance(done, types.CallToolResult)
        assert done.is_error is not True
        assert TRANSFERS == [3]


async def test_a_2025_client_without_elicitation_is_refused_as_before(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, _), Client(server.server, mode="legacy") as client:
        with anyio.fail_after(HANG):
            result = await client.call_tool("transfer", {"amount": 7})
    assert result.is_error is True
    assert (result.meta or {}).get("openstarry/error", {}).get("code") == "APPROVAL_REQUIRED"
    assert TRANSFERS == []


async def test_a_tool_without_approval_asks_nothing(tmp_path: Path) -> None:
    asked = Asked("decline")
    async with (
        serving(tmp_path) as (server, _),
        Client(server.server, mode="auto", elicitation_callback=asked) as client,
    ):
        result = await client.call_tool("whoami", {})
    assert result.is_error is not True, result
    assert asked.forms == []
    assert (result.structured_content or {}).get("callDepth") == 1


# -- openstarry's own client --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_openstarrys_answers_say_yes_only_to_a_call_its_user_approved(
    tmp_path: Path, mode: str
) -> None:
    answers = ApprovalAnswers("b")
    async with (
        serving(tmp_path) as (server, _),
        Client(server.server, mode=mode, elicitation_callback=answers) as client,
    ):
        with anyio.fail_after(HANG):
            refused = await client.call_tool("transfer", {"amount": 1})
            with answers.calling("transfer", approved=False):
                unapproved = await client.call_tool("transfer", {"amount": 2})
            if mode == "legacy":  # a form of its own, matched by its _meta's tool
                with answers.calling("whoami", approved=True):  # another tool approved
                    other = await client.call_tool("transfer", {"amount": 3})
                assert other.is_error is True
            # (2026-07-28: the form comes in the call's own result, so it is that call's.)
            with answers.calling("transfer", approved=True):
                done = await client.call_tool("transfer", {"amount": 4})
    for result in (refused, unapproved):
        assert result.is_error is True
        assert (result.meta or {}).get("openstarry/error", {}).get("code") == "DENIED"
    assert done.is_error is not True
    assert done.structured_content == {"moved": 4}
    assert TRANSFERS == [4]


def _stdio_server(tmp_path: Path) -> McpServerConfig:
    folder = tmp_path / "b"
    folder.mkdir()
    manifest = helpers.write_manifest(
        folder,
        {"expose_tools": EXPOSE},
        tools=TOOLS,
        approval={"tools": ["mcp_fixtures.tools:transfer"], "timeout": 5},
    )
    return McpServerConfig(
        name="b", command=helpers.server_command(manifest), env=helpers.environment(), timeout=HANG
    )


@pytest.mark.parametrize("approve", [True, False])
async def test_an_agent_asks_its_user_before_another_agents_tool_that_needs_approval(
    tmp_path: Path, approve: bool
) -> None:
    """Agent A calls B's ``transfer`` over MCP (B in its own process, over stdio). B's
    listing says the tool needs approval, so A's run waits for its user; a yes is then
    also A's answer to B's own form, and B runs the tool once. A no reaches nobody."""
    provider = ScriptedProvider([tool_call("b.transfer", {"amount": 5}), text("done")])
    toolset = mcp_toolset([_stdio_server(tmp_path)], tool_timeout=HANG)
    agent = Agent(provider, [], toolsets=[toolset])
    results: list[Event] = []
    with anyio.fail_after(3 * HANG):
        async with agent:
            agent.bus.subscribe("EXEC:TOOL_RESULT", results.append)
            assert agent.loop.needs_approval("b.transfer")
            run = agent.loop.start("move 5", session_id="s")
            while not agent.loop.waits.pending("s"):
                await anyio.sleep(0.01)
            (wait,) = agent.loop.waits.pending("s")
            assert wait.name == "b.transfer"
            agent.loop.waits.answer("s", wait.id, Answer(approve=approve))
            await run.wait()
            await agent.bus.wait_idle()
    (result,) = [e for e in results if e.payload.get("name") == "b.transfer"]
    if approve:
        assert result.payload["success"] is True
        assert result.payload["result"] == {"moved": 5}
    else:
        assert result.payload["success"] is False
        assert result.payload["error"]["code"] == "DENIED"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_over_json_http_2026_asks_and_2025_is_refused(tmp_path: Path, mode: str) -> None:
    """Streamable HTTP answering in JSON: 2026-07-28 asks in the result as ever; a
    2025-11-25 call, whose response has no stream for a request of the server's, is
    refused (APPROVAL_REQUIRED) and runs nothing."""
    asked = Asked("accept", {"approve": True})
    async with serving(tmp_path) as (server, _):
        app = server.http_app(json_response=True)
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1:8765"
            ) as http,
            Client(
                streamable_http_client("http://127.0.0.1:8765/mcp", http_client=http),
                mode=mode,
                elicitation_callback=asked,
            ) as client,
        ):
            with anyio.fail_after(HANG):
                result = await client.call_tool("transfer", {"amount": 9})
    if mode == "legacy":  # no way back for the server's request: refused, nothing run
        assert result.is_error is True
        assert (result.meta or {}).get("openstarry/error", {}).get("code") == "APPROVAL_REQUIRED"
        assert TRANSFERS == []
    else:
        assert result.structured_content == {"moved": 9}
        assert TRANSFERS == [9]
        assert len(asked.forms) == 1
