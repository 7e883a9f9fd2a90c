//! openstarry's hot core.
//!
//! The logic lives in plain Rust modules with no `PyO3` in them, so `cargo test`
//! needs no Python and another runtime could embed the same code. The `PyO3`
//! wrappers sit apart in `py`, behind the `python` feature that maturin turns on.
//!
//! The modules are private (the decoders' are public but hidden, for the fuzz
//! targets, and not part of the surface); what another crate may use is
//! re-exported here, so the surface is chosen in one place and the modules can
//! change behind it.

// The decoders' modules are public, unlisted, for the fuzz targets (fuzz/),
// which check their internals (the JSON scanner, the envelope and segment
// decoders, window snapshots); what another crate may use is listed below.
#[doc(hidden)]
pub mod dedup;
#[doc(hidden)]
pub mod envelope;
#[doc(hidden)]
pub mod http;
mod ingest;
#[doc(hidden)]
pub mod json;
mod latency;
mod queue;
mod retrieval;
#[doc(hidden)]
pub mod segment;

#[cfg(feature = "python")]
mod py;

pub use dedup::{uuid_key, DedupWindow, IdKey, KeyHasher, OwnedIdKey, MAX_LIVE};
pub use envelope::{
    decode as decode_envelope, encode as encode_envelope, is_event_type, new_uuid, now_ms,
    EnvelopeIndex, Header, LOWEST_PRIORITY, SPEC_TYPES,
};
// `ingest` in one call, or its phases for a host that builds its own items
// between them (as the Python bindings do).
pub use http::{
    Framing, Head, HttpError, Progress, ResponseDecoder, SseDecoder, SseError, SseEvent, MAX_HEAD,
    MAX_HEADERS,
};
pub use ingest::{
    admit, admit_keyed, decode_lines, ingest, split_lines, Admitted, ChunkKeys, Decoded,
    NdjsonLines, Report, CHUNK_LINES,
};
pub use json::{
    validate as validate_json, JsonError, Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, MAX_DEPTH,
    MAX_INPUT,
};
pub use latency::{
    monotonic_ns, LatencyError, LatencyRecorder, DEFAULT_HIGHEST_NS, DEFAULT_SIGNIFICANT_FIGURES,
    MAX_SIGNIFICANT_FIGURES,
};
pub use queue::{Overflow, PriorityQueue, PushError, LANES};
pub use retrieval::{
    stem, tokenize, RetrievalError, ToolIndex, MAX_DOCUMENTS, MAX_NAME_BYTES, MAX_QUERY_BYTES,
    MAX_TEXT_BYTES,
};
pub use segment::{
    decode as decode_response, Args, ResponseIndex, SegmentIndex, SegmentType, ToolCallIndex,
};
