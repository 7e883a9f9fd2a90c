"""Hardening tests for the agent runtime: the event bus, the execution loop, the tools,
the default provider, the CLI and the manifest loader.

Each test guards one failure mode that would otherwise take down a session, the
loop or the bus, or lose or misorder events. Waits are bounded by :data:`HANG` only
as a guard against a hang; no test asserts on wall time except the one that runs
the default provider's parser in a subprocess (a hang guard with a wide margin).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent_harness import HANG, Echo, running
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop, RunResult
from openstarry.agent.memory import UserTurn
from openstarry.agent.runtime import Agent
from openstarry.bus import EventBus
from openstarry.core import ContentSegment, DedupWindow, Event, ProviderResponse, ToolCall
from openstarry.errors import ManifestError, QueueClosed
from openstarry.events import EventType
from openstarry.manifest import load_manifest
from openstarry.protocol import parse_payload
from openstarry.testing import FunctionProvider, ScriptedProvider, text, tool_call

STATE_CHANGE = EventType.STATE_CHANGE.value
TOOL_RESULT = EventType.TOOL_RESULT.value
ERROR = EventType.ERROR.value


# ----------------------------------------------------------------------------- helpers


def nested(levels: int) -> Any:
    """``[[[...1...]]]``, ``levels`` lists deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def user_event(type_: str = "X:Y") -> Event:
    return Event.new(type_, {"n": 1}, source="test", session_id="s")


class Gate(Tool):
    """An async tool that waits for ``release``."""

    name = "gate"

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        await self.release.wait()
        return "released"


