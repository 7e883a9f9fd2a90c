"""Golden files: what each HTTP provider sends and what it makes of each recorded answer.

For each API (``openai``, ``openai-responses``, ``anthropic``, ``gemini``) and
each recorded answer under ``tests/fixtures/providers/<api>/`` (``response_*.json``
asked for whole, ``stream_*.json`` streamed), the provider the registry makes,
pointed with ``baseUrl`` at a :class:`FakeLLMServer` on 127.0.0.1 that serves
that answer, answers a conversation with a user turn, two tool calls and their
outcomes, and two tools declared. Each case checks, against
``tests/fixtures/providers/<api>/golden/<answer>.json``:

* the request the server got: its method, path (with the query), its body
  byte for byte (the text, and its SHA-256; the parsed JSON too, for a readable
  difference) and the headers that say what the request is (``content-type``,
  ``accept``, the API's key header with the key as ``<key>``, its version
  header), not those of the transport (``user-agent``, ``host``,
  ``content-length``, ``accept-encoding``, ``connection``, ``traceparent``);
  an ``Accept: */*`` (httpx's default, which means what no ``Accept`` means)
  is left out;
* the response ``generate`` returned, as :func:`openstarry.core.encode_response`
  writes it, without its ``latency_ms``; the ids the provider makes up for
  calls the API gave none (UUIDs, Gemini) are written ``<uuid-1>``, ``<uuid-2>``...
  in order of appearance;
* the text passed to the context while the answer streamed, piece by piece.

Each case asks twice with the same provider: the second call reuses the tool
declarations the first translated (and may reuse its connection). Both requests
are recorded (the httpx provider puts the declarations' keys last in the second
body: the same JSON, other bytes); the answer must be the same both times. The
cases use the provider's public face only (the registry, ``generate``), so they
hold for any transport.

The golden files were recorded from the httpx transport. To record them again
(a new answer fixture, or a change meant to alter what is sent)::

    OPENSTARRY_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_provider_golden.py

and review the difference before committing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import anyio
import pytest

from fake_llm_server import FakeLLMServer, Recorded, Reply, sse
from openstarry import core
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import (
    AssistantTurn,
    MemoryEntry,
    Observation,
    Session,
    ToolFailure,
    ToolOutcome,
    UserTurn,
)
from openstarry.protocol import ToolCall
from openstarry.providers import create_provider

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
RECORD = os.environ.get("OPENSTARRY_RECORD_GOLDEN", "") not in ("", "0")
KEY_ENV = "OPENSTARRY_TEST_GOLDEN_KEY"
KEY = "sk-golden-Zq8vK3secretVALUE-0042"
#: A bound on each call, so a broken transport fails instead of hanging.
HANG = 10
#: The headers recorded: what the request is, not how it travelled.
HEADERS = (
    "content-type",
    "content-encoding",
    "accept",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "anthropic-version",
    "anthropic-beta",
    "openai-organization",
    "openai-project",
    "openai-beta",
)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
#: The golden files written by this run (recording): a second backend checks against them.
_RECORDED: set[Path] = set()


# --- the conversation each API is asked about ----------------------------------------------------


class _Tool(Tool):
    """A declared tool; the provider only describes it."""

    def __init__(self, name: str, description: str, parameters: Mapping[str, Any]) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise AssertionError("the provider never runs a tool")


def _load(folder: str, name: str) -> Any:
    return json.loads((FIXTURES / folder / name).read_text(encoding="utf-8"))


def _openai_entry(raw: Mapping[str, Any]) -> MemoryEntry:
    """A memory entry of ``openai_*/request_conversation.json``."""
    role = raw["role"]
    if role == "user":
        return UserTurn(raw["text"])
    if role == "assistant":
        calls = tuple(
            core.ToolCall(c["name"], c["args"], id=c["id"]) for c in raw.get("tool_calls", ())
        )
        return AssistantTurn(raw["text"], calls)
    if role == "tool":
        error = raw.get("error")
        return ToolOutcome(
            raw["tool_call_id"],
            raw["name"],
            raw["success"],
            raw.get("result"),
            ToolFailure(**error) if error else None,
        )
    assert role == "system"
    return Observation(raw["text"])


def _openai_conversation(folder: str) -> tuple[list[MemoryEntry], dict[str, Tool], str]:
    """The memory, tools and instructions of ``<folder>/request_conversation.json``."""
    fixture = _load(folder, "request_conversation.json")
    tools: dict[str, Tool] = {
        t["name"]: _Tool(t["name"], t["description"], t["parameters"]) for t in fixture["tools"]
    }
    return [_openai_entry(e) for e in fixture["memory"]], tools, fixture["instructions"]


PROMPT = "Weather in Taipei, and read notes.txt"
WARNING = (
    'Warning: fs.read has failed 3 times in a row with the same arguments {"path": "notes.txt"}. '
    "Do not call it that way again; try something else or answer the user."
)
SIGNATURE = "Q2lZQnZqejJFdXZ0UnY="


def _declared_tools() -> dict[str, Tool]:
    """The tools of ``tests/test_provider_anthropic.py`` and ``test_provider_gemini.py``."""
    weather = _Tool(
        "get_weather",
        "Get the current weather in a given location.",
        MappingProxyType(
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city, e.g. Taipei"},
                    "unit": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "default": "celsius",
                    },
                },
                "required": ["location"],
                "additionalProperties": False,
            }
        ),
    )
    read = _Tool(
        "fs.read",
        "Read a text file.",
        MappingProxyType(
            {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Relative path"}},
                "required": ["path"],
            }
        ),
    )
    return {"get_weather": weather, "fs.read": read}


def _conversation(*, signed: bool) -> tuple[list[MemoryEntry], dict[str, Tool], str]:
    """The conversation of ``conversation()`` in ``tests/test_provider_anthropic.py`` (and,
    ``signed``, with the first call's Gemini thought signature, ``test_provider_gemini.py``)."""
    weather = core.ToolCall("get_weather", {"location": "Taipei"}, "call_1")
    if signed:
        wire = {
            "id": "call_1",
            "name": "get_weather",
            "args": {"location": "Taipei"},
            "thoughtSignature": SIGNATURE,
        }
        weather = ToolCall.model_validate(wire).to_core()
    memory: list[MemoryEntry] = [
        UserTurn("Hello"),
        AssistantTurn("Hi! How can I help?"),
        UserTurn(PROMPT),
        AssistantTurn(
            "Sure, let me check.",
            (weather, core.ToolCall("fs.read", {"path": "notes.txt"}, "call_2")),
        ),
        ToolOutcome(
            "call_1",
            "get_weather",
            True,
            result={
                "location": "Taipei",
                "temperature": 25,
                "unit": "celsius",
                "condition": "Sunny",
            },
        ),
        ToolOutcome(
            "call_2",
            "fs.read",
            False,
            error=ToolFailure("ENOENT", "notes.txt: no such file", "tool"),
        ),
        Observation(WARNING),
    ]
    return memory, _declared_tools(), "You are a weather agent."


@dataclass(frozen=True)
class API:
    """One HTTP provider and the conversation it is asked about."""

    #: The provider's name in the registry.
    provider: str
    #: Its folder under ``tests/fixtures/providers``.
    folder: str
    model: str
    #: The path ``baseUrl`` ends with (the API's own base URL's).
    prefix: str
    prompt: str
    options: Mapping[str, Any]
    conversation: Callable[[], tuple[list[MemoryEntry], dict[str, Tool], str]]
    #: The key of ``request_conversation.json`` that holds the body asked for whole.
    expected_key: str


_OPENAI_FIXTURE = _load("openai_chat", "request_conversation.json")
APIS = {
    api.provider: api
    for api in (
        API(
            "openai",
            "openai_chat",
            _OPENAI_FIXTURE["model"],
            "/v1",
            _OPENAI_FIXTURE["prompt"],
            _OPENAI_FIXTURE["options"],
            lambda: _openai_conversation("openai_chat"),
            "request",
        ),
        API(
            "openai-responses",
            "openai_responses",
            _OPENAI_FIXTURE["model"],
            "/v1",
            _OPENAI_FIXTURE["prompt"],
            _OPENAI_FIXTURE["options"],
            lambda: _openai_conversation("openai_responses"),
            "request",
        ),
        API(
            "anthropic",
            "anthropic",
            "claude-sonnet-4-5",
            "/v1",
            PROMPT,
            {"temperature": 0.2},
            lambda: _conversation(signed=False),
            "expected",
        ),
        API(
            "gemini",
            "gemini",
            "gemini-2.5-flash",
            "/v1beta",
            PROMPT,
            {"temperature": 0.2},
            lambda: _conversation(signed=True),
            "expected",
        ),
    )
}


@dataclass(frozen=True)
class Case:
    api: API
    #: The answer fixture: ``response_*.json`` (whole) or ``stream_*.json``.
    fixture: str

    @property
    def stream(self) -> bool:
        return self.fixture.startswith("stream_")

    @property
    def golden(self) -> Path:
        return FIXTURES / self.api.folder / "golden" / self.fixture

    def reply(self) -> Reply:
        data = _load(self.api.folder, self.fixture)
        if not self.stream:
            return Reply(json=data["response"])
        return Reply(events=[sse(e["data"], e["event"]) for e in data["events"]])

    def served(self) -> str:
        """The answer's text, where the ids the API gave are found."""
        return (FIXTURES / self.api.folder / self.fixture).read_text(encoding="utf-8")


def _cases() -> list[Case]:
    return [
        Case(api, path.name)
        for api in APIS.values()
        for pattern in ("response_*.json", "stream_*.json")
        for path in sorted((FIXTURES / api.folder).glob(pattern))
    ]


CASES = _cases()


# --- what is observed ----------------------------------------------------------------------------


def _request(recorded: Recorded) -> dict[str, Any]:
    headers = {}
    for name in HEADERS:
        value = recorded.headers.get(name)
        if value is None or (name == "accept" and value == "*/*"):
            continue
        headers[name] = value.replace(KEY, "<key>")
    assert KEY not in recorded.path
    assert KEY.encode() not in recorded.body
    assert sum(KEY in v for v in recorded.headers.values()) == 1, "the key goes in one header"
    text = recorded.body.decode("utf-8")
    return {
        "method": recorded.method,
        "path": recorded.path,
        "headers": headers,
        "body_sha256": hashlib.sha256(recorded.body).hexdigest(),
        "body": text,
        "body_json": json.loads(text),
    }


def _response(response: core.ProviderResponse, served: str) -> Any:
    metadata = response.metadata
    if isinstance(metadata, Mapping):
        assert isinstance(metadata.get("latency_ms"), (int, float))
        metadata = {k: v for k, v in metadata.items() if k != "latency_ms"}
    text = core.encode_response(core.ProviderResponse(response.segments, metadata)).decode()
    made_up: dict[str, str] = {}
    for found in UUID.findall(text):
        if found not in served and found not in made_up:
            made_up[found] = f"<uuid-{len(made_up) + 1}>"
    for found, placeholder in made_up.items():
        text = text.replace(found, placeholder)
    return json.loads(text)


async def _observe(case: Case) -> dict[str, Any]:
    """Ask ``case``'s provider twice: both requests, and the answer (the same both times)."""
    api = case.api
    memory, tools, instructions = api.conversation()
    session = Session("golden")
    session.memory.extend(memory)
    reply = case.reply()
    with FakeLLMServer() as server:
        server.script(None, reply, reply)
        config = SimpleNamespace(
            name=api.provider,
            model=api.model,
            base_url=server.url + api.prefix,
            api_key_env=KEY_ENV,
            options={**api.options, "stream": case.stream, "maxRetries": 0},
        )
        provider = create_provider(config)
        answers = []
        for _ in range(2):
            deltas: list[str] = []
            context = AgentContext(
                tools=tools, session=session, instructions=instructions, text_sink=deltas.append
            )
            with anyio.fail_after(HANG):
                response = await provider.generate(api.prompt, context)
            answers.append((_response(response, case.served()), deltas))
        assert server.pending() == 0
        assert len(server.requests) == 2, server.paths()
        requests = [_request(r) for r in server.requests]
    first, second = answers
    # The deltas follow the network's reads (one per read), so only their text is compared.
    assert (second[0], "".join(second[1])) == (first[0], "".join(first[1])), (
        "the second call reads the same answer as the first"
    )
    response, deltas = first
    return {
        "description": (
            f"What provider {api.provider!r} sends for the conversation of "
            "tests/test_provider_golden.py and makes of "
            f"{case.fixture} ({'streamed' if case.stream else 'whole'}), asked twice: "
            "requests[1] is the second call's, whose tool declarations were translated "
            "by the first. Recorded by OPENSTARRY_RECORD_GOLDEN=1 (see the module)."
        ),
        "provider": api.provider,
        "fixture": case.fixture,
        "stream": case.stream,
        "requests": requests,
        "response": response,
        "text_deltas": deltas,
        "text": "".join(deltas),
    }


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


# --- the cases -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.api.provider}/{c.fixture[:-5]}")
async def test_the_requests_and_the_answer_are_the_golden_ones(case: Case) -> None:
    observed = await _observe(case)
    if RECORD and case.golden not in _RECORDED:
        case.golden.parent.mkdir(parents=True, exist_ok=True)
        case.golden.write_text(_dumps(observed), encoding="utf-8")
        _RECORDED.add(case.golden)
        return
    assert case.golden.exists(), f"no golden file {case.golden}: record it (module docstring)"
    golden = json.loads(case.golden.read_text(encoding="utf-8"))
    assert len(observed["requests"]) == len(golden["requests"])
    for call, (request, expected) in enumerate(
        zip(observed["requests"], golden["requests"], strict=True), start=1
    ):
        assert request["body_json"] == expected["body_json"], f"call {call}: another body"
        assert request["body"] == expected["body"], (
            f"call {call}: the same JSON, other bytes (key order, spacing or escapes)"
        )
        assert request["body_sha256"] == expected["body_sha256"]
        assert request == expected, f"call {call}: another method, path or header"
    assert observed["response"] == golden["response"]
    # The text reaches the context as it arrives: one delta per network read,
    # however many of the recorded events that read carried.
    deltas, recorded = observed.pop("text_deltas"), golden.pop("text_deltas")
    assert "".join(deltas) == "".join(recorded) == golden["text"] == observed["text"]
    assert all(deltas), "an empty delta"
    assert len(deltas) <= len(recorded)
    assert observed == golden


@pytest.mark.parametrize("api", APIS.values(), ids=lambda a: a.provider)
def test_the_whole_request_is_the_translators_recorded_one(api: API) -> None:
    """The golden body asked for whole is ``request_conversation.json``'s: the
    conversation here is the one the translator's own tests build."""
    (whole, *_) = [c for c in CASES if c.api is api and not c.stream]
    golden = json.loads(whole.golden.read_text(encoding="utf-8"))
    expected = _load(api.folder, "request_conversation.json")[api.expected_key]
    for request in golden["requests"]:
        assert request["body_json"] == expected


def test_every_golden_file_has_its_case() -> None:
    goldens = {p for api in APIS.values() for p in (FIXTURES / api.folder / "golden").glob("*")}
    assert goldens == {c.golden for c in CASES}
