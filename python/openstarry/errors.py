"""The exceptions openstarry raises.

Every exception derives from :class:`OpenStarryError`. The Rust core raises the
classes defined here (it imports them from this module), so callers catch them
without touching the extension. Where a Python built-in already names the
failure, the class derives from it too, so existing ``except`` clauses keep
working: a :class:`DecodeError` is a :class:`ValueError`, and :class:`QueueFull`
and :class:`QueueEmpty` are :class:`asyncio.QueueFull` and
:class:`asyncio.QueueEmpty`.
"""

from __future__ import annotations

import asyncio

__all__ = [
    "AgentPainException",
    "DecodeError",
    "OpenStarryError",
    "ProviderError",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "RecursionLimitExceeded",
    "ToolNotFound",
]


class OpenStarryError(Exception):
    """The root of every openstarry exception."""


class DecodeError(OpenStarryError, ValueError):
    """Bytes that are not a valid envelope, provider response or snapshot.

    Attributes:
        field: The wire name of the offending field (``"priority"``,
            ``"segments[1].toolCall.name"``), or ``None`` when the input is
            not valid JSON at all or the error is not tied to one field.
        offset: The byte offset where decoding failed (for a field's invalid
            value, where that value starts), or ``None`` when no single place
            is at fault, such as a missing required field.
    """

    def __init__(
        self, message: str, *, field: str | None = None, offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.offset = offset


class QueueFull(OpenStarryError, asyncio.QueueFull):
    """A bounded queue with the ``"reject"`` overflow policy is full."""


class QueueEmpty(OpenStarryError, asyncio.QueueEmpty):
    """A non-blocking get found the queue empty."""


class QueueClosed(OpenStarryError):
    """The queue has been closed: it accepts no more items."""


class AgentPainException(OpenStarryError):
    """A provider's output could not be understood (spec 000 section 7)."""


class ToolNotFound(OpenStarryError, LookupError):
    """A tool call named a tool the agent does not have."""


class RecursionLimitExceeded(OpenStarryError):
    """An inter-agent call chain went deeper than the allowed depth."""


class ProviderError(OpenStarryError):
    """A provider failed to produce a response."""
