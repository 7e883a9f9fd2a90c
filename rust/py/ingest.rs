//! `Ingestor`: NDJSON or a list of byte strings to the queue in one call.

use std::sync::Arc;

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use pyo3::PyTraverseError;

use super::dedup::PyDedupWindow;
use super::errors::CoreError;
use super::event::{as_bytes_object, limits_arg};
use super::queue::PyEventQueue;
use super::record::{into_objects, Batch, Input, Item, Line};
use crate::dedup::DedupWindow;
use crate::envelope;
use crate::ingest::{
    admit_keyed, decode_lines, Admitted, ChunkKeys, Decoded, NdjsonLines, CHUNK_LINES,
};
use crate::json::{Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH};
use crate::queue::{Overflow, PriorityQueue};

/// What one :meth:`Ingestor.ingest` call did.
#[pyclass(frozen, name = "IngestResult", module = "openstarry._core")]
pub struct PyIngestResult {
    /// Events decoded, new, and queued.
    #[pyo3(get)]
    accepted: usize,
    /// Valid events dropped as already seen within the window.
    #[pyo3(get)]
    duplicates: usize,
    invalid: Vec<(usize, String)>,
    rejected: Vec<usize>,
    shed: Vec<Py<PyAny>>,
}

#[pymethods]
impl PyIngestResult {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for item in &self.shed {
            visit.call(item)?;
        }
        Ok(())
    }

    /// (line index, message) for each line that could not be decoded.
    #[getter]
    fn invalid<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .invalid
            .iter()
            .map(|(i, m)| {
                PyTuple::new(
                    py,
                    [
                        i.into_pyobject(py)?.into_any(),
                        m.into_pyobject(py)?.into_any(),
                    ],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Line indexes of valid, new events the queue refused (full, ``"reject"`` policy, or closed).
    ///
    /// They are not recorded in the dedup window, so a retry is not a duplicate.
    #[getter]
    fn rejected<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.rejected)
    }

    /// Items the queue dropped under the ``"shed"`` policy to make room.
    #[getter]
    fn shed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.shed.iter().map(|s| s.clone_ref(py)))
    }

    fn __repr__(&self) -> String {
        format!(
            "IngestResult(accepted={}, duplicates={}, invalid={}, rejected={}, shed={})",
            self.accepted,
            self.duplicates,
            self.invalid.len(),
            self.rejected.len(),
            self.shed.len()
        )
    }
}

/// Bytes to queue in one call: decode, validate, de-duplicate, enqueue.
#[pyclass(frozen, name = "Ingestor", module = "openstarry._core")]
pub struct PyIngestor {
    queue: Py<PyEventQueue>,
    dedup: Option<Py<PyDedupWindow>>,
    limits: Limits,
}

