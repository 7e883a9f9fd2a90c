"""``n`` from 2 to 5: one request answered by ``n`` independent runs.

Each choice is a run of its own, with its own trace, on a private session
whose memory starts as a copy of the request's session's: the runs go on
concurrently and never write into each other's memory, nor into the session's.
When they have all ended, the first choice's turn (the user's input and all
the run added after it) is written into the session's memory, as if it alone
had run; the other choices are forgotten with their private sessions.

The response carries every choice's output messages, choice 0's first, each
with ``metadata.choice`` (its index); it is ``completed`` when at least one
choice completed (the usage is their sum, ``metadata.choices`` gives each
choice's status), ``failed`` when all failed, ``canceled`` when stopped. The
messages are sent once every choice has ended, each whole (no deltas).

What cannot run ``n`` times is refused (422 ``unsupported_n``) by
:func:`check_choices`: a run that could wait for its client (client tools,
answers to a waiting run, an agent with tools that need approval) and slash
commands.

Each choice is run by the function :class:`Choices` is given
(:func:`openstarry.api.adapter.collect_run`): the adapter imports this module, and
this module never imports the adapter.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from openstarry.agent.commands import parse_line
from openstarry.api.models import (
    AgentRequest,
    AgentResponse,
    Error,
    InvalidRequestError,
    RunStatus,
)
from openstarry.errors import QueueClosed, QueueFull

if TYPE_CHECKING:
    from openstarry.agent.runtime import Agent
    from openstarry.api.builders import ResponseBuilder
    from openstarry.api.translate import WireEvent

__all__ = ["Choices", "CollectRun", "check_choices"]

#: Runs one request to its end and returns the terminal response
#: (:func:`openstarry.api.adapter.collect_run`).
CollectRun = Callable[["Agent", AgentRequest], Awaitable[AgentResponse]]

#: The ``source`` of the commands that forget the private sessions.
SOURCE = "openstarry.api"


def _refuse(message: str) -> InvalidRequestError:
    text = f"n: {message}"
    return InvalidRequestError(
        text, code="unsupported_n", errors=[{"loc": "n", "msg": text, "type": "unsupported_n"}]
    )


def _needs_approval(agent: Agent) -> bool:
    approval = getattr(getattr(agent.manifest, "approval", None), "tools", ())
    return bool(approval) or any(
        getattr(tool, "requires_approval", False) is True for tool in agent.tools.values()
    )


def check_choices(request: AgentRequest, text: str, answers: bool, agent: Agent | None) -> None:
    """Refuse ``n`` above 1 where the runs could not be independent.

    Raises:
        InvalidRequestError: (HTTP 422 ``unsupported_n``) saying why.
    """
    n = request.n or 1
    if n == 1:
        return
    if request.tools:
        raise _refuse(f"{n} choices cannot each wait for the client's tools; send n 1")
    if answers:
        raise _refuse("answers to a waiting run continue that one run; send n 1")
    if parse_line(text) is not None:
        raise _refuse("a slash command runs once; send n 1")
    if agent is not None and _needs_approval(agent):
        raise _refuse(
            f"this agent has tools that wait for approval, which {n} choices cannot "
            "each ask for; send n 1"
        )


class Choices:
    """The ``n`` runs of one request and the response that merges them.

    :meth:`run` appends the response's events to ``out``, the terminal one
    last, which it also keeps as :attr:`final`; ``collect`` runs each choice.
    """

    def __init__(
        self,
        agent: Agent,
        request: AgentRequest,
        session_id: str,
        builder: ResponseBuilder,
        out: deque[WireEvent],
        collect: CollectRun,
    ) -> None:
        self.agent = agent
        self._collect = collect
        self.session_id = session_id
        self.n = request.n or 1
        self._builder = builder
        self._out = out
        tag = uuid.uuid4().hex[:12]
        self.private_ids = [f"{session_id}~choice{i}~{tag}" for i in range(self.n)]
        self._requests = [
            request.model_copy(update={"n": None, "session_id": sid}) for sid in self.private_ids
        ]
        self.responses: list[AgentResponse | None] = [None] * self.n
        self.final: AgentResponse | None = None
        self._scope: anyio.CancelScope | None = None

    def cancel(self) -> None:
        """Stop every choice; the response ends ``canceled``."""
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> AgentResponse:
        loop = self.agent.loop
        shared = list(loop.session(self.session_id).memory)
        for sid in self.private_ids:
            loop.session(sid).memory.extend(shared)

        async def one(index: int) -> None:
            self.responses[index] = await self._collect(self.agent, self._requests[index])

        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                async with anyio.create_task_group() as group:
                    for index in range(self.n):
                        group.start_soon(one, index, name=f"openstarry.api choice {index}")
            canceled = scope.cancel_called
            if not canceled and self._first_completed():
                turn = loop.session(self.private_ids[0]).memory.current_turn()
                loop.session(self.session_id).memory.extend(list(turn))
        finally:
            for sid in self.private_ids:
                with contextlib.suppress(QueueClosed, QueueFull):
                    loop.command("quit", session_id=sid, source=SOURCE)
        return self._merge(canceled)

    def _first_completed(self) -> bool:
        first = self.responses[0]
        return first is not None and first.status is RunStatus.Completed

    def _merge(self, canceled: bool) -> AgentResponse:
        builder = self._builder
        usage: dict[str, Any] = {}
        statuses: list[str] = []
        for index, response in enumerate(self.responses):
            status = response.status if response is not None else None
            statuses.append(status.value if status is not None else "canceled")
            if response is None:
                continue
            for key, value in (response.usage or {}).items():
                if isinstance(value, int) and not isinstance(value, bool):
                    usage[key] = usage.get(key, 0) + value
            for message in response.output or ():
                made = builder.create_message_builder(message.role or "assistant", message.type)
                made.metadata = {**(message.metadata or {}), "choice": index}
                self._out.append(made.created())
                if message.code is not None:
                    made.set_error(message.code, message.message or "")
                for item in message.content or ():
                    self._out.append(made.add_content(item.model_copy(update={"index": None})))
                if message.status is RunStatus.Failed and message.error is not None:
                    self._out.append(made.failed(message.error))
                else:
                    self._out.append(made.complete())
        builder.metadata = {**(builder.metadata or {}), "choices": statuses}
        if usage:
            builder.set_usage(usage)
        if canceled:
            final = builder.canceled()
        elif "completed" in statuses:
            final = builder.completed()
        else:
            errors = [r.error for r in self.responses if r is not None and r.error is not None]
            final = builder.failed(errors[0] if errors else Error(code="failed", message=""))
        self._out.append(final)
        self.final = final
        return final
