//! `ToolIndex`: the lexical tool index of [`crate::retrieval`], immutable once built.

// The limits are written as in the stub (`65536`): the lint sees them outside any item.
#![allow(clippy::unreadable_literal)]

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyString, PyTuple};

use super::errors::{type_name, CoreError};
use crate::retrieval::{self, RetrievalError, ToolIndex};

/// Searches of an index larger than this release the GIL.
const DETACH_ABOVE_DOCUMENTS: usize = 10_000;

impl From<RetrievalError> for CoreError {
    fn from(e: RetrievalError) -> Self {
        CoreError::Value(e.to_string())
    }
}

/// One `(name, text)` document of the iterable given to `ToolIndex`.
fn document(item: &Bound<'_, PyAny>, index: usize) -> PyResult<(PyBackedStr, PyBackedStr)> {
    let bad = || {
        CoreError::Type(format!(
            "documents must be (name, text) pairs of str; document {index} is a {}",
            type_name(item)
        ))
    };
    let pair = item.cast::<PyTuple>().map_err(|_| bad())?;
    if pair.len() != 2 {
        return Err(CoreError::Type(format!(
            "documents must be (name, text) pairs of str; document {index} has {} items",
            pair.len()
        ))
        .into());
    }
    let field = |i: usize, what: &str| -> PyResult<PyBackedStr> {
        let value = pair.get_item(i)?;
        let s = value.cast::<PyString>().map_err(|_| {
            CoreError::Type(format!(
                "document {index}'s {what} must be a str, not {}",
                type_name(&value)
            ))
        })?;
        s.clone().try_into()
    };
    Ok((field(0, "name")?, field(1, "text")?))
}

/// A lexical index of tools: which best match an input, scored by BM25F.
///
/// Built once from ``(name, text)`` documents (a tool's name, and its
/// description with its parameters' names and descriptions); immutable and
/// safe to share between threads. A name counts three times as much as the
/// text. Terms are split on anything but letters and digits and at camelCase
/// boundaries (an acronym's plural, ``APIs``, stays one word, ``api``),
/// lowercased, stripped of a few English stop words and of plural,
/// ``-ing`` and ``-ed`` endings; a few verbs also count as the operation they
/// name (``add`` as ``create``, ``remove`` as ``delete``, ``fetch`` as ``get``);
/// Chinese and Japanese text becomes overlapping character pairs. A query
/// word of three characters or more also matches the longer words it begins
/// (at half weight), so ``auth`` finds ``authenticate``.
///
/// Raises:
///     ValueError: for more than ``MAX_DOCUMENTS`` documents, an empty,
///         repeated or over-long name, or a text over ``MAX_TEXT_BYTES``.
///     TypeError: for a document that is not a pair of str.
#[allow(clippy::doc_markdown)] // the docstring of the Python class
#[pyclass(frozen, name = "ToolIndex", module = "openstarry._core")]
pub struct PyToolIndex {
    inner: ToolIndex,
    /// The names as Python strings, made once: a search hands out new references.
    names: Vec<Py<PyString>>,
}

// The doc comments below are the Python docstrings (Google style), not rustdoc.
#[allow(clippy::doc_markdown)]
#[pymethods]
impl PyToolIndex {
    #[classattr]
    const MAX_DOCUMENTS: usize = retrieval::MAX_DOCUMENTS;
    #[classattr]
    const MAX_NAME_BYTES: usize = retrieval::MAX_NAME_BYTES;
    #[classattr]
    const MAX_TEXT_BYTES: usize = retrieval::MAX_TEXT_BYTES;
    #[classattr]
    const MAX_QUERY_BYTES: usize = retrieval::MAX_QUERY_BYTES;

    #[new]
    fn new(py: Python<'_>, documents: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut docs = Vec::new();
        for (index, item) in documents.try_iter()?.enumerate() {
            if index >= retrieval::MAX_DOCUMENTS {
                return Err(CoreError::from(RetrievalError::TooManyDocuments(index + 1)).into());
            }
            docs.push(document(&item?, index)?);
        }
        // Tokenising and weighting a thousand tools takes a millisecond or so.
        let inner = py
            .detach(|| ToolIndex::new(&docs))
            .map_err(CoreError::from)?;
        let names = docs
            .into_iter()
            .map(|(name, _)| {
                let Ok(name) = name.into_pyobject(py);
                name.unbind()
            })
            .collect();
        Ok(PyToolIndex { inner, names })
    }

    /// The ``limit`` best matches of ``query`` as ``(name, score)``, the best first.
    ///
    /// Ties are ordered by name; documents that share no term with the query
    /// are left out, so fewer than ``limit`` may come back (none for a query of
    /// stop words or punctuation alone).
    ///
    /// Raises:
    ///     ValueError: for a negative ``limit`` or a query over ``MAX_QUERY_BYTES``.
    #[pyo3(signature = (query, limit=10))]
    fn search(
        &self,
        py: Python<'_>,
        query: &str,
        limit: i64,
    ) -> Result<Vec<(Py<PyString>, f64)>, CoreError> {
        let limit = usize::try_from(limit)
            .map_err(|_| CoreError::Value(format!("limit must be at least 0, got {limit}")))?;
        // A search of a thousand tools takes a few microseconds: releasing the
        // GIL would cost a good part of that. A large index is worth it.
        let hits = if self.inner.len() > DETACH_ABOVE_DOCUMENTS {
            py.detach(|| self.inner.search(query, limit))?
        } else {
            self.inner.search(query, limit)?
        };
        Ok(hits
            .into_iter()
            .map(|(doc, score)| (self.names[doc].clone_ref(py), score))
            .collect())
    }

    /// The terms the index makes of ``text``, in order: what queries and documents match on.
    ///
    /// Raises:
    ///     ValueError: for a text over ``MAX_TEXT_BYTES``.
    #[staticmethod]
    fn tokenize(text: &str) -> Result<Vec<String>, CoreError> {
        if text.len() > retrieval::MAX_TEXT_BYTES {
            return Err(CoreError::Value(format!(
                "the text is {} bytes, more than the {} allowed",
                text.len(),
                retrieval::MAX_TEXT_BYTES
            )));
        }
        Ok(retrieval::tokenize(text))
    }

    /// The documents' names, in the order given.
    #[getter]
    fn names(&self, py: Python<'_>) -> Vec<Py<PyString>> {
        self.names.iter().map(|n| n.clone_ref(py)).collect()
    }

    /// How many distinct terms the index holds.
    #[getter]
    fn term_count(&self) -> usize {
        self.inner.term_count()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ToolIndex documents={} terms={}>",
            self.inner.len(),
            self.inner.term_count()
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyToolIndex>()?;
    Ok(())
}
