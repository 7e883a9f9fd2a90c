//! `ToolCall`, `ContentSegment` and `ProviderResponse` (spec 000 section 3) and their codec.

use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::errors::{repr, CoreError};
use super::event::{as_bytes_object, limits_arg};
use super::pyjson;
use crate::json::{write_str, Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH};
use crate::segment::{self, Args, SegmentType};

/// The longest text a ``plain`` response (``ProviderResponse.parts``) carries.
const NOTED_TEXT: usize = 1 << 20;

/// Unknown wire fields, kept for re-encoding: the key and the raw JSON value.
type Extra = Vec<(String, Vec<u8>)>;

fn extra_of(buf: &[u8], fields: &[(crate::json::Span, segment::Raw)]) -> Extra {
    fields
        .iter()
        .map(|(k, (a, b))| (k.as_str(buf).into_owned(), buf[*a..*b].to_vec()))
        .collect()
}

fn write_extra(out: &mut Vec<u8>, extra: &Extra) {
    for (k, v) in extra {
        out.push(b',');
        write_str(out, k);
        out.push(b':');
        out.extend_from_slice(v);
    }
}

/// Python equality of two optional fields: both absent, or both present and equal.
fn opt_eq<T>(py: Python<'_>, a: Option<&Py<T>>, b: Option<&Py<T>>) -> PyResult<bool> {
    match (a, b) {
        (None, None) => Ok(true),
        (Some(a), Some(b)) => a.bind(py).as_any().eq(b.bind(py).as_any()),
        _ => Ok(false),
    }
}

fn eq_result(py: Python<'_>, op: CompareOp, equal: PyResult<bool>) -> PyResult<Py<PyAny>> {
    let equal = equal?;
    Ok(match op {
        CompareOp::Eq => equal.into_pyobject(py)?.to_owned().into_any().unbind(),
        CompareOp::Ne => (!equal).into_pyobject(py)?.to_owned().into_any().unbind(),
        _ => py.NotImplemented(),
    })
}

/// An agent's intent to run a tool (spec 000 section 3A). Wire name ``toolCall``.
#[pyclass(frozen, name = "ToolCall", module = "openstarry._core")]
pub struct PyToolCall {
    id: String,
    name: String,
    /// `id` and `name` as the Python strings the getters give, made once: the
    /// loop reads them several times a call and keys dicts with them (their
    /// hash is then computed once).
    py_id: Py<PyString>,
    py_name: Py<PyString>,
    args: Py<PyAny>,
    extra: Extra,
}

impl PyToolCall {
    fn new(py: Python<'_>, id: String, name: String, args: Py<PyAny>, extra: Extra) -> Self {
        PyToolCall {
            py_id: PyString::new(py, &id).unbind(),
            py_name: PyString::new(py, &name).unbind(),
            id,
            name,
            args,
            extra,
        }
    }
}

fn parse_args<'py>(
    py: Python<'py>,
    args: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    match args {
        None => Ok(PyDict::new(py).into_any()),
        Some(a) if a.is_none() => Ok(PyDict::new(py).into_any()),
        Some(a) => match a.cast::<PyString>() {
            Ok(s) => {
                let text = s.to_cow()?;
                segment::args_text(&text, &Limits::default())
                    .map_err(|e| CoreError::Value(format!("args is {}", e.message)))?;
                pyjson::loads_validated(py, text.as_bytes())
            }
            Err(_) => Ok(a.clone()),
        },
    }
}

#[pymethods]
impl PyToolCall {
    /// ``args`` defaults to ``{}``; a JSON string is parsed; a missing ``id`` gets a UUID v4.
    #[new]
    #[pyo3(signature = (name, args=None, id=None))]
    fn py_new(
        py: Python<'_>,
        name: &str,
        args: Option<&Bound<'_, PyAny>>,
        id: Option<&str>,
    ) -> PyResult<Self> {
        if name.is_empty() {
            return Err(CoreError::Value("a tool call needs a non-empty name".into()).into());
        }
        let args = parse_args(py, args)?;
        // Fail now, not at encoding time, for arguments that are not JSON.
        pyjson::dumps_at(&args, segment::ARGS_DEPTH, DEFAULT_MAX_DEPTH)?;
        Ok(PyToolCall::new(
            py,
            id.filter(|i| !i.is_empty())
                .map_or_else(crate::envelope::new_uuid, str::to_owned),
            name.to_owned(),
            args.unbind(),
            Vec::new(),
        ))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.args)
    }

    #[getter]
    fn id(&self, py: Python<'_>) -> Py<PyString> {
        self.py_id.clone_ref(py)
    }

    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.py_name.clone_ref(py)
    }

    #[getter]
    fn args(&self, py: Python<'_>) -> Py<PyAny> {
        self.args.clone_ref(py)
    }

    fn __richcmp__(
        &self,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
        py: Python<'_>,
    ) -> PyResult<Py<PyAny>> {
        let Ok(other) = other.cast::<PyToolCall>() else {
            return Ok(py.NotImplemented());
        };
        let o = other.get();
        let equal = || -> PyResult<bool> {
            Ok(self.id == o.id
                && self.name == o.name
                && self.extra == o.extra
                && self.args.bind(py).eq(o.args.bind(py))?)
        };
        eq_result(py, op, equal())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let args = repr(self.args.bind(py));
        format!(
            "ToolCall(name={:?}, args={args}, id={:?})",
            self.name, self.id
        )
    }
}

