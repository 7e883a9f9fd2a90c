"""Providers for your own tests: answers you script, or a function you write.

:class:`ScriptedProvider` plays back a list of answers, one per ``generate``
call (once, or over and over with ``cycle=True``); :class:`FunctionProvider`
asks a function of yours. Both record the calls they receive in ``calls``: the
last 100 by default, ``record=0`` for none (a benchmark, a long soak),
``record=None`` for every one. The helpers :func:`text`, :func:`tool_call`
and :func:`tool_calls` build the responses::

    from openstarry.testing import ScriptedProvider, text, tool_call

    provider = ScriptedProvider([
        tool_call("get_weather", {"location": "Taipei"}, text="Sure, let me check."),
        text("The weather in Taipei is 25°C, Sunny."),
    ])
    # ... run the agent with it, then:
    assert provider.call_count == len(provider.calls) == 2
    prompt, memory, round = provider.calls[1]

An answer may be a :class:`~openstarry.core.ProviderResponse`, a ``str`` (one
text segment), a ``dict`` in the wire form of spec 000 (``{"segments": [...]}``),
an exception instance (raised by ``generate``), or, in a script, a function
``(prompt, context)`` returning any of those, sync or ``async``.

A provider function tells the rounds of a run apart by ``context.tool_results``:
empty on the first round, the outcomes of the tools it asked for on the next::

    def model(prompt: str, context: AgentContext) -> ProviderResponse:
        if not context.tool_results:
            return tool_call("add_one", {"x": 1})
        return text(f"the answer is {context.tool_results[0].result}")
"""

from __future__ import annotations

import inspect
import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeAlias

import anyio
import anyio.lowlevel

from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import MemoryEntry
from openstarry.agent.tools import cannot_wait
from openstarry.core import ContentSegment, ProviderResponse, ToolCall, decode_response
from openstarry.errors import OpenStarryError

__all__ = [
    "Answer",
    "DEFAULT_RECORD",
    "CallSpec",
    "FunctionProvider",
    "ProviderCall",
    "ScriptExhausted",
    "ScriptItem",
    "ScriptedProvider",
    "text",
    "tool_call",
    "tool_calls",
]

#: What a scripted item or a provider function may give: a response, its text,
#: its wire form, or an exception to raise.
Answer: TypeAlias = ProviderResponse | str | Mapping[str, Any] | BaseException
#: One call for :func:`tool_calls`: a ``ToolCall``, ``(name, args)`` or ``(name, args, id)``.
CallSpec: TypeAlias = (
    ToolCall | tuple[str, Mapping[str, Any] | None] | tuple[str, Mapping[str, Any] | None, Any]
)
#: One item of a :class:`ScriptedProvider`'s script: an answer, or a function making one.
ScriptItem: TypeAlias = Answer | Callable[[str, AgentContext], Answer | Awaitable[Answer]]


class ProviderCall(NamedTuple):
    """One ``generate`` call a test provider received.

    Attributes:
        prompt: The prompt it was given.
        memory: The session's memory entries at the time of the call, oldest first.
        round: ``context.round``: the provider call of the run, from 1.
    """

    prompt: str
    memory: tuple[MemoryEntry, ...]
    round: int


class ScriptExhausted(OpenStarryError, AssertionError):
    """A :class:`ScriptedProvider` was called after it had given every scripted answer.

    It is an :class:`AssertionError`, so pytest reports it as a failed expectation.
    """


def text(content: str, *, metadata: Any = None) -> ProviderResponse:
    """A response of one text segment.

    Example::

        text("Hello!")  # {"segments": [{"type": "text", "text": "Hello!"}]}
    """
    return ProviderResponse.of_text(content, metadata)


def tool_call(
    name: str,
    args: Mapping[str, Any] | None = None,
    *,
    id: str | None = None,
    text: str | None = None,
    metadata: Any = None,
) -> ProviderResponse:
    """A response that calls one tool, after a text segment when ``text`` is given.

    ``id`` defaults to a fresh UUID, as the core does for a call without one.

    Example::

        tool_call("get_weather", {"location": "Taipei"}, text="Sure, let me check.")
    """
    return ProviderResponse.of_tool_call(
        name, dict(args) if args is not None else None, id, text, metadata
    )


