"""Tool execution of the execution loop: how the tool calls of a response are run.

Concurrency and ``max_concurrent_tools``, timeouts, tools that raise, invalid
arguments, unknown tools, results that are not JSON, failure streaks and the session
lock, the warning for repeated failures, and the EXEC:TOOL_CALL / EXEC:TOOL_RESULT
events with every call answered in order. Waits are bounded by :data:`HANG` only as a
guard against a hang.
"""

from __future__ import annotations

import asyncio
import errno
import sys
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import (
    AGENT_MESSAGE,
    ERROR,
    HANG,
    TICK_START,
    TOOL_CALL,
    TOOL_RESULT,
    USER_MESSAGE,
    AsyncRaises,
    Blocking,
    FakeProvider,
    Raises,
    Returns,
    UnprintableError,
    Weather,
    call,
    last_state,
    observations,
    outcomes,
    response,
    running,
    schema,
    text,
    then_say,
)
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import LoopLimits, RunResult
from openstarry.agent.memory import AssistantTurn, MemoryEntry, ToolFailure, ToolOutcome
from openstarry.core import ProviderResponse
from openstarry.errors import ToolError
from openstarry.testing import ScriptedProvider, tool_call
from openstarry.testing import text as text_response


@pytest.mark.anyio
async def test_a_tool_call_without_id_gets_one_and_the_result_matches_it() -> None:
    provider = then_say(response(call("get_weather", {"location": "Taipei"})), "Sunny.")
    async with running(provider, [Weather()]) as h:
        result = await h.ask("weather?")
    [tool_call] = h.of(TOOL_CALL)
    [tool_result] = h.of(TOOL_RESULT)
    call_id = tool_call.payload["toolCallId"]
    assert isinstance(call_id, str)
    assert call_id
    assert tool_result.payload["toolCallId"] == call_id
    assert outcomes(provider.calls[1].memory)[0].tool_call_id == call_id
    # A response with only a tool call says nothing: one message, the final one.
    assert result.replies == ["Sunny."]
    assert [e.payload["final"] for e in h.of(AGENT_MESSAGE)] == [True]


