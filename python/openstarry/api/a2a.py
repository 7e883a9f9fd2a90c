"""A2A 1.0 on ``openstarry serve``: the agent card and the JSON-RPC binding, on the same
port as the Agent API, with its auth and limits (the HTTP+JSON binding, over the same
methods, is :mod:`openstarry.api.a2a_rest`).

- ``GET /.well-known/agent-card.json``: the card. The manifest's identity (name,
  description, version), the exposed tools (``api.expose_tools``) as skills,
  streaming, and the bearer scheme when the server has a key. Public, as A2A clients
  read it before they authenticate.
- ``POST /a2a``: JSON-RPC 2.0, the methods of A2A 1.0: ``SendMessage`` (blocking, or
  ``configuration.returnImmediately``), ``SendStreamingMessage`` (server-sent events:
  the task, its status, its answer as it is said, the final status), ``GetTask``,
  ``ListTasks``, ``CancelTask``, ``SubscribeToTask``; ``GetExtendedAgentCard`` answers
  that there is none.

A task is a response of the Agent API (its id is the response's, its ``contextId`` the
session's), so a task runs where the server's runs run, in the process or on its Redis
bus, and keeps their limits (one run per session, ``max_concurrent_runs``, the replay
buffer, the response TTL). A message to a context goes on in the same session: its
memory holds the earlier turns.

Wire form (A2A 1.0, ProtoJSON): camelCase fields, ``ROLE_*`` and ``TASK_STATE_*``
enums, timestamps in UTC with a ``Z``, parts as ``{"text": ...}`` or ``{"data": ...}``.
Every error is a JSON-RPC error with the A2A code (``-32001`` task not found, ``-32002``
not cancelable, ``-32004`` unsupported, ``-32009`` version, the standard ``-326xx``),
never a 5xx: bad input is the caller's, and is said so. A request that names another
version than 1.0 (``A2A-Version``, a header or the query parameter) is refused; one that
names none is taken for 1.0 (0.3's methods have other names, and are not found).
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from openstarry.api.models import ProtocolError, parse_request
from openstarry.api.replay import ReaderGone, ResponseRecord
from openstarry.api.routes import check_content_type, read_body
from openstarry.api.runs import ApiError, RunsApi
from openstarry.api.tracecontext import incoming_depth, incoming_trace
from openstarry.tracecontext import MAX_CALL_DEPTH, META_DEPTH, META_TRACE

try:
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import BaseRoute, Route
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.api.server needs Starlette and uvicorn: pip install 'openstarry[http]'"
    ) from exc

__all__ = [
    "A2A_PATH",
    "CARD_PATH",
    "A2AError",
    "A2AMethods",
    "a2a_routes",
    "agent_card",
    "check_version",
    "events",
]

#: Where the agent card is (A2A's well-known path).
CARD_PATH = "/.well-known/agent-card.json"
#: Where the JSON-RPC binding answers.
A2A_PATH = "/a2a"
#: The protocol version served (``A2A-Version``: major.minor).
VERSION = "1.0"

#: A2A's error codes (spec section 9.5) beside JSON-RPC's own.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED = -32004
EXTENDED_CARD_NOT_CONFIGURED = -32007
VERSION_NOT_SUPPORTED = -32009
#: A message deeper in a chain of agents than :data:`MAX_CALL_DEPTH` (as MCP's guard).
RECURSION_LIMIT_EXCEEDED = -32050

#: Tasks a ``ListTasks`` page holds by default, and at most.
PAGE_SIZE, MAX_PAGE_SIZE = 50, 100
#: The most parts one message may carry.
MAX_PARTS = 64
#: The position of a reader that reads no events (a blocking ``SendMessage``).
_NO_EVENTS = 1 << 62

#: Each Agent API status, as an A2A task state.
_STATES = {
    "created": "TASK_STATE_SUBMITTED",
    "queued": "TASK_STATE_SUBMITTED",
    "in_progress": "TASK_STATE_WORKING",
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "canceled": "TASK_STATE_CANCELED",
    "rejected": "TASK_STATE_REJECTED",
    "incomplete": "TASK_STATE_INPUT_REQUIRED",
    "unknown": "TASK_STATE_UNSPECIFIED",
}
_STATE_NAMES = frozenset({*_STATES.values(), "TASK_STATE_AUTH_REQUIRED"})
#: States after which a task does not change (spec 3.1: terminal, or interrupted).
_ENDED = {
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_INPUT_REQUIRED",
}


class A2AError(Exception):
    """A JSON-RPC error to answer with: its code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _now() -> str:
    return _timestamp(datetime.datetime.now(datetime.timezone.utc).timestamp())


