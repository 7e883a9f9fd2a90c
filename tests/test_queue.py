"""EventQueue: priority lanes, overflow policies, close, aging, threads.

A hypothesis state machine checks every call against :class:`RefQueue`, a
plain-Python model of the same rules.
"""

from __future__ import annotations

import asyncio
import gc
import math
import signal
import subprocess
import sys
import threading
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

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

from openstarry._core import (
    DEFAULT_PRIORITY,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    DedupWindow,
    Emitter,
    Event,
    EventQueue,
    EventRef,
    Published,
)
from openstarry.errors import DecodeError, OpenStarryError, QueueClosed, QueueFull

PRIORITIES = range(6)
#: Generous bound for a thread that should finish promptly; never a timing assertion.
JOIN_TIMEOUT = 30.0


def event(priority: int, text: str = "hi") -> Event:
    return Event.new(
        "INPUT:USER_MESSAGE", {"text": text}, source="t", session_id="s", priority=priority
    )


def drain(q: EventQueue) -> list[Any]:
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


# --- Basics ---------------------------------------------------------------------------


def test_priority_constants() -> None:
    assert (PRIORITY_HIGHEST, PRIORITY_LOWEST) == (0, 5)
    assert DEFAULT_PRIORITY == 2


def test_new_queue_is_empty() -> None:
    q = EventQueue()
    assert len(q) == 0
    assert not q
    assert q.pop() is None
    assert q.pop_many(10) == []
    assert q.depths() == [0] * 6
    assert q.capacity is None
    assert q.overflow == "reject"
    assert q.starvation_limit is None
    assert not q.closed
    assert q.shed_count == 0


def test_properties_reflect_arguments() -> None:
    q = EventQueue(7, "shed", 3)
    assert (q.capacity, q.overflow, q.starvation_limit) == (7, "shed", 3)
    q = EventQueue(capacity=2, overflow="reject", starvation_limit=None)
    assert (q.capacity, q.overflow, q.starvation_limit) == (2, "reject", None)


def test_serves_by_priority_then_fifo() -> None:
    q = EventQueue()
    pushes = [(5, "a"), (0, "b"), (3, "c"), (0, "d"), (5, "e"), (1, "f"), (3, "g"), (2, "h")]
    for priority, name in pushes:
        assert q.push(name, priority) is None
    expected = [name for _, name in sorted(pushes, key=lambda p: p[0])]  # stable sort: FIFO
    assert drain(q) == expected
    assert expected == ["b", "d", "f", "h", "c", "g", "a", "e"]


def test_fifo_within_one_priority() -> None:
    q = EventQueue()
    for i in range(1000):
        q.push(i, 4)
    assert drain(q) == list(range(1000))


@pytest.mark.parametrize(
    "item", [0, "", [], {}, (), False, 0.0, b"", object(), {"a": 1}, ("x", 1), Ellipsis]
)
def test_pushes_any_object_except_none(item: object) -> None:
    q = EventQueue()
    q.push(item, 3)
    assert len(q) == 1
    assert q  # a queue holding a falsy item is still non-empty
    assert q.pop() is item
    assert q.pop() is None


def test_an_event_takes_its_own_priority() -> None:
    q = EventQueue()
    events = [event(p, str(i)) for i, p in enumerate([5, 0, 3, 0, 2, 4, 1])]
    for e in events:
        q.push(e)
    assert q.depths() == [2, 1, 1, 1, 1, 1]
    popped = drain(q)
    assert [e.priority for e in popped] == [0, 0, 1, 2, 3, 4, 5]
    assert popped[0] is events[1]
    assert popped[1] is events[3]


def test_an_explicit_priority_overrides_the_events_own() -> None:
    q = EventQueue()
    low = event(5)
    high = event(0)
    q.push(low, 0)
    q.push(high, 5)
    assert q.depths() == [1, 0, 0, 0, 0, 1]
    assert drain(q) == [low, high]


def test_event_push_many_uses_each_events_priority() -> None:
    q = EventQueue()
    events = [event(p) for p in [3, 1, 5, 1, 0]]
    assert q.push_many(events) == []
    assert q.depths() == [1, 2, 0, 1, 0, 1]
    assert drain(q) == [events[4], events[1], events[3], events[0], events[2]]


def test_push_many_with_one_priority_keeps_order() -> None:
    q = EventQueue()
    q.push("first", 2)
    assert q.push_many(iter(range(5)), 2) == []
    assert q.push_many((x for x in "ab"), 0) == []
    assert drain(q) == ["a", "b", "first", 0, 1, 2, 3, 4]


def test_push_many_takes_any_iterable() -> None:
    """Lists and tuples are read by index, anything else through the iterator protocol."""
    items = ["a", "b", "c"]
    sources: list[Callable[[], Iterable[str]]] = [
        lambda: list(items),
        lambda: tuple(items),
        lambda: (x for x in items),
        lambda: deque(items),
        lambda: dict.fromkeys(items).keys(),
    ]
    for source in sources:
        q = EventQueue()
        assert q.push_many(source(), 2) == []
        assert q.pop_many(10) == ["a", "b", "c"]


def test_push_many_checks_every_item_of_a_tuple_first() -> None:
    q = EventQueue()
    with pytest.raises(TypeError):
        q.push_many((event(1), "no priority", event(2)))
    assert len(q) == 0


def test_push_many_of_nothing() -> None:
    q = EventQueue(capacity=1)
    assert q.push_many([], 0) == []
    assert len(q) == 0


def test_len_bool_and_depths_track_contents() -> None:
    q = EventQueue()
    q.push_many(["a", "b"], 1)
    q.push("c", 5)
    assert len(q) == 3
    assert bool(q)
    assert q.depths() == [0, 2, 0, 0, 0, 1]
    q.pop()
    assert len(q) == 2
    assert q.depths() == [0, 1, 0, 0, 0, 1]
    q.pop_many(5)
    assert len(q) == 0
    assert not q
    assert q.depths() == [0] * 6


