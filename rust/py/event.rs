//! `Event`: the spec 002 envelope as an immutable Python object over its wire bytes.

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::errors::{repr, strict_int, type_name, CoreError};
use super::pyjson;
use crate::envelope::{self, EnvelopeIndex, Header};
use crate::json::{
    JsonError, Limits, Span, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, MAX_DEPTH, MAX_INPUT,
};

/// Priority given by `Event.new` when none is passed.
pub const DEFAULT_PRIORITY: u8 = 2;

/// What an event caused by another one takes from it: its id (the child's
/// ``parentId``), trace, session, and source and priority unless given.
pub struct Cause<'a> {
    pub id: &'a str,
    pub trace_id: &'a str,
    pub session_id: &'a str,
    pub source: &'a str,
    pub priority: u8,
}

impl Cause<'_> {
    /// A new event of type `type` caused by this one (``Event.child``).
    pub fn make_child(
        &self,
        py: Python<'_>,
        r#type: &str,
        payload: Option<&Bound<'_, PyAny>>,
        source: Option<&str>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyEvent>> {
        let mut id_buf = [0; 36];
        let id = envelope::new_uuid_in(&mut id_buf);
        let header = Header {
            id,
            timestamp: envelope::now_ms(),
            trace_id: self.trace_id,
            source: source.unwrap_or(self.source),
            session_id: self.session_id,
            priority: priority.map_or(Ok(self.priority), priority_arg)?,
            type_: r#type,
            parent_id: Some(self.id),
        };
        let none = py.None().into_bound(py);
        PyEvent::build(py, &header, payload.unwrap_or(&none))?.into_py(py)
    }
}

/// The spec 002 event envelope: immutable, hashable by id.
///
/// On the wire its fields are ``id``, ``timestamp``, ``traceId``, ``source``,
/// ``sessionId``, ``priority``, ``type``, ``payload`` and, for an event caused
/// by another one, ``parentId``. The event keeps its wire bytes: ``payload`` is
/// decoded from them on first access, and :func:`encode_event` returns them
/// unchanged.
#[pyclass(frozen, name = "Event", module = "openstarry._core")]
pub struct PyEvent {
    buf: Wire,
    idx: EnvelopeIndex,
    /// The decoded payload, once read. A std `OnceLock` rather than the one of `PyO3`, so
    /// that `__traverse__`, which may not use the interpreter, can read it.
    payload: OnceLock<Py<PyAny>>,
}

/// An event's wire bytes.
pub enum Wire {
    /// The `bytes` object it was decoded from: `encode_event` returns it as is.
    Shared(Py<PyBytes>),
    /// Bytes of its own, in the Rust heap.
    Owned(Box<[u8]>),
    /// A line of a larger `bytes` object: the NDJSON input of
    /// `Ingestor.ingest`, kept by reference instead of copying each line out.
    /// The event keeps the whole input alive (see `Ingestor.ingest`).
    Slice {
        whole: Py<PyBytes>,
        start: usize,
        len: u32,
    },
}

impl Wire {
    /// The line `line` of `whole`, which must lie within `whole`'s bytes.
    ///
    /// # Panics
    ///
    /// If `line` does not lie within `whole`'s bytes, or is 2 GiB or longer.
    #[must_use]
    pub fn slice_of(py: Python<'_>, whole: &Py<PyBytes>, line: &[u8]) -> Self {
        let base = whole.as_bytes(py);
        let start = (line.as_ptr() as usize)
            .checked_sub(base.as_ptr() as usize)
            .filter(|s| s + line.len() <= base.len())
            .expect("the line lies within the input");
        Wire::Slice {
            whole: whole.clone_ref(py),
            start,
            len: u32::try_from(line.len()).expect("a line is shorter than 4 GiB"),
        }
    }
}

impl PyEvent {
    /// Decode `buf` (the event keeps this very bytes object).
    pub fn from_bytes(
        py: Python<'_>,
        buf: Py<PyBytes>,
        limits: &Limits,
    ) -> Result<Self, JsonError> {
        let idx = envelope::decode(buf.bind(py).as_bytes(), limits)?;
        Ok(PyEvent {
            buf: Wire::Shared(buf),
            idx,
            payload: OnceLock::new(),
        })
    }

