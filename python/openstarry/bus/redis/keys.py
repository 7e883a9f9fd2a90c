"""The names of the Redis bus's keys, and which partition a session belongs to.

Every key of the bus starts with the hash tag ``{name}`` (``{openstarry}`` by
default), so that a script's keys are on one node of a Redis Cluster.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

__all__ = ["PRIORITIES", "partition_of", "stream_key"]

#: The priorities of the streams of a partition, 0 (read first) to 5.
PRIORITIES = range(6)


def partition_of(session_id: str, partitions: int) -> int:
    """The partition of a session: the same in every process (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % partitions


def stream_key(name: str, partition: int, priority: int) -> str:
    """The stream of one partition at one priority."""
    return f"{{{name}}}:s:{partition}:{priority}"


def _field(fields: Sequence[bytes]) -> bytes:
    """The ``e`` field of an entry's ``[field, value, ...]`` list (empty if none)."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == b"e":
            return fields[i + 1]
    return b""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
