"""The docs' examples run: every Python block of docs/ and the README, and the shell blocks that
call ``openstarry``, are executed here, or say why not; the outputs they show are checked.

The rules a page keeps (docs/design/testing.md says them for writers):

- A ``python`` block runs. The blocks of one page run in order in one namespace, as a
  reader reads them, in a folder holding a copy of ``examples/`` (so ``examples/...``
  paths work and nothing is written into the checkout). A block may ``await`` at its
  top level; the page's blocks share one event loop.
- A ``console`` block's ``$ `` lines are commands; the lines under a command are its
  expected output. An ``sh``/``bash`` block is a script. Either runs in bash when it calls
  ``openstarry`` (the ``openstarry`` there is this interpreter's ``python -m openstarry.cli``).
- ``<!-- not-run: REASON -->`` on the line before a block says it does not run, and why.
- ``<!-- needs: PROGRAM -->`` before a block: the page's examples need PROGRAM on ``PATH``
  (``redis-server``); without it the page is skipped, as the Redis tests are.
- ``<!-- run -->`` before a shell block runs it though it does not call ``openstarry``
  (a ``curl`` against the page's server).
- ``<!-- file: PATH -->`` before a block: the block is a file the reader saves as PATH
  (an ``agent.json``, a module of tools); it is written there, in the page's order,
  and not run. The block's fence may name it for the reader (``title="PATH"``).
- ``<!-- serve: MANIFEST -->`` on a line of a page: its examples run against
  ``openstarry serve MANIFEST``, started on a free port for the page, and every
  ``127.0.0.1:8000`` in its blocks is that port (the page shows the default address).
- ``<!-- model-server -->`` on a line of a page: its examples run against a
  local OpenAI-compatible server (Chat Completions, streamed or whole), started
  on a free port for the page, and every ``127.0.0.1:8080`` in its blocks is
  that server's address (the page shows a real one, ``http://127.0.0.1:8080/v1``).
  Its model is a few rules (:func:`model_reply`): asked about the weather in a
  city with a tool named ``get_weather`` (or ``<server>.get_weather``), it calls
  the tool, and says what the tool answered. The page must say that a real model
  words things its own way.
- ``<!-- redis-server -->`` on a line of a page: its examples run against a
  throwaway ``redis-server`` started for the page (the page needs it on
  ``PATH``, as for ``needs``), and every ``localhost:6379`` in its blocks is
  that server's address.
- A shell block may leave a program running in the background (``cmd &``);
  whatever a page's shell blocks leave running is stopped (SIGTERM) when the
  page ends, pass or fail.
- ``<!-- expect-output -->`` before a block makes it the expected standard output of the
  runnable block just before it.
- In an expected output, ``...`` or ``…`` matches anything within a line, and a line of
  only ``...`` any number of lines.

The generated references (docs/hooks.py) are checked against the code here too, and the
README is held to its 250 lines.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import openstarry
from docs_support import load_docs_module

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250

PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"sh", "bash", "shell", "console"}
# `openstarry` as a command: at a line's start, after a prompt, a pipe, `;` or `&&`.
CALLS_OPENSTARRY = re.compile(r"(?:^|[|;&]\s*|\$\s+)openstarry(?:\s|$)", re.MULTILINE)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->$")
SERVE = re.compile(r"^<!--\s*serve:\s*(?P<manifest>\S+)\s*-->$", re.MULTILINE)
SERVED_AT = "127.0.0.1:8000"
RUN = "<!-- run -->"
MODEL_SERVER = re.compile(r"^<!--\s*model-server\s*-->$", re.MULTILINE)
MODEL_AT = "127.0.0.1:8080"
REDIS_SERVER = re.compile(r"^<!--\s*redis-server\s*-->$", re.MULTILINE)
REDIS_AT = "localhost:6379"
FILE = re.compile(r"^<!--\s*file:\s*(?P<path>\S+)\s*-->$")
NEEDS = re.compile(r"^<!--\s*needs:\s*(?P<program>\S+)\s*-->$")
EXPECT_OUTPUT = "<!-- expect-output -->"
SHELL_TIMEOUT = 120


@dataclass
class Block:
    """A fenced code block of a Markdown file."""

    path: Path
    line: int  # of the opening fence, from 1
    lang: str
    source: str
    not_run: str | None  # the reason, when marked
    expect_output: bool  # this block is the expected output of the one before
    needs: str | None  # a program the block needs on PATH
    run_marked: bool  # a shell block marked to run though it does not call openstarry
    file: str | None = None  # the path the block is saved as, when it is a file

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.lang in PYTHON_LANGS

    @property
    def calls_openstarry(self) -> bool:
        return self.lang in SHELL_LANGS and bool(CALLS_OPENSTARRY.search(self.source))

    @property
    def runs(self) -> bool:
        shell = self.calls_openstarry or (self.run_marked and self.lang in SHELL_LANGS)
        return self.not_run is None and self.file is None and (self.is_python or shell)


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the marker on the line before each."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        start, indent, fence = index, len(opening["indent"]), opening["fence"]
        lang = opening["info"].strip().split(" ")[0].strip("{}.").lower()
        before = next((text.strip() for text in reversed(lines[:index]) if text.strip()), "")
        marker = NOT_RUN.match(before)
        needs = NEEDS.match(before)
        body: list[str] = []
        index += 1
        while index < len(lines) and not (
            lines[index].strip().startswith(fence) and lines[index].strip().strip(fence[0]) == ""
        ):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        blocks.append(
            Block(
                path=path,
                line=start + 1,
                lang=lang,
                source="\n".join(body) + "\n",
                not_run=marker["reason"] if marker else None,
                expect_output=before == EXPECT_OUTPUT,
                needs=needs["program"] if needs else None,
                run_marked=before == RUN,
                file=saved["path"] if (saved := FILE.match(before)) else None,
            )
        )
        index += 1
    return blocks


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- expected outputs ---------------------------------------------------------------------------


def output_pattern(expected: str) -> re.Pattern[str]:
    """A regex for an expected output: ``...``/``…`` match within a line, a ``...`` line lines."""
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() in ("...", "…"):
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = re.split(r"\.\.\.|…", line.rstrip())
        parts.append("[^\\n]*?".join(re.escape(piece) for piece in pieces) + r"\n")
    return re.compile("".join(parts))


def matches(expected: str, actual: str) -> bool:
    cleaned = "\n".join(line.rstrip() for line in actual.rstrip("\n").split("\n")) + "\n"
    return output_pattern(expected).fullmatch(cleaned) is not None


def test_output_patterns() -> None:
    assert matches("a ... c\n", "a b b c\n")
    assert matches("a\n...\nz\n", "a\nb\nc\nz\n")
    assert matches("a\n...\nz\n", "a\nz\n")
    assert not matches("a b\n", "a c\n")
    assert not matches("a ... c\n", "a b\nc\n")  # within a line only
    assert not matches("a\n", "a\nb\n")


# --- running blocks -----------------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a copy of examples/, the working directory of a page's examples."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    # `openstarry` on PATH as in the shell blocks, for the programs an example starts
    # itself (an agent.json's MCP server command, with only PATH of the environment).
    bin_folder = tmp_path.parent / f"{tmp_path.name}-bin"
    bin_folder.mkdir()
    command = bin_folder / "openstarry"
    pythonpath = shell_env().get("PYTHONPATH")
    command.write_text(
        "#!/bin/sh\n"
        + (f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else "")
        + f'exec {shlex.quote(sys.executable)} -m openstarry.cli "$@"\n'
    )
    command.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_folder}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("OPENSTARRY_DOCS_ON_PATH", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_python(block: Block, namespace: dict[str, Any], loop: asyncio.AbstractEventLoop) -> str:
    """Run a Python block in ``namespace``; its standard output."""
    code = compile(
        block.source, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            loop.run_until_complete(result)
    return out.getvalue()


def shell_env() -> dict[str, str]:
    """The environment of the examples' commands: this interpreter's openstarry, no colour."""
    env = dict(os.environ)
    env.pop("TERM", None)
    env["NO_COLOR"] = "1"
    env["OPENSTARRY_DOCS_PYTHON"] = sys.executable
    # openstarry as the tests import it: the installed wheel, or python/ on PYTHONPATH
    # (made absolute, as the commands run in another folder).
    package_root = str(Path(openstarry.__file__).resolve().parent.parent)
    if package_root not in site.getsitepackages():
        env["PYTHONPATH"] = os.pathsep.join(
            part for part in (package_root, env.get("PYTHONPATH", "")) if part
        )
    return env


# Where the page's folder has put an `openstarry` program on PATH (the workdir fixture), the
# commands run that, as a reader's would: `openstarry worker ... &` then `kill %1` stops it.
PRELUDE = (
    'if [ -z "${OPENSTARRY_DOCS_ON_PATH:-}" ]; then\n'
    '  openstarry() { "$OPENSTARRY_DOCS_PYTHON" -m openstarry.cli "$@"; }\n'
    "fi\n"
)


#: The process groups of the current page's shell commands, stopped when the page ends
#: (a command may leave a program running in the background: ``openstarry worker ... &``).
LEFT_RUNNING: list[int] = []


def stop_left_running() -> None:
    """SIGTERM what the page's shell commands left running, then SIGKILL what stays."""
    groups, LEFT_RUNNING[:] = list(LEFT_RUNNING), []
    alive = []
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
            alive.append(group)
    deadline = time.monotonic() + 10
    for group in alive:
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)


