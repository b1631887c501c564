//! `LookupCorpus`: earlier texts that `ngram` mode's prompt lookup may copy
//! besides a generation's own history (`Generator.set_lookup_corpus`).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::arguments::{TokenIds, WideInt};
use crate::engine::corpus::{check_mode, LookupCorpus, DEFAULT_CORPUS_TOKENS};

/// Earlier texts (token ids) that prompt lookup may copy besides a
/// generation's own history: in a server, the prompts and replies of earlier
/// requests. Kept up to ``max_tokens`` tokens in all, the oldest texts
/// dropped first; shared by any number of generators and threads.
///
/// A corpus changes what ``ngram`` mode proposes, never what it generates:
/// verification commits what plain decoding would, so the text is the same
/// with or without one, and checkpoints do not carry it.
#[pyclass(name = "LookupCorpus", module = "specstate._native", frozen)]
pub(crate) struct PyLookupCorpus {
    pub(crate) inner: Arc<LookupCorpus>,
}

#[pymethods]
impl PyLookupCorpus {
    #[new]
    #[pyo3(signature = (max_tokens = WideInt(DEFAULT_CORPUS_TOKENS as i128)), text_signature = "(max_tokens=65536)")]
    fn new(max_tokens: WideInt) -> PyResult<Self> {
        let corpus =
            LookupCorpus::new(max_tokens.narrow("max_tokens")?).map_err(PyValueError::new_err)?;
        Ok(Self {
            inner: Arc::new(corpus),
        })
    }

    /// Add a text (its last ``max_tokens`` tokens when longer), dropping the
    /// oldest texts beyond the budget. Negative ids raise ``ValueError`` and
    /// add nothing; a draft copied from the corpus stops before an id outside
    /// the target's vocabulary.
    fn add(&self, py: Python<'_>, tokens: TokenIds) -> PyResult<()> {
        py.detach(|| self.inner.add(&tokens.0))
            .map_err(PyValueError::new_err)
    }

    /// Raise ``ValueError`` unless generators of ``mode`` draft from a corpus
    /// (only ``ngram`` mode's prompt lookup does).
    #[staticmethod]
    fn check_mode(mode: &str) -> PyResult<()> {
        check_mode(mode).map_err(PyValueError::new_err)
    }

    /// Forget every text.
    fn clear(&self) {
        self.inner.clear();
    }

    /// The token budget.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }

    /// Tokens held, in all.
    #[getter]
    fn n_tokens(&self) -> usize {
        self.inner.n_tokens()
    }

    /// Texts held.
    #[getter]
    fn n_documents(&self) -> usize {
        self.inner.n_documents()
    }

    fn __repr__(&self) -> String {
        format!(
            "LookupCorpus(max_tokens={}, n_documents={}, n_tokens={})",
            self.inner.max_tokens(),
            self.inner.n_documents(),
            self.inner.n_tokens()
        )
    }
}
