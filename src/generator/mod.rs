//! One generator over a target model in five modes under one exactness
//! contract: `none` (plain decoding), `ngram` (prompt lookup), `draft` (a
//! separate same-vocabulary draft model), `mtp` and `eagle3` (llama.cpp's
//! speculative sessions). Rounds are the engine's ([`crate::engine`]); the
//! generator owns the contexts, the drafter's parts and the state between rounds.
//!
//! Between rounds a generation is at a quiescent boundary: the target context
//! holds positions `0..n_past` of the history, `history[n_past]` is the last
//! committed token (not yet decoded), and the draft side (draft context,
//! speculative session) is quiescent. The [`GeneratorState`] plus the
//! contexts' sequence states and the speculative state is a complete, exact
//! checkpoint.

mod build;
mod member;
pub(crate) mod multi_sequence;
mod restore;
pub(crate) mod shared_engine;
mod target;

use std::sync::Arc;

pub(crate) use build::{new_member, rollback_snapshots};
pub(crate) use member::{history_drafter, Member};
pub use multi_sequence::EngineShape;
pub use restore::{Boundary, Positions, RestoreError};
pub use shared_engine::{SharedEngine, SharedStats};
pub(crate) use target::Target;

use crate::chat::Conversation;
use crate::engine::corpus::LookupCorpus;
pub use crate::engine::LogprobLog;
use crate::engine::{
    AdaptiveState, Cursor, DraftModelDrafter, Drafter, Engine, Round, SessionDrafter,
};
use crate::limits::SettingError;
use crate::native::Grammar;
use crate::native::{Batch, Context, Model};
use crate::sampling::{GrammarState, Rng};
use crate::session::DraftSession;
use crate::settings::{GeneratorConfig, Mode, SamplingParams};
use crate::{Error, Result};
use multi_sequence::{history_engine, member_engine};

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
    /// The adaptive draft length's state (`adaptive` configurations, once
    /// the cost curve is measured or pinned).
    pub adaptive: Option<AdaptiveState>,
}

impl GeneratorState {
    /// The state of a generation with no prompt yet.
    pub(crate) fn empty(rng: [u64; 4]) -> Self {
        Self {
            history: Vec::new(),
            n_prompt: 0,
            n_past: 0,
            draft_past: 0,
            delivered: 0,
            rng,
            finished: false,
            rounds: 0,
            drafted: 0,
            accepted: 0,
            adaptive: None,
        }
    }

    /// The tokens of the current reply: those generated after the prompt or the latest turn.
    pub fn reply(&self) -> &[i32] {
        &self.history[self.n_prompt.min(self.history.len())..]
    }

    /// Add a round's outcome.
    fn apply(&mut self, round: &Round) {
        self.history.extend_from_slice(&round.committed);
        self.n_past = round.n_past;
        self.finished = round.finished;
        self.rounds += 1;
        self.drafted += round.drafted as u64;
        self.accepted += round.accepted as u64;
    }
}

/// The grammar of `params` compiled for `model`'s vocabulary, at the start of a reply.
fn compiled_grammar(
    model: &Arc<Model>,
    params: &SamplingParams,
) -> std::result::Result<Option<GrammarState>, SettingError> {
    let Some(text) = &params.grammar else {
        return Ok(None);
    };
    let grammar = Grammar::new(model, text).map_err(|reason| SettingError {
        field: "grammar",
        reason,
    })?;
    Ok(Some(GrammarState::new(grammar)))
}

/// What a generator drafts with beside its target, one variant per kind of
/// drafter (built by [`Generator::new`] for its mode).
enum DraftParts {
    /// `none` and `ngram` modes: the history alone.
    History,
    /// `draft` mode: the draft model's context and the batch it decodes through.
    Model {
        /// The draft model's context.
        context: Context,
        /// The batch the draft context decodes through.
        batch: Batch,
    },
    /// `mtp` and `eagle3` modes: a session over the target and its draft context.
    Session {
        /// The session (which keeps both contexts alive).
        session: DraftSession,
        /// The session's draft context.
        context: Context,
    },
}

impl DraftParts {
    /// The draft context (`draft`, `mtp`, `eagle3` modes).
    fn context(&self) -> Option<&Context> {
        match self {
            Self::History => None,
            Self::Model { context, .. } | Self::Session { context, .. } => Some(context),
        }
    }

    /// The draft context, to change (`draft`, `mtp`, `eagle3` modes).
    fn context_mut(&mut self) -> Option<&mut Context> {
        match self {
            Self::History => None,
            Self::Model { context, .. } | Self::Session { context, .. } => Some(context),
        }
    }

