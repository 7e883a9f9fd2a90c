"""The built-in tools (fs.*, get_weather) and resolve_tools."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_harness import context
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import Session
from openstarry.agent.tools import FunctionTool
from openstarry.core import Event
from openstarry.errors import ManifestError, ToolArgumentsError, ToolError
from openstarry.tools import BUILTIN_TOOLS, fs, get_weather, resolve_tools
from openstarry.tools.fs import fs_tools
from openstarry.tools.weather import CONDITIONS

needs_symlinks = pytest.mark.skipif(
    sys.platform == "win32", reason="symbolic links need privileges on Windows"
)


def call(tool: Tool, **args: Any) -> Any:
    """Validate and run a sync tool, as the loop does."""
    context = AgentContext(tools={}, session=Session("s"))
    assert not tool.is_async
    return tool.run(tool.validate(args), context)


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {item.name: item for item in tools}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An allowed directory with a file, a subdirectory, and files outside it."""
    base = tmp_path / "root"
    (base / "sub").mkdir(parents=True)
    (base / "hello.txt").write_text("hello, world\n", encoding="utf-8")
    (base / "sub" / "nested.txt").write_text("nested", encoding="utf-8")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret", encoding="utf-8")
    (tmp_path / "outside.txt").write_text("outside", encoding="utf-8")
    return base


@pytest.fixture
def tools(root: Path) -> dict[str, Tool]:
    return by_name(fs_tools([root]))