    /// ``Event.child``: a new event caused by this one (same trace and
    /// session, ``parent_id`` this id), ``source`` and ``priority`` this one's
    /// unless given.
    pub fn make_child(
        &self,
        py: Python<'_>,
        r#type: &str,
        payload: Option<&Bound<'_, PyAny>>,
        source: Option<&str>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Self>> {
        let buf = self.bytes(py);
        let parent = self.idx.id.as_str(buf);
        let trace = self.idx.trace_id.as_str(buf);
        let session = self.idx.session_id.as_str(buf);
        let own_source = self.idx.source.as_str(buf);
        let cause = Cause {
            id: &parent,
            trace_id: &trace,
            session_id: &session,
            source: &own_source,
            priority: self.idx.priority,
        };
        cause.make_child(py, r#type, payload, source, priority)
    }

    /// The parts of this event that an [`EventRef`](super::eventref::PyEventRef) caused by it keeps.
    pub fn cause_parts(&self, py: Python<'_>) -> (Py<PyString>, Py<PyString>, u8) {
        let buf = self.bytes(py);
        (
            PyString::new(py, &self.idx.trace_id.as_str(buf)).unbind(),
            PyString::new(py, &self.idx.session_id.as_str(buf)).unbind(),
            self.idx.priority,
        )
    }

    /// An event over bytes already decoded to `idx`.
    #[must_use]
    pub fn from_index(buf: Wire, idx: EnvelopeIndex) -> Self {
        PyEvent {
            buf,
            idx,
            payload: OnceLock::new(),
        }
    }

    /// Put the event on the Python heap, untracked by the cycle collector.
    ///
    /// Until its payload is decoded, an event refers to nothing that could lead
    /// back to it (its bytes, at most a `bytes` object), so it cannot be part of
    /// a cycle, and tracking it would only make every collection walk each live
    /// event: ingesting millions of events, that walk was a tenth of the time.
    /// Reading the payload tracks the event again (see `payload`).
    pub fn into_py(self, py: Python<'_>) -> PyResult<Py<PyEvent>> {
        let obj = Py::new(py, self)?;
        // SAFETY: `obj` is a live object of a GC type, just created, and the
        // GIL is held. CPython's untrack is a no-op for an untracked object,
        // and PyO3's deallocator untracks only tracked objects.
        #[allow(unsafe_code)]
        unsafe {
            pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast());
        }
        Ok(obj)
    }

    /// Track `slf` by the cycle collector again, if it is not tracked.
    fn track(slf: &Bound<'_, Self>) {
        // SAFETY: `slf` is a live object of a GC type whose `__traverse__`
        // visits what it holds, and the GIL is held; tracking an object that is
        // already tracked is an error, hence the check first.
        #[allow(unsafe_code)]
        unsafe {
            if pyo3::ffi::PyObject_GC_IsTracked(slf.as_ptr()) == 0 {
                pyo3::ffi::PyObject_GC_Track(slf.as_ptr().cast());
            }
        }
    }

    /// The id's UTF-8 bytes.
    #[must_use]
    pub fn id_bytes(&self, py: Python<'_>) -> Vec<u8> {
        self.id_text(py).into_owned()
    }

    /// The id's UTF-8 bytes, borrowed from the envelope unless it is escaped there.
    #[must_use]
    pub fn id_text<'a>(&'a self, py: Python<'a>) -> std::borrow::Cow<'a, [u8]> {
        self.idx.id.as_bytes(self.bytes(py))
    }

    /// The event's ``timestamp``: Unix time in ms.
    #[must_use]
    pub fn timestamp_ms(&self) -> i64 {
        self.idx.timestamp
    }

    /// The event's type as UTF-8 (types are ASCII: never escaped).
    #[must_use]
    pub fn type_bytes<'a>(&'a self, py: Python<'a>) -> std::borrow::Cow<'a, [u8]> {
        self.idx.type_.as_bytes(self.bytes(py))
    }

    #[must_use]
    pub fn priority(&self) -> u8 {
        self.idx.priority
    }

    /// The wire bytes as a `bytes` object (the one it was decoded from, if any).
    #[must_use]
    pub fn wire(&self, py: Python<'_>) -> Py<PyBytes> {
        match &self.buf {
            Wire::Shared(b) => b.clone_ref(py),
            Wire::Owned(b) => PyBytes::new(py, b).unbind(),
            Wire::Slice { whole, .. } if whole.as_bytes(py).len() == self.bytes(py).len() => {
                whole.clone_ref(py)
            }
            Wire::Slice { .. } => PyBytes::new(py, self.bytes(py)).unbind(),
        }
    }

    fn bytes<'a>(&'a self, py: Python<'a>) -> &'a [u8] {
        match &self.buf {
            Wire::Shared(b) => b.as_bytes(py),
            Wire::Owned(b) => b,
            Wire::Slice { whole, start, len } => {
                &whole.as_bytes(py)[*start..*start + *len as usize]
            }
        }
    }

    fn text<'py>(&self, py: Python<'py>, span: Span) -> Bound<'py, PyString> {
        PyString::new(py, &span.as_str(self.bytes(py)))
    }

    fn build(py: Python<'_>, header: &Header<'_>, payload: &Bound<'_, PyAny>) -> PyResult<Self> {
        header.validate().map_err(CoreError::Decode)?;
        let (bytes, idx) = envelope::encode_indexed_with(header, 64, |out| {
            pyjson::write(payload, out, envelope::PAYLOAD_DEPTH, DEFAULT_MAX_DEPTH)
        })?;
        let buf = PyBytes::new(py, &bytes).unbind();
        if bytes.len() > MAX_INPUT {
            // Past what any decoder takes: the decoder's own error.
            let limits = Limits {
                max_bytes: MAX_INPUT,
                max_depth: DEFAULT_MAX_DEPTH,
            };
            return Ok(PyEvent::from_bytes(py, buf, &limits)?);
        }
        // The header is valid and the payload is JSON within the depth limit
        // (dumps_at): the index is what decoding the bytes would give.
        Ok(PyEvent::from_index(Wire::Shared(buf), idx))
    }
}

