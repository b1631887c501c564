//! Many generations over one target context: continuous batching in which
//! every reply is, token for token, the reply the same request gets alone.
//!
//! A [`BatchEngine`] engine holds one target context with a KV stream per
//! sequence (llama.cpp's `kv_unified = false`) and a [`Member`] per sequence:
//! its configuration, state, sampler, grammar, adaptive draft length, budget
//! and log-probability records. Sequences join ([`BatchEngine::add`],
//! [`BatchEngine::join`], from a `Generator` or a checkpoint restored into one)
//! and leave ([`BatchEngine::leave`], into a `Generator` of their own, whose
//! checkpoint is a `Generator` checkpoint) between steps.
//!
//! Why a reply does not depend on its neighbours:
//! - **Prompts** are decoded in decodes of their own, in the chunks the
//!   sequence's `n_batch` gives, as a lone `Generator` decodes them.
//! - **A step** plans a round for every sequence that needs one (its draft,
//!   from the history alone), decodes every plan's rows together in decodes of
//!   at most [`MAX_EXACT_ROWS`] rows, where patch 0001 gives every row its
//!   single decode's bits (a plan of more rows is decoded alone, as a lone
//!   generator would), then judges each plan on its own rows.
//! - **Attention** reads only the sequence's own KV stream, whose cells sit
//!   where they would in a context of its own.
//!
//! Modes: `none` and `ngram`, whose drafts come from the history. `draft`,
//! `mtp` and `eagle3` draft from a draft context or session built for one
//! sequence (`SessionConfig::n_seq` 1); they are refused.

use std::sync::Arc;

use crate::engine::Plan;
use crate::generator::multi_sequence::{
    batch_target, check_joins, decode_groups, fill_rows, history_engine, place_state,
    undo_failed_decode,
};
use crate::generator::{EngineShape, Generator, Member};
use crate::limits::MAX_EXACT_ROWS;
use crate::native::{restream_seq_state, Batch, Context, Model};
use crate::settings::{GeneratorConfig, RuntimeOptions};
use crate::{Error, Result};

/// What one step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Sequences that ran a round.
    pub sequences: usize,
    /// Rows decoded (every sequence's last token and draft).
    pub rows: usize,
    /// Decodes run.
    pub decodes: usize,
    /// Tokens committed.
    pub committed: usize,
}

/// One sequence of the batch.
struct Sequence {
    member: Member,
    /// The batch its prompt chunks are decoded through (its `n_batch` rows).
    batch: Batch,
    /// The most tokens its next round may commit.
    budget: usize,
    /// Its rounds run while it holds fewer committed tokens than this not yet handed out.
    lead: usize,
    /// A failure of its last round, handed to the next [`BatchEngine::take`].
    error: Option<Error>,
}

impl Sequence {
    /// Whether the next step should run a round for it.
    fn wants_round(&self) -> bool {
        self.error.is_none()
            && self.member.started()
            && !self.member.state.finished
            && self.budget > 0
            && self.member.undelivered() < self.lead
    }
}

/// A planned round of sequence `seq`.
struct Planned {
    seq: usize,
    plan: Plan,
}

/// Many generations over one target context (see the module documentation).
pub struct BatchEngine {
    target: Context,
    /// The rows of one decode of a step.
    step: Batch,
    seqs: Vec<Option<Sequence>>,
    config: EngineShape,
    runtime: RuntimeOptions,
}

impl BatchEngine {
    /// An engine of `config.n_seq` empty sequences over `model`.
    pub fn new(model: Arc<Model>, config: EngineShape, runtime: RuntimeOptions) -> Result<Self> {
        let (target, config) = batch_target(&model, config, runtime)?;
        Ok(Self {
            step: Batch::new(MAX_EXACT_ROWS)?,
            seqs: (0..config.n_seq).map(|_| None).collect(),
            config,
            target,
            runtime,
        })
    }

    /// The engine's shape (`n_ctx` resolved).
    pub fn config(&self) -> EngineShape {
        self.config
    }

    /// The threads the target decodes with.
    pub fn n_threads(&self) -> i32 {
        self.target.n_threads()
    }

    /// The target model.
    pub fn model(&self) -> &Arc<Model> {
        self.target.model()
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.seqs.iter().flatten().count()
    }

    /// Whether no sequence is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A new sequence, not yet prefilled, configured by `config` (resolved
    /// and checked as `Generator::new` does); returns its id.
    pub fn add(&mut self, config: GeneratorConfig) -> Result<i32> {
        let member = crate::generator::new_member(self.target.model(), config)?;
        self.admit(member, None)
    }

