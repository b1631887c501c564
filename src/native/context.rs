//! An owned llama.cpp context (`llama_init_from_model`/`llama_free`).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use llama_cpp_sys_4 as sys;

use super::pool::GraphPool;
use super::seq_state::{check_recurrent_cells, Memories};
use super::threads::{resolved, threads_now, InFlight};
use super::{Batch, Model, NativeError, NativeResult};
use crate::limits::{check_threads, resolve_n_ctx, SettingError, MAX_BATCH_ROWS, MAX_SEQUENCES};
use crate::speculative::SpeculativeContextCapacity;

/// Which computation a context runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextKind {
    /// The model's ordinary forward pass.
    Default,
    /// The model's multi-token-prediction (nextn) head, as an MTP draft context.
    Mtp,
}

impl ContextKind {
    /// The kind called `default` or `mtp`.
    pub fn parse(name: &str) -> Result<Self, SettingError> {
        match name {
            "default" => Ok(Self::Default),
            "mtp" => Ok(Self::Mtp),
            other => Err(SettingError {
                field: "kind",
                reason: format!("must be 'default' or 'mtp', not {other:?}"),
            }),
        }
    }

    /// `default` or `mtp`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Mtp => "mtp",
        }
    }
}

/// Parameters of a new context; zero means llama.cpp's default where it has one.
/// Every one is given: the native layer holds no defaults of its own (a
/// generator's sizes are `settings::GeneratorConfig::DEFAULT`'s).
#[derive(Clone, Copy, Debug)]
pub struct ContextParams {
    /// Context length in tokens (0: the model's training length).
    pub n_ctx: u32,
    /// Rows one `decode` may hold.
    pub n_batch: u32,
    /// Rows one compute pass may hold.
    pub n_ubatch: u32,
    /// Sequences the context can hold.
    pub n_seq_max: u32,
    /// Recurrent-state snapshots per sequence kept for rollback.
    pub n_rs_seq: u32,
    /// Which computation the context runs.
    pub kind: ContextKind,
    /// Threads for single-token and for batch decoding (0: the default, [`default_threads`]).
    pub n_threads: i32,
}

/// Bytes a context holds (see [`Context::allocated_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextBytes {
    /// KV cache, recurrent states and rollback snapshots.
    pub memory: u64,
    /// Compute buffers (sized for `n_ubatch` rows).
    pub compute: u64,
}

/// Refuse, before llama.cpp sees them, parameters it would abort on or that
/// would allocate more than the model was made for; the context length,
/// resolved ([`resolve_n_ctx`]: 0 is the trained length).
fn check_params(
    model: &Model,
    params: &ContextParams,
    other: Option<&Context>,
) -> NativeResult<u32> {
    let invalid = |message: String| Err(NativeError::InvalidArgument(message));
    let setting = |e: SettingError| NativeError::InvalidArgument(e.to_string());
    let max_rows = u32::try_from(MAX_BATCH_ROWS).unwrap_or(u32::MAX);
    for (name, value) in [("n_batch", params.n_batch), ("n_ubatch", params.n_ubatch)] {
        if value == 0 || value > max_rows {
            return invalid(format!(
                "{name} must be between 1 and {max_rows}, not {value}"
            ));
        }
    }
    if params.n_seq_max == 0 || params.n_seq_max > MAX_SEQUENCES {
        return invalid(format!(
            "n_seq_max must be between 1 and {MAX_SEQUENCES}, not {}",
            params.n_seq_max
        ));
    }
    // Each sequence has a KV stream of `n_ctx / n_seq_max` cells: that is what the model's trained length bounds.
    let per_sequence =
        resolve_n_ctx(params.n_ctx / params.n_seq_max, model.n_ctx_train()).map_err(setting)?;
    let n_ctx = per_sequence.checked_mul(params.n_seq_max).ok_or_else(|| {
        NativeError::InvalidArgument(format!(
            "{per_sequence} tokens for each of {} sequences overflow a context length",
            params.n_seq_max
        ))
    })?;
    check_threads(params.n_threads.into()).map_err(setting)?;
    if let Some(other) = other {
        let theirs = other.model();
        if theirs.n_embd() != model.n_embd() || theirs.n_vocab() != model.n_vocab() {
            return Err(NativeError::ContextInit(format!(
                "the linked context's model ({} wide, {} tokens) does not match this model ({} wide, {} tokens)",
                theirs.n_embd(),
                theirs.n_vocab(),
                model.n_embd(),
                model.n_vocab()
            )));
        }
    }
    Ok(n_ctx)
}