impl PyToolCall {
    fn write(&self, py: Python<'_>, out: &mut Vec<u8>) -> PyResult<()> {
        out.extend_from_slice(b"{\"id\":");
        write_str(out, &self.id);
        out.extend_from_slice(b",\"name\":");
        write_str(out, &self.name);
        out.extend_from_slice(b",\"args\":");
        out.extend_from_slice(&pyjson::dumps_at(
            self.args.bind(py),
            segment::ARGS_DEPTH,
            DEFAULT_MAX_DEPTH,
        )?);
        write_extra(out, &self.extra);
        out.push(b'}');
        Ok(())
    }
}

/// One part of a provider response (spec 000 section 3B).
#[pyclass(frozen, name = "ContentSegment", module = "openstarry._core")]
pub struct PySegment {
    kind: SegmentType,
    text: Option<String>,
    data: Option<String>,
    mime_type: Option<String>,
    signature: Option<String>,
    tool_call: Option<Py<PyToolCall>>,
    ui: Option<Py<PyAny>>,
    extra: Extra,
}

impl PySegment {
    /// A text (or reasoning) segment, or a tool call's: what it needs, given.
    fn of(kind: SegmentType, text: Option<String>, tool_call: Option<Py<PyToolCall>>) -> Self {
        PySegment {
            kind,
            text,
            data: None,
            mime_type: None,
            signature: None,
            tool_call,
            ui: None,
            extra: Vec::new(),
        }
    }
}

#[pymethods]
impl PySegment {
    /// Raises ``ValueError`` when the type's required field is missing.
    #[new]
    #[pyo3(signature = (r#type, *, text=None, data=None, mime_type=None, tool_call=None, ui=None, signature=None))]
    fn py_new(
        r#type: &str,
        text: Option<String>,
        data: Option<String>,
        mime_type: Option<String>,
        tool_call: Option<Py<PyToolCall>>,
        ui: Option<&Bound<'_, PyAny>>,
        signature: Option<String>,
    ) -> PyResult<Self> {
        let kind = SegmentType::parse(r#type).ok_or_else(|| {
            CoreError::Value(format!(
                "unknown segment type {type:?}; expected text, image, audio, video, ui, tool_call or reasoning"
            ))
        })?;
        let ui = ui.filter(|u| !u.is_none());
        if let Some(u) = ui {
            pyjson::dumps_at(u, segment::UI_DEPTH, DEFAULT_MAX_DEPTH)?;
        }
        let present = match kind {
            SegmentType::Text | SegmentType::Reasoning => text.is_some(),
            SegmentType::Image | SegmentType::Audio | SegmentType::Video => data.is_some(),
            SegmentType::Ui => ui.is_some(),
            SegmentType::ToolCall => tool_call.is_some(),
        };
        if !present {
            let field = match kind.required_field() {
                "toolCall" => "tool_call",
                f => f,
            };
            return Err(
                CoreError::Value(format!("a {} segment needs {field}", kind.as_str())).into(),
            );
        }
        Ok(PySegment {
            kind,
            text,
            data,
            mime_type,
            signature,
            tool_call,
            ui: ui.map(|u| u.clone().unbind()),
            extra: Vec::new(),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(tool_call) = &self.tool_call {
            visit.call(tool_call)?;
        }
        if let Some(ui) = &self.ui {
            visit.call(ui)?;
        }
        Ok(())
    }

    #[getter(r#type)]
    fn segment_type(&self) -> &'static str {
        self.kind.as_str()
    }

