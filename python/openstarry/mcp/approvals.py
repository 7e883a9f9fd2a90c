"""Approvals over MCP: a tool that waits for a person's yes, called by an MCP client.

A tool of the agent that needs approval (the manifest's ``approval.tools``, or
a tool whose ``requires_approval`` is true) says so in ``tools/list``:
``_meta["openstarry/requiresApproval"]`` is true. A ``tools/call`` of it asks
the client's user, in the protocol's own way:

- **2026-07-28** (multi-round-trip): the call is answered with an
  ``InputRequiredResult`` holding one form elicitation under the key
  ``openstarry/approval``. It names the agent, the tool and its arguments and
  asks for ``approve`` (a boolean) and an optional ``reason``. The client
  retries the same call with the answer in ``inputResponses``; nothing runs
  before that. The SDK's ``Client`` does it for you when it has an
  ``elicitation_callback``.
- **2025-11-25** (initialize handshake): the same form goes to the client as an
  ``elicitation/create`` request while the call waits, if the client declared
  the ``elicitation`` capability; a client that did not is refused
  (``APPROVAL_REQUIRED``, as before).

A yes runs the tool once. A no, a declined or dismissed form, or no answer
within the manifest's ``approval.timeout`` is a ``DENIED`` result
(``isError: true``) and runs nothing. The answer is bound to the call it
comes with, its tool and arguments: a retry with other arguments is that
call's own answer. The client is the approver here, as the HTTP client is
over the Agent API, so an answer sent without being asked is taken as given.

A client tells an approval from another form by its input request's key,
``openstarry/approval`` (2026-07-28), or by the form's
``_meta["openstarry/approval"]``, ``{"tool": NAME}`` (2025-11-25).
openstarry's own MCP client (:class:`ApprovalAnswers`, one per server it
connects to) answers it with its user's answer: a remote tool listed as
needing approval waits for a yes in the caller's run like any tool that needs
one, and the yes is then given to the remote server when it asks. A form that
asks about a call the user did not approve, or any other form, is declined.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

import anyio

try:
    import mcp.types as types
    from mcp.shared.exceptions import MCPError, NoBackChannelError
    from mcp.shared.message import ServerMessageMetadata
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "openstarry.mcp needs the MCP SDK, which is not installed: "
        f"pip install 'openstarry[mcp]' ({exc})"
    ) from exc

from openstarry.agent.waits import Answer

__all__ = [
    "APPROVAL",
    "ApprovalAnswers",
    "REQUIRES_APPROVAL",
    "answer_of",
    "approval_for",
    "approval_form",
    "approval_meta",
    "ask_by_elicitation",
    "asked_tool",
    "input_required",
    "takes_input_required",
]

#: The key of the approval's input request, and of the form's ``_meta`` entry.
APPROVAL = "openstarry/approval"
#: A listed tool's ``_meta`` key: true when its calls wait for approval.
REQUIRES_APPROVAL = "openstarry/requiresApproval"

log = logging.getLogger(__name__)

#: The first protocol version that elicits through ``InputRequiredResult``.
_MULTI_ROUND_TRIP = "2026-07-28"
#: The arguments shown in the form's message, at most (characters).
_SHOWN_ARGS = 500

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Run the tool with these arguments",
        },
        "reason": {
            "type": "string",
            "title": "Reason",
            "description": "Why not (optional, given to the agent)",
        },
    },
    "required": ["approve"],
}


def takes_input_required(protocol_version: str | None) -> bool:
    """Whether a session of this protocol version is asked through ``InputRequiredResult``."""
    return protocol_version is not None and protocol_version >= _MULTI_ROUND_TRIP


def approval_meta(tool: str) -> dict[str, Any]:
    """The form's ``_meta``: which tool's call it asks about."""
    return {APPROVAL: {"tool": tool}}


def approval_form(agent: str, tool: str, args: Any) -> types.ElicitRequestFormParams:
    """The form that asks the client's user to approve a call of ``tool`` with ``args``."""
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True, default=str)
    if len(shown) > _SHOWN_ARGS:
        shown = shown[: _SHOWN_ARGS - 3] + "..."
    return types.ElicitRequestFormParams(
        message=f"{agent} asks to run {tool} with {shown}. Approve?",
        requested_schema=_SCHEMA,
        _meta=cast(Any, approval_meta(tool)),
    )


def input_required(agent: str, tool: str, args: Any) -> types.InputRequiredResult:
    """The answer to a 2026-07-28 call that needs approval and came without one."""
    request = types.ElicitRequest(params=approval_form(agent, tool, args))
    return types.InputRequiredResult(input_requests={APPROVAL: request})


def answer_of(params: types.CallToolRequestParams) -> Answer | None:
    """The approval a retried call carries in ``inputResponses``; ``None`` when none."""
    responses = params.input_responses
    if not responses or APPROVAL not in responses:
        return None
    response = responses[APPROVAL]
    if not isinstance(response, types.ElicitResult):
        return Answer(approve=False, reason="the client's answer was not a form's")
    return _answer_of_form(response)