/// A copy of `payload` when it is a `dict` of at most 16 items whose keys are
/// `str` and values `str`, `int`, `float`, `bool` or `None` (those types
/// exactly): then the copy equals what decoding its JSON gives.
fn flat_copy<'py>(payload: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyDict>>> {
    use pyo3::types::{PyBool, PyFloat, PyInt};
    let Ok(dict) = payload.cast_exact::<PyDict>() else {
        return Ok(None);
    };
    if dict.len() > 16 {
        return Ok(None);
    }
    for (key, value) in dict.iter() {
        let scalar = value.is_none()
            || value.is_exact_instance_of::<PyString>()
            || value.is_exact_instance_of::<PyInt>()
            || value.is_exact_instance_of::<PyBool>()
            || value.is_exact_instance_of::<PyFloat>();
        if !key.is_exact_instance_of::<PyString>() || !scalar {
            return Ok(None);
        }
    }
    dict.copy().map(Some)
}

/// A priority given from Python: an `int` (not a `bool`) from 0 to 5.
pub fn priority_arg(value: &Bound<'_, PyAny>) -> Result<u8, CoreError> {
    match strict_int(value) {
        Some(p) if (0..=i64::from(envelope::LOWEST_PRIORITY)).contains(&p) => Ok(p as u8),
        _ => Err(CoreError::Value(format!(
            "priority must be an int from 0 to {}, got {}",
            envelope::LOWEST_PRIORITY,
            repr(value)
        ))),
    }
}

