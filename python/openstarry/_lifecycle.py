"""One async context manager per object, written as one generator.

:class:`Lifecycle` is anyio's ``AsyncContextManagerMixin`` with the error
openstarry's objects have always raised when entered while running ("... is
already running"): a subclass writes its whole life in
``__asynccontextmanager__`` (set up, ``yield``, tear down, with task groups as
``async with`` blocks around the ``yield``), so no task group is entered by
hand and every exit path leaves them in order. An object can be entered again
once it has exited; entering it while it runs is refused before anything is
touched.

An exception raised in the body of ``async with`` comes out as itself, not
wrapped in the ``ExceptionGroup`` of the task groups it passed through on its
way out (anyio's and trio's task groups always wrap); when a task of the
object failed too, the group comes out whole. So does the one error that
stopped the object from starting (a bus whose Redis refused its TLS
certificate): itself, not a group of one.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

if sys.version_info < (3, 11):  # pragma: no cover - anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

__all__ = ["Lifecycle"]


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception a group (of groups) holds, or ``None`` when it holds several."""
    while len(group.exceptions) == 1:
        inner: BaseException = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return None


class Lifecycle(ABC):
    """Async context manager support from an ``@asynccontextmanager`` method."""

    __cm: AbstractAsyncContextManager[Any, bool | None] | None = None

    @abstractmethod
    def __asynccontextmanager__(self) -> AbstractAsyncContextManager[Any, bool | None]:
        """The object's life: set up, ``yield self``, tear down (an ``@asynccontextmanager``)."""

    async def __aenter__(self) -> Self:
        if self.__cm is not None:
            raise RuntimeError(f"this {type(self).__name__} is already running")
        cm = self.__asynccontextmanager__()
        # Held from the start: a second entry while this one sets up is refused too.
        self.__cm = cm
        try:
            await cm.__aenter__()
        except BaseExceptionGroup as group:
            self.__cm = None
            failed = _sole(group)
            if not isinstance(failed, Exception):
                raise
        except BaseException:
            self.__cm = None
            raise
        else:
            return self
        # Raised outside the handler: the group must not become its context.
        raise failed

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        cm = self.__cm
        if cm is None:
            raise RuntimeError(f"this {type(self).__name__} is not running")
        try:
            return await cm.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            if exc is None or _sole(group) is not exc:
                raise
        finally:
            # Cleared once torn down: entering again while it tears down is refused.
            self.__cm = None
        # Raised outside the handler: the group must not become its context.
        raise exc
