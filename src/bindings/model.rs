//! `specstate.Model`: a loaded GGUF model.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::arguments::{TokenIds, WideInt};
use crate::native::Model;

/// A GGUF model loaded by llama.cpp. Immutable; usable from any thread.
#[pyclass(name = "Model", module = "specstate._native", frozen)]
pub(crate) struct PyModel {
    pub(crate) inner: Arc<Model>,
    /// Tokens in the vocabulary.
    #[pyo3(get)]
    n_vocab: usize,
    /// Embedding width.
    #[pyo3(get)]
    n_embd: i32,
    /// Layer count (MTP/nextn layers included).
    #[pyo3(get)]
    n_layer: i32,
    /// Number of MTP (nextn) layers.
    #[pyo3(get)]
    n_layer_nextn: i32,
    /// Whether every layer is recurrent.
    #[pyo3(get)]
    is_recurrent: bool,
    /// Whether recurrent and attention layers are mixed.
    #[pyo3(get)]
    is_hybrid: bool,
    /// The architecture (`general.architecture`).
    #[pyo3(get)]
    architecture: String,
    /// Bytes of the model's tensors.
    #[pyo3(get)]
    size: u64,
    /// End-of-sequence token id.
    #[pyo3(get)]
    eos: i32,
    /// Beginning-of-sequence token id.
    #[pyo3(get)]
    bos: i32,
    /// The model's chat template (`tokenizer.chat_template`), or `None`.
    #[pyo3(get)]
    chat_template: Option<String>,
    /// The context length the model was trained with (0 if it records none):
    /// what `n_ctx=0` means.
    #[pyo3(get)]
    n_ctx_train: u32,
}

impl PyModel {
    /// The model, with what never changes about it read once.
    fn describe(model: Model) -> Self {
        Self {
            n_vocab: model.n_vocab(),
            n_embd: model.n_embd(),
            n_layer: model.n_layer(),
            n_layer_nextn: model.n_layer_nextn(),
            is_recurrent: model.is_recurrent(),
            is_hybrid: model.is_hybrid(),
            architecture: model.architecture(),
            size: model.size_bytes(),
            eos: model.eos(),
            bos: model.bos(),
            chat_template: model.chat_template(),
            n_ctx_train: model.n_ctx_train(),
            inner: Arc::new(model),
        }
    }
}

#[pymethods]
impl PyModel {
    #[new]
    #[pyo3(signature = (path, *, n_gpu_layers = WideInt(0), use_mmap = false),
           text_signature = "(path, *, n_gpu_layers=0, use_mmap=False)")]
    fn new(py: Python<'_>, path: PathBuf, n_gpu_layers: WideInt, use_mmap: bool) -> PyResult<Self> {
        let n_gpu_layers: i32 = n_gpu_layers.narrow("n_gpu_layers")?;
        let model = py.detach(|| Model::load_with(&path, n_gpu_layers, use_mmap))?;
        Ok(Self::describe(model))
    }

    /// Whether the weights are computed from a mapping of the file (`use_mmap=True`).
    #[getter]
    fn use_mmap(&self) -> bool {
        self.inner.use_mmap()
    }

    /// The path the model was loaded from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.path().to_path_buf()
    }

    /// GGUF metadata as text values.
    #[getter]
    fn metadata(&self) -> BTreeMap<String, String> {
        self.inner.metadata().into_iter().collect()
    }

    /// Whether `token` ends a generation (EOS, EOT, ...).
    fn is_eog(&self, token: WideInt) -> bool {
        // An id outside every vocabulary ends nothing.
        i32::try_from(token.0).is_ok_and(|token| self.inner.is_eog(token))
    }

    /// Token ids of `text`.
    #[pyo3(signature = (text, *, add_special = true, parse_special = false))]
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> PyResult<Vec<i32>> {
        Ok(self.inner.tokenize(text, add_special, parse_special)?)
    }

    /// The bytes of one token.
    #[pyo3(signature = (token, *, special = false))]
    fn token_to_piece<'py>(
        &self,
        py: Python<'py>,
        token: WideInt,
        special: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let token: i32 = token.narrow("token")?;
        let piece = self.inner.token_to_piece(token, special)?;
        Ok(PyBytes::new(py, &piece))
    }

    /// The text of `tokens` (invalid UTF-8 replaced).
    #[pyo3(signature = (tokens, *, special = false))]
    fn detokenize(&self, tokens: TokenIds, special: bool) -> PyResult<String> {
        let bytes = self.inner.detokenize(&tokens.0, special)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn __repr__(&self) -> String {
        format!(
            "Model(path={:?}, architecture={:?}, n_vocab={}, n_embd={}, n_layer={})",
            self.inner.path().display().to_string(),
            self.inner.architecture(),
            self.inner.n_vocab(),
            self.inner.n_embd(),
            self.inner.n_layer()
        )
    }
}
