"""DedupWindow: exact sliding-window de-duplication, eviction, snapshots.

A hypothesis state machine checks every call against :class:`RefDedup`, a
plain-Python model of the same rules.
"""

from __future__ import annotations

import re
import struct
import threading
import uuid
from collections import Counter, deque
from collections.abc import Iterable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from openstarry._core import DedupWindow
from openstarry.errors import DecodeError, OpenStarryError

T0 = 1_700_000_000_000  # a realistic wall-clock time in ms


# --- Basics ---------------------------------------------------------------------------


def test_defaults() -> None:
    w = DedupWindow()
    assert w.window_ms == 60_000
    assert w.max_entries == 1_000_000
    assert len(w) == 0


def test_first_sight_is_new_then_duplicate() -> None:
    w = DedupWindow(window_ms=1000, max_entries=10)
    assert w.check_and_insert("a", T0) is True
    assert w.check_and_insert("a", T0) is False
    assert w.check_and_insert("b", T0) is True
    assert w.check_and_insert("a", T0 + 1) is False
    assert len(w) == 2


def test_wall_clock_by_default() -> None:
    w = DedupWindow()
    assert w.check_and_insert("a") is True
    assert w.check_and_insert("a") is False
    assert "a" in w


def test_a_duplicate_within_the_window_then_new_again_at_its_end() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    assert w.check_and_insert("a", T0)
    # A duplicate for now in [T0, T0 + 100).
    assert not w.check_and_insert("a", T0 + 1)
    assert not w.check_and_insert("a", T0 + 99)
    # New again from T0 + 100 on, and then a duplicate for another window.
    assert w.check_and_insert("a", T0 + 100)
    assert not w.check_and_insert("a", T0 + 199)
    assert w.check_and_insert("a", T0 + 200)


def test_a_duplicate_does_not_refresh_the_entry() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    assert w.check_and_insert("a", T0)
    for t in range(T0 + 10, T0 + 100, 10):
        assert not w.check_and_insert("a", t)
    # Seen many times since, but first seen at T0: new again at T0 + 100.
    assert w.check_and_insert("a", T0 + 100)


def test_time_going_backwards_counts_as_no_time_passing() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    assert w.check_and_insert("a", T0 + 50)
    # Earlier times are clamped to T0 + 50: "b" is recorded as first seen then.
    assert w.check_and_insert("b", T0)
    assert not w.check_and_insert("a", T0)
    assert not w.check_and_insert("b", T0 + 149)
    assert w.check_and_insert("b", T0 + 150)
    assert w.check_and_insert("a", T0 + 150)


def test_expire_drops_old_entries() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    w.check_and_insert("a", T0)
    w.check_and_insert("b", T0 + 10)
    w.check_and_insert("c", T0 + 20)
    assert w.expire(T0 + 99) == 0
    assert len(w) == 3
    assert w.expire(T0 + 110) == 2  # a (T0) and b (T0 + 10)
    assert len(w) == 1
    assert "a" not in w
    assert "b" not in w
    assert "c" in w
    assert w.expire(T0 + 110) == 0
    assert w.expire(T0) == 0  # earlier: no time passes
    assert w.expire(T0 + 1_000_000) == 1
    assert len(w) == 0


def test_expire_with_the_wall_clock() -> None:
    w = DedupWindow(window_ms=1000, max_entries=10)
    w.check_and_insert("a", 1)  # far in the past
    assert w.expire() == 1
    assert len(w) == 0


def test_max_entries_evicts_the_oldest_first() -> None:
    w = DedupWindow(window_ms=10_000, max_entries=3)
    for i, name in enumerate("abc"):
        assert w.check_and_insert(name, T0 + i)
    assert len(w) == 3
    assert w.check_and_insert("d", T0 + 3)  # evicts a
    assert len(w) == 3
    assert "a" not in w
    assert all(x in w for x in "bcd")
    assert not w.check_and_insert("b", T0 + 4)  # still held: a duplicate does not reorder
    assert w.check_and_insert("a", T0 + 5)  # a was forgotten: new, and evicts b
    assert "b" not in w
    assert [x in w for x in "abcd"] == [True, False, True, True]


def test_max_entries_of_one() -> None:
    w = DedupWindow(window_ms=10_000, max_entries=1)
    assert w.check_and_insert("a", T0)
    assert not w.check_and_insert("a", T0)
    assert w.check_and_insert("b", T0)
    assert w.check_and_insert("a", T0)
    assert len(w) == 1


