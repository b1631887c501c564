//! One generator over a target model in five modes under one exactness
//! contract: `none` (plain decoding), `ngram` (prompt lookup), `draft` (a
//! separate same-vocabulary draft model), `mtp` and `eagle3` (llama.cpp's
//! speculative sessions).
//!
//! A generation advances in rounds. Between rounds it is at a quiescent
//! boundary: the target context holds positions `0..n_past` of the history,
//! `history[n_past]` is the last committed token (not yet decoded), and the
//! draft side (draft context, speculative session) is quiescent. The
//! [`GeneratorState`] plus the contexts' sequence states and the speculative
//! state is a complete, exact checkpoint.

pub mod ngram;

use std::sync::Arc;

use crate::native::{Batch, Context, ContextKind, ContextParams, Model, NativeError};
use crate::sampling::{self, Distribution, Rng, SamplingParams};
use crate::session::{DraftSession, SessionConfig, SessionError, SpecType, SpeculativeStateView};
use ngram::NgramConfig;

/// The five ways of drafting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Plain decoding: no drafts.
    None,
    /// Prompt lookup over the history.
    Ngram(NgramConfig),
    /// A separate draft model with the same vocabulary.
    Draft,
    /// The target's own multi-token-prediction head.
    Mtp,
    /// A separate EAGLE-3 draft model.
    Eagle3,
}

impl Mode {
    /// The mode's name: `none`, `ngram`, `draft`, `mtp`, `eagle3`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ngram(_) => "ngram",
            Self::Draft => "draft",
            Self::Mtp => "mtp",
            Self::Eagle3 => "eagle3",
        }
    }

    /// Whether the mode needs a separate draft model.
    pub fn needs_draft_model(&self) -> bool {
        matches!(self, Self::Draft | Self::Eagle3)
    }
}

/// Everything that decides what a generation computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorConfig {
    /// How drafts are made.
    pub mode: Mode,
    /// Most tokens drafted per round (ignored by `none`).
    pub n_draft: u32,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// Context length of the target (and draft) context.
    pub n_ctx: u32,
    /// Rows per decode call (and per processed batch).
    pub n_batch: u32,
}

/// A generator setting outside its range: the setting's name and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct SettingError {
    /// The setting (`n_ctx`, `n_batch`, `n_draft`, `temperature`, ...).
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

fn setting(field: &'static str, reason: String) -> std::result::Result<(), SettingError> {
    Err(SettingError { field, reason })
}

impl GeneratorConfig {
    /// Check every setting that does not depend on a model: the one rule for
    /// the constructor, checkpoints and the CLI. (The context length's upper
    /// bound, the model's trained length, is checked against the model.)
    pub fn validate(&self) -> std::result::Result<(), SettingError> {
        let max_draft = crate::speculative::MAX_SPECULATIVE_DRAFT_TOKENS as u32;
        let max_rows = u32::try_from(crate::native::MAX_BATCH_ROWS).unwrap_or(u32::MAX);
        if self.n_ctx < 2 {
            return setting("n_ctx", format!("must be at least 2, not {}", self.n_ctx));
        }
        if self.n_batch == 0 || self.n_batch > self.n_ctx.min(max_rows) {
            let most = self.n_ctx.min(max_rows);
            return setting(
                "n_batch",
                format!("must be between 1 and {most}, not {}", self.n_batch),
            );
        }
        if self.n_draft > max_draft {
            return setting(
                "n_draft",
                format!("must be at most {max_draft}, not {}", self.n_draft),
            );
        }
        let speculative = !matches!(self.mode, Mode::None);
        if speculative && (self.n_draft == 0 || self.n_draft >= self.n_batch) {
            return setting(
                "n_draft",
                format!(
                    "must be between 1 and n_batch - 1 ({}), not {}",
                    self.n_batch - 1,
                    self.n_draft
                ),
            );
        }
        if let Mode::Ngram(ngram) = self.mode {
            ngram.validate()?;
        }
        self.sampling.validate()
    }
}

/// Threads are a runtime choice, not part of what is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RuntimeOptions {
    /// Threads per context (0: the CPUs available).
    pub n_threads: i32,
}

impl RuntimeOptions {
    /// Check the thread count against ggml's maximum.
    pub fn validate(&self) -> std::result::Result<(), SettingError> {
        let most = crate::native::MAX_THREADS;
        if (0..=most).contains(&self.n_threads) {
            return Ok(());
        }
        setting(
            "n_threads",
            format!(
                "must be between 0 (the CPUs available) and {most}, not {}",
                self.n_threads
            ),
        )
    }
}

