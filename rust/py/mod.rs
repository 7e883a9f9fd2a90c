//! The `PyO3` bindings: `openstarry._core`, re-exported as `openstarry.core`.

use pyo3::prelude::*;

pub mod codec;
pub mod dedup;
pub mod errors;
pub mod event;
pub mod ingest;
pub mod pyjson;
pub mod queue;
pub mod retrieval;

/// The one registration point of the extension module.
#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    event::register(m)?;
    codec::register(m)?;
    queue::register(m)?;
    dedup::register(m)?;
    ingest::register(m)?;
    retrieval::register(m)?;
    Ok(())
}