def expect_error(code: str, tool: Tool, **args: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        call(tool, **args)
    assert info.value.code == code, str(info.value)
    return info.value


# --- fs happy paths -------------------------------------------------------------------


def test_fs_tools_are_sync_function_tools(tools: dict[str, Tool]) -> None:
    assert list(tools) == ["fs.read", "fs.write", "fs.list"]
    for item in tools.values():
        assert isinstance(item, FunctionTool)
        assert item.is_async is False
        assert item.parameters["additionalProperties"] is False
    assert tools["fs.write"].parameters["required"] == ["path", "content"]
    assert "required" not in tools["fs.list"].parameters


def test_read_relative_and_absolute(root: Path, tools: dict[str, Tool]) -> None:
    assert call(tools["fs.read"], path="hello.txt") == "hello, world\n"
    assert call(tools["fs.read"], path="sub/nested.txt") == "nested"
    assert call(tools["fs.read"], path="./sub/../hello.txt") == "hello, world\n"
    assert call(tools["fs.read"], path=str(root / "sub" / "nested.txt")) == "nested"


def test_read_replaces_bytes_that_are_not_utf8(root: Path, tools: dict[str, Tool]) -> None:
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert call(tools["fs.read"], path="latin1.txt") == "caf\ufffd"


def test_write_creates_and_overwrites(root: Path, tools: dict[str, Tool]) -> None:
    assert call(tools["fs.write"], path="sub/new.txt", content="héllo") == {
        "path": "sub/new.txt",
        "bytes": 6,
    }
    assert (root / "sub" / "new.txt").read_bytes() == "héllo".encode()
    assert call(tools["fs.write"], path=str(root / "hello.txt"), content="bye") == {
        "path": "hello.txt",
        "bytes": 3,
    }
    assert (root / "hello.txt").read_text(encoding="utf-8") == "bye"
    assert call(tools["fs.read"], path="hello.txt") == "bye"


def test_write_refuses_a_missing_parent(root: Path, tools: dict[str, Tool]) -> None:
    error = expect_error("ENOENT", tools["fs.write"], path="nope/new.txt", content="x")
    assert "'nope/new.txt'" in str(error)
    assert not (root / "nope").exists()


def test_list(root: Path, tools: dict[str, Tool]) -> None:
    (root / "b.bin").write_bytes(b"12345")
    assert call(tools["fs.list"]) == [
        {"name": "b.bin", "type": "file", "size": 5},
        {"name": "hello.txt", "type": "file", "size": 13},
        {"name": "sub", "type": "dir", "size": None},
    ]
    assert call(tools["fs.list"], path="sub") == [
        {"name": "nested.txt", "type": "file", "size": 6},
    ]
    assert call(tools["fs.list"], path=str(root / "sub")) == call(tools["fs.list"], path="sub")


@needs_symlinks
def test_symlinks_inside_the_roots_are_fine(root: Path, tools: dict[str, Tool]) -> None:
    (root / "link.txt").symlink_to(root / "sub" / "nested.txt")
    (root / "sublink").symlink_to(root / "sub", target_is_directory=True)
    assert call(tools["fs.read"], path="link.txt") == "nested"
    assert call(tools["fs.read"], path="sublink/nested.txt") == "nested"
    assert call(tools["fs.write"], path="sublink/w.txt", content="w") == {
        "path": "sub/w.txt",
        "bytes": 1,
    }
    # fs.list reports links without following them.
    names = {entry["name"]: entry for entry in call(tools["fs.list"])}
    assert names["link.txt"] == {"name": "link.txt", "type": "symlink", "size": None}
    assert names["sublink"]["type"] == "symlink"


def test_several_roots(tmp_path: Path, root: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "o.txt").write_text("other", encoding="utf-8")
    tools = by_name(fs_tools([root, other]))
    assert call(tools["fs.read"], path=str(other / "o.txt")) == "other"
    # Relative paths are relative to the first root.
    expect_error("ENOENT", tools["fs.read"], path="o.txt")
    assert call(tools["fs.write"], path=str(other / "n.txt"), content="n") == {
        "path": str((other / "n.txt").resolve()),
        "bytes": 1,
    }


# --- fs errors ------------------------------------------------------------------------


def test_missing_file_is_enoent(tools: dict[str, Tool]) -> None:
    error = expect_error("ENOENT", tools["fs.read"], path="missing.txt")
    assert "'missing.txt'" in str(error)
    expect_error("ENOENT", tools["fs.list"], path="missing")


def test_directories_and_files_swapped(tools: dict[str, Tool]) -> None:
    error = expect_error("EISDIR", tools["fs.read"], path="sub")
    assert "'sub'" in str(error)
    expect_error("EISDIR", tools["fs.read"], path=".")
    expect_error("EISDIR", tools["fs.write"], path="sub", content="x")
    expect_error("ENOTDIR", tools["fs.list"], path="hello.txt")
    expect_error("ENOTDIR", tools["fs.read"], path="hello.txt/x")


def test_read_size_limit(root: Path) -> None:
    tools = by_name(fs_tools([root], max_bytes=13))
    assert call(tools["fs.read"], path="hello.txt") == "hello, world\n"  # exactly 13 bytes
    (root / "big.txt").write_bytes(b"x" * 14)
    error = expect_error("EFBIG", tools["fs.read"], path="big.txt")
    assert "'big.txt'" in str(error)
    assert "13 bytes" in str(error)


def test_write_size_limit(root: Path) -> None:
    tools = by_name(fs_tools([root], max_bytes=4))
    assert call(tools["fs.write"], path="ok.txt", content="abcd")["bytes"] == 4
    error = expect_error("EFBIG", tools["fs.write"], path="hello.txt", content="abcde")
    assert "'hello.txt'" in str(error)
    # The refused write left the file as it was.
    assert (root / "hello.txt").read_text() == "hello, world\n"


def test_default_size_limit_is_one_mib(root: Path, tools: dict[str, Tool]) -> None:
    assert fs.DEFAULT_MAX_BYTES == 1024 * 1024
    (root / "big.txt").write_bytes(b"x" * (1024 * 1024 + 1))
    expect_error("EFBIG", tools["fs.read"], path="big.txt")
    (root / "ok.txt").write_bytes(b"x" * (1024 * 1024))
    assert len(call(tools["fs.read"], path="ok.txt")) == 1024 * 1024


@pytest.mark.parametrize("path", ["../outside.txt", "sub/../../outside.txt", "..", "../root"])
def test_dotdot_escapes_are_eperm(tools: dict[str, Tool], path: str) -> None:
    if path == "../root":  # back into the root: allowed
        assert call(tools["fs.read"], path="../root/hello.txt") == "hello, world\n"
        return
    error = expect_error("EPERM", tools["fs.read"], path=path)
    assert repr(path) in str(error)
    expect_error("EPERM", tools["fs.write"], path=path, content="x")
    expect_error("EPERM", tools["fs.list"], path=path)


def test_absolute_path_outside_is_eperm(tmp_path: Path, tools: dict[str, Tool]) -> None:
    outside = str(tmp_path / "outside.txt")
    error = expect_error("EPERM", tools["fs.read"], path=outside)
    assert outside in str(error)
    expect_error("EPERM", tools["fs.write"], path=outside, content="pwned")
    assert (tmp_path / "outside.txt").read_text(encoding="utf-8") == "outside"
    expect_error("EPERM", tools["fs.list"], path=str(tmp_path))
    # A sibling whose name starts with the root's is not inside it.
    (tmp_path / "root2").mkdir()
    (tmp_path / "root2" / "f.txt").write_text("f", encoding="utf-8")
    expect_error("EPERM", tools["fs.read"], path=str(tmp_path / "root2" / "f.txt"))


@needs_symlinks
def test_symlinked_file_pointing_outside_is_eperm(
    tmp_path: Path, root: Path, tools: dict[str, Tool]
) -> None:
    (root / "evil.txt").symlink_to(tmp_path / "outside.txt")
    (root / "dangling.txt").symlink_to(tmp_path / "outside" / "new.txt")
    error = expect_error("EPERM", tools["fs.read"], path="evil.txt")
    assert "'evil.txt'" in str(error)
    expect_error("EPERM", tools["fs.write"], path="evil.txt", content="pwned")
    expect_error("EPERM", tools["fs.write"], path="dangling.txt", content="pwned")
    assert (tmp_path / "outside.txt").read_text(encoding="utf-8") == "outside"
    assert not (tmp_path / "outside" / "new.txt").exists()


@needs_symlinks
def test_symlinked_directory_pointing_outside_is_eperm(
    tmp_path: Path, root: Path, tools: dict[str, Tool]
) -> None:
    (root / "evil").symlink_to(tmp_path / "outside", target_is_directory=True)
    error = expect_error("EPERM", tools["fs.read"], path="evil/secret.txt")
    assert "'evil/secret.txt'" in str(error)
    expect_error("EPERM", tools["fs.list"], path="evil")
    expect_error("EPERM", tools["fs.write"], path="evil/new.txt", content="pwned")
    assert not (tmp_path / "outside" / "new.txt").exists()


@needs_symlinks
def test_symlinked_root_is_resolved(tmp_path: Path, root: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    tools = by_name(fs_tools([alias]))
    assert call(tools["fs.read"], path="hello.txt") == "hello, world\n"
    assert call(tools["fs.read"], path=str(alias / "hello.txt")) == "hello, world\n"
    expect_error("EPERM", tools["fs.read"], path="../outside.txt")


@pytest.mark.skipif(not fs._WALK, reason="needs openat and O_NOFOLLOW")
@needs_symlinks
def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, root: Path, tools: dict[str, Tool], monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "evil").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "evil.txt").symlink_to(tmp_path / "outside.txt")
    # Simulate the race: the check sees no link (as if it were swapped in afterwards).
    monkeypatch.setattr(os.path, "realpath", os.path.abspath)
    error = expect_error("EPERM", tools["fs.read"], path="evil/secret.txt")
    assert "symbolic link" in str(error)
    expect_error("EPERM", tools["fs.read"], path="evil.txt")
    expect_error("EPERM", tools["fs.write"], path="evil.txt", content="pwned")
    expect_error("EPERM", tools["fs.list"], path="evil")
    monkeypatch.undo()
    assert (tmp_path / "outside.txt").read_text(encoding="utf-8") == "outside"