    /// The session (`mtp`, `eagle3` modes).
    fn session(&self) -> Option<&DraftSession> {
        match self {
            Self::Session { session, .. } => Some(session),
            _ => None,
        }
    }

    /// The session, to change (`mtp`, `eagle3` modes).
    fn session_mut(&mut self) -> Option<&mut DraftSession> {
        match self {
            Self::Session { session, .. } => Some(session),
            _ => None,
        }
    }
}

/// A generation over a target model (and, by mode, a draft model or session).
pub struct Generator {
    target: Target,
    batch: Batch,
    /// The drafter's parts, by mode.
    parts: DraftParts,
    /// The generation itself, on sequence 0 of `target`.
    member: Member,
}

impl Generator {
    /// The configuration.
    pub fn config(&self) -> &GeneratorConfig {
        &self.member.config
    }

    /// Change how the following tokens are chosen, checked (against the
    /// target's vocabulary too) before anything changes. The RNG goes on
    /// where it is, or starts again from the new seed when the seed changes.
    ///
    /// A grammar constrains the reply: the tokens generated after the prompt
    /// or the latest turn. One set in the middle of a reply follows the reply
    /// so far at the next round (which fails, changing nothing, if the reply
    /// does not follow it); a new turn starts it again.
    pub fn set_sampling(&mut self, params: SamplingParams) -> Result<()> {
        let grammar = self.check_sampling(&params)?;
        if params.seed != self.member.sampler.params.seed {
            self.member.sampler.rng = Rng::new(params.seed);
            self.member.state.rng = self.member.sampler.rng.state();
        }
        self.put_sampling(params, grammar);
        Ok(())
    }

    /// Check sampling parameters for this generator: their ranges, the
    /// logit bias's tokens against the target's vocabulary, and the grammar,
    /// which is compiled for it and returned (at the start of a reply).
    pub fn check_sampling(
        &self,
        params: &SamplingParams,
    ) -> std::result::Result<Option<GrammarState>, SettingError> {
        params.validate()?;
        params.check_vocabulary(self.target.model().n_vocab())?;
        compiled_grammar(self.target.model(), params)
    }

    /// Use checked `params` and their compiled grammar from now on, the RNG
    /// going on where it is (a restored boundary brings its own).
    pub(crate) fn put_sampling(&mut self, params: SamplingParams, grammar: Option<GrammarState>) {
        self.member.sampler.params = params.clone();
        self.member.sampler.grammar = grammar;
        self.member.config.sampling = params;
    }

    /// Let prompt lookup copy from `corpus` besides the history (`None`: the
    /// history alone). Only `ngram` mode looks up; other modes refuse one.
    pub fn set_lookup_corpus(&mut self, corpus: Option<Arc<LookupCorpus>>) -> Result<()> {
        if corpus.is_some() {
            crate::engine::corpus::check_mode(self.member.config.mode.name())
                .map_err(Error::Invalid)?;
        }
        self.member.corpus = corpus;
        Ok(())
    }

    /// The corpus prompt lookup copies from besides the history, if any.
    pub fn lookup_corpus(&self) -> Option<&Arc<LookupCorpus>> {
        self.member.corpus.as_ref()
    }

    /// On a shared engine, keep this generation's exact cells under `key`
    /// when it gives its sequence back, and let its prompt reuse only the
    /// cells kept under the same key (`None`: keep none, reuse none). A key
    /// of more than [`shared_engine::MAX_REUSE_KEY_BYTES`] bytes is refused.
    pub fn set_reuse_key(&mut self, key: Option<&str>) -> Result<()> {
        if let Some(key) = key.filter(|key| key.len() > shared_engine::MAX_REUSE_KEY_BYTES) {
            return Err(Error::Invalid(format!(
                "a reuse key may have at most {} bytes, not {}",
                shared_engine::MAX_REUSE_KEY_BYTES,
                key.len()
            )));
        }
        self.member.reuse_key = key.map(Arc::from);
        Ok(())
    }

    /// The key of the cells this generation keeps and reuses (see
    /// [`Generator::set_reuse_key`]).
    pub fn reuse_key(&self) -> Option<&str> {
        self.member.reuse_key.as_deref()
    }