/// Let `raw`'s next graphs run with the threads the machine can give now of
/// its `configured` ones ([`threads_now`]), on its `pool` (made again in a
/// forked process, [`GraphPool::renew_after_fork`]); hold the guard while
/// they run, so that other graphs of the process count them.
///
/// # Safety
/// `raw` is a live context that nothing else uses during the call, and
/// `pool` the one attached to it.
pub(super) unsafe fn fit_threads(
    raw: NonNull<sys::llama_context>,
    configured: i32,
    pool: &mut Option<GraphPool>,
) -> InFlight {
    // SAFETY: live, not used elsewhere, its own pool (the caller's promise).
    unsafe { GraphPool::renew_after_fork(pool, raw) };
    let threads = threads_now(configured);
    // SAFETY: live and not used elsewhere during the call (the caller's promise).
    unsafe { sys::llama_set_n_threads(raw.as_ptr(), threads, threads) };
    InFlight::new(threads)
}

/// The llama.cpp context a [`Context`] runs, freed when its last holder
/// goes: the [`Context`] itself, a context linked to it (`ctx_other`), or a
/// speculative session over it ([`super::SessionHandle`]), since llama.cpp
/// keeps pointers to it in both.
pub(crate) struct ContextHandle {
    raw: NonNull<sys::llama_context>,
    /// Held while llama.cpp writes this context's memory, and while a
    /// context linked to it decodes (which reads that memory).
    busy: Mutex<()>,
    /// The model the context runs, freed after it.
    _model: Arc<Model>,
    /// The context this one is linked to (`ctx_other`), freed after it.
    other: Option<Arc<ContextHandle>>,
    /// The threads its graphs run on, freed after it.
    pool: Mutex<Option<GraphPool>>,
}

// SAFETY: the handle dereferences `raw` only when it frees it, once, in
// `drop`; every other use goes through the `Context` that owns it (or a
// session given that `Context`), under Rust's borrows and `busy`. A llama.cpp
// context has no thread affinity.
unsafe impl Send for ContextHandle {}
// SAFETY: as for `Send`: a shared handle gives no access to the context.
unsafe impl Sync for ContextHandle {}

impl ContextHandle {
    /// Exclusion from a linked context's decode while this context's memory changes.
    fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ContextHandle {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `llama_init_from_model` and is freed once,
        // by its last holder; the model and the linked context outlive it
        // (fields, dropped after this).
        unsafe { sys::llama_free(self.raw.as_ptr()) };
    }
}

/// A llama.cpp context, used by one thread at a time.
pub struct Context {
    raw: NonNull<sys::llama_context>,
    handle: Arc<ContextHandle>,
    model: Arc<Model>,
    params: ContextParams,
    /// The threads its graphs may use (the resolved count, never 0); each runs with as many of them as the
    /// machine can give it then ([`threads_now`]).
    n_threads: i32,
    /// Decodes run so far (failed ones included).
    decodes: u64,
    /// The stamp of the batch the last decode ran, if it succeeded.
    last_decoded: Option<u64>,
}

impl Context {
    /// A context over `model`.
    pub fn new(model: Arc<Model>, params: ContextParams) -> NativeResult<Self> {
        Self::create(model, params, None)
    }

    /// A context over `model` linked to a source context `other` (`ctx_other`):
    /// EAGLE-3 drafts without their own embedding or head read the target's.
    ///
    /// llama.cpp keeps a pointer to `other`: the new context keeps it alive,
    /// and its decodes wait for any change to `other`'s memory (and hold
    /// changes off while they read it).
    pub fn with_other(
        model: Arc<Model>,
        params: ContextParams,
        other: &Context,
    ) -> NativeResult<Self> {
        Self::create(model, params, Some(other))
    }

