"""Tools the MCP test manifests name by import reference (``mcp_fixtures.tools:NAME``)."""

from __future__ import annotations

import sys
from typing import Any

import anyio

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.tools import tool
from openstarry.errors import ToolError


@tool
def explode(reason: str = "boom") -> str:
    """Always fails, with the code EBOOM.

    Args:
        reason: Put into the failure's message.
    """
    raise ToolError(f"exploded: {reason}", code="EBOOM")


@tool
def whoami(context: AgentContext) -> dict[str, Any]:
    """The trace id and call depth the tool runs with."""
    return {"traceId": context.trace_id, "callDepth": context.call_depth}


@tool
def noisy(text: str) -> str:
    """Prints ``text`` to stdout and stderr, then returns it.

    Args:
        text: What to print.
    """
    print(f"stdout chatter: {text}", flush=True)
    print(f"stderr chatter: {text}", file=sys.stderr, flush=True)
    return text


class Gate(Tool):
    """Blocks until the test opens it; :meth:`reset` arms it inside the running event loop."""

    name = "gate"
    description = "Waits until the test opens the gate."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {}}
        self.entered: anyio.Event | None = None
        self.opened: anyio.Event | None = None
        self.runs = 0

    def reset(self) -> None:
        self.entered = anyio.Event()
        self.opened = anyio.Event()
        self.runs = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        if self.entered is None or self.opened is None:
            raise RuntimeError("call gate.reset() first")
        self.runs += 1
        self.entered.set()
        await self.opened.wait()
        return "opened"


gate = Gate()


@tool
def mumble(text: str) -> str:
    """Prints ``text`` to stdout without flushing, then returns it.

    Args:
        text: What to print.
    """
    print(f"buffered chatter: {text}")
    return text


class Echo(Tool):
    """Returns its argument ``value``, whatever it is; counts its runs.

    Made by the tests themselves, not named by a manifest.
    """

    name = "echo"
    description = "Returns its argument."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"value": {}}}
        self.runs = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.runs += 1
        return args.get("value")


#: The transfers :func:`transfer` made, in order (the approval tests read them).
TRANSFERS: list[int] = []


@tool
def transfer(amount: int) -> dict[str, Any]:
    """Moves ``amount``: a tool with an effect, which the approval tests have approved.

    Args:
        amount: How much.
    """
    TRANSFERS.append(amount)
    return {"moved": amount}