fn timestamp_arg(value: &Bound<'_, PyAny>) -> Result<i64, CoreError> {
    strict_int(value).ok_or_else(|| {
        CoreError::Value(format!(
            "timestamp must be an int (Unix time in ms) that fits in 64 bits, got {}",
            repr(value)
        ))
    })
}

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (*, id, timestamp, trace_id, source, session_id, priority, r#type, payload=None, parent_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        id: &str,
        timestamp: &Bound<'_, PyAny>,
        trace_id: &str,
        source: &str,
        session_id: &str,
        priority: &Bound<'_, PyAny>,
        r#type: &str,
        payload: Option<&Bound<'_, PyAny>>,
        parent_id: Option<&str>,
    ) -> PyResult<Self> {
        let header = Header {
            id,
            timestamp: timestamp_arg(timestamp)?,
            trace_id,
            source,
            session_id,
            priority: priority_arg(priority)?,
            type_: r#type,
            parent_id,
        };
        let none = py.None().into_bound(py);
        Self::build(py, &header, payload.unwrap_or(&none))
    }

    /// A new event with a fresh UUID v4 id, the current time in ms and, unless given, a fresh trace id.
    #[staticmethod]
    #[pyo3(signature = (r#type, payload=None, *, source, session_id, priority=None, trace_id=None, parent_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        r#type: &str,
        payload: Option<&Bound<'_, PyAny>>,
        source: &str,
        session_id: &str,
        priority: Option<&Bound<'_, PyAny>>,
        trace_id: Option<&str>,
        parent_id: Option<&str>,
    ) -> PyResult<Py<Self>> {
        let (mut id_buf, mut trace_buf) = ([0; 36], [0; 36]);
        let id = envelope::new_uuid_in(&mut id_buf);
        let trace_id = match trace_id {
            Some(t) => t,
            None => envelope::new_uuid_in(&mut trace_buf),
        };
        let header = Header {
            id,
            timestamp: envelope::now_ms(),
            trace_id,
            source,
            session_id,
            priority: priority.map_or(Ok(DEFAULT_PRIORITY), priority_arg)?,
            type_: r#type,
            parent_id,
        };
        let none = py.None().into_bound(py);
        let event = Self::build(py, &header, payload.unwrap_or(&none))?.into_py(py)?;
        // A made event is mostly read by its handler: a flat payload's copy is
        // what decoding the envelope would give, for a fraction of the cost.
        if let Some(copy) = payload.map(flat_copy).transpose()?.flatten() {
            let bound = event.bind(py);
            if bound.get().payload.set(copy.into_any().unbind()).is_ok() {
                Self::track(bound);
            }
        }
        Ok(event)
    }

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
    ) -> PyResult<Py<Self>> {
        self.make_child(py, r#type, payload, source, priority)
    }

    #[getter]
    fn id<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.text(py, self.idx.id)
    }

    /// Unix time in milliseconds.
    #[getter]
    fn timestamp(&self) -> i64 {
        self.idx.timestamp
    }

    #[getter]
    fn trace_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.text(py, self.idx.trace_id)
    }

    #[getter]
    fn source<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.text(py, self.idx.source)
    }

    #[getter]
    fn session_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.text(py, self.idx.session_id)
    }

    /// 0 (highest, system-critical) to 5 (lowest, background).
    #[getter(priority)]
    fn py_priority(&self) -> u8 {
        self.idx.priority
    }

    /// ``NAMESPACE:NAME``, such as ``INPUT:USER_MESSAGE``.
    #[getter(r#type)]
    fn event_type<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.text(py, self.idx.type_)
    }

    /// The id of the event that caused this one, or ``None``.
    #[getter]
    fn parent_id<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        self.idx.parent_id.map(|span| self.text(py, span))
    }

    /// The payload, decoded from its JSON on first access and then cached.
    ///
    /// The cached object is shared by every access: mutating it does not change
    /// the event's wire bytes.
    #[getter]
    fn payload<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Some(value) = this.payload.get() {
            return Ok(value.bind(py).clone());
        }
        let value = pyjson::loads_validated(py, &this.bytes(py)[this.idx.payload.range()])?;
        // Another thread may have decoded it meanwhile: the first value stays.
        let value = this.payload.get_or_init(|| value.unbind()).bind(py).clone();
        if is_container(&value) {
            // The payload can now lead back to the event: let the collector see it.
            Self::track(slf);
        }
        Ok(value)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(payload) = self.payload.get() {
            visit.call(payload)?;
        }
        Ok(())
    }

    /// The payload's raw JSON, exactly as on the wire.
    #[getter]
    fn payload_json<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes(py)[self.idx.payload.range()])
    }

    /// Wire fields this version does not know, decoded (they are kept on re-encode).
    #[getter]
    fn extra<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let buf = self.bytes(py);
        let dict = PyDict::new(py);
        for (key, value) in &self.idx.extra {
            dict.set_item(
                key.as_str(buf),
                pyjson::loads_validated(py, &buf[value.range()])?,
            )?;
        }
        Ok(dict)
    }

    /// The envelope as a dict with its wire (camelCase) field names.
    fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let this = slf.get();
        let d = PyDict::new(py);
        d.set_item("id", this.id(py))?;
        d.set_item("timestamp", this.idx.timestamp)?;
        d.set_item("traceId", this.trace_id(py))?;
        d.set_item("source", this.source(py))?;
        d.set_item("sessionId", this.session_id(py))?;
        d.set_item("priority", this.idx.priority)?;
        d.set_item("type", this.event_type(py))?;
        d.set_item("payload", Self::payload(slf)?)?;
        if let Some(parent) = this.parent_id(py) {
            d.set_item("parentId", parent)?;
        }
        for (k, v) in this.extra(py)? {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __hash__(&self, py: Python<'_>) -> isize {
        let mut h = std::hash::DefaultHasher::new();
        self.idx.id.as_str(self.bytes(py)).hash(&mut h);
        // -1 is CPython's error marker for hashes.
        (h.finish() >> 2) as isize
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp, py: Python<'_>) -> Py<PyAny> {
        let Ok(other) = other.cast::<PyEvent>() else {
            return py.NotImplemented();
        };
        let equal = self.bytes(py) == other.get().bytes(py);
        match op {
            CompareOp::Eq => equal
                .into_pyobject(py)
                .map_or_else(|_| py.None(), |b| b.to_owned().into_any().unbind()),
            CompareOp::Ne => (!equal)
                .into_pyobject(py)
                .map_or_else(|_| py.None(), |b| b.to_owned().into_any().unbind()),
            _ => py.NotImplemented(),
        }
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let decode = py.import("openstarry._core")?.getattr("_event_from_wire")?;
        PyTuple::new(py, [decode, PyTuple::new(py, [self.wire(py)])?.into_any()])
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let buf = self.bytes(py);
        format!(
            "Event(type={:?}, id={:?}, priority={}, session_id={:?}, trace_id={:?})",
            self.idx.type_.as_str(buf),
            self.idx.id.as_str(buf),
            self.idx.priority,
            self.idx.session_id.as_str(buf),
            self.idx.trace_id.as_str(buf),
        )
    }
}

