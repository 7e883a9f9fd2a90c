"""Remote A2A agents as tools: :class:`A2AToolset` resolves their cards when the agent
starts, and each :class:`A2ATool` sends a message and answers with the reply.

A remote agent whose card declares streaming is called with
``SendStreamingMessage``: each piece of its answer, and each change of its task's
state, is an ``EXEC:TOOL_PROGRESS`` event of the call in the caller's run
(``{"text": ...}`` or ``{"state": "TASK_STATE_WORKING"}``, with the ``taskId``),
so whoever follows the run (the Agent API's stream, ``/events``, the console,
``openstarry tail``) sees the remote answer as it comes. The tool's result is
still the whole answer, once the task is done.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.errors import ToolError
from openstarry.manifest import A2AAgentConfig
from openstarry.tracecontext import META_DEPTH, META_TRACE, current_traceparent

try:
    import httpx
    from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, ClientFactory
    from a2a.helpers import get_artifact_text
    from a2a.types import Message, Part, Role, SendMessageRequest, StreamResponse, TaskState
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "remote A2A agents need the official A2A SDK: pip install 'openstarry[a2a]'"
    ) from exc

__all__ = ["A2ATool", "A2AToolset"]

log = logging.getLogger("openstarry.a2a")

#: The remote contexts kept per tool: one per caller session, the oldest forgotten.
MAX_CONTEXTS = 1024

#: The states a task ends in (input-required and auth-required end a call: the task
#: waits for its caller).
_ENDED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
        TaskState.TASK_STATE_INPUT_REQUIRED,
        TaskState.TASK_STATE_AUTH_REQUIRED,
    }
)

#: What a call answers with, when the remote agent's task ended otherwise than done.
_FAILED = {
    TaskState.TASK_STATE_FAILED: "REMOTE_ERROR",
    TaskState.TASK_STATE_CANCELED: "REMOTE_CANCELED",
    TaskState.TASK_STATE_REJECTED: "REMOTE_REJECTED",
    TaskState.TASK_STATE_INPUT_REQUIRED: "REMOTE_INPUT_REQUIRED",
    TaskState.TASK_STATE_AUTH_REQUIRED: "REMOTE_AUTH_REQUIRED",
}


class A2ATool(Tool):
    """A remote agent, called with a message; answers with what it said.

    Its card is read when the agent starts; an agent not reachable then is read at the
    first call instead (two agents may call each other, and start in either order).

    Attributes:
        name: The manifest entry's name.
        url: The remote agent's base URL (its card is under it).
        requires_approval: The entry sets ``approval``: each call waits for a person.
    """

    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "message": {"type": "string", "description": "What to ask or tell the agent."}
        },
        "required": ["message"],
    }

    def __init__(self, config: A2AAgentConfig, http: httpx.AsyncClient, timeout: float) -> None:
        self.name = config.name
        self.url = config.url
        self.requires_approval = config.approval
        self.description = f"Ask the agent {config.name!r} at {config.url} (over A2A)."
        self._http = http
        self._timeout = timeout
        self._client: Any = None
        self._lock = anyio.Lock()
        #: The remote context of each caller session (the conversation over there).
        self._contexts: OrderedDict[str, str] = OrderedDict()

    async def connect(self) -> None:
        """Read the agent's card (once), and describe the tool by it.

        Raises:
            ToolError: ``REMOTE_UNAVAILABLE``: the card could not be read.
        """
        async with self._lock:
            if self._client is not None:
                return
            try:
                with anyio.fail_after(self._timeout):
                    card = await A2ACardResolver(self._http, self.url).get_agent_card()
            except (A2AClientError, httpx.HTTPError, TimeoutError, ValueError) as exc:
                raise ToolError(
                    f"{self.name}: the agent card at {self.url} could not be read: "
                    f"{exc or type(exc).__name__}",
                    code="REMOTE_UNAVAILABLE",
                ) from exc
            # Streamed where the card says it can be (the SDK checks), else one answer.
            config = ClientConfig(streaming=True, httpx_client=self._http)
            self._client = ClientFactory(config).create(card)
            skills = "; ".join(
                f"{skill.name}: {skill.description}" if skill.description else skill.name
                for skill in card.skills
            )
            self.description = f"Ask the agent {card.name!r} (over A2A): {card.description}" + (
                f" Its skills: {skills}." if skills else ""
            )

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        """Send ``args["message"]`` one hop deeper than ``context``'s run; the reply's text.

        Raises:
            ToolError: ``REMOTE_UNAVAILABLE`` (not reached), ``REMOTE_ERROR`` (it
                failed, or refused the call: ``RECURSION_LIMIT_EXCEEDED`` for a
                call too deep), ``REMOTE_INPUT_REQUIRED`` and the like for a task
                that ended waiting.
        """
        text = args["message"]
        if not isinstance(text, str) or not text.strip():
            raise ToolError(f"{self.name}: message must be non-empty text", code="INVALID_ARGS")
        await self.connect()
        session = context.session.id
        hop: dict[str, Any] = {META_DEPTH: context.call_depth + 1}
        if context.trace_id:
            hop[META_TRACE] = context.trace_id
        parent = current_traceparent()
        if parent is not None:
            hop["traceparent"] = parent
        message = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            metadata=hop,
        )
        known = self._contexts.get(session)
        if known is not None:
            message.context_id = known
        answer = _Answer(self.name, context)
        try:
            # Read to the stream's end, which the server makes once the task has ended
            # (breaking off would leave the SDK's inner streams for the collector).
            async for event in self._client.send_message(SendMessageRequest(message=message)):
                answer.take(event)
        except A2AClientError as exc:
            said = str(exc)
            code = "RECURSION_LIMIT_EXCEEDED" if "-32050" in said else "REMOTE_ERROR"
            if isinstance(exc.__cause__, httpx.TransportError):
                code = "REMOTE_UNAVAILABLE"
            raise ToolError(f"{self.name}: {said}", code=code) from None
        except httpx.TransportError as exc:
            raise ToolError(f"{self.name}: {exc}", code="REMOTE_UNAVAILABLE") from None
        if answer.context_id:
            contexts = self._contexts
            contexts[session] = answer.context_id
            contexts.move_to_end(session)
            while len(contexts) > MAX_CONTEXTS:
                contexts.popitem(last=False)
        return answer.result()


class _Answer:
    """A remote agent's answer as it comes: a message, or a task and its updates.

    Each piece of an artifact and each new state of the task is passed on as the
    call's progress (:meth:`AgentContext.emit_progress`); :meth:`result` is the
    whole answer once the task has ended.
    """

    def __init__(self, tool: str, context: AgentContext) -> None:
        self.tool = tool
        self.context = context
        self.context_id = ""
        self.message: str | None = None
        self.state = TaskState.TASK_STATE_UNSPECIFIED
        self.why = ""
        #: Each artifact's text, by its id: the pieces appended, in order.
        self.artifacts: dict[str, list[str]] = {}

    def take(self, event: StreamResponse) -> None:
        """Take one event of the answer (nothing more, once it is whole)."""
        if self.message is not None or self.state in _ENDED:
            return
        if event.HasField("message"):
            self.message = "\n".join(part.text for part in event.message.parts if part.text)
            self.context_id = event.message.context_id or self.context_id
        elif event.HasField("task"):
            task = event.task
            self.context_id = task.context_id
            for artifact in task.artifacts:
                self.artifacts[artifact.artifact_id] = [get_artifact_text(artifact)]
            self._status(task.id, task.status)
        elif event.HasField("artifact_update"):
            update = event.artifact_update
            artifact = update.artifact
            piece = get_artifact_text(artifact)
            pieces = self.artifacts.setdefault(artifact.artifact_id, [])
            if not update.append:
                pieces.clear()
            pieces.append(piece)
            if piece:
                self.context.emit_progress(text=piece, taskId=update.task_id)
        elif event.HasField("status_update"):
            update = event.status_update
            self.context_id = update.context_id or self.context_id
            self._status(update.task_id, update.status)

    def _status(self, task_id: str, status: Any) -> None:
        if status.state != self.state:
            self.state = status.state
            self.context.emit_progress(state=TaskState.Name(status.state), taskId=task_id)
        said = "\n".join(p.text for p in status.message.parts if p.text)
        if said:
            self.why = said

    def result(self) -> str:
        """The answer's text.

        Raises:
            ToolError: the task ended otherwise than done (``REMOTE_ERROR`` and the
                like), or the answer ended before its task did.
        """
        if self.message is not None:
            return self.message
        said = "\n".join("".join(pieces) for pieces in self.artifacts.values())
        code = _FAILED.get(self.state)
        if code is not None:
            why = self.why or said or TaskState.Name(self.state)
            raise ToolError(f"{self.tool}: {why}", code=code)
        if self.state != TaskState.TASK_STATE_COMPLETED:
            raise ToolError(
                f"{self.tool}: the answer ended with its task {TaskState.Name(self.state)}",
                code="REMOTE_ERROR",
            )
        return said


class A2AToolset:
    """The manifest's ``a2a.agents``, each a tool (:class:`A2ATool`).

    Entering reads every card, concurrently, each within its ``timeout``; an agent not
    reachable then is said in the log, and its card is read at its first call.
    """

    origin = "a2a.agents"

    def __init__(self, agents: Sequence[A2AAgentConfig], *, timeout: float = 30.0) -> None:
        self._agents = list(agents)
        self._timeout = timeout
        self._http: httpx.AsyncClient | None = None
        self._tools: dict[str, Tool] = {}

    @property
    def tools(self) -> Mapping[str, Tool]:
        return self._tools

    async def __aenter__(self) -> A2AToolset:
        # Calls take as long as the remote agent's run: no read timeout of their own.
        self._http = http = httpx.AsyncClient(timeout=httpx.Timeout(self._timeout, read=None))
        tools = [A2ATool(c, http, c.timeout or self._timeout) for c in self._agents]

        async def connect(tool: A2ATool) -> None:
            try:
                await tool.connect()
            except ToolError as exc:
                log.warning("%s; reading it again at the first call", exc)

        async with anyio.create_task_group() as tasks:
            for tool in tools:
                tasks.start_soon(connect, tool)
        self._tools = {tool.name: tool for tool in tools}
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        http, self._http = self._http, None
        self._tools = {}
        if http is not None:
            with anyio.CancelScope(shield=True):
                await http.aclose()