def test_no_allowed_paths_refuses_everything(tmp_path: Path, root: Path) -> None:
    tools = by_name(fs_tools([]))
    for args in ({"path": "hello.txt"}, {"path": str(root / "hello.txt")}):
        error = expect_error("EPERM", tools["fs.read"], **args)
        assert "no directory is allowed" in str(error)
        expect_error("EPERM", tools["fs.write"], content="x", **args)
    expect_error("EPERM", tools["fs.list"])


def test_nul_in_path_is_einval(tools: dict[str, Tool]) -> None:
    expect_error("EINVAL", tools["fs.read"], path="hello\0.txt")


def test_fs_arguments_are_validated(tools: dict[str, Tool]) -> None:
    with pytest.raises(ToolArgumentsError, match=r"fs\.write: argument 'content': field required"):
        tools["fs.write"].validate({"path": "a.txt"})
    with pytest.raises(ToolArgumentsError, match=r"argument 'mode': extra inputs"):
        tools["fs.read"].validate({"path": "a.txt", "mode": "rb"})


# --- get_weather ----------------------------------------------------------------------


def test_weather_taipei() -> None:
    assert get_weather.name == "get_weather"
    assert get_weather.parameters["required"] == ["location"]
    assert get_weather.parameters["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert call(get_weather, location="Taipei") == {
        "location": "Taipei",
        "temperature": 25,
        "unit": "celsius",
        "condition": "Sunny",
        "summary": "25°C, Sunny",
    }
    assert get_weather("  taipei ") == call(get_weather, location="Taipei")
    assert get_weather("Taipei, Taiwan")["summary"] == "25°C, Sunny"


