"""A2A 1.0 on ``openstarry serve``, driven by the official ``a2a-sdk`` client.

A real uvicorn server on 127.0.0.1 (``test_api_http.serving``): the card resolved,
blocking, non-blocking and streamed sends, multi-turn by context, get, list and cancel,
the A2A errors, the key the card declares, and malformed JSON-RPC bodies answered with
JSON-RPC errors, never a 5xx.
"""

from __future__ import annotations

import json
import random
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

from openstarry import tool
from openstarry.a2a import A2AToolset
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import ToolOutcome
from openstarry.agent.runtime import Agent
from openstarry.api.server import create_app
from openstarry.core import ContentSegment, Event, ProviderResponse
from openstarry.manifest import A2AAgentConfig
from openstarry.testing import FunctionProvider, text, tool_call
from test_api_http import serving_app

pytestmark = pytest.mark.anyio

HANG = 30
#: The two bindings the server speaks, as the official client names them.
BINDINGS = ["JSONRPC", "HTTP+JSON"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextmanager
def served(agent: Agent, api_key: str | None = None) -> Iterator[str]:
    with serving_app(create_app(agent, api_key=api_key), lifespan="on") as url:
        yield url


@asynccontextmanager
async def a2a_client(
    url: str,
    *,
    streaming: bool = False,
    headers: dict[str, str] | None = None,
    binding: str = "JSONRPC",
) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(headers=headers or {}, timeout=HANG) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        config = ClientConfig(
            streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding]
        )
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()


def message(words: str, context: str | None = None) -> Message:
    found = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=words)])
    if context is not None:
        found.context_id = context
    return found


async def send(client: Any, words: str, context: str | None = None, **config: Any) -> Any:
    request = SendMessageRequest(
        message=message(words, context), configuration=SendMessageConfiguration(**config)
    )
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1
    assert answers[0].HasField("task")
    return answers[0].task


def echo_agent() -> Agent:
    """An agent that repeats what it was told, and how many turns its session has had."""

    async def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        turns = sum(1 for entry in context.memory if entry.role == "user")
        return text(f"{prompt} (turn {turns})")

    return Agent(FunctionProvider(answer), name="echo")


async def test_the_card_names_the_agent_and_its_two_bindings() -> None:
    agent = echo_agent()
    with served(agent) as url:
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, url).get_agent_card()
            raw = (await http.get(f"{url}/.well-known/agent-card.json")).json()
    assert card.name == "echo"
    assert card.capabilities.streaming
    bindings = {i.protocol_binding: i for i in card.supported_interfaces}
    assert list(bindings) == ["JSONRPC", "HTTP+JSON"]  # JSON-RPC first: the preferred one
    for interface in bindings.values():
        assert interface.url == f"{url}/a2a"
        assert interface.protocol_version == "1.0"
    assert raw["skills"]
    assert "securitySchemes" not in raw  # no key: none asked


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_blocking_send_answers_with_the_completed_task_and_a_context_goes_on(
    binding: str,
) -> None:
    with served(echo_agent()) as url:
        async with a2a_client(url, binding=binding) as client:
            with anyio.fail_after(HANG):
                task = await send(client, "hello")
                assert task.status.state == TaskState.TASK_STATE_COMPLETED
                assert get_artifact_text(task.artifacts[0]) == "hello (turn 1)"
                assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
                # The same context is the same session: its memory holds the first turn.
                again = await send(client, "again", context=task.context_id)
                assert again.context_id == task.context_id
                assert again.id != task.id
                assert get_artifact_text(again.artifacts[0]) == "again (turn 2)"
                found = await client.get_task(GetTaskRequest(id=task.id, history_length=1))
                assert found.status.state == TaskState.TASK_STATE_COMPLETED
                assert len(found.history) == 1
                page = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
                assert {t.id for t in page.tasks} == {task.id, again.id}
                assert page.total_size == 2
                assert page.next_page_token == ""
                first = await client.list_tasks(ListTasksRequest(page_size=1))
                assert len(first.tasks) == 1
                assert first.next_page_token


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_streamed_send_gives_the_task_its_answer_and_its_last_state(binding: str) -> None:
    with served(echo_agent()) as url:
        async with a2a_client(url, streaming=True, binding=binding) as client:
            with anyio.fail_after(HANG):
                request = SendMessageRequest(message=message("stream me"))
                kinds, said, states = [], [], []
                async for answer in client.send_message(request):
                    kind = answer.WhichOneof("payload")
                    kinds.append(kind)
                    if kind == "artifact_update":
                        said.append(get_artifact_text(answer.artifact_update.artifact))
                    if kind == "status_update":
                        states.append(answer.status_update.status.state)
    assert kinds[0] == "task"
    assert "".join(said) == "stream me (turn 1)"
    assert states[-1] == TaskState.TASK_STATE_COMPLETED


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_streamed_answer_of_two_messages_adds_up_to_the_tasks_artifact(
    binding: str,
) -> None:
    """A first message said in pieces, a tool call, then a second one said whole: the
    pieces streamed (appended as A2A says) are the artifact GetTask gives, lines and all."""

    @tool
    def look() -> str:
        """Looks."""
        return "seen"

    async def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            for piece in ("Let me ", "look."):
                context.emit_text_delta(piece)
            response = tool_call("look", {})
            response.segments.insert(0, ContentSegment("text", text="Let me look."))
            return response
        return text("It is there.")  # not streamed

    with served(Agent(FunctionProvider(answer), [look], name="two")) as url:
        async with a2a_client(url, streaming=True, binding=binding) as client:
            with anyio.fail_after(HANG):
                artifact: list[str] = []
                task_id = ""
                request = SendMessageRequest(message=message("where?"))
                async for event in client.send_message(request):
                    if event.HasField("task"):
                        task_id = event.task.id
                    if event.HasField("artifact_update"):
                        update = event.artifact_update
                        if not update.append:
                            artifact.clear()
                        artifact.append(get_artifact_text(update.artifact))
                task = await client.get_task(GetTaskRequest(id=task_id))
    whole = "\n".join(get_artifact_text(a) for a in task.artifacts)
    assert whole == "Let me look.\nIt is there."
    assert artifact == ["Let me ", "look.", "\nIt is there."]  # the pieces as said


