"""The HTTP server's runs: which may start, where their events go, and how they are stopped.

:class:`RunsApi` is the server's state, one per application: the agent, the
responses kept for reconnects (each a :class:`~openstarry.api.replay._Record`),
the session each run is busy in, and the task group the runs live in. It
decides whether a request may run now (one run per session, at most
``max_concurrent_runs``, a slash command only for an exposed tool) and refuses
with an :class:`ApiError` otherwise; it drives a run into its record; it stops
a run nobody has come back to within ``resume_grace``, or the oldest unread one
to make room; and it is the runs' part of a graceful shutdown
(:meth:`RunsApi.drain`, which :func:`openstarry.api.server.serve` calls before the
connections close).

It knows nothing of HTTP beyond the status codes of its refusals:
:mod:`openstarry.api.routes` turns requests into its calls, and
:mod:`openstarry.api.streams` sends a record's events on a connection.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from openstarry.agent.commands import BUILTIN_COMMANDS, find_tool, parse_line
from openstarry.api.adapter import open_run
from openstarry.api.models import AgentRequest, AgentResponse, Error, RunStatus
from openstarry.api.replay import ResponseRecord
from openstarry.bus import describe_exception
from openstarry.tools import tool_name

if TYPE_CHECKING:
    from openstarry.agent.runtime import Agent
    from openstarry.api.limits import ServerLimits

# The server's log, under the name it had when the server was one module.
log = logging.getLogger("openstarry.api.server")

_RESPONSE_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")


#: The error of a response the shutdown stopped.
_SHUTDOWN = Error(code="shutdown", message="the server shut down before the run ended")


class ApiError(Exception):
    """A request refused with ``status`` and an :class:`Error` body."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


