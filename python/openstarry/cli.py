"""The ``openstarry`` command.

    openstarry run MANIFEST --input "Query weather in Taipei"  # a turn per --input, then exit
    openstarry run MANIFEST --input "..." --events     # every event, a JSON envelope a line
    openstarry run MANIFEST                            # an interactive prompt ([cli] extra:
                                                       # history, completion, rich output)
    openstarry schema manifest|protocol                # JSON Schema of agent.json or events
    openstarry serve MANIFEST [--host H] [--port N] [--api-key-env NAME] [--otel]
                                                       # the Agent API (spec 003)
    openstarry mcp MANIFEST [--http --port N] [--api-key-env NAME] [--otel]
                                                       # the tools over MCP (spec 004)
    openstarry worker MANIFEST --bus URL [--group G] [--consumer C] [--otel]
                                                       # a consumer of a shared bus
    openstarry publish --bus URL [FILE]                # NDJSON envelopes onto a shared bus
    openstarry tail --bus URL [--type P] [--count N] [--timeout S]   # its history, then new events
                    [--since WHEN | --from-end]        # start at a time or an event; or new only
    openstarry bench latency [--rates R1,R2,...] [--duration S] [--handler MODULE:FUNCTION]
                     [--json FILE] [--plot FILE.png] [--against pure-python|bubus]
                                                       # dispatch latency, open loop, to p99.99
    openstarry bench [bus|loop] [--quick]              # bus throughput, loop overhead
    openstarry demo NDJSON                             # the Rust ingestion demo

``--otel`` traces the agent's runs with OpenTelemetry as the standard ``OTEL_*``
environment variables say (exporter, endpoint, service name; see
:mod:`openstarry.otel`), with the ``[otel]`` extra; an exporter that is not
installed is said in one line, and the command exits 2.

Exit status: 0 on success, 1 when a turn ended with a ``KERNEL:ERROR`` or a
network error stopped the command (one line on standard error: Redis down, a
refused connection, a timeout), 2 for a bad command line or manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import anyio

from openstarry.benchargs import add_bench_arguments
from openstarry.core import Event, encode_event
from openstarry.errors import ManifestError, McpConnectError, PartitionMismatch
from openstarry.events import OUTPUT_AGENT_MESSAGE, EventType
from openstarry.netcheck import network_failure, one_line, unreachable
from openstarry.stdio import (
    Output,
    closed_stream,
    leave,
    leave_now,
    quiet_stdout,
    stdout_gone,
    valid_text,
    write_failure,
)

__all__ = ["main"]

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
    """:mod:`openstarry.terminal` when prompt_toolkit and rich import, else ``None``.

    Imported only here: the two libraries take about 150 ms to import, which
    ``openstarry --help`` and piped runs should not pay.
    """
    try:
        from openstarry import terminal
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
        from openstarry import plain_prompt

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
    """The prompt at a terminal without the ``[cli]`` extra (:mod:`openstarry.plain_prompt`).

    As the ``[cli]`` prompt: turns run while the next line is typed, and what
    they print goes above it; Ctrl-C stops a running turn, Ctrl-D or a second
    Ctrl-C on an empty line leaves (stopping the turn in progress).
    """
    from openstarry.plain_prompt import ASK_LEAVE, STOP

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
    the prompt is :func:`openstarry.terminal.prompt_loop` (without it, and with
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


def _schema(args: argparse.Namespace) -> int:
    if args.what == "manifest":
        from openstarry.manifest import AgentManifest

        schema: Any = AgentManifest.json_schema()
    else:
        from openstarry.protocol import json_schema

        schema = json_schema()
    print(json.dumps(schema, indent=2, ensure_ascii=False))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from openstarry.bench import run as run_bench

    return run_bench(args)


def _demo(args: argparse.Namespace) -> int:
    from openstarry.demo import main as demo_main

    return demo_main([args.path], prog="openstarry demo")


def _serve(args: argparse.Namespace) -> int:
    try:
        from openstarry.api.server import serve
    except ImportError as exc:
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 2
    from openstarry._http import check_bind, listen, read_api_key
    from openstarry.api.server import ServerLimits
    from openstarry.assembly import agent_from_manifest

    try:
        api_key = read_api_key(args.api_key_env)
        check_bind(args.host, api_key, insecure=args.insecure)
        limits = ServerLimits(
            shutdown_grace=args.shutdown_grace,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address,
        )
    except ValueError as exc:
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 2
    try:
        sock = listen(args.host, args.port)
    except (OSError, OverflowError) as exc:
        print(f"openstarry serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    try:
        agent = agent_from_manifest(args.manifest)
        trace_agent(args, agent)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"openstarry serve: {agent.name} on http://{shown}:{port}/", file=sys.stderr)
        return serve(
            agent,
            host=args.host,
            port=args.port,
            limits=limits,
            sock=sock,
            api_key=api_key,
            insecure=args.insecure,
        )
    except ImportError as exc:  # uvicorn missing beside Starlette
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 2
    finally:
        sock.close()


def _mcp(args: argparse.Namespace) -> int:
    try:
        from openstarry.mcp.server import serve
    except ImportError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        # Logs go to stderr: over stdio, stdout is the MCP wire.
        logging.basicConfig(
            stream=sys.stderr, level=logging.WARNING, format="openstarry mcp: %(message)s"
        )
    from openstarry._http import check_bind, read_api_key
    from openstarry.assembly import agent_from_manifest

    try:
        api_key = read_api_key(args.api_key_env)
        if args.http:
            check_bind(args.host, api_key, insecure=args.insecure)
    except ValueError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    try:
        agent = agent_from_manifest(args.manifest)
    except ManifestError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    trace_agent(args, agent)
    if not args.http:
        # The MCP SDK reads stdin in a thread that no cancellation reaches: Ctrl-C
        # would wait for the client's next line. It ends the server at once instead.
        signal.signal(signal.SIGINT, lambda signum, frame: leave_now(130))
    return serve(agent, http=args.http, host=args.host, port=args.port, api_key=api_key)


def otel_argument(command: argparse.ArgumentParser) -> None:
    """``--otel``: set up by :func:`main`, taken by :func:`trace_agent`."""
    command.add_argument(
        "--otel",
        action="store_true",
        help="trace the agent's runs with OpenTelemetry, as the OTEL_* environment variables "
        "say (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...; "
        "needs openstarry[otel])",
    )


def trace_agent(args: argparse.Namespace, agent: Any) -> None:
    """With ``--otel``, trace ``agent``'s runs to the provider :func:`main` set up."""
    provider = getattr(args, "tracer_provider", None)
    if provider is not None:
        from openstarry.otel import instrument

        instrument(agent, provider)


