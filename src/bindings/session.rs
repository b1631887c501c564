//! `DraftSession` (MTP and EAGLE-3) and `GreedyGeneration` for Python.

use std::thread::ThreadId;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::arguments::{f32_argument, WideInt};
use super::context::{PyBatch, PyContext};
use super::errors::{
    capacity_error, config_error, context_error, ensure_thread, native_error, session_error,
    speculative_state_error,
};
use crate::generation::{self, GreedyCursor};
use crate::native::Batch;
use crate::session::{DraftSession, SessionConfig, SessionError, SpecType};

pub(crate) fn session_error_to_py(py: Python<'_>, error: SessionError) -> PyErr {
    match error {
        SessionError::Config(message) => config_error(py, message),
        SessionError::Capacity(message) => capacity_error(py, message),
        SessionError::Incompatible(message) => context_error(py, message),
        SessionError::BadSequence { .. } => {
            speculative_state_error(py, crate::speculative::SpeculativeStateError::BadSequence)
        }
        SessionError::Usage(message) | SessionError::Native(message) => session_error(py, message),
        SessionError::State(state) => speculative_state_error(py, state),
    }
}

fn parse_spec_type(spec_type: &str) -> PyResult<SpecType> {
    match spec_type {
        "mtp" => Ok(SpecType::Mtp),
        "eagle3" => Ok(SpecType::Eagle3),
        other => Err(PyValueError::new_err(format!(
            "spec_type must be 'mtp' or 'eagle3', not {other:?}"
        ))),
    }
}

/// A speculative draft session pairing a target context with a draft context.
///
/// Use `MtpSession` or `Eagle3Session` (Python subclasses that fix `spec_type`).
#[pyclass(name = "DraftSession", module = "specstate._native", subclass)]
pub(crate) struct PySession {
    // Declared first so it is dropped first: the native session points into
    // both contexts, which the fields below keep alive.
    pub(crate) core: DraftSession,
    pub(crate) target: Py<PyContext>,
    pub(crate) draft: Py<PyContext>,
    owner: ThreadId,
    /// The target's decode count when the session was created: only batches
    /// decoded after it carry the hidden states the session extracts.
    created_at_decode: u64,
}

// SAFETY: every method checks that it runs on `owner`, the creating thread,
// before touching the native session or the contexts.
unsafe impl Sync for PySession {}

impl PySession {
    fn check_thread(&self, py: Python<'_>) -> PyResult<()> {
        ensure_thread(py, self.owner, "session")
    }

