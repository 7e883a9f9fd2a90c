"""The names of the Redis bus's keys, and which partition a session belongs to.

Two layouts, one per kind of deployment (:class:`Layout`):

- **one Redis server**: every key starts with the hash tag ``{name}``
  (``{openstarry}`` by default): ``{name}:s:P:R`` (the stream of partition
  ``P`` at priority ``R``), ``{name}:ids:B``, ``{name}:hold:PRODUCER``,
  ``{name}:dead``, ``{name}:lease:GROUP:P`` (and its epoch counter
  ``{name}:epoch:GROUP:P``), ``{name}:consumers:GROUP``, ``{name}:session:ID``
  (a session's memory), ``{name}:run:ID`` (the journal of a run not yet committed);
- **a Redis Cluster**: the partition is the unit of sharding, so every key of
  partition ``P`` carries that partition's own hash tag ``{name:P.K}``: its
  streams, its duplicate window, its producers' holds, its dead letters, its
  lease and epoch, its sessions' memory, its runs' journals and its relay
  stream (effects bound for another partition, ``x``). The suffix ``K`` is the
  smallest number that puts the tag's slot in the ``P``-th of ``partitions``
  equal slices of the 16,384 slots, so that a cluster whose masters hold
  equal ranges of slots (what ``redis-cli --cluster create`` makes)
  holds equal numbers of partitions: 24 partitions are 8/8/8 on 3 masters,
  6 each on 4, 4 each on 6. Keys no partition owns (the consumer registry of a
  group) keep the tag ``{name}`` and are off the hot path.

A duplicate always lands in its original's partition (the partition comes
from ``sessionId``), so each partition's duplicate window is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openstarry._redisurl import (
    CLUSTER_PARTITIONS,
    PARTITIONS,
    cluster_nodes,
    default_partitions,
    is_cluster_url,
    key_slot,
    partition_of,
    partition_tag,
    partitions_key,
    session_key,
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


def stream_key(name: str, partition: int, priority: int, *, cluster: bool = False) -> str:
    """The stream of one partition at one priority (on a cluster: ``cluster=True``)."""
    return f"{partition_tag(name, partition, cluster)}:s:{partition}:{priority}"


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

    def epoch(self, group: str, partition: int) -> str:
        """The counter of a partition's lease epochs (each take of the lease is a new one)."""
        return f"{self.tags[partition]}:epoch:{group}:{partition}"

    def session(self, session_id: str) -> str:
        """Where a session's memory lives: in its partition's slot, so a commit writes it."""
        return session_key(self.name, self.partitions, self.cluster, session_id)

    def journal(self, partition: int, event_id: str) -> str:
        """The journal of the run of one input (its completed steps), until its commit."""
        return f"{self.tags[partition]}:run:{event_id}"

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


def event_field(fields: Sequence[bytes]) -> bytes:
    """The ``e`` field of an entry's ``[field, value, ...]`` list (empty if none)."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == b"e":
            return fields[i + 1]
    return b""


def event_value(fields: Any) -> bytes:
    """The ``e`` field of an entry as a parsed reply gives it (a dict, or a flat list)."""
    if isinstance(fields, dict):
        value: bytes = fields.get(b"e", b"")
        return value
    return event_field(fields) if fields else b""


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