def _timestamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def agent_card(api: RunsApi, base_url: str, *, secured: bool) -> dict[str, Any]:
    """The card of the agent ``api`` serves, its JSON-RPC endpoint under ``base_url``."""
    agent = api.agent
    manifest = getattr(agent, "manifest", None)
    identity = getattr(manifest, "identity", None)
    name = str(getattr(identity, "name", None) or agent.name)
    description = str(getattr(identity, "description", None) or f"The openstarry agent {name}.")
    version = str(getattr(identity, "version", None) or "1.0.0")
    skills = [
        {
            "id": tool.name,
            "name": tool.name,
            "description": tool.description or tool.name,
            "tags": ["tool"],
        }
        for tool in agent.tools.values()
        if tool.name in api.expose_tools
    ] or [
        {
            "id": "chat",
            "name": name,
            "description": description,
            "tags": ["chat"],
        }
    ]
    card: dict[str, Any] = {
        "name": name,
        "description": description,
        "version": version,
        "supportedInterfaces": [
            {
                "url": base_url.rstrip("/") + A2A_PATH,
                "protocolBinding": binding,
                "protocolVersion": VERSION,
            }
            for binding in ("JSONRPC", "HTTP+JSON")
        ],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    }
    if secured:
        card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
        card["securityRequirements"] = [{"schemes": {"bearer": {}}}]
    return card


class _Tasks:
    """What A2A adds to the server's responses: each task's first message and its start."""

    def __init__(self, api: RunsApi) -> None:
        self.api = api
        #: Each task's message (the user's), by response id; forgotten with its response.
        self.messages: dict[str, dict[str, Any]] = {}
        self.started: dict[str, float] = {}
        #: A task resumed after it asked for input goes on in another response: the
        #: response each such task is in now, and the task each such response is.
        self.now_in: dict[str, str] = {}
        self.task_of: dict[str, str] = {}

    def forget_gone(self) -> None:
        records = self.api.records
        for response in [r for r in self.messages if r not in records]:
            del self.messages[response]
            self.started.pop(response, None)
        for response in [r for r in self.task_of if r not in records]:
            task_id = self.task_of.pop(response)
            if self.now_in.get(task_id) == response:
                del self.now_in[task_id]

    def record(self, task_id: object) -> ResponseRecord:
        if not isinstance(task_id, str) or not task_id:
            raise A2AError(INVALID_PARAMS, "params.id: the task's id, a string")
        try:
            return self.api.find(self.now_in.get(task_id, task_id))
        except ApiError:
            raise A2AError(TASK_NOT_FOUND, f"no task {task_id!r} (unknown, or expired)") from None

    def updated(self, record: ResponseRecord) -> float:
        """When the task's status last changed (seconds since the epoch)."""
        final = record.final
        done = final.to_wire().get("completed_at") if final is not None else None
        if isinstance(done, (int, float)):
            return float(done)
        return self.started.get(record.id, 0.0)

    def state(self, record: ResponseRecord) -> str:
        final = record.final
        if final is None:
            return "TASK_STATE_WORKING" if record.last_seq >= 0 else "TASK_STATE_SUBMITTED"
        return _STATES.get(str(final.status), "TASK_STATE_UNSPECIFIED")

    def task(
        self, record: ResponseRecord, *, history: int | None = None, artifacts: bool = True
    ) -> dict[str, Any]:
        """The A2A task of ``record``, as it stands."""
        state = self.state(record)
        final = record.final.to_wire() if record.final is not None else None
        when = (final or {}).get("completed_at") or self.started.get(record.id)
        status: dict[str, Any] = {
            "state": state,
            "timestamp": _timestamp(when) if isinstance(when, (int, float)) else _now(),
        }
        said = _said(final) if final is not None else ""
        error = (final or {}).get("error")
        if isinstance(error, dict) and state in ("TASK_STATE_FAILED", "TASK_STATE_CANCELED"):
            status["message"] = self._agent_message(record, str(error.get("message", "")))
        elif state == "TASK_STATE_INPUT_REQUIRED" and final is not None:
            status["message"] = message = self._agent_message(record, said or "I wait for input.")
            message["parts"].append({"data": _waiting_for(final), "mediaType": "application/json"})
        task_id = self.task_of.get(record.id, record.id)
        task: dict[str, Any] = {"id": task_id, "contextId": record.session_id, "status": status}
        if artifacts and said and state == "TASK_STATE_COMPLETED":
            task["artifacts"] = [_artifact(record.id, said)]
        past = []
        asked = self.messages.get(record.id)
        if asked is not None:
            past.append(asked)
        if said and state == "TASK_STATE_COMPLETED":
            past.append(self._agent_message(record, said))
        if history is None or history > 0:
            task["history"] = past if history is None else past[-history:]
        return task

    def _agent_message(self, record: ResponseRecord, text: str) -> dict[str, Any]:
        return {
            "messageId": f"{record.id}.answer",
            "contextId": record.session_id,
            "taskId": self.task_of.get(record.id, record.id),
            "role": "ROLE_AGENT",
            "parts": [{"text": text}],
        }