class RunsApi:
    """The server's state: the agent, the responses kept, and the runs' task group."""

    def __init__(
        self, agent: Agent, limits: ServerLimits, expose_tools: Collection[str] | None = None
    ) -> None:
        self.agent = agent
        self.limits = limits
        self.records: OrderedDict[str, ResponseRecord] = OrderedDict()
        #: The response running in each busy session.
        self.sessions: dict[str, str] = {}
        self.running = 0
        #: Runs stopped to make room that have not ended yet (not counted against the cap).
        self.evicted = 0
        self.task_group: anyio.abc.TaskGroup | None = None
        #: Set once the server is shutting down: no new run starts.
        self.draining = False
        manifest = getattr(agent, "manifest", None)
        if expose_tools is None:
            api_config = getattr(manifest, "api", None)
            expose_tools = getattr(api_config, "expose_tools", None) or ()
        mcp_config = getattr(manifest, "mcp", None)
        private = set(getattr(mcp_config, "private_tools", None) or ())
        private_names = {tool_name(entry) for entry in private}
        #: The tools a slash command over HTTP may run (never a private one).
        self.expose_tools = frozenset(
            name for name in map(tool_name, expose_tools) if name not in private_names
        )

    # -- records ---------------------------------------------------------

    def _purge(self) -> None:
        now = time.monotonic()
        ttl = self.limits.response_ttl
        for key in [
            key
            for key, record in self.records.items()
            if record.done and record.finished_at is not None and now - record.finished_at > ttl
        ]:
            del self.records[key]
        excess = len(self.records) - self.limits.max_responses + 1
        if excess > 0:
            finished = [key for key, record in self.records.items() if record.done]
            for key in finished[:excess]:
                del self.records[key]

    def find(self, response_id: str) -> ResponseRecord:
        self._purge()
        record = self.records.get(response_id)
        if record is None:
            raise ApiError(
                404,
                "response_not_found",
                f"no response {response_id!r} is kept here (unknown, or expired)",
            )
        return record

    def attach(self, record: ResponseRecord, after: int) -> object:
        """A new reader of ``record``, at sequence number ``after``; its token."""
        token = object()
        record.cursors[token] = after
        return token

    def detach(self, record: ResponseRecord, token: object) -> None:
        """A reader has gone: the last one leaving starts the grace period."""
        record.cursors.pop(token, None)
        record.trim()
        if record.readers > 0 or record.done:
            return
        record.detach_epoch += 1
        grace = self.limits.resume_grace
        if grace == 0 or self.task_group is None:
            record.cancel()
        else:
            self.task_group.start_soon(self._cancel_later, record, record.detach_epoch, grace)

    async def _cancel_later(self, record: ResponseRecord, epoch: int, grace: float) -> None:
        await anyio.sleep(grace)
        if record.readers == 0 and record.detach_epoch == epoch and not record.done:
            log.info("response %s: nobody reconnected within %g s; stopping it", record.id, grace)
            record.cancel()

    # -- runs ------------------------------------------------------------

    def check_command(self, text: str) -> None:
        """Refuse a slash command that would run a tool not in ``api.expose_tools``."""
        command = parse_line(text)
        if command is None or command.is_builtin:
            return
        tool = find_tool(command.name, self.agent.loop.tools)
        if tool is None or tool.name not in self.expose_tools:
            allowed = ", ".join(f"/{name}" for name in sorted(self.expose_tools)) or "none"
            raise ApiError(
                403,
                "command_not_allowed",
                f"/{command.name} is not a command callers over HTTP may run; built-ins: "
                f"{', '.join('/' + c for c in BUILTIN_COMMANDS)}; tools: {allowed} "
                "(the manifest's api.expose_tools)",
            )

    def _make_room(self) -> bool:
        """At the run cap, stop the oldest run nobody reads (waiting out its
        reconnect grace) so a new request can take its place; whether one was."""
        for record in self.records.values():
            if not record.done and record.readers == 0 and not record.evicted:
                log.info("response %s: nobody reads it; stopped to make room", record.id)
                record.evicted = True
                self.evicted += 1
                record.stop_reason = Error(
                    code="evicted",
                    message="stopped to make room for a new run: nobody was reading it",
                )
                record.cancel()
                return True
        return False

    def start(self, request: AgentRequest) -> ResponseRecord:
        """Check that the request may run now, and start its run."""
        task_group = self.task_group
        if task_group is None or self.draining:
            raise ApiError(
                503,
                "shutting_down" if self.draining else "unavailable",
                "the server is shutting down"
                if self.draining
                else "the server is not running its agent",
            )
        self._purge()
        session_id = request.session_id or f"session_{uuid.uuid4()}"
        busy = self.sessions.get(session_id)
        if busy is not None:
            raise ApiError(
                409,
                "session_busy",
                f"session {session_id!r} is running response {busy}; "
                f"resume it with GET /process/{busy} or wait until it ends",
            )
        response_id = request.response_id or f"response_{uuid.uuid4()}"
        if not _RESPONSE_ID.fullmatch(response_id):
            raise ApiError(
                422,
                "invalid_request",
                "response_id: 1 to 200 letters, digits, '_', '-' or '.' "
                "(it goes into SSE ids and headers)",
            )
        if response_id in self.records:
            raise ApiError(
                409,
                "response_exists",
                f"response {response_id!r} exists; resume it with GET /process/{response_id}",
            )
        if self.running - self.evicted >= self.limits.max_concurrent_runs and not self._make_room():
            raise ApiError(
                503,
                "too_many_runs",
                f"the server is running {self.running} requests, its limit; retry shortly",
                headers={"retry-after": "1"},
            )
        request = request.model_copy(update={"session_id": session_id})
        record = ResponseRecord(response_id, session_id, self.limits)
        self.records[response_id] = record
        self.sessions[session_id] = response_id
        self.running += 1
        task_group.start_soon(self._drive, record, request, name=f"openstarry.api {response_id}")
        return record

    async def _drive(self, record: ResponseRecord, request: AgentRequest) -> None:
        try:
            async with open_run(self.agent, request, response_id=record.id) as run:
                record.run = run
                if record.cancel_requested:
                    run.cancel()
                async for event in run:
                    seq = event.sequence_number
                    assert seq is not None
                    if isinstance(event, AgentResponse):
                        event = record.with_stop_reason(event)
                    record.append(seq, event.wire_json())
                if not record.done:  # (the shutdown may have ended it already)
                    record.final = run.final and record.with_stop_reason(run.final)
        except Exception as exc:
            log.exception("response %s: the run failed", record.id)
            # Every stream ends with a terminal event, even this one.
            record.final = AgentResponse(
                id=record.id,
                session_id=record.session_id,
                status=RunStatus.Failed,
                error=Error(code="internal_error", message=describe_exception(exc)),
                output=[],
                sequence_number=record.last_seq + 1,
            )
            record.append(record.last_seq + 1, record.final.wire_json())
        finally:
            record.run = None
            record.finish()
            self.running -= 1
            if record.evicted:
                self.evicted -= 1
            if self.sessions.get(record.session_id) == record.id:
                del self.sessions[record.session_id]

    async def stop_all(self) -> None:
        for record in list(self.records.values()):
            if not record.done:
                record.cancel()

    async def drain(self, grace: float, stop_wait: float = 5.0) -> None:
        """Shut down gracefully: refuse new runs, give the runs ``grace`` seconds,
        then stop them, and wait until every open stream has been sent its end.

        A run that does not end within ``stop_wait`` seconds of being stopped is
        ended here: its response ends ``canceled`` with an error saying why.
        """
        self.draining = True
        pending = [record for record in self.records.values() if not record.done]
        if pending:
            log.info("shutting down: %d run(s) in progress get %g s to finish", len(pending), grace)
        with anyio.move_on_after(grace):
            for record in pending:
                await record.wait_done()
        left = [record for record in pending if not record.done]
        for record in left:
            log.info("response %s: stopped by the shutdown", record.id)
            record.stop_reason = _SHUTDOWN
            record.cancel()
        with anyio.move_on_after(stop_wait):
            for record in left:
                await record.wait_done()
        for record in left:
            if not record.done:
                record.end_now(RunStatus.Canceled, _SHUTDOWN)
        # The streams end once their readers have been sent the final event.
        with anyio.move_on_after(stop_wait):
            while any(record.readers for record in pending):
                await anyio.sleep(0.02)
