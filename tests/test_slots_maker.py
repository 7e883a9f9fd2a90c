"""``SlotsMaker`` and ``slots_maker``: an instance of a slotted dataclass, made in
one call into Rust, is the instance its constructor makes."""

from __future__ import annotations

import dataclasses
import gc
import pickle
import sys
from typing import Any

import pytest

from openstarry._core import SlotsMaker
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import (
    AssistantTurn,
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    UserTurn,
    new_assistant_turn,
    new_tool_outcome,
    new_user_turn,
    slots_maker,
)
from openstarry.agent.results import RunResult
from openstarry.core import ContentSegment, ToolCall

CALL = ToolCall("f", {"x": 1}, "c1")
THOUGHT = (ContentSegment("reasoning", text="hm"),)
FAILURE = ToolFailure("NOPE", "it says no", "tool")


@pytest.mark.parametrize(
    ("made", "constructed"),
    [
        (lambda: new_user_turn("hi"), lambda: UserTurn("hi")),
        (
            lambda: new_assistant_turn("ok", (CALL,), THOUGHT),
            lambda: AssistantTurn("ok", (CALL,), THOUGHT),
        ),
        (lambda: new_tool_outcome("c1", "f", True, 2), lambda: ToolOutcome("c1", "f", True, 2)),
        (
            lambda: new_tool_outcome("c1", "f", False, None, FAILURE),
            lambda: ToolOutcome("c1", "f", False, error=FAILURE),
        ),
        (lambda: slots_maker(Observation)("seen"), lambda: Observation("seen")),
    ],
    ids=["user", "assistant", "outcome", "failure", "observation"],
)
def test_a_made_entry_is_the_constructed_one(made: Any, constructed: Any) -> None:
    entry, expected = made(), constructed()
    assert type(entry) is type(expected)
    assert entry == expected
    try:
        expected_hash = hash(expected)
    except TypeError:  # (a ToolCall is not hashable: neither is its turn)
        with pytest.raises(TypeError):
            hash(entry)
    else:
        assert hash(entry) == expected_hash
    assert repr(entry) == repr(expected)
    for f in dataclasses.fields(expected):
        assert getattr(entry, f.name) is getattr(expected, f.name) or (
            getattr(entry, f.name) == getattr(expected, f.name)
        )
    try:
        pickled = pickle.dumps(expected)
    except TypeError:  # (nor can it be pickled)
        with pytest.raises(TypeError):
            pickle.dumps(entry)
    else:
        assert pickle.dumps(entry) == pickled
        assert pickle.loads(pickle.dumps(entry)) == expected
    assert gc.is_tracked(entry) == gc.is_tracked(expected)
    # Still frozen.
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.role = "x"


def test_a_field_with_a_default_factory_must_be_given() -> None:
    new_result = slots_maker(RunResult)
    with pytest.raises(TypeError, match="RunResult takes 2 to 5 values, not 1"):
        new_result("t")
    one, two = new_result("t", []), new_result("t", [])
    assert one == RunResult("t")
    one.replies.append("mine")
    assert two.replies == []  # not shared


def test_a_made_context_is_the_constructed_one() -> None:
    session = Session("s")
    new_context = slots_maker(AgentContext)
    made = new_context({}, session, "a", "t", 3, "be brief", 1, None, {})
    built = AgentContext({}, session, "a", "t", 3, "be brief", call_depth=1)
    assert [getattr(made, f.name) for f in dataclasses.fields(AgentContext)] == [
        getattr(built, f.name) for f in dataclasses.fields(AgentContext)
    ]
    assert made.tool_results == built.tool_results == ()


def test_the_values_are_held_once_and_let_go() -> None:
    value = object()
    before = sys.getrefcount(value)
    entries = [new_tool_outcome("c", "f", True, value) for _ in range(100)]
    assert sys.getrefcount(value) == before + 100
    del entries
    assert sys.getrefcount(value) == before


class _OwnNew:
    __slots__ = ("x",)

    def __new__(cls) -> _OwnNew:
        return super().__new__(cls)


class _NoSlots:
    pass


class _Slots:
    __slots__ = ("x", "y")


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((int, ("x",)), TypeError, "object.__new__, not int"),
        ((_OwnNew, ("x",)), TypeError, "object.__new__"),
        ((_NoSlots, ("x",)), TypeError, "__slots__"),
        ((_Slots, ("x", "z")), TypeError, "has no slot z"),
        ((_Slots, ("x",), (1, 2)), ValueError, "2 defaults for 1 fields"),
        ((_Slots, (1,)), TypeError, ""),
    ],
)
def test_what_a_maker_refuses(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match or None):
        SlotsMaker(*args)


def test_a_call_gives_the_values_it_needs() -> None:
    maker = SlotsMaker(_Slots, ("x", "y"), (9,))
    made = maker(1)
    assert (made.x, made.y) == (1, 9)
    assert maker(1, 2).y == 2
    with pytest.raises(TypeError, match="_Slots takes 1 to 2 values, not 3"):
        maker(1, 2, 3)
    with pytest.raises(TypeError, match="not 0"):
        maker()
    assert repr(maker) == "SlotsMaker(_Slots)"
