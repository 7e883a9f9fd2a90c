"""``openstarry bus info``: where a Redis bus's partitions live and what they hold.

    openstarry bus info --bus redis+cluster://10.0.0.1:7000 [--group G] [--json]

For each partition: its hash tag, the node that holds it (the master of its
tag's slot on a cluster; the server itself on one server), its owner in the
group (the consumer its lease names, ``-`` when none holds it; ``epoch`` in the
JSON: how many times its lease was taken), the entries
of its six streams (all priorities, and priority 0 apart), the entries the
group has read and not acknowledged (``XPENDING``, summed over the streams)
and its dead letters. Then per node: the partitions it holds and its share
of the entries; and the group's live consumers with when each was last seen
(the heartbeats each consumer writes, by its own clock).

Everything comes in one pipeline: one round trip per node (the cluster client
sends each node's commands as one batch, concurrently), every command naming
one key. Lengths are ``XLEN``, O(1); nothing reads the entries themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

__all__ = ["add_info_command", "collect", "render"]


def add_info_command(commands: Any, bus_arguments: Any) -> None:
    """Add ``bus`` with its ``info`` subcommand to the ``openstarry`` parser."""
    bus = commands.add_parser(
        "bus",
        help="look at a shared bus on Redis",
        description="Look at a shared bus on Redis (one server or a Redis Cluster).",
    )
    actions = bus.add_subparsers(dest="bus_command", metavar="COMMAND", required=True)
    info = actions.add_parser(
        "info",
        help="where the bus's partitions live and what they hold",
        description="For each partition: its hash tag, its node, its owner in the group, "
        "its entries, the group's pending entries and its dead letters; then each "
        "node's partitions and share of the entries, and the group's live consumers.",
    )
    bus_arguments(info)
    info.add_argument(
        "--group", default="openstarry", help="the consumer group (default: openstarry)"
    )
    info.add_argument("--json", action="store_true", help="one JSON object, for machines")
    info.set_defaults(handler=_info)


def _info(args: argparse.Namespace) -> int:
    import anyio

    return anyio.run(_ainfo, args)


async def _ainfo(args: argparse.Namespace) -> int:
    import anyio

    from openstarry.bus.redis.reader import ERRORS, bus_layout, connect
    from openstarry.cli.busargs import redacted

    client = connect(args.bus)
    try:
        layout = await bus_layout(client, args.bus, args.name, args.partitions)
        found = await collect(client, layout, args.group)
    except ERRORS as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"openstarry bus info: on {redacted(args.bus)}: {text}", file=sys.stderr)
        return 1
    finally:
        with anyio.move_on_after(2, shield=True):
            await client.aclose()
    found = {"bus": redacted(args.bus), **found}
    if args.json:
        print(json.dumps(found), flush=True)
    else:
        sys.stdout.write(render(found))
        sys.stdout.flush()
    return 0


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _address(client: Any) -> str:
    """The server of a single-node client: ``host:port``, or its socket's path."""
    options = client.connection_pool.connection_kwargs
    if options.get("path"):
        return str(options["path"])
    return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"


