"""The providers' own transport over TLS: verified against the CA it is given, refused
against a certificate it cannot verify, on asyncio and trio.

A certificate authority of the test's own (trustme) signs a certificate for
127.0.0.1; a TLS server on 127.0.0.1, started and stopped here, answers one
Chat Completions request.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest
import trustme

from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import Session, UserTurn
from openstarry.errors import ProviderError
from openstarry.providers.http import HTTPProvider
from openstarry.providers.openai_chat import OpenAIChatAPI
from openstarry.providers.transport import PooledTransport

ANSWER = json.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": "over TLS"}}]}
).encode()


class _Chat(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_url(ca: trustme.CA) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


async def _ask(url: str, transport: PooledTransport) -> Any:
    provider = HTTPProvider(
        OpenAIChatAPI(),
        "m",
        base_url=url,
        options={"stream": False, "maxRetries": 0, "timeout": 5},
        transport=transport,
    )
    session = Session("tls")
    session.memory.append(UserTurn("hi"))
    try:
        with anyio.fail_after(10):
            return await provider.generate("hi", AgentContext(tools={}, session=session))
    finally:
        await transport.aclose()


@pytest.mark.anyio
async def test_a_server_whose_certificate_verifies_is_answered(
    ca: trustme.CA, tls_url: str
) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    response = await _ask(tls_url, PooledTransport(ssl_context=context))
    assert [s.text for s in response.segments] == ["over TLS"]


@pytest.mark.anyio
async def test_a_certificate_the_bundle_does_not_vouch_for_is_refused(tls_url: str) -> None:
    """The default context verifies against the usual CA bundle, which knows nothing of
    the test's CA: the connection is refused, and the error says it was TLS."""
    with pytest.raises(ProviderError, match="TLS"):
        await _ask(tls_url, PooledTransport())
