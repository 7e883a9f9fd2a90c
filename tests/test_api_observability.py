"""``GET /events`` and ``GET /metrics`` of ``openstarry serve`` (openstarry.api.events, .metrics).

A real uvicorn server on 127.0.0.1 in a thread, driven with httpx; the
Prometheus text is read back with prometheus_client's own parser.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openstarry.api.events import EventFeed
from openstarry.assembly import agent_from_manifest
from openstarry.bus import EventBus
from openstarry.core import Event
from test_api_http import FINAL_TEXT, HANG, WEATHER, body, serving


def bus_frames(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, envelope) of each ``event: bus`` frame of an SSE line stream."""
    seq = ""
    for line in lines:
        if line.startswith("id: "):
            seq = line[4:]
        elif line.startswith("data: "):
            yield seq, json.loads(line[6:])


def run_weather(url: str, session: str) -> dict[str, Any]:
    response = httpx.post(
        f"{url}/process", json=body(stream=False, session_id=session), timeout=HANG
    )
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


def test_metrics_parse_and_match_the_bus_after_the_weather_run() -> None:
    agent = agent_from_manifest(WEATHER)
    with serving(agent) as url:
        result = run_weather(url, "metrics")
        assert result["status"] == "completed"
        assert FINAL_TEXT in json.dumps(result, ensure_ascii=False)
        response = httpx.get(f"{url}/metrics", timeout=HANG)
        bus = agent.bus.metrics()
        loop = agent.loop.metrics()["loop"]
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}

    def value(family: str, sample: str, **labels: str) -> float:
        for s in families[family].samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise AssertionError(f"no {sample} {labels} in {family}")

    assert families["openstarry_events_published"].type == "counter"
    assert (
        value("openstarry_events_published", "openstarry_events_published_total")
        == bus["published"]
    )
    assert value("openstarry_events_duplicates", "openstarry_events_duplicates_total") == 0
    assert value("openstarry_events_invalid", "openstarry_events_invalid_total") == 0
    for event_type, count in bus["dispatched"].items():
        assert (
            value(
                "openstarry_events_dispatched",
                "openstarry_events_dispatched_total",
                type=event_type,
            )
            == count
        )
    for priority, depth in enumerate(bus["depth"]):
        assert value(
            "openstarry_queue_depth", "openstarry_queue_depth", priority=str(priority)
        ) == (depth)
    latency = families["openstarry_dispatch_latency_seconds"]
    assert latency.type == "histogram"
    count = value(latency.name, "openstarry_dispatch_latency_seconds_count")
    assert 0 < count <= bus["latency_us"]["count"]
    assert value(latency.name, "openstarry_dispatch_latency_seconds_bucket", le="+Inf") == count
    assert value("openstarry_tool_calls", "openstarry_tool_calls_total", tool="get_weather") == 1
    assert (
        value("openstarry_tool_failures", "openstarry_tool_failures_total", tool="get_weather") == 0
    )
    provider = "default"
    calls = value(
        "openstarry_provider_call_duration_seconds",
        "openstarry_provider_call_duration_seconds_count",
        provider=provider,
    )
    assert calls == 2  # the round that called the tool, the round that answered
    assert (
        value(
            "openstarry_provider_tokens",
            "openstarry_provider_tokens_total",
            provider=provider,
            kind="output",
        )
        > 0
    )
    assert (
        value("openstarry_runs_completed", "openstarry_runs_completed_total")
        == loop["runs_completed"]
    )
    assert value("openstarry_runs_in_flight", "openstarry_runs_in_flight") == 0
    assert value("openstarry_sessions", "openstarry_sessions") == loop["sessions"] == 1


def test_metrics_json_feeds_the_console() -> None:
    agent = agent_from_manifest(WEATHER)
    with serving(agent) as url:
        run_weather(url, "json")
        snapshot = httpx.get(f"{url}/metrics.json", timeout=HANG).json()
    assert snapshot["agent"] == "weather-agent"
    assert snapshot["bus"]["dispatched"]["EXEC:TOOL_CALL"] == 1
    assert snapshot["tools"] == {"get_weather": {"calls": 1, "failures": 0}}
    assert snapshot["providers"]["default"]["calls"] == 2


