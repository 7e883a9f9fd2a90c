//! `Emitter`: ``EventBus.emit`` of a local bus, and the events an agent's
//! turn emits (``child``, ``note``, ``mark``, ``take``, ``take_ref``), each in
//! one call into Rust.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::dedup::PyDedupWindow;
use super::errors::{bus_closed, type_name, CoreError};
use super::event::{PyEvent, DEFAULT_PRIORITY};
use super::eventref::{Parent, PyEventRef};
use super::queue::PyEventQueue;

/// ``EventBus.emit`` of a local bus, in one call into Rust.
///
/// Made by the bus over its queue, its dedup window, its cache of routes by
/// type and its ``publish``. :meth:`emit` looks up the event type's route
/// (the bus's ``route_of`` fills a missing entry); an event nobody subscribes
/// to (or only ``skip``) is admitted by the queue (:meth:`EventQueue.admit`)
/// and counted in its route's entry, anything else goes to ``publish``.
#[pyclass(frozen, name = "Emitter", module = "openstarry._core")]
pub struct PyEmitter {
    queue: Py<PyEventQueue>,
    dedup: Option<Py<PyDedupWindow>>,
    by_type: Py<PyDict>,
    route_of: Py<PyAny>,
    publish: Py<PyAny>,
    duplicates: AtomicU64,
    /// Set by the bus while its dispatcher sleeps: then, with nothing queued,
    /// nothing could be dispatched before an emitted event.
    asleep: AtomicBool,
}

// The docstrings are Python's (reST double backquotes).
#[allow(clippy::doc_markdown)]
#[pymethods]
impl PyEmitter {
    #[new]
    #[pyo3(signature = (queue, dedup, by_type, route_of, publish))]
    fn py_new(
        queue: Py<PyEventQueue>,
        dedup: Option<Py<PyDedupWindow>>,
        by_type: Py<PyDict>,
        route_of: Py<PyAny>,
        publish: Py<PyAny>,
    ) -> Self {
        PyEmitter {
            queue,
            dedup,
            by_type,
            route_of,
            publish,
            duplicates: AtomicU64::new(0),
            asleep: AtomicBool::new(false),
        }
    }

    /// Emit ``event``, whose type is ``event_type``: ``False`` for a duplicate id.
    ///
    /// Raises:
    ///     TypeError: ``event`` is not an ``Event``.
    ///     QueueClosed: the queue is closed.
    ///     QueueFull: a routed event, and ``publish`` found the bus full.
    #[pyo3(signature = (event, event_type, skip=None))]
    fn emit(
        &self,
        event: &Bound<'_, PyAny>,
        event_type: &Bound<'_, PyString>,
        skip: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let typed = event_of_type(event, event_type)?;
        self.emit_typed(typed, event_type, skip, None)
    }

    /// Admit ``event`` (of type ``event_type``) for ``subscription`` to handle
    /// now, in the caller's task: when nothing could come before it (the
    /// dispatcher sleeps, nothing is queued) and ``subscription``, a plain
    /// function, is the type's only one. Its id goes through the window and it
    /// is counted as dispatched (``EventBus.deliver``).
    ///
    /// Returns ``True`` when admitted, ``False`` for a duplicate id, ``None``
    /// when it cannot be handled now (publish it).
    ///
    /// Raises:
    ///     TypeError: ``event`` is not an ``Event``.
    ///     ValueError: ``event_type`` is not the event's type.
    ///     QueueClosed: the queue is closed.
    fn take(
        &self,
        event: &Bound<'_, PyAny>,
        event_type: &Bound<'_, PyString>,
        subscription: &Bound<'_, PyAny>,
    ) -> PyResult<Option<bool>> {
        let py = event.py();
        let typed = event_of_type(event, event_type)?;
        let Some(entry) = self.taken_entry(py, event_type, subscription)? else {
            return Ok(None);
        };
        let dedup = self.dedup.as_ref().map(|d| d.bind(py));
        let admitted = self.queue.get().admit_event(py, typed.get(), dedup, None);
        Ok(Some(self.count_admitted(py, &entry, admitted)?))
    }

