//! `DraftSession` (MTP and EAGLE-3) and `GreedyGeneration` for Python.

use std::thread::ThreadId;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::arguments::{f32_argument, TokenIds, WideInt};
use super::context::{ContextState, PyBatch, PyContext};
use super::errors::ensure_thread;
use super::guarded::Guarded;
use crate::greedy_generation::{self, GreedyGeneration, SessionParts};
use crate::native::Context;
use crate::session::{check_distinct, DraftSession, SessionConfig, SpecType};

/// A speculative draft session pairing a target context with a draft context.
///
/// Use `MtpSession` or `Eagle3Session` (Python subclasses that fix `spec_type`).
///
/// The session and both contexts are bound to the thread that created them
/// (every method that reaches them checks, first), so llama.cpp never sees
/// them used from two threads. The class is frozen: the native session is
/// behind one lock, which calls take in a fixed order with the contexts'
/// (session, target, draft, then a batch), and another thread gets
/// `ThreadAffinityError`, never a borrow error; the configuration fixed at
/// creation is read from any thread.
#[pyclass(name = "DraftSession", module = "specstate._native", subclass, frozen)]
pub(crate) struct PySession {
    // Declared first so it is dropped first: the native session points into
    // both contexts, which the fields below keep alive.
    pub(crate) core: Guarded<DraftSession>,
    /// `'mtp'` or `'eagle3'`.
    #[pyo3(get)]
    spec_type: &'static str,
    /// Sequence slots.
    #[pyo3(get)]
    n_seq: u32,
    /// Most tokens one draft proposes.
    #[pyo3(get)]
    n_draft_max: i32,
    /// Fewest tokens a draft must have.
    #[pyo3(get)]
    n_min: i32,
    /// Smallest draft-token probability kept (as the f32 llama.cpp uses).
    #[pyo3(get)]
    p_min: f32,
    pub(crate) target: Py<PyContext>,
    pub(crate) draft: Py<PyContext>,
    owner: ThreadId,
}

impl PySession {
    fn check_thread(&self) -> PyResult<()> {
        ensure_thread(self.owner, "session")
    }

    /// `seq_id` as a native sequence id, once the thread is checked.
    fn sequence(&self, seq_id: WideInt) -> PyResult<i32> {
        self.check_thread()?;
        seq_id.narrow("seq_id")
    }