    #[getter]
    fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }

    #[getter]
    fn data(&self) -> Option<&str> {
        self.data.as_deref()
    }

    #[getter]
    fn mime_type(&self) -> Option<&str> {
        self.mime_type.as_deref()
    }

    /// A ``reasoning`` segment's opaque proof, sent back to its provider.
    #[getter]
    fn signature(&self) -> Option<&str> {
        self.signature.as_deref()
    }

    #[getter]
    fn tool_call(&self, py: Python<'_>) -> Option<Py<PyToolCall>> {
        self.tool_call.as_ref().map(|t| t.clone_ref(py))
    }

    #[getter]
    fn ui(&self, py: Python<'_>) -> Py<PyAny> {
        self.ui
            .as_ref()
            .map_or_else(|| py.None(), |u| u.clone_ref(py))
    }

    fn __richcmp__(
        &self,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
        py: Python<'_>,
    ) -> PyResult<Py<PyAny>> {
        let Ok(other) = other.cast::<PySegment>() else {
            return Ok(py.NotImplemented());
        };
        let o = other.get();
        let equal = || -> PyResult<bool> {
            if self.kind != o.kind
                || self.text != o.text
                || self.data != o.data
                || self.mime_type != o.mime_type
                || self.signature != o.signature
                || self.extra != o.extra
            {
                return Ok(false);
            }
            Ok(opt_eq(py, self.tool_call.as_ref(), o.tool_call.as_ref())?
                && opt_eq(py, self.ui.as_ref(), o.ui.as_ref())?)
        };
        eq_result(py, op, equal())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let mut parts = vec![format!("{:?}", self.kind.as_str())];
        if let Some(t) = &self.text {
            parts.push(format!("text={t:?}"));
        }
        if let Some(d) = &self.data {
            let shown: String = d.chars().take(32).collect();
            parts.push(format!(
                "data={shown:?}{}",
                if d.len() > shown.len() { "..." } else { "" }
            ));
        }
        if let Some(m) = &self.mime_type {
            parts.push(format!("mime_type={m:?}"));
        }
        if let Some(sig) = &self.signature {
            parts.push(format!("signature={sig:?}"));
        }
        if let Some(tc) = &self.tool_call {
            parts.push(format!("tool_call={}", tc.get().__repr__(py)));
        }
        if let Some(ui) = &self.ui {
            parts.push(format!("ui={}", repr(ui.bind(py))));
        }
        format!("ContentSegment({})", parts.join(", "))
    }
}

impl PySegment {
    fn write(&self, py: Python<'_>, out: &mut Vec<u8>) -> PyResult<()> {
        out.extend_from_slice(b"{\"type\":");
        write_str(out, self.kind.as_str());
        for (name, value) in [
            ("text", &self.text),
            ("data", &self.data),
            ("mimeType", &self.mime_type),
            ("signature", &self.signature),
        ] {
            if let Some(v) = value {
                out.extend_from_slice(b",\"");
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b"\":");
                write_str(out, v);
            }
        }
        if let Some(tc) = &self.tool_call {
            out.extend_from_slice(b",\"toolCall\":");
            tc.get().write(py, out)?;
        }
        if let Some(ui) = &self.ui {
            out.extend_from_slice(b",\"ui\":");
            out.extend_from_slice(&pyjson::dumps_at(
                ui.bind(py),
                segment::UI_DEPTH,
                DEFAULT_MAX_DEPTH,
            )?);
        }
        write_extra(out, &self.extra);
        out.push(b'}');
        Ok(())
    }
}

/// What a provider's ``generate`` returns: ordered segments and metadata.
#[pyclass(frozen, name = "ProviderResponse", module = "openstarry._core")]
pub struct PyResponse {
    segments: Vec<Py<PySegment>>,
    metadata: Option<Py<PyAny>>,
    extra: Extra,
}

impl PyResponse {
    /// A response of these segments, its ``metadata`` checked as the constructor checks it.
    fn with(segments: Vec<Py<PySegment>>, metadata: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let metadata = metadata.filter(|m| !m.is_none());
        if let Some(m) = metadata {
            pyjson::dumps_at(m, segment::METADATA_DEPTH, DEFAULT_MAX_DEPTH)?;
        }
        Ok(PyResponse {
            segments,
            metadata: metadata.map(|m| m.clone().unbind()),
            extra: Vec::new(),
        })
    }
}

#[pymethods]
impl PyResponse {
    #[new]
    #[pyo3(signature = (segments, metadata=None))]
    fn py_new(segments: &Bound<'_, PyAny>, metadata: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let mut list = Vec::new();
        for item in segments.try_iter()? {
            let item = item?;
            let seg = item
                .cast::<PySegment>()
                .map_err(|_| CoreError::Type("segments must be ContentSegment objects".into()))?;
            list.push(seg.clone().unbind());
        }
        PyResponse::with(list, metadata)
    }

