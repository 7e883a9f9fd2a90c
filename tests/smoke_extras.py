"""Smoke test of the wheel with an extra: each extra's first documented example.

Run by ``make test`` with the python of a fresh virtual environment that holds
the wheel and what the extras named by ``--extra`` bring, nothing else (no test
tools), so a module an extra needs and does not install fails here. ``make
test`` runs it once for each of ``redis``, ``http``, ``mcp``, ``cli`` and
``a2a`` alone, each in its own venv, then for ``http,mcp,cli,otel`` together:

- ``redis``: a throwaway ``redis-server`` (no persistence), the first example
  of docs/guides/redis.md (a worker and a producer in one process), then
  ``openstarry worker`` answering an input sent by ``openstarry publish``, read
  back with ``openstarry tail`` and seen by ``openstarry bus info``, then
  ``openstarry run`` keeping its session in the Redis session store;
- ``http``: ``openstarry serve``, asked with the shipped client; its console and
  ``/metrics``;
- ``mcp``: ``openstarry mcp`` over stdio, its tool called by the MCP SDK's client;
- ``cli``: ``openstarry run`` at a terminal (a pseudo-terminal): the
  prompt_toolkit prompt, a question typed, its answer read, ``/quit``;
- ``otel``: ``openstarry.otel`` imports;
- ``a2a``: a remote A2A agent as a tool of an agent (nothing listens: its call
  says ``REMOTE_UNAVAILABLE``; a server would need ``[http]``).

Every server is on 127.0.0.1, started and stopped here, and every wait has a
time limit. Only the standard library and what the extras install are used.

    python tests/smoke_extras.py --extra redis examples/weather-agent/agent.json
    python tests/smoke_extras.py --extra http,mcp,cli,otel examples/weather-agent/agent.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

QUESTION = "Query weather in Taipei"
ANSWER = "The weather in Taipei is 25°C, Sunny."


def fail(message: str) -> SystemExit:
    return SystemExit(f"smoke_extras: {message}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _openstarry() -> str:
    found = shutil.which("openstarry", path=str(Path(sys.executable).parent))
    if found is None:
        raise fail("the openstarry command is not installed beside python")
    return found


def _stop(process: subprocess.Popen[bytes], timeout: float = 15) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` seconds: nothing is left running."""
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
        raise fail(f"{process.args!r} did not stop within {timeout:g} s of SIGTERM") from None


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise fail(f"{what} did not start:\n{log.read_text(errors='replace')}") from None
            time.sleep(0.1)


def _openstarry_run(args: list[str], *, timeout: float = 60, stdin: str = "") -> str:
    """``openstarry ARGS``: its standard output; a failure shows its standard error."""
    command = [_openstarry(), *args]
    try:
        done = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise fail(f"openstarry {args[0]} took more than {timeout:g} s") from None
    if done.returncode != 0:
        raise fail(
            f"openstarry {' '.join(args)}: exit status {done.returncode}\n"
            f"{done.stdout}{done.stderr}"
        )
    return done.stdout


# -- [redis] --------------------------------------------------------------------------------