def test_uuid_ids_are_case_insensitive() -> None:
    w = DedupWindow(window_ms=1000, max_entries=100)
    u = str(uuid.uuid4())
    assert w.check_and_insert(u, T0)
    assert not w.check_and_insert(u.upper(), T0)
    mixed = "".join(c.upper() if i % 2 else c for i, c in enumerate(u))
    assert not w.check_and_insert(mixed, T0)
    assert u.upper() in w
    assert w.check_and_insert(str(uuid.uuid4()).upper(), T0)
    assert len(w) == 2


def test_uuid_ids_that_differ_in_one_digit_are_distinct() -> None:
    w = DedupWindow(window_ms=1000, max_entries=100)
    base = "123e4567-e89b-12d3-a456-426614174000"
    assert w.check_and_insert(base, T0)
    for i, c in enumerate(base):
        if c == "-":
            continue
        other = base[:i] + ("1" if c != "1" else "2") + base[i + 1 :]
        assert w.check_and_insert(other, T0), other
    assert len(w) == 33


def test_non_canonical_uuid_forms_are_other_ids() -> None:
    w = DedupWindow(window_ms=1000, max_entries=100)
    u = "123e4567-e89b-12d3-a456-426614174abc"
    assert w.check_and_insert(u, T0)
    for other in [
        u.replace("-", ""),
        "{" + u + "}",
        "urn:uuid:" + u,
        u + " ",
        " " + u,
        u[:-1],
        u + "0",
        "123e4567-e89b-12d3-a456-42661417zabc",  # not hex
        "123e4567e-89b-12d3-a456-426614174abc",  # hyphen misplaced
    ]:
        assert w.check_and_insert(other, T0), other
    # Held whole, so case matters for them.
    assert w.check_and_insert(u.replace("-", "").upper(), T0)
    assert not w.check_and_insert(u.replace("-", ""), T0)


def test_other_ids_are_exact() -> None:
    w = DedupWindow(window_ms=1000, max_entries=1000)
    ids = [
        "evt-1",
        "evt-2",
        "EVT-1",
        "evt-1 ",
        "evt-",
        "evt-10",
        "é",
        "e\u0301",
        "a\x00b",
        "a\x00c",
    ]
    assert w.check_and_insert_many(ids, T0) == [True] * len(ids)
    assert w.check_and_insert_many(ids, T0) == [False] * len(ids)


def test_long_ids_that_differ_by_one_byte_are_distinct() -> None:
    w = DedupWindow(window_ms=1000, max_entries=1000)
    long = "x" * 10_000
    variants = [long, long[:-1] + "y", "y" + long[1:], long[:5000] + "y" + long[5001:], long + "x"]
    assert w.check_and_insert_many(variants, T0) == [True] * len(variants)
    assert not w.check_and_insert(long, T0)
    assert w.check_and_insert(long[:-1], T0)


def test_check_and_insert_many_is_check_and_insert_in_order() -> None:
    w = DedupWindow(window_ms=100, max_entries=3)
    assert w.check_and_insert_many(["a", "b", "a", "c", "d", "b"], T0) == [
        True,
        True,
        False,
        True,
        True,  # evicts a
        False,
    ]
    assert w.check_and_insert_many(iter(["a", "c"]), T0) == [True, False]  # a evicts b
    assert w.check_and_insert_many([], T0) == []
    assert w.check_and_insert_many((x for x in ["b"]), T0 + 100) == [True]


def test_check_and_insert_many_takes_any_iterable_of_str() -> None:
    """A tuple, a deque, a generator, a dict's keys and a str subclass all work like a list."""

    class Id(str):
        pass

    batches: list[Iterable[str]] = [
        ("a", "b", "a"),
        deque(["a", "b", "a"]),
        (x for x in ["a", "b", "a"]),
        [Id("a"), Id("b"), "a"],
    ]
    for batch in batches:
        w = DedupWindow(window_ms=100, max_entries=10)
        assert w.check_and_insert_many(batch, T0) == [True, True, False]
        assert "a" in w
        assert "b" in w
    w = DedupWindow(window_ms=100, max_entries=10)
    assert w.check_and_insert_many(dict.fromkeys(["a", "b"]).keys(), T0) == [True, True]


