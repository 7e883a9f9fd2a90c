//! JSON to Python objects and back, for payloads, tool arguments and metadata.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::errors::type_name;
use crate::json::{write_str, JsonError, Kind, Limits, Scanner};

/// Decode one JSON document into Python objects.
pub fn loads<'py>(py: Python<'py>, buf: &[u8], limits: &Limits) -> PyResult<Bound<'py, PyAny>> {
    let mut s = Scanner::new(buf, limits)?;
    let value = value(py, &mut s, 0)?;
    s.finish()?;
    Ok(value)
}

/// Decode a region already validated by a scanner (no size check, same depth rule).
pub fn loads_validated<'py>(py: Python<'py>, buf: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    loads(
        py,
        buf,
        &Limits {
            max_bytes: usize::MAX,
            max_depth: usize::MAX,
        },
    )
}

fn value<'py>(py: Python<'py>, s: &mut Scanner<'_>, depth: usize) -> PyResult<Bound<'py, PyAny>> {
    let buf = s.buf();
    Ok(match s.peek_kind()? {
        Kind::Object => {
            s.enter(depth)?;
            s.begin_object()?;
            let dict = PyDict::new(py);
            let mut first = true;
            while let Some(key) = s.next_key(first)? {
                first = false;
                let k = PyString::new(py, &key.as_str(buf));
                dict.set_item(k, value(py, s, depth + 1)?)?;
            }
            dict.into_any()
        }
        Kind::Array => {
            s.enter(depth)?;
            s.begin_array()?;
            let list = PyList::empty(py);
            let mut first = true;
            while s.next_item(first)? {
                first = false;
                list.append(value(py, s, depth + 1)?)?;
            }
            list.into_any()
        }
        Kind::String => {
            let span = s.string()?;
            PyString::new(py, &span.as_str(buf)).into_any()
        }
        Kind::Number => {
            let (start, end, integer) = s.number()?;
            let text = std::str::from_utf8(&buf[start..end]).unwrap_or("0");
            if integer {
                match text.parse::<i64>() {
                    Ok(v) => v.into_pyobject(py)?.into_any(),
                    Err(_) => py.get_type::<PyInt>().call1((text,))?,
                }
            } else {
                let v: f64 = text
                    .parse()
                    .map_err(|_| JsonError::at(start, "invalid number"))?;
                PyFloat::new(py, v).into_any()
            }
        }
        Kind::True => {
            s.literal(Kind::True)?;
            PyBool::new(py, true).to_owned().into_any()
        }
        Kind::False => {
            s.literal(Kind::False)?;
            PyBool::new(py, false).to_owned().into_any()
        }
        Kind::Null => {
            s.literal(Kind::Null)?;
            py.None().into_bound(py)
        }
    })
}

/// Encode a Python object as JSON: dicts with string keys, lists and tuples,
/// strings, integers of any size, finite floats, booleans and `None`.
pub fn dumps(obj: &Bound<'_, PyAny>, max_depth: usize) -> PyResult<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    write(obj, &mut out, 0, max_depth)?;
    Ok(out)
}

fn write(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<u8>,
    depth: usize,
    max_depth: usize,
) -> PyResult<()> {
    if let Ok(s) = obj.cast::<PyString>() {
        write_str(out, &s.to_cow()?);
    } else if obj.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = obj.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if let Ok(i) = obj.cast::<PyInt>() {
        match i.extract::<i64>() {
            Ok(v) => out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes()),
            Err(_) => out.extend_from_slice(i.str()?.to_cow()?.as_bytes()),
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        if !v.is_finite() {
            return Err(PyValueError::new_err(format!("{v} is not valid JSON")));
        }
        out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    } else if let Ok(d) = obj.cast::<PyDict>() {
        enter(depth, max_depth)?;
        out.push(b'{');
        for (n, (k, v)) in d.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let key = k.cast::<PyString>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "JSON object keys must be str, not {}",
                    type_name(&k)
                ))
            })?;
            write_str(out, &key.to_cow()?);
            out.push(b':');
            write(&v, out, depth + 1, max_depth)?;
        }
        out.push(b'}');
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        enter(depth, max_depth)?;
        out.push(b'[');
        for (n, item) in obj.try_iter()?.enumerate() {
            if n > 0 {
                out.push(b',');
            }
            write(&item?, out, depth + 1, max_depth)?;
        }
        out.push(b']');
    } else {
        let name = type_name(obj);
        return Err(PyTypeError::new_err(format!(
            "Object of type {name} is not JSON serializable"
        )));
    }
    Ok(())
}

fn enter(depth: usize, max_depth: usize) -> PyResult<()> {
    if depth >= max_depth {
        Err(PyValueError::new_err(format!(
            "nesting deeper than {max_depth} levels (or a reference cycle)"
        )))
    } else {
        Ok(())
    }
}
