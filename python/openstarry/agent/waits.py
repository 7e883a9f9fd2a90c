"""Calls that wait for someone outside the loop: client tools and approvals.

Two kinds of tool call cannot finish inside the agent:

- a **client tool** (:class:`ClientTool`): a function the client of a request
  declared (spec 003 ``AgentRequest.tools``) and runs itself. The call waits
  for its output, which the client sends in a later request on the same
  session (a ``function_call_output`` message);
- a call to a tool that **needs approval** (the manifest's ``approval.tools``,
  or a tool whose ``requires_approval`` is true, as a remote MCP server's can
  be): it waits for a yes or a no (an ``mcp_approval_response`` over HTTP, y/n
  at the terminal prompt) before it runs.

Rules the waits keep:

- **A wait is announced before it starts.** The executor publishes the round's
  ``EXEC:TOOL_CALL`` events, an ``EXEC:APPROVAL_REQUEST`` per call that needs
  approval, then one ``EXEC:AWAITING`` that lists every wait of the round;
  only then does any call wait. A transport that sees ``EXEC:AWAITING`` knows
  the run now waits for its client.
- **Every wait ends.** An answer, the wait's timeout, or the run being stopped
  ends it; an unanswered approval is a denial, an unanswered client call a
  ``TIMEOUT`` failure. A wait is forgotten once it ends: a late answer finds
  nothing to answer.
- **Waits are per session**, answered by id (the tool call's id for a client
  tool, the approval's id for an approval).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

import anyio

from openstarry.agent.interfaces import AgentContext, Tool

__all__ = [
    "APPROVAL",
    "CLIENT_CALL",
    "Answer",
    "ClientTool",
    "Wait",
    "Waits",
]

#: The kind of a wait for a client tool's output.
CLIENT_CALL = "function_call"
#: The kind of a wait for an approval.
APPROVAL = "approval"
#: Answers kept for waits not opened yet, at most (the oldest go first).
EARLY_ANSWERS = 1024


@final
class ClientTool(Tool):
    """A function the client of a request declared; the client runs it, not the agent.

    The loop never calls :meth:`run`: a call to it waits for the client's
    output (see the module's rules).
    """

    def __init__(self, name: str, description: str, parameters: Mapping[str, Any]) -> None:
        self.name = name
        self.description = description
        self.parameters = dict(parameters)

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise RuntimeError(f"{self.name} is a client tool: its client runs it")

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> ClientTool:
        """One from ``{"name", "description", "parameters"}`` (what a request declares)."""
        parameters = spec.get("parameters")
        return cls(
            str(spec["name"]),
            str(spec.get("description") or ""),
            parameters if isinstance(parameters, Mapping) else {"type": "object", "properties": {}},
        )


@dataclass(slots=True)
class Answer:
    """What answers a wait: a client tool's ``output``, or an approval's yes or no."""

    output: str | None = None
    approve: bool = False
    reason: str | None = None


@dataclass(slots=True, eq=False)
class Wait:
    """One call waiting for an answer from outside the loop."""

    id: str
    kind: str
    session_id: str
    trace_id: str
    tool_call_id: str
    name: str
    args: Any
    server_label: str | None = None
    answer: Answer | None = None
    done: anyio.Event | None = None
    expired: bool = field(default=False)


class Waits:
    """The calls that wait, by session and id; the loop keeps one."""

    __slots__ = ("_early", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[str, dict[str, Wait]] = {}
        #: Answers that came before their wait was opened (a durable run still
        #: replaying up to it), by session and id: at most :data:`EARLY_ANSWERS`.
        self._early: dict[tuple[str, str], Answer] = {}

    def keep(self, session_id: str, wait_id: str, answer: Answer) -> None:
        """Keep an answer for a wait not opened yet: :meth:`open` gives it to the wait."""
        early = self._early
        early[(session_id, wait_id)] = answer
        if len(early) > EARLY_ANSWERS:
            del early[next(iter(early))]

    def open(
        self,
        kind: str,
        context: AgentContext,
        tool_call_id: str,
        name: str,
        args: Any,
        *,
        server_label: str | None = None,
        wait_id: str | None = None,
    ) -> Wait:
        """Record a wait (not yet waited for); an approval gets a fresh ``apr_`` id, unless
        ``wait_id`` gives one (a durable run's, the same on every attempt)."""
        if wait_id is None:
            wait_id = tool_call_id if kind == CLIENT_CALL else f"apr_{uuid.uuid4().hex}"
        wait = Wait(
            wait_id,
            kind,
            context.session_id,
            context.trace_id,
            tool_call_id,
            name,
            args,
            server_label,
        )
        self._sessions.setdefault(wait.session_id, {})[wait_id] = wait
        if self._early:
            wait.answer = self._early.pop((wait.session_id, wait_id), None)
        return wait

    def find(self, session_id: str, kind: str, tool_call_id: str) -> Wait | None:
        """The wait of that kind for that call, if one is recorded."""
        for wait in self._sessions.get(session_id, {}).values():
            if wait.kind == kind and wait.tool_call_id == tool_call_id:
                return wait
        return None

    def pending(self, session_id: str) -> list[Wait]:
        """The session's waits not yet answered, in the order they were opened."""
        return [w for w in self._sessions.get(session_id, {}).values() if w.answer is None]

    def answer(self, session_id: str, wait_id: str, answer: Answer) -> bool:
        """Answer a wait; False when the session has no unanswered wait of that id."""
        wait = self._sessions.get(session_id, {}).get(wait_id)
        if wait is None or wait.answer is not None:
            return False
        wait.answer = answer
        if wait.done is not None:
            wait.done.set()
        return True

    async def wait(self, wait: Wait, timeout: float) -> Answer | None:
        """Wait for the answer, at most ``timeout`` seconds; ``None`` when none came.

        The wait is forgotten on the way out, whatever ends it.
        """
        try:
            if wait.answer is None:
                wait.done = anyio.Event()
                with anyio.move_on_after(timeout):
                    await wait.done.wait()
            if wait.answer is None:
                wait.expired = True
            return wait.answer
        finally:
            self.close(wait)

    def close(self, wait: Wait) -> None:
        """Forget a wait (answered, expired, or its run stopped)."""
        waits = self._sessions.get(wait.session_id)
        if waits is not None and waits.get(wait.id) is wait:
            del waits[wait.id]
            if not waits:
                del self._sessions[wait.session_id]

    def __len__(self) -> int:
        return sum(len(w) for w in self._sessions.values())