    /// A copy of `generator`'s generation (prefilled or not) as a new
    /// sequence; `generator` is left as it was. Returns the sequence's id.
    pub fn join(&mut self, generator: &mut Generator) -> Result<i32> {
        if !Arc::ptr_eq(generator.target_model(), self.target.model()) {
            return Err(Error::Invalid(
                "the generator's target is another model than the batch's".into(),
            ));
        }
        let state = match generator.started() {
            true => Some(generator.target_state()?),
            false => None,
        };
        self.admit(generator.member().clone(), state.as_deref())
    }

    /// Check `member` against the batch, take a free sequence for it and put
    /// its target state (if prefilled) there.
    fn admit(&mut self, member: Member, state: Option<&[u8]>) -> Result<i32> {
        check_joins(&member, self.config)?;
        let seq = self.seqs.iter().position(Option::is_none).ok_or_else(|| {
            Error::Usage(format!(
                "the batch's {} sequences are all taken",
                self.seqs.len()
            ))
        })?;
        let seq_id = crate::engine::position(seq)?;
        place_state(&mut self.target, self.config.n_seq, seq_id, state)?;
        self.seqs[seq] = Some(Sequence {
            batch: Batch::new(member.config.n_batch as usize)?,
            member,
            budget: usize::MAX,
            lead: 1,
            error: None,
        });
        Ok(seq_id)
    }

    fn sequence(&mut self, seq_id: i32) -> Result<&mut Sequence> {
        Self::held(&mut self.seqs, seq_id)
    }

    /// A copy of sequence `seq_id` as a `Generator` of its own (a context of
    /// its own, holding the sequence's target state): it continues alone
    /// exactly as the sequence does in the batch, and its checkpoint is a
    /// `Generator` checkpoint. The sequence stays.
    pub fn snapshot(&mut self, seq_id: i32) -> Result<Generator> {
        let started = self.sequence(seq_id)?.member.started();
        let state = match started {
            true => Some(restream_seq_state(&self.target.seq_state(seq_id)?, 1, 0)?),
            false => None,
        };
        let member = self.sequence(seq_id)?.member.clone();
        let model = Arc::clone(self.target.model());
        Generator::from_member(model, member, self.runtime, state.as_deref())
    }

    /// Sequence `seq_id` taken out of the batch as a `Generator` of its own
    /// ([`BatchEngine::snapshot`], then [`BatchEngine::remove`]).
    pub fn leave(&mut self, seq_id: i32) -> Result<Generator> {
        let generator = self.snapshot(seq_id)?;
        self.remove(seq_id)?;
        Ok(generator)
    }

    /// Drop sequence `seq_id` and free its place.
    pub fn remove(&mut self, seq_id: i32) -> Result<()> {
        self.sequence(seq_id)?;
        self.target.seq_rm(seq_id, -1, -1);
        self.seqs[seq_id as usize] = None;
        Ok(())
    }

    /// Decode the prompt of sequence `seq_id` in decodes of its own and
    /// commit the first generated token; returns it.
    pub fn prefill(&mut self, seq_id: i32, prompt: &[i32]) -> Result<i32> {
        let Self { target, seqs, .. } = self;
        let seq = Self::held(seqs, seq_id)?;
        if seq.member.started() {
            return Err(Error::Usage("the sequence already has a prompt".into()));
        }
        seq.member
            .prepare_cost_curve(target, &mut seq.batch, seq_id, prompt, None)?;
        seq.member.new_reply()?;
        let first = history_engine(
            target,
            &mut seq.member,
            &mut seq.batch,
            seq_id,
            |engine, _| engine.prefill(prompt),
        )?;
        seq.member.state.history = prompt.to_vec();
        seq.member.commit_first(first, target.model().is_eog(first));
        Ok(first)
    }

