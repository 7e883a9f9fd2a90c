"""A request's generation parameters reach each HTTP provider's upstream request.

``temperature`` and ``max_tokens`` sent to ``POST /process`` must arrive in the
request the fake model server records, under each API's own names; what an
API has no field for is named in the response's ``metadata.dropped_parameters``.
The default (offline) provider ignores them.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from fake_llm_server import FakeLLMServer
from openstarry.agent.runtime import Agent
from openstarry.api.client import AgentClient
from openstarry.api.models import AgentRequest, RunStatus
from openstarry.assembly import agent_from_manifest
from openstarry.testing import FunctionProvider
from test_api_http import serving
from test_provider_agent_runs import API, APIS, KEY, KEY_ENV, manifest_for

HANG = 10.0

#: Where each API carries temperature, max_tokens and seed (None: it has no seed).
WHERE: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...] | None]] = {
    "openai": (("temperature",), ("max_completion_tokens",), ("seed",)),
    "openai-responses": (("temperature",), ("max_output_tokens",), None),
    "anthropic": (("temperature",), ("max_tokens",), None),
    "gemini": (
        ("generationConfig", "temperature"),
        ("generationConfig", "maxOutputTokens"),
        ("generationConfig", "seed"),
    ),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def dig(body: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


def request(**fields: Any) -> AgentRequest:
    return AgentRequest.model_validate(
        {"input": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}], **fields}
    )


@pytest.mark.anyio
@pytest.mark.parametrize("api", APIS, ids=[api.name for api in APIS])
async def test_temperature_and_max_tokens_reach_each_api(
    api: API, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    server.script(None, api.whole("Hi there.", False))
    agent = agent_from_manifest(manifest_for(api, server.url + "/v1", stream=False))
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            final = await client.run(
                request(temperature=0.25, max_tokens=77, model="other-model", seed=7)
            )
    assert final.status is RunStatus.Completed
    (upstream,) = server.requests
    temperature_at, max_tokens_at, seed_at = WHERE[api.name]
    assert dig(upstream.json, temperature_at) == 0.25
    assert dig(upstream.json, max_tokens_at) == 77
    # The manifest chooses the model; an API without seed says it dropped it.
    assert "other-model" not in json.dumps(upstream.json)
    if seed_at is not None:
        assert dig(upstream.json, seed_at) == 7
        assert final.metadata == {"dropped_parameters": ["model"]}
    else:
        assert "seed" not in json.dumps(upstream.json)
        assert final.metadata == {"dropped_parameters": ["model", "seed"]}


@pytest.mark.anyio
async def test_the_provider_sees_the_parameters_in_its_context() -> None:
    seen: list[dict[str, Any]] = []

    def answer(prompt: str, context: Any) -> str:
        seen.append(dict(context.generation))
        return "ok"

    agent = Agent(FunctionProvider(answer))
    with serving(agent) as url, anyio.fail_after(HANG):
        async with AgentClient(url) as client:
            await client.run(request(temperature=0.5, stop=["\n\n"], top_p=0.9))
            await client.run(request())
    assert seen == [{"temperature": 0.5, "stop": ["\n\n"], "top_p": 0.9}, {}]
