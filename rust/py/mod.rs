//! The `PyO3` bindings: `openstarry._core`, re-exported as `openstarry.core`.

use pyo3::prelude::*;

pub mod codec;
pub mod dedup;
pub mod emitter;
pub mod errors;
pub mod event;
pub mod eventref;
pub mod http;
pub mod ingest;
pub mod latency;
pub mod pyjson;
pub mod queue;
pub mod record;
pub mod retrieval;
pub mod slots;

/// The one registration point of the extension module.
// `gil_used = true`: on a free-threaded CPython (3.13t, 3.14t) importing the
// module turns the GIL back on, with a `RuntimeWarning` (none if the GIL was
// asked for, `PYTHON_GIL=1`). PyO3 0.28 and later default to `false`, a claim
// that every object here is safe to share between threads running at once.
// The review of the shared mutable state behind that choice:
//
// - `EventQueue`: lanes, counters and the closed flag sit behind one
//   `parking_lot` mutex with a condvar; a blocking pop waits with the
//   interpreter detached; no Python code runs with the mutex held (refused or
//   shed items are dropped after it is released). Safe without the GIL.
// - `DedupWindow`: one mutex around the set and its ring; ids are read into
//   `&str` before the lock is taken. Safe without the GIL.
// - `Ingestor`: reads its input with the GIL, then decodes, screens and
//   enqueues with it released, holding the window's mutex and the queue's a
//   chunk at a time and running no Python code in there. The queue keeps each
//   line as Rust data (an `Arc` of the input object and the line's index);
//   its `Event` is made by the pop, with the GIL. Under the shed policy the
//   admission keeps the GIL to read shed events' ids. Safe without the GIL.
// - `LatencyRecorder`: its histogram sits behind one `parking_lot` mutex,
//   held for one record or read and never across Python code. Safe.
// - `ToolIndex`: immutable once built; searches share it read-only. Safe.
// - `SlotsMaker`: immutable once made (its class, names and defaults). Safe.
// - the exception classes: `PyOnceLock`, which is made for this. Safe.
// - `Event`: its decoded payload is a `OnceLock` (safe), but `Event` leaves
//   the cycle collector's tracking on creation and rejoins it when its payload
//   is first read (rust/py/event.rs): "is it tracked? if not, track it" is one
//   step only under the GIL. Two threads reading a fresh event's payload at
//   once on a free-threaded build could both track it, and CPython aborts the
//   process on an object tracked twice.
//
// So the GIL stays until that step is made atomic (or skipped on
// free-threaded builds) and the thread tests have run on a free-threaded
// interpreter, which this project's machines do not have yet. The cp314t
// wheels are built all the same, so that free-threaded users can install
// openstarry without a Rust toolchain.
#[pymodule(gil_used = true)]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    event::register(m)?;
    eventref::register(m)?;
    codec::register(m)?;
    queue::register(m)?;
    emitter::register(m)?;
    dedup::register(m)?;
    ingest::register(m)?;
    latency::register(m)?;
    http::register(m)?;
    retrieval::register(m)?;
    slots::register(m)?;
    Ok(())
}
