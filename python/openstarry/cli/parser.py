"""The ``openstarry`` command line: its parser, made of each command group's parsers.

Each group adds its own commands (and their handler, ``args.handler``) to the
parser: :mod:`~openstarry.cli.run`, :mod:`~openstarry.cli.schema`,
:mod:`~openstarry.cli.bench`, :mod:`~openstarry.cli.serve` (``serve`` and
``mcp``), :mod:`~openstarry.cli.demo`, :mod:`~openstarry.cli.cluster`
(``worker``, ``publish``, ``tail`` and ``bus info``) and
:mod:`~openstarry.cli.scaffold` (``init``).
"""

from __future__ import annotations

import argparse

from openstarry.cli.bench import add_bench_command
from openstarry.cli.cluster import add_commands as add_cluster_commands
from openstarry.cli.run import add_run_command
from openstarry.cli.scaffold import add_init_command
from openstarry.cli.schema import add_schema_command
from openstarry.cli.serve import add_serve_commands

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``openstarry``: every command, its options and its handler."""
    # Imported here, not above: `python -m openstarry.cli.demo` imports this package first,
    # and runpy warns when the module it is about to run was already imported.
    from openstarry.cli.demo import add_demo_command
    from openstarry.core import __version__

    parser = argparse.ArgumentParser(
        prog="openstarry", description="An agent core whose hot path is Rust."
    )
    parser.add_argument("--version", action="version", version=f"openstarry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_run_command(commands)
    add_schema_command(commands)
    add_bench_command(commands)
    add_serve_commands(commands)
    add_demo_command(commands)
    add_cluster_commands(commands)
    add_init_command(commands)
    return parser
