"""A remote server's tool list kept current while the connection lives.

While a connection is up, :func:`serve_until` holds it and lists the server's
tools again whenever the server says they changed: a
``notifications/tools/list_changed`` (the connection's message handler sets
``relist``), or, on the 2026-07-28 protocol, an event on a
``subscriptions/listen`` stream (:func:`_listen_changes`, renewed every
:data:`LISTEN_RENEW` seconds over HTTP). New tools reach the agent through
the connection's ``on_tools_changed``. What it needs of the connection is
:class:`ListedServer`, so this module sits below
:mod:`openstarry.mcp.connection`.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable
from typing import Protocol

import anyio
import anyio.abc

from openstarry.manifest import McpServerConfig
from openstarry.mcp.transport import CLOSE_GRACE, describe

try:
    import mcp_types
    from mcp import Client
    from mcp.types.version import MODERN_PROTOCOL_VERSIONS
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("openstarry.mcp needs the MCP SDK: pip install 'openstarry[mcp]'") from exc


__all__ = ["LISTEN_RENEW", "ListedServer", "serve_until"]

log = logging.getLogger("openstarry.mcp")

#: Seconds an HTTP server's ``subscriptions/listen`` stream is kept before a new
#: one replaces it: how long, at most, it keeps a server that is stopping waiting
#: (see :func:`_listen_changes`).
LISTEN_RENEW = 10.0
#: Seconds before a listen stream that ended by itself is opened again.
_RELISTEN_PAUSE = 1.0


class ListedServer(Protocol):
    """What keeping a tool list current needs of a connection (an ``McpServerConnection``)."""

    #: Set when the server said its tools changed: they are listed again.
    relist: anyio.Event
    #: Called once new tools were taken (the toolset tells the agent).
    on_tools_changed: Callable[[], None] | None

    @property
    def name(self) -> str:
        """The server's name in the manifest."""

    @property
    def config(self) -> McpServerConfig:
        """The server's manifest entry (whether it is reached over HTTP)."""

    @property
    def timeout(self) -> float:
        """Seconds a listing may take."""

    async def list_tools(self, client: Client) -> list[mcp_types.Tool]:
        """The server's tools (as the ``tools`` filter keeps them)."""

    def absorb(self, listing: Iterable[mcp_types.Tool], *, grow: bool = False) -> None:
        """Make or refresh the tools from a listing."""


async def serve_until(
    conn: ListedServer, drop: anyio.Event, client: Client, scope: anyio.CancelScope
) -> None:
    """Hold the connection until ``drop``; list the tools again when the server says so."""
    async with anyio.create_task_group() as listening:
        listening.start_soon(_listen_changes, conn, client)
        await _refresh_until(conn, drop, client)
        # Closing is bounded too (an HTTP server that hangs would hold the
        # session's DELETE, or a listen stream); a stdio server's shutdown
        # is shielded by the SDK and bounded on its own.
        scope.deadline = anyio.current_time() + CLOSE_GRACE
        listening.cancel_scope.cancel()


async def _listen_changes(conn: ListedServer, client: Client) -> None:
    """On the 2026-07-28 protocol a change arrives on a ``subscriptions/listen`` stream.

    Over HTTP the stream is renewed every :data:`LISTEN_RENEW` seconds, the new
    one acknowledged before the old one is closed, so no change falls between
    them. Why: told to stop (SIGTERM), a server on the SDK's Streamable HTTP
    transport and uvicorn waits until every response has ended, and the SDK's
    listen responses do not end by themselves then (its older GET streams do,
    through sse-starlette), so one listen stream held for ever would keep such
    a server from stopping until it is killed (measured with mcp 2.3.0 and
    uvicorn 0.54; closing the stream from this side, on cancel, is clean and
    immediate). A stopping server refuses the new stream's connection: the old
    one is then closed at once, and the server stops. (openstarry's own server
    ends its listen streams itself when it stops.) A stream that ends by
    itself is opened again, and the tools listed again, since changes may have
    come meanwhile.
    """
    tools = client.server_capabilities.tools
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (
        tools is not None and tools.list_changed
    ):
        return  # the handshake era: a notification, to the message handler
    if conn.config.url is not None and _on_trio():
        # The SDK aborts a cancelled request's SSE response without closing
        # httpx2's async generators (no aclosing); trio then warns for each
        # (ResourceWarning: "garbage collected before it had been exhausted"),
        # at every renewal. On trio an HTTP server's new tools are taken on
        # its next connection; over stdio, and on asyncio, they come live.
        return
    renew = LISTEN_RENEW if conn.config.url is not None else math.inf
    current: anyio.CancelScope | None = None
    opened = 0
    missed = False
    async with anyio.create_task_group() as streams:
        while True:
            ended = anyio.Event()
            try:
                scope: anyio.CancelScope = await streams.start(_listen_once, conn, client, ended)
            except Exception as exc:
                if current is not None:
                    current.cancel()
                    current = None
                if opened == 0 or math.isinf(renew):
                    # Refused outright: this server has no live list.
                    log.info("MCP server %r: no live tool list: %s", conn.name, describe(exc))
                    return
                log.info(
                    "MCP server %r: its tool list stream could not be renewed: %s",
                    conn.name,
                    describe(exc),
                )
                missed = True
                await anyio.sleep(renew)
                continue
            opened += 1
            if current is not None:
                current.cancel()
            current = scope
            if missed:
                conn.relist.set()  # no stream was open for a while
                missed = False
            with anyio.move_on_after(renew):
                await ended.wait()
            if ended.is_set():
                missed = True
                current = None
                await anyio.sleep(_RELISTEN_PAUSE)


def _on_trio() -> bool:
    """Whether the caller runs in trio (told by trio itself: no sniffio needed)."""
    trio = sys.modules.get("trio")
    if trio is None:  # never imported: nothing runs on it
        return False
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


async def _listen_once(
    conn: ListedServer,
    client: Client,
    ended: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[anyio.CancelScope],
) -> None:
    """One listen stream: started once acknowledged; ``ended`` set when it ends by itself."""
    with anyio.CancelScope() as scope:
        started = False
        try:
            async with client.listen(tools_list_changed=True) as changes:
                task_status.started(scope)
                started = True
                async for _ in changes:
                    conn.relist.set()
        except Exception as exc:
            if not started:
                raise
            log.info("MCP server %r: its tool list stream ended: %s", conn.name, describe(exc))
        ended.set()


async def _refresh_until(conn: ListedServer, drop: anyio.Event, client: Client) -> None:
    while not drop.is_set():
        refresh = conn.relist
        async with anyio.create_task_group() as waiting:

            async def until(event: anyio.Event) -> None:
                await event.wait()
                waiting.cancel_scope.cancel()

            waiting.start_soon(until, drop)
            waiting.start_soon(until, refresh)
        if refresh.is_set() and not drop.is_set():
            conn.relist = anyio.Event()
            try:
                with anyio.fail_after(conn.timeout):
                    conn.absorb(await conn.list_tools(client), grow=True)
            except Exception as exc:
                log.warning("MCP server %r: listing the tools again failed: %s", conn.name, exc)
                continue
            if conn.on_tools_changed is not None:
                try:
                    conn.on_tools_changed()
                except Exception as exc:  # the agent's trouble must not end the connection
                    log.warning(
                        "MCP server %r: the agent could not take its new tools: %s",
                        conn.name,
                        describe(exc),
                    )
