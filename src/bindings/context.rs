//! `specstate.Context` and `specstate.Batch`: llama.cpp contexts from Python.

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::arguments::{TokenIds, WideInt};
use super::errors::ensure_thread;
use super::guarded::Guarded;
use super::model::PyModel;
use super::validators::ContextCapacity;
use crate::native::{Batch, Context, ContextKind, ContextParams};

/// Stamps of batch contents: never reused in a process, unlike addresses.
static NEXT_CONTENTS: AtomicU64 = AtomicU64::new(1);

fn next_contents() -> u64 {
    NEXT_CONTENTS.fetch_add(1, Ordering::Relaxed)
}

/// A batch of token rows to decode, reusable across calls.
#[pyclass(name = "Batch", module = "specstate._native")]
pub(crate) struct PyBatch {
    pub(crate) inner: Batch,
    /// A process-wide unique stamp, renewed on every change, so a decoded
    /// batch can be told from a refilled one or from a new batch at the same
    /// address after the old one was freed.
    contents: u64,
}

impl PyBatch {
    /// The stamp of the batch's current contents.
    pub(crate) fn key(&self) -> u64 {
        self.contents
    }
}

#[pymethods]
impl PyBatch {
    #[new]
    fn new(capacity: WideInt) -> PyResult<Self> {
        let capacity: usize = capacity.narrow("capacity")?;
        Ok(Self {
            inner: Batch::new(capacity)?,
            contents: next_contents(),
        })
    }

    /// Append `token` at position `pos` of `seq_id`; `logits` requests its output row.
    #[pyo3(signature = (token, pos, *, seq_id = WideInt(0), logits = false), text_signature = "(self, /, token, pos, *, seq_id=0, logits=False)")]
    fn add(&mut self, token: WideInt, pos: WideInt, seq_id: WideInt, logits: bool) -> PyResult<()> {
        let token: i32 = token.narrow("token")?;
        let pos: i32 = pos.narrow("pos")?;
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.contents = next_contents();
        Ok(self.inner.push(token, pos, seq_id, logits)?)
    }

    /// Remove every row.
    fn clear(&mut self) {
        self.contents = next_contents();
        self.inner.clear();
    }

