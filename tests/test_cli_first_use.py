"""Every command, every bad input a new user meets first: one line on standard error, the
documented exit status, never a traceback and never a hang.

Each case runs the real ``openstarry`` command in a child process, as a person at a shell
would: with a standard stream closed or full, a reader that goes away, Ctrl-C, a bad
store, a bad Redis URL, a bus counted otherwise, a missing extra. The Redis cases use a
throwaway ``redis-server`` on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from openstarry.cli.scaffold import AGENT, inputs_ndjson
from openstarry.core import Event, encode_event
from openstarry.redis_server import RedisServer
from redis_support import NEEDS_REDIS_SERVER

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "examples" / "weather-agent" / "agent.json"
OPENSTARRY = [sys.executable, "-m", "openstarry.cli"]
#: The command as a shell line (for the cases that close a stream with bash's ``<&-``).
SHELL_OPENSTARRY = f"{sys.executable} -m openstarry.cli"
TIMEOUT = 60


def _openstarry(
    *args: str, stdin: bytes | None = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPENSTARRY, *args],
        input=stdin.decode("utf-8", "surrogateescape") if stdin is not None else None,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=TIMEOUT,
        env={**os.environ, **(env or {})},
    )


def _shell(line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT
    )


def _one_line(result: subprocess.CompletedProcess[str], status: int, *, says: str) -> str:
    """The command ended with ``status`` and one line on stderr that contains ``says``."""
    err = result.stderr
    assert "Traceback" not in err, err
    assert result.returncode == status, (result.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    if lines and lines[0].startswith("usage:"):  # argparse: its usage, then the one line
        lines = [line for line in lines if line.startswith("openstarry")]
    assert len(lines) == 1, err
    assert says in lines[0], lines[0]
    return lines[0]


def _manifest(tmp_path: Path, **changes: object) -> Path:
    data = json.loads(MANIFEST.read_text())
    data["fs"] = {"allowedPaths": [str(MANIFEST.parent / "workspace")], "allowOutside": True}
    data.update(changes)
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def bus(redis: RedisServer) -> str:
    return redis.url


# --- 1 and 3: the [redis] extra, and a Redis that is not there ---------------------------------

#: Runs the command with redis-py (and trio) made unimportable, as without the extras.
WITHOUT = (
    "import sys\n"
    "for name in {names!r}: sys.modules[name] = None\n"
    "from openstarry.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _without(names: tuple[str, ...], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT.format(names=names), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["worker", str(MANIFEST), "--bus", "redis://127.0.0.1:6379/0"],
        ["publish", "--bus", "redis://127.0.0.1:6379/0", str(MANIFEST)],
        ["tail", "--bus", "redis://127.0.0.1:6379/0"],
        ["bus", "info", "--bus", "redis://127.0.0.1:6379/0"],
    ],
    ids=["worker", "publish", "tail", "bus-info"],
)
def test_a_command_that_needs_the_redis_extra_says_how_to_install_it(args: list[str]) -> None:
    result = _without(("redis",), *args)
    _one_line(result, 2, says="pip install 'openstarry[redis]'")


def test_a_redis_session_store_that_does_not_answer_is_told_before_the_first_turn(
    tmp_path: Path,
) -> None:
    manifest = _manifest(tmp_path, sessions={"store": "redis://127.0.0.1:1/0"})
    result = _openstarry("run", str(manifest), "-i", "hi")
    _one_line(result, 1, says="cannot reach Redis at redis://127.0.0.1:1/0")
    assert "you> hi" not in result.stdout


# --- 2: a SQLite store that cannot be opened ---------------------------------------------------


@pytest.mark.parametrize(
    ("store", "says"),
    [
        ("sqlite:///nonexistent/dir/s.db", "unable to open database file"),
        ("sqlite:///{tmp}", "unable to open database file"),
        ("sqlite:///{tmp}/not-a-db.txt", "file is not a database"),
        ("sqlite://", "expected sqlite:///PATH"),
    ],
    ids=["missing-folder", "a-directory", "not-a-database", "no-path"],
)
@pytest.mark.parametrize("command", ["run", "serve", "mcp"])
def test_a_sqlite_store_that_cannot_be_used_is_refused_at_start(
    tmp_path: Path, store: str, says: str, command: str
) -> None:
    (tmp_path / "not-a-db.txt").write_text("hello, not SQLite\n" * 100)
    manifest = _manifest(tmp_path, sessions={"store": store.format(tmp=tmp_path)})
    args = ["-i", "hi"] if command == "run" else ["--port", "0"] if command == "serve" else []
    result = _openstarry(command, str(manifest), *args)
    line = _one_line(result, 2, says=says)
    assert "sessions.store" in line


@NEEDS_REDIS_SERVER
def test_a_worker_refuses_a_sqlite_store_that_cannot_be_used(tmp_path: Path, bus: str) -> None:
    manifest = _manifest(tmp_path, sessions={"store": "sqlite:///nonexistent/dir/s.db"})
    result = _openstarry("worker", str(manifest), "--bus", bus)
    _one_line(result, 2, says="sessions.store: cannot use the SQLite database")


# --- 4: publish of a file that cannot be read --------------------------------------------------


@pytest.mark.parametrize(("name", "says"), [("missing", "No such file"), (".", "Is a directory")])
def test_publish_of_a_file_that_cannot_be_read(tmp_path: Path, name: str, says: str) -> None:
    path = tmp_path / name
    result = _openstarry("publish", "--bus", "redis://127.0.0.1:1/0", str(path))
    _one_line(result, 2, says=f"openstarry publish: cannot read {path}: {says}")


# --- 5: closed and full standard streams -------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("publish --bus redis://127.0.0.1:1/0 <&-", "standard input is closed: give a FILE"),
        (f"mcp {MANIFEST} <&-", "standard input is closed"),
        (f"run {MANIFEST} <&-", "standard input is closed: give --input TEXT"),
        (f"run {MANIFEST} -i hi >&-", "standard output is closed"),
        ("tail --bus redis://127.0.0.1:1/0 >&-", "standard output is closed"),
        ("schema manifest >/dev/full", "cannot write: No space left on device"),
        ("demo examples/events.ndjson >/dev/full", "cannot write: No space left on device"),
    ],
    ids=[
        "publish-stdin",
        "mcp-stdin",
        "run-stdin",
        "run-stdout",
        "tail-stdout",
        "schema-full",
        "demo-full",
    ],
)
def test_closed_and_full_standard_streams(line: str, says: str) -> None:
    status = 1 if "/dev/full" in line else 2
    _one_line(_shell(f"exec {SHELL_OPENSTARRY} {line}"), status, says=says)


@NEEDS_REDIS_SERVER
def test_publish_and_tail_on_a_full_disk(bus: str, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.ndjson"
    inputs.write_bytes(inputs_ndjson(["one", "two"]))
    line = f"exec {SHELL_OPENSTARRY} publish --bus {bus} {inputs} >/dev/full"
    _one_line(_shell(line), 1, says="openstarry publish: cannot write: No space left")
    line = f"exec {SHELL_OPENSTARRY} tail --bus {bus} --count 1 >/dev/full"
    _one_line(_shell(line), 1, says="openstarry tail: cannot write: No space left")


# --- 6: bad Redis URLs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://[::1", "not a valid URL: Invalid IPv6 URL"),
        ("redis://:secret@[::1", "not a valid URL"),
        ("redis://127.0.0.1:6379/notadb", "the database is a number (/0, /1, ...), not 'notadb'"),
        ("redis://127.0.0.1:99999/0", "Port out of range"),
        ("unix://", "the socket's path is missing"),
    ],
)
@pytest.mark.parametrize("command", ["tail", "publish", "bus-info"])
def test_a_bad_redis_url_is_refused_in_one_line(url: str, says: str, command: str) -> None:
    args = command.split("-") if command == "bus-info" else [command]
    result = _openstarry(*args, "--bus", url)
    line = _one_line(result, 2, says=says)
    assert "secret" not in result.stderr, line


@pytest.mark.parametrize(
    ("where", "url"),
    [("bus", "redis://[::1"), ("sessions", "redis://127.0.0.1:6379/notadb")],
)
def test_a_bad_redis_url_in_the_manifest_is_refused(tmp_path: Path, where: str, url: str) -> None:
    change = {"bus": {"url": url}} if where == "bus" else {"sessions": {"store": url}}
    manifest = _manifest(tmp_path, **change)
    result = _openstarry("run", str(manifest), "-i", "hi")
    _one_line(result, 2, says="bus.url" if where == "bus" else "sessions.store")


@NEEDS_REDIS_SERVER
def test_a_database_the_server_does_not_have_is_told_by_it(bus: str) -> None:
    url = bus.rsplit("/", 1)[0] + "/99"
    for args in (["tail", "--bus", url], ["bus", "info", "--bus", url]):
        _one_line(_openstarry(*args), 2, says="DB index is out of range")


# --- 7: bad environment values -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf"])
def test_a_bad_claim_idle_is_refused(value: str) -> None:
    result = _openstarry(
        "worker",
        str(MANIFEST),
        "--bus",
        "redis://127.0.0.1:1/0",
        env={"OPENSTARRY_CLAIM_IDLE": value},
    )
    _one_line(result, 2, says="OPENSTARRY_CLAIM_IDLE: expected seconds, a number more than 0")


# --- 8: text that is not UTF-8 -----------------------------------------------------------------


def test_an_input_line_that_is_not_utf8_is_skipped_and_the_next_ones_run() -> None:
    result = _openstarry("run", str(MANIFEST), stdin=b"a\xff\nQuery weather in Taipei\n")
    _one_line(result, 1, says="openstarry run: input line 1 is not valid UTF-8: skipped")
    assert "The weather in Taipei is 25°C, Sunny." in result.stdout


def test_an_input_argument_that_is_not_utf8_is_refused() -> None:
    bad = os.fsdecode(b"\xff")
    result = _openstarry("run", str(MANIFEST), "-i", bad)
    _one_line(result, 2, says="--input and --session must be valid UTF-8 text")


# --- 9: a reader that goes away ----------------------------------------------------------------


def test_run_into_a_pipe_closed_early_stops_quietly(tmp_path: Path) -> None:
    inputs = tmp_path / "questions.txt"
    inputs.write_text("Query weather in Taipei\n" * 200)
    line = (
        f"set -o pipefail; {SHELL_OPENSTARRY} run {MANIFEST} < {inputs} 2>{tmp_path}/err | head -1"
    )
    started = time.monotonic()
    result = _shell(line)
    assert time.monotonic() - started < 20  # not 200 turns
    assert result.returncode == 0, result.stderr
    assert result.stdout == "you> Query weather in Taipei\n"
    err = (tmp_path / "err").read_text()
    assert err == "", err  # no KERNEL:ERROR line per event, no "Exception ignored"


@pytest.mark.parametrize(
    "line",
    [
        "schema manifest | head -1",
        "demo examples/events.ndjson | head -1",
        "run {manifest} --events -i hi -i hi | head -c 10",
    ],
)
def test_a_pipe_closed_early_ends_a_command_quietly(line: str, tmp_path: Path) -> None:
    line = line.format(manifest=MANIFEST)
    result = _shell(f"set -o pipefail; {SHELL_OPENSTARRY} {line} >/dev/null")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@NEEDS_REDIS_SERVER
def test_bus_info_into_a_pipe_closed_early(bus: str) -> None:
    result = _shell(f"set -o pipefail; {SHELL_OPENSTARRY} bus info --bus {bus} --json | head -c 10")
    assert result.returncode == 0, result.stderr
    assert result.stdout == '{"bus": "r'
    assert result.stderr == ""


# --- 10 and 11: Ctrl-C -------------------------------------------------------------------------


def _interrupt(
    args: list[str], *, ready: Callable[[subprocess.Popen[str]], None], stdin: int | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Start ``openstarry ARGS``, send SIGINT once ``ready`` returns; the result and how long
    the command took to end after it."""
    process = subprocess.Popen(
        [*OPENSTARRY, *args],
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready(process)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = process.communicate(timeout=TIMEOUT)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), took


