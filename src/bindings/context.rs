//! `specstate.Context` and `specstate.Batch`: llama.cpp contexts from Python.

use std::sync::MutexGuard;
use std::thread::ThreadId;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::arguments::{TokenIds, WideInt};
use super::errors::ensure_thread;
use super::guarded::Guarded;
use super::model::PyModel;
use super::validators::ContextCapacity;
use crate::limits::LLAMA_N_BATCH;
use crate::native::{Batch, Context, ContextKind, ContextParams, NativeResult};
use crate::settings::{GeneratorConfig, RuntimeOptions};
use crate::speculative::SpeculativeContextCapacity;

/// A batch of token rows to decode, reusable across calls, from any thread.
///
/// Its rows are behind a lock: a decode or a session's `process` holds it
/// with the GIL released, and a change from another thread meanwhile waits
/// for that call (the class is frozen, so Python never sees a borrow error).
#[pyclass(name = "Batch", module = "specstate._native", frozen)]
pub(crate) struct PyBatch {
    pub(crate) rows: Guarded<Batch>,
    /// Row capacity (fixed).
    capacity: usize,
}

#[pymethods]
impl PyBatch {
    #[new]
    fn new(capacity: WideInt) -> PyResult<Self> {
        let capacity: usize = capacity.narrow("capacity")?;
        let rows = Batch::new(capacity)?;
        Ok(Self {
            capacity: rows.capacity(),
            rows: Guarded::new(rows),
        })
    }

    /// Append `token` at position `pos` of `seq_id`; `logits` requests its output row.
    #[pyo3(signature = (token, pos, *, seq_id = WideInt(0), logits = false), text_signature = "(self, /, token, pos, *, seq_id=0, logits=False)")]
    fn add(
        &self,
        py: Python<'_>,
        token: WideInt,
        pos: WideInt,
        seq_id: WideInt,
        logits: bool,
    ) -> PyResult<()> {
        let token: i32 = token.narrow("token")?;
        let pos: i32 = pos.narrow("pos")?;
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        Ok(self
            .rows
            .lock_waiting(py)
            .push(token, pos, seq_id, logits)?)
    }

    /// Remove every row.
    fn clear(&self, py: Python<'_>) {
        self.rows.lock_waiting(py).clear();
    }

    /// Row capacity.
    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.rows.lock_waiting(py).len()
    }
}

/// What a context's calls change: the native context (which keeps the
/// decode bookkeeping a session checks) and the batch `decode` fills, behind
/// the context's lock.
pub(crate) struct ContextState {
    pub(crate) native: Context,
    /// The batch `decode` fills.
    scratch: Batch,
}

impl ContextState {
    /// Decode `tokens` through the scratch batch (a native call: run it with
    /// the GIL released).
    pub(crate) fn decode_tokens(
        &mut self,
        tokens: &[i32],
        start_pos: i32,
        seq_id: i32,
        all_logits: bool,
    ) -> NativeResult<()> {
        self.scratch.fill(tokens, start_pos, seq_id, all_logits)?;
        self.native.decode(&self.scratch)
    }

    /// The scratch batch that the last `decode_tokens` filled.
    pub(crate) fn scratch(&self) -> &Batch {
        &self.scratch
    }
}

/// A llama.cpp context over a model, used from the thread that created it.
///
/// The class is frozen: what calls change is behind one lock
/// ([`ContextState`]), which only the owner thread takes (every method that
/// reaches it checks the thread first, so another thread gets
/// `ThreadAffinityError`, never a borrow error); what is fixed at creation
/// is read from any thread without it.
#[pyclass(name = "Context", module = "specstate._native", frozen)]
pub(crate) struct PyContext {
    pub(crate) state: Guarded<ContextState>,
    /// The parameters it was created with.
    params: ContextParams,
    /// The context's real length.
    n_ctx: u32,
    /// The capacities read from llama.cpp at creation (fixed for its life).
    capacity: SpeculativeContextCapacity,
    pub(crate) model: Py<PyModel>,
    pub(crate) owner: ThreadId,
    /// The linked source context (`other`), kept alive as long as this one.
    _other: Option<Py<PyContext>>,
}

impl PyContext {
    pub(crate) fn check_thread(&self) -> PyResult<()> {
        ensure_thread(self.owner, "Context")
    }

    /// `seq_id` as a native sequence id, once the thread is checked.
    fn sequence(&self, seq_id: WideInt) -> PyResult<i32> {
        self.check_thread()?;
        seq_id.narrow("seq_id")
    }

