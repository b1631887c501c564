//! Greedy speculative generation over a [`DraftSession`]: prefill, draft,
//! verify every draft in one target batch, accept, roll back what was rejected.
//!
//! Every committed token is the target's own greedy choice at verification:
//! a draft token is kept only where it equals the target's argmax at its row,
//! and each round ends with the target's own token after the last match.

use crate::native::{Batch, Context, NativeError};
use crate::sampling::argmax;
use crate::session::{DraftSession, SessionError};

/// Where a greedy speculative generation stands between rounds.
///
/// At a round boundary the session is quiescent, the target and draft
/// contexts hold positions `0..n_past` of `seq_id`, and `id_last` is the last
/// committed token, not yet decoded. These three values plus the two
/// contexts' sequence states and the speculative state are a complete
/// checkpoint of the generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GreedyCursor {
    /// The sequence generated on.
    pub seq_id: i32,
    /// Tokens in the target's (and draft's) memory for `seq_id`.
    pub n_past: i32,
    /// The last committed token, decoded by the next round.
    pub id_last: i32,
}

impl From<NativeError> for SessionError {
    fn from(error: NativeError) -> Self {
        SessionError::Native(error.to_string())
    }
}

/// Rows one batch passed to `process` may hold: the smaller `n_batch` of the two contexts.
pub fn process_rows(target: &Context, draft: &Context) -> usize {
    target.capacity().batch.min(draft.capacity().batch) as usize
}

/// Decode `prompt` on the target in chunks the draft context can also take,
/// tell the session about each chunk, begin the generation, and return the
/// cursor whose `id_last` is the first generated token.
pub fn prefill(
    target: &mut Context,
    draft: &mut Context,
    session: &mut DraftSession,
    batch: &mut Batch,
    seq_id: i32,
    prompt: &[i32],
) -> Result<GreedyCursor, SessionError> {
    if prompt.is_empty() {
        return Err(SessionError::Usage("the prompt is empty".into()));
    }
    if prompt.len() >= target.n_ctx() as usize {
        return Err(SessionError::Usage(format!(
            "the prompt has {} tokens, which leaves no room in the target's {}-token context",
            prompt.len(),
            target.n_ctx()
        )));
    }
    let chunk = process_rows(target, draft).min(batch.capacity());
    for (index, piece) in prompt.chunks(chunk).enumerate() {
        batch.fill(piece, (index * chunk) as i32, seq_id, false)?;
        target.decode(batch)?;
        session.process(batch)?;
    }
    session.begin(seq_id, prompt)?;
    Ok(GreedyCursor {
        seq_id,
        n_past: prompt.len() as i32,
        id_last: argmax(target.logits(-1)?),
    })
}

/// The outcome of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    /// Tokens committed this round: the accepted drafts, then the target's own token.
    pub committed: Vec<i32>,
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Drafted tokens that matched the target.
    pub accepted: usize,
}

/// One round from `cursor`: draft, verify in one target batch, accept, roll back.
pub fn step(
    target: &mut Context,
    draft: &mut Context,
    session: &mut DraftSession,
    batch: &mut Batch,
    cursor: &mut GreedyCursor,
) -> Result<Round, SessionError> {
    let GreedyCursor {
        seq_id,
        n_past,
        id_last,
    } = *cursor;
    let room = target.n_ctx() as i64 - i64::from(n_past) - 1;
    if room < 0 {
        return Err(SessionError::Usage("the target context is full".into()));
    }
    let mut proposal = session.draft(seq_id, n_past, id_last)?;
    // Never verify past the end of the context (or past a batch).
    let limit = (room as usize).min(process_rows(target, draft).saturating_sub(1));
    let verified = proposal.len().min(limit);
    // The draft context holds the drafted positions; the verify batch goes at n_past.
    draft.seq_rm(seq_id, n_past, -1);
    let mut rows = Vec::with_capacity(verified + 1);
    rows.push(id_last);
    rows.extend_from_slice(&proposal[..verified]);
    batch.fill(&rows, n_past, seq_id, true)?;
    if let Err(error) = target
        .decode(batch)
        .map_err(SessionError::from)
        .and_then(|()| session.process(batch))
    {
        if !proposal.is_empty() {
            session.accept(seq_id, 0)?;
        }
        return Err(error);
    }
    let mut committed = Vec::with_capacity(verified + 1);
    let mut accepted = 0;
    loop {
        let choice = argmax(target.logits(accepted as i32)?);
        committed.push(choice);
        if accepted < verified && choice == proposal[accepted] {
            accepted += 1;
        } else {
            break;
        }
    }
    if !proposal.is_empty() {
        session.accept(seq_id, accepted)?;
    }
    let keep = n_past + accepted as i32 + 1;
    if !target.seq_rm(seq_id, keep, -1) {
        return Err(SessionError::Native(format!(
            "the target could not roll back to position {keep} (recurrent models need n_rs_seq >= n_draft_max)"
        )));
    }
    draft.seq_rm(seq_id, keep, -1);
    proposal.truncate(verified);
    *cursor = GreedyCursor {
        seq_id,
        n_past: keep,
        id_last: *committed
            .last()
            .expect("a round commits at least one token"),
    };
    Ok(Round {
        committed,
        drafted: proposal.len(),
        accepted,
    })
}