@pytest.mark.anyio
async def test_unknown_tool_is_fed_back_and_the_provider_sees_it() -> None:
    provider = then_say(response(call("get_wether", {"location": "Taipei"}, "c1")), "Oops.")
    weather = Weather()
    async with running(provider, [weather]) as h:
        result = await h.ask("weather?")
    assert result.error is None
    assert result.replies == ["Oops."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "c1"
    assert tool_result.payload["success"] is False
    error = tool_result.payload["error"]
    assert error["code"] == "TOOL_NOT_FOUND"
    assert error["source"] == "core"
    assert "get_wether" in error["message"]
    assert weather.calls == []
    # Called again, and shown the observation and the failed outcome.
    assert len(provider.calls) == 2
    seen = provider.calls[1].memory
    [observation] = observations(seen)
    assert "get_wether" in observation
    assert "get_weather" in observation  # the tools that do exist
    [outcome] = outcomes(seen)
    assert outcome == ToolOutcome(
        "c1", "get_wether", False, error=ToolFailure("TOOL_NOT_FOUND", error["message"], "core")
    )
    assert last_state(h.events) == {"from": "THINKING", "to": "IDLE"}


@pytest.mark.anyio
async def test_invalid_arguments_are_fed_back() -> None:
    provider = then_say(response(call("get_weather", {"city": "Taipei"}, "c1")), "Let me fix that.")
    weather = Weather()
    async with running(provider, [weather]) as h:
        result = await h.ask("weather?")
    assert result.error is None
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "INVALID_ARGUMENTS"
    assert "location" in tool_result.payload["error"]["message"]
    assert weather.calls == []
    seen = provider.calls[1].memory
    [observation] = observations(seen)
    assert "get_weather" in observation
    assert "location" in observation
    assert outcomes(seen)[0].error is not None
    assert outcomes(seen)[0].error.code == "INVALID_ARGUMENTS"  # type: ignore[union-attr]


FAILURES = [
    pytest.param(
        ToolError("Operation not permitted", code="EPERM"),
        "EPERM",
        "Operation not permitted",
        id="tool-error",
    ),
    pytest.param(RuntimeError("boom"), "TOOL_ERROR", "RuntimeError: boom", id="exception"),
    pytest.param(
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        "ENOENT",
        "No such file or directory",
        id="enoent",
    ),
    pytest.param(
        PermissionError(errno.EACCES, "Permission denied", "secret.txt"),
        "EACCES",
        "Permission denied",
        id="eacces",
    ),
    # A TimeoutError of the tool's own (a socket's, say) is an exception it raised,
    # not the loop's tool timeout: it did not run for tool_timeout seconds.
    pytest.param(
        TimeoutError("read timed out"),
        "TOOL_ERROR",
        "TimeoutError: read timed out",
        id="own-timeout-error",
    ),
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("exc", "code", "message"), FAILURES)
@pytest.mark.anyio
async def test_a_tool_that_raises_becomes_a_failed_result(
    exc: Exception, code: str, message: str, is_async: bool
) -> None:
    tool = AsyncRaises("risky", exc) if is_async else Raises("risky", exc)
    assert tool.is_async is is_async
    provider = then_say(response(call("risky", {}, "c1")), "It failed.")
    async with running(provider, [tool]) as h:
        result = await h.ask("try it")
    assert result.error is None
    assert result.replies == ["It failed."]
    assert tool.calls == 1
    [tool_result] = h.of(TOOL_RESULT)
    failure = {"code": code, "message": message, "source": "tool"}
    assert tool_result.payload == {
        "toolCallId": "c1",
        "name": "risky",
        "success": False,
        "error": failure,
    }
    assert outcomes(provider.calls[1].memory) == [
        ToolOutcome("c1", "risky", False, error=ToolFailure(code, message, "tool"))
    ]


class RaisingValidate(Tool):
    """A tool whose own ``validate`` fails with something other than ToolArgumentsError."""

    name = "picky"

    def __init__(self) -> None:
        self.ran = False

    def validate(self, args: Any) -> dict[str, Any]:
        raise KeyError("unit")

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.ran = True
        return "ran"


@pytest.mark.anyio
async def test_a_tool_whose_validate_raises_is_a_failed_result_not_a_crash() -> None:
    provider = then_say(response(call("picky", {}, "c1")), "It refused.")
    picky = RaisingValidate()
    async with running(provider, [picky, Weather()]) as h:
        result = await h.ask("go")
        # The loop is still serving: another session gets its answer.
        other = await h.ask("/get_weather Taipei", session_id="other")
    assert result.error is None
    assert result.replies == ["It refused."]
    assert picky.ran is False
    [tool_result, _] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "c1"
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] in {"INVALID_ARGUMENTS", "TOOL_ERROR"}
    assert other.error is None


@pytest.mark.parametrize(
    "value", [object(), {"when": threading.Event()}, float("nan")], ids=["object", "nested", "nan"]
)
@pytest.mark.anyio
async def test_a_result_that_is_not_json_is_invalid_result(value: Any) -> None:
    provider = then_say(response(call("odd", {}, "c1")), "Hm.")
    async with running(provider, [Returns("odd", value)]) as h:
        result = await h.ask("go")
    assert result.error is None
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["toolCallId"] == "c1"
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "INVALID_RESULT"
    assert tool_result.payload["error"]["source"] == "core"
    [outcome] = outcomes(provider.calls[1].memory)
    assert outcome.success is False
    assert outcome.error is not None
    assert outcome.error.code == "INVALID_RESULT"