@pytest.mark.parametrize("command", ["run", "mcp"])
def test_ctrl_c_stops_a_command_reading_standard_input_at_once(command: str) -> None:
    read, write = os.pipe()  # a writer that never writes nor closes, as a fifo or a terminal
    try:
        result, took = _interrupt(
            [command, str(MANIFEST)], ready=lambda process: time.sleep(4), stdin=read
        )
    finally:
        os.close(read)
        os.close(write)
    assert took < 2, took
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr


@NEEDS_REDIS_SERVER
def test_publish_says_when_it_is_blocked_and_ctrl_c_prints_what_was_accepted(
    bus: str, tmp_path: Path
) -> None:
    # No worker: 8 partitions of 10,000 entries each fill, and publish waits for room.
    big = tmp_path / "big.ndjson"
    events = (
        Event.new("INPUT:USER_MESSAGE", {"text": f"q{i}"}, source="t", session_id=f"s{i % 64}")
        for i in range(90_000)
    )
    big.write_bytes(b"".join(encode_event(event) + b"\n" for event in events))
    notices: list[str] = []

    def blocked(process: subprocess.Popen[str]) -> None:
        notices.append(process.stderr.readline() if process.stderr else "")

    result, took = _interrupt(["publish", "--bus", bus, str(big)], ready=blocked)
    assert "waiting: the bus's streams are at their bound (maxlen 10,000)" in notices[0]
    assert "publishing resumes as workers drain them" in notices[0]
    assert took < 2, took
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    counts = json.loads(out)
    assert 10_000 <= counts["accepted"] < 90_000  # at least one stream filled
    assert counts["accepted"] + counts["unsent"] == 90_000
    assert counts["duplicates"] == counts["invalid"] == 0


