//! A generator's boundary: its state and the contexts' and session's states,
//! captured as bytes and put back with every part checked against the others.

use super::{Generator, GeneratorState};
use crate::sampling::Rng;
use crate::session::SpeculativeStateView;
use crate::settings::Mode;
use crate::{Error, Result};

impl Generator {
    /// Bytes of the target context's sequence state.
    pub fn target_state_size(&mut self) -> Result<usize> {
        match self.target.own() {
            Some(context) => Ok(context.seq_state_size(0)?),
            None => Ok(self.target.state()?.len()),
        }
    }

    /// Write the target context's sequence state into `out` (exactly its size).
    pub fn write_target_state(&mut self, out: &mut [u8]) -> Result<()> {
        if let Some(context) = self.target.own() {
            return Ok(context.seq_state_into(0, out)?);
        }
        let state = self.target.state()?;
        if state.len() != out.len() {
            return Err(Error::Usage(format!(
                "the target state is {} bytes, not {}",
                state.len(),
                out.len()
            )));
        }
        out.copy_from_slice(&state);
        Ok(())
    }

    /// Bytes of the draft context's sequence state (`draft`, `mtp`, `eagle3` modes).
    pub fn draft_state_size(&mut self) -> Result<Option<usize>> {
        Ok(self
            .parts
            .context_mut()
            .map(|draft| draft.seq_state_size(0))
            .transpose()?)
    }

    /// Write the draft context's sequence state into `out` (exactly its size).
    pub fn write_draft_state(&mut self, out: &mut [u8]) -> Result<()> {
        let draft = self
            .parts
            .context_mut()
            .ok_or_else(|| Error::Usage("this mode has no draft context".into()))?;
        Ok(draft.seq_state_into(0, out)?)
    }

    /// The speculative state (`mtp`, `eagle3` modes).
    pub fn speculative_state(&self) -> Result<Option<Vec<u8>>> {
        self.parts
            .session()
            .map(|session| session.state(0))
            .transpose()
            .map_err(Error::from)
    }

    /// Everything at the current boundary, as owned copies (to put back with [`Generator::restore`]).
    pub fn boundary(&mut self) -> Result<Boundary> {
        Ok(Boundary {
            state: self.member.state.clone(),
            target_state: self.target.state()?,
            draft_state: self
                .parts
                .context_mut()
                .map(|draft| draft.seq_state(0))
                .transpose()?,
            speculative_state: self.speculative_state()?,
        })
    }

    /// Put back a boundary taken with [`Generator::boundary`] (see [`Generator::restore`]).
    pub fn put_back(&mut self, boundary: Boundary) -> std::result::Result<(), RestoreError> {
        self.restore(
            boundary.state,
            &boundary.target_state,
            boundary.draft_state.as_deref(),
            boundary.speculative_state.as_deref(),
        )
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
        if let Some(draft) = self.parts.context_mut() {
            draft.clear();
        }
        self.target
            .set_state(target_state)
            .map_err(|e| RestoreError::new("target_state", e))?;
        match (self.parts.context_mut(), draft_state) {
            (Some(draft), Some(bytes)) => draft
                .set_seq_state(0, bytes)
                .map_err(|e| RestoreError::new("draft_state", e))?,
            (None, None) => {}
            _ => return Err(RestoreError::new("draft_state", "does not fit this mode")),
        }
        if let Some(bytes) = speculative_state {
            check_speculative_state(self.member.config.mode, &state, bytes)?;
        }
        match (self.parts.session_mut(), speculative_state) {
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
        self.member.sampler.rng = rng;
        self.member.state = state;
        Ok(())
    }

    /// What can be checked of a state against the model and the context
    /// before any native state is touched.
    fn check_state(&self, state: &GeneratorState) -> std::result::Result<(), RestoreError> {
        let model = self.target.model();
        // llama.cpp's drafters abort on ids outside the vocabulary: refuse them here.
        model
            .check_tokens(&state.history)
            .map_err(|e| RestoreError::new("tokens", format!("the history holds {e}")))?;
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
        expect_positions(
            self.target.positions(),
            "target_state",
            target_last..=target_last,
        )?;
        let draft_last = match self.member.config.mode {
            Mode::Draft => last_position(state.draft_past)..=last_position(state.draft_past),
            // An MTP or EAGLE-3 draft context ends one or two positions before
            // the target's `n_past` (EAGLE-3 may not have drafted from the last one yet).
            Mode::Mtp | Mode::Eagle3 => target_last - 1..=target_last,
            Mode::None | Mode::Ngram(_) => return Ok(()),
        };
        match self.parts.context() {
            Some(draft) => expect_positions(draft.seq_positions(0), "draft_state", draft_last),
            None => Ok(()),
        }
    }

    /// The lowest and highest positions of sequence 0 in the target context
    /// and, where the mode has one, in the draft context (`-1` when empty).
    pub fn memory_positions(&self) -> Result<(Positions, Option<Positions>)> {
        let draft = self
            .parts
            .context()
            .map(|d| d.seq_positions(0))
            .transpose()?;
        Ok((self.target.positions()?, draft))
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
    positions: crate::native::NativeResult<(i32, i32)>,
    part: &'static str,
    last: std::ops::RangeInclusive<i64>,
) -> std::result::Result<(), RestoreError> {
    let (min, max) = positions.map_err(|e| RestoreError::new(part, e))?;
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
