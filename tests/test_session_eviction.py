"""Forgetting the least recently used session costs the same however many are kept."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import ItemsView, Iterator
from typing import Any

from openstarry.agent.results import Waiters
from openstarry.agent.sessions import SessionRuntime, Sessions


class _CountingDict(OrderedDict[str, SessionRuntime]):
    """An OrderedDict that counts the items its ``items()`` walks hand out."""

    steps = 0

    def items(self) -> Any:
        outer = self
        base: ItemsView[str, SessionRuntime] = super().items()

        class _View:
            def __iter__(self) -> Iterator[tuple[str, SessionRuntime]]:
                for item in base:
                    outer.steps += 1
                    yield item

        return _View()


async def _serve(rt: SessionRuntime, event: Any, text: str | None) -> None:  # pragma: no cover
    raise AssertionError("no input is served here")


def _full(count: int) -> tuple[Sessions, _CountingDict]:
    sessions = Sessions(
        _serve, Waiters(), memory_window=4, max_sessions=count, max_pending_inputs=4
    )
    counting = _CountingDict()
    sessions._by_id = counting
    for index in range(count):
        sessions.get(f"s{index}")
    return sessions, counting


def test_a_new_session_in_a_full_table_looks_at_one_session() -> None:
    sessions, counting = _full(10_000)
    counting.steps = 0
    sessions.get("newcomer")
    assert counting.steps <= 2
    assert "s0" not in counting
    assert "newcomer" in counting
    assert len(counting) == 10_000
    # The one used most recently survives; the next least recently used goes next.
    sessions.get("s1")
    sessions.get("another")
    assert "s1" in counting
    assert "s2" not in counting


def test_locked_sessions_are_spared_while_another_can_go() -> None:
    sessions, counting = _full(100)
    for index in range(10):
        counting[f"s{index}"].session.locked = True
    sessions.get("newcomer")
    assert "s0" in counting
    assert "s10" not in counting
    # Only locked ones left to forget: the least recently used of them goes.
    sessions, counting = _full(3)
    for rt in counting.values():
        rt.session.locked = True
    sessions.get("newcomer")
    assert list(counting) == ["s1", "s2", "newcomer"]


def test_busy_sessions_are_never_forgotten() -> None:
    sessions, counting = _full(3)
    for rt in counting.values():
        rt.running = True
    sessions.get("newcomer")
    assert list(counting) == ["s0", "s1", "s2", "newcomer"]