def test_weather_fahrenheit() -> None:
    assert call(get_weather, location="Taipei", unit="fahrenheit") == {
        "location": "Taipei",
        "temperature": 77,
        "unit": "fahrenheit",
        "condition": "Sunny",
        "summary": "77°F, Sunny",
    }
    assert get_weather("Moscow", "fahrenheit")["temperature"] == 25  # -4 °C


def test_weather_is_deterministic_for_unknown_places() -> None:
    first = get_weather("Atlantis")
    assert first == get_weather("ATLANTIS") | {"location": "Atlantis"}
    assert first == get_weather("Atlantis")
    assert -10 <= first["temperature"] <= 35
    assert first["condition"] in CONDITIONS
    # Pinned: a stable hash, not Python's per-process salted hash().
    assert first == {
        "location": "Atlantis",
        "temperature": 9,
        "unit": "celsius",
        "condition": "Cloudy",
        "summary": "9°C, Cloudy",
    }
    assert get_weather("Atlantis", "fahrenheit")["summary"] == "48°F, Cloudy"
    places = {get_weather(f"Town {i}")["summary"] for i in range(40)}
    assert len(places) > 5


def test_weather_refuses_an_empty_location() -> None:
    with pytest.raises(ToolArgumentsError, match=r"argument 'location': string should have"):
        get_weather.validate({"location": ""})
    with pytest.raises(ToolError) as info:
        call(get_weather, location="   ")
    assert info.value.code == "EINVAL"
    with pytest.raises(ToolArgumentsError, match=r"argument 'unit'"):
        get_weather.validate({"location": "Taipei", "unit": "kelvin"})


# --- resolve_tools --------------------------------------------------------------------


