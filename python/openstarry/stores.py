"""Session stores: SQLite for one machine that must survive a restart, Redis for several workers.

    from openstarry.stores import open_store

    store = open_store("sqlite:///var/lib/agent/sessions.db")  # or "redis://host:6379/0"
    async with Agent(provider, tools, store=store) as agent: ...

Each implements :class:`~openstarry.agent.store.SessionStore`: a session is one
JSON document (its memory's entries), replaced whole by each save. The SQLite
store uses the standard library (its calls run in a worker thread); the Redis
store needs the ``[redis]`` extra and keeps each session under
``{NAME}:session:ID``. The assembly layer picks one from the manifest's
``sessions.store``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from openstarry._lifecycle import Lifecycle
from openstarry._redisurl import check_redis_url, cluster_nodes, is_cluster_url, is_redis_url
from openstarry.agent.store import InMemoryStore, SessionStore

__all__ = ["InMemoryStore", "RedisStore", "SQLiteStore", "open_store"]


class SQLiteStore:
    """Sessions in one SQLite file (the standard library's ``sqlite3``, WAL mode)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, data TEXT NOT NULL)"
            )
            self._db = db
        return self._db

    def open(self) -> None:
        """Open the database now, so that one that cannot be used is told before any run.

        Raises:
            ValueError: the file cannot be opened or made (a missing folder, a
                directory, no permission) or is not a SQLite database.
        """
        try:
            with self._lock:
                self._connection().execute("SELECT count(*) FROM sessions").fetchall()
        except sqlite3.Error as exc:
            self.close()
            raise ValueError(f"cannot use the SQLite database {self.path!r}: {exc}") from None

    def _call(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            return self._connection().execute(sql, args).fetchall()

    async def load(self, session_id: str) -> list[dict[str, Any]] | None:
        rows = await anyio.to_thread.run_sync(
            self._call, "SELECT data FROM sessions WHERE id = ?", (session_id,)
        )
        return json.loads(rows[0][0]) if rows else None

    async def save(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        data = json.dumps(entries, ensure_ascii=False)
        await anyio.to_thread.run_sync(
            self._call,
            "INSERT INTO sessions (id, data) VALUES (?, ?) "
            "ON CONFLICT(id) DO UPDATE SET data = excluded.data",
            (session_id, data),
        )

    async def delete(self, session_id: str) -> None:
        await anyio.to_thread.run_sync(
            self._call, "DELETE FROM sessions WHERE id = ?", (session_id,)
        )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class RedisStore(Lifecycle):
    """Sessions in Redis, shared by every worker (the ``[redis]`` extra; asyncio only).

    Its connection opens on first use and closes when the store, used as an
    async context manager (an :class:`~openstarry.agent.Agent` enters it), exits.
    At most ``concurrency`` calls run at once (the others wait their turn), on
    a pool of as many connections: a worker running hundreds of sessions never
    runs out of connections, and never opens hundreds.
    """

    def __init__(self, url: str, *, name: str = "openstarry", concurrency: int = 16) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {concurrency}")
        try:
            import redis.asyncio  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "the Redis session store needs redis-py: pip install 'openstarry[redis]'"
            ) from exc
        self.url = url
        self.name = name
        self.concurrency = concurrency
        self._cluster = is_cluster_url(url)
        self._ready = False
        self._init = anyio.Lock()
        self._slots = anyio.Semaphore(concurrency)
        self._client: Any = None

    def _redis(self) -> Any:
        if self._client is None:
            if self._cluster:
                from redis.asyncio.cluster import ClusterNode, RedisCluster

                nodes, options = cluster_nodes(self.url)
                self._client = RedisCluster(
                    startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                    decode_responses=False,
                    max_connections=self.concurrency,
                    **options,
                )
            else:
                import redis.asyncio as aioredis

                self._client = aioredis.Redis.from_url(
                    self.url, decode_responses=False, max_connections=self.concurrency
                )
        return self._client

    def _key(self, session_id: str) -> str:
        if self._cluster:  # each session its own slot: sessions spread over the masters
            return f"{self.name}:session:{{{session_id}}}"
        return f"{{{self.name}}}:session:{session_id}"

    async def _retrying(self, command: str, *args: Any) -> Any:
        """A command, retried with backoff (50 ms to 2 s, 30 s in all) while Redis is away."""
        from redis import exceptions

        delay, waited = 0.05, 0.0
        while True:
            try:
                async with self._slots:
                    client = self._redis()
                    if self._cluster and not self._ready:
                        # Once, before the calls run at once: redis-py's cluster client
                        # looking its slots up from several calls closes their connections.
                        async with self._init:
                            if not self._ready:
                                await client.initialize()
                                self._ready = True
                    return await getattr(client, command)(*args)
            except (
                exceptions.ConnectionError,
                exceptions.TimeoutError,
                exceptions.ClusterError,
                OSError,
                AttributeError,  # redis-py's cluster client, a connection closed under a call
            ):
                if waited >= 30:
                    raise
                await anyio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 2.0)

    async def load(self, session_id: str) -> list[dict[str, Any]] | None:
        data = await self._retrying("get", self._key(session_id))
        return None if data is None else json.loads(data)

    async def save(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        data = json.dumps(entries, ensure_ascii=False)
        await self._retrying("set", self._key(session_id), data)

    async def delete(self, session_id: str) -> None:
        await self._retrying("delete", self._key(session_id))

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[RedisStore]:
        try:
            yield self
        finally:
            client, self._client = self._client, None
            self._ready = False
            if client is not None:
                with anyio.CancelScope(shield=True):
                    await client.aclose()


def open_store(spec: str | None) -> SessionStore | None:
    """The store a ``sessions.store`` value names.

    ``None`` or ``"memory"``: none (sessions in the agent's process);
    ``"sqlite:///PATH"`` or ``"sqlite:PATH"``: :class:`SQLiteStore`, opened
    here (a file that cannot be used is refused now, not at the first run);
    ``"redis://..."`` or ``"redis+cluster://..."``: :class:`RedisStore`.

    Raises:
        ValueError: any other value, a SQLite file that cannot be used, or a
            Redis URL that cannot name a server.
    """
    if spec is None or spec == "memory":
        return None
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:")
        path = path.removeprefix("//") if path.startswith("///") else path
        if not path or path == "//":
            raise ValueError(f"{spec!r}: expected sqlite:///PATH, a file's path")
        store = SQLiteStore(path)
        store.open()
        return store
    if is_redis_url(spec):
        try:
            check_redis_url(spec)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        return RedisStore(spec)
    raise ValueError(
        f"sessions store {spec!r}: expected 'memory', 'sqlite:///PATH', 'redis://...' "
        "or 'redis+cluster://...'"
    )
