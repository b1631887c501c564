//! Greedy speculative generation on one sequence of an MTP or EAGLE-3
//! session whose contexts the caller built and owns (Python's
//! `GreedyGeneration`). The rounds are the engine's, the same as `Generator`'s.
//!
//! At a round boundary the session is quiescent, the target and draft
//! contexts hold positions `0..n_past` of `seq_id`, and the last committed
//! token is not yet decoded. `n_past`, that token and the two contexts'
//! sequence states plus the speculative state are a complete checkpoint.

use crate::engine::{Cursor, Engine, Round, SessionDrafter};
use crate::native::{Batch, Context};
use crate::sampling::Sampler;
use crate::session::{DraftSession, SessionError};
use crate::{Error, Result};

/// The contexts and session a generation runs on, borrowed for one call.
pub struct SessionParts<'a> {
    /// The target context.
    pub target: &'a mut Context,
    /// The session's draft context.
    pub draft: &'a mut Context,
    /// The session over both.
    pub session: &'a mut DraftSession,
}

/// Rows one batch may hold: the smaller `n_batch` of the two contexts, since
/// the session processes every target batch in the draft context too.
pub fn process_rows(target: &Context, draft: &Context) -> usize {
    target.capacity().batch.min(draft.capacity().batch) as usize
}

/// A greedy generation's state between rounds.
pub struct GreedyGeneration {
    seq_id: i32,
    batch: Batch,
    sampler: Sampler,
    /// Tokens in the target's memory (`None` before prefill or resume).
    n_past: Option<usize>,
    /// Every committed token, the first generated one included.
    tokens: Vec<i32>,
    finished: bool,
    rounds: u64,
    drafted: u64,
    accepted: u64,
}

fn usage(message: &str) -> Error {
    Error::Session(SessionError::Usage(message.into()))
}

impl GreedyGeneration {
    /// A generation on `seq_id` whose batches hold `rows` rows.
    pub fn new(seq_id: i32, rows: usize) -> Result<Self> {
        Ok(Self {
            seq_id,
            batch: Batch::new(rows)?,
            sampler: Sampler::greedy(),
            n_past: None,
            tokens: Vec::new(),
            finished: false,
            rounds: 0,
            drafted: 0,
            accepted: 0,
        })
    }

    fn run<T>(
        &mut self,
        parts: &mut SessionParts<'_>,
        call: impl FnOnce(&mut Engine<'_>, &[i32]) -> Result<T>,
    ) -> Result<T> {
        let mut drafter = SessionDrafter {
            session: parts.session,
            context: parts.draft,
            seq_id: self.seq_id,
        };
        let mut engine = Engine {
            target: parts.target,
            batch: &mut self.batch,
            drafter: &mut drafter,
            sampler: &mut self.sampler,
            seq_id: self.seq_id,
            policy: None,
            logprobs: None,
            grammar_drafts: 0,
        };
        call(&mut engine, &self.tokens)
    }

    /// Decode `prompt`, begin the session, and return the first generated token.
    pub fn prefill(&mut self, parts: &mut SessionParts<'_>, prompt: &[i32]) -> Result<i32> {
        if self.n_past.is_some() {
            return Err(usage("this generation already has a prompt"));
        }
        let first = self.run(parts, |engine, _| engine.prefill(prompt))?;
        self.n_past = Some(prompt.len());
        self.tokens = vec![first];
        self.finished = parts.target.model().is_eog(first);
        Ok(first)
    }

    /// Continue from a restored boundary: the contexts hold `n_past` tokens,
    /// `id_last` is the last committed token (not yet decoded) and `tokens`
    /// the committed tokens, ending with it (default: `id_last` alone).
    pub fn resume(
        &mut self,
        n_past: usize,
        id_last: i32,
        tokens: Option<Vec<i32>>,
        finished: bool,
    ) -> Result<()> {
        let tokens = tokens.unwrap_or_else(|| vec![id_last]);
        if tokens.last() != Some(&id_last) {
            return Err(Error::Invalid(
                "tokens must end with id_last, the last committed token".into(),
            ));
        }
        if self.n_past.is_some() {
            return Err(usage("this generation has already started"));
        }
        if n_past == 0 || tokens.is_empty() {
            return Err(Error::Invalid(
                "n_past must be positive and the last committed token known".into(),
            ));
        }
        self.n_past = Some(n_past);
        self.tokens = tokens;
        self.finished = finished;
        Ok(())
    }

    /// Run one round; returns the tokens it committed (none once the
    /// generation is finished or the context is full).
    pub fn step(&mut self, parts: &mut SessionParts<'_>) -> Result<Vec<i32>> {
        let n_past = self
            .n_past
            .ok_or_else(|| usage("the generation has no prompt yet: call prefill() or resume()"))?;
        let finished = self.finished;
        let round = self.run(parts, |engine, history| {
            engine.round(Cursor {
                history,
                n_past,
                finished,
            })
        })?;
        self.apply(&round);
        Ok(round.committed)
    }

    fn apply(&mut self, round: &Round) {
        if round.committed.is_empty() {
            return;
        }
        self.tokens.extend_from_slice(&round.committed);
        self.n_past = Some(round.n_past);
        self.finished = round.finished;
        self.rounds += 1;
        self.drafted += round.drafted as u64;
        self.accepted += round.accepted as u64;
    }

    /// Run rounds until `n_tokens` tokens are committed in total, the
    /// generation is finished or the context is full.
    pub fn generate(&mut self, parts: &mut SessionParts<'_>, n_tokens: usize) -> Result<()> {
        while self.tokens.len() < n_tokens {
            if self.step(parts)?.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// Every committed token, the first generated one included.
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    /// Tokens in the target's memory (`None` before prefill or resume).
    pub fn n_past(&self) -> Option<usize> {
        self.n_past
    }

    /// The last committed token, decoded by the next round.
    pub fn id_last(&self) -> Option<i32> {
        self.n_past.and(self.tokens.last().copied())
    }

    /// The sequence generated on.
    pub fn seq_id(&self) -> i32 {
        self.seq_id
    }

    /// Whether an end-of-generation token was committed.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Rounds run, draft tokens verified, draft tokens accepted.
    pub fn counters(&self) -> (u64, u64, u64) {
        (self.rounds, self.drafted, self.accepted)
    }
}