def tool_calls(
    calls: Iterable[CallSpec],
    text: str | None = None,
    *,
    metadata: Any = None,
) -> ProviderResponse:
    """A response that calls several tools in order, after a text segment when ``text`` is given.

    Each call is a :class:`~openstarry.core.ToolCall`, ``(name, args)`` or ``(name, args, id)``.

    Example::

        tool_calls([("get_weather", {"location": "Taipei"}), ("fs.read", {"path": "a.txt"})])
    """
    segments: list[ContentSegment] = []
    if text is not None:
        segments.append(ContentSegment("text", text=text))
    for call in calls:
        if not isinstance(call, ToolCall):
            name, args, *rest = call
            call = ToolCall(
                name, dict(args) if args is not None else None, rest[0] if rest else None
            )
        segments.append(ContentSegment("tool_call", tool_call=call))
    return ProviderResponse(segments, metadata)


#: Calls a test provider keeps in ``calls`` unless told otherwise.
DEFAULT_RECORD = 100


def _check_record(record: int | None) -> int | None:
    if record is not None and (isinstance(record, bool) or not isinstance(record, int)):
        raise TypeError(f"record must be an int or None, not {type(record).__name__}")
    if record is not None and record < 0:
        raise ValueError(f"record must be 0 or more (or None), not {record}")
    return record


class _RecordingProvider:
    """What both test providers share: a name, the calls received, and answer conversion."""

    name: str

    #: ``generate`` never waits but for what a function answer returns to
    #: await, and it waits first at a plain checkpoint (see :meth:`_wait_for`):
    #: a run served in its asker's task enters its cancel scope only then
    #: (:attr:`Provider.completes_at_once <openstarry.agent.interfaces.Provider>`).
    completes_at_once = True

    def __init__(self, name: str, record: int | None) -> None:
        self.name = name
        self._keep = _check_record(record)
        #: The last ``record`` ``generate`` calls, oldest first (all of them when
        #: ``record`` is ``None``, none when it is 0).
        self.calls: deque[ProviderCall] = deque(maxlen=self._keep)
        #: How many ``generate`` calls it has received, recorded or not.
        self.call_count = 0

    def _record(self, prompt: str, context: AgentContext) -> None:
        self.call_count += 1
        if self._keep != 0:
            self.calls.append(ProviderCall(prompt, tuple(context.memory), context.round))

    async def _answer(self, item: object, prompt: str, context: AgentContext) -> ProviderResponse:
        """A script item's answer: the item, or what a function item returns."""
        if callable(item) and not isinstance(item, BaseException):
            item = item(prompt, context)
            if inspect.isawaitable(item):
                item = await self._wait_for(item)
        return self._convert(item)

    @staticmethod
    async def _wait_for(answer: Awaitable[Any]) -> Any:
        """Await a function's answer, after a plain checkpoint.

        The answer may enter cancel scopes of its own before it waits: the
        checkpoint lets the run enter its own first (``completes_at_once``).
        """
        await anyio.lowlevel.checkpoint()
        return await answer

    def _convert(self, item: object) -> ProviderResponse:
        if type(item) is ProviderResponse:
            return item
        if isinstance(item, ProviderResponse):
            return item
        if isinstance(item, str):
            return text(item)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Mapping):
            return decode_response(json.dumps(dict(item)).encode())
        to_core = getattr(item, "to_core", None)  # openstarry.protocol.ProviderResponse
        if callable(to_core):
            converted = to_core()
            if isinstance(converted, ProviderResponse):
                return converted
        raise TypeError(
            f"{type(self).__name__} {self.name!r}: an answer must be a ProviderResponse, "
            f"a str, a dict or an exception, not {type(item).__name__}"
        )


