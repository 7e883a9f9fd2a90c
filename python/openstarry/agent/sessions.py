"""Sessions: each one's memory, its queue of inputs, and the worker that serves them.

Rules the scheduler keeps:

- **One run at a time per session, in order.** A session's inputs wait in its
  queue (at most ``max_pending_inputs``; more are refused, except on a remote
  bus, whose backend bounds what a worker holds) and one worker task
  serves them one after the other; sessions never wait for each other.
- **Workers are parked, not restarted.** After its last input a worker waits,
  idle, for the session's next one: waking it costs a signal, where a new task
  (and a timer to end a lingering one) would cost more on every turn. Parked
  workers are bounded (``_MAX_IDLE_WORKERS``): past it the one idle the longest
  is woken with nothing to do, and exits.
- **One cancel scope per worker, not per run.** A worker serves its runs in
  one scope, which a ``/stop`` or a provider deadline cancels; the stopped run
  is then finished outside it and the worker enters a new one. A scope
  cancelled after its run had ended is left before the next run starts.
- **Sessions are bounded.** Past ``max_sessions`` the least recently used idle
  session is forgotten, a locked one only when no other can be; a busy session
  is never forgotten.
- **Stateless runs leave nothing.** A session made for one stateless run
  (``ask(session_id=None)``) is forgotten when its run ends, or when its
  input is refused before it runs; until then it counts as any other.
- **A free session is served by its asker.** An ``ask`` whose input finds
  its session free (no run, nothing queued) serves that input in the asking
  task (:meth:`Sessions.serve_here`): no worker is woken, and the asker is
  not woken again when the run ends. Meanwhile the session is busy as with
  a worker: later inputs queue, and once the run has ended its worker (woken,
  or started) serves them. Cancelling the asker stops its run, as ``/stop``
  would.
- **A stop is at once.** :meth:`Sessions.stop` drops the queued inputs (their
  waiters hear "stopped") and cancels the run in progress; the session stays
  usable.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from openstarry.agent.memory import Memory, Session
from openstarry.agent.results import Waiters
from openstarry.agent.taskscope import (
    CancelScopeLike,
    RunScope,
    new_run_scope,
    scope_factory,
)
from openstarry.bus import Signal
from openstarry.core import Event, EventRef

__all__ = ["CancelScopeLike", "SessionRuntime", "Sessions", "scope_factory"]


#: Seconds a run served by its asker, stopped, may wait for room on the bus to
#: say so when its asker has been cancelled.
_FINISH_GRACE = 10.0

#: Workers kept waiting for their session's next input; past it the one idle
#: the longest exits (its session starts a new worker when it needs one).
_MAX_IDLE_WORKERS = 256


class SessionRuntime:
    """The scheduler's private state of one session."""

    __slots__ = (
        "cancelled",
        "deadline",
        "enter_scope",
        "ephemeral",
        "epoch",
        "failure_key",
        "failure_repeats",
        "idle",
        "live_scope",
        "pending",
        "running",
        "scope",
        "served_here",
        "serving",
        "session",
        "stop_requested",
        "stopped_turn",
        "wake",
    )

    def __init__(self, session: Session) -> None:
        self.session = session
        self.pending: deque[Event] = deque()
        #: A worker task serves this session (it stays, idle, after its last input).
        self.running = False
        #: The worker waits on ``wake`` for more input; ``idle`` says it is waiting.
        self.idle = False
        self.wake: Signal | None = None
        #: The cancel scope of the run in progress, and whether it was cancelled
        #: (by a stop or the provider deadline; read where a scope's own
        #: ``cancel_called`` costs a clock read, on trio).
        self.scope: CancelScopeLike | None = None
        self.cancelled = False
        #: The id of the input being served, and whether its asker serves it
        #: in its own task (:meth:`Sessions.serve_here`).
        self.serving: str | None = None
        self.served_here = False
        #: The worker's cancel scope, which its runs are served in: one scope
        #: for every run until one is cancelled, not one per run.
        self.live_scope: CancelScopeLike | None = None
        #: While a run served in its asker's task has not entered its scope
        #: (:class:`~openstarry.agent.taskscope.RunScope`): what enters it,
        #: called before code that may enter scopes of its own and wait.
        self.enter_scope: Callable[[], None] | None = None
        #: The run that the scope's cancellation stopped, for the worker to finish.
        self.stopped_turn: Any = None
        #: The deadline of the provider call in progress, while the loop's watcher watches it.
        self.deadline = math.inf
        #: A session for one stateless run: forgotten once its inputs are served.
        self.ephemeral = False
        self.stop_requested = False
        #: Bumped by /reset: a run that started before it leaves memory alone.
        self.epoch = 0
        #: The last failing call (name, arguments) and how many times in a row it failed.
        self.failure_key: tuple[str, str] | None = None
        self.failure_repeats = 0

    @property
    def free(self) -> bool:
        """No run in progress and nothing queued: an asker may serve its input itself."""
        return not self.pending and (self.idle or not self.running)