# ---------------------------------------- 1. inputs that must not kill the loop's task group


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            ProviderResponse([ContentSegment("text", text="hi")], {"m": nested(62)}),
            id="metadata",
        ),
        pytest.param(ProviderResponse([ContentSegment("ui", ui={"m": nested(60)})]), id="ui"),
    ],
)
@pytest.mark.anyio
async def test_a_response_too_deep_for_an_event_ends_the_run_not_the_loop(
    answer: ProviderResponse,
) -> None:
    """A provider response nested too deep to fit in an OUTPUT:AGENT_MESSAGE ends
    only its own run with a KERNEL:ERROR; the loop keeps serving other sessions
    (spec 000 §7: a provider's failure is reported, not raised)."""
    provider = FunctionProvider(lambda prompt, context: answer if prompt == "bad" else "fine")
    async with running(provider) as h:
        bad = await h.ask("bad", session_id="a")
        good = await h.ask("good", session_id="b")
    assert bad.error is not None
    assert good.replies == ["fine"]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('/echo {"x": ' + "[" * 70 + "]" * 70 + "}", id="json-object-70-deep"),
        pytest.param("/echo x=" + "[" * 70 + "]" * 70, id="key-value-70-deep"),
        pytest.param("/echo x=" + "[" * 50_000 + "]" * 50_000, id="key-value-recursion"),
        pytest.param('/echo {"x": ' + "[" * 50_000 + "]" * 50_000 + "}", id="object-recursion"),
        pytest.param("/echo " + "[" * 50_000 + "]" * 50_000, id="positional-recursion"),
    ],
)
@pytest.mark.anyio
async def test_a_slash_line_with_deeply_nested_arguments_is_invalid_arguments(line: str) -> None:
    """A slash line whose arguments are nested too deep (for the JSON decoder or for a
    ToolCall) gets a failed EXEC:TOOL_RESULT with INVALID_ARGUMENTS, like any argument
    line that does not parse; whatever a user types, the session keeps working."""
    provider = FunctionProvider(lambda prompt, context: "fine")
    async with running(provider, [Echo()]) as h:
        await h.ask(line)
        after = await h.ask("hello")
    [result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert result.payload["success"] is False
    assert result.payload["error"]["code"] == "INVALID_ARGUMENTS"
    assert after.replies == ["fine"]


class UnprintableError(Exception):
    """An exception whose ``str()`` raises, as a faulty ``__str__`` does."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        raise AttributeError("message")  # e.g. `return self.message` on an unset attribute


class RaisesUnprintable(Tool):
    name = "unprintable"

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise UnprintableError(1)


@pytest.mark.anyio
async def test_a_tool_error_that_cannot_be_printed_is_a_failed_result_not_a_crash() -> None:
    """A tool whose exception cannot be printed (its ``__str__`` raises) still gets a
    failed EXEC:TOOL_RESULT with a fallback message; the run goes on to the next round
    and the loop and the other sessions go on."""
    provider = ScriptedProvider([tool_call("unprintable", {}), text("done")])
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
    provider = ScriptedProvider([tool_call("proxy", {}), text("done")])
    async with running(provider, [Proxy()]) as h:
        result = await h.ask("go")
    assert result.replies == ["done"]
    [tool_result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert tool_result.payload["error"]["code"] == "INVALID_ARGUMENTS"


@pytest.mark.anyio
async def test_a_memory_window_of_one_keeps_the_last_turn() -> None:
    """``memory.window`` of 1, which the manifest allows, keeps exactly the latest user
    turn: the second input is answered and memory holds only that turn."""
    provider = FunctionProvider(lambda prompt, context: f"re: {prompt}")
    async with running(provider, memory_window=1) as h:
        await h.ask("one")
        second = await h.ask("two")
        memory = list(h.loop.sessions["s"].memory)
    assert second.replies == ["re: two"]
    assert [m for m in memory if isinstance(m, UserTurn)] == [UserTurn("two")]


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

    provider = ScriptedProvider([tool_call("stray", {}), text("done")])
    result: RunResult | None = None
    async with running(provider, [StrayCancel()]) as h:
        result = await h.ask("go")
    assert result is not None, "ask() was cancelled by the loop's own task group"
    assert result.replies == ["done"]


# ------------------------------------------------------------------ 2. /reset and /stop


@pytest.mark.anyio
async def test_reset_during_a_tool_call_leaves_memory_empty() -> None:
    """/reset during a tool call leaves memory empty even after the cancelled run winds
    down, so the next provider call sees only the new user turn and never an orphan
    tool outcome (which OpenAI- and Anthropic-style adapters would reject)."""
    gate = Gate()

    def reply(prompt: str, context: AgentContext) -> ProviderResponse:
        if prompt == "go":
            return tool_call("gate", {}, id="c1")
        return text("fresh")

    provider = FunctionProvider(reply)
    async with running(provider, [gate]) as h:
        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.ask, "go")
                await gate.started.wait()
                h.loop.command("reset", session_id="s")
        after_reset = list(h.loop.sessions["s"].memory)
        await h.ask("hello")
    assert after_reset == []
    assert [type(m).__name__ for m in provider.calls[-1].memory] == ["UserTurn"]


# ------------------------------------------------------- 3. the bus under pressure / closed


@pytest.mark.anyio
async def test_a_small_bus_does_not_drop_the_state_changes_of_a_run() -> None:
    """On a bus with room for only two events, a run still publishes every
    KERNEL:STATE_CHANGE (waiting for room rather than dropping), so a subscriber
    tracking the agent's state sees each transition."""
    echo = Echo()
    provider = ScriptedProvider([tool_call("echo", {"x": 1}), text("done")])
    async with running(provider, [echo], capacity=2) as h:
        result = await h.ask("go")
        dropped = h.loop.metrics()["loop"]["events_dropped"]
    assert result.replies == ["done"]
    changes = [(e.payload["from"], e.payload["to"]) for e in h.events if e.type == STATE_CHANGE]
    assert changes == [
        ("IDLE", "THINKING"),
        ("THINKING", "EXECUTING"),
        ("EXECUTING", "THINKING"),
        ("THINKING", "IDLE"),
    ]
    assert dropped == 0


@pytest.mark.anyio
async def test_closing_the_bus_during_a_run_does_not_kill_the_loop() -> None:
    """Closing the bus while a run waits on a tool ends that run (its events have nowhere
    to go): ``ask`` returns and the loop exits cleanly, without an ExceptionGroup."""
    gate = Gate()
    provider = ScriptedProvider([tool_call("gate", {}), text("done")])
    results: list[RunResult] = []
    async with running(provider, [gate]) as h:

        async def go() -> None:
            results.append(await h.loop.ask("go"))

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(go)
                await gate.started.wait()
                await h.bus.aclose()
                gate.release.set()
    assert len(results) == 1


@pytest.mark.anyio
async def test_publish_to_a_closed_bus_does_not_record_the_id() -> None:
    """``publish`` into a closed bus raises QueueClosed before the dedup window records
    the event's id, so with a shared or restored DedupWindow the refused event can
    still be published on the next bus instead of being dropped as a duplicate."""
    window = DedupWindow(60_000, 1000)
    event = user_event()
    async with EventBus(dedup=window) as old:
        await old.aclose()
        with pytest.raises(QueueClosed):
            old.publish(event)
    assert event.id not in window
    async with EventBus(dedup=window) as new:
        assert new.publish(event) is True


@pytest.mark.anyio
async def test_a_cancelled_subscription_gets_no_more_events() -> None:
    """Once ``Subscription.cancel`` has returned, the handler is not called again, even
    for an event whose dispatch was already under way (the loop relies on this when it
    unsubscribes in ``__aexit__``)."""
    entered = anyio.Event()
    proceed = anyio.Event()
    late: list[str] = []

    async def first(event: Event) -> None:
        entered.set()
        await proceed.wait()

    async with EventBus() as bus:
        bus.subscribe("*", first)
        second = bus.subscribe("*", lambda event: late.append(event.type))
        bus.publish(user_event())
        with anyio.fail_after(HANG):
            await entered.wait()
            second.cancel()
            proceed.set()
            await bus.wait_idle()
    assert late == []


@pytest.mark.anyio
async def test_a_handler_error_that_cannot_be_printed_does_not_stop_the_bus() -> None:
    """A handler whose exception cannot be printed still becomes a KERNEL:ERROR with a
    fallback message, and the bus goes on dispatching later events."""
    seen: list[str] = []

    def bad(event: Event) -> None:
        if event.type == "X:BAD":
            raise UnprintableError(2)

    async with EventBus() as bus:
        bus.subscribe("*", bad)
        bus.subscribe("*", lambda event: seen.append(event.type))
        with anyio.fail_after(HANG):
            bus.publish(user_event("X:BAD"))
            await bus.wait_idle()
            bus.publish(user_event("X:GOOD"))
            await bus.wait_idle()
    assert seen == ["X:BAD", ERROR, "X:GOOD"]


@pytest.mark.anyio
async def test_cancelled_while_the_bus_drains_exits_its_task_group() -> None:
    """Cancelling the task while ``async with EventBus()`` drains on exit (a timeout, or
    Ctrl-C in the CLI) still exits the bus's task group, so the cancellation is caught
    by the scope that issued it and the task's cancel scope stack stays intact."""
    draining = anyio.Event()

    with anyio.CancelScope() as scope:

        async def slow(event: Event) -> None:
            with anyio.fail_after(HANG):
                while not bus.closed:  # the host task is now in aclose()
                    await anyio.lowlevel.checkpoint()
            draining.set()
            scope.cancel()
            await anyio.sleep_forever()

        async with EventBus() as bus:
            bus.subscribe("*", slow)
            bus.publish(user_event())
    assert draining.is_set()
    assert scope.cancelled_caught
    await anyio.lowlevel.checkpoint()  # the task's cancel scope stack is intact


@pytest.mark.anyio
async def test_wait_idle_from_a_handler_does_not_deadlock_the_bus() -> None:
    """``wait_idle`` called from a handler returns or raises RuntimeError at once
    instead of waiting for the dispatcher that is running it, so the bus never
    deadlocks on itself (as ``aclose`` already avoids)."""
    outcome: list[str] = []

    async def handler(event: Event) -> None:
        try:
            with anyio.fail_after(0.5):
                await bus.wait_idle()
            outcome.append("returned")
        except RuntimeError:
            outcome.append("refused")
        except TimeoutError:
            outcome.append("deadlocked")

    async with EventBus() as bus:
        bus.subscribe("*", handler)
        bus.publish(user_event())
        with anyio.fail_after(HANG):
            while not outcome:
                await anyio.sleep(0.01)
    assert outcome in (["returned"], ["refused"])


# -------------------------------------------------------------- 4. the loop's lifecycle


@pytest.mark.parametrize("when", ["before-enter", "after-exit"])
@pytest.mark.anyio
async def test_ask_on_a_loop_that_is_not_running_raises(when: str) -> None:
    """``ask`` on a loop that was never entered, or was already left, raises
    RuntimeError ("not running") at once instead of waiting forever for a run that
    nobody will start."""
    provider = FunctionProvider(lambda prompt, context: "hi")
    async with EventBus() as bus:
        loop = ExecutionLoop(bus, provider)
        if when == "after-exit":
            async with loop:
                assert (await loop.ask("first")).replies == ["hi"]
        with anyio.fail_after(0.5), pytest.raises(RuntimeError, match="not running"):
            await loop.ask("hello")


# ------------------------------------------------------------------ 5. event order


@pytest.mark.anyio
async def test_a_run_error_is_dispatched_after_the_events_it_descends_from() -> None:
    """Every event of a run, including a KERNEL:ERROR when the provider fails, is
    dispatched after its parent, and the error after the THINKING transition it ends,
    so transcripts and the CLI's ``--events`` show a failed turn in order."""

    def fail(prompt: str, context: AgentContext) -> ProviderResponse:
        raise RuntimeError("the model is down")

    async with running(FunctionProvider(fail)) as h:
        result = await h.ask("go")
    assert result.error is not None
    seen: set[str] = set()
    for event in h.events:
        assert event.parent_id is None or event.parent_id in seen, (event.type, event.parent_id)
        seen.add(event.id)
    types = [e.type for e in h.events]
    assert types.index(ERROR) > types.index(STATE_CHANGE)


@pytest.mark.anyio
async def test_every_event_of_a_run_with_non_object_args_matches_the_protocol() -> None:
    """Every event the loop emits validates against its protocol payload model (spec
    002), even when a provider's tool call has non-object ``args``, so consumers can
    validate the stream with the project's own models."""
    bad_call = ProviderResponse([ContentSegment("tool_call", tool_call=ToolCall("echo", [1]))])
    provider = ScriptedProvider([bad_call, text("done")])
    async with running(provider, [Echo()]) as h:
        await h.ask("go")
    for event in h.events:
        parse_payload(event.type, event.payload)


@pytest.mark.anyio
async def test_the_route_cache_does_not_grow_with_every_event_type_seen() -> None:
    """The bus's route cache stays bounded however many distinct event types pass
    through, so a peer sending ever new types cannot grow memory without bound."""
    async with EventBus() as bus:
        bus.subscribe("*", lambda event: None)
        with anyio.fail_after(HANG):
            for i in range(5000):
                bus.publish(user_event(f"X:T{i}"))
            await bus.wait_idle()
        cached = len(getattr(bus, "_routes", {}))
    assert cached <= 1024


# -------------------------------------------------------------- 6. the default provider


def test_the_default_provider_answers_a_maximal_prompt_quickly() -> None:
    """The default provider parses a prompt of maximal length (``MAX_REQUEST_CHARS``)
    without catastrophic regex backtracking, so one request cannot stall the event
    loop for every session. Run in a subprocess (killed on timeout); the 5 s bound
    is only a hang guard, a normal answer takes milliseconds."""
    code = textwrap.dedent(
        """
        import asyncio
        from openstarry.agent.interfaces import AgentContext
        from openstarry.agent.memory import Memory, Session
        from openstarry.providers.default import DefaultProvider
        from openstarry.tools import fs_tools

        tools = {t.name: t for t in fs_tools(["."])}
        context = AgentContext(tools, Session("s", Memory()), "a", "t", 1)
        prompt = "write " + " " * 990 + "x"
        asyncio.run(DefaultProvider().generate(prompt, context))
        """
    )
    try:
        subprocess.run([sys.executable, "-c", code], timeout=5, check=True, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("DefaultProvider.generate blocked for over 5 s on a 997-character prompt")


def test_the_default_provider_tries_a_bounded_number_of_write_merges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt of many clauses that start like a write ("put ;" x 166) is parsed in
    linear work: each clause tries a bounded number of merges with the next ones,
    where trying them all cost cubic time (0.4 s of blocked event loop)."""
    from openstarry.providers import default

    calls = 0
    match_write = default._match_write

    def counting(clause: str) -> Any:
        nonlocal calls
        calls += 1
        return match_write(clause)

    monkeypatch.setattr(default, "_match_write", counting)
    default._parse("put ;" * 166)
    assert calls <= 166 * (default._MAX_MERGED + 2)


def test_an_empty_session_id_on_the_command_line_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--session ""`` on the command line is a bad command line: the CLI prints a
    one-line error naming the session and exits with status 2, not a traceback."""
    from openstarry.cli import main

    example = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
    assert main(["run", str(example), "--session", "", "--input", "hi"]) == 2
    assert "session" in capsys.readouterr().err.lower()


# -------------------------------------------------------------- 7. the manifest loader


@pytest.mark.parametrize(
    "content",
    [
        pytest.param('{"identity": ' + "[" * 50_000 + "]" * 50_000 + "}", id="deep-json"),
        pytest.param(
            '{"identity": {"name": "x"}, "limits": {"maxToolRounds": ' + "1" * 5000 + "}}",
            id="int-over-4300-digits",
        ),
    ],
)
def test_json_the_decoder_refuses_is_a_manifest_error_naming_the_file(
    tmp_path: Path, content: str
) -> None:
    """Manifest JSON the decoder refuses for any reason (nesting too deep, an integer
    over Python's digit limit) is a ManifestError naming the file, so ``openstarry
    run`` prints a message and exits 2 instead of a traceback."""
    manifest = tmp_path / "agent.json"
    manifest.write_text(content, encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load_manifest(manifest)
    assert info.value.path == str(manifest)
    assert str(manifest) in str(info.value)


def test_a_nul_in_allowed_paths_is_a_manifest_error_naming_file_and_field(
    tmp_path: Path,
) -> None:
    """A NUL character in ``fs.allowedPaths`` is a ManifestError naming the file and
    the field (``fs.allowedPaths[0]``), not a bare ValueError from path resolution."""
    manifest = tmp_path / "agent.json"
    data = {"identity": {"name": "x"}, "fs": {"allowedPaths": ["a\0b"]}, "tools": ["fs.read"]}
    manifest.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        Agent.from_manifest(manifest)
    assert str(manifest) in str(info.value)
    assert "fs.allowedPaths[0]" in str(info.value)
