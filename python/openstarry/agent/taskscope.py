"""Cancel scopes of runs: what the loop needs of one, and the cheapest on each backend.

:class:`CancelScopeLike` is what the agent uses of a cancel scope;
:func:`scope_factory` gives the running backend's cheapest scope for a
session's worker and a tool call, :func:`run_scope_factory` the one for a run
served in its asker's task (:class:`TaskScope` on asyncio).

A run is served in a cancel scope, which a ``/stop``, the provider deadline
or the loop leaving cancels. A session's worker serves its runs in one anyio
``CancelScope`` for many runs; a run served in the task that asked for it
(:meth:`Sessions.serve_here <openstarry.agent.sessions.Sessions.serve_here>`)
needs a scope of its own each time. On asyncio, anyio's scope keeps the task's
state in a weak mapping and links itself into the task's tree of scopes on
entering and leaving: about 5 µs, a sixth of a whole turn.
:class:`TaskScope` does what a run needs of a scope for less:

- :meth:`~TaskScope.cancel` cancels the task where it waits, as anyio's
  scope does, and again at each later wait until the task has left the
  scope (a run that swallows a ``CancelledError`` is cancelled again): not
  while the task runs (a run that stops itself is cancelled at its next
  wait), not while it is about to be woken with a result or already has a
  cancellation pending, and not while it is inside an anyio scope that
  shields it, entered within the run (then it looks again when the task's
  wait there ends, where anyio is told when the shield ends).
- Leaving the scope takes back those cancellations and swallows the
  ``CancelledError`` they raised; a cancellation of the task from elsewhere
  (its caller's) goes on.

It reads two private parts of anyio's asyncio backend (the task's current
scope, each scope's shield and parent): when they are not there, the run gets
anyio's own ``CancelScope``, as it does on Python 3.10 (which cannot take a
task's cancellation back: ``Task.uncancel`` came in 3.11). On trio the run
gets trio's ``CancelScope``.

:class:`RunScope` enters that scope only if the run waits. A run whose
provider and tools complete at once never yields to the event loop, and so
can never be cancelled mid-way: it needs no scope. On trio that spares a
``trio.CancelScope`` entered and left (about 48,000 instructions, more than a
quarter of a whole turn); on asyncio a :class:`TaskScope`. The scope is
entered at the run's first wait, which must come while the task is in no
cancel scope that the run entered itself (scopes are left in the order they
were entered): the run enters it beforehand, with :meth:`RunScope.enter`,
wherever code that may enter scopes of its own is about to run (a provider
that does not complete at once, a tool call that can wait, a store).
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from functools import partial
from types import TracebackType
from typing import Any, Protocol

import anyio

__all__ = [
    "CancelScopeLike",
    "Resumed",
    "RunScope",
    "TaskScope",
    "TrioRunScope",
    "new_run_scope",
    "run_scope_factory",
    "scope_factory",
]

_task_states: Any
try:  # anyio's record of each task's current cancel scope (its asyncio backend)
    from anyio._backends._asyncio import _task_states
except ImportError:  # pragma: no cover - another anyio: its own scope is used
    _task_states = None


#: The weak map's own dict, keyed by weak references: read without the
#: mapping's Python-level ``get`` (a reference to a task is made once and reused).
_states_by_ref: dict[Any, Any] | None = getattr(_task_states, "data", None)


def _current_anyio_scope(task: asyncio.Task[Any]) -> Any:
    if _states_by_ref is not None:
        state = _states_by_ref.get(weakref.ref(task))
    else:
        state = _task_states.get(task) if _task_states is not None else None
    return getattr(state, "cancel_scope", None)


class CancelScopeLike(Protocol):
    """What the loop uses of a cancel scope: ``anyio.CancelScope``'s, or trio's own."""

    @property
    def cancel_called(self) -> bool: ...

    @property
    def cancelled_caught(self) -> bool: ...

    def cancel(self, reason: str | None = None) -> None: ...

    def __enter__(self) -> CancelScopeLike: ...

    def __exit__(self, *exc_info: Any) -> bool | None: ...


def scope_factory() -> Callable[..., CancelScopeLike]:
    """The cheapest cancel scope class of the running backend, taking ``deadline=``, ``shield=``.

    ``anyio.CancelScope()`` looks up the running library on every creation
    (a turn makes two); on asyncio this is the class it returns, on trio
    trio's own scope, which anyio's wraps. Both cancel, and are cancelled, as
    anyio's do.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        import trio  # only when running on trio

        return trio.CancelScope
    scope_class: Callable[..., CancelScopeLike] = type(anyio.CancelScope())
    return scope_class


