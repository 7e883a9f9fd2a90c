"""agent.json: the manifest model, its loader and its error messages (openstarry.manifest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from openstarry.assembly import agent_from_manifest
from openstarry.errors import ManifestError, OpenStarryError
from openstarry.manifest import (
    MANIFEST_FILENAME,
    AgentManifest,
    FsConfig,
    Identity,
    Limits,
    McpConfig,
    MemoryConfig,
    ProviderConfig,
    load_manifest,
    parse_manifest,
)

FULL: dict[str, Any] = {
    "identity": {"name": "weather-bot", "version": "1.2.0", "description": "Weather answers"},
    "instructions": "You are a concise weather assistant.",
    "provider": {
        "name": "openai",
        "model": "gpt-4o-mini",
        "options": {"temperature": 0.2, "stop": ["\n\n"]},
        "baseUrl": "http://localhost:8080/v1",
        "apiKeyEnv": "OPENAI_API_KEY",
    },
    "tools": ["get_weather", "fs.read", "my_package.tools:forecast"],
    "fs": {"allowedPaths": ["./data", "/srv/shared", "~/notes"], "allowOutside": True},
    "limits": {
        "maxToolRounds": 5,
        "toolTimeout": 2.5,
        "providerTimeout": 60,
        "maxConcurrentTools": 2,
        "maxFailureStreak": 7,
        "repeatedFailureWarning": 2,
    },
    "memory": {"window": None},
    "mcp": {"expose_tools": ["get_weather"], "private_tools": ["fs.read"]},
}

MINIMAL: dict[str, Any] = {"identity": {"name": "x"}}


def write(folder: Path, data: Any, name: str = MANIFEST_FILENAME) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return path


def with_change(base: dict[str, Any], section: str | None, **change: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(base))
    if section is None:
        data.update(change)
    else:
        data.setdefault(section, {}).update(change)
    return data


def load_error(tmp_path: Path, data: Any) -> ManifestError:
    path = write(tmp_path, data)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    err = info.value
    assert isinstance(err, OpenStarryError)
    assert isinstance(err, ValueError)
    assert err.path == str(path)
    assert str(path) in str(err)
    return err


# --- valid manifests ----------------------------------------------------------------------------


def test_full_manifest(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, FULL))
    assert m.identity == Identity(
        name="weather-bot", version="1.2.0", description="Weather answers"
    )
    assert m.instructions == "You are a concise weather assistant."
    assert m.provider == ProviderConfig(
        name="openai",
        model="gpt-4o-mini",
        options={"temperature": 0.2, "stop": ["\n\n"]},
        base_url="http://localhost:8080/v1",
        api_key_env="OPENAI_API_KEY",
    )
    assert m.tools == ["get_weather", "fs.read", "my_package.tools:forecast"]
    assert m.fs.allowed_paths == ["./data", "/srv/shared", "~/notes"]
    assert m.limits == Limits(
        max_tool_rounds=5,
        tool_timeout=2.5,
        provider_timeout=60.0,
        max_concurrent_tools=2,
        max_failure_streak=7,
        repeated_failure_warning=2,
    )
    assert m.memory.window is None
    assert m.mcp == McpConfig(expose_tools=["get_weather"], private_tools=["fs.read"])
    assert m.base_dir == tmp_path


def test_minimal_manifest_defaults() -> None:
    m = parse_manifest(MINIMAL)
    assert m.identity == Identity(name="x", version="0.1.0", description="")
    assert m.instructions is None
    assert m.provider == ProviderConfig(
        name="default", model=None, options={}, base_url=None, api_key_env=None
    )
    assert m.tools == []
    assert m.fs == FsConfig(allowed_paths=[])
    assert m.limits == Limits()
    assert (
        m.limits.max_tool_rounds,
        m.limits.tool_timeout,
        m.limits.provider_timeout,
        m.limits.max_concurrent_tools,
        m.limits.max_failure_streak,
        m.limits.repeated_failure_warning,
    ) == (10, 30.0, 120.0, 4, 5, 3)
    assert isinstance(m.limits.tool_timeout, float)
    assert m.memory == MemoryConfig(window=50)
    assert m.mcp == McpConfig(expose_tools=[], private_tools=[])
    assert m.allowed_paths() == []


def test_manifest_round_trips_through_its_json(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, FULL))
    dumped = json.loads(m.model_dump_json())
    assert dumped["limits"]["toolTimeout"] == 2.5
    assert dumped["provider"]["apiKeyEnv"] == "OPENAI_API_KEY"
    assert dumped["mcp"] == {
        "servers": [],
        "expose_resources": [],
        "private_resources": [],
        **FULL["mcp"],
    }
    assert parse_manifest(dumped, tmp_path) == m
    assert parse_manifest(dumped, tmp_path / "elsewhere") != m  # relative paths differ


def test_manifest_file_may_have_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(MINIMAL).encode())
    assert load_manifest(path).identity.name == "x"


def test_load_accepts_a_path_object_and_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    assert load_manifest(path) == load_manifest(str(path))


# --- paths --------------------------------------------------------------------------------------


def test_allowed_paths_are_relative_to_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "agents" / "bot"
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    m = load_manifest(os.path.relpath(write(folder, FULL), elsewhere))
    assert m.base_dir == folder
    assert m.allowed_paths() == [
        (folder / "data").resolve(),
        Path("/srv/shared").resolve(),
        (tmp_path / "home" / "notes").resolve(),
    ]
    assert all(p.is_absolute() for p in m.allowed_paths())
    assert m.resolve("../x/y.txt") == (tmp_path / "agents" / "x" / "y.txt").resolve()
    assert m.resolve(tmp_path / "abs") == (tmp_path / "abs").resolve()


def test_data_manifest_base_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = with_change(MINIMAL, "fs", allowedPaths=["data"])
    assert parse_manifest(data).allowed_paths() == [(tmp_path / "data").resolve()]
    other = tmp_path / "other"
    assert AgentManifest.from_dict(data, base_dir=other).allowed_paths() == [
        (other / "data").resolve()
    ]
    assert parse_manifest(data, other).base_dir == other


# --- bad files ----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "agent.json"
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(path) in str(info.value)
    assert "cannot read" in str(info.value)
    assert info.value.path == str(path)
    assert info.value.field is None


def test_a_folder_is_not_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path)


def test_bad_json_gives_line_and_column(tmp_path: Path) -> None:
    # A missing comma: every CPython since 3.10 puts it at the same place.
    err = load_error(tmp_path, '{\n  "identity": {"name": "x"},\n  "tools": ["a" "b"]\n}\n')
    assert "invalid JSON at line 3, column 17" in str(err)
    assert err.field is None


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_bytes(b'{"identity": {"name": "\xff"}}')
    with pytest.raises(ManifestError, match="not UTF-8") as info:
        load_manifest(path)
    assert str(path) in str(info.value)


def test_duplicate_json_key(tmp_path: Path) -> None:
    err = load_error(tmp_path, '{"identity": {"name": "x"}, "tools": [], "tools": ["a"]}')
    assert "duplicate key 'tools'" in str(err)


@pytest.mark.parametrize("data", [[], "agent", 3, None])
def test_manifest_must_be_an_object(tmp_path: Path, data: Any) -> None:
    err = load_error(tmp_path, json.dumps(data))
    assert "must be a JSON object" in str(err)


# --- bad fields: each message names the file and the field --------------------------------------

BAD_FIELDS: list[tuple[str, dict[str, Any], str, str]] = [
    ("missing identity", {}, "identity", "required field is missing"),
    ("missing name", {"identity": {}}, "identity.name", "required field is missing"),
    ("empty name", {"identity": {"name": ""}}, "identity.name", "at least 1 character"),
    ("name type", {"identity": {"name": 3}}, "identity.name", "must be a valid string, got 3"),
    (
        "timeout as text",
        with_change(MINIMAL, "limits", toolTimeout="30"),
        "limits.toolTimeout",
        'must be a valid number, got "30"',
    ),
    (
        "negative timeout",
        with_change(MINIMAL, "limits", toolTimeout=-1),
        "limits.toolTimeout",
        "must be greater than 0, got -1",
    ),
    (
        "zero provider timeout",
        with_change(MINIMAL, "limits", providerTimeout=0),
        "limits.providerTimeout",
        "greater than 0",
    ),
    (
        "fractional rounds",
        with_change(MINIMAL, "limits", maxToolRounds=1.5),
        "limits.maxToolRounds",
        "must be a valid integer, got 1.5",
    ),
    (
        "boolean concurrency",
        with_change(MINIMAL, "limits", maxConcurrentTools=True),
        "limits.maxConcurrentTools",
        "valid integer, got true",
    ),
    (
        "zero rounds",
        with_change(MINIMAL, "limits", maxToolRounds=0),
        "limits.maxToolRounds",
        "greater than or equal to 1",
    ),
    (
        "warning of one",
        with_change(MINIMAL, "limits", repeatedFailureWarning=1),
        "limits.repeatedFailureWarning",
        "greater than or equal to 2",
    ),
    (
        "zero window",
        with_change(MINIMAL, "memory", window=0),
        "memory.window",
        "greater than or equal to 1",
    ),
    (
        "tools not a list",
        with_change(MINIMAL, None, tools="fs.read"),
        "tools",
        "must be a valid list",
    ),
    (
        "tool not a string",
        with_change(MINIMAL, None, tools=["a", 2]),
        "tools[1]",
        "must be a valid string",
    ),
    (
        "options not an object",
        with_change(MINIMAL, "provider", options=[]),
        "provider.options",
        "valid dictionary",
    ),
    (
        "unknown top-level key",
        with_change(MINIMAL, None, limitz={}),
        "limitz",
        "unknown field; did you mean 'limits'?",
    ),
    (
        "unknown nested key",
        with_change(MINIMAL, "limits", toolTimout=3),
        "limits.toolTimout",
        "unknown field; did you mean 'toolTimeout'?",
    ),
    (
        "snake_case where camelCase is the wire name",
        with_change(MINIMAL, "limits", tool_timeout=3),
        "limits.tool_timeout",
        "did you mean 'toolTimeout'?",
    ),
    (
        "camelCase where snake_case is the wire name",
        with_change(MINIMAL, "mcp", exposeTools=[]),
        "mcp.exposeTools",
        "did you mean 'expose_tools'?",
    ),
    (
        "unknown key with nothing close",
        with_change(MINIMAL, "memory", zzz=1),
        "memory.zzz",
        "unknown field (known: window)",
    ),
    (
        "duplicate tool",
        with_change(MINIMAL, None, tools=["a", "b", "a"]),
        "tools[2]",
        "duplicate tool 'a' (already tools[0])",
    ),
    (
        "tool with a space",
        with_change(MINIMAL, None, tools=["fs read"]),
        "tools[0]",
        "without spaces",
    ),
    (
        "exposed and private",
        with_change(
            MINIMAL,
            None,
            tools=["a", "b"],
            mcp={"expose_tools": ["a"], "private_tools": ["b", "a"]},
        ),
        "mcp.private_tools[1]",
        "'a' is in both expose_tools and private_tools",
    ),
    (
        "exposed but not a tool",
        with_change(MINIMAL, None, tools=["a"], mcp={"expose_tools": ["a", "b"]}),
        "mcp.expose_tools[1]",
        "'b' is not in tools",
    ),
    (
        "private but not a tool",
        with_change(MINIMAL, None, mcp={"private_tools": ["secret"]}),
        "mcp.private_tools[0]",
        "'secret' is not in tools",
    ),
    (
        "empty allowed path",
        with_change(MINIMAL, "fs", allowedPaths=["a", ""]),
        "fs.allowedPaths[1]",
        "must not be empty",
    ),
]


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [case[1:] for case in BAD_FIELDS],
    ids=[case[0] for case in BAD_FIELDS],
)
def test_bad_field_in_a_file(
    tmp_path: Path, data: dict[str, Any], field: str, problem: str
) -> None:
    err = load_error(tmp_path, data)
    assert err.field == field
    assert str(err).startswith(f"{err.path}: {field}: ")
    assert problem in str(err)
    assert "\n" not in str(err)  # one problem, one line


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [case[1:] for case in BAD_FIELDS],
    ids=[case[0] for case in BAD_FIELDS],
)
def test_bad_field_in_data(data: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ManifestError) as info:
        AgentManifest.from_dict(data)
    err = info.value
    assert err.path is None
    assert err.field == field
    assert str(err).startswith(f"manifest data: {field}: ")
    assert problem in str(err)


def test_several_problems_are_all_reported(tmp_path: Path) -> None:
    data = {
        "identity": {"name": ""},
        "tools": ["a", "a"],
        "limits": {"toolTimeout": -1, "maxToolRounds": "many"},
        "extra": True,
    }
    err = load_error(tmp_path, data)
    text = str(err)
    assert text.startswith(f"{err.path}: 5 problems:\n")
    lines = text.splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        "identity.name",
        "tools[1]",
        "limits.maxToolRounds",
        "limits.toolTimeout",
        "extra",
    ]
    assert err.field == "identity.name"


def test_several_mcp_problems_are_all_reported() -> None:
    data = with_change(
        MINIMAL, None, tools=["a"], mcp={"expose_tools": ["a", "x"], "private_tools": ["a", "y"]}
    )
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    text = str(info.value)
    assert "3 problems" in text
    assert "mcp.expose_tools[1]: 'x' is not in tools" in text
    assert "mcp.private_tools[0]: 'a' is in both expose_tools and private_tools" in text
    assert "mcp.private_tools[1]: 'y' is not in tools" in text
    assert info.value.field == "mcp.expose_tools[1]"


def test_not_a_number_is_rejected(tmp_path: Path) -> None:
    err = load_error(tmp_path, '{"identity": {"name": "x"}, "limits": {"toolTimeout": NaN}}')
    assert err.field == "limits.toolTimeout"


def test_the_model_rejects_the_same_as_the_loader() -> None:
    with pytest.raises(ValueError, match="duplicate tool"):
        AgentManifest(identity=Identity(name="x"), tools=["a", "a"])
    with pytest.raises(ValueError, match="is not in tools"):
        AgentManifest(identity=Identity(name="x"), mcp=McpConfig(expose_tools=["a"]))


# --- JSON Schema --------------------------------------------------------------------------------


def test_json_schema_of_agent_json() -> None:
    schema = AgentManifest.json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["required"] == ["identity"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {
        "api",
        "toolRetrieval",
        "identity",
        "instructions",
        "provider",
        "tools",
        "fs",
        "limits",
        "memory",
        "approval",
        "mcp",
        "a2a",
        "bus",
        "sessions",
    }
    defs = schema["$defs"]
    limits = defs["Limits"]
    assert limits["additionalProperties"] is False
    assert limits["properties"]["toolTimeout"]["exclusiveMinimum"] == 0
    assert limits["properties"]["maxToolRounds"]["minimum"] == 1
    assert limits["properties"]["repeatedFailureWarning"]["minimum"] == 2
    assert set(defs["ProviderConfig"]["properties"]) == {
        "name",
        "model",
        "options",
        "baseUrl",
        "apiKeyEnv",
    }
    assert set(defs["FsConfig"]["properties"]) == {"allowedPaths", "allowOutside"}
    assert set(defs["McpConfig"]["properties"]) == {
        "servers",
        "expose_tools",
        "private_tools",
        "expose_resources",
        "private_resources",
    }
    assert set(defs["McpServerConfig"]["properties"]) == {
        "name",
        "command",
        "env",
        "cwd",
        "url",
        "tools",
        "timeout",
        "approval",
    }
    assert set(defs["ToolRetrievalConfig"]["properties"]) == {"topN", "retriever"}
    assert defs["Identity"]["required"] == ["name"]
    json.dumps(schema)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo (POSIX)")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "agent.json"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError, match="not a regular file") as info:
        load_manifest(fifo)
    assert info.value.path == str(fifo)


def test_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param('{"identity": ' + "[" * 50_000 + "]" * 50_000 + "}", id="deep-json"),
        pytest.param(
            '{"identity": {"name": "x"}, "limits": {"maxToolRounds": ' + "1" * 5000 + "}}",
            id="int-over-4300-digits",
        ),
    ],
)
def test_json_the_decoder_refuses_is_a_manifest_error_naming_the_file(
    tmp_path: Path, content: str
) -> None:
    """Manifest JSON the decoder refuses for any reason (nesting too deep, an integer
    over Python's digit limit) is a ManifestError naming the file, so ``openstarry
    run`` prints a message and exits 2 instead of a traceback."""
    manifest = tmp_path / "agent.json"
    manifest.write_text(content, encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load_manifest(manifest)
    assert info.value.path == str(manifest)
    assert str(manifest) in str(info.value)


def test_a_nul_in_allowed_paths_is_a_manifest_error_naming_file_and_field(
    tmp_path: Path,
) -> None:
    """A NUL character in ``fs.allowedPaths`` is a ManifestError naming the file and
    the field (``fs.allowedPaths[0]``), not a bare ValueError from path resolution."""
    manifest = tmp_path / "agent.json"
    data = {"identity": {"name": "x"}, "fs": {"allowedPaths": ["a\0b"]}, "tools": ["fs.read"]}
    manifest.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        agent_from_manifest(manifest)
    assert str(manifest) in str(info.value)
    assert "fs.allowedPaths[0]" in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS as Linux has it")
def test_load_manifest_of_a_huge_file_is_a_manifest_error_naming_the_file(tmp_path: Path) -> None:
    """A manifest file far too large to be one gets a ``ManifestError`` that names the file.

    ``load_manifest`` reads the whole file first; a (sparse) 1 TiB file then
    ends in a bare ``MemoryError`` that names nothing. The check runs in a child
    process with a bounded address space, so it costs no real memory.
    """
    path = tmp_path / "agent.json"
    try:
        with path.open("wb") as f:
            f.write(b'{"identity": {"name": "a"}}')
            f.truncate(1 << 40)
    except OSError:
        pytest.skip("this file system cannot hold a sparse 1 TiB file")
    code = textwrap.dedent(
        """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
        from openstarry.errors import ManifestError
        from openstarry.manifest import load_manifest
        try:
            load_manifest(sys.argv[1])
        except ManifestError as exc:
            print("ManifestError", sys.argv[1] in str(exc))
        except BaseException as exc:
            print("other", type(exc).__name__)
        else:
            print("accepted")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["ManifestError", "True"], done.stderr


def test_exposing_an_imported_tool_by_its_name_says_how_to_name_it() -> None:
    with pytest.raises(ValueError, match=r"name an imported tool by its entry in tools"):
        AgentManifest.model_validate(
            {
                "identity": {"name": "x"},
                "tools": ["mcp_fixtures.tools:mumble"],
                "mcp": {"expose_tools": ["mumble"]},
            }
        )


@pytest.mark.skipif(os.name == "nt", reason="POSIX folders")
@pytest.mark.parametrize(
    ("allowed", "why"),
    [
        ("/", "the root of the file system"),
        ("/etc", "a system folder"),
        ("/usr/share", "a system folder"),
        ("..", "outside the manifest's folder"),
        ("data/../../elsewhere", "outside the manifest's folder"),
    ],
)
def test_allowed_paths_outside_the_manifest_folder_need_allow_outside(
    tmp_path: Path, allowed: str, why: str
) -> None:
    folder = tmp_path / "agent"
    folder.mkdir()
    data = with_change(MINIMAL, "fs", allowedPaths=["data", allowed])
    err = load_error(folder, data)
    assert err.field == "fs.allowedPaths[1]"
    assert why in str(err)
    assert "allowOutside" in str(err)
    accepted = load_manifest(write(folder, with_change(data, "fs", allowOutside=True)))
    assert accepted.allowed_paths()[1] == (folder / allowed).resolve()


def test_allowed_paths_inside_the_manifest_folder_need_nothing(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data", target_is_directory=True)
    data = with_change(MINIMAL, "fs", allowedPaths=[".", "data", "link"])
    m = load_manifest(write(tmp_path, data))
    assert m.fs.allow_outside is False
    inside = (tmp_path / "data").resolve()
    assert m.allowed_paths() == [tmp_path.resolve(), inside, inside]


def test_a_link_inside_the_folder_to_a_system_folder_needs_allow_outside(tmp_path: Path) -> None:
    (tmp_path / "etc").symlink_to("/etc", target_is_directory=True)
    err = load_error(tmp_path, with_change(MINIMAL, "fs", allowedPaths=["etc"]))
    assert "a system folder" in str(err)


def test_api_expose_tools_are_tools_and_never_private(tmp_path: Path) -> None:
    base = with_change(MINIMAL, None, tools=["get_weather", "fs.read"])
    m = load_manifest(write(tmp_path, with_change(base, "api", expose_tools=["get_weather"])))
    assert m.api.expose_tools == ["get_weather"]
    assert AgentManifest.json_schema()["properties"]["api"]
    err = load_error(tmp_path, with_change(base, "api", expose_tools=["nope"]))
    assert err.field == "api.expose_tools[0]"
    private = with_change(base, "mcp", private_tools=["fs.read"])
    err = load_error(tmp_path, with_change(private, "api", expose_tools=["fs.read"]))
    assert "never reachable over HTTP" in str(err)
