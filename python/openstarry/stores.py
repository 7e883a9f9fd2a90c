"""Session stores: SQLite for one machine that must survive a restart, Redis for several workers.

    from openstarry.stores import open_store

    store = open_store("sqlite:///var/lib/agent/sessions.db")  # or "redis://host:6379/0"
    async with Agent(provider, tools, store=store) as agent: ...

Each implements :class:`~openstarry.agent.store.SessionStore`: a session is one
JSON document (its memory's entries), replaced whole by each save. The SQLite
store uses the standard library (its calls run in a worker thread); the Redis
store needs the ``[redis]`` extra and keeps each session where the Redis bus of
the same name keeps its session's partition (``{NAME}:session:ID`` on one
server; on a cluster, under the partition's hash tag). The assembly layer picks
one from the manifest's ``sessions.store``.

On the Redis bus it shares (the same URL and name), the Redis store commits with
the bus: a run's save is carried by the commit that acknowledges its input, and
written if, and only if, that commit is accepted (see :class:`RedisStore`).
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
from openstarry._redisurl import (
    CLUSTER_PARTITIONS,
    PARTITIONS,
    check_redis_url,
    cluster_nodes,
    is_cluster_url,
    is_redis_url,
    partitions_key,
    session_key,
)
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

    **Fenced, on its bus.** When the agent runs on the Redis bus of the same
    ``url`` and ``name`` (what ``openstarry worker`` does by default), a run's
    save is not a write of its own: it goes with the commit that acknowledges
    the run's input (:meth:`save_with`), which Redis refuses when the worker's
    lease of the session's partition has moved on. A worker frozen past its
    lease (a GC pause, a suspended VM, a partition) and thawed changes no
    session; the memory holds each turn once, in order. Until that commit is
    answered, the worker reads the memory it staged (:meth:`load_with`). On
    another Redis than the bus's, saves are plain writes, and not fenced.

    Args:
        url: The Redis server (``redis://``) or cluster (``redis+cluster://``).
        name: The name of the bus whose layout the keys follow.
        concurrency: Calls at once, at most (and connections).
        partitions: The bus's partition count, which places a session's key on a
            cluster; by default the count the bus recorded at its first use.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "openstarry",
        concurrency: int = 16,
        partitions: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {concurrency}")
        if partitions is not None and partitions < 1:
            raise ValueError(f"partitions must be >= 1, not {partitions}")
        try:
            import redis.asyncio  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "the Redis session store needs redis-py: pip install 'openstarry[redis]'"
            ) from exc
        self.url = url
        self.name = name
        self.concurrency = concurrency
        self.partitions = partitions
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
        if self._cluster and self.partitions is None:
            raise RuntimeError("the store's partition count is read from the cluster first")
        return session_key(self.name, self.partitions or PARTITIONS, self._cluster, session_id)

    async def _session_key(self, session_id: str) -> str:
        """The key of a session: on a cluster, in its partition's slot (the count read
        once from what the bus recorded, else the default)."""
        if self._cluster and self.partitions is None:
            recorded = await self._retrying("get", partitions_key(self.name))
            self.partitions = int(recorded) if recorded else CLUSTER_PARTITIONS
        return self._key(session_id)

    def _bus_of(self, bus: Any) -> Any:
        """The bus's Redis backend, when it is this store's Redis and name, else ``None``."""
        backend: Any = getattr(bus, "backend", None)
        if (
            getattr(backend, "stage", None) is None
            or getattr(backend, "url", None) != self.url
            or getattr(backend, "name", None) != self.name
        ):
            return None
        if self.partitions is None:
            self.partitions = backend.partitions
        return backend

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
        data = await self._retrying("get", await self._session_key(session_id))
        return None if data is None else json.loads(data)

    async def save(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        data = json.dumps(entries, ensure_ascii=False)
        await self._retrying("set", await self._session_key(session_id), data)

    async def delete(self, session_id: str) -> None:
        await self._retrying("delete", await self._session_key(session_id))

    async def load_with(self, bus: Any, session_id: str) -> list[dict[str, Any]] | None:
        """:meth:`load`, as a worker of ``bus`` sees the session: with what it staged
        in a commit not yet answered."""
        backend = self._bus_of(bus)
        if backend is not None:
            found, data = backend.staged(self._key(session_id))
            if found:
                return None if data is None else list(data)
        return await self.load(session_id)

    def save_with(
        self, bus: Any, event: Any, session_id: str, entries: list[dict[str, Any]]
    ) -> bool:
        """Stage the save into the commit of ``event`` (the input whose run wrote it) on
        ``bus``, when ``bus`` runs on this store's Redis and delivered ``event``.

        Returns ``False`` when it cannot (another bus; an event not delivered by
        it): then :meth:`save` it.

        Raises:
            LeaseLost: the lease ``event`` was delivered under is lost: nothing
                may be written for it.
        """
        backend = self._bus_of(bus)
        if backend is None:
            return False
        value = json.dumps(entries, ensure_ascii=False).encode()
        return bool(backend.stage(event, self._key(session_id), value, entries))

    def delete_with(self, bus: Any, event: Any, session_id: str) -> bool:
        """:meth:`save_with` for a delete (a ``/reset``)."""
        backend = self._bus_of(bus)
        if backend is None:
            return False
        return bool(backend.stage(event, self._key(session_id), b"", None))

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


def open_store(spec: str | None, *, name: str | None = None) -> SessionStore | None:
    """The store a ``sessions.store`` value names.

    ``None`` or ``"memory"``: none (sessions in the agent's process);
    ``"sqlite:///PATH"`` or ``"sqlite:PATH"``: :class:`SQLiteStore`, opened
    here (a file that cannot be used is refused now, not at the first run);
    ``"redis://..."`` or ``"redis+cluster://..."``: :class:`RedisStore`, for
    the bus called ``name`` (by default ``"openstarry"``).

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
        return RedisStore(spec) if name is None else RedisStore(spec, name=name)
    raise ValueError(
        f"sessions store {spec!r}: expected 'memory', 'sqlite:///PATH', 'redis://...' "
        "or 'redis+cluster://...'"
    )