async def collect(client: Any, layout: Any, group: str) -> dict[str, Any]:
    """What ``bus info`` shows, as plain data (the ``--json`` object less ``bus``).

    Args:
        client: A redis-py asyncio client (``RedisCluster`` for a cluster) answering bytes.
        layout: The bus's :class:`~openstarry.bus.redis.keys.Layout`.
        group: The consumer group whose owners, pending entries and consumers are shown.
    """
    from redis.asyncio.cluster import RedisCluster

    cluster = isinstance(client, RedisCluster)
    if cluster:
        await client.initialize()  # the slot map, for get_node_from_key
        node_of = [client.get_node_from_key(layout.tags[p]).name for p in range(layout.partitions)]
        every_node = sorted({node.name for node in client.get_primaries()} | set(node_of))
    else:
        here = _address(client)
        node_of = [here] * layout.partitions
        every_node = [here]
    per_partition = 1 + 2 * len(layout.streams(0)) + 1 if layout.partitions else 0
    async with client.pipeline(transaction=False) as pipe:
        for p in range(layout.partitions):
            pipe.get(layout.lease(group, p))
            for stream in layout.streams(p):
                pipe.xlen(stream)
                pipe.xpending(stream, group)
            pipe.xlen(layout.dead(p))
        pipe.zrange(layout.consumers(group), 0, -1, withscores=True)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    for reply in replies:
        # NOGROUP (no group on a stream, or no stream yet) is "nothing pending";
        # anything else is the server's answer to report.
        if isinstance(reply, Exception) and not str(reply).startswith("NOGROUP"):
            raise reply
    partitions = []
    for p in range(layout.partitions):
        owner, *rest = replies[p * per_partition : (p + 1) * per_partition]
        lengths = [int(n) for n in rest[0:-1:2]]
        pending = sum(
            int(summary["pending"]) for summary in rest[1:-1:2] if isinstance(summary, dict)
        )
        partitions.append(
            {
                "partition": p,
                "tag": layout.tags[p],
                "node": node_of[p],
                # A lease's value is "consumer|epoch" (each take of it a new epoch).
                "owner": None if owner is None else _text(owner).rpartition("|")[0] or _text(owner),
                "epoch": None if owner is None else _epoch(_text(owner)),
                "streams": lengths,
                "entries": sum(lengths),
                "pending": pending,
                "dead": int(rest[-1]),
            }
        )
    total = sum(part["entries"] for part in partitions)
    nodes = []
    # The nodes in the order of the partitions they hold (those holding none last).
    first = {name: p for p, name in reversed(list(enumerate(node_of)))}
    for name in sorted(every_node, key=lambda name: (first.get(name, layout.partitions), name)):
        held = [part for part in partitions if part["node"] == name]
        entries = sum(part["entries"] for part in held)
        nodes.append(
            {
                "node": name,
                "partitions": [part["partition"] for part in held],
                "entries": entries,
                "share": entries / total if total else 0.0,
            }
        )
    heartbeats = replies[-1]
    consumers = [
        {"consumer": _text(name), "last_seen_ms": int(score)}
        for name, score in (heartbeats if isinstance(heartbeats, list) else ())
    ]
    return {
        "name": layout.name,
        "group": group,
        "cluster": cluster,
        "partitions": partitions,
        "nodes": nodes,
        "consumers": consumers,
    }


def _spans(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5`` (``-`` for none)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "-"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in [header, *rows]
    ]


def render(found: dict[str, Any], *, now_ms: int | None = None) -> str:
    """The human tables of ``bus info``."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    partitions = found["partitions"]
    kind = "Redis Cluster" if found["cluster"] else "one Redis server"
    lines = [
        f"bus {found.get('bus', '')} ({kind}), name {found['name']}, group {found['group']}: "
        f"{len(partitions)} partitions on {len(found['nodes'])} node(s)",
        "",
    ]
    lines += _table(
        ["PART", "TAG", "NODE", "OWNER", "ENTRIES", "P0", "PENDING", "DEAD"],
        [
            [
                str(part["partition"]),
                part["tag"],
                part["node"],
                part["owner"] or "-",
                str(part["entries"]),
                str(part["streams"][0]),
                str(part["pending"]),
                str(part["dead"]),
            ]
            for part in partitions
        ],
        right={0, 4, 5, 6, 7},
    )
    lines.append("")
    lines += _table(
        ["NODE", "PARTITIONS", "COUNT", "ENTRIES", "SHARE"],
        [
            [
                node["node"],
                _spans(node["partitions"]),
                str(len(node["partitions"])),
                str(node["entries"]),
                f"{node['share']:.1%}",
            ]
            for node in found["nodes"]
        ],
        right={2, 3, 4},
    )
    lines.append("")
    if found["consumers"]:
        lines += _table(
            ["CONSUMER", "LAST SEEN"],
            [
                [c["consumer"], f"{max(0, now_ms - c['last_seen_ms']) / 1000:.1f} s ago"]
                for c in found["consumers"]
            ],
            right=set(),
        )
    else:
        lines.append(f"no live consumer in group {found['group']}")
    return "\n".join(lines) + "\n"


def _epoch(lease: str) -> int | None:
    """The epoch of a lease's value ``consumer|epoch`` (``None`` for another value)."""
    epoch = lease.rpartition("|")[2]
    return int(epoch) if epoch.isdigit() else None