    /// ``ProviderResponse([ContentSegment("text", text=text)], metadata)``, in one call.
    #[staticmethod]
    #[pyo3(signature = (text, metadata=None))]
    fn of_text(
        py: Python<'_>,
        text: String,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let segment = Py::new(py, PySegment::of(SegmentType::Text, Some(text), None))?;
        PyResponse::with(vec![segment], metadata)
    }

    /// A response that calls one tool, after a text segment when ``text`` is
    /// given: ``ProviderResponse([ContentSegment("text", text=text),
    /// ContentSegment("tool_call", tool_call=ToolCall(name, args, id))],
    /// metadata)``, in one call.
    #[staticmethod]
    #[pyo3(signature = (name, args=None, id=None, text=None, metadata=None))]
    fn of_tool_call(
        py: Python<'_>,
        name: &str,
        args: Option<&Bound<'_, PyAny>>,
        id: Option<&str>,
        text: Option<String>,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let call = Py::new(py, PyToolCall::py_new(py, name, args, id)?)?;
        let mut segments = Vec::with_capacity(2);
        if text.is_some() {
            segments.push(Py::new(py, PySegment::of(SegmentType::Text, text, None))?);
        }
        segments.push(Py::new(
            py,
            PySegment::of(SegmentType::ToolCall, None, Some(call)),
        )?);
        PyResponse::with(segments, metadata)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for segment in &self.segments {
            visit.call(segment)?;
        }
        if let Some(metadata) = &self.metadata {
            visit.call(metadata)?;
        }
        Ok(())
    }

    #[getter]
    fn segments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.segments.iter().map(|s| s.clone_ref(py)))
    }

    #[getter]
    fn metadata(&self, py: Python<'_>) -> Py<PyAny> {
        self.metadata
            .as_ref()
            .map_or_else(|| py.None(), |m| m.clone_ref(py))
    }

    /// The response as an agent's turn reads it, in one call:
    /// ``(calls, text, thought, said, plain)``.
    ///
    /// - ``calls``: the tool calls, in order (a tuple);
    /// - ``text``: the text of the segments that are neither tool calls nor
    ///   reasoning, joined;
    /// - ``thought``: the ``reasoning`` segments (a tuple);
    /// - ``said``: each segment that is not a tool call as the
    ///   ``OUTPUT:AGENT_MESSAGE`` payload shows it (``type``, and ``text``,
    ///   ``data``, ``mimeType``, ``ui`` where present; a reasoning segment's
    ///   ``text`` only, ``""`` when it has none), or ``None`` when there is none;
    /// - ``plain``: ``said`` is one ``text`` segment of ASCII text shorter than
    ///   1 MiB, with no other field and no metadata (its event can carry it
    ///   without encoding it first).
    #[allow(clippy::type_complexity)]
    fn parts<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyTuple>,
        Bound<'py, PyString>,
        Bound<'py, PyTuple>,
        Option<Bound<'py, PyList>>,
        bool,
    )> {
        let mut calls: Vec<Py<PyToolCall>> = Vec::new();
        let mut thought: Vec<Py<PySegment>> = Vec::new();
        let mut said: Option<Bound<'py, PyList>> = None;
        let mut text = String::new();
        let mut plain_seen = 0usize;
        let mut plain = true;
        for segment in &self.segments {
            let s = segment.get();
            if let Some(call) = &s.tool_call {
                calls.push(call.clone_ref(py));
                continue;
            }
            let out = PyDict::new(py);
            out.set_item(intern!(py, "type"), s.kind.as_str())?;
            if s.kind == SegmentType::Reasoning {
                out.set_item(intern!(py, "text"), s.text.as_deref().unwrap_or(""))?;
                thought.push(segment.clone_ref(py));
                plain = false;
            } else {
                if let Some(t) = &s.text {
                    out.set_item(intern!(py, "text"), t)?;
                    text.push_str(t);
                }
                if let Some(d) = &s.data {
                    out.set_item(intern!(py, "data"), d)?;
                }
                if let Some(m) = &s.mime_type {
                    out.set_item(intern!(py, "mimeType"), m)?;
                }
                if let Some(ui) = &s.ui {
                    out.set_item(intern!(py, "ui"), ui.bind(py))?;
                }
                plain &= s.kind == SegmentType::Text
                    && s.data.is_none()
                    && s.mime_type.is_none()
                    && s.ui.is_none();
            }
            plain_seen += 1;
            match &said {
                Some(list) => list.append(out)?,
                None => said = Some(PyList::new(py, [out])?),
            }
        }
        let plain = plain
            && plain_seen == 1
            && self.metadata.is_none()
            && text.len() < NOTED_TEXT
            && text.is_ascii();
        Ok((
            PyTuple::new(py, calls)?,
            PyString::new(py, &text),
            PyTuple::new(py, thought)?,
            said,
            plain,
        ))
    }

    fn __richcmp__(
        &self,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
        py: Python<'_>,
    ) -> PyResult<Py<PyAny>> {
        let Ok(other) = other.cast::<PyResponse>() else {
            return Ok(py.NotImplemented());
        };
        let o = other.get();
        let equal = || -> PyResult<bool> {
            if self.segments.len() != o.segments.len() || self.extra != o.extra {
                return Ok(false);
            }
            for (a, b) in self.segments.iter().zip(&o.segments) {
                if !a.bind(py).eq(b.bind(py))? {
                    return Ok(false);
                }
            }
            opt_eq(py, self.metadata.as_ref(), o.metadata.as_ref())
        };
        eq_result(py, op, equal())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let segs: Vec<String> = self.segments.iter().map(|s| s.get().__repr__(py)).collect();
        format!("ProviderResponse(segments=[{}])", segs.join(", "))
    }
}