# --- 13: a bus counted otherwise ---------------------------------------------------------------


@NEEDS_REDIS_SERVER
def test_a_different_partition_count_is_refused_by_every_command(bus: str, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.ndjson"
    inputs.write_bytes(inputs_ndjson(["Query weather in Taipei"]))
    published = _openstarry("publish", "--bus", bus, str(inputs))  # records 8, the default
    assert json.loads(published.stdout)["accepted"] == 1, published.stderr
    says = "the bus 'openstarry' has 8 partitions, not 3: give --partitions 8"
    for args in (
        ["worker", str(MANIFEST), "--bus", bus, "--partitions", "3"],
        ["publish", "--bus", bus, "--partitions", "3", str(inputs)],
        ["tail", "--bus", bus, "--partitions", "3", "--count", "1"],
        ["bus", "info", "--bus", bus, "--partitions", "3"],
    ):
        _one_line(_openstarry(*args), 2, says=says)
    # Without --partitions, a reader takes the bus's own count: the whole bus is shown.
    tail = _openstarry("tail", "--bus", bus, "--count", "1", "--timeout", "5")
    assert tail.returncode == 0, tail.stderr
    assert json.loads(tail.stdout)["payload"] == {"text": "Query weather in Taipei"}


# --- 14: serve on an address that cannot be used -----------------------------------------------


def test_serve_on_a_port_in_use_says_so_before_starting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _openstarry("serve", str(MANIFEST), "--port", str(port))
    line = _one_line(result, 1, says=f"cannot listen on 127.0.0.1:{port}")
    assert "Address already in use" in line
    assert "startup" not in result.stderr


def test_serve_on_a_host_that_is_not_this_machine() -> None:
    result = _openstarry("serve", str(MANIFEST), "--host", "no-such-host.invalid", "--insecure")
    _one_line(result, 1, says="cannot listen on no-such-host.invalid:8000")


# --- 15: the smaller ones ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the server did not start")


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    process = subprocess.Popen(
        [*OPENSTARRY, "serve", str(MANIFEST), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port, process)
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_exits_130_on_ctrl_c(served: tuple[subprocess.Popen[bytes], int]) -> None:
    process, port = served
    # Serving, not only listening: the port listens before the agent and uvicorn start.
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                assert r.status == 200
                break
        except OSError:
            assert time.monotonic() < deadline, "the server did not answer /health"
            time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130


@NEEDS_REDIS_SERVER
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_worker_exits_130_on_ctrl_c_and_0_on_sigterm(bus: str, sig: int, status: int) -> None:
    process = subprocess.Popen(
        [*OPENSTARRY, "worker", str(MANIFEST), "--bus", bus],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stderr.readline() if process.stderr else ""
        assert "consuming" in line, line
        process.send_signal(sig)
        process.communicate(timeout=30)
        assert process.returncode == status
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_demo_errors_name_the_command(tmp_path: Path) -> None:
    result = _openstarry("demo", str(tmp_path / "missing.ndjson"))
    _one_line(result, 2, says="openstarry demo: cannot read")


def test_an_api_key_variable_that_is_not_a_name_is_refused_at_load(tmp_path: Path) -> None:
    provider = {"name": "openai", "model": "m", "apiKeyEnv": "has space"}
    result = _openstarry("run", str(_manifest(tmp_path, provider=provider)), "-i", "hi")
    _one_line(result, 2, says="provider.apiKeyEnv")


def test_trio_missing_is_told_with_how_to_install_it() -> None:
    result = _without(("trio",), "run", str(MANIFEST), "--backend", "trio", "-i", "hi")
    _one_line(result, 2, says="--backend trio needs trio: pip install trio")


def test_mcp_over_http_answers_its_health_check() -> None:
    pytest.importorskip("mcp")
    port = _free_port()
    process = subprocess.Popen(
        [*OPENSTARRY, "mcp", str(MANIFEST), "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port, process)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            assert response.status == 200
            assert json.loads(response.read()) == {"status": "ok"}
    finally:
        process.terminate()
        process.wait(timeout=30)


# --- openstarry init ---------------------------------------------------------------------------


def test_init_writes_the_example_agent_and_never_overwrites(tmp_path: Path) -> None:
    folder = tmp_path / "my-agent"
    made = _openstarry("init", str(folder))
    assert made.returncode == 0, made.stderr
    written = json.loads((folder / "agent.json").read_text())
    example = json.loads(MANIFEST.read_text())
    assert written == AGENT == example  # the agent the docs run from a clone
    assert (folder / "workspace").is_dir()
    run = _openstarry("run", str(folder / "agent.json"), "-i", "Query weather in Taipei")
    assert "The weather in Taipei is 25°C, Sunny." in run.stdout, run.stderr
    lines = (folder / "inputs.ndjson").read_bytes().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0])["type"] == "INPUT:USER_MESSAGE"
    again = _openstarry("init", str(folder))
    _one_line(again, 2, says="agent.json exists: nothing written")
