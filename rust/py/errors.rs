//! One error enum, mapped once to the exception classes of `openstarry.errors`.
//!
//! The classes are defined in Python so users can catch them without touching the
//! extension; they are imported on first use and cached.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::json::JsonError;

/// Every error the core raises into Python.
#[derive(Debug)]
pub enum CoreError {
    /// Invalid wire bytes: `openstarry.errors.DecodeError`.
    Decode(JsonError),
    /// A bounded queue under the `"reject"` policy is full.
    QueueFull,
    /// The queue was closed.
    QueueClosed,
    /// A bad argument value (`ValueError`).
    Value(String),
    /// A bad argument type (`TypeError`).
    Type(String),
}

static DECODE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static QUEUE_FULL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static QUEUE_CLOSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn error_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "openstarry.errors", name)
}

/// ``QueueClosed("the bus is closed")``: what the event bus says of its closed queue.
pub fn bus_closed(py: Python<'_>) -> PyErr {
    match error_class(py, &QUEUE_CLOSED, "QueueClosed") {
        Ok(cls) => PyErr::from_type(cls.clone(), "the bus is closed"),
        Err(e) => e,
    }
}

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> PyErr {
        Python::attach(|py| match err {
            CoreError::Decode(e) => decode_error(py, &e),
            CoreError::QueueFull => match error_class(py, &QUEUE_FULL, "QueueFull") {
                Ok(cls) => PyErr::from_type(cls.clone(), "the queue is full"),
                Err(e) => e,
            },
            CoreError::QueueClosed => match error_class(py, &QUEUE_CLOSED, "QueueClosed") {
                Ok(cls) => PyErr::from_type(cls.clone(), "the queue is closed"),
                Err(e) => e,
            },
            CoreError::Value(msg) => PyValueError::new_err(msg),
            CoreError::Type(msg) => PyTypeError::new_err(msg),
        })
    }
}

impl From<JsonError> for CoreError {
    fn from(e: JsonError) -> Self {
        CoreError::Decode(e)
    }
}

impl From<JsonError> for PyErr {
    fn from(e: JsonError) -> Self {
        CoreError::Decode(e).into()
    }
}

/// The name of `obj`'s type, for error messages.
#[must_use]
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// `repr(obj)`, for error messages and reprs.
#[must_use]
pub fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
}

/// `obj` as an `int` that is not a `bool`, if it is one and fits in 64 bits.
#[must_use]
pub fn strict_int(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if obj.is_instance_of::<pyo3::types::PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>() {
        obj.extract().ok()
    } else {
        None
    }
}

/// Build `DecodeError(message, field=..., offset=...)`.
fn decode_error(py: Python<'_>, e: &JsonError) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = error_class(py, &DECODE_ERROR, "DecodeError")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("field", e.field.as_deref())?;
        kwargs.set_item("offset", e.offset)?;
        let instance = cls.call((e.to_string(),), Some(&kwargs))?;
        Ok(PyErr::from_value(instance))
    };
    build().unwrap_or_else(|err| err)
}
