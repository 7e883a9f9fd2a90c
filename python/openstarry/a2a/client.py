"""Remote A2A agents as tools: :class:`A2AToolset` resolves their cards when the agent
starts, and each :class:`A2ATool` sends a message and answers with the reply."""

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
    from a2a.types import Message, Part, Role, SendMessageRequest, TaskState
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "remote A2A agents need the official A2A SDK: pip install 'openstarry[a2a]'"
    ) from exc

__all__ = ["A2ATool", "A2AToolset"]

log = logging.getLogger("openstarry.a2a")

#: The remote contexts kept per tool: one per caller session, the oldest forgotten.
MAX_CONTEXTS = 1024

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
            config = ClientConfig(streaming=False, httpx_client=self._http)
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
        try:
            request = SendMessageRequest(message=message)
            answers = [answer async for answer in self._client.send_message(request)]
        except A2AClientError as exc:
            said = str(exc)
            code = "RECURSION_LIMIT_EXCEEDED" if "-32050" in said else "REMOTE_ERROR"
            if isinstance(exc.__cause__, httpx.TransportError):
                code = "REMOTE_UNAVAILABLE"
            raise ToolError(f"{self.name}: {said}", code=code) from None
        except httpx.TransportError as exc:
            raise ToolError(f"{self.name}: {exc}", code="REMOTE_UNAVAILABLE") from None
        for answer in answers:
            if answer.HasField("message"):
                return "\n".join(part.text for part in answer.message.parts if part.text)
            if answer.HasField("task"):
                return self._answer(session, answer.task)
        raise ToolError(f"{self.name}: the agent answered nothing", code="REMOTE_ERROR")

    def _answer(self, session: str, task: Any) -> str:
        contexts = self._contexts
        contexts[session] = task.context_id
        contexts.move_to_end(session)
        while len(contexts) > MAX_CONTEXTS:
            contexts.popitem(last=False)
        said = "\n".join(get_artifact_text(artifact) for artifact in task.artifacts)
        code = _FAILED.get(task.status.state)
        if code is not None:
            why = "\n".join(p.text for p in task.status.message.parts if p.text) or said
            raise ToolError(f"{self.name}: {why or TaskState.Name(task.status.state)}", code=code)
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
