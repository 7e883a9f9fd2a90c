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
use super::record::Item;
use crate::dedup::IdKey;
use crate::queue::{Overflow, PriorityQueue, PushError};

mod published;

use published::hook;
pub use published::PyPublished;

/// The longest a blocking pop waits with the GIL released before it checks for signals.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A thread-safe priority queue: priorities 0..5, 0 served first, FIFO within a priority.
///
/// Six FIFO lanes and a bitmask of the non-empty ones make push and pop O(1).
/// Lines queued by an :class:`Ingestor` wait as Rust data; ``pop`` and
/// ``pop_many`` make their :class:`Event` objects.
#[pyclass(frozen, name = "EventQueue", module = "openstarry._core")]
pub struct PyEventQueue {
    /// Objects pushed from Python, and ingested lines that become `Event`s when popped.
    pub inner: PriorityQueue<Item>,
    /// How many events `push_unique` has queued and `admit` admitted.
    unique: AtomicU64,
}

/// The wall clock in Unix milliseconds, as the dedup window reads it.
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
    item_lane(item, priority).ok_or_else(|| unqueueable(item))
}

/// [`item_priority`] without the error: `None` when `item` cannot be queued.
#[inline(always)]
fn item_lane(item: &Bound<'_, PyAny>, priority: Option<u8>) -> Option<u8> {
    if item.is_none() {
        None
    } else if priority.is_some() {
        priority
    } else {
        // `Event` cannot be subclassed: an exact type check is enough, and cheaper.
        item.cast_exact::<PyEvent>()
            .ok()
            .map(|event| event.get().priority())
    }
}