class _Gate:
    """A provider that waits until it is cancelled (or told to go on)."""

    def __init__(self) -> None:
        self.started = anyio.Event()

    async def __call__(self, prompt: str, context: AgentContext) -> ProviderResponse:
        self.started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_task_returned_at_once_is_cancelled_and_the_errors_are_a2as(binding: str) -> None:
    gate = _Gate()
    with served(Agent(FunctionProvider(gate), name="slow")) as url:
        async with a2a_client(url, binding=binding) as client:
            with anyio.fail_after(HANG):
                task = await send(client, "wait", return_immediately=True)
                assert task.status.state in (
                    TaskState.TASK_STATE_SUBMITTED,
                    TaskState.TASK_STATE_WORKING,
                )
                await gate.started.wait()
                cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
                assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
                with pytest.raises(TaskNotCancelableError):
                    await client.cancel_task(CancelTaskRequest(id=task.id))
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(GetTaskRequest(id="task-that-never-was"))


@pytest.mark.parametrize("binding", BINDINGS)
async def test_with_a_key_the_card_says_so_and_a_call_without_it_is_refused(binding: str) -> None:
    with served(echo_agent(), api_key="s3cret-key") as url:
        async with httpx.AsyncClient(timeout=HANG) as http:
            raw = (await http.get(f"{url}/.well-known/agent-card.json")).json()
            assert raw["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
            refused = await http.post(
                f"{url}/a2a",
                json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}},
                headers={"A2A-Version": "1.0"},
            )
            assert refused.status_code == 401
        async with a2a_client(
            url, headers={"Authorization": "Bearer s3cret-key"}, binding=binding
        ) as client:
            with anyio.fail_after(HANG):
                task = await send(client, "hello")
        assert task.status.state == TaskState.TASK_STATE_COMPLETED


