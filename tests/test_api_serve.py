"""``openstarry serve`` in production: shutdown, large events, slow and abusive clients,
who may call what.

In-process tests serve with uvicorn in a thread (``test_api_http.serving``);
the shutdown and connection tests run ``openstarry serve`` as a process, as a
deployment does. Every wait is bounded; the only timing asserted is the
issue's "answered within 1 s" under load, with a generous bound (see there).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from openstarry._http import check_bind, is_loopback, read_api_key
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.runtime import Agent
from openstarry.api.server import ServerLimits, create_app
from openstarry.assembly import agent_from_manifest
from openstarry.testing import ScriptedProvider, text, tool_call
from openstarry.tools.fs import fs_tools
from test_api_http import (
    HANG,
    WEATHER,
    BlockingTool,
    body,
    frames,
    lifespan_of,
    serving,
    serving_app,
    stream_until,
    wait_for,
)

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The server runs its own asyncio loop whatever the client's: one backend is enough."""
    return "asyncio"


def events_of(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(f["data"]) for f in frames(raw.decode())]


# --- a served process ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve_process(manifest: Path, *options: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``openstarry serve MANIFEST OPTIONS`` on a free port; yields its URL and process.

    The process is ended (SIGKILL) if the test left it running.
    """
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "openstarry.cli", "serve", str(manifest), "--port", str(port)]
    process = subprocess.Popen(
        [*command, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG * 2
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=HANG).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.05)
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def gated_manifest(folder: Path) -> Path:
    """An agent whose ``/wait_for FILE`` waits until FILE exists, callable over HTTP."""
    data = {
        "identity": {"name": "gated"},
        "provider": {"name": "default", "model": "offline"},
        "tools": ["get_weather", "prompt_tools:wait_for"],
        "api": {"expose_tools": ["prompt_tools:wait_for"]},
    }
    path = folder / "agent.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- 1. graceful shutdown --------------------------------------------------------------------


async def test_sigterm_lets_runs_finish_then_stops_them_and_every_client_gets_its_end(
    tmp_path: Path,
) -> None:
    """SIGTERM with three runs in flight, a grace of 2 s: the one that finishes within the
    grace completes; a stream and a ``stream: false`` request that never would end
    ``canceled``, each with its final event or JSON; no traceback; exit status 0."""
    gate = tmp_path / "gate"
    with serve_process(gated_manifest(tmp_path), "--shutdown-grace", "2") as (url, process):
        results: dict[str, Any] = {}
        async with httpx.AsyncClient(base_url=url, timeout=HANG * 3) as http:

            async def stream(name: str, text: str) -> None:
                async with http.stream("POST", "/process", json=body(text)) as response:
                    results[name] = (response.status_code, events_of(await response.aread()))

            async def wait(name: str, text: str) -> None:
                response = await http.post("/process", json=body(text, stream=False))
                results[name] = (response.status_code, response.json())

            with anyio.fail_after(HANG * 3):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(stream, "finishes", f"/wait_for {gate}")
                    tasks.start_soon(stream, "stopped", f"/wait_for {tmp_path / 'never-1'}")
                    tasks.start_soon(wait, "waiting", f"/wait_for {tmp_path / 'never-2'}")
                    while (await http.get("/health")).json()["runs"] < 3:
                        await anyio.sleep(0.05)
                    process.send_signal(signal.SIGTERM)
                    await anyio.sleep(0.5)
                    gate.touch()  # within the grace
        _, err = process.communicate(timeout=HANG * 3)
    assert process.returncode == 0, err
    assert "Traceback" not in err
    status, events = results["finishes"]
    assert status == 200
    assert events[-1]["status"] == "completed", events[-1]
    assert "gate opened" in json.dumps(events[-1]["output"])
    status, events = results["stopped"]
    assert status == 200
    assert events[-1]["object"] == "response"
    assert events[-1]["status"] == "canceled", events[-1]
    assert events[-1]["error"]["code"] == "shutdown"
    status, answer = results["waiting"]
    assert status == 200
    assert answer["status"] == "canceled"
    assert answer["error"]["code"] == "shutdown"


class StubbornTool(Tool):
    """Ignores being stopped for ``seconds`` (its wait is shielded from cancellation)."""

    name = "stubborn"
    description = "Will not stop."

    def __init__(self, seconds: float) -> None:
        self.parameters = {"type": "object", "properties": {}}
        self.seconds = seconds
        self.started = anyio.Event()

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.started.set()
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.seconds)
        return "finally"


async def test_a_run_that_will_not_stop_is_ended_by_the_shutdown_with_an_error() -> None:
    tool = StubbornTool(1.5)
    app = create_app(Agent(ScriptedProvider([]), [tool]), expose_tools=["stubborn"])
    api = app.state.openstarry
    async with lifespan_of(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            answers: list[httpx.Response] = []

            async def ask() -> None:
                answers.append(await http.post("/process", json=body("/stubborn", stream=False)))

            with anyio.fail_after(HANG):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(ask)
                    await tool.started.wait()
                    await api.drain(grace=0.1, stop_wait=0.3)
                late = await http.post("/process", json=body("hello"))
    [answer] = answers
    assert answer.status_code == 200
    assert answer.json()["status"] == "canceled"
    assert answer.json()["error"]["code"] == "shutdown"
    assert late.status_code == 503
    assert late.json()["code"] == "shutting_down"


# --- 2. live streams and the replay buffer -----------------------------------------------------


class BigTool(Tool):
    """Returns ``size`` characters of ``char``."""

    name = "big"
    description = "A large result."

    def __init__(self, size: int, char: str = "x") -> None:
        self.parameters = {"type": "object", "properties": {}}
        self.size = size
        self.char = char

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return self.char * self.size


async def _stream_whole(url: str, text: str) -> tuple[str, list[dict[str, Any]], bytes]:
    async with (
        httpx.AsyncClient(base_url=url, timeout=HANG * 3) as http,
        http.stream("POST", "/process", json=body(text)) as response,
    ):
        assert response.status_code == 200
        raw = await response.aread()
        return response.headers["x-openstarry-response-id"], events_of(raw), raw


async def test_a_10_mb_tool_result_streams_whole_and_only_its_replay_is_refused() -> None:
    size = 10_000_000
    agent = Agent(ScriptedProvider([]), [BigTool(size)])
    app = create_app(agent, expose_tools=["big"])
    with serving_app_of(app) as url:
        response_id, events, raw = await _stream_whole(url, "/big")
        assert len(raw) > size
        assert events[-1]["status"] == "completed", events[-1]
        results = [e for e in events if "x" * 1000 in json.dumps(e)]
        assert results, "the 10 MB result never arrived"
        assert max(len(json.dumps(e)) for e in results) > size
        # The replay buffer (2 MiB) did not keep it: a reconnect asking for it gets 410.
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            first = await http.get(
                f"/process/{response_id}", headers={"Last-Event-ID": f"{response_id}:0"}
            )
    assert first.status_code == 410
    assert first.json()["code"] == "events_expired"


async def test_a_mebibyte_of_characters_json_escapes_streams_whole(tmp_path: Path) -> None:
    """``fs.read`` of a 1 MiB file of ``"``: each becomes ``\\"`` in every event holding it."""
    (tmp_path / "quotes.txt").write_text('"' * (1 << 20), encoding="utf-8")
    agent = Agent(ScriptedProvider([]), fs_tools([tmp_path], max_bytes=2 << 20))
    with serving_app_of(create_app(agent, expose_tools=["fs.read"])) as url:
        _, events, _ = await _stream_whole(url, "/fs.read quotes.txt")
    final = events[-1]
    assert final["status"] == "completed", final
    [result] = [item for item in final["output"] if item["type"] == "function_call_output"]
    assert '"' * (1 << 20) in _texts(result)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def _texts(value: Any) -> str:
    """Every string in ``value``, decoded again where it holds JSON, joined."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return value if isinstance(decoded, (int, float)) else _texts(decoded)
    if isinstance(value, dict):
        return "".join(_texts(v) for v in value.values())
    if isinstance(value, list):
        return "".join(_texts(v) for v in value)
    return ""


