//! `DedupWindow`: the exact sliding window of [`crate::dedup`], shared behind a mutex.

// The defaults in `#[pyo3(signature)]` are written as in the stub (`60000`), so
// the text signature matches it; the lint sees them outside any item.
#![allow(clippy::unreadable_literal)]

use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBool, PyBytes, PyList, PyString, PyTuple};

use super::errors::{type_name, CoreError};
use crate::dedup::{DedupWindow, IdKey, KeyHasher};

/// Every item of `ids` as a str, in order; a `TypeError` for the first that is not one.
fn collect_strs<'py>(ids: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyString>>> {
    let as_str = |id: Bound<'py, PyAny>| {
        id.cast_into::<PyString>().map_err(|e| {
            PyErr::from(CoreError::Type(format!(
                "ids must be str, got {}",
                type_name(&e.into_inner())
            )))
        })
    };
    // Lists and tuples, the common cases, by index: no iterator object, and no
    // user code runs while they are read.
    if let Ok(list) = ids.cast::<PyList>() {
        list.iter().map(as_str).collect()
    } else if let Ok(tuple) = ids.cast::<PyTuple>() {
        tuple.iter().map(as_str).collect()
    } else {
        ids.try_iter()?.map(|id| id.and_then(as_str)).collect()
    }
}

/// The wall clock in milliseconds since the Unix epoch.
fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Exact sliding-window de-duplication of event ids.
///
/// An id is a duplicate when it was first seen less than ``window_ms`` ago and
/// is among the last ``max_entries`` ids seen (at most 2**30 whatever
/// ``max_entries`` says). Canonical UUIDs are held as 128-bit integers
/// (case-insensitive); other ids are held whole. A hash only narrows the
/// search: every answer is confirmed on the id itself, so there are no false
/// positives.
#[pyclass(frozen, name = "DedupWindow", module = "openstarry._core")]
pub struct PyDedupWindow {
    inner: Mutex<DedupWindow>,
    /// The window's hasher (fixed for its life), to hash ids outside the lock.
    hasher: KeyHasher,
}

impl PyDedupWindow {
    fn wrap(window: DedupWindow) -> Self {
        PyDedupWindow {
            hasher: window.key_hasher(),
            inner: Mutex::new(window),
        }
    }

    /// How the window hashes ids, read without its lock: an ingestor hashes
    /// a chunk's ids before it takes the lock.
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// Run `f` on the window under its lock (the ingestor's access).
    ///
    /// `f` must not call back into Python code that could use this window.
    pub fn with_inner<R>(&self, f: impl FnOnce(&mut DedupWindow) -> R) -> R {
        f(&mut self.inner.lock())
    }

    /// [`PyDedupWindow::with_inner`] if the lock is free now, else `None`
    /// without waiting.
    pub fn try_with_inner<R>(&self, f: impl FnOnce(&mut DedupWindow) -> R) -> Option<R> {
        self.inner.try_lock().map(|mut w| f(&mut w))
    }
}

// The doc comments below are the Python docstrings, not rustdoc.
#[allow(clippy::doc_markdown)]
#[pymethods]
impl PyDedupWindow {
    #[new]
    #[pyo3(signature = (window_ms=60000, max_entries=1000000))]
    fn new(window_ms: i64, max_entries: i64) -> Result<Self, CoreError> {
        let window = u64::try_from(window_ms)
            .ok()
            .filter(|&w| w >= 1)
            .ok_or_else(|| {
                CoreError::Value(format!("window_ms must be at least 1, got {window_ms}"))
            })?;
        let max = usize::try_from(max_entries)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| {
                CoreError::Value(format!("max_entries must be at least 1, got {max_entries}"))
            })?;
        Ok(PyDedupWindow::wrap(DedupWindow::new(window, max)))
    }

    #[getter]
    fn window_ms(&self) -> u64 {
        self.inner.lock().window_ms()
    }

    #[getter]
    fn max_entries(&self) -> usize {
        self.inner.lock().max_entries()
    }

    /// True the first time ``id`` is seen within the window (keep it), False for a duplicate.
    ///
    /// ``now_ms`` defaults to the wall clock; time that goes backwards counts as
    /// no time passing.
    #[pyo3(signature = (id, now_ms=None))]
    fn check_and_insert(&self, id: &str, now_ms: Option<i64>) -> bool {
        let now = now_ms.unwrap_or_else(wall_clock_ms);
        self.inner.lock().check_and_insert(id, now)
    }

    /// ``check_and_insert`` for each id in order, in one call.
    ///
    /// ``ids`` is any iterable of str; a list or tuple is read without the
    /// iterator protocol, so it is the fastest. Every id is checked to be a str
    /// before any is recorded; the window's lock is taken and the clock read
    /// once for the whole batch.
    ///
    /// Raises:
    ///     TypeError: for an item that is not a str (nothing is recorded).
    #[pyo3(signature = (ids, now_ms=None))]
    fn check_and_insert_many<'py>(
        &self,
        ids: &Bound<'py, PyAny>,
        now_ms: Option<i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = ids.py();
        let strings = collect_strs(ids)?;
        let strs = strings
            .iter()
            .map(|s| s.to_str())
            .collect::<PyResult<Vec<&str>>>()?;
        let now = now_ms.unwrap_or_else(wall_clock_ms);
        let mut answers = Vec::with_capacity(strs.len());
        self.inner.lock().check_and_insert_keys(
            strs.iter().map(|id| IdKey::of(id.as_bytes())),
            now,
            &mut answers,
        );
        PyList::new(py, answers.into_iter().map(|new| PyBool::new(py, new)))
    }

    /// Whether ``id`` is in the window (without inserting it or expiring anything).
    fn __contains__(&self, id: &Bound<'_, PyAny>) -> bool {
        match id.cast::<PyString>().map(|s| s.to_str()) {
            Ok(Ok(id)) => self.inner.lock().contains(id),
            // A str that is not valid UTF-8 (lone surrogates) can never have been inserted.
            _ => false,
        }
    }

    /// Drop the entries older than the window; returns how many were dropped.
    #[pyo3(signature = (now_ms=None))]
    fn expire(&self, now_ms: Option<i64>) -> usize {
        let now = now_ms.unwrap_or_else(wall_clock_ms);
        self.inner.lock().expire(now)
    }

    fn clear(&self) {
        self.inner.lock().clear();
    }

    /// Bytes held by the window's tables.
    fn memory_usage(&self) -> usize {
        self.inner.lock().memory_usage()
    }

    /// The window's state as bytes, for :meth:`restore`.
    fn snapshot<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let data = self.inner.lock().snapshot();
        PyBytes::new(py, &data)
    }

    /// A window from :meth:`snapshot` bytes.
    ///
    /// Snapshots of every release so far (format version 1) restore.
    ///
    /// Raises:
    ///     openstarry.errors.DecodeError: for bytes that are not a snapshot,
    ///         or a snapshot of a format version this release cannot read
    ///         (the message names the version).
    #[staticmethod]
    fn restore(data: PyBackedBytes) -> Result<Self, CoreError> {
        let window = DedupWindow::restore(&data)?;
        Ok(PyDedupWindow::wrap(window))
    }

    fn __len__(&self) -> usize {
        self.inner.lock().len()
    }

    fn __repr__(&self) -> String {
        let window = self.inner.lock();
        format!(
            "<DedupWindow len={} window_ms={} max_entries={}>",
            window.len(),
            window.window_ms(),
            window.max_entries()
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDedupWindow>()?;
    Ok(())
}
