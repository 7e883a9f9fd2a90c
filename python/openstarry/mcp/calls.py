"""One ``tools/call`` in and out: the call's trace, its caller, and the MCP result of its outcome.

:class:`~openstarry.mcp.dispatch.AgentMcpServer` decides whether a call runs;
this module translates around it, knowing nothing of sessions or transports:
the trace a call carries (:func:`trace_of`, from the HTTP headers or
``params._meta``) and the span its spans are children of
(:func:`caller_span`), the client's name and session as event fields
(:func:`client_name`, :func:`session_of`), a tool's parameters as an
``inputSchema`` (:func:`object_schema`), and an outcome as a
``CallToolResult`` (:func:`result_of`, :func:`failure_result`). Also the
manifest's names for what is exposed (:func:`tool_name`, :func:`catalog_of`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import mcp.types as types
    from mcp.server.context import ServerRequestContext
    from opentelemetry import trace as otel_trace  # a dependency of the SDK
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "openstarry.mcp needs the MCP SDK, which is not installed: "
        f"pip install 'openstarry[mcp]' ({exc})"
    ) from exc

from openstarry.mcp.guard import (
    META_TRACEPARENT,
    TRACEPARENT_HEADER,
    TraceContext,
    trace_from_headers,
    trace_from_meta,
    w3c_trace_id,
)
from openstarry.mcp.resources import ResourceCatalog
from openstarry.tracecontext import parse_traceparent

if TYPE_CHECKING:
    from openstarry.agent.memory import ToolOutcome

__all__ = [
    "SOURCE",
    "caller_span",
    "catalog_of",
    "client_name",
    "failure_result",
    "object_schema",
    "result_of",
    "session_of",
    "tool_name",
    "trace_of",
]

#: The ``source`` of the events the server publishes on the agent's bus.
SOURCE = "openstarry.mcp"
#: Client names go into event sources: these characters only, this long at most.
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 64
_SESSION_HEADER = "mcp-session-id"


def catalog_of(manifest: Any) -> ResourceCatalog:
    """The manifest's ``mcp.expose_resources`` (none without a manifest)."""
    mcp_config = getattr(manifest, "mcp", None)
    entries = list(getattr(mcp_config, "expose_resources", ()))
    if manifest is None or not entries:
        return ResourceCatalog([], [], Path.cwd(), [])
    return ResourceCatalog(
        entries,
        list(getattr(mcp_config, "private_resources", ())),
        manifest.base_dir,
        manifest.allowed_paths(),
    )


def tool_name(entry: str) -> str:
    """The tool a manifest's ``tools`` entry names (:func:`openstarry.tools.tool_name`)."""
    from openstarry.tools import tool_name

    return tool_name(entry)


def object_schema(parameters: Any) -> dict[str, Any]:
    """A tool's parameters as an MCP ``inputSchema``, whose root must be ``type: object``."""
    schema = dict(parameters) if isinstance(parameters, Mapping) else {}
    schema.setdefault("type", "object")
    return schema


def client_name(ctx: ServerRequestContext[Any, Any]) -> str:
    """The client's ``clientInfo.name``, cut to a safe event source; ``client`` when absent."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    name = _NAME_CHARS.sub("_", info.name if info is not None else "")[:_MAX_NAME]
    return name or "client"


def session_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """The ``sessionId`` of the call's events: ``mcp``, or ``mcp:<Mcp-Session-Id>`` over HTTP."""
    headers = getattr(ctx.request, "headers", None)
    session = headers.get(_SESSION_HEADER) if headers is not None else None
    if session:
        return "mcp:" + _NAME_CHARS.sub("_", session)[:_MAX_NAME]
    return "mcp"


def trace_of(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> TraceContext:
    """The call's trace: from the HTTP headers or ``_meta`` (the deeper when both), else new.

    Raises:
        ValueError: a malformed trace id or depth.
    """
    headers = getattr(ctx.request, "headers", None)
    found = [
        trace
        for trace in (
            trace_from_headers(headers) if headers is not None else None,
            trace_from_meta(dict(params.meta) if params.meta else None),
        )
        if trace is not None
    ]
    if not found:
        return TraceContext(str(uuid.uuid4()), 1)
    return max(found, key=lambda trace: trace.depth)


def caller_span(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, trace: TraceContext
) -> str | None:
    """The ``traceparent`` of the span the call's spans are children of, if any.

    The SDK's own server span (``tools/call NAME``) when a tracer provider
    records it, else the caller's span that ``_meta`` or the headers name:
    the first of these in the call's trace.
    """
    w3c = w3c_trace_id(trace.trace_id)
    current = otel_trace.get_current_span().get_span_context()
    if current.is_valid and f"{current.trace_id:032x}" == w3c:
        return f"00-{w3c}-{current.span_id:016x}-01"
    headers = getattr(ctx.request, "headers", None)
    meta = dict(params.meta) if params.meta else {}
    for value in (meta.get(META_TRACEPARENT), headers.get(TRACEPARENT_HEADER) if headers else None):
        parsed = parse_traceparent(value)
        if parsed is not None and w3c_trace_id(parsed[0]) == w3c:
            return f"00-{w3c}-{parsed[1]}-01"
    return None


def result_of(outcome: ToolOutcome) -> types.CallToolResult:
    """The MCP result of a tool's outcome."""
    if not outcome.success:
        error = outcome.error
        message = error.message if error is not None else "the tool failed"
        meta = {"openstarry/error": error.to_dict()} if error is not None else None
        return types.CallToolResult(
            content=[types.TextContent(text=message or "the tool failed")],
            is_error=True,
            _meta=meta,
        )
    result = outcome.result
    try:
        text = (
            result
            if isinstance(result, str)
            else json.dumps(result, ensure_ascii=False, allow_nan=False)
        )
    except (TypeError, ValueError) as exc:
        return failure_result("INVALID_RESULT", f"the tool's result is not JSON: {exc}")
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=result if isinstance(result, dict) else None,
    )


def failure_result(code: str, message: str) -> types.CallToolResult:
    """An ``isError`` result for a failure of the server's own (code under ``_meta``)."""
    failure = {"code": code, "message": message, "source": SOURCE}
    return types.CallToolResult(
        content=[types.TextContent(text=message)],
        is_error=True,
        _meta={"openstarry/error": failure},
    )