    /// Tell the session about the batch the target decoded last, after checks
    /// that keep llama.cpp from reading hidden states it never extracted.
    fn process_checked(
        &mut self,
        py: Python<'_>,
        batch: &Batch,
        batch_key: Option<u64>,
    ) -> PyResult<()> {
        let target = self.target.bind(py).borrow();
        let draft = self.draft.bind(py).borrow();
        if target.decode_count() <= self.created_at_decode || target.last_batch() != batch_key {
            return Err(session_error(
                py,
                "process() takes the batch the target decoded last, after the session was created",
            ));
        }
        if batch.len() > draft.inner.capacity().batch as usize {
            return Err(session_error(
                py,
                format!(
                    "a batch of {} rows exceeds the draft context's n_batch of {}",
                    batch.len(),
                    draft.inner.capacity().batch
                ),
            ));
        }
        drop((target, draft));
        let core = &mut self.core;
        py.detach(|| core.process(batch))
            .map_err(|e| session_error_to_py(py, e))
    }
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (target, draft, *, spec_type, n_seq = 1, n_draft_max = 3, n_min = 0, p_min = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: Py<PyContext>,
        draft: Py<PyContext>,
        spec_type: &str,
        n_seq: u32,
        n_draft_max: i32,
        n_min: i32,
        p_min: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config = SessionConfig {
            n_seq,
            n_draft_max,
            n_min,
            p_min: p_min.map_or(Ok(0.0), |p| f32_argument(p, "p_min"))?,
            spec_type: parse_spec_type(spec_type)?,
        };
        if target.is(&draft) {
            return Err(context_error(
                py,
                "the target and draft contexts must be two different contexts",
            ));
        }
        let mut target_ref = target.bind(py).borrow_mut();
        let mut draft_ref = draft.bind(py).borrow_mut();
        target_ref.check_thread(py)?;
        draft_ref.check_thread(py)?;
        let created_at_decode = target_ref.decode_count();
        // SAFETY: this object keeps both contexts alive through `target` and
        // `draft` and drops `core` first; pyclass values never move, so the
        // contexts stay at the same address.
        let core =
            unsafe { DraftSession::new(&mut target_ref.inner, &mut draft_ref.inner, config) }
                .map_err(|e| session_error_to_py(py, e))?;
        drop((target_ref, draft_ref));
        Ok(Self {
            core,
            target,
            draft,
            owner: std::thread::current().id(),
            created_at_decode,
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

    /// `'mtp'` or `'eagle3'`.
    #[getter]
    fn spec_type(&self) -> &'static str {
        match self.core.config().spec_type {
            SpecType::Mtp => "mtp",
            SpecType::Eagle3 => "eagle3",
        }
    }

    /// Sequence slots.
    #[getter]
    fn n_seq(&self) -> u32 {
        self.core.config().n_seq
    }

    /// Most tokens one draft proposes.
    #[getter]
    fn n_draft_max(&self) -> i32 {
        self.core.config().n_draft_max
    }

    /// Fewest tokens a draft must have.
    #[getter]
    fn n_min(&self) -> i32 {
        self.core.config().n_min
    }

    /// Smallest draft-token probability kept (as the f32 llama.cpp uses).
    #[getter]
    fn p_min(&self) -> f32 {
        self.core.config().p_min
    }

    /// Tokens drafted so far.
    #[getter]
    fn n_drafted(&self) -> u64 {
        self.core.drafted()
    }

    /// Drafted tokens accepted so far.
    #[getter]
    fn n_accepted(&self) -> u64 {
        self.core.accepted()
    }

    /// Whether the target must keep post-norm embeddings.
    #[getter]
    fn need_embd(&self) -> bool {
        self.core.need_embd()
    }

    /// Whether the target must keep pre-norm hidden states.
    #[getter]
    fn need_embd_pre_norm(&self) -> bool {
        self.core.need_embd_pre_norm()
    }

    /// Start a generation on `seq_id` whose `prompt` the target has decoded.
    #[pyo3(signature = (prompt, *, seq_id = WideInt(0)), text_signature = "(self, /, prompt, *, seq_id=0)")]
    fn begin(&mut self, py: Python<'_>, prompt: Vec<i32>, seq_id: WideInt) -> PyResult<()> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.check_thread(py)?;
        self.core
            .begin(seq_id, &prompt)
            .map_err(|e| session_error_to_py(py, e))
    }

    /// Decode `tokens` on the target at `start_pos..` of `seq_id`, then
    /// process that batch (GIL released for both).
    #[pyo3(signature = (tokens, start_pos, *, seq_id = 0, all_logits = false))]
    fn decode(
        &mut self,
        py: Python<'_>,
        tokens: Vec<i32>,
        start_pos: i32,
        seq_id: i32,
        all_logits: bool,
    ) -> PyResult<()> {
        self.check_thread(py)?;
        let draft_rows = self.draft.bind(py).borrow().inner.capacity().batch as usize;
        if tokens.len() > draft_rows {
            return Err(session_error(
                py,
                format!(
                    "{} tokens exceed the draft context's n_batch of {draft_rows}",
                    tokens.len()
                ),
            ));
        }
        let target = self.target.clone_ref(py);
        let mut target = target.bind(py).borrow_mut();
        target.decode_tokens(py, &tokens, start_pos, seq_id, all_logits)?;
        let core = &mut self.core;
        let batch = target.scratch();
        py.detach(|| core.process(batch))
            .map_err(|e| session_error_to_py(py, e))
    }

    /// Tell the session about `batch`, which the target decoded last (`Context.decode_batch`).
    fn process(&mut self, py: Python<'_>, batch: PyRef<'_, PyBatch>) -> PyResult<()> {
        self.check_thread(py)?;
        let key = Some(batch.key());
        self.process_checked(py, &batch.inner, key)
    }

    /// Draft up to `n_draft_max` tokens after `id_last` at position `n_past`.
    #[pyo3(signature = (n_past, id_last, *, seq_id = WideInt(0)), text_signature = "(self, /, n_past, id_last, *, seq_id=0)")]
    fn draft(
        &mut self,
        py: Python<'_>,
        n_past: WideInt,
        id_last: WideInt,
        seq_id: WideInt,
    ) -> PyResult<Vec<i32>> {
        let n_past: i32 = n_past.narrow("n_past")?;
        let id_last: i32 = id_last.narrow("id_last")?;
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.check_thread(py)?;
        let core = &mut self.core;
        py.detach(|| core.draft(seq_id, n_past, id_last))
            .map_err(|e| session_error_to_py(py, e))
    }

    /// Complete the pending proposal: `n_accepted` of its tokens were verified.
    #[pyo3(signature = (n_accepted, *, seq_id = WideInt(0)), text_signature = "(self, /, n_accepted, *, seq_id=0)")]
    fn accept(&mut self, py: Python<'_>, n_accepted: WideInt, seq_id: WideInt) -> PyResult<()> {
        let n_accepted: usize = n_accepted.narrow("n_accepted")?;
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.check_thread(py)?;
        self.core
            .accept(seq_id, n_accepted)
            .map_err(|e| session_error_to_py(py, e))
    }

    /// Whether no sequence has a pending proposal.
    fn is_quiescent(&self, py: Python<'_>) -> PyResult<bool> {
        self.check_thread(py)?;
        Ok(self.core.is_quiescent())
    }

    /// Whether `seq_id` has a pending proposal.
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn has_pending_proposal(&self, py: Python<'_>, seq_id: WideInt) -> PyResult<bool> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.check_thread(py)?;
        self.core
            .has_pending_proposal(seq_id)
            .map_err(|e| session_error_to_py(py, e))
    }

    /// The exact speculative state of `seq_id` (only at a quiescent boundary).
    #[pyo3(signature = (seq_id = WideInt(0)), text_signature = "(self, /, seq_id=0)")]
    fn speculative_state<'py>(
        &self,
        py: Python<'py>,
        seq_id: WideInt,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.check_thread(py)?;
        let state = self
            .core
            .state(seq_id)
            .map_err(|e| speculative_state_error(py, e))?;
        Ok(PyBytes::new(py, &state))
    }

    /// Restore `seq_id`'s speculative state; bytes that are not a valid state
    /// for this session leave it exactly as it was.
    #[pyo3(signature = (seq_id, data))]
    fn restore_speculative_state(
        &mut self,
        py: Python<'_>,
        seq_id: WideInt,
        data: &[u8],
    ) -> PyResult<()> {
        let seq_id: i32 = seq_id.narrow("seq_id")?;
        self.check_thread(py)?;
        self.core
            .restore(seq_id, data)
            .map_err(|e| speculative_state_error(py, e))
    }
}

/// A greedy speculative generation on one sequence of a session.
#[pyclass(name = "GreedyGeneration", module = "specstate._native")]
pub(crate) struct PyGreedyGeneration {
    session: Py<PySession>,
    cursor: Option<GreedyCursor>,
    seq_id: i32,
    batch: Batch,
    tokens: Vec<i32>,
    rounds: u64,
    drafted: u64,
    accepted: u64,
    owner: ThreadId,
}

// SAFETY: every method checks that it runs on `owner` before touching `batch`.
unsafe impl Sync for PyGreedyGeneration {}

impl PyGreedyGeneration {
    fn cursor(&self, py: Python<'_>) -> PyResult<GreedyCursor> {
        ensure_thread(py, self.owner, "generation")?;
        self.cursor.ok_or_else(|| {
            session_error(
                py,
                "the generation has no prompt yet: call prefill() or resume()",
            )
        })
    }
}

#[pymethods]
impl PyGreedyGeneration {
    #[new]
    #[pyo3(signature = (session, *, seq_id = 0))]
    fn new(py: Python<'_>, session: Py<PySession>, seq_id: i32) -> PyResult<Self> {
        let rows = {
            let s = session.bind(py).borrow();
            s.check_thread(py)?;
            let target = s.target.bind(py).borrow();
            let draft = s.draft.bind(py).borrow();
            generation::process_rows(&target.inner, &draft.inner)
        };
        Ok(Self {
            session,
            cursor: None,
            seq_id,
            batch: Batch::new(rows).map_err(|e| native_error(py, e))?,
            tokens: Vec::new(),
            rounds: 0,
            drafted: 0,
            accepted: 0,
            owner: std::thread::current().id(),
        })
    }

