//! An owned speculative session of the `mtp_session_*` shim
//! (`mtp_session_new`/`mtp_session_free`), MTP or EAGLE-3.
//!
//! llama.cpp keeps pointers to the session's target and draft contexts: the
//! session holds their handles, so they outlive it, and every call that
//! reaches them takes them as arguments (checked to be the session's own),
//! so Rust's borrows keep anything else from using them meanwhile.

use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_4 as sys;

use super::context::ContextHandle;
use super::{Batch, Context};
use crate::limits::SettingError;
use crate::speculative::SessionState;

/// The status of a speculative-state call, as the shim reports it.
pub use sys::mtp_state_status as StateStatus;

/// Which draft strategy a session drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecType {
    /// Multi-token prediction: the draft context is the target model's own
    /// nextn head, in a context of kind `Mtp`.
    Mtp,
    /// EAGLE-3: the draft context runs a separate EAGLE-3 draft model.
    Eagle3,
}

impl SpecType {
    /// The strategy called `mtp` or `eagle3`.
    pub fn parse(name: &str) -> Result<Self, SettingError> {
        match name {
            "mtp" => Ok(Self::Mtp),
            "eagle3" => Ok(Self::Eagle3),
            _ => Err(SettingError {
                field: "spec_type",
                reason: format!("must be 'mtp' or 'eagle3', not {name:?}"),
            }),
        }
    }

    /// `mtp` or `eagle3`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mtp => "mtp",
            Self::Eagle3 => "eagle3",
        }
    }

    fn raw(self) -> i32 {
        match self {
            Self::Mtp => sys::MTP_SPEC_TYPE_MTP as i32,
            Self::Eagle3 => sys::MTP_SPEC_TYPE_EAGLE3 as i32,
        }
    }
}

/// A session's configuration (checked by the contract's `validate_config` first: `crate::session::DraftSession::new`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionConfig {
    /// Sequence slots.
    pub n_seq: u32,
    /// Most tokens one draft may propose.
    pub n_draft_max: i32,
    /// Fewest tokens a draft must have to be proposed.
    pub n_min: i32,
    /// Smallest draft-token probability kept.
    pub p_min: f32,
    /// The draft strategy.
    pub spec_type: SpecType,
}

/// A call was given contexts other than the ones its session was created over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the session was created over other target and draft contexts")]
pub struct OtherContexts;

/// A native speculative session over a target and a draft context.
pub struct SessionHandle {
    raw: NonNull<sys::mtp_session>,
    /// Most tokens one draft may propose (the shim's output bound).
    n_draft_max: i32,
    /// The target's handle, freed after the session (field order).
    target: Arc<ContextHandle>,
    /// The draft's handle, freed after the session (field order).
    draft: Arc<ContextHandle>,
}

// SAFETY: the native session has no thread affinity; every call that
// changes it goes through `&mut self`, every read through `&self` that no
// `&mut` call can overlap, and a call that reaches the contexts borrows them.
unsafe impl Send for SessionHandle {}

impl SessionHandle {
    /// The shim's session over `target` and `draft`, or `None` if llama.cpp
    /// could not create one (missing draft heads or target layers). The
    /// session keeps both contexts alive for as long as it lives.
    pub fn new(target: &mut Context, draft: &mut Context, config: SessionConfig) -> Option<Self> {
        let raw_config = sys::mtp_session_config {
            n_seq: config.n_seq,
            n_draft_max: config.n_draft_max,
            n_min: config.n_min,
            p_min: config.p_min,
            spec_type: config.spec_type.raw(),
        };
        // SAFETY: both contexts are live and exclusively borrowed (so two);
        // the session holds their handles (below), so they outlive it;
        // `raw_config` lives for the call; null means failure.
        let raw = unsafe { sys::mtp_session_new(target.raw(), draft.raw(), &raw const raw_config) };
        Some(Self {
            raw: NonNull::new(raw)?,
            n_draft_max: config.n_draft_max,
            target: Arc::clone(target.handle()),
            draft: Arc::clone(draft.handle()),
        })
    }

    /// Refuse contexts other than the session's own.
    fn check(&self, target: &Context, draft: &Context) -> Result<(), OtherContexts> {
        let own =
            Arc::ptr_eq(&self.target, target.handle()) && Arc::ptr_eq(&self.draft, draft.handle());
        own.then_some(()).ok_or(OtherContexts)
    }

    /// `mtp_session_begin`: start `seq_id` on `prompt`; false if the shim refused.
    pub fn begin(
        &mut self,
        target: &Context,
        draft: &mut Context,
        seq_id: i32,
        prompt: &[i32],
    ) -> Result<bool, OtherContexts> {
        self.check(target, draft)?;
        // SAFETY: the session and its contexts are live and borrowed for the
        // call; `prompt` is readable for `len` tokens during it.
        Ok(unsafe {
            sys::mtp_session_begin(self.raw.as_ptr(), seq_id, prompt.as_ptr(), prompt.len())
        })
    }

