"""An agent: a provider, tools and toolsets, running on a bus.

    async with Agent(provider, [get_weather]) as agent:
        result = await agent.ask("Query weather in Taipei")
        print(result.text)

:class:`Agent` takes its parts already built; :func:`openstarry.assembly.agent_from_manifest`
builds them from an ``agent.json``. It owns an :class:`~openstarry.bus.EventBus`
(unless given one) and an :class:`~openstarry.agent.loop.ExecutionLoop`.

Entering it starts, in order: its bus, its provider (when the provider is an
async context manager: an HTTP provider keeps one pool of connections for the
agent's life), its toolsets (:class:`~openstarry.agent.interfaces.Toolset`,
such as the remote MCP servers of ``mcp.servers``), whose tools join the
agent's, then the loop. Leaving stops them in the reverse order: the runs in
progress are stopped, the toolsets' tools leave, connections close and the bus
drains. A start that fails part way leaves what it had started, in the same
order. An agent can be entered again once it has exited; entering it while it
runs is refused before anything is touched.

A toolset whose tools change while the agent runs (a remote MCP server's
``list_changed``) gives the agent its new list. A new tool named like one the
agent already has (a local tool, or another toolset's) is left out, and said
once: a warning on the ``openstarry.agent`` logger and a ``KERNEL:ERROR``
(``TOOL_NAME_CLASH``, session ``agent``) naming both tools. The agent runs on
with the tool it had. At the start the same clash fails the start instead
(a :class:`~openstarry.errors.ManifestError`): there nothing runs yet.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from openstarry._lifecycle import Lifecycle
from openstarry.agent.interfaces import Provider, Tool, Toolset
from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
from openstarry.agent.retrieval import ToolRetriever
from openstarry.agent.store import SessionStore
from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.errors import ManifestError, QueueClosed, QueueFull
from openstarry.events import EventType

__all__ = ["TOOL_NAME_CLASH", "Agent"]

log = logging.getLogger("openstarry.agent")

#: The ``code`` of the ``KERNEL:ERROR`` that says a toolset's new tool was left out.
TOOL_NAME_CLASH = "TOOL_NAME_CLASH"


class Agent(Lifecycle):
    """A provider, tools and toolsets, running on a bus.

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
        toolsets: Tools to connect when the agent starts (remote MCP servers);
            their tools join :attr:`tools` while it runs.
        approval_tools: Tools whose calls wait for a person's approval
            (:mod:`openstarry.agent.waits`).
        store: Where sessions' memory lives between runs (``None``: in this
            process); a store that is an async context manager is entered with the agent.
        run_bus: Whether the agent starts and stops ``bus`` with itself, as it does
            its own (default: only its own). An agent assembled from a manifest
            whose ``bus`` names a Redis bus runs that bus.
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
        toolsets: Sequence[Toolset] = (),
        approval_tools: Iterable[str] = (),
        store: SessionStore | None = None,
        run_bus: bool | None = None,
    ) -> None:
        for toolset in toolsets:
            if not isinstance(toolset, Toolset):
                raise TypeError(
                    f"toolsets must be openstarry Toolset objects, not {type(toolset).__name__}"
                )
        self.name = name
        self.manifest = manifest
        self.toolsets: tuple[Toolset, ...] = tuple(toolsets)
        self._owns_bus = bus is None if run_bus is None else run_bus
        self.bus = bus if bus is not None else EventBus()
        """The :class:`~openstarry.bus.EventBus` the agent runs on: the one given, or its own.

        Its own bus starts and stops with the agent; a bus given is the caller's to
        run (unless ``run_bus``).

        Subscribe to it to watch a run (``agent.bus.subscribe("EXEC:*", print)``);
        an ``INPUT:USER_MESSAGE`` published on it asks as :meth:`ask` does.
        """
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
            approval_tools=approval_tools,
            store=store,
        )
        """The :class:`~openstarry.agent.loop.ExecutionLoop` that runs each session's turns.

        It has the controls finer than :meth:`ask`: start a run without waiting
        (:meth:`~openstarry.agent.loop.ExecutionLoop.start`), stop one
        (:meth:`~openstarry.agent.loop.ExecutionLoop.command`), call a tool
        (:meth:`~openstarry.agent.loop.ExecutionLoop.call_tool`), read the counters
        (:meth:`~openstarry.agent.loop.ExecutionLoop.metrics`).
        """

    @property
    def provider(self) -> Provider:
        """The agent's provider (the loop's): the model it thinks with."""
        return self.loop.provider

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's tools by name; while it runs, its toolsets' too."""
        return self.loop.tools

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Agent]:
        async with AsyncExitStack() as stack:
            if self._owns_bus:
                await stack.enter_async_context(self.bus)
            store = self.loop.store
            if isinstance(store, AbstractAsyncContextManager):
                await stack.enter_async_context(store)
            provider = self.provider
            if isinstance(provider, AbstractAsyncContextManager):
                await stack.enter_async_context(provider)
            for toolset in self.toolsets:
                await stack.enter_async_context(toolset)
            if self.toolsets:
                local = self.loop.tools
                self.loop.tools = self._with_toolsets(local)
                stack.callback(setattr, self.loop, "tools", local)
                #: The names left out for a clash, so each clash is said once.
                clashes: set[str] = set()
                for toolset in self.toolsets:
                    # A toolset whose tools change while it runs (a remote server's
                    # list_changed) says so; the agent takes the new list.
                    if hasattr(toolset, "on_change"):
                        toolset.on_change = lambda: self._take_changed_tools(local, clashes)
                        stack.callback(setattr, toolset, "on_change", None)
            await stack.enter_async_context(self.loop)
            yield self

    def _with_toolsets(self, local: Mapping[str, Tool]) -> dict[str, Tool]:
        """The local tools and every toolset's, refusing a name that two of them give.

        Raises:
            openstarry.errors.ManifestError: a toolset's tool is named like one
                the agent already has (a ``ValueError``, naming the toolset's origin).
        """
        merged = dict(local)
        for toolset in self.toolsets:
            tools = toolset.tools
            clash = sorted(set(merged) & set(tools))
            if clash:
                raise ManifestError(
                    f"{toolset.origin}: tool(s) {clash} have the name of a local tool; "
                    "rename the local tool or the server",
                    field=toolset.origin,
                )
            merged.update(tools)
        return merged

    def _take_changed_tools(self, local: Mapping[str, Tool], clashes: set[str]) -> None:
        """A toolset's tools changed while the agent runs: take the new list.

        Never raises (it runs in the toolset's notification callback): a new
        tool named like one the agent has is left out, and a clash not yet
        in ``clashes`` is said (a log line and a ``KERNEL:ERROR``).
        """
        merged = dict(local)
        clashing: set[str] = set()
        for toolset in self.toolsets:
            for name, tool in toolset.tools.items():
                other = merged.get(name)
                if other is None:
                    merged[name] = tool
                    continue
                clashing.add(name)
                if name not in clashes:
                    mine = "the local tool" if local.get(name) is other else "tool"
                    self._say_clash(
                        f"{toolset.origin}: tool {_described(tool)} is left out: its name "
                        f"{name!r} is that of {mine} {_described(other)} "
                        "(rename the local tool or the server)"
                    )
        # A clash that went away and comes back is said again.
        clashes.clear()
        clashes.update(clashing)
        self.loop.tools = merged

    def _say_clash(self, message: str) -> None:
        log.warning("%s", message)
        source = self.loop.source
        error = Event.new(
            EventType.ERROR.value,
            {"code": TOOL_NAME_CLASH, "message": message, "source": source},
            source=source,
            session_id="agent",
        )
        with contextlib.suppress(QueueFull, QueueClosed):
            self.bus.publish(error)

    async def ask(self, text: str, *, session_id: str | None = "default") -> RunResult:
        """Send one user turn and wait for the run it starts to end.

        ``session_id=None`` asks statelessly: the run starts from no history
        and its session is forgotten when it ends (:meth:`ExecutionLoop.start
        <openstarry.agent.loop.ExecutionLoop.start>`). Cancelling it stops
        the run, as ``/stop`` would (:meth:`ExecutionLoop.ask
        <openstarry.agent.loop.ExecutionLoop.ask>`).
        """
        return await self.loop.ask(text, session_id=session_id)


def _described(tool: Tool) -> str:
    """A tool in words: a remote one by its server and its name there."""
    server = getattr(tool, "server", None)
    remote_name = getattr(tool, "remote_name", None)
    if isinstance(server, str) and isinstance(remote_name, str):
        return f"{remote_name!r} of MCP server {server!r}"
    return repr(tool.name)
