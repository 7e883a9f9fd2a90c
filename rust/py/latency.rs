//! `LatencyRecorder`: the HDR histogram of [`crate::latency`], behind a mutex.

// The defaults are written as in the stub (`3600000000000`): the lint sees them outside any item.
#![allow(clippy::unreadable_literal)]

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::errors::CoreError;
use crate::latency::{monotonic_ns, LatencyError, LatencyRecorder, MAX_SIGNIFICANT_FIGURES};

impl From<LatencyError> for CoreError {
    fn from(e: LatencyError) -> Self {
        CoreError::Value(e.to_string())
    }
}

/// A nanosecond count from Python: a `ValueError` for a negative one.
fn nanoseconds(value: i64, what: &str) -> Result<u64, CoreError> {
    u64::try_from(value)
        .map_err(|_| CoreError::Value(format!("{what} must not be negative, got {value}")))
}

/// Latencies in nanoseconds, counted in an HDR histogram (the ``hdrhistogram`` crate).
///
/// Recording is one call into Rust with a fixed memory footprint, whatever the
/// number of values. Values from 0 to ``highest_ns`` (one hour by default)
/// are kept to ``significant_figures`` significant figures (3: percentiles
/// within 0.1 %); a larger value is recorded as ``highest_ns`` and counted in
/// :attr:`saturated`, so nothing is dropped.
///
/// :meth:`now_ns` is the recorder's clock (monotonic; ``CLOCK_MONOTONIC`` on
/// Linux, counted from the first read in the process): stamp intended times
/// with it and :meth:`record_since` measures from them on the same clock.
/// Safe to share between threads (one lock per call).
#[pyclass(frozen, name = "LatencyRecorder", module = "openstarry._core")]
pub struct PyLatencyRecorder {
    inner: Mutex<LatencyRecorder>,
}

// The doc comments below are the Python docstrings, not rustdoc.
#[allow(clippy::doc_markdown)]
#[pymethods]
impl PyLatencyRecorder {
    #[new]
    #[pyo3(signature = (highest_ns=3600000000000, significant_figures=3))]
    fn new(highest_ns: i64, significant_figures: i64) -> Result<Self, CoreError> {
        let highest = nanoseconds(highest_ns, "highest_ns")?;
        let figures = u8::try_from(significant_figures)
            .ok()
            .filter(|f| (1..=MAX_SIGNIFICANT_FIGURES).contains(f))
            .ok_or_else(|| {
                CoreError::Value(format!(
                    "significant_figures must be 1 to {MAX_SIGNIFICANT_FIGURES}, got {significant_figures}"
                ))
            })?;
        Ok(PyLatencyRecorder {
            inner: Mutex::new(LatencyRecorder::new(highest, figures)?),
        })
    }

    /// Nanoseconds on the recorder's monotonic clock (the same for every recorder).
    #[staticmethod]
    fn now_ns() -> u64 {
        monotonic_ns()
    }

    /// Record one latency of ``ns`` nanoseconds.
    ///
    /// Raises:
    ///     ValueError: ``ns`` is negative.
    fn record(&self, ns: i64) -> Result<(), CoreError> {
        let ns = nanoseconds(ns, "ns")?;
        self.inner.lock().record(ns);
        Ok(())
    }

    /// Record the time from ``intended_ns`` (a :meth:`now_ns` reading) to now; returns it.
    ///
    /// The clock is read in Rust, inside this call. An ``intended_ns`` still to
    /// come records 0.
    ///
    /// Raises:
    ///     ValueError: ``intended_ns`` is negative.
    fn record_since(&self, intended_ns: i64) -> Result<u64, CoreError> {
        let intended = nanoseconds(intended_ns, "intended_ns")?;
        Ok(self.inner.lock().record_since(intended))
    }

    /// The latency at ``percentile`` (0 to 100), in nanoseconds; 0 when nothing was recorded.
    ///
    /// It is the highest value equivalent to the exact one at the recorder's
    /// precision (never below it).
    ///
    /// Raises:
    ///     ValueError: ``percentile`` is outside 0..100 or NaN.
    fn value_at_percentile(&self, percentile: f64) -> Result<u64, CoreError> {
        Ok(self.inner.lock().value_at_percentile(percentile)?)
    }

    /// How many latencies were recorded.
    #[getter]
    fn count(&self) -> u64 {
        self.inner.lock().len()
    }

    /// The smallest latency recorded, in nanoseconds; 0 when empty.
    #[getter]
    fn min(&self) -> u64 {
        self.inner.lock().min()
    }

    /// The largest latency recorded, in nanoseconds (at the precision); 0 when empty.
    #[getter]
    fn max(&self) -> u64 {
        self.inner.lock().max()
    }

    /// The mean latency, in nanoseconds; 0.0 when empty.
    #[getter]
    fn mean(&self) -> f64 {
        self.inner.lock().mean()
    }

    /// How many latencies were above ``highest_ns`` (recorded as ``highest_ns``).
    #[getter]
    fn saturated(&self) -> u64 {
        self.inner.lock().saturated()
    }

    /// The highest trackable latency, in nanoseconds.
    #[getter]
    fn highest_ns(&self) -> u64 {
        self.inner.lock().highest_ns()
    }

    /// The precision, in significant figures.
    #[getter]
    fn significant_figures(&self) -> u8 {
        self.inner.lock().significant_figures()
    }

    /// Forget every recorded latency.
    fn reset(&self) {
        self.inner.lock().reset();
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.inner.lock().len()).unwrap_or(usize::MAX)
    }

    fn __repr__(&self) -> String {
        let inner = self.inner.lock();
        format!(
            "<LatencyRecorder count={} p50={}ns max={}ns>",
            inner.len(),
            inner.value_at_percentile(50.0).unwrap_or(0),
            inner.max()
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLatencyRecorder>()?;
    Ok(())
}
