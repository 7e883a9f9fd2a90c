"""``heartbeat`` messages (spec 003) on a quiet stream, for clients that ask for them.

The server keeps a quiet Server-Sent Events stream alive with an SSE comment
(``: keep-alive``) every ``heartbeat`` seconds, which every SSE client skips.
A client that wants to see the beat asks with the request header
``X-OpenStarry-Heartbeat: message`` (on ``POST /process`` or a resuming
``GET /process/{response_id}``): after each comment the stream then also
carries a ``heartbeat`` message, a ``data:`` frame without an ``id:``::

    {"object": "message", "type": "heartbeat", "role": "assistant",
     "status": "in_progress", "id": "msg_...", "metadata": {"response_id": "response_..."}}

It has no ``sequence_number`` and is no part of the response: it is not
replayed on a reconnect, does not move the client's ``Last-Event-ID``, and
never joins the ``output``. ``openstarry.api.client`` passes it over.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any

from openstarry.api.models import Message, MessageType, Role, RunStatus

__all__ = ["HEARTBEAT_HEADER", "KEEP_ALIVE", "heartbeat_frame", "wants_messages", "with_heartbeats"]

#: The request header that asks for heartbeat messages, and the value that does.
HEARTBEAT_HEADER = "x-openstarry-heartbeat"
_ASKS = "message"
#: The SSE comment a quiet stream sends.
KEEP_ALIVE = b": keep-alive\n\n"


def wants_messages(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether an ASGI scope's ``headers`` ask for heartbeat messages."""
    name = HEARTBEAT_HEADER.encode()
    return any(
        key.lower() == name and value.decode("latin-1").strip().lower() == _ASKS
        for key, value in headers
    )


def heartbeat_frame(response_id: str) -> bytes:
    """One ``heartbeat`` message as an SSE ``data:`` frame, without an ``id:``."""
    message = Message(
        type=MessageType.HEARTBEAT,
        role=Role.ASSISTANT,
        status=RunStatus.InProgress,
        metadata={"response_id": response_id},
    )
    return b"data: " + message.wire_json().encode() + b"\n\n"


async def with_heartbeats(
    scope: Mapping[str, Any], response_id: str, frames: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    """``frames``, with a heartbeat message after each keep-alive comment when ``scope`` asks."""
    asked = wants_messages(scope.get("headers") or ())
    async with contextlib.aclosing(frames):
        async for frame in frames:
            yield frame
            if asked and frame == KEEP_ALIVE:
                yield heartbeat_frame(response_id)
