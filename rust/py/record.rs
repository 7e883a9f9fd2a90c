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
use crate::json::Span;

/// The input of one `Ingestor.ingest` call, kept alive by its queued lines.
pub enum Input {
    /// NDJSON: every line is a slice of this `bytes` object.
    Whole(Py<PyBytes>),
    /// A sequence of byte strings, one line each.
    Parts(Vec<Py<PyBytes>>),
}

impl Input {
    /// The bytes of `line` (a range for NDJSON, a part otherwise).
    fn bytes<'a>(&'a self, py: Python<'a>, line: &Line) -> &'a [u8] {
        match self {
            Input::Whole(whole) => &whole.as_bytes(py)[line.start..line.start + line.len as usize],
            Input::Parts(parts) => parts[line.start].as_bytes(py),
        }
    }
}

/// One decoded line of a [`Batch`], in one cache line: popping it reads
/// nothing else of the batch.
#[repr(align(64))]
pub struct Line {
    /// Where the line starts in an NDJSON input; its index among the parts otherwise.
    start: usize,
    len: u32,
    fields: Fields,
}

impl Line {
    /// Line `bytes` (its index among the parts, or where it starts in an
    /// NDJSON input), decoded to `envelope`.
    pub fn new(start: usize, bytes: &[u8], envelope: &EnvelopeIndex) -> Self {
        Line {
            start,
            len: u32::try_from(bytes.len()).expect("a line is shorter than 4 GiB"),
            fields: Fields::of(envelope, bytes.len()),
        }
    }
}

const _: () = assert!(std::mem::size_of::<Line>() == 64);

/// A line's decoded index: packed when it fits (the common case), boxed otherwise.
enum Fields {
    Packed(Packed),
    Boxed(Box<EnvelopeIndex>),
}

/// An [`EnvelopeIndex`] of a line shorter than 64 KiB, without escapes in
/// its strings and without unknown fields: its spans as 16-bit offsets.
struct Packed {
    timestamp: i64,
    /// id, traceId, source, sessionId, type, payload, parentId: (start, end).
    spans: [(u16, u16); 7],
    priority: u8,
    parent: bool,
}

impl Fields {
    fn of(idx: &EnvelopeIndex, len: usize) -> Self {
        let spans = [
            idx.id,
            idx.trace_id,
            idx.source,
            idx.session_id,
            idx.type_,
            idx.payload,
            idx.parent_id.unwrap_or_default(),
        ];
        if len > usize::from(u16::MAX) || !idx.extra.is_empty() || spans.iter().any(|s| s.escaped())
        {
            return Fields::Boxed(Box::new(idx.clone()));
        }
        Fields::Packed(Packed {
            timestamp: idx.timestamp,
            spans: spans.map(|s| (s.start() as u16, s.end() as u16)),
            priority: idx.priority,
            parent: idx.parent_id.is_some(),
        })
    }

    /// The index back.
    #[inline]
    fn index(&self) -> EnvelopeIndex {
        match self {
            Fields::Packed(p) => {
                let span = |i: usize| {
                    let (a, b) = p.spans[i];
                    Span::new(usize::from(a), usize::from(b), false)
                };
                EnvelopeIndex {
                    id: span(0),
                    timestamp: p.timestamp,
                    trace_id: span(1),
                    source: span(2),
                    session_id: span(3),
                    priority: p.priority,
                    type_: span(4),
                    payload: span(5),
                    parent_id: p.parent.then(|| span(6)),
                    extra: Vec::new(),
                }
            }
            Fields::Boxed(idx) => (**idx).clone(),
        }
    }

    /// The event's id span.
    fn id(&self) -> Span {
        match self {
            Fields::Packed(p) => {
                Span::new(usize::from(p.spans[0].0), usize::from(p.spans[0].1), false)
            }
            Fields::Boxed(idx) => idx.id,
        }
    }
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
        line.fields
            .id()
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
            Input::Parts(parts) => Wire::Shared(parts[line.start].clone_ref(py)),
        };
        Ok(PyEvent::from_index(wire, line.fields.index())
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