    fn held(seqs: &mut [Option<Sequence>], seq_id: i32) -> Result<&mut Sequence> {
        usize::try_from(seq_id)
            .ok()
            .and_then(|seq| seqs.get_mut(seq))
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Usage(format!("the batch holds no sequence {seq_id}")))
    }

    /// The most tokens the next round of `seq_id` may commit (`usize::MAX`:
    /// no bound), as `Generator.take(max_commit=...)` bounds a lone round.
    pub fn set_budget(&mut self, seq_id: i32, max_commit: usize) -> Result<()> {
        self.sequence(seq_id)?.budget = max_commit;
        Ok(())
    }

    /// Let `seq_id`'s rounds run while it holds fewer than `lead` committed
    /// tokens not yet handed out (at least 1; 1, the default: a round only
    /// once every token is handed out), so that a caller who takes tokens
    /// later finds them decoded alongside the others' rounds.
    pub fn set_lead(&mut self, seq_id: i32, lead: usize) -> Result<()> {
        self.sequence(seq_id)?.lead = lead.max(1);
        Ok(())
    }

    /// Hand out up to `max_n` committed tokens of `seq_id` (never runs a
    /// round: [`BatchEngine::step`] does), or the failure of its last round.
    pub fn take(&mut self, seq_id: i32, max_n: usize) -> Result<Vec<i32>> {
        let seq = self.sequence(seq_id)?;
        if let Some(error) = seq.error.take() {
            return Err(error);
        }
        Ok(seq.member.deliver(max_n))
    }

    /// Whether `seq_id` is done: finished, or its context full, with every
    /// token handed out.
    pub fn done(&mut self, seq_id: i32) -> Result<bool> {
        let n_ctx = self.target.n_ctx_seq() as usize;
        let member = &self.sequence(seq_id)?.member;
        let full = member.state.n_past + 1 >= n_ctx;
        Ok(member.started() && member.undelivered() == 0 && (member.state.finished || full))
    }

    /// The prompt and committed tokens of `seq_id`.
    pub fn history(&mut self, seq_id: i32) -> Result<Vec<i32>> {
        Ok(self.sequence(seq_id)?.member.state.history.clone())
    }

    /// One step: a round for every sequence that has handed out all its
    /// tokens and is not done, their rows decoded together. A sequence whose
    /// round fails keeps the failure for its next [`BatchEngine::take`]; the others go on.
    pub fn step(&mut self) -> Result<StepReport> {
        let planned = self.plan_all();
        let mut report = StepReport::default();
        let rows = planned.iter().map(|p| p.plan.draft.tokens.len() + 1);
        for range in decode_groups(rows) {
            let group = &planned[range];
            report.decodes += 1;
            report.rows += group
                .iter()
                .map(|p| p.plan.draft.tokens.len() + 1)
                .sum::<usize>();
            report.sequences += group.len();
            report.committed += self.decode_group(group);
        }
        Ok(report)
    }

    /// Plan a round for every sequence that wants one; a failure stays with its sequence.
    fn plan_all(&mut self) -> Vec<Planned> {
        let Self { target, seqs, .. } = self;
        let mut planned = Vec::new();
        for (index, slot) in seqs.iter_mut().enumerate() {
            let Some(seq) = slot.as_mut().filter(|seq| seq.wants_round()) else {
                continue;
            };
            let seq_id = index as i32;
            let budget = seq.budget;
            let outcome = seq
                .member
                .follow_grammar()
                .map_err(Error::from)
                .and_then(|()| {
                    history_engine(
                        target,
                        &mut seq.member,
                        &mut seq.batch,
                        seq_id,
                        |engine, at| engine.plan_round(&at, budget),
                    )
                });
            match outcome {
                Ok(Some(plan)) => planned.push(Planned { seq: index, plan }),
                Ok(None) => {}
                Err(error) => seq.error = Some(error),
            }
        }
        planned
    }

    /// Decode `group`'s rows in one decode and finish each plan on its rows;
    /// returns the tokens committed.
    fn decode_group(&mut self, group: &[Planned]) -> usize {
        let started = std::time::Instant::now();
        let rows = group.iter().map(|p| (p.seq as i32, &p.plan));
        let decoded = fill_rows(&mut self.step, rows).and_then(|()| {
            self.target.decode(&self.step)?;
            Ok(())
        });
        let micros = crate::engine::micros_since(started);
        let Self { target, seqs, .. } = self;
        let mut first_row = 0;
        let mut committed = 0;
        for planned in group {
            let rows = planned.plan.draft.tokens.len() + 1;
            let Some(seq) = seqs[planned.seq].as_mut() else {
                continue;
            };
            let seq_id = planned.seq as i32;
            let outcome = match &decoded {
                Ok(()) => history_engine(
                    target,
                    &mut seq.member,
                    &mut seq.batch,
                    seq_id,
                    |engine, at| engine.finish_round(&at, planned.plan.clone(), first_row, micros),
                ),
                Err(error) => Err(undo_failed_decode(
                    target,
                    seq_id,
                    planned.plan.n_past,
                    error,
                )),
            };
            match outcome {
                Ok(round) => {
                    committed += round.committed.len();
                    seq.member.apply(&round);
                }
                Err(error) => seq.error = Some(error),
            }
            first_row += rows as i32;
        }
        committed
    }
}
