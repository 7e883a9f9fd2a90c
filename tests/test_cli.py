"""The ``openstarry`` command: run an agent from its manifest; print the conversation or events."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent_harness import SYSTEM_COMMAND, USER_MESSAGE, conformance_problems, manifest_file
from openstarry.api.client import Client
from openstarry.cli import main
from openstarry.core import DedupWindow, EventQueue, Ingestor, decode_event

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "weather-agent" / "agent.json"

SPEC_SEQUENCE = [
    ("INPUT:USER_MESSAGE", None),
    ("KERNEL:TICK_START", None),
    ("KERNEL:STATE_CHANGE", ("IDLE", "THINKING")),
    ("OUTPUT:AGENT_MESSAGE", None),
    ("KERNEL:STATE_CHANGE", ("THINKING", "EXECUTING")),
    ("EXEC:TOOL_CALL", None),
    ("EXEC:TOOL_RESULT", None),
    ("KERNEL:TICK_START", None),
    ("KERNEL:STATE_CHANGE", ("EXECUTING", "THINKING")),
    ("OUTPUT:AGENT_MESSAGE", None),
    ("KERNEL:STATE_CHANGE", ("THINKING", "IDLE")),
]


def test_run_prints_the_conversation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLE), "--input", "Query weather in Taipei"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "you> Query weather in Taipei",
        "agent> Sure, let me check.",
        '  -> get_weather {"location": "Taipei"}',
        '  <- get_weather: {"location": "Taipei", "temperature": 25, "unit": "celsius", '
        '"condition": "Sunny", "summary": "25°C, Sunny"}',
        "agent> The weather in Taipei is 25°C, Sunny.",
    ]


def test_run_with_events_prints_one_envelope_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLE), "--input", "Query weather in Taipei", "--events"]) == 0
    lines = capsys.readouterr().out.splitlines()
    events = [decode_event(line.encode()) for line in lines]
    assert [e.type for e in events] == [kind for kind, _ in SPEC_SEQUENCE]
    for event, (_, states) in zip(events, SPEC_SEQUENCE, strict=True):
        if states is not None:
            assert (event.payload["from"], event.payload["to"]) == states
    assert len({e.trace_id for e in events}) == 1
    assert {e.session_id for e in events} == {"cli"}
    # Every line is the exact wire form: camelCase keys of spec 002.
    first = json.loads(lines[0])
    assert set(first) >= {"id", "timestamp", "traceId", "source", "sessionId", "priority", "type"}
    call, result = events[5], events[6]
    assert call.payload == {
        "toolCallId": call.payload["toolCallId"],
        "name": "get_weather",
        "args": {"location": "Taipei"},
    }
    assert result.parent_id == call.id
    assert result.payload["toolCallId"] == call.payload["toolCallId"]
    assert result.payload["result"]["summary"] == "25°C, Sunny"


def test_run_on_trio(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(EXAMPLE), "--input", "Query weather in Taipei", "--backend", "trio"])
    assert code == 0
    assert "agent> The weather in Taipei is 25°C, Sunny." in capsys.readouterr().out


def test_several_inputs_share_the_session(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            str(EXAMPLE),
            "-i",
            "Query weather in Taipei",
            "-i",
            "/read notes.txt",
            "-i",
            "/help",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "you> /read notes.txt" in out
    assert "  <- fs.read: Trip to Taipei" in out
    assert "/get_weather" in out  # /help lists the tools


def test_a_run_that_ends_in_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLE), "--input", "/nonsense"]) == 1
    assert "error: UNKNOWN_COMMAND" in capsys.readouterr().out


def test_a_bad_manifest_exits_2_naming_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "agent.json"
    manifest.write_text(json.dumps({"identity": {"name": "x"}, "limits": {"toolTimeout": -1}}))
    assert main(["run", str(manifest), "--input", "hi"]) == 2
    err = capsys.readouterr().err
    assert str(manifest) in err
    assert "limits.toolTimeout" in err


def test_an_unknown_tool_in_the_manifest_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "agent.json"
    manifest.write_text(json.dumps({"identity": {"name": "x"}, "tools": ["get_weather", "nope"]}))
    assert main(["run", str(manifest), "--input", "hi"]) == 2
    err = capsys.readouterr().err
    assert str(manifest) in err
    assert "tools[1]" in err


def test_schema_commands_print_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "manifest"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "identity" in schema["properties"]
    assert main(["schema", "protocol"]) == 0
    assert json.loads(capsys.readouterr().out)


def _command() -> list[str]:
    script = shutil.which("openstarry", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "openstarry.cli"]


def test_interactive_prompt_reads_lines_until_quit() -> None:
    proc = subprocess.run(
        [*_command(), "run", str(EXAMPLE)],
        input="Query weather in Taipei\n/quit\nnever read\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "agent> The weather in Taipei is 25°C, Sunny." in proc.stdout
    assert "never read" not in proc.stdout


def test_piped_input_and_output_are_unchanged_byte_for_byte() -> None:
    """(Regression guard, passes.) Issue 29 changed the prompt at a terminal only:
    from a pipe, every line is echoed as ``you> ...``, nothing else is printed
    (no prompt, no hint), and the bytes are exactly these."""
    proc = subprocess.run(
        [*_command(), "run", str(EXAMPLE)],
        input=b"Query weather in Taipei\n/read notes.txt\n/quit\nnever read\n",
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert (
        proc.stdout
        == (
            "you> Query weather in Taipei\n"
            "agent> Sure, let me check.\n"
            '  -> get_weather {"location": "Taipei"}\n'
            '  <- get_weather: {"location": "Taipei", "temperature": 25, "unit": "celsius", '
            '"condition": "Sunny", "summary": "25°C, Sunny"}\n'
            "agent> The weather in Taipei is 25°C, Sunny.\n"
            "you> /read notes.txt\n"
            '  -> fs.read {"path": "notes.txt"}\n'
            "  <- fs.read: Trip to Taipei: pack an umbrella just in case, and visit the night "
            "markets.\n"
            "agent> Goodbye.\n"
        ).encode()
    )


def test_interactive_prompt_ends_at_eof() -> None:
    proc = subprocess.run(
        [*_command(), "run", str(EXAMPLE), "--events"],
        input="list files\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    types = [json.loads(line)["type"] for line in proc.stdout.splitlines()]
    assert types.count("EXEC:TOOL_RESULT") == 1
    assert types[-1] == "KERNEL:STATE_CHANGE"


def test_the_console_script_is_installed() -> None:
    script = shutil.which("openstarry", path=str(Path(sys.executable).parent))
    assert script is not None, "the openstarry entry point is not installed next to python"
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("openstarry ")


def test_an_empty_session_id_on_the_command_line_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--session ""`` on the command line is a bad command line: the CLI prints a
    one-line error naming the session and exits with status 2, not a traceback."""
    from openstarry.cli import main

    example = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
    assert main(["run", str(example), "--session", "", "--input", "hi"]) == 2
    assert "session" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cli_events_from_a_piped_session_reingest_cleanly(
    backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(Regression guard, passes.) ``openstarry run --events`` fed through a pipe with
    /reset, /stop, built-ins, an unknown command, a slash tool and /quit prints one
    envelope a line that ``Ingestor`` takes back with no invalid line and no duplicate,
    and every event the agent emitted conforms."""
    from openstarry.cli import main

    script = [
        "Query weather in Taipei",
        "/reset",
        "list files",
        "/stop",
        "/metrics",
        "/help",
        "/nope",
        "/read notes.txt",
        "what did I ask?",
        "/quit",
        "never read",
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(script) + "\n"))
    code = main(["run", str(EXAMPLE), "--events", "--backend", backend])
    out = capsys.readouterr().out
    assert code == 1  # /nope ends with a KERNEL:ERROR
    ingestor = Ingestor(EventQueue(None), DedupWindow(60_000, 10_000))
    result = ingestor.ingest(out.encode())
    lines = out.splitlines()
    assert (result.accepted, result.duplicates, list(result.invalid)) == (len(lines), 0, [])
    events = [decode_event(line.encode()) for line in lines]
    inputs = [e.id for e in events if e.type in (USER_MESSAGE, SYSTEM_COMMAND)]
    typed = [e.payload.get("text") or "/" + e.payload["command"] for e in events if e.id in inputs]
    assert typed == script[:-1]
    assert conformance_problems(events, inputs) == []
    assert {e.session_id for e in events} == {"cli"}


def test_an_http_provider_behind_a_proxy_without_the_extra_is_a_manifest_error(
    tmp_path: Path,
) -> None:
    """It was a 30-line traceback and exit 1; now exit 2 naming the extra (httpx carries
    the requests through a proxy; openstarry's own transport needs no extra)."""
    path = manifest_file(tmp_path, {"provider": {"name": "openai", "model": "m"}})
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "from openstarry.cli import main\n"
        f"sys.exit(main(['run', {str(path)!r}, '--input', 'hi']))\n"
    )
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "OPENAI_API_KEY": "k"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "provider.name" in done.stderr
    assert "openstarry[http]" in done.stderr


#: A bound on any one wait, so a broken component fails a test instead of hanging it.
HANG = 10.0


FINAL_TEXT = "The weather in Taipei is 25°C, Sunny."


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_issue4_openstarry_serve_takes_host_and_port() -> None:
    """``openstarry serve MANIFEST --host 127.0.0.1 --port N``: health, then a streamed run."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "openstarry.cli", "serve", str(EXAMPLE)),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with Client(f"http://127.0.0.1:{port}", timeout=HANG) as client:
            deadline = time.monotonic() + HANG
            while True:
                try:
                    health = client.health()
                    break
                except httpx.TransportError:
                    assert process.poll() is None, process.communicate()
                    assert time.monotonic() < deadline, "the server did not come up"
                    time.sleep(0.05)
            streamed = client.run("Query weather in Taipei", session_id="host")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=HANG * 3)
        except subprocess.TimeoutExpired:  # never left running past the test
            process.kill()
            process.communicate()
            raise
    assert health["status"] == "ok"
    assert health["agent"] == "weather-agent"
    assert streamed.session_id == "host"
    assert streamed.output is not None
    assert streamed.output[-1].get_text_content() == FINAL_TEXT
    assert f"127.0.0.1:{port}" in err


@pytest.mark.parametrize(
    ("argv", "figures", "quick"),
    [
        (["bench"], None, False),
        (["bench", "--quick"], None, True),
        (["bench", "bus"], "bus", False),
        (["bench", "bus", "--quick"], "bus", True),
        (["bench", "--quick", "loop"], "loop", True),
        (["bench", "latency"], "latency", False),
    ],
)
def test_bench_sub_commands_parse(argv: list[str], figures: str | None, quick: bool) -> None:
    from openstarry.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.figures == figures
    assert getattr(args, "quick", False) is quick


def test_bench_latency_options_parse() -> None:
    from openstarry.cli import build_parser
    from openstarry.cli.bench import BENCH_DURATION, BENCH_RATES

    args = build_parser().parse_args(["bench", "latency"])
    assert args.rates == list(BENCH_RATES)
    assert args.duration == BENCH_DURATION
    assert args.handler_spec is None
    assert args.json is None
    assert args.plot is None
    assert args.against is None
    args = build_parser().parse_args(
        [
            *("bench", "latency", "--rates", "200, 2000", "--duration", "0.5"),
            *("--handler", "m:f", "--json", "o.json", "--plot", "o.png"),
            *("--against", "pure-python", "--against", "bubus"),
        ]
    )
    assert args.rates == [200, 2000]
    assert args.duration == 0.5
    assert args.handler_spec == "m:f"
    assert args.json == Path("o.json")
    assert args.plot == Path("o.png")
    assert args.against == ["pure-python", "bubus"]
    assert args.handler is not None  # the command's own handler, not --handler's


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--rates", "1000,fast", "not a rate: 'fast'"),
        ("--rates", "0", "a rate is 1 to 10,000,000 events per second, not 0"),
        ("--rates", "", "not a rate: ''"),
        ("--rates", ",".join(["5"] * 101), "at most 100 rates"),
        ("--duration", "0", "a duration is more than 0 and at most 3600 seconds"),
        ("--duration", "nan", "a duration is more than 0"),
        ("--duration", "soon", "not a number of seconds: 'soon'"),
        ("--against", "kafka", "invalid choice: 'kafka'"),
    ],
)
def test_bench_latency_bad_options_exit_2(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "latency", option, value])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_bus_prints_the_bus_figures_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "bus", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "bus latency" in out
    assert "bus throughput" in out
    assert "loop turn" not in out
