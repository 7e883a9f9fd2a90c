"""``openstarry schema manifest|protocol``: the JSON Schema of ``agent.json`` or of the events."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_schema_command"]


def add_schema_command(commands: Any) -> None:
    """Add ``schema`` to the ``openstarry`` parser."""
    schema = commands.add_parser("schema", help="print a JSON Schema")
    schema.add_argument(
        "what",
        choices=["manifest", "protocol"],
        help="manifest: the schema of agent.json; protocol: the schema of the events "
        "(the envelope and each event type's payload)",
    )
    schema.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace) -> int:
    if args.what == "manifest":
        from openstarry.manifest import AgentManifest

        schema: Any = AgentManifest.json_schema()
    else:
        from openstarry.protocol import json_schema

        schema = json_schema()
    print(json.dumps(schema, indent=2, ensure_ascii=False))
    return 0