def _cancel_run(rt: SessionRuntime, waiters: Waiters) -> None:
    """Cancel the run the session is serving, if any.

    Its turn's scope; or, before its turn has begun (its session still
    loading from a store), the scope it is served in, its input ending
    stopped there and then.
    """
    if rt.scope is not None:
        rt.stop_requested = rt.cancelled = True
        rt.scope.cancel()
    elif rt.serving is not None and rt.live_scope is not None:
        rt.stop_requested = rt.cancelled = True
        waiters.stop(rt.serving)
        rt.live_scope.cancel()


class Sessions:
    """The sessions of one loop and their workers.

    Args:
        serve: Runs one input of a session to its end (the loop's run).
        waiters: Where the inputs that are waited for are finished when dropped.
        memory_window: User turns each session's memory keeps (``None``: all).
        max_sessions: Sessions kept at most.
        max_pending_inputs: Inputs that may wait behind a session's run (``None``:
            no bound of its own, on a remote bus: the inputs a worker fetched
            are its own to answer, and the backend bounds how many it holds).
        release: Told when a queued input is dropped: ``release(event, handled=...)``,
            ``handled=False`` when the loop is leaving (the input is handed back
            to a remote bus, to run elsewhere).
    """

    def __init__(
        self,
        serve: Callable[[SessionRuntime, Event | EventRef, str | None], Coroutine[Any, Any, None]],
        waiters: Waiters,
        *,
        memory_window: int | None,
        max_sessions: int,
        max_pending_inputs: int | None,
        release: Callable[..., None] | None = None,
    ) -> None:
        self._serve = serve
        self._release = release
        self._waiters = waiters
        self.memory_window = memory_window
        self.max_sessions = max_sessions
        self.max_pending_inputs = max_pending_inputs
        self._by_id: OrderedDict[str, SessionRuntime] = OrderedDict()
        # Workers waiting for input, the longest idle first.
        self._idle_workers: dict[SessionRuntime, None] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._new_signal: Callable[[], Signal] = anyio.Event
        self._new_scope: Callable[[], CancelScopeLike] = anyio.CancelScope
        #: The scope of a run served in its asker's task (serve_here).
        self._here_scope: Callable[[], RunScope] = partial(RunScope, anyio.CancelScope)
        self._closing = False
        # Workers alive (tasks, and askers serving their input), and the
        # signal their count reaching 0 sets while closing.
        self._workers = 0
        self._workers_gone: Signal | None = None

    # -- lifecycle -------------------------------------------------------

    def open(
        self,
        task_group: anyio.abc.TaskGroup,
        new_signal: Callable[[], Signal],
        new_scope: Callable[[], CancelScopeLike] = anyio.CancelScope,
    ) -> None:
        """Start serving: workers are started in ``task_group``."""
        self._task_group = task_group
        self._new_signal = new_signal
        self._new_scope = new_scope
        self._here_scope = new_run_scope()
        self._closing = False
        self._workers_gone = new_signal()

    def close(self) -> None:
        """Stop every run and drop every queued input; the workers then exit."""
        self._closing = True
        for rt in list(self._by_id.values()):
            self.stop(rt)
            if rt.idle:
                self._unpark(rt)
            if rt.ephemeral and not rt.running:
                del self._by_id[rt.session.id]  # a stateless input that never ran

    async def wait_closed(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the workers to exit after :meth:`close`."""
        if self._workers and self._workers_gone is not None:
            with anyio.move_on_after(timeout):
                await self._workers_gone.wait()
        self._task_group = None

    # -- lookup ----------------------------------------------------------

    def get(self, session_id: str) -> SessionRuntime:
        """The session of that id, created empty on first use (forgetting an idle one if full)."""
        by_id = self._by_id
        rt = by_id.get(session_id)
        if rt is None:
            while len(by_id) >= self.max_sessions and self._evict_idle():
                pass
            rt = SessionRuntime(Session(session_id, Memory(self.memory_window)))
            by_id[session_id] = rt
        else:
            by_id.move_to_end(session_id)
        return rt

    def discard_ephemeral(self, session_id: str) -> None:
        """Forget the session if it is ephemeral and has nothing to serve (its input never ran)."""
        rt = self._by_id.get(session_id)
        if rt is not None and rt.ephemeral and not rt.running and not rt.pending:
            del self._by_id[session_id]

    def find(self, session_id: str) -> SessionRuntime | None:
        """The session of that id if it exists; a lookup creates nothing."""
        return self._by_id.get(session_id)

    @property
    def sessions(self) -> Mapping[str, Session]:
        return {key: rt.session for key, rt in self._by_id.items()}

    def _evict_idle(self) -> bool:
        """Forget the least recently used idle session, sparing locked ones if it can.

        Returns whether one was forgotten (none is when every session is busy).
        """
        # Walk from the least recently used and stop at the first unlocked idle
        # session: a new session costs O(1) however many there are (only the
        # busy and locked ones at the front are stepped over).
        victim: str | None = None
        for key, rt in self._by_id.items():
            if (rt.idle or not rt.running) and not rt.pending:
                if not rt.session.locked:
                    victim = key
                    break
                if victim is None:
                    victim = key  # a locked one, if no other can go
        if victim is None:
            return False
        rt = self._by_id.pop(victim)
        if rt.idle:
            self._unpark(rt)
        return True

    # -- scheduling ------------------------------------------------------

    def enqueue(self, event: Event) -> int | None:
        """Queue an input for its session's worker, starting or waking it.

        Returns:
            ``None`` when queued; the number of inputs already waiting when the
            session's queue is full and the input is refused.
        """
        rt = self.get(event.session_id)
        limit = self.max_pending_inputs
        if limit is not None and len(rt.pending) >= limit:
            return len(rt.pending)
        rt.pending.append(event)
        if rt.idle:
            self._unpark(rt)
        elif not rt.running:
            task_group = self._task_group
            if task_group is None:
                raise RuntimeError(
                    "the ExecutionLoop is not running: use `async with ExecutionLoop(...)`"
                )
            rt.running = True
            self._workers += 1
            task_group.start_soon(self._worker, rt)
        return None

    def claim(self, rt: SessionRuntime) -> bool:
        """Take a free session (:attr:`SessionRuntime.free`) for the caller to serve one input.

        The session is then busy as with a worker: later inputs queue. Returns
        whether its worker was parked (it stays parked until the session is
        handed back by :meth:`serve_here`, which must follow).
        """
        parked = rt.idle
        if parked:
            self._idle_workers.pop(rt, None)
            rt.idle = False
        rt.running = True
        self._workers += 1
        return parked

    async def serve_here(
        self,
        rt: SessionRuntime,
        parked: bool,
        event: Event | EventRef,
        text: str | None = None,
        at_once: bool = False,
    ) -> None:
        """Serve ``event``, the input of a session the caller :meth:`claim`-ed, in the calling task.

        ``text`` is the input's text when ``event`` is an ``EventRef`` (an
        input taken without being made, ``Emitter.take_ref``).

        The run is served as a worker serves it, in a cancel scope of its own
        that a ``/stop`` or the provider deadline cancels. A cancellation of
        the caller stops the run as ``/stop`` would: its open calls are
        answered and it ends stopped, before the cancellation goes on. Then
        the session is handed back: to its parked worker, or to a new one when
        inputs came meanwhile.

        ``at_once``: the provider completes at once (or waits first at a plain
        checkpoint) and no store is read: the scope is entered only when the
        run first waits (:class:`~openstarry.agent.taskscope.RunScope`), and
        before any tool call that can wait (``rt.enter_scope``).
        """
        worker_scope = rt.live_scope
        rt.serving = event.id
        rt.served_here = True
        try:
            try:
                with self._here_scope() as scope:
                    rt.live_scope = scope
                    run = self._serve(rt, event, text)
                    if at_once:
                        rt.enter_scope = scope.enter
                        rest = scope.serve(run)
                        if rest is not None:
                            await rest
                    else:
                        scope.enter()
                        await run
            finally:
                rt.enter_scope = None
                rt.live_scope = worker_scope
                rt.serving = None
                rt.served_here = False
                stopped, rt.stopped_turn = rt.stopped_turn, None
                if stopped is not None:
                    # Stopped by /stop or its deadline, or its caller was cancelled:
                    # finished even so, unless the bus has no room for that long.
                    with anyio.move_on_after(_FINISH_GRACE, shield=True):
                        await stopped.finish_stopped()
        finally:
            # The session handed back: to its worker, or free.
            self._workers -= 1
            if self._closing and not self._workers and self._workers_gone is not None:
                self._workers_gone.set()
            kept = self._by_id.get(rt.session.id) is rt
            if parked:
                if rt.pending or self._closing or not kept:
                    self._unpark(rt)  # it serves what came meanwhile, or exits
                else:
                    rt.idle = True
                    idle = self._idle_workers
                    idle[rt] = None
                    if len(idle) > _MAX_IDLE_WORKERS:
                        self._unpark(next(iter(idle)))
            elif rt.pending and kept and not self._closing and self._task_group is not None:
                self._workers += 1
                self._task_group.start_soon(self._worker, rt)
            else:
                rt.running = False
                if rt.ephemeral and kept and not rt.pending:
                    del self._by_id[rt.session.id]

    def stop_input(self, event: Event) -> None:
        """Stop one input: dropped from its session's queue, or its run cancelled.

        Nothing happens when the input has already ended, or has not yet
        reached its session (it still waits on the bus).
        """
        rt = self._by_id.get(event.session_id)
        if rt is None:
            return
        if rt.serving == event.id:
            _cancel_run(rt, self._waiters)
            return
        try:
            rt.pending.remove(event)
        except ValueError:
            return
        self._waiters.stop(event.id)
        if self._release is not None:
            self._release(event, handled=True)
        if rt.ephemeral and not rt.running and not rt.pending:
            del self._by_id[rt.session.id]

    def stop(self, rt: SessionRuntime) -> int:
        """Drop the session's queued inputs and cancel its run; returns how many were dropped."""
        dropped = len(rt.pending)
        release = self._release
        for waiting in rt.pending:
            self._waiters.stop(waiting.id)
            if release is not None:
                release(waiting, handled=not self._closing)
        rt.pending.clear()
        _cancel_run(rt, self._waiters)
        return dropped

    def reset(self, rt: SessionRuntime) -> None:
        """Stop the session and clear its memory, failure streak and lock."""
        self.stop(rt)
        rt.epoch += 1
        rt.session.memory.clear()
        rt.session.failure_streak = 0
        rt.session.locked = False
        rt.failure_key, rt.failure_repeats = None, 0

    def quit(self, session_id: str) -> None:
        """Stop the session and forget it."""
        rt = self._by_id.pop(session_id, None)
        if rt is not None:
            self.stop(rt)
            if rt.idle:
                self._unpark(rt)  # with nothing pending, the worker exits

    async def _worker(self, rt: SessionRuntime) -> None:
        """Serve the session's inputs one after the other, then wait, idle, for more."""
        try:
            while True:
                # One scope for the runs until one of them is cancelled (a
                # /stop, a provider deadline): then it is left, the stopped run
                # finished outside it, and a new one entered.
                with self._new_scope() as scope:
                    rt.live_scope = scope
                    if await self._serve_until_idle(rt, scope):
                        return
                rt.live_scope = None
                stopped, rt.stopped_turn = rt.stopped_turn, None
                if stopped is not None:
                    await stopped.finish_stopped()
        finally:
            self._idle_workers.pop(rt, None)
            rt.running = False
            rt.idle = False
            rt.scope = None
            self._workers -= 1
            if self._closing and not self._workers and self._workers_gone is not None:
                self._workers_gone.set()

    async def _serve_until_idle(self, rt: SessionRuntime, scope: CancelScopeLike) -> bool:
        """Serve the pending inputs, then park until more come; True when the worker is done."""
        while True:
            while rt.pending:
                if scope.cancel_called:
                    # Cancelled after its run had already ended: leave the scope
                    # before the next run, which it would otherwise stop.
                    await anyio.lowlevel.checkpoint()
                event = rt.pending.popleft()
                rt.serving = event.id
                try:
                    await self._serve(rt, event, None)
                finally:
                    rt.serving = None
            if rt.ephemeral:
                # A stateless run's session: its run is over, nothing is kept.
                if self._by_id.get(rt.session.id) is rt:
                    del self._by_id[rt.session.id]
                return True
            if self._closing or self._by_id.get(rt.session.id) is not rt:
                return True  # the loop is leaving, or the session was quit or evicted
            wake = rt.wake = self._new_signal()
            rt.idle = True
            idle = self._idle_workers
            idle[rt] = None
            if len(idle) > _MAX_IDLE_WORKERS:
                self._unpark(next(iter(idle)))
            await wake.wait()
            if not rt.pending:
                return True

    def _unpark(self, rt: SessionRuntime) -> None:
        """Wake an idle worker: it serves what is pending, or exits when nothing is."""
        self._idle_workers.pop(rt, None)
        rt.idle = False
        assert rt.wake is not None
        rt.wake.set()

    # -- metrics ---------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Sessions known, runs in progress, inputs waiting, parked workers."""
        by_id = self._by_id.values()
        return {
            "sessions": len(self._by_id),
            "running": sum(1 for rt in by_id if rt.scope is not None),
            "waiting": sum(len(rt.pending) for rt in by_id),
            "idle_workers": len(self._idle_workers),
        }
