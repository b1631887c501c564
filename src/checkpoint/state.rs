//! The `state` and `tokens` sections: a generator state's positions,
//! counters, RNG and history, the invariants a generator keeps between
//! rounds, and the bindings that tie the other sections to the state.
//! Plain data only.

use super::format::{corrupt, u32_at, u64_at, CheckpointError, SectionKind};
use crate::generator::GeneratorState;
use crate::settings::Mode;

/// Bytes of the `state` section in version 1: eight u64, the finished flag, the RNG.
pub(super) const STATE_SIZE_V1: usize = 8 * 8 + 1 + 32;
/// Bytes of the `state` section in version 2: version 1's, then the bindings.
pub(super) const STATE_SIZE: usize = STATE_SIZE_V1 + 4 * BOUND_SECTIONS.len();
/// The sections whose CRC-32 the `state` section records (version 2), in order:
/// a section spliced in from another checkpoint is refused.
pub(super) const BOUND_SECTIONS: [SectionKind; 5] = [
    SectionKind::Meta,
    SectionKind::Tokens,
    SectionKind::TargetState,
    SectionKind::DraftState,
    SectionKind::SpeculativeState,
];
/// Offset of the finished flag in the `state` section.
const FINISHED_AT: usize = 64;
/// Offset of the RNG state in the `state` section.
const RNG_AT: usize = 65;

/// A generator state's `state` and `tokens` payloads, as written. The
/// bindings in `state` are left zero: the encoder records them once every
/// section is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedState {
    state: Vec<u8>,
    tokens: Vec<u8>,
}

