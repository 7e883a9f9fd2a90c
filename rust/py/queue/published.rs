//! `Published`: the handle ``EventBus.publish`` returns on one event, and the
//! hooks through which it calls back into ``openstarry.bus``.

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::PyTraverseError;

use crate::py::errors::{type_name, CoreError};
use crate::py::event::PyEvent;

/// Register `Published` and the function that installs its hooks.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPublished>()?;
    m.add_function(wrap_pyfunction!(_install_published_hooks, m)?)?;
    Ok(())
}

/// What `Published` calls back into Python: the coroutine that awaits a handle
/// (`openstarry.bus`) and the clock of its latency samples.
pub(super) struct Hooks {
    wait: Py<PyAny>,
    pub(super) clock: Py<PyAny>,
}

static HOOKS: parking_lot::Mutex<Option<Hooks>> = parking_lot::Mutex::new(None);

/// Install the functions a `Published` handle calls: ``wait(handle)`` returns
/// the coroutine that ``await handle`` runs, and ``clock()`` the
/// ``perf_counter_ns`` of a measured publish. The event bus installs them when
/// it is imported.
#[pyfunction]
fn _install_published_hooks(wait: Py<PyAny>, clock: Py<PyAny>) {
    *HOOKS.lock() = Some(Hooks { wait, clock });
}

pub(super) fn hook(py: Python<'_>, which: fn(&Hooks) -> &Py<PyAny>) -> PyResult<Py<PyAny>> {
    HOOKS
        .lock()
        .as_ref()
        .map(|hooks| which(hooks).clone_ref(py))
        .ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "import openstarry.bus before awaiting a Published",
            )
        })
}

/// The mutable part of a handle.
#[derive(Default)]
pub(super) struct Slot {
    /// `perf_counter_ns` at publishing, for an event whose latency is measured.
    pub(super) at: Option<i64>,
    /// `None` (pending, nobody waiting), the signal an awaiter sleeps on, or the outcome (a str).
    state: Option<Py<PyAny>>,
}

/// What ``EventBus.publish`` and ``EventBus.apublish`` return: a handle on one event.
///
/// Truthy when the bus accepted the event, falsy when it refused it as a
/// duplicate. ``await handle`` (or ``await handle.handled()``) waits until the
/// event's handlers have finished and answers the outcome: ``"handled"``
/// (every handler returned), ``"failed"`` (a handler raised; the others still
/// ran and the error became a ``KERNEL:ERROR``), ``"no_subscriber"`` (nothing
/// was subscribed to its type when its turn came), ``"duplicate"`` (refused
/// at publishing, answered at once) or ``"stopped"`` (the bus stopped
/// without dispatching it; see ``openstarry.bus``). On a bus with a remote
/// backend, awaiting an accepted event's handle raises ``RuntimeError``.
///
/// A handle is one small object, untracked by the cycle collector until
/// something awaits it; nothing is made for waiting until then.
#[pyclass(frozen, name = "Published", module = "openstarry._core")]
pub struct PyPublished {
    event: Py<PyAny>,
    pub(super) slot: parking_lot::Mutex<Slot>,
}

impl PyPublished {
    /// A pending handle on `event`, on the Python heap and untracked by the
    /// cycle collector: it refers to an event and at most an int, none of
    /// which can lead back to it, until an awaiter's signal is stored (then
    /// it is tracked, see `_state`). Untracked, a burst of publishes makes
    /// the collector run no more often than the events themselves do.
    pub(super) fn untracked(
        py: Python<'_>,
        event: Py<PyAny>,
        at: Option<i64>,
    ) -> PyResult<Py<PyPublished>> {
        let obj = Py::new(
            py,
            PyPublished {
                event,
                slot: parking_lot::Mutex::new(Slot { at, state: None }),
            },
        )?;
        // SAFETY: `obj` is a live object of a GC type, just created, and the
        // GIL is held. CPython's untrack is a no-op for an untracked object,
        // and PyO3's deallocator untracks only tracked objects.
        #[allow(unsafe_code)]
        unsafe {
            pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast());
        }
        Ok(obj)
    }

    /// The outcome string, if `state` holds one.
    fn outcome_str(&self, py: Python<'_>) -> Option<String> {
        let slot = self.slot.lock();
        let state = slot.state.as_ref()?.bind(py);
        let text = state.cast::<PyString>().ok()?;
        text.to_str().ok().map(str::to_owned)
    }
}

