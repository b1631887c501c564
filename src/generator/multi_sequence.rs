//! What every way of running many generations over one target context
//! shares (the explicit [`crate::batch_engine::BatchEngine`] engine and the
//! [`super::SharedEngine`]): the target with a KV stream per sequence, what may
//! join it, placing a sequence's state, the engine over one member, and the
//! decodes a step's rows are packed into.

use std::sync::Arc;

use super::{parts_drafter, DraftParts, Member};
use crate::engine::{Cursor, Engine, Plan};
use crate::limits::{MAX_EXACT_ROWS, MAX_SEQUENCES};
use crate::native::{restream_seq_state, Batch, Context, ContextKind, ContextParams, Model};
use crate::settings::{Mode, RuntimeOptions};
use crate::{Error, Result};

/// The shape of a batched engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineShape {
    /// Sequences held at once (1 ..= [`MAX_SEQUENCES`]).
    pub n_seq: u32,
    /// Context length of every sequence (each has a KV stream of this many cells).
    pub n_ctx: u32,
    /// Most rows of one prompt chunk (a sequence's own `n_batch` may be smaller).
    pub n_batch: u32,
}

/// What a batch cannot hold: another mode than `none` and `ngram`, another
/// context length than its sequences', longer prompt chunks than its `n_batch`.
pub(crate) fn check_joins(member: &Member, batch: EngineShape) -> Result<()> {
    let config = &member.config;
    if matches!(config.mode, Mode::Draft | Mode::Mtp | Mode::Eagle3) {
        return Err(Error::Invalid(format!(
            "mode '{}' cannot join a batch: a batch drafts from the history only \
             (modes 'none' and 'ngram'); run it as a Generator of its own",
            config.mode.name()
        )));
    }
    if config.n_ctx != batch.n_ctx {
        return Err(Error::Invalid(format!(
            "the generation's n_ctx is {}, the batch's sequences have {}",
            config.n_ctx, batch.n_ctx
        )));
    }
    if config.n_batch > batch.n_batch {
        return Err(Error::Invalid(format!(
            "the generation's n_batch ({}) exceeds the batch's ({})",
            config.n_batch, batch.n_batch
        )));
    }
    Ok(())
}

/// Empty sequence `seq_id` of a batch's target of `n_seq` sequences and put
/// `state` there (a lone context's layout) if given; on failure it stays empty.
pub(crate) fn place_state(
    target: &mut Context,
    n_seq: u32,
    seq_id: i32,
    state: Option<&[u8]>,
) -> Result<()> {
    target.seq_rm(seq_id, -1, -1);
    let Some(state) = state else {
        return Ok(());
    };
    let placed = restream_seq_state(state, n_seq, seq_id)
        .and_then(|state| target.set_seq_state(seq_id, &state));
    if placed.is_err() {
        target.seq_rm(seq_id, -1, -1);
    }
    Ok(placed?)
}

/// The target context of a batch, `config.n_seq` KV streams of
/// `config.n_ctx` cells (0: the trained length), and `config` resolved.
pub(crate) fn batch_target(
    model: &Arc<Model>,
    config: EngineShape,
    runtime: RuntimeOptions,
) -> Result<(Context, EngineShape)> {
    if config.n_seq == 0 || config.n_seq > MAX_SEQUENCES {
        return Err(Error::Invalid(format!(
            "n_seq must be between 1 and {MAX_SEQUENCES}, not {}",
            config.n_seq
        )));
    }
    if model.is_recurrent() || model.is_hybrid() {
        return Err(Error::Invalid(format!(
            "a batch needs an attention-only target; {} keeps recurrent state",
            model.architecture()
        )));
    }
    let n_ctx = crate::limits::resolve_n_ctx(config.n_ctx, model.n_ctx_train())?;
    let total = n_ctx.checked_mul(config.n_seq).ok_or_else(|| {
        Error::Invalid(format!(
            "n_ctx x n_seq ({n_ctx} x {}) overflows",
            config.n_seq
        ))
    })?;
    // A step's decode holds up to MAX_EXACT_ROWS rows, whatever the prompt chunks.
    let n_rows = config.n_batch.max(MAX_EXACT_ROWS as u32);
    let params = ContextParams {
        n_ctx: total,
        n_batch: n_rows,
        n_ubatch: n_rows,
        n_seq_max: config.n_seq,
        n_rs_seq: 0,
        kind: ContextKind::Default,
        n_threads: runtime.n_threads,
    };
    let target = Context::new(Arc::clone(model), params)?;
    let n_ctx = target.n_ctx_seq();
    Ok((target, EngineShape { n_ctx, ..config }))
}

