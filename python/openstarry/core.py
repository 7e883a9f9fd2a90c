"""openstarry's Rust core: the event envelope and segment codec, the priority
event queue, the sliding-window dedup of event ids, one-call ingestion, the
lexical tool index, the HDR latency recorder of ``openstarry bench latency``, and
the byte work of the model providers' HTTP transport (``ResponseDecoder``,
``SseDecoder``, ``json_dumps``, ``json_loads``).

This module needs nothing beyond the Python standard library, so other runtimes
can embed it: ``from openstarry.core import EventQueue``.
"""

from openstarry._asyncqueue import AsyncEventQueue
from openstarry._core import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_PRIORITY,
    MAX_DEPTH,
    PRIORITY_HIGHEST,
    PRIORITY_LOWEST,
    ContentSegment,
    DedupWindow,
    Emitter,
    Event,
    EventQueue,
    EventRef,
    Ingestor,
    IngestResult,
    LatencyRecorder,
    ProviderResponse,
    ResponseDecoder,
    SseDecoder,
    ToolCall,
    ToolIndex,
    __version__,
    decode_event,
    decode_response,
    encode_event,
    encode_response,
    json_dumps,
    json_loads,
)
from openstarry.errors import DecodeError, QueueClosed, QueueEmpty, QueueFull

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_PRIORITY",
    "MAX_DEPTH",
    "PRIORITY_HIGHEST",
    "PRIORITY_LOWEST",
    "AsyncEventQueue",
    "ContentSegment",
    "DecodeError",
    "DedupWindow",
    "Emitter",
    "Event",
    "EventRef",
    "EventQueue",
    "IngestResult",
    "Ingestor",
    "LatencyRecorder",
    "ProviderResponse",
    "QueueClosed",
    "QueueEmpty",
    "QueueFull",
    "ResponseDecoder",
    "SseDecoder",
    "ToolCall",
    "ToolIndex",
    "__version__",
    "decode_event",
    "decode_response",
    "encode_event",
    "encode_response",
    "json_dumps",
    "json_loads",
]
