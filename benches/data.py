"""Deterministic, realistic inputs for the benchmarks: spec 002 envelopes and UUID streams."""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

EVENT_TYPES = (
    "INPUT:USER_MESSAGE",
    "INPUT:SYSTEM_COMMAND",
    "INPUT:SIGNAL",
    "KERNEL:TICK_START",
    "KERNEL:STATE_CHANGE",
    "KERNEL:ERROR",
    "EXEC:TOOL_CALL",
    "EXEC:TOOL_RESULT",
)
# Roughly what a busy agent sees: mostly conversation and tool traffic at 1..3.
_PRIORITY_WEIGHTS = (1, 4, 8, 5, 2, 1)
_MESSAGES = (
    "Read the recent system logs",
    "Summarise README.md in three bullet points",
    "What changed in the last deploy?",
    "List the files in ./examples and their sizes",
    "Why did the nightly build fail?",
    "Translate the release notes into Japanese",
)
_TOOLS = (
    ("fs.read", {"path": "/var/log/syslog", "lines": 50}),
    ("fs.list", {"path": "./examples", "recursive": False}),
    ("http.get", {"url": "https://wttr.in/Taipei?format=j1", "timeoutMs": 5000}),
    ("shell.run", {"cmd": "df -h /", "cwd": "/srv/app"}),
)


def uuid4(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _payload(rng: random.Random, type_: str) -> Any:
    call_id = f"call_{rng.getrandbits(48):012x}"
    if type_ == "INPUT:USER_MESSAGE":
        return {
            "text": rng.choice(_MESSAGES),
            "mimeType": "text/plain",
            "metadata": {"platform": rng.choice(("discord", "slack", "websocket", "cli"))},
        }
    if type_ == "INPUT:SYSTEM_COMMAND":
        return {
            "command": rng.choice(("/stop", "/reset", "/status")),
            "args": [],
            "issuedBy": "user",
        }
    if type_ == "INPUT:SIGNAL":
        return {
            "signal": "webhook",
            "name": "github.push",
            "data": {
                "repo": "openstarry/openstarry",
                "ref": "refs/heads/main",
                "commits": rng.randint(1, 9),
            },
        }
    if type_ == "KERNEL:TICK_START":
        return {"tick": rng.randint(1, 8), "maxTicks": 8, "pendingToolCalls": rng.randint(0, 3)}
    if type_ == "KERNEL:STATE_CHANGE":
        old, new = rng.choice(
            (("IDLE", "EXECUTING"), ("EXECUTING", "IDLE"), ("EXECUTING", "WAITING"))
        )
        return {"from": old, "to": new, "reason": "tick"}
    if type_ == "KERNEL:ERROR":
        return {
            "code": "PROVIDER_TIMEOUT",
            "message": "provider did not answer within 30000 ms",
            "source": "provider-openai",
            "retryable": True,
        }
    if type_ == "EXEC:TOOL_CALL":
        name, args = rng.choice(_TOOLS)
        return {"toolCallId": call_id, "name": name, "args": args}
    if rng.random() < 0.7:
        return {
            "toolCallId": call_id,
            "success": True,
            "result": {"bytes": rng.randint(200, 9000), "truncated": False},
            "durationMs": rng.randint(2, 400),
        }
    return {
        "toolCallId": call_id,
        "success": False,
        "error": {"code": "EPERM", "message": "Operation not permitted", "source": "fs-plugin"},
    }


def envelopes(n: int, *, seed: int) -> list[bytes]:
    """``n`` distinct compact envelopes (about 250 to 400 bytes) of every type, priority 0..5."""
    rng = random.Random(seed)
    sessions = [f"sess-{rng.getrandbits(32):08x}" for _ in range(64)]
    traces = [uuid4(rng) for _ in range(256)]
    clock = 1_764_115_200_000
    out: list[bytes] = []
    previous: str | None = None
    for _ in range(n):
        type_ = rng.choice(EVENT_TYPES)
        clock += rng.randint(0, 40)
        event: dict[str, Any] = {
            "id": uuid4(rng),
            "timestamp": clock,
            "traceId": rng.choice(traces),
            "source": rng.choice(
                ("kernel", "transport-websocket-01", "plugin-fs", "transport-cli")
            ),
            "sessionId": rng.choice(sessions),
            "priority": rng.choices(range(6), _PRIORITY_WEIGHTS)[0],
            "type": type_,
            "payload": _payload(rng, type_),
        }
        if previous is not None and type_.startswith(("EXEC:", "KERNEL:")):
            event["parentId"] = previous
        previous = event["id"]
        out.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode())
    return out


def user_messages(n: int, *, seed: int, nested: bool) -> list[bytes]:
    """``n`` compact ``INPUT:USER_MESSAGE`` envelopes of one shape, ids and times varying.

    With ``nested`` the payload carries ``metadata`` with a few keys, as a chat
    transport sends; without it the payload is flat (``text`` and ``mimeType``).
    """
    rng = random.Random(seed)
    clock = 1_764_115_200_000
    out: list[bytes] = []
    for _ in range(n):
        clock += rng.randint(0, 40)
        payload: dict[str, Any] = {"text": rng.choice(_MESSAGES), "mimeType": "text/plain"}
        if nested:
            payload["metadata"] = {
                "platform": rng.choice(("discord", "slack", "websocket", "cli")),
                "channelId": f"C{rng.getrandbits(40):010X}",
                "userId": f"U{rng.getrandbits(40):010X}",
                "locale": rng.choice(("en-US", "zh-TW", "ja-JP")),
            }
        event = {
            "id": uuid4(rng),
            "timestamp": clock,
            "traceId": uuid4(rng),
            "source": "transport-websocket-01",
            "sessionId": f"sess-{rng.getrandbits(32):08x}",
            "priority": 1,
            "type": "INPUT:USER_MESSAGE",
            "payload": payload,
        }
        out.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode())
    return out


def with_repeats(items: list[Any], ratio: float, *, seed: int, recent: int = 1000) -> list[Any]:
    """``items`` with about ``ratio`` of the output being repeats of an item seen shortly before.

    A repeat copies one of the last ``recent`` outputs, as a retransmitting
    transport does; the output has ``len(items)`` entries.
    """
    rng = random.Random(seed)
    out: list[Any] = []
    fresh = iter(items)
    while len(out) < len(items):
        if out and rng.random() < ratio:
            out.append(out[-rng.randint(1, min(recent, len(out)))])
        else:
            out.append(next(fresh))
    return out


def ids(n: int, *, seed: int) -> list[str]:
    """``n`` UUID v4 strings."""
    rng = random.Random(seed)
    return [uuid4(rng) for _ in range(n)]
