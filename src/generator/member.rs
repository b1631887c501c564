//! A generation without its contexts: the configuration, the state between
//! rounds, the sampler, the conversation and the log-probability records.
//! A [`super::Generator`] holds one over a target context of its own; a
//! [`crate::batch_engine::BatchEngine`] engine holds one per sequence of a shared target.

use std::sync::Arc;

use crate::chat::Conversation;
use crate::engine::corpus::LookupCorpus;
use crate::engine::{
    policy::measure_cost_curve, AdaptiveState, Drafter, LogprobLog, NgramDrafter, NoDrafter, Round,
};
use crate::native::{Batch, Context};
use crate::sampling::Sampler;
use crate::settings::{GeneratorConfig, Mode, RuntimeOptions};
use crate::{Error, Result};

use super::GeneratorState;

/// One generation's own part (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// The resolved configuration.
    pub config: GeneratorConfig,
    /// Where the generation stands at a round boundary.
    pub state: GeneratorState,
    /// How tokens are chosen.
    pub sampler: Sampler,
    /// The conversation that led to the current reply, for a chat.
    pub conversation: Option<Conversation>,
    /// Log-probability records, while asked for.
    pub logprobs: Option<LogprobLog>,
    /// Earlier texts prompt lookup may copy (`ngram` mode), if given.
    pub corpus: Option<Arc<LookupCorpus>>,
    /// On a shared engine, the key this generation's exact cells are kept
    /// under when it gives its sequence back, and the only key whose kept
    /// cells its prompt reuses (`None`: it neither keeps nor reuses any).
    pub reuse_key: Option<Arc<str>>,
    /// Whether rounds under a grammar draft the tokens it forces (a runtime
    /// choice: the reply is the same either way).
    pub grammar_drafts: bool,
}

impl Member {
    /// A generation with no prompt yet.
    pub fn new(config: GeneratorConfig, sampler: Sampler) -> Self {
        Self {
            config,
            state: GeneratorState::empty(sampler.rng.state()),
            sampler,
            conversation: None,
            logprobs: None,
            corpus: None,
            reuse_key: Some(Arc::from("")),
            grammar_drafts: RuntimeOptions::DEFAULT.grammar_drafts,
        }
    }

    /// Most tokens a round drafts from the grammar: up to `n_draft`, when grammar drafts are on.
    pub fn grammar_draft_limit(&self) -> usize {
        if self.grammar_drafts {
            self.config.n_draft as usize
        } else {
            0
        }
    }

    /// Whether the prompt has been decoded.
    pub fn started(&self) -> bool {
        !self.state.history.is_empty()
    }

    /// A new reply begins: the grammar and the log-probability records start again.
    pub fn new_reply(&mut self) -> Result<()> {
        self.sampler.restart_grammar()?;
        if let Some(log) = self.logprobs.as_mut() {
            log.restart();
        }
        Ok(())
    }

    /// Whether the adaptive policy still has to time its cost curve (before the prompt).
    pub fn needs_cost_curve(&self) -> bool {
        self.config.adaptive && self.state.adaptive.is_none()
    }

    /// Whether the generation times its cost curve before its prompt: an
    /// adaptive one without a curve whose text depends on its draft lengths
    /// (sampled, with a draft model).
    pub fn times_cost_curve(&self) -> bool {
        let lengths_free =
            self.sampler.is_greedy() || matches!(self.config.mode, Mode::None | Mode::Ngram(_));
        self.needs_cost_curve() && !lengths_free
    }

    /// An adaptive generation without a pinned cost curve gets one before its
    /// prompt: a greedy one, or one that drafts without a model, an estimate
    /// its rounds' timings replace ([`AdaptiveState::estimated`]); a sampled
    /// one with a draft model, whose text depends on its draft lengths and so
    /// on a curve fixed before it starts, times it on
    /// sequence `seq_id` of `target`, still empty (after as many cells as the
    /// prompt has, up to [`crate::engine::policy::MAX_TIMED_CONTEXT`]). A draft
    /// model's decode is priced at `draft_share` of a target decode until timed.
    pub fn prepare_cost_curve(
        &mut self,
        target: &mut Context,
        batch: &mut Batch,
        seq_id: i32,
        prompt: &[i32],
        draft_share: Option<f64>,
    ) -> Result<()> {
        if !self.needs_cost_curve() {
            return Ok(());
        }
        let rows = self.config.n_draft as usize + 1;
        if !self.times_cost_curve() {
            self.state.adaptive = Some(AdaptiveState::estimated(rows, draft_share));
            return Ok(());
        }
        let token = *prompt
            .first()
            .ok_or_else(|| Error::Invalid("the prompt is empty".into()))?;
        target.model().check_tokens(&[token])?;
        let curve = measure_cost_curve(target, batch, seq_id, token, rows, prompt.len())?;
        self.state.adaptive = Some(AdaptiveState::measured(curve).priced(draft_share));
        Ok(())
    }

    /// The whole history is now a decoded prompt: commit the first token
    /// generated after it, and start the reply's counters from zero.
    pub fn commit_first(&mut self, first: i32, end_of_generation: bool) {
        let state = &mut self.state;
        state.n_prompt = state.history.len();
        state.n_past = state.n_prompt;
        state.history.push(first);
        state.finished = end_of_generation;
        state.delivered = 0;
        (state.rounds, state.drafted, state.accepted) = (0, 0, 0);
        state.rng = self.sampler.rng.state();
    }

    /// Committed tokens not yet handed out.
    pub fn undelivered(&self) -> usize {
        self.state
            .history
            .len()
            .saturating_sub(self.state.n_prompt + self.state.delivered)
    }

    /// Hand out up to `max_n` committed tokens not yet handed out.
    pub fn deliver(&mut self, max_n: usize) -> Vec<i32> {
        let start = self.state.n_prompt + self.state.delivered;
        let n = self.undelivered().min(max_n);
        self.state.delivered += n;
        self.state.history[start..start + n].to_vec()
    }

    /// Add a round's outcome; a round that commits nothing (finished, or a
    /// full context) leaves the state as it is.
    pub fn apply(&mut self, round: &Round) {
        if !round.committed.is_empty() {
            self.state.apply(round);
            self.state.rng = self.sampler.rng.state();
        }
    }

    /// Follow the reply so far with the grammar (a restored boundary's reply).
    pub fn follow_grammar(&mut self) -> std::result::Result<(), crate::native::NativeError> {
        self.sampler.follow(self.state.reply())
    }
}

/// The drafter of a mode that drafts from the history alone (`none`, `ngram`);
/// the other modes need draft parts beside the target.
pub(crate) fn history_drafter(
    mode: Mode,
    n_draft: usize,
    corpus: Option<Arc<LookupCorpus>>,
) -> Result<Box<dyn Drafter>> {
    match mode {
        Mode::None => Ok(Box::new(NoDrafter)),
        Mode::Ngram(config) => Ok(Box::new(NgramDrafter {
            config,
            n_draft,
            corpus,
        })),
        mode => Err(Error::Usage(format!(
            "this generator lacks the draft parts of mode '{}'",
            mode.name()
        ))),
    }
}