    /// Row capacity.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// A llama.cpp context over a model, used from the thread that created it.
#[pyclass(name = "Context", module = "specstate._native")]
pub(crate) struct PyContext {
    pub(crate) inner: Guarded<Context>,
    /// The parameters it was created with (fixed, readable without the lock).
    params: ContextParams,
    /// The context's real length.
    n_ctx: u32,
    pub(crate) model: Py<PyModel>,
    pub(crate) owner: ThreadId,
    scratch: Batch,
    /// The linked source context (`other`), kept alive as long as this one.
    _other: Option<Py<PyContext>>,
    /// Decodes run on this context so far.
    decodes: u64,
    /// The `PyBatch` key of the last decode, if it was a user batch.
    last_batch: Option<u64>,
}

fn parse_kind(kind: &str) -> PyResult<ContextKind> {
    match kind {
        "default" => Ok(ContextKind::Default),
        "mtp" => Ok(ContextKind::Mtp),
        other => Err(PyValueError::new_err(format!(
            "kind must be 'default' or 'mtp', not {other:?}"
        ))),
    }
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

    /// Decode `tokens` through the scratch batch with the GIL released.
    pub(crate) fn decode_tokens(
        &mut self,
        py: Python<'_>,
        tokens: &[i32],
        start_pos: i32,
        seq_id: i32,
        all_logits: bool,
    ) -> PyResult<()> {
        self.check_thread()?;
        self.scratch.fill(tokens, start_pos, seq_id, all_logits)?;
        self.note_external_decode();
        let Self { inner, scratch, .. } = self;
        let inner = inner.get_mut();
        Ok(py.detach(|| inner.decode(scratch))?)
    }

    /// Record a decode made outside `decode`/`decode_batch` (the generation loop's).
    pub(crate) fn note_external_decode(&mut self) {
        self.decodes += 1;
        self.last_batch = None;
    }

    /// Rows one decode call may hold (llama.cpp's `n_batch`).
    pub(crate) fn batch_rows(&self) -> usize {
        self.inner.lock().capacity().batch as usize
    }

    /// Decodes run on this context so far.
    pub(crate) fn decode_count(&self) -> u64 {
        self.decodes
    }

    /// The `PyBatch` key of the last decode, if it was a user batch.
    pub(crate) fn last_batch(&self) -> Option<u64> {
        self.last_batch
    }

    /// The scratch batch that the last `decode_tokens` filled.
    pub(crate) fn scratch(&self) -> &Batch {
        &self.scratch
    }
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (model, *, n_ctx = WideInt(2048), n_batch = WideInt(512), n_ubatch = WideInt(512),
                        n_seq_max = WideInt(1), n_rs_seq = WideInt(0), kind = "default", n_threads = WideInt(0),
                        other = None),
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
            kind: parse_kind(kind)?,
            n_threads: n_threads.narrow("n_threads")?,
        };
        let shared = model.get().inner.clone();
        let inner = match &other {
            None => Context::new(shared, params)?,
            Some(other) => {
                let other = other.bind(py).borrow();
                other.check_thread()?;
                let source = other.inner.lock();
                // SAFETY: the new `PyContext` holds `other` in `_other`, so the
                // linked context outlives it; llama.cpp's context lives on the
                // heap, so it stays where it is.
                unsafe { Context::with_other(shared, params, &source)? }
            }
        };
        let scratch = Batch::new(inner.capacity().batch as usize)?;
        Ok(Self {
            params: *inner.params(),
            n_ctx: inner.n_ctx(),
            inner: Guarded::new(inner),
            model,
            owner: std::thread::current().id(),
            scratch,
            _other: other,
            decodes: 0,
            last_batch: None,
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
        match self.params.kind {
            ContextKind::Default => "default",
            ContextKind::Mtp => "mtp",
        }
    }

    /// The capacities that bound a speculative batch, read from llama.cpp.
    #[getter]
    fn capacity(&self) -> ContextCapacity {
        ContextCapacity {
            inner: self.inner.lock().capacity(),
        }
    }

    /// Decode `tokens` at positions `start_pos..` of `seq_id` (GIL released).
    ///
    /// Logits are kept for the last token, or for every token with `all_logits`.
    #[pyo3(signature = (tokens, start_pos, *, seq_id = WideInt(0), all_logits = false), text_signature = "(self, /, tokens, start_pos, *, seq_id=0, all_logits=False)")]
    fn decode(
        &mut self,
        py: Python<'_>,
        tokens: TokenIds,
        start_pos: WideInt,
        seq_id: WideInt,
        all_logits: bool,
    ) -> PyResult<()> {
        let start_pos: i32 = start_pos.narrow("start_pos")?;
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.decode_tokens(py, &tokens.0, start_pos, seq_id, all_logits)
    }

    /// Decode a prepared batch (GIL released).
    fn decode_batch(&mut self, py: Python<'_>, batch: PyRef<'_, PyBatch>) -> PyResult<()> {
        self.check_thread()?;
        self.decodes += 1;
        self.last_batch = Some(batch.key());
        let inner = self.inner.get_mut();
        let batch = &batch.inner;
        Ok(py.detach(|| inner.decode(batch))?)
    }

    /// The logits of output row `row` of the last decode (`-1`: the last row).
    #[pyo3(signature = (row = WideInt(-1)), text_signature = "(self, /, row=-1)")]
    fn logits(&self, row: WideInt) -> PyResult<Vec<f32>> {
        let row: i32 = row.narrow("row")?;
        self.check_thread()?;
        Ok(self.inner.lock().logits(row)?.to_vec())
    }

    /// The greedy choice of output row `row`: the id of the largest logit (lowest id on ties).
    #[pyo3(signature = (row = WideInt(-1)), text_signature = "(self, /, row=-1)")]
    fn argmax(&self, row: WideInt) -> PyResult<i32> {
        let row: i32 = row.narrow("row")?;
        self.check_thread()?;
        Ok(crate::sampling::argmax(self.inner.lock().logits(row)?))
    }

    /// The `k` largest logits of row `row` as `(token, logit)`, largest first.
    #[pyo3(signature = (row = WideInt(-1), k = WideInt(2)), text_signature = "(self, /, row=-1, k=2)")]
    fn top_logits(&self, row: WideInt, k: WideInt) -> PyResult<Vec<(i32, f32)>> {
        let row: i32 = row.narrow("row")?;
        let k: usize = k.narrow("k")?;
        self.check_thread()?;
        Ok(crate::sampling::top_k(self.inner.lock().logits(row)?, k))
    }

    /// The exact state of one sequence (KV cells and recurrent state; no logits).
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn seq_state<'py>(
        &mut self,
        py: Python<'py>,
        seq_id: WideInt,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let seq_id = self.sequence(seq_id)?;
        Ok(PyBytes::new(py, &self.inner.get_mut().seq_state(seq_id)?))
    }

    /// Replace one sequence's state with bytes from `seq_state`.
    ///
    /// On failure the sequence is left exactly as it was.
    #[pyo3(signature = (seq_id, data))]
    fn set_seq_state(&mut self, seq_id: WideInt, data: &[u8]) -> PyResult<()> {
        let seq_id = self.sequence(seq_id)?;
        Ok(self.inner.get_mut().replace_seq_state(seq_id, data)?)
    }

    /// Remove positions `p0..p1` of `seq_id` (`-1`: open end; `seq_id=-1`: every
    /// sequence); False if refused (an unknown sequence included).
    #[pyo3(signature = (seq_id = WideInt(0), p0 = WideInt(-1), p1 = WideInt(-1)), text_signature = "(self, /, seq_id=0, p0=-1, p1=-1)")]
    fn seq_rm(&mut self, seq_id: WideInt, p0: WideInt, p1: WideInt) -> PyResult<bool> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        let p0: i32 = p0.narrow("p0")?;
        let p1: i32 = p1.narrow("p1")?;
        self.check_thread()?;
        Ok(self.inner.get_mut().seq_rm(seq_id, p0, p1))
    }

    /// Clear one sequence.
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn seq_clear(&mut self, seq_id: WideInt) -> PyResult<()> {
        let seq_id = self.sequence(seq_id)?;
        let inner = self.inner.get_mut();
        inner.seq_pos_max(seq_id)?;
        inner.seq_rm(seq_id, -1, -1);
        Ok(())
    }

    /// The highest position stored for `seq_id`, or -1 when empty.
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn seq_pos_max(&self, seq_id: WideInt) -> PyResult<i32> {
        let seq_id = self.sequence(seq_id)?;
        Ok(self.inner.lock().seq_pos_max(seq_id)?)
    }
}