async def test_malformed_json_rpc_gets_json_rpc_errors_never_a_5xx() -> None:
    """Bodies broken in every way a fuzzer finds: each answered 200 with an error object
    (or 4xx for the HTTP itself), the server still serving after."""
    rng = random.Random(7)
    valid = {
        "jsonrpc": "2.0",
        "id": "1",
        "method": "SendMessage",
        "params": {
            "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
        },
    }
    odd: list[Any] = [None, True, 0, -1, 2**70, 1.5, "", "x" * 300, [], {}, [1], {"a": None}]
    bodies: list[bytes] = [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"jsonrpc": "2.0"}']
    for _ in range(150):
        call = json.loads(json.dumps(valid))
        where = rng.choice(["top", "params", "message", "part"])
        target = {
            "top": call,
            "params": call["params"],
            "message": call["params"]["message"],
            "part": call["params"]["message"]["parts"][0],
        }[where]
        key = rng.choice([*list(target), "configuration", "historyLength", "pageSize", "id"])
        target[key] = rng.choice(odd)
        if rng.random() < 0.3:
            call["method"] = rng.choice(
                ["GetTask", "ListTasks", "CancelTask", "SubscribeToTask", "Nope", 5]
            )
        bodies.append(json.dumps(call).encode())
    with served(echo_agent()) as url:
        async with httpx.AsyncClient(timeout=HANG) as http:
            for body in bodies:
                answer = await http.post(
                    f"{url}/a2a",
                    content=body,
                    headers={"A2A-Version": "1.0", "content-type": "application/json"},
                )
                assert answer.status_code < 500, (body, answer.text)
                if answer.headers["content-type"].startswith("application/json"):
                    reply = answer.json()
                    assert reply["jsonrpc"] == "2.0"
                    assert ("result" in reply) != ("error" in reply), reply
            old = await http.post(
                f"{url}/a2a",
                json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks"},
                headers={"A2A-Version": "0.3"},
            )
            assert old.json()["error"]["code"] == -32009  # 0.3 is not served
            unnamed = await http.post(
                f"{url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}
            )
            assert "result" in unnamed.json()  # no version named: 1.0
            unknown = await http.post(
                f"{url}/a2a",
                json={"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {}},
                headers={"A2A-Version": "1.0"},
            )
            assert unknown.json()["error"]["code"] == -32601
            assert (await http.get(f"{url}/health")).status_code == 200


async def test_malformed_http_json_requests_get_a2a_errors_never_a_5xx() -> None:
    """The HTTP+JSON binding, fed broken bodies, odd query strings and unknown paths:
    each answered with a google.rpc.Status naming an A2A reason, the server still up."""
    rng = random.Random(11)
    valid = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    odd: list[Any] = [None, True, 0, -1, 2**70, 1.5, "", "x" * 300, [], {}, [1], {"a": None}]
    sends: list[bytes] = [b"", b"{", b"[]", b"null", b"\xff\xfe", b"{}"]
    for _ in range(100):
        call = json.loads(json.dumps(valid))
        where = rng.choice(["top", "message", "part"])
        target = {"top": call, "message": call["message"], "part": call["message"]["parts"][0]}
        target = target[where]
        key = rng.choice([*list(target), "configuration", "taskId", "contextId"])
        target[key] = rng.choice(odd)
        sends.append(json.dumps(call).encode())
    queries = [
        "pageSize=0",
        "pageSize=x",
        "pageSize=-5",
        "pageToken=%F0",
        "historyLength=-1",
        "status=NOPE",
        "statusTimestampAfter=yesterday",
        "includeArtifacts=maybe",
    ]
    with served(echo_agent()) as url:
        async with httpx.AsyncClient(timeout=HANG) as http:
            answers = [await http.post(f"{url}/a2a/message:send", content=body) for body in sends]
            answers += [await http.get(f"{url}/a2a/tasks?{query}") for query in queries]
            answers += [
                await http.get(f"{url}/a2a/tasks/nope"),
                await http.post(f"{url}/a2a/tasks/nope:cancel"),
                await http.post(f"{url}/a2a/tasks/nope:subscribe"),
                await http.get(f"{url}/a2a/tasks/nope/pushNotificationConfigs"),
                await http.get(f"{url}/a2a/extendedAgentCard"),
                await http.delete(f"{url}/a2a/whatever/else"),
                await http.post(
                    f"{url}/a2a/message:send", content=b"{}", headers={"content-type": "text/plain"}
                ),
            ]
            old = await http.get(f"{url}/a2a/tasks", headers={"A2A-Version": "0.3"})
            assert (await http.get(f"{url}/health")).status_code == 200
    reasons = set()
    for answer in answers:
        assert answer.status_code < 500, answer.text
        if answer.status_code >= 400:
            error = answer.json()["error"]
            assert error["code"] == answer.status_code
            (info,) = error["details"]
            assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
            reasons.add(info["reason"])
    assert {
        "TASK_NOT_FOUND",
        "INVALID_PARAMS",
        "INVALID_REQUEST",
        "METHOD_NOT_FOUND",
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
        "UNSUPPORTED_OPERATION",
    } <= reasons
    assert old.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"


# -- the client side: remote agents as tools -----------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_an_agent_calls_another_over_a2a_in_its_trace() -> None:
    """Two openstarry agents: the caller's tool is the other agent; the other's run is
    in the caller's trace, one call deep, and its answer is the tool's result."""
    seen: list[tuple[str, int]] = []

    async def helper(prompt: str, context: AgentContext) -> ProviderResponse:
        seen.append((context.trace_id, context.call_depth))
        return text(f"helper says: {prompt.upper()}")

    async def caller(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            return tool_call("helper", {"message": prompt})
        outcome = context.memory[-1]
        assert isinstance(outcome, ToolOutcome)
        return text(f"the helper answered {outcome.result}")

    with served(Agent(FunctionProvider(helper), name="helper")) as url:
        toolset = A2AToolset([A2AAgentConfig(name="helper", url=url)], timeout=HANG)
        agent = Agent(FunctionProvider(caller), name="caller", toolsets=[toolset])
        async with agent:
            tool = agent.tools["helper"]
            assert "helper" in tool.description  # from the card
            with anyio.fail_after(HANG):
                result = await agent.ask("hello there", session_id="s1")
                again = await agent.ask("and again", session_id="s1")
    assert result.text == "the helper answered helper says: HELLO THERE"
    assert again.text == "the helper answered helper says: AND AGAIN"
    assert seen[0] == (result.trace_id, 1)  # the caller's trace, one call deep
    assert seen[1] == (again.trace_id, 1)


async def test_a_streamed_remote_answer_comes_as_progress_of_the_call_in_the_callers_run() -> None:
    """The helper says its answer in pieces; the caller's run shows each piece, and each
    state of the remote task, as EXEC:TOOL_PROGRESS children of the call, in its trace,
    and the tool's result is the whole answer."""
    pieces = ["The weather ", "in Taipei ", "is sunny."]

    async def helper(prompt: str, context: AgentContext) -> ProviderResponse:
        for piece in pieces:
            context.emit_text_delta(piece)
        return text("".join(pieces))

    async def caller(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            return tool_call("helper", {"message": prompt})
        outcome = context.memory[-1]
        assert isinstance(outcome, ToolOutcome)
        return text(str(outcome.result))

    events: list[Event] = []
    with served(Agent(FunctionProvider(helper), name="helper")) as url:
        toolset = A2AToolset([A2AAgentConfig(name="helper", url=url)], timeout=HANG)
        agent = Agent(FunctionProvider(caller), name="caller", toolsets=[toolset])
        async with agent:
            agent.bus.subscribe("EXEC:*", events.append)
            with anyio.fail_after(HANG):
                result = await agent.ask("weather?", session_id="s1")
                await agent.bus.wait_idle()
    assert result.text == "".join(pieces)
    (call,) = [e for e in events if e.type == "EXEC:TOOL_CALL"]
    progress = [e for e in events if e.type == "EXEC:TOOL_PROGRESS"]
    assert progress
    for event in progress:
        assert (event.trace_id, event.parent_id) == (result.trace_id, call.id)
        assert event.payload["toolCallId"] == call.payload["toolCallId"]
        assert event.payload["name"] == "helper"
        assert event.payload["taskId"]
    said = [e.payload["text"] for e in progress if "text" in e.payload]
    assert said == pieces  # one event per piece, as the helper said them
    states = [e.payload["state"] for e in progress if "state" in e.payload]
    assert states[-1] == "TASK_STATE_COMPLETED"
    assert "TASK_STATE_WORKING" in states
    (done,) = [e for e in events if e.type == "EXEC:TOOL_RESULT"]
    assert done.payload["result"] == "".join(pieces)


async def test_a_cycle_of_agents_is_refused_at_the_depth_limit() -> None:
    """An agent whose tool is itself, over A2A: each call goes one deeper, until the
    sixth is refused (-32050) and the refusal comes back up the chain."""
    depths: list[int] = []

    async def loop(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            depths.append(context.call_depth)
            return tool_call("self", {"message": prompt})
        outcome = context.memory[-1]
        assert isinstance(outcome, ToolOutcome)
        said = outcome.result if outcome.success else f"{outcome.error.code}"  # type: ignore[union-attr]
        return text(f"{context.call_depth}<{said}>")

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    toolset = A2AToolset([A2AAgentConfig(name="self", url=url)], timeout=HANG)
    agent = Agent(FunctionProvider(loop), name="loop", toolsets=[toolset])
    with serving_app(create_app(agent), lifespan="on", port=port):
        async with httpx.AsyncClient(timeout=HANG) as http:
            answer = await http.post(
                f"{url}/a2a",
                headers={"A2A-Version": "1.0"},
                json={
                    "jsonrpc": "2.0",
                    "id": "1",
                    "method": "SendMessage",
                    "params": {
                        "message": {
                            "messageId": "m",
                            "role": "ROLE_USER",
                            "parts": [{"text": "go"}],
                        }
                    },
                },
            )
    task = answer.json()["result"]["task"]
    said = task["artifacts"][0]["parts"][0]["text"]
    assert depths == [0, 1, 2, 3, 4, 5]
    assert said == "0<1<2<3<4<5<RECURSION_LIMIT_EXCEEDED>>>>>>"


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_task_that_asks_for_an_approval_goes_on_when_answered_by_its_id(
    binding: str,
) -> None:
    """input-required: the task's status names the approval it waits for; a message to
    that task with the answer as a data part resumes it, the same task, to its end."""
    charged: list[int] = []

    @tool
    async def charge(amount: int) -> str:
        """Charge the card."""
        charged.append(amount)
        return f"charged {amount}"

    async def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        if context.round == 1:
            return tool_call("charge", {"amount": 5})
        outcome = context.memory[-1]
        assert isinstance(outcome, ToolOutcome)
        return text(f"done: {outcome.result if outcome.success else 'not charged'}")

    agent = Agent(FunctionProvider(answer), tools=[charge], approval_tools=["charge"])

    async def call(http: httpx.AsyncClient, url: str, message: dict[str, Any]) -> Any:
        body = {
            "jsonrpc": "2.0",
            "id": "1",
            "method": "SendMessage",
            "params": {"message": message},
        }
        reply = (await http.post(f"{url}/a2a", json=body, headers={"A2A-Version": "1.0"})).json()
        assert "result" in reply, reply
        return reply["result"]["task"]

    with served(agent) as url:
        async with httpx.AsyncClient(timeout=HANG) as http:
            with anyio.fail_after(HANG):
                asked = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "pay"}]}
                task = await call(http, url, asked)
                assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
                [waiting] = [p["data"] for p in task["status"]["message"]["parts"] if "data" in p]
                [approval] = waiting["approvals"]
                assert approval["name"] == "charge"
                assert charged == []
                answer_part = {
                    "data": {
                        "approval_request_id": approval["approval_request_id"],
                        "approve": True,
                    }
                }
                resumed = await call(
                    http,
                    url,
                    {
                        "messageId": "m2",
                        "role": "ROLE_USER",
                        "taskId": task["id"],
                        "parts": [answer_part],
                    },
                )
                assert resumed["id"] == task["id"]
                assert resumed["status"]["state"] == "TASK_STATE_COMPLETED"
                assert resumed["artifacts"][0]["parts"][0]["text"] == "done: charged 5"
                assert charged == [5]
                again = {
                    "messageId": "m3",
                    "role": "ROLE_USER",
                    "taskId": task["id"],
                    "parts": [answer_part],
                }
                body = {
                    "jsonrpc": "2.0",
                    "id": "2",
                    "method": "SendMessage",
                    "params": {"message": again},
                }
                refused = await http.post(f"{url}/a2a", json=body, headers={"A2A-Version": "1.0"})
                assert refused.json()["error"]["code"] == -32004  # it is over now


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_subscriber_follows_a_running_task_to_its_end(binding: str) -> None:
    gate = anyio.Event()

    async def answer(prompt: str, context: AgentContext) -> ProviderResponse:
        await gate.wait()
        return text("at last")

    with served(Agent(FunctionProvider(answer), name="slow")) as url:
        async with (
            a2a_client(url, binding=binding) as client,
            a2a_client(url, streaming=True, binding=binding) as subscriber,
        ):
            with anyio.fail_after(HANG):
                task = await send(client, "go", return_immediately=True)
                seen: list[Any] = []
                async with anyio.create_task_group() as tasks:

                    async def follow() -> None:
                        async for event in subscriber.subscribe(SubscribeToTaskRequest(id=task.id)):
                            seen.append(event)

                    tasks.start_soon(follow)
                    await anyio.sleep(0.3)
                    gate.set()
    kinds = [event.WhichOneof("payload") for event in seen]
    assert kinds[0] == "task"
    said = "".join(
        get_artifact_text(e.artifact_update.artifact) for e in seen if e.HasField("artifact_update")
    )
    assert said == "at last"
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