    /// The native session, on the owner thread only (checked first); see
    /// `PyContext::owned`.
    fn owned(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, DraftSession>> {
        self.check_thread()?;
        Ok(self.core.lock_waiting(py))
    }

    /// Run `call` on the native session and both contexts, locked in the
    /// fixed order (session, target, draft) with the GIL released, after the
    /// thread check.
    fn with_contexts<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut DraftSession, &mut ContextState, &mut Context) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        self.check_thread()?;
        let (target, draft) = (self.target.get(), self.draft.get());
        py.detach(|| {
            let mut core = self.core.lock();
            let mut target = target.state.lock();
            let mut draft = draft.state.lock();
            call(&mut core, &mut target, &mut draft.native)
        })
    }
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (target, draft, *, spec_type, n_seq = WideInt(1), n_draft_max = WideInt(3), n_min = WideInt(0), p_min = None),
           text_signature = "(target, draft, *, spec_type, n_seq=1, n_draft_max=3, n_min=0, p_min=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: Py<PyContext>,
        draft: Py<PyContext>,
        spec_type: &str,
        n_seq: WideInt,
        n_draft_max: WideInt,
        n_min: WideInt,
        p_min: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config = SessionConfig {
            n_seq: n_seq.saturate(),
            n_draft_max: n_draft_max.saturate(),
            n_min: n_min.saturate(),
            p_min: p_min.map_or(Ok(0.0), |p| f32_argument(p, "p_min"))?,
            spec_type: SpecType::parse(spec_type)?,
        };
        check_distinct(target.get(), draft.get())?;
        let mut target_state = target.get().owned(py)?;
        let mut draft_state = draft.get().owned(py)?;
        let core = DraftSession::new(&mut target_state.native, &mut draft_state.native, config)?;
        drop((target_state, draft_state));
        Ok(Self {
            core: Guarded::new(core),
            spec_type: config.spec_type.name(),
            n_seq: config.n_seq,
            n_draft_max: config.n_draft_max,
            n_min: config.n_min,
            p_min: config.p_min,
            target,
            draft,
            owner: std::thread::current().id(),
        })
    }

    /// The target context.
    #[getter]
    fn target(&self, py: Python<'_>) -> Py<PyContext> {
        self.target.clone_ref(py)
    }

    /// The draft context.
    #[getter]
    fn draft_context(&self, py: Python<'_>) -> Py<PyContext> {
        self.draft.clone_ref(py)
    }

    /// Tokens drafted so far.
    #[getter]
    fn n_drafted(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.owned(py)?.drafted())
    }

    /// Drafted tokens accepted so far.
    #[getter]
    fn n_accepted(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.owned(py)?.accepted())
    }

    /// Whether the target must keep post-norm embeddings.
    #[getter]
    fn need_embd(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.owned(py)?.need_embd())
    }

    /// Whether the target must keep pre-norm hidden states.
    #[getter]
    fn need_embd_pre_norm(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.owned(py)?.need_embd_pre_norm())
    }

    /// Start a generation on `seq_id` whose `prompt` the target has decoded.
    #[pyo3(signature = (prompt, *, seq_id = WideInt(0)), text_signature = "(self, /, prompt, *, seq_id=0)")]
    fn begin(&self, py: Python<'_>, prompt: TokenIds, seq_id: WideInt) -> PyResult<()> {
        let seq_id = self.sequence(seq_id)?;
        self.with_contexts(py, |core, target, draft| {
            Ok(core.begin(&target.native, draft, seq_id, &prompt.0)?)
        })
    }

    /// Decode `tokens` on the target at `start_pos..` of `seq_id`, then
    /// process that batch (GIL released for both).
    #[pyo3(signature = (tokens, start_pos, *, seq_id = WideInt(0), all_logits = false),
           text_signature = "(self, /, tokens, start_pos, *, seq_id=0, all_logits=False)")]
    fn decode(
        &self,
        py: Python<'_>,
        tokens: TokenIds,
        start_pos: WideInt,
        seq_id: WideInt,
        all_logits: bool,
    ) -> PyResult<()> {
        let (tokens, start_pos) = (tokens.0, start_pos.narrow("start_pos")?);
        let seq_id = self.sequence(seq_id)?;
        self.target.get().check_thread()?;
        self.with_contexts(py, |core, target, draft| {
            core.check_rows(tokens.len())?;
            target.decode_tokens(&tokens, start_pos, seq_id, all_logits)?;
            Ok(core.process_decoded(&target.native, draft, target.scratch())?)
        })
    }

    /// Tell the session about `batch`, which the target decoded last (`Context.decode_batch`).
    ///
    /// Checked first (`DraftSession::process_decoded`), so llama.cpp never
    /// reads hidden states it never extracted; the batch's lock is held from
    /// the check to the end.
    fn process(&self, py: Python<'_>, batch: &Bound<'_, PyBatch>) -> PyResult<()> {
        let batch = batch.get();
        self.with_contexts(py, |core, target, draft| {
            Ok(core.process_decoded(&target.native, draft, &batch.rows.lock())?)
        })
    }

    /// Draft up to `n_draft_max` tokens after `id_last` at position `n_past`.
    #[pyo3(signature = (n_past, id_last, *, seq_id = WideInt(0)), text_signature = "(self, /, n_past, id_last, *, seq_id=0)")]
    fn draft(
        &self,
        py: Python<'_>,
        n_past: WideInt,
        id_last: WideInt,
        seq_id: WideInt,
    ) -> PyResult<Vec<i32>> {
        let n_past: i32 = n_past.narrow("n_past")?;
        let id_last: i32 = id_last.narrow("id_last")?;
        let seq_id = self.sequence(seq_id)?;
        self.with_contexts(py, |core, target, draft| {
            Ok(core.draft(&target.native, draft, seq_id, n_past, id_last)?)
        })
    }

    /// Complete the pending proposal: `n_accepted` of its tokens were verified.
    #[pyo3(signature = (n_accepted, *, seq_id = WideInt(0)), text_signature = "(self, /, n_accepted, *, seq_id=0)")]
    fn accept(&self, py: Python<'_>, n_accepted: WideInt, seq_id: WideInt) -> PyResult<()> {
        let n_accepted: usize = n_accepted.narrow("n_accepted")?;
        let seq_id = self.sequence(seq_id)?;
        self.with_contexts(py, |core, target, draft| {
            Ok(core.accept(&target.native, draft, seq_id, n_accepted)?)
        })
    }

    /// Whether no sequence has a pending proposal.
    fn is_quiescent(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.owned(py)?.is_quiescent())
    }

    /// Whether `seq_id` has a pending proposal.
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn has_pending_proposal(&self, py: Python<'_>, seq_id: WideInt) -> PyResult<bool> {
        let seq_id = self.sequence(seq_id)?;
        Ok(self.owned(py)?.has_pending_proposal(seq_id)?)
    }

    /// The exact speculative state of `seq_id` (only at a quiescent boundary).
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn speculative_state<'py>(
        &self,
        py: Python<'py>,
        seq_id: WideInt,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let seq_id = self.sequence(seq_id)?;
        let state = self.owned(py)?.state(seq_id)?;
        Ok(PyBytes::new(py, &state))
    }

    /// Restore `seq_id`'s speculative state; bytes that are not a valid state
    /// for this session leave it exactly as it was.
    #[pyo3(signature = (seq_id, data))]
    fn restore_speculative_state(
        &self,
        py: Python<'_>,
        seq_id: WideInt,
        data: &[u8],
    ) -> PyResult<()> {
        let seq_id = self.sequence(seq_id)?;
        Ok(self.owned(py)?.restore(seq_id, data)?)
    }
}