def run_shell(script: str, where: str, cwd: Path) -> str:
    """Run ``script`` in bash; its standard output. A command still running at the time
    limit is killed with everything it started (its own process group).

    The outputs go to files, not pipes, so that the script ends when bash does: a
    program it left running in the background (``cmd &``) keeps them open.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", PRELUDE + script],
            cwd=cwd,
            env=shell_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        LEFT_RUNNING.append(process.pid)
        try:
            process.wait(timeout=SHELL_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"{where}: still running after {SHELL_TIMEOUT} s")
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode()
        stderr = err.read().decode()
    assert process.returncode == 0, f"{where}: exit status {process.returncode}\n{stdout}\n{stderr}"
    return stdout


def console_commands(source: str) -> Iterator[tuple[str, str]]:
    """(command, expected output) of each ``$`` line of a console block."""
    command: list[str] | None = None
    output: list[str] = []
    continued = False
    for line in source.rstrip("\n").split("\n"):
        if continued and command is not None:
            command.append(line)
            continued = line.endswith("\\")
        elif line.startswith("$ "):
            if command is not None:
                yield "\n".join(command), "\n".join(output)
            command, output = [line[2:]], []
            continued = line.endswith("\\")
        else:
            output.append(line)
    if command is not None:
        yield "\n".join(command), "\n".join(output)


def run_shell_block(block: Block, cwd: Path) -> str:
    if block.lang != "console":
        return run_shell(block.source, block.where, cwd)
    everything = []
    for command, expected in console_commands(block.source):
        actual = run_shell(command, block.where, cwd)
        if expected.strip():
            assert matches(expected + "\n", actual), (
                f"{block.where}: `{command}` printed\n{actual}\nexpected\n{expected}"
            )
        everything.append(actual)
    return "".join(everything)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(manifest: str, cwd: Path) -> Iterator[str]:
    """``openstarry serve MANIFEST`` on a free port, until the block ends; its address."""
    port = free_port()
    command = [sys.executable, "-m", "openstarry.cli", "serve", manifest, "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=cwd, env=shell_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()[1].decode()
            try:
                with urllib.request.urlopen(f"http://{address}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"openstarry serve {manifest}: no answer"
                time.sleep(0.1)
        yield address
    finally:
        process.terminate()
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def model_reply(request: Any) -> Any:
    """The answer of the ``<!-- model-server -->`` model to one Chat Completions request.

    Asked about the weather in a city (``weather in Taipei``) with a ``get_weather``
    tool, it calls the tool; given a tool's result, it says it (its ``summary``, for
    the weather); anything else it answers in one line. Streamed when asked to be.
    """
    from fake_llm_server import Reply, chunk, sse

    body = request.json
    messages = body.get("messages") or [{}]
    last = messages[-1]
    # A weather tool of the agent's own, or another agent's (weather.get_weather is
    # weather_get_weather on the wire).
    weather = [
        name
        for name in sorted(tool["function"]["name"] for tool in body.get("tools") or ())
        if name.endswith("get_weather")
    ]
    said = last.get("content") if isinstance(last.get("content"), str) else ""
    asked = re.search(r"weather in ([A-Z][a-z]+)", said or "")
    call = None
    if last.get("role") == "tool":
        try:
            result = json.loads(last.get("content") or "null")
        except ValueError:
            result = last.get("content")
        if isinstance(result, dict) and {"location", "summary"} <= result.keys():
            text = f"It is {result['summary']} in {result['location']} right now."
        else:
            text = f"The tool answered: {json.dumps(result)}"
    elif asked and weather:
        text = None
        arguments = json.dumps({"location": asked[1]})
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": weather[0], "arguments": arguments},
        }
    else:
        text = "Hello! Ask me about the weather in a city."
    usage = {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28}
    finish = "tool_calls" if call else "stop"
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if call:
            message["tool_calls"] = [call]
        return Reply(
            json={
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body.get("model"),
                "usage": usage,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
        )
    events = [sse(chunk({"role": "assistant", "content": ""}))]
    if call:
        events.append(sse(chunk({"tool_calls": [{"index": 0, **call}]})))
    else:
        events += [sse(chunk({"content": piece})) for piece in re.findall(r"\S+\s*", text or "")]
    events.append(sse(chunk({}, finish)))
    events.append(sse({"id": "c", "choices": [], "usage": usage}))
    events.append(sse("[DONE]"))
    return Reply(events=events)


@contextlib.contextmanager
def model_server() -> Iterator[str]:
    """The ``<!-- model-server -->`` server, until the block ends; its address."""
    from fake_llm_server import FakeLLMServer

    with FakeLLMServer() as server:
        server.handler = model_reply
        yield server.url.removeprefix("http://")


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """The ``<!-- redis-server -->`` server, until the block ends; its ``host:port``."""
    from openstarry.redis_server import RedisServer

    folder.mkdir(parents=True, exist_ok=True)
    server = RedisServer(folder, aof=False)
    server.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop()


def runnable_pages() -> list[Path]:
    """The pages with a block to run (the reference, speed and design pages have none)."""
    return [page for page in pages() if any(block.runs for block in blocks_of(page))]


def test_the_readme_and_the_guides_have_examples_to_run() -> None:
    """A page whose examples all lost their fences would leave the run silently."""
    runnable = set(runnable_pages())
    assert README in runnable
    assert len(runnable) >= 10


@pytest.mark.parametrize("page", runnable_pages(), ids=page_id)
def test_the_examples_of_a_page_run(page: Path, workdir: Path) -> None:
    blocks = blocks_of(page)
    text = page.read_text(encoding="utf-8")
    needs = {block.needs for block in blocks if block.needs}
    if REDIS_SERVER.search(text):
        needs.add("redis-server")
    for program in sorted(needs):
        # As the Redis tests do: a missing redis-server skips, except on CI, where it fails.
        if shutil.which(program) is None and not os.environ.get("CI"):
            pytest.skip(f"{page_id(page)} needs {program} (make test installs it)")
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    loop = asyncio.new_event_loop()
    last_output: str | None = None
    serve = SERVE.search(text)
    with contextlib.ExitStack() as stack:
        addresses = {}
        if REDIS_SERVER.search(text):
            addresses[REDIS_AT] = stack.enter_context(redis_server(workdir / ".redis"))
        if MODEL_SERVER.search(text):
            addresses[MODEL_AT] = stack.enter_context(model_server())
        # Before the servers stop: what the page left running may still use them.
        stack.callback(stop_left_running)
        if serve is not None:
            addresses[SERVED_AT] = stack.enter_context(served(serve["manifest"], workdir))
        stack.callback(loop.close)
        for block in blocks:
            for shown, actual in addresses.items():
                block.source = block.source.replace(shown, actual)
            if block.expect_output:
                assert last_output is not None, (
                    f"{block.where}: an expected output follows no runnable block"
                )
                assert matches(block.source, last_output), (
                    f"{block.where}: the block before printed\n{last_output}\nexpected\n"
                    f"{block.source}"
                )
                last_output = None
                continue
            if block.file is not None:
                path = workdir / block.file
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.source, encoding="utf-8")
                last_output = None
                continue
            if not block.runs:
                last_output = None
                continue
            if block.is_python:
                last_output = run_python(block, namespace, loop)
            else:
                last_output = run_shell_block(block, workdir)


def test_every_block_runs_or_says_why() -> None:
    """No Python block, and no shell block that calls openstarry, is left silently unrun."""
    unmarked = []
    for page in pages():
        for block in blocks_of(page):
            if block.not_run is not None and not block.not_run.strip():
                unmarked.append(f"{block.where}: not-run without a reason")
            if block.not_run is not None and not (block.is_python or block.lang in SHELL_LANGS):
                unmarked.append(f"{block.where}: not-run on a {block.lang or 'plain'} block")
    assert not unmarked, "\n".join(unmarked)


def test_the_docs_have_examples_that_run() -> None:
    """The collector finds the blocks (a parser that found none would pass everything)."""
    all_blocks = [block for page in pages() for block in blocks_of(page)]
    running = [block for block in all_blocks if block.runs]
    assert len([block for block in running if block.is_python]) >= 20
    assert len([block for block in running if block.calls_openstarry]) >= 5
    assert any(block.expect_output for block in all_blocks)


# --- the README ---------------------------------------------------------------------------------


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").split("\n")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readmes_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    for target in targets:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = ROOT / target.partition("#")[0]
        assert path.exists(), f"README.md links to {target}, which does not exist"


# --- the generated references -------------------------------------------------------------------


def hooks() -> ModuleType:
    return load_docs_module("hooks")


def test_the_agent_json_reference_has_every_key() -> None:
    from openstarry.manifest import AgentManifest

    page = hooks().agent_json_reference()
    schema = AgentManifest.json_schema()
    for key in schema["properties"]:
        assert f"| `{key}` |" in page
    for definition in schema["$defs"].values():
        for key in definition.get("properties", {}):
            assert f"| `{key}` |" in page, key
    assert "| `maxToolRounds` | integer ≥ 1 | `10` |" in page


def test_the_events_reference_has_every_type() -> None:
    from openstarry.events import OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA, EventType

    page = hooks().events_reference()
    for event_type in [*EventType, OUTPUT_AGENT_MESSAGE, OUTPUT_AGENT_MESSAGE_DELTA]:
        assert f"### `{event_type}`" in page
    for field in ("id", "timestamp", "traceId", "source", "sessionId", "priority", "type"):
        assert f"| `{field}` |" in page


def test_the_cli_reference_has_every_command_and_option() -> None:
    import argparse

    from openstarry.cli import build_parser

    page = hooks().cli_reference()

    def walk(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, sub_parser in action.choices.items():
                    yield from walk(sub_parser, f"{name} {sub}")
            else:
                for option in action.option_strings:
                    if option not in ("-h", "--help"):
                        yield name, option

    found = list(walk(build_parser(), "openstarry"))
    assert ("openstarry tail", "--type") in found
    for command, option in found:
        assert f"`{command}`" in page, command
        assert option in page, (command, option)


def test_the_layers_table_is_the_contract() -> None:
    table = hooks().layers_reference()
    assert "| 1 | `openstarry.cli`" in table
    assert "`openstarry.errors`" in table.splitlines()[-1]


def griffe_rest() -> ModuleType:
    return load_docs_module("griffe_rest")


def test_docstrings_roles_become_markdown() -> None:
    markdown_of = griffe_rest().markdown_of
    assert markdown_of("See :class:`~openstarry.bus.EventBus`.") == "See `EventBus`."
    assert markdown_of(":meth:`EventQueue.pop` and :mod:`openstarry.core`") == (
        "`EventQueue.pop` and `openstarry.core`"
    )
    assert markdown_of(":attr:`the queue <openstarry.core.AsyncEventQueue.queue>`") == (
        "`the queue`"
    )
    assert markdown_of("For example::\n\n    code\n") == "For example:\n\n    code\n"


def test_doc_comments_document_the_attributes_below_them() -> None:
    doc_comment = griffe_rest().doc_comment
    lines = ["", "#: Highest and lowest.", "HIGH: int", "LOW: int", "", "OTHER: int"]
    assert doc_comment(lines, 3) == "Highest and lowest."
    assert doc_comment(lines, 4) == "Highest and lowest."
    assert doc_comment(lines, 6) is None


def test_expected_outputs_are_titled() -> None:
    page = "text\n\n<!-- expect-output -->\n```text\n5\n```\n"
    assert hooks().title_outputs(page) == 'text\n\n```text title="Output"\n5\n```\n'


def test_an_unknown_marker_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated part"):
        hooks().expand("<!-- generated: nothing-of-the-kind -->", "page.md")


def test_the_schema_commands_print_what_the_references_read() -> None:
    """The references are `openstarry schema manifest|protocol`, as the pages say."""
    from openstarry.manifest import AgentManifest
    from openstarry.protocol import json_schema

    for what, schema in (("manifest", AgentManifest.json_schema()), ("protocol", json_schema())):
        printed = run_shell(f"openstarry schema {what}", "test", ROOT)
        assert json.loads(printed) == schema
