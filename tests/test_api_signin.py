"""The console's sign-in behind ``--api-key-env`` (``openstarry.api.signin``), over HTTP.

A real uvicorn server on 127.0.0.1 for what a browser does (sign in, then use
the cookie for ``/metrics.json``, ``/events``, ``/process``, ``/stop``); the ASGI
app called in process (httpx's ``ASGITransport``) where the test must choose
the scheme (TLS) or the client's address (the wrong-key book). The browser
itself is in ``test_console_browser.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from openstarry.agent.runtime import Agent
from openstarry.api.server import ServerLimits, create_app
from openstarry.api.signin import SessionCookies, SignIn, WrongKeys
from openstarry.providers.default import DefaultProvider
from openstarry.tools import get_weather
from test_api_http import FINAL_TEXT, HANG, body, serving_app

pytestmark = pytest.mark.anyio

KEY = "console-test-key-9f3a"


@pytest.fixture
def anyio_backend() -> str:
    """The server runs its own asyncio loop whatever the client's: one backend is enough."""
    return "asyncio"


def _app(api_key: str | None = KEY, **limits: Any) -> Any:
    agent = Agent(DefaultProvider(), [get_weather], name="weather-agent")
    return create_app(agent, api_key=api_key, limits=ServerLimits(**limits))


