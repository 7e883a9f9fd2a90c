"""The tool retrieval layer (spec 000 section 6B).

When an agent has more tools than fit a provider's context, only the ``N`` most
relevant to the current input reach it. A :class:`ToolRetriever` picks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from openstarry.agent.interfaces import Tool

__all__ = ["ToolRetriever"]


@runtime_checkable
class ToolRetriever(Protocol):
    """Picks the tools most relevant to an input.

    ``select`` returns at most ``limit`` names of ``tools``, the most relevant
    first. It is called once per input, on the input's text, and may cache
    whatever it derives from ``tools`` (an index, embeddings) between calls.
    """

    def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> Sequence[str]: ...
