"""Tool-set fingerprints and the schema cache (spec 000 section 6A)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent_harness import HANG
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.registry import (
    FINGERPRINT_PREFIX,
    SchemaCache,
    canonical_tool_set,
    tool_set_fingerprint,
)
from openstarry.agent.tools import tool

ROOT = Path(__file__).resolve().parent.parent


class Spec(Tool):
    def __init__(
        self, name: str, description: str = "", parameters: Mapping[str, Any] | None = None
    ) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters or {"type": "object", "properties": {}}

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        return None


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "The city, such as Taipei."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["location"],
}


def weather() -> Spec:
    return Spec("get_weather", "Get the current weather.", WEATHER_SCHEMA)


def tools() -> list[Tool]:
    return [
        weather(),
        Spec(
            "fs.read",
            "Read a file.",
            {"type": "object", "properties": {"path": {"type": "string"}}},
        ),
        Spec("fs.list", "List a folder."),
    ]


def _reordered(value: Any) -> Any:
    """The same JSON with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


# --- the fingerprint --------------------------------------------------------------------------


def test_the_canonical_form_is_sorted_compact_json() -> None:
    one = Spec("b", "Bé", {"type": "object", "properties": {"z": {}, "a": {"type": "integer"}}})
    two = Spec("a", "", {"type": "object"})
    expected = (
        '[{"description":"","name":"a","parameters":{"type":"object"}},'
        '{"description":"Bé","name":"b","parameters":'
        '{"properties":{"a":{"type":"integer"},"z":{}},"type":"object"}}]'
    ).encode()
    assert canonical_tool_set([one, two]) == expected
    fingerprint = tool_set_fingerprint([one, two])
    assert fingerprint == "ts_" + hashlib.sha256(expected).hexdigest()
    assert fingerprint.startswith(FINGERPRINT_PREFIX)
    assert len(fingerprint) == 3 + 64
    # Pinned: changing the canonical form would orphan every cached upload.
    assert fingerprint == "ts_65a42fbd4b933ca35b70a5da0d22a3db7868b7929ae96ec791aea73fb86da67c"
    assert tool_set_fingerprint([]) == "ts_" + hashlib.sha256(b"[]").hexdigest()


def test_independent_of_the_order_of_tools_and_of_keys() -> None:
    base = tool_set_fingerprint(tools())
    for seed in range(5):
        shuffled = tools()
        random.Random(seed).shuffle(shuffled)
        assert tool_set_fingerprint(shuffled) == base
    assert tool_set_fingerprint({t.name: t for t in reversed(tools())}) == base
    assert tool_set_fingerprint(iter(tools())) == base
    reordered = [Spec(t.name, t.description, _reordered(dict(t.parameters))) for t in tools()]
    assert list(reordered[0].parameters) == ["required", "properties", "type"]
    assert tool_set_fingerprint(reordered) == base


def test_sensitive_to_every_part() -> None:
    base = tool_set_fingerprint(tools())
    changed_schema = json.loads(json.dumps(WEATHER_SCHEMA))
    changed_schema["properties"]["unit"]["enum"].append("kelvin")
    variants = [
        [Spec("get_weather2", "Get the current weather.", WEATHER_SCHEMA), *tools()[1:]],
        [Spec("get_weather", "Get the weather.", WEATHER_SCHEMA), *tools()[1:]],
        [Spec("get_weather", "Get the current weather.", changed_schema), *tools()[1:]],
        [
            Spec("get_weather", "Get the current weather.", {**WEATHER_SCHEMA, "required": []}),
            *tools()[1:],
        ],
        tools()[:2],
        [*tools(), Spec("fs.write")],
        # The description moved to another tool: each part is tied to its tool.
        [
            Spec("get_weather", "List a folder.", WEATHER_SCHEMA),
            tools()[1],
            Spec("fs.list", "Get the current weather."),
        ],
    ]
    prints = [tool_set_fingerprint(v) for v in variants]
    assert base not in prints
    assert len(set(prints)) == len(prints)


def test_a_decorated_tool_has_its_fingerprint() -> None:
    @tool
    def get_weather(location: str) -> str:
        """Get the current weather.

        Args:
            location: The city.
        """
        return location

    described = get_weather.describe()
    by_hand = Spec(described["name"], described["description"], described["parameters"])
    assert tool_set_fingerprint([get_weather]) == tool_set_fingerprint([by_hand])


