"""The walk of a user's text through openstarry, from ``ExecutionLoop.ask``.

    python -m benches.walk               # the walk of one turn
    python -m benches.walk --turns 1200  # 1,200 turns, untraced (for callgrind)

One turn of the turn benchmark (``benches/test_bench_turn.py``: a
``FunctionProvider`` that asks for ``add_one`` once, then answers ``"done"``)
is traced with :func:`sys.setprofile`. The walk is the files of openstarry's
frames that hold the user's text (the very ``str`` object ``ask`` was given,
as a local or an argument), in the order the text reaches them: a call enters
the callee's file, a return goes back to the caller's. Consecutive events in
one file are one stay. A *return* is a stay in a file the walk has already
left, which a reader following the text must go back to.

It prints each stay (its file, and the functions entered or left there), then
the count of files, stays and returns. ``docs/design/turn.md`` says what the
count is today and what it would take to bring it down.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

import openstarry
from benches.test_bench_turn import add_one, model
from openstarry import Agent
from openstarry.testing import FunctionProvider

_PACKAGE = Path(openstarry.__path__[0])


def _holds(frame: FrameType | None, value: str) -> bool:
    return frame is not None and any(v is value for v in frame.f_locals.values())


def _file(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    return str(path.relative_to(_PACKAGE)) if path.is_relative_to(_PACKAGE) else None


def trace(prompt: str) -> list[tuple[str, str]]:
    """The walk of ``prompt`` through one ``ExecutionLoop.ask``: ``(file, what)`` per event."""
    walk: list[tuple[str, str]] = []
    started = False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal started
        if event not in ("call", "return"):
            return
        name = _file(frame)
        if name is None or not _holds(frame, prompt):
            return
        code = frame.f_code.co_name
        if not started:
            if not (name == "agent/loop.py" and code == "ask" and event == "call"):
                return
            started = True
        if event == "call":
            walk.append((name, f"{code}()"))
            return
        caller = frame.f_back
        back = None if caller is None else _file(caller)
        if back is not None and _holds(caller, prompt):
            walk.append((back, f"<-{code}"))
        if name == "agent/loop.py" and code == "ask":
            sys.setprofile(None)

    async def one() -> None:
        agent = Agent(FunctionProvider(model, record=0), [add_one], memory_window=1)
        async with agent:
            await agent.ask("warm up")
            sys.setprofile(profile)
            try:
                await agent.loop.ask(prompt)
            finally:
                sys.setprofile(None)

    anyio.run(one)
    return walk


def turns(n: int) -> None:
    """Run ``n`` turns of the walk's agent, untraced (what callgrind counts)."""

    async def run() -> None:
        agent = Agent(FunctionProvider(model, record=0), [add_one], memory_window=1)
        async with agent:
            for _ in range(n):
                result = await agent.ask("add one to one")
            assert n == 0 or result.replies == ["done"], result

    anyio.run(run)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--turns":
        turns(int(sys.argv[2]))
        return
    prompt = "".join(["add one ", "to one"])  # a str no other code holds
    stays: list[tuple[str, list[str]]] = []
    for name, what in trace(prompt):
        if stays and stays[-1][0] == name:
            stays[-1][1].append(what)
        else:
            stays.append((name, [what]))
    seen: set[str] = set()
    returns = 0
    for name, whats in stays:
        back = name in seen
        returns += back
        seen.add(name)
        print(f"{'  back to ' if back else ''}{name}: {' '.join(whats)}")
    print(f"{len(seen)} files, {len(stays)} stays, {returns} returns to a file already left")


if __name__ == "__main__":
    main()
