"""The backend seam: backends found by URL scheme, the bus importing none of them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from openstarry.bus import BusBackend, BusHost, EventBus, backend_for_url, register_backend
from openstarry.bus import backend as backend_module
from openstarry.core import Event

pytestmark = pytest.mark.anyio


class _Echo:
    """A backend of this test's own: what is sent comes back, delivered to the bus."""

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        self.options = options
        self.done_with: list[tuple[str, str]] = []
        self._bus: BusHost | None = None

    def send(self, event: Event, cause: Event | None = None) -> None:
        assert self._bus is not None
        self._bus.feed([event])

    async def asend(self, event: Event, cause: Event | None = None) -> bool:
        self.send(event, cause)
        return True

    @asynccontextmanager
    async def running(self, bus: BusHost) -> AsyncIterator[_Echo]:
        self._bus = bus
        try:
            yield self
        finally:
            self._bus = None

    def done(self, event: Event, outcome: str) -> None:
        self.done_with.append((event.type, outcome))

    async def flush(self) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {"done": len(self.done_with)}


def _echo(
    url: str, *, group: str | None, consumer: str | None, consume: bool, **options: Any
) -> _Echo:
    return _Echo(url, group=group, consumer=consumer, consume=consume, **options)


@pytest.fixture
def echo_scheme() -> Any:
    register_backend(_echo, "echo", "echo+tls")
    yield "echo"
    for scheme in ("echo", "echo+tls"):
        backend_module._registry.pop(scheme, None)


async def test_a_registered_backend_serves_its_schemes(echo_scheme: str) -> None:
    bus = EventBus.from_url("echo://somewhere", group="g", consumer="c", capacity=10, knob=3)
    backend = bus.backend
    assert isinstance(backend, _Echo)
    assert isinstance(backend, BusBackend)
    assert backend.options == {"group": "g", "consumer": "c", "consume": True, "knob": 3}
    seen: list[str] = []
    bus.subscribe("INPUT:*", lambda e: seen.append(e.payload["text"]))
    async with bus:
        await bus.apublish(
            Event.new("INPUT:USER_MESSAGE", {"text": "hi"}, source="t", session_id="s")
        )
        with anyio.fail_after(5):
            while not backend.done_with:
                await anyio.sleep(0.01)
    assert seen == ["hi"]
    assert backend.done_with == [("INPUT:USER_MESSAGE", "handled")]
    assert isinstance(backend_for_url("ECHO+TLS://x", consume=False), _Echo)


def test_bad_urls_and_schemes_are_refused_with_what_is_known() -> None:
    with pytest.raises(ValueError, match="expected scheme://"):
        EventBus.from_url("just-a-host:6379")
    with pytest.raises(ValueError, match=r"no backend for nats:// \(known: local:, .*redis://"):
        EventBus.from_url("nats://x")
    with pytest.raises(ValueError, match="lower case"):
        register_backend(_echo, "Echo")
    with pytest.raises(ValueError, match="at least one"):
        register_backend(_echo)
    with pytest.raises(ValueError, match="need a remote bus URL"):
        EventBus.from_url("local:", group="g")


def test_the_bus_finds_the_redis_backend_through_its_entry_point() -> None:
    """In a fresh interpreter: making the bus imports the backend, the bus alone does not."""
    code = (
        "import sys\n"
        "import openstarry.bus\n"
        "assert 'openstarry.bus.redis' not in sys.modules, 'the bus imported its backend'\n"
        "bus = openstarry.bus.EventBus.from_url('redis://127.0.0.1:1/0', consume=False)\n"
        "print(type(bus.backend).__module__, 'openstarry.bus.redis' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["openstarry.bus.redis.streams", "True"]


def test_the_lua_scripts_ship_with_the_package() -> None:
    from openstarry.bus.redis import lua

    assert "cmsgpack.unpack(ARGV[7])" in lua.FLUSH
    assert lua.RENEW.lstrip().startswith("--")
    assert "PEXPIRE" in lua.RENEW
    assert "DEL" in lua.FREE


def test_the_manifest_names_a_cluster_and_its_durability(tmp_path: Any) -> None:
    """``bus.url`` may name a Redis Cluster, ``bus.min_replicas`` its durability; nothing
    connects until the bus is entered."""
    pytest.importorskip("redis")
    import json

    from openstarry.assembly import agent_from_manifest

    manifest = tmp_path / "agent.json"
    manifest.write_text(
        json.dumps(
            {
                "identity": {"name": "a"},
                "provider": {"name": "default"},
                "bus": {"url": "redis+cluster://127.0.0.1:1,127.0.0.1:2", "minReplicas": 1},
            }
        )
    )
    backend: Any = agent_from_manifest(manifest).bus.backend
    assert (backend.cluster, backend.min_replicas, backend.partitions) == (True, 1, 24)
    bad = json.loads(manifest.read_text())
    bad["bus"]["minReplicas"] = 17
    manifest.write_text(json.dumps(bad))
    with pytest.raises(Exception, match=r"bus\.minReplicas: must be less than or equal to 16"):
        agent_from_manifest(manifest)