def test_check_and_insert_many_returns_a_new_list_of_bools() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    got = w.check_and_insert_many(["x", "x"], T0)
    assert type(got) is list
    assert [type(b) for b in got] == [bool, bool]
    assert got[0] is True
    assert got[1] is False


def test_check_and_insert_many_refuses_a_non_iterable_and_a_lone_str() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    with pytest.raises(TypeError):
        w.check_and_insert_many(5, T0)  # type: ignore[arg-type]
    # A str is an iterable of one-character ids: accepted, as any iterable of str is.
    assert w.check_and_insert_many("aba", T0) == [True, True, False]


def test_check_and_insert_many_checks_every_id_first() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    with pytest.raises(TypeError):
        w.check_and_insert_many(["a", 1, "b"], T0)  # type: ignore[list-item]
    assert len(w) == 0
    assert "a" not in w


def test_threads_see_each_id_new_exactly_once() -> None:
    w = DedupWindow(window_ms=10_000_000, max_entries=1_000_000)
    ids = [str(uuid.uuid4()) if i % 2 else f"evt-{i}" for i in range(5_000)]
    results: list[list[tuple[str, bool]]] = []

    def worker(n: int) -> None:
        mine = ids[n::2] + ids[:n:2] + ids[::-1]  # different orders, all overlapping
        got: list[tuple[str, bool]] = []
        for start in range(0, len(mine), 50):
            batch = mine[start : start + 50]
            if start % 100:
                got.extend(zip(batch, w.check_and_insert_many(batch, T0), strict=True))
            else:
                got.extend((id_, w.check_and_insert(id_, T0)) for id_ in batch)
        results.append(got)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    new = Counter(id_ for got in results for id_, fresh in got if fresh)
    assert new == Counter(ids)
    assert len(w) == len(ids)


def test_contains_neither_inserts_nor_expires() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    assert "a" not in w
    assert len(w) == 0
    w.check_and_insert("a", T0)
    assert "a" in w
    assert len(w) == 1
    assert 42 not in w
    assert None not in w
    assert b"a" not in w


def test_clear() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    w.check_and_insert_many(["a", "b"], T0)
    w.clear()
    assert len(w) == 0
    assert "a" not in w
    assert w.check_and_insert("a", T0)


def test_memory_usage_grows_with_entries() -> None:
    w = DedupWindow(window_ms=10_000, max_entries=1_000_000)
    empty = w.memory_usage()
    assert empty >= 0
    w.check_and_insert_many([str(uuid.uuid4()) for _ in range(10_000)], T0)
    with_uuids = w.memory_usage()
    assert with_uuids > empty
    assert with_uuids >= 10_000 * 16  # at least the 128-bit ids themselves
    w.check_and_insert_many([f"evt-{i}-{'x' * 100}" for i in range(10_000)], T0)
    assert w.memory_usage() > with_uuids + 10_000 * 100  # other ids are held whole


@pytest.mark.parametrize(
    "kwargs", [{"window_ms": -1}, {"max_entries": -1}, {"max_entries": 0}, {"window_ms": 0}]
)
def test_invalid_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises((ValueError, OverflowError)):
        DedupWindow(**kwargs)


# --- Snapshot and restore -------------------------------------------------------------


SAMPLE_STEPS = [
    ("123e4567-e89b-12d3-a456-426614174000", T0),
    ("evt-1", T0 + 10),
    ("x" * 300, T0 + 20),
    ("evt-2", T0 + 60),
    ("evt-3", T0 + 30),  # clamped to T0 + 60; the count bound evicts the UUID
]


def sample_window() -> DedupWindow:
    w = DedupWindow(window_ms=100, max_entries=4)
    assert w.check_and_insert_many([id_ for id_, _ in SAMPLE_STEPS[:1]], T0) == [True]
    for id_, now in SAMPLE_STEPS[1:]:
        assert w.check_and_insert(id_, now)
    return w


def test_snapshot_restore_round_trip() -> None:
    w = sample_window()
    data = w.snapshot()
    assert isinstance(data, bytes)
    r = DedupWindow.restore(data)
    assert (
        (r.window_ms, r.max_entries, len(r))
        == (w.window_ms, w.max_entries, len(w))
        == (
            100,
            4,
            4,
        )
    )
    assert r.snapshot() == data
    for x in ["123E4567-E89B-12D3-A456-426614174000", "evt-1", "x" * 300, "evt-2", "evt-3"]:
        assert (x in r) == (x in w)