impl EncodedState {
    /// Encode `state` (its history becomes the `tokens` section).
    pub fn new(state: &GeneratorState) -> Self {
        let mut out = Vec::with_capacity(STATE_SIZE);
        for value in [
            state.n_prompt as u64,
            state.n_past as u64,
            state.draft_past as u64,
            state.rounds,
            state.drafted,
            state.accepted,
            state.history.len() as u64,
            state.delivered as u64,
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.push(u8::from(state.finished));
        for word in state.rng {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.resize(STATE_SIZE, 0);
        Self {
            state: out,
            tokens: state.history.iter().flat_map(|t| t.to_le_bytes()).collect(),
        }
    }

    /// The `state` payload, bindings zero.
    pub fn state(&self) -> &[u8] {
        &self.state
    }

    /// The `tokens` payload.
    pub fn tokens(&self) -> &[u8] {
        &self.tokens
    }
}

/// The `state` section's fields as read, before any is trusted.
struct Fields {
    n_prompt: u64,
    n_past: u64,
    draft_past: u64,
    rounds: u64,
    drafted: u64,
    accepted: u64,
    history_length: u64,
    delivered: u64,
    finished: u8,
    rng: [u64; 4],
}

impl Fields {
    /// Read a `state` payload of a checked size.
    fn read(bytes: &[u8]) -> Self {
        let field = |index: usize| u64_at(bytes, index * 8);
        Self {
            n_prompt: field(0),
            n_past: field(1),
            draft_past: field(2),
            rounds: field(3),
            drafted: field(4),
            accepted: field(5),
            history_length: field(6),
            delivered: field(7),
            finished: bytes[FINISHED_AT],
            rng: [0, 1, 2, 3].map(|i| u64_at(bytes, RNG_AT + 8 * i)),
        }
    }

    /// `1 <= n_prompt <= n_past = length - 1`, and `draft_past <= n_past` in
    /// `draft` mode, 0 otherwise.
    fn check_positions(&self, length: u64, mode: Mode) -> Result<(), CheckpointError> {
        let (n_prompt, n_past) = (self.n_prompt, self.n_past);
        if n_prompt == 0 || n_prompt > n_past || n_past.checked_add(1) != Some(length) {
            return Err(corrupt(
                "state.n_past: positions are inconsistent (1 <= n_prompt <= n_past = history length - 1)",
            ));
        }
        let may_draft_past = if mode == Mode::Draft { n_past } else { 0 };
        if self.draft_past > may_draft_past {
            return Err(corrupt(format!(
                "state.draft_past: {} exceeds {may_draft_past}",
                self.draft_past
            )));
        }
        Ok(())
    }

    /// The counters account for the generated tokens: the first comes from
    /// the prompt's pass, each round commits its accepted drafts and one more.
    /// Checked after [`Fields::check_positions`] (`n_prompt < length`).
    fn check_counters(&self, length: u64) -> Result<(), CheckpointError> {
        let generated = length - self.n_prompt;
        if self.delivered > generated {
            return Err(corrupt(
                "state.delivered: more tokens delivered than generated",
            ));
        }
        let committed_by_rounds = self
            .rounds
            .checked_add(self.accepted)
            .and_then(|n| n.checked_add(1));
        if self.accepted > self.drafted || committed_by_rounds != Some(generated) {
            return Err(corrupt(
                "state.rounds: rounds, drafted and accepted do not account for the generated tokens",
            ));
        }
        Ok(())
    }

    fn finished(&self) -> Result<bool, CheckpointError> {
        match self.finished {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(corrupt("state.finished: not 0 or 1")),
        }
    }

    fn rng(&self) -> Result<[u64; 4], CheckpointError> {
        if self.rng == [0; 4] {
            return Err(corrupt("state.rng: the RNG state is all zero"));
        }
        Ok(self.rng)
    }
}

/// A count from the file as a `usize`.
fn to_usize(value: u64, field: &str) -> Result<usize, CheckpointError> {
    usize::try_from(value).map_err(|_| corrupt(format!("state.{field}: too large")))
}

/// The `state` section is the size of its format version.
fn check_state_size(bytes: &[u8], version: u16) -> Result<(), CheckpointError> {
    let size = if version == 1 {
        STATE_SIZE_V1
    } else {
        STATE_SIZE
    };
    if bytes.len() == size {
        return Ok(());
    }
    Err(corrupt(format!(
        "the state section is {} bytes, not the {size} of format version {version}",
        bytes.len()
    )))
}

/// The token history, `i32` each: `declared` of them, at least one.
fn decode_tokens(tokens: &[u8], declared: u64) -> Result<Vec<i32>, CheckpointError> {
    if !tokens.len().is_multiple_of(4) || (tokens.len() / 4) as u64 != declared || declared == 0 {
        return Err(corrupt(
            "state.history_length: does not match the tokens section",
        ));
    }
    Ok(tokens
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4")))
        .collect())
}

/// Decode the `state` section against the token history and the mode, with
/// every invariant a generator keeps between rounds checked in checked
/// arithmetic: nothing from the file is used before it is bounded.
pub(super) fn decode_state(
    bytes: &[u8],
    tokens: &[u8],
    mode: Mode,
    version: u16,
) -> Result<GeneratorState, CheckpointError> {
    check_state_size(bytes, version)?;
    let fields = Fields::read(bytes);
    let history = decode_tokens(tokens, fields.history_length)?;
    fields.check_positions(history.len() as u64, mode)?;
    fields.check_counters(history.len() as u64)?;
    let finished = fields.finished()?;
    let rng = fields.rng()?;
    Ok(GeneratorState {
        history,
        n_prompt: to_usize(fields.n_prompt, "n_prompt")?,
        n_past: to_usize(fields.n_past, "n_past")?,
        draft_past: to_usize(fields.draft_past, "draft_past")?,
        delivered: to_usize(fields.delivered, "delivered")?,
        rng,
        finished,
        rounds: fields.rounds,
        drafted: fields.drafted,
        accepted: fields.accepted,
        // The adaptive policy's state travels in `meta` (format version 4).
        adaptive: None,
    })
}

/// The CRC-32 each bound section must have, in [`BOUND_SECTIONS`] order:
/// its payload's, or 0 for a section the checkpoint does not have.
pub(super) fn bindings(crc_of: impl Fn(SectionKind) -> Option<u32>) -> [u32; 5] {
    BOUND_SECTIONS.map(|kind| crc_of(kind).unwrap_or(0))
}

/// Record the bindings in a version-2 `state` payload.
pub(super) fn record_bindings(state: &mut [u8], bindings: [u32; 5]) {
    for (index, crc) in bindings.iter().enumerate() {
        let at = STATE_SIZE_V1 + 4 * index;
        state[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Refuse any section whose CRC-32 differs from the one the `state` section
/// recorded for it (version 2): sections are not interchangeable between
/// checkpoints, even of the same generation.
pub(super) fn check_bindings(
    state: &[u8],
    crc_of: impl Fn(SectionKind) -> Option<u32>,
) -> Result<(), CheckpointError> {
    for (index, actual) in bindings(crc_of).into_iter().enumerate() {
        let recorded = u32_at(state, STATE_SIZE_V1 + 4 * index);
        if recorded != actual {
            return Err(corrupt(format!(
                "section {} does not belong to this checkpoint's state (CRC-32 {actual:08x}, recorded {recorded:08x})",
                BOUND_SECTIONS[index].name()
            )));
        }
    }
    Ok(())
}
