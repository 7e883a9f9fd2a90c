"""Tools for the prompt's pseudo-terminal tests (``tests/test_terminal_pty.py``).

A manifest lists them by import reference (``"prompt_tools:wait_for"``), with
this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

from pathlib import Path

import anyio


async def wait_for(gate: str) -> str:
    """Wait until the file ``gate`` exists (at most 60 s), then say so."""
    with anyio.move_on_after(60):
        while not Path(gate).exists():
            await anyio.sleep(0.05)
        return f"{Path(gate).name} opened"
    return f"{Path(gate).name} never opened"
