"""The composition root: an ``agent.json`` turned into a running :class:`~openstarry.agent.Agent`.

    from openstarry.assembly import agent_from_manifest

    async with agent_from_manifest("examples/weather-agent/agent.json") as agent:
        result = await agent.ask("Query weather in Taipei")

This is the one module that knows the manifest's whole shape: it resolves the
provider by name (:mod:`openstarry.providers`), the tools (:mod:`openstarry.tools`),
the tool retriever, and the remote MCP servers of ``mcp.servers`` as an
:class:`~openstarry.mcp.client.McpToolset` (which needs the ``[mcp]`` extra),
and hands them, built, to :class:`~openstarry.agent.Agent`, which imports none
of them. The ``openstarry`` command assembles its agent here, then gives it to
``serve`` (HTTP) or ``mcp``.

A server of ``mcp.servers`` is connected when the agent starts: one that
cannot be reached fails the start with :class:`~openstarry.errors.McpConnectError`,
unless its entry names its ``tools``, which are then connected on first use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from openstarry.agent.interfaces import Toolset
from openstarry.agent.loop import LoopLimits
from openstarry.agent.retrieval import ToolRetriever
from openstarry.agent.runtime import Agent
from openstarry.bus import EventBus
from openstarry.errors import ManifestError
from openstarry.manifest import AgentManifest, McpServerConfig, load_manifest
from openstarry.providers import create_provider
from openstarry.stores import open_store
from openstarry.tools import import_reference, resolve_tools, tool_name

__all__ = ["agent_from_manifest", "mcp_toolset"]


def agent_from_manifest(
    manifest: str | os.PathLike[str] | AgentManifest, *, bus: EventBus | None = None
) -> Agent:
    """Build the agent an ``agent.json`` describes (a path, or a loaded manifest).

    The manifest's ``bus`` picks the bus (``EventBus.from_url``) and its
    ``sessions.store`` the session store (:func:`openstarry.stores.open_store`);
    on a Redis bus with no store named, sessions live in the bus's Redis, so
    every worker sees every conversation whole.

    Args:
        manifest: The manifest's path, or the manifest loaded.
        bus: A bus for the agent to run on; by default it makes its own (the
            manifest's ``bus``).

    Raises:
        openstarry.errors.ManifestError: a bad file, field, tool or provider,
            naming the file and the field; ``mcp.servers`` without the
            ``[mcp]`` extra.
    """
    where: str | None = None
    if not isinstance(manifest, AgentManifest):
        where = os.fspath(manifest)
        manifest = load_manifest(manifest)
    try:
        tools = resolve_tools(manifest.tools, allowed_paths=manifest.allowed_paths())
        try:
            provider = create_provider(manifest.provider)
        except ImportError as exc:  # an HTTP provider without openstarry[http]
            raise ManifestError(str(exc), field="provider.name") from exc
        retriever = _retriever_of(manifest.tool_retrieval.retriever)
        toolsets = _toolsets_of(manifest)
        made_bus = bus is None and manifest.bus.url is not None
        if made_bus:
            bus = _bus_of(manifest)
        store_spec = manifest.sessions.store
        backend = None if bus is None else bus.backend
        bus_url = getattr(backend, "url", None)
        if store_spec is None:
            store_spec = bus_url
        try:
            # On the bus's own Redis, under the bus's name: saved with its commits, fenced.
            store = open_store(
                store_spec, name=getattr(backend, "name", None) if store_spec == bus_url else None
            )
        except (ValueError, ImportError) as exc:
            raise ManifestError(str(exc), field="sessions.store") from exc
    except Exception as exc:
        _name_file(exc, where)
        raise
    limits = manifest.limits
    return Agent(
        provider,
        tools,
        name=manifest.identity.name,
        limits=LoopLimits(
            max_tool_rounds=limits.max_tool_rounds,
            tool_timeout=limits.tool_timeout,
            provider_timeout=limits.provider_timeout,
            max_concurrent_tools=limits.max_concurrent_tools,
            max_failure_streak=limits.max_failure_streak,
            repeated_failure_warning=limits.repeated_failure_warning,
            approval_timeout=manifest.approval.timeout,
        ),
        memory_window=manifest.memory.window,
        instructions=manifest.instructions,
        bus=bus,
        manifest=manifest,
        max_tools=manifest.tool_retrieval.top_n,
        retriever=retriever,
        toolsets=toolsets,
        # Entries, as the manifest names tools: an imported tool by its reference.
        approval_tools=[tool_name(entry) for entry in manifest.approval.tools],
        store=store,
        # The bus the manifest names runs with the agent; a bus given is the caller's.
        run_bus=True if made_bus else None,
    )


def _bus_of(manifest: AgentManifest) -> EventBus:
    """The bus the manifest's ``bus`` names."""
    config = manifest.bus
    try:
        options: dict[str, Any] = {}
        if config.min_replicas is not None:
            options["min_replicas"] = config.min_replicas
        return EventBus.from_url(
            config.url, group=config.group, consumer=config.consumer, **options
        )
    except (ValueError, ImportError) as exc:
        raise ManifestError(str(exc), field="bus.url") from exc


def _toolsets_of(manifest: AgentManifest) -> list[Toolset]:
    """The manifest's toolsets: its remote MCP servers as one, its A2A agents as another."""
    toolsets: list[Toolset] = []
    servers = manifest.mcp.servers
    timeout = manifest.limits.tool_timeout
    if servers:
        toolsets.append(mcp_toolset(servers, tool_timeout=timeout, base_dir=manifest.base_dir))
    if manifest.a2a.agents:
        try:
            from openstarry.a2a import A2AToolset
        except ImportError as exc:
            raise ManifestError(
                f"a2a.agents: remote A2A agents need the A2A SDK: {exc}", field="a2a.agents"
            ) from exc
        toolsets.append(A2AToolset(manifest.a2a.agents, timeout=timeout))
    return toolsets


def mcp_toolset(
    servers: Sequence[McpServerConfig],
    *,
    tool_timeout: float = 30.0,
    base_dir: str | os.PathLike[str] | None = None,
) -> Toolset:
    """Remote MCP servers (the manifest's ``mcp.servers``) as a toolset for an :class:`Agent`.

    Connecting to a server and each call get ``tool_timeout`` seconds (the
    manifest's ``limits.toolTimeout``), so a remote call may take as long as a
    local tool. A stdio server's relative ``cwd`` is relative to ``base_dir``
    (the manifest's folder), and one that gives none runs there.

    Raises:
        openstarry.errors.ManifestError: the ``[mcp]`` extra is not installed
            (field ``mcp.servers``), or two servers share a name.
    """
    try:
        from openstarry.mcp.client import McpToolset
    except ImportError as exc:
        raise ManifestError(
            f"mcp.servers: remote MCP servers need the MCP SDK: {exc}", field="mcp.servers"
        ) from exc
    try:
        return McpToolset(
            servers,
            default_timeout=tool_timeout,
            call_timeout=tool_timeout,
            base_dir=None if base_dir is None else os.fspath(base_dir),
        )
    except ValueError as exc:  # two servers share a name
        raise ManifestError(f"mcp.servers: {exc}", field="mcp.servers") from exc


def _name_file(exc: Exception, where: str | None) -> None:
    """Put the manifest's file into a ManifestError raised while resolving its parts."""
    if isinstance(exc, ManifestError) and where and exc.path is None:
        exc.path = where
        field = f"{exc.field}: " if exc.field and exc.field not in str(exc) else ""
        exc.args = (f"{where}: {field}{exc}",)


def _retriever_of(spec: str) -> ToolRetriever | None:
    """The retriever ``toolRetrieval.retriever`` names: ``"lexical"`` (the default) or an import
    reference to a ToolRetriever class, factory or instance."""
    if spec == "lexical":
        return None
    if ":" not in spec:
        raise ManifestError(
            f"unknown retriever {spec!r}: 'lexical' or an import reference "
            "'package.module:attribute'",
            field="toolRetrieval.retriever",
        )
    target: Any = import_reference(spec, "toolRetrieval.retriever", "retriever")
    retriever = target
    if isinstance(target, type) or (callable(target) and not hasattr(target, "select")):
        try:
            retriever = target()
        except Exception as exc:
            raise ManifestError(
                f"retriever {spec!r}: cannot make one: {type(exc).__name__}: {exc}",
                field="toolRetrieval.retriever",
            ) from exc
    if not isinstance(retriever, ToolRetriever):
        raise ManifestError(
            f"{spec!r} is not a ToolRetriever (it needs a select(query, tools, limit) method)",
            field="toolRetrieval.retriever",
        )
    return retriever
