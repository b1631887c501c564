//! Speculative draft sessions over the `mtp_session_*` shim (MTP and EAGLE-3).
//!
//! The contract's validators run before any native allocation; state capture and
//! restore go through the contract's protocol (`speculative::capture_state` and
//! `speculative::restore_state`).

use crate::native::{Batch, Context, OtherContexts, SessionHandle};
use crate::speculative::{self, SpeculativeStateError, MAX_SPECULATIVE_PROMPT_TOKENS};

pub use crate::native::{SessionConfig, SpecType};

/// Failures of a session call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SessionError {
    /// The contract's `validate_config` refused the configuration.
    #[error("{0}")]
    Config(&'static str),
    /// The contract's `validate_context_capacities` refused the contexts.
    #[error("{0}")]
    Capacity(&'static str),
    /// The contexts do not fit the strategy (kinds, models, sequence slots).
    #[error("{0}")]
    Incompatible(String),
    /// A call out of order or with bad arguments (the message says which).
    #[error("{0}")]
    Usage(String),
    /// The sequence id is outside the session's range.
    #[error("sequence id {seq_id} is outside the session's {n_seq} sequences")]
    BadSequence {
        /// The id given.
        seq_id: i32,
        /// Sequences the session has.
        n_seq: u32,
    },
    /// llama.cpp reported a failure in a session call.
    #[error("{0}")]
    Native(String),
    /// Speculative state capture or restore failed.
    #[error(transparent)]
    State(#[from] SpeculativeStateError),
}

/// A speculative session over a target and a draft context
/// ([`SessionHandle`], which keeps both alive): its calls that reach the
/// contexts take them, the ones it was created over.
pub struct DraftSession {
    native: SessionHandle,
    config: SessionConfig,
    /// Tokens proposed by the pending draft of each sequence (0: none pending).
    proposed: Vec<usize>,
    drafted: u64,
    accepted: u64,
    /// Whether the target model is recurrent or hybrid.
    target_recurrent: bool,
    /// The target's decode count when the session was created: only batches
    /// decoded after it carry the hidden states the session extracts.
    created_at_decode: u64,
    /// Rows the draft context decodes at once: the most a processed batch may hold.
    draft_rows: usize,
    /// Tokens in the target's vocabulary (llama.cpp aborts on ids outside it).
    n_vocab: usize,
}

/// A session's target and draft are two contexts. Rust's borrows guarantee
/// it to [`DraftSession::new`]; a caller that holds contexts by shared
/// handles (the Python bindings) checks with this before borrowing both.
pub fn check_distinct<T>(target: &T, draft: &T) -> Result<(), SessionError> {
    if std::ptr::eq(target, draft) {
        return Err(SessionError::Incompatible(
            "the target and draft contexts must be two different contexts".into(),
        ));
    }
    Ok(())
}

fn check_contexts(
    target: &Context,
    draft: &Context,
    config: &SessionConfig,
) -> Result<(), SessionError> {
    use crate::native::ContextKind;
    let (expected_kind, same_model) = match config.spec_type {
        SpecType::Mtp => (ContextKind::Mtp, true),
        SpecType::Eagle3 => (ContextKind::Default, false),
    };
    if target.params().kind != ContextKind::Default {
        return Err(SessionError::Incompatible(
            "the target context must be of kind 'default'".into(),
        ));
    }
    if draft.params().kind != expected_kind {
        return Err(SessionError::Incompatible(format!(
            "the draft context of a {:?} session must be of kind '{}'",
            config.spec_type,
            expected_kind.name()
        )));
    }
    let shares_model = std::sync::Arc::ptr_eq(target.model(), draft.model());
    if same_model && !shares_model {
        return Err(SessionError::Incompatible(
            "an MTP draft context must be created from the target's own model".into(),
        ));
    }
    if same_model && target.model().n_layer_nextn() < 1 {
        return Err(SessionError::Incompatible(
            "the model has no MTP (nextn) layer".into(),
        ));
    }
    if !same_model && shares_model {
        return Err(SessionError::Incompatible(
            "an EAGLE-3 draft context must run a separate EAGLE-3 draft model".into(),
        ));
    }
    if !same_model && target.model().n_vocab() != draft.model().n_vocab() {
        return Err(SessionError::Incompatible(format!(
            "the target has {} tokens and the draft {}: vocabularies differ",
            target.model().n_vocab(),
            draft.model().n_vocab()
        )));
    }
    if !same_model {
        let target_width = i64::from(target.model().n_embd());
        let expected = draft.model().metadata_value("eagle3.target_hidden_size");
        if let Some(width) = expected
            .as_deref()
            .and_then(|w| w.trim().parse::<i64>().ok())
        {
            if width != target_width {
                return Err(SessionError::Incompatible(format!(
                    "the EAGLE-3 draft reads {width}-wide target hidden states, the target's are {target_width}"
                )));
            }
        }
    }
    for (name, context) in [("target", target), ("draft", draft)] {
        if context.params().n_seq_max < config.n_seq {
            return Err(SessionError::Incompatible(format!(
                "the {name} context holds {} sequences, fewer than n_seq={}",
                context.params().n_seq_max,
                config.n_seq
            )));
        }
    }
    Ok(())
}

impl DraftSession {
    /// Validate `config` and both contexts, then create the native session.
    pub fn new(
        target: &mut Context,
        draft: &mut Context,
        config: SessionConfig,
    ) -> Result<Self, SessionError> {
        speculative::validate_config(config.n_seq, config.n_draft_max, config.n_min, config.p_min)
            .map_err(SessionError::Config)?;
        let maximum = u32::try_from(config.n_draft_max)
            .map_err(|_| SessionError::Config("n_draft_max is outside the supported bound"))?;
        speculative::validate_context_capacities(target.capacity(), draft.capacity(), maximum)
            .map_err(SessionError::Capacity)?;
        check_contexts(target, draft, &config)?;
        let native = SessionHandle::new(target, draft, config).ok_or_else(|| {
            SessionError::Incompatible(format!(
                "llama.cpp could not create a {:?} session for these contexts (missing draft heads or target layers)",
                config.spec_type
            ))
        })?;
        Ok(Self {
            native,
            config,
            proposed: vec![0; config.n_seq as usize],
            drafted: 0,
            accepted: 0,
            target_recurrent: target.capacity().recurrent_or_hybrid,
            created_at_decode: target.decode_count(),
            draft_rows: draft.capacity().batch as usize,
            n_vocab: target.model().n_vocab(),
        })
    }

    /// Whether the native state is complete for this strategy and target.
    ///
    /// llama.cpp's EAGLE-3 state carries the deferred boundary row (the
    /// target's hidden state at the last accepted position) only for
    /// recurrent or hybrid targets; for a transformer target it is empty, and
    /// a session restored from it cannot draft again. Report that as the
    /// seed's `Unavailable` instead of handing out an incomplete state.
    fn state_is_complete(&self) -> bool {
        self.config.spec_type != SpecType::Eagle3 || self.target_recurrent
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn slot(&self, seq_id: i32) -> Result<usize, SessionError> {
        usize::try_from(seq_id)
            .ok()
            .filter(|slot| *slot < self.proposed.len())
            .ok_or(SessionError::BadSequence {
                seq_id,
                n_seq: self.config.n_seq,
            })
    }

    fn check_tokens(&self, tokens: &[i32]) -> Result<(), SessionError> {
        crate::native::check_vocabulary(tokens, self.n_vocab)
            .map_err(|error| SessionError::Usage(error.to_string()))
    }

    /// Start a generation on `seq_id` whose `prompt` was decoded into the target.
    pub fn begin(
        &mut self,
        target: &Context,
        draft: &mut Context,
        seq_id: i32,
        prompt: &[i32],
    ) -> Result<(), SessionError> {
        let slot = self.slot(seq_id)?;
        self.check_tokens(prompt)?;
        if prompt.len() > MAX_SPECULATIVE_PROMPT_TOKENS {
            return Err(SessionError::Usage(format!(
                "the prompt has {} tokens, more than MAX_SPECULATIVE_PROMPT_TOKENS ({MAX_SPECULATIVE_PROMPT_TOKENS})",
                prompt.len()
            )));
        }
        if self.proposed[slot] > 0 {
            return Err(SessionError::Usage(
                "cannot begin while a proposal is pending; accept it first".into(),
            ));
        }
        let ok = self.native.begin(target, draft, seq_id, prompt)?;
        ok.then_some(())
            .ok_or_else(|| SessionError::Native("mtp_session_begin failed".into()))
    }

    /// Refuse a batch of more `rows` than the draft context decodes at once
    /// (the session processes every target batch in the draft context too):
    /// checked by [`DraftSession::process`], and before a target decode
    /// whose batch the session will process.
    pub fn check_rows(&self, rows: usize) -> Result<(), SessionError> {
        if rows > self.draft_rows {
            return Err(SessionError::Usage(format!(
                "a batch of {rows} rows exceeds the draft context's n_batch of {}",
                self.draft_rows
            )));
        }
        Ok(())
    }

    /// Tell the session about `batch`, which `target` decoded last, after the
    /// session was created (checked first, so llama.cpp never reads hidden
    /// states it never extracted): the order for a caller that does not run
    /// the decodes itself.
    pub fn process_decoded(
        &mut self,
        target: &Context,
        draft: &mut Context,
        batch: &Batch,
    ) -> Result<(), SessionError> {
        if target.decode_count() <= self.created_at_decode || !target.decoded_last(batch) {
            return Err(SessionError::Usage(
                "process() takes the batch the target decoded last, after the session was created"
                    .into(),
            ));
        }
        self.process(target, draft, batch)
    }

    /// Tell the session about `batch`, which was just decoded on the target
    /// (see [`DraftSession::process_decoded`] for a caller that cannot be sure).
    pub fn process(
        &mut self,
        target: &Context,
        draft: &mut Context,
        batch: &Batch,
    ) -> Result<(), SessionError> {
        self.check_rows(batch.len())?;
        let ok = self.native.process(target, draft, batch)?;
        ok.then_some(())
            .ok_or_else(|| SessionError::Native("mtp_session_process failed".into()))
    }

    /// Draft up to `n_draft_max` tokens for `seq_id` after `id_last` at `n_past`.
    pub fn draft(
        &mut self,
        target: &Context,
        draft: &mut Context,
        seq_id: i32,
        n_past: i32,
        id_last: i32,
    ) -> Result<Vec<i32>, SessionError> {
        let slot = self.slot(seq_id)?;
        self.check_tokens(&[id_last])?;
        if n_past < 0 {
            return Err(SessionError::Usage(format!(
                "n_past must not be negative, got {n_past}"
            )));
        }
        if self.proposed[slot] > 0 {
            return Err(SessionError::Usage(
                "a proposal is already pending for this sequence; accept it before drafting again"
                    .into(),
            ));
        }
        let Some(tokens) = self.native.draft(target, draft, seq_id, n_past, id_last)? else {
            return Err(SessionError::Native("mtp_session_draft failed".into()));
        };
        self.proposed[slot] = tokens.len();
        self.drafted += tokens.len() as u64;
        Ok(tokens)
    }

    /// Complete the pending proposal of `seq_id`: `n_accepted` of its tokens were verified.
    pub fn accept(
        &mut self,
        target: &Context,
        draft: &mut Context,
        seq_id: i32,
        n_accepted: usize,
    ) -> Result<(), SessionError> {
        let slot = self.slot(seq_id)?;
        let proposed = self.proposed[slot];
        if proposed == 0 {
            return Err(SessionError::Usage(
                "there is no pending proposal to accept".into(),
            ));
        }
        if n_accepted > proposed {
            return Err(SessionError::Usage(format!(
                "cannot accept {n_accepted} tokens of a {proposed}-token proposal"
            )));
        }
        // `proposed <= n_draft_max <= 4096`, so the count fits u16.
        let count = u16::try_from(n_accepted)
            .map_err(|_| SessionError::Usage("n_accepted exceeds u16".into()))?;
        if !self.native.accept(target, draft, seq_id, count)? {
            return Err(SessionError::Native("mtp_session_accept failed".into()));
        }
        self.proposed[slot] = 0;
        self.accepted += n_accepted as u64;
        Ok(())
    }

    /// Whether no sequence has a pending proposal.
    pub fn is_quiescent(&self) -> bool {
        self.native.is_quiescent()
    }

    /// Whether `seq_id` has a pending proposal.
    pub fn has_pending_proposal(&self, seq_id: i32) -> Result<bool, SessionError> {
        self.slot(seq_id)?;
        Ok(self.native.has_pending_proposal(seq_id))
    }

    /// Whether the target must keep post-norm embeddings.
    pub fn need_embd(&self) -> bool {
        self.native.need_embd()
    }

    /// Whether the target must keep pre-norm hidden states.
    pub fn need_embd_pre_norm(&self) -> bool {
        self.native.need_embd_pre_norm()
    }

    /// Tokens drafted so far.
    pub fn drafted(&self) -> u64 {
        self.drafted
    }

    /// Drafted tokens accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// The exact speculative state of `seq_id` (quiescent sessions only).
    pub fn state(&self, seq_id: i32) -> Result<Vec<u8>, SpeculativeStateError> {
        let state = speculative::capture_state(&self.native, seq_id)?;
        if !self.state_is_complete() {
            return Err(SpeculativeStateError::Unavailable);
        }
        Ok(state)
    }

    /// Restore `seq_id`'s speculative state; invalid bytes leave it unchanged.
    pub fn restore(&mut self, seq_id: i32, state: &[u8]) -> Result<(), SpeculativeStateError> {
        speculative::restore_state(&mut self.native, seq_id, state)
    }
}

impl From<OtherContexts> for SessionError {
    fn from(error: OtherContexts) -> Self {
        Self::Usage(error.to_string())
    }
}

/// What a speculative state says about the generation it was taken from,
/// read from the pinned shim's `LLSPEC1` blob (version 1: an 8-byte magic,
/// nine `u32` header fields, the prompt's tokens, then the implementation's
/// state). Used only to check a restored state against the generation; the
/// shim itself validates the header against the session.
#[derive(Debug, PartialEq, Eq)]
pub struct SpeculativeStateView<'a> {
    /// The prompt the session was begun with.
    pub prompt: Vec<i32>,
    /// The implementation's own state (EAGLE-3: the boundary position, then a row).
    pub implementation: &'a [u8],
}

impl<'a> SpeculativeStateView<'a> {
    const MAGIC: &'static [u8; 8] = b"LLSPEC1\0";
    const HEADER: usize = 8 + 9 * 4;

    /// Read `blob`, or `None` if it is not laid out as the shim writes it.
    pub fn parse(blob: &'a [u8]) -> Option<Self> {
        if blob.len() < Self::HEADER || &blob[..8] != Self::MAGIC {
            return None;
        }
        let word = |index: usize| {
            let at = 8 + 4 * index;
            u32::from_le_bytes(blob[at..at + 4].try_into().expect("4 bytes"))
        };
        let (prompt_count, implementation_size) = (word(7) as usize, word(8) as usize);
        let prompt_end = prompt_count
            .checked_mul(4)
            .and_then(|bytes| bytes.checked_add(Self::HEADER))
            .filter(|end| *end <= blob.len() && blob.len() - end == implementation_size)?;
        let prompt = blob[Self::HEADER..prompt_end]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Some(Self {
            prompt,
            implementation: &blob[prompt_end..],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_types_parse_by_name_and_the_contexts_must_be_two() {
        for spec_type in [SpecType::Mtp, SpecType::Eagle3] {
            assert_eq!(SpecType::parse(spec_type.name()), Ok(spec_type));
        }
        assert_eq!(
            SpecType::parse("medusa").unwrap_err().to_string(),
            "spec_type must be 'mtp' or 'eagle3', not \"medusa\""
        );
        let (one, two) = (1, 1);
        assert!(check_distinct(&one, &two).is_ok());
        assert_eq!(
            check_distinct(&one, &one).unwrap_err(),
            SessionError::Incompatible(
                "the target and draft contexts must be two different contexts".into()
            )
        );
    }
}