fn decode(py: Python<'_>, buf: &[u8], limits: &Limits) -> PyResult<PyResponse> {
    let idx = segment::decode(buf, limits)?;
    let value = |(a, b): segment::Raw| pyjson::loads_validated(py, &buf[a..b]);
    let mut segments = Vec::with_capacity(idx.segments.len());
    for seg in idx.segments {
        let tool_call = match seg.tool_call {
            None => None,
            Some(tc) => {
                let args = match tc.args {
                    Args::Missing => PyDict::new(py).into_any(),
                    Args::Value(raw) => value(raw)?,
                    Args::Text(text) => pyjson::loads_validated(py, text.as_bytes())?,
                };
                let call = PyToolCall::new(
                    py,
                    tc.id
                        .filter(|s| !s.is_empty())
                        .map_or_else(crate::envelope::new_uuid, |s| s.as_str(buf).into_owned()),
                    tc.name.as_str(buf).into_owned(),
                    args.unbind(),
                    extra_of(buf, &tc.extra),
                );
                Some(Py::new(py, call)?)
            }
        };
        let text = |s: Option<crate::json::Span>| s.map(|s| s.as_str(buf).into_owned());
        let ui = match seg.ui {
            Some(raw) => Some(value(raw)?.unbind()),
            None => None,
        };
        let segment = PySegment {
            kind: seg.kind,
            text: text(seg.text),
            data: text(seg.data),
            mime_type: text(seg.mime_type),
            signature: text(seg.signature),
            tool_call,
            ui,
            extra: extra_of(buf, &seg.extra),
        };
        segments.push(Py::new(py, segment)?);
    }
    let metadata = match idx.metadata {
        Some(raw) => Some(value(raw)?.unbind()),
        None => None,
    };
    Ok(PyResponse {
        segments,
        metadata,
        extra: extra_of(buf, &idx.extra),
    })
}

/// Decode and validate a JSON ``ProviderResponse``.
#[pyfunction]
#[pyo3(signature = (data, *, max_bytes=DEFAULT_MAX_BYTES, max_depth=DEFAULT_MAX_DEPTH))]
fn decode_response(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    max_bytes: usize,
    max_depth: usize,
) -> PyResult<PyResponse> {
    let limits = limits_arg(max_bytes, max_depth)?;
    let buf = as_bytes_object(data)?;
    decode(py, buf.as_bytes(py), &limits)
}

/// Encode a ``ProviderResponse`` to JSON with the spec's wire field names.
#[pyfunction]
fn encode_response<'py>(
    py: Python<'py>,
    response: &Bound<'py, PyResponse>,
) -> PyResult<Bound<'py, PyBytes>> {
    let r = response.get();
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"{\"segments\":[");
    for (n, seg) in r.segments.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        seg.get().write(py, &mut out)?;
    }
    out.push(b']');
    if let Some(m) = &r.metadata {
        out.extend_from_slice(b",\"metadata\":");
        out.extend_from_slice(&pyjson::dumps_at(
            m.bind(py),
            segment::METADATA_DEPTH,
            DEFAULT_MAX_DEPTH,
        )?);
    }
    write_extra(&mut out, &r.extra);
    out.push(b'}');
    Ok(PyBytes::new(py, &out))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyToolCall>()?;
    m.add_class::<PySegment>()?;
    m.add_class::<PyResponse>()?;
    m.add_function(wrap_pyfunction!(decode_response, m)?)?;
    m.add_function(wrap_pyfunction!(encode_response, m)?)?;
    Ok(())
}
