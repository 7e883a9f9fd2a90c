"""A tool call that completes at once is run in one step that never waits
(``ToolExecutor.execute_at_once``), and it must be the same call as one run
the usual way: the same outcome, the same observations for the provider, the
same ``EXEC:TOOL_CALL`` and ``EXEC:TOOL_RESULT`` events. Each case runs once
with an ``async def`` that never waits (the one-step path) and once with the
same tool waiting at a checkpoint first (``execute``), and compares them.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.loop import ExecutionLoop, LoopLimits
from openstarry.agent.memory import MemoryEntry, Observation, ToolOutcome
from openstarry.agent.tools import tool
from openstarry.bus import EventBus
from openstarry.core import Event, ProviderResponse
from openstarry.errors import ToolArgumentsError, ToolError
from openstarry.testing import FunctionProvider, text, tool_call

TOOL_EVENTS = ("EXEC:TOOL_CALL", "EXEC:TOOL_RESULT")


@tool(name="pick")
async def pick_at_once(x: int, how: str = "ok") -> Any:
    """Answer, or fail as ``how`` says; never waits."""
    if how == "raise":
        raise ToolError("it says no", code="NOPE")
    if how == "args":
        raise ToolArgumentsError("pick: the tool itself refuses x")
    if how == "crash":
        raise RuntimeError("broken")
    if how == "object":
        return object()  # no JSON can carry it: an INVALID_RESULT failure
    return x * 2


@tool(name="pick")
async def pick_waiting(x: int, how: str = "ok") -> Any:
    """The same, waiting at a checkpoint first."""
    await anyio.lowlevel.checkpoint()
    return await pick_at_once.func(x, how)


def calling(args: dict[str, Any]) -> FunctionProvider:
    def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        if not context.tool_results:
            return tool_call("pick", args, id="call-1")
        return text("done")

    return FunctionProvider(answer)


def comparable(entry: MemoryEntry) -> Any:
    if isinstance(entry, ToolOutcome):
        error = entry.error
        return ("outcome", entry.success, entry.result, error and (error.code, error.source))
    if isinstance(entry, Observation):
        return ("observation", entry.text)
    return type(entry).__name__


async def run_once(tool_: Any, args: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The memory and the tool events of one ask."""
    events: list[Event] = []
    async with EventBus() as bus:
        for kind in TOOL_EVENTS:
            bus.subscribe(kind, events.append)
        async with ExecutionLoop(bus, calling(args), [tool_]) as loop:
            await loop.ask("go", session_id="s")
            await bus.wait_idle()
            memory = [comparable(m) for m in loop.session("s").memory]
    tool_events = [(e.type, e.payload) for e in events if e.type in TOOL_EVENTS]
    return memory, tool_events


@pytest.mark.anyio
@pytest.mark.parametrize(
    "args",
    [
        {"x": 2},
        {"x": "not a number"},
        {"y": 1},
        {"x": 1, "how": "raise"},
        {"x": 1, "how": "args"},
        {"x": 1, "how": "crash"},
        {"x": 1, "how": "object"},
    ],
    ids=["ok", "invalid", "unknown-argument", "tool-error", "refuses-itself", "crash", "no-json"],
)
async def test_a_call_that_completes_at_once_is_the_same_call(args: dict[str, Any]) -> None:
    with anyio.fail_after(HANG):
        fast = await run_once(pick_at_once, args)
        usual = await run_once(pick_waiting, args)
    # The turn runs a lone call in one step when its tool completes at once.
    assert pick_at_once.completes_at_once
    assert not pick_waiting.completes_at_once
    assert fast[0] == usual[0]
    assert fast[1] == usual[1]
    [call, result] = fast[1]
    assert call[1]["toolCallId"] == result[1]["toolCallId"] == "call-1"
    [outcome] = [m for m in fast[0] if m[0] == "outcome"]
    expected = {
        "ok": (True, 4, None),
        "raise": (False, None, ("NOPE", "tool")),
        "args": (False, None, ("INVALID_ARGUMENTS", "core")),
        "crash": (False, None, ("TOOL_ERROR", "tool")),
    }.get(args.get("how", "ok") if "x" in args and isinstance(args["x"], int) else "")
    if expected is not None:
        assert outcome[1:] == expected


@pytest.mark.anyio
async def test_an_at_once_call_the_provider_got_wrong_is_heard_of() -> None:
    with anyio.fail_after(HANG):
        memory, _events = await run_once(pick_at_once, {"x": "nine"})
    [outcome] = [m for m in memory if m[0] == "outcome"]
    assert outcome[1:] == (False, None, ("INVALID_ARGUMENTS", "core"))
    [observation] = [m for m in memory if m[0] == "observation"]
    assert observation[1].startswith("Invalid arguments for pick:")


@pytest.mark.parametrize("at_once", [True, False], ids=["one-step", "execute"])
@pytest.mark.anyio
async def test_a_call_that_succeeds_starts_the_failure_streaks_again(at_once: bool) -> None:
    """Failed, succeeded, failed: with ``max_failure_streak=2`` the session is
    not locked, since the success in between started the streak again."""
    used = pick_at_once if at_once else pick_waiting
    hows = {1: "raise", 2: "ok", 3: "raise"}

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "go" and context.round in hows:
            return tool_call("pick", {"x": context.round, "how": hows[context.round]})
        return text("done")

    async with (
        EventBus() as bus,
        ExecutionLoop(
            bus,
            FunctionProvider(model),
            [used],
            limits=LoopLimits(max_failure_streak=2, max_tool_rounds=5),
        ) as loop,
    ):
        with anyio.fail_after(HANG):
            result = await loop.ask("go", session_id="s")
            session = loop.sessions["s"]
            assert (result.error, result.replies) == (None, ["done"])
            assert session.failure_streak == 1
            assert not session.locked
            again = await loop.ask("again", session_id="s")
    assert again.error is None