    /// `mtp_session_process`: the target has decoded `batch`; false if the shim failed.
    pub fn process(
        &mut self,
        target: &Context,
        draft: &mut Context,
        batch: &Batch,
    ) -> Result<bool, OtherContexts> {
        self.check(target, draft)?;
        let _graph = draft.fit_threads();
        // SAFETY: the session, its contexts and the batch are live and
        // borrowed for the call; the shim only reads the batch.
        Ok(unsafe { sys::mtp_session_process(self.raw.as_ptr(), batch.raw()) })
    }

    /// `mtp_session_draft`: up to `n_draft_max` tokens for `seq_id` after
    /// `id_last` at `n_past`, or `None` if the shim failed.
    pub fn draft(
        &mut self,
        target: &Context,
        draft: &mut Context,
        seq_id: i32,
        n_past: i32,
        id_last: i32,
    ) -> Result<Option<Vec<i32>>, OtherContexts> {
        self.check(target, draft)?;
        let _graph = draft.fit_threads();
        let capacity = self.n_draft_max;
        let mut tokens = vec![0_i32; usize::try_from(capacity).unwrap_or(0)];
        let mut written = capacity;
        // SAFETY: `tokens` has `capacity` writable slots and `written` says so
        // on entry, as the shim requires; the session and its contexts are
        // borrowed for the call.
        let ok = unsafe {
            sys::mtp_session_draft(
                self.raw.as_ptr(),
                seq_id,
                n_past,
                id_last,
                tokens.as_mut_ptr(),
                &raw mut written,
            )
        };
        tokens.truncate(usize::try_from(written).unwrap_or(0));
        Ok(ok.then_some(tokens))
    }

    /// `mtp_session_accept`: `count` tokens of `seq_id`'s proposal were
    /// verified; false if the shim refused.
    pub fn accept(
        &mut self,
        target: &Context,
        draft: &mut Context,
        seq_id: i32,
        count: u16,
    ) -> Result<bool, OtherContexts> {
        self.check(target, draft)?;
        // SAFETY: the session and its contexts are live and borrowed for the call.
        Ok(unsafe { sys::mtp_session_accept(self.raw.as_ptr(), seq_id, count) })
    }

    /// Whether no sequence has a pending proposal.
    pub fn is_quiescent(&self) -> bool {
        // SAFETY: the session is live; the shim only reads it.
        unsafe { sys::mtp_session_is_quiescent(self.raw.as_ptr()) }
    }

    /// Whether `seq_id` has a pending proposal.
    pub fn has_pending_proposal(&self, seq_id: i32) -> bool {
        // SAFETY: the session is live; the shim only reads it.
        unsafe { sys::mtp_session_has_pending_proposal(self.raw.as_ptr(), seq_id) }
    }

    /// Whether the target must keep post-norm embeddings.
    pub fn need_embd(&self) -> bool {
        // SAFETY: the session is live; the shim only reads it.
        unsafe { sys::mtp_session_need_embd(self.raw.as_ptr()) }
    }

    /// Whether the target must keep pre-norm hidden states.
    pub fn need_embd_pre_norm(&self) -> bool {
        // SAFETY: the session is live; the shim only reads it.
        unsafe { sys::mtp_session_need_embd_pre_norm(self.raw.as_ptr()) }
    }
}

/// The shim's state calls, through which the contract's capture and restore
/// protocol (`crate::speculative::capture_state`, `restore_state`) runs.
impl SessionState for SessionHandle {
    /// `mtp_session_state_size`: the status, and the bytes of `seq_id`'s state.
    fn state_size(&self, seq_id: i32) -> (StateStatus, usize) {
        let mut size = 0_usize;
        // SAFETY: the session is live and only read; `size` is a live output
        // for the duration of the synchronous call.
        let status =
            unsafe { sys::mtp_session_state_size(self.raw.as_ptr(), seq_id, &raw mut size) };
        (status, size)
    }

    /// `mtp_session_state_get` into `out`: the status, and the bytes written
    /// (on `MTP_STATE_STATUS_BUFFER_SMALL`: the bytes needed).
    fn state_get(&self, seq_id: i32, out: &mut [u8]) -> (StateStatus, usize) {
        let mut written = 0_usize;
        // SAFETY: `out` has exactly `out.len()` writable bytes and the session
        // is live and only read during the synchronous call.
        let status = unsafe {
            sys::mtp_session_state_get(
                self.raw.as_ptr(),
                seq_id,
                out.as_mut_ptr(),
                out.len(),
                &raw mut written,
            )
        };
        (status, written)
    }

    /// `mtp_session_state_set`: restore `seq_id`'s state from `state`.
    fn state_set(&mut self, seq_id: i32, state: &[u8]) -> StateStatus {
        // SAFETY: `state` remains live and immutable for the synchronous
        // call; the session is exclusively borrowed.
        unsafe {
            sys::mtp_session_state_set(self.raw.as_ptr(), seq_id, state.as_ptr(), state.len())
        }
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `mtp_session_new` and is freed once, while
        // the contexts it points to are alive (their handles are fields,
        // dropped after this).
        unsafe { sys::mtp_session_free(self.raw.as_ptr()) };
    }
}
