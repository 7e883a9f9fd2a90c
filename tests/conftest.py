"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fake_llm_server import FakeLLMServer


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on asyncio and on trio.

    A module that needs only one backend overrides this fixture.
    """
    backend: str = request.param
    return backend


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    """A scripted LLM API server on 127.0.0.1 (a module may define its own ``server``)."""
    with FakeLLMServer() as fake:
        yield fake
