"""A2A 1.0 as a client: remote agents as tools of an openstarry agent.

An entry of the manifest's ``a2a.agents`` (``{"name": ..., "url": ...}``) becomes one
tool, named as the entry, whose description is the remote agent's card (its
description and skills). A call sends its ``message`` to the remote agent
(``SendMessage``, blocking) in a context kept per caller session, so the calls of one
session are one conversation over there, and answers with what the remote agent said.
Each call carries the caller's trace and depth in the message's metadata (spec 004's
guard, as over MCP): a remote openstarry agent joins the trace, and refuses a call
deeper than :data:`~openstarry.tracecontext.MAX_CALL_DEPTH`, so a cycle of agents ends.

It needs the ``[a2a]`` extra (the official ``a2a-sdk``). The server side is
:mod:`openstarry.api.a2a`, in ``openstarry serve``.
"""

from __future__ import annotations

from openstarry.a2a.client import A2ATool, A2AToolset

__all__ = ["A2ATool", "A2AToolset"]
