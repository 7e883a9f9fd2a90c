"""What the parts of the Redis bus share: the client library, the errors worth a retry,
and :class:`Streams`, the face of :class:`~openstarry.bus.redis.RedisStreams` that its
parts (the outbox, the leases, the deliveries) see: its settings, its connection and its
counters."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from openstarry.bus.backend import BusHost
from openstarry.bus.redis.keys import Layout
from openstarry.bus.redis.records import Delivery
from openstarry.core import Event

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised by the smoke test without extras
    raise ImportError(
        "the Redis bus needs redis-py with hiredis: pip install 'openstarry[redis]'"
    ) from exc

__all__ = ["Streams", "aioredis", "log", "redis_errors", "tls_refusal"]

log = logging.getLogger("openstarry.bus.redis")

#: Errors after which a connection is retried with backoff.
RETRYABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    OSError,
)

#: What a cluster answers while a partition's slot is between nodes (a failover,
#: a resharding): the client looks the slots up again and the command is sent again.
SLOT_MOVING = (
    redis_errors.AskError,  # MovedError too
    redis_errors.TryAgainError,
    redis_errors.ClusterError,  # ClusterDownError, MasterDownError
    redis_errors.ReadOnlyError,  # a master that came back as a replica
    redis_errors.SlotNotCoveredError,
    # redis-py's cluster pipeline, when the client closed a node's connections
    # under it (it does so when it looks the slots up again after an error).
    AttributeError,
)


def tls_refusal(exc: BaseException) -> str | None:
    """Why TLS refused the connection, when it did (a certificate that fails verification,
    a handshake that fails): no retry mends it. ``None`` for any other error."""
    seen: BaseException | None = exc
    for _ in range(8):  # redis-py wraps the ssl module's error in its ConnectionError
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"the server's certificate failed verification: {seen.verify_message}"
        if isinstance(seen, ssl.SSLError):
            return f"the TLS handshake failed: {seen.reason or seen}"
        seen = seen.__cause__ or seen.__context__
    said = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in said or "[SSL" in said:
        return f"TLS refused the connection: {said}"
    return None


class Streams(Protocol):
    """The settings, connection and counters of a Redis bus, as its parts use them."""

    # Settings.
    url: str
    group: str
    consumer: str
    consume: bool
    name: str
    partitions: int
    maxlen: int
    window_ms: int
    claim_idle: float
    max_deliveries: int
    batch: int
    buffer: int
    max_held: int
    token: str
    #: Whether the bus runs on a Redis Cluster (a script per partition, reads per node).
    cluster: bool
    #: The names of the bus's keys.
    layout: Layout
    #: Replicas that must have a flush before its publishes are answered (``WAIT``).
    min_replicas: int
    replica_timeout_ms: int
    # The connection, the bus it runs for, the scripts; what is held.
    _client: Any
    _bus: BusHost | None
    _stopping: bool
    _scripts: dict[str, Any]
    _partition_of_key: dict[bytes, int]
    #: The entries delivered to this consumer and not yet done, by event.
    held: dict[Event, Delivery]
    # Counters.
    sent: int
    duplicates: int
    refused_full: int
    backoffs: int
    delivered: int
    acked: int
    skipped_handled: int
    twins: int
    retried: int
    dead_lettered: int
    reconnects: int
    relayed: int
    fenced: int
    stranded: int
    _leases: Any
    #: What runs write beside their effects (``durable._Durable``).
    _durable: Any
    #: What was fetched for this consumer (``deliveries._Deliveries``).
    _deliveries: Any

    async def _retrying(self, action: Callable[[], Any]) -> Any: ...

    async def flush(self) -> None: ...