#[pymethods]
impl PyPublished {
    /// A pending handle on ``event`` (the bus makes them; this is for a bus of your own).
    #[new]
    fn new(event: &Bound<'_, PyAny>) -> Result<Self, CoreError> {
        if event.cast_exact::<PyEvent>().is_err() {
            return Err(CoreError::Type(format!(
                "Published takes an Event, got a {}",
                type_name(event)
            )));
        }
        Ok(PyPublished {
            event: event.clone().unbind(),
            slot: parking_lot::Mutex::new(Slot::default()),
        })
    }

    /// The event published.
    #[getter]
    fn event(&self, py: Python<'_>) -> Py<PyAny> {
        self.event.clone_ref(py)
    }

    #[getter(_at)]
    fn get_at(&self) -> Option<i64> {
        self.slot.lock().at
    }

    #[setter(_at)]
    fn set_at(&self, at: Option<i64>) {
        self.slot.lock().at = at;
    }

    #[getter(_state)]
    fn get_state(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.slot.lock().state.as_ref().map(|s| s.clone_ref(py))
    }

    #[setter(_state)]
    fn set_state(slf: &Bound<'_, Self>, state: Option<Bound<'_, PyAny>>) {
        let waiter = state
            .as_ref()
            .is_some_and(|s| !s.is_instance_of::<PyString>());
        let old = std::mem::replace(&mut slf.get().slot.lock().state, state.map(Bound::unbind));
        drop(old); // after the lock is released
        if waiter {
            // A signal may lead back to the handle (its waiters' tasks hold it).
            // SAFETY: `slf` is a live object of a GC type whose `__traverse__`
            // visits what it holds, and the GIL is held; tracking an object
            // that is already tracked is an error, hence the check first.
            #[allow(unsafe_code)]
            unsafe {
                if pyo3::ffi::PyObject_GC_IsTracked(slf.as_ptr()) == 0 {
                    pyo3::ffi::PyObject_GC_Track(slf.as_ptr().cast());
                }
            }
        }
    }

    /// Set the outcome and wake the awaiters, if any (the dispatcher's one call per event).
    fn _finish(&self, outcome: &Bound<'_, PyString>) -> PyResult<()> {
        let old = self
            .slot
            .lock()
            .state
            .replace(outcome.clone().into_any().unbind());
        if let Some(old) = old {
            let old = old.bind(outcome.py());
            if !old.is_instance_of::<PyString>() {
                old.call_method0(pyo3::intern!(outcome.py(), "set"))?;
            }
        }
        Ok(())
    }

    /// ``True`` when the bus accepted the event, ``False`` for a duplicate.
    fn __bool__(&self, py: Python<'_>) -> bool {
        self.outcome_str(py).as_deref() != Some("duplicate")
    }

    /// Whether the bus accepted the event (``False`` for a duplicate).
    #[getter]
    fn accepted(&self, py: Python<'_>) -> bool {
        self.__bool__(py)
    }

    /// The outcome once decided, else ``None`` (always ``None`` on a remote backend).
    #[getter]
    fn outcome(&self, py: Python<'_>) -> Option<String> {
        self.outcome_str(py).filter(|s| s != "remote")
    }

    /// Whether :attr:`outcome` is decided: awaiting the handle now answers at once.
    fn done(&self, py: Python<'_>) -> bool {
        self.outcome(py).is_some()
    }

    /// Wait until the event's handlers have finished; the outcome (a coroutine).
    fn handled(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        Ok(hook(py, |h| &h.wait)?.bind(py).call1((slf,))?.unbind())
    }

    fn __await__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let coroutine = hook(py, |h| &h.wait)?.bind(py).call1((slf,))?;
        Ok(coroutine
            .call_method0(pyo3::intern!(py, "__await__"))?
            .unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let event = self.event.bind(py);
        let shown = self.outcome_str(py).unwrap_or_else(|| "pending".to_owned());
        Ok(format!(
            "<Published {} {} {}>",
            event.getattr(pyo3::intern!(py, "type"))?,
            event.getattr(pyo3::intern!(py, "id"))?,
            shown
        ))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.event)?;
        // A handle busy in another thread reports nothing this round.
        if let Some(slot) = self.slot.try_lock() {
            if let Some(state) = &slot.state {
                visit.call(state)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let old = self.slot.lock().state.take();
        drop(old);
    }
}
