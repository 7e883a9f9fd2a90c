"""Tools of the agents in the MCP call-cycle test (``mcp_fixtures.cycle_tools:NAME``).

Each agent has ``relay``, which passes the call on to its peer's ``relay``
(the remote tool ``peer.relay``), and ``whoami``. Two agents that name each
other as ``peer`` call each other in a cycle until the recursion guard stops it.
"""

from __future__ import annotations

from typing import Any

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.tools import tool
from openstarry.errors import ToolError


class Relay(Tool):
    """Calls the peer agent's ``relay`` with the same arguments, one hop deeper."""

    name = "relay"
    description = "Pass the call on to the peer agent's relay."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"note": {"type": "string"}}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        peer = context.tools.get("peer.relay")
        if peer is None:
            raise ToolError("this agent has no peer.relay", code="NO_PEER")
        # The context goes on: the peer's call carries this call's depth + 1.
        return await peer.run(args, context)


relay = Relay()


@tool
def whoami(context: AgentContext) -> dict[str, Any]:
    """The agent's name, and the depth and trace the call runs with."""
    return {
        "agent": context.agent_name,
        "callDepth": context.call_depth,
        "traceId": context.trace_id,
    }