# --- Errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [6, -1, 100, -(2**70), 2**70, "2", 2.5, 2.0, True, False])
def test_invalid_priority_is_a_value_error(priority: Any) -> None:
    q = EventQueue()
    with pytest.raises(ValueError, match="priority"):
        q.push("x", priority)
    with pytest.raises(ValueError, match="priority"):
        q.push_many(["x", "y"], priority)
    assert len(q) == 0


def test_none_is_not_an_item() -> None:
    q = EventQueue()
    with pytest.raises(TypeError):
        q.push(None, 1)
    with pytest.raises(TypeError):
        q.push(None)
    with pytest.raises(TypeError):
        q.push_many(["a", None, "b"], 1)
    assert len(q) == 0


def test_a_non_event_needs_a_priority() -> None:
    q = EventQueue()
    with pytest.raises(TypeError):
        q.push("not an event")
    with pytest.raises(TypeError):
        q.push({"priority": 1})
    with pytest.raises(TypeError):
        q.push_many([event(1), "not an event", event(2)])
    assert len(q) == 0


def test_a_failed_push_many_pushes_nothing() -> None:
    q = EventQueue()
    with pytest.raises(ValueError, match="priority"):
        q.push_many([event(1), event(2)], 9)
    assert len(q) == 0
    assert q.depths() == [0] * 6


def test_a_failed_push_many_leaves_a_queue_as_it_was() -> None:
    q = EventQueue()
    first, last = event(4), event(0)
    q.push_many([first, last])
    items = [event(1), event(5), event(0), event(3)]
    before = [sys.getrefcount(item) for item in items]
    for bad in ([*items, "no priority"], (*items, None)):
        with pytest.raises(TypeError):
            q.push_many(bad)
        assert q.depths() == [1, 0, 0, 0, 1, 0]
        assert len(q) == 2
    del bad
    # Every item queued before the bad one was taken out and released.
    assert [sys.getrefcount(item) for item in items] == before
    assert q.pop_many(5) == [last, first]
    assert not q
    assert q.pop() is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"overflow": "drop"},
        {"overflow": "REJECT"},
        {"capacity": -1},
        {"capacity": 0},
        {"starvation_limit": -1},
        {"starvation_limit": 0},
    ],
)
def test_invalid_constructor_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises((ValueError, OverflowError)):
        EventQueue(**kwargs)


def test_a_failing_iterable_pushes_nothing() -> None:
    q = EventQueue()

    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        q.push_many(items(), 1)
    assert len(q) == 0


def test_items_that_refer_to_their_queue_are_collected() -> None:
    class Holder:
        q: EventQueue

    q = EventQueue()
    holder = Holder()
    holder.q = q  # a cycle through the queue: only the GC can free it
    q.push(holder, 0)
    ref = weakref.ref(holder)
    del q, holder
    gc.collect()
    assert ref() is None


def test_pop_many_of_a_negative_count() -> None:
    q = EventQueue()
    q.push("a", 1)
    with pytest.raises((ValueError, OverflowError)):
        q.pop_many(-1)
    assert len(q) == 1


# --- Capacity: reject -----------------------------------------------------------------


def test_reject_raises_queue_full_at_capacity() -> None:
    q = EventQueue(capacity=3)
    for i in range(3):
        q.push(i, 5)
    with pytest.raises(QueueFull) as info:
        q.push("x", 0)
    assert isinstance(info.value, asyncio.QueueFull)
    assert isinstance(info.value, OpenStarryError)
    assert len(q) == 3
    assert q.shed_count == 0
    assert q.pop() == 0
    q.push("x", 0)
    assert drain(q) == ["x", 1, 2]


def test_reject_push_many_is_all_or_nothing() -> None:
    q = EventQueue(capacity=5)
    q.push_many(["a", "b", "c"], 3)
    with pytest.raises(QueueFull):
        q.push_many(["d", "e", "f"], 0)
    assert len(q) == 3
    assert q.depths() == [0, 0, 0, 3, 0, 0]
    with pytest.raises(QueueFull):
        q.push_many([event(0), event(0), event(0)])
    assert q.push_many(["d", "e"], 0) == []
    assert len(q) == 5
    assert drain(q) == ["d", "e", "a", "b", "c"]


def test_capacity_of_one() -> None:
    q = EventQueue(capacity=1)
    q.push("a", 0)
    with pytest.raises(QueueFull):
        q.push("b", 0)
    assert q.pop() == "a"
    q.push("b", 0)
    assert q.pop() == "b"


# --- Capacity: shed -------------------------------------------------------------------


def test_shed_drops_the_newest_lowest_priority_item() -> None:
    q = EventQueue(capacity=3, overflow="shed")
    assert q.push("a", 2) is None
    assert q.push("b", 2) is None
    assert q.push("c", 4) is None
    # Full: the newest item of the lowest-priority lane (4) makes room.
    assert q.push("d", 1) == "c"
    assert q.shed_count == 1
    # The incoming item is no more important than the lowest lane (2): it is shed itself.
    assert q.push("e", 5) == "e"
    assert q.push("f", 2) == "f"
    assert q.shed_count == 3
    # Lane 2 holds a then b: b, the newest, goes.
    assert q.push("g", 0) == "b"
    assert q.shed_count == 4
    assert len(q) == 3
    assert drain(q) == ["g", "d", "a"]


def test_shed_push_many_returns_everything_dropped() -> None:
    q = EventQueue(capacity=3, overflow="shed")
    q.push_many(["x", "y"], 5)
    shed = q.push_many(["a", "b", "c"], 1)
    assert shed == ["y", "x"]
    assert q.shed_count == 2
    assert drain(q) == ["a", "b", "c"]
    q.push_many(["a", "b", "c"], 3)
    assert q.push_many(["p", "q"], 4) == ["p", "q"]
    assert q.shed_count == 4