    /// :meth:`take` of an event that is not made: a new event of type
    /// ``event_type`` (a new trace, session ``session_id``, ``source``, the
    /// default priority, no parent) for ``subscription`` to handle now, in the
    /// caller's task, on the same terms as :meth:`take`. Its id is minted,
    /// goes through the window and it is counted as dispatched; since its one
    /// subscriber is the caller, who holds its payload, an ``EventRef`` stands
    /// for it and is returned.
    ///
    /// Returns ``None`` when it cannot be handled now (make the event and
    /// publish it).
    ///
    /// Raises:
    ///     DecodeError: a header an event cannot have (an empty ``source`` or
    ///         ``session_id``, a malformed type).
    ///     QueueClosed: the queue is closed.
    fn take_ref(
        &self,
        event_type: &Bound<'_, PyString>,
        session_id: &Bound<'_, PyString>,
        source: &Bound<'_, PyString>,
        subscription: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Py<PyEventRef>>> {
        let py = event_type.py();
        let Some(entry) = self.taken_entry(py, event_type, subscription)? else {
            return Ok(None);
        };
        let value = crate::envelope::new_uuid_value();
        let (mut id_buf, mut trace_buf) = ([0; 36], [0; 36]);
        let id = crate::envelope::uuid_text(value, &mut id_buf);
        let trace_id = crate::envelope::new_uuid_in(&mut trace_buf);
        let header = crate::envelope::Header {
            id,
            timestamp: 0,
            trace_id,
            source: source.to_str()?,
            session_id: session_id.to_str()?,
            priority: DEFAULT_PRIORITY,
            type_: event_type.to_str()?,
            parent_id: None,
        };
        header.validate().map_err(CoreError::Decode)?;
        // (A duplicate of an id just minted: the caller makes the event instead.)
        if !self.admit_unmade(py, &entry, value)? {
            return Ok(None);
        }
        let made = PyEventRef::new(
            PyString::new(py, id).unbind(),
            PyString::new(py, trace_id).unbind(),
            session_id.clone().unbind(),
            source.clone().unbind(),
            event_type.clone().unbind(),
            DEFAULT_PRIORITY,
        );
        Ok(Some(Py::new(py, made)?))
    }

    /// Make ``parent.child(event_type, payload, source=source)`` and :meth:`emit` it
    /// (with ``skip``); returns it. ``parent`` is an ``Event`` or an ``EventRef``.
    ///
    /// One call for what a producer of caused events does for each (an
    /// agent's ticks, state changes, tool calls and replies).
    ///
    /// Raises:
    ///     TypeError, ValueError: as ``Event.child`` does (a payload that is
    ///         not JSON, a bad type); nothing is emitted.
    ///     QueueClosed: the queue is closed.
    ///     QueueFull: a routed event, and ``publish`` found the bus full (the
    ///         event was not published: make it again to wait for room).
    #[pyo3(signature = (parent, event_type, payload, source, skip=None))]
    fn child(
        &self,
        parent: &Bound<'_, PyAny>,
        event_type: &Bound<'_, PyString>,
        payload: &Bound<'_, PyAny>,
        source: &str,
        skip: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyEvent>> {
        let py = parent.py();
        let event =
            Parent::of(parent)?.make_child(event_type.to_str()?, Some(payload), Some(source))?;
        // Made just now: its timestamp is the window's clock.
        let made = event.bind(py);
        let now = made.get().timestamp_ms();
        self.emit_typed(made, event_type, skip, Some(now))?;
        Ok(event)
    }

    /// :meth:`child` for a caller that has no use for the event: ``False`` for
    /// a duplicate id.
    ///
    /// An event nobody subscribes to, emitted while nothing could come before
    /// it, is dispatched at once: its id is minted, goes through the dedup
    /// window and it is counted, as :meth:`child` does, but no ``Event`` is
    /// made, nor is ``payload`` encoded, since nothing could read either. So
    /// ``payload`` must be one an event can carry (a constant, checked by
    /// its caller once). Otherwise the event is made and emitted as
    /// :meth:`child` does.
    ///
    /// Raises:
    ///     QueueClosed: the queue is closed.
    ///     QueueFull: a routed event, and ``publish`` found the bus full (the
    ///         event was not published: make it to wait for room).
    #[pyo3(signature = (parent, event_type, payload, source))]
    fn note(
        &self,
        parent: &Bound<'_, PyAny>,
        event_type: &Bound<'_, PyString>,
        payload: &Bound<'_, PyAny>,
        source: &str,
    ) -> PyResult<bool> {
        let py = parent.py();
        let parent = Parent::of(parent)?;
        if let Some(entry) = self.unrouted_entry(py, event_type, None)? {
            // Nobody reads its id: minted as a value, never written out.
            return self.admit_unmade(py, &entry, crate::envelope::new_uuid_value());
        }
        let event = parent.make_child(event_type.to_str()?, Some(payload), Some(source))?;
        let made = event.bind(py);
        let now = made.get().timestamp_ms();
        self.emit_typed(made, event_type, None, Some(now))
    }

    /// :meth:`child` for a caller that needs the event only as the parent of
    /// the events it causes: returns the event emitted, an ``Event`` or an
    /// ``EventRef``.
    ///
    /// An event nobody subscribes to (or only ``skip``), emitted while
    /// nothing could come before it, is dispatched at once, as :meth:`note`
    /// does (its id minted, through the dedup window, counted), and an
    /// ``EventRef`` (its id, trace, session, source, priority and type) stands
    /// for it: no ``Event`` is made, nor is ``payload`` encoded, since nothing
    /// could read either. So ``payload`` must be one an event can carry.
    /// Otherwise the event is made and emitted as :meth:`child` does, and returned.
    ///
    /// Raises:
    ///     TypeError: ``parent`` is neither an ``Event`` nor an ``EventRef``.
    ///     QueueClosed: the queue is closed.
    ///     QueueFull: a routed event, and ``publish`` found the bus full (the
    ///         event was not published: make it to wait for room).
    #[pyo3(signature = (parent, event_type, payload, source, skip=None))]
    fn mark(
        &self,
        parent: &Bound<'_, PyAny>,
        event_type: &Bound<'_, PyString>,
        payload: &Bound<'_, PyAny>,
        source: &Bound<'_, PyString>,
        skip: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = parent.py();
        let parent = Parent::of(parent)?;
        if let Some(entry) = self.unrouted_entry(py, event_type, skip)? {
            let value = crate::envelope::new_uuid_value();
            self.admit_unmade(py, &entry, value)?;
            let mut id_buf = [0; 36];
            let id = crate::envelope::uuid_text(value, &mut id_buf);
            let made = PyEventRef::caused_by(&parent, id, event_type, source);
            return Ok(Py::new(py, made)?.into_any());
        }
        let event =
            parent.make_child(event_type.to_str()?, Some(payload), Some(source.to_str()?))?;
        let made = event.bind(py);
        let now = made.get().timestamp_ms();
        self.emit_typed(made, event_type, skip, Some(now))?;
        Ok(event.into_any())
    }

    /// :meth:`mark` and, under the event it stands for, :meth:`note`, for events
    /// nobody could read: both dispatched at once, unmade, in one call.
    ///
    /// When the bus is idle and nobody subscribes to ``event_type`` (or only
    /// ``skip``) nor to ``then_type``, an event of ``event_type`` is
    /// dispatched as :meth:`mark` dispatches it (its id minted, through the
    /// dedup window, counted) and, when ``then_type`` is given, one of
    /// ``then_type`` under it as :meth:`note` does; the first's ``EventRef``
    /// is returned. No payload is taken: nothing could read one. Otherwise
    /// nothing is emitted and ``None`` is returned: the caller emits the
    /// events with their payloads (:meth:`mark`, :meth:`note`).
    ///
    /// Raises:
    ///     TypeError: ``parent`` is neither an ``Event`` nor an ``EventRef``.
    ///     QueueClosed: the queue is closed.
    #[pyo3(signature = (parent, event_type, then_type, source, skip=None))]
    fn mark_unread(
        &self,
        parent: &Bound<'_, PyAny>,
        event_type: &Bound<'_, PyString>,
        then_type: Option<&Bound<'_, PyString>>,
        source: &Bound<'_, PyString>,
        skip: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let py = parent.py();
        let parent = Parent::of(parent)?;
        let Some(entry) = self.unrouted_entry(py, event_type, skip)? else {
            return Ok(None);
        };
        let then_entry = match then_type {
            Some(then_type) => {
                let then_entry = self.route_entry(py, then_type)?;
                if !unrouted(&then_entry, None)? {
                    return Ok(None);
                }
                Some(then_entry)
            }
            None => None,
        };
        let value = crate::envelope::new_uuid_value();
        self.admit_unmade(py, &entry, value)?;
        let mut id_buf = [0; 36];
        let id = crate::envelope::uuid_text(value, &mut id_buf);
        let made = PyEventRef::caused_by(&parent, id, event_type, source);
        if let Some(then_entry) = then_entry {
            self.admit_unmade(py, &then_entry, crate::envelope::new_uuid_value())?;
        }
        Ok(Some(Py::new(py, made)?.into_any()))
    }

    /// :meth:`note` for an event nobody could read: dispatched at once, unmade.
    ///
    /// When the bus is idle and nobody subscribes to ``event_type``, an event
    /// of that type is dispatched as :meth:`note` dispatches it (its id
    /// minted, through the dedup window, counted) and ``True`` is returned.
    /// No parent nor payload is taken: nothing could read them. Otherwise
    /// nothing is emitted and ``False`` is returned: the caller emits the
    /// event with its payload.
    ///
    /// Raises:
    ///     QueueClosed: the queue is closed.
    fn note_unread(&self, event_type: &Bound<'_, PyString>) -> PyResult<bool> {
        let py = event_type.py();
        let Some(entry) = self.unrouted_entry(py, event_type, None)? else {
            return Ok(false);
        };
        self.admit_unmade(py, &entry, crate::envelope::new_uuid_value())?;
        Ok(true)
    }

    /// Events refused so far as duplicates by :meth:`emit` (not by ``publish``).
    #[getter]
    fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    /// Whether the bus's dispatcher sleeps (the bus keeps it up to date).
    #[getter]
    fn asleep(&self) -> bool {
        self.asleep.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_asleep(&self, value: bool) {
        self.asleep.store(value, Ordering::Relaxed);
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.queue)?;
        if let Some(dedup) = &self.dedup {
            visit.call(dedup)?;
        }
        visit.call(&self.by_type)?;
        visit.call(&self.route_of)?;
        visit.call(&self.publish)
    }
}

impl PyEmitter {
    /// Whether nothing could be dispatched before an event emitted now: the
    /// dispatcher sleeps and nothing is queued.
    fn idle(&self) -> bool {
        self.asleep.load(Ordering::Relaxed) && self.queue.get().inner.is_empty()
    }

    /// The bus's route entry of ``event_type``: ``[subscriptions, dispatched, plain, ...]``.
    fn route_entry<'py>(
        &self,
        py: Python<'py>,
        event_type: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        let entry = match self.by_type.bind(py).get_item(event_type)? {
            Some(entry) => entry,
            None => self.route_of.bind(py).call1((event_type,))?,
        };
        Ok(entry.cast_into::<PyList>()?)
    }

    /// The route entry of ``event_type`` when an event of that type could be
    /// dispatched now without being made: the bus is :meth:`idle` and nobody
    /// subscribes to it but ``skip``.
    fn unrouted_entry<'py>(
        &self,
        py: Python<'py>,
        event_type: &Bound<'py, PyString>,
        skip: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        if !self.idle() {
            return Ok(None);
        }
        let entry = self.route_entry(py, event_type)?;
        Ok(unrouted(&entry, skip)?.then_some(entry))
    }

