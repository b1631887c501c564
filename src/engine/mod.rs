//! The one speculative round engine behind every generation.
//!
//! A generation advances in rounds over a target context and a [`Drafter`]:
//! draft up to `n_draft` tokens, verify the draft in one target batch through
//! [`Sampler::verify`], commit the accepted draft tokens and the target's own
//! next token, and roll back what was rejected. [`Engine::prefill`] decodes a
//! prompt and chooses the first token, [`Engine::extend`] does the same for a
//! new turn after a generation; [`Engine::round`] runs one round. Both
//! `Generator` (five modes) and `GreedyGeneration` (a session over contexts
//! the caller built) drive these two functions.
//!
//! The rules, decided once for every drafter:
//! - **Draft length (`n_draft`).** A round drafts at most `n_ctx - n_past - 2` tokens (so
//!   that every committed token fits the context, the last one included), at
//!   most the batch's rows minus one (the verify batch holds the last token
//!   and the draft), and at most the drafter's own maximum. A caller that
//!   must not commit beyond a budget ([`Engine::round_within`]) lowers it to
//!   the budget minus one.
//! - **Full context or finished generation.** A round commits nothing: it is
//!   the end of the generation, not an error.
//! - **Rollback.** The target removes positions only after a rejection (when
//!   everything was accepted there is nothing to remove); the drafter settles
//!   its own state every round.
//! - **End of generation.** A committed end-of-generation token ends the
//!   generation: what would follow it in the round is not committed.
//! - **Decode failures** keep their type ([`crate::native::NativeError::Decode`]), and the
//!   drafter abandons its proposal so its state stays quiescent.

pub mod agreement;
pub mod corpus;
mod drafters;
pub mod grammar_drafts;
pub mod ngram;
pub mod policy;

pub use drafters::{DraftModelDrafter, NgramDrafter, NoDrafter, SessionDrafter, DRAFT_CONFIDENCE};
pub use policy::{AdaptiveState, Probe};

use policy::Evidence;

use crate::native::{Batch, Context};
use crate::sampling::{Distribution, Sampler, TokenLogprobs};
use crate::{Error, Result};

/// What a drafter is asked for at the start of a round.
#[derive(Clone, Copy, Debug)]
pub struct DraftRequest<'a> {
    /// Tokens known to the generation; the last one is committed but not yet
    /// decoded, and goes at position `n_past`.
    pub history: &'a [i32],
    /// Tokens in the target's memory.
    pub n_past: usize,
    /// Most tokens the round can verify (at least 1).
    pub n_draft: usize,
}

impl DraftRequest<'_> {
    /// The last committed token.
    pub fn id_last(&self) -> i32 {
        last_committed(self.history)
    }
}

/// The last token of `history`, the committed one a round decodes first.
fn last_committed(history: &[i32]) -> i32 {
    history.last().copied().unwrap_or_default()
}

/// A proposal: tokens and, for rejection sampling, the distributions they
/// were drawn from (`None`: each token is a point mass, as a drafter that
/// does not sample proposes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    /// The proposed tokens.
    pub tokens: Vec<i32>,
    /// The distribution of each token, if the drafter sampled them.
    pub distributions: Option<Vec<Distribution>>,
}

impl Draft {
    fn truncated(mut self, n_draft: usize) -> Self {
        self.tokens.truncate(n_draft);
        if let Some(dists) = self.distributions.as_mut() {
            dists.truncate(n_draft);
        }
        self
    }
}

