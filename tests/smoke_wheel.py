"""Smoke test of an installed openstarry wheel, in a fresh virtual environment.

Plain script, standard library only: ``make test`` runs it in a venv that holds
nothing but the wheel, so it also proves that ``openstarry.core`` needs no
third-party package. Prints ``smoke: N passed, 0 failed``; exits non-zero on any
failure.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback
import uuid
from collections.abc import Callable

CHECKS: list[tuple[str, Callable[[], None]]] = []


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS.append((fn.__name__, fn))
    return fn


def envelope(event_id: str | None = None, priority: int = 2, **overrides: object) -> bytes:
    env: dict[str, object] = {
        "id": event_id or str(uuid.uuid4()),
        "timestamp": 1_700_000_000_000,
        "traceId": "trace-smoke",
        "source": "smoke",
        "sessionId": "session-smoke",
        "priority": priority,
        "type": "INPUT:USER_MESSAGE",
        "payload": {"text": "hello", "n": [1, 2.5, None]},
    }
    env.update(overrides)
    return json.dumps(env).encode()


@check
def third_party_packages_are_absent() -> None:
    for name in ("pydantic", "pydantic_core", "orjson", "msgspec"):
        assert importlib.util.find_spec(name) is None, f"{name} is importable in the smoke venv"


@check
def core_imports_only_the_standard_library() -> None:
    before = set(sys.modules)
    import openstarry.core  # noqa: F401

    new = {name.split(".")[0] for name in set(sys.modules) - before}
    third_party = new - set(sys.stdlib_module_names) - {"openstarry"}
    assert not third_party, sorted(third_party)


@check
def version_is_set() -> None:
    import openstarry
    import openstarry.core

    assert openstarry.core.__version__
    assert openstarry.__version__ == openstarry.core.__version__


@check
def decode_encode_round_trip() -> None:
    from openstarry.core import decode_event, encode_event

    data = envelope(priority=1, custom={"kept": True})
    event = decode_event(data)
    assert event.priority == 1
    assert event.session_id == "session-smoke"
    assert event.payload == {"text": "hello", "n": [1, 2.5, None]}
    assert event.extra == {"custom": {"kept": True}}
    assert encode_event(event) == data


@check
def new_event_and_child() -> None:
    from openstarry.core import Event, decode_event, encode_event

    event = Event.new("INPUT:USER_MESSAGE", {"text": "hi"}, source="cli", session_id="s")
    assert uuid.UUID(event.id).version == 4
    child = event.child("EXEC:TOOL_CALL", {"name": "read"})
    assert child.trace_id == event.trace_id
    back = decode_event(encode_event(child))
    assert back.parent_id == event.id
    assert back == child


@check
def decode_error_is_a_value_error() -> None:
    from openstarry.core import decode_event
    from openstarry.errors import DecodeError

    for bad, field in ((envelope(priority=6), "priority"), (b'{"id": ', None)):
        caught: DecodeError | None = None
        try:
            decode_event(bad)
        except DecodeError as err:
            caught = err
        assert caught is not None, f"no DecodeError for {bad!r}"
        assert isinstance(caught, ValueError)
        assert caught.field == field, caught


@check
def queue_push_pop() -> None:
    from openstarry.core import EventQueue, decode_event
    from openstarry.errors import QueueFull

    queue = EventQueue(capacity=3)
    queue.push("background", 5)
    queue.push(decode_event(envelope(priority=0)))
    queue.push("normal", 2)
    assert len(queue) == 3
    try:
        queue.push("one too many", 0)
    except QueueFull:
        pass
    else:
        raise AssertionError("no QueueFull")
    first = queue.pop()
    assert first is not None
    assert first.priority == 0
    assert queue.pop() == "normal"
    assert queue.pop() == "background"
    assert queue.pop() is None


@check
def dedup_window() -> None:
    from openstarry.core import DedupWindow

    window = DedupWindow(window_ms=1_000)
    event_id = str(uuid.uuid4())
    assert window.check_and_insert(event_id, now_ms=0) is True
    assert window.check_and_insert(event_id, now_ms=10) is False
    assert window.check_and_insert(event_id.upper(), now_ms=20) is False
    assert window.check_and_insert(event_id, now_ms=5_000) is True


@check
def ingest_batch_with_a_bad_line_and_a_duplicate() -> None:
    from openstarry.core import DedupWindow, EventQueue, Ingestor

    a, b, c = envelope(priority=3), envelope(priority=0), envelope(priority=3)
    data = b"\n".join([a, b"{not json", b, a, c]) + b"\n"
    ingestor = Ingestor(EventQueue(), DedupWindow())
    result = ingestor.ingest(data, now_ms=1_700_000_000_000)
    assert result.accepted == 3, result.accepted
    assert result.duplicates == 1, result.duplicates
    assert [index for index, _ in result.invalid] == [1], result.invalid
    assert result.rejected == []
    order = [ingestor.queue.pop().id for _ in range(3)]
    assert order == [json.loads(x)["id"] for x in (b, a, c)], order
    assert ingestor.queue.pop() is None


@check
def provider_response() -> None:
    from openstarry.core import decode_response, encode_response

    data = (
        b'{"segments": [{"type": "text", "text": "Sure, let me check."},'
        b' {"type": "tool_call", "toolCall": {"name": "get_weather",'
        b' "args": {"location": "Taipei"}}}]}'
    )
    response = decode_response(data)
    call = response.segments[1].tool_call
    assert call is not None
    assert call.name == "get_weather"
    assert call.args == {"location": "Taipei"}
    assert uuid.UUID(call.id)
    assert decode_response(encode_response(response)) == response


def main() -> int:
    passed = failed = 0
    for name, fn in CHECKS:
        try:
            fn()
        except Exception:
            failed += 1
            print(f"FAIL {name}", file=sys.stderr)
            traceback.print_exc()
        else:
            passed += 1
    print(f"smoke: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
