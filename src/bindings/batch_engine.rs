//! `BatchEngine`: many generations over one target context ([`crate::batch_engine`]).

use std::sync::Arc;
use std::thread::ThreadId;

use pyo3::prelude::*;

use super::arguments::{TokenIds, WideInt};
use super::errors::ensure_thread;
use super::generator::PyGenerator;
use super::guarded::Guarded;
use super::model::PyModel;
use super::shared_engine::shape;
use crate::batch_engine::{BatchEngine, StepReport};
use crate::settings::GeneratorConfig;

const DEFAULTS: GeneratorConfig = GeneratorConfig::DEFAULT;

/// Many generations (modes `none` and `ngram`) over one target context,
/// each reply token for token the one the same `Generator` gives alone.
#[pyclass(name = "BatchEngine", module = "specstate._native", frozen)]
pub(crate) struct PyBatchEngine {
    inner: Guarded<BatchEngine>,
    target: Py<PyModel>,
    owner: ThreadId,
}

impl PyBatchEngine {
    /// Run `work` on the engine from its own thread, with the GIL released.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut BatchEngine) -> R + Send,
    ) -> PyResult<R> {
        ensure_thread(self.owner, "BatchEngine")?;
        Ok(py.detach(|| work(&mut self.inner.lock())))
    }
}

#[pymethods]
impl PyBatchEngine {
    /// An engine of `n_seq` sequences of `n_ctx` tokens each (0: the model's
    /// trained length) over `target`, decoding with `n_threads` (0: the CPUs
    /// available); prompts are decoded in chunks of at most `n_batch` rows.
    #[new]
    #[pyo3(signature = (target, *, n_seq = WideInt(4), n_ctx = WideInt(DEFAULTS.n_ctx.into()),
                        n_batch = WideInt(crate::limits::LLAMA_N_BATCH.into()), n_threads = WideInt(0)),
           text_signature = "(target, *, n_seq=4, n_ctx=2048, n_batch=512, n_threads=0)")]
    fn new(
        py: Python<'_>,
        target: Py<PyModel>,
        n_seq: WideInt,
        n_ctx: WideInt,
        n_batch: WideInt,
        n_threads: WideInt,
    ) -> PyResult<Self> {
        let (config, runtime) = shape(n_seq, n_ctx, n_batch, n_threads)?;
        let model = Arc::clone(&target.get().inner);
        let inner = py.detach(|| BatchEngine::new(model, config, runtime))?;
        Ok(Self {
            inner: Guarded::new(inner),
            target,
            owner: std::thread::current().id(),
        })
    }

    /// A copy of `generator`'s generation (prefilled or not) as a new
    /// sequence; the generator is left as it was. Returns the sequence id.
    fn join(&self, py: Python<'_>, generator: &PyGenerator) -> PyResult<i32> {
        ensure_thread(self.owner, "BatchEngine")?;
        let mut generator = generator.hold(py)?;
        let generator = &mut *generator;
        Ok(self.run(py, |batched| batched.join(generator))??)
    }

    /// Take sequence `seq` out of the batch as a `Generator` of its own,
    /// which continues exactly as the sequence would have (and checkpoints).
    fn leave(&self, py: Python<'_>, seq: i32) -> PyResult<PyGenerator> {
        let generator = self.run(py, |batched| batched.leave(seq))??;
        Ok(PyGenerator::wrap(
            generator,
            self.target.clone_ref(py),
            None,
        ))
    }

    /// A copy of sequence `seq` as a `Generator` of its own (its checkpoint is
    /// the sequence's); the sequence stays in the batch.
    fn snapshot(&self, py: Python<'_>, seq: i32) -> PyResult<PyGenerator> {
        let generator = self.run(py, |batched| batched.snapshot(seq))??;
        Ok(PyGenerator::wrap(
            generator,
            self.target.clone_ref(py),
            None,
        ))
    }

    /// Drop sequence `seq`.
    fn remove(&self, py: Python<'_>, seq: i32) -> PyResult<()> {
        Ok(self.run(py, |batched| batched.remove(seq))??)
    }

    /// Decode the prompt of sequence `seq` (in decodes of its own) and commit
    /// the first generated token.
    fn prefill(&self, py: Python<'_>, seq: i32, prompt: TokenIds) -> PyResult<()> {
        self.run(py, |batched| batched.prefill(seq, &prompt.0))??;
        Ok(())
    }

    /// The most tokens the next round of `seq` may commit (`None`: no bound),
    /// as `Generator.take(max_commit=...)` bounds a lone round.
    #[pyo3(signature = (seq, max_commit))]
    fn set_budget(&self, py: Python<'_>, seq: i32, max_commit: Option<WideInt>) -> PyResult<()> {
        let budget = max_commit
            .map(|n| n.count("max_commit"))
            .transpose()?
            .unwrap_or(usize::MAX);
        Ok(self.run(py, |batched| batched.set_budget(seq, budget))??)
    }

    /// Let the rounds of `seq` run while it holds fewer than `lead` committed
    /// tokens not yet handed out (1, the default: once all are handed out).
    #[pyo3(signature = (seq, lead))]
    fn set_lead(&self, py: Python<'_>, seq: i32, lead: WideInt) -> PyResult<()> {
        let lead = lead.count("lead")?;
        Ok(self.run(py, |batched| batched.set_lead(seq, lead))??)
    }

    /// One step: a round for every sequence that has handed out all its tokens
    /// and is not done, their rows decoded together. Returns `(sequences,
    /// rows, decodes, committed)`. A sequence whose round failed raises at its
    /// next `take`.
    fn step(&self, py: Python<'_>) -> PyResult<(usize, usize, usize, usize)> {
        let StepReport {
            sequences,
            rows,
            decodes,
            committed,
        } = self.run(py, BatchEngine::step)??;
        Ok((sequences, rows, decodes, committed))
    }

    /// Up to `max_n` committed tokens of `seq` not yet handed out (never runs
    /// a round), or the failure of its last round.
    #[pyo3(signature = (seq, max_n = WideInt(i128::MAX)))]
    fn take(&self, py: Python<'_>, seq: i32, max_n: WideInt) -> PyResult<Vec<i32>> {
        let max_n = max_n.count("max_n")?;
        Ok(self.run(py, |batched| batched.take(seq, max_n))??)
    }

    /// Whether `seq` is finished (or its context full) with every token handed out.
    fn done(&self, py: Python<'_>, seq: i32) -> PyResult<bool> {
        Ok(self.run(py, |batched| batched.done(seq))??)
    }

    /// The prompt and committed tokens of `seq`.
    fn history(&self, py: Python<'_>, seq: i32) -> PyResult<Vec<i32>> {
        Ok(self.run(py, |batched| batched.history(seq))??)
    }

    /// Sequences held.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |batched| batched.len())
    }

    /// Sequences the engine holds at most.
    #[getter]
    fn n_seq(&self, py: Python<'_>) -> u32 {
        self.inner.lock_waiting(py).config().n_seq
    }

    /// Context length of every sequence.
    #[getter]
    fn n_ctx(&self, py: Python<'_>) -> u32 {
        self.inner.lock_waiting(py).config().n_ctx
    }

    /// The threads the target decodes with.
    #[getter]
    fn n_threads(&self, py: Python<'_>) -> i32 {
        self.inner.lock_waiting(py).n_threads()
    }

    /// The target model.
    #[getter]
    fn target(&self, py: Python<'_>) -> Py<PyModel> {
        self.target.clone_ref(py)
    }
}