def test_events_streams_the_bus_filtered_by_type_and_session() -> None:
    agent = agent_from_manifest(WEATHER)
    seen: list[tuple[str, dict[str, Any]]] = []
    connected = threading.Event()
    with serving(agent) as url:

        def listen() -> None:
            params = {"type": "EXEC:*,KERNEL:STATE_CHANGE", "session": "watched"}
            with httpx.stream("GET", f"{url}/events", params=params, timeout=HANG) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                connected.set()
                for frame in bus_frames(response.iter_lines()):
                    seen.append(frame)
                    if frame[1]["type"] == "EXEC:TOOL_RESULT":
                        return

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        assert connected.wait(HANG)
        run_weather(url, "other")
        run_weather(url, "watched")
        thread.join(HANG)
        assert not thread.is_alive()
    types = [envelope["type"] for _, envelope in seen]
    assert "EXEC:TOOL_CALL" in types
    assert types[-1] == "EXEC:TOOL_RESULT"
    assert set(types) <= {"EXEC:TOOL_CALL", "EXEC:TOOL_RESULT", "KERNEL:STATE_CHANGE"}
    assert {envelope["sessionId"] for _, envelope in seen} == {"watched"}
    call = next(e for _, e in seen if e["type"] == "EXEC:TOOL_CALL")
    result = seen[-1][1]
    assert result["parentId"] == call["id"]
    assert result["traceId"] == call["traceId"]
    assert {"id", "type", "priority", "traceId", "sessionId", "source", "timestamp"} <= set(call)
    ids = [int(seq) for seq, _ in seen]
    assert ids == sorted(ids)


def test_events_refuses_a_malformed_type_pattern() -> None:
    agent = agent_from_manifest(WEATHER)
    with serving(agent) as url:
        response = httpx.get(f"{url}/events", params={"type": "EXEC*"}, timeout=HANG)
    assert response.status_code == 422


def test_stop_sends_a_priority_0_stop_to_the_session() -> None:
    agent = agent_from_manifest(WEATHER)
    stops: list[Event] = []
    agent.bus.subscribe("INPUT:SYSTEM_COMMAND", stops.append)
    with serving(agent) as url:
        response = httpx.post(f"{url}/stop", json={"session_id": "s1"}, timeout=HANG)
        assert response.status_code == 202
        assert httpx.post(f"{url}/stop", json={}, timeout=HANG).status_code == 422
        page = httpx.get(f"{url}/", timeout=HANG)
        script = httpx.get(f"{url}/console/console.js", timeout=HANG)
        assert httpx.get(f"{url}/console/nope.js", timeout=HANG).status_code == 404
        for _ in range(100):
            if stops:
                break
            httpx.get(f"{url}/health", timeout=HANG)
    assert [(e.payload["command"], e.priority, e.session_id) for e in stops] == [("stop", 0, "s1")]
    assert page.headers["content-type"].startswith("text/html")
    assert "/console/console.js" in page.text
    assert "EventSource" in script.text


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_slow_client_is_dropped_with_a_final_comment() -> None:
    """The queue of a client that does not read is bounded; past it the client is cut off."""
    async with EventBus() as bus:
        feed = EventFeed(bus, replay=4, client_buffer=3, heartbeat=HANG)
        client = feed.open()
        for i in range(10):
            bus.publish(Event.new("EXEC:TOOL_CALL", {"n": i}, source="t", session_id="s"))
        await bus.wait_idle()
        assert client.dropped
        assert len(client.queue) == 0
        frames = [frame async for frame in feed.stream(client)]
    assert frames[-1].startswith(b": dropped:")
    assert not any(b"data:" in frame for frame in frames)
    assert feed.dropped_clients == 1
    assert not feed.clients
    assert len(feed.recent) == 4


async def test_a_reconnect_with_last_event_id_replays_what_is_kept() -> None:
    async with EventBus() as bus:
        feed = EventFeed(bus, replay=100)
        for i in range(5):
            bus.publish(Event.new("EXEC:TOOL_CALL", {"n": i}, source="t", session_id="s"))
        bus.publish(Event.new("KERNEL:TICK_START", {"round": 1}, source="t", session_id="s"))
        await bus.wait_idle()
        client = feed.open(types=["EXEC:*"], last_event_id=2)
        received: list[bytes] = []
        with anyio.move_on_after(HANG):
            async for frame in feed.stream(client):
                received.append(frame)
                if len(received) == 4:
                    break
    data = [frame for frame in received if frame.startswith(b"id:")]
    assert [frame.split(b"\n")[0] for frame in data] == [b"id: 3", b"id: 4", b"id: 5"]
    assert [json.loads(frame.split(b"data: ")[1])["payload"]["n"] for frame in data] == [2, 3, 4]


def test_a_request_s_trace_headers_continue_into_its_run() -> None:
    """X-OpenStarry-Trace-ID, or else a W3C traceparent, becomes the run's traceId."""
    agent = agent_from_manifest(WEATHER)
    inputs: list[Event] = []
    agent.bus.subscribe("INPUT:USER_MESSAGE", inputs.append)
    w3c = "4bf92f3577b34da6a3ce929d0e0e4736"
    with serving(agent) as url:
        for headers in (
            {"traceparent": f"00-{w3c}-00f067aa0ba902b7-01"},
            {"X-OpenStarry-Trace-ID": "trace-from-a-caller", "traceparent": "malformed"},
            {"traceparent": "00-not-a-trace-01"},
        ):
            response = httpx.post(
                f"{url}/process", json=body(stream=False), headers=headers, timeout=HANG
            )
            assert response.json()["status"] == "completed"
    traces = [event.trace_id for event in inputs]
    assert traces[:2] == ["4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "trace-from-a-caller"]
    assert traces[2] not in traces[:2]