async def ask_by_elicitation(
    session: Any, request_id: Any, agent: str, tool: str, args: Any, timeout: float
) -> Answer | None:
    """Ask a 2025-11-25 client with ``elicitation/create``; ``None`` when it cannot be asked
    (it declared no elicitation, or its transport has no way back).

    No answer within ``timeout`` seconds is a no, and so is an error or a malformed answer.
    """
    asking = types.ClientCapabilities(elicitation=types.ElicitationCapability())
    if not session.check_client_capability(asking):
        return None
    request = types.ElicitRequest(params=approval_form(agent, tool, args))
    result: types.ElicitResult | None = None
    with anyio.move_on_after(timeout):
        try:
            result = await session.send_request(
                request,
                types.ElicitResult,
                metadata=ServerMessageMetadata(related_request_id=request_id),
            )
        except NoBackChannelError:  # a transport with no way back (stateless HTTP)
            return None
        except MCPError as exc:  # the client refused the request
            return Answer(approve=False, reason=f"the MCP client could not ask: {exc}")
        except ValidationError:
            return Answer(approve=False, reason="the MCP client's answer was not a form's")
    if result is None:
        return Answer(approve=False, reason=f"the MCP client did not answer within {timeout:g} s")
    return _answer_of_form(result)


async def approval_for(
    ctx: Any, params: types.CallToolRequestParams, agent: str, timeout: float
) -> Answer | types.InputRequiredResult | None:
    """The client's answer to a call that needs approval: its yes or no, the
    ``InputRequiredResult`` that asks for it (2026-07-28), or ``None`` when the
    client cannot be asked (a 2025-11-25 client without elicitation)."""
    answer = answer_of(params)
    if answer is not None:
        return answer
    args = params.arguments if params.arguments is not None else {}
    if takes_input_required(ctx.protocol_version):
        return input_required(agent, params.name, args)
    return await ask_by_elicitation(ctx.session, ctx.request_id, agent, params.name, args, timeout)


def asked_tool(params: types.ElicitRequestParams) -> str | None:
    """The tool an elicitation asks approval for, when it is an openstarry approval form."""
    meta = cast(Mapping[str, Any] | None, params.meta)
    entry = meta.get(APPROVAL) if meta else None
    tool = entry.get("tool") if isinstance(entry, Mapping) else None
    return tool if isinstance(tool, str) else None


def _answer_of_form(result: types.ElicitResult) -> Answer:
    if result.action == "decline":
        return Answer(approve=False, reason="the MCP client declined")
    if result.action != "accept":
        return Answer(approve=False, reason="the MCP client dismissed the request")
    content = result.content or {}
    reason = content.get("reason")
    return Answer(
        approve=content.get("approve") is True,
        reason=reason if isinstance(reason, str) and reason else None,
    )


#: The remote call this task is making, and whether its user approved it: how a
#: 2026-07-28 form (embedded in the call's result, answered in the call's task)
#: is matched to its call.
_CALLING: ContextVar[tuple[ApprovalAnswers, str, bool] | None] = ContextVar(
    "openstarry_mcp_calling", default=None
)


class ApprovalAnswers:
    """openstarry's answers to one MCP server's approval forms (its ``elicitation_callback``).

    A call made with :meth:`calling` is the user's: ``approved`` when the
    user's yes came before it was sent. A form about an approved call in
    flight is answered yes; any other form is declined, with a warning.
    """

    def __init__(self, server: str) -> None:
        self.server = server
        self._approved: Counter[str] = Counter()

    @contextmanager
    def calling(self, tool: str, approved: bool) -> Iterator[None]:
        """Around the call of the server's ``tool``."""
        token = _CALLING.set((self, tool, approved))
        if approved:
            self._approved[tool] += 1
        try:
            yield
        finally:
            _CALLING.reset(token)
            if approved:
                self._approved[tool] -= 1
                if not self._approved[tool]:
                    del self._approved[tool]

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        calling = _CALLING.get()
        if context.request_id == APPROVAL and calling is not None and calling[0] is self:
            tool: str | None = calling[1]
            approved = calling[2]
        else:
            tool = asked_tool(params)
            approved = tool is not None and self._approved[tool] > 0
        if tool is not None and approved:
            return types.ElicitResult(action="accept", content={"approve": True})
        if tool is None:
            log.warning(
                "MCP server %r asked for input this agent cannot give: declined", self.server
            )
        else:
            log.warning(
                "MCP server %r asked to approve %s, not approved by this agent's user: declined "
                "(set approval on the server's entry, or have its listing say the tool needs it)",
                self.server,
                tool,
            )
        return types.ElicitResult(action="decline")
