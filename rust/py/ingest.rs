//! `Ingestor`: NDJSON or a list of byte strings to the queue in one call.

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use pyo3::PyTraverseError;

use super::dedup::PyDedupWindow;
use super::errors::CoreError;
use super::event::{as_bytes_object, limits_arg, PyEvent, Wire};
use super::queue::PyEventQueue;
use crate::envelope;
use crate::ingest::{admit, decode_lines, split_lines, CHUNK_LINES};
use crate::json::{Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH};

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
    /// Events are not copied out of NDJSON input: each holds a reference to the
    /// ``bytes`` object passed in (or to one copy of a ``bytearray`` or
    /// ``memoryview``), which stays alive while any of its events does. To
    /// keep one event long after the rest of its batch is gone, keep a copy
    /// (``decode_event(encode_event(event))``) so the batch can be freed.
    #[pyo3(signature = (data, now_ms=None))]
    fn ingest(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        now_ms: Option<i64>,
    ) -> PyResult<PyIngestResult> {
        // Keep every input buffer alive while the lines borrow from it.
        let whole: Option<Py<PyBytes>>;
        let parts: Vec<Py<PyBytes>>;
        let lines: Vec<&[u8]> = if data.is_instance_of::<PyList>()
            || data.is_instance_of::<PyTuple>()
        {
            parts = data
                .try_iter()?
                .enumerate()
                .map(|(i, item)| {
                    let item = item?;
                    item.cast::<PyBytes>()
                        .map(|b| b.clone().unbind())
                        .map_err(|_| {
                            CoreError::Type(format!("item {i} of the batch is not bytes")).into()
                        })
                })
                .collect::<PyResult<_>>()?;
            whole = None;
            parts.iter().map(|b| b.as_bytes(py)).collect()
        } else {
            whole = Some(as_bytes_object(data)?);
            parts = Vec::new();
            split_lines(whole.as_ref().map_or(&[][..], |w| w.as_bytes(py))).collect()
        };

        let now = now_ms.unwrap_or_else(envelope::now_ms);
        let mut result = PyIngestResult {
            accepted: 0,
            duplicates: 0,
            invalid: Vec::new(),
            rejected: Vec::new(),
            shed: Vec::new(),
        };
        // The window's table grows once for the whole call, not by doublings
        // chunk after chunk (profiled: a tenth of the window's work).
        if let Some(d) = &self.dedup {
            d.get().with_inner(|w| w.reserve(lines.len()));
        }
        // A chunk at a time: each phase's working set stays in cache, and each
        // lock is taken once per chunk.
        for (n, chunk) in lines.chunks(CHUNK_LINES).enumerate() {
            let first = n * CHUNK_LINES;
            let decoded = decode_lines(
                chunk.iter().copied(),
                first,
                &self.limits,
                &mut result.invalid,
            );
            // Build every line's event first, outside every lock: allocation
            // may run arbitrary Python code (a collection, a finalizer), and
            // with it another thread's ingest.
            let mut items: Vec<Option<Py<PyAny>>> = Vec::with_capacity(decoded.len());
            for d in &decoded {
                // A line given as its own bytes object is kept as is; an
                // NDJSON line is a slice of the input, kept by reference.
                let buf = match &whole {
                    None => Wire::Shared(parts[d.index].clone_ref(py)),
                    Some(w) => Wire::slice_of(py, w, d.bytes),
                };
                items.push(Some(
                    PyEvent::from_index(buf, d.envelope.clone())
                        .into_py(py)?
                        .into_any(),
                ));
            }
            // Then screen, enqueue and record with the window held throughout:
            // two ingestors sharing it cannot both take an id. No Python code
            // runs in there.
            let queue = &self.queue.get().inner;
            let id_of = |item: &Py<PyAny>| shed_id(py, item);
            let admitted = match &self.dedup {
                Some(d) => d
                    .get()
                    .with_inner(|w| admit(&decoded, &mut items, Some(w), now, queue, id_of)),
                None => admit(&decoded, &mut items, None, now, queue, id_of),
            };
            result.accepted += admitted.accepted;
            result.duplicates += admitted.duplicates;
            result.rejected.extend(admitted.rejected);
            result.shed.extend(admitted.shed);
            // The events of duplicate and refused lines are dropped here, after the locks.
            drop(admitted.refused);
            drop(items);
        }
        Ok(result)
    }
}

/// The id of an item the queue shed, if it is an event.
fn shed_id(py: Python<'_>, item: &Py<PyAny>) -> Option<Vec<u8>> {
    let event = item.bind(py).cast_exact::<PyEvent>().ok()?;
    Some(event.get().id_bytes(py))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIngestor>()?;
    m.add_class::<PyIngestResult>()?;
    Ok(())
}
