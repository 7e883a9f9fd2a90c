"""The console's sign-in: with an API key, a browser trades the key once for a session cookie.

A browser cannot add ``Authorization: Bearer`` to a page load or to an
``EventSource``, so when ``openstarry serve`` has a key (``--api-key-env``)
the console asks for it once and ``POST /signin`` exchanges it for a cookie
that the page's own requests and ``/events`` then carry. Programs keep
sending the bearer header; without a key none of this exists.

Rules this module keeps:

- A request passes with ``Authorization: Bearer <key>`` or with a valid
  session cookie. The key is compared in constant time
  (``hmac.compare_digest``), in the header and at the sign-in alike.
- The cookie holds ``<expiry>.<nonce>.<HMAC-SHA256 of both>``, signed with a
  random secret made per process: nothing is stored per session, and a
  restart signs every browser out. It is ``HttpOnly`` (page scripts cannot
  read it), ``SameSite=Strict``, ``Path=/``, with a ``Max-Age``, and ``Secure``
  when the request came over TLS (the ASGI scheme is ``https``: uvicorn with
  a certificate, or behind a proxy it trusts for ``X-Forwarded-Proto``). The
  expiry inside is checked too, so a kept cookie is refused once it is stale;
  an expired or forged cookie gets ``401``. Its name carries the server's
  port, so consoles of two servers on one host do not sign each other out.
- A request that changes something (any method but ``GET``, ``HEAD`` and
  ``OPTIONS``) on the strength of the cookie must come from the server's own
  page: its ``Origin`` must name the host it was sent to (``403`` otherwise),
  since ``SameSite`` does not tell two ports of one host apart.
- Wrong keys are slowed down per client address (an IPv6 address by its
  ``/64``): from the ``free_attempts``-th wrong key in a row, the address must
  wait before its next try, 1 s and then twice as long each time, up to
  ``max_delay``; a key sent before then (right or wrong) is not checked and
  gets ``429`` with ``Retry-After``. A right key clears the address's count.
  The book is bounded: at most ``max_addresses`` addresses (the one whose last
  wrong key is oldest goes first), each forgotten ``forget_after`` seconds
  after its last wrong key. A request with no key at all (a page load before
  the sign-in) or with a stale cookie counts for nothing.
- Neither the key nor the secret is ever logged or sent.

Routes (only when a key is set):

``GET /signin``
    ``{"required": true, "signed_in": <bool>}``: whether this browser's cookie is valid.
``POST /signin``
    ``{"key": "..."}`` (JSON): ``200`` ``{"signed_in": true, "expires_in": <seconds>}``
    with the cookie; ``401`` for a wrong key; ``429`` while slowed down; ``400``,
    ``413``, ``415`` or ``422`` for a body that is not such an object.
``POST /signout``
    ``204`` and the cookie cleared.

Both ``POST`` routes refuse (``403``) a request whose ``Origin`` names another
origin, so a page elsewhere can neither sign a browser in or out nor use up
its address's tries; a program sends no ``Origin`` and is not concerned.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from openstarry._http import WrongKeys

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

__all__ = ["ConsoleAuth", "SessionCookies", "SignIn", "WrongKeys", "signin_routes"]

log = logging.getLogger("openstarry.api.signin")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The largest sign-in body read (a key and its JSON wrapping).
MAX_SIGNIN_BYTES = 4096
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class SessionCookies:
    """Session tokens: ``<expiry>.<nonce>.<mac>``, HMAC-SHA256 with a per-process secret.

    Args:
        ttl: Seconds a token is valid for.
        clock: Wall-clock seconds (tests pass their own).
    """

    def __init__(self, ttl: float, clock: Callable[[], float] = time.time) -> None:
        if not ttl > 0:
            raise ValueError(f"a session's lifetime must be positive, not {ttl}")
        self.ttl = ttl
        self.clock = clock
        self._secret = secrets.token_bytes(32)

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._secret, payload.encode("ascii"), hashlib.sha256).digest())

    def issue(self, now: float | None = None) -> str:
        """A new token, valid for ``ttl`` seconds from ``now`` (default: the clock)."""
        now = self.clock() if now is None else now
        payload = f"{math.ceil(now + self.ttl)}.{_b64(secrets.token_bytes(12))}"
        return f"{payload}.{self._mac(payload)}"

    def valid(self, token: str) -> bool:
        """Whether ``token`` was issued by this process and has not expired."""
        expiry, _, rest = token.partition(".")
        nonce, _, mac = rest.partition(".")
        if not (expiry.isascii() and expiry.isdigit() and len(expiry) <= 12 and nonce and mac):
            return False
        payload = f"{expiry}.{nonce}"
        if not payload.isascii() or not mac.isascii():
            return False
        if not hmac.compare_digest(mac.encode("ascii"), self._mac(payload).encode("ascii")):
            return False
        return int(expiry) > self.clock()


class SignIn:
    """The key, the session cookies and the wrong-key book of one server.

    Args:
        key: The API key.
        ttl: Seconds a sign-in lasts.
        wrong_keys: The book of wrong keys (default: :class:`WrongKeys`' defaults).
    """

    def __init__(self, key: str, *, ttl: float, wrong_keys: WrongKeys | None = None) -> None:
        if not key:
            raise ValueError("the API key must not be empty")
        self._key = key.encode()
        self._bearer = b"Bearer " + self._key
        self.cookies = SessionCookies(ttl)
        self.wrong_keys = wrong_keys if wrong_keys is not None else WrongKeys()

    def key_matches(self, given: bytes) -> bool:
        """Whether ``given`` is the key (constant time)."""
        return hmac.compare_digest(given, self._key)

    def bearer_matches(self, header: bytes) -> bool:
        """Whether an ``Authorization`` header's value carries the key (constant time)."""
        return hmac.compare_digest(header, self._bearer)

    def record_wrong(self, address: str) -> float:
        """Count a wrong key from ``address``; the seconds it must now wait."""
        count, delay = self.wrong_keys.failed(address)
        if delay:
            log.warning(
                "wrong API key from %s (%d in a row): its next try waits %g s",
                address or "an unknown address",
                count,
                delay,
            )
        else:
            log.warning(
                "wrong API key from %s (%d in a row)", address or "an unknown address", count
            )
        return delay

    @staticmethod
    def cookie_name(scope: Scope) -> str:
        """The session cookie's name on this server: ``openstarry_session_<port>``."""
        server = scope.get("server")
        port = server[1] if server and len(server) > 1 and server[1] is not None else 0
        return f"openstarry_session_{port}"

    def cookie_of(self, scope: Scope) -> str | None:
        """The value of this server's session cookie in the request, if any."""
        name = self.cookie_name(scope)
        for header, value in scope.get("headers", ()):
            if header != b"cookie":
                continue
            text = bytes(value).decode("latin-1")
            for part in text.split(";"):
                key, sep, content = part.strip().partition("=")
                if sep and key == name:
                    return content.strip().strip('"')
        return None

    def set_cookie(self, scope: Scope, token: str | None) -> str:
        """A ``Set-Cookie`` value that stores ``token`` (``None``: clears the cookie)."""
        age = int(self.cookies.ttl) if token is not None else 0
        parts = [
            f"{self.cookie_name(scope)}={token or ''}",
            "Path=/",
            f"Max-Age={age}",
            "HttpOnly",
            "SameSite=Strict",
        ]
        if scope.get("scheme") in ("https", "wss"):
            parts.append("Secure")
        return "; ".join(parts)


def _client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for header, value in scope.get("headers", ()):
        if header == name:
            return bytes(value)
    return None


def _same_origin(scope: Scope) -> bool:
    """Whether the request's ``Origin`` names the host it was sent to."""
    origin = _header(scope, b"origin")
    host = _header(scope, b"host")
    if origin is None or host is None:
        return False
    try:
        netloc = urlsplit(origin.decode("latin-1")).netloc
    except ValueError:
        return False
    return netloc.lower() == host.decode("latin-1").lower()


async def _send_json(
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps({"code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _slowed_message(wait: float) -> str:
    return (
        f"too many wrong keys from this address: try again in {math.ceil(wait)} s "
        "(until then no key from it is checked)"
    )


class ConsoleAuth:
    """ASGI middleware: every request but ``public`` paths needs the key or the console's cookie.

    See the module for the rules. ``public`` paths pass as they are (the
    console's static page, ``/signin``, ``/health``).
    """

    def __init__(self, app: ASGIApp, signin: SignIn, public: Collection[str] = ()) -> None:
        self.app = app
        self.signin = signin
        self._public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._public:
            await self.app(scope, receive, send)
            return
        signin = self.signin
        challenge = [(b"www-authenticate", b'Bearer realm="openstarry"')]
        given = _header(scope, b"authorization")
        if given:
            address = _client_address(scope)
            wait = signin.wrong_keys.wait(address)
            if wait > 0:
                retry = str(math.ceil(wait)).encode()
                await _send_json(
                    send,
                    429,
                    "too_many_wrong_keys",
                    _slowed_message(wait),
                    [(b"retry-after", retry)],
                )
                return
            if signin.bearer_matches(given):
                signin.wrong_keys.succeeded(address)
                await self.app(scope, receive, send)
                return
            signin.record_wrong(address)
            await _send_json(send, 401, "unauthorized", "the API key is not valid", challenge)
            return
        token = signin.cookie_of(scope)
        if token is None:
            await _send_json(
                send,
                401,
                "unauthorized",
                "this server needs the header 'Authorization: Bearer <key>' "
                "(in a browser: sign in on the console's page)",
                challenge,
            )
            return
        if not signin.cookies.valid(token):
            await _send_json(
                send,
                401,
                "unauthorized",
                "the console's sign-in has expired or is not valid: sign in again",
                challenge,
            )
            return
        if scope.get("method", "GET") not in _SAFE_METHODS and not _same_origin(scope):
            await _send_json(
                send,
                403,
                "forbidden",
                "a request signed in by the console's cookie must come from the console's "
                "page (its Origin header must name this server)",
            )
            return
        await self.app(scope, receive, send)


async def _read_small_body(request: Request, limit: int) -> bytes | None:
    """The body, or ``None`` when it is over ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def signin_routes(signin: SignIn, body_timeout: float = 30.0) -> list[BaseRoute]:
    """``GET /signin``, ``POST /signin`` and ``POST /signout`` (see the module).

    Args:
        signin: The server's key, cookies and wrong-key book.
        body_timeout: Seconds a sign-in's body may take to arrive (``408`` after).
    """
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, code: str, message: str, **headers: str) -> Response:
        return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)

    async def status(request: Request) -> Response:
        token = signin.cookie_of(request.scope)
        signed_in = token is not None and signin.cookies.valid(token)
        return JSONResponse(
            {"required": True, "signed_in": signed_in}, headers={"cache-control": "no-store"}
        )

    def foreign(request: Request) -> Response | None:
        # A browser sends Origin with every POST; a page of another origin may
        # not sign in or out here (nor spend this address's tries). Programs
        # send no Origin.
        if _header(request.scope, b"origin") is None or _same_origin(request.scope):
            return None
        return error(403, "forbidden", "sign in from the console's own page")

    async def sign_in(request: Request) -> Response:
        refused = foreign(request)
        if refused is not None:
            return refused
        address = _client_address(request.scope)
        wait = signin.wrong_keys.wait(address)
        if wait > 0:
            return error(
                429,
                "too_many_wrong_keys",
                _slowed_message(wait),
                **{"retry-after": str(math.ceil(wait))},
            )
        media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return error(
                415, "unsupported_media_type", 'send the key as application/json: {"key": "..."}'
            )
        body: bytes | None = b""
        with anyio.move_on_after(body_timeout) as scope:
            try:
                body = await _read_small_body(request, MAX_SIGNIN_BYTES)
            except ClientDisconnect:
                return error(400, "client_disconnected", "the client left mid-request")
        if scope.cancelled_caught:
            return error(
                408, "request_timeout", f"the body did not arrive within {body_timeout:g} s"
            )
        if body is None:
            return error(413, "request_too_large", f"a sign-in is at most {MAX_SIGNIN_BYTES} bytes")
        try:
            data = json.loads(body)
        except ValueError:
            return error(400, "invalid_json", "the body is not JSON")
        key = data.get("key") if isinstance(data, dict) else None
        if not isinstance(key, str) or not key:
            return error(422, "invalid_request", 'expected {"key": "<the API key>"}')
        if not signin.key_matches(key.encode()):
            delay = signin.record_wrong(address)
            extra = {"retry-after": str(math.ceil(delay))} if delay else {}
            return error(401, "unauthorized", "the API key is not valid", **extra)
        signin.wrong_keys.succeeded(address)
        log.info("console signed in from %s", address or "an unknown address")
        response = JSONResponse(
            {"signed_in": True, "expires_in": int(signin.cookies.ttl)},
            headers={"cache-control": "no-store"},
        )
        response.headers.append(
            "set-cookie", signin.set_cookie(request.scope, signin.cookies.issue())
        )
        return response

    async def sign_out(request: Request) -> Response:
        refused = foreign(request)
        if refused is not None:
            return refused
        response = Response(status_code=204)
        response.headers.append("set-cookie", signin.set_cookie(request.scope, None))
        return response

    return [
        Route("/signin", status, methods=["GET"]),
        Route("/signin", sign_in, methods=["POST"]),
        Route("/signout", sign_out, methods=["POST"]),
    ]