def check_redis(manifest: str) -> None:
    """docs/guides/redis.md's first example, the commands of a shared bus, the session store."""
    server_path = shutil.which("redis-server")
    if server_path is None:
        raise fail("the [redis] check needs redis-server on PATH (`make redis-server`)")
    with tempfile.TemporaryDirectory(prefix="smoke-redis-") as tmp:
        folder = Path(tmp)
        port = _free_port()
        log = folder / "redis.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [
                    *(server_path, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp),
                    *("--save", "", "--appendonly", "no", "--protected-mode", "yes"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_for_port(port, server, "redis-server", log)
            url = f"redis://127.0.0.1:{port}/0"
            anyio.run(_redis_first_example, url)
            _redis_worker(manifest, url, folder)
            _redis_sessions(manifest, url, folder)
        finally:
            _stop(server)


async def _redis_first_example(url: str) -> None:
    """The first example of docs/guides/redis.md: a worker and a producer in one process."""
    from openstarry import EventBus
    from openstarry.core import Event

    handled = anyio.Event()
    seen: list[str] = []

    def on_input(event: Event) -> None:
        seen.append(event.payload["text"])
        handled.set()

    with anyio.fail_after(30):
        async with EventBus.from_url(url, group="agents", consumer="w1") as worker:
            worker.subscribe("INPUT:*", on_input)
            async with EventBus.from_url(url, consume=False) as producer:  # publishes only
                event = Event.new(
                    "INPUT:USER_MESSAGE", {"text": "hello"}, source="docs", session_id="alice"
                )
                producer.publish(event)
            await handled.wait()
    if seen != ["hello"]:
        raise fail(f"the Redis bus's worker handled {seen}")
    print("redis: docs/guides/redis.md's worker and producer, w1 handled INPUT:USER_MESSAGE")


def _envelope(text: str, session_id: str) -> str:
    """An ``INPUT:USER_MESSAGE`` envelope of spec 002, one NDJSON line."""
    return json.dumps(
        {
            "id": str(uuid.uuid4()),
            "timestamp": int(time.time() * 1000),
            "traceId": str(uuid.uuid4()),
            "source": "smoke",
            "sessionId": session_id,
            "priority": 2,
            "type": "INPUT:USER_MESSAGE",
            "payload": {"text": text},
        }
    )


def _redis_worker(manifest: str, url: str, folder: Path) -> None:
    """``openstarry worker`` answers what ``openstarry publish`` sends; ``tail`` reads it."""
    consumer = "smoke-w1"
    log = folder / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [_openstarry(), "worker", manifest, "--bus", url, "--consumer", consumer],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        published = _openstarry_run(
            ["publish", "--bus", url], stdin=_envelope(QUESTION, "smoke-bus") + "\n"
        )
        if json.loads(published).get("accepted") != 1:
            raise fail(f"openstarry publish: {published.strip()}")
        texts = _tail_until_answer(url, "smoke-bus")
        info = json.loads(_openstarry_run(["bus", "info", "--bus", url, "--json"]))
        entries = sum(node["entries"] for node in info["nodes"])
        if entries == 0 or consumer not in json.dumps(info["consumers"]):
            raise fail(f"openstarry bus info: {entries} entries, consumers {info['consumers']}")
    finally:
        status = _stop(worker, timeout=30)
    if status != 0:
        raise fail(f"openstarry worker: exit status {status} on SIGTERM\n{log.read_text()}")
    print(f"redis: worker, publish, tail -> {texts[-1]!r}; bus info: {entries} entries")


def _tail_until_answer(url: str, session_id: str, timeout: float = 60) -> list[str]:
    """``openstarry tail`` of the agent's messages, until the session's answer (or ``timeout``)."""
    tail = subprocess.Popen(
        [_openstarry(), "tail", "--bus", url, "--type", "OUTPUT:AGENT_MESSAGE"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert tail.stdout is not None
    texts: list[str] = []
    pending = b""
    deadline = time.monotonic() + timeout
    try:
        while ANSWER not in texts:
            left = deadline - time.monotonic()
            if left <= 0:
                raise fail(f"openstarry tail read {texts} in {timeout:g} s, not {ANSWER!r}")
            ready, _, _ = select.select([tail.stdout], [], [], min(left, 0.2))
            if not ready:
                continue
            chunk = os.read(tail.stdout.fileno(), 65536)
            if not chunk:
                raise fail(f"openstarry tail exited ({tail.wait(5)}): {texts} {pending!r}")
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:  # a message on standard error
                    texts.append(line.decode(errors="replace"))
                    continue
                if event["sessionId"] == session_id:
                    texts.append(event["payload"]["text"])
    finally:
        _stop(tail)
    return texts


def _redis_sessions(manifest: str, url: str, folder: Path) -> None:
    """``openstarry run`` with ``"sessions": {"store": "redis://..."}``, twice: one session."""
    import redis

    agent = folder / "agent"
    shutil.copytree(Path(manifest).parent, agent)
    copy = agent / Path(manifest).name
    data = json.loads(copy.read_text())
    data["sessions"] = {"store": url}
    copy.write_text(json.dumps(data))
    lengths = []
    with redis.Redis.from_url(url) as client:
        for _ in range(2):
            out = _openstarry_run(
                ["run", str(copy), "--input", QUESTION, "--session", "smoke-store"]
            )
            if ANSWER not in out:
                raise fail(f"openstarry run with the Redis session store printed {out!r}")
            stored = client.get("{openstarry}:session:smoke-store")
            lengths.append(len(json.loads(stored)) if stored else 0)
    if not 0 < lengths[0] < lengths[1]:
        raise fail(f"the Redis session store held {lengths} entries after each run")
    print(f"redis: openstarry run, the session in Redis: {lengths[0]} then {lengths[1]} entries")


# -- [http] ---------------------------------------------------------------------------------


def check_http(manifest: str) -> None:
    from openstarry.api.client import Client

    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="smoke-http-") as tmp:
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [_openstarry(), "serve", manifest, "--port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_for_port(port, server, "openstarry serve", log)
            base = f"http://127.0.0.1:{port}"
            with Client(base) as client:
                response = client.run(QUESTION, session_id="smoke")
            texts = [m.get_text_content() for m in response.output or [] if m.role == "assistant"]
            if response.status != "completed" or ANSWER not in texts:
                raise fail(f"unexpected answer {response.status}: {texts}")
            print(f"http: {response.status}, {len(response.output or [])} messages, {texts[-1]!r}")
            check_console(base)
        finally:
            _stop(server)


def check_console(base: str) -> None:
    """The console's files came in the wheel, and /metrics speaks Prometheus."""
    import httpx

    for path, needle in (
        ("/", "console.js"),
        ("/console/console.js", "EventSource"),
        ("/console/console.css", "--p0"),
        ("/metrics", "openstarry_tool_calls_total"),
    ):
        reply = httpx.get(base + path, timeout=10)
        if reply.status_code != 200 or needle not in reply.text:
            raise fail(f"GET {path}: {reply.status_code}, no {needle!r}")
    print("http: the console, its script and style, /metrics")


# -- [mcp] ----------------------------------------------------------------------------------


def check_mcp(manifest: str) -> None:
    anyio.run(_check_mcp, manifest)


async def _check_mcp(manifest: str) -> None:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=_openstarry(), args=["mcp", manifest], env=dict(os.environ)
    )
    with anyio.fail_after(60):
        async with Client(stdio_client(params)) as client:
            listed = await client.list_tools()
            names = sorted(tool.name for tool in listed.tools)
            if names != ["fs.read", "get_weather"]:
                raise fail(f"unexpected tools {names}")
            result = await client.call_tool("get_weather", {"location": "Taipei"})
            text = "".join(getattr(block, "text", "") for block in result.content)
            if result.is_error or "25°C, Sunny" not in text:
                raise fail(f"unexpected tool result {result}")
    print(f"mcp: tools {names}, get_weather -> {text[:60]!r}")


# -- [cli] ----------------------------------------------------------------------------------

_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_CURSOR_POSITION_REQUEST = b"\x1b[6n"
_BRACKETED_PASTE_ON = b"\x1b[?2004h"  # prompt_toolkit's prompt turns it on, the plain one never


class _Terminal:
    """A program at a pseudo-terminal of 24 x 100, its output kept, its cursor requests answered."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        import fcntl
        import pty
        import struct
        import termios

        self.fd, child = pty.openpty()
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self.process = subprocess.Popen(
            command, stdin=child, stdout=child, stderr=child, env=env, start_new_session=True
        )
        os.close(child)
        self.output = b""

    def text(self) -> str:
        return _ESCAPE.sub(b"", self.output).decode(errors="replace")

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\r")

    def read_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise fail(
                    f"openstarry run at a terminal: no {what} in {timeout:g} s:\n{self.text()}"
                )
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the program closed the terminal
                chunk = b""
            if not chunk:
                raise fail(f"openstarry run at a terminal ended before its {what}:\n{self.text()}")
            self.output += chunk
            for _ in range(chunk.count(_CURSOR_POSITION_REQUEST)):
                os.write(self.fd, b"\x1b[1;1R")  # as a terminal answers

    def close(self) -> int:
        try:
            return _stop(self.process, timeout=10)
        finally:
            os.close(self.fd)


def check_cli(manifest: str) -> None:
    """``openstarry run`` at a terminal: prompt_toolkit's prompt, a question, its answer, /quit."""
    with tempfile.TemporaryDirectory(prefix="smoke-cli-") as tmp:
        env = dict(os.environ, TERM="xterm", NO_COLOR="1", XDG_DATA_HOME=tmp)
        terminal = _Terminal([_openstarry(), "run", manifest], env)
        try:
            terminal.read_until(
                lambda: (
                    _BRACKETED_PASTE_ON in terminal.output or "openstarry[cli]" in terminal.text()
                ),
                30,
                "prompt",
            )
            if "openstarry[cli]" in terminal.text():
                raise fail(f"the plain prompt, not the [cli] one:\n{terminal.text()}")
            terminal.type(QUESTION)
            terminal.read_until(lambda: ANSWER in terminal.text(), 60, "answer")
            terminal.type("/quit")
            status = terminal.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise fail(f"openstarry run did not leave on /quit:\n{terminal.text()}") from None
        finally:
            terminal.close()
    if status != 0:
        raise fail(f"openstarry run at a terminal: exit status {status}\n{terminal.text()}")
    print(f"cli: openstarry run at a terminal, prompt_toolkit's prompt -> {ANSWER!r}, /quit")


# -- [otel] ---------------------------------------------------------------------------------


def check_otel(manifest: str) -> None:
    """The [otel] extra brings what openstarry.otel imports."""
    import openstarry.otel  # noqa: F401

    print("otel: openstarry.otel imports")


def check_a2a(manifest: str) -> None:
    """The [a2a] extra: a remote A2A agent as a tool (its SDK, httpx), one that is not
    reachable, so the call answers REMOTE_UNAVAILABLE (no server needs [http] here)."""
    anyio.run(_check_a2a)


async def _check_a2a() -> None:
    from openstarry.a2a import A2AToolset
    from openstarry.agent.runtime import Agent
    from openstarry.manifest import A2AAgentConfig
    from openstarry.testing import FunctionProvider, text, tool_call

    def model(prompt: str, context: Any) -> Any:
        if context.round == 1:
            return tool_call("far", {"message": prompt})
        return text(str(context.memory[-1].error.code))

    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    far = A2AToolset([A2AAgentConfig(name="far", url=url)], timeout=5)
    async with Agent(FunctionProvider(model), toolsets=[far]) as agent:
        said = (await agent.ask("hello?")).text
    if said != "REMOTE_UNAVAILABLE":
        raise fail(f"a2a: an unreachable agent's call said {said!r}, not REMOTE_UNAVAILABLE")
    print("a2a: a remote agent as a tool; unreachable, its call says REMOTE_UNAVAILABLE")


CHECKS: dict[str, Callable[[str], None]] = {
    "redis": check_redis,
    "http": check_http,
    "mcp": check_mcp,
    "cli": check_cli,
    "otel": check_otel,
    "a2a": check_a2a,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--extra",
        default="http,mcp,cli,otel",
        help=f"the extras to check, comma-separated: {', '.join(CHECKS)} (default: %(default)s)",
    )
    parser.add_argument("manifest", help="the example agent's agent.json")
    args = parser.parse_args()
    extras = [name.strip() for name in args.extra.split(",") if name.strip()]
    unknown = [name for name in extras if name not in CHECKS]
    if unknown or not extras:
        parser.error(f"--extra: one or more of {', '.join(CHECKS)}, not {args.extra!r}")
    for name in extras:
        CHECKS[name](args.manifest)
    print(f"smoke_extras: openstarry[{','.join(extras)}] ok")


if __name__ == "__main__":
    main()