@pytest.fixture
def ext_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of tools on sys.path, under a unique name."""
    name = f"ext_tools_{uuid.uuid4().hex}"
    source = textwrap.dedent(
        """
        from typing import Any

        from openstarry import tools as _builtins
        from openstarry.agent.interfaces import AgentContext, Tool
        from openstarry.agent.tools import tool


        class Shout(Tool):
            name = "shout"
            description = "Shout."

            def run(self, args: dict[str, Any], context: AgentContext) -> str:
                return str(args["text"]).upper()


        shout = Shout()


        @tool(name="greet")
        def greet(who: str) -> str:
            return f"hello {who}"


        def add(a: int, b: int = 1) -> int:
            \"\"\"Add two numbers.\"\"\"
            return a + b


        def untyped(a):
            return a


        class Holder:
            shout = Shout()


        NOT_A_TOOL = 42
        weather_again = _builtins.get_weather
        """
    )
    (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in (name, f"{name}_broken"):
        sys.modules.pop(module, None)


def test_builtin_names() -> None:
    assert BUILTIN_TOOLS == ("fs.read", "fs.write", "fs.list", "get_weather")


def test_resolve_builtins(root: Path) -> None:
    resolved = resolve_tools(["get_weather", "fs.write", "fs.read"], allowed_paths=[root])
    assert list(resolved) == ["get_weather", "fs.write", "fs.read"]
    assert resolved["get_weather"] is get_weather
    assert all(name == item.name for name, item in resolved.items())
    # The fs tools share the allowed paths.
    call(resolved["fs.write"], path="n.txt", content="shared")
    assert call(resolved["fs.read"], path="n.txt") == "shared"
    assert resolve_tools([]) == {}
    # Without allowed paths the fs tools exist but refuse every path.
    expect_error("EPERM", resolve_tools(["fs.list"])["fs.list"])


def test_resolve_import_references(ext_module: str) -> None:
    resolved = resolve_tools(
        [f"{ext_module}:shout", f"{ext_module}:greet", f"{ext_module}:add", "fs.list"]
    )
    assert list(resolved) == ["shout", "greet", "add", "fs.list"]
    assert type(resolved["shout"]).__name__ == "Shout"
    assert call(resolved["shout"], text="hi") == "HI"
    assert call(resolved["greet"], who="you") == "hello you"
    add = resolved["add"]
    assert isinstance(add, FunctionTool)
    assert add.description == "Add two numbers."
    assert call(add, a="2") == 3
    # A Tool subclass is instantiated; a dotted attribute is followed.
    assert resolve_tools([f"{ext_module}:Shout"])["shout"].description == "Shout."
    assert call(resolve_tools([f"{ext_module}:Holder.shout"])["shout"], text="a") == "A"


@pytest.mark.parametrize(
    ("entries", "field", "message"),
    [
        (["get_weather", "fs.delete"], "tools[1]", r"unknown built-in tool 'fs.delete'"),
        (["{mod}_missing:x"], "tools[0]", r"cannot import module '{mod}_missing'"),
        (["{mod}_broken:x"], "tools[0]", r"cannot import module .*RuntimeError: boom"),
        (["fs.read", "{mod}:nope"], "tools[1]", r"'{mod}' has no attribute 'nope'"),
        (["{mod}:Holder.nope"], "tools[0]", r"has no attribute 'Holder.nope'"),
        (["{mod}:NOT_A_TOOL"], "tools[0]", r"'{mod}:NOT_A_TOOL': not a tool: int"),
        (["{mod}:untyped"], "tools[0]", r"'{mod}:untyped': not a tool: .*no type hint"),
        (["{mod}:AgentContext"], "tools[0]", r"AgentContext is not a Tool subclass"),
        (["{mod}:"], "tools[0]", r"invalid tool reference '{mod}:'"),
        ([":shout"], "tools[0]", r"invalid tool reference"),
        (["get_weather", "fs.read", "get_weather"], "tools[2]", r"duplicate tool name"),
        (["get_weather", "{mod}:weather_again"], "tools[1]", r"'get_weather'.*tools\[0\]"),
        (["{mod}:greet", "{mod}:greet"], "tools[1]", r"duplicate tool name 'greet'"),
        (["get_weather", 3], "tools[1]", r"tools\[1\] must be a string, not int"),
    ],
)
def test_resolve_errors(ext_module: str, entries: list[Any], field: str, message: str) -> None:
    names = [entry.format(mod=ext_module) if isinstance(entry, str) else entry for entry in entries]
    with pytest.raises(ManifestError, match=message.format(mod=ext_module)) as info:
        resolve_tools(names)
    assert info.value.field == field
    assert info.value.path is None


def test_fs_list_of_a_directory_with_a_non_utf8_name_can_be_reported(tmp_path: Path) -> None:
    """fs.list returns text that JSON and the core can carry, whatever the file names' bytes.

    A single file name that is not UTF-8 must not make the whole directory
    unlistable: its name comes back with replacement characters (as fs.read
    decodes content), not as lone surrogates that no event can encode.
    """
    try:
        fd = os.open(os.path.join(os.fsencode(tmp_path), b"bad\xff.txt"), os.O_CREAT | os.O_WRONLY)
    except OSError:
        pytest.skip("this file system refuses file names that are not UTF-8")
    os.close(fd)
    (tmp_path / "good.txt").write_text("x")
    listing = next(t for t in fs_tools([tmp_path]) if t.name == "fs.list")

    entries: Any = listing.run(listing.validate({}), context())

    assert len(entries) == 2
    assert "good.txt" in [entry["name"] for entry in entries]
    payload = {"toolCallId": "c-1", "name": "fs.list", "success": True, "result": entries}
    event = Event.new("EXEC:TOOL_RESULT", payload, source="test", session_id="s")
    assert len(event.payload["result"]) == 2


@pytest.mark.skipif(not hasattr(os, "link"), reason="needs hard links")
def test_write_refuses_a_hard_link_to_a_file_outside(tmp_path: Path, root: Path) -> None:
    """A hard link inside the root to a file outside it is not written through, nor truncated."""
    tools = by_name(fs_tools([root]))
    outside = tmp_path / "outside" / "secret.txt"
    os.link(outside, root / "linked.txt")
    error = expect_error("EPERM", tools["fs.write"], path="linked.txt", content="pwned")
    assert "hard links" in str(error)
    assert outside.read_text(encoding="utf-8") == "secret"
    # An ordinary file is still written whole, replacing a longer content.
    (root / "plain.txt").write_text("a much longer old content", encoding="utf-8")
    assert call(tools["fs.write"], path="plain.txt", content="new") == {
        "path": "plain.txt",
        "bytes": 3,
    }
    assert (root / "plain.txt").read_text(encoding="utf-8") == "new"
