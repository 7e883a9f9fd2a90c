"""Proxies: httpx's transport, and the choice of a provider's transport by its base URL.

openstarry's own transport (:class:`~openstarry.providers.transport.PooledTransport`)
speaks to the server directly. A base URL that the environment routes through
a proxy (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, less ``NO_PROXY``)
goes through :class:`HttpxTransport` instead, which is also the way to client
certificates and HTTP/2: ``HTTPProvider(..., transport=HttpxTransport(client))``.
This module imports httpx only when an :class:`HttpxTransport` is made.
"""

from __future__ import annotations

import contextlib
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from openstarry.providers.transport import (
    NO_LIMIT,
    ConnectError,
    ConnectTimeout,
    PooledTransport,
    ReadTimeout,
    RemoteProtocolError,
    Request,
    Response,
    ResponseTooLarge,
    Transport,
    TransportError,
    default_ssl_context,
    describe,
    display_url,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpxTransport", "default_transport", "proxied"]


def proxied(url: str) -> bool:
    """Whether the environment routes ``url`` through a proxy (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, less ``NO_PROXY``)."""
    proxies = urllib.request.getproxies_environment()
    parts = urllib.parse.urlsplit(url)
    if not (proxies.get(parts.scheme.lower()) or proxies.get("all")):
        return False
    bypass: Callable[[str, dict[str, str]], bool] = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    return not bypass(parts.hostname or "", proxies)


def default_transport(base_url: str) -> Transport:
    """The transport a provider gets for ``base_url``: :class:`HttpxTransport` where the
    environment names a proxy for it, else :class:`PooledTransport`."""
    if proxied(base_url):
        return HttpxTransport()
    return PooledTransport()


# --- httpx ---------------------------------------------------------------------------------------


class _HttpxResponse:
    __slots__ = ("_pieces", "_response", "headers", "reason", "status")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._pieces = response.aiter_raw()
        self.status: int = response.status_code
        self.reason: str = response.reason_phrase
        self.headers: Mapping[str, str] = {k: response.headers[k] for k in response.headers}

    async def read(self, limit: int = NO_LIMIT) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await self.receive()
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                chunks.append(chunk[: len(chunk) - (size - limit)])
                await self.aclose()
                raise ResponseTooLarge(f"the answer is more than {limit} bytes", b"".join(chunks))
            chunks.append(chunk)

    async def receive(self) -> bytes:
        import httpx

        try:
            return await self._pieces.__anext__()
        except StopAsyncIteration:
            return b""
        except httpx.TimeoutException:
            raise ReadTimeout(f"no answer within the timeout from {self._response.url}") from None
        except httpx.TransportError as exc:
            raise RemoteProtocolError(f"the answer broke off: {describe(exc)}") from None

    async def aclose(self) -> None:
        import httpx

        # httpx reads a body through a chain of async generators, and trio warns
        # of one left half-done (httpx issue 3686): the response is closed
        # first, then the generator we hold runs out.
        await self._response.aclose()
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            async for _ in self._pieces:
                pass


class HttpxTransport:
    """Requests sent by an ``httpx.AsyncClient``: proxies, client certificates, HTTP/2.

    Args:
        client: The client to send with; closed by :meth:`aclose` only when
            made here. By default one that reads the proxy variables of the
            environment, verifies TLS against the usual CA bundle and never
            follows redirects.
    """

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._client = client
        self._own = client is None

    def _get(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                verify=default_ssl_context(), follow_redirects=False, trust_env=True, timeout=None
            )
        return self._client

    async def send(self, request: Request) -> Response:
        import httpx

        client = self._get()
        where = display_url(request.url)
        timeout = request.timeout
        built = client.build_request(
            request.method,
            request.url,
            content=request.content,
            headers=dict(request.headers),
            timeout=httpx.Timeout(timeout),
        )
        try:
            response = await client.send(built, stream=True)
        except httpx.ConnectTimeout:
            raise ConnectTimeout(f"could not connect to {where} within {timeout:g} s") from None
        except httpx.TimeoutException:
            raise ReadTimeout(f"no answer from {where} within {timeout:g} s") from None
        except httpx.ConnectError as exc:
            raise ConnectError(f"could not connect to {where}: {describe(exc)}") from None
        except (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError) as exc:
            raise RemoteProtocolError(f"connection to {where} failed: {describe(exc)}") from None
        except httpx.HTTPError as exc:
            raise TransportError(f"request to {where} failed: {describe(exc)}") from None
        return _HttpxResponse(response)

    async def aclose(self) -> None:
        client = self._client
        if client is not None and self._own:
            self._client = None
            await client.aclose()