def _start_tracing(args: argparse.Namespace) -> str | None:
    """``--otel``: OpenTelemetry's global provider from ``OTEL_*``; why not, in one line."""
    try:
        from openstarry.otel import configure_from_env
    except ImportError as exc:
        return str(exc)
    service = "openstarry"
    try:
        from openstarry.manifest import load_manifest

        service = load_manifest(args.manifest).identity.name or service
    except Exception:  # the command reports a bad manifest itself
        pass
    # Over stdio, stdout is the MCP channel: the console exporter writes to stderr.
    stdio = args.command == "mcp" and not args.http
    try:
        args.tracer_provider = configure_from_env(
            service_name=service, console=sys.stderr if stdio else None
        )
    except ValueError as exc:
        return str(exc)
    return None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, not {port}")
    return port


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds are 0 or more, not {text}")
    return value


def _auth_arguments(command: argparse.ArgumentParser, *, console: bool = False) -> None:
    needs = (
        "every request (but GET /health and the console's page) then needs "
        "'Authorization: Bearer <key>'; in a browser, the console asks for the key once "
        "and signs in with a session cookie"
        if console
        else "every request (but GET /health) then needs 'Authorization: Bearer <key>'"
    )
    command.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"the environment variable holding the API key: {needs}",
    )
    command.add_argument(
        "--insecure",
        action="store_true",
        help="serve on an address other than loopback without an API key",
    )