def test_shed_with_events_returns_the_event() -> None:
    q = EventQueue(capacity=1, overflow="shed")
    low = event(5)
    high = event(0)
    assert q.push(low) is None
    assert q.push(high) is low
    assert q.push(event(3)).priority == 3
    assert q.pop() is high


def test_shed_never_loses_an_item_silently() -> None:
    q = EventQueue(capacity=4, overflow="shed")
    pushed: list[int] = []
    dropped: list[Any] = []
    popped: list[Any] = []
    for i in range(200):
        pushed.append(i)
        victim = q.push(i, (i * 7) % 6)
        if victim is not None:
            dropped.append(victim)
        if i % 5 == 0:
            popped.extend(q.pop_many(2))
    popped.extend(drain(q))
    assert sorted(popped + dropped) == pushed
    assert q.shed_count == len(dropped)


# --- Close ----------------------------------------------------------------------------


def test_close_refuses_pushes_and_drains() -> None:
    q = EventQueue()
    q.push_many(["a", "b"], 3)
    q.push("c", 0)
    q.close()
    assert q.closed
    with pytest.raises(QueueClosed):
        q.push("d", 0)
    with pytest.raises(QueueClosed):
        q.push(event(1))
    with pytest.raises(QueueClosed):
        q.push_many(["d"], 0)
    assert len(q) == 3
    assert q.pop() == "c"
    assert q.pop_many(5) == ["a", "b"]
    assert q.pop() is None
    assert q.pop(timeout=10) is None  # closed and empty: returns at once
    assert q.pop_many(3, timeout=10) == []


def test_close_is_idempotent() -> None:
    q = EventQueue()
    q.close()
    q.close()
    assert q.closed


def test_closed_full_queue_reports_closed() -> None:
    q = EventQueue(capacity=1)
    q.push("a", 0)
    q.close()
    with pytest.raises(QueueClosed):
        q.push("b", 0)


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, threading.Event, list[Any]]:
    """Start ``fn`` in a thread; returns it, an event set before ``fn`` runs, and its result."""
    started = threading.Event()
    result: list[Any] = []

    def target() -> None:
        started.set()
        result.append(fn())

    t = threading.Thread(target=target, daemon=True)
    t.start()
    assert started.wait(JOIN_TIMEOUT)
    return t, started, result


def let_it_block() -> None:
    # Give the thread a chance to enter its blocking pop. The test holds either
    # way (a pop that starts after the event returns at once); this only makes
    # it more likely that the wake-up path is the one exercised.
    threading.Event().wait(0.05)


def test_close_wakes_a_blocked_pop() -> None:
    q = EventQueue()
    t, _, result = run_in_thread(lambda: q.pop(timeout=10))
    let_it_block()
    q.close()
    t.join(JOIN_TIMEOUT)
    assert not t.is_alive()
    assert result == [None]


def test_close_wakes_a_blocked_pop_many() -> None:
    q = EventQueue()
    t, _, result = run_in_thread(lambda: q.pop_many(4, timeout=math.inf))
    let_it_block()
    q.close()
    t.join(JOIN_TIMEOUT)
    assert not t.is_alive()
    assert result == [[]]


def test_a_push_wakes_a_blocked_pop() -> None:
    q = EventQueue()
    t, _, result = run_in_thread(lambda: q.pop(timeout=math.inf))
    let_it_block()
    q.push("x", 3)
    t.join(JOIN_TIMEOUT)
    assert not t.is_alive()
    assert result == ["x"]
    assert len(q) == 0


def test_pop_many_waits_for_the_first_item_only() -> None:
    q = EventQueue()
    t, _, result = run_in_thread(lambda: q.pop_many(10, timeout=JOIN_TIMEOUT))
    let_it_block()
    q.push_many(["a", "b"], 1)
    t.join(JOIN_TIMEOUT)
    assert not t.is_alive()
    # The pop may wake after the first item or after both: never more, never out of order.
    assert result[0] in (["a"], ["a", "b"])
    assert result[0] + drain(q) == ["a", "b"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_interrupts_a_blocked_pop() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import math\n"
            "from openstarry._core import EventQueue\n"
            "q = EventQueue()\n"
            "print('ready', flush=True)\n"
            "q.pop(timeout=math.inf)\n",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        let_it_block()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=JOIN_TIMEOUT)
    finally:
        child.kill()
        child.wait()
    assert "KeyboardInterrupt" in err


# --- Timeouts and pop_many ------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, 0.0, 0.001, 0.02])
def test_pop_times_out_with_none(timeout: float) -> None:
    q = EventQueue()
    assert q.pop(timeout=timeout) is None
    assert q.pop_many(3, timeout=timeout) == []


def test_pop_with_timeout_returns_a_queued_item_at_once() -> None:
    q = EventQueue()
    q.push("a", 5)
    assert q.pop(timeout=math.inf) == "a"
    q.push("b", 5)
    assert q.pop(timeout=JOIN_TIMEOUT) == "b"


