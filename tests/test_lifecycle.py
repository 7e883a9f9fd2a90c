"""``Lifecycle``: an object's errors come out as themselves, not in a group of one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from openstarry._lifecycle import Lifecycle

pytestmark = pytest.mark.anyio


class Starting(Lifecycle):
    """Fails while it sets up, inside a task group (as a bus whose backend cannot start)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Starting]:
        async with anyio.create_task_group():
            raise self.error
        yield self  # pragma: no cover - never reached


async def test_the_error_that_stopped_the_start_comes_out_as_itself() -> None:
    cause = OSError("the root of it")
    try:
        raise ConnectionError("refused") from cause
    except ConnectionError as exc:
        error = exc
    starting = Starting(error)
    with pytest.raises(ConnectionError) as caught:
        await starting.__aenter__()
    assert caught.value is error
    assert caught.value.__cause__ is cause  # its cause kept
    # It may be entered again (and fails again the same way).
    with pytest.raises(ConnectionError):
        async with starting:
            pass
