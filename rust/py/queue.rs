//! `EventQueue`: the thread-safe priority queue of [`crate::queue`] over Python objects.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::PyTraverseError;

use super::dedup::PyDedupWindow;
use super::errors::CoreError;
use super::errors::{repr, strict_int, type_name};
use super::event::{priority_arg, PyEvent};
use crate::queue::{Overflow, PriorityQueue, PushError};

/// The longest a blocking pop waits with the GIL released before it checks for signals.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A thread-safe priority queue: priorities 0..5, 0 served first, FIFO within a priority.
///
/// Six FIFO lanes and a bitmask of the non-empty ones make push and pop O(1).
#[pyclass(frozen, name = "EventQueue", module = "openstarry._core")]
pub struct PyEventQueue {
    pub inner: PriorityQueue<Py<PyAny>>,
    /// How many items `push_unique` has queued (its return value).
    unique: AtomicU64,
}

/// The error of a refused push; the refused item(s) are dropped (the GIL is held).
fn refused<T>(err: PushError<T>) -> CoreError {
    match err {
        PushError::Full(_) => CoreError::QueueFull,
        PushError::Closed(_) => CoreError::QueueClosed,
    }
}

/// The lane of `item`: the explicit priority, else the item's own as an `Event`.
// Inlined into the batch loops: as a call, its large `Result` went through the stack.
#[inline(always)]
fn item_priority(item: &Bound<'_, PyAny>, priority: Option<u8>) -> Result<u8, CoreError> {
    let lane = if item.is_none() {
        None
    } else if priority.is_some() {
        priority
    } else {
        // `Event` cannot be subclassed: an exact type check is enough, and cheaper.
        item.cast_exact::<PyEvent>()
            .ok()
            .map(|event| event.get().priority())
    };
    lane.ok_or_else(|| unqueueable(item))
}

#[cold]
fn unqueueable(item: &Bound<'_, PyAny>) -> CoreError {
    if item.is_none() {
        CoreError::Type("None cannot be queued: pop() answers None for an empty queue".to_owned())
    } else {
        CoreError::Type(format!(
            "an item that is not an Event needs a priority, got a {}",
            type_name(item)
        ))
    }
}

/// How long a pop may wait.
#[derive(Clone, Copy)]
enum Wait {
    /// Not at all: answer at once.
    No,
    /// Until this instant.
    Until(Instant),
    /// As long as it takes.
    Forever,
}

fn wait_from(timeout: Option<f64>) -> Result<Wait, CoreError> {
    let Some(t) = timeout else {
        return Ok(Wait::No);
    };
    if t.is_nan() || t < 0.0 {
        return Err(CoreError::Value(format!(
            "timeout must be a number of seconds >= 0 (math.inf for no limit), got {t}"
        )));
    }
    if t == 0.0 {
        return Ok(Wait::No);
    }
    // A timeout too large for a deadline is the same as no limit.
    Ok(Duration::try_from_secs_f64(t)
        .ok()
        .and_then(|d| Instant::now().checked_add(d))
        .map_or(Wait::Forever, Wait::Until))
}

impl PyEventQueue {
    /// Run `take(wait)` until it yields something or the time is up, waiting in
    /// slices with the GIL released and checking for signals between slices.
    fn wait_for<R: Send>(
        &self,
        py: Python<'_>,
        wait: Wait,
        take: impl Fn(Duration) -> R + Sync,
        got: impl Fn(&R) -> bool,
    ) -> PyResult<R> {
        // The first try holds the GIL: no release for an item that is already there.
        let mut result = take(Duration::ZERO);
        loop {
            if got(&result) {
                return Ok(result);
            }
            if self.inner.is_closed() {
                // Closed: no push can come, but one may have landed just before the close.
                return Ok(take(Duration::ZERO));
            }
            let slice = match wait {
                Wait::No => return Ok(result),
                Wait::Forever => WAIT_SLICE,
                Wait::Until(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(result);
                    }
                    left.min(WAIT_SLICE)
                }
            };
            // Only while holding nothing: a KeyboardInterrupt here loses no item.
            py.check_signals()?;
            result = py.detach(|| take(slice));
        }
    }
}

