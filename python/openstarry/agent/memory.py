"""A session's memory: what the provider sees of the conversation so far.

Memory is a list of entries, oldest first, of four kinds: the user's turns, the
assistant's turns (its text and the tool calls it asked for), the outcome of
each tool call, and system observations (what the core tells the provider, such
as "that tool does not exist"). Provider adapters translate it into the message
list of their API, pairing each :class:`ToolOutcome` with the call of the same
``tool_call_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeVar

from openstarry._core import SlotsMaker
from openstarry.core import ContentSegment, ToolCall
from openstarry.events import AgentState

__all__ = [
    "AssistantTurn",
    "Memory",
    "MemoryEntry",
    "Observation",
    "Session",
    "ToolFailure",
    "ToolOutcome",
    "UserTurn",
]


_Entry = TypeVar("_Entry")


def _quick_init(cls: type[_Entry]) -> type[_Entry]:
    """Give a frozen, slotted dataclass an ``__init__`` that sets each slot through its descriptor.

    The ``__init__`` that ``dataclass(frozen=True)`` writes sets each field with
    ``object.__setattr__``, looked up field by field: a ``ToolOutcome`` cost
    about twice what this one does, and a turn makes four entries. The
    signature, the defaults and everything else of the dataclass stay as they were.
    """
    namespace: dict[str, Any] = {}
    params: list[str] = []
    body: list[str] = []
    for f in fields(cls):  # type: ignore[arg-type]
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(source, namespace)  # the source is built above from the fields. names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@_quick_init
@dataclass(frozen=True, slots=True)
class UserTurn:
    """What the user said."""

    text: str
    role: Literal["user"] = "user"


@_quick_init
@dataclass(frozen=True, slots=True)
class AssistantTurn:
    """What the provider answered: its text (may be empty) and its tool calls, in order.

    ``reasoning`` holds the answer's ``reasoning`` segments (its thinking or
    their summaries), with the signatures and encrypted reasoning a provider
    asks to be handed back on the next round.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: tuple[ContentSegment, ...] = ()
    role: Literal["assistant"] = "assistant"


@_quick_init
@dataclass(frozen=True, slots=True)
class ToolFailure:
    """Why a tool call failed: the ``error`` object of an ``EXEC:TOOL_RESULT``."""

    code: str
    message: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "source": self.source}


