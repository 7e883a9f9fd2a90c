"""``openstarry``'s entry point: the command line parsed, checked, run, and how it ended.

Exit status: 0 on success, 1 when a turn ended with a ``KERNEL:ERROR`` or a
network error stopped the command (one line on standard error: Redis down, a
refused connection, a timeout), 2 for a bad command line or manifest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from openstarry.cli.netcheck import network_failure, one_line, unreachable
from openstarry.cli.parser import build_parser
from openstarry.cli.run import check_run_arguments
from openstarry.cli.stdio import (
    closed_stream,
    leave,
    quiet_stdout,
    stdout_gone,
    write_failure,
)
from openstarry.cli.tracing import start_tracing
from openstarry.errors import ManifestError, McpConnectError, PartitionMismatch

__all__ = ["main"]


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
        problem = start_tracing(args)
        if problem is not None:
            print(f"openstarry {args.command}: --otel: {problem}", file=sys.stderr)
            return 2
    try:
        away = unreachable(args)
        if away is not None:
            code, message = away
            print(f"openstarry {args.command}: {message}", file=sys.stderr)
            return code
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
        problem = check_run_arguments(args)
        if problem is not None:
            return problem
    elif args.command == "worker":
        from openstarry.cli.cluster import claim_idle

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