// The doc comments below are the Python docstrings (Google style), not rustdoc.
#[allow(clippy::doc_markdown)]
#[pymethods]
impl PyEventQueue {
    #[new]
    #[pyo3(signature = (capacity=None, overflow="reject", starvation_limit=None))]
    fn new(
        capacity: Option<&Bound<'_, PyAny>>,
        overflow: &str,
        starvation_limit: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self, CoreError> {
        let capacity = capacity
            .map(|c| {
                strict_int(c)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| {
                        CoreError::Value(format!(
                            "capacity must be None or an int of at least 1, got {}",
                            repr(c)
                        ))
                    })
            })
            .transpose()?;
        let overflow = match overflow {
            "reject" => Overflow::Reject,
            "shed" => Overflow::Shed,
            other => {
                return Err(CoreError::Value(format!(
                    "overflow must be 'reject' or 'shed', got {other:?}"
                )))
            }
        };
        let starvation_limit = starvation_limit
            .map(|k| {
                strict_int(k)
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| {
                        CoreError::Value(format!(
                            "starvation_limit must be None or an int from 1 to {}, got {}",
                            u32::MAX,
                            repr(k)
                        ))
                    })
            })
            .transpose()?;
        Ok(PyEventQueue {
            inner: PriorityQueue::new(capacity, overflow, starvation_limit),
            unique: AtomicU64::new(0),
        })
    }

    /// How many items ``push_unique`` has queued on this queue so far.
    #[getter]
    fn unique_pushed(&self) -> u64 {
        self.unique.load(Ordering::Relaxed)
    }

    #[getter]
    fn capacity(&self) -> Option<usize> {
        self.inner.capacity()
    }

    #[getter]
    fn overflow(&self) -> &'static str {
        match self.inner.overflow() {
            Overflow::Reject => "reject",
            Overflow::Shed => "shed",
        }
    }

    #[getter]
    fn starvation_limit(&self) -> Option<u32> {
        self.inner.starvation_limit()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// How many items the ``"shed"`` policy has dropped so far.
    #[getter]
    fn shed_count(&self) -> u64 {
        self.inner.shed_count()
    }

    /// Queue ``item``; an ``Event`` takes its own priority when ``priority`` is ``None``.
    ///
    /// Returns:
    ///     ``None``, or under the ``"shed"`` policy the item dropped to make room.
    ///
    /// Raises:
    ///     QueueFull: at capacity under the ``"reject"`` policy.
    ///     QueueClosed: after ``close()``.
    #[pyo3(signature = (item, priority=None))]
    fn push(
        &self,
        item: &Bound<'_, PyAny>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> Result<Option<Py<PyAny>>, CoreError> {
        let priority = priority.map(priority_arg).transpose()?;
        let lane = item_priority(item, priority)?;
        self.inner
            .push(item.clone().unbind(), lane)
            .map_err(refused)
    }

    /// Queue ``item`` at ``event``'s priority unless ``dedup`` has seen ``event``'s id.
    ///
    /// What a publisher does per event, in one call: the queue refuses first
    /// (closed, then at capacity, under either overflow policy), so a refused
    /// event leaves no id in the window; then the window checks and records
    /// the id (wall clock), and a duplicate is not queued; then ``item`` is
    /// queued. ``item`` is what pops: the event itself, or a wrapper of it.
    /// Another thread filling the queue between the check and the push makes
    /// the push raise with the id already recorded.
    ///
    /// Returns:
    ///     How many items ``push_unique`` has queued on this queue, this one
    ///     included (so a true value, counting from 1), or ``0`` for a
    ///     duplicate. A publisher counts its events and samples every n-th
    ///     one with it.
    ///
    /// Raises:
    ///     TypeError: ``event`` is not an ``Event``, or ``item`` is ``None``.
    ///     QueueFull: at capacity.
    ///     QueueClosed: after ``close()``.
    #[pyo3(signature = (item, event, dedup=None))]
    fn push_unique(
        &self,
        item: &Bound<'_, PyAny>,
        event: &Bound<'_, PyAny>,
        dedup: Option<&Bound<'_, PyDedupWindow>>,
    ) -> Result<u64, CoreError> {
        let event = event.cast_exact::<PyEvent>().map_err(|_| {
            CoreError::Type(format!(
                "push_unique takes an Event, got a {}",
                type_name(event)
            ))
        })?;
        if item.is_none() {
            return Err(unqueueable(item));
        }
        let event = event.get();
        let lane = event.priority();
        let item = item.clone().unbind();
        // The window's lock, then the queue's: the order the ingestor takes them in.
        let queued = match dedup {
            Some(dedup) => {
                let id = event.id_bytes(dedup.py());
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                dedup.get().with_inner(|window| {
                    self.inner
                        .push_checked(item, lane, || window.check_and_insert(&id, now))
                })
            }
            None => self.inner.push_checked(item, lane, || true),
        };
        if !queued.map_err(refused)? {
            return Ok(0);
        }
        Ok(self.unique.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Queue every item in one call (all or nothing under ``"reject"``).
    ///
    /// ``items`` is any iterable; a list or tuple is read without the iterator
    /// protocol, so it is the fastest. Every item is checked before any is
    /// queued, and the queue's lock is taken once.
    ///
    /// Returns:
    ///     The items dropped by the ``"shed"`` policy (empty otherwise).
    #[pyo3(signature = (items, priority=None))]
    fn push_many(
        &self,
        items: &Bound<'_, PyAny>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let priority = priority.map(priority_arg).transpose()?;
        // Every item is checked before any is queued; the iterable runs outside the lock.
        let batch = if let Ok(list) = items.cast::<PyList>() {
            // Lists, the common case, without the iterator protocol (PyO3's
            // list iterator reads the items inline outside the stable ABI).
            // No user code runs in this loop, so the list cannot change size.
            let mut batch = Vec::with_capacity(list.len());
            for item in list.iter() {
                let lane = item_priority(&item, priority)?;
                batch.push((item.unbind(), lane));
            }
            batch
        } else if let Ok(tuple) = items.cast::<PyTuple>() {
            let mut batch = Vec::with_capacity(tuple.len());
            for item in tuple.iter() {
                let lane = item_priority(&item, priority)?;
                batch.push((item.unbind(), lane));
            }
            batch
        } else {
            items
                .try_iter()?
                .map(|item| {
                    let item = item?;
                    let lane = item_priority(&item, priority)?;
                    Ok((item.unbind(), lane))
                })
                .collect::<PyResult<Vec<_>>>()?
        };
        Ok(self.inner.push_many(batch).map_err(refused)?)
    }

    /// The next item, or ``None`` when empty.
    ///
    /// With ``timeout`` (seconds, ``math.inf`` for no limit), wait that long for
    /// an item with the GIL released. A closed queue still drains.
    #[pyo3(signature = (timeout=None))]
    fn pop(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        match wait_from(timeout)? {
            Wait::No => Ok(self.inner.try_pop()),
            wait => self.wait_for(
                py,
                wait,
                |wait| self.inner.pop_timeout(Some(wait)),
                Option::is_some,
            ),
        }
    }

    /// Up to ``n`` items in priority order; with ``timeout``, wait for the first.
    ///
    /// The items come as a new list, taken under one lock.
    #[pyo3(signature = (n, timeout=None))]
    fn pop_many(&self, py: Python<'_>, n: i64, timeout: Option<f64>) -> PyResult<Vec<Py<PyAny>>> {
        let n =
            usize::try_from(n).map_err(|_| CoreError::Value(format!("n must be >= 0, got {n}")))?;
        let wait = wait_from(timeout)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        match wait {
            Wait::No => Ok(self.inner.try_pop_many(n)),
            wait => self.wait_for(
                py,
                wait,
                |wait| self.inner.pop_many_timeout(n, Some(wait)),
                |batch| !batch.is_empty(),
            ),
        }
    }

    /// How many items wait at each priority, 0..5.
    fn depths(&self) -> Vec<usize> {
        self.inner.depths().to_vec()
    }

    /// Refuse further pushes and wake every waiting pop; what is queued can still be popped.
    fn close(&self) {
        self.inner.close();
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __bool__(&self) -> bool {
        !self.inner.is_empty()
    }

    fn __repr__(&self) -> String {
        let capacity = self
            .inner
            .capacity()
            .map_or_else(|| "None".to_owned(), |c| c.to_string());
        format!(
            "<EventQueue len={} depths={:?} capacity={capacity} overflow='{}' closed={}>",
            self.inner.len(),
            self.inner.depths(),
            self.overflow(),
            if self.inner.is_closed() {
                "True"
            } else {
                "False"
            },
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // A queue busy in another thread reports nothing this round: that only delays collection.
        self.inner
            .try_for_each(|item| visit.call(item))
            .unwrap_or(Ok(()))
    }

    fn __clear__(&self) {
        // The items are released after the queue's lock is.
        drop(self.inner.try_pop_many(usize::MAX));
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEventQueue>()?;
    Ok(())
}
