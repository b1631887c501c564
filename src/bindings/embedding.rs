//! `specstate._native.Embedder`: embeddings of token sequences.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use super::arguments::{TokenIds, WideInt};
use super::guarded::Guarded;
use super::model::PyModel;
use crate::native::{
    Embedder, EmbedderParams, Embedding, EmbeddingInputError, NativeError, Pooling,
    MAX_EMBEDDING_FLOATS, MAX_EMBEDDING_INPUTS,
};

use crate::limits::EMBEDDING_N_CTX;

/// An embedding context over a model: usable from any thread, one call at a
/// time (each runs with the GIL released; others wait for it).
#[pyclass(name = "Embedder", module = "specstate._native", frozen)]
pub(crate) struct PyEmbedder {
    native: Guarded<Embedder>,
    model: Py<PyModel>,
    /// The context length: the most tokens an input may have.
    #[pyo3(get)]
    n_ctx: u32,
    /// Floats in one embedding.
    #[pyo3(get)]
    n_embd: usize,
    /// The threads decoding uses.
    #[pyo3(get)]
    n_threads: i32,
    pooling: Pooling,
}

impl PyEmbedder {
    /// The token ids of input `index`, its length checked before they are
    /// read (an input longer than the context is never copied).
    fn tokens(&self, index: usize, tokens: &Bound<'_, PyAny>) -> PyResult<Vec<i32>> {
        if tokens.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(format!(
                "input {index} must be a sequence of token ids, not str"
            )));
        }
        let len = tokens.len()?;
        if len > self.n_ctx as usize {
            let error = EmbeddingInputError::ExceedsContext {
                index,
                tokens: len,
                n_ctx: self.n_ctx,
            };
            return Err(NativeError::from(error).into());
        }
        Ok(tokens.extract::<TokenIds>()?.0)
    }
}

/// An embedding as Python lists: floats, or a list of them per token.
fn to_python(py: Python<'_>, embedding: Embedding) -> PyResult<Py<PyAny>> {
    match embedding {
        Embedding::Pooled(vector) => vector.into_py_any(py),
        Embedding::PerToken(rows) => rows.into_py_any(py),
    }
}

#[pymethods]
impl PyEmbedder {
    #[new]
    #[pyo3(signature = (model, *, n_ctx = WideInt(EMBEDDING_N_CTX.into()), pooling = None,
                        n_threads = WideInt(0)),
           text_signature = "(model, *, n_ctx=512, pooling=None, n_threads=0)")]
    fn new(
        py: Python<'_>,
        model: Py<PyModel>,
        n_ctx: WideInt,
        pooling: Option<&str>,
        n_threads: WideInt,
    ) -> PyResult<Self> {
        let params = EmbedderParams {
            n_ctx: n_ctx.narrow("n_ctx")?,
            pooling: pooling.map(Pooling::parse).transpose()?,
            n_threads: n_threads.saturate(),
        };
        let shared = model.get().inner.clone();
        let native = py.detach(|| Embedder::new(shared, params))?;
        Ok(Self {
            n_ctx: native.n_ctx(),
            n_embd: native.n_embd(),
            n_threads: native.n_threads(),
            pooling: native.pooling(),
            native: Guarded::new(native),
            model,
        })
    }

    /// The model this embedder runs.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<PyModel> {
        self.model.clone_ref(py)
    }

    /// The pooling in effect: `'none'`, `'mean'`, `'cls'` or `'last'`.
    #[getter]
    fn pooling(&self) -> &'static str {
        self.pooling.name()
    }

    /// The embedding of one token sequence (GIL released): a list of
    /// `n_embd` floats, or with pooling `'none'` one such list per token.
    fn embed(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let tokens = self.tokens(0, tokens)?;
        let embedding = py.detach(|| self.native.lock().embed(&tokens))?;
        to_python(py, embedding)
    }

    /// The embeddings of several token sequences, in order, each computed
    /// alone as `embed` computes it (GIL released). Every input is checked
    /// before any is decoded.
    fn embed_batch(&self, py: Python<'_>, inputs: &Bound<'_, PyAny>) -> PyResult<Vec<Py<PyAny>>> {
        let count = inputs.len()?;
        if count > MAX_EMBEDDING_INPUTS {
            let error = EmbeddingInputError::TooManyInputs {
                count,
                maximum: MAX_EMBEDDING_INPUTS,
            };
            return Err(NativeError::from(error).into());
        }
        let inputs = (0..count)
            .map(|index| self.tokens(index, &inputs.get_item(index)?))
            .collect::<PyResult<Vec<_>>>()?;
        let embeddings = py.detach(|| self.native.lock().embed_all(&inputs))?;
        embeddings
            .into_iter()
            .map(|embedding| to_python(py, embedding))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Embedder(n_ctx={}, n_embd={}, pooling={:?})",
            self.n_ctx,
            self.n_embd,
            self.pooling.name()
        )
    }
}

/// Add the embedder's class and bounds to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyEmbedder>()?;
    module.add("EMBEDDING_N_CTX", EMBEDDING_N_CTX)?;
    module.add("MAX_EMBEDDING_INPUTS", MAX_EMBEDDING_INPUTS)?;
    module.add("MAX_EMBEDDING_FLOATS", MAX_EMBEDDING_FLOATS)?;
    module.add(
        "EMBEDDING_POOLINGS",
        PyTuple::new(module.py(), Pooling::NAMES)?,
    )?;
    Ok(())
}