def _waiting_for(final: dict[str, Any]) -> dict[str, Any]:
    """What a task in ``TASK_STATE_INPUT_REQUIRED`` waits for, as its status message's data
    part: the approvals (``approval_request_id`` each, with the call) and the client
    tools' calls (``call_id``), and how to answer them."""
    waiting: dict[str, list[Any]] = {"approvals": [], "calls": []}
    waited = (final.get("metadata") or {}).get("waiting_for") or {}
    calls = set(waited.get("function_call") or ())
    for item in final.get("output") or ():
        kind = item.get("type")
        data = next((c.get("data") for c in item.get("content") or () if "data" in c), None)
        if kind == "mcp_approval_request" and isinstance(data, dict):
            waiting["approvals"].append({"approval_request_id": data.get("id"), **data})
        elif kind == "function_call" and isinstance(data, dict) and data.get("call_id") in calls:
            waiting["calls"].append(data)
    return {
        **waiting,
        "answer": "send a message with this taskId whose data parts are "
        '{"approval_request_id": ID, "approve": true|false, "reason"?: TEXT} '
        'or {"call_id": ID, "output": ...}',
    }


def _artifact(task_id: str, text: str) -> dict[str, Any]:
    return {"artifactId": f"{task_id}.answer", "name": "answer", "parts": [{"text": text}]}


def _said(final: dict[str, Any]) -> str:
    """The text the agent said in a response: its assistant messages' text, joined."""
    texts = []
    for item in final.get("output") or ():
        if item.get("type") != "message" or item.get("role") != "assistant":
            continue
        for part in item.get("content") or ():
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return "\n".join(texts)


def _text_of(message: object) -> tuple[str, dict[str, Any]]:
    """The input text of an A2A message (its text parts, and its data parts as JSON), and
    the message as kept in the task's history."""
    if not isinstance(message, dict):
        raise A2AError(INVALID_PARAMS, "params.message: a Message object is required")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise A2AError(INVALID_PARAMS, "params.message.parts: at least one part")
    if len(parts) > MAX_PARTS:
        raise A2AError(INVALID_PARAMS, f"params.message.parts: at most {MAX_PARTS} parts")
    role = message.get("role", "ROLE_USER")
    if role not in ("ROLE_USER", "ROLE_UNSPECIFIED", "user"):
        raise A2AError(INVALID_PARAMS, f"params.message.role: ROLE_USER, not {role!r}")
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise A2AError(INVALID_PARAMS, f"params.message.parts[{i}]: a Part object")
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "data" in part:
            texts.append(json.dumps(part["data"], ensure_ascii=False))
        else:
            raise A2AError(
                INVALID_PARAMS,
                f"params.message.parts[{i}]: this agent reads text and data parts "
                "(not raw bytes or urls)",
            )
    text = "\n".join(texts)
    if not text.strip():
        raise A2AError(INVALID_PARAMS, "params.message: its text is empty")
    message_id = message.get("messageId")
    kept = {
        "messageId": message_id if isinstance(message_id, str) else str(uuid.uuid4()),
        "role": "ROLE_USER",
        "parts": parts,
    }
    return text, kept