class TaskScope:
    """A cancel scope over the asyncio task that enters it (see the module's doc)."""

    # Attributes in the instance's dict, with defaults on the class: making
    # one sets a single attribute (a run makes one each time it is asked).
    _task: asyncio.Task[Any] | None = None
    _active = False
    #: Cancellations delivered to the task, each taken back on leaving.
    _delivered = 0
    _handle: asyncio.Handle | None = None
    #: What the task waits for inside a shield, until which nothing is delivered.
    _waiter: asyncio.Future[Any] | None = None
    #: The anyio scope the task was in on entering: shields inside it are the run's.
    _outer: Any = None
    #: The task's pending cancellations on entering (``Task.cancelling()``).
    _at_enter = 0
    cancel_called = False
    cancelled_caught = False

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def __enter__(self) -> TaskScope:
        if self._task is not None:
            raise RuntimeError("a TaskScope is entered once")
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("a TaskScope is entered in a task")
        self._task = task
        self._outer = _current_anyio_scope(task)
        if sys.version_info >= (3, 11):
            self._at_enter = task.cancelling()
        self._active = True
        if self.cancel_called:
            self._deliver()
        return self

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the run inside the scope (at once, or as soon as it can be)."""
        if self.cancel_called:
            return
        self.cancel_called = True
        if self._active:
            self._deliver()

    def _deliver(self) -> None:
        """Cancel the task if it waits here; look again on the next iteration (as anyio does)."""
        self._handle = None
        self._waiter = None
        task = self._task
        if not self._active or task is None or task.done():
            return
        loop = self._loop
        if self._shielded(task):
            waiter = getattr(task, "_fut_waiter", None)
            if isinstance(waiter, asyncio.Future) and not waiter.done():
                # Waiting inside the shield: look again when that wait ends.
                self._waiter = waiter
                waiter.add_done_callback(self._wait_ended)
            else:
                self._handle = loop.call_soon(self._deliver)
            return
        if not getattr(task, "_must_cancel", False) and task is not asyncio.current_task(loop):
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is None or not waiter.done():
                task.cancel()
                self._delivered += 1
        self._handle = loop.call_soon(self._deliver)

    def _wait_ended(self, waiter: asyncio.Future[Any]) -> None:
        if waiter is self._waiter:
            self._deliver()

    def _shielded(self, task: asyncio.Task[Any]) -> bool:
        """Whether the task is in an anyio scope that shields it, entered within this one."""
        scope = _current_anyio_scope(task)
        outer = self._outer
        while scope is not None and scope is not outer:
            if getattr(scope, "_shield", False):
                return True
            scope = getattr(scope, "_parent_scope", None)
        return False

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._active = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._waiter is not None:
            self._waiter.remove_done_callback(self._wait_ended)
            self._waiter = None
        delivered, self._delivered = self._delivered, 0
        if not delivered:
            return False
        assert self._task is not None
        pending = 0
        if sys.version_info >= (3, 11):
            for _ in range(delivered):
                pending = self._task.uncancel()
        if isinstance(exc, asyncio.CancelledError) and pending <= self._at_enter:
            self.cancelled_caught = True
            return True
        return False


class RunScope:
    """A run's cancel scope, entered for real only once the run waits (see the module's doc).

    ``new_scope`` makes the real one (:func:`run_scope_factory`'s). A
    cancellation before then is recorded and delivered when it is entered; a
    run that ends without waiting never saw one, as with a real scope.
    """

    _real: CancelScopeLike | None = None
    cancel_called = False

    def __init__(self, new_scope: Callable[[], CancelScopeLike]) -> None:
        self._new_scope = new_scope

    @property
    def entered(self) -> bool:
        """Whether the real scope has been entered."""
        return self._real is not None

    @property
    def cancelled_caught(self) -> bool:
        return self._real is not None and self._real.cancelled_caught

    def __enter__(self) -> RunScope:
        return self

    def enter(self) -> None:
        """Enter the real scope now (nothing if it is entered already).

        Call it only where the task is in no cancel scope entered since this
        one was: where the run's own code is about to wait, or to call code
        that may enter scopes of its own.
        """
        if self._real is None:
            real = self._new_scope()
            real.__enter__()
            self._real = real
            if self.cancel_called:
                real.cancel()

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the run: at its wait now, or as soon as it waits."""
        if self.cancel_called:
            return
        self.cancel_called = True
        if self._real is not None:
            self._real.cancel()

    def serve(self, run: Coroutine[Any, Any, None]) -> Awaitable[None] | None:
        """Start ``run``; ``None`` when it has ended without waiting, else what awaits its rest.

        At its first wait the real scope is entered, before the wait reaches
        the event loop. Exceptions of the run are raised here.
        """
        try:
            waited = run.send(None)
        except StopIteration:
            return None
        return Resumed(run, waited, self)

    def enter_at_wait(self) -> bool:
        """Enter the real scope at a wait of the run, if it can be entered there; whether it is.

        On asyncio it can at any wait: a :class:`TaskScope` takes no place
        among anyio's scopes.
        """
        self.enter()
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        real = self._real
        if real is None:
            return False
        return real.__exit__(exc_type, exc, tb)


class TrioRunScope(RunScope):
    """A :class:`RunScope` on trio, whose scopes are left in the order they were entered.

    The real scope is entered at a wait of the run only where the task is in
    the cancel scope it was in when the run started: never inside a scope the
    run entered itself (``trio.sleep`` enters one before it waits). Until
    then, at each later wait, it looks again, and a cancellation waits for it.
    """

    _base: object = None

    def serve(self, run: Coroutine[Any, Any, None]) -> Awaitable[None] | None:
        self._base = _trio_cancel_status()
        return super().serve(run)

    def enter_at_wait(self) -> bool:
        if _trio_cancel_status() is not self._base:
            return False
        self.enter()
        return True


def _trio_cancel_status() -> object:
    """The cancel status the current trio task is in (its innermost scope's)."""
    import trio  # only when running on trio

    status: object = trio.lowlevel.current_task()._cancel_status
    return status


class Resumed:
    """The rest of a coroutine that has run to its first wait: awaiting it awaits that rest.

    What ``await run`` does (PEP 380), from the wait ``run.send(None)``
    returned on. With a ``scope``, its real scope is entered at the first
    wait where it can be, before the wait reaches the event loop.
    """

    __slots__ = ("_run", "_scope", "_waited")

    def __init__(
        self, run: Coroutine[Any, Any, Any], waited: Any, scope: RunScope | None = None
    ) -> None:
        self._run = run
        self._waited = waited
        self._scope = scope

    def __await__(self) -> Generator[Any, Any, Any]:
        run = self._run
        scope = self._scope
        step = self._waited
        while True:
            if scope is not None and not scope.entered:
                try:
                    scope.enter_at_wait()
                except BaseException:
                    run.close()
                    raise
            try:
                sent = yield step
            except GeneratorExit:
                run.close()
                raise
            except BaseException as exc:
                try:
                    step = run.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    step = run.send(sent)
                except StopIteration as done:
                    return done.value


def new_run_scope() -> Callable[[], RunScope]:
    """What makes the :class:`RunScope` of a run served in its asker's task, on this backend."""
    new_scope = run_scope_factory()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            _trio_cancel_status()
        except AttributeError:  # pragma: no cover - a trio without it: entered at once
            return partial(_EnteredAtOnce, new_scope)
        return partial(TrioRunScope, new_scope)
    return partial(RunScope, new_scope)


class _EnteredAtOnce(RunScope):
    """A :class:`RunScope` that cannot tell where it may be entered: entered before the run."""

    def serve(self, run: Coroutine[Any, Any, None]) -> Awaitable[None] | None:
        self.enter()
        return run


def run_scope_factory() -> Callable[[], CancelScopeLike]:
    """The cancel scope class for a run served in its asker's task, on the running backend."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import trio  # only when running on trio

        return trio.CancelScope
    if _task_states is None or sys.version_info < (3, 11):  # pragma: no cover
        scope_class: Callable[[], CancelScopeLike] = type(anyio.CancelScope())
        return scope_class
    return partial(TaskScope, loop)