def build_parser() -> argparse.ArgumentParser:
    from openstarry.core import __version__

    parser = argparse.ArgumentParser(
        prog="openstarry", description="An agent core whose hot path is Rust."
    )
    parser.add_argument("--version", action="version", version=f"openstarry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

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
    run.set_defaults(handler=None)

    schema = commands.add_parser("schema", help="print a JSON Schema")
    schema.add_argument(
        "what",
        choices=["manifest", "protocol"],
        help="manifest: the schema of agent.json; protocol: the schema of the events "
        "(the envelope and each event type's payload)",
    )
    schema.set_defaults(handler=_schema)

    bench = commands.add_parser(
        "bench",
        help="measure dispatch latency under load (bench latency), the bus and the loop",
        description="openstarry's benchmarks: 'bench latency' for dispatch latency at fixed "
        "arrival rates; 'bench bus' and 'bench loop' (or plain 'bench' for both) for the "
        "figures beside pure-Python baselines.",
    )
    add_bench_arguments(bench)
    bench.set_defaults(handler=_bench)

    serve = commands.add_parser(
        "serve", help="serve the agent over HTTP: the Agent API (needs openstarry[http])"
    )
    serve.add_argument("manifest", help="path of the agent.json manifest")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port to listen on (8000)")
    _auth_arguments(serve, console=True)
    serve.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=10.0,
        help="seconds the runs in progress get to finish on SIGTERM/SIGINT (10)",
    )
    serve.add_argument(
        "--header-timeout",
        type=_seconds,
        default=10.0,
        help="seconds a client may take to send a request's head (10)",
    )
    serve.add_argument(
        "--body-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a client may take to send a request's body (30)",
    )
    serve.add_argument(
        "--max-connections", type=int, default=4096, help="connections at once (4096)"
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=int,
        default=256,
        help="connections at once from one client address (256); raise it behind a proxy",
    )
    otel_argument(serve)
    serve.set_defaults(handler=_serve)

    mcp = commands.add_parser(
        "mcp", help="serve the agent's exposed tools over MCP (needs openstarry[mcp])"
    )
    mcp.add_argument("manifest", help="path of the agent.json manifest")
    mcp.add_argument(
        "--http", action="store_true", help="Streamable HTTP instead of stdio (the default)"
    )
    mcp.add_argument("--host", default="127.0.0.1", help="address for --http (127.0.0.1)")
    mcp.add_argument("--port", type=_port, default=8765, help="port for --http (8765)")
    _auth_arguments(mcp)
    otel_argument(mcp)
    mcp.set_defaults(handler=_mcp)

    demo = commands.add_parser("demo", help="the Rust ingestion demo on an NDJSON file")
    demo.add_argument("path", help="NDJSON file, one envelope a line")
    demo.set_defaults(handler=_demo)

    from openstarry.cluster import add_commands
    from openstarry.scaffold import add_init_command

    add_commands(commands)
    add_init_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``openstarry`` command; returns the exit status.

    Whatever goes wrong, the command ends with one line on standard error and
    never a traceback: a network error (Redis down, a refused connection, a
    timeout) with exit status 1, and a Redis the command needs is checked
    before it starts; a missing extra, a bad manifest, a closed standard
    stream or text that is not UTF-8 with 2; a full disk with 1; a reader that
    went away (``| head``) quietly with 0; Ctrl-C with 130, at once.
    """
    status = _main(argv)
    return leave(status) if status == 130 else status


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    problem = _bad_arguments(args)
    if problem is not None:
        print(f"openstarry {args.command}: {problem}", file=sys.stderr)
        return 2
    args.tracer_provider = None
    if getattr(args, "otel", False):
        problem = _start_tracing(args)
        if problem is not None:
            print(f"openstarry {args.command}: --otel: {problem}", file=sys.stderr)
            return 2
    try:
        away = unreachable(args)
        if away is not None:
            code, message = away
            print(f"openstarry {args.command}: {message}", file=sys.stderr)
            return code
        if args.command == "run":
            return anyio.run(_run, args, backend=args.backend)
        status: int = args.handler(args)
        return status
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _failed(args.command, exc)
    finally:
        if args.tracer_provider is not None:
            args.tracer_provider.shutdown()  # exports the spans still waiting


def _sole(exc: BaseException) -> BaseException:
    """The one exception an exception group holds (at any depth), else ``exc`` itself."""
    inner = getattr(exc, "exceptions", None)
    while isinstance(inner, tuple) and len(inner) == 1:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def _bad_arguments(args: argparse.Namespace) -> str | None:
    """What makes the command line unusable before anything starts, or ``None``."""
    if args.command == "run":
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
    elif args.command == "worker":
        from openstarry.cluster import claim_idle

        try:
            claim_idle()
        except ValueError as exc:
            return str(exc)
    elif args.command == "publish" and args.file:
        try:
            with open(args.file, "rb"):
                pass
        except OSError as exc:
            return f"cannot read {args.file}: {exc.strerror or exc}"
    return closed_stream(args)


def _failed(command: str, exc: Exception) -> int:
    """One line for what ended the command, and its exit status; re-raises what is unknown."""
    leaf = _sole(exc)  # what a task group wrapped, when it wrapped one thing
    if isinstance(leaf, ManifestError):
        print(f"openstarry: {leaf}", file=sys.stderr)
        return 2
    if isinstance(leaf, (ImportError, PartitionMismatch)):  # a missing extra; a bus's count
        print(f"openstarry {command}: {one_line(leaf)}", file=sys.stderr)
        return 2
    if isinstance(leaf, McpConnectError):  # a server of mcp.servers cannot be used
        print(f"openstarry: {leaf}", file=sys.stderr)
        return 1
    gone = network_failure(exc)
    if isinstance(leaf, BrokenPipeError) and stdout_gone():
        quiet_stdout()  # the reader went away (`| head`): stop quietly, as `cat` does
        return 0
    written = write_failure(leaf)
    if written is not None:
        print(f"openstarry {command}: {written}", file=sys.stderr)
        return 1
    if gone is None:
        raise exc
    kind = "Redis" if type(gone).__module__.startswith("redis") else "network error"
    print(f"openstarry {command}: {kind}: {one_line(gone)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