    /// Decode `prompt`, begin the session, and return the first generated token.
    fn prefill(&mut self, py: Python<'_>, prompt: Vec<i32>) -> PyResult<i32> {
        ensure_thread(py, self.owner, "generation")?;
        if self.cursor.is_some() {
            return Err(session_error(py, "this generation already has a prompt"));
        }
        let session = self.session.clone_ref(py);
        let mut session = session.bind(py).borrow_mut();
        let target_obj = session.target.clone_ref(py);
        let draft_obj = session.draft.clone_ref(py);
        let mut target = target_obj.bind(py).borrow_mut();
        let mut draft = draft_obj.bind(py).borrow_mut();
        let (core, batch, seq_id) = (&mut session.core, &mut self.batch, self.seq_id);
        let (target_ctx, draft_ctx) = (&mut target.inner, &mut draft.inner);
        let cursor = py
            .detach(|| generation::prefill(target_ctx, draft_ctx, core, batch, seq_id, &prompt))
            .map_err(|e| session_error_to_py(py, e))?;
        target.note_external_decode();
        self.cursor = Some(cursor);
        self.tokens.push(cursor.id_last);
        Ok(cursor.id_last)
    }

    /// Continue from a restored boundary: the contexts hold `n_past` tokens of
    /// `seq_id` and `id_last` is the last committed token, not yet decoded.
    #[pyo3(signature = (n_past, id_last, tokens = None))]
    fn resume(
        &mut self,
        py: Python<'_>,
        n_past: i32,
        id_last: i32,
        tokens: Option<Vec<i32>>,
    ) -> PyResult<()> {
        ensure_thread(py, self.owner, "generation")?;
        if self.cursor.is_some() {
            return Err(session_error(py, "this generation has already started"));
        }
        if n_past <= 0 {
            return Err(PyValueError::new_err("n_past must be positive"));
        }
        self.cursor = Some(GreedyCursor {
            seq_id: self.seq_id,
            n_past,
            id_last,
        });
        self.tokens = tokens.unwrap_or_else(|| vec![id_last]);
        Ok(())
    }