    /// Record the log-probability of every token committed from now on, with
    /// its `top_n` most likely alternatives (`None`: stop recording). Asking
    /// again for the same `top_n` keeps the records.
    pub fn set_logprobs(&mut self, top_n: Option<usize>) -> Result<()> {
        let most = crate::sampling::MAX_TOP_LOGPROBS;
        match top_n {
            Some(n) if n > most => Err(Error::Invalid(format!(
                "top_logprobs must be from 0 to {most}, not {n}"
            ))),
            Some(n)
                if self
                    .member
                    .logprobs
                    .as_ref()
                    .is_some_and(|log| log.top_n == n) =>
            {
                Ok(())
            }
            Some(n) => {
                self.member.logprobs = Some(LogprobLog::new(n, self.member.state.reply().len()));
                Ok(())
            }
            None => {
                self.member.logprobs = None;
                Ok(())
            }
        }
    }

    /// The log-probability records kept (see [`Generator::set_logprobs`]).
    pub fn logprobs(&self) -> Option<&LogprobLog> {
        self.member.logprobs.as_ref()
    }

    /// Follow the reply so far with the grammar (a restored boundary's reply).
    pub(crate) fn follow_grammar(&mut self) -> std::result::Result<(), crate::native::NativeError> {
        self.member.follow_grammar()
    }

    /// Keep `log` (a restored boundary's records).
    pub(crate) fn put_logprobs(&mut self, log: Option<LogprobLog>) {
        self.member.logprobs = log;
    }

    /// The state at the current boundary.
    pub fn state(&self) -> &GeneratorState {
        &self.member.state
    }

    /// The target model.
    pub fn target_model(&self) -> &Arc<Model> {
        self.target.model()
    }

    /// The draft model (`draft` and `eagle3` modes).
    pub fn draft_model(&self) -> Option<&Arc<Model>> {
        match self.member.config.mode {
            Mode::Draft | Mode::Eagle3 => self.parts.context().map(Context::model),
            _ => None,
        }
    }

    /// Whether rounds under a grammar draft the tokens it forces.
    pub fn grammar_drafts(&self) -> bool {
        self.member.grammar_drafts
    }

    /// Draft the tokens a grammar forces (`true`) or not, from the next
    /// round on: a runtime choice, the reply being the same either way.
    pub fn set_grammar_drafts(&mut self, on: bool) {
        self.member.grammar_drafts = on;
    }

    /// The threads the contexts decode with (resolved: never 0).
    pub fn n_threads(&self) -> u32 {
        u32::try_from(self.target.n_threads()).unwrap_or(1)
    }

    /// The target context's real length (llama.cpp may round `n_ctx` up).
    pub fn context_length(&self) -> usize {
        self.target.n_ctx() as usize
    }

    /// Whether the prompt has been decoded.
    pub fn started(&self) -> bool {
        self.member.started()
    }

    /// Run `call` on the engine over this generator's target and its mode's
    /// drafter, at the current boundary.
    fn with_engine<T>(
        &mut self,
        call: impl FnOnce(&mut Engine<'_>, Cursor<'_>) -> Result<T>,
    ) -> Result<T> {
        let Self {
            target,
            batch,
            parts,
            member,
        } = self;
        match target {
            Target::Own(context) => member_engine(context, batch, parts, member, 0, call),
            Target::Shared(attached) => {
                let mut shared = attached.settle();
                history_engine(&mut shared.target, member, batch, attached.seq(), call)
            }
            Target::Released(_) => Err(target::released_error()),
        }
    }

    /// Run `call` on the target context (its own, or the shared one under its
    /// lock), this generator's batch and member, and its sequence id.
    fn on_target<T>(
        &mut self,
        call: impl FnOnce(&mut Context, &mut Batch, &mut Member, i32) -> Result<T>,
    ) -> Result<T> {
        let Self {
            target,
            batch,
            member,
            ..
        } = self;
        match target {
            Target::Own(context) => call(context, batch, member, 0),
            Target::Shared(attached) => {
                let mut shared = attached.settle();
                call(&mut shared.target, batch, member, attached.seq())
            }
            Target::Released(_) => Err(target::released_error()),
        }
    }

    /// Decode `prompt` and commit the first generated token; returns it.
    pub fn prefill(&mut self, prompt: &[i32]) -> Result<i32> {
        if self.started() {
            return Err(Error::Usage("the generator already has a prompt".into()));
        }
        let kept = self.reuse_prefix(prompt)?;
        let draft_share = self.draft_share();
        self.on_target(|target, batch, member, seq| {
            member.prepare_cost_curve(target, batch, seq, prompt, draft_share)?;
            member.new_reply()
        })?;
        let first = match &mut self.target {
            Target::Shared(attached) => {
                prefill_shared(attached, &mut self.batch, &mut self.member, prompt, kept)?
            }
            _ => self.with_engine(|engine, _| engine.prefill_after(prompt, kept))?,
        };
        self.member.state.history = prompt.to_vec();
        self.commit_first(first);
        Ok(first)
    }

