"""``mcp_list_tools``: a remote MCP server's tools, listed once per response before its first call.

The remote tools here stand in for :class:`openstarry.mcp.client.RemoteTool`:
what the Agent API reads of one is its ``server_label`` and ``remote_name``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.runtime import Agent
from openstarry.api.adapter import collect_run
from openstarry.api.models import AgentRequest, DataContent, MessageType, parse_request
from openstarry.testing import ScriptedProvider, text, tool_call, tool_calls

HANG = 10.0


class Remote(Tool):
    def __init__(self, server: str, remote_name: str) -> None:
        self.server_label = server
        self.remote_name = remote_name
        self.name = f"{server}.{remote_name}"
        self.description = f"{remote_name} on {server}"
        self.parameters = {"type": "object", "properties": {"x": {"type": "integer"}}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return {"ok": self.remote_name}


class Local(Tool):
    name = "local"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return "here"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request(text_: str) -> AgentRequest:
    body = {"input": [{"role": "user", "content": [{"type": "text", "text": text_}]}]}
    return parse_request(json.dumps(body))


def data(message: Any) -> Any:
    item = message.content[0]
    assert isinstance(item, DataContent)
    return item.data


@pytest.mark.anyio
async def test_a_servers_tools_are_listed_once_before_its_first_call() -> None:
    provider = ScriptedProvider(
        [
            tool_call("fx.echo", {"x": 1}),
            tool_calls([("fx.add", {"x": 2}), ("gy.ping", {}), ("local", {})]),
            tool_call("fx.echo", {"x": 3}),
            text("Done."),
        ]
    )
    tools = [Remote("fx", "echo"), Remote("fx", "add"), Remote("gy", "ping"), Local()]
    async with Agent(provider, tools) as agent:
        with anyio.fail_after(HANG):
            final = await collect_run(agent, request("go"))
    output = final.output or []
    kinds = [m.type for m in output if m.type is not MessageType.FUNCTION_CALL_OUTPUT]
    assert kinds == [
        MessageType.MCP_LIST_TOOLS,
        MessageType.MCP_TOOL_CALL,
        MessageType.MCP_TOOL_CALL,
        MessageType.MCP_LIST_TOOLS,
        MessageType.MCP_TOOL_CALL,
        MessageType.FUNCTION_CALL,
        MessageType.MCP_TOOL_CALL,
        MessageType.MESSAGE,
    ]
    listed = [data(m) for m in output if m.type is MessageType.MCP_LIST_TOOLS]
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert listed == [
        {
            "server_label": "fx",
            "tools": [
                {"name": "echo", "description": "echo on fx", "input_schema": schema},
                {"name": "add", "description": "add on fx", "input_schema": schema},
            ],
        },
        {
            "server_label": "gy",
            "tools": [{"name": "ping", "description": "ping on gy", "input_schema": schema}],
        },
    ]
    roles = {m.role for m in output if m.type is MessageType.MCP_LIST_TOOLS}
    assert {r.value for r in roles if r is not None} == {"assistant"}


@pytest.mark.anyio
async def test_a_run_without_remote_tools_lists_none() -> None:
    provider = ScriptedProvider([tool_call("local", {}), text("Done.")])
    async with Agent(provider, [Local()]) as agent:
        with anyio.fail_after(HANG):
            final = await collect_run(agent, request("go"))
    assert MessageType.MCP_LIST_TOOLS not in [m.type for m in final.output or []]
