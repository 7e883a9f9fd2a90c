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

/// A container being filled, with the key its next value goes under.
enum Frame<'py> {
    Dict(Bound<'py, PyDict>, Bound<'py, PyString>),
    List(Bound<'py, PyList>),
}

/// Convert the value at the cursor. Iterative, with the open containers on a
/// heap stack: the machine stack does not grow with the nesting.
fn value<'py>(py: Python<'py>, s: &mut Scanner<'_>, depth: usize) -> PyResult<Bound<'py, PyAny>> {
    let buf = s.buf();
    let mut stack: Vec<Frame<'py>> = Vec::new();
    loop {
        let mut v = match s.peek_kind()? {
            Kind::Object => {
                s.enter(depth + stack.len())?;
                s.begin_object()?;
                let dict = PyDict::new(py);
                if s.object_sep(true)? {
                    let key = s.key()?;
                    stack.push(Frame::Dict(dict, PyString::new(py, &key.as_str(buf))));
                    continue;
                }
                dict.into_any()
            }
            Kind::Array => {
                s.enter(depth + stack.len())?;
                s.begin_array()?;
                let list = PyList::empty(py);
                if s.next_item(true)? {
                    stack.push(Frame::List(list));
                    continue;
                }
                list.into_any()
            }
            Kind::String => {
                let span = s.string()?;
                PyString::new(py, &span.as_str(buf)).into_any()
            }
            Kind::Number => number(py, s)?,
            kind @ (Kind::True | Kind::False) => {
                s.literal(kind)?;
                PyBool::new(py, kind == Kind::True).to_owned().into_any()
            }
            Kind::Null => {
                s.literal(Kind::Null)?;
                py.None().into_bound(py)
            }
        };
        // Put the value into its container; close the containers it completes.
        loop {
            let more = match stack.last_mut() {
                None => return Ok(v),
                Some(Frame::Dict(dict, key)) => {
                    dict.set_item(&*key, v)?;
                    let more = s.object_sep(false)?;
                    if more {
                        *key = PyString::new(py, &s.key()?.as_str(buf));
                    }
                    more
                }
                Some(Frame::List(list)) => {
                    list.append(v)?;
                    s.next_item(false)?
                }
            };
            if more {
                break;
            }
            v = match stack.pop() {
                Some(Frame::Dict(dict, _)) => dict.into_any(),
                Some(Frame::List(list)) => list.into_any(),
                None => unreachable!("a frame was just read"),
            };
        }
    }
}

fn number<'py>(py: Python<'py>, s: &mut Scanner<'_>) -> PyResult<Bound<'py, PyAny>> {
    let (start, end, integer) = s.number()?;
    let text = std::str::from_utf8(&s.buf()[start..end]).unwrap_or("0");
    if integer {
        if let Ok(v) = text.parse::<i64>() {
            return Ok(v.into_pyobject(py)?.into_any());
        }
        // The scanner bounds the digits; a lowered sys.set_int_max_str_digits can still refuse.
        return py
            .get_type::<PyInt>()
            .call1((text,))
            .map_err(|e| JsonError::at(start, format!("integer not convertible: {e}")).into());
    }
    let v: f64 = text
        .parse()
        .map_err(|_| JsonError::at(start, "invalid number"))?;
    Ok(PyFloat::new(py, v).into_any())
}

/// Encode a Python object as JSON (dicts with string keys, lists and tuples,
/// strings, integers of any size, finite floats, booleans and `None`) that will
/// sit `depth` levels deep in its document, so that what encodes here also
/// decodes there under `max_depth`.
pub fn dumps_at(obj: &Bound<'_, PyAny>, depth: usize, max_depth: usize) -> PyResult<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    write(obj, &mut out, depth, max_depth)?;
    Ok(out)
}

/// [`dumps_at`] into `out`.
pub fn write(
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
        if let Ok(v) = i.extract::<i64>() {
            out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        } else {
            // int.__repr__, not str(): a subclass's own __str__ must not write the JSON.
            let digits = i.py().get_type::<PyInt>().call_method1("__repr__", (i,))?;
            out.extend_from_slice(digits.cast::<PyString>()?.to_cow()?.as_bytes());
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
    } else if let Ok(list) = obj.cast::<PyList>() {
        // Item by item, not through __iter__: no user code runs while encoding.
        enter(depth, max_depth)?;
        out.push(b'[');
        for (n, item) in list.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            write(&item, out, depth + 1, max_depth)?;
        }
        out.push(b']');
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        enter(depth, max_depth)?;
        out.push(b'[');
        for (n, item) in tuple.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            write(&item, out, depth + 1, max_depth)?;
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
