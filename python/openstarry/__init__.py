"""openstarry: an agent core for Python whose hot path is Rust.

The Rust core is :mod:`openstarry.core`; it needs nothing beyond the standard
library. Exceptions live in :mod:`openstarry.errors`.

The agent runtime is importable from here too: :class:`Agent`,
:class:`EventBus`, :class:`ExecutionLoop`, :class:`Tool`, :func:`tool`,
:class:`Provider`, :class:`Toolset`, :class:`AgentContext`, and
:func:`agent_from_manifest`, which builds an agent from an ``agent.json``.
They are loaded on first use, so ``import openstarry.core`` still pulls in no
third-party package (the runtime needs pydantic and anyio).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from openstarry._core import __version__

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext, Provider, Tool, Toolset
    from openstarry.agent.loop import ExecutionLoop, LoopLimits, RunResult
    from openstarry.agent.runtime import Agent
    from openstarry.agent.tools import tool
    from openstarry.assembly import agent_from_manifest
    from openstarry.bus import EventBus

__all__ = [
    "Agent",
    "AgentContext",
    "EventBus",
    "ExecutionLoop",
    "LoopLimits",
    "Provider",
    "RunResult",
    "Tool",
    "Toolset",
    "__version__",
    "agent_from_manifest",
    "tool",
]

_LAZY = {
    "Agent": "openstarry.agent.runtime",
    "AgentContext": "openstarry.agent.interfaces",
    "EventBus": "openstarry.bus",
    "ExecutionLoop": "openstarry.agent.loop",
    "LoopLimits": "openstarry.agent.loop",
    "Provider": "openstarry.agent.interfaces",
    "RunResult": "openstarry.agent.loop",
    "Tool": "openstarry.agent.interfaces",
    "Toolset": "openstarry.agent.interfaces",
    "agent_from_manifest": "openstarry.assembly",
    "tool": "openstarry.agent.tools",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'openstarry' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