_CHILD = """
import json, sys
from openstarry.agent.registry import tool_set_fingerprint
from openstarry.agent.interfaces import Tool

class Spec(Tool):
    def __init__(self, name, description, parameters):
        self.name, self.description, self.parameters = name, description, parameters
    def run(self, args, context):
        return None

specs = json.loads(sys.stdin.read())
print(tool_set_fingerprint([Spec(*s) for s in specs]))
"""


def test_the_same_in_another_process() -> None:
    specs = [[t.name, t.description, dict(t.parameters)] for t in tools()]
    here = tool_set_fingerprint(tools())
    for seed in ("0", "12345"):
        random.Random(seed).shuffle(specs)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=json.dumps(specs),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.stdout.strip() == here


def test_tool_sets_that_cannot_be_fingerprinted() -> None:
    with pytest.raises(ValueError, match="two tools are named 'a'"):
        tool_set_fingerprint([Spec("a"), Spec("a", "other")])
    with pytest.raises(TypeError, match="tool 'odd': its schema is not plain JSON"):
        tool_set_fingerprint([Spec("fine"), Spec("odd", "", {"type": "object", "enum": {1, 2}})])
    with pytest.raises(ValueError, match="tool 'nan': its schema is not plain JSON"):
        tool_set_fingerprint([Spec("nan", "", {"type": "number", "maximum": float("nan")})])


# --- SchemaCache ------------------------------------------------------------------------------


def test_get_or_create_makes_each_value_once() -> None:
    cache: SchemaCache[list[str]] = SchemaCache()
    key = SchemaCache.key_for("openai", tools())
    assert key == ("openai", tool_set_fingerprint(tools()))
    made: list[int] = []

    def translate() -> list[str]:
        made.append(1)
        return [t.name for t in tools()]

    first = cache.get_or_create(key, translate)
    assert cache.get_or_create(key, translate) is first
    assert cache.get_or_create(SchemaCache.key_for("openai", reversed(tools())), translate) is first
    assert len(made) == 1
    assert cache.get_or_create(("gemini", key[1]), translate) is not first
    assert len(made) == 2
    assert (cache.hits, cache.misses, len(cache)) == (2, 2, 2)


def test_least_recently_used_goes_first() -> None:
    cache: SchemaCache[int] = SchemaCache(max_entries=3)
    for i in range(3):
        cache.put(("api", f"ts_{i}"), i)
    assert cache.get(("api", "ts_0")) == 0  # now the most recent
    cache.put(("api", "ts_3"), 3)
    assert ("api", "ts_1") not in cache
    assert cache.keys() == [("api", "ts_2"), ("api", "ts_0"), ("api", "ts_3")]
    for i in range(4, 10):
        cache.get_or_create(("api", f"ts_{i}"), lambda i=i: i)  # type: ignore[misc]
    assert len(cache) == 3
    assert cache.evictions == 7
    assert cache.keys() == [("api", "ts_7"), ("api", "ts_8"), ("api", "ts_9")]
    assert cache.get(("api", "ts_0")) is None
    assert "3/3" in repr(cache)


def test_a_failing_factory_stores_nothing() -> None:
    cache: SchemaCache[str] = SchemaCache()

    def broken() -> str:
        raise RuntimeError("upload refused")

    with pytest.raises(RuntimeError, match="upload refused"):
        cache.get_or_create(("api", "ts_x"), broken)
    assert ("api", "ts_x") not in cache
    assert cache.get_or_create(("api", "ts_x"), lambda: "ok") == "ok"


def test_discard_clear_and_bad_bounds() -> None:
    cache: SchemaCache[str] = SchemaCache(2)
    cache.put(("a", "1"), "x")
    cache.put(("a", "2"), "y")
    cache.discard(("a", "1"))
    cache.discard(("a", "missing"))
    assert cache.keys() == [("a", "2")]
    cache.clear()
    assert len(cache) == 0
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="max_entries must be an int of at least 1"):
            SchemaCache(bad)  # type: ignore[arg-type]