/// A greedy speculative generation on one sequence of a session (the rounds
/// are the engine's, as `Generator`'s are).
///
/// Bound to its session's thread (every method that reaches its state
/// checks, first); the class is frozen and its state is behind one lock,
/// taken before the session's and the contexts', so another thread gets
/// `ThreadAffinityError`, never a borrow error.
#[pyclass(name = "GreedyGeneration", module = "specstate._native", frozen)]
pub(crate) struct PyGreedyGeneration {
    session: Py<PySession>,
    core: Guarded<GreedyGeneration>,
    /// The sequence generated on (fixed).
    seq_id: i32,
    owner: ThreadId,
}

impl PyGreedyGeneration {
    fn check_thread(&self) -> PyResult<()> {
        ensure_thread(self.owner, "generation")
    }

    /// The generation's state, on the owner thread only (checked first).
    fn owned(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, GreedyGeneration>> {
        self.check_thread()?;
        Ok(self.core.lock_waiting(py))
    }

    /// Run `call` on the core with the session and its contexts locked
    /// (generation, session, target, draft; GIL released), after the thread
    /// check.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut GreedyGeneration, &mut SessionParts<'_>) -> crate::Result<T> + Send,
    ) -> PyResult<T> {
        self.check_thread()?;
        let session = self.session.get();
        let (target, draft) = (session.target.get(), session.draft.get());
        let result = py.detach(|| {
            let mut core = self.core.lock();
            let mut session_core = session.core.lock();
            let mut target = target.state.lock();
            let mut draft = draft.state.lock();
            let mut parts = SessionParts {
                target: &mut target.native,
                draft: &mut draft.native,
                session: &mut session_core,
            };
            call(&mut core, &mut parts)
        });
        Ok(result?)
    }
}