def test_a_restored_window_continues_as_the_original() -> None:
    steps = [
        ("evt-1", T0 + 40),  # clamped to T0 + 60: a duplicate
        ("evt-9", T0 + 61),  # new: the count bound evicts evt-1
        ("123e4567-e89b-12d3-a456-426614174000", T0 + 99),  # evicted before: new
        ("evt-1", T0 + 100),
        ("x" * 300, T0 + 119),
        ("x" * 300, T0 + 120),
        ("evt-3", T0 + 159),
        ("evt-3", T0 + 160),
        ("evt-9", T0 + 160),
        ("evt-1", T0 + 199),  # first seen at T0 + 100: a duplicate until T0 + 200
        ("evt-1", T0 + 200),
        ("x" * 300, T0 + 500),  # everything else has expired
    ]
    model = RefDedup(100, 4)
    for id_, now in SAMPLE_STEPS:
        assert model.check_and_insert(id_, now)
    original = sample_window()
    restored = DedupWindow.restore(original.snapshot())
    results = []
    for id_, now in steps:
        expected = model.check_and_insert(id_, now)
        assert original.check_and_insert(id_, now) == expected
        assert restored.check_and_insert(id_, now) == expected
        assert len(restored) == len(original) == len(model)
        results.append(expected)
    assert results == [False, True, True, True, True, False, True, False, True, False, True, True]
    assert len(restored) == 1
    assert restored.snapshot() == original.snapshot()


def test_a_restored_window_remembers_its_clock() -> None:
    w = DedupWindow(window_ms=100, max_entries=10)
    w.check_and_insert("late", T0 + 500)
    r = DedupWindow.restore(w.snapshot())
    # T0 is before the clock: no time passes, so "early" is recorded at T0 + 500.
    assert r.check_and_insert("early", T0)
    assert not r.check_and_insert("early", T0 + 599)
    assert r.check_and_insert("early", T0 + 600)


def test_snapshot_of_an_empty_window() -> None:
    w = DedupWindow(window_ms=5, max_entries=7)
    r = DedupWindow.restore(w.snapshot())
    assert (r.window_ms, r.max_entries, len(r)) == (5, 7, 0)


def test_restore_accepts_bytes_like() -> None:
    data = sample_window().snapshot()
    assert len(DedupWindow.restore(bytes(data))) == 4


def assert_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        DedupWindow.restore(data)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, OpenStarryError)


def test_restore_rejects_empty_bytes() -> None:
    assert_decode_error(b"")


def test_restore_rejects_every_truncation() -> None:
    data = sample_window().snapshot()
    for n in range(len(data)):
        assert_decode_error(data[:n])


def test_restore_rejects_trailing_bytes() -> None:
    data = sample_window().snapshot()
    assert_decode_error(data + b"\x00")
    assert_decode_error(data + data)


def _v1_snapshot(entries: list[tuple[int, str]], last_now: int) -> bytes:
    """A snapshot in format version 1, built by hand as the first releases wrote it."""
    out = b"OSDEDUP\x00" + struct.pack("<IQQqQ", 1, 1000, 10, last_now, len(entries))
    for ts, id_ in entries:
        try:
            value = uuid.UUID(id_).int if len(id_) == 36 else None
        except ValueError:
            value = None
        if value is not None:
            out += b"\x00" + struct.pack("<q", ts) + value.to_bytes(16, "big")
        else:
            raw = id_.encode()
            out += b"\x01" + struct.pack("<qI", ts, len(raw)) + raw
    return out


def test_a_version_1_snapshot_restores() -> None:
    u = "123e4567-e89b-42d3-a456-426614174000"
    data = _v1_snapshot([(T0, "evt-1"), (T0 + 5, u)], T0 + 10)
    w = DedupWindow.restore(data)
    assert (w.window_ms, w.max_entries, len(w)) == (1000, 10, 2)
    assert "evt-1" in w
    assert u.upper() in w
    assert not w.check_and_insert(u.upper(), T0 + 10)
    assert w.check_and_insert("evt-1", T0 + 1000)  # left the window at T0 + 1000
    assert not w.check_and_insert(u, T0 + 1004)
    assert w.snapshot()[:12] == b"OSDEDUP\x00" + struct.pack("<I", 1)
    assert DedupWindow.restore(data).snapshot() == data