def _join_trace(metadata: object) -> None:
    """A message from another agent says in its metadata how many calls deep it is, and
    its trace (spec 004's guard, as over MCP): the run joins that trace at that depth,
    and a message deeper than :data:`MAX_CALL_DEPTH` is refused (a cycle of agents)."""
    if not isinstance(metadata, dict):
        return
    depth, trace = metadata.get(META_DEPTH), metadata.get(META_TRACE)
    if depth is None:
        return
    if isinstance(depth, float) and depth.is_integer():
        depth = int(depth)  # (ProtoJSON carries numbers as doubles)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise A2AError(INVALID_PARAMS, f"metadata[{META_DEPTH!r}]: a whole number >= 1")
    if depth > MAX_CALL_DEPTH:
        raise A2AError(
            RECURSION_LIMIT_EXCEEDED,
            f"call depth {depth} exceeds the limit of {MAX_CALL_DEPTH}"
            + (f" (trace {trace[:64]})" if isinstance(trace, str) else "")
            + ": refused to break a call cycle",
        )
    incoming_depth.set(depth)
    if isinstance(trace, str) and 0 < len(trace) <= 128 and trace.isprintable():
        incoming_trace.set(trace)


def _seconds(value: object) -> float | None:
    """An A2A timestamp (ISO 8601, UTC ``Z`` or an offset) as seconds since the epoch."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and len(value) <= 40:
        try:
            moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None:
                return moment.timestamp()
    raise A2AError(INVALID_PARAMS, "statusTimestampAfter: an ISO 8601 time with Z or an offset")


def _history_length(params: dict[str, Any], where: dict[str, Any] | None = None) -> int | None:
    value = (where if where is not None else params).get("historyLength")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise A2AError(INVALID_PARAMS, "historyLength: a whole number >= 0")
    return value


class A2AMethods:
    """A2A's methods over the server's :class:`RunsApi`, for both bindings: JSON-RPC here, and
    HTTP+JSON (:mod:`openstarry.api.a2a_rest`)."""

    def __init__(self, api: RunsApi) -> None:
        self.api = api
        self.tasks = _Tasks(api)

    def start(self, params: dict[str, Any]) -> ResponseRecord:
        """Start the run of a ``SendMessage``'s message: a new task in its context."""
        text, kept = _text_of(params.get("message"))
        message = params["message"]
        if message.get("taskId") not in (None, ""):
            return self.resume(message["taskId"], message, kept)
        context = message.get("contextId")
        if context is not None and not isinstance(context, str):
            raise A2AError(INVALID_PARAMS, "params.message.contextId: a string")
        _join_trace(message.get("metadata"))
        body = {
            "input": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "session_id": context or f"ctx_{uuid.uuid4()}",
            "stream": False,
        }
        try:
            request = parse_request(json.dumps(body))
            self.api.check_command(text)
            record = self.api.start(request)
        except ProtocolError as exc:
            raise A2AError(INVALID_PARAMS, str(exc)) from None
        except ApiError as exc:
            raise A2AError(INVALID_REQUEST, f"{exc.code}: {exc.message}") from None
        self.tasks.forget_gone()
        self.tasks.messages[record.id] = {
            **kept,
            "contextId": record.session_id,
            "taskId": record.id,
        }
        self.tasks.started[record.id] = datetime.datetime.now(datetime.timezone.utc).timestamp()
        return record

    def resume(self, task_id: str, message: dict[str, Any], kept: dict[str, Any]) -> ResponseRecord:
        """Answer a task that asked for input: its message's data parts answer the
        approvals and client tools it waits for, and it goes on (in another response of
        its session, the same task)."""
        tasks = self.tasks
        record = tasks.record(task_id)
        state = tasks.state(record)
        if state != "TASK_STATE_INPUT_REQUIRED":
            raise A2AError(
                UNSUPPORTED,
                f"task {task_id} is {'still running' if state not in _ENDED else 'over'}"
                f" ({state}): only a task that asks for input takes a message; send one "
                f"without a taskId (in context {record.session_id}) to go on",
            )
        answers = []
        for i, part in enumerate(message["parts"]):
            data = part.get("data")
            if isinstance(data, dict) and "approval_request_id" in data:
                kind = "mcp_approval_response"
            elif isinstance(data, dict) and "call_id" in data:
                kind = "function_call_output"
            else:
                raise A2AError(
                    INVALID_PARAMS,
                    f"params.message.parts[{i}]: an answer to the task is a data part, "
                    '{"approval_request_id": ID, "approve": BOOL} or '
                    '{"call_id": ID, "output": ...}',
                )
            answers.append(
                {"type": kind, "role": "user", "content": [{"type": "data", "data": data}]}
            )
        body = {"input": answers, "session_id": record.session_id, "stream": False}
        try:
            resumed = self.api.start(parse_request(json.dumps(body)))
        except ProtocolError as exc:
            raise A2AError(INVALID_PARAMS, str(exc)) from None
        except ApiError as exc:
            raise A2AError(INVALID_REQUEST, f"{exc.code}: {exc.message}") from None
        tasks.now_in[task_id] = resumed.id
        tasks.task_of[resumed.id] = task_id
        tasks.messages[resumed.id] = {**kept, "contextId": record.session_id, "taskId": task_id}
        tasks.started[resumed.id] = datetime.datetime.now(datetime.timezone.utc).timestamp()
        return resumed

    async def send(self, params: dict[str, Any]) -> dict[str, Any]:
        configuration = params.get("configuration") or {}
        if not isinstance(configuration, dict):
            raise A2AError(INVALID_PARAMS, "params.configuration: an object")
        history = _history_length(params, configuration)
        record = self.start(params)
        if configuration.get("returnImmediately") is not True:
            # A reader while it waits (of no events): a run someone waits for is not
            # one nobody reads, stopped to make room; a caller gone stops it after
            # the reconnect grace, as for the Agent API.
            reader = self.api.attach(record, _NO_EVENTS)
            try:
                await record.wait_done()
            finally:
                self.api.detach(record, reader)
        return {"task": self.tasks.task(record, history=history)}

    def get(self, params: dict[str, Any]) -> dict[str, Any]:
        record = self.tasks.record(params.get("id"))
        return self.tasks.task(record, history=_history_length(params))

    def list(self, params: dict[str, Any]) -> dict[str, Any]:
        size = params.get("pageSize", PAGE_SIZE)
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PAGE_SIZE:
            raise A2AError(INVALID_PARAMS, f"pageSize: 1 to {MAX_PAGE_SIZE}")
        token = params.get("pageToken") or "0"
        if not isinstance(token, str) or not token.isascii() or not token.isdigit():
            raise A2AError(INVALID_PARAMS, "pageToken: a token from an earlier page")
        context, state = params.get("contextId"), params.get("status")
        if state and state not in _STATE_NAMES:
            raise A2AError(INVALID_PARAMS, f"status: one of {', '.join(sorted(_STATE_NAMES))}")
        after = _seconds(params.get("statusTimestampAfter"))
        history = _history_length(params)
        tasks = self.tasks
        records = [
            r
            for r in reversed(self.api.records.values())
            if (not context or r.session_id == context)
            and (not state or tasks.state(r) == state)
            and (after is None or tasks.updated(r) > after)
        ]
        start = int(token[:18])
        page = records[start : start + size]
        more = start + size < len(records)
        artifacts = params.get("includeArtifacts") is True
        return {
            "tasks": [tasks.task(r, history=history, artifacts=artifacts) for r in page],
            "nextPageToken": str(start + size) if more else "",
            "pageSize": len(page),
            "totalSize": len(records),
        }

    async def cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        record = self.tasks.record(params.get("id"))
        if record.done:
            raise A2AError(
                TASK_NOT_CANCELABLE, f"task {record.id} has ended ({self.tasks.state(record)})"
            )
        record.cancel()
        with anyio.move_on_after(10):
            await record.wait_done()
        return self.tasks.task(record)

    async def stream(
        self, record: ResponseRecord, frame: Callable[[dict[str, Any]], bytes]
    ) -> AsyncIterator[bytes]:
        """The events of a task as server-sent events: the task, then its status while it
        works, its answer as it is said (appended), and its last status. ``frame`` makes
        the event of one ``StreamResponse`` (in a JSON-RPC response, or bare)."""
        tasks = self.tasks

        def status(state: str) -> dict[str, Any]:
            task = tasks.task(record, history=0)
            task["status"]["state"] = state
            return {
                "statusUpdate": {
                    "taskId": record.id,
                    "contextId": record.session_id,
                    "status": task["status"],
                }
            }

        yield frame({"task": tasks.task(record)})
        yield frame(status("TASK_STATE_WORKING"))
        answer = _Streamed()

        def update(piece: str, *, append: bool, last: bool = False) -> bytes:
            changed = {
                "taskId": record.id,
                "contextId": record.session_id,
                "artifact": _artifact(record.id, piece),
                "append": append,
            }
            if last:
                changed["lastChunk"] = True
            return frame({"artifactUpdate": changed})

        try:
            async for item in record.frames_after(-1, self.api.limits.heartbeat):
                appended = answer.take(item)
                if appended:
                    yield update(appended, append=len(answer.pieces) > 1)
                elif item.startswith(b":"):
                    yield item  # a keep-alive comment
        except ReaderGone:
            pass  # a reader too far behind: the last update below makes the answer whole
        await record.wait_done()
        said = _said(record.final.to_wire()) if record.final is not None else ""
        completed = tasks.state(record) == "TASK_STATE_COMPLETED"
        if completed and said and "".join(answer.pieces) != said:
            yield update(said, append=False, last=True)  # the whole answer, replacing the pieces
        yield frame(status(tasks.state(record)))