    /// What one decode of the draft model costs against one of the target,
    /// until timed: its share of the target's weights, which a decode reads
    /// once each (`None` without a draft model).
    fn draft_share(&self) -> Option<f64> {
        let DraftParts::Model { context, .. } = &self.parts else {
            return None;
        };
        let target = self.target.model().size_bytes().max(1);
        Some(context.model().size_bytes() as f64 / target as f64)
    }

    /// On a shared engine, before `prompt`: the tokens of it whose exact
    /// cells an earlier generation of the same reuse key left (this
    /// generator moving onto that sequence), when this generation's own
    /// decodes are exact too and it need not time its cost curve first;
    /// else 0 (its sequence empty).
    fn reuse_prefix(&mut self, prompt: &[i32]) -> Result<usize> {
        let Target::Shared(attached) = &mut self.target else {
            return Ok(0);
        };
        let member = &self.member;
        let Some(key) = member.reuse_key.as_deref() else {
            return Ok(0);
        };
        if !member.config.decodes_exactly() || member.times_cost_curve() {
            return Ok(0);
        }
        attached.reuse(prompt, key)
    }

    /// Pin the cost curve of an adaptive generation before its prompt
    /// (`cost_us[r - 1]`: microseconds to decode `r` rows, `r` in `1..=n_draft + 1`),
    /// so that it is not measured: two generations pinned alike choose alike.
    pub fn pin_cost_curve(&mut self, cost_us: Vec<u32>) -> Result<()> {
        if !self.member.config.adaptive {
            return Err(Error::Invalid(
                "cost_curve: only an adaptive draft policy uses a cost curve".into(),
            ));
        }
        if self.started() {
            return Err(Error::Usage(
                "cost_curve: the generation has started; its curve is set".into(),
            ));
        }
        let state = AdaptiveState::new(cost_us);
        state
            .validate(self.member.config.n_draft)
            .map_err(|e| Error::Invalid(format!("cost_curve: {e}")))?;
        self.member.state.adaptive = Some(state);
        Ok(())
    }

    /// The whole history is now a decoded prompt: commit the first token after it.
    fn commit_first(&mut self, first: i32) {
        let end = self.target.model().is_eog(first);
        self.member.commit_first(first, end);
    }

    /// Continue with a new turn: `tokens` (a user's next message, say) are
    /// decoded after every committed token, and the first token after them
    /// is committed and returned.
    ///
    /// Committed tokens not yet handed out stay part of the history (a
    /// caller that must end exactly where it stopped takes with
    /// [`Generator::take_within`]). The history up to the new turn becomes the
    /// prompt of what follows: `n_prompt` moves to its end, and the rounds,
    /// drafted, accepted and delivered counters start again from zero.
    pub fn extend(&mut self, tokens: &[i32]) -> Result<i32> {
        if !self.started() {
            return Err(Error::Usage("call prefill() first".into()));
        }
        self.member.new_reply()?;
        let first = self.with_engine(|engine, at| engine.extend(at, tokens))?;
        self.member.state.history.extend_from_slice(tokens);
        self.commit_first(first);
        Ok(first)
    }

    /// The conversation that led to the current reply, if this generation is a chat.
    pub fn conversation(&self) -> Option<&Conversation> {
        self.member.conversation.as_ref()
    }

    /// Record (or clear) the conversation that led to the current reply; it
    /// travels in checkpoints.
    pub fn set_conversation(
        &mut self,
        conversation: Option<Conversation>,
    ) -> std::result::Result<(), crate::chat::ChatError> {
        if let Some(conversation) = &conversation {
            conversation.validate()?;
        }
        self.member.conversation = conversation;
        Ok(())
    }

    /// Committed tokens not yet handed out.
    pub fn undelivered(&self) -> usize {
        self.member.undelivered()
    }

    /// Hand out up to `max_n` generated tokens, running a round when none are
    /// waiting. Empty once finished (or the context is full) and all are out.
    ///
    /// Rounds never depend on `max_n`: how a generation is split into calls
    /// does not change what it generates.
    pub fn take(&mut self, max_n: usize) -> Result<Vec<i32>> {
        self.take_rounds(max_n, usize::MAX)
    }

