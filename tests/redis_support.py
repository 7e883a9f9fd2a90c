"""What the tests on a real Redis share: a skip where no ``redis-server`` is found, a server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from openstarry.redis_server import RedisServer, redis_server_path

#: Skips a test where no ``redis-server`` can be found (never on CI, where it must be).
NEEDS_REDIS_SERVER = pytest.mark.skipif(
    redis_server_path() is None and not os.environ.get("CI"),
    reason="redis-server is missing: `make test` installs it",
)


@contextmanager
def running_redis(tmp_path: Path, **options: Any) -> Iterator[RedisServer]:
    """A ``redis-server`` on loopback, its files under ``tmp_path``, stopped on leaving."""
    server = RedisServer(tmp_path, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