def test_negative_or_nan_timeout_is_rejected() -> None:
    q = EventQueue()
    with pytest.raises(ValueError, match="timeout"):
        q.pop(timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        q.pop(timeout=math.nan)


def test_pop_many_in_priority_order() -> None:
    q = EventQueue()
    for i, p in enumerate([4, 2, 0, 2, 5, 0]):
        q.push(i, p)
    assert q.pop_many(0) == []
    assert q.pop_many(3) == [2, 5, 1]
    assert q.pop_many(100) == [3, 0, 4]
    assert q.pop_many(100) == []


# --- Aging ----------------------------------------------------------------------------


def test_without_aging_a_flood_starves_low_priorities() -> None:
    q = EventQueue()
    q.push("low", 5)
    for i in range(10):
        q.push(i, 0)
    assert drain(q) == [*range(10), "low"]


def test_aging_serves_a_passed_over_lane() -> None:
    q = EventQueue(starvation_limit=2)
    q.push("low", 5)
    for i in range(6):
        q.push(i, 0)
    # Lane 5 is passed over twice, then served.
    assert drain(q) == [0, 1, "low", 2, 3, 4, 5]


def test_aging_of_several_lanes() -> None:
    q = EventQueue(starvation_limit=2)
    q.push_many(["a1", "a2", "a3"], 3)
    q.push_many(["b1", "b2"], 5)
    q.push_many(list(range(8)), 0)
    # Counters (lane3, lane5) after each pop:
    #   0 -> (1,1); 1 -> (2,2); a1: both starve, lane 3 first -> (0,3);
    #   b1 (3 >= 2) -> (0,0)... lane 3 < 5 is not counted when 5 is served.
    #   2 -> (1,1); 3 -> (2,2); a2 -> (0,3); b2 -> lane 5 empties; 4 -> (1,-);
    #   5 -> (2,-); a3; 6; 7.
    assert drain(q) == [0, 1, "a1", "b1", 2, 3, "a2", "b2", 4, 5, "a3", 6, 7]


def test_aging_limit_of_one_alternates() -> None:
    q = EventQueue(starvation_limit=1)
    q.push_many(["x", "y"], 4)
    q.push_many([1, 2, 3, 4], 1)
    assert drain(q) == [1, "x", 2, "y", 3, 4]


def test_aging_applies_to_pop_many() -> None:
    q = EventQueue(starvation_limit=2)
    q.push("low", 5)
    q.push_many(list(range(6)), 0)
    assert q.pop_many(4) == [0, 1, "low", 2]


def test_an_emptied_lane_forgets_its_count() -> None:
    q = EventQueue(starvation_limit=3)
    q.push("low", 4)
    q.push_many([0, 1], 0)
    assert q.pop_many(2) == [0, 1]  # lane 4 passed over twice
    assert q.pop() == "low"  # lane 4 empties: its count resets
    q.push("low2", 4)
    q.push_many([2, 3, 4, 5], 0)
    # A fresh count: three more pops of lane 0 before lane 4 is served.
    assert drain(q) == [2, 3, 4, "low2", 5]


def test_a_shed_victim_that_empties_its_lane_resets_its_count() -> None:
    q = EventQueue(capacity=3, overflow="shed", starvation_limit=2)
    q.push("low", 5)
    q.push_many([0, 1], 0)
    assert q.pop() == 0  # lane 5 passed over once
    q.push(2, 0)
    assert q.push(3, 0) == "low"  # lane 5 empties
    assert q.push("low2", 5) == "low2"  # full, and 5 >= 0: shed itself
    assert q.pop() == 1
    assert q.push("low3", 5) is None
    # Lane 5 starts counting afresh: passed over by 2 and 3, then served.
    assert drain(q) == [2, 3, "low3"]


# --- Reference model and state machine ------------------------------------------------


class RefQueue:
    """Plain-Python model of EventQueue: six deques, shed and aging rules as in rust/queue.rs.

    Shed victim: the newest item of the lowest-priority non-empty lane, unless the
    incoming priority is at or below that lane's (a number >= it): then the incoming
    item. Aging: each lane counts the pops that passed it over; a pop serves the
    highest-priority lane whose count reached the limit, else the highest-priority
    non-empty lane; the served lane's count becomes 0, every non-empty lane of lower
    priority gains 1, and a lane that becomes empty resets to 0.
    """

    def __init__(self, capacity: int | None, overflow: str, starvation_limit: int | None) -> None:
        self.capacity = capacity
        self.overflow = overflow
        self.starvation_limit = starvation_limit
        self.lanes: list[deque[Any]] = [deque() for _ in PRIORITIES]
        self.passed = [0] * 6
        self.closed = False
        self.shed_count = 0

    def __len__(self) -> int:
        return sum(map(len, self.lanes))

    def depths(self) -> list[int]:
        return [len(lane) for lane in self.lanes]

    def _push(self, item: Any, priority: int) -> Any:
        if self.capacity is not None and len(self) >= self.capacity:
            if self.overflow == "reject":
                raise QueueFull
            self.shed_count += 1
            lowest = max(p for p in PRIORITIES if self.lanes[p])
            if priority >= lowest:
                return item
            victim = self.lanes[lowest].pop()
            if not self.lanes[lowest]:
                self.passed[lowest] = 0
            self.lanes[priority].append(item)
            return victim
        self.lanes[priority].append(item)
        return None

    def push(self, item: Any, priority: int) -> Any:
        if self.closed:
            raise QueueClosed
        return self._push(item, priority)

    def push_many(self, items: Sequence[tuple[Any, int]]) -> list[Any]:
        if self.closed:
            raise QueueClosed
        if (
            self.overflow == "reject"
            and self.capacity is not None
            and len(self) + len(items) > self.capacity
        ):
            raise QueueFull
        shed = [self._push(item, priority) for item, priority in items]
        return [s for s in shed if s is not None]

    def pop(self) -> Any:
        nonempty = [p for p in PRIORITIES if self.lanes[p]]
        if not nonempty:
            return None
        k = self.starvation_limit
        starving = [p for p in nonempty if k is not None and self.passed[p] >= k]
        chosen = starving[0] if starving else nonempty[0]
        item = self.lanes[chosen].popleft()
        self.passed[chosen] = 0
        for p in nonempty:
            if p > chosen:
                self.passed[p] += 1
        return item

    def pop_many(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            item = self.pop()
            if item is None:
                break
            out.append(item)
        return out


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """A call's result, or the type of the queue error it raised."""
    try:
        return ("ok", fn())
    except (QueueFull, QueueClosed) as e:
        return ("raised", type(e))


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.accepted: list[Any] = []  # every item a push took in
        self.out: list[Any] = []  # every item popped or returned as shed

    @initialize(
        capacity=st.none() | st.integers(1, 8),
        overflow=st.sampled_from(["reject", "shed"]),
        starvation_limit=st.none() | st.integers(1, 4),
    )
    def make(self, capacity: int | None, overflow: str, starvation_limit: int | None) -> None:
        self.q = EventQueue(capacity, overflow, starvation_limit)  # type: ignore[arg-type]
        self.model = RefQueue(capacity, overflow, starvation_limit)

    def new_item(self) -> int:
        self.next_id += 1
        return self.next_id

    def check(self, real: tuple[str, Any], expected: tuple[str, Any]) -> Any:
        assert real == expected
        return real[1]

    @rule(priority=st.integers(0, 5))
    def push(self, priority: int) -> None:
        item = self.new_item()
        expected = outcome(lambda: self.model.push(item, priority))
        shed = self.check(outcome(lambda: self.q.push(item, priority)), expected)
        if expected[0] == "ok":
            self.accepted.append(item)
            if shed is not None:
                self.out.append(shed)

    @rule(priority=st.integers(0, 5))
    def push_event(self, priority: int) -> None:
        item = event(priority)
        expected = outcome(lambda: self.model.push(item, priority))
        shed = self.check(outcome(lambda: self.q.push(item)), expected)
        if expected[0] == "ok":
            self.accepted.append(item)
            if shed is not None:
                self.out.append(shed)

    @rule(priority=st.integers(0, 5), n=st.integers(1, 6))
    def push_many(self, priority: int, n: int) -> None:
        items = [self.new_item() for _ in range(n)]
        expected = outcome(lambda: self.model.push_many([(i, priority) for i in items]))
        shed = self.check(outcome(lambda: self.q.push_many(items, priority)), expected)
        if expected[0] == "ok":
            self.accepted.extend(items)
            self.out.extend(shed)

    @rule(priorities=st.lists(st.integers(0, 5), min_size=1, max_size=6))
    def push_many_events(self, priorities: list[int]) -> None:
        items = [event(p) for p in priorities]
        expected = outcome(lambda: self.model.push_many([(e, e.priority) for e in items]))
        shed = self.check(outcome(lambda: self.q.push_many(items)), expected)
        if expected[0] == "ok":
            self.accepted.extend(items)
            self.out.extend(shed)

    @rule()
    def pop(self) -> None:
        item = self.q.pop()
        assert item == self.model.pop()
        if item is not None:
            self.out.append(item)

    @rule()
    def pop_with_timeout(self) -> None:
        # Only when the answer is immediate: an item, or closed and empty.
        if self.model or self.model.closed:
            item = self.q.pop(timeout=JOIN_TIMEOUT)
            assert item == self.model.pop()
            if item is not None:
                self.out.append(item)

    @rule(n=st.integers(0, 6))
    def pop_many(self, n: int) -> None:
        items = self.q.pop_many(n)
        assert items == self.model.pop_many(n)
        self.out.extend(items)

    @precondition(lambda self: not self.model.closed)
    @rule()
    def close(self) -> None:
        self.q.close()
        self.model.closed = True

    @invariant()
    def same_state(self) -> None:
        assert len(self.q) == len(self.model)
        assert bool(self.q) == (len(self.model) > 0)
        assert self.q.depths() == self.model.depths()
        assert self.q.shed_count == self.model.shed_count
        assert self.q.closed == self.model.closed

    def teardown(self) -> None:
        if hasattr(self, "q"):
            # Never a silent loss: every item taken in was popped, shed, or is still queued.
            remaining = drain(self.q)
            assert remaining == self.model.pop_many(len(self.model))
            assert Counter(map(id, self.out + remaining)) == Counter(map(id, self.accepted))


QueueMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestQueueMachine = QueueMachine.TestCase


# --- Threads --------------------------------------------------------------------------

PRODUCERS = 4
CONSUMERS = 4
PER_PRODUCER = 20_000


def run_producers_and_consumers(
    q: EventQueue,
) -> tuple[list[list[tuple[int, int]]], list[Any]]:
    """Producers 0, 1 push one at a time, 2, 3 in batches; consumers 0, 1 pop, 2, 3 pop_many.

    Item ``(p, i)`` goes to priority ``i % 6``. Returns each consumer's items in
    the order it got them, and everything the queue shed.
    """
    shed: list[Any] = []
    shed_lock = threading.Lock()

    def produce(p: int) -> None:
        items = [(p, i) for i in range(PER_PRODUCER)]
        mine: list[Any] = []
        if p < 2:
            for item in items:
                victim = q.push(item, item[1] % 6)
                if victim is not None:
                    mine.append(victim)
        else:
            for start in range(0, PER_PRODUCER, 60):
                batch = items[start : start + 60]
                for lane in PRIORITIES:
                    mine.extend(q.push_many([it for it in batch if it[1] % 6 == lane], lane))
        with shed_lock:
            shed.extend(mine)

    seen: list[list[tuple[int, int]]] = [[] for _ in range(CONSUMERS)]

    def consume(c: int) -> None:
        got = seen[c]
        while True:
            # With no time limit, a pop comes back empty only once the queue is
            # closed and drained: nothing more will come.
            if c < 2:
                item = q.pop(timeout=math.inf)
                batch = [] if item is None else [item]
            else:
                batch = q.pop_many(64, timeout=math.inf)
            if not batch:
                return
            got.extend(batch)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    consumers = [threading.Thread(target=consume, args=(c,)) for c in range(CONSUMERS)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join(JOIN_TIMEOUT * 4)
        assert not t.is_alive()
    q.close()
    for t in consumers:
        t.join(JOIN_TIMEOUT * 4)
        assert not t.is_alive()
    return seen, shed


def assert_ordered_per_stream(got: list[tuple[int, int]]) -> None:
    """What one consumer saw of each (producer, priority) stream is in push order.

    Each lane is FIFO and each pop atomic, so this holds for every consumer even
    when several share the queue (they see interleaved subsequences).
    """
    last: dict[tuple[int, int], int] = {}
    for p, i in got:
        key = (p, i % 6)
        assert last.get(key, -1) < i, (key, last.get(key), i)
        last[key] = i


def test_threads_consume_every_item_exactly_once() -> None:
    q = EventQueue()
    seen, shed = run_producers_and_consumers(q)
    assert shed == []
    everything = Counter(item for got in seen for item in got)
    expected = Counter((p, i) for p in range(PRODUCERS) for i in range(PER_PRODUCER))
    assert everything == expected
    for got in seen:
        assert_ordered_per_stream(got)
    assert len(q) == 0


def test_threads_with_shedding_lose_nothing_silently() -> None:
    q = EventQueue(capacity=64, overflow="shed")
    seen, shed = run_producers_and_consumers(q)
    consumed = Counter(item for got in seen for item in got)
    expected = Counter((p, i) for p in range(PRODUCERS) for i in range(PER_PRODUCER))
    assert consumed + Counter(shed) == expected
    assert q.shed_count == len(shed)
    for got in seen:
        assert_ordered_per_stream(got)


def test_threads_single_consumer_sees_each_producer_in_order() -> None:
    q = EventQueue(capacity=256)
    n = 5_000
    got: list[tuple[int, int]] = []

    def produce(p: int) -> None:
        for i in range(n):
            while True:
                try:
                    q.push((p, i), 3)
                    break
                except QueueFull:
                    threading.Event().wait(0.0001)  # back off while the consumer catches up

    def consume() -> None:
        # None only once the queue is closed and drained.
        while (item := q.pop(timeout=math.inf)) is not None:
            got.append(item)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    consumer = threading.Thread(target=consume)
    consumer.start()
    for t in producers:
        t.start()
    for t in producers:
        t.join(JOIN_TIMEOUT * 4)
    q.close()
    consumer.join(JOIN_TIMEOUT * 4)
    assert not consumer.is_alive()
    assert len(got) == PRODUCERS * n
    for p in range(PRODUCERS):
        assert [i for q_, i in got if q_ == p] == list(range(n))


@pytest.mark.parametrize("capacity", [True, 0, -1, 1.5])
def test_queue_capacity_must_be_a_positive_int(capacity: Any) -> None:
    with pytest.raises(ValueError, match="capacity"):
        EventQueue(capacity=capacity)


# --- push_unique: the publisher's one call -------------------------------------------------


def _unique_event(n: int, priority: int = 2) -> Event:
    return Event.new("INPUT:USER_MESSAGE", {"n": n}, source="t", session_id="s", priority=priority)


def test_push_unique_queues_the_item_at_the_events_priority() -> None:
    q = EventQueue()
    window = DedupWindow()
    low, high = _unique_event(1, priority=4), _unique_event(2, priority=0)
    assert q.push_unique(("wrapped", low), low, window) == 1
    assert q.push_unique(("wrapped", high), high, window) == 2
    assert q.unique_pushed == 2
    assert q.depths() == [1, 0, 0, 0, 1, 0]
    assert q.pop_many(2) == [("wrapped", high), ("wrapped", low)]


def test_push_unique_refuses_a_duplicate_without_queueing() -> None:
    q = EventQueue()
    window = DedupWindow()
    event = _unique_event(1)
    assert q.push_unique(event, event, window) == 1
    assert q.push_unique(event, event, window) == 0
    assert len(q) == 1
    assert not window.check_and_insert(event.id)  # the window recorded it once


def test_push_unique_without_a_window_queues_every_time() -> None:
    q = EventQueue()
    event = _unique_event(1)
    assert q.push_unique(event, event) == 1
    assert q.push_unique(event, event, None) == 2
    assert len(q) == 2


@pytest.mark.parametrize("overflow", ["reject", "shed"])
def test_push_unique_refuses_at_capacity_before_recording_the_id(overflow: str) -> None:
    q = EventQueue(1, overflow=overflow)  # type: ignore[arg-type]
    window = DedupWindow()
    first, second = _unique_event(1), _unique_event(2)
    assert q.push_unique(first, first, window)
    with pytest.raises(QueueFull):
        q.push_unique(second, second, window)
    assert q.pop() is first
    assert q.push_unique(second, second, window)  # a retry is not a duplicate


def test_push_unique_after_close_raises_and_records_nothing() -> None:
    q = EventQueue()
    window = DedupWindow()
    event = _unique_event(1)
    q.close()
    with pytest.raises(QueueClosed):
        q.push_unique(event, event, window)
    assert window.check_and_insert(event.id)


def test_push_unique_checks_its_arguments() -> None:
    q = EventQueue()
    event = _unique_event(1)
    with pytest.raises(TypeError, match="push_unique takes an Event"):
        q.push_unique(event, event.to_dict())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="None cannot be queued"):
        q.push_unique(None, event)
    with pytest.raises(TypeError):
        q.push_unique(event, event, "not a window")  # type: ignore[arg-type]
    assert len(q) == 0


# --- admit: what publish does for an event dispatched at once ----------------------------


def test_admit_records_and_counts_the_id_without_queueing() -> None:
    q = EventQueue()
    window = DedupWindow()
    event = _unique_event(1)
    assert q.admit(event, window) is True
    assert len(q) == 0
    assert q.unique_pushed == 1
    assert q.admit(event, window) is False  # a duplicate: not counted again
    assert q.unique_pushed == 1
    assert not window.check_and_insert(event.id)


def test_admit_takes_no_room_at_capacity() -> None:
    q = EventQueue(1)
    window = DedupWindow()
    queued, admitted = _unique_event(1), _unique_event(2)
    assert q.push_unique(queued, queued, window)
    assert q.admit(admitted, window)
    assert len(q) == 1
    assert q.unique_pushed == 2


def test_admit_without_a_window_counts_every_time() -> None:
    q = EventQueue()
    event = _unique_event(1)
    assert q.admit(event)
    assert q.admit(event, None)
    assert q.unique_pushed == 2


def test_admit_after_close_raises_and_records_nothing() -> None:
    q = EventQueue()
    window = DedupWindow()
    event = _unique_event(1)
    q.close()
    with pytest.raises(QueueClosed):
        q.admit(event, window)
    assert q.unique_pushed == 0
    assert window.check_and_insert(event.id)


def test_admit_checks_its_arguments() -> None:
    q = EventQueue()
    with pytest.raises(TypeError, match="admit takes an Event"):
        q.admit(_unique_event(1).to_dict())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        q.admit(_unique_event(1), "not a window")  # type: ignore[arg-type]
    assert q.unique_pushed == 0


# --- Emitter: EventBus.emit in one call ----------------------------------------------------


def _emitter_parts() -> tuple[EventQueue, DedupWindow, dict[str, list[Any]], list[str], list[Any]]:
    return EventQueue(), DedupWindow(), {}, [], []


def test_emitter_admits_an_event_nobody_subscribes_to_and_counts_it() -> None:
    queue, window, by_type, asked, published = _emitter_parts()

    def route_of(event_type: str) -> list[Any]:
        asked.append(event_type)
        entry = by_type[event_type] = [(), 0, None, "no_subscriber"]
        return entry

    emitter = Emitter(queue, window, by_type, route_of, published.append)
    emitter.asleep = True  # as the bus says while its dispatcher sleeps
    first, second = _unique_event(1), _unique_event(2)
    assert emitter.emit(first, first.type) is True
    assert emitter.emit(second, second.type) is True
    assert asked == [first.type]  # the entry is looked up once, then read from the cache
    assert by_type[first.type][1] == 2
    assert queue.unique_pushed == 2
    assert len(queue) == 0
    assert published == []
    assert emitter.emit(first, first.type) is False
    assert emitter.duplicates == 1
    assert by_type[first.type][1] == 2


def test_emitter_publishes_a_routed_event_unless_only_skip_listens() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    handler, other = object(), object()
    event = _unique_event(1)
    by_type[event.type] = [(handler,), 0, None, "handled"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    emitter.asleep = True
    assert emitter.emit(event, event.type) is False  # what publish returned (None here)
    assert published == [event]
    assert emitter.emit(_unique_event(2), event.type, handler) is True  # only skip listens
    assert published == [event]
    by_type[event.type] = [(handler, other), 0, None, "handled"]
    third = _unique_event(3)
    assert emitter.emit(third, event.type, handler) is False
    assert published == [event, third]


def test_emitter_publishes_while_the_dispatcher_is_awake_or_events_wait() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    first, second = _unique_event(1), _unique_event(2)
    by_type[first.type] = [(), 0, None, "no_subscriber"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    assert not emitter.asleep  # until the bus says its dispatcher sleeps
    emitter.emit(first, first.type)
    assert published == [first]
    emitter.asleep = True
    queue.push("waiting", 5)
    emitter.emit(second, second.type)
    assert published == [first, second]
    assert queue.unique_pushed == 0
    assert by_type[first.type][1] == 0


def test_emitter_refuses_what_is_not_an_event_and_a_closed_queue() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    by_type["INPUT:USER_MESSAGE"] = [(), 0, None, "no_subscriber"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    emitter.asleep = True
    with pytest.raises(TypeError, match=r"publish takes an openstarry\.core\.Event, not dict"):
        emitter.emit({}, "INPUT:USER_MESSAGE")  # type: ignore[arg-type]
    queue.close()
    event = _unique_event(1)
    with pytest.raises(QueueClosed, match="the bus is closed"):
        emitter.emit(event, event.type)
    assert window.check_and_insert(event.id)  # nothing recorded


def test_emitter_take_admits_an_event_only_its_one_subscriber_handles_now() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    handler, other = object(), object()
    event = _unique_event(1)
    by_type[event.type] = [(handler,), 0, print, "handled"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    assert emitter.take(event, event.type, handler) is None  # the dispatcher is awake
    emitter.asleep = True
    assert emitter.take(event, event.type, other) is None  # not its subscriber
    assert emitter.take(event, event.type, handler) is True
    assert by_type[event.type][1] == 1  # counted, and in the window
    assert not window.check_and_insert(event.id)
    assert emitter.take(event, event.type, handler) is False  # a duplicate
    assert emitter.duplicates == 1
    by_type[event.type] = [(handler, other), 1, None, "handled"]
    assert emitter.take(_unique_event(2), event.type, handler) is None  # two subscribers
    by_type[event.type] = [(handler,), 1, print, "handled"]
    queue.push("waiting", 5)
    assert emitter.take(_unique_event(3), event.type, handler) is None  # something waits
    assert published == []  # take never publishes
    with pytest.raises(ValueError, match="not the event's type"):
        emitter.take(event, "X:OTHER", handler)
    with pytest.raises(TypeError, match=r"publish takes an openstarry\.core\.Event"):
        emitter.take({}, event.type, handler)  # type: ignore[arg-type]


def test_emitter_take_ref_takes_an_input_that_is_never_made() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    handler, other = object(), object()
    user = "INPUT:USER_MESSAGE"
    by_type[user] = [(handler,), 0, print, "handled"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    assert emitter.take_ref(user, "s-1", "user", handler) is None  # the dispatcher is awake
    emitter.asleep = True
    assert emitter.take_ref(user, "s-1", "user", other) is None  # not its subscriber
    taken = emitter.take_ref(user, "s-1", "user", handler)
    assert isinstance(taken, EventRef)
    assert (taken.type, taken.session_id, taken.source, taken.priority) == (user, "s-1", "user", 2)
    assert uuid.UUID(taken.id).version == 4
    assert uuid.UUID(taken.trace_id).version == 4
    assert taken.trace_id != taken.id
    assert by_type[user][1] == 1  # counted, and its id in the window
    assert queue.unique_pushed == 1
    assert not window.check_and_insert(taken.id)
    # Its children are caused by it: its trace, its session, its id as their parent.
    reply = taken.child("OUTPUT:AGENT_MESSAGE", {"text": "hi"}, source="agent")
    assert (reply.trace_id, reply.session_id, reply.parent_id, reply.source, reply.priority) == (
        taken.trace_id,
        "s-1",
        taken.id,
        "agent",
        2,
    )
    with pytest.raises(DecodeError):
        emitter.take_ref(user, "", "user", handler)  # no session: no event could have it
    by_type[user] = [(handler, other), 1, None, "handled"]
    assert emitter.take_ref(user, "s-1", "user", handler) is None  # two subscribers
    by_type[user] = [(handler,), 1, print, "handled"]
    queue.push("waiting", 5)
    assert emitter.take_ref(user, "s-1", "user", handler) is None  # something waits
    assert published == []  # take_ref never publishes
    assert by_type[user][1] == 1
    queue.pop()
    queue.close()
    with pytest.raises(QueueClosed):
        emitter.take_ref(user, "s-1", "user", handler)


def test_emitter_child_makes_the_caused_event_and_emits_it() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    handler = object()
    by_type["KERNEL:TICK_START"] = [(), 0, None, "no_subscriber"]
    by_type["EXEC:TOOL_CALL"] = [(handler,), 0, None, "handled"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    emitter.asleep = True
    parent = _unique_event(1)
    tick = emitter.child(parent, "KERNEL:TICK_START", {"round": 1}, "agent:a")
    # As parent.child(...) makes it: same trace and session, parent id, the source given.
    assert (tick.type, tick.payload, tick.source) == ("KERNEL:TICK_START", {"round": 1}, "agent:a")
    assert (tick.trace_id, tick.session_id, tick.parent_id) == (
        parent.trace_id,
        parent.session_id,
        parent.id,
    )
    assert tick.priority == parent.priority
    assert by_type["KERNEL:TICK_START"][1] == 1  # admitted and counted, not published
    assert not window.check_and_insert(tick.id)
    assert published == []
    # Only skip listens: admitted; another listens: published.
    skipped = emitter.child(parent, "EXEC:TOOL_CALL", {"n": 1}, "agent:a", handler)
    assert published == []
    call = emitter.child(parent, "EXEC:TOOL_CALL", {"n": 2}, "agent:a")
    assert published == [call]
    assert skipped.id != call.id


def test_emitter_child_of_a_payload_json_cannot_carry_emits_nothing() -> None:
    queue, window, by_type, _, published = _emitter_parts()
    by_type["X:Y"] = [(), 0, None, "no_subscriber"]
    emitter = Emitter(queue, window, by_type, lambda t: by_type[t], published.append)
    emitter.asleep = True
    parent = _unique_event(1)
    with pytest.raises(TypeError):
        emitter.child(parent, "X:Y", {"when": object()}, "agent:a")
    with pytest.raises(ValueError, match="type"):
        emitter.child(parent, "not a type", {}, "agent:a")
    assert by_type["X:Y"][1] == 0
    assert queue.unique_pushed == 0
    queue.close()
    with pytest.raises(QueueClosed):
        emitter.child(parent, "X:Y", {}, "agent:a")


# --- publish: push_unique with a Published handle as the item -------------------------------


def test_publish_queues_a_new_handle_at_the_events_priority() -> None:
    import openstarry.bus  # noqa: F401 - installs the hooks a handle calls

    q = EventQueue()
    window = DedupWindow()
    low, high = _unique_event(1, priority=5), _unique_event(2, priority=1)
    first = q.publish(low, window)
    second = q.publish(high, window)
    assert isinstance(first, Published)
    assert isinstance(second, Published)
    assert first.event is low
    assert q.unique_pushed == 2
    assert q.pop_many(2) == [second, first]
    assert q.publish(low, window) is None  # a duplicate: nothing queued
    assert len(q) == 0


def test_publish_reads_the_clock_for_one_handle_in_sample_every() -> None:
    import openstarry.bus  # noqa: F401 - installs the clock

    q = EventQueue()
    handles = [q.publish(_unique_event(i), None, 3) for i in range(6)]
    assert [h is not None and h._at is not None for h in handles] == [
        False,
        False,
        True,
        False,
        False,
        True,
    ]
    unsampled = q.publish(_unique_event(9))  # sample_every 0: none measured
    assert unsampled is not None
    assert unsampled._at is None


def test_publish_refuses_like_push_unique() -> None:
    q = EventQueue(1)
    window = DedupWindow()
    first, second = _unique_event(1), _unique_event(2)
    assert q.publish(first, window) is not None
    with pytest.raises(QueueFull):
        q.publish(second, window)
    assert window.check_and_insert(second.id)  # the refused id was not recorded
    with pytest.raises(TypeError, match="publish takes an Event"):
        q.publish(first.to_dict())  # type: ignore[arg-type]
    q.close()
    with pytest.raises(QueueClosed):
        q.publish(_unique_event(3))


def test_a_handle_is_untracked_by_the_collector_until_a_waiter_is_stored() -> None:
    q = EventQueue()
    handle = q.publish(_unique_event(1))
    assert handle is not None
    assert not gc.is_tracked(handle)
    handle._state = "handled"  # a str cannot lead back to it
    assert not gc.is_tracked(handle)
    handle._state = threading.Event()  # a waiter may
    assert gc.is_tracked(handle)
    assert handle.outcome is None


def test_a_handle_made_by_hand_takes_only_an_event() -> None:
    event = _unique_event(1)
    handle = Published(event)
    assert handle.event is event
    assert handle
    assert handle.outcome is None
    assert not handle.done()
    handle._finish("duplicate")
    assert not handle
    assert handle.accepted is False
    assert handle.outcome == "duplicate"
    with pytest.raises(TypeError, match="Published takes an Event"):
        Published(event.to_dict())  # type: ignore[arg-type]