@pytest.mark.anyio
async def test_tool_timeout_cancels_the_tool() -> None:
    slow = Blocking()
    cancelled_before_round_2: list[bool] = []

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            return response(call("slow", {}, "c1"))
        cancelled_before_round_2.append(slow.cancelled)
        return response(text("Too slow."))

    provider = FakeProvider(reply=reply)
    async with running(provider, [slow], limits=LoopLimits(tool_timeout=0.05)) as h:
        result = await h.ask("go")
    assert result.error is None
    assert result.replies == ["Too slow."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["success"] is False
    assert tool_result.payload["error"]["code"] == "TIMEOUT"
    assert tool_result.payload["error"]["source"] == "core"
    assert slow.started.is_set()
    assert slow.cancelled is True
    assert slow.finished is False
    assert cancelled_before_round_2 == [True]
    assert outcomes(provider.calls[1].memory)[0].error is not None


class BlockingSync(Tool):
    """A synchronous tool (worker thread) that blocks until released."""

    name = "sync_slow"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.done = threading.Event()

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        try:
            self.release.wait(HANG)
            return "late"
        finally:
            self.done.set()


@pytest.mark.anyio
async def test_tool_timeout_of_a_sync_tool() -> None:
    tool = BlockingSync()
    provider = then_say(response(call("sync_slow", {}, "c1")), "Too slow.")
    async with running(provider, [tool], limits=LoopLimits(tool_timeout=0.05)) as h:
        try:
            result = await h.ask("go")
        finally:
            tool.release.set()
            await anyio.to_thread.run_sync(tool.done.wait, HANG)
    assert result.replies == ["Too slow."]
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["error"]["code"] == "TIMEOUT"


class Meet(Tool):
    """Two calls that each wait for the other to have started: sequential runs deadlock.

    The call with ``last`` also waits for its peer to finish, so it finishes last.
    """

    name = "meet"
    parameters = schema("me", "peer")

    def __init__(self) -> None:
        self.started = {"a": anyio.Event(), "b": anyio.Event()}
        self.finished = {"a": anyio.Event(), "b": anyio.Event()}
        self.order: list[str] = []

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        me, peer = args["me"], args["peer"]
        self.started[me].set()
        await self.started[peer].wait()
        if args.get("last"):
            await self.finished[peer].wait()
        self.order.append(me)
        self.finished[me].set()
        return f"{me} met {peer}"


@pytest.mark.anyio
async def test_tool_calls_of_one_response_run_concurrently_and_report_in_call_order() -> None:
    meet = Meet()
    provider = then_say(
        response(
            call("meet", {"me": "a", "peer": "b", "last": True}, "c1"),
            call("meet", {"me": "b", "peer": "a"}, "c2"),
        ),
        "Both met.",
    )
    async with running(provider, [meet]) as h:
        result = await h.ask("meet")  # deadlocks (and fails after HANG) if run one by one
    assert result.error is None
    assert meet.order == ["b", "a"]  # the first call finished last ...
    # ... and still its events and outcome come first.
    assert [e.payload["toolCallId"] for e in h.of(TOOL_CALL)] == ["c1", "c2"]
    assert [e.payload["toolCallId"] for e in h.of(TOOL_RESULT)] == ["c1", "c2"]
    assert [e.payload["result"] for e in h.of(TOOL_RESULT)] == ["a met b", "b met a"]
    types = [e.type for e in h.events]
    assert types.index(TOOL_RESULT) > len(types) - 1 - types[::-1].index(TOOL_CALL)
    assert [o.tool_call_id for o in outcomes(provider.calls[1].memory)] == ["c1", "c2"]
    calls, results = h.of(TOOL_CALL), h.of(TOOL_RESULT)
    assert [r.parent_id for r in results] == [c.id for c in calls]


class Counting(Tool):
    """Counts how many of its calls run at once."""

    name = "count"
    parameters = schema("n", types={"n": "integer"})

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.active += 1
        self.peak = max(self.peak, self.active)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        self.active -= 1
        return args["n"]


@pytest.mark.parametrize(("cap", "peak"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.anyio
async def test_max_concurrent_tools(cap: int, peak: int) -> None:
    counting = Counting()
    provider = then_say(response(*(call("count", {"n": n}, f"c{n}") for n in range(3))), "Counted.")
    limits = LoopLimits(max_concurrent_tools=cap)
    async with running(provider, [counting], limits=limits) as h:
        result = await h.ask("count")
    assert result.error is None
    assert counting.peak == peak
    assert [e.payload["result"] for e in h.of(TOOL_RESULT)] == [0, 1, 2]
    assert [e.payload["toolCallId"] for e in h.of(TOOL_RESULT)] == ["c0", "c1", "c2"]


@pytest.mark.anyio
async def test_three_identical_failing_calls_add_a_warning() -> None:
    broken = Raises("broken", RuntimeError("nope"))
    provider = FakeProvider(
        response(call("broken", {"x": 1})),
        response(call("broken", {"x": 1})),
        response(call("broken", {"x": 1})),
        response(text("I give up.")),
    )
    async with running(provider, [broken]) as h:
        result = await h.ask("try")
    assert result.error is None
    assert broken.calls == 3
    assert observations(provider.calls[2].memory) == []
    [warning] = observations(provider.calls[3].memory)
    assert "broken" in warning
    assert "3 times" in warning
    assert h.loop.sessions["s"].failure_streak == 3
    assert h.loop.sessions["s"].locked is False


@pytest.mark.anyio
async def test_different_failing_calls_add_no_warning() -> None:
    broken = Raises("broken", RuntimeError("nope"))
    provider = FakeProvider(
        response(call("broken", {"x": 1})),
        response(call("broken", {"x": 2})),
        response(call("broken", {"x": 3})),
        response(text("I give up.")),
    )
    async with running(provider, [broken]) as h:
        await h.ask("try")
    assert observations(h.loop.sessions["s"].memory) == []


def failing_provider(plan: Mapping[str, int]) -> FakeProvider:
    """For prompt p, call the broken tool in the first plan[p] rounds, then answer."""

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round <= plan.get(prompt, 0):
            return response(call("broken", {"round": context.round}))
        if prompt == "weather" and context.round == 1:
            return response(call("get_weather", {"location": "Taipei"}))
        return response(text(f"answer to {prompt}"))

    return FakeProvider(reply=reply)


@pytest.mark.anyio
async def test_failure_streak_locks_the_session_until_reset() -> None:
    provider = failing_provider({"break": 10})
    broken = Raises("broken", RuntimeError("nope"))
    weather = Weather()
    limits = LoopLimits(max_failure_streak=3)
    async with running(provider, [broken, weather], limits=limits) as h:
        result = await h.ask("break")
        session = h.loop.sessions["s"]
        assert result.error is not None
        assert result.error["code"] == "SESSION_LOCKED"
        assert broken.calls == 3
        assert len(provider.calls) == 3
        assert session.locked is True
        assert last_state(h.trace(result.trace_id)) == {"from": "EXECUTING", "to": "IDLE"}
        [error] = h.of(ERROR, result.trace_id)
        assert error.parent_id == h.of(TICK_START, result.trace_id)[-1].id

        # Locked: inputs and slash tools are refused without calling anyone.
        refused = await h.ask("hello")
        assert refused.error is not None
        assert refused.error["code"] == "SESSION_LOCKED"
        assert refused.replies == []
        assert len(provider.calls) == 3
        assert h.of(TICK_START, refused.trace_id) == []
        [error] = h.of(ERROR, refused.trace_id)
        assert error.parent_id == h.of(USER_MESSAGE, refused.trace_id)[0].id
        slash = await h.ask("/get_weather Taipei")
        assert slash.error is not None
        assert slash.error["code"] == "SESSION_LOCKED"
        assert weather.calls == []

        # Another session is not locked.
        other = await h.ask("hello", session_id="other")
        assert other.replies == ["answer to hello"]

        await h.ask("/reset")
        assert session.locked is False
        answered = await h.ask("hello")
    assert answered.error is None
    assert answered.replies == ["answer to hello"]


@pytest.mark.anyio
async def test_failure_streak_counts_across_inputs_and_a_success_resets_it() -> None:
    provider = failing_provider({"fail twice": 2, "fail once": 1})
    broken = Raises("broken", RuntimeError("nope"))
    limits = LoopLimits(max_failure_streak=3)
    async with running(provider, [broken, Weather()], limits=limits) as h:
        first = await h.ask("fail twice")
        assert first.error is None
        assert h.loop.sessions["s"].failure_streak == 2
        await h.ask("weather")  # a successful tool call resets the streak
        assert h.loop.sessions["s"].failure_streak == 0
        await h.ask("fail twice")
        assert h.loop.sessions["s"].locked is False
        locked = await h.ask("fail once")
    assert locked.error is not None
    assert locked.error["code"] == "SESSION_LOCKED"
    assert h.loop.sessions["s"].locked is True
    # The run stopped at the locking round: the provider was not asked again.
    assert [c.round for c in provider.calls if c.trace_id == locked.trace_id] == [1]


@pytest.mark.anyio
async def test_a_success_between_identical_failures_breaks_the_row() -> None:
    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round <= {"fail twice": 2, "fail once": 1}.get(prompt, 0):
            return response(call("broken", {"x": 1}))
        return response(text("done"))

    provider = FakeProvider(reply=reply)
    broken = Raises("broken", RuntimeError("nope"))
    async with running(provider, [broken, Weather()]) as h:
        await h.ask("fail twice")
        session = h.loop.sessions["s"]
        assert session.failure_streak == 2
        # A successful call (here a slash command) ends the row of failures ...
        slash = await h.ask("/get_weather Taipei")
        assert slash.error is None
        assert session.failure_streak == 0
        # ... so one more identical failure is the first of a new row, not the third.
        await h.ask("fail once")
    assert broken.calls == 3
    assert session.failure_streak == 1
    assert observations(session.memory) == []


def assert_calls_answered_in_order(memory: Iterable[MemoryEntry]) -> None:
    """Each assistant turn's calls are followed at once by their outcomes, in call order."""
    entries = list(memory)
    for i, entry in enumerate(entries):
        if isinstance(entry, AssistantTurn) and entry.tool_calls:
            answers = entries[i + 1 : i + 1 + len(entry.tool_calls)]
            assert [a.tool_call_id for a in answers if isinstance(a, ToolOutcome)] == [
                c.id for c in entry.tool_calls
            ], entries


@pytest.mark.anyio
async def test_round_limit_answers_the_calls_it_does_not_run() -> None:
    provider = FakeProvider(
        reply=lambda prompt, context: response(call("get_weather", {"location": "Taipei"}))
    )
    async with running(provider, [Weather()], limits=LoopLimits(max_tool_rounds=1)) as h:
        await h.ask("loop forever")
    memory = h.loop.sessions["s"].memory
    assert_calls_answered_in_order(memory)
    last = outcomes(memory)[-1]
    assert last.success is False
    assert last.error is not None
    assert last.error.code == "TOOL_ROUND_LIMIT"


@pytest.mark.anyio
async def test_a_stopped_run_answers_its_open_calls() -> None:
    slow = Blocking()
    provider = FakeProvider(reply=lambda prompt, context: response(call("slow", {}, "c1")))
    async with running(provider, [slow]) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go")
                await slow.started.wait()
                h.loop.command("stop", session_id="s")
    memory = h.loop.sessions["s"].memory
    assert_calls_answered_in_order(memory)
    [outcome] = outcomes(memory)
    assert outcome.tool_call_id == "c1"
    assert outcome.error is not None
    assert outcome.error.code == "CANCELLED"


@pytest.mark.anyio
async def test_observations_follow_the_outcomes_of_their_round() -> None:
    provider = then_say(
        response(call("nope", {}, "n1"), call("get_weather", {"location": "Taipei"}, "w1")),
        "done",
    )
    async with running(provider, [Weather()]) as h:
        await h.ask("go")
    memory = list(h.loop.sessions["s"].memory)
    assert_calls_answered_in_order(memory)
    kinds = [type(m).__name__ for m in memory]
    assert kinds == [
        "UserTurn",
        "AssistantTurn",
        "ToolOutcome",
        "ToolOutcome",
        "Observation",
        "AssistantTurn",
    ]


@pytest.mark.anyio
async def test_a_success_breaks_the_row_of_identical_failures() -> None:
    broken = Raises("broken", ToolError("no", code="EIO"))
    async with running(FakeProvider(), [broken, Weather()]) as h:
        for line in ["/broken x=1", "/broken x=1", "/get_weather Taipei", "/broken x=1"]:
            await h.ask(line)
    assert not any("times in a row" in o for o in observations(h.loop.sessions["s"].memory))


class CooperativeSync(Tool):
    """A sync tool that checks for cancellation while it works, as the Tool docs advise."""

    name = "crunch"

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        try:
            while True:
                threading.Event().wait(0.005)
                anyio.from_thread.check_cancelled()
        except BaseException:
            self.stopped.set()
            raise


@pytest.mark.anyio
async def test_a_sync_tool_that_checks_for_cancellation_stops_at_the_timeout() -> None:
    crunch = CooperativeSync()
    provider = then_say(response(call("crunch", {}, "k1")), "gave up")
    limits = LoopLimits(tool_timeout=0.05)
    async with running(provider, [crunch], limits=limits) as h:
        result = await h.ask("go")
        with anyio.fail_after(HANG):
            await anyio.to_thread.run_sync(crunch.stopped.wait)
    [tool_result] = h.of(TOOL_RESULT)
    assert tool_result.payload["error"]["code"] == "TIMEOUT"
    assert result.replies == ["gave up"]
    assert crunch.stopped.is_set()


class RaisesUnprintable(Tool):
    name = "unprintable"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise UnprintableError(1)


@pytest.mark.anyio
async def test_a_tool_error_that_cannot_be_printed_is_a_failed_result_not_a_crash() -> None:
    """A tool whose exception cannot be printed (its ``__str__`` raises) still gets a
    failed EXEC:TOOL_RESULT with a fallback message; the run goes on to the next round
    and the loop and the other sessions go on."""
    provider = ScriptedProvider([tool_call("unprintable", {}), text_response("done")])
    async with running(provider, [RaisesUnprintable()]) as h:
        result = await h.ask("go")
    assert result.replies == ["done"]
    [tool_result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert tool_result.payload["success"] is False


class Proxy(Tool):
    """A tool whose ``parameters`` is a read-only Mapping, as its type allows."""

    name = "proxy"
    parameters = MappingProxyType(
        {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    )

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return args


@pytest.mark.anyio
async def test_invalid_arguments_for_a_tool_with_a_mapping_proxy_schema_do_not_crash() -> None:
    """Invalid arguments for a tool whose ``parameters`` is a read-only Mapping (as its
    ``Mapping[str, Any]`` type allows) give the usual INVALID_ARGUMENTS result and
    observation, without crashing the loop."""
    provider = ScriptedProvider([tool_call("proxy", {}), text_response("done")])
    async with running(provider, [Proxy()]) as h:
        result = await h.ask("go")
    assert result.replies == ["done"]
    [tool_result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert tool_result.payload["error"]["code"] == "INVALID_ARGUMENTS"


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="telling a stray CancelledError from a real cancellation needs Task.cancelling() (3.11)",
)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_tool_raising_a_stray_cancelled_error_fails_alone() -> None:
    """On asyncio, a CancelledError raised inside a tool that nobody cancelled (awaiting
    a future another party cancelled) is that tool's failure, like any exception; it
    does not cancel the loop's task group, ``ask`` returns and the run goes on."""

    class StrayCancel(Tool):
        name = "stray"

        async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.cancel()
            await future

    provider = ScriptedProvider([tool_call("stray", {}), text_response("done")])
    result: RunResult | None = None
    async with running(provider, [StrayCancel()]) as h:
        result = await h.ask("go")
    assert result is not None, "ask() was cancelled by the loop's own task group"
    assert result.replies == ["done"]
