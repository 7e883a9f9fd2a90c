"""The agent layer: interfaces, ``@tool``, session memory, slash commands, the execution loop.

    from openstarry.agent import Agent, ExecutionLoop, Tool, tool

:class:`Agent` runs a provider, tools, toolsets and limits, built already
(:func:`openstarry.assembly.agent_from_manifest` builds them from an
``agent.json``), on an :class:`~openstarry.bus.EventBus`; :class:`ExecutionLoop` is the
think-act loop of spec 000 section 5 that runs each session's turns.
"""

from openstarry.agent.interfaces import AgentContext, Provider, Tool, Toolset
from openstarry.agent.loop import ExecutionLoop, LoopLimits, PendingRun, RunResult
from openstarry.agent.memory import (
    AssistantTurn,
    Memory,
    MemoryEntry,
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.agent.registry import SchemaCache, tool_set_fingerprint
from openstarry.agent.retrieval import (
    EmbeddingRetriever,
    HybridRetriever,
    LexicalRetriever,
    ToolRetriever,
)
from openstarry.agent.runtime import Agent
from openstarry.agent.tools import AsyncFunctionTool, FunctionTool, tool

__all__ = [
    "Agent",
    "AgentContext",
    "AssistantTurn",
    "AsyncFunctionTool",
    "EmbeddingRetriever",
    "ExecutionLoop",
    "FunctionTool",
    "HybridRetriever",
    "LexicalRetriever",
    "LoopLimits",
    "Memory",
    "MemoryEntry",
    "Observation",
    "PendingRun",
    "Provider",
    "RunResult",
    "SchemaCache",
    "Session",
    "Tool",
    "ToolFailure",
    "ToolOutcome",
    "ToolRetriever",
    "Toolset",
    "UserTurn",
    "tool",
    "tool_set_fingerprint",
]