/// A source of drafts: one implementation per way of drafting.
pub trait Drafter {
    /// Most tokens one draft may hold.
    fn n_draft(&self) -> usize;
    /// The target has just decoded `batch` (a prompt chunk or a verify batch).
    fn observe(&mut self, _target: &Context, _batch: &Batch) -> Result<()> {
        Ok(())
    }
    /// The prompt has been decoded: a generation begins.
    fn begin(&mut self, _target: &Context, _prompt: &[i32]) -> Result<()> {
        Ok(())
    }
    /// Whether proposing costs next to nothing (no model runs), so that a
    /// round that drafts nothing may still ask, to learn from the proposal.
    fn proposes_freely(&self) -> bool {
        false
    }
    /// Whether drafting after `history` costs what drafting round after
    /// round does: a draft model first catching up on a gap (a prompt, a new
    /// turn, plain rounds) does more.
    fn in_step(&self, _history: &[i32]) -> bool {
        true
    }
    /// How the adaptive policy probes it after rounds without evidence.
    fn probe(&self) -> Probe {
        if self.proposes_freely() {
            Probe::Never
        } else {
            Probe::OneToken
        }
    }
    /// Decode the first token a draft would need decoded (of a draft model
    /// that has decoded nothing yet, the prompt's first) and return how long
    /// it took, so that a policy prices the draft model's decodes before its
    /// first draft makes it catch up on the whole prompt; `None` where there
    /// is no such decode.
    fn time_one_decode(&mut self, _history: &[i32]) -> Result<Option<u64>> {
        Ok(None)
    }
    /// Whether its drafts carry the distributions they were sampled from,
    /// which a sampled verification draws against (rejection sampling), so
    /// that a sampled generation's text depends on its draft lengths.
    fn samples_drafts(&self) -> bool {
        false
    }
    /// Up to `n_draft` tokens copied from the history (prompt lookup) that a
    /// round drafts instead of running the drafter's model, which costs
    /// nothing; empty where there are none, or the drafter copies nothing.
    fn copied(&self, _history: &[i32], _n_draft: usize) -> Vec<i32> {
        Vec::new()
    }
    /// Whether its state stays right when a round verifies tokens after its
    /// own draft (the grammar's): it is told of its own tokens only.
    fn follows_foreign_drafts(&self) -> bool {
        true
    }
    /// Propose up to `request.n_draft` tokens to follow the history.
    fn propose(
        &mut self,
        target: &Context,
        request: DraftRequest<'_>,
        sampler: &mut Sampler,
    ) -> Result<Draft>;
    /// The round kept target positions `0..keep`, of which `accepted` were drafted.
    fn settle(&mut self, _target: &Context, _keep: usize, _accepted: usize) -> Result<()> {
        Ok(())
    }
    /// Verification failed: leave the drafter quiescent again.
    fn abandon(&mut self, _target: &Context) -> Result<()> {
        Ok(())
    }
}

/// Where a generation stands at a round boundary.
#[derive(Clone, Copy, Debug)]
pub struct Cursor<'a> {
    /// Tokens known to the generation; the last one is committed, not decoded.
    pub history: &'a [i32],
    /// Tokens in the target's memory.
    pub n_past: usize,
    /// Whether an end-of-generation token was committed.
    pub finished: bool,
}

/// The outcome of one round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Tokens committed: the accepted draft tokens, then the target's own.
    pub committed: Vec<i32>,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted (and committed).
    pub accepted: usize,
    /// Tokens in the target's memory after the round.
    pub n_past: usize,
    /// Whether the round committed an end-of-generation token.
    pub finished: bool,
}

impl Round {
    /// A round that commits nothing (full context or finished generation).
    fn nothing(at: &Cursor<'_>) -> Self {
        Self {
            n_past: at.n_past,
            finished: at.finished,
            ..Self::default()
        }
    }
}

/// The first half of a round ([`Engine::plan_round`]): the rows to verify
/// and what the second half ([`Engine::finish_round`]) needs to judge them.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Tokens in the target's memory: the rows go at positions `n_past..`.
    pub n_past: usize,
    /// The last committed token, the first row.
    pub id_last: i32,
    /// The longest draft the round allowed.
    n_draft: usize,
    /// The draft length chosen (by the adaptive policy, or `n_draft`).
    chosen: usize,
    /// The draft: the drafter's (at most `chosen` tokens), then the grammar's.
    pub draft: Draft,
    /// The draft's first tokens that are the drafter's own.
    own: usize,
    /// A free drafter's first proposal in a round kept plain.
    shadow: Option<i32>,
}

