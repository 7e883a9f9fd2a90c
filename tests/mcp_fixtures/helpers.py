"""Manifests and server processes for the MCP server tests."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent

#: A bound on any one wait for a server process, so a broken server fails a test, not hangs it.
WAIT = 20.0

#: The tools of the test agent, and which of them an MCP client may use.
TOOLS = [
    "get_weather",
    "fs.read",
    "fs.write",
    "fs.list",
    "mcp_fixtures.tools:explode",
    "mcp_fixtures.tools:whoami",
    "mcp_fixtures.tools:noisy",
    "mcp_fixtures.tools:gate",
]
EXPOSED = [
    "get_weather",
    "fs.read",
    "mcp_fixtures.tools:explode",
    "mcp_fixtures.tools:whoami",
    "mcp_fixtures.tools:noisy",
    "mcp_fixtures.tools:gate",
]
#: The names of the exposed tools, as a client sees them.
EXPOSED_NAMES = ["get_weather", "fs.read", "explode", "whoami", "noisy", "gate"]
PRIVATE = ["fs.write"]

_ANNOUNCE = re.compile(r"serving .* on (http://\S+)")


def write_manifest(folder: Path, mcp: dict[str, Any] | None = None, **extra: Any) -> Path:
    """An ``agent.json`` in ``folder`` for the test agent ``mcp-test`` 2.5.0.

    ``mcp`` replaces the default exposure (:data:`EXPOSED`, :data:`PRIVATE`);
    ``{}`` leaves the key out of the manifest's ``mcp``. ``folder`` holds a
    ``notes.txt`` the ``fs.*`` tools may read.
    """
    (folder / "notes.txt").write_text("hello from the notes\n", encoding="utf-8")
    data: dict[str, Any] = {
        "identity": {"name": "mcp-test", "version": "2.5.0", "description": "An MCP test agent"},
        "tools": TOOLS,
        "fs": {"allowedPaths": ["."]},
        "limits": {"toolTimeout": 10},
        "mcp": {"expose_tools": EXPOSED, "private_tools": PRIVATE} if mcp is None else mcp,
        **extra,
    }
    path = folder / "agent.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def environment() -> dict[str, str]:
    """The environment of a server process: ``mcp_fixtures`` importable, UTF-8 I/O."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def server_command(manifest: Path, *options: str) -> list[str]:
    """``openstarry mcp MANIFEST OPTIONS`` as a command line (``python -m openstarry.cli``)."""
    return [sys.executable, "-m", "openstarry.cli", "mcp", str(manifest), *options]


class Lines:
    """The lines of a process's pipe, read by a thread, so a test can wait with a timeout."""

    def __init__(self, pipe: Any) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        for raw in pipe:
            line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            self.seen.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float = WAIT) -> str | None:
        """The next line; ``None`` at end of file. Raises ``queue.Empty`` on timeout."""
        return self.lines.get(timeout=timeout)

    def join(self, timeout: float = WAIT) -> str:
        """Wait for end of file; every line read, joined."""
        self._thread.join(timeout)
        return "".join(self.seen)


def stop(process: subprocess.Popen[bytes]) -> int:
    """End a server process (SIGTERM, then SIGKILL) and return its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=WAIT)


@contextmanager
def http_server(manifest: Path, exits: list[int] | None = None) -> Iterator[tuple[str, Lines]]:
    """``openstarry mcp MANIFEST --http --port 0``: its URL and its stderr lines.

    On leaving, the process gets SIGTERM; its exit status is appended to ``exits``.
    """
    process = subprocess.Popen(
        server_command(manifest, "--http", "--port", "0"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
    )
    try:
        stderr = Lines(process.stderr)
        url = None
        while url is None:
            line = stderr.next()
            if line is None:
                raise RuntimeError(f"the MCP server exited: {stderr.join()}")
            match = _ANNOUNCE.search(line)
            url = match.group(1) if match else None
        yield url, stderr
    finally:
        status = stop(process)
        if exits is not None:
            exits.append(status)
        if process.stdout is not None:
            process.stdout.close()
        if process.stderr is not None:
            process.stderr.close()


@contextmanager
def stdio_server(manifest: Path) -> Iterator[tuple[subprocess.Popen[bytes], Lines, Lines]]:
    """``openstarry mcp MANIFEST`` with pipes: the process, its stdout lines and stderr lines."""
    process = subprocess.Popen(
        server_command(manifest),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
    )
    try:
        yield process, Lines(process.stdout), Lines(process.stderr)
    finally:
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()
        try:
            process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            stop(process)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