@_quick_init
@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The outcome of one tool call: its result on success, its ``error`` otherwise."""

    tool_call_id: str
    name: str
    success: bool
    result: Any = None
    error: ToolFailure | None = None
    role: Literal["tool"] = "tool"


@_quick_init
@dataclass(frozen=True, slots=True)
class Observation:
    """A system observation for the provider (spec 000 section 7), such as an unknown tool."""

    text: str
    role: Literal["system"] = "system"


MemoryEntry = UserTurn | AssistantTurn | ToolOutcome | Observation


def slots_maker(cls: type[_Entry]) -> Callable[..., _Entry]:
    """``cls(*values)`` for a slotted dataclass whose ``__init__`` only stores
    its fields, in one call into Rust (:class:`openstarry._core.SlotsMaker`).

    The trailing fields that have a plain default may be left out, as with
    the constructor; any other field must be given (a ``default_factory``'s
    value, made once, would be shared). A frozen
    dataclass's ``__init__`` sets each field through its slot's descriptor, a
    call each: the loop makes its memory entries, its run's context and its
    result this way, several times cheaper. (Measured under callgrind: a
    ``ToolOutcome`` of six fields cost 5,700 instructions to make by its
    constructor, a ``UserTurn`` 2,900; the turn benchmark's turn went from
    132,700 to 120,400 instructions when these were made this way. The
    instance is the constructor's: equal, same hash and repr, still frozen.)
    """
    names: list[str] = []
    defaults: list[Any] = []
    for f in fields(cls):  # type: ignore[arg-type]
        names.append(f.name)
        if f.default is not MISSING:
            defaults.append(f.default)
        else:
            defaults.clear()  # (only the trailing ones)
    return SlotsMaker(cls, tuple(names), tuple(defaults))


#: ``UserTurn(text)``, in one call.
new_user_turn: Callable[[str], UserTurn] = slots_maker(UserTurn)
#: ``AssistantTurn(text, tool_calls, reasoning)``, in one call.
new_assistant_turn: Callable[
    [str, tuple[ToolCall, ...], tuple[ContentSegment, ...]], AssistantTurn
] = slots_maker(AssistantTurn)
#: ``ToolOutcome(tool_call_id, name, success, result[, error])``, in one call.
new_tool_outcome: Callable[..., ToolOutcome] = slots_maker(ToolOutcome)


class Memory(Sequence[MemoryEntry]):
    """A session's entries, oldest first, bounded by ``window`` user turns.

    When a new user turn would exceed the window, the oldest turns are dropped
    whole (a user turn with everything that followed it up to the next user
    turn), so a tool outcome never loses the call it answers.
    """

    __slots__ = ("_entries", "_turn_starts", "add", "add_all", "window")

    def __init__(self, window: int | None = None) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._entries: list[MemoryEntry] = []
        # Index in _entries of each UserTurn, oldest first.
        self._turn_starts: list[int] = []
        #: Appends an entry that starts no turn (not a :class:`UserTurn`): what
        #: :meth:`append` does with it, without a call of its own (the turn's
        #: loop appends a few such entries each round).
        self.add: Callable[[MemoryEntry], None] = self._entries.append
        #: :meth:`extend` for entries none of which is a :class:`UserTurn`.
        self.add_all: Callable[[Iterable[MemoryEntry]], None] = self._entries.extend

    def __getstate__(self) -> tuple[int | None, list[MemoryEntry], list[int]]:
        # (add and add_all are bound to the entries: a copy binds its own.)
        return self.window, self._entries, self._turn_starts

    def __setstate__(self, state: tuple[int | None, list[MemoryEntry], list[int]]) -> None:
        self.window, self._entries, self._turn_starts = state
        self.add = self._entries.append
        self.add_all = self._entries.extend

    def append(self, entry: MemoryEntry) -> None:
        entries = self._entries
        if type(entry) is UserTurn:
            starts = self._turn_starts
            window = self.window
            if window is not None and len(starts) >= window:
                # Keep the last window - 1 turns; the new one makes window.
                if window == 1:
                    entries.clear()
                    starts.clear()
                else:
                    cut = starts[len(starts) - window + 1]
                    del entries[:cut]
                    self._turn_starts = starts = [i - cut for i in starts if i >= cut]
            starts.append(len(entries))
        entries.append(entry)

    def extend(self, entries: Sequence[MemoryEntry]) -> None:
        for entry in entries:
            self.append(entry)

    def clear(self) -> None:
        self._entries.clear()
        self._turn_starts.clear()

    def tool_results(self) -> tuple[ToolOutcome, ...]:
        """The outcomes that follow the last assistant turn, in order.

        Empty when the entries since the latest user turn hold no assistant
        turn followed by outcomes (what :attr:`AgentContext.tool_results
        <openstarry.agent.interfaces.AgentContext.tool_results>` reads).
        """
        entries = self._entries
        found: list[ToolOutcome] = []
        for i in range(len(entries) - 1, -1, -1):
            entry = entries[i]
            kind = type(entry)
            if kind is ToolOutcome:
                found.append(entry)  # type: ignore[arg-type]
            elif kind is AssistantTurn:
                break
            elif kind is not Observation:
                return ()  # the user's turn: no round of this run has called tools yet
        else:
            return ()
        found.reverse()
        return tuple(found)

    def current_turn(self) -> Sequence[MemoryEntry]:
        """The entries from the latest user turn on (all of them when there is none)."""
        start = self._turn_starts[-1] if self._turn_starts else 0
        return self._entries[start:]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[MemoryEntry]:
        return iter(self._entries)

    def __getitem__(self, index: Any) -> Any:
        return self._entries[index]

    def __repr__(self) -> str:
        return f"Memory({len(self._entries)} entries, window={self.window})"


@dataclass(slots=True, eq=False)
class Session:
    """One conversation, isolated from the others by its ``id`` (the events' ``sessionId``)."""

    id: str
    memory: Memory = field(default_factory=Memory)
    state: AgentState = AgentState.IDLE
    #: Consecutive failed tool calls, across rounds and inputs; reset by a success or ``/reset``.
    failure_streak: int = 0
    #: Set when ``failure_streak`` reaches the limit: inputs are refused until ``/reset``.
    locked: bool = False
