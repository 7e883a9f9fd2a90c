"""agent.json's ``mcp.servers`` and ``toolRetrieval`` sections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openstarry.assembly import agent_from_manifest
from openstarry.errors import ManifestError
from openstarry.manifest import load_manifest


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(data))
    return path


BASE: dict[str, Any] = {"identity": {"name": "a"}, "tools": ["get_weather"]}


def test_servers_take_a_command_or_a_url(tmp_path: Path) -> None:
    m = load_manifest(
        write(
            tmp_path,
            {
                **BASE,
                "mcp": {
                    "servers": [
                        {"name": "local", "command": ["python", "-m", "x"], "env": {"A": "1"}},
                        {"name": "peer", "url": "http://127.0.0.1:9/mcp", "tools": ["relay"]},
                    ],
                    "expose_tools": ["peer.relay", "get_weather"],
                },
            },
        )
    )
    local, peer = m.mcp.servers
    assert local.command == ["python", "-m", "x"]
    assert local.env == {"A": "1"}
    assert peer.url == "http://127.0.0.1:9/mcp"
    assert peer.tools == ["relay"]
    assert m.mcp.expose_tools == ["peer.relay", "get_weather"]


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"name": "x"}, "exactly one of command"),
        ({"name": "x", "command": ["a"], "url": "http://h/"}, "exactly one of command"),
        ({"name": "x", "url": "ftp://h/"}, "must start with http"),
        ({"name": "x", "command": []}, "at least 1 item"),
        ({"name": "x.y", "command": ["a"]}, "must match pattern"),
        ({"name": "x", "command": ["a"], "timeout": 0}, "greater than 0"),
        ({"name": "x", "command": ["a"], "bogus": 1}, "bogus"),
    ],
)
def test_bad_servers_are_refused_naming_the_field(
    tmp_path: Path, server: dict[str, Any], message: str
) -> None:
    with pytest.raises(ManifestError, match=message) as info:
        load_manifest(write(tmp_path, {**BASE, "mcp": {"servers": [server]}}))
    assert "mcp.servers" in str(info.value)
    assert str(tmp_path / "agent.json") in str(info.value)


def test_two_servers_may_not_share_a_name(tmp_path: Path) -> None:
    servers = [{"name": "p", "command": ["a"]}, {"name": "p", "url": "http://127.0.0.1:1/"}]
    with pytest.raises(ManifestError, match="two servers are named 'p'"):
        load_manifest(write(tmp_path, {**BASE, "mcp": {"servers": servers}}))


def test_exposed_names_must_be_tools_or_under_a_server(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"'other\.relay' is not in tools"):
        load_manifest(
            write(
                tmp_path,
                {
                    **BASE,
                    "mcp": {
                        "servers": [{"name": "peer", "command": ["a"]}],
                        "expose_tools": ["other.relay"],
                    },
                },
            )
        )


def test_tool_retrieval_section(tmp_path: Path) -> None:
    m = load_manifest(write(tmp_path, {**BASE, "toolRetrieval": {"topN": 8}}))
    assert m.tool_retrieval.top_n == 8
    assert m.tool_retrieval.retriever == "lexical"
    assert load_manifest(write(tmp_path, BASE)).tool_retrieval.top_n is None
    with pytest.raises(ManifestError, match=r"toolRetrieval\.topN"):
        load_manifest(write(tmp_path, {**BASE, "toolRetrieval": {"topN": 0}}))


class FirstOnes:
    """A retriever for the manifest test: the first tools by name."""

    def select(self, query: str, tools: Any, limit: int) -> list[str]:
        return sorted(tools)[:limit]


def test_an_imported_retriever_reaches_the_loop(tmp_path: Path) -> None:
    data = {**BASE, "toolRetrieval": {"topN": 1, "retriever": f"{__name__}:FirstOnes"}}
    agent = agent_from_manifest(write(tmp_path, data))
    assert isinstance(agent.loop.retriever, FirstOnes)
    assert agent.loop.max_tools == 1


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no-colon", "unknown retriever 'no-colon'"),
        ("openstarry_nope_module:X", "cannot import module"),
        (f"{__name__}:Nothing", "has no attribute"),
        (f"{__name__}:BASE", "is not a ToolRetriever"),
    ],
)
def test_a_bad_retriever_reference_names_the_field(
    tmp_path: Path, reference: str, message: str
) -> None:
    data = {**BASE, "toolRetrieval": {"topN": 1, "retriever": reference}}
    with pytest.raises(ManifestError, match=message) as info:
        agent_from_manifest(write(tmp_path, data))
    assert "toolRetrieval.retriever" in str(info.value)


def test_a2a_agents_are_tools_by_name_with_http_urls() -> None:
    from openstarry.errors import ManifestError
    from openstarry.manifest import parse_manifest

    manifest = parse_manifest(
        {
            "identity": {"name": "caller"},
            "tools": ["get_weather"],
            "a2a": {"agents": [{"name": "helper", "url": "http://127.0.0.1:9000"}]},
            "approval": {"tools": ["helper"]},
        }
    )
    [agent] = manifest.a2a.agents
    assert (agent.name, agent.url, agent.approval) == ("helper", "http://127.0.0.1:9000", False)
    for bad, why in (
        ({"name": "get_weather", "url": "http://x"}, "already names"),
        ({"name": "h", "url": "ftp://x"}, "url"),
        ({"name": "a b", "url": "http://x"}, "name"),
    ):
        data = {"identity": {"name": "c"}, "tools": ["get_weather"], "a2a": {"agents": [bad]}}
        with pytest.raises(ManifestError, match=why):
            parse_manifest(data)