    /// The route entry of ``event_type`` when ``subscription``, a plain
    /// function, is its only subscriber and the bus is :meth:`idle`: an event
    /// of that type can be handed to it now (:meth:`take`).
    fn taken_entry<'py>(
        &self,
        py: Python<'py>,
        event_type: &Bound<'py, PyString>,
        subscription: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        if !self.idle() {
            return Ok(None);
        }
        let entry = self.route_entry(py, event_type)?;
        let route = entry.get_item(0)?;
        let route = route.cast::<PyTuple>()?;
        if route.len() != 1 || !route.get_item(0)?.is(subscription) || entry.get_item(2)?.is_none()
        {
            return Ok(None);
        }
        Ok(Some(entry))
    }

    /// What the queue answered to admitting an event dispatched at once:
    /// counted in its route `entry` when admitted; ``False`` for a duplicate
    /// id (counted as one).
    fn count_admitted(
        &self,
        py: Python<'_>,
        entry: &Bound<'_, PyList>,
        admitted: Result<bool, CoreError>,
    ) -> PyResult<bool> {
        match admitted {
            Ok(true) => {}
            Ok(false) => {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
            Err(CoreError::QueueClosed) => return Err(bus_closed(py)),
            Err(err) => return Err(err.into()),
        }
        let count = entry.get_item(1)?.add(1)?;
        entry.set_item(1, count)?;
        Ok(true)
    }

    /// Dispatch the event that was not made (its route `entry` has no
    /// subscriber), of the UUID of value `id`: through the dedup window and
    /// counted. ``False`` for a duplicate id.
    fn admit_unmade(&self, py: Python<'_>, entry: &Bound<'_, PyList>, id: u128) -> PyResult<bool> {
        let dedup = self.dedup.as_ref().map(|d| d.bind(py));
        let admitted = self
            .queue
            .get()
            .admit_uuid(id, dedup, crate::envelope::now_ms());
        self.count_admitted(py, entry, admitted)
    }

    /// :meth:`emit` of an event whose type is known to be ``event_type``.
    fn emit_typed(
        &self,
        typed: &Bound<'_, PyEvent>,
        event_type: &Bound<'_, PyString>,
        skip: Option<&Bound<'_, PyAny>>,
        now: Option<i64>,
    ) -> PyResult<bool> {
        let py = typed.py();
        // Something may come before the event (the dispatcher is busy, or
        // events wait): it takes its turn, whoever subscribes meanwhile.
        let Some(entry) = self.unrouted_entry(py, event_type, skip)? else {
            return self.publish.bind(py).call1((typed,))?.is_truthy();
        };
        let dedup = self.dedup.as_ref().map(|d| d.bind(py));
        let admitted = self.queue.get().admit_event(py, typed.get(), dedup, now);
        self.count_admitted(py, &entry, admitted)
    }
}

/// Whether a route `entry` has no subscriber but `skip`.
fn unrouted(entry: &Bound<'_, PyList>, skip: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let route = entry.get_item(0)?;
    let route = route.cast::<PyTuple>()?;
    Ok(match route.len() {
        0 => true,
        1 => skip.is_some_and(|skip| route.get_item(0).is_ok_and(|only| only.is(skip))),
        _ => false,
    })
}

/// `event` as an `Event` whose type is `event_type`.
fn event_of_type<'a, 'py>(
    event: &'a Bound<'py, PyAny>,
    event_type: &Bound<'py, PyString>,
) -> PyResult<&'a Bound<'py, PyEvent>> {
    let typed = event.cast_exact::<PyEvent>().map_err(|_| {
        CoreError::Type(format!(
            "publish takes an openstarry.core.Event, not {}",
            type_name(event)
        ))
    })?;
    let actual = typed.get().type_bytes(event.py());
    let given = event_type.to_str()?;
    if actual.as_ref() != given.as_bytes() {
        return Err(CoreError::Value(format!(
            "event_type {given:?} is not the event's type {:?}",
            String::from_utf8_lossy(&actual)
        ))
        .into());
    }
    Ok(typed)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEmitter>()
}
