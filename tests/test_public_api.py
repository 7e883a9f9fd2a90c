"""The public face of openstarry's core: names, docstrings, exceptions, version, no dependencies."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import openstarry
import openstarry.core
import openstarry.errors
from openstarry import _core

ROOT = Path(__file__).resolve().parent.parent

# What the contract (python/openstarry/_core.pyi) promises users of openstarry.core.
CONTRACT = {
    "__version__",
    "ToolIndex",
    "PRIORITY_HIGHEST",
    "PRIORITY_LOWEST",
    "DEFAULT_PRIORITY",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "Event",
    "decode_event",
    "encode_event",
    "ToolCall",
    "ContentSegment",
    "ProviderResponse",
    "decode_response",
    "encode_response",
    "EventQueue",
    "DedupWindow",
    "IngestResult",
    "Ingestor",
}


def test_all_has_the_contract() -> None:
    assert set(openstarry.core.__all__) >= CONTRACT
    assert len(openstarry.core.__all__) == len(set(openstarry.core.__all__))


@pytest.mark.parametrize("name", openstarry.core.__all__)
def test_every_public_name_imports_and_is_documented(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from openstarry.core import {name}", namespace)
    obj = namespace[name]
    assert obj is getattr(openstarry.core, name)
    if inspect.isclass(obj) or callable(obj):
        doc = inspect.getdoc(obj)
        assert doc, f"{name} has no docstring"
        assert doc != inspect.getdoc(object)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_core_re_exports_the_extension(name: str) -> None:
    assert getattr(openstarry.core, name) is getattr(_core, name)


def test_the_modules_are_documented() -> None:
    for module in (openstarry, openstarry.core, openstarry.errors):
        assert inspect.getdoc(module), module.__name__


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from openstarry.core import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(openstarry.core.__all__)


# --- exceptions -------------------------------------------------------------------------------


def test_error_hierarchy() -> None:
    errors = openstarry.errors
    assert issubclass(errors.DecodeError, ValueError)
    assert issubclass(errors.DecodeError, errors.OpenStarryError)
    assert issubclass(errors.QueueFull, asyncio.QueueFull)
    assert issubclass(errors.QueueFull, errors.OpenStarryError)
    assert issubclass(errors.QueueEmpty, asyncio.QueueEmpty)
    assert issubclass(errors.QueueEmpty, errors.OpenStarryError)
    assert issubclass(errors.QueueClosed, errors.OpenStarryError)
    assert issubclass(errors.OpenStarryError, Exception)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.OpenStarryError), name
        assert inspect.getdoc(cls), name


def test_decode_error_attributes() -> None:
    err = openstarry.errors.DecodeError("bad", field="priority", offset=None)
    assert (str(err), err.field, err.offset) == ("bad", "priority", None)
    err = openstarry.errors.DecodeError("bad", offset=3)
    assert (err.field, err.offset) == (None, 3)


def test_the_core_raises_the_classes_of_openstarry_errors() -> None:
    with pytest.raises(openstarry.errors.DecodeError) as info:
        openstarry.core.decode_event(b"{")
    assert type(info.value) is openstarry.errors.DecodeError
    with pytest.raises(ValueError):  # noqa: PT011 - that a DecodeError is a ValueError is the point
        openstarry.core.decode_event(b"[]")
    queue = openstarry.core.EventQueue(1, "reject")
    queue.push("a", 0)
    with pytest.raises(asyncio.QueueFull):
        queue.push("b", 0)
    with pytest.raises(openstarry.errors.QueueFull):
        queue.push("b", 0)
    queue.close()
    with pytest.raises(openstarry.errors.QueueClosed):
        queue.push("c", 0)


def test_core_exports_the_errors_it_raises() -> None:
    for name in ("DecodeError", "QueueFull", "QueueEmpty", "QueueClosed"):
        if name in openstarry.core.__all__:
            assert getattr(openstarry.core, name) is getattr(openstarry.errors, name)


# --- version ----------------------------------------------------------------------------------


def cargo_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', package, re.MULTILINE)
    assert match, "Cargo.toml has a [package] version"
    return match.group(1)


def test_version_matches_cargo_toml() -> None:
    version = cargo_version()
    assert openstarry.core.__version__ == version
    assert openstarry.__version__ == version
    assert _core.__version__ == version


def test_installed_distribution_has_the_same_version() -> None:
    assert importlib.metadata.version("openstarry") == cargo_version()


# --- the standard library is enough -----------------------------------------------------------

BLOCKED = (
    "pydantic",
    "pydantic_core",
    "orjson",
    "msgspec",
    "anyio",
    "trio",
    "sniffio",
    "hypothesis",
    "typing_extensions",
)

STDLIB_ONLY_SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = {blocked!r}
    for name in BLOCKED:
        sys.modules[name] = None  # "import name" now raises ImportError
    before = set(sys.modules)

    import openstarry.core as core
    from openstarry.errors import DecodeError

    # decode and encode
    line = (
        b'{{"id":"9b2c1e5a-0d3f-4c7b-8e6a-1f2d3c4b5a69","timestamp":1700000000000,'
        b'"traceId":"t","source":"s","sessionId":"x","priority":1,'
        b'"type":"INPUT:USER_MESSAGE","payload":{{"text":"hi"}}}}'
    )
    event = core.decode_event(line)
    assert core.encode_event(event) == line
    assert event.payload == {{"text": "hi"}}
    try:
        core.decode_event(b"{{")
    except DecodeError:
        pass
    else:
        raise AssertionError("no DecodeError")
    child = event.child("EXEC:TOOL_CALL", {{"name": "read"}})
    assert core.decode_event(core.encode_event(child)).parent_id == event.id

    # queue
    queue = core.EventQueue()
    queue.push("low", 5)
    queue.push(event)
    assert queue.pop() is event
    assert queue.pop() == "low"
    assert queue.pop() is None

    # dedup
    window = core.DedupWindow(window_ms=1000)
    assert window.check_and_insert("a", now_ms=0)
    assert not window.check_and_insert("a", now_ms=1)

    # ingest
    ingestor = core.Ingestor(core.EventQueue(), core.DedupWindow())
    result = ingestor.ingest(line + b"\\nbad\\n" + line + b"\\n", now_ms=0)
    assert (result.accepted, result.duplicates) == (1, 1), result
    assert [index for index, _ in result.invalid] == [1]
    assert ingestor.queue.pop() == event

    # response
    response = core.decode_response(b'{{"segments":[{{"type":"text","text":"ok"}}]}}')
    assert response.segments[0].text == "ok"

    for name in BLOCKED:
        assert sys.modules[name] is None, name
    third_party = sorted(
        name
        for name in set(sys.modules) - before
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] != "openstarry"
    )
    assert not third_party, third_party
    print("stdlib-only: ok")
    """
).format(blocked=BLOCKED)


def test_core_works_with_only_the_standard_library() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", STDLIB_ONLY_SCRIPT],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "stdlib-only: ok" in completed.stdout


def test_importing_core_does_not_import_third_party_modules() -> None:
    script = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        import openstarry.core
        new = {name.split(".")[0] for name in set(sys.modules) - before}
        print(sorted(new - set(sys.stdlib_module_names) - {"openstarry"}))
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    assert completed.stdout.strip() == "[]"


def test_the_runtime_names_load_lazily_from_the_package() -> None:
    import openstarry.agent

    for name in openstarry.__all__:
        obj = getattr(openstarry, name)
        if name != "__version__":
            assert inspect.getdoc(obj), f"openstarry.{name} has no docstring"
    for name in openstarry.agent.__all__:
        assert getattr(openstarry.agent, name) is not None
    assert openstarry.Agent is openstarry.agent.Agent
    with pytest.raises(AttributeError):
        _ = openstarry.NoSuchName
