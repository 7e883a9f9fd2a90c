"""The Redis bus on a Redis Cluster over TLS (``rediss+cluster://``): 3 masters and their
replicas that speak TLS only (``tls-port``, ``port 0``), their cluster bus and
replication over TLS too (``tls-cluster yes``, ``tls-replication yes``), with
certificates of the test's own CA (trustme). The CA named in the URL
(``?ssl_ca_certs=``) reaches every node the client finds; a certificate of another CA
is refused at the start, with the check that failed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from openstarry._redisurl import cluster_nodes
from openstarry.bus import EventBus
from openstarry.redis_server import ClusterTls, RedisClusterServer
from redis_support import NEEDS_REDIS_SERVER

pytest.importorskip("redis")
trustme = pytest.importorskip("trustme")
import redis.exceptions  # noqa: E402

from openstarry.bus.redis import RedisStreams  # noqa: E402
from test_redis_cluster import _Answering, _input  # noqa: E402

pytestmark = [pytest.mark.anyio, NEEDS_REDIS_SERVER]

HANG = 30


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    folder = tmp_path_factory.mktemp("tls-cluster")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    tls = ClusterTls(cert=folder / "cert.pem", key=folder / "key.pem", ca=folder / "ca.pem")
    with RedisClusterServer(folder / "nodes", masters=3, replicas=1, tls=tls) as server:
        yield server


def test_every_node_speaks_tls_only(tls_cluster: RedisClusterServer) -> None:
    assert tls_cluster.url.startswith("rediss+cluster://")
    for node in tls_cluster.nodes:  # plain text is not answered
        with socket.create_connection(("127.0.0.1", node.port), timeout=1) as plain:
            plain.sendall(b"PING\r\n")
            try:
                answer = plain.recv(64)
            except OSError:  # reset, or no answer in time
                answer = b""
        assert not answer.startswith(b"+PONG")
    assert len(tls_cluster.masters()) == 3
    for master in tls_cluster.masters():  # replication over TLS: each replica's link is up
        assert len(tls_cluster.replicas_of(master)) == 1


async def test_a_bus_over_tls_on_a_cluster_answers_each_input_once(
    tls_cluster: RedisClusterServer,
) -> None:
    n = 600
    inputs = [_input(i, sessions=120) for i in range(n)]
    url = tls_cluster.url
    async with (
        EventBus.from_url(url, group="g", consumer="w1", claim_idle=2) as w1,
        EventBus.from_url(url, group="g", consumer="w2", claim_idle=2) as w2,
        EventBus.from_url(url, consume=False) as producer,
    ):
        one, two = _Answering(w1), _Answering(w2)
        one.subscribe()
        two.subscribe()
        backend = producer.backend
        assert isinstance(backend, RedisStreams)
        assert all(await backend.asend_many(inputs))
        assert not any(await backend.asend_many(inputs[:50]))  # duplicates, over TLS too
        with anyio.fail_after(HANG):
            while len(one.answers + two.answers) < n or one.elsewhere + two.elsewhere < n // 2:
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # nothing more arrives
        handled = one.handled + two.handled
        answers = one.answers + two.answers
        relayed = w1.metrics()["backend"]["relayed"] + w2.metrics()["backend"]["relayed"]
        client = backend._client
        # The client found every master from the seeds, and reaches each over TLS.
        reached = {node.port for node in client.get_primaries()}
    assert set(handled) == {e.id for e in inputs}
    assert set(handled.values()) == {1}
    assert set(answers.values()) == {1}
    assert one.elsewhere + two.elsewhere == n // 2
    assert relayed > 0  # effects bound for another partition crossed masters
    assert reached == {m.port for m in tls_cluster.masters()}


async def _enter(url: str) -> None:
    """Start a worker bus on ``url`` and stop it."""
    with anyio.fail_after(HANG):
        async with EventBus.from_url(url, group="g", consumer="w"):
            pass


async def test_a_certificate_of_another_ca_is_refused_at_once_on_a_cluster(
    tls_cluster: RedisClusterServer, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    seeds = tls_cluster.url.partition("?")[0]
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError) as refused:
        await _enter(f"{seeds}?ssl_ca_certs={other}")
    assert time.monotonic() - started < 5  # not retried
    said = str(refused.value)
    assert "certificate failed verification" in said
    assert "rediss+cluster://" in said  # how to name the CA, for a cluster
    assert "ssl_ca_certs" in said


async def test_without_the_ca_the_default_trust_store_refuses_the_cluster(
    tls_cluster: RedisClusterServer,
) -> None:
    with pytest.raises(redis.exceptions.ConnectionError, match="failed verification"):
        await _enter(tls_cluster.url.partition("?")[0])


def test_a_cluster_urls_tls_settings_are_typed_as_redis_py_takes_them() -> None:
    """``?ssl_check_hostname=false`` is the boolean False for every node, not the text
    ``"false"`` (which is true); numbers are numbers; paths stay text."""
    _, options = cluster_nodes(
        "rediss+cluster://h:7000?ssl_ca_certs=/ca.pem&ssl_check_hostname=false"
        "&ssl_cert_reqs=required&socket_timeout=2.5&max_connections=8"
    )
    assert options == {
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
        "ssl_check_hostname": False,
        "ssl_cert_reqs": "required",
        "socket_timeout": 2.5,
        "max_connections": 8,
    }