    /// Run one round (draft, verify, accept, roll back); returns the tokens it committed.
    fn step(&mut self, py: Python<'_>) -> PyResult<Vec<i32>> {
        let mut cursor = self.cursor(py)?;
        let session = self.session.clone_ref(py);
        let mut session = session.bind(py).borrow_mut();
        let target_obj = session.target.clone_ref(py);
        let draft_obj = session.draft.clone_ref(py);
        let mut target = target_obj.bind(py).borrow_mut();
        let mut draft = draft_obj.bind(py).borrow_mut();
        let (core, batch) = (&mut session.core, &mut self.batch);
        let (target_ctx, draft_ctx) = (&mut target.inner, &mut draft.inner);
        let round = py
            .detach(|| generation::step(target_ctx, draft_ctx, core, batch, &mut cursor))
            .map_err(|e| session_error_to_py(py, e))?;
        target.note_external_decode();
        self.cursor = Some(cursor);
        self.rounds += 1;
        self.drafted += round.drafted as u64;
        self.accepted += round.accepted as u64;
        self.tokens.extend_from_slice(&round.committed);
        Ok(round.committed)
    }

    /// Run rounds until at least `n_tokens` tokens are committed in total (or
    /// the target's context is full); returns every committed token.
    fn generate(&mut self, py: Python<'_>, n_tokens: WideInt) -> PyResult<Vec<i32>> {
        let n_tokens: usize = n_tokens.narrow("n_tokens")?;
        while self.tokens.len() < n_tokens {
            let room = {
                let session = self.session.bind(py).borrow();
                let target = session.target.bind(py).borrow();
                target.inner.n_ctx() as i64 - i64::from(self.cursor(py)?.n_past)
            };
            if room <= 1 {
                break;
            }
            self.step(py)?;
        }
        Ok(self.tokens.clone())
    }

    /// Every committed token, the first generated token included.
    #[getter]
    fn tokens(&self) -> Vec<i32> {
        self.tokens.clone()
    }

    /// Tokens in the target's memory for this sequence (None before prefill).
    #[getter]
    fn n_past(&self) -> Option<i32> {
        self.cursor.map(|c| c.n_past)
    }

    /// The last committed token, decoded by the next round (None before prefill).
    #[getter]
    fn id_last(&self) -> Option<i32> {
        self.cursor.map(|c| c.id_last)
    }

    /// The sequence generated on.
    #[getter]
    fn seq_id(&self) -> i32 {
        self.seq_id
    }

    /// Rounds run.
    #[getter]
    fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Tokens drafted (and verified) by this generation.
    #[getter]
    fn n_drafted(&self) -> u64 {
        self.drafted
    }

    /// Drafted tokens accepted by this generation.
    #[getter]
    fn n_accepted(&self) -> u64 {
        self.accepted
    }
}
