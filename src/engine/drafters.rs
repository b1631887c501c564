//! One [`Drafter`] per way of drafting: none, prompt lookup, a draft model,
//! and an MTP or EAGLE-3 session over contexts it borrows.

use std::sync::Arc;

use super::corpus::LookupCorpus;
use super::{micros_since, ngram, position, Draft, DraftRequest, Drafter, Probe, Result};
use crate::native::{Batch, Context};
use crate::sampling::{self, Sampler};
use crate::session::DraftSession;
use crate::settings::NgramConfig;

/// Plain decoding: never drafts.
pub struct NoDrafter;

impl Drafter for NoDrafter {
    fn n_draft(&self) -> usize {
        0
    }

    fn propose(
        &mut self,
        _target: &Context,
        _request: DraftRequest<'_>,
        _sampler: &mut Sampler,
    ) -> Result<Draft> {
        Ok(Draft::default())
    }
}

/// Prompt lookup over the history, and the texts of a corpus if given one.
pub struct NgramDrafter {
    /// The n-gram sizes looked up.
    pub config: NgramConfig,
    /// Most tokens per draft.
    pub n_draft: usize,
    /// Earlier texts to copy from besides the history.
    pub corpus: Option<Arc<LookupCorpus>>,
}

impl Drafter for NgramDrafter {
    fn n_draft(&self) -> usize {
        self.n_draft
    }

    fn proposes_freely(&self) -> bool {
        true
    }

    fn propose(
        &mut self,
        target: &Context,
        request: DraftRequest<'_>,
        _sampler: &mut Sampler,
    ) -> Result<Draft> {
        let corpus = self.corpus.as_deref();
        let mut tokens = ngram::propose_from(request.history, corpus, self.config, request.n_draft);
        // A corpus holds any ids: a draft stops before one the target does not know.
        let n_vocab = target.model().n_vocab();
        if let Some(unknown) = tokens.iter().position(|&token| token as usize >= n_vocab) {
            tokens.truncate(unknown);
        }
        Ok(Draft {
            tokens,
            distributions: None,
        })
    }
}

/// `draft` mode stops drafting when the draft model's most likely next token
/// has less than this probability (softmax of its raw logits).
pub const DRAFT_CONFIDENCE: f64 = 0.5;

/// Where the history's end has occurred before, after at least this many
/// agreeing tokens, `draft` mode copies what followed it (prompt lookup,
/// which costs nothing) instead of running the draft model: text that
/// repeats (an edit of code, a quotation) is copied more surely and far
/// more cheaply than a small model predicts it. A long agreement keeps
/// chance repetitions of ordinary prose to the model.
const LOOKUP_BEFORE_MODEL: NgramConfig = NgramConfig {
    n_max: ngram::RESYNC_CONTEXT,
    n_min: ngram::RESYNC_CONTEXT,
};

/// The most history tokens a draft model decodes before drafting when the
/// round before drafted too: its last drafted token (never decoded by it)
/// and the target's token after the accepted ones.
const STEADY_CATCH_UP: usize = 2;

/// Generated tokens a draft model decodes at most to catch up on rounds it
/// did not draft in: the ones before them are skipped, the draft's memory
/// moved up to end where the history does, so that a probe after a long pause
/// costs what a short one does. The prompt is always decoded whole.
pub const CATCH_UP_WINDOW: usize = 16;

/// Autoregressive drafting on a separate draft model with the target's vocabulary.
pub struct DraftModelDrafter<'a> {
    /// The draft model's context.
    pub context: &'a mut Context,
    /// The batch the draft context decodes through.
    pub batch: &'a mut Batch,
    /// Tokens of the history the draft context has passed: decoded, or
    /// skipped while catching up; its memory ends at position `decoded - 1`.
    pub decoded: &'a mut usize,
    /// Tokens of the history before the reply (never skipped).
    pub n_prompt: usize,
    /// Most tokens per draft.
    pub n_draft: usize,
    /// The sequence drafted on.
    pub seq_id: i32,
}

impl DraftModelDrafter<'_> {
    /// Bring the draft context to the end of the history (the last token
    /// included): the prompt whole, of the reply the last [`CATCH_UP_WINDOW`]
    /// tokens where the memory can move positions.
    fn catch_up(&mut self, history: &[i32]) -> Result<()> {
        self.decode_up_to(history, self.n_prompt)?;
        let window = history.len().saturating_sub(CATCH_UP_WINDOW);
        if *self.decoded < window {
            let skip = position(window - *self.decoded)?;
            if self.context.seq_shift(self.seq_id, -1, -1, skip) {
                *self.decoded = window;
            }
        }
        self.decode_up_to(history, history.len())
    }

    /// Decode `history[decoded..end]` in the draft context, where it is
    /// behind, in the chunks a prompt is decoded in.
    fn decode_up_to(&mut self, history: &[i32], end: usize) -> Result<()> {
        let end = end.min(history.len());
        let chunk = crate::limits::prompt_chunk_rows(self.batch.capacity());
        while *self.decoded < end {
            let start = *self.decoded;
            let stop = (start + chunk).min(end);
            self.batch
                .fill(&history[start..stop], position(start)?, self.seq_id, false)?;
            self.context.decode(self.batch)?;
            *self.decoded = stop;
        }
        Ok(())
    }
}

