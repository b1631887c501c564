//! The codec: bytes to a validated [`Checkpoint`], and captured sections to
//! bytes. Pure: no llama.cpp, no generator, no model. The large sequence
//! states are written in place by a writer the caller gives the encoder, so
//! encoding needs no intermediate copy of them.

use std::ops::Range;

use super::format::{
    checked_table, combined_crc, corrupt, decode_header, file_len, u32_at, write_header_and_table,
    CheckpointError, SectionKind, Table, TRAILER_SIZE,
};
use super::meta::Meta;
use super::state::{bindings, check_bindings, decode_state, record_bindings, EncodedState};
use crate::generator::GeneratorState;
use crate::settings::Mode;

/// A decoded, structurally valid checkpoint borrowing its payloads.
#[derive(Debug)]
pub struct Checkpoint<'a> {
    /// The format version it was written in.
    pub version: u16,
    /// The `meta` section.
    pub meta: Meta,
    /// The generator state (history included).
    pub state: GeneratorState,
    /// The target context's sequence state.
    pub target_state: &'a [u8],
    /// The draft context's sequence state.
    pub draft_state: Option<&'a [u8]>,
    /// The speculative state.
    pub speculative_state: Option<&'a [u8]>,
    /// `(section, payload bytes)` in file order.
    pub sections: Vec<(&'static str, u64)>,
    /// The CRC-32 stored in the trailer.
    pub checksum: u32,
}

/// Validate and decode `bytes`: header, section table and checksum, then
/// each section's content.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint<'_>, CheckpointError> {
    let (version, count) = decode_header(bytes)?;
    let table = checked_table(bytes, count)?;
    let meta = Meta::from_json(table.required(SectionKind::Meta)?)?;
    meta.check_versioned_entries(version)?;
    let mode = meta.config()?.mode;
    let state_bytes = table.required(SectionKind::State)?;
    let tokens = table.required(SectionKind::Tokens)?;
    let mut state = decode_state(state_bytes, tokens, mode, version)?;
    state.adaptive = meta.adaptive_state()?;
    check_sections_fit_mode(&meta, mode, &table)?;
    if version >= 2 {
        check_bindings(state_bytes, |kind| table.crc(kind))?;
    }
    Ok(Checkpoint {
        version,
        meta,
        state,
        target_state: table.required(SectionKind::TargetState)?,
        draft_state: table.payload(SectionKind::DraftState),
        speculative_state: table.payload(SectionKind::SpeculativeState),
        sections: table.sizes(),
        checksum: u32_at(bytes, bytes.len() - TRAILER_SIZE),
    })
}

/// The draft and speculative sections, and the draft model entry, are
/// present exactly when the mode has them.
fn check_sections_fit_mode(
    meta: &Meta,
    mode: Mode,
    table: &Table<'_>,
) -> Result<(), CheckpointError> {
    let has = |kind: SectionKind| table.payload(kind).is_some();
    let needs_draft_state = matches!(mode, Mode::Draft | Mode::Mtp | Mode::Eagle3);
    let needs_speculative = matches!(mode, Mode::Mtp | Mode::Eagle3);
    if needs_draft_state != has(SectionKind::DraftState)
        || needs_speculative != has(SectionKind::SpeculativeState)
    {
        return Err(corrupt(format!("sections do not fit mode {}", mode.name())));
    }
    if mode.needs_draft_model() != meta.draft_model.is_some() {
        return Err(corrupt(format!(
            "meta.draft_model: does not fit mode {}",
            mode.name()
        )));
    }
    Ok(())
}

/// Where an encoded section's payload comes from.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Bytes already captured, copied in.
    Bytes(&'a [u8]),
    /// This many bytes, written in place by the encoder's writer: a
    /// context's sequence state goes straight into the output.
    Written(usize),
}

