"""The names of the Redis bus's keys, and which partition a session belongs to.

Two layouts, one per kind of deployment (:class:`Layout`):

- **one Redis server**: every key starts with the hash tag ``{name}``
  (``{openstarry}`` by default): ``{name}:s:P:R`` (the stream of partition
  ``P`` at priority ``R``), ``{name}:ids:B``, ``{name}:hold:PRODUCER``,
  ``{name}:dead``, ``{name}:lease:GROUP:P``, ``{name}:consumers:GROUP``;
- **a Redis Cluster**: the partition is the unit of sharding, so every key of
  partition ``P`` carries that partition's own hash tag ``{name:P.K}``: its
  streams, its duplicate window, its producers' holds, its dead letters, its
  lease and its relay stream (effects bound for another partition, ``x``). The
  suffix ``K`` is the smallest number that puts the tag's slot in the ``P``-th
  of ``partitions`` equal slices of the 16,384 slots, so that a cluster whose
  masters hold equal ranges of slots (what ``redis-cli --cluster create`` makes)
  holds equal numbers of partitions: 24 partitions are 8/8/8 on 3 masters,
  6 each on 4, 4 each on 6. Keys no partition owns (the consumer registry of a
  group) keep the tag ``{name}`` and are off the hot path.

A duplicate always lands in its original's partition (the partition comes
from ``sessionId``), so each partition's duplicate window is exact.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

from openstarry._redisurl import (
    CLUSTER_PARTITIONS,
    PARTITIONS,
    cluster_nodes,
    default_partitions,
    is_cluster_url,
)

__all__ = [
    "CLUSTER_PARTITIONS",
    "PARTITIONS",
    "PRIORITIES",
    "Layout",
    "cluster_nodes",
    "default_partitions",
    "is_cluster_url",
    "key_slot",
    "partition_of",
    "partition_tag",
    "stream_key",
    "partitions_key",
]

#: The priorities of the streams of a partition, 0 (read first) to 5.
PRIORITIES = range(6)


def partition_of(session_id: str, partitions: int) -> int:
    """The partition of a session: the same in every process (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % partitions


def stream_key(name: str, partition: int, priority: int, *, cluster: bool = False) -> str:
    """The stream of one partition at one priority (on a cluster: ``cluster=True``)."""
    return f"{partition_tag(name, partition, cluster)}:s:{partition}:{priority}"


#: Hash slots of a Redis Cluster.
SLOTS = 16384


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the checksum of Redis Cluster's key slots."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The hash slot of a key: of its hash tag (``{...}``) when it has one."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return _crc16(key.encode("utf-8", "surrogatepass")) % SLOTS


@functools.lru_cache(maxsize=4096)
def partition_tag(name: str, partition: int, cluster: bool, partitions: int = 0) -> str:
    """The hash tag of a partition's keys: ``{name}``, or on a cluster ``{name:P.K}``.

    On a cluster, ``partitions`` (when given) places the tag's slot in the
    partition's slice of the slots (see the module); 0 takes ``K = 0``.
    """
    if not cluster:
        return f"{{{name}}}"
    if partitions <= 0:
        return f"{{{name}:{partition}.0}}"
    low = partition * SLOTS // partitions
    high = (partition + 1) * SLOTS // partitions
    k = 0
    while True:
        tag = f"{name}:{partition}.{k}"
        if low <= key_slot(tag) < high or high <= low:
            return f"{{{tag}}}"
        k += 1


class Layout:
    """The names of a bus's keys: on one Redis server, or sharded by partition on a cluster."""

    __slots__ = ("cluster", "name", "partitions", "tags")

    def __init__(self, name: str, partitions: int, *, cluster: bool = False) -> None:
        self.name = name
        self.partitions = partitions
        self.cluster = cluster
        #: Each partition's hash tag.
        self.tags = [partition_tag(name, p, cluster, partitions) for p in range(partitions)]

    def stream(self, partition: int, priority: int) -> str:
        """The stream of one partition at one priority."""
        return f"{self.tags[partition]}:s:{partition}:{priority}"

    def streams(self, partition: int) -> list[str]:
        """A partition's streams, priority 0 first."""
        return [self.stream(partition, r) for r in PRIORITIES]

    def prefix(self, partition: int) -> str:
        """What the flush script puts before ``ids:B``, ``hold:PRODUCER``, ``dead``, ``x``."""
        return f"{self.tags[partition]}:"

    def lease(self, group: str, partition: int) -> str:
        return f"{self.tags[partition]}:lease:{group}:{partition}"

    def dead(self, partition: int) -> str:
        return f"{self.tags[partition]}:dead"

    def relay(self, partition: int) -> str:
        """A partition's relay stream: effects committed here, bound for another partition."""
        return f"{self.tags[partition]}:x"

    def consumers(self, group: str) -> str:
        """The live consumers of a group (no partition owns it)."""
        return f"{{{self.name}}}:consumers:{group}"

    def partitions_key(self) -> str:
        """Where the bus records its partition count at its first use (no partition owns it)."""
        return partitions_key(self.name)


def partitions_key(name: str) -> str:
    """Where the bus called ``name`` records its partition count at its first use."""
    return f"{{{name}}}:partitions"


def _field(fields: Sequence[bytes]) -> bytes:
    """The ``e`` field of an entry's ``[field, value, ...]`` list (empty if none)."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == b"e":
            return fields[i + 1]
    return b""


def _value(fields: Any) -> bytes:
    """The ``e`` field of an entry as a parsed reply gives it (a dict, or a flat list)."""
    if isinstance(fields, dict):
        value: bytes = fields.get(b"e", b"")
        return value
    return _field(fields) if fields else b""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
