"""The console in a real browser: Debian's chromium, headless, driven by Selenium.

The browser and its driver are the system's (``/usr/bin/chromium``,
``/usr/bin/chromedriver``; ``make test`` installs them); nothing is downloaded.
Without them the test is skipped, saying why. The test saves a screenshot of
the console at ``test-artifacts/console.png``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from openstarry import tool
from openstarry.agent.runtime import Agent
from openstarry.api.server import create_app
from openstarry.providers.default import DefaultProvider
from openstarry.tools import get_weather
from test_api_http import FINAL_TEXT, serving_app

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
WAIT = 20


@tool(name="slow")
async def slow(seconds: float = 60.0) -> str:
    """Takes its time (the test stops it)."""
    await anyio.sleep(seconds)
    return "finished"


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("needs Debian's chromium and chromium-driver (make test installs them)")
    # Selenium Manager must never fetch a browser or a driver.
    monkeypatch.setenv("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER)
    )
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: WebDriver, what: str, script: str) -> object:
    """Wait (at most ``WAIT`` s) until the JavaScript ``script`` returns something truthy."""
    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(
            lambda d: d.execute_script(script)
        )
    except TimeoutException:
        raise AssertionError(f"the console never showed {what}") from None


def send(driver: WebDriver, text: str) -> None:
    box = driver.find_element(By.ID, "chat-input")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def test_the_console_chats_shows_the_trace_and_stops_a_run(browser: WebDriver) -> None:
    agent = Agent(DefaultProvider(), [get_weather, slow], name="weather-agent")
    # /slow is a slash command over HTTP: reachable only when the server exposes it.
    app = create_app(agent, expose_tools=["slow"])
    with serving_app(app, lifespan="on") as url:
        browser.get(url + "/")
        until(
            browser,
            "the bus connected",
            "return document.getElementById('bus-status').textContent === 'live'",
        )

        send(browser, "Query weather in Taipei")
        until(
            browser,
            "the weather answer",
            f"return [...document.querySelectorAll('#chat-log .msg.assistant')]"
            f".some(m => m.textContent.includes({FINAL_TEXT!r}))",
        )
        chat = browser.find_element(By.ID, "chat-log").text
        assert "get_weather(" in chat  # the tool call, inline
        assert "25" in chat.split("get_weather:")[1]  # and its result
        assert "run completed" in chat

        # The timeline has the call and the result of one trace; the tree links them.
        trace = until(
            browser,
            "the tool result in the timeline",
            "const r = document.querySelector('#timeline .ev[data-type=\"EXEC:TOOL_RESULT\"]');"
            "return r && r.dataset.trace;",
        )
        call = browser.find_element(
            By.CSS_SELECTOR, f'#timeline .ev[data-type="EXEC:TOOL_CALL"][data-trace="{trace}"]'
        )
        assert "p" in (call.get_attribute("class") or "")
        result = browser.find_element(
            By.CSS_SELECTOR, f'#timeline .ev[data-type="EXEC:TOOL_RESULT"][data-trace="{trace}"]'
        )
        result.click()
        nested = browser.find_elements(
            By.CSS_SELECTOR,
            '#trace-tree li[data-type="EXEC:TOOL_CALL"] > ul > li[data-type="EXEC:TOOL_RESULT"]',
        )
        assert len(nested) == 1
        assert browser.find_element(By.ID, "trace-tree").get_attribute("data-trace") == trace
        assert "toolCallId" in browser.find_element(By.ID, "payload").text
        until(
            browser,
            "the charts with a few points",
            "return Number(document.body.dataset.polls || 0) >= 4 && document.getElementById("
            "'legend-rate').textContent.includes('EXEC:TOOL_CALL')",
        )
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "console.png"))

        # A slow tool, stopped from the console: the run ends canceled.
        send(browser, "/slow")
        until(
            browser,
            "the slow tool running",
            "return [...document.querySelectorAll('#timeline .ev')]"
            ".some(r => r.dataset.type === 'EXEC:TOOL_CALL' && r.dataset.trace !== "
            f"{trace!r})",
        )
        browser.find_element(By.ID, "stop").click()
        until(
            browser,
            "the run canceled",
            "return document.querySelector('#chat-log .run-status[data-status=\"canceled\"]')",
        )
        assert browser.find_elements(
            By.CSS_SELECTOR, '#timeline .ev.p0[data-type="INPUT:SYSTEM_COMMAND"]'
        )
        assert browser.save_screenshot(str(ARTIFACTS / "console-stopped.png"))


def test_behind_a_key_the_console_signs_in_once_then_chats_and_shows_the_timeline(
    browser: WebDriver,
) -> None:
    """Issue 29: with ``--api-key-env`` the console could not be used from a browser,
    which cannot send a bearer header to a page or an ``EventSource``."""
    key = "browser-test-key-5c1d"
    agent = Agent(DefaultProvider(), [get_weather], name="weather-agent")
    with serving_app(create_app(agent, api_key=key), lifespan="on") as url:
        browser.get(url + "/")
        until(
            browser,
            "the sign-in form",
            "return !document.getElementById('signin').hidden",
        )
        assert browser.find_element(By.ID, "bus-status").text == "connecting"
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "console-signin.png"))

        box = browser.find_element(By.ID, "signin-key")
        box.send_keys("not the key")
        browser.find_element(By.ID, "signin-button").click()
        until(
            browser,
            "the wrong key refused",
            "return document.getElementById('signin-error').textContent"
            ".includes('the API key is not valid')",
        )
        box.clear()
        box.send_keys(key)
        browser.find_element(By.ID, "signin-button").click()
        until(browser, "the form gone", "return document.getElementById('signin').hidden")
        until(
            browser,
            "the bus connected with the cookie",
            "return document.getElementById('bus-status').textContent === 'live'",
        )
        # The cookie is HttpOnly: the page's scripts cannot read it.
        assert browser.execute_script("return document.cookie") == ""

        send(browser, "Query weather in Taipei")
        until(
            browser,
            "the weather answer",
            f"return [...document.querySelectorAll('#chat-log .msg.assistant')]"
            f".some(m => m.textContent.includes({FINAL_TEXT!r}))",
        )
        assert "run completed" in browser.find_element(By.ID, "chat-log").text
        until(
            browser,
            "the tool call and result in the timeline",
            "const types = [...document.querySelectorAll('#timeline .ev')]"
            ".map(r => r.dataset.type);"
            "return types.includes('EXEC:TOOL_CALL') && types.includes('EXEC:TOOL_RESULT');",
        )
        until(
            browser,
            "the charts polled with the cookie",
            "return Number(document.body.dataset.polls || 0) >= 2",
        )
        assert browser.save_screenshot(str(ARTIFACTS / "console-signed-in.png"))

        # A reload keeps the sign-in; signing out asks for the key again.
        browser.refresh()
        until(
            browser,
            "the bus connected again without a sign-in",
            "return document.getElementById('bus-status').textContent === 'live'",
        )
        assert browser.execute_script("return document.getElementById('signin').hidden")
        browser.find_element(By.ID, "signout").click()
        until(browser, "the sign-in form again", "return !document.getElementById('signin').hidden")
        refused = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/metrics.json').then(r => done(r.status));"
        )
        assert refused == 401