/// Whether a decoded payload can hold references (and so lead back to its event).
fn is_container(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyDict>() || value.is_instance_of::<pyo3::types::PyList>()
}

/// Decoder limits from Python arguments: `max_depth` above [`MAX_DEPTH`] is refused.
pub fn limits_arg(max_bytes: usize, max_depth: usize) -> PyResult<Limits> {
    if max_depth > MAX_DEPTH {
        return Err(CoreError::Value(format!(
            "max_depth must be at most {MAX_DEPTH}, not {max_depth}"
        ))
        .into());
    }
    Ok(Limits {
        max_bytes: max_bytes.min(MAX_INPUT),
        max_depth,
    })
}

/// Turn `bytes`, `bytearray` or `memoryview` into a `bytes` object (no copy for `bytes`).
pub fn as_bytes_object(data: &Bound<'_, PyAny>) -> PyResult<Py<PyBytes>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(b.clone().unbind());
    }
    if data.is_instance_of::<PyString>() {
        return Err(CoreError::Type(
            "expected bytes, bytearray or memoryview, not str (encode it as UTF-8 first)".into(),
        )
        .into());
    }
    if !(data.is_instance_of::<pyo3::types::PyByteArray>()
        || data.is_instance_of::<pyo3::types::PyMemoryView>())
    {
        return Err(CoreError::Type(format!(
            "expected bytes, bytearray or memoryview, not {}",
            type_name(data)
        ))
        .into());
    }
    // A copy: the buffer may change after this call, the event must not.
    let copied = data.py().get_type::<PyBytes>().call1((data,))?;
    Ok(copied.cast_into::<PyBytes>()?.unbind())
}

/// Decode and validate one JSON envelope.
///
/// Raises:
///     openstarry.errors.DecodeError: naming the field or the byte offset.
#[pyfunction]
#[pyo3(signature = (data, *, max_bytes=DEFAULT_MAX_BYTES, max_depth=DEFAULT_MAX_DEPTH))]
fn decode_event(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    max_bytes: usize,
    max_depth: usize,
) -> PyResult<Py<PyEvent>> {
    let limits = limits_arg(max_bytes, max_depth)?;
    let buf = as_bytes_object(data)?;
    PyEvent::from_bytes(py, buf, &limits)?.into_py(py)
}

/// Rebuild a pickled event: its bytes were valid when it was made, whatever the
/// limits it was decoded with, so only the hard limits apply.
#[pyfunction]
fn _event_from_wire(py: Python<'_>, data: Py<PyBytes>) -> PyResult<PyEvent> {
    Ok(PyEvent::from_bytes(
        py,
        data,
        &Limits {
            max_bytes: MAX_INPUT,
            max_depth: MAX_DEPTH,
        },
    )?)
}

/// The event's wire bytes; for a decoded event, the very bytes it came from.
#[pyfunction]
fn encode_event(py: Python<'_>, event: &Bound<'_, PyEvent>) -> Py<PyBytes> {
    event.get().wire(py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEvent>()?;
    m.add_function(wrap_pyfunction!(decode_event, m)?)?;
    m.add_function(wrap_pyfunction!(encode_event, m)?)?;
    m.add_function(wrap_pyfunction!(_event_from_wire, m)?)?;
    m.add("PRIORITY_HIGHEST", 0u8)?;
    m.add("PRIORITY_LOWEST", envelope::LOWEST_PRIORITY)?;
    m.add("DEFAULT_PRIORITY", DEFAULT_PRIORITY)?;
    m.add("DEFAULT_MAX_BYTES", DEFAULT_MAX_BYTES)?;
    m.add("DEFAULT_MAX_DEPTH", DEFAULT_MAX_DEPTH)?;
    m.add("MAX_DEPTH", MAX_DEPTH)?;
    Ok(())
}