@asynccontextmanager
async def _served(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    with serving_app(app, lifespan="on") as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as http:
            yield http


def _in_process(
    app: Any, *, scheme: str = "http", client: tuple[str, int] = ("127.0.0.1", 50000)
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=client)
    return httpx.AsyncClient(transport=transport, base_url=f"{scheme}://testserver", timeout=HANG)


def _set_cookie(response: httpx.Response) -> tuple[str, str, dict[str, str]]:
    """``(name, value, attributes)`` of the one ``Set-Cookie`` of ``response``."""
    headers = response.headers.get_list("set-cookie")
    assert len(headers) == 1, headers
    name, _, rest = headers[0].partition("=")
    value, *attributes = (part.strip() for part in rest.split(";"))
    flags = {}
    for attribute in attributes:
        key, _, content = attribute.partition("=")
        flags[key.lower()] = content
    return name, value, flags


async def _sign_in(http: httpx.AsyncClient, key: str = KEY) -> httpx.Response:
    return await http.post("/signin", json={"key": key})


async def test_without_a_key_nothing_changes() -> None:
    async with _served(_app(api_key=None)) as http:
        assert (await http.get("/signin")).status_code == 404
        assert (await http.post("/signin", json={"key": "x"})).status_code == 404
        page = await http.get("/")
        metrics = await http.get("/metrics.json")
        done = await http.post("/process", json=body(stream=False))
    assert page.status_code == 200
    assert metrics.status_code == 200
    assert done.json()["status"] == "completed"
    for response in (page, metrics, done):
        assert "set-cookie" not in response.headers


async def test_the_page_loads_without_the_key_and_asks_for_it() -> None:
    async with _served(_app()) as http:
        page = await http.get("/")
        script = await http.get("/console/console.js")
        state = await http.get("/signin")
        metrics = await http.get("/metrics.json")
        events = await http.get("/events")
    assert page.status_code == 200
    assert 'id="signin-form"' in page.text
    assert script.status_code == 200
    assert state.json() == {"required": True, "signed_in": False}
    for refused in (metrics, events):
        assert refused.status_code == 401
        assert refused.json()["code"] == "unauthorized"
        assert "sign in" in refused.json()["message"]


async def test_a_sign_in_gives_a_cookie_the_console_s_requests_and_events_then_use() -> None:
    async with _served(_app()) as http:
        signed = await _sign_in(http)
        assert signed.status_code == 200, signed.text
        assert signed.json() == {"signed_in": True, "expires_in": 12 * 3600}
        name, value, flags = _set_cookie(signed)
        port = http.base_url.port
        assert name == f"openstarry_session_{port}"
        assert flags == {
            "path": "/",
            "max-age": str(12 * 3600),
            "httponly": "",
            "samesite": "Strict",
        }
        assert KEY not in value
        # httpx keeps the cookie, as a browser does; no Authorization header is sent.
        assert (await http.get("/signin")).json() == {"required": True, "signed_in": True}
        assert (await http.get("/metrics.json")).json()["agent"] == "weather-agent"
        async with http.stream("GET", "/events") as events:
            assert events.status_code == 200
            assert events.headers["content-type"].startswith("text/event-stream")
        origin = {"origin": str(http.base_url).rstrip("/")}
        done = await http.post("/process", json=body(stream=False), headers=origin)
        assert done.status_code == 200, done.text
        assert done.json()["output"][-1]["content"][0]["text"] == FINAL_TEXT
        stop = await http.post("/stop", json={"session_id": "s"}, headers=origin)
        assert stop.status_code == 202


async def test_the_bearer_header_keeps_working_for_programs() -> None:
    async with _served(_app()) as http:
        right = await http.get("/metrics.json", headers={"authorization": f"Bearer {KEY}"})
        wrong = await http.get("/metrics.json", headers={"authorization": "Bearer nope"})
        done = await http.post(
            "/process", json=body(stream=False), headers={"authorization": f"Bearer {KEY}"}
        )
    assert right.status_code == 200
    assert "set-cookie" not in right.headers
    assert wrong.status_code == 401
    assert wrong.json() == {"code": "unauthorized", "message": "the API key is not valid"}
    assert wrong.headers["www-authenticate"].startswith("Bearer")
    assert done.json()["status"] == "completed"


async def test_a_stale_or_forged_cookie_gets_401() -> None:
    app = _app()
    signin: SignIn = app.state.signin
    async with _served(app) as http:
        name = f"openstarry_session_{http.base_url.port}"
        fresh = signin.cookies.issue()
        expiry, nonce, mac = fresh.split(".")
        stale = signin.cookies.issue(now=time.time() - signin.cookies.ttl - 1)
        cookies = {
            "stale (signed here, expired)": stale,
            "expiry pushed forward": f"{int(expiry) + 3600}.{nonce}.{mac}",
            "another server's": SessionCookies(3600).issue(),
            "mac cut short": f"{expiry}.{nonce}.{mac[:-2]}",
            "not a token": "hello",
            "empty": "",
        }
        for what, token in cookies.items():
            for path in ("/metrics.json", "/events"):
                response = await http.get(path, headers={"cookie": f"{name}={token}"})
                assert response.status_code == 401, (what, path)
                assert response.json()["code"] == "unauthorized"
                assert "expired or is not valid" in response.json()["message"], what
            state = await http.get("/signin", headers={"cookie": f"{name}={token}"})
            assert state.json()["signed_in"] is False, what
        # The same cookie freshly signed passes; a stale one counted for no slow-down.
        ok = await http.get("/metrics.json", headers={"cookie": f"{name}={fresh}"})
        assert ok.status_code == 200
        assert len(signin.wrong_keys) == 0


async def test_the_cookie_is_secure_when_served_over_tls() -> None:
    app = _app()
    async with _in_process(app, scheme="https") as https:
        _, _, flags = _set_cookie(await _sign_in(https))
        assert "secure" in flags
        out = await https.post("/signout")
        assert out.status_code == 204
        _, value, flags = _set_cookie(out)
        assert value == ""
        assert flags["max-age"] == "0"
        assert "secure" in flags
    async with _in_process(app, scheme="http") as http:
        _, _, flags = _set_cookie(await _sign_in(http))
        assert "secure" not in flags


async def test_a_signed_in_change_must_come_from_the_console_s_own_page() -> None:
    async with _served(_app()) as http:
        await _sign_in(http)
        own = str(http.base_url).rstrip("/")
        port = http.base_url.port
        assert port is not None
        other_port = f"http://127.0.0.1:{port + 1}"
        stop = {"session_id": "s"}
        missing = await http.post("/stop", json=stop)
        foreign = await http.post("/stop", json=stop, headers={"origin": other_port})
        ours = await http.post("/stop", json=stop, headers={"origin": own})
        reading = await http.get("/metrics.json", headers={"origin": other_port})
    for refused in (missing, foreign):
        assert refused.status_code == 403
        assert refused.json()["code"] == "forbidden"
    assert ours.status_code == 202
    assert reading.status_code == 200  # reading: the browser's CORS keeps it from that page


async def test_a_page_of_another_origin_cannot_sign_in_or_out() -> None:
    app = _app()
    async with _in_process(app) as http:
        for path, payload in (
            ("/signin", {"key": KEY}),
            ("/signin", {"key": "x"}),
            ("/signout", {}),
        ):
            response = await http.post(
                path, json=payload, headers={"origin": "http://127.0.0.1:9999"}
            )
            assert response.status_code == 403, path
            assert "set-cookie" not in response.headers
        ours = await http.post(
            "/signin", json={"key": KEY}, headers={"origin": "http://testserver"}
        )
        assert ours.status_code == 200
    assert len(app.state.signin.wrong_keys) == 0  # the foreign wrong key was not counted


async def test_repeated_wrong_keys_from_one_address_are_slowed_down() -> None:
    app = _app()
    signin: SignIn = app.state.signin
    now = [1000.0]
    signin.wrong_keys.clock = lambda: now[0]
    attacker = _in_process(app, client=("192.0.2.7", 40000))
    neighbour = _in_process(app, client=("192.0.2.8", 40000))
    async with attacker, neighbour:
        for _ in range(4):
            wrong = await _sign_in(attacker, "guess")
            assert wrong.status_code == 401
            assert "retry-after" not in wrong.headers
        fifth = await _sign_in(attacker, "guess")
        assert fifth.status_code == 401
        assert fifth.headers["retry-after"] == "1"
        # Until then no key from that address is checked, not even the right one,
        # in the sign-in and in the bearer header alike.
        for slowed in (
            await _sign_in(attacker),
            await attacker.get("/metrics.json", headers={"authorization": f"Bearer {KEY}"}),
        ):
            assert slowed.status_code == 429
            assert slowed.json()["code"] == "too_many_wrong_keys"
            assert slowed.headers["retry-after"] == "1"
        # Another address is not slowed down.
        assert (await _sign_in(neighbour)).status_code == 200
        # Each further wrong key doubles the wait.
        now[0] += 1
        sixth = await attacker.get("/metrics.json", headers={"authorization": "Bearer guess"})
        assert sixth.status_code == 401
        assert sixth.headers["www-authenticate"].startswith("Bearer")
        assert (await _sign_in(attacker)).headers["retry-after"] == "2"
        now[0] += 2
        # Once the wait is over, the right key works and the count starts again.
        assert (await _sign_in(attacker)).status_code == 200
        assert (await _sign_in(attacker, "guess")).status_code == 401
        assert signin.wrong_keys.wait("192.0.2.7") == 0


async def test_a_sign_in_with_a_bad_body_gets_a_clear_error_and_counts_for_nothing() -> None:
    app = _app()
    async with _in_process(app) as http:
        cases: list[tuple[dict[str, Any], int]] = [
            ({"content": KEY, "headers": {"content-type": "text/plain"}}, 415),
            ({"content": b"{nope", "headers": {"content-type": "application/json"}}, 400),
            ({"json": {"key": 123}}, 422),
            ({"json": [KEY]}, 422),
            ({"json": {"key": ""}}, 422),
            ({"json": {"key": "x" * 5000}}, 413),
        ]
        for request, status in cases * 2:
            response = await http.post("/signin", **request)
            assert response.status_code == status, (request, response.text)
            assert set(response.json()) == {"code", "message"}
        assert (await _sign_in(http)).status_code == 200
    assert len(app.state.signin.wrong_keys) == 0


async def test_neither_the_key_nor_the_secret_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    signin: SignIn = app.state.signin
    caplog.set_level(logging.DEBUG)
    async with _in_process(app) as http:
        for key in ("wrong-key-1", "wrong-key-2", KEY):
            await _sign_in(http, key)
        await http.get("/metrics.json", headers={"authorization": "Bearer wrong-key-3"})
    text = caplog.text
    assert "wrong API key from 127.0.0.1 (2 in a row)" in text
    assert "console signed in from 127.0.0.1" in text
    secret = signin.cookies._secret
    for hidden in (KEY, "wrong-key-", secret.hex(), repr(secret)):
        assert hidden not in text


def test_the_wrong_key_book_is_bounded_and_forgets() -> None:
    now = [0.0]
    book = WrongKeys(
        free_attempts=2, max_delay=8, forget_after=100, max_addresses=3, clock=lambda: now[0]
    )
    assert [book.failed("10.0.0.1")[1] for _ in range(6)] == [0, 1, 2, 4, 8, 8]
    for i in range(2, 50):
        book.failed(f"10.0.0.{i}")
    assert len(book) == 3  # the least recently failed went first
    assert book.wait("10.0.0.1") == 0
    # An IPv6 address counts by its /64.
    book.failed("2001:db8::1")
    count, _ = book.failed("2001:db8::ffff:2")
    assert count == 2
    assert book.wait("2001:db8::3") == 1
    assert book.wait("2001:db8:0:1::1") == 0
    now[0] += 101
    assert book.wait("2001:db8::3") == 0
    assert len(book) == 0  # forgotten after forget_after seconds
    with pytest.raises(ValueError, match="max_addresses"):
        WrongKeys(max_addresses=0)


def test_a_session_token_is_valid_until_it_expires() -> None:
    now = [1_000_000.0]
    cookies = SessionCookies(60, clock=lambda: now[0])
    token = cookies.issue()
    assert cookies.valid(token)
    assert token.count(".") == 2
    now[0] += 59
    assert cookies.valid(token)
    now[0] += 2
    assert not cookies.valid(token)
    assert token != cookies.issue()  # a fresh nonce each time
    for bad in ("", "1.2", "x.y.z", "9" * 13 + ".a.b", "١٢٣.a.b", "1.é.b"):
        assert not cookies.valid(bad)
    with pytest.raises(ValueError, match="positive"):
        SessionCookies(0)
    with pytest.raises(ValueError, match="signin_ttl"):
        ServerLimits(signin_ttl=0)
