"""Bad JSON-RPC against ``openstarry mcp``: raw bytes over HTTP and over stdio (issue 5).

Every malformed message gets its JSON-RPC error code (invalid JSON -32700, an
unknown method -32601, wrong params -32602) and the server keeps serving.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcp_fixtures import helpers

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def initialize(request_id: int = 1, version: str = "2025-06-18") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "1"},
        },
    }


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def weather_call(request_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "get_weather", "arguments": {"location": "Taipei"}},
    }


#: Requests whose params the server refuses with -32602, as (params, why).
WRONG_PARAMS = [
    ({"name": 5}, "a name that is not a string"),
    ({"arguments": {}}, "no name"),
    ({"name": "get_weather", "arguments": [1, 2]}, "arguments that are not an object"),
    ({"name": "get_weather", "arguments": "Taipei"}, "arguments that are a string"),
]


# --- over HTTP -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    manifest = helpers.write_manifest(tmp_path_factory.mktemp("jsonrpc-http"))
    with helpers.http_server(manifest) as (address, _stderr):
        yield address


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=helpers.WAIT) as client:
        yield client


def reply_of(response: httpx.Response) -> dict[str, Any]:
    """The one JSON-RPC message of a response, whether plain JSON or one SSE event."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        messages = [json.loads(d) for d in data if d]
        assert len(messages) == 1, response.text
        message: dict[str, Any] = messages[0]
        return message
    decoded: dict[str, Any] = response.json()
    return decoded


@pytest.fixture
def session(url: str, http: httpx.Client) -> dict[str, str]:
    """The headers of an initialized handshake-era session."""
    response = http.post(url, json=initialize(), headers=ACCEPT)
    assert response.status_code == 200
    assert reply_of(response)["result"]["protocolVersion"] == "2025-06-18"
    headers = {
        **ACCEPT,
        "Mcp-Session-Id": response.headers["mcp-session-id"],
        "MCP-Protocol-Version": "2025-06-18",
    }
    assert http.post(url, json=INITIALIZED, headers=headers).status_code == 202
    return headers


def assert_error(response: httpx.Response, code: int, request_id: Any) -> dict[str, Any]:
    reply = reply_of(response)
    assert reply["jsonrpc"] == "2.0"
    assert "result" not in reply
    assert reply["error"]["code"] == code, reply
    assert isinstance(reply["error"]["message"], str)
    assert reply["error"]["message"]
    assert reply["id"] == request_id
    return reply


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"jsonrpc": "2.0", "id": 1,', b"\xff\xfe"])
def test_http_invalid_json_is_a_parse_error(
    url: str, http: httpx.Client, session: dict[str, str], body: bytes
) -> None:
    response = http.post(url, content=body, headers=session)
    assert response.status_code == 400
    assert_error(response, PARSE_ERROR, None)
    # The session goes on.
    assert reply_of(http.post(url, json=weather_call(9), headers=session))["id"] == 9


def test_http_invalid_json_before_any_session_is_a_parse_error(
    url: str, http: httpx.Client
) -> None:
    response = http.post(url, content=b"[1, 2", headers=ACCEPT)
    assert response.status_code == 400
    assert_error(response, PARSE_ERROR, None)


def test_http_unknown_method(url: str, http: httpx.Client, session: dict[str, str]) -> None:
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/explode", "params": {}}
    reply = assert_error(http.post(url, json=body, headers=session), METHOD_NOT_FOUND, 2)
    assert reply["error"]["data"] == "tools/explode"
    # Methods of capabilities the agent does not declare (prompts) are unknown too.
    body = {"jsonrpc": "2.0", "id": 3, "method": "prompts/list", "params": {}}
    assert_error(http.post(url, json=body, headers=session), METHOD_NOT_FOUND, 3)


@pytest.mark.parametrize(("params", "why"), WRONG_PARAMS)
def test_http_wrong_params(
    url: str, http: httpx.Client, session: dict[str, str], params: Any, why: str
) -> None:
    body = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params}
    assert_error(http.post(url, json=body, headers=session), INVALID_PARAMS, 4)
    assert reply_of(http.post(url, json=weather_call(5), headers=session))["result"]["isError"] is (
        False
    )


def test_http_a_json_value_that_is_no_message_is_refused(
    url: str, http: httpx.Client, session: dict[str, str]
) -> None:
    # The SDK answers -32602 for a body that is JSON but no JSON-RPC message.
    response = http.post(url, json={"hello": "world"}, headers=session)
    assert response.status_code == 400
    assert_error(response, INVALID_PARAMS, None)


def test_http_2026_era_unknown_method_and_wrong_params(url: str, http: httpx.Client) -> None:
    headers = {**ACCEPT, "MCP-Protocol-Version": MODERN}

    def post(request_id: int, method: str, params: dict[str, Any]) -> httpx.Response:
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": {"_meta": MODERN_META, **params},
        }
        extra = {"Mcp-Method": method}
        if isinstance(params.get("name"), str):
            extra["Mcp-Name"] = params["name"]
        return http.post(url, json=body, headers={**headers, **extra})

    response = post(1, "tools/explode", {})
    assert response.status_code == 404
    assert_error(response, METHOD_NOT_FOUND, 1)
    response = post(2, "tools/call", {"name": "get_weather", "arguments": [1]})
    assert response.status_code == 400
    assert_error(response, INVALID_PARAMS, 2)
    response = http.post(url, content=b"{oops", headers=headers)
    assert response.status_code == 400
    assert_error(response, PARSE_ERROR, None)
    ok = post(3, "tools/call", {"name": "get_weather", "arguments": {"location": "Taipei"}})
    assert "25°C, Sunny" in reply_of(ok)["result"]["content"][0]["text"]


