//! openstarry's hot core.
//!
//! The logic lives in plain Rust modules with no `PyO3` in them, so `cargo test`
//! needs no Python and another runtime could embed the same code. The `PyO3`
//! wrappers sit apart in [`py`], behind the `python` feature that maturin turns on.

pub mod dedup;
pub mod envelope;
pub mod ingest;
pub mod json;
pub mod queue;
pub mod retrieval;
pub mod segment;

#[cfg(feature = "python")]
pub mod py;