/// Run `call` on the engine over `member` (a mode that drafts from the
/// history) on sequence `seq_id` of `target`, prompt chunks going through `batch`.
pub(crate) fn history_engine<T>(
    target: &mut Context,
    member: &mut Member,
    batch: &mut Batch,
    seq_id: i32,
    call: impl FnOnce(&mut Engine<'_>, Cursor<'_>) -> Result<T>,
) -> Result<T> {
    member_engine(
        target,
        batch,
        &mut DraftParts::History,
        member,
        seq_id,
        call,
    )
}

/// Run `call` on the engine over `member` and the drafter of its mode over
/// `parts` on sequence `seq_id` of `target`, prompt chunks going through `batch`.
pub(super) fn member_engine<T>(
    target: &mut Context,
    batch: &mut Batch,
    parts: &mut DraftParts,
    member: &mut Member,
    seq_id: i32,
    call: impl FnOnce(&mut Engine<'_>, Cursor<'_>) -> Result<T>,
) -> Result<T> {
    let grammar_drafts = member.grammar_draft_limit();
    let Member {
        config,
        state,
        sampler,
        logprobs,
        corpus,
        ..
    } = member;
    let mut drafter = parts_drafter(config, parts, &mut state.draft_past, state.n_prompt, corpus)?;
    let mut engine = Engine {
        target,
        batch,
        drafter: drafter.as_mut(),
        sampler,
        seq_id,
        policy: state.adaptive.as_mut(),
        logprobs: logprobs.as_mut(),
        grammar_drafts,
    };
    let at = Cursor {
        history: &state.history,
        n_past: state.n_past,
        finished: state.finished,
    };
    call(&mut engine, at)
}

/// Put the rows of `plans` (sequence id, plan) in `step`: each plan's rows at
/// its positions, all with logits.
pub(crate) fn fill_rows<'a>(
    step: &mut Batch,
    plans: impl Iterator<Item = (i32, &'a Plan)>,
) -> Result<()> {
    step.clear();
    for (seq_id, plan) in plans {
        push_rows(step, seq_id, plan)?;
    }
    Ok(())
}

/// Add `plan`'s rows of sequence `seq_id` to `step`, at its positions, all with logits.
pub(crate) fn push_rows(step: &mut Batch, seq_id: i32, plan: &Plan) -> Result<()> {
    let start = crate::engine::position(plan.n_past)?;
    for (offset, token) in plan.rows().into_iter().enumerate() {
        step.push(token, start + offset as i32, seq_id, true)?;
    }
    Ok(())
}

/// A decode of a round's rows failed: the rows of `seq_id` from `n_past` on
/// are removed again, and the round gets the failure.
pub(crate) fn undo_failed_decode(
    target: &mut Context,
    seq_id: i32,
    n_past: usize,
    error: &dyn std::fmt::Display,
) -> Error {
    let keep = i32::try_from(n_past).unwrap_or(i32::MAX);
    target.seq_rm(seq_id, keep, -1);
    Error::Usage(format!("the batched decode failed: {error}"))
}

/// Split plans of `rows` rows each, in order, into decodes of at most
/// [`MAX_EXACT_ROWS`] rows (index ranges); a plan of more rows is decoded alone.
pub(crate) fn decode_groups(rows: impl IntoIterator<Item = usize>) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut total, mut end) = (0, 0, 0);
    for (index, n) in rows.into_iter().enumerate() {
        if index > start && total + n > MAX_EXACT_ROWS {
            groups.push(start..index);
            (start, total) = (index, 0);
        }
        total += n;
        end = index + 1;
    }
    if start < end {
        groups.push(start..end);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(rows: &[usize]) -> Vec<Vec<usize>> {
        decode_groups(rows.iter().copied())
            .into_iter()
            .map(|range| rows[range].to_vec())
            .collect()
    }

    #[test]
    fn a_step_packs_plans_in_order_into_decodes_of_at_most_the_exact_rows() {
        assert_eq!(
            shapes(&[1, 9, 9, 1, 17, 21, 4]),
            vec![vec![1, 9], vec![9, 1], vec![17], vec![21], vec![4]]
        );
        assert!(shapes(&[]).is_empty());
        assert_eq!(shapes(&[1; 20]), vec![vec![1; 17], vec![1; 3]]);
    }
}