/// The lane of every item of a list or tuple (see [`item_priority`]).
#[inline(always)]
fn lanes_of<'py>(
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    priority: Option<u8>,
) -> Result<Vec<u8>, CoreError> {
    let mut lanes = Vec::with_capacity(items.len());
    for item in items {
        lanes.push(item_priority(&item, priority)?);
    }
    Ok(lanes)
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
    /// `push_many` of a list or tuple, read by `items()` (as often as needed).
    ///
    /// No Python code runs until the items are queued, so the sequence cannot
    /// change in between (the GIL is held throughout). When the batch fits,
    /// every item is checked and queued in one pass under the lock (checking
    /// runs no Python code), and an item that cannot be queued takes the
    /// batch out again. Otherwise (closed, or not enough room) every item is
    /// checked first, then the queue's policy applies to the batch. (The
    /// check under the lock compares types with `Event`'s, which exists since
    /// the module's import: nothing is created there.)
    fn push_sequence<'py, I>(
        &self,
        items: impl Fn() -> I,
        priority: Option<u8>,
    ) -> PyResult<Vec<Item>>
    where
        I: ExactSizeIterator<Item = Bound<'py, PyAny>>,
    {
        let checked = items().enumerate().map(|(i, item)| {
            item_lane(&item, priority)
                .map(|lane| (Item::Object(item.unbind()), lane))
                .ok_or(i)
        });
        match self.inner.push_many_fitting(items().len(), checked) {
            Ok(true) => return Ok(Vec::new()),
            Ok(false) => {}
            Err(i) => {
                if let Some(item) = items().nth(i) {
                    return Err(unqueueable(&item).into());
                }
            }
        }
        let lanes = lanes_of(items(), priority)?;
        let objects = items().map(|item| Item::Object(item.unbind()));
        Ok(self
            .inner
            .push_many_in_lanes(&lanes, objects)
            .map_err(refused)?)
    }

    /// `push_unique`'s work: `item` at `event`'s priority unless `dedup` has seen its id.
    /// What `admit` does once `event` is known to be an `Event`.
    /// ``now``: the wall clock in ms, when the caller has just read it.
    pub(super) fn admit_event(
        &self,
        py: Python<'_>,
        event: &PyEvent,
        dedup: Option<&Bound<'_, PyDedupWindow>>,
        now: Option<i64>,
    ) -> Result<bool, CoreError> {
        self.admit_id(&event.id_text(py), dedup, now)
    }

    /// `admit_event` of an event known by its id alone (one made no further,
    /// see `Emitter.note`).
    pub(super) fn admit_id(
        &self,
        id: &[u8],
        dedup: Option<&Bound<'_, PyDedupWindow>>,
        now: Option<i64>,
    ) -> Result<bool, CoreError> {
        if self.inner.is_closed() {
            return Err(CoreError::QueueClosed);
        }
        if let Some(dedup) = dedup {
            let now = now.unwrap_or_else(wall_ms);
            if !dedup
                .get()
                .with_inner(|window| window.check_and_insert(id, now))
            {
                return Ok(false);
            }
        }
        self.unique.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// [`Self::admit_id`] for an id the caller minted as a UUID's value.
    pub(super) fn admit_uuid(
        &self,
        value: u128,
        dedup: Option<&Bound<'_, PyDedupWindow>>,
        now: i64,
    ) -> Result<bool, CoreError> {
        if self.inner.is_closed() {
            return Err(CoreError::QueueClosed);
        }
        if let Some(dedup) = dedup {
            if !dedup
                .get()
                .with_inner(|window| window.check_and_insert_key(IdKey::Uuid(value), now))
            {
                return Ok(false);
            }
        }
        self.unique.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn push_unique_item(
        &self,
        item: Py<PyAny>,
        event: &PyEvent,
        dedup: Option<&Bound<'_, PyDedupWindow>>,
    ) -> Result<u64, CoreError> {
        let lane = event.priority();
        // The window's lock, then the queue's: the order the ingestor takes them in.
        let queued = match dedup {
            Some(dedup) => {
                let id = event.id_text(dedup.py());
                let now = wall_ms();
                dedup.get().with_inner(|window| {
                    self.inner.push_checked(Item::Object(item), lane, || {
                        window.check_and_insert(&id, now)
                    })
                })
            }
            None => self.inner.push_checked(Item::Object(item), lane, || true),
        };
        if !queued.map_err(refused)? {
            return Ok(0);
        }
        Ok(self.unique.fetch_add(1, Ordering::Relaxed) + 1)
    }

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

    /// How many events ``push_unique`` (and so ``publish``) has queued on this
    /// queue so far, and ``admit`` admitted.
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
    ) -> Result<Option<Item>, CoreError> {
        let priority = priority.map(priority_arg).transpose()?;
        let lane = item_priority(item, priority)?;
        self.inner
            .push(Item::Object(item.clone().unbind()), lane)
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
        self.push_unique_item(item.clone().unbind(), event.get(), dedup)
    }

    /// Publish ``event``: :meth:`push_unique` with a new ``Published`` handle as the item.
    ///
    /// Returns the handle, or ``None`` for a duplicate (nothing queued). When
    /// ``sample_every`` divides the count ``push_unique`` would return, the
    /// handle's publish time is read from the clock the event bus installed
    /// (``openstarry.bus`` measures the dispatch latency of those events).
    ///
    /// Raises:
    ///     TypeError: ``event`` is not an ``Event``.
    ///     QueueFull: at capacity.
    ///     QueueClosed: after ``close()``.
    #[pyo3(signature = (event, dedup=None, sample_every=0))]
    fn publish(
        &self,
        event: &Bound<'_, PyAny>,
        dedup: Option<&Bound<'_, PyDedupWindow>>,
        sample_every: u64,
    ) -> PyResult<Option<Py<PyPublished>>> {
        let py = event.py();
        let typed = event.cast_exact::<PyEvent>().map_err(|_| {
            CoreError::Type(format!(
                "publish takes an Event, got a {}",
                type_name(event)
            ))
        })?;
        let handle = PyPublished::untracked(py, event.clone().unbind(), None)?;
        let count = self.push_unique_item(handle.clone_ref(py).into_any(), typed.get(), dedup)?;
        if count == 0 {
            return Ok(None);
        }
        if sample_every != 0 && count % sample_every == 0 {
            let at: i64 = hook(py, |h| &h.clock)?.bind(py).call0()?.extract()?;
            handle.get().slot.lock().at = Some(at);
        }
        Ok(Some(handle))
    }

    /// Admit ``event`` as :meth:`publish` would, without queueing it.
    ///
    /// For an event dispatched at its publish, which no handler waits for
    /// (the event bus's ``emit`` of an event nobody subscribes to): refused
    /// after ``close()``; then ``dedup`` checks and records its id (wall
    /// clock); a new id is counted in ``unique_pushed``. It takes no room, so
    /// it is never refused for being at capacity.
    ///
    /// Returns:
    ///     ``False`` for a duplicate id (nothing counted), else ``True``.
    ///
    /// Raises:
    ///     TypeError: ``event`` is not an ``Event``.
    ///     QueueClosed: after ``close()``.
    #[pyo3(signature = (event, dedup=None))]
    fn admit(
        &self,
        event: &Bound<'_, PyAny>,
        dedup: Option<&Bound<'_, PyDedupWindow>>,
    ) -> Result<bool, CoreError> {
        let typed = event.cast_exact::<PyEvent>().map_err(|_| {
            CoreError::Type(format!("admit takes an Event, got a {}", type_name(event)))
        })?;
        self.admit_event(event.py(), typed.get(), dedup, None)
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
    ) -> PyResult<Vec<Item>> {
        let priority = priority.map(priority_arg).transpose()?;
        // Nothing is queued unless every item can be. A list or tuple is
        // checked as it is queued (`push_sequence`); any other iterable runs
        // outside the lock, into a vector first.
        if let Ok(list) = items.cast::<PyList>() {
            // Lists, the common case, without the iterator protocol (PyO3's
            // list iterator reads the items inline outside the stable ABI).
            return self.push_sequence(|| list.iter(), priority);
        }
        if let Ok(tuple) = items.cast::<PyTuple>() {
            return self.push_sequence(|| tuple.iter(), priority);
        }
        let batch = items
            .try_iter()?
            .map(|item| {
                let item = item?;
                let lane = item_priority(&item, priority)?;
                Ok((Item::Object(item.unbind()), lane))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(self.inner.push_many(batch).map_err(refused)?)
    }

    /// The next item, or ``None`` when empty.
    ///
    /// With ``timeout`` (seconds, ``math.inf`` for no limit), wait that long for
    /// an item with the GIL released. A closed queue still drains.
    #[pyo3(signature = (timeout=None))]
    fn pop(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Item>> {
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
    fn pop_many(&self, py: Python<'_>, n: i64, timeout: Option<f64>) -> PyResult<Vec<Item>> {
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
            .try_for_each(|item| item.as_object().map_or(Ok(()), |o| visit.call(o)))
            .unwrap_or(Ok(()))
    }

    fn __clear__(&self) {
        // The items are released after the queue's lock is.
        drop(self.inner.try_pop_many(usize::MAX));
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEventQueue>()?;
    published::register(m)?;
    Ok(())
}
