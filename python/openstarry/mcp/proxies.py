"""The remote tools as the agent sees them: proxies, what a listing must hold, what a call gives.

A :class:`RemoteTool` is a tool of a remote MCP server, ``<server>.<tool>``,
whose :meth:`~RemoteTool.run` calls it one hop deeper over the server's
connection; :class:`ReadResourceTool` is ``<server>.read_resource``. Both
need of the connection only what :class:`ToolServer` says (so this module
sits below :mod:`openstarry.mcp.connection`). Also here: why a listed tool
cannot become one (:func:`bad_tool`), and what a ``tools/call`` result gives
the agent, or the :class:`~openstarry.errors.ToolError` it is
(:func:`result_value`), within :data:`MAX_RESULT_CHARS`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.errors import ToolError
from openstarry.manifest import McpServerConfig
from openstarry.mcp.guard import (
    MAX_DEPTH,
    TraceContext,
    next_hop,
)

try:
    import mcp_types
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("openstarry.mcp needs the MCP SDK: pip install 'openstarry[mcp]'") from exc

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_RESULT_CHARS",
    "MAX_SCHEMA_CHARS",
    "ReadResourceTool",
    "RemoteTool",
    "ToolServer",
    "bad_tool",
    "cut",
    "is_depth_refusal",
    "resource_text",
    "result_value",
]

#: Characters of a call's result that reach the agent; past it the text is cut.
MAX_RESULT_CHARS = 1 << 20
#: Characters of a remote tool's description that are kept.
MAX_DESCRIPTION_CHARS = 8192
#: Characters of a remote tool's input schema (as JSON) that are accepted.
MAX_SCHEMA_CHARS = 64 * 1024
_MAX_TOOL_NAME = 128


class ToolServer(Protocol):
    """What a proxy needs of its server's connection.

    :class:`~openstarry.mcp.connection.McpServerConnection` is one.
    """

    @property
    def name(self) -> str:
        """The server's name in the manifest."""

    @property
    def config(self) -> McpServerConfig:
        """The server's manifest entry (its ``approval``)."""

    async def call(
        self, remote_name: str, args: dict[str, Any], trace: TraceContext, *, approved: bool = False
    ) -> Any:
        """Call a tool of the server; see :meth:`McpServerConnection.call`."""

    async def read_resource(self, uri: str) -> str:
        """Read a resource of the server; see :meth:`McpServerConnection.read_resource`."""


class RemoteTool(Tool):
    """A tool of a remote MCP server, run by calling it over its connection.

    Attributes:
        name: ``<server>.<tool>``.
        remote_name: The tool's name on its server.
        server: The server's name in the manifest.
        server_label: The same: the Agent API shows its calls as ``mcp_call``
            messages with this ``server_label``.
        requires_approval: The server's entry sets ``approval``, or its listing
            says the tool needs it (``_meta["openstarry/requiresApproval"]``):
            each call waits for a person's yes, which is also the answer to the
            server's own approval form (:mod:`openstarry.mcp.approvals`).
    """

    def __init__(
        self,
        connection: ToolServer,
        remote_name: str,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self._connection = connection
        self.server = self.server_label = connection.name
        self.requires_approval = connection.config.approval
        self.remote_name = remote_name
        self.name = f"{connection.name}.{remote_name}"
        self.description = description
        self.parameters = dict(parameters) if parameters is not None else _OPEN_SCHEMA

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        """Call the remote tool one hop deeper than ``context``'s run.

        Raises:
            ToolError: ``REMOTE_ERROR``, ``RECURSION_LIMIT``, ``REMOTE_UNAVAILABLE``
                or ``INVALID_RESULT``; see the module's documentation.
        """
        trace = next_hop(context.trace_id, context.call_depth)
        # A tool that needs approval runs only after its yes (the executor waits for it).
        approved = self.requires_approval
        return await self._connection.call(self.remote_name, args, trace, approved=approved)


class ReadResourceTool(Tool):
    """``<server>.read_resource``: read a resource of a remote MCP server by its URI."""

    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"uri": {"type": "string", "description": "The resource's URI."}},
        "required": ["uri"],
    }

    def __init__(self, connection: ToolServer) -> None:
        self._connection = connection
        self.server = self.server_label = connection.name
        self.name = f"{connection.name}.read_resource"
        self.description = (
            f"Read a resource of the MCP server {connection.name!r} by its URI "
            "(as its resources/list names them)."
        )

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        """The resource's text (contents joined), or its base64 blob.

        Raises:
            ToolError: ``REMOTE_ERROR`` (unknown resource) or ``REMOTE_UNAVAILABLE``.
        """
        return await self._connection.read_resource(str(args["uri"]))