# --- over stdio ----------------------------------------------------------------------------


class Stdio:
    """A raw line-level conversation with ``openstarry mcp`` over its stdin and stdout."""

    def __init__(self, process: subprocess.Popen[bytes], out: helpers.Lines) -> None:
        self.process = process
        self.out = out

    def send(self, data: bytes | dict[str, Any]) -> None:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(raw + b"\n")
        self.process.stdin.flush()

    def reply(self) -> dict[str, Any]:
        line = self.out.next()
        assert line is not None, "the server closed its stdout"
        message: dict[str, Any] = json.loads(line)
        return message

    def ask(self, data: bytes | dict[str, Any]) -> dict[str, Any]:
        self.send(data)
        return self.reply()


@pytest.fixture
def stdio(tmp_path: Path) -> Iterator[tuple[Stdio, helpers.Lines]]:
    with helpers.stdio_server(helpers.write_manifest(tmp_path)) as (process, out, err):
        yield Stdio(process, out), err


def test_stdio_bad_messages_get_their_codes_and_the_connection_goes_on(
    stdio: tuple[Stdio, helpers.Lines],
) -> None:
    server, _ = stdio
    for body in (b"{not json", b'{"jsonrpc": "2.0", "id": 1,', b"\xff\xfe garbage"):
        reply = server.ask(body)
        assert reply == {"jsonrpc": "2.0", "id": None, "error": reply["error"]}
        assert reply["error"]["code"] == PARSE_ERROR
    # JSON, but no JSON-RPC message.
    for body in (b'{"hello": "world"}', b"[1, 2, 3]", b"42"):
        reply = server.ask(body)
        assert reply["id"] is None
        assert reply["error"]["code"] == INVALID_REQUEST
    # Before the handshake, an unknown method is still unknown.
    reply = server.ask({"jsonrpc": "2.0", "id": 7, "method": "nope/nope"})
    assert (reply["id"], reply["error"]["code"]) == (7, METHOD_NOT_FOUND)

    answer = server.ask(initialize(1, "2024-11-05"))
    assert answer["id"] == 1
    result = answer["result"]
    assert result["protocolVersion"] == "2024-11-05"  # the client's, which the server speaks
    assert result["serverInfo"]["name"] == "mcp-test"
    assert result["serverInfo"]["version"] == "2.5.0"
    assert "tools" in result["capabilities"]
    server.send(INITIALIZED)

    reply = server.ask({"jsonrpc": "2.0", "id": 2, "method": "tools/explode", "params": {}})
    assert (reply["id"], reply["error"]["code"]) == (2, METHOD_NOT_FOUND)
    for request_id, (params, _why) in enumerate(WRONG_PARAMS, start=10):
        reply = server.ask(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        )
        assert (reply["id"], reply["error"]["code"]) == (request_id, INVALID_PARAMS)
    reply = server.ask(b"{still not json")
    assert reply["error"]["code"] == PARSE_ERROR

    reply = server.ask(weather_call(3))
    assert reply["id"] == 3
    assert "25°C, Sunny" in reply["result"]["content"][0]["text"]


def test_stdio_an_unknown_protocol_version_gets_the_latest_the_server_speaks(
    stdio: tuple[Stdio, helpers.Lines],
) -> None:
    server, _ = stdio
    result = server.ask(initialize(1, "1999-01-01"))["result"]
    assert result["protocolVersion"] >= "2025-06-18"


def test_stdio_stdout_carries_nothing_but_protocol(stdio: tuple[Stdio, helpers.Lines]) -> None:
    server, err = stdio
    server.ask(initialize(1))
    server.send(INITIALIZED)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "noisy", "arguments": {"text": "psst"}},
    }
    reply = server.ask(call)
    assert reply["result"]["content"][0]["text"] == "psst"
    assert server.process.stdin is not None
    server.process.stdin.close()
    assert server.process.wait(timeout=helpers.WAIT) == 0
    assert server.out.next() is None  # nothing followed the reply
    stderr = err.join()
    # The tool's print to stdout was turned to stderr: the protocol stream stayed clean.
    assert "stdout chatter: psst" in stderr
    assert "stderr chatter: psst" in stderr


def test_stdio_requests_sent_before_stdin_closes_are_all_answered(
    stdio: tuple[Stdio, helpers.Lines],
) -> None:
    server, _ = stdio
    batch = [initialize(1), INITIALIZED, *(weather_call(i) for i in range(2, 7))]
    assert server.process.stdin is not None
    server.process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in batch))
    server.process.stdin.close()  # at once, as a pipe does
    assert server.process.wait(timeout=helpers.WAIT) == 0
    replies = []
    while (line := server.out.next()) is not None:
        replies.append(json.loads(line))
    assert sorted(reply["id"] for reply in replies) == [1, 2, 3, 4, 5, 6]
    for reply in replies[1:]:
        assert "25°C, Sunny" in reply["result"]["content"][0]["text"]