class _Streamed:
    """The answer of a streamed task, as the Agent API's frames say it: the pieces sent.

    A text content item's deltas are pieces as they come; an item said whole (its
    completed value, or a provider that does not stream) adds what no delta of it
    said. Items after the first start on a new line, as the task's artifact joins
    them (:func:`_said`).
    """

    def __init__(self) -> None:
        self.pieces: list[str] = []
        #: The text sent of each content item, by (message id, index).
        self._items: dict[tuple[object, object], str] = {}

    def take(self, frame: bytes) -> str:
        """The piece ``frame`` adds to the answer ("" for none)."""
        content = _text_content(frame)
        if content is None:
            return ""
        item = (content.get("msg_id"), content.get("index"))
        text: str = content["text"]
        before = self._items.get(item)
        if content.get("delta") is True:
            so_far = (before or "") + text
        else:  # the item's whole text so far
            so_far = text
            text = text[len(before) :] if before is not None and text.startswith(before) else ""
            if before is None:
                text = so_far
        self._items[item] = so_far
        if not text:
            return ""
        if before is None and self.pieces:
            text = "\n" + text
        self.pieces.append(text)
        return text


def _text_content(frame: bytes) -> dict[str, Any] | None:
    """A frame of the Agent API that is a text content item (a delta or a whole value)."""
    _, sep, data = frame.partition(b"\ndata: ")
    if not sep:
        return None
    try:
        event = json.loads(data)
    except ValueError:
        return None
    if (
        isinstance(event, dict)
        and event.get("object") == "content"
        and event.get("type") == "text"
        and isinstance(event.get("text"), str)
    ):
        return event
    return None


