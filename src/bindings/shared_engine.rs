//! `SharedEngine`: a target context whose sequences generators attach to
//! ([`crate::generator::SharedEngine`]).

use std::sync::Arc;

use pyo3::prelude::*;

use super::arguments::WideInt;
use super::model::PyModel;
use crate::generator::{EngineShape, SharedEngine, SharedStats};
use crate::settings::{GeneratorConfig, RuntimeOptions};

const DEFAULTS: GeneratorConfig = GeneratorConfig::DEFAULT;

/// The shape and threads of an engine, from Python's integers.
pub(crate) fn shape(
    n_seq: WideInt,
    n_ctx: WideInt,
    n_batch: WideInt,
    n_threads: WideInt,
) -> PyResult<(EngineShape, RuntimeOptions)> {
    let config = EngineShape {
        n_seq: n_seq.narrow("n_seq")?,
        n_ctx: n_ctx.narrow("n_ctx")?,
        n_batch: n_batch.narrow("n_batch")?,
    };
    let runtime = RuntimeOptions {
        n_threads: n_threads.narrow("n_threads")?,
        ..RuntimeOptions::DEFAULT
    };
    Ok((config, runtime))
}

/// A target context whose sequences generators attach to (`Generator(...,
/// engine=...)`), used from several threads: their rounds are decoded together.
#[pyclass(name = "SharedEngine", module = "specstate._native", frozen)]
pub(crate) struct PySharedEngine {
    inner: Arc<SharedEngine>,
    target: Py<PyModel>,
}

impl PySharedEngine {
    /// The engine, for a generator over `model` (with a draft model or not).
    pub(crate) fn arc(
        &self,
        model: Arc<crate::native::Model>,
        drafted: bool,
    ) -> PyResult<Arc<SharedEngine>> {
        if drafted {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a generator on a shared engine drafts from the history (modes 'none' and 'ngram'): \
                 it takes no draft model",
            ));
        }
        if !Arc::ptr_eq(&model, self.inner.model()) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "the generator's target is another Model object than the engine's: pass the engine's target",
            ));
        }
        Ok(Arc::clone(&self.inner))
    }
}

#[pymethods]
impl PySharedEngine {
    /// An engine of `n_seq` sequences of `n_ctx` tokens each (0: the model's
    /// trained length) over `target`, decoding with `n_threads` (0: the CPUs
    /// available); prompts are decoded in chunks of at most `n_batch` rows.
    /// `prompt_cache_bytes`: the states of given-back sequences kept in memory
    /// (0: none), so that a prompt that starts like one of them decodes only
    /// the rest after its sequence was taken by another generation.
    #[new]
    #[pyo3(signature = (target, *, n_seq = WideInt(4), n_ctx = WideInt(DEFAULTS.n_ctx.into()),
                        n_batch = WideInt(crate::limits::LLAMA_N_BATCH.into()), n_threads = WideInt(0),
                        prompt_cache_bytes = WideInt(0)),
           text_signature = "(target, *, n_seq=4, n_ctx=2048, n_batch=512, n_threads=0, prompt_cache_bytes=0)")]
    fn new(
        py: Python<'_>,
        target: Py<PyModel>,
        n_seq: WideInt,
        n_ctx: WideInt,
        n_batch: WideInt,
        n_threads: WideInt,
        prompt_cache_bytes: WideInt,
    ) -> PyResult<Self> {
        let (config, runtime) = shape(n_seq, n_ctx, n_batch, n_threads)?;
        let cache_bytes: u64 = prompt_cache_bytes.narrow("prompt_cache_bytes")?;
        let cache_bytes = usize::try_from(cache_bytes).unwrap_or(usize::MAX);
        let model = Arc::clone(&target.get().inner);
        let inner = py.detach(|| SharedEngine::new(model, config, runtime))?;
        inner.set_prompt_cache_bytes(cache_bytes);
        Ok(Self { inner, target })
    }

    /// Sequences the engine holds at most.
    #[getter]
    fn n_seq(&self) -> u32 {
        self.inner.config().n_seq
    }

    /// Context length of every sequence.
    #[getter]
    fn n_ctx(&self) -> u32 {
        self.inner.config().n_ctx
    }

    /// Most rows of one prompt chunk.
    #[getter]
    fn n_batch(&self) -> u32 {
        self.inner.config().n_batch
    }

    /// The threads the target decodes with.
    #[getter]
    fn n_threads(&self, py: Python<'_>) -> i32 {
        py.detach(|| self.inner.n_threads())
    }

    /// Sequences attached now.
    #[getter]
    fn attached(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.attached())
    }

    /// `(decodes, rows, sequences)` of the shared decodes so far.
    #[getter]
    fn stats(&self, py: Python<'_>) -> (u64, u64, u64) {
        let SharedStats {
            decodes,
            rows,
            sequences,
            ..
        } = py.detach(|| self.inner.stats());
        (decodes, rows, sequences)
    }

    /// Prompt tokens not decoded so far: their cells kept from an earlier
    /// generation's exact decodes (a prompt that starts the same way).
    #[getter]
    fn reused_tokens(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.inner.stats().reused)
    }

    /// Seconds the shared decodes took so far.
    #[getter]
    fn decode_seconds(&self, py: Python<'_>) -> f64 {
        py.detach(|| self.inner.stats().micros as f64 / 1e6)
    }

    /// The target model.
    #[getter]
    fn target(&self, py: Python<'_>) -> Py<PyModel> {
        self.target.clone_ref(py)
    }
}
