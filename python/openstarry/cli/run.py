"""``openstarry run``: an agent's turns from the command line, or a prompt.

    openstarry run MANIFEST --input "Query weather in Taipei"  # a turn per --input, then exit
    openstarry run MANIFEST --input "..." --events     # every event, a JSON envelope a line
    openstarry run MANIFEST                            # an interactive prompt ([cli] extra:
                                                       # history, completion, rich output)

At a terminal, the prompt is :mod:`openstarry.cli.terminal` with the ``[cli]``
extra, else :mod:`openstarry.cli.prompt`; from a pipe or a file, a turn per
line, each waiting for the one before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, TextIO

import anyio

from openstarry.cli.stdio import Output, valid_text
from openstarry.core import Event, encode_event
from openstarry.events import OUTPUT_AGENT_MESSAGE, EventType

__all__ = [
    "CLI_EXTRA_HINT",
    "ConversationPrinter",
    "EventPrinter",
    "add_run_command",
    "check_run_arguments",
]

#: The commands a prompt hands to the loop at once, never queued behind a run.
_AT_ONCE = frozenset(("/stop", "/reset", "/quit"))


def _short(value: Any, limit: int = 200) -> str:
    text = value.strip() if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\n    ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ConversationPrinter:
    """Prints a session's events as a readable conversation.

    Args:
        out: Where to print.
        echo_input: Print the user's messages (``you> ...``); not at the plain
            prompt, which leaves each typed line on the screen.
    """

    def __init__(self, out: TextIO, *, echo_input: bool = True) -> None:
        self.out = out
        self.echo_input = echo_input
        self.errors = 0
        self.write = Output(out)

    def __call__(self, event: Event) -> None:
        kind = event.type
        payload = event.payload
        line: str | None = None
        if kind == EventType.USER_MESSAGE:
            if self.echo_input:
                line = f"you> {payload.get('text', '')}"
        elif kind == OUTPUT_AGENT_MESSAGE:
            line = f"agent> {payload.get('text', '')}"
        elif kind == EventType.TOOL_CALL:
            line = f"  -> {payload['name']} {_short(payload.get('args', {}))}"
        elif kind == EventType.TOOL_RESULT:
            if payload.get("success"):
                line = f"  <- {payload.get('name', '')}: {_short(payload.get('result'))}"
            else:
                error = payload.get("error") or {}
                name = payload.get("name", "")
                line = f"  <- {name} failed: {error.get('code')}: {error.get('message')}"
        elif kind == EventType.ERROR:
            self.errors += 1
            line = f"error: {payload.get('code')}: {payload.get('message')}"
        if line is not None:
            self.write.line(line)


class EventPrinter:
    """Prints every event as its JSON envelope, one a line (spec 002's wire format)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.errors = 0
        self.write = Output(out)

    def __call__(self, event: Event) -> None:
        if event.type == EventType.ERROR:
            self.errors += 1
        self.write.line(encode_event(event).decode())


#: What the plain prompt says at a terminal when the ``[cli]`` extra is missing.
CLI_EXTRA_HINT = (
    "openstarry: for history, Tab completion and formatted output: pip install 'openstarry[cli]'"
)


def _terminal_module() -> Any:
    """:mod:`openstarry.cli.terminal` when prompt_toolkit and rich import, else ``None``.

    Imported only here: the two libraries take about 150 ms to import, which
    ``openstarry --help`` and piped runs should not pay.
    """
    try:
        from openstarry.cli import terminal
    except ImportError:
        return None
    return terminal


async def _run(args: argparse.Namespace) -> int:
    from openstarry.assembly import agent_from_manifest

    agent = agent_from_manifest(args.manifest)
    interactive = not args.input
    at_terminal = sys.stdout.isatty() and (not interactive or sys.stdin.isatty())
    terminal = _terminal_module() if at_terminal else None
    screen = None
    if interactive and terminal is None:
        from openstarry.cli import prompt as plain_prompt

        if plain_prompt.usable():
            screen = plain_prompt.Screen("> ", names=lambda: _slash_names(agent))
    skipped = 0
    with screen.output() if screen is not None else contextlib.nullcontext():
        printer: Any
        if args.events:
            printer = EventPrinter(sys.stdout)
        elif terminal is not None:
            printer = terminal.RichPrinter(terminal.make_console(), echo_input=not interactive)
        else:
            printer = ConversationPrinter(sys.stdout, echo_input=screen is None)
        output: Output | None = getattr(printer, "write", None)
        async with agent:
            agent.bus.subscribe("*", printer)
            with anyio.CancelScope() as turns:
                if output is not None:
                    # The reader is gone or the disk is full: no turn after this one.
                    output.on_failure = turns.cancel
                if args.input:
                    for text in args.input:
                        await agent.ask(text, session_id=args.session)
                        await agent.bus.wait_idle()
                elif screen is not None:
                    await _plain_prompt(agent, args.session, screen)
                    await agent.bus.wait_idle()
                else:
                    skipped = await _interactive(agent, args.session, printer, terminal)
                    await agent.bus.wait_idle()
    if output is not None and output.failed is not None:
        raise output.failed  # main says it in one line (nothing, for a reader gone)
    return 1 if printer.errors or skipped else 0


def _slash_names(agent: Any) -> list[str]:
    """What Tab completes after ``/`` at the plain prompt: built-ins, tools, unique short names."""
    from openstarry.agent.commands import BUILTIN_COMMANDS

    tools = list(agent.tools)
    short = [t.rsplit(".", 1)[-1] for t in tools if "." in t]
    unique = [s for s in short if short.count(s) == 1 and s not in tools]
    return sorted({*BUILTIN_COMMANDS, *tools, *unique})


async def _plain_prompt(agent: Any, session_id: str, screen: Any) -> None:
    """The prompt at a terminal without the ``[cli]`` extra (:mod:`openstarry.cli.prompt`).

    As the ``[cli]`` prompt: turns run while the next line is typed, and what
    they print goes above it; Ctrl-C stops a running turn, Ctrl-D or a second
    Ctrl-C on an empty line leaves (stopping the turn in progress).
    """
    from openstarry.cli.prompt import ASK_LEAVE, STOP

    quit_requested = anyio.Event()
    agent.loop.on_quit(lambda sid: quit_requested.set() if sid == session_id else None)
    print(f"openstarry: {agent.name}. Type /help for commands, /quit to leave.", flush=True)
    print(CLI_EXTRA_HINT, file=sys.stderr, flush=True)
    running = 0

    def busy() -> bool:
        return running > 0

    async def follow(run: Any) -> None:
        nonlocal running
        try:
            await run.wait()
        finally:
            running -= 1

    async with anyio.create_task_group() as runs:
        while not quit_requested.is_set():
            line = await screen.read_line(running=busy)
            if line is None:
                if running:  # leaving stops the turn in progress
                    agent.loop.command("/stop", session_id=session_id)
                break
            if line == STOP:
                agent.loop.command("/stop", session_id=session_id)
                continue
            if line == ASK_LEAVE:
                print("(Ctrl-C again or Ctrl-D to leave)", flush=True)
                continue
            text = line.strip()
            if not text:
                continue
            if text in _AT_ONCE:
                agent.loop.command(text, session_id=session_id)
                if text == "/quit":
                    break
                continue
            running += 1
            runs.start_soon(follow, agent.loop.start(text, session_id=session_id))


async def _interactive(
    agent: Any, session_id: str, printer: Any = None, terminal: Any = None
) -> int:
    """Read lines until EOF or ``/quit``; returns how many were skipped (not UTF-8).

    At a terminal, reading goes on while a turn runs, so a ``/stop`` typed
    meanwhile goes out at priority 0 and cancels it; with the ``[cli]`` extra
    the prompt is :func:`openstarry.cli.terminal.prompt_loop` (without it, and with
    both ends at a terminal, :func:`_plain_prompt`). From a pipe or a file,
    each line waits for the previous turn to end, as a script expects. At EOF
    the turns still queued are finished. A line that is not valid UTF-8 is
    skipped with one line on standard error; the lines after it still run.
    """
    quit_requested = anyio.Event()
    agent.loop.on_quit(lambda sid: quit_requested.set() if sid == session_id else None)
    at_terminal = sys.stdin.isatty()
    if terminal is not None and at_terminal:
        await terminal.prompt_loop(agent, session_id, quit_requested, printer=printer)
        return 0
    prompt = "> " if at_terminal else ""
    if prompt:
        print(f"openstarry: {agent.name}. Type /help for commands, /quit to leave.", flush=True)
        if sys.stdout.isatty():
            print(CLI_EXTRA_HINT, file=sys.stderr, flush=True)
    # Invalid bytes kept as they came (lone surrogates), to be told and skipped.
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdin.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]

    def read() -> str | None:
        try:
            return input(prompt)
        except EOFError:
            return None

    skipped = 0
    number = 0
    async with anyio.create_task_group() as runs:
        while not quit_requested.is_set():
            line = await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
            if line is None:
                break
            number += 1
            if not valid_text(line):
                skipped += 1
                print(
                    f"openstarry run: input line {number} is not valid UTF-8: skipped",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            text = line.strip()
            if not text:
                continue
            if text in _AT_ONCE:
                agent.loop.command(text, session_id=session_id)
                if text == "/quit":
                    break
                continue
            run = agent.loop.start(text, session_id=session_id)
            if at_terminal:
                runs.start_soon(run.wait)  # done with the turn, the task ends
            else:
                await run.wait()
    return skipped


def add_run_command(commands: Any) -> None:
    """Add ``run`` to the ``openstarry`` parser."""
    run = commands.add_parser("run", help="run an agent from its agent.json")
    run.add_argument("manifest", help="path of the agent.json manifest")
    run.add_argument(
        "--input",
        "-i",
        action="append",
        metavar="TEXT",
        help="a user turn (repeatable); without it, an interactive prompt",
    )
    run.add_argument(
        "--events", action="store_true", help="print every event as a JSON envelope per line"
    )
    run.add_argument("--session", default="cli", help="the session id (default: cli)")
    run.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="the async library to run on (default: asyncio; trio needs: pip install trio)",
    )
    run.set_defaults(handler=_run_command)


def _run_command(args: argparse.Namespace) -> int:
    status: int = anyio.run(_run, args, backend=args.backend)
    return status


def check_run_arguments(args: argparse.Namespace) -> str | None:
    """What makes ``run``'s command line unusable before anything starts, or ``None``."""
    if not args.session.strip():
        return "error: --session must not be empty"
    texts = [*(args.input or ()), args.session]
    if not all(valid_text(text) for text in texts):
        return "--input and --session must be valid UTF-8 text"
    if args.backend == "trio":  # checked before the manifest, which may be fine
        try:
            import trio  # noqa: F401 - the run imports it anyway
        except ImportError:
            return "--backend trio needs trio: pip install trio"
    return None