    /// The state, on the owner thread only (checked first).
    ///
    /// Only the owner thread takes this lock, one call at a time, and never
    /// while it already holds it, so it is free here; `lock_waiting` keeps
    /// the GIL released should that ever change.
    pub(crate) fn owned(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, ContextState>> {
        self.check_thread()?;
        Ok(self.state.lock_waiting(py))
    }

    /// Run `work` on the state with the GIL released, after the thread check.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut ContextState) -> R + Send,
    ) -> PyResult<R> {
        self.check_thread()?;
        Ok(py.detach(|| work(&mut self.state.lock())))
    }
}

#[pymethods]
impl PyContext {
    #[new]
    // A generator's context length and llama.cpp's batch by default; the text signature is checked against
    // them by `crate::signature_tests`.
    #[pyo3(signature = (model, *, n_ctx = WideInt(GeneratorConfig::DEFAULT.n_ctx.into()),
                        n_batch = WideInt(LLAMA_N_BATCH.into()),
                        n_ubatch = WideInt(LLAMA_N_BATCH.into()), n_seq_max = WideInt(1),
                        n_rs_seq = WideInt(0), kind = "default",
                        n_threads = WideInt(RuntimeOptions::DEFAULT.n_threads.into()), other = None),
           text_signature = "(model, *, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_rs_seq=0, \
                             kind='default', n_threads=0, other=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Py<PyModel>,
        n_ctx: WideInt,
        n_batch: WideInt,
        n_ubatch: WideInt,
        n_seq_max: WideInt,
        n_rs_seq: WideInt,
        kind: &str,
        n_threads: WideInt,
        other: Option<Py<PyContext>>,
    ) -> PyResult<Self> {
        let params = ContextParams {
            n_ctx: n_ctx.narrow("n_ctx")?,
            n_batch: n_batch.narrow("n_batch")?,
            n_ubatch: n_ubatch.narrow("n_ubatch")?,
            n_seq_max: n_seq_max.narrow("n_seq_max")?,
            n_rs_seq: n_rs_seq.narrow("n_rs_seq")?,
            kind: ContextKind::parse(kind)?,
            n_threads: n_threads.narrow("n_threads")?,
        };
        let shared = model.get().inner.clone();
        let native = match &other {
            None => Context::new(shared, params)?,
            Some(other) => {
                let source = other.get().owned(py)?;
                Context::with_other(shared, params, &source.native)?
            }
        };
        let capacity = native.capacity();
        let scratch = Batch::new(capacity.batch as usize)?;
        Ok(Self {
            params: *native.params(),
            n_ctx: native.n_ctx(),
            capacity,
            state: Guarded::new(ContextState { native, scratch }),
            model,
            owner: std::thread::current().id(),
            _other: other,
        })
    }

    /// The model this context runs.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<PyModel> {
        self.model.clone_ref(py)
    }

    /// Context length in tokens.
    #[getter]
    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// `'default'` or `'mtp'`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.params.kind.name()
    }

    /// The capacities that bound a speculative batch, read from llama.cpp.
    #[getter]
    fn capacity(&self) -> ContextCapacity {
        ContextCapacity {
            inner: self.capacity,
        }
    }

    /// Decode `tokens` at positions `start_pos..` of `seq_id` (GIL released).
    ///
    /// Logits are kept for the last token, or for every token with `all_logits`.
    #[pyo3(signature = (tokens, start_pos, *, seq_id = WideInt(0), all_logits = false), text_signature = "(self, /, tokens, start_pos, *, seq_id=0, all_logits=False)")]
    fn decode(
        &self,
        py: Python<'_>,
        tokens: TokenIds,
        start_pos: WideInt,
        seq_id: WideInt,
        all_logits: bool,
    ) -> PyResult<()> {
        let start_pos: i32 = start_pos.narrow("start_pos")?;
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        let tokens = &tokens.0;
        Ok(self.run(py, |state| {
            state.decode_tokens(tokens, start_pos, seq_id, all_logits)
        })??)
    }

    /// Decode a prepared batch (GIL released; the batch's lock is held for
    /// the decode, so changes from other threads wait for it).
    fn decode_batch(&self, py: Python<'_>, batch: &Bound<'_, PyBatch>) -> PyResult<()> {
        let batch = batch.get();
        Ok(self.run(py, |state| state.native.decode(&batch.rows.lock()))??)
    }

    /// The logits of output row `row` of the last decode (`-1`: the last row).
    #[pyo3(signature = (row = WideInt(-1)), text_signature = "(self, /, row=-1)")]
    fn logits(&self, py: Python<'_>, row: WideInt) -> PyResult<Vec<f32>> {
        let row: i32 = row.narrow("row")?;
        Ok(self.owned(py)?.native.logits(row)?.to_vec())
    }

    /// The greedy choice of output row `row`: the id of the largest logit (lowest id on ties).
    #[pyo3(signature = (row = WideInt(-1)), text_signature = "(self, /, row=-1)")]
    fn argmax(&self, py: Python<'_>, row: WideInt) -> PyResult<i32> {
        let row: i32 = row.narrow("row")?;
        Ok(crate::sampling::argmax(self.owned(py)?.native.logits(row)?))
    }

    /// The `k` largest logits of row `row` as `(token, logit)`, largest first.
    #[pyo3(signature = (row = WideInt(-1), k = WideInt(2)), text_signature = "(self, /, row=-1, k=2)")]
    fn top_logits(&self, py: Python<'_>, row: WideInt, k: WideInt) -> PyResult<Vec<(i32, f32)>> {
        let row: i32 = row.narrow("row")?;
        let k: usize = k.narrow("k")?;
        Ok(crate::sampling::top_k(
            self.owned(py)?.native.logits(row)?,
            k,
        ))
    }

    /// The log-probability of `token` at output row `row` (the log-softmax of
    /// the row's logits, computed as a generator's log-probability records
    /// are) and the `top_n` (at most 20) most likely tokens' `(token, logprob)`,
    /// most likely first.
    #[pyo3(signature = (row, token, top_n = WideInt(0)), text_signature = "(self, /, row, token, top_n=0)")]
    fn token_logprobs(
        &self,
        py: Python<'_>,
        row: WideInt,
        token: WideInt,
        top_n: WideInt,
    ) -> PyResult<(f32, Vec<(i32, f32)>)> {
        let row: i32 = row.narrow("row")?;
        let token: i32 = token.narrow("token")?;
        let top_n: usize = top_n.narrow("top_n")?;
        let record =
            crate::sampling::TokenLogprobs::of(self.owned(py)?.native.logits(row)?, token, top_n);
        Ok((record.logprob, record.top))
    }

    /// The exact state of one sequence (KV cells and recurrent state; no logits).
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn seq_state<'py>(&self, py: Python<'py>, seq_id: WideInt) -> PyResult<Bound<'py, PyBytes>> {
        let seq_id = self.sequence(seq_id)?;
        let state = self.owned(py)?.native.seq_state(seq_id)?;
        Ok(PyBytes::new(py, &state))
    }

    /// Replace one sequence's state with bytes from `seq_state`.
    ///
    /// On failure the sequence is left exactly as it was.
    #[pyo3(signature = (seq_id, data))]
    fn set_seq_state(&self, py: Python<'_>, seq_id: WideInt, data: &[u8]) -> PyResult<()> {
        let seq_id = self.sequence(seq_id)?;
        Ok(self.owned(py)?.native.replace_seq_state(seq_id, data)?)
    }

    /// Remove positions `p0..p1` of `seq_id` (`-1`: open end; `seq_id=-1`: every
    /// sequence); False if refused (an unknown sequence included).
    #[pyo3(signature = (seq_id = WideInt(0), p0 = WideInt(-1), p1 = WideInt(-1)), text_signature = "(self, /, seq_id=0, p0=-1, p1=-1)")]
    fn seq_rm(&self, py: Python<'_>, seq_id: WideInt, p0: WideInt, p1: WideInt) -> PyResult<bool> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        let p0: i32 = p0.narrow("p0")?;
        let p1: i32 = p1.narrow("p1")?;
        Ok(self.owned(py)?.native.seq_rm(seq_id, p0, p1))
    }

    /// Clear one sequence.
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn seq_clear(&self, py: Python<'_>, seq_id: WideInt) -> PyResult<()> {
        let seq_id = self.sequence(seq_id)?;
        let mut state = self.owned(py)?;
        state.native.seq_pos_max(seq_id)?;
        state.native.seq_rm(seq_id, -1, -1);
        Ok(())
    }

    /// The highest position stored for `seq_id`, or -1 when empty.
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn seq_pos_max(&self, py: Python<'_>, seq_id: WideInt) -> PyResult<i32> {
        let seq_id = self.sequence(seq_id)?;
        Ok(self.owned(py)?.native.seq_pos_max(seq_id)?)
    }
}
