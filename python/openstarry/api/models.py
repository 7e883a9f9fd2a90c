"""The Agent API's wire models (spec 003): requests, responses, messages and content.

The JSON these models read and write is wire-compatible with the AgentScope
Runtime schema that spec 003 documents: the same snake_case field names
(``msg_id``, ``session_id``, ``created_at``, ``sequence_number``, ``call_id``),
the same ``object`` values (``"response"``, ``"message"``, ``"content"``), the
same status strings and the same id prefixes (``response_``, ``msg_``).

Wire form:
    :meth:`WireModel.to_wire` (a JSON-ready ``dict``) and
    :meth:`WireModel.wire_json` (a JSON string) are the one way openstarry puts a
    model on the wire. Fields that are ``None`` are left out, so a streamed event
    is as compact as the spec's examples
    (``{"status":"created","id":"response_...","object":"response"}``); ``None``
    values *inside* a ``data`` or ``usage`` dict are kept. ``model_dump_json()``
    writes the same JSON with ``null`` for the absent fields; both parse back to
    the same model.

``sequence_number``:
    spec 003 types it ``str = None`` on the response; AgentScope Runtime and
    openstarry use an integer. openstarry always emits an ``int`` (counting from 0
    within one response stream) and, for compatibility, accepts a string of
    digits on input.

Unknown fields:
    ignored, as AgentScope Runtime does, so a client of a newer protocol revision
    still talks to openstarry. Everything openstarry does read is validated: an
    unknown content type, message type, role, status or tool type is refused, and
    so are values of the wrong JSON type (``"stream": "yes"``, ``"n": "3"``).

Tools:
    spec 003 types ``AgentRequest.tools`` as ``List[Union[Tool, Dict]]``; a bare
    dict would let any tool type through, so openstarry accepts :class:`Tool`
    objects only, and a ``type`` other than ``"function"`` is refused (a server
    answers 422).

Limits that protect a server: at most :data:`MAX_INPUT_MESSAGES` input messages,
:data:`MAX_CONTENT_ITEMS` content items per message, :data:`MAX_TOOLS` tools,
:data:`MAX_TEXT_LENGTH` characters in any one string of content, and
:data:`MAX_REQUEST_BYTES` bytes of request JSON for :func:`parse_request`.

The spec's example stream shows ``"type":"assistant"`` on a message: that is a
quirk of the spec's example; ``type`` is a :class:`MessageType`
(``"message"``), and ``"assistant"`` is the message's ``role``.

Where each model lives (all are re-exported here, and from :mod:`openstarry.api`):
:mod:`openstarry.api.wire` (limits, enums, ids, errors, :class:`WireModel`,
:class:`Event`), :mod:`openstarry.api.messages` (messages and content items),
:mod:`openstarry.api.requests` (requests and tools) and
:mod:`openstarry.api.responses` (responses and reading a streamed event).
"""

from __future__ import annotations

from openstarry.api.messages import (
    AnyContent,
    AudioContent,
    Content,
    DataContent,
    FileContent,
    FunctionCall,
    FunctionCallOutput,
    ImageContent,
    Message,
    RefusalContent,
    TextContent,
    content_class,
    merge_delta,
    parse_content,
)
from openstarry.api.requests import (
    MAX_INPUT_MESSAGES,
    MAX_REQUEST_BYTES,
    MAX_TOOLS,
    AgentRequest,
    BaseRequest,
    FunctionParameters,
    FunctionTool,
    Tool,
    parse_request,
)
from openstarry.api.responses import AgentResponse, BaseResponse, parse_event
from openstarry.api.wire import (
    MAX_CONTENT_ITEMS,
    MAX_TEXT_LENGTH,
    TERMINAL_STATUSES,
    ContentType,
    Error,
    Event,
    InvalidEventError,
    InvalidRequestError,
    MessageType,
    ProtocolError,
    Role,
    RunStatus,
    StatusTransitionError,
    WireModel,
    new_message_id,
    new_response_id,
)
from openstarry.api.wire import (
    MAX_SESSION_ID_LENGTH as MAX_SESSION_ID_LENGTH,
)

__all__ = [
    "MAX_CONTENT_ITEMS",
    "MAX_INPUT_MESSAGES",
    "MAX_REQUEST_BYTES",
    "MAX_TEXT_LENGTH",
    "MAX_TOOLS",
    "TERMINAL_STATUSES",
    "AgentRequest",
    "AgentResponse",
    "AnyContent",
    "AudioContent",
    "BaseRequest",
    "BaseResponse",
    "Content",
    "ContentType",
    "DataContent",
    "Error",
    "Event",
    "FileContent",
    "FunctionCall",
    "FunctionCallOutput",
    "FunctionParameters",
    "FunctionTool",
    "ImageContent",
    "InvalidEventError",
    "InvalidRequestError",
    "Message",
    "MessageType",
    "ProtocolError",
    "RefusalContent",
    "Role",
    "RunStatus",
    "StatusTransitionError",
    "TextContent",
    "Tool",
    "WireModel",
    "content_class",
    "merge_delta",
    "new_message_id",
    "new_response_id",
    "parse_content",
    "parse_event",
    "parse_request",
]
