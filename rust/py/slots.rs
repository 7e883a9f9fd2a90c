//! `SlotsMaker`: an instance of a slotted class, its fields set, in one call.
//!
//! A frozen dataclass's `__init__` sets each field through its slot's
//! descriptor, a call each (a frozen class refuses plain assignment): a
//! memory entry of six fields costs several times what its allocation does.
//! The agent's turn makes a few entries each round; a `SlotsMaker` makes one
//! as the constructor would, with no Python frame: the instance allocated as
//! `object.__new__` allocates it, each field set as `object.__setattr__`
//! sets it (past the class's own `__setattr__`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};

/// Makes instances of one slotted class whose constructor only stores its
/// fields: ``maker(*values)`` is ``cls(*values)`` with the trailing fields it
/// is not given set to ``defaults``.
///
/// ``cls`` must use ``object.__new__`` and define ``__slots__`` holding every
/// name of ``names`` (a dataclass with ``slots=True``, frozen or not); its
/// ``__init__`` and ``__post_init__`` are not run, so it must do no more than
/// store its arguments.
///
/// Raises:
///     TypeError: ``cls`` has a ``__new__`` of its own or no ``__slots__``,
///         or a call gives more values than ``names`` or fewer than it
///         needs.
///     ValueError: more ``defaults`` than ``names``.
#[allow(clippy::doc_markdown)] // (a Python docstring: its Raises section names the exceptions)
#[pyclass(frozen, name = "SlotsMaker", module = "openstarry._core")]
pub struct PySlotsMaker {
    cls: Py<PyType>,
    names: Vec<Py<PyString>>,
    defaults: Vec<Py<PyAny>>,
}

#[pymethods]
impl PySlotsMaker {
    #[new]
    #[pyo3(signature = (cls, names, defaults=None))]
    fn py_new(
        cls: &Bound<'_, PyType>,
        names: &Bound<'_, PyTuple>,
        defaults: Option<&Bound<'_, PyTuple>>,
    ) -> PyResult<Self> {
        let py = cls.py();
        let object_new = py.get_type::<pyo3::types::PyAny>().getattr("__new__")?;
        if !cls.getattr("__new__")?.is(&object_new) {
            return Err(PyTypeError::new_err(format!(
                "SlotsMaker makes instances of a class that uses object.__new__, not {}",
                cls.name()?
            )));
        }
        let slots = cls.getattr("__slots__").map_err(|_| {
            PyTypeError::new_err("SlotsMaker makes instances of a class with __slots__")
        })?;
        let mut kept = Vec::with_capacity(names.len());
        for name in names.iter() {
            let name = name.cast_into::<PyString>()?;
            if !slots.contains(&name)? {
                return Err(PyTypeError::new_err(format!(
                    "{} has no slot {name}",
                    cls.name()?
                )));
            }
            kept.push(name.unbind());
        }
        let defaults: Vec<Py<PyAny>> = defaults
            .map(|d| d.iter().map(Bound::unbind).collect())
            .unwrap_or_default();
        if defaults.len() > kept.len() {
            return Err(PyValueError::new_err(format!(
                "{} defaults for {} fields",
                defaults.len(),
                kept.len()
            )));
        }
        Ok(PySlotsMaker {
            cls: cls.clone().unbind(),
            names: kept,
            defaults,
        })
    }

    /// An instance of the class, its fields set to ``values`` and then the defaults.
    #[pyo3(signature = (*values))]
    fn __call__<'py>(&self, values: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        let py = values.py();
        let given = values.len();
        let total = self.names.len();
        let first_default = total - self.defaults.len();
        if given > total || given < first_default {
            return Err(PyTypeError::new_err(format!(
                "{} takes {first_default} to {total} values, not {given}",
                self.cls.bind(py).name()?
            )));
        }
        let cls = self.cls.bind(py);
        let empty = PyTuple::empty(py);
        // SAFETY: `cls` is a live type object whose `__new__` is
        // `object.__new__` (checked when the maker was made), `empty` a live
        // tuple, and the GIL is held: `PyType_GenericNew` allocates the
        // instance as `object.__new__` does (GC-tracked for a GC type) and
        // returns a new reference, or NULL with an exception set.
        #[allow(unsafe_code)]
        let instance = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                pyo3::ffi::PyType_GenericNew(
                    cls.as_type_ptr(),
                    empty.as_ptr(),
                    std::ptr::null_mut(),
                ),
            )?
        };
        for (i, name) in self.names.iter().enumerate() {
            let value = if i < given {
                values.get_item(i)?
            } else {
                self.defaults[i - first_default].bind(py).clone()
            };
            // SAFETY: live objects and the GIL held; `PyObject_GenericSetAttr`
            // stores through the slot's descriptor as `object.__setattr__`
            // does, and borrows its arguments. -1 sets an exception.
            #[allow(unsafe_code)]
            let stored = unsafe {
                pyo3::ffi::PyObject_GenericSetAttr(instance.as_ptr(), name.as_ptr(), value.as_ptr())
            };
            if stored < 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(instance)
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.cls)?;
        for default in &self.defaults {
            visit.call(default)?;
        }
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("SlotsMaker({})", self.cls.bind(py).name()?))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySlotsMaker>()
}
