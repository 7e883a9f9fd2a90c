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
    "LeaseLost",
    "McpConnectError",
    "OpenStarryError",
    "PartitionMismatch",
    "ProviderError",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "ManifestError",
    "RecursionLimitExceeded",
    "ToolArgumentsError",
    "ToolError",
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


class ToolArgumentsError(OpenStarryError, ValueError):
    """A tool call's arguments do not satisfy the tool's JSON Schema.

    The message lists each offending argument; the execution loop feeds it back
    to the provider as a system observation (spec 000 section 7).
    """


class ToolError(OpenStarryError):
    """A tool failed. Tools raise it to report a failure with a code of their own.

    Attributes:
        code: A short machine-readable code, such as ``"EPERM"`` or ``"ENOENT"``;
            it becomes ``error.code`` of the ``EXEC:TOOL_RESULT`` payload.
    """

    def __init__(self, message: str, *, code: str = "TOOL_ERROR") -> None:
        super().__init__(message)
        self.code = code


class ManifestError(OpenStarryError, ValueError):
    """An ``agent.json`` manifest that cannot be loaded.

    The message names the file and the offending field.

    Attributes:
        path: The manifest's file, or ``None`` for a manifest given as data.
        field: The dotted path of the offending field (``"limits.toolTimeout"``),
            or ``None`` when the file as a whole is at fault.
    """

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field


class RecursionLimitExceeded(OpenStarryError):
    """An inter-agent call chain went deeper than the allowed depth."""


class LeaseLost(OpenStarryError):
    """A worker's lease of a partition holds another worker now: what it was running there
    is the new owner's, and this attempt stops without committing anything.

    A worker frozen past its lease (a long GC pause, a suspended VM, a network
    partition) meets it when it wakes up; the input is handled by the worker
    that took the partition over.
    """


class McpConnectError(OpenStarryError, ConnectionError):
    """A remote MCP server the agent needs (``mcp.servers``) cannot be used; the message names it.

    Attributes:
        server: The server's name in the manifest.
    """

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message)
        self.server = server


class PartitionMismatch(OpenStarryError, ValueError):
    """A process of a shared bus counts its partitions differently from the bus.

    A session's partition is ``crc32(sessionId) % partitions``, so every
    process of one bus must agree on the count: the bus records it at its first
    use and refuses a process that gives another.

    Attributes:
        recorded: The count the bus was first used with.
        given: The count this process gave.
    """

    def __init__(self, message: str, *, recorded: int, given: int) -> None:
        super().__init__(message)
        self.recorded = recorded
        self.given = given


class ProviderError(OpenStarryError):
    """A provider failed to produce a response."""