impl Plan {
    /// The rows to decode: the last committed token, then the draft.
    pub fn rows(&self) -> Vec<i32> {
        let mut rows = Vec::with_capacity(self.draft.tokens.len() + 1);
        rows.push(self.id_last);
        rows.extend_from_slice(&self.draft.tokens);
        rows
    }
}

/// Log-probability records of committed tokens, kept while a caller asks for them.
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobLog {
    /// Alternatives each record lists (at most [`crate::sampling::MAX_TOP_LOGPROBS`]).
    pub top_n: usize,
    /// The reply position (index among the tokens generated after the prompt) of `records[0]`.
    pub from: usize,
    /// One record per committed token from `from` on.
    pub records: Vec<TokenLogprobs>,
}

impl LogprobLog {
    /// An empty log whose next record is reply position `from`.
    pub fn new(top_n: usize, from: usize) -> Self {
        Self {
            top_n,
            from,
            records: Vec::new(),
        }
    }

    /// Start again at the first token of a new reply.
    pub fn restart(&mut self) {
        self.from = 0;
        self.records.clear();
    }
}

/// Add the records of `tokens` committed from `rows` to `log`, if one is kept.
fn record(log: Option<&mut LogprobLog>, rows: &[&[f32]], tokens: &[i32]) {
    if let Some(log) = log {
        for (row, &token) in rows.iter().zip(tokens) {
            log.records.push(TokenLogprobs::of(row, token, log.top_n));
        }
    }
}

/// The refusal of a prefill whose `kept` tokens leave nothing of a prompt of
/// `len` tokens to decode (its last token's row gives the first token).
pub fn nothing_to_decode(kept: usize, len: usize) -> Error {
    Error::Usage(format!(
        "{kept} kept tokens leave nothing of a {len}-token prompt to decode"
    ))
}

/// One generation's target side and drafter, borrowed for a call.
pub struct Engine<'a> {
    /// The target context.
    pub target: &'a mut Context,
    /// The batch prompt chunks and verify batches are decoded through.
    pub batch: &'a mut Batch,
    /// Where drafts come from.
    pub drafter: &'a mut dyn Drafter,
    /// How tokens are chosen and drafts verified.
    pub sampler: &'a mut Sampler,
    /// The sequence generated on.
    pub seq_id: i32,
    /// The adaptive draft length's state (`None`: every round drafts its `n_draft`).
    pub policy: Option<&'a mut AdaptiveState>,
    /// Where committed tokens' log-probabilities go (`None`: not asked for).
    pub logprobs: Option<&'a mut LogprobLog>,
    /// Most tokens a round drafts from the grammar ([`grammar_drafts`]; 0: none).
    pub grammar_drafts: usize,
}