@contextmanager
def serving_app_of(app: Any) -> Iterator[str]:
    with serving_app(app, lifespan="on") as url:
        yield url


# --- 3. slow and abusive clients -------------------------------------------------------------


async def _slow_client(
    address: str, port: int, head: bytes, outcome: dict[str, int], deadline: float
) -> None:
    """Connect from ``address``, send ``head``, then a byte a second until the server answers."""
    try:
        stream = await anyio.connect_tcp("127.0.0.1", port, local_host=address)
    except OSError:
        outcome["refused"] = outcome.get("refused", 0) + 1
        return
    async with stream:
        outcome["connected"] = outcome.get("connected", 0) + 1
        await stream.send(head)
        answer = b""
        with anyio.move_on_after(deadline):
            while True:
                with anyio.move_on_after(1):
                    try:
                        answer = await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        answer = answer or b"closed"
                    break
                try:
                    await stream.send(b"x")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    answer = b"closed"
                    break
        key = answer.split(b"\r\n", 1)[0].decode("latin-1") if answer else "no answer"
        outcome[key] = outcome.get(key, 0) + 1


async def _timed(call: Any) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    response = await call
    return time.monotonic() - start, response


async def test_slow_clients_are_timed_out_and_health_and_a_run_are_answered_meanwhile() -> None:
    """1,500 connections sending their head a byte a second, each from its own loopback
    address, and 50 sending their body a byte a second: ``/health`` and a ``/process`` are
    still answered, then every slow connection gets ``408`` once its timeout passes.

    The issue asks for answers within 1 s; on a shared two-core machine running the 1,550
    clients in the same process, this asserts a generous 3 s and prints the figures.
    """
    slow_heads, slow_bodies, timeout = 1500, 50, 6
    options = ["--header-timeout", str(timeout), "--body-timeout", str(timeout)]
    with serve_process(WEATHER, *options) as (url, _process):
        port = int(url.rsplit(":", 1)[1])
        heads: dict[str, int] = {}
        bodies: dict[str, int] = {}
        post = (
            b"POST /process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        with anyio.fail_after(timeout * 4 + HANG):
            async with anyio.create_task_group() as tasks:
                for i in range(slow_heads):
                    address = f"127.1.{i // 250}.{i % 250 + 1}"
                    tasks.start_soon(
                        _slow_client,
                        address,
                        port,
                        b"GET /health HTTP/1.1\r\nHo",
                        heads,
                        timeout * 3,
                    )
                for i in range(slow_bodies):
                    tasks.start_soon(
                        _slow_client, f"127.2.0.{i + 1}", port, post, bodies, timeout * 3
                    )
                while heads.get("connected", 0) + bodies.get("connected", 0) < 1550:
                    await anyio.sleep(0.05)
                await anyio.sleep(0.5)
                async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
                    health_s, health = await _timed(http.get("/health"))
                    run_s, run = await _timed(
                        http.post("/process", json=body("Query weather in Taipei", stream=False))
                    )
        print(f"\n/health {health_s:.3f} s, /process {run_s:.3f} s; heads {heads}; bodies {bodies}")
    assert health.status_code == 200
    assert run.status_code == 200
    assert run.json()["status"] == "completed"
    assert health_s < 3
    assert run_s < 3
    assert heads == {"connected": slow_heads, "HTTP/1.1 408 Request Timeout": slow_heads}
    assert bodies == {"connected": slow_bodies, "HTTP/1.1 408 Request Timeout": slow_bodies}


async def test_connections_per_address_are_capped_with_a_json_429() -> None:
    with serve_process(WEATHER, "--max-connections-per-address", "3") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        held = [
            await anyio.connect_tcp("127.0.0.1", port, local_host="127.3.0.1") for _ in range(3)
        ]
        try:
            async with await anyio.connect_tcp("127.0.0.1", port, local_host="127.3.0.1") as extra:
                await extra.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                raw = b""
                with anyio.fail_after(HANG):
                    try:
                        while True:
                            raw += await extra.receive()
                    except anyio.EndOfStream:
                        pass
            # Another address is served as usual meanwhile.
            async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
                health = await http.get("/health")
        finally:
            for stream in held:
                await stream.aclose()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429")
    assert json.loads(payload)["code"] == "too_many_connections"
    assert health.status_code == 200


async def _read_all(stream: Any) -> bytes:
    raw = b""
    with anyio.fail_after(HANG):
        try:
            while True:
                raw += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    return raw


async def test_at_the_connection_cap_the_longest_silent_connection_gives_way() -> None:
    """Five silent connections fill a cap of five: a sixth is served, and the oldest silent
    one is answered ``408`` and closed."""
    with serve_process(WEATHER, "--max-connections", "5") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        silent = []
        for i in range(5):
            silent.append(await anyio.connect_tcp("127.0.0.1", port, local_host=f"127.4.0.{i + 1}"))
            await anyio.sleep(0.05)  # in order: the first is the longest silent
        try:
            async with await anyio.connect_tcp("127.0.0.1", port) as sixth:
                await sixth.send(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = await _read_all(sixth)
            oldest = await _read_all(silent[0])
        finally:
            for stream in silent:
                await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 200")
    head, _, payload = oldest.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(payload)["code"] == "request_timeout"


async def test_a_body_that_comes_too_slowly_gets_a_json_408() -> None:
    limits = ServerLimits(body_timeout=0.5)
    with serving(Agent(ScriptedProvider([]), []), limits) as url:
        host, _, port = url.removeprefix("http://").partition(":")
        async with await anyio.connect_tcp(host, int(port)) as connection:
            await connection.send(
                b"POST /process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            raw = b""
            with anyio.fail_after(HANG):
                while b"}" not in raw:
                    raw += await connection.receive()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(payload)["code"] == "request_timeout"


async def test_runs_nobody_reads_make_room_for_new_requests() -> None:
    """Two clients drop their long runs (which wait out a 30 s reconnect grace) with the run
    cap at 2: a new request is served at once, taking the slot of the older dropped run,
    which ends ``canceled``."""
    tool = BlockingTool()
    limits = ServerLimits(max_concurrent_runs=2, max_responses=8, resume_grace=30)
    # Each run calls the tool first: the script's three calls, then its three answers.
    script: list[Any] = [tool_call("block", {})] * 3 + [text("Done.")] * 3
    with serving(Agent(ScriptedProvider(script), [tool]), limits) as url:
        dropped = []
        for session in ("a", "b"):
            headers, _ = await stream_until(url, body(session_id=session), lambda e: True)
            dropped.append(headers["x-openstarry-response-id"])
        assert await wait_for(tool.started)
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            async with http.stream("POST", "/process", json=body(session_id="c")) as fresh:
                status = fresh.status_code
                tool.release.set()
                final = events_of(await fresh.aread())[-1]
            finals = [events_of((await http.get(f"/process/{rid}")).content)[-1] for rid in dropped]
            ends = [final["status"] for final in finals]
    assert status == 200
    assert final["status"] == "completed"
    # Only one slot was needed: the oldest run nobody read gave it up.
    assert ends == ["canceled", "completed"]
    assert finals[0]["error"]["code"] == "evicted"


# --- 6. who may call what ----------------------------------------------------------------------


async def test_an_api_key_guards_every_route_but_health() -> None:
    agent = agent_from_manifest(WEATHER)
    with serving_app_of(create_app(agent, api_key="s3cret")) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            health = await http.get("/health")
            missing = await http.post("/process", json=body(stream=False))
            wrong = await http.post(
                "/process", json=body(stream=False), headers={"Authorization": "Bearer nope"}
            )
            resume = await http.get("/process/response_x")
            right = await http.post(
                "/process", json=body(stream=False), headers={"Authorization": "Bearer s3cret"}
            )
    assert health.status_code == 200
    for refused in (missing, wrong, resume):
        assert refused.status_code == 401
        assert refused.json()["code"] == "unauthorized"
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200
    assert right.json()["status"] == "completed"


def test_a_public_address_needs_a_key_or_insecure(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("192.0.2.1")
    with pytest.raises(ValueError, match="not a loopback address"):
        check_bind("0.0.0.0", None, insecure=False)
    check_bind("0.0.0.0", "key", insecure=False)
    check_bind("0.0.0.0", None, insecure=True)
    check_bind("127.0.0.1", None, insecure=False)
    monkeypatch.delenv("OPENSTARRY_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="holds no API key"):
        read_api_key("OPENSTARRY_TEST_KEY")
    # The command refuses before it binds anything.
    for command, extra in (("serve", []), ("mcp", ["--http"])):
        cli = [sys.executable, "-m", "openstarry.cli", command, str(WEATHER), *extra]
        for options, said in (
            (["--host", "0.0.0.0", "--port", "9"], "--insecure"),
            (["--api-key-env", "OPENSTARRY_TEST_KEY"], "OPENSTARRY_TEST_KEY holds no API key"),
        ):
            result = subprocess.run(
                [*cli, *options], capture_output=True, text=True, timeout=HANG * 3
            )
            assert result.returncode == 2, result.stderr
            assert said in result.stderr


async def test_slash_commands_over_http_reach_only_exposed_tools() -> None:
    async def ask(url: str, text: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            return await http.post("/process", json=body(text, stream=False))

    # The example manifest exposes nothing over HTTP; fs.write is private to MCP.
    with serving_app_of(create_app(agent_from_manifest(WEATHER))) as url:
        refused = await ask(url, "/get_weather Taipei")
        helped = await ask(url, "/help")
        chat = await ask(url, "Query weather in Taipei")
    assert refused.status_code == 403
    assert refused.json()["code"] == "command_not_allowed"
    assert "tools: none" in refused.json()["message"]
    assert helped.status_code == 200
    assert helped.json()["status"] == "completed"
    assert chat.json()["status"] == "completed"
    exposed = create_app(agent_from_manifest(WEATHER), expose_tools=["get_weather", "fs.write"])
    with serving_app_of(exposed) as url:
        weather = await ask(url, "/get_weather Taipei")
        private = await ask(url, "/fs.write notes.txt hi")
        short = await ask(url, "/write notes.txt hi")
    assert weather.status_code == 200
    assert "Taipei" in json.dumps(weather.json()["output"])
    for refused in (private, short):
        assert refused.status_code == 403
        assert "fs.write" not in refused.json()["message"].split("tools:")[1]


@pytest.mark.parametrize(
    "session_id", ["a\nb", "tab\there", "x" * 129, "space here", "é", "\u2028", ""]
)
async def test_a_session_id_outside_its_charset_or_length_is_a_422(session_id: str) -> None:
    with serving(agent_from_manifest(WEATHER)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            refused = await http.post("/process", json=body(session_id=session_id))
    assert refused.status_code == 422
    assert refused.json()["code"] == "invalid_request"
    assert "session_id" in refused.json()["message"]


async def test_a_session_id_of_the_documented_charset_is_served() -> None:
    session_id = "user-1:chat@example.org_" + "x" * 104
    with serving(agent_from_manifest(WEATHER)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            answer = await http.post("/process", json=body(session_id=session_id, stream=False))
    assert answer.status_code == 200
    assert answer.json()["session_id"] == session_id