#[pymethods]
impl PyGreedyGeneration {
    #[new]
    #[pyo3(signature = (session, *, seq_id = WideInt(0)), text_signature = "(session, *, seq_id=0)")]
    fn new(py: Python<'_>, session: Py<PySession>, seq_id: WideInt) -> PyResult<Self> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        let rows = {
            let s = session.get();
            s.check_thread()?;
            let target = s.target.get().owned(py)?;
            let draft = s.draft.get().owned(py)?;
            greedy_generation::process_rows(&target.native, &draft.native)
        };
        Ok(Self {
            session,
            core: Guarded::new(GreedyGeneration::new(seq_id, rows)?),
            seq_id,
            owner: std::thread::current().id(),
        })
    }

    /// Decode `prompt`, begin the session, and return the first generated token.
    fn prefill(&self, py: Python<'_>, prompt: TokenIds) -> PyResult<i32> {
        self.run(py, |core, parts| core.prefill(parts, &prompt.0))
    }

    /// Continue from a restored boundary: the contexts hold `n_past` tokens of
    /// `seq_id` and `id_last` is the last committed token, not yet decoded
    /// (the last of `tokens`, if given).
    #[pyo3(signature = (n_past, id_last, tokens = None))]
    fn resume(
        &self,
        py: Python<'_>,
        n_past: WideInt,
        id_last: WideInt,
        tokens: Option<TokenIds>,
    ) -> PyResult<()> {
        let n_past: usize = n_past.narrow("n_past")?;
        let id_last: i32 = id_last.narrow("id_last")?;
        let target = self.session.get().target.get();
        let finished = target.model.get().inner.is_eog(id_last);
        let tokens = tokens.map(|t| t.0);
        Ok(self.owned(py)?.resume(n_past, id_last, tokens, finished)?)
    }

    /// Run one round (draft, verify, accept, roll back); returns the tokens it
    /// committed (none once finished or when the context is full).
    fn step(&self, py: Python<'_>) -> PyResult<Vec<i32>> {
        self.run(py, |core, parts| core.step(parts))
    }

    /// Run rounds until at least `n_tokens` tokens are committed in total (or
    /// the generation is finished or the context full); returns every
    /// committed token.
    fn generate(&self, py: Python<'_>, n_tokens: WideInt) -> PyResult<Vec<i32>> {
        let n_tokens: usize = n_tokens.narrow("n_tokens")?;
        self.run(py, |core, parts| {
            core.generate(parts, n_tokens)?;
            Ok(core.tokens().to_vec())
        })
    }

    /// Every committed token, the first generated token included.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> PyResult<Vec<i32>> {
        Ok(self.owned(py)?.tokens().to_vec())
    }

    /// Tokens in the target's memory for this sequence (None before prefill).
    #[getter]
    fn n_past(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        Ok(self.owned(py)?.n_past())
    }

    /// The last committed token, decoded by the next round (None before prefill).
    #[getter]
    fn id_last(&self, py: Python<'_>) -> PyResult<Option<i32>> {
        Ok(self.owned(py)?.id_last())
    }

    /// Whether an end-of-generation token was committed (no round commits after it).
    #[getter]
    fn finished(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.owned(py)?.finished())
    }

    /// The sequence generated on.
    #[getter]
    fn seq_id(&self) -> i32 {
        self.seq_id
    }

    /// Rounds run.
    #[getter]
    fn rounds(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.owned(py)?.counters().0)
    }

    /// Tokens drafted (and verified) by this generation.
    #[getter]
    fn n_drafted(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.owned(py)?.counters().1)
    }

    /// Drafted tokens accepted by this generation.
    #[getter]
    fn n_accepted(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.owned(py)?.counters().2)
    }
}
