"""Regenerate ``events.ndjson``, the sample that ``make run`` feeds to the demo.

The sample is a few conversations as a transport would deliver them: spec 002
envelopes of all eight event types at priorities 0 to 5, over several sessions,
with child events (``parentId``) that share their parent's ``traceId``. Like a
real transport it retransmits a few lines (same ``id``) and lets a few broken
ones through: truncated JSON, a priority given as a string, a priority out of
range, a missing ``sessionId``, a lowercase ``type``.

Run from the repository root: ``python examples/make_sample.py``. The output is
deterministic, so the shipped file only changes when this script does.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("events.ndjson")
rng = random.Random(2002)
clock = 1_764_115_200_000  # 2025-11-26T00:00:00Z, in ms


def new_id() -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def envelope(
    type_: str,
    payload: Any,
    *,
    source: str,
    session: str,
    priority: int,
    trace: str | None = None,
    parent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    global clock
    clock += rng.randint(3, 900)
    event: dict[str, Any] = {
        "id": new_id(),
        "timestamp": clock,
        "traceId": parent["traceId"] if parent else (trace or new_id()),
        "source": source,
        "sessionId": parent["sessionId"] if parent else session,
        "priority": priority,
        "type": type_,
        "payload": payload,
    }
    if parent:
        event["parentId"] = parent["id"]
    return event


def conversation(
    session: str, platform: str, text: str, tool: str, args: dict[str, Any], ok: bool
) -> list[dict[str, Any]]:
    """A user message, the tick it starts, a tool call and its result, state changes."""
    src = f"transport-{platform}-01"
    msg = envelope(
        "INPUT:USER_MESSAGE",
        {"text": text, "mimeType": "text/plain", "metadata": {"platform": platform}},
        source=src,
        session=session,
        priority=2,
    )
    busy = envelope(
        "KERNEL:STATE_CHANGE",
        {"from": "IDLE", "to": "EXECUTING", "reason": "input"},
        source="kernel",
        session=session,
        priority=1,
        parent=msg,
    )
    tick = envelope(
        "KERNEL:TICK_START",
        {"tick": 1, "maxTicks": 8, "pendingToolCalls": 0},
        source="kernel",
        session=session,
        priority=1,
        parent=msg,
    )
    call_id = f"call_{rng.getrandbits(48):012x}"
    call = envelope(
        "EXEC:TOOL_CALL",
        {"toolCallId": call_id, "name": tool, "args": args},
        source="kernel",
        session=session,
        priority=2,
        parent=tick,
    )
    if ok:
        result_payload: dict[str, Any] = {
            "toolCallId": call_id,
            "success": True,
            "result": {"bytes": rng.randint(200, 9000), "truncated": False},
            "durationMs": rng.randint(2, 400),
        }
    else:
        result_payload = {
            "toolCallId": call_id,
            "success": False,
            "error": {"code": "EPERM", "message": "Operation not permitted", "source": "fs-plugin"},
        }
    result = envelope(
        "EXEC:TOOL_RESULT",
        result_payload,
        source="plugin-" + tool.split(".")[0],
        session=session,
        priority=3,
        parent=call,
    )
    idle = envelope(
        "KERNEL:STATE_CHANGE",
        {"from": "EXECUTING", "to": "IDLE", "reason": "done"},
        source="kernel",
        session=session,
        priority=1,
        parent=msg,
    )
    return [msg, busy, tick, call, result, idle]


def main() -> None:
    events: list[dict[str, Any]] = []
    sessions = [f"sess-{rng.getrandbits(32):08x}" for _ in range(4)]
    events += conversation(
        sessions[0],
        "discord",
        "Read the recent system logs",
        "fs.read",
        {"path": "/var/log/syslog", "lines": 50},
        ok=False,
    )
    events += conversation(
        sessions[1],
        "websocket",
        "Summarise README.md in three bullet points",
        "fs.read",
        {"path": "README.md"},
        ok=True,
    )
    events += conversation(
        sessions[2],
        "slack",
        "What is the weather in Taipei tomorrow?",
        "http.get",
        {"url": "https://wttr.in/Taipei?format=j1"},
        ok=True,
    )
    for i, session in enumerate(sessions):
        events.append(
            envelope(
                "INPUT:SIGNAL",
                {
                    "signal": "webhook",
                    "name": "github.push",
                    "data": {
                        "repo": "openstarry/openstarry",
                        "ref": "refs/heads/main",
                        "commits": i + 1,
                    },
                },
                source="transport-webhook-02",
                session=session,
                priority=4,
            )
        )
        events.append(
            envelope(
                "INPUT:SIGNAL",
                {"signal": "cron", "name": "memory.compact", "data": {"sessions": 4}},
                source="scheduler",
                session=session,
                priority=5,
            )
        )
    stop = envelope(
        "INPUT:SYSTEM_COMMAND",
        {"command": "/stop", "args": [], "issuedBy": "operator"},
        source="transport-cli",
        session=sessions[0],
        priority=0,
    )
    events.append(stop)
    events.append(
        envelope(
            "KERNEL:ERROR",
            {
                "code": "PROVIDER_TIMEOUT",
                "message": "provider did not answer within 30000 ms",
                "source": "provider-openai",
                "retryable": True,
            },
            source="kernel",
            session=sessions[3],
            priority=0,
        )
    )
    events.append(
        envelope(
            "KERNEL:STATE_CHANGE",
            {"from": "EXECUTING", "to": "STOPPED", "reason": "/stop"},
            source="kernel",
            session=sessions[0],
            priority=0,
            parent=stop,
        )
    )
    events.append(
        envelope(
            "INPUT:SYSTEM_COMMAND",
            {"command": "/reset", "args": ["--keep-memory"], "issuedBy": "user"},
            source="transport-cli",
            session=sessions[3],
            priority=1,
        )
    )
    events += conversation(
        sessions[3],
        "discord",
        "List the files in ./examples",
        "fs.list",
        {"path": "./examples", "recursive": False},
        ok=True,
    )
    events.append(
        envelope(
            "INPUT:USER_MESSAGE",
            {
                "text": "Also check disk usage",
                "mimeType": "text/plain",
                "metadata": {"platform": "cli"},
            },
            source="transport-cli",
            session=sessions[1],
            priority=2,
        )
    )
    events.append(
        envelope(
            "INPUT:SIGNAL",
            {"signal": "sensor", "name": "cpu.temperature", "data": {"celsius": 71.5}},
            source="sensor-gateway",
            session=sessions[2],
            priority=3,
        )
    )
    events.append(
        envelope(
            "KERNEL:ERROR",
            {"code": "TOOL_TIMEOUT", "message": "tool http.get exceeded 10 s", "source": "kernel"},
            source="kernel",
            session=sessions[2],
            priority=1,
        )
    )

    lines = [json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in events]
    # Retransmissions: the same envelope, same id, delivered again a little later.
    for src_index, at in [(0, 9), (4, 15), (18, 25), (27, 33)]:
        lines.insert(at, lines[src_index])
    # Lines a validating core must refuse, each for one reason.
    template = dict(events[7])
    bad: list[str] = [
        json.dumps(template, separators=(",", ":"))[:97],  # truncated mid-string
        json.dumps({**template, "id": new_id(), "priority": "2"}, separators=(",", ":")),
        json.dumps({**template, "id": new_id(), "priority": 6}, separators=(",", ":")),
        json.dumps(
            {k: v for k, v in {**template, "id": new_id()}.items() if k != "sessionId"},
            separators=(",", ":"),
        ),
        json.dumps(
            {**template, "id": new_id(), "type": "input:user_message"}, separators=(",", ":")
        ),
    ]
    for at, line in zip([6, 13, 21, 30, 40], bad, strict=True):
        lines.insert(at, line)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} lines to {OUT}")


if __name__ == "__main__":
    main()
