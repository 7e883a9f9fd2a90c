"""The interfaces between the core and its plugins (spec 000 sections 3 and 4).

- :class:`Provider` is the agent's brain: ``generate(prompt, context)`` returns a
  :class:`~openstarry.core.ProviderResponse` (or the pydantic
  :class:`openstarry.protocol.ProviderResponse`, which the loop converts).
- :class:`Tool` is what the agent can do: a name, a description, a JSON Schema
  of its parameters, and ``run``, sync or async. The :func:`openstarry.tool`
  decorator makes one from a typed function.
- :class:`Toolset` is a group of tools that must be connected before they can
  run (the remote servers of ``mcp.servers``, for one): an async context
  manager whose ``tools`` are final once entered. The agent enters its toolsets
  when it starts and leaves them when it stops; it never knows what is behind one.
- :class:`AgentContext` is what the core shows a provider and a tool: the tools
  by name (``context.tools``, spec 000 section 4), the session and its memory.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from openstarry.agent.memory import Memory, Session, ToolOutcome
from openstarry.errors import ToolArgumentsError

if TYPE_CHECKING:
    from types import TracebackType

    from openstarry.agent.journal import RunJournal
    from openstarry.core import ProviderResponse

__all__ = ["TOOL_CALL_KEY", "TOOL_PROGRESS", "AgentContext", "Provider", "Tool", "Toolset"]

#: The idempotency key of the tool call running in this task (the executor sets it
#: around each call): what :attr:`AgentContext.idempotency_key` answers.
TOOL_CALL_KEY: ContextVar[str | None] = ContextVar("openstarry_tool_call_key", default=None)

#: Where :meth:`AgentContext.emit_progress` sends a piece of progress of the tool
#: call running in this task, with the call's id and name (the executor sets it
#: around each call): ``(send, session_id, tool_call_id, name)``; ``send`` takes the
#: other three and the fields.
TOOL_PROGRESS: ContextVar[
    tuple[Callable[[str, str, str, dict[str, Any]], None], str, str, str] | None
] = ContextVar("openstarry_tool_progress", default=None)


@runtime_checkable
class Provider(Protocol):
    """Turns a prompt and the agent's context into a response (spec 000 ``IProvider``).

    ``prompt`` is the text of the input being answered, on every round of it;
    what happened since (tool calls, their outcomes, observations) is in
    ``context.memory``, and ``context.round`` counts the rounds from 1. The
    outcomes of the tool calls the provider asked for in the previous round are
    ``context.tool_results`` (empty on the first round): a provider answers
    them, rather than calling the tools again, when it is non-empty. The tools
    the provider may call are ``context.tools``.

    A provider that cannot make sense of its model's output returns a text
    segment saying so or raises :class:`~openstarry.errors.AgentPainException`
    (spec 000 section 7); any other failure may raise
    :class:`~openstarry.errors.ProviderError`.

    A provider may say ``completes_at_once = True`` (an attribute, read
    where present): its ``generate`` returns without waiting, or, if it may
    wait, waits first at a plain checkpoint (``await
    anyio.lowlevel.checkpoint()``) before it enters any cancel scope or task
    group of its own. A run that :meth:`ExecutionLoop.ask
    <openstarry.agent.loop.ExecutionLoop.ask>` serves in its asker's task then
    enters its cancel scope only if it waits (on trio, a ``trio.CancelScope``
    is about a quarter of a turn that never waits). The test providers of
    :mod:`openstarry.testing` say it; a provider that says it wrongly may
    leave its wait uncancellable by ``/stop``, or break trio's order of scopes.
    """

    name: str

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse: ...


@runtime_checkable
class Toolset(Protocol):
    """Tools that must be connected before they run, entered while the agent runs.

    Entering connects (and may fail: the agent's start then fails with that
    error); once entered, :attr:`tools` is final until the toolset exits.
    Leaving on an error may cut connections off rather than close them in order.
    """

    #: Where the toolset comes from, named in errors (the manifest's field, such
    #: as ``"mcp.servers"``).
    origin: str

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The tools by the names the agent knows them by."""
        ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...


