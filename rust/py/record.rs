//! What an `EventQueue` holds: a Python object, or an ingested line that
//! becomes an `Event` only when it is popped.
//!
//! `Ingestor.ingest` decodes, validates, de-duplicates and queues without the
//! interpreter; making the Python objects is left to the consumer's pop, so
//! threads that ingest run in parallel up to the queue.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::event::{PyEvent, Wire};
use crate::envelope::EnvelopeIndex;

/// The input of one `Ingestor.ingest` call, kept alive by its queued lines.
pub enum Input {
    /// NDJSON: every line is a slice of this `bytes` object.
    Whole(Py<PyBytes>),
    /// A sequence of byte strings, one line each.
    Parts(Vec<Py<PyBytes>>),
}

impl Input {
    /// The bytes of line `line` (`line.index` for parts, the range for NDJSON).
    fn bytes<'a>(&'a self, py: Python<'a>, line: &Line) -> &'a [u8] {
        match self {
            Input::Whole(whole) => &whole.as_bytes(py)[line.start..line.start + line.len as usize],
            Input::Parts(parts) => parts[line.index].as_bytes(py),
        }
    }
}

/// One decoded line of a [`Batch`].
pub struct Line {
    /// The line's number in the input (its index among the parts).
    pub index: usize,
    /// Where the line starts in an NDJSON input (0 for parts).
    pub start: usize,
    pub len: u32,
    pub envelope: EnvelopeIndex,
}

/// The decoded lines of one ingest call over its input.
pub struct Batch {
    pub input: Arc<Input>,
    pub lines: Vec<Line>,
}

impl Batch {
    /// The id of line `i` as bytes.
    fn id_bytes(&self, py: Python<'_>, i: usize) -> Vec<u8> {
        let line = &self.lines[i];
        line.envelope
            .id
            .as_bytes(self.input.bytes(py, line))
            .into_owned()
    }

    /// The event of line `i`, over the input's bytes (no copy).
    fn event(&self, py: Python<'_>, i: usize) -> PyResult<Py<PyAny>> {
        let line = &self.lines[i];
        let wire = match &*self.input {
            Input::Whole(whole) => Wire::Slice {
                whole: whole.clone_ref(py),
                start: line.start,
                len: line.len,
            },
            Input::Parts(parts) => Wire::Shared(parts[line.index].clone_ref(py)),
        };
        Ok(PyEvent::from_index(wire, line.envelope.clone())
            .into_py(py)?
            .into_any())
    }
}

/// An item of an `EventQueue`.
pub enum Item {
    /// An object pushed from Python.
    Object(Py<PyAny>),
    /// Line `.1` of an ingested batch: an `Event` once popped.
    Line(Arc<Batch>, u32),
}

impl Item {
    /// The Python object: the one pushed, or a new `Event` for an ingested line.
    #[inline]
    pub fn into_object(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self {
            Item::Object(object) => Ok(object),
            Item::Line(batch, i) => line_event(py, &batch, i),
        }
    }

    /// The id of the item if it is an event (the ingestor's view of what was shed).
    pub fn event_id(&self, py: Python<'_>) -> Option<Vec<u8>> {
        match self {
            Item::Object(object) => {
                let event = object.bind(py).cast_exact::<PyEvent>().ok()?;
                Some(event.get().id_bytes(py))
            }
            Item::Line(batch, i) => Some(batch.id_bytes(py, *i as usize)),
        }
    }

    /// The Python object this item holds, if it was pushed as one.
    pub fn as_object(&self) -> Option<&Py<PyAny>> {
        match self {
            Item::Object(object) => Some(object),
            Item::Line(..) => None,
        }
    }
}

/// The event of an ingested line; out of line, so that popping pushed objects
/// stays a move.
#[inline(never)]
fn line_event(py: Python<'_>, batch: &Batch, i: u32) -> PyResult<Py<PyAny>> {
    batch.event(py, i as usize)
}

/// An item returned to Python (a popped list is built from the items directly).
impl<'py> IntoPyObject<'py> for Item {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    #[inline]
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.into_object(py)?.into_bound(py))
    }
}

/// Every item as its Python object, in order.
pub fn into_objects(py: Python<'_>, items: Vec<Item>) -> PyResult<Vec<Py<PyAny>>> {
    items.into_iter().map(|item| item.into_object(py)).collect()
}
