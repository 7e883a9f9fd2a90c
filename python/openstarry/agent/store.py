"""Where sessions' memory lives between runs: the :class:`SessionStore` protocol.

By default an agent keeps its sessions in its own process (no store). Given a
store, the execution loop loads a session's memory from it before each run and
saves it after, so a conversation continued on another worker sees its whole
history, and an agent restarted keeps its sessions. A session is stored as
plain JSON data (:func:`memory_to_data`); :mod:`openstarry.stores` has the
SQLite and Redis stores, and :class:`InMemoryStore` is the one to test with.

Rules a store keeps: ``load`` of an unknown session is ``None``; ``save``
replaces the whole session; ``delete`` of an unknown session does nothing.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.core import ToolCall

__all__ = ["InMemoryStore", "SessionStore", "memory_from_data", "memory_to_data"]


@runtime_checkable
class SessionStore(Protocol):
    """Loads and saves sessions' memory as JSON data (a list of entries)."""

    async def load(self, session_id: str) -> list[dict[str, Any]] | None:
        """The session's entries, oldest first; ``None`` for a session never saved."""

    async def save(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        """Replace the session's entries."""

    async def delete(self, session_id: str) -> None:
        """Forget the session."""


class InMemoryStore:
    """A store in this process (for tests, or to share sessions between agents of one process)."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[dict[str, Any]]] = {}

    async def load(self, session_id: str) -> list[dict[str, Any]] | None:
        entries = self.sessions.get(session_id)
        return None if entries is None else list(entries)

    async def save(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        self.sessions[session_id] = list(entries)

    async def delete(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


def memory_to_data(entries: Any) -> list[dict[str, Any]]:
    """A memory's entries as JSON data."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        if type(entry) is UserTurn:
            out.append({"role": "user", "text": entry.text})
        elif type(entry) is AssistantTurn:
            calls = [{"id": c.id, "name": c.name, "args": c.args} for c in entry.tool_calls]
            out.append({"role": "assistant", "text": entry.text, "toolCalls": calls})
        elif type(entry) is ToolOutcome:
            error = entry.error.to_dict() if entry.error is not None else None
            out.append(
                {
                    "role": "tool",
                    "toolCallId": entry.tool_call_id,
                    "name": entry.name,
                    "success": entry.success,
                    "result": entry.result,
                    "error": error,
                }
            )
        elif type(entry) is Observation:
            out.append({"role": "system", "text": entry.text})
    return out


def memory_from_data(data: list[dict[str, Any]]) -> list[MemoryEntry]:
    """Entries from :func:`memory_to_data`'s data (unknown roles are skipped)."""
    entries: list[MemoryEntry] = []
    for item in data:
        role = item.get("role")
        if role == "user":
            entries.append(UserTurn(str(item.get("text", ""))))
        elif role == "assistant":
            calls = tuple(
                ToolCall(str(c["name"]), c.get("args"), str(c["id"]))
                for c in item.get("toolCalls") or ()
            )
            entries.append(AssistantTurn(str(item.get("text", "")), calls))
        elif role == "tool":
            error = item.get("error")
            entries.append(
                ToolOutcome(
                    str(item.get("toolCallId", "")),
                    str(item.get("name", "")),
                    bool(item.get("success")),
                    item.get("result"),
                    ToolFailure(
                        str(error.get("code", "")),
                        str(error.get("message", "")),
                        str(error.get("source", "")),
                    )
                    if isinstance(error, dict)
                    else None,
                )
            )
        elif role == "system":
            entries.append(Observation(str(item.get("text", ""))))
    return entries