class Tool(abc.ABC):
    """A capability of the agent: subclass it, or decorate a function with :func:`openstarry.tool`.

    Attributes:
        name: Unique within an agent; what a ``toolCall.name`` must match exactly.
        description: What the tool does, for the provider.
        parameters: A JSON Schema (``{"type": "object", ...}``) of the arguments.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}

    def validate(self, args: Any) -> dict[str, Any]:
        """The arguments to pass to :meth:`run`, checked against :attr:`parameters`.

        The base class checks that ``args`` is an object and that the schema's
        ``required`` names are present; :func:`openstarry.tool` validates fully.

        Raises:
            ToolArgumentsError: naming each offending argument.
        """
        if not isinstance(args, dict):
            raise ToolArgumentsError(
                f"{self.name}: arguments must be an object, not {type(args).__name__}"
            )
        missing = [name for name in self.parameters.get("required", ()) if name not in args]
        if missing:
            raise ToolArgumentsError(f"{self.name}: missing required argument(s): {missing}")
        return args

    @abc.abstractmethod
    def run(self, args: dict[str, Any], context: AgentContext) -> Any | Awaitable[Any]:
        """Do the work; ``args`` has passed :meth:`validate`.

        May be ``async def``: on a timeout or a ``/stop`` it is cancelled like
        any coroutine. A plain ``def`` runs in a worker thread, so it does not
        block the event loop; a thread cannot be interrupted, so a long sync
        tool should call ``anyio.from_thread.check_cancelled()`` now and then,
        which raises once the call is cancelled (otherwise it runs to its end
        and its result is dropped). Return any JSON-serialisable value; raise
        :class:`~openstarry.errors.ToolError` (with a ``code``) or any exception
        to report a failure.
        """

    #: Whether the class's ``run`` is a coroutine function, found once per class.
    _run_is_async: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._run_is_async = inspect.iscoroutinefunction(cls.run)

    @property
    def is_async(self) -> bool:
        """Whether :meth:`run` is a coroutine function (run on the event loop)."""
        own = getattr(self, "__dict__", None)
        if own and "run" in own:  # a run set on the instance itself
            return inspect.iscoroutinefunction(own["run"])
        return self._run_is_async

    @property
    def completes_at_once(self) -> bool:
        """Whether :meth:`run` is a coroutine that never waits for anything.

        Such a call finishes in the step that starts it: nothing can cancel it
        or time it out meanwhile, so the loop runs it without the cancel scope
        and deadline of the tool timeout. False unless a subclass knows better
        (an ``@tool`` ``async def`` with no ``await``, ``async with`` or
        ``async for`` in its body says true).
        """
        return False

    def describe(self) -> dict[str, Any]:
        """``{"name", "description", "parameters"}``: what providers translate for their API."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"


