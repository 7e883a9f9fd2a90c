"""An agent assembled from its parts, or from an ``agent.json``.

    async with Agent.from_manifest("examples/weather-agent/agent.json") as agent:
        result = await agent.ask("Query weather in Taipei")
        print(result.text)

:class:`Agent` owns an :class:`~openstarry.bus.EventBus` and an
:class:`~openstarry.agent.loop.ExecutionLoop`; entering it starts both, leaving
it cancels the runs in progress and drains the bus.

An agent whose manifest lists remote MCP servers (``mcp.servers``) connects to
them when it starts, before its loop runs, and gains their tools as
``<server>.<tool>`` (:mod:`openstarry.mcp.client`, which needs the ``[mcp]``
extra); it disconnects when it stops. A server that cannot be reached at the
start fails it with :class:`~openstarry.mcp.client.McpConnectError`, unless the
server's entry names its ``tools``: those are then connected on first use.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openstarry.agent.interfaces import Provider, Tool
from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
from openstarry.agent.retrieval import ToolRetriever
from openstarry.bus import EventBus

if TYPE_CHECKING:
    from openstarry.manifest import McpServerConfig
    from openstarry.mcp.client import McpToolset

__all__ = ["Agent"]


class Agent:
    """A provider, tools and limits, running on a bus.

    Args:
        provider: The agent's brain.
        tools: Its tools.
        name: Its name (the manifest's ``identity.name``).
        limits: Run limits.
        memory_window: User turns each session remembers.
        instructions: A system prompt for the provider (``context.instructions``).
        bus: A bus to run on; by default the agent makes its own. One agent
            serves a bus's inputs: a second agent on the same bus is refused
            when it starts.
        manifest: The manifest it came from, if any (for transports such as MCP).
        max_tools: Tools that reach the provider per input, at most (spec 000
            section 6B); ``None``: all.
        retriever: What picks those tools (default: the lexical scorer).
        mcp_servers: Remote MCP servers whose tools the agent gains while it
            runs, as ``<server>.<tool>`` (the manifest's ``mcp.servers``).
        mcp_base_dir: What a stdio server's relative ``cwd`` is relative to, and
            the ``cwd`` of one that gives none (the manifest's folder);
            ``None``: the working directory.
    """

    def __init__(
        self,
        provider: Provider,
        tools: Iterable[Tool] | Mapping[str, Tool] = (),
        *,
        name: str = "openstarry",
        limits: LoopLimits | None = None,
        memory_window: int | None = 50,
        instructions: str | None = None,
        bus: EventBus | None = None,
        manifest: Any = None,
        max_tools: int | None = None,
        retriever: ToolRetriever | None = None,
        mcp_servers: Sequence[McpServerConfig] = (),
        mcp_base_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.mcp_servers = list(mcp_servers)
        self.mcp_base_dir = Path(mcp_base_dir) if mcp_base_dir is not None else None
        self._mcp: McpToolset | None = None
        self._local_tools: Mapping[str, Tool] | None = None
        self.manifest = manifest
        self._entered_provider: Any = None
        self._running = False
        self._owns_bus = bus is None
        self.bus = bus if bus is not None else EventBus()
        self.loop = ExecutionLoop(
            self.bus,
            provider,
            tools,
            limits=limits,
            agent_name=name,
            memory_window=memory_window,
            instructions=instructions,
            max_tools=max_tools,
            retriever=retriever,
        )

    @property
    def provider(self) -> Provider:
        return self.loop.provider

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's tools by name; while it runs, its remote MCP servers' too."""
        return self.loop.tools

    @property
    def mcp(self) -> McpToolset | None:
        """The connections to the remote MCP servers while the agent runs, else ``None``."""
        return self._mcp

    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike[str] | Any) -> Agent:
        """Build the agent an ``agent.json`` describes (a path, or a loaded manifest).

        Raises:
            openstarry.errors.ManifestError: a bad file, field, tool or provider,
                naming the file and the field.
        """
        from openstarry.errors import ManifestError
        from openstarry.manifest import AgentManifest, load_manifest
        from openstarry.providers import create_provider
        from openstarry.tools import resolve_tools

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
        except Exception as exc:
            _name_file(exc, where)
            raise
        limits = manifest.limits
        return cls(
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
            ),
            memory_window=manifest.memory.window,
            instructions=manifest.instructions,
            manifest=manifest,
            max_tools=manifest.tool_retrieval.top_n,
            retriever=retriever,
            mcp_servers=manifest.mcp.servers,
            mcp_base_dir=manifest.base_dir,
        )

    async def __aenter__(self) -> Agent:
        if self._running:
            # Refused before anything is touched: the clean-up of a failed
            # start would close the running agent's connections and provider.
            raise RuntimeError(f"the agent {self.name!r} is already running")
        if self._owns_bus:
            await self.bus.__aenter__()
        try:
            await self._enter_provider()
            if self.mcp_servers:
                await self._connect_mcp()
            await self.loop.__aenter__()
        except BaseException:
            try:
                await self._disconnect_mcp(failed=True)
            finally:
                try:
                    await self._exit_provider(None, None, None)
                finally:
                    if self._owns_bus:
                        await self.bus.__aexit__(None, None, None)
            raise
        self._running = True
        return self

    async def _enter_provider(self) -> None:
        """Enter the provider when it is an async context manager (an HTTP provider
        then keeps one pool of connections for the agent's life)."""
        provider = self.provider
        if hasattr(provider, "__aenter__") and hasattr(provider, "__aexit__"):
            await provider.__aenter__()
            self._entered_provider = provider

    async def _exit_provider(self, *exc_info: Any) -> None:
        provider, self._entered_provider = self._entered_provider, None
        if provider is not None:
            await provider.__aexit__(*exc_info)

    async def __aexit__(self, *exc_info: Any) -> None:
        self._running = False
        try:
            await self.loop.__aexit__(*exc_info)
        finally:
            try:
                await self._disconnect_mcp(failed=exc_info[0] is not None)
            finally:
                try:
                    await self._exit_provider(*exc_info)
                finally:
                    if self._owns_bus:
                        await self.bus.__aexit__(*exc_info)

    async def _connect_mcp(self) -> None:
        """Connect the remote MCP servers and add their tools, before the loop starts.

        Raises:
            openstarry.mcp.client.McpConnectError: a server the agent needs
                cannot be used.
            openstarry.errors.ManifestError: a remote tool's name is already a
                local tool's, or the ``[mcp]`` extra is not installed (field
                ``mcp.servers``; a ``ValueError``).
        """
        from openstarry.errors import ManifestError

        try:
            from openstarry.mcp.client import McpToolset
        except ImportError as exc:
            raise ManifestError(
                f"mcp.servers: remote MCP servers need the MCP SDK: {exc}", field="mcp.servers"
            ) from exc

        toolset = McpToolset(
            self.mcp_servers,
            default_timeout=self.loop.limits.tool_timeout,
            call_timeout=self.loop.limits.tool_timeout,
            base_dir=self.mcp_base_dir,
        )
        await toolset.__aenter__()
        self._mcp = toolset
        local = self.loop.tools
        remote = toolset.tools
        clash = sorted(set(local) & set(remote))
        if clash:
            raise ManifestError(
                f"mcp.servers: remote MCP tool(s) {clash} have the name of a local tool; "
                "rename the local tool or the server",
                field="mcp.servers",
            )
        self._local_tools = local
        self.loop.tools = {**local, **remote}

    async def _disconnect_mcp(self, *, failed: bool) -> None:
        """Drop the remote tools and close the connections (no-op when none are open)."""
        if self._local_tools is not None:
            self.loop.tools = self._local_tools
            self._local_tools = None
        toolset, self._mcp = self._mcp, None
        if toolset is not None:
            await toolset.aclose(cancel=failed)

    async def ask(self, text: str, *, session_id: str = "default") -> RunResult:
        """Send one user turn and wait for the run it starts to end."""
        return await self.loop.ask(text, session_id=session_id)


def _name_file(exc: Exception, where: str | None) -> None:
    """Put the manifest's file into a ManifestError raised while resolving its parts."""
    from openstarry.errors import ManifestError

    if isinstance(exc, ManifestError) and where and exc.path is None:
        exc.path = where
        field = f"{exc.field}: " if exc.field and exc.field not in str(exc) else ""
        exc.args = (f"{where}: {field}{exc}",)


def _retriever_of(spec: str) -> ToolRetriever | None:
    """The retriever ``toolRetrieval.retriever`` names: ``"lexical"`` (the default) or an import
    reference to a ToolRetriever class, factory or instance."""
    from openstarry.errors import ManifestError
    from openstarry.tools import import_reference

    if spec == "lexical":
        return None
    if ":" not in spec:
        raise ManifestError(
            f"unknown retriever {spec!r}: 'lexical' or an import reference "
            "'package.module:attribute'",
            field="toolRetrieval.retriever",
        )
    target = import_reference(spec, "toolRetrieval.retriever", "retriever")
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
