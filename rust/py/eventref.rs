//! `EventRef`: an event that was emitted without being made.

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::errors::{type_name, CoreError};
use super::event::{Cause, PyEvent};

/// An event emitted without being made (``Emitter.mark``): nobody could
/// read it when it was emitted, so only what the events it causes need of it
/// is kept: its id, trace, session, source, priority and type.
///
/// Its id was minted, went through the bus's dedup window and the event was
/// counted, as for any event emitted; :meth:`child` makes an event caused by
/// it, as ``Event.child`` does.
#[pyclass(frozen, name = "EventRef", module = "openstarry._core")]
pub struct PyEventRef {
    id: Py<PyString>,
    trace_id: Py<PyString>,
    session_id: Py<PyString>,
    source: Py<PyString>,
    type_: Py<PyString>,
    priority: u8,
}

impl PyEventRef {
    /// The event of these parts.
    pub fn new(
        id: Py<PyString>,
        trace_id: Py<PyString>,
        session_id: Py<PyString>,
        source: Py<PyString>,
        type_: Py<PyString>,
        priority: u8,
    ) -> Self {
        PyEventRef {
            id,
            trace_id,
            session_id,
            source,
            type_,
            priority,
        }
    }

    /// The event of id `id` and type `type_`, caused by `parent`, from `source`.
    pub fn caused_by(
        parent: &Parent<'_, '_>,
        id: &str,
        type_: &Bound<'_, PyString>,
        source: &Bound<'_, PyString>,
    ) -> Self {
        let py = type_.py();
        let (trace_id, session_id, priority) = match parent {
            Parent::Event(event) => event.get().cause_parts(py),
            Parent::Ref(cause) => {
                let cause = cause.get();
                (
                    cause.trace_id.clone_ref(py),
                    cause.session_id.clone_ref(py),
                    cause.priority,
                )
            }
        };
        PyEventRef {
            id: PyString::new(py, id).unbind(),
            trace_id,
            session_id,
            source: source.clone().unbind(),
            type_: type_.clone().unbind(),
            priority,
        }
    }
}

#[pymethods]
impl PyEventRef {
    /// A new event caused by this one: same trace and session, ``parent_id`` set to this id.
    ///
    /// ``source`` and ``priority`` default to this event's.
    #[pyo3(signature = (r#type, payload=None, *, source=None, priority=None))]
    fn child(
        &self,
        py: Python<'_>,
        r#type: &str,
        payload: Option<&Bound<'_, PyAny>>,
        source: Option<&str>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyEvent>> {
        let cause = Cause {
            id: self.id.bind(py).to_str()?,
            trace_id: self.trace_id.bind(py).to_str()?,
            session_id: self.session_id.bind(py).to_str()?,
            source: self.source.bind(py).to_str()?,
            priority: self.priority,
        };
        cause.make_child(py, r#type, payload, source, priority)
    }

    #[getter]
    fn id(&self, py: Python<'_>) -> Py<PyString> {
        self.id.clone_ref(py)
    }

    #[getter]
    fn trace_id(&self, py: Python<'_>) -> Py<PyString> {
        self.trace_id.clone_ref(py)
    }

    #[getter]
    fn session_id(&self, py: Python<'_>) -> Py<PyString> {
        self.session_id.clone_ref(py)
    }

    #[getter]
    fn source(&self, py: Python<'_>) -> Py<PyString> {
        self.source.clone_ref(py)
    }

    #[getter(r#type)]
    fn event_type(&self, py: Python<'_>) -> Py<PyString> {
        self.type_.clone_ref(py)
    }

    #[getter]
    fn priority(&self) -> u8 {
        self.priority
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "EventRef(type={:?}, id={:?}, trace_id={:?})",
            self.type_.bind(py).to_string_lossy(),
            self.id.bind(py).to_string_lossy(),
            self.trace_id.bind(py).to_string_lossy(),
        )
    }
}

/// The parent of an event being made: an `Event`, or an `EventRef`.
pub enum Parent<'a, 'py> {
    Event(&'a Bound<'py, PyEvent>),
    Ref(&'a Bound<'py, PyEventRef>),
}

impl<'a, 'py> Parent<'a, 'py> {
    /// `parent` as a parent, or a `TypeError`.
    pub fn of(parent: &'a Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(event) = parent.cast_exact::<PyEvent>() {
            return Ok(Parent::Event(event));
        }
        if let Ok(cause) = parent.cast_exact::<PyEventRef>() {
            return Ok(Parent::Ref(cause));
        }
        Err(CoreError::Type(format!(
            "a parent must be an openstarry.core.Event or EventRef, not {}",
            type_name(parent)
        ))
        .into())
    }

    /// A new event caused by the parent (``Event.child``).
    pub fn make_child(
        &self,
        r#type: &str,
        payload: Option<&Bound<'py, PyAny>>,
        source: Option<&str>,
    ) -> PyResult<Py<PyEvent>> {
        match self {
            Parent::Event(event) => {
                event
                    .get()
                    .make_child(event.py(), r#type, payload, source, None)
            }
            Parent::Ref(cause) => cause.get().child(cause.py(), r#type, payload, source, None),
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEventRef>()
}
