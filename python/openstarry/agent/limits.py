"""The limits of a run: rounds, timeouts, concurrency, failure streaks, queued inputs, sessions.

They are the manifest's ``limits`` (seconds for timeouts). Every bound that
protects the process is here, checked once when the limits are made.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoopLimits"]


@dataclass(frozen=True, slots=True)
class LoopLimits:
    """The limits of a run; the manifest's ``limits`` (seconds for timeouts)."""

    max_tool_rounds: int = 10
    tool_timeout: float = 30.0
    provider_timeout: float = 120.0
    max_concurrent_tools: int = 4
    #: Failed tool calls in a row (across rounds and inputs) that lock the session.
    max_failure_streak: int = 5
    #: Identical failing calls in a row that add a warning observation.
    repeated_failure_warning: int = 3
    #: Inputs that may wait behind a session's run; more are refused with ``KERNEL:ERROR``
    #: (on the local bus: a worker of a remote bus answers every input it fetched,
    #: and its backend bounds how many it holds, ``max_held``).
    max_pending_inputs: int = 64
    #: Sessions kept; past it the least recently used idle one is forgotten.
    max_sessions: int = 10_000
    #: Seconds a call that needs approval waits for a yes; unanswered, it is denied.
    approval_timeout: float = 300.0
    #: Seconds a client tool's call waits for the output its client runs.
    client_timeout: float = 600.0

    def __post_init__(self) -> None:
        for name in (
            "max_tool_rounds",
            "max_concurrent_tools",
            "max_failure_streak",
            "max_pending_inputs",
            "max_sessions",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.repeated_failure_warning < 2:
            raise ValueError("repeated_failure_warning must be at least 2")
        for name in ("tool_timeout", "provider_timeout", "approval_timeout", "client_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
