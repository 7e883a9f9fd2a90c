"""Fixtures shared by the test modules."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_llm_server import FakeLLMServer
from openstarry.redis_server import RedisServer
from redis_support import running_redis


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


@pytest.fixture
def gated_manifest(tmp_path: Path) -> Path:
    """The weather agent plus ``wait_for`` (``tests/prompt_tools.py``), a tool that
    waits until a file exists: the prompt's terminal tests hold a turn open with it."""
    example = Path(__file__).resolve().parent.parent / "examples" / "weather-agent" / "agent.json"
    data = json.loads(example.read_text(encoding="utf-8"))
    data["tools"] = [*data["tools"], "prompt_tools:wait_for"]
    data["fs"] = {"allowedPaths": [str(example.parent / "workspace")], "allowOutside": True}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# redis-py's asyncio cluster client leaves some of its node connections open for the
# garbage collector (nodes it drops when it looks the slots up again, connections it
# marks for a reconnect): a ResourceWarning each, which filterwarnings=error would turn
# into a failure of whichever test the collector happens to run in. Every test on a
# Redis Cluster collects its leftovers when it ends, with these warnings ignored.
_CLUSTER_WARNINGS = (
    "ignore:unclosed:ResourceWarning",
    "ignore::pytest.PytestUnraisableExceptionWarning",
)


def _on_a_cluster(item: pytest.Item) -> bool:
    return "cluster" in item.nodeid.rpartition("/")[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _on_a_cluster(item):
            for spec in _CLUSTER_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(autouse=True)
def _collect_cluster_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if _on_a_cluster(request.node):
        gc.collect()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A throwaway ``redis-server`` without an append-only file (a module may define its own)."""
    with running_redis(tmp_path, aof=False) as server:
        yield server