def test_threads_agree_on_one_value() -> None:
    cache: SchemaCache[object] = SchemaCache()
    got: list[object] = []
    barrier = threading.Barrier(8, timeout=10)  # bounded: a stuck thread fails the test

    def work() -> None:
        barrier.wait()
        got.append(cache.get_or_create(("api", "ts"), object))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert len(got) == 8
    assert all(value is got[0] for value in got)
    assert cache.get(("api", "ts")) is got[0]


@pytest.mark.anyio
async def test_concurrent_async_creations_run_the_factory_once() -> None:
    cache: SchemaCache[str] = SchemaCache()
    uploads: list[int] = []
    release = anyio.Event()

    async def upload() -> str:
        uploads.append(1)
        await release.wait()
        return f"tools_{len(uploads)}"

    got: list[str] = []

    async def ask() -> None:
        got.append(await cache.aget_or_create(("gemini", "ts_1"), upload))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        assert uploads == [1]
        release.set()
    assert got == ["tools_1"] * 5
    assert (cache.hits, cache.misses) == (0, 5)
    assert await cache.aget_or_create(("gemini", "ts_1"), upload) == "tools_1"
    assert cache.hits == 1
    assert uploads == [1]


@pytest.mark.anyio
async def test_a_failed_async_creation_lets_a_waiter_try_again() -> None:
    cache: SchemaCache[str] = SchemaCache()
    attempts: list[int] = []
    first_may_fail = anyio.Event()

    async def upload() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            await first_may_fail.wait()
            raise ConnectionError("server said 503")
        return "tools_ok"

    errors: list[BaseException] = []
    got: list[str] = []

    async def ask() -> None:
        try:
            got.append(await cache.aget_or_create(("openai", "ts_1"), upload))
        except ConnectionError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        first_may_fail.set()
    assert len(errors) == 1
    assert got == ["tools_ok", "tools_ok"]
    assert len(attempts) == 2


@pytest.mark.anyio
async def test_a_cancelled_async_creation_lets_a_waiter_try_again() -> None:
    cache: SchemaCache[str] = SchemaCache()
    attempts: list[int] = []

    async def upload() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            await anyio.sleep_forever()
        return "tools_ok"

    got: list[str] = []
    first = anyio.CancelScope()

    async def creator() -> None:
        with first:
            await cache.aget_or_create(("openai", "ts_1"), upload)

    async def waiter() -> None:
        got.append(await cache.aget_or_create(("openai", "ts_1"), upload))

    async with anyio.create_task_group() as tg:
        tg.start_soon(creator)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert attempts == [1]
        first.cancel()
    assert got == ["tools_ok"]
    assert len(attempts) == 2
    assert cache.get(("openai", "ts_1")) == "tools_ok"


def test_text_read_with_surrogateescape_has_a_fingerprint() -> None:
    one = tool_set_fingerprint([Spec("odd", "bytes \udcff")])
    two = tool_set_fingerprint([Spec("odd", "bytes \udcfe")])
    assert one != two
    assert one == tool_set_fingerprint([Spec("odd", "bytes \udcff")])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_creation_in_one_event_loop_does_not_hang_another(backend: str) -> None:
    """Two threads, each with its event loop, share one cache (say, one provider).

    The second asked while the first was creating: it waited on the first
    loop's signal, which cannot wake it (asyncio: stuck until something else
    woke its loop; trio: AttributeError).
    """
    cache: SchemaCache[str] = SchemaCache()
    key = ("api", "ts_same")
    creating = threading.Event()
    second_done = threading.Event()
    out: dict[str, Any] = {}

    def first() -> None:
        async def main() -> None:
            async def factory() -> str:
                creating.set()
                # Still creating while the other loop asks.
                second_done.wait(HANG)
                return "first"

            out["first"] = await cache.aget_or_create(key, factory)

        anyio.run(main, backend="asyncio")

    def second() -> None:
        async def main() -> None:
            async def factory() -> str:
                return "second"

            creating.wait(HANG)
            with anyio.move_on_after(2) as scope:
                out["second"] = await cache.aget_or_create(key, factory)
            out["hung"] = scope.cancelled_caught

        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:  # reported below
            out["error"] = exc
        finally:
            second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG * 2)
    assert "error" not in out, out
    # Not hung: the first factory waits for the second call to finish, so a second call that
    # waited for the first would have been cut off by its 2 s limit.
    assert out["hung"] is False
    # Whichever was stored first is what both get.
    assert out["first"] == out["second"] == "second"
    assert cache.keys() == [key]