def _error(request_id: object, code: int, message: str) -> Response:
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return Response(json.dumps(body).encode(), media_type="application/json")


def _result(request_id: object, result: dict[str, Any]) -> Response:
    body = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return Response(json.dumps(body, ensure_ascii=False).encode(), media_type="application/json")


def check_version(request: Request) -> None:
    """Refuse a request that names another A2A version than 1.0 (``A2A-Version``, a header
    or the query parameter). One that names none is taken for 1.0: a 0.3 client calls
    methods by 0.3's names (``message/send``), which are not found here.

    Raises:
        A2AError: ``VERSION_NOT_SUPPORTED``.
    """
    version = request.headers.get("a2a-version") or request.query_params.get("A2A-Version", "")
    if version.strip() and version.strip().split(".")[0] != VERSION.split(".")[0]:
        raise A2AError(
            VERSION_NOT_SUPPORTED,
            f"this server speaks A2A {VERSION}, not {version[:20]!r}: "
            f"send the header A2A-Version: {VERSION}",
        )


def a2a_routes(rpc: A2AMethods, *, secured: bool) -> list[BaseRoute]:
    """The card and the JSON-RPC endpoint of A2A, over the server's runs (``rpc``); the
    HTTP+JSON binding is :func:`openstarry.api.a2a_rest.rest_routes`."""
    api = rpc.api

    async def card(request: Request) -> Response:
        body = agent_card(api, str(request.base_url), secured=secured)
        return Response(json.dumps(body).encode(), media_type="application/json")

    async def endpoint(request: Request) -> Response:
        request_id: object = None
        try:
            check_version(request)
            check_content_type(request)
            body = await read_body(request, api.limits.max_body_bytes, api.limits.body_timeout)
            try:
                call = json.loads(body)
            except ValueError:
                raise A2AError(PARSE_ERROR, "the body is not JSON") from None
            if not isinstance(call, dict):
                raise A2AError(INVALID_REQUEST, "a JSON-RPC request is an object (no batches)")
            request_id = call.get("id")
            if isinstance(request_id, (dict, list, bool)) or (
                isinstance(request_id, str) and len(request_id) > 200
            ):
                request_id = None
                raise A2AError(INVALID_REQUEST, "id: a string or a number")
            method, params = call.get("method"), call.get("params", {})
            if call.get("jsonrpc") != "2.0" or not isinstance(method, str):
                raise A2AError(
                    INVALID_REQUEST, 'a JSON-RPC 2.0 request: "jsonrpc": "2.0", "method"'
                )
            if not isinstance(params, dict):
                raise A2AError(INVALID_PARAMS, "params: an object")
            if method == "SendMessage":
                return _result(request_id, await rpc.send(params))
            if method == "SendStreamingMessage":
                return events(rpc.stream(rpc.start(params), _framer(request_id)))
            if method == "GetTask":
                return _result(request_id, rpc.get(params))
            if method == "ListTasks":
                return _result(request_id, rpc.list(params))
            if method == "CancelTask":
                return _result(request_id, await rpc.cancel(params))
            if method == "SubscribeToTask":
                record = rpc.tasks.record(params.get("id"))
                if record.done:
                    raise A2AError(UNSUPPORTED, f"task {record.id} has ended: GetTask tells how")
                return events(rpc.stream(record, _framer(request_id)))
            if method == "GetExtendedAgentCard":
                raise A2AError(UNSUPPORTED, "this agent has no extended card")
            if method.endswith("TaskPushNotificationConfig") or method.endswith(
                "TaskPushNotificationConfigs"
            ):
                raise A2AError(PUSH_NOT_SUPPORTED, "this agent sends no push notifications")
            raise A2AError(METHOD_NOT_FOUND, f"no method {method[:100]!r} (A2A {VERSION})")
        except A2AError as exc:
            return _error(request_id, exc.code, exc.message)
        except ApiError as exc:  # the body's size, time or type
            return _error(request_id, INVALID_REQUEST, f"{exc.code}: {exc.message}")

    return [
        Route(CARD_PATH, card, methods=["GET"]),
        Route(A2A_PATH, endpoint, methods=["POST"]),
    ]


def _framer(request_id: object) -> Callable[[dict[str, Any]], bytes]:
    """The server-sent event of a ``StreamResponse``, in a JSON-RPC response."""

    def frame(result: dict[str, Any]) -> bytes:
        body = {"jsonrpc": "2.0", "id": request_id, "result": result}
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    return frame


def events(stream: AsyncIterator[bytes]) -> Response:
    """A response of server-sent events."""
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