class ScriptedProvider(_RecordingProvider):
    """Gives the scripted answers in order, one per ``generate`` call.

    Args:
        responses: The script; see the module doc for what an item may be. A
            function item is called with ``(prompt, context)`` when its turn comes.
        name: The provider's ``name``.
        cycle: Start the script over after its last answer, for ever (a
            benchmark's or a soak test's endless turns), instead of raising
            :class:`ScriptExhausted`.
        record: How many calls :attr:`calls` keeps, the latest ones (default
            100); ``0`` records none, ``None`` every one.

    Attributes:
        calls: A :class:`ProviderCall` ``(prompt, memory, round)`` for each of
            the last ``record`` ``generate`` calls, including one that raised.
        call_count: Every ``generate`` call so far, recorded or not.

    Raises:
        ScriptExhausted: from ``generate`` once every answer has been given
            (never with ``cycle=True``).
        ValueError: ``cycle=True`` with an empty script, or a negative ``record``.

    Example::

        provider = ScriptedProvider(["first", {"segments": [{"type": "text", "text": "second"}]}])
        assert provider.remaining == 2
        endless = ScriptedProvider([tool_call("add_one", {"x": 1}), "done"], cycle=True, record=0)
    """

    def __init__(
        self,
        responses: Iterable[ScriptItem],
        *,
        name: str = "scripted",
        cycle: bool = False,
        record: int | None = DEFAULT_RECORD,
    ) -> None:
        super().__init__(name, record)
        self._script: tuple[ScriptItem, ...] = tuple(responses)
        if cycle and not self._script:
            raise ValueError("ScriptedProvider(cycle=True) needs at least one response")
        self.cycle = bool(cycle)
        self._next = 0

    @property
    def remaining(self) -> int:
        """How many scripted answers are left (with ``cycle=True``: before it starts over)."""
        return len(self._script) - self._next

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        """The next scripted answer (raised when it is an exception)."""
        self._record(prompt, context)
        script = self._script
        if self._next >= len(script):
            count = len(script)
            raise ScriptExhausted(
                f"ScriptedProvider {self.name!r} had {count} response{'' if count == 1 else 's'}, "
                f"all given; call {self.call_count} (prompt {prompt!r}, round {context.round}) "
                "has none"
            )
        item = script[self._next]
        self._next += 1
        if self.cycle and self._next == len(script):
            self._next = 0
        return await self._answer(item, prompt, context)

    def __repr__(self) -> str:
        cycle = ", cycle=True" if self.cycle else ""
        return f"ScriptedProvider(name={self.name!r}, remaining={self.remaining}{cycle})"


class FunctionProvider(_RecordingProvider):
    """Answers each ``generate`` call with ``fn(prompt, context)``, sync or ``async``.

    ``fn`` returns a :class:`~openstarry.core.ProviderResponse`, a ``str`` or a
    wire-form ``dict`` (an exception instance it returns is raised). A sync ``fn``
    runs on the event loop: keep it quick.

    Args:
        fn: The function.
        name: The provider's ``name``.
        record: How many calls :attr:`calls` keeps, the latest ones (default
            100); ``0`` records none, ``None`` every one.

    Attributes:
        calls: A :class:`ProviderCall` for each of the last ``record`` ``generate`` calls.
        call_count: Every ``generate`` call so far, recorded or not.

    Example::

        def echo(prompt: str, context: AgentContext) -> str:
            return f"you said {prompt!r} in round {context.round}"

        provider = FunctionProvider(echo)
    """

    def __init__(
        self,
        fn: Callable[[str, AgentContext], Answer | Awaitable[Answer]],
        *,
        name: str = "function",
        record: int | None = DEFAULT_RECORD,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionProvider needs a callable, not {fn!r}")
        super().__init__(name, record)
        self.fn = fn
        #: An ``async def`` that never waits: its answer needs no checkpoint first.
        self._never_waits = cannot_wait(fn)

    async def generate(self, prompt: str, context: AgentContext) -> ProviderResponse:
        """What ``fn(prompt, context)`` returns, as a response."""
        self.call_count += 1
        if self._keep != 0:
            self.calls.append(ProviderCall(prompt, tuple(context.memory), context.round))
        answer = self.fn(prompt, context)
        if type(answer) is ProviderResponse:
            return answer
        if inspect.isawaitable(answer):
            answer = await (answer if self._never_waits else self._wait_for(answer))
        return self._convert(answer)

    def __repr__(self) -> str:
        return f"FunctionProvider({self.fn!r}, name={self.name!r})"