    /// [`Generator::take`], where a round run for this call commits at most
    /// `max_n` tokens, so that nothing is committed beyond what is handed
    /// out. The rounds then depend on `max_n` (a chat reply, whose length is
    /// part of the conversation, ends exactly at its budget this way).
    pub fn take_within(&mut self, max_n: usize) -> Result<Vec<i32>> {
        self.take_rounds(max_n, max_n)
    }

    /// Up to `max_n` tokens, where a round run for this call commits at most
    /// `max_commit` (a caller that hands tokens out one at a time, to stop
    /// between any two, still bounds the round by its whole budget).
    pub fn take_rounds(&mut self, max_n: usize, max_commit: usize) -> Result<Vec<i32>> {
        if !self.started() {
            return Err(Error::Usage("call prefill() first".into()));
        }
        if max_n == 0 {
            return Ok(Vec::new());
        }
        if self.undelivered() == 0 {
            self.round(max_commit)?;
        }
        Ok(self.member.deliver(max_n))
    }

    /// Run one round of the engine and add it to the state; a round that
    /// commits nothing (finished, or a full context) leaves the state as it is.
    fn round(&mut self, max_commit: usize) -> Result<()> {
        self.follow_grammar()?;
        let round = match &self.target {
            Target::Shared(attached) => attached.engine().round(
                attached.seq(),
                &mut self.member,
                &mut self.batch,
                max_commit,
            )?,
            Target::Own(_) => self.with_engine(|engine, at| engine.round_within(at, max_commit))?,
            Target::Released(_) => return Err(target::released_error()),
        };
        self.member.apply(&round);
        Ok(())
    }
}

/// [`Engine::prefill_after`] on a shared engine: the prompt's chunks (after
/// the `kept` tokens) are decoded on the engine's decoder thread, beside
/// other sequences' rows when they fit, then the first token is chosen.
fn prefill_shared(
    attached: &shared_engine::Attached,
    batch: &mut Batch,
    member: &mut Member,
    prompt: &[i32],
    kept: usize,
) -> Result<i32> {
    let (engine, seq) = (attached.engine(), attached.seq());
    {
        let mut shared = attached.settle();
        history_engine(&mut shared.target, member, batch, seq, |engine, _| {
            engine.check_prompt(prompt)
        })?;
    }
    let rest = prompt.get(kept..).unwrap_or_default();
    let rows = crate::limits::prompt_chunk_rows(member.config.n_batch as usize);
    let chunks: Vec<&[i32]> = rest.chunks(rows).collect();
    let Some((last, before)) = chunks.split_last() else {
        return Err(crate::engine::nothing_to_decode(kept, prompt.len()));
    };
    let mut start = kept;
    for piece in before {
        let (mut shared, _) = engine.decode_prompt_chunk(seq, piece, start)?;
        engine.done_reading(&mut shared, seq);
        start += piece.len();
    }
    let (mut shared, row) = engine.decode_prompt_chunk(seq, last, start)?;
    let first = history_engine(&mut shared.target, member, batch, seq, |engine, _| {
        engine.begin_after_prompt(prompt, row)
    });
    engine.done_reading(&mut shared, seq);
    first
}

/// A generator dropped on a shared engine gives its sequence back as
/// [`Generator::release_sequence`] does, its exact cells kept for a later prompt.
impl Drop for Generator {
    fn drop(&mut self) {
        self.release_sequence();
    }
}

/// The drafter of `mode` over a generator's draft parts: the draft model's or
/// the session's in the modes that have them, the history's otherwise.
fn parts_drafter<'a>(
    config: &GeneratorConfig,
    parts: &'a mut DraftParts,
    draft_past: &'a mut usize,
    n_prompt: usize,
    corpus: &Option<Arc<LookupCorpus>>,
) -> Result<Box<dyn Drafter + 'a>> {
    let n_draft = config.n_draft as usize;
    Ok(match (config.mode, parts) {
        (Mode::Draft | Mode::Mtp | Mode::Eagle3, DraftParts::Model { context, batch }) => {
            Box::new(DraftModelDrafter {
                context,
                batch,
                decoded: draft_past,
                n_prompt,
                n_draft,
                seq_id: 0,
            })
        }
        (Mode::Draft | Mode::Mtp | Mode::Eagle3, DraftParts::Session { session, context }) => {
            Box::new(SessionDrafter {
                session,
                context,
                seq_id: 0,
            })
        }
        (mode, _) => history_drafter(mode, n_draft, corpus.clone())?,
    })
}