impl Drafter for DraftModelDrafter<'_> {
    fn n_draft(&self) -> usize {
        self.n_draft
    }

    fn samples_drafts(&self) -> bool {
        true
    }

    fn copied(&self, history: &[i32], n_draft: usize) -> Vec<i32> {
        ngram::propose(history, LOOKUP_BEFORE_MODEL, n_draft)
    }

    fn in_step(&self, history: &[i32]) -> bool {
        history.len().saturating_sub(*self.decoded) <= STEADY_CATCH_UP
    }

    /// The prompt's first token, which its first draft's catch-up would
    /// decode anyway.
    fn time_one_decode(&mut self, history: &[i32]) -> Result<Option<u64>> {
        if *self.decoded > 0 || history.is_empty() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        self.decode_up_to(history, 1)?;
        Ok(Some(micros_since(started)))
    }

    /// A draft stops where the draft model is unsure, so a probe may ask for
    /// as long a draft as the round allows: on text the model cannot predict
    /// it stops after a token or none.
    fn probe(&self) -> Probe {
        Probe::WhileSure
    }

    fn propose(
        &mut self,
        _target: &Context,
        request: DraftRequest<'_>,
        sampler: &mut Sampler,
    ) -> Result<Draft> {
        self.catch_up(request.history)?;
        let mut tokens = Vec::with_capacity(request.n_draft);
        let mut dists = Vec::with_capacity(request.n_draft);
        // The draft chooses as the target would after the same history.
        let mut seen = sampler.params.penalty_window(request.history).to_vec();
        loop {
            let logits = self.context.logits(-1)?;
            // Stop where the draft model is unsure of its next token: such
            // drafts are rarely accepted and each costs a draft decode and a
            // verified row. (A policy that depends only on the draft keeps
            // rejection sampling exact.)
            if sampling::top_probability(logits) < DRAFT_CONFIDENCE {
                break;
            }
            let (token, dist) = sampler.draw(logits, &seen);
            seen.push(token);
            tokens.push(token);
            dists.push(dist);
            if tokens.len() == request.n_draft {
                break;
            }
            self.batch
                .fill(&[token], position(*self.decoded)?, self.seq_id, false)?;
            self.context.decode(self.batch)?;
            *self.decoded += 1;
        }
        Ok(Draft {
            tokens,
            distributions: Some(dists),
        })
    }

    fn settle(&mut self, _target: &Context, keep: usize, _accepted: usize) -> Result<()> {
        self.context.seq_rm(self.seq_id, position(keep)?, -1);
        *self.decoded = (*self.decoded).min(keep);
        Ok(())
    }
}

/// An MTP or EAGLE-3 session, with the draft context it drafts in.
pub struct SessionDrafter<'a> {
    /// The native session (which points into both contexts).
    pub session: &'a mut DraftSession,
    /// The session's draft context.
    pub context: &'a mut Context,
    /// The sequence drafted on.
    pub seq_id: i32,
}

impl SessionDrafter<'_> {
    /// Complete a pending proposal with `accepted` of its tokens.
    fn complete(&mut self, target: &Context, accepted: usize) -> Result<()> {
        if self.session.has_pending_proposal(self.seq_id)? {
            self.session
                .accept(target, self.context, self.seq_id, accepted)?;
        }
        Ok(())
    }
}

impl Drafter for SessionDrafter<'_> {
    fn n_draft(&self) -> usize {
        usize::try_from(self.session.config().n_draft_max).unwrap_or(0)
    }

    /// The session takes the target's rows of a verify batch as its own
    /// draft's: tokens after its draft would leave it out of step.
    fn follows_foreign_drafts(&self) -> bool {
        false
    }

    fn observe(&mut self, target: &Context, batch: &Batch) -> Result<()> {
        Ok(self.session.process(target, self.context, batch)?)
    }

    fn begin(&mut self, target: &Context, prompt: &[i32]) -> Result<()> {
        Ok(self
            .session
            .begin(target, self.context, self.seq_id, prompt)?)
    }

    fn propose(
        &mut self,
        target: &Context,
        request: DraftRequest<'_>,
        _sampler: &mut Sampler,
    ) -> Result<Draft> {
        let n_past = position(request.n_past)?;
        let tokens =
            self.session
                .draft(target, self.context, self.seq_id, n_past, request.id_last())?;
        // The draft context holds the drafted positions; the verify batch goes at n_past.
        self.context.seq_rm(self.seq_id, n_past, -1);
        Ok(Draft {
            tokens,
            distributions: None,
        })
    }

    fn settle(&mut self, target: &Context, keep: usize, accepted: usize) -> Result<()> {
        self.complete(target, accepted)?;
        self.context.seq_rm(self.seq_id, position(keep)?, -1);
        Ok(())
    }

    fn abandon(&mut self, target: &Context) -> Result<()> {
        self.complete(target, 0)
    }
}