/// Where a generation stands at a round boundary (everything but the contexts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratorState {
    /// Prompt and committed tokens; the last one is not yet in the target's memory.
    pub history: Vec<i32>,
    /// Prompt tokens at the start of `history`.
    pub n_prompt: usize,
    /// Tokens in the target's memory (`history[..n_past]`).
    pub n_past: usize,
    /// Tokens of `history` decoded in the draft context (`draft` mode).
    pub draft_past: usize,
    /// Generated tokens handed out so far; committed tokens beyond them wait
    /// in `history` (a round may commit more than a caller asked for).
    pub delivered: usize,
    /// The RNG state.
    pub rng: [u64; 4],
    /// Whether an end-of-generation token was committed.
    pub finished: bool,
    /// Rounds run.
    pub rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
}

/// Failures of a generator call.
#[derive(Debug, thiserror::Error)]
pub enum GeneratorError {
    /// Bad configuration or arguments.
    #[error("{0}")]
    Invalid(String),
    /// The call does not fit the generator's state.
    #[error("{0}")]
    Usage(String),
    /// A native failure.
    #[error(transparent)]
    Native(#[from] NativeError),
    /// A speculative session failure.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A checkpoint was refused.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
}

impl From<SettingError> for GeneratorError {
    fn from(error: SettingError) -> Self {
        Self::Invalid(error.to_string())
    }
}

type Result<T> = std::result::Result<T, GeneratorError>;

/// `draft` mode stops drafting when the draft model's most likely next token
/// has less than this probability (softmax of its raw logits).
pub const DRAFT_CONFIDENCE: f64 = 0.5;

/// A generation over a target model (and, by mode, a draft model or session).
pub struct Generator {
    // Field order is drop order: the session points into both contexts, and an
    // EAGLE-3 draft context into the target context.
    session: Option<DraftSession>,
    draft: Option<Context>,
    target: Context,
    batch: Batch,
    draft_batch: Option<Batch>,
    config: GeneratorConfig,
    state: GeneratorState,
    rng: Rng,
}

fn context_params(
    model: &Model,
    config: &GeneratorConfig,
    runtime: RuntimeOptions,
    kind: ContextKind,
) -> ContextParams {
    let recurrent = model.is_recurrent() || model.is_hybrid();
    let speculative = !matches!(config.mode, Mode::None);
    // Rollback of rejected drafts needs recurrent snapshots (seed: slots >= n_draft).
    let n_rs_seq = if recurrent && speculative {
        config.n_draft.max(1)
    } else {
        0
    };
    // llama.cpp needs room for the snapshots in every compute pass; the
    // generator itself never decodes more than `config.n_batch` rows at once.
    let n_rows = config.n_batch.max(n_rs_seq + 2);
    ContextParams {
        n_ctx: config.n_ctx,
        n_batch: n_rows,
        n_ubatch: n_rows,
        n_seq_max: 1,
        n_rs_seq,
        kind,
        n_threads: runtime.n_threads,
    }
}

impl Generator {
    /// Build the contexts (and session) that `config.mode` needs.
    pub fn new(
        target_model: Arc<Model>,
        draft_model: Option<Arc<Model>>,
        config: GeneratorConfig,
        runtime: RuntimeOptions,
    ) -> Result<Self> {
        // The context length against the model's trained length, and the
        // thread count, are checked by `Context::new` before it allocates.
        config.validate()?;
        match (config.mode.needs_draft_model(), &draft_model) {
            (true, None) => {
                return Err(GeneratorError::Invalid(format!(
                    "mode '{}' needs a draft model",
                    config.mode.name()
                )))
            }
            (false, Some(_)) => {
                return Err(GeneratorError::Invalid(format!(
                    "mode '{}' takes no draft model",
                    config.mode.name()
                )))
            }
            _ => {}
        }
        if let (Mode::Draft, Some(draft)) = (config.mode, &draft_model) {
            if draft.n_vocab() != target_model.n_vocab() {
                return Err(GeneratorError::Invalid(format!(
                    "the draft model has {} tokens and the target {}: vocabularies differ",
                    draft.n_vocab(),
                    target_model.n_vocab()
                )));
            }
        }
        let mut target = Context::new(
            Arc::clone(&target_model),
            context_params(&target_model, &config, runtime, ContextKind::Default),
        )?;
        let mut draft = match (config.mode, draft_model) {
            (Mode::Mtp, _) => Some(Context::new(
                Arc::clone(&target_model),
                context_params(&target_model, &config, runtime, ContextKind::Mtp),
            )?),
            (Mode::Eagle3, Some(model)) => {
                let params = context_params(&model, &config, runtime, ContextKind::Default);
                // SAFETY: the generator owns both contexts and drops the draft
                // context before the target (field order), so `target` outlives it.
                Some(unsafe { Context::with_other(model, params, &target)? })
            }
            (Mode::Draft, Some(model)) => {
                let params = context_params(&model, &config, runtime, ContextKind::Default);
                Some(Context::new(model, params)?)
            }
            _ => None,
        };
        let session = match (config.mode, draft.as_mut()) {
            (Mode::Mtp | Mode::Eagle3, Some(draft_context)) => {
                let spec_type = if config.mode == Mode::Mtp {
                    SpecType::Mtp
                } else {
                    SpecType::Eagle3
                };
                let session_config = SessionConfig {
                    n_seq: 1,
                    n_draft_max: config.n_draft as i32,
                    n_min: 0,
                    p_min: 0.0,
                    spec_type,
                };
                // SAFETY: the generator owns both contexts and drops the
                // session first (field order); llama.cpp's contexts live on
                // the heap, so moving the `Context` values does not move them.
                Some(unsafe { DraftSession::new(&mut target, draft_context, session_config)? })
            }
            _ => None,
        };
        let batch = Batch::new(config.n_batch as usize)?;
        let draft_batch = match config.mode {
            Mode::Draft => Some(Batch::new(config.n_batch as usize)?),
            _ => None,
        };
        let rng = Rng::new(config.sampling.seed);
        Ok(Self {
            session,
            draft,
            target,
            batch,
            draft_batch,
            config,
            state: GeneratorState {
                history: Vec::new(),
                n_prompt: 0,
                n_past: 0,
                draft_past: 0,
                delivered: 0,
                rng: rng.state(),
                finished: false,
                rounds: 0,
                drafted: 0,
                accepted: 0,
            },
            rng,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GeneratorConfig {
        &self.config
    }

    /// The state at the current boundary.
    pub fn state(&self) -> &GeneratorState {
        &self.state
    }

    /// The target model.
    pub fn target_model(&self) -> &Arc<Model> {
        self.target.model()
    }

    /// The draft model (`draft` and `eagle3` modes).
    pub fn draft_model(&self) -> Option<&Arc<Model>> {
        match self.config.mode {
            Mode::Draft | Mode::Eagle3 => self.draft.as_ref().map(Context::model),
            _ => None,
        }
    }

    /// The target context's real length (llama.cpp may round `n_ctx` up).
    pub fn context_length(&self) -> usize {
        self.target.n_ctx() as usize
    }

    /// Whether the prompt has been decoded.
    pub fn started(&self) -> bool {
        !self.state.history.is_empty()
    }

    fn choose(&mut self, logits_row: i32) -> Result<i32> {
        let logits = self.target.logits(logits_row)?;
        Ok(if self.config.sampling.is_greedy() {
            sampling::argmax(logits)
        } else {
            sampling::sample(
                &sampling::distribution(logits, &self.config.sampling),
                &mut self.rng,
            )
        })
    }

    /// Decode `prompt` and commit the first generated token; returns it.
    pub fn prefill(&mut self, prompt: &[i32]) -> Result<i32> {
        if self.started() {
            return Err(GeneratorError::Usage(
                "the generator already has a prompt".into(),
            ));
        }
        if prompt.is_empty() {
            return Err(GeneratorError::Invalid("the prompt is empty".into()));
        }
        if prompt.len() >= self.target.n_ctx() as usize {
            return Err(GeneratorError::Invalid(format!(
                "the prompt has {} tokens; the context holds {}",
                prompt.len(),
                self.target.n_ctx()
            )));
        }
        if let Some(token) = prompt
            .iter()
            .find(|t| !self.target.model().is_valid_token(**t))
        {
            return Err(GeneratorError::Invalid(format!(
                "token {token} is outside the vocabulary"
            )));
        }
        let chunk = self.config.n_batch as usize;
        for (index, piece) in prompt.chunks(chunk).enumerate() {
            self.batch.fill(piece, position(index * chunk)?, 0, false)?;
            self.target.decode(&self.batch)?;
            if let Some(session) = self.session.as_mut() {
                session.process(&self.batch)?;
            }
        }
        if let Some(session) = self.session.as_mut() {
            session.begin(0, prompt)?;
        }
        let first = self.choose(-1)?;
        self.state.history = prompt.to_vec();
        self.state.history.push(first);
        self.state.n_prompt = prompt.len();
        self.state.n_past = prompt.len();
        self.state.finished = self.target.model().is_eog(first);
        self.state.delivered = 0;
        self.state.rng = self.rng.state();
        Ok(first)
    }

    /// Committed tokens not yet handed out.
    pub fn undelivered(&self) -> usize {
        self.state
            .history
            .len()
            .saturating_sub(self.state.n_prompt + self.state.delivered)
    }

    /// Hand out up to `max_n` generated tokens, running a round when none are
    /// waiting. Empty once finished (or the context is full) and all are out.
    ///
    /// Rounds never depend on `max_n`: how a generation is split into calls
    /// does not change what it generates.
    pub fn take(&mut self, max_n: usize) -> Result<Vec<i32>> {
        if !self.started() {
            return Err(GeneratorError::Usage("call prefill() first".into()));
        }
        if max_n == 0 {
            return Ok(Vec::new());
        }
        if self.undelivered() == 0 {
            self.round()?;
        }
        let start = self.state.n_prompt + self.state.delivered;
        let n = self.undelivered().min(max_n);
        self.state.delivered += n;
        Ok(self.state.history[start..start + n].to_vec())
    }

    /// Run one round: draft, verify in one target batch, accept, roll back.
    /// Commits nothing once finished or when the context is full.
    fn round(&mut self) -> Result<()> {
        let room = (self.target.n_ctx() as usize).saturating_sub(self.state.n_past + 1);
        if self.state.finished || room == 0 {
            return Ok(());
        }
        let n_past = self.state.n_past;
        let id_last = *self.state.history.last().expect("started");
        // A round commits accepted drafts plus one token: bound the draft so
        // that the context does not overflow.
        let limit = (room - 1).min(self.config.n_draft as usize);
        let (mut proposal, draft_dists) = self.make_draft(n_past, id_last, limit)?;
        proposal.truncate(limit);
        let mut rows = Vec::with_capacity(proposal.len() + 1);
        rows.push(id_last);
        rows.extend_from_slice(&proposal);
        self.batch.fill(&rows, position(n_past)?, 0, true)?;
        let verified = self
            .target
            .decode(&self.batch)
            .map_err(GeneratorError::from)
            .and_then(|()| {
                if let Some(session) = self.session.as_mut() {
                    session.process(&self.batch)?;
                }
                Ok(())
            });
        if let Err(error) = verified {
            self.abandon_proposal()?;
            return Err(error);
        }
        let target = &self.target;
        let logits_rows: Vec<&[f32]> = (0..rows.len())
            .map(|i| target.logits(i as i32))
            .collect::<std::result::Result<_, _>>()?;
        let verdict = sampling::verify(
            |i| logits_rows[i],
            &proposal,
            draft_dists.as_deref(),
            &self.config.sampling,
            &mut self.rng,
        );
        let mut committed: Vec<i32> = proposal[..verdict.accepted].to_vec();
        committed.push(verdict.next);
        // Stop at an end-of-generation token: what follows it is not committed.
        let mut accepted = verdict.accepted;
        if let Some(end) = committed
            .iter()
            .position(|t| self.target.model().is_eog(*t))
        {
            committed.truncate(end + 1);
            accepted = accepted.min(end);
            self.state.finished = true;
        }
        self.finish_round(n_past, proposal.len(), accepted)?;
        self.state.history.extend_from_slice(&committed);
        self.state.n_past = n_past + accepted + 1;
        self.state.rounds += 1;
        self.state.drafted += proposal.len() as u64;
        self.state.accepted += accepted as u64;
        self.state.rng = self.rng.state();
        Ok(())
    }

    /// The draft of this round and, in `draft` mode, the draft's distributions.
    fn make_draft(
        &mut self,
        n_past: usize,
        id_last: i32,
        limit: usize,
    ) -> Result<(Vec<i32>, Option<Vec<Distribution>>)> {
        if limit == 0 {
            return Ok((Vec::new(), None));
        }
        match self.config.mode {
            Mode::None => Ok((Vec::new(), None)),
            Mode::Ngram(config) => Ok((ngram::propose(&self.state.history, config, limit), None)),
            Mode::Mtp | Mode::Eagle3 => {
                let session = self
                    .session
                    .as_mut()
                    .expect("speculative modes have a session");
                let proposal = session.draft(0, n_past as i32, id_last)?;
                // The draft context holds the drafted positions; the verify batch goes at n_past.
                if let Some(draft) = self.draft.as_mut() {
                    draft.seq_rm(0, n_past as i32, -1);
                }
                Ok((proposal, None))
            }
            Mode::Draft => self
                .draft_with_model(limit)
                .map(|(tokens, dists)| (tokens, Some(dists))),
        }
    }

    /// Autoregressive drafting on the draft model, after catching its context
    /// up with the history (the last token included).
    fn draft_with_model(&mut self, limit: usize) -> Result<(Vec<i32>, Vec<Distribution>)> {
        let draft = self.draft.as_mut().expect("draft mode has a draft context");
        let batch = self
            .draft_batch
            .as_mut()
            .expect("draft mode has a draft batch");
        let history = &self.state.history;
        let chunk = batch.capacity();
        let mut pos = self.state.draft_past;
        while pos < history.len() {
            let end = (pos + chunk).min(history.len());
            batch.fill(&history[pos..end], position(pos)?, 0, false)?;
            draft.decode(batch)?;
            pos = end;
        }
        let mut tokens = Vec::with_capacity(limit);
        let mut dists = Vec::with_capacity(limit);
        loop {
            let logits = draft.logits(-1)?;
            // Stop where the draft model is unsure of its next token: such
            // drafts are rarely accepted and each costs a draft decode and a
            // verified row. (A policy that depends only on the draft keeps
            // rejection sampling exact.)
            if sampling::top_probability(logits) < DRAFT_CONFIDENCE {
                break;
            }
            let (token, dist) = if self.config.sampling.is_greedy() {
                let token = sampling::argmax(logits);
                (token, vec![(token, 1.0)])
            } else {
                let dist = sampling::distribution(logits, &self.config.sampling);
                (sampling::sample(&dist, &mut self.rng), dist)
            };
            tokens.push(token);
            dists.push(dist);
            if tokens.len() == limit {
                break;
            }
            batch.fill(&[token], position(pos)?, 0, false)?;
            draft.decode(batch)?;
            pos += 1;
        }
        self.state.draft_past = pos;
        Ok((tokens, dists))
    }

    /// Complete the session's proposal and roll back what was not accepted.
    fn finish_round(&mut self, n_past: usize, proposed: usize, accepted: usize) -> Result<()> {
        if let Some(session) = self.session.as_mut() {
            if session.has_pending_proposal(0)? {
                session.accept(0, accepted)?;
            }
        }
        let keep = n_past + accepted + 1;
        if accepted < proposed && !self.target.seq_rm(0, keep as i32, -1) {
            return Err(GeneratorError::Usage(format!(
                "the target could not roll back to position {keep}"
            )));
        }
        if let Some(draft) = self.draft.as_mut() {
            draft.seq_rm(0, keep as i32, -1);
        }
        self.state.draft_past = self.state.draft_past.min(keep);
        Ok(())
    }

    /// After a failed verification, leave the session quiescent again.
    fn abandon_proposal(&mut self) -> Result<()> {
        if let Some(session) = self.session.as_mut() {
            if session.has_pending_proposal(0)? {
                session.accept(0, 0)?;
            }
        }
        Ok(())
    }

    /// Bytes of the target context's sequence state.
    pub fn target_state_size(&mut self) -> Result<usize> {
        Ok(self.target.seq_state_size(0)?)
    }

    /// Write the target context's sequence state into `out` (exactly its size).
    pub fn write_target_state(&mut self, out: &mut [u8]) -> Result<()> {
        Ok(self.target.seq_state_into(0, out)?)
    }

    /// Bytes of the draft context's sequence state (`draft`, `mtp`, `eagle3` modes).
    pub fn draft_state_size(&mut self) -> Result<Option<usize>> {
        Ok(self
            .draft
            .as_mut()
            .map(|draft| draft.seq_state_size(0))
            .transpose()?)
    }

    /// Write the draft context's sequence state into `out` (exactly its size).
    pub fn write_draft_state(&mut self, out: &mut [u8]) -> Result<()> {
        let draft = self
            .draft
            .as_mut()
            .ok_or_else(|| GeneratorError::Usage("this mode has no draft context".into()))?;
        Ok(draft.seq_state_into(0, out)?)
    }

    /// The speculative state (`mtp`, `eagle3` modes).
    pub fn speculative_state(&self) -> Result<Option<Vec<u8>>> {
        self.session
            .as_ref()
            .map(|session| session.state(0))
            .transpose()
            .map_err(|error| GeneratorError::Session(SessionError::State(error)))
    }

    /// Everything at the current boundary, as owned copies (to put back with [`Generator::restore`]).
    pub fn boundary(&mut self) -> Result<Boundary> {
        Ok(Boundary {
            state: self.state.clone(),
            target_state: self.target.seq_state(0)?,
            draft_state: self
                .draft
                .as_mut()
                .map(|draft| draft.seq_state(0))
                .transpose()?,
            speculative_state: self
                .session
                .as_ref()
                .map(|session| session.state(0))
                .transpose()
                .map_err(|error| GeneratorError::Session(SessionError::State(error)))?,
        })
    }

    /// Put a captured boundary back: state, contexts and speculative state.
    /// The state is checked against the model and, once the contexts' states
    /// are in, against the positions they hold. On failure the generator must
    /// be discarded or given its previous boundary back (as
    /// `checkpoint::load_into` does).
    pub fn restore(
        &mut self,
        state: GeneratorState,
        target_state: &[u8],
        draft_state: Option<&[u8]>,
        speculative_state: Option<&[u8]>,
    ) -> std::result::Result<(), RestoreError> {
        let rng = Rng::from_state(state.rng)
            .ok_or_else(|| RestoreError::new("state", "the RNG state is all zero"))?;
        self.check_state(&state)?;
        // Start from empty memories: a refused state may have left cells that
        // removing the sequence does not reach (llama.cpp's `seq_rm` skips
        // negative positions), and a restore must not depend on what was there.
        self.target.clear();
        if let Some(draft) = self.draft.as_mut() {
            draft.clear();
        }
        self.target
            .set_seq_state(0, target_state)
            .map_err(|e| RestoreError::new("target_state", e))?;
        match (self.draft.as_mut(), draft_state) {
            (Some(draft), Some(bytes)) => draft
                .set_seq_state(0, bytes)
                .map_err(|e| RestoreError::new("draft_state", e))?,
            (None, None) => {}
            _ => return Err(RestoreError::new("draft_state", "does not fit this mode")),
        }
        if let Some(bytes) = speculative_state {
            check_speculative_state(self.config.mode, &state, bytes)?;
        }
        match (self.session.as_mut(), speculative_state) {
            (Some(session), Some(bytes)) => session
                .restore(0, bytes)
                .map_err(|e| RestoreError::new("speculative_state", e))?,
            (None, None) => {}
            _ => {
                return Err(RestoreError::new(
                    "speculative_state",
                    "does not fit this mode",
                ));
            }
        }
        self.check_positions(&state)?;
        self.rng = rng;
        self.state = state;
        Ok(())
    }

    /// What can be checked of a state against the model and the context
    /// before any native state is touched.
    fn check_state(&self, state: &GeneratorState) -> std::result::Result<(), RestoreError> {
        let model = self.target.model();
        if let Some(token) = state.history.iter().find(|t| !model.is_valid_token(**t)) {
            // llama.cpp's drafters abort on such ids: refuse them here.
            return Err(RestoreError::new(
                "tokens",
                format!("token {token} of the history is outside the target's vocabulary"),
            ));
        }
        if state.history.len() > self.context_length() {
            return Err(RestoreError::new(
                "tokens",
                format!(
                    "the history of {} tokens exceeds the context of {}",
                    state.history.len(),
                    self.context_length()
                ),
            ));
        }
        let last_ends = state.history.last().is_some_and(|t| model.is_eog(*t));
        if state.finished != last_ends {
            return Err(RestoreError::new(
                "state",
                "the finished flag does not match the last committed token",
            ));
        }
        Ok(())
    }

    /// The positions the contexts hold must be those the state says: ending
    /// at `n_past - 1` in the target, at `draft_past - 1` in a `draft` context.
    fn check_positions(&self, state: &GeneratorState) -> std::result::Result<(), RestoreError> {
        let target_last = last_position(state.n_past);
        expect_positions(&self.target, "target_state", target_last..=target_last)?;
        let draft_last = match self.config.mode {
            Mode::Draft => last_position(state.draft_past)..=last_position(state.draft_past),
            // An MTP or EAGLE-3 draft context ends one or two positions before
            // the target's `n_past` (EAGLE-3 may not have drafted from the last one yet).
            Mode::Mtp | Mode::Eagle3 => target_last - 1..=target_last,
            Mode::None | Mode::Ngram(_) => return Ok(()),
        };
        match self.draft.as_ref() {
            Some(draft) => expect_positions(draft, "draft_state", draft_last),
            None => Ok(()),
        }
    }

    /// The lowest and highest positions of sequence 0 in the target context
    /// and, where the mode has one, in the draft context (`-1` when empty).
    pub fn memory_positions(&self) -> Result<(Positions, Option<Positions>)> {
        let draft = self
            .draft
            .as_ref()
            .map(|d| d.seq_positions(0))
            .transpose()?;
        Ok((self.target.seq_positions(0)?, draft))
    }
}

/// A speculative state must have been taken from this generation: begun
/// with its prompt and, for EAGLE-3, holding the row of its last position.
fn check_speculative_state(
    mode: Mode,
    state: &GeneratorState,
    blob: &[u8],
) -> std::result::Result<(), RestoreError> {
    let part = "speculative_state";
    if state.history.is_empty() {
        return Ok(());
    }
    let view = SpeculativeStateView::parse(blob)
        .ok_or_else(|| RestoreError::new(part, "not laid out as the pinned shim writes it"))?;
    if view.prompt != state.history[..state.n_prompt] {
        return Err(RestoreError::new(part, "was begun with another prompt"));
    }
    let boundary = view
        .implementation
        .get(..4)
        .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")));
    let last = last_position(state.n_past);
    if mode == Mode::Eagle3 && boundary.map(i64::from) != Some(last) {
        return Err(RestoreError::new(
            part,
            format!("holds the row of position {boundary:?}, not of the last position {last}"),
        ));
    }
    Ok(())
}

/// The lowest and highest positions a sequence holds (`(-1, -1)` when empty).
pub type Positions = (i32, i32);

/// The part of a boundary that could not be put back, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{part}: {reason}")]
pub struct RestoreError {
    /// `state`, `tokens`, `target_state`, `draft_state` or `speculative_state`.
    pub part: &'static str,
    /// Why it was refused.
    pub reason: String,
}

impl RestoreError {
    fn new(part: &'static str, reason: impl ToString) -> Self {
        Self {
            part,
            reason: reason.to_string(),
        }
    }
}

/// Refuse a context whose sequence 0 does not hold positions from its start
/// up to a last position in `last`; `-1` is an empty sequence. The lowest
/// position is 0 for an attention memory; a recurrent or hybrid memory
/// reports its last one.
fn expect_positions(
    context: &Context,
    part: &'static str,
    last: std::ops::RangeInclusive<i64>,
) -> std::result::Result<(), RestoreError> {
    let (min, max) = context
        .seq_positions(0)
        .map_err(|e| RestoreError::new(part, e))?;
    let starts_right = (min, max) == (-1, -1) || (0..=max).contains(&min);
    if starts_right && last.contains(&i64::from(max)) {
        return Ok(());
    }
    Err(RestoreError::new(
        part,
        format!(
            "holds positions {min}..={max}, but the state says its last one is in {}..={}",
            last.start(),
            last.end()
        ),
    ))
}

/// `count - 1` as a position (`-1` for none).
fn last_position(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX) - 1
}

/// A generator's boundary as owned copies.
pub struct Boundary {
    /// Positions, history, counters, RNG.
    pub state: GeneratorState,
    /// The target context's sequence state.
    pub target_state: Vec<u8>,
    /// The draft context's sequence state.
    pub draft_state: Option<Vec<u8>>,
    /// The speculative state.
    pub speculative_state: Option<Vec<u8>>,
}

/// A history index as a llama.cpp position.
fn position(index: usize) -> Result<i32> {
    i32::try_from(index)
        .map_err(|_| GeneratorError::Invalid(format!("position {index} overflows i32")))
}