    fn create(
        model: Arc<Model>,
        params: ContextParams,
        other: Option<&Context>,
    ) -> NativeResult<Self> {
        let n_ctx = check_params(&model, &params, other)?;
        let recurrent = model.is_recurrent() || model.is_hybrid();
        // llama.cpp runs at most n_batch rows per compute pass, whatever n_ubatch
        // says, and caps n_batch at the context length (as asked, before padding).
        let n_ubatch = params.n_ubatch.min(params.n_batch).min(n_ctx);
        if recurrent && params.n_rs_seq > 0 && n_ubatch <= params.n_rs_seq.saturating_add(1) {
            // llama.cpp asserts `n_ubatch > n_rs_seq + 1` on the first decode
            // of a recurrent memory with rollback snapshots (an abort, not an error).
            return Err(NativeError::ContextInit(format!(
                "n_ubatch, n_batch and n_ctx (at most {n_ubatch} rows per pass) must exceed n_rs_seq + 1 ({}) \
                 for a recurrent or hybrid model",
                u64::from(params.n_rs_seq) + 1
            )));
        }
        // SAFETY: returns a plain struct of defaults.
        let mut raw_params = unsafe { sys::llama_context_default_params() };
        raw_params.n_ctx = n_ctx;
        raw_params.n_batch = params.n_batch;
        raw_params.n_ubatch = params.n_ubatch;
        raw_params.n_seq_max = params.n_seq_max;
        // One KV stream per sequence: a sequence's cells sit where they would
        // in a context of its own, so that attention over them (patch 0001's
        // fixed chunks of cells) has the same bits whatever shares the context.
        raw_params.kv_unified = false;
        raw_params.n_rs_seq = params.n_rs_seq;
        raw_params.ctx_type = match params.kind {
            ContextKind::Default => sys::LLAMA_CONTEXT_TYPE_DEFAULT,
            ContextKind::Mtp => sys::LLAMA_CONTEXT_TYPE_MTP,
        };
        let threads = resolved(params.n_threads);
        raw_params.n_threads = threads;
        raw_params.n_threads_batch = threads;
        raw_params.no_perf = true;
        raw_params.ctx_other = other.map_or(std::ptr::null_mut(), |context| context.raw.as_ptr());
        // SAFETY: the model is live and kept alive by the `Arc` this context
        // holds; `ctx_other`, when set, is a live context whose handle the
        // new one holds (below), so it outlives it.
        let raw = unsafe { sys::llama_init_from_model(model.raw(), raw_params) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            NativeError::ContextInit(format!(
                "llama.cpp refused the parameters {params:?} for model {}",
                model.path().display()
            ))
        })?;
        // SAFETY: the context is live; the handle below frees it before the pool (a field).
        let pool = unsafe { GraphPool::attached(threads, raw) };
        let handle = Arc::new(ContextHandle {
            raw,
            busy: Mutex::new(()),
            _model: Arc::clone(&model),
            other: other.map(|context| Arc::clone(&context.handle)),
            pool: Mutex::new(pool),
        });
        Ok(Self {
            raw,
            handle,
            model,
            params,
            n_threads: threads,
            decodes: 0,
            last_decoded: None,
        })
    }

    /// The model this context runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The parameters the context was created with.
    pub fn params(&self) -> &ContextParams {
        &self.params
    }

    pub(crate) fn raw(&self) -> *mut sys::llama_context {
        self.raw.as_ptr()
    }

    /// The handle that keeps the native context alive (for a session over it).
    pub(crate) fn handle(&self) -> &Arc<ContextHandle> {
        &self.handle
    }

    /// Context length in tokens.
    pub fn n_ctx(&self) -> u32 {
        // SAFETY: the context is live.
        unsafe { sys::llama_n_ctx(self.raw.as_ptr()) }
    }

    /// Context length of each sequence: [`Context::n_ctx`] divided among the
    /// sequences (each has its own KV stream; see [`Context::new`]).
    pub fn n_ctx_seq(&self) -> u32 {
        // SAFETY: the context is live.
        unsafe { sys::llama_n_ctx_seq(self.raw.as_ptr()) }
    }

    /// The capacities the contract's `validate_context_capacities` checks, read from llama.cpp.
    pub(crate) fn capacity(&self) -> SpeculativeContextCapacity {
        // SAFETY: the context is live; these are plain getters.
        let (batch, micro_batch, recurrent_slots) = unsafe {
            (
                sys::llama_n_batch(self.raw.as_ptr()),
                sys::llama_n_ubatch(self.raw.as_ptr()),
                sys::llama_n_rs_seq(self.raw.as_ptr()),
            )
        };
        SpeculativeContextCapacity {
            batch,
            micro_batch,
            recurrent_slots,
            recurrent_or_hybrid: self.model.is_recurrent() || self.model.is_hybrid(),
        }
    }

    /// Bytes llama.cpp allocated for this context, over every buffer type:
    /// its memory (KV cache, recurrent states and their rollback snapshots)
    /// and its compute buffers.
    pub fn allocated_bytes(&self) -> ContextBytes {
        const MAX_BUFFER_TYPES: usize = 16;
        let empty = sys::llama_memory_breakdown_entry {
            buft_name: [0; 128],
            model: 0,
            context: 0,
            compute: 0,
        };
        let mut entries = [empty; MAX_BUFFER_TYPES];
        // SAFETY: the context is live; the shim writes at most
        // `MAX_BUFFER_TYPES` entries into the array and returns how many.
        let written = unsafe {
            sys::llama_memory_breakdown_collect(
                self.raw.as_ptr(),
                entries.as_mut_ptr(),
                MAX_BUFFER_TYPES,
            )
        };
        entries[..written.min(MAX_BUFFER_TYPES)].iter().fold(
            ContextBytes::default(),
            |sum, entry| ContextBytes {
                memory: sum.memory.saturating_add(entry.context as u64),
                compute: sum.compute.saturating_add(entry.compute as u64),
            },
        )
    }

    /// The threads used for decoding (the resolved count, never 0).
    pub fn n_threads(&self) -> i32 {
        self.n_threads
    }

    /// Let the next graphs run with the threads the machine can give now of the context's own ([`threads_now`]);
    /// hold the guard while they run, so that other graphs of the process count them.
    pub(crate) fn fit_threads(&mut self) -> InFlight {
        let mut pool = self
            .handle
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the context is live and exclusively borrowed; the pool is its own.
        unsafe { fit_threads(self.raw, self.n_threads, &mut pool) }
    }

    /// Decode a batch. Runs llama.cpp's compute; call without the GIL.
    pub fn decode(&mut self, batch: &Batch) -> NativeResult<()> {
        if batch.is_empty() {
            return Err(NativeError::InvalidArgument(
                "cannot decode an empty batch".into(),
            ));
        }
        if batch.len() > self.capacity().batch as usize {
            return Err(NativeError::InvalidArgument(format!(
                "batch of {} rows exceeds the context's n_batch of {}",
                batch.len(),
                self.capacity().batch
            )));
        }
        self.decodes += 1;
        self.last_decoded = None;
        let _graph = self.fit_threads();
        let _changing = self.handle.hold();
        let _reading = self.handle.other.as_deref().map(ContextHandle::hold);
        // SAFETY: the context is live and exclusively borrowed; the batch's
        // arrays hold `n_tokens` valid rows (see `Batch::push`); the linked
        // context's memory, which the decode reads, is held unchanged.
        let status = unsafe { sys::llama_decode(self.raw.as_ptr(), *batch.raw()) };
        match status {
            0 => {
                self.last_decoded = Some(batch.stamp());
                Ok(())
            }
            status => Err(NativeError::Decode(status)),
        }
    }

    /// Decodes run on this context so far (failed ones included).
    pub fn decode_count(&self) -> u64 {
        self.decodes
    }

    /// Whether the last decode ran `batch`, as it is now, and succeeded.
    pub fn decoded_last(&self, batch: &Batch) -> bool {
        self.last_decoded == Some(batch.stamp())
    }

    /// The logits of output row `index` of the last decode (`n_vocab` floats).
    pub fn logits(&self, index: i32) -> NativeResult<&[f32]> {
        // SAFETY: the context is live; llama.cpp checks `index` and returns
        // null (after logging) for a row without output.
        let raw = unsafe { sys::llama_get_logits_ith(self.raw.as_ptr(), index) };
        if raw.is_null() {
            return Err(NativeError::InvalidArgument(format!(
                "no logits for output row {index}"
            )));
        }
        // SAFETY: llama.cpp's logits row has `n_vocab` floats and stays valid
        // until the next decode, which needs `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(raw, self.model.n_vocab()) })
    }

    /// Whether `seq_id` names one of this context's sequences (or, with
    /// `allow_all`, is -1 for all of them). llama.cpp asserts on others.
    fn valid_seq(&self, seq_id: i32, allow_all: bool) -> bool {
        (allow_all && seq_id == -1)
            || u32::try_from(seq_id).is_ok_and(|seq| seq < self.params.n_seq_max)
    }

    fn check_seq(&self, seq_id: i32) -> NativeResult<()> {
        if self.valid_seq(seq_id, false) {
            return Ok(());
        }
        Err(NativeError::InvalidArgument(format!(
            "sequence id {seq_id} is outside this context's {} sequences",
            self.params.n_seq_max
        )))
    }

    /// The highest position stored for `seq_id`, or -1 when empty.
    pub fn seq_pos_max(&self, seq_id: i32) -> NativeResult<i32> {
        self.check_seq(seq_id)?;
        Ok(self.seq_pos_max_unchecked(seq_id))
    }

    /// The lowest and highest positions stored for `seq_id`, `(-1, -1)` when empty.
    pub fn seq_positions(&self, seq_id: i32) -> NativeResult<(i32, i32)> {
        self.check_seq(seq_id)?;
        // SAFETY: the context and its memory are live; `seq_id` is valid.
        let min = unsafe {
            sys::llama_memory_seq_pos_min(sys::llama_get_memory(self.raw.as_ptr()), seq_id)
        };
        Ok((min, self.seq_pos_max_unchecked(seq_id)))
    }

    fn seq_pos_max_unchecked(&self, seq_id: i32) -> i32 {
        // SAFETY: the context and its memory are live.
        unsafe { sys::llama_memory_seq_pos_max(sys::llama_get_memory(self.raw.as_ptr()), seq_id) }
    }

    /// Remove positions `p0..p1` (`-1`: to the end) of `seq_id`; false if refused.
    pub fn seq_rm(&mut self, seq_id: i32, p0: i32, p1: i32) -> bool {
        if !self.valid_seq(seq_id, true) {
            return false;
        }
        let _changing = self.handle.hold();
        // SAFETY: the context and its memory are live and exclusively borrowed.
        unsafe {
            sys::llama_memory_seq_rm(sys::llama_get_memory(self.raw.as_ptr()), seq_id, p0, p1)
        }
    }

    /// Move the positions `p0..p1` of `seq_id` by `delta` (the keys rotated to
    /// their new positions at the next decode); false if refused: an invalid
    /// sequence, or a memory that cannot move positions.
    pub fn seq_shift(&mut self, seq_id: i32, p0: i32, p1: i32, delta: i32) -> bool {
        if !self.valid_seq(seq_id, false) || !self.can_shift() {
            return false;
        }
        let _changing = self.handle.hold();
        // SAFETY: the context and its memory are live and exclusively borrowed;
        // `seq_id` is one of its sequences.
        unsafe {
            sys::llama_memory_seq_add(
                sys::llama_get_memory(self.raw.as_ptr()),
                seq_id,
                p0,
                p1,
                delta,
            );
        }
        true
    }

    /// Whether this context's memory can move positions ([`Context::seq_shift`]).
    pub fn can_shift(&self) -> bool {
        // SAFETY: the context and its memory are live.
        unsafe { sys::llama_memory_can_shift(sys::llama_get_memory(self.raw.as_ptr())) }
    }

    /// Clear every sequence (KV cells and recurrent state).
    pub fn clear(&mut self) {
        let _changing = self.handle.hold();
        // SAFETY: the context and its memory are live and exclusively borrowed.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.raw.as_ptr()), true) };
    }

    /// The exact state of one sequence (its KV cells and recurrent state, no logits).
    pub fn seq_state(&mut self, seq_id: i32) -> NativeResult<Vec<u8>> {
        let mut state = super::zeroed_buffer(self.seq_state_size(seq_id)?);
        self.seq_state_into(seq_id, &mut state)?;
        Ok(state)
    }

    /// Bytes of one sequence's state (see [`Context::seq_state`]).
    pub fn seq_state_size(&mut self, seq_id: i32) -> NativeResult<usize> {
        self.check_seq(seq_id)?;
        // SAFETY: the context is live and exclusively borrowed; `seq_id` is valid.
        Ok(unsafe { sys::llama_state_seq_get_size(self.raw.as_ptr(), seq_id) })
    }

    /// Write one sequence's state into `out`, which must be exactly
    /// [`Context::seq_state_size`] bytes (no intermediate copy).
    pub fn seq_state_into(&mut self, seq_id: i32, out: &mut [u8]) -> NativeResult<()> {
        self.check_seq(seq_id)?;
        // SAFETY: `out` has `out.len()` writable bytes; llama.cpp writes at
        // most that many and returns how many it wrote (0 if too small).
        let written = unsafe {
            sys::llama_state_seq_get_data(self.raw.as_ptr(), out.as_mut_ptr(), out.len(), seq_id)
        };
        if written != out.len() {
            return Err(NativeError::SequenceState(format!(
                "sequence {seq_id} state is not {} bytes (llama.cpp wrote {written})",
                out.len()
            )));
        }
        Ok(())
    }

    /// Replace sequence `seq_id`'s state with `state` (from [`Context::seq_state`]).
    ///
    /// On failure llama.cpp has cleared the sequence; callers that must leave
    /// it unchanged capture it first and restore that copy. A recurrent or
    /// hybrid model's state is refused untouched if its recurrent part claims
    /// more than one cell (llama.cpp aborts on it in a context of two or more
    /// sequences), or if it is not laid out as such a state.
    pub fn set_seq_state(&mut self, seq_id: i32, state: &[u8]) -> NativeResult<()> {
        self.check_seq(seq_id)?;
        if state.is_empty() {
            return Err(NativeError::SequenceState(
                "an empty sequence state is not valid".into(),
            ));
        }
        if self.model.is_recurrent() || self.model.is_hybrid() {
            let memories = Memories {
                recurrent: self.model.is_recurrent(),
                hybrid: self.model.is_hybrid(),
                kind: self.params.kind,
            };
            check_recurrent_cells(state, memories).map_err(NativeError::SequenceState)?;
        }
        let _changing = self.handle.hold();
        // SAFETY: `state` is readable for `len` bytes; llama.cpp validates the
        // layout and returns 0 on failure.
        let read = unsafe {
            sys::llama_state_seq_set_data(self.raw.as_ptr(), state.as_ptr(), state.len(), seq_id)
        };
        if read == 0 {
            return Err(NativeError::SequenceState(format!(
                "the {}-byte state does not fit sequence {seq_id} of this context",
                state.len()
            )));
        }
        Ok(())
    }
}

