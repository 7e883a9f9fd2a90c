"""``openstarry init DIR``: a first agent to run, from the package alone.

    openstarry init my-agent                 # my-agent/agent.json and my-agent/workspace/
    openstarry run my-agent/agent.json --input "Query weather in Taipei"

It writes the example weather agent (on the offline ``default`` provider: no
key, no network) and an input file for ``openstarry publish``, so that what
the docs show runs in a folder of one's own without a clone of the
repository. It never overwrites: a folder that already holds an
``agent.json`` is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["AGENT", "add_init_command", "inputs_ndjson"]

#: The example weather agent's ``agent.json``.
AGENT: dict[str, Any] = {
    "identity": {
        "name": "weather-agent",
        "version": "0.1.0",
        "description": "Answers weather questions with the get_weather tool, and reads "
        "and writes notes in its workspace.",
    },
    "provider": {"name": "default", "model": "offline"},
    "tools": ["get_weather", "fs.read", "fs.write", "fs.list"],
    "fs": {"allowedPaths": ["workspace"]},
    "limits": {
        "maxToolRounds": 10,
        "toolTimeout": 30,
        "providerTimeout": 120,
        "maxConcurrentTools": 4,
    },
    "memory": {"window": 50},
    "mcp": {"expose_tools": ["get_weather", "fs.read"], "private_tools": ["fs.write"]},
}

#: The questions of the input file ``init`` writes, one user turn each.
QUESTIONS = ("Query weather in Taipei", "Query weather in Paris", "Query weather in Lima")


def inputs_ndjson(questions: tuple[str, ...] | list[str], *, session: str = "demo") -> bytes:
    """NDJSON that ``openstarry publish`` reads: one ``INPUT:USER_MESSAGE`` envelope a question."""
    from openstarry.core import Event, encode_event

    lines = [
        encode_event(
            Event.new("INPUT:USER_MESSAGE", {"text": text}, source="cli", session_id=session)
        )
        for text in questions
    ]
    return b"".join(line + b"\n" for line in lines)


def _init(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    manifest = folder / "agent.json"
    if manifest.exists():
        print(f"openstarry init: {manifest} exists: nothing written", file=sys.stderr)
        return 2
    try:
        (folder / "workspace").mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(AGENT, indent=2) + "\n", encoding="utf-8")
        (folder / "inputs.ndjson").write_bytes(inputs_ndjson(QUESTIONS))
    except OSError as exc:
        print(f"openstarry init: cannot write {folder}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {manifest}, {folder / 'workspace'}/ and {folder / 'inputs.ndjson'}")
    print(f'run it: openstarry run {manifest} --input "Query weather in Taipei"')
    return 0


def add_init_command(commands: Any) -> None:
    """Add ``init`` to the ``openstarry`` parser."""
    init = commands.add_parser(
        "init",
        help="write a first agent into a folder: agent.json, its workspace, an input file",
        description="Write the example weather agent (offline: no key, no network) into DIR: "
        "DIR/agent.json, the folder DIR/workspace/ its fs tools may use, and "
        "DIR/inputs.ndjson, three questions for openstarry publish. Nothing is "
        "overwritten: a DIR that holds an agent.json is refused.",
    )
    init.add_argument("dir", metavar="DIR", help="the folder to write (made if missing)")
    init.set_defaults(handler=_init)
