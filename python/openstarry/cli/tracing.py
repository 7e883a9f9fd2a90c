"""``--otel``: OpenTelemetry for the commands that run an agent (``serve``, ``mcp``, ``worker``).

:func:`start_tracing` sets up the provider before the command starts, as the
standard ``OTEL_*`` environment variables say (see :mod:`openstarry.otel`);
:func:`trace_agent` hands it the command's agent.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["otel_argument", "start_tracing", "trace_agent"]


def otel_argument(command: argparse.ArgumentParser) -> None:
    """``--otel``: set up by :func:`start_tracing`, taken by :func:`trace_agent`."""
    command.add_argument(
        "--otel",
        action="store_true",
        help="trace the agent's runs with OpenTelemetry, as the OTEL_* environment variables "
        "say (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...; "
        "needs openstarry[otel])",
    )


def trace_agent(args: argparse.Namespace, agent: Any) -> None:
    """With ``--otel``, trace ``agent``'s runs to the provider :func:`start_tracing` set up."""
    provider = getattr(args, "tracer_provider", None)
    if provider is not None:
        from openstarry.otel import instrument

        instrument(agent, provider)


def start_tracing(args: argparse.Namespace) -> str | None:
    """``--otel``: OpenTelemetry's global provider from ``OTEL_*``; why not, in one line."""
    try:
        from openstarry.otel import configure_from_env
    except ImportError as exc:
        return str(exc)
    service = "openstarry"
    try:
        from openstarry.manifest import load_manifest

        service = load_manifest(args.manifest).identity.name or service
    except Exception:  # the command reports a bad manifest itself
        pass
    # Over stdio, stdout is the MCP channel: the console exporter writes to stderr.
    stdio = args.command == "mcp" and not args.http
    try:
        args.tracer_provider = configure_from_env(
            service_name=service, console=sys.stderr if stdio else None
        )
    except ValueError as exc:
        return str(exc)
    return None
