"""``openstarry serve`` and ``openstarry mcp``: an agent behind a server.

    openstarry serve MANIFEST [--host H] [--port N] [--api-key-env NAME] [--otel]
                                                       # the Agent API (spec 003)
    openstarry mcp MANIFEST [--http --port N] [--api-key-env NAME] [--otel]
                                                       # the tools over MCP (spec 004)

Both listen on loopback unless told otherwise, and refuse another address
without an API key (``--api-key-env``) or ``--insecure``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from openstarry.cli.stdio import leave_now
from openstarry.cli.tracing import otel_argument, trace_agent
from openstarry.errors import ManifestError

__all__ = ["add_serve_commands"]


def add_serve_commands(commands: Any) -> None:
    """Add ``serve`` and ``mcp`` to the ``openstarry`` parser."""
    serve = commands.add_parser(
        "serve", help="serve the agent over HTTP: the Agent API (needs openstarry[http])"
    )
    serve.add_argument("manifest", help="path of the agent.json manifest")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port to listen on (8000)")
    _auth_arguments(serve, console=True)
    serve.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=10.0,
        help="seconds the runs in progress get to finish on SIGTERM/SIGINT (10)",
    )
    serve.add_argument(
        "--header-timeout",
        type=_seconds,
        default=10.0,
        help="seconds a client may take to send a request's head (10)",
    )
    serve.add_argument(
        "--body-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a client may take to send a request's body (30)",
    )
    serve.add_argument(
        "--max-connections", type=int, default=4096, help="connections at once (4096)"
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=int,
        default=256,
        help="connections at once from one client address (256); raise it behind a proxy",
    )
    otel_argument(serve)
    serve.set_defaults(handler=_serve)

    mcp = commands.add_parser(
        "mcp", help="serve the agent's exposed tools over MCP (needs openstarry[mcp])"
    )
    mcp.add_argument("manifest", help="path of the agent.json manifest")
    mcp.add_argument(
        "--http", action="store_true", help="Streamable HTTP instead of stdio (the default)"
    )
    mcp.add_argument("--host", default="127.0.0.1", help="address for --http (127.0.0.1)")
    mcp.add_argument("--port", type=_port, default=8765, help="port for --http (8765)")
    _auth_arguments(mcp)
    otel_argument(mcp)
    mcp.set_defaults(handler=_mcp)


def _serve(args: argparse.Namespace) -> int:
    try:
        from openstarry.api.server import serve
    except ImportError as exc:
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 2
    from openstarry._http import check_bind, listen, read_api_key
    from openstarry.api.server import ServerLimits
    from openstarry.assembly import agent_from_manifest

    try:
        api_key = read_api_key(args.api_key_env)
        check_bind(args.host, api_key, insecure=args.insecure)
        limits = ServerLimits(
            shutdown_grace=args.shutdown_grace,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address,
        )
    except ValueError as exc:
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 2
    try:
        sock = listen(args.host, args.port)
    except (OSError, OverflowError) as exc:
        print(f"openstarry serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    try:
        agent = agent_from_manifest(args.manifest)
        trace_agent(args, agent)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"openstarry serve: {agent.name} on http://{shown}:{port}/", file=sys.stderr)
        return serve(
            agent,
            host=args.host,
            port=args.port,
            limits=limits,
            sock=sock,
            api_key=api_key,
            insecure=args.insecure,
        )
    except ImportError as exc:  # uvicorn missing beside Starlette
        print(f"openstarry serve: {exc}", file=sys.stderr)
        return 2
    finally:
        sock.close()


def _mcp(args: argparse.Namespace) -> int:
    try:
        from openstarry.mcp.server import serve
    except ImportError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        # Logs go to stderr: over stdio, stdout is the MCP wire.
        logging.basicConfig(
            stream=sys.stderr, level=logging.WARNING, format="openstarry mcp: %(message)s"
        )
    from openstarry._http import check_bind, read_api_key
    from openstarry.assembly import agent_from_manifest

    try:
        api_key = read_api_key(args.api_key_env)
        if args.http:
            check_bind(args.host, api_key, insecure=args.insecure)
    except ValueError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    try:
        agent = agent_from_manifest(args.manifest)
    except ManifestError as exc:
        print(f"openstarry mcp: {exc}", file=sys.stderr)
        return 2
    trace_agent(args, agent)
    if not args.http:
        # The MCP SDK reads stdin in a thread that no cancellation reaches: Ctrl-C
        # would wait for the client's next line. It ends the server at once instead.
        signal.signal(signal.SIGINT, lambda signum, frame: leave_now(130))
    return serve(agent, http=args.http, host=args.host, port=args.port, api_key=api_key)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, not {port}")
    return port


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds are 0 or more, not {text}")
    return value


def _auth_arguments(command: argparse.ArgumentParser, *, console: bool = False) -> None:
    needs = (
        "every request (but GET /health and the console's page) then needs "
        "'Authorization: Bearer <key>'; in a browser, the console asks for the key once "
        "and signs in with a session cookie"
        if console
        else "every request (but GET /health) then needs 'Authorization: Bearer <key>'"
    )
    command.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"the environment variable holding the API key: {needs}",
    )
    command.add_argument(
        "--insecure",
        action="store_true",
        help="serve on an address other than loopback without an API key",
    )
