"""Every ``openstarry`` command ends a network error in one line and a non-zero status.

The defect: with Redis down, ``tail`` and ``publish`` retried forever, a
``worker`` retried forever and ignored SIGTERM, and a lost connection ended
``tail`` in a traceback. Each command that talks to Redis is run here against
a closed port on 127.0.0.1 (and ``tail`` against a server that never answers
and one that stops under it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from openstarry import cli
from openstarry.core import Event, encode_event
from openstarry.redis_server import RedisServer, redis_server_path

redis = pytest.importorskip("redis")

OPENSTARRY = [sys.executable, "-m", "openstarry.cli"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def closed() -> str:
    return f"redis://127.0.0.1:{_closed_port()}/0"


def _manifest(folder: Path, **extra: object) -> str:
    folder.mkdir()
    path = folder / "agent.json"
    manifest = {"identity": {"name": "w"}, "provider": {"name": "default"}, **extra}
    path.write_text(json.dumps(manifest))
    return str(path)


def _run(
    args: list[str], stdin: bytes = b"", timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(OPENSTARRY + args, input=stdin, capture_output=True, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode()
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


#: Each command that talks to Redis: its arguments (URL for the closed port's
#: URL, MANIFEST for a manifest whose bus or store is there) and what names it.
COMMANDS = {
    "worker": (["worker", "PLAIN", "--bus", "URL"], "--bus"),
    "publish": (["publish", "--bus", "URL"], "--bus"),
    "tail": (["tail", "--bus", "URL"], "--bus"),
    "run, bus": (["run", "BUS", "--input", "hi"], "the manifest's bus.url"),
    "run, store": (["run", "STORE", "--input", "hi"], "the manifest's sessions.store"),
    "serve": (["serve", "BUS", "--port", "0"], "the manifest's bus.url"),
    "mcp": (["mcp", "BUS"], "the manifest's bus.url"),
    "mcp --http": (["mcp", "BUS", "--http", "--port", "0"], "the manifest's bus.url"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_with_an_unreachable_redis_says_so_in_one_line(
    command: str, closed: str, tmp_path: Path
) -> None:
    template, what = COMMANDS[command]
    manifests = {
        "URL": closed,
        "PLAIN": _manifest(tmp_path / "plain"),
        "BUS": _manifest(tmp_path / "bus", bus={"url": closed}),
        "STORE": _manifest(tmp_path / "store", sessions={"store": closed}),
    }
    args = [manifests.get(arg, arg) for arg in template]
    envelope = Event.new("INPUT:USER_MESSAGE", {"text": "hi"}, source="t", session_id="s")
    done = _run(args, stdin=encode_event(envelope) + b"\n")
    assert done.returncode == 1
    assert done.stdout == b""
    line = _one_line(done)
    host = closed.removeprefix("redis://").removesuffix("/0")
    assert line.startswith(f"openstarry {args[0]}: cannot reach Redis at {closed} ({what}): ")
    assert f"connecting to {host}" in line  # redis-py's own words: what it tried


def test_a_password_in_the_url_is_not_printed(tmp_path: Path) -> None:
    url = f"redis://agent:hunter2@127.0.0.1:{_closed_port()}/0"
    done = _run(["tail", "--bus", url])
    assert done.returncode == 1
    line = _one_line(done)
    assert "hunter2" not in line
    assert "redis://agent:***@127.0.0.1:" in line


def test_a_redis_that_never_answers_times_out_in_one_line() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections are accepted by the kernel, never answered
        port = silent.getsockname()[1]
        done = _run(["tail", "--bus", f"redis://127.0.0.1:{port}/0", "--timeout", "0"])
    assert done.returncode == 1
    line = _one_line(done)
    assert line.startswith(f"openstarry tail: cannot reach Redis at redis://127.0.0.1:{port}/0")
    assert "Timeout" in line


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    if redis_server_path() is None and not os.environ.get("CI"):
        pytest.skip("redis-server is missing: `make test` installs it")
    started = RedisServer(tmp_path, aof=False)
    started.start()
    try:
        yield started
    finally:
        started.stop()


def test_tail_ends_in_one_line_when_redis_goes_away(server: RedisServer) -> None:
    tail = subprocess.Popen(
        [*OPENSTARRY, "tail", "--bus", server.url, "--count", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        client = redis.Redis.from_url(server.url)
        client.xadd(
            "{openstarry}:s:0:2", {"e": encode_event(Event.new("A:B", source="t", session_id="s"))}
        )
        client.close()
        assert tail.stdout is not None
        assert tail.stdout.readline()  # printed: tail is following now
        server.stop()
        _, err = tail.communicate(timeout=60)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert tail.returncode == 1
    lines = err.decode().splitlines()
    assert len(lines) == 1, err.decode()
    assert lines[0].startswith(f"openstarry tail: following the bus on {server.url}: ")


def test_a_network_error_anywhere_in_a_command_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What no command catches itself (here inside a task group) still ends in one line."""

    async def lose() -> None:
        raise redis.exceptions.TimeoutError("Timeout reading from 127.0.0.1:6379")

    async def grouped() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lose)

    import openstarry.cli.demo

    monkeypatch.setattr(openstarry.cli.demo, "main", lambda argv, **options: anyio.run(grouped))
    assert cli.main(["demo", str(tmp_path / "x.ndjson")]) == 1
    captured = capsys.readouterr()
    assert captured.err == "openstarry demo: Redis: Timeout reading from 127.0.0.1:6379\n"

    def refused(argv: list[str], **options: object) -> int:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(openstarry.cli.demo, "main", refused)
    assert cli.main(["demo", "x"]) == 1
    assert (
        capsys.readouterr().err
        == "openstarry demo: network error: [Errno 111] Connection refused\n"
    )

    def broken(argv: list[str], **options: object) -> int:
        raise ValueError("not a network error")

    monkeypatch.setattr(openstarry.cli.demo, "main", broken)
    with pytest.raises(ValueError, match="not a network error"):
        cli.main(["demo", "x"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tail", "--bus", "http://localhost/0"], "argument --bus: expected redis://host:port/db"),
        (["publish", "--bus", "localhost:6379"], "argument --bus: expected redis://host:port/db"),
        (
            ["worker", "MANIFEST", "--bus", "redis://:pw@localhost:abc/0"],
            "argument --bus: not a valid URL: Port could not be cast to integer value as 'abc': "
            "'redis://:***@localhost:abc/0'",
        ),
        (
            ["run", "BAD_BUS", "--input", "hi"],
            "bus.url: not a valid URL: Port could not be cast to integer value as 'abc'",
        ),
    ],
)
def test_a_bad_redis_url_is_a_usage_error(args: list[str], message: str, tmp_path: Path) -> None:
    files = {
        "MANIFEST": _manifest(tmp_path / "plain"),
        "BAD_BUS": _manifest(tmp_path / "bad", bus={"url": "redis://localhost:abc/0"}),
    }
    done = _run([files.get(arg, arg) for arg in args])
    assert done.returncode == 2
    err = done.stderr.decode()
    assert message in err
    assert "Traceback" not in err
    assert "pw@" not in err
