"""The ``openstarry`` command's standard streams: closed, gone, full, or not UTF-8.

Every command meets these the same way, in one line on standard error and
never a traceback:

- a standard stream closed when the command starts (``<&-``, ``>&-``): a
  command that needs it says so and exits 2; one that does not (``serve``,
  ``worker``) writes what it would have printed nowhere;
- a reader that went away (``openstarry run ... | head -1``): the command
  stops quietly, as ``cat`` does, and exits 0;
- a full disk or another failed write (``>/dev/full``): one line naming the
  error, exit 1;
- text that is not valid UTF-8 (``--input``, a line of standard input): Python
  keeps each invalid byte as a lone surrogate, which no event may carry;
  :func:`valid_text` tells it.
"""

from __future__ import annotations

import argparse
import errno
import os
import select
import sys
import threading
from collections.abc import Callable
from typing import TextIO

__all__ = [
    "Output",
    "closed_stream",
    "leave",
    "leave_now",
    "quiet_stdout",
    "stdout_gone",
    "valid_text",
    "write_failure",
]


class Output:
    """Lines to a stream that may fail: a reader gone (``| head``), a full disk.

    The first failed write is kept in :attr:`failed` and calls ``on_failure``
    (the command stops its work there); every later line is dropped. A bus
    handler that prints through it never raises, so no ``KERNEL:ERROR`` is
    made of a closed pipe.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.failed: OSError | None = None
        self.on_failure: Callable[[], object] = lambda: None

    def line(self, text: str) -> None:
        if self.failed is not None:
            return
        try:
            print(text, file=self.out, flush=True)
        except OSError as exc:
            self.failed = exc
            self.on_failure()


def valid_text(text: str) -> bool:
    """Whether ``text`` came from valid UTF-8 (invalid bytes arrive as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reads_stdin(args: argparse.Namespace) -> bool:
    command = args.command
    if command == "run":
        return not args.input
    if command == "publish":
        return not args.file
    return command == "mcp" and not args.http


def _writes_stdout(args: argparse.Namespace) -> bool:
    if args.command in ("serve", "worker"):
        return False
    return not (args.command == "mcp" and args.http)


def closed_stream(args: argparse.Namespace) -> str | None:
    """Why the command cannot run with its standard streams as they are, or ``None``.

    A closed standard error, or a closed standard output that the command
    does not need, is pointed at ``os.devnull``, so a stray print goes nowhere.
    """
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the process's own, to its end
    if sys.stdin is None and _reads_stdin(args):
        what = {"run": "give --input TEXT", "publish": "give a FILE"}.get(args.command)
        return "standard input is closed" + (f": {what}" if what else "")
    if sys.stdout is None:
        if _writes_stdout(args):
            return "standard output is closed"
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the process's own, to its end
    return None


def stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader went away (``| head``)."""
    stdout = sys.stdout
    if stdout is None:
        return True
    try:
        fd = stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        ready = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in ready)


def quiet_stdout() -> None:
    """Point standard output at ``os.devnull``: what is still buffered goes nowhere.

    Without it, Python's last flush at exit fails again on the closed pipe
    and prints ``Exception ignored ... BrokenPipeError``.
    """
    stdout = sys.stdout
    if stdout is None:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


#: The write errors told as a full disk or a device that takes nothing more.
_FULL = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO))


def write_failure(exc: BaseException) -> str | None:
    """The one line for a failed write (a full disk), or ``None`` if ``exc`` is not one."""
    if isinstance(exc, OSError) and exc.errno in _FULL:
        quiet_stdout()
        return f"cannot write: {exc.strerror or exc}"
    return None


def leave(status: int) -> int:
    """Return ``status``, or end the process with it now if a thread would hold it open.

    After Ctrl-C, a thread blocked reading standard input (a prompt, MCP over
    stdio) would keep the process alive until the input closed; the command
    has finished its own clean-up by then, so the process ends at once.
    """
    stuck = [
        thread
        for thread in threading.enumerate()
        if thread.is_alive() and not thread.daemon and thread is not threading.main_thread()
    ]
    if stuck and threading.current_thread() is threading.main_thread():
        leave_now(status)
    return status


def leave_now(status: int) -> None:
    """End the process with ``status`` at once, what it printed flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
