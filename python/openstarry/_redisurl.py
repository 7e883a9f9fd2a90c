"""Redis URLs: one server (``redis://``) or a Redis Cluster (``redis+cluster://``), the
partitions a bus has by default on each, and where a bus's partitions and sessions live
(their hash tags). Standard library only: the CLI, the session store and the Redis bus
read URLs and name keys the same way, with or without the ``[redis]`` extra."""

from __future__ import annotations

import functools
import urllib.parse
import zlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "CLUSTER_PARTITIONS",
    "CLUSTER_SCHEMES",
    "PARTITIONS",
    "REDIS_SCHEMES",
    "SLOTS",
    "check_redis_url",
    "cluster_nodes",
    "default_partitions",
    "is_cluster_url",
    "is_redis_url",
    "key_slot",
    "partition_of",
    "partition_tag",
    "partitions_key",
    "session_key",
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


def check_redis_url(url: str) -> None:
    """Refuse a Redis URL that cannot name a server, before anything connects to it.

    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS),
    ``unix:///path[?db=N]`` and ``redis+cluster://host:port[,host:port...]``:
    a host that parses, a port of 1 to 65535, and a database that is a whole
    number (redis-py reads ``/notadb`` as database 0). Whether the database
    exists is the server's to say: ``/99`` is refused when the server answers.

    Raises:
        ValueError: what is wrong, in one line (the URL's password never in it).
    """
    scheme = url.partition("://")[0].lower()
    if scheme not in REDIS_SCHEMES or "://" not in url:
        raise ValueError(
            "expected redis://host:port/db, rediss://..., unix:///path or "
            "redis+cluster://host:port[,host:port...]"
        )
    if scheme in CLUSTER_SCHEMES:
        cluster_nodes(url)
        return
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise ValueError(f"not a valid URL: {exc}") from None
    query = urllib.parse.parse_qs(parts.query)
    if scheme == "unix":
        if not parts.path:
            raise ValueError("unix:///path: the socket's path is missing")
        db = query.get("db", [""])[0]
    else:
        if port == 0:
            raise ValueError("a port is 1 to 65535, not 0")
        db = parts.path.lstrip("/") or query.get("db", [""])[0]
    if db and not db.isdigit():
        raise ValueError(f"the database is a number (/0, /1, ...), not {db!r}")


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
    survive one that is down. ``rediss+cluster://`` connects over TLS. The options
    are redis-py's, for every node the client finds (``ssl_ca_certs=/path``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname=false``, ...): typed as
    redis-py types them in a ``redis://`` URL (a flag ``false`` is ``False``, a
    timeout a number), the rest as text.

    Raises:
        ValueError: not a cluster URL, no node, a node without a valid port, or an
            option that is not of its type.
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
        key, value = urllib.parse.unquote(key), urllib.parse.unquote(value)
        parse = _OPTION_TYPES.get(key)
        try:
            options[key] = value if parse is None else parse(value)
        except ValueError:
            kind = "a whole number" if parse is int else "a number"
            raise ValueError(f"Redis Cluster URL: {key}={value!r} is not {kind}") from None
    return nodes, options


def _flag(value: str) -> bool:
    """A URL's flag as redis-py reads one: ``0``, ``f``, ``false``, ``n``, ``no`` are false."""
    return value.upper() not in ("0", "F", "FALSE", "N", "NO")


#: The options of a cluster URL that are not text, and their types (redis-py's own
#: for ``redis://`` URLs, and its cluster client's): text such as ``"false"`` would
#: reach every node as a true value.
_OPTION_TYPES: dict[str, Callable[[str], Any]] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "socket_keepalive": _flag,
    "retry_on_timeout": _flag,
    "max_connections": int,
    "health_check_interval": int,
    "ssl_check_hostname": _flag,
    "ssl_min_version": int,
    "protocol": int,
    "read_from_replicas": _flag,
    "require_full_coverage": _flag,
    "reinitialize_steps": int,
}


# -- where a bus's keys live (the Redis bus and the session store agree on them) --


def partition_of(session_id: str, partitions: int) -> int:
    """The partition of a session: the same in every process (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % partitions


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


def partitions_key(name: str) -> str:
    """Where the bus called ``name`` records its partition count at its first use."""
    return f"{{{name}}}:partitions"


def session_key(name: str, partitions: int, cluster: bool, session_id: str) -> str:
    """Where the bus called ``name`` keeps a session's memory: under the hash tag of the
    session's partition, so that the commit of its input writes it in one script."""
    tag = partition_tag(name, partition_of(session_id, partitions), cluster, partitions)
    return f"{tag}:session:{session_id}"
