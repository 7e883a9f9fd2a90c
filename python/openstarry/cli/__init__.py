"""The ``openstarry`` command.

    openstarry run MANIFEST --input "Query weather in Taipei"  # a turn per --input, then exit
    openstarry run MANIFEST --input "..." --events     # every event, a JSON envelope a line
    openstarry run MANIFEST                            # an interactive prompt ([cli] extra:
                                                       # history, completion, rich output)
    openstarry schema manifest|protocol                # JSON Schema of agent.json or events
    openstarry serve MANIFEST [--host H] [--port N] [--api-key-env NAME] [--otel]
                                                       # the Agent API (spec 003)
    openstarry mcp MANIFEST [--http --port N] [--api-key-env NAME] [--otel]
                                                       # the tools over MCP (spec 004)
    openstarry worker MANIFEST --bus URL [--group G] [--consumer C] [--otel]
                                                       # a consumer of a shared bus
    openstarry publish --bus URL [FILE]                # NDJSON envelopes onto a shared bus
    openstarry tail --bus URL [--type P] [--count N] [--timeout S]   # its history, then new events
                    [--since WHEN | --from-end]        # start at a time or an event; or new only
    openstarry bench latency [--rates R1,R2,...] [--duration S] [--handler MODULE:FUNCTION]
                     [--json FILE] [--plot FILE.png] [--against pure-python|bubus]
                                                       # dispatch latency, open loop, to p99.99
    openstarry bench [bus|loop] [--quick]              # bus throughput, loop overhead
    openstarry demo NDJSON                             # the Rust ingestion demo

``--otel`` traces the agent's runs with OpenTelemetry as the standard ``OTEL_*``
environment variables say (exporter, endpoint, service name; see
:mod:`openstarry.otel`), with the ``[otel]`` extra; an exporter that is not
installed is said in one line, and the command exits 2.

Exit status: 0 on success, 1 when a turn ended with a ``KERNEL:ERROR`` or a
network error stopped the command (one line on standard error: Redis down, a
refused connection, a timeout), 2 for a bad command line or manifest.

The package, a module per part:

- :mod:`~openstarry.cli.entry`: :func:`main`, and how a command ends (its exit
  status and its one line on standard error);
- :mod:`~openstarry.cli.parser`: :func:`build_parser`, made of the command
  groups' parsers;
- the command groups: :mod:`~openstarry.cli.run` (``run``),
  :mod:`~openstarry.cli.schema`, :mod:`~openstarry.cli.serve` (``serve``,
  ``mcp``), :mod:`~openstarry.cli.cluster` (``worker``, ``publish``,
  ``tail``), :mod:`~openstarry.cli.businfo` (``bus info``),
  :mod:`~openstarry.cli.bench`, :mod:`~openstarry.cli.demo`,
  :mod:`~openstarry.cli.scaffold` (``init``);
- the prompts of ``run``: :mod:`~openstarry.cli.terminal` (the ``[cli]``
  extra) and :mod:`~openstarry.cli.prompt` (the standard library's);
- what the commands share: :mod:`~openstarry.cli.busargs` (the bus options),
  :mod:`~openstarry.cli.netcheck` (the network pre-checks),
  :mod:`~openstarry.cli.stdio` (the standard streams),
  :mod:`~openstarry.cli.tracing` (``--otel``).
"""

from __future__ import annotations

from openstarry.cli.entry import main
from openstarry.cli.parser import build_parser

__all__ = ["build_parser", "main"]