#: The schema of a tool known by name only (its server not reached yet).
_OPEN_SCHEMA: Mapping[str, Any] = {"type": "object", "additionalProperties": True}


def bad_tool(tool: mcp_types.Tool) -> str | None:
    """Why a listed tool cannot become an agent's tool, or None."""
    name = tool.name
    if not name or len(name) > _MAX_TOOL_NAME:
        return f"its name must have 1 to {_MAX_TOOL_NAME} characters"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "its name has spaces or control characters"
    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "its input schema is not an object schema"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        return "its input schema is not JSON"
    if size > MAX_SCHEMA_CHARS:
        return f"its input schema is larger than {MAX_SCHEMA_CHARS} characters"
    return None


#: Where an openstarry MCP server puts a failed tool's error (``{"code", "message", ...}``).
_ERROR_META = "openstarry/error"


def is_depth_refusal(message: str) -> bool:
    """Whether a remote error is the recursion guard's refusal (see guard.check_depth)."""
    return f"exceeds the limit of {MAX_DEPTH}" in message and "depth" in message


def result_value(result: mcp_types.CallToolResult, label: str) -> Any:
    """What a ``tools/call`` result gives the agent, or the ToolError it is."""
    if result.is_error:
        text = _text_of(result.content) or "the remote tool failed without a message"
        text = cut(text, MAX_RESULT_CHARS)
        error = (result.meta or {}).get(_ERROR_META)
        remote_code = error.get("code") if isinstance(error, dict) else None
        if remote_code == "RECURSION_LIMIT" or is_depth_refusal(text):
            raise ToolError(f"{label}: {text}", code="RECURSION_LIMIT")
        if isinstance(remote_code, str) and remote_code:
            text = f"{text} (remote code {remote_code[:64]})"
        raise ToolError(f"{label}: {text}", code="REMOTE_ERROR")
    structured = result.structured_content
    blocks = result.content
    if structured is not None:
        try:
            size = len(json.dumps(structured))
        except (TypeError, ValueError, RecursionError):
            size = MAX_RESULT_CHARS + 1
        if size <= MAX_RESULT_CHARS:
            return _unwrapped(structured, blocks)
    if all(isinstance(block, mcp_types.TextContent) for block in blocks):
        return cut(_text_of(blocks), MAX_RESULT_CHARS)
    out: list[dict[str, Any]] = []
    budget = MAX_RESULT_CHARS
    for block in blocks:
        item = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key in ("text", "data", "blob"):
            value = item.get(key)
            if isinstance(value, str):
                if key == "text":
                    item[key] = cut(value, max(budget, 0))
                elif len(value) > budget:
                    item[key] = None
                    item["omitted"] = f"{len(value)} characters of {key}: over the result limit"
                budget -= len(item[key] or "")
        resource = item.get("resource")
        if isinstance(resource, dict):
            for key in ("text", "blob"):
                value = resource.get(key)
                if isinstance(value, str) and len(value) > budget:
                    resource[key] = cut(value, max(budget, 0)) if key == "text" else None
                    item["omitted"] = f"{len(value)} characters of {key}: over the result limit"
                budget -= len(resource.get(key) or "")
        out.append(item)
    return out


def _unwrapped(structured: Any, blocks: Sequence[Any]) -> Any:
    """``structuredContent``, without the ``{"result": ...}`` wrapper servers put around a
    value that is not an object, when the text block says that value alone."""
    if not (isinstance(structured, dict) and len(structured) == 1 and "result" in structured):
        return structured
    if len(blocks) != 1 or not isinstance(blocks[0], mcp_types.TextContent):
        return structured
    value, said = structured["result"], blocks[0].text
    if isinstance(value, str):
        return value if said == value else structured
    try:
        return value if json.loads(said) == value else structured
    except (ValueError, RecursionError):
        return structured


def _text_of(blocks: Iterable[Any]) -> str:
    return "\n".join(block.text for block in blocks if isinstance(block, mcp_types.TextContent))


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[cut: {len(text) - limit} more characters over the result limit]"


def resource_text(result: mcp_types.ReadResourceResult) -> str:
    """A ``resources/read`` result as the tool's value: text contents joined, or the base64 blob."""
    parts = [
        str(getattr(item, "text", None) or getattr(item, "blob", "")) for item in result.contents
    ]
    return cut("".join(parts), MAX_RESULT_CHARS)
