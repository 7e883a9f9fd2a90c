"""A Redis Cluster for the load benchmarks: N masters, no replicas, in memory.

    with cluster_url(3) as url:       # "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,..."
        ...

``python -m benches.redis_load --cluster N`` starts one and runs its load on it;
``test_bench_redis.py``'s cluster rows start one of 3 masters.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openstarry.redis_server import RedisClusterServer


def start_cluster(masters: int, folder: Path, *, replicas: int = 0) -> RedisClusterServer:
    """A started cluster of ``masters`` masters (at least 3) in ``folder``; stop it after."""
    server = RedisClusterServer(folder, masters=masters, replicas=replicas, aof=False)
    server.start()
    return server


@contextmanager
def cluster_url(masters: int, *, replicas: int = 0) -> Iterator[str]:
    """The URL of a cluster of ``masters`` masters in a temporary folder, stopped after."""
    with tempfile.TemporaryDirectory() as folder:
        server = start_cluster(masters, Path(folder), replicas=replicas)
        try:
            yield server.url
        finally:
            server.stop()
