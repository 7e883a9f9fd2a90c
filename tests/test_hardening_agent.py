"""Review of the agent runtime: defects found by reading bus.py, agent/*.py, the tools,
the default provider and the manifest loader, each pinned by a test that fails today.

Every test states what is expected and why. Waits are bounded by :data:`HANG` only
as a guard against a hang; no test asserts on wall time except the one that runs
the default provider's parser in a subprocess (a hang guard with a wide margin).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

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

#: A bound on any one wait, so that a broken loop fails a test instead of hanging it.
HANG = 3

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


class Echo(Tool):
    """An async tool with one untyped parameter ``x``; returns its arguments."""

    name = "echo"

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"x": {}}}

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return args


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


@dataclass
class Harness:
    bus: EventBus
    loop: ExecutionLoop
    events: list[Event]

    async def ask(self, line: str, session_id: str = "s") -> RunResult:
        with anyio.fail_after(HANG):
            result = await self.loop.ask(line, session_id=session_id)
            await self.bus.wait_idle()
        return result


@asynccontextmanager
async def running(
    provider: Any, tools: Iterable[Tool] = (), *, capacity: int | None = 65536, **options: Any
) -> AsyncIterator[Harness]:
    async with EventBus(capacity=capacity) as bus:
        events: list[Event] = []
        bus.subscribe("*", events.append)
        async with ExecutionLoop(bus, provider, tools, **options) as loop:
            yield Harness(bus, loop, events)


# ------------------------------------------------ 1. inputs that kill the loop's task group


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
    """A ProviderResponse the core accepted, whose metadata or ui segment is nested a
    few levels short of the 64-level limit, no longer fits once wrapped in the
    OUTPUT:AGENT_MESSAGE payload. ``event.child`` raises ValueError in ``_think_act``
    (loop.py, the OUTPUT:AGENT_MESSAGE publish) and nothing catches it, so the
    worker's exception tears down the loop's task group: every session dies and
    ``async with ExecutionLoop`` raises an ExceptionGroup. Expected (spec 000 §7,
    "what is not the provider's success is told to it rather than raised"): the
    run ends with a KERNEL:ERROR and the loop keeps serving other sessions."""
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
    """Any user can type a slash line. ``parse_tool_args`` (commands.py ``_value`` and
    the ``{``-object branch) catches only ValueError, so ``json.loads`` of a very deep
    value raises RecursionError out of it; a value 70 levels deep parses but then
    ``ToolCall(tool.name, args)`` in ``_slash_tool`` raises ValueError. Either one
    escapes the worker and kills the loop's task group (all sessions). Expected:
    a failed EXEC:TOOL_RESULT with INVALID_ARGUMENTS, like any argument line that
    does not parse, and the session keeps working."""
    provider = FunctionProvider(lambda prompt, context: "fine")
    async with running(provider, [Echo()]) as h:
        await h.ask(line)
        after = await h.ask("hello")
    [result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert result.payload["success"] is False
    assert result.payload["error"]["code"] == "INVALID_ARGUMENTS"
    assert after.replies == ["fine"]


class UnprintableError(Exception):
    """An exception whose ``str()`` raises, as a buggy ``__str__`` does."""

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
    """``_run_one`` catches the tool's exception, then ``_failure_of`` formats it with
    ``str(exc)`` (loop.py ``_failure_of``); when ``__str__`` itself raises, that
    second exception escapes the ``except`` block and kills the loop's task group.
    The same holds for a provider (``f"{exc}"`` in the PROVIDER_ERROR branch).
    Expected: a failed EXEC:TOOL_RESULT (TOOL_ERROR, with a fallback message such
    as the exception's type name), and the run goes on to the next round."""
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
    """``Tool.parameters`` is typed ``Mapping[str, Any]``, but the INVALID_ARGUMENTS
    branch of ``_run_one`` does ``json.dumps(tool.parameters)``, which raises
    TypeError for a MappingProxyType: the error escapes and kills the loop's task
    group. Expected: the usual failed result and observation."""
    provider = ScriptedProvider([tool_call("proxy", {}), text("done")])
    async with running(provider, [Proxy()]) as h:
        result = await h.ask("go")
    assert result.replies == ["done"]
    [tool_result] = [e for e in h.events if e.type == TOOL_RESULT]
    assert tool_result.payload["error"]["code"] == "INVALID_ARGUMENTS"


@pytest.mark.anyio
async def test_a_memory_window_of_one_keeps_the_last_turn() -> None:
    """``memory.window`` may be 1 (the manifest allows ``ge=1``), but
    ``Memory.append`` computes ``cut = self._turn_starts[len - window + 1]``, which is
    ``_turn_starts[1]`` when one turn is kept: IndexError on the second user turn,
    raised in ``_think_act`` and fatal to the loop's task group. Expected: the second
    input is answered and memory holds only the latest turn."""
    provider = FunctionProvider(lambda prompt, context: f"re: {prompt}")
    async with running(provider, memory_window=1) as h:
        await h.ask("one")
        second = await h.ask("two")
        memory = list(h.loop.sessions["s"].memory)
    assert second.replies == ["re: two"]
    assert [m for m in memory if isinstance(m, UserTurn)] == [UserTurn("two")]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_tool_raising_a_stray_cancelled_error_fails_alone() -> None:
    """On asyncio, library code can raise CancelledError without anyone cancelling the
    task (awaiting a future another party cancelled). ``_run_one`` catches only
    Exception, so the CancelledError leaves the worker; anyio's task group then
    cancels itself, which cancels the host task (the one in ``async with
    ExecutionLoop``), and ``__aexit__`` swallows that cancellation: ``ask`` is
    cancelled and the code after it silently never runs, every session is gone.
    Expected: a spurious CancelledError (no cancel scope of the loop was cancelled)
    is the tool's failure, like any other exception."""

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
    """/reset says "Session reset: memory cleared." and clears memory at once, but the
    run it cancels resumes afterwards and ``_run`` calls ``run.close_calls``, which
    appends a CANCELLED ToolOutcome into the freshly cleared memory. The next turn
    then starts with a tool outcome whose call (the AssistantTurn) was forgotten:
    provider adapters that pair each outcome with its call (OpenAI, Anthropic) get
    an orphan tool message. Expected: memory is empty after /reset, and the next
    provider call sees only the new user turn."""
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
    """``_send`` promises "the run's events are never dropped" and waits for room, but
    ``_set_state`` and ``_error`` publish with ``_emit``, which drops on QueueFull,
    even though they are called from the run's own (async) code, which could wait.
    With ``capacity=2`` a plain tool round loses two of its four
    KERNEL:STATE_CHANGE events (``events_dropped`` is 2): a subscriber tracking the
    agent's state never sees THINKING->EXECUTING. Expected: every transition is
    published (the issue: "every state transition emits KERNEL:STATE_CHANGE")."""
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
    """When the bus is closed (``aclose``) while a run waits on a tool, the run's next
    publish raises QueueClosed (``_send``; ``_emit`` re-raises it on purpose) out of
    the worker, and the loop's task group dies with it: ``ask`` never returns and
    leaving ``async with ExecutionLoop`` raises an ExceptionGroup. Expected: the run
    ends (its events have nowhere to go) and ``ask`` returns; the loop exits
    cleanly."""
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
    """``publish`` refuses at capacity *before* the dedup window records the id ("a
    retry must not be a duplicate"), and ``ingest`` into a closed bus records
    nothing; but ``publish`` into a closed bus records the id and only then raises
    QueueClosed from the queue. With a shared or restored DedupWindow (the
    documented way to survive a restart), the event that was refused is then
    dropped as a duplicate by the next bus: it is lost. Expected: QueueClosed
    before the window is touched."""
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
    """``Subscription.cancel`` says "stop delivering events to the handler", but the
    dispatcher iterates over the route it computed before awaiting an earlier async
    handler, so a subscription cancelled meanwhile still receives the event being
    dispatched. (The loop relies on this in ``__aexit__``: an in-flight
    USER_MESSAGE still reaches ``_on_user_message`` after the loop has exited, which
    marks the session running and raises RuntimeError.) Expected: once ``cancel``
    has returned, the handler is not called again."""
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
    """ "A handler that raises becomes a KERNEL:ERROR event and the bus keeps running",
    but ``_handler_failed`` formats the message with ``f"{exc}"`` outside any guard
    (and evaluates ``repr(handler)`` eagerly as getattr's default): when that raises,
    the exception escapes the dispatcher, which dies, and the bus's task group
    raises. Expected: a KERNEL:ERROR (with a fallback message) and later events
    still dispatched."""
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
    """Leaving ``async with EventBus()`` drains the bus (``aclose``) before exiting its
    task group; when the task is cancelled during the drain (a timeout around the
    block, Ctrl-C in the CLI), ``aclose`` raises and ``__aexit__`` returns without
    ever calling ``task_group.__aexit__``: trio reports "Cancel scope stack
    corrupted" / "Nursery stack corrupted" and asyncio "Attempted to exit a cancel
    scope that isn't the current task's current cancel scope", and the run is
    broken. Expected: the task group is exited in any case (``try/finally``), so the
    cancellation is simply caught by the scope that issued it."""
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
    """``aclose`` knows it may be called from a handler (it does not wait for the
    dispatcher it runs in), but ``wait_idle`` does not: from a handler it waits for
    the dispatcher to go idle, which cannot happen while the dispatcher awaits that
    very handler, so the bus is stuck for good. Expected: from the dispatcher,
    ``wait_idle`` returns or raises RuntimeError at once, as ``aclose`` avoids the
    same self-wait."""
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
    """``ask`` publishes the input and waits for its run, but when the loop is not
    running (never entered, or already left) nobody is subscribed, so the wait never
    ends: ``ask`` hangs forever. ``_enqueue`` already has the intended message ("the
    ExecutionLoop is not running: use `async with ExecutionLoop(...)`"). Expected:
    ``start``/``ask`` raise RuntimeError at once."""
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
    """The loop publishes a run's KERNEL:ERROR at priority 1 and its other events at the
    input's priority (2). When the provider fails without yielding, the error is
    queued together with the round's TICK_START and STATE_CHANGE, overtakes them, and
    subscribers get: KERNEL:ERROR (parent: a tick not seen yet), then TICK_START,
    IDLE->THINKING, THINKING->IDLE. A transcript or the CLI's ``--events`` shows the
    turn failing before it started. Expected: every event of a run is dispatched
    after its parent, and the error after the THINKING transition it ends."""

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
    """The core's ToolCall accepts any JSON as ``args`` (``ToolCall("echo", [1])``), and
    the loop copies them as they are into the EXEC:TOOL_CALL payload; but
    ``openstarry.protocol.ToolCallPayload.args`` (spec 002) is an object, so
    ``parse_payload`` rejects the event the loop itself published, and a consumer
    validating the stream with the project's own models fails. Expected: every
    event the loop emits validates against its payload model (e.g. non-object args
    are refused as INVALID_ARGUMENTS and published as an object)."""
    bad_call = ProviderResponse([ContentSegment("tool_call", tool_call=ToolCall("echo", [1]))])
    provider = ScriptedProvider([bad_call, text("done")])
    async with running(provider, [Echo()]) as h:
        await h.ask("go")
    for event in h.events:
        parse_payload(event.type, event.payload)


@pytest.mark.anyio
async def test_the_route_cache_does_not_grow_with_every_event_type_seen() -> None:
    """``EventBus._route`` caches the route of every event type it dispatches in
    ``_routes``, which is cleared only by (un)subscribing. Types are open-ended
    (any ``NAMESPACE:NAME``), and ``ingest`` takes them from the outside, so a peer
    sending events of ever new types grows the cache (and ``_dispatched``) without
    bound. Expected: the cache is bounded (or keyed by namespace)."""
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
    """``MAX_REQUEST_CHARS`` (1000) is meant to bound the parser's regular expressions,
    but the first ``_WRITE`` pattern (``write\\s+(.+?)\\s+(?:to|into|in)\\s+...$``)
    backtracks in cubic time over a run of spaces, and ``_parse`` tries it twice:
    ``"write" + 990 spaces + "x"`` takes seconds of CPU inside ``generate``, on the
    event loop, so every session stalls and /stop cannot be served. Run in a
    subprocess (killed on timeout); a fix answers in milliseconds, the bound is
    only a hang guard."""
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
        subprocess.run([sys.executable, "-c", code], timeout=2, check=True, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("DefaultProvider.generate blocked for over 2 s on a 997-character prompt")


def test_an_empty_session_id_on_the_command_line_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI promises exit status 2 for a bad command line, but ``--session ""`` is
    accepted by argparse and only fails inside the run, where ``Event.new`` raises
    DecodeError (sessionId must be non-empty): the user gets an ExceptionGroup
    traceback. Expected: a one-line error and exit status 2."""
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
    """``load_manifest`` turns JSONDecodeError into a ManifestError naming the file,
    but ``json.loads`` also raises RecursionError (deep nesting) and a plain
    ValueError (an integer over Python's 4300-digit limit), which escape as they
    are: ``openstarry run`` prints a traceback and exits 1 instead of a message and
    exit status 2. Expected: ManifestError with ``path`` set and the file named."""
    manifest = tmp_path / "agent.json"
    manifest.write_text(content, encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load_manifest(manifest)
    assert info.value.path == str(manifest)
    assert str(manifest) in str(info.value)


def test_a_nul_in_allowed_paths_is_a_manifest_error_naming_file_and_field(
    tmp_path: Path,
) -> None:
    """``fs.allowedPaths`` only rejects empty strings; ``"a\\u0000b"`` passes validation
    and then ``AgentManifest.resolve`` (``Path.resolve``) raises a bare ValueError
    ("embedded null byte") in ``Agent.from_manifest``, which is not a ManifestError,
    so neither the file nor the field is named and the CLI shows a traceback.
    Expected: ManifestError naming the file and ``fs.allowedPaths[0]``."""
    manifest = tmp_path / "agent.json"
    data = {"identity": {"name": "x"}, "fs": {"allowedPaths": ["a\0b"]}, "tools": ["fs.read"]}
    manifest.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        Agent.from_manifest(manifest)
    assert str(manifest) in str(info.value)
    assert "fs.allowedPaths[0]" in str(info.value)