#[pymethods]
impl PyIngestor {
    #[new]
    #[pyo3(signature = (queue, dedup=None, *, max_line_bytes=DEFAULT_MAX_BYTES, max_depth=DEFAULT_MAX_DEPTH))]
    fn py_new(
        queue: Py<PyEventQueue>,
        dedup: Option<Py<PyDedupWindow>>,
        max_line_bytes: usize,
        max_depth: usize,
    ) -> PyResult<Self> {
        Ok(PyIngestor {
            queue,
            dedup,
            limits: limits_arg(max_line_bytes, max_depth)?,
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.queue)?;
        if let Some(dedup) = &self.dedup {
            visit.call(dedup)?;
        }
        Ok(())
    }

    #[getter]
    fn queue(&self, py: Python<'_>) -> Py<PyEventQueue> {
        self.queue.clone_ref(py)
    }

    #[getter]
    fn dedup(&self, py: Python<'_>) -> Option<Py<PyDedupWindow>> {
        self.dedup.as_ref().map(|d| d.clone_ref(py))
    }

    /// Ingest NDJSON bytes (one envelope a line) or a sequence of byte strings.
    ///
    /// Every valid line is ingested even when other lines are invalid. A
    /// ``\r\n`` line ending is accepted; the empty piece after a final newline
    /// is not a line; any other empty line is reported invalid.
    ///
    /// The lines are decoded, validated, de-duplicated and queued with the GIL
    /// released: other Python threads run meanwhile, and threads ingesting at
    /// once use as many cores. The queue holds each line decoded; its
    /// :class:`Event` is made when it is popped.
    ///
    /// Events are not copied out of NDJSON input: each holds a reference to the
    /// ``bytes`` object passed in (or to one copy of a ``bytearray`` or
    /// ``memoryview``), which stays alive while any of its events (or of its
    /// lines in the queue) does. To keep one event long after the rest of its
    /// batch is gone, keep a copy (``decode_event(encode_event(event))``) so
    /// the batch can be freed.
    #[pyo3(signature = (data, now_ms=None))]
    fn ingest(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        now_ms: Option<i64>,
    ) -> PyResult<PyIngestResult> {
        // The input, kept alive by the queued lines that borrow from it.
        let input = Arc::new(
            if data.is_instance_of::<PyList>() || data.is_instance_of::<PyTuple>() {
                Input::Parts(
                    data.try_iter()?
                        .enumerate()
                        .map(|(i, item)| {
                            let item = item?;
                            item.cast::<PyBytes>()
                                .map(|b| b.clone().unbind())
                                .map_err(|_| {
                                    CoreError::Type(format!("item {i} of the batch is not bytes"))
                                        .into()
                                })
                        })
                        .collect::<PyResult<_>>()?,
                )
            } else {
                Input::Whole(as_bytes_object(data)?)
            },
        );
        // Byte strings are read with the interpreter; NDJSON without it.
        let (parts, whole): (Vec<&[u8]>, &[u8]) = match &*input {
            Input::Parts(parts) => (parts.iter().map(|b| b.as_bytes(py)).collect(), &[]),
            Input::Whole(whole) => (Vec::new(), whole.as_bytes(py)),
        };
        let now = now_ms.unwrap_or_else(envelope::now_ms);
        let queue = &self.queue.get().inner;
        let dedup = self.dedup.as_ref().map(Py::get);
        let limits = &self.limits;
        // Other Python threads run while this one works, unless the input is
        // too small for handing the interpreter over to pay.
        let detach = parts.len() >= DETACH_FROM_LINES || whole.len() >= DETACH_FROM_BYTES;
        // Under the shed policy, forgetting a shed event's id reads its bytes,
        // which needs the interpreter: admission then keeps it. Otherwise the
        // whole call after reading the input runs without it.
        let shed = queue.overflow() == Overflow::Shed;
        let (invalid, mut total, pending) = without_gil(py, detach, || {
            let mut invalid = Vec::new();
            let mut total = Totals::default();
            let mut pending = Vec::new();
            // Chunks keyed and waiting for the window's lock, in order, and
            // the room to make in the window at its next hold.
            let mut backlog = Backlog::default();
            // NDJSON is split as it is decoded, in one pass; byte strings
            // are lines already.
            let mut reader = match &*input {
                Input::Whole(_) => Some(NdjsonLines::new(whole)),
                Input::Parts(_) => {
                    backlog.reserve(dedup, shed, parts.len());
                    None
                }
            };
            let mut parts = parts.chunks(CHUNK_LINES);
            let mut first = 0;
            // A chunk at a time, decoded then admitted at once: its lines are
            // still in cache when their ids are looked up.
            loop {
                let (read, decoded) = match &mut reader {
                    Some(reader) => {
                        let mut decoded = Vec::with_capacity(CHUNK_LINES);
                        let read = reader.read(CHUNK_LINES, limits, &mut decoded, &mut invalid);
                        if first == 0 {
                            backlog.reserve(dedup, shed, estimate_lines(reader));
                        }
                        (read, decoded)
                    }
                    None => match parts.next() {
                        Some(chunk) => (
                            chunk.len(),
                            decode_lines(chunk.iter().copied(), first, limits, &mut invalid),
                        ),
                        None => (0, Vec::new()),
                    },
                };
                if read == 0 {
                    break;
                }
                first += read;
                let mut items = queue_items(&input, &decoded, whole);
                match dedup {
                    _ if shed => pending.push((decoded, items)),
                    // Refused and duplicate lines are this call's own: they
                    // are dropped here, without the interpreter.
                    None => total.add(admit_chunk(&decoded, &mut items, None, now, queue, |_| {
                        None
                    })),
                    Some(d) => backlog.admit_or_wait((decoded, items), d, now, queue, &mut total),
                }
            }
            if let Some(d) = dedup {
                let admitted = d.with_inner(|w| backlog.admit_all(w, now, queue, &mut total));
                drop(admitted);
            }
            (invalid, total, pending)
        });
        for (decoded, mut items) in pending {
            total.add(admit_chunk(
                &decoded,
                &mut items,
                dedup,
                now,
                queue,
                |item| item.event_id(py),
            ));
        }
        Ok(PyIngestResult {
            accepted: total.accepted,
            duplicates: total.duplicates,
            invalid,
            rejected: total.rejected,
            shed: into_objects(py, total.shed)?,
        })
    }
}

/// Inputs below these sizes (byte strings, NDJSON bytes) are ingested with the
/// interpreter held throughout: releasing it and taking it back costs about as
/// much as decoding a few lines.
const DETACH_FROM_LINES: usize = 32;
const DETACH_FROM_BYTES: usize = 8 * 1024;

/// Run `f` with the interpreter released when `detach` is set.
fn without_gil<T: Send>(py: Python<'_>, detach: bool, f: impl FnOnce() -> T + Send) -> T {
    if detach {
        py.detach(f)
    } else {
        f()
    }
}

/// What the chunks of one call added up to.
#[derive(Default)]
struct Totals {
    accepted: usize,
    duplicates: usize,
    rejected: Vec<usize>,
    shed: Vec<Item>,
}

impl Totals {
    /// Count one chunk in; the items it refused are dropped.
    fn add(&mut self, admitted: Admitted<Item>) {
        self.accepted += admitted.accepted;
        self.duplicates += admitted.duplicates;
        self.rejected.extend(admitted.rejected);
        self.shed.extend(admitted.shed);
    }
}

/// How many lines NDJSON holds in all, judged by the lines read so far (only
/// the window's capacity depends on it).
fn estimate_lines(reader: &NdjsonLines<'_>) -> usize {
    let lines = reader.lines_read();
    let (read, left) = reader.bytes();
    lines + (left as u128 * lines as u128).div_ceil(read.max(1) as u128) as usize
}

/// The queue item of each decoded line (slices of `base` for NDJSON input),
/// which owns its decoded index.
///
/// Runs without the interpreter: it reads the input's bytes and nothing else.
fn queue_items(input: &Arc<Input>, decoded: &[Decoded<'_>], base: &[u8]) -> Vec<Option<Item>> {
    let owned = decoded
        .iter()
        .map(|d| {
            // An NDJSON line lies within the input; a part is its own object
            // (and `base` is empty).
            let start = if base.is_empty() {
                d.index
            } else {
                d.bytes.as_ptr() as usize - base.as_ptr() as usize
            };
            Line::new(start, d.bytes, &d.envelope)
        })
        .collect();
    let batch = Arc::new(Batch {
        input: Arc::clone(input),
        lines: owned,
    });
    (0..decoded.len() as u32)
        .map(|i| Some(Item::Line(Arc::clone(&batch), i)))
        .collect()
}

/// Screen, enqueue and record a chunk under one hold of the window's lock and
/// one of the queue's: two ingestors sharing the window cannot both take an
/// id, and other threads get the locks between calls. The ids are parsed,
/// hashed and checked against each other before the lock is taken, so threads
/// sharing a window hold it only to look them up and record them. No Python
/// code runs in here.
fn admit_chunk(
    decoded: &[Decoded<'_>],
    items: &mut [Option<Item>],
    dedup: Option<&PyDedupWindow>,
    now: i64,
    queue: &PriorityQueue<Item>,
    id_of: impl Fn(&Item) -> Option<Vec<u8>>,
) -> Admitted<Item> {
    match dedup {
        Some(d) => {
            let keys = ChunkKeys::new(decoded, d.hasher());
            d.with_inner(|w| admit_keyed(decoded, items, Some((w, &keys)), now, queue, id_of))
        }
        None => admit_keyed(decoded, items, None, now, queue, id_of),
    }
}

/// A chunk decoded, its queue items, and its keys, waiting for the window.
type Waiting<'a> = (Vec<Decoded<'a>>, Vec<Option<Item>>, ChunkKeys<'a>);

/// How many chunks a thread decodes ahead while another thread holds the
/// window, before it waits for the window's lock: at most 65,536 lines held
/// decoded, a few hundred bytes each (about what the queue holds for them
/// once they are admitted). A hold lasts microseconds, so a thread rarely
/// has more than one chunk waiting; the depth is for a holder that the
/// system takes off its core mid-hold for a time slice, which the other
/// thread then rides out decoding instead of sleeping on the lock. Measured
/// with both threads pinned to one core (calls of 40 chunks), a shared
/// `Ingestor` against one each: 5% slower at a depth of 4 chunks, 1% to 2%
/// at 32, no difference at 256.
const MOST_WAITING: usize = 256;

/// What one call has for the window while another thread may hold it: the
/// chunks keyed and waiting for its lock, in order, and the room the window
/// should make for the call's lines. Both are done at the next hold of the
/// lock, so a thread never waits on the window only to grow it.
#[derive(Default)]
struct Backlog<'a> {
    waiting: Vec<Waiting<'a>>,
    /// Ids to make room for at the next hold (0: none).
    reserve: usize,
}

impl<'a> Backlog<'a> {
    /// Have the window make room for `lines` more ids: at the next hold, or
    /// at once under the shed policy, whose chunks are admitted later on their
    /// own (the table grows once for the whole call, not by doublings chunk
    /// after chunk: profiled, a tenth of its work).
    fn reserve(&mut self, dedup: Option<&PyDedupWindow>, shed: bool, lines: usize) {
        match dedup {
            Some(d) if shed => d.with_inner(|w| w.reserve(lines)),
            Some(_) => self.reserve = lines,
            None => {}
        }
    }

    /// Key a chunk and add it to the waiting ones, then admit them all, in
    /// order, if the window's lock is free or too many wait; otherwise leave
    /// them waiting. A thread that finds the window held by another decodes
    /// its next chunk instead of sleeping on the lock.
    fn admit_or_wait(
        &mut self,
        (decoded, items): (Vec<Decoded<'a>>, Vec<Option<Item>>),
        dedup: &PyDedupWindow,
        now: i64,
        queue: &PriorityQueue<Item>,
        total: &mut Totals,
    ) {
        // The hasher is copied: it sits by the window's lock, which the
        // other thread writes while this one hashes.
        let keys = ChunkKeys::new(&decoded, &dedup.hasher().clone());
        self.waiting.push((decoded, items, keys));
        let full = self.waiting.len() >= MOST_WAITING;
        let admit = |w: &mut DedupWindow| self.admit_all(w, now, queue, total);
        let admitted = if full {
            Some(dedup.with_inner(admit))
        } else {
            dedup.try_with_inner(admit)
        };
        // Freed with the lock released.
        drop(admitted);
    }

    /// Make the room asked for, then admit every waiting chunk, in order,
    /// under one hold of the window. Returns the chunks admitted, for the
    /// caller to free once the lock is released (their duplicate lines
    /// release their references to the input).
    #[must_use]
    fn admit_all(
        &mut self,
        window: &mut DedupWindow,
        now: i64,
        queue: &PriorityQueue<Item>,
        total: &mut Totals,
    ) -> Vec<Waiting<'a>> {
        if self.reserve > 0 {
            window.reserve(std::mem::take(&mut self.reserve));
        }
        let mut admitted = std::mem::take(&mut self.waiting);
        for (decoded, items, keys) in &mut admitted {
            total.add(admit_keyed(
                decoded,
                items,
                Some((&mut *window, keys)),
                now,
                queue,
                |_| None,
            ));
        }
        admitted
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIngestor>()?;
    m.add_class::<PyIngestResult>()?;
    Ok(())
}
