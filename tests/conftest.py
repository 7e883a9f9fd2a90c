"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on asyncio and on trio.

    A module that needs only one backend overrides this fixture.
    """
    backend: str = request.param
    return backend
