//! `DedupWindow`: the exact sliding window of [`crate::dedup`], shared behind a mutex.

// The defaults in `#[pyo3(signature)]` are written as in the stub (`60000`), so
// the text signature matches it; the lint sees them outside any item.
#![allow(clippy::unreadable_literal)]

use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyString};

use super::errors::{type_name, CoreError};
use crate::dedup::DedupWindow;

/// The wall clock in milliseconds since the Unix epoch.
fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Exact sliding-window de-duplication of event ids.
///
/// An id is a duplicate when it was first seen less than ``window_ms`` ago and
/// is among the last ``max_entries`` ids seen. Canonical UUIDs are held as
/// 128-bit integers (case-insensitive); other ids are held whole.
#[pyclass(frozen, name = "DedupWindow", module = "openstarry._core")]
pub struct PyDedupWindow {
    inner: Mutex<DedupWindow>,
}

impl PyDedupWindow {
    /// Run `f` on the window under its lock (the ingestor's access).
    ///
    /// `f` must not call back into Python code that could use this window.
    pub fn with_inner<R>(&self, f: impl FnOnce(&mut DedupWindow) -> R) -> R {
        f(&mut self.inner.lock())
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
        Ok(PyDedupWindow {
            inner: Mutex::new(DedupWindow::new(window, max)),
        })
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
    #[pyo3(signature = (ids, now_ms=None))]
    fn check_and_insert_many(
        &self,
        ids: &Bound<'_, PyAny>,
        now_ms: Option<i64>,
    ) -> PyResult<Vec<bool>> {
        // Run the iterable and check every id before taking the lock.
        let objects = ids
            .try_iter()?
            .map(|id| {
                let id = id?;
                id.cast_into::<PyString>().map_err(|e| {
                    CoreError::Type(format!(
                        "ids must be str, got {}",
                        type_name(&e.into_inner())
                    ))
                    .into()
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let strs = objects
            .iter()
            .map(|s| s.to_str())
            .collect::<PyResult<Vec<&str>>>()?;
        let now = now_ms.unwrap_or_else(wall_clock_ms);
        let mut window = self.inner.lock();
        Ok(strs
            .into_iter()
            .map(|id| window.check_and_insert(id, now))
            .collect())
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
    /// Raises:
    ///     openstarry.errors.DecodeError: for bytes that are not a snapshot.
    #[staticmethod]
    fn restore(data: PyBackedBytes) -> Result<Self, CoreError> {
        let window = DedupWindow::restore(&data)?;
        Ok(PyDedupWindow {
            inner: Mutex::new(window),
        })
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