/// Bytes of one recurrent state of `model` (one cell of each recurrent layer):
/// what each rollback snapshot of a context costs; 0 for a model without
/// recurrent layers. Measured once per model file (SHA-256) in a process, as
/// the difference between two minimal contexts with 0 and 1 snapshots.
pub fn recurrent_state_bytes(model: &Arc<Model>) -> NativeResult<u64> {
    static MEASURED: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());
    if !(model.is_recurrent() || model.is_hybrid()) {
        return Ok(0);
    }
    let key = &model.file_digest().0;
    let lock = || MEASURED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, bytes)) = lock().iter().find(|(sha256, _)| sha256 == key) {
        return Ok(*bytes);
    }
    let memory = |n_rs_seq| {
        let params = ContextParams {
            n_ctx: 3,
            n_batch: 3,
            n_ubatch: 3,
            n_seq_max: 1,
            n_rs_seq,
            kind: ContextKind::Default,
            n_threads: 1,
        };
        Context::new(Arc::clone(model), params).map(|context| context.allocated_bytes().memory)
    };
    let bytes = memory(1)?.saturating_sub(memory(0)?);
    lock().push((key.clone(), bytes));
    Ok(bytes)
}

/// An attention-only model's sequence state laid out again for sequence
/// `seq_id` of a context of `n_seq_max` sequences (a KV stream each): the
/// same cells, moved between a context of its own and a batch's.
pub fn restream_seq_state(state: &[u8], n_seq_max: u32, seq_id: i32) -> NativeResult<Vec<u8>> {
    let seq = u32::try_from(seq_id)
        .map_err(|_| NativeError::InvalidArgument(format!("sequence id {seq_id} is negative")))?;
    super::seq_state::restream(state, n_seq_max, seq).map_err(NativeError::SequenceState)
}

impl Context {
    /// Replace sequence `seq_id`'s state with `state`; on failure the previous
    /// state is put back, so the sequence is left exactly as it was.
    pub fn replace_seq_state(&mut self, seq_id: i32, state: &[u8]) -> NativeResult<()> {
        let previous = self.seq_state(seq_id)?;
        match self.set_seq_state(seq_id, state) {
            Ok(()) => Ok(()),
            Err(error) => {
                self.set_seq_state(seq_id, &previous)?;
                Err(error)
            }
        }
    }
}

// SAFETY: a llama.cpp context has no thread affinity; what it forbids is
// concurrent use. Every use goes through `&mut self` (or `&self` for reads
// that no `&mut` call can overlap), so moving it between threads is sound;
// a linked context reads this one's memory only under `ContextHandle::busy`,
// and a session reaches it only when given this `Context`.
unsafe impl Send for Context {}
