"""Building an ``Agent`` from an agent.json: the provider, the tools, the retriever and
the MCP toolsets the manifest names, and the errors for what it cannot resolve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent_harness import manifest_file
from fake_llm_server import FakeLLMServer, chat_answer
from openstarry.agent.tools import tool
from openstarry.assembly import agent_from_manifest
from openstarry.errors import ManifestError


def test_an_unknown_retriever_name_says_what_is_known(tmp_path: Path) -> None:
    path = manifest_file(tmp_path, {"toolRetrieval": {"topN": 2, "retriever": "embedding"}})
    with pytest.raises(ManifestError, match=r"unknown retriever 'embedding': 'lexical' or"):
        agent_from_manifest(path)


#: A bound on any one wait, so a broken component fails a test instead of hanging it.
HANG = 10.0


KEY_ENV = "OPENSTARRY_CONFORMANCE_KEY"


# --- tools for the retrieval tests (named in agent.json by import reference) -----------------


@tool
def convert_currency(amount: float, source: str, target: str) -> str:
    """Convert an amount of money from one currency into another at today's exchange rate.

    Args:
        amount: How much money.
        source: The currency code to convert from, such as USD.
        target: The currency code to convert into, such as EUR.
    """
    return f"{amount} {source} in {target}"


@tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email message to a recipient's mailbox.

    Args:
        to: The recipient's email address.
        subject: The subject line.
        body: The message text.
    """
    return "sent"


@tool
def create_calendar_event(title: str, start: str) -> str:
    """Create a meeting or appointment in the user's calendar.

    Args:
        title: What the meeting is about.
        start: When it starts, as an ISO 8601 date and time.
    """
    return "created"


@tool
def translate_text(text_: str, language: str) -> str:
    """Translate a piece of text into another language.

    Args:
        text_: The text to translate.
        language: The language to translate into.
    """
    return text_


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search airline flights between two airports on a date.

    Args:
        origin: The departure airport.
        destination: The arrival airport.
        date: The day of travel.
    """
    return "none"


@tool
def resize_image(path: str, width: int, height: int) -> str:
    """Resize an image file to a new width and height in pixels.

    Args:
        path: The image file.
        width: The new width.
        height: The new height.
    """
    return path


@tool
def play_music(song: str) -> str:
    """Play a song or a playlist on the speakers.

    Args:
        song: The song or playlist name.
    """
    return song


@tool
def stock_quote(symbol: str) -> str:
    """Look up the latest share price of a stock by its ticker symbol.

    Args:
        symbol: The ticker symbol.
    """
    return symbol


MANY_TOOLS = [
    "get_weather",
    "fs.read",
    "fs.write",
    "fs.list",
    *(
        f"{__name__}:{f}"
        for f in (
            "convert_currency",
            "send_email",
            "create_calendar_event",
            "translate_text",
            "search_flights",
            "resize_image",
            "play_music",
            "stock_quote",
        )
    ),
]


def declared_names(body: dict[str, Any]) -> list[str]:
    """The tool names a Chat Completions request declares."""
    return [entry["function"]["name"] for entry in body.get("tools", [])]


@pytest.mark.anyio
async def test_issue6_only_the_top_n_tools_of_agent_json_reach_the_http_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More tools than ``toolRetrieval.topN``: the default (lexical, no model) retriever
    picks the N most relevant to each input, and only those reach the LLM API."""
    monkeypatch.setenv(KEY_ENV, "k-conformance")
    with FakeLLMServer() as server:
        manifest = {
            "identity": {"name": "many-tools", "version": "1.0.0"},
            "tools": MANY_TOOLS,
            "fs": {"allowedPaths": ["."]},
            "toolRetrieval": {"topN": 2},
            "provider": {
                "name": "openai",
                "model": "gpt-4.1",
                "baseUrl": server.url + "/v1",
                "apiKeyEnv": KEY_ENV,
                "options": {"stream": False, "retryBackoff": 0.01},
            },
        }
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(manifest), encoding="utf-8")
        server.script(None, chat_answer("one"), chat_answer("two"), chat_answer("three"))
        agent = agent_from_manifest(path)
        assert len(agent.tools) == len(MANY_TOOLS)
        with anyio.fail_after(HANG):
            async with agent:
                for line in (
                    "Convert 100 dollars into euros at the exchange rate",
                    "What is the weather forecast in Taipei today?",
                    "Send an email to Ada about the meeting",
                ):
                    result = await agent.ask(line)
                    assert result.error is None, result.error
        asked = [declared_names(request.json) for request in server.requests]
    assert [len(names) for names in asked] == [2, 2, 2]
    assert "convert_currency" in asked[0]
    assert "get_weather" in asked[1]
    assert "send_email" in asked[2]
    # Each input gets its own selection.
    assert len({tuple(sorted(names)) for names in asked}) == 3


def test_approval_tools_named_by_import_reference_wait_for_approval(tmp_path: Path) -> None:
    """``approval.tools`` names an imported tool by its entry in ``tools`` (what the
    manifest's check asks for): the agent's loop knows it by the tool's own name."""
    entry = "test_assembly:send_email"
    path = manifest_file(
        tmp_path,
        {"provider": {"name": "default"}, "tools": [entry], "approval": {"tools": [entry]}},
    )
    agent = agent_from_manifest(path)
    executor = agent.loop._executor
    assert executor.approval_tools == frozenset({"send_email"})
    assert executor.needs_approval(executor.tools["send_email"])


@pytest.mark.anyio
async def test_an_agent_assembled_without_a_bus_runs_its_own(tmp_path: Path) -> None:
    """No ``bus`` in the manifest: entering the agent starts its own bus (the one named
    by a manifest's ``bus`` too; a bus the caller gives stays the caller's to run)."""
    agent = agent_from_manifest(manifest_file(tmp_path, {"provider": {"name": "default"}}))
    with anyio.fail_after(10):
        async with agent:
            result = await agent.ask("hello", session_id="s")
    assert result.text