@dataclass(slots=True, eq=False)
class AgentContext:
    """What the core exposes to providers and tools during one run.

    Attributes:
        tools: The agent's tools by name (spec 000 section 4, ``context.tools``).
        session: The session being served; its memory is :attr:`memory`.
        agent_name: The manifest's ``identity.name``.
        trace_id: The ``traceId`` shared by every event of this run.
        round: The provider call of this run, counting from 1 (0 for a slash command).
        instructions: The manifest's ``instructions``: a system prompt for
            providers backed by a language model.
        call_depth: How many agent-to-agent (MCP) calls deep this run is: 0 for
            an input from a user; a ``tools/call`` served at depth ``d`` runs
            its tool with ``d``, and a remote tool called from there sends
            ``d + 1`` (spec 004 section 4).
        text_sink: Where :meth:`emit_text_delta` sends text; set by the loop.
        generation: The generation parameters of the request being served
            (``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``,
            ``frequency_penalty``, ``presence_penalty``, ``model``): a
            provider maps those its API has, and names the others in its
            response's ``metadata["droppedParameters"]``. Empty when none.
    """

    tools: Mapping[str, Tool]
    session: Session
    agent_name: str = "openstarry"
    trace_id: str = ""
    round: int = 0
    instructions: str | None = None
    call_depth: int = 0
    text_sink: Callable[[str], None] | None = None
    generation: Mapping[str, Any] = field(default_factory=dict)
    #: The run's journal on a bus that keeps one (Redis): its completed steps, replayed
    #: when the run is handled again after a crash (``None`` elsewhere).
    journal: RunJournal | None = field(default=None, repr=False)
    #: The id of the input event this run serves (``""`` outside a run).
    run_id: str = ""
    #: The previous round's outcomes, kept by the run that owns this context
    #: (``None``: read from memory).
    _tool_results: tuple[ToolOutcome, ...] | None = field(default=None, init=False, repr=False)

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key of the tool call running now (in a tool's ``run``), else ``None``.

        The same on every attempt at the call: a run handled again after its
        worker died (a durable run, see :mod:`openstarry.agent.journal`) runs a
        tool whose outcome was not recorded again, with the same key. A tool with
        side effects passes it on (a payment API's ``Idempotency-Key`` header, a
        unique column) or remembers it, so the second attempt does nothing twice.
        It is ``"RUN_ID/TOOL_CALL_ID"``: :attr:`run_id` (the input event's id) and
        the call's id.
        """
        return TOOL_CALL_KEY.get()

    def emit_text_delta(self, text: str) -> None:
        """Pass on a piece of what the provider is saying as it streams in.

        A streaming provider calls this for each chunk of text, before
        ``generate`` returns the whole response; the loop publishes each as an
        ``OUTPUT:AGENT_MESSAGE_DELTA`` event, which the Agent API streams to its
        client. With nobody listening it does nothing. The returned response
        still carries the whole text: deltas are a preview, never the record.
        """
        if text and self.text_sink is not None:
            self.text_sink(text)

    def emit_progress(self, **fields: Any) -> None:
        """Tell the run's subscribers how a tool call that takes a while is going.

        Called from a tool's ``run``: the loop publishes an ``EXEC:TOOL_PROGRESS``
        event, a child of the call's ``EXEC:TOOL_CALL`` in the run's trace. Its
        payload is ``fields`` (JSON values; by convention ``text``, a piece of
        what a remote agent is saying, and ``state``, where its work stands)
        with the call's ``toolCallId`` and ``name``. An A2A agent called as a
        tool streams its answer this way. Progress is a preview, never the
        record: the call's result still carries everything, and a full bus
        drops a progress event rather than make the tool wait. Outside a tool's
        call it does nothing.
        """
        running = TOOL_PROGRESS.get()
        if running is not None:
            send, session_id, call_id, name = running
            send(session_id, call_id, name, fields)

    @property
    def memory(self) -> Memory:
        return self.session.memory

    @property
    def tool_results(self) -> tuple[ToolOutcome, ...]:
        """The outcomes of the tool calls the provider asked for in the previous round.

        In the order of the calls; empty on the first round of a run (and for a
        slash command). On a later round the memory ends with the provider's
        previous answer, its calls' outcomes and what the core observed (an
        unknown tool, bad arguments): this is those outcomes, so a provider
        can tell "the tools came back" without reading the memory's entries::

            async def generate(self, prompt, context):
                if context.tool_results:
                    return answer_from(context.tool_results)
                return call_a_tool(prompt)

        A failed call is here too (``success`` is false, ``error`` says why).
        During a run the run keeps them itself, so a provider that rewrites
        the memory (a summarizer) still gets them; outside a run they are read
        from the memory.
        """
        kept = self._tool_results
        if kept is not None:
            return kept
        return self.session.memory.tool_results()

    @property
    def session_id(self) -> str:
        return self.session.id
