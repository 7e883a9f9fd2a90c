"""The bounds that protect ``openstarry serve``: one frozen dataclass, :class:`ServerLimits`.

Every limit of the HTTP server is a field here, checked when it is made, so a
server cannot start with a bound that makes no sense. The parts of the server
read them where they apply: :mod:`openstarry.api.runs` (runs at once, responses
kept, the reconnect grace, the shutdown's grace), :mod:`openstarry.api.replay`
(what is kept of a response's events for reconnects),
:mod:`openstarry.api.streams` (heartbeats), :mod:`openstarry.api.routes` (the
size and time of a request body), and :func:`openstarry.api.server.serve`
(connections, the time of a request's head). It needs no HTTP package:
``openstarry serve``'s options build one before the server is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerLimits"]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The bounds that protect the server; every one is per server unless it says otherwise.

    Attributes:
        max_body_bytes: The largest request body read; a larger one gets 413.
        max_concurrent_runs: Runs at once; more get 503.
        resume_grace: Seconds a run goes on after its last reader disconnected,
            waiting for a reconnect; then it is stopped. 0 stops it at once.
        replay_events: Events kept per response for reconnects (the oldest go first).
        replay_bytes: Bytes of events kept per response.
        max_responses: Responses kept for reconnects (the oldest finished go first).
        response_ttl: Seconds a finished response is kept for reconnects.
        heartbeat: Seconds of silence after which a stream sends an SSE comment,
            so idle connections stay open and dead ones are noticed.
        max_connections: Connections :func:`serve` holds at once. At the limit
            a new connection closes the one that has waited longest for its
            request head (so ``/health`` is still answered under a flood of
            slow clients), or gets ``503`` when every connection is busy.
        max_connections_per_address: Connections at once from one client
            address; more get ``429``. Behind a reverse proxy every client has
            the proxy's address: raise it there.
        header_timeout: Seconds a connection may take to send a request's head
            (its request line and headers); then ``408`` and it is closed.
        body_timeout: Seconds a request's body may take to arrive; then ``408``.
        max_unsent_bytes: Bytes of events a connected reader may fall behind
            by before it is cut off (a reader that keeps up is never cut, however
            large an event is: the replay bounds only limit what is kept for
            reconnects).
        shutdown_grace: Seconds the runs in progress get to finish when the
            server is asked to stop (SIGTERM, SIGINT); then they are stopped and
            end ``canceled``.
        signin_ttl: Seconds a console sign-in lasts (with an API key): its
            session cookie expires then, and the page asks for the key again.
    """

    max_body_bytes: int = 1024 * 1024
    max_concurrent_runs: int = 32
    resume_grace: float = 10.0
    replay_events: int = 10_000
    replay_bytes: int = 2 * 1024 * 1024
    max_responses: int = 64
    response_ttl: float = 300.0
    heartbeat: float = 15.0
    max_connections: int = 4096
    max_connections_per_address: int = 256
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_unsent_bytes: int = 256 * 1024 * 1024
    shutdown_grace: float = 10.0
    signin_ttl: float = 12 * 3600.0

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_concurrent_runs",
            "replay_events",
            "replay_bytes",
            "max_responses",
            "max_connections",
            "max_connections_per_address",
            "max_unsent_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_responses < self.max_concurrent_runs:
            raise ValueError("max_responses must be at least max_concurrent_runs")
        for name in ("resume_grace", "shutdown_grace"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)}")
        for name in ("response_ttl", "heartbeat", "header_timeout", "body_timeout", "signin_ttl"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