def test_restore_refuses_another_version_naming_it() -> None:
    data = bytearray(sample_window().snapshot())
    data[8:12] = struct.pack("<I", 7)
    with pytest.raises(DecodeError, match=r"version 7 \(expected 1\)"):
        DedupWindow.restore(bytes(data))


def test_restore_rejects_a_wrong_magic() -> None:
    data = sample_window().snapshot()
    assert_decode_error(bytes([data[0] ^ 0xFF]) + data[1:])
    assert_decode_error(b"\x00" * len(data))
    assert_decode_error(b"not a snapshot at all")


# --- Reference model and state machine ------------------------------------------------

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class RefDedup:
    """Plain-Python model of DedupWindow.

    ``now`` is clamped to the latest time seen; an entry first seen at ``t`` is
    dropped once ``now >= t + window_ms``; past ``max_entries`` the oldest entry
    is evicted; canonical UUIDs compare case-insensitively, other ids exactly.
    """

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.first_seen: dict[str, int] = {}
        self.order: deque[str] = deque()
        self.clock = 0

    @staticmethod
    def key(id_: str) -> str:
        return id_.lower() if _UUID.fullmatch(id_) else id_

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, id_: str) -> bool:
        return self.key(id_) in self.first_seen

    def _tick(self, now: int) -> int:
        self.clock = max(self.clock, now)
        return self.clock

    def expire(self, now: int) -> int:
        now = self._tick(now)
        dropped = 0
        while self.order and self.first_seen[self.order[0]] + self.window_ms <= now:
            del self.first_seen[self.order.popleft()]
            dropped += 1
        return dropped

    def check_and_insert(self, id_: str, now: int) -> bool:
        self.expire(now)
        key = self.key(id_)
        if key in self.first_seen:
            return False
        self.first_seen[key] = self.clock
        self.order.append(key)
        if len(self.order) > self.max_entries:
            del self.first_seen[self.order.popleft()]
        return True


_U = "123e4567-e89b-12d3-a456-426614174000"
ID_POOL = [
    _U,
    _U.upper(),
    "123e4567-e89b-12d3-a456-426614174001",
    str(uuid.UUID(int=0)),
    _U.replace("-", ""),
    "a",
    "A",
    "b",
    "evt-1",
    "evt-1 ",
    "é",
    "x" * 200,
    "x" * 199 + "y",
]
ids = st.sampled_from(ID_POOL) | st.text(max_size=4)


class DedupMachine(RuleBasedStateMachine):
    @initialize(window_ms=st.integers(1, 60), max_entries=st.integers(1, 8))
    def make(self, window_ms: int, max_entries: int) -> None:
        self.w = DedupWindow(window_ms=window_ms, max_entries=max_entries)
        self.model = RefDedup(window_ms, max_entries)
        self.now = T0

    @rule(id_=ids)
    def check_and_insert(self, id_: str) -> None:
        assert self.w.check_and_insert(id_, self.now) == self.model.check_and_insert(id_, self.now)

    @rule(batch=st.lists(ids, max_size=6))
    def check_and_insert_many(self, batch: list[str]) -> None:
        expected = [self.model.check_and_insert(id_, self.now) for id_ in batch]
        assert self.w.check_and_insert_many(batch, self.now) == expected

    @rule(ms=st.integers(0, 40))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(ms=st.integers(1, 40))
    def go_back(self, ms: int) -> None:
        self.now -= ms

    @rule()
    def expire(self) -> None:
        assert self.w.expire(self.now) == self.model.expire(self.now)

    @rule()
    def snapshot_and_restore(self) -> None:
        data = self.w.snapshot()
        self.w = DedupWindow.restore(data)
        assert self.w.snapshot() == data

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def clear(self) -> None:
        self.w.clear()
        clock = self.model.clock
        self.model = RefDedup(self.model.window_ms, self.model.max_entries)
        self.model.clock = clock

    @invariant()
    def same_state(self) -> None:
        assert len(self.w) == len(self.model)
        assert self.w.window_ms == self.model.window_ms
        assert self.w.max_entries == self.model.max_entries
        for id_ in ID_POOL:
            assert (id_ in self.w) == (id_ in self.model), id_


DedupMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestDedupMachine = DedupMachine.TestCase
