"""The Redis bus over TLS (``rediss://``), against a ``redis-server`` with ``tls-port`` and
certificates of the test's own CA (trustme): verified by default, and a certificate that
fails verification refused at once with the check that failed, never retried for ever."""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis.exceptions
import trustme

from openstarry.bus import EventBus
from openstarry.core import Event
from openstarry.redis_server import redis_server_path

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(redis_server_path() is None, reason="redis-server is missing"),
]

HANG = 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Redis bus runs on asyncio


class TlsRedis:
    """A ``redis-server`` that speaks TLS only, with a certificate for 127.0.0.1."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.ca_path = folder / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))
        cert = self.ca.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(folder / "key.pem"))
        cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        path = redis_server_path()
        assert path is not None
        self.process = subprocess.Popen(
            [
                path,
                "--port", "0",
                "--tls-port", str(self.port),
                "--bind", "127.0.0.1",
                "--tls-cert-file", str(folder / "cert.pem"),
                "--tls-key-file", str(folder / "key.pem"),
                "--tls-ca-cert-file", str(self.ca_path),
                "--tls-auth-clients", "no",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        context = ssl.create_default_context(cafile=str(self.ca_path))
        deadline = time.monotonic() + 10
        while True:
            try:
                with (
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw,
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
                ):
                    tls.sendall(b"PING\r\n")
                    if tls.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                assert self.process.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not answer over TLS"
                time.sleep(0.05)

    def url(self, ca: Path | None = None) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={ca or self.ca_path}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    server = TlsRedis(tmp_path)
    try:
        yield server
    finally:
        server.stop()


async def test_a_bus_over_tls_answers_each_input_once(tls_redis: TlsRedis) -> None:
    n = 300
    inputs = [
        Event.new("INPUT:USER_MESSAGE", {"i": i}, source="t", session_id=f"s{i % 17}")
        for i in range(n)
    ]
    handled: list[str] = []
    async with (
        EventBus.from_url(tls_redis.url(), group="g", consumer="w") as worker,
        EventBus.from_url(tls_redis.url(), consume=False) as producer,
    ):
        worker.subscribe("INPUT:*", lambda e: handled.append(e.id))
        assert all(await producer.backend.asend_many(inputs))  # type: ignore[union-attr]
        with anyio.fail_after(HANG):
            while len(handled) < n:
                await anyio.sleep(0.05)
        await anyio.sleep(0.2)
    assert sorted(handled) == sorted(e.id for e in inputs)


async def _enter(url: str) -> None:
    """Start a worker bus on ``url`` and stop it."""
    with anyio.fail_after(HANG):
        async with EventBus.from_url(url, group="g", consumer="w"):
            pass


async def test_a_certificate_of_another_ca_is_refused_at_once(
    tls_redis: TlsRedis, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError) as refused:
        await _enter(tls_redis.url(other))
    assert time.monotonic() - started < 5  # not retried
    said = str(refused.value)
    assert "certificate failed verification" in said
    assert "ssl_ca_certs" in said  # how to name the CA


async def test_without_the_ca_the_default_trust_store_refuses_the_test_ca(
    tls_redis: TlsRedis,
) -> None:
    """Verification is on by default: a URL that names no CA trusts the system's only."""
    url = f"rediss://127.0.0.1:{tls_redis.port}/0"
    with pytest.raises(redis.exceptions.ConnectionError, match="failed verification"):
        await _enter(url)
