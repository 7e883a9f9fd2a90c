//! `ResponseDecoder`, `SseDecoder`, `json_dumps` and `json_loads`: the byte work
//! of the model providers' HTTP transport (`openstarry.providers.transport`).

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use super::pyjson;
use crate::http::{chat_chunk, ChatChunk, HttpError, Progress, ResponseDecoder, SseDecoder};
use crate::json::{Limits, MAX_DEPTH, MAX_INPUT};

fn http_error(e: HttpError) -> PyErr {
    match e {
        HttpError::Protocol(msg) => PyValueError::new_err(msg),
        HttpError::TooLarge(limit) => {
            PyOverflowError::new_err(format!("the body is more than {limit} bytes"))
        }
    }
}

fn progress(p: Progress) -> u8 {
    match p {
        Progress::Head => 0,
        Progress::Body => 1,
        Progress::Done => 2,
    }
}

/// An HTTP/1.1 response read from a connection's bytes: `feed` returns 0 while
/// the head is incomplete, 1 once it is read, 2 once the whole response is.
#[pyclass(name = "ResponseDecoder", module = "openstarry._core")]
pub struct PyResponseDecoder {
    inner: ResponseDecoder,
}

#[pymethods]
impl PyResponseDecoder {
    #[new]
    fn py_new(limit: u64) -> Self {
        PyResponseDecoder {
            inner: ResponseDecoder::new(limit),
        }
    }

    /// Read the connection's next bytes. `ValueError` for bytes that break
    /// HTTP/1.1, `OverflowError` for a body past the limit.
    fn feed(&mut self, data: &[u8]) -> PyResult<u8> {
        self.inner.feed(data).map(progress).map_err(http_error)
    }

    /// The connection ended; `ValueError` when that cuts the response short.
    fn eof(&mut self) -> PyResult<u8> {
        self.inner.eof().map(progress).map_err(http_error)
    }

    /// A new limit for the body (an error answer is read only so far).
    fn set_limit(&mut self, limit: u64) {
        self.inner.set_limit(limit);
    }

    #[getter]
    fn status(&self) -> u16 {
        self.inner.head().map_or(0, |h| h.status)
    }

    #[getter]
    fn reason(&self) -> &str {
        self.inner.head().map_or("", |h| h.reason.as_str())
    }

    /// The header fields, `(lower-cased name, value)` in order.
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        if let Some(head) = self.inner.head() {
            for (name, value) in &head.headers {
                list.append(PyTuple::new(
                    py,
                    [PyString::new(py, name), PyString::new(py, value)],
                )?)?;
            }
        }
        Ok(list)
    }

    /// Whether the connection may carry another request after this response.
    #[getter]
    fn keep_alive(&self) -> bool {
        self.inner.head().is_some_and(|h| h.keep_alive) && self.inner.surplus() == 0
    }

    /// Whether decoded body bytes wait to be taken.
    #[getter]
    fn body_pending(&self) -> bool {
        !self.inner.body().is_empty()
    }

    /// The body bytes decoded since the last call.
    fn take_body<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let body = self.inner.take_body();
        PyBytes::new(py, &body)
    }

    /// The body decoded so far, parsed as one JSON document (and taken).
    /// `openstarry.errors.DecodeError` when it is not JSON.
    fn json<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let body = self.inner.take_body();
        loads(py, &body)
    }
}

fn loads<'py>(py: Python<'py>, buf: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    pyjson::loads(
        py,
        buf,
        &Limits {
            max_bytes: MAX_INPUT,
            max_depth: MAX_DEPTH,
        },
    )
}

/// Server-sent events split from a body's bytes: `feed` returns the events a
/// chunk completes as `(event name or None, data)`. `OverflowError` for a line
/// or an event past its bound.
///
/// With `text="openai-chat"`, a run of Chat Completions chunks that carry text
/// alone (`openstarry::http::chat_chunk`) comes back as one `str`, their texts
/// joined, in its place among the other events; only once an earlier chunk of
/// the stream, read in full, named the answer's `id` and `model`.
#[pyclass(name = "SseDecoder", module = "openstarry._core")]
pub struct PySseDecoder {
    inner: SseDecoder,
    max_line: usize,
    max_event: usize,
    chat: bool,
    meta_seen: bool,
}

#[pymethods]
impl PySseDecoder {
    #[new]
    #[pyo3(signature = (max_line, max_event, text=None))]
    fn py_new(max_line: usize, max_event: usize, text: Option<&str>) -> PyResult<Self> {
        let chat = match text {
            None => false,
            Some("openai-chat") => true,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "text must be None or 'openai-chat', not {other:?}"
                )))
            }
        };
        Ok(PySseDecoder {
            inner: SseDecoder::new(max_line, max_event),
            max_line,
            max_event,
            chat,
            meta_seen: false,
        })
    }

    #[getter]
    fn max_line(&self) -> usize {
        self.max_line
    }

    #[getter]
    fn max_event(&self) -> usize {
        self.max_event
    }

    fn feed<'py>(&mut self, py: Python<'py>, chunk: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let mut events = Vec::new();
        let result = self.inner.feed(chunk, &mut events);
        let list = PyList::empty(py);
        let mut text = String::new();
        for (event, data) in events {
            if self.chat && event.is_none() {
                match chat_chunk(data.as_bytes()) {
                    ChatChunk::Text(piece, _) if self.meta_seen => {
                        text.push_str(&piece);
                        continue;
                    }
                    ChatChunk::Text(_, meta) | ChatChunk::Other { meta } => self.meta_seen |= meta,
                }
            }
            if !text.is_empty() {
                list.append(std::mem::take(&mut text))?;
            }
            list.append((event, data))?;
        }
        if !text.is_empty() {
            list.append(text)?;
        }
        result.map_err(|e| PyOverflowError::new_err(e.to_string()))?;
        Ok(list)
    }

    /// The stream ended: an open event or line is dropped.
    fn close<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyList> {
        self.inner.close();
        PyList::empty(py)
    }
}

/// `obj` as compact JSON bytes: `json.dumps(obj, ensure_ascii=False,
/// separators=(",", ":"), allow_nan=False).encode()` for the types JSON has
/// (floats written shortest, as `repr` does, with `e` and no `+`).
#[pyfunction]
fn json_dumps<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let out = pyjson::dumps_at(obj, 0, MAX_DEPTH)?;
    Ok(PyBytes::new(py, &out))
}

/// One JSON document as Python objects, nested at most 512 deep.
#[pyfunction]
fn json_loads<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    loads(py, data)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyResponseDecoder>()?;
    m.add_class::<PySseDecoder>()?;
    m.add_function(wrap_pyfunction!(json_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(json_loads, m)?)?;
    Ok(())
}
