"""Redis URLs: one server (``redis://``) or a Redis Cluster (``redis+cluster://``), and the
partitions a bus has by default on each. Standard library only: the CLI, the session
store and the Redis bus read URLs the same way, with or without the ``[redis]`` extra."""

from __future__ import annotations

import urllib.parse
from typing import Any

__all__ = [
    "CLUSTER_PARTITIONS",
    "CLUSTER_SCHEMES",
    "PARTITIONS",
    "REDIS_SCHEMES",
    "cluster_nodes",
    "default_partitions",
    "is_cluster_url",
    "is_redis_url",
]


#: Every Redis URL scheme: one server (``redis``, ``rediss``, ``unix``) or a cluster.
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")

#: URL schemes of a Redis Cluster: ``redis+cluster://host:port[,host:port...]`` (and over TLS).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

#: Partitions by default: on one server, and on a cluster (24 spreads evenly over 2, 3, 4,
#: 6, 8 and 12 masters).
PARTITIONS = 8
CLUSTER_PARTITIONS = 24


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server or a Redis Cluster."""
    return url.partition("://")[0].lower() in REDIS_SCHEMES


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def default_partitions(url: str) -> int:
    """The partitions of a bus at ``url`` when none are given: 24 on a cluster, else 8."""
    return CLUSTER_PARTITIONS if is_cluster_url(url) else PARTITIONS


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes of a ``redis+cluster://`` URL and its connection options.

    ``redis+cluster://[user:password@]host:port[,host:port...][?option=value]``:
    any node of the cluster will do as a seed; several make the first connection
    survive one that is down. ``rediss+cluster://`` connects over TLS.

    Raises:
        ValueError: not a cluster URL, no node, or a node without a valid port.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError("not a Redis Cluster URL: expected redis+cluster://host:port[,...]")
    rest, _, query = rest.partition("?")
    rest = rest.split("/", 1)[0]  # a cluster has one database: /0 or nothing
    options: dict[str, Any] = {"ssl": scheme.lower() == "rediss+cluster"}
    auth, at, hosts = rest.rpartition("@")
    if at:
        user, colon, password = auth.partition(":")
        options["password"] = urllib.parse.unquote(password if colon else user)
        if colon and user:
            options["username"] = urllib.parse.unquote(user)
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"Redis Cluster URL: expected host:port, not {part.strip()!r}")
        nodes.append((host.strip("[]"), int(port)))
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        options[key] = value
    return nodes, options
