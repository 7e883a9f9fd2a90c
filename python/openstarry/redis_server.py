"""A throwaway ``redis-server`` for tests and benchmarks: on a free port in a folder you give.

    server = RedisServer(tmp_path)
    server.start()
    try:
        bus = EventBus.from_url(server.url)
        ...
    finally:
        server.stop()

It needs Debian's ``redis-server`` (or any on ``PATH``); openstarry's own tests
and benchmarks use it, so that no fake stands in for Redis. By default the
server runs with AOF on (``appendfsync always``), so that :meth:`RedisServer.restart`
keeps every acknowledged write; ``aof=False`` keeps everything in memory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ClusterNode",
    "ClusterTls",
    "RedisClusterServer",
    "RedisServer",
    "key_slot",
    "parse_cluster_nodes",
    "redis_server_path",
]


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process; :meth:`restart` keeps its data (AOF) and port."""

    def __init__(self, folder: Path, *, aof: bool = True) -> None:
        self.folder = folder
        self.aof = aof
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        path = redis_server_path()
        assert path is not None, "redis-server is missing: `make test` installs it"
        self.process = subprocess.Popen(
            [
                path,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes" if self.aof else "no",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer within 10 s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)  # a clean shutdown writes the AOF out
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


# -- A throwaway Redis Cluster -------------------------------------------------------------------

#: Every hash slot of a Redis Cluster.
SLOTS = 16384


def _redis() -> Any:
    try:
        import redis
    except ImportError as e:  # pragma: no cover - the tests have the extra
        raise ImportError(
            "RedisClusterServer needs redis-py: pip install 'openstarry[redis]'"
        ) from e
    return redis


@dataclass(frozen=True)
class ClusterNode:
    """One node as ``CLUSTER NODES`` shows it."""

    port: int
    node_id: str
    #: ``"master"`` or ``"replica"``.
    role: str
    #: The node id of its master (replicas), else ``None``.
    master_id: str | None
    #: Inclusive ``(first, last)`` slot ranges it serves (masters).
    slots: tuple[tuple[int, int], ...]
    #: Flags such as ``fail``, ``fail?`` (pfail), ``handshake``, ``noaddr``.
    flags: frozenset[str]
    #: Whether the node that answered has a live cluster-bus link to it.
    connected: bool

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


@dataclass(frozen=True)
class ClusterTls:
    """The files of a cluster that speaks TLS only: every node's certificate (for
    127.0.0.1) and key, and the CA that signed it, which clients and nodes trust.

    Each node listens with ``tls-port`` alone (``port 0``), and its cluster bus
    and replication go over TLS too (``tls-cluster yes``, ``tls-replication yes``).
    """

    cert: Path
    key: Path
    ca: Path


def parse_cluster_nodes(text: str) -> list[ClusterNode]:
    """The nodes of a ``CLUSTER NODES`` answer (importing slots are left out)."""
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        node_id, address, flags_text, master, _, _, _, link = fields[:8]
        port = int(address.split("@")[0].rpartition(":")[2] or 0)
        flags = frozenset(flags_text.split(","))
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot migrating or importing
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        nodes.append(
            ClusterNode(
                port=port,
                node_id=node_id,
                role="master" if "master" in flags else "replica",
                master_id=None if master == "-" else master,
                slots=tuple(sorted(slots)),
                flags=flags,
                connected=link == "connected",
            )
        )
    return sorted(nodes, key=lambda n: n.port)


class RedisClusterServer:
    """A Redis Cluster of local ``redis-server`` processes on free loopback ports.

        with RedisClusterServer(tmp_path, masters=3, replicas=1) as cluster:
            client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
            node = cluster.master_for_key("{openstarry:3}:stream")
            killed = cluster.kill_master(node.port)
            port, promoted = cluster.wait_failover(node.port)

    Each node lives in ``folder/<port>`` (its ``nodes.conf``, AOF and
    ``redis.log``). The first ``masters`` ports are the masters that
    ``redis-cli --cluster create`` is given, so :attr:`url` lists them.
    ``node_timeout_ms`` is ``cluster-node-timeout``: a dead master's replica
    takes over about two of them after its death. ``require_full_coverage``
    is ``cluster-require-full-coverage``: with Redis's default (``True``) the
    whole cluster refuses commands (``CLUSTERDOWN``) from the moment a master
    is marked failed until its replica is promoted. ``tls`` (a
    :class:`ClusterTls`) makes every node speak TLS only, the cluster created
    and reached over TLS; :attr:`url` is then ``rediss+cluster://...`` naming the CA.
    :meth:`move_slots` and :meth:`add_master` reshard it live.
    """

    def __init__(
        self,
        folder: Path,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        aof: bool = False,
        require_full_coverage: bool = True,
        timeout: float = 30.0,
        tls: ClusterTls | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.folder = folder
        self.masters_wanted = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.aof = aof
        self.require_full_coverage = require_full_coverage
        self.timeout = timeout
        self.tls = tls
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._bus_ports: dict[int, int] = {}
        self._seeds: list[int] = []
        #: The masters :meth:`kill_master` killed, as they were: their slots.
        self._killed: dict[int, ClusterNode] = {}
        #: Masters :meth:`add_master` joined without slots (not replicas in the making).
        self._added: set[int] = set()
        #: Seconds :meth:`start` spent: ``processes`` up, ``create`` (redis-cli), ``healthy``.
        self.timings: dict[str, float] = {}

    # -- lifecycle

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``: the masters it was created with
        (``rediss+cluster://...?ssl_ca_certs=CA`` over TLS)."""
        nodes = ",".join(f"127.0.0.1:{p}" for p in self._seeds)
        if self.tls is None:
            return f"redis+cluster://{nodes}"
        return f"rediss+cluster://{nodes}?ssl_ca_certs={urllib.parse.quote(str(self.tls.ca))}"

    @property
    def pids(self) -> dict[int, int]:
        """The pid of every process it started and has not seen exit, by port."""
        return {port: p.pid for port, p in self.processes.items() if p.poll() is None}

    def start(self) -> None:
        """Start every node, create the cluster and wait until it is whole; on failure, stop."""
        total = self.masters_wanted * (1 + self.replicas)
        started = time.monotonic()
        try:
            # Client ports and cluster-bus ports, given: the default bus port (port + 10000)
            # may be over 65535.
            ports = _free_ports(2 * total)
            self.ports = ports[:total]
            self._bus_ports = dict(zip(self.ports, ports[total:], strict=True))
            self._seeds = self.ports[: self.masters_wanted]
            for port in self.ports:
                _spawn(self, port)
            for port in self.ports:
                _wait_ping(self, port, time.monotonic() + self.timeout)
            self.timings["processes"] = time.monotonic() - started
            started = time.monotonic()
            _create(self)
            self.timings["create"] = time.monotonic() - started
            self.wait_healthy()
            self.timings["healthy"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process it started (SIGKILL after 10 s) and reap it; nothing is left."""
        processes = list(self.processes.values())
        self.processes = {}
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> RedisClusterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the cluster looks like now

    @property
    def nodes(self) -> list[ClusterNode]:
        """Every node, as a live node's ``CLUSTER NODES`` shows them now."""
        return parse_cluster_nodes(_ask_any(self, list(self.pids), "CLUSTER", "NODES"))

    def masters(self) -> list[ClusterNode]:
        """The masters that serve slots now, with their slot ranges, by first slot."""
        found = [n for n in self.nodes if n.role == "master" and n.slots and "fail" not in n.flags]
        return sorted(found, key=lambda n: n.slots[0])

    def replicas_of(self, master: int | ClusterNode) -> list[ClusterNode]:
        node = _find(self, master)
        return [n for n in self.nodes if n.master_id == node.node_id]

    def master_for_slot(self, slot: int) -> ClusterNode:
        if not 0 <= slot < SLOTS:
            raise ValueError(f"no slot {slot}")
        for node in self.masters():
            if node.serves(slot):
                return node
        raise LookupError(f"no live master serves slot {slot}")

    def master_for_key(self, key: str | bytes) -> ClusterNode:
        return self.master_for_slot(key_slot(key))

    # -- resharding, live

    def move_slots(
        self, slots: Iterable[int], to: int | ClusterNode, *, batch: int = 10, pause: float = 0.0
    ) -> None:
        """Move each of ``slots`` to the master ``to``, live, as ``redis-cli --cluster
        reshard`` does: ``CLUSTER SETSLOT <slot> IMPORTING`` on the target, ``MIGRATING``
        on its owner, its keys moved ``batch`` at a time (``MIGRATE ... KEYS``, ``pause``
        seconds after each batch: clients meet the slot half moved, ``ASK`` and
        ``TRYAGAIN``), then ``CLUSTER SETSLOT <slot> NODE`` on every master (``MOVED``)."""
        target = _find(self, to)
        if target.role != "master":
            raise ValueError(f"{target.address} is a {target.role}")
        for slot in slots:
            masters = [n for n in self.nodes if n.role == "master" and n.port in self.pids]
            source = next(n for n in masters if n.serves(slot))
            if source.port == target.port:
                continue
            _ask(self, target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            _ask(self, source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
            while keys := _ask(self, source.port, "CLUSTER", "GETKEYSINSLOT", slot, batch):
                # No REPLACE: a key the target holds already (written there while the
                # slot moved) is an error, not overwritten.
                move = ("MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", *keys)
                _ask(self, source.port, *move, timeout=15.0)
                if pause:
                    time.sleep(pause)
            for node in sorted(masters, key=lambda n: (n != target, n != source)):
                _ask(self, node.port, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

    def add_master(self, *, rebalance: bool = True, timeout: float = 60.0) -> ClusterNode:
        """Start an empty node and join it as a master (``redis-cli --cluster add-node``:
        ``CLUSTER MEET``); with ``rebalance``, move slots onto it, live, until the masters
        hold about equal shares (``redis-cli --cluster rebalance --cluster-use-empty-masters``).
        Waits until the cluster is whole; returns the new master as it is then."""
        deadline = time.monotonic() + timeout
        port, bus_port = _free_ports(2)
        self.ports.append(port)
        self._bus_ports[port] = bus_port
        self._added.add(port)
        _spawn(self, port)
        _wait_ping(self, port, deadline)
        seed = f"127.0.0.1:{next(p for p in self._seeds if p in self.pids)}"
        _cli(self, "add-node", f"127.0.0.1:{port}", seed)
        self.wait_healthy(timeout=max(0.1, deadline - time.monotonic()))
        if rebalance:
            _cli(self, "rebalance", seed, "--cluster-use-empty-masters")
            self.wait_healthy(timeout=max(0.1, deadline - time.monotonic()))
        return _find(self, port)

    # -- faults

    def kill_node(self, port: int | ClusterNode, sig: int = signal.SIGKILL) -> float:
        """Send ``sig`` to a node; return ``time.monotonic()`` right after; reap it."""
        port = port.port if isinstance(port, ClusterNode) else port
        process = self.processes[port]
        process.send_signal(sig)
        killed = time.monotonic()
        process.wait(timeout=self.timeout)
        return killed

    def kill_master(self, port: int | ClusterNode, sig: int = signal.SIGKILL) -> float:
        """Kill a master (SIGKILL by default); return when, as ``time.monotonic()``."""
        node = _find(self, port)
        if node.role != "master":
            raise ValueError(f"{node.address} is a {node.role}")
        self._killed[node.port] = node
        return self.kill_node(node.port, sig)

    def wait_failover(self, dead_port: int, timeout: float = 30.0) -> tuple[int, float]:
        """Wait until a replica of the master that was on ``dead_port`` has taken its
        slots and every live node says ``cluster_state:ok``; return that replica's port and
        when this was first seen (``time.monotonic()``, polled every 10 ms)."""
        deadline = time.monotonic() + timeout
        dead = self._killed.get(dead_port)
        unanswered: Exception | None = None  # while the nodes vote, one may not answer
        while time.monotonic() < deadline:
            try:
                nodes = self.nodes
                if dead is None:  # killed without kill_master: its slots as seen now
                    dead = next((n for n in nodes if n.port == dead_port and n.slots), None)
                if dead is not None:
                    heirs = [
                        n
                        for n in nodes
                        if n.role == "master"
                        and n.port != dead_port
                        and n.port in self.pids
                        and _was_replica_of(n, dead)
                    ]
                    if heirs and _all_ok(self):
                        return heirs[0].port, time.monotonic()
            except (OSError, RuntimeError, ValueError, _redis().RedisError) as exc:
                unanswered = exc
            time.sleep(0.01)
        last = f" (last: {unanswered!r})" if unanswered is not None else ""
        raise TimeoutError(
            f"no replica of 127.0.0.1:{dead_port} took over within {timeout} s{last}"
        )

    def restart_node(self, port: int, timeout: float = 30.0) -> None:
        """Start a node that was killed again, on its port and with its ``nodes.conf``:
        a master that was failed over rejoins as a replica of its heir. Waits until the
        cluster is whole again."""
        if port in self.pids:
            raise ValueError(f"127.0.0.1:{port} is running")
        _spawn(self, port)
        deadline = time.monotonic() + timeout
        _wait_ping(self, port, deadline)
        self.wait_healthy(timeout=max(0.1, deadline - time.monotonic()))

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running node says ``cluster_state:ok`` with all slots served,
        knows every running node, sees none failing, and every replica's link to its
        master is up."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        last: object = None
        while time.monotonic() < deadline:
            try:
                if _healthy(self):
                    return
            except Exception as e:
                last = e
            time.sleep(0.02)
        raise TimeoutError(f"the cluster was not whole within the timeout ({last!r})")


# -- inside


def _find(server: RedisClusterServer, node: int | ClusterNode) -> ClusterNode:
    """A node of ``server`` as it is now, by port."""
    port = node.port if isinstance(node, ClusterNode) else node
    for found in server.nodes:
        if found.port == port:
            return found
    raise LookupError(f"no node on port {port}")


def _all_ok(server: RedisClusterServer) -> bool:
    return all("cluster_state:ok" in _ask(server, port, "CLUSTER", "INFO") for port in server.pids)


def _healthy(server: RedisClusterServer) -> bool:
    live = server.pids
    for port in live:
        info = dict(line.split(":", 1) for line in _ask(server, port, "CLUSTER", "INFO").split())
        if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != SLOTS:
            return False
        nodes = parse_cluster_nodes(_ask(server, port, "CLUSTER", "NODES"))
        seen = {n.port for n in nodes if n.connected and not n.flags & _BAD_FLAGS}
        if not set(live) <= seen:
            return False
        by_id = {n.node_id: n for n in nodes}
        for n in nodes:
            if n.port in live and n.role == "replica":
                master = by_id.get(n.master_id or "")
                if master is None or master.role != "master":
                    return False
            elif n.port in live and not n.slots and server.replicas and n.port not in server._added:
                return False  # a replica this node does not know as one yet (gossip)
    for port in live:
        role = _ask(server, port, "ROLE")
        if role[0] == "slave" and role[3] != "connected":
            return False
    return True


def _spawn(server: RedisClusterServer, port: int) -> None:
    """Start one node of ``server`` on ``port``."""
    path = redis_server_path()
    if path is None:
        raise RuntimeError("redis-server is missing: `make test` installs it")
    folder = server.folder / str(port)
    folder.mkdir(parents=True, exist_ok=True)
    tls = server.tls
    listen = ["--port", str(port)]
    if tls is not None:  # TLS only: clients, the cluster bus and replication
        listen = ["--port", "0", "--tls-port", str(port)]
        listen += ["--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)]
        listen += ["--tls-ca-cert-file", str(tls.ca), "--tls-auth-clients", "no"]
        listen += ["--tls-cluster", "yes", "--tls-replication", "yes"]
    server.processes[port] = subprocess.Popen(
        [
            path,
            *listen,
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            str(server._bus_ports[port]),
            "--cluster-config-file",
            str(folder / "nodes.conf"),
            "--cluster-node-timeout",
            str(server.node_timeout_ms),
            "--cluster-require-full-coverage",
            "yes" if server.require_full_coverage else "no",
            # A replica's first sync starts at once, not 5 s later (Redis's default).
            "--repl-diskless-sync-delay",
            "0",
            "--appendonly",
            "yes" if server.aof else "no",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "no",
            "--logfile",
            str(folder / "redis.log"),
            "--loglevel",
            "notice",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_ping(server: RedisClusterServer, port: int, deadline: float) -> None:
    """Until the node on ``port`` answers ``PING`` (its log's tail if it died)."""
    process = server.processes[port]
    context = None
    if server.tls is not None:
        context = ssl.create_default_context(cafile=str(server.tls.ca))
    while time.monotonic() < deadline:
        try:
            if _pong(port, context):
                return
        except OSError:
            pass
        if process.poll() is not None:
            log = server.folder / str(port) / "redis.log"
            tail = log.read_text()[-500:] if log.exists() else ""
            raise RuntimeError(f"redis-server :{port} exited with {process.returncode}: {tail}")
        time.sleep(0.01)
    raise RuntimeError(f"redis-server :{port} did not answer in time")


def _pong(port: int, context: ssl.SSLContext | None) -> bool:
    """Whether the node on ``port`` answers ``PING`` (over TLS with ``context``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as raw:
        if context is None:
            raw.sendall(b"PING\r\n")
            return raw.recv(64).startswith(b"+PONG")
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"PING\r\n")
            return tls.recv(64).startswith(b"+PONG")


def _ask_any(server: RedisClusterServer, ports: list[int], *command: Any) -> Any:
    """The first answer of any node."""
    last: Exception | None = None
    for port in sorted(ports):
        try:
            return _ask(server, port, *command)
        except Exception as e:
            last = e
    raise RuntimeError(f"no node answered {command!r}: {last!r}")


def _ask(server: RedisClusterServer, port: int, *command: Any, timeout: float = 1.0) -> Any:
    """One command to one node, on a connection of its own."""
    tls: dict[str, Any] = {}
    if server.tls is not None:
        tls = {"ssl": True, "ssl_ca_certs": str(server.tls.ca)}
    client = _redis().Redis(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        socket_timeout=timeout,
        socket_connect_timeout=0.5,
        **tls,
    )
    try:
        return client.execute_command(*command)
    finally:
        client.close()


def _was_replica_of(node: ClusterNode, dead: ClusterNode) -> bool:
    # The heir has taken every slot the dead master had (a master that was a replica).
    return bool(dead.slots) and all(
        node.serves(first) and node.serves(last) for first, last in dead.slots
    )


def _create(server: RedisClusterServer) -> None:
    """Join the nodes into a cluster (``redis-cli --cluster create``)."""
    addresses = [f"127.0.0.1:{p}" for p in server.ports]
    _cli(server, "create", *addresses, "--cluster-replicas", str(server.replicas))


def _cli(server: RedisClusterServer, action: str, *args: str) -> None:
    """``redis-cli --cluster <action> ...`` (``create``, ``add-node``, ``rebalance``), over
    TLS when the cluster speaks it, answering yes to its questions."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli is missing (Debian's redis-tools)")
    tls = [] if server.tls is None else ["--tls", "--cacert", str(server.tls.ca)]
    command = [cli, *tls, "--cluster", action, *args, "--cluster-yes"]
    done = subprocess.run(command, capture_output=True, timeout=server.timeout, check=False)
    if done.returncode != 0:
        out = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise RuntimeError(f"redis-cli --cluster {action} failed: {out}")


_BAD_FLAGS = frozenset({"fail", "fail?", "handshake", "noaddr"})


def key_slot(key: str | bytes) -> int:
    """The hash slot of a key (CRC16 of its hash tag, as Redis Cluster computes it)."""
    from redis.crc import key_slot as slot

    return int(slot(key.encode() if isinstance(key, str) else key))


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (bound at once, so the kernel gives distinct ones)."""
    sockets = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            ports.append(port)
        return ports
    finally:
        for s in sockets:
            s.close()