impl Payload<'_> {
    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Bytes(bytes) => bytes.len(),
            Self::Written(len) => *len,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a checkpoint could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError<E> {
    /// The output buffer is not [`Sections::encoded_len`] bytes.
    #[error("the output buffer must be encoded_len() bytes")]
    BufferSize {
        /// Bytes the checkpoint needs.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// The writer of a [`Payload::Written`] section failed.
    #[error(transparent)]
    Write(E),
}

/// The sections a checkpoint is encoded from: the small ones captured, the
/// sequence states by length (written in place when encoding).
#[derive(Clone, Copy, Debug)]
pub struct Sections<'a> {
    /// The `meta` payload ([`Meta::to_json`]).
    pub meta: &'a [u8],
    /// The `state` and `tokens` payloads.
    pub state: &'a EncodedState,
    /// The target context's sequence state.
    pub target_state: Payload<'a>,
    /// The draft context's sequence state (`draft`, `mtp`, `eagle3` modes).
    pub draft_state: Option<Payload<'a>>,
    /// The speculative state (`mtp`, `eagle3` modes).
    pub speculative_state: Option<Payload<'a>>,
}

impl<'a> Sections<'a> {
    /// The sections in file order.
    fn in_order(&self) -> Vec<(SectionKind, Payload<'a>)> {
        let mut sections = vec![
            (SectionKind::Meta, Payload::Bytes(self.meta)),
            (SectionKind::State, Payload::Bytes(self.state.state())),
            (SectionKind::Tokens, Payload::Bytes(self.state.tokens())),
            (SectionKind::TargetState, self.target_state),
        ];
        sections.extend(self.draft_state.map(|p| (SectionKind::DraftState, p)));
        sections.extend(
            self.speculative_state
                .map(|p| (SectionKind::SpeculativeState, p)),
        );
        sections
    }

    /// Bytes of the encoded checkpoint.
    pub fn encoded_len(&self) -> usize {
        file_len(self.in_order().iter().map(|(_, payload)| payload.len()))
    }

    /// Write the checkpoint into `out` (exactly [`Sections::encoded_len`]
    /// bytes). `write(kind, payload)` fills each [`Payload::Written`]
    /// section's payload in place; its error is returned as it is.
    pub fn encode_into<E>(
        &self,
        out: &mut [u8],
        mut write: impl FnMut(SectionKind, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), EncodeError<E>> {
        let expected = self.encoded_len();
        if out.len() != expected {
            return Err(EncodeError::BufferSize {
                expected,
                actual: out.len(),
            });
        }
        let sections = self.in_order();
        let lengths: Vec<(SectionKind, usize)> =
            sections.iter().map(|(kind, p)| (*kind, p.len())).collect();
        let table_end = write_header_and_table(out, &lengths);
        let mut placed = Vec::with_capacity(sections.len());
        let mut offset = table_end;
        for (kind, payload) in sections {
            let range = offset..offset + payload.len();
            match payload {
                Payload::Bytes(bytes) => out[range.clone()].copy_from_slice(bytes),
                Payload::Written(_) => {
                    write(kind, &mut out[range.clone()]).map_err(EncodeError::Write)?
                }
            }
            offset = range.end;
            placed.push((kind, range));
        }
        let checksum = seal(out, table_end, &placed);
        out[offset..].copy_from_slice(&checksum.to_le_bytes());
        Ok(())
    }
}

/// Record the other sections' CRC-32s in the `state` section, and return the
/// CRC-32 of the whole file, combined from the sections' (each byte is read once).
fn seal(out: &mut [u8], table_end: usize, placed: &[(SectionKind, Range<usize>)]) -> u32 {
    let mut crcs: Vec<u32> = placed
        .iter()
        .map(|(_, range)| crc32fast::hash(&out[range.clone()]))
        .collect();
    let index_of = |kind: SectionKind| placed.iter().position(|(k, _)| *k == kind);
    let recorded = bindings(|kind| index_of(kind).map(|index| crcs[index]));
    let state_index = index_of(SectionKind::State).expect("a checkpoint has a state section");
    let state = placed[state_index].1.clone();
    record_bindings(&mut out[state.clone()], recorded);
    crcs[state_index] = crc32fast::hash(&out[state]);
    let lengths = placed.iter().map(|(_, range)| range.len());
    combined_crc(&out[..table_end], crcs.iter().copied().zip(lengths))
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