impl Engine<'_> {
    /// Decode `prompt` in batch-sized chunks (the drafter observing each),
    /// begin the drafter, and return the first generated token. Should the
    /// first token not be chosen (a grammar llama.cpp refuses, or one that
    /// allows no token), the target and the drafter are left empty again.
    pub fn prefill(&mut self, prompt: &[i32]) -> Result<i32> {
        self.prefill_after(prompt, 0)
    }

    /// [`Engine::prefill`] when the target already holds the cells of
    /// `prompt[..kept]` (a prefix kept from an earlier generation, as exact
    /// as decoding it again): only the rest is decoded. `kept` is below the
    /// prompt's length (the last prompt token's row gives the first token).
    pub fn prefill_after(&mut self, prompt: &[i32], kept: usize) -> Result<i32> {
        self.check_prompt(prompt)?;
        if kept >= prompt.len() {
            return Err(nothing_to_decode(kept, prompt.len()));
        }
        self.decode_prompt(&prompt[kept..], kept)?;
        self.begin_after_prompt(prompt, -1)
    }

    /// The rest of [`Engine::prefill`] once the target holds `prompt`'s
    /// cells, its last row's logits at output row `row` of the last decode
    /// (`-1`: the last): begin the drafter and return the first token.
    pub fn begin_after_prompt(&mut self, prompt: &[i32], row: i32) -> Result<i32> {
        self.drafter.begin(self.target, prompt)?;
        self.choose_first(prompt, row)
            .map_err(|error| self.abandon_after(0, error))
    }

    /// The first token after a decoded prompt (its logits at output row
    /// `row`), its log-probability recorded.
    fn choose_first(&mut self, prompt: &[i32], row: i32) -> Result<i32> {
        let row = self.target.logits(row)?;
        let token = self.sampler.choose(row, prompt)?;
        record(self.logprobs.as_deref_mut(), &[row], &[token]);
        Ok(token)
    }

    /// Continue the generation at `at` with a new turn: decode the last
    /// committed token and `tokens` after it, begin the drafter on the whole
    /// history as its new prompt, and return the first token generated after
    /// it. The rules of [`Engine::prefill`] apply to that new prompt (a first
    /// token not chosen leaves the target and the drafter at `at`).
    pub fn extend(&mut self, at: Cursor<'_>, tokens: &[i32]) -> Result<i32> {
        if tokens.is_empty() {
            return Err(Error::Invalid("the new turn is empty".into()));
        }
        let prompt = [at.history, tokens].concat();
        self.check_prompt(&prompt)?;
        self.decode_prompt(&prompt[at.n_past..], at.n_past)?;
        self.drafter.begin(self.target, &prompt)?;
        self.choose_first(&prompt, -1)
            .map_err(|error| self.abandon_after(at.n_past, error))
    }

    /// Decode `rows` at positions `start..` in batch-sized chunks, the drafter observing each.
    fn decode_prompt(&mut self, rows: &[i32], start: usize) -> Result<()> {
        let drafter = &mut *self.drafter;
        decode_in_chunks(
            self.target,
            self.batch,
            rows,
            start,
            self.seq_id,
            |target, batch| drafter.observe(target, batch),
        )
    }

    /// Refuse a prompt the target cannot hold: empty, not shorter than a
    /// sequence's context, or with a token the model does not have.
    pub fn check_prompt(&self, prompt: &[i32]) -> Result<()> {
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        let n_ctx = self.target.n_ctx_seq() as usize;
        if prompt.len() >= n_ctx {
            // The words llama-cpp-python's error has, so that code matching them goes on working.
            return Err(Error::Invalid(format!(
                "the prompt has {n} tokens, which leaves no room in the {n_ctx}-token context \
                 (Requested tokens ({n}) exceed context window of {n_ctx})",
                n = prompt.len()
            )));
        }
        Ok(self.target.model().check_tokens(prompt)?)
    }

    /// One round from `at`: draft, verify in one target batch, commit, roll back.
    pub fn round(&mut self, at: Cursor<'_>) -> Result<Round> {
        self.round_within(at, usize::MAX)
    }

    /// [`Engine::round`] committing at most `max_commit` tokens: the draft is
    /// limited to `max_commit - 1` tokens (none when `max_commit` is 0).
    pub fn round_within(&mut self, at: Cursor<'_>, max_commit: usize) -> Result<Round> {
        let Some(plan) = self.plan_round(&at, max_commit)? else {
            return Ok(Round::nothing(&at));
        };
        let started = std::time::Instant::now();
        self.decode_verify_batch(&plan)?;
        let verify_micros = micros_since(started);
        self.finish_round(&at, plan, 0, verify_micros)
    }

    /// The first half of a round from `at`: choose the draft length and
    /// draft. `None` when the round can commit nothing. The plan's rows
    /// ([`Plan::rows`]) are then decoded, alone or beside other sequences'
    /// rows, and [`Engine::finish_round`] judges them.
    pub fn plan_round(&mut self, at: &Cursor<'_>, max_commit: usize) -> Result<Option<Plan>> {
        let Some(n_draft) = self.round_n_draft(at, max_commit) else {
            return Ok(None);
        };
        let copied = self.drafter.copied(at.history, n_draft);
        let (chosen, draft, shadow) = if copied.is_empty() {
            self.drafters_own(at, n_draft)?
        } else {
            let (chosen, draft) = self.copied_draft(copied, n_draft);
            (chosen, draft, None)
        };
        let (draft, own) = self.with_grammar_draft(at, draft, max_commit);
        Ok(Some(Plan {
            n_past: at.n_past,
            id_last: last_committed(at.history),
            n_draft,
            chosen,
            draft,
            own,
            shadow,
        }))
    }

    /// The drafter's own draft for a round that allows `n_draft` tokens: its
    /// chosen length, the draft, and in a round kept plain a free drafter's
    /// first proposal.
    fn drafters_own(
        &mut self,
        at: &Cursor<'_>,
        n_draft: usize,
    ) -> Result<(usize, Draft, Option<i32>)> {
        let request = DraftRequest {
            history: at.history,
            n_past: at.n_past,
            n_draft: self.chosen_n_draft(at.history, n_draft)?,
        };
        let draft = match request.n_draft {
            0 => Draft::default(),
            _ => self.timed_proposal(request)?,
        };
        let shadow = self.shadow_proposal(&request, n_draft)?;
        Ok((request.n_draft, draft, shadow))
    }

    /// A draft copied from the history (free) and its length: as many of its
    /// tokens as the adaptive policy drafts when drafting costs only the
    /// verification (all without a policy). A round that keeps plain
    /// compares nothing: a copy's first token is no evidence of what the
    /// drafter's model would draft, whose first probe must wait until it
    /// could pay for the model's catch-up on the prompt.
    fn copied_draft(&self, copied: Vec<i32>, n_draft: usize) -> (usize, Draft) {
        let chosen = self
            .policy
            .as_deref()
            .map_or(n_draft, |policy| policy.choose_free(n_draft))
            .min(copied.len());
        let draft = Draft {
            tokens: copied,
            distributions: None,
        };
        (chosen, draft.truncated(chosen))
    }

    /// The second half of a round: judge the plan's rows, decoded at output
    /// rows `first_row..` of the target's last decode (in `verify_micros`),
    /// commit, and roll back what was rejected.
    pub fn finish_round(
        &mut self,
        at: &Cursor<'_>,
        plan: Plan,
        first_row: i32,
        verify_micros: u64,
    ) -> Result<Round> {
        let round = match self.judge(at, &plan.draft, first_row) {
            Ok(round) => round,
            Err(error) => return Err(self.abandon_after(at.n_past, error)),
        };
        // The drafter is told of its own tokens only: what it drafted stops at them.
        let own_kept = round.n_past.min(at.n_past + 1 + plan.own);
        self.drafter
            .settle(self.target, own_kept, round.accepted.min(plan.own))?;
        if round.accepted < plan.draft.tokens.len() {
            self.roll_back_target(round.n_past)?;
        }
        self.learn(&round, &plan);
        self.learn_sureness(first_row)?;
        self.learn_cost(plan.draft.tokens.len() + 1, verify_micros);
        Ok(round)
    }

    /// The adaptive policy's draft length within `n_draft`, or `n_draft`
    /// without a policy. A live policy about to draft on an estimated draft
    /// cost first times one decode of the draft model, and chooses again.
    fn chosen_n_draft(&mut self, history: &[i32], n_draft: usize) -> Result<usize> {
        let probe = self.drafter.probe();
        let free = self.lengths_leave_text_alone();
        let Some(policy) = self.policy.as_deref_mut() else {
            return Ok(n_draft);
        };
        let chosen = policy.choose(n_draft, probe);
        if chosen == 0 || !policy.draft_estimated || !policy.follows_timings(free) {
            return Ok(chosen);
        }
        match self.drafter.time_one_decode(history)? {
            Some(micros) => {
                policy.observe_draft_cost(1, micros);
                Ok(policy.choose(n_draft, probe))
            }
            None => Ok(chosen),
        }
    }

    /// The drafter's proposal; a drafter that does not propose for free
    /// tells a live policy what its drafting cost, unless it caught up on
    /// more than a drafting round leaves it first (a prompt, a turn, plain
    /// rounds).
    fn timed_proposal(&mut self, request: DraftRequest<'_>) -> Result<Draft> {
        let steady = self.drafter.in_step(request.history);
        let started = std::time::Instant::now();
        let draft = self
            .drafter
            .propose(self.target, request, self.sampler)?
            .truncated(request.n_draft);
        let micros = micros_since(started);
        let free = self.lengths_leave_text_alone();
        if let Some(policy) = self
            .policy
            .as_deref_mut()
            .filter(|p| p.follows_timings(free))
        {
            // A drafter that stopped before its first token priced nothing.
            if !self.drafter.proposes_freely() && steady && !draft.tokens.is_empty() {
                policy.observe_draft_cost(draft.tokens.len(), micros);
            }
        }
        Ok(draft)
    }

    /// In a round the policy chose to keep plain, the first token a free
    /// drafter would have proposed (to compare with the committed one).
    fn shadow_proposal(
        &mut self,
        request: &DraftRequest<'_>,
        n_draft: usize,
    ) -> Result<Option<i32>> {
        if self.policy.is_none()
            || request.n_draft > 0
            || n_draft == 0
            || !self.drafter.proposes_freely()
        {
            return Ok(None);
        }
        let probe = DraftRequest {
            n_draft: 1,
            ..*request
        };
        Ok(self
            .drafter
            .propose(self.target, probe, self.sampler)?
            .tokens
            .first()
            .copied())
    }

    /// Give the policy what the round showed of the drafter's own tokens.
    fn learn(&mut self, round: &Round, plan: &Plan) {
        let Some(policy) = self.policy.as_deref_mut() else {
            return;
        };
        let own = Round {
            drafted: plan.own,
            accepted: round.accepted.min(plan.own),
            ..round.clone()
        };
        let round = &own;
        let evidence = match (plan.n_draft, plan.chosen, plan.shadow) {
            (0, ..) => Evidence::Forced,
            (_, 0, Some(token)) => Evidence::Shadow(round.committed.first() == Some(&token)),
            (_, 0, None) => Evidence::Nothing,
            _ => Evidence::Verified,
        };
        policy.observe(round, evidence);
    }

    /// Tell a policy that probes a draft model how sure the target was of
    /// the round's first token (its row at `first_row` of the last decode).
    fn learn_sureness(&mut self, first_row: i32) -> Result<()> {
        let Some(policy) = self.policy.as_deref_mut() else {
            return Ok(());
        };
        if self.drafter.probe() != Probe::WhileSure {
            return Ok(());
        }
        let row = self.target.logits(first_row)?;
        policy.observe_sureness(crate::sampling::top_probability(row));
        Ok(())
    }

    /// Whether the text is the same whatever the draft lengths: greedy
    /// choices, or drafts that carry no distributions to sample against.
    fn lengths_leave_text_alone(&self) -> bool {
        self.sampler.is_greedy() || !self.drafter.samples_drafts()
    }

    /// Move the live cost curve's entry for a verify batch of `rows` rows toward its time.
    fn learn_cost(&mut self, rows: usize, micros: u64) {
        let free = self.lengths_leave_text_alone();
        if let Some(policy) = self
            .policy
            .as_deref_mut()
            .filter(|p| p.follows_timings(free))
        {
            policy.observe_cost(rows, micros);
        }
    }

    /// How many tokens this round may draft, or `None` when it can commit nothing.
    fn round_n_draft(&self, at: &Cursor<'_>, max_commit: usize) -> Option<usize> {
        let room = (self.target.n_ctx_seq() as usize).saturating_sub(at.n_past + 1);
        if at.finished || room == 0 || at.history.is_empty() || max_commit == 0 {
            return None;
        }
        let rows = self.batch.capacity().saturating_sub(1);
        let n_draft = (room - 1).min(rows).min(self.drafter.n_draft());
        Some(n_draft.min(max_commit - 1))
    }

    /// Decode the plan's rows at `n_past..`; the drafter observes the batch,
    /// or abandons its proposal if either step fails.
    fn decode_verify_batch(&mut self, plan: &Plan) -> Result<()> {
        self.batch
            .fill(&plan.rows(), position(plan.n_past)?, self.seq_id, true)?;
        let decoded = self
            .target
            .decode(self.batch)
            .map_err(Error::from)
            .and_then(|()| self.drafter.observe(self.target, self.batch));
        if let Err(error) = decoded {
            self.drafter.abandon(self.target)?;
            return Err(error);
        }
        Ok(())
    }

    /// Verify the draft against the target's rows and decide what is committed.
    fn judge(&mut self, at: &Cursor<'_>, draft: &Draft, first_row: i32) -> Result<Round> {
        let target = &*self.target;
        let rows: Vec<&[f32]> = (0..=draft.tokens.len())
            .map(|row| target.logits(first_row + row as i32))
            .collect::<std::result::Result<_, _>>()?;
        let verdict = self.sampler.verify(
            |row| rows[row],
            at.history,
            &draft.tokens,
            draft.distributions.as_deref(),
        )?;
        let mut committed = draft.tokens[..verdict.accepted].to_vec();
        committed.push(verdict.next);
        let mut accepted = verdict.accepted;
        let end = committed.iter().position(|t| target.model().is_eog(*t));
        if let Some(end) = end {
            committed.truncate(end + 1);
            accepted = accepted.min(end);
        }
        record(self.logprobs.as_deref_mut(), &rows, &committed);
        Ok(Round {
            n_past: at.n_past + accepted + 1,
            drafted: draft.tokens.len(),
            committed,
            accepted,
            finished: end.is_some(),
        })
    }

    /// Choosing failed after tokens were decoded (a verify batch, a prompt:
    /// a grammar that allows no token, or one llama.cpp refuses): keep the
    /// first `keep` positions of the target and the drafter, as before.
    fn abandon_after(&mut self, keep: usize, error: Error) -> Error {
        let undone = self
            .drafter
            .settle(self.target, keep, 0)
            .and_then(|()| self.roll_back_target(keep));
        undone.err().unwrap_or(error)
    }

    fn roll_back_target(&mut self, keep: usize) -> Result<()> {
        if self.target.seq_rm(self.seq_id, position(keep)?, -1) {
            return Ok(());
        }
        Err(Error::Usage(format!(
            "the target could not roll back to position {keep} (a recurrent target needs n_rs_seq >= the draft length)"
        )))
    }
}

/// A history index as a llama.cpp position.
/// Decode `rows` of sequence `seq_id` at positions `start..` in batch-sized
/// chunks (no logits asked for), calling `each` after every chunk's decode.
pub(crate) fn decode_in_chunks(
    target: &mut Context,
    batch: &mut Batch,
    rows: &[i32],
    start: usize,
    seq_id: i32,
    mut each: impl FnMut(&Context, &Batch) -> Result<()>,
) -> Result<()> {
    let chunk = crate::limits::prompt_chunk_rows(batch.capacity());
    for (index, piece) in rows.chunks(chunk).enumerate() {
        batch.fill(piece, position(start + index * chunk)?, seq_id, false)?;
        target.decode(batch)?;
        each(target, batch)?;
    }
    Ok(())
}

pub(crate) fn position(index: usize) -> Result<i32> {
    i32::try_from(index).map_err(|_| Error::Invalid(format!("position {index} overflows i32")))
}

/// Microseconds since `started` (saturating), as rounds and drafts are timed.
pub(crate) fn micros_since(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}
