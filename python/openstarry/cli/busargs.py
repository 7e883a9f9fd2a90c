"""The options every command on a shared bus takes (``--bus``, ``--name``,
``--partitions``), and a URL fit for messages: one place for ``worker``,
``publish``, ``tail`` and ``bus info``."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from openstarry._redisurl import check_redis_url, default_partitions

__all__ = [
    "bus_arguments",
    "bus_options",
    "count",
    "durability_argument",
    "redacted",
    "resolve_partitions",
]


def bus_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bus``, ``--name`` and ``--partitions``: the same for every process of one bus."""
    parser.add_argument(
        "--bus",
        required=True,
        type=_bus_url,
        metavar="URL",
        help="redis://host:port/db, or a Redis Cluster: redis+cluster://host:port[,host:port...]",
    )
    parser.add_argument(
        "--name", default="openstarry", help="the bus's key prefix (default: openstarry)"
    )
    parser.add_argument(
        "--partitions",
        type=count,
        default=None,
        help="session partitions; every process of the bus must agree, and the bus "
        "refuses another count than the one it was first used with (default: 8 on one "
        "server, 24 on a cluster; tail and bus info: the bus's own)",
    )


def _bus_url(text: str) -> str:
    """``--bus``: a Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``)."""
    try:
        check_redis_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}: {redacted(text)!r}") from None
    return text


def resolve_partitions(args: argparse.Namespace) -> int:
    """``--partitions``, or the default of the bus's kind (8 on one server, 24 on a cluster)."""
    if args.partitions is None:
        args.partitions = default_partitions(args.bus)
    partitions: int = args.partitions
    return partitions


def bus_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"name": args.name, "partitions": resolve_partitions(args)}
    if getattr(args, "min_replicas", None):
        options["min_replicas"] = args.min_replicas
    return options


def durability_argument(parser: argparse.ArgumentParser) -> None:
    """``--min-replicas`` (``worker`` and ``publish``)."""
    parser.add_argument(
        "--min-replicas",
        type=int,
        choices=range(17),
        default=0,
        metavar="N",
        help="replicas that must hold each flush before it is answered (Redis WAIT): an "
        "accepted publish survives the loss of its master (default 0: answered at once)",
    )


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (for messages).

    A URL that does not parse (``redis://[::1``) has what stands between
    ``://`` and the last ``@`` replaced, so no password leaks from it either.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parses the port: it raises on a bad one
    except ValueError:
        scheme, sep, rest = url.partition("://")
        auth, at, host = rest.rpartition("@")
        user = auth.partition(":")[0]
        return f"{scheme}{sep}{user}:***@{host}" if at else url
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def count(text: str) -> int:
    """A whole number, at least 1 (``--partitions``, ``tail --count``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value
