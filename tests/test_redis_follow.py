"""Runs followed outside the consumer group (a real redis-server, in one process).

The HTTP server's side of ``openstarry serve`` beside other workers: an agent whose
bus only publishes (it owns no partition) opens runs that a worker's agent runs,
and sees each run's events and its end; a cancelled one ends canceled; a built-in
command ends too. The processes' version (serve and a worker, the worker killed)
is in ``test_exactly_once_state.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from openstarry.agent import Agent
from openstarry.agent.interfaces import AgentContext
from openstarry.api.adapter import open_run
from openstarry.api.models import AgentResponse, TextContent, parse_request
from openstarry.bus import EventBus, follow_session
from openstarry.core import Event, ProviderResponse
from openstarry.events import OUTPUT_RUN_END
from openstarry.redis_server import RedisServer
from openstarry.testing import FunctionProvider, ScriptedProvider, text
from redis_support import NEEDS_REDIS_SERVER, running_redis

pytestmark = [pytest.mark.anyio, NEEDS_REDIS_SERVER]

HANG = 30


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path, aof=False) as server:
        yield server


def _request(text: str, session: str) -> Any:
    body = {"input": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    return parse_request(json.dumps({**body, "session_id": session}))


async def test_a_session_followed_sees_what_is_committed_there_from_then_on(
    redis: RedisServer,
) -> None:
    reads: list[tuple[list[Event], bool]] = []
    async with EventBus.from_url(redis.url, consume=False) as bus:
        backend: Any = bus.backend
        before = Event.new("OUTPUT:AGENT_MESSAGE", {"text": "before"}, source="t", session_id="s")
        assert await backend.asend(before)
        follow = follow_session(backend, "s", lambda events, done: reads.append((events, done)))
        assert follow is not None
        async with follow:
            after = [
                Event.new("OUTPUT:AGENT_MESSAGE", {"text": str(i)}, source="t", session_id="s")
                for i in range(3)
            ]
            assert all(await backend.asend_many(after))
            with anyio.fail_after(HANG):
                while sum(len(events) for events, _ in reads) < 3:
                    await anyio.sleep(0.01)
        seen = [e.payload["text"] for events, _ in reads for e in events]
        assert seen == ["0", "1", "2"]  # from the moment it was followed, in order
        assert all(done for _, done in reads)
        assert not backend.follower.cursors  # nothing followed any more: nothing read
    assert follow_session(None, "s", lambda events, done: None) is None  # the local bus


async def test_a_run_another_worker_runs_is_followed_to_its_end(redis: RedisServer) -> None:
    """The asker's bus only publishes: every run is the worker's, and the asker follows it."""
    ran: list[str] = []

    async def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        ran.append(prompt)
        if prompt == "boom":
            raise RuntimeError("the model is down")
        return text(f"answered {prompt}")

    worker_bus = EventBus.from_url(redis.url, group="g", consumer="w", claim_idle=1.0)
    asker_bus = EventBus.from_url(redis.url, group="g", consume=False)
    ends: list[Event] = []
    worker_bus.subscribe(OUTPUT_RUN_END, ends.append)
    async with (
        worker_bus,
        asker_bus,
        Agent(FunctionProvider(answer), bus=worker_bus),
        Agent(ScriptedProvider(["never"]), bus=asker_bus) as asker,
    ):
        with anyio.fail_after(HANG):
            for i in range(3):
                async with open_run(asker, _request(f"q{i}", f"s{i}")) as run:
                    events = [event async for event in run]
                final = events[-1]
                assert isinstance(final, AgentResponse)
                assert str(final.status) == "completed", final.model_dump_json()[:1500]
                assert final.output is not None
                assert final.output[-1].get_text_content() == f"answered q{i}"
                assert run.result is not None
                assert not run.result.stopped
            # A run that fails ends failed, with its error.
            async with open_run(asker, _request("boom", "s1")) as run:
                events = [event async for event in run]
            final = events[-1]
            assert isinstance(final, AgentResponse)
            assert str(final.status) == "failed"
            assert final.error is not None
            assert "the model is down" in final.error.message
            # A built-in command's answer is its run: it ends too.
            async with open_run(asker, _request("/help", "s0")) as run:
                events = [event async for event in run]
            assert str(events[-1].status) == "completed"
    assert ran == ["q0", "q1", "q2", "boom"]
    assert len(ends) == 5  # each run said its end once, committed with its events


async def test_a_followed_run_cancelled_ends_canceled(redis: RedisServer) -> None:
    started = anyio.Event()

    async def wait(prompt: str, context: AgentContext) -> ProviderResponse:
        context.emit_text_delta("Thinking")
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    worker_bus = EventBus.from_url(redis.url, group="g", consumer="w", claim_idle=1.0)
    asker_bus = EventBus.from_url(redis.url, group="g", consume=False)
    async with (
        worker_bus,
        asker_bus,
        Agent(FunctionProvider(wait), bus=worker_bus),
        Agent(ScriptedProvider(["never"]), bus=asker_bus) as asker,
    ):
        with anyio.fail_after(HANG):
            async with open_run(asker, _request("wait", "s")) as run:
                await started.wait()
                run.cancel()
                events = [event async for event in run]
        final = events[-1]
        assert isinstance(final, AgentResponse)
        assert str(final.status) == "canceled"
        assert run.result is not None
        assert run.result.stopped
        # What the run said before it was stopped came with its commit.
        assert any(isinstance(e, TextContent) for e in events) or final.output is not None
