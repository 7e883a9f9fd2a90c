"""openstarry's Rust core: the event envelope and segment codec, the priority
event queue, the sliding-window dedup of event ids, one-call ingestion, the
lexical tool index, and the HDR latency recorder of ``openstarry bench latency``.

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
    ToolCall,
    ToolIndex,
    __version__,
    decode_event,
    decode_response,
    encode_event,
    encode_response,
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
    "ToolCall",
    "ToolIndex",
    "__version__",
    "decode_event",
    "decode_response",
    "encode_event",
    "encode_response",
]
