"""``Memory``: its window of user turns, and the entries a round adds."""

from __future__ import annotations

import copy
import pickle

import pytest

from openstarry.agent.memory import (
    AssistantTurn,
    Memory,
    Observation,
    ToolOutcome,
    UserTurn,
)


def _turn(memory: Memory, n: int) -> None:
    memory.append(UserTurn(f"u{n}"))
    memory.add(AssistantTurn(f"a{n}"))
    memory.add_all([ToolOutcome(f"c{n}", "f", True, n), Observation(f"o{n}")])


def test_add_and_add_all_append_as_append_and_extend_do() -> None:
    added, appended = Memory(2), Memory(2)
    for n in range(4):
        _turn(added, n)
        appended.append(UserTurn(f"u{n}"))
        appended.append(AssistantTurn(f"a{n}"))
        appended.extend([ToolOutcome(f"c{n}", "f", True, n), Observation(f"o{n}")])
    assert list(added) == list(appended)
    # The window counts user turns only: the last two are kept whole.
    assert [e.text for e in added if type(e) is UserTurn] == ["u2", "u3"]
    assert len(added) == 8
    assert added.tool_results() == (ToolOutcome("c3", "f", True, 3),)


def test_a_cleared_memory_still_adds_to_its_entries() -> None:
    memory = Memory(1)
    _turn(memory, 0)
    memory.clear()
    _turn(memory, 1)
    assert [type(e).__name__ for e in memory] == [
        "UserTurn",
        "AssistantTurn",
        "ToolOutcome",
        "Observation",
    ]


@pytest.mark.parametrize(
    "duplicate",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
    ids=["deepcopy", "pickle"],
)
def test_a_copy_adds_to_its_own_entries(duplicate: object) -> None:
    memory = Memory(3)
    _turn(memory, 0)
    other = duplicate(memory)  # type: ignore[operator]
    assert list(other) == list(memory)
    assert other.window == 3
    other.add(AssistantTurn("only in the copy"))
    other.append(UserTurn("and this"))
    assert len(memory) == 4
    assert len(other) == 6
    memory.add_all([Observation("only in the first")])
    assert len(other) == 6


@pytest.mark.parametrize("window", [1, 2, 3, None])
def test_the_window_keeps_the_last_turns_whole(window: int | None) -> None:
    memory = Memory(window)
    for n in range(7):
        _turn(memory, n)
        kept = n + 1 if window is None else min(n + 1, window)
        assert [e.text for e in memory if type(e) is UserTurn] == [
            f"u{i}" for i in range(n + 1 - kept, n + 1)
        ]
        assert len(memory) == 4 * kept
        assert type(memory[0]) is UserTurn
