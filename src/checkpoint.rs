//! The checkpoint format: one versioned, checksummed file holding everything a
//! generation needs to resume bit for bit (specified in docs/checkpoint-format.md).
//!
//! Layout (little-endian): a 32-byte header, a table of sections, the section
//! payloads in table order, and a CRC-32 trailer over every preceding byte.
//! Decoding validates everything before anything is applied.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::generator::{
    Generator, GeneratorConfig, GeneratorError, GeneratorState, Mode, RestoreError, RuntimeOptions,
};
use crate::native::Model;
use crate::native_info;
use crate::sampling::SamplingParams;
use crate::settings::NgramConfig;
use crate::speculative::MAX_SPECULATIVE_STATE_BYTES;

/// First eight bytes of every checkpoint.
pub const MAGIC: &[u8; 8] = b"SPECSTAT";
/// The format version this build writes. Version 1 (no section bindings) is still read.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest format version this build reads.
const OLDEST_READABLE_VERSION: u16 = 1;
const HEADER_SIZE: usize = 32;
const TABLE_ENTRY_SIZE: usize = 24;
const TRAILER_SIZE: usize = 4;
const MAX_SECTIONS: usize = 16;

/// Section kinds, in the order they are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    /// JSON: versions, model fingerprints, mode, configuration, sampling.
    Meta = 1,
    /// Binary generator state: positions, counters, RNG.
    State = 2,
    /// Token history (prompt and committed tokens), i32 each.
    Tokens = 3,
    /// The target context's sequence state.
    TargetState = 4,
    /// The draft context's sequence state.
    DraftState = 5,
    /// The speculative session's state.
    SpeculativeState = 6,
}

impl SectionKind {
    const ALL: [SectionKind; 6] = [
        Self::Meta,
        Self::State,
        Self::Tokens,
        Self::TargetState,
        Self::DraftState,
        Self::SpeculativeState,
    ];

    fn from_u32(raw: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| *kind as u32 == raw)
    }

    /// The section's name in errors and `inspect`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Meta => "meta",
            Self::State => "state",
            Self::Tokens => "tokens",
            Self::TargetState => "target_state",
            Self::DraftState => "draft_state",
            Self::SpeculativeState => "speculative_state",
        }
    }

    /// The largest payload accepted.
    pub fn maximum(self) -> u64 {
        match self {
            Self::Meta => 1 << 20,
            Self::State => 1 << 10,
            Self::Tokens => 4 << 24,
            Self::TargetState | Self::DraftState => 1 << 36,
            Self::SpeculativeState => MAX_SPECULATIVE_STATE_BYTES as u64,
        }
    }
}

/// Why a checkpoint was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// The bytes do not start with the checkpoint magic.
    #[error("not a specstate checkpoint")]
    NotACheckpoint,
    /// Written by a format version this build cannot read.
    #[error(
        "unsupported checkpoint format version {found} (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u16,
        /// The version supported.
        supported: u16,
    },
    /// Fewer bytes than the header declares.
    #[error("the checkpoint is truncated: {actual} of {expected} bytes")]
    Truncated {
        /// Bytes declared.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The checksum does not match the content.
    #[error("checkpoint checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    ChecksumMismatch {
        /// Checksum stored in the trailer.
        stored: u32,
        /// Checksum of the content.
        computed: u32,
    },
    /// Inconsistent structure or content.
    #[error("corrupt checkpoint: {0}")]
    Corrupt(String),
    /// A section is larger than its bound.
    #[error("checkpoint section {section} is {size} bytes, exceeding its {maximum}-byte bound")]
    SectionTooLarge {
        /// The section's name.
        section: &'static str,
        /// Its declared size.
        size: u64,
        /// The bound.
        maximum: u64,
    },
    /// Taken with a different model file.
    #[error("the checkpoint's {role} model is {expected}, but the {role} model given is {actual}")]
    ModelMismatch {
        /// `target` or `draft`.
        role: &'static str,
        /// Fingerprint in the checkpoint (or `none`).
        expected: String,
        /// Fingerprint of the model given (or `none`).
        actual: String,
    },
    /// A different mode or configuration than the generator's.
    #[error("the checkpoint's {field} is {checkpoint}, the generator's is {generator}")]
    ConfigMismatch {
        /// The differing field.
        field: &'static str,
        /// Value in the checkpoint.
        checkpoint: String,
        /// Value in the generator.
        generator: String,
    },
}

/// An exact fingerprint of a model file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFingerprint {
    /// SHA-256 of the file's bytes, hex.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
    /// File name when saved (informational).
    pub file: String,
}

impl std::fmt::Display for ModelFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The name comes from a file: shown with control characters escaped.
        let file: String = self.file.chars().take(256).collect();
        write!(
            f,
            "{} ({} bytes, sha256 {})",
            file.escape_debug(),
            self.size,
            self.sha256.escape_debug()
        )
    }
}

/// The fingerprint of a loaded model's file.
pub fn fingerprint(model: &Model) -> ModelFingerprint {
    let (sha256, size) = model.file_digest().clone();
    ModelFingerprint {
        sha256,
        size,
        file: model
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// The `meta` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// specstate release that wrote it.
    pub specstate_version: String,
    /// Pinned llama-cpp-sys-4 release.
    pub llama_cpp_sys_version: String,
    /// llama.cpp build.
    pub llama_cpp_build: String,
    /// llama.cpp commit.
    pub llama_cpp_commit: String,
    /// `none`, `ngram`, `draft`, `mtp` or `eagle3`.
    pub mode: String,
    /// n-gram lengths (`ngram` mode).
    pub ngram: Option<[usize; 2]>,
    /// Most tokens drafted per round.
    pub n_draft: u32,
    /// Context length.
    pub n_ctx: u32,
    /// Rows per decode.
    pub n_batch: u32,
    /// Sampling temperature (0: greedy).
    pub temperature: f32,
    /// Top-k (0: off).
    pub top_k: u32,
    /// Top-p (1: off).
    pub top_p: f32,
    /// RNG seed.
    pub seed: u64,
    /// The target model.
    pub target_model: ModelFingerprint,
    /// The draft model (`draft` and `eagle3` modes).
    pub draft_model: Option<ModelFingerprint>,
}

impl Meta {
    /// The generator configuration the checkpoint was taken with.
    /// Every setting is checked with the generator's own rules
    /// ([`GeneratorConfig::validate`]); a failure names the field.
    pub fn config(&self) -> Result<GeneratorConfig, CheckpointError> {
        let mode = match (self.mode.as_str(), self.ngram) {
            ("none", None) => Mode::None,
            ("ngram", Some([n_max, n_min])) => Mode::Ngram(NgramConfig { n_max, n_min }),
            ("draft", None) => Mode::Draft,
            ("mtp", None) => Mode::Mtp,
            ("eagle3", None) => Mode::Eagle3,
            (mode, _) => {
                return Err(CheckpointError::Corrupt(format!(
                    "meta.mode: unknown mode {:?} (or n-gram sizes that do not fit it)",
                    truncated(mode)
                )))
            }
        };
        let config = GeneratorConfig {
            mode,
            n_draft: self.n_draft,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
            n_ctx: self.n_ctx,
            n_batch: self.n_batch,
        };
        config
            .validate()
            .map_err(|e| CheckpointError::Corrupt(format!("meta.{e}")))?;
        Ok(config)
    }
}

/// At most 64 characters of a string from a file, for messages.
fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

fn describe_mode(config: &GeneratorConfig) -> (String, Option<[usize; 2]>) {
    match config.mode {
        Mode::Ngram(ngram) => ("ngram".into(), Some([ngram.n_max, ngram.n_min])),
        mode => (mode.name().into(), None),
    }
}

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

/// Bytes of the `state` section in version 1: eight u64, the finished flag, the RNG.
const STATE_SIZE_V1: usize = 8 * 8 + 1 + 32;
/// Bytes of the `state` section in version 2: version 1's, then the bindings.
const STATE_SIZE: usize = STATE_SIZE_V1 + 4 * BOUND_SECTIONS.len();
/// The sections whose CRC-32 the `state` section records (version 2), in order:
/// a section spliced in from another checkpoint is refused.
const BOUND_SECTIONS: [SectionKind; 5] = [
    SectionKind::Meta,
    SectionKind::Tokens,
    SectionKind::TargetState,
    SectionKind::DraftState,
    SectionKind::SpeculativeState,
];

fn encode_state(state: &GeneratorState) -> Vec<u8> {
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
    // The bindings are filled in once every section is written.
    out.resize(STATE_SIZE, 0);
    out
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

fn corrupt(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt(what.into())
}

/// The token history, `i32` each.
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
fn decode_state(
    bytes: &[u8],
    tokens: &[u8],
    mode: Mode,
    version: u16,
) -> Result<GeneratorState, CheckpointError> {
    let size = if version == 1 {
        STATE_SIZE_V1
    } else {
        STATE_SIZE
    };
    if bytes.len() != size {
        return Err(corrupt(format!(
            "the state section is {} bytes, not the {size} of format version {version}",
            bytes.len()
        )));
    }
    let field = |index: usize| u64_at(bytes, index * 8);
    let history = decode_tokens(tokens, field(6))?;
    let length = history.len() as u64;
    let (n_prompt, n_past, draft_past) = (field(0), field(1), field(2));
    let (rounds, drafted, accepted, delivered) = (field(3), field(4), field(5), field(7));
    if n_prompt == 0 || n_prompt > n_past || n_past.checked_add(1) != Some(length) {
        return Err(corrupt(
            "state.n_past: positions are inconsistent (1 <= n_prompt <= n_past = history length - 1)",
        ));
    }
    let may_draft_past = if mode == Mode::Draft { n_past } else { 0 };
    if draft_past > may_draft_past {
        return Err(corrupt(format!(
            "state.draft_past: {draft_past} exceeds {may_draft_past}"
        )));
    }
    let generated = length - n_prompt;
    if delivered > generated {
        return Err(corrupt(
            "state.delivered: more tokens delivered than generated",
        ));
    }
    // The first token comes from the prompt's pass; each round commits its
    // accepted drafts and one token more.
    let committed_by_rounds = rounds.checked_add(accepted).and_then(|n| n.checked_add(1));
    if accepted > drafted || committed_by_rounds != Some(generated) {
        return Err(corrupt(
            "state.rounds: rounds, drafted and accepted do not account for the generated tokens",
        ));
    }
    let finished = match bytes[64] {
        0 => false,
        1 => true,
        _ => return Err(corrupt("state.finished: not 0 or 1")),
    };
    let rng = [0, 1, 2, 3].map(|i| u64_at(bytes, 65 + 8 * i));
    if rng == [0; 4] {
        return Err(corrupt("state.rng: the RNG state is all zero"));
    }
    Ok(GeneratorState {
        history,
        n_prompt: usize::try_from(n_prompt).map_err(|_| corrupt("state.n_prompt: too large"))?,
        n_past: usize::try_from(n_past).map_err(|_| corrupt("state.n_past: too large"))?,
        draft_past: usize::try_from(draft_past)
            .map_err(|_| corrupt("state.draft_past: too large"))?,
        delivered: usize::try_from(delivered).map_err(|_| corrupt("state.delivered: too large"))?,
        rng,
        finished,
        rounds,
        drafted,
        accepted,
    })
}

/// The CRC-32 each bound section must have, in [`BOUND_SECTIONS`] order:
/// its payload's, or 0 for a section the checkpoint does not have.
fn bindings(crc_of: impl Fn(SectionKind) -> Option<u32>) -> [u32; 5] {
    BOUND_SECTIONS.map(|kind| crc_of(kind).unwrap_or(0))
}

/// Refuse any section whose CRC-32 differs from the one the `state` section
/// recorded for it (version 2): sections are not interchangeable between
/// checkpoints, even of the same generation.
fn check_bindings(
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

/// The CRC-32 of `prefix` followed by sections given by their own CRC-32s and
/// lengths, in file order: each byte of a checkpoint is read once.
fn combined_crc(prefix: &[u8], sections: impl IntoIterator<Item = (u32, usize)>) -> u32 {
    let mut whole = crc32fast::Hasher::new();
    whole.update(prefix);
    for (crc, len) in sections {
        whole.combine(&crc32fast::Hasher::new_with_initial_len(crc, len as u64));
    }
    whole.finalize()
}

/// What a checkpoint is written from. The small sections are captured here;
/// the contexts' sequence states are written straight from llama.cpp into
/// the output by [`Capture::encode_into`], so a capture needs no second copy.
pub struct Capture {
    meta: Vec<u8>,
    state: Vec<u8>,
    tokens: Vec<u8>,
    target_len: usize,
    draft_len: Option<usize>,
    speculative_state: Option<Vec<u8>>,
}

/// Capture a generator at its current boundary.
pub fn capture(generator: &mut Generator) -> Result<Capture, GeneratorError> {
    if !generator.started() {
        return Err(GeneratorError::Usage(
            "nothing to checkpoint: the generator has no prompt yet".into(),
        ));
    }
    let config = *generator.config();
    let (mode, ngram) = describe_mode(&config);
    let meta = Meta {
        specstate_version: env!("CARGO_PKG_VERSION").into(),
        llama_cpp_sys_version: native_info::LLAMA_CPP_SYS_VERSION.into(),
        llama_cpp_build: native_info::LLAMA_CPP_BUILD.into(),
        llama_cpp_commit: native_info::LLAMA_CPP_COMMIT.into(),
        mode,
        ngram,
        n_draft: config.n_draft,
        n_ctx: config.n_ctx,
        n_batch: config.n_batch,
        temperature: config.sampling.temperature,
        top_k: config.sampling.top_k,
        top_p: config.sampling.top_p,
        seed: config.sampling.seed,
        target_model: fingerprint(generator.target_model()),
        draft_model: generator.draft_model().map(|m| fingerprint(m)),
    };
    let meta = serde_json::to_vec(&meta).map_err(|e| GeneratorError::Invalid(e.to_string()))?;
    let state = generator.state();
    Ok(Capture {
        meta,
        state: encode_state(state),
        tokens: state.history.iter().flat_map(|t| t.to_le_bytes()).collect(),
        speculative_state: generator.speculative_state()?,
        target_len: generator.target_state_size()?,
        draft_len: generator.draft_state_size()?,
    })
}

/// Where a section's bytes come from.
enum Source<'a> {
    Bytes(&'a [u8]),
    TargetState(usize),
    DraftState(usize),
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Self::Bytes(bytes) => bytes.len(),
            Self::TargetState(len) | Self::DraftState(len) => *len,
        }
    }
}

impl Capture {
    fn sections(&self) -> Vec<(SectionKind, Source<'_>)> {
        let mut sections = vec![
            (SectionKind::Meta, Source::Bytes(&self.meta)),
            (SectionKind::State, Source::Bytes(&self.state)),
            (SectionKind::Tokens, Source::Bytes(&self.tokens)),
            (
                SectionKind::TargetState,
                Source::TargetState(self.target_len),
            ),
        ];
        if let Some(len) = self.draft_len {
            sections.push((SectionKind::DraftState, Source::DraftState(len)));
        }
        if let Some(speculative) = &self.speculative_state {
            sections.push((SectionKind::SpeculativeState, Source::Bytes(speculative)));
        }
        sections
    }

    /// Bytes of the encoded checkpoint.
    pub fn encoded_len(&self) -> usize {
        let sections = self.sections();
        HEADER_SIZE
            + TABLE_ENTRY_SIZE * sections.len()
            + sections
                .iter()
                .map(|(_, source)| source.len())
                .sum::<usize>()
            + TRAILER_SIZE
    }

    /// Write the checkpoint into `out` (exactly `encoded_len()` bytes),
    /// copying the contexts' states from `generator`, which must be the one
    /// captured and unchanged since.
    pub fn encode_into(
        &self,
        generator: &mut Generator,
        out: &mut [u8],
    ) -> Result<(), GeneratorError> {
        let sections = self.sections();
        let total = self.encoded_len();
        if out.len() != total {
            return Err(GeneratorError::Usage(
                "the output buffer must be encoded_len() bytes".into(),
            ));
        }
        let table_end = write_header_and_table(out, &sections, total);
        let mut offset = table_end;
        let mut placed = Vec::with_capacity(sections.len());
        for (kind, source) in &sections {
            let payload = &mut out[offset..offset + source.len()];
            match source {
                Source::Bytes(bytes) => payload.copy_from_slice(bytes),
                Source::TargetState(_) => generator.write_target_state(payload)?,
                Source::DraftState(_) => generator.write_draft_state(payload)?,
            }
            placed.push((*kind, offset..offset + source.len()));
            offset += source.len();
        }
        let checksum = seal(out, table_end, &placed);
        out[offset..offset + TRAILER_SIZE].copy_from_slice(&checksum.to_le_bytes());
        Ok(())
    }
}

/// Write the header and the section table; returns where the payloads start.
fn write_header_and_table(
    out: &mut [u8],
    sections: &[(SectionKind, Source<'_>)],
    total: usize,
) -> usize {
    out[..8].copy_from_slice(MAGIC);
    out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[10..12].copy_from_slice(&(HEADER_SIZE as u16).to_le_bytes());
    out[12..16].copy_from_slice(&(sections.len() as u32).to_le_bytes());
    out[16..24].copy_from_slice(&(total as u64).to_le_bytes());
    out[24..32].fill(0);
    let mut offset = HEADER_SIZE + TABLE_ENTRY_SIZE * sections.len();
    for (index, (kind, source)) in sections.iter().enumerate() {
        let entry = HEADER_SIZE + TABLE_ENTRY_SIZE * index;
        out[entry..entry + 4].copy_from_slice(&(*kind as u32).to_le_bytes());
        out[entry + 4..entry + 8].fill(0);
        out[entry + 8..entry + 16].copy_from_slice(&(offset as u64).to_le_bytes());
        out[entry + 16..entry + 24].copy_from_slice(&(source.len() as u64).to_le_bytes());
        offset += source.len();
    }
    HEADER_SIZE + TABLE_ENTRY_SIZE * sections.len()
}

/// Record the other sections' CRC-32s in the `state` section, and return the
/// CRC-32 of the whole file, combined from the sections' (each byte is read once).
fn seal(out: &mut [u8], table_end: usize, placed: &[(SectionKind, std::ops::Range<usize>)]) -> u32 {
    let mut crcs: Vec<u32> = placed
        .iter()
        .map(|(_, range)| crc32fast::hash(&out[range.clone()]))
        .collect();
    let index_of = |kind: SectionKind| placed.iter().position(|(k, _)| *k == kind);
    let recorded = bindings(|kind| index_of(kind).map(|index| crcs[index]));
    let state_index = index_of(SectionKind::State).expect("a checkpoint has a state section");
    let state = placed[state_index].1.clone();
    for (index, crc) in recorded.iter().enumerate() {
        let at = state.start + STATE_SIZE_V1 + 4 * index;
        out[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    crcs[state_index] = crc32fast::hash(&out[state]);
    let lengths = placed.iter().map(|(_, range)| range.len());
    combined_crc(&out[..table_end], crcs.iter().copied().zip(lengths))
}

/// Validate and decode `bytes`: structure, checksum, bounds and content.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint<'_>, CheckpointError> {
    let (version, count) = decode_header(bytes)?;
    let (table, crcs) = checked_table(bytes, count)?;
    let crc_of = |kind: SectionKind| {
        let index = table.iter().position(|(k, _)| *k == kind)?;
        Some(crcs[index])
    };
    let payload = |kind: SectionKind| table.iter().find(|(k, _)| *k == kind).map(|(_, p)| *p);
    let required = |kind: SectionKind| {
        payload(kind).ok_or_else(|| corrupt(format!("no {} section", kind.name())))
    };
    let meta: Meta = serde_json::from_slice(required(SectionKind::Meta)?)
        .map_err(|e| corrupt(format!("meta section: {e}")))?;
    let config = meta.config()?;
    let state_bytes = required(SectionKind::State)?;
    let state = decode_state(
        state_bytes,
        required(SectionKind::Tokens)?,
        config.mode,
        version,
    )?;
    check_sections_fit_mode(&meta, config.mode, payload)?;
    if version >= 2 {
        check_bindings(state_bytes, crc_of)?;
    }
    Ok(Checkpoint {
        version,
        meta,
        state,
        target_state: required(SectionKind::TargetState)?,
        draft_state: payload(SectionKind::DraftState),
        speculative_state: payload(SectionKind::SpeculativeState),
        sections: table
            .iter()
            .map(|(k, p)| (k.name(), p.len() as u64))
            .collect(),
        checksum: u32_at(bytes, bytes.len() - TRAILER_SIZE),
    })
}

/// Each section's kind and payload, in file order.
type Table<'a> = Vec<(SectionKind, &'a [u8])>;

/// The section table and each section's CRC-32, once the file's checksum is
/// verified. A checksum mismatch is reported before anything wrong with the
/// table; with a valid table the file's CRC-32 is combined from the sections'.
fn checked_table(bytes: &[u8], count: usize) -> Result<(Table<'_>, Vec<u32>), CheckpointError> {
    let body_end = bytes.len() - TRAILER_SIZE;
    let stored = u32_at(bytes, body_end);
    let table = decode_table(bytes, count);
    let crcs: Vec<u32> = match &table {
        Ok(entries) => entries.iter().map(|(_, p)| crc32fast::hash(p)).collect(),
        Err(_) => Vec::new(),
    };
    let computed = match &table {
        Ok(entries) => {
            let table_end = HEADER_SIZE + TABLE_ENTRY_SIZE * count;
            let lengths = entries.iter().map(|(_, p)| p.len());
            combined_crc(&bytes[..table_end], crcs.iter().copied().zip(lengths))
        }
        Err(_) => crc32fast::hash(&bytes[..body_end]),
    };
    if stored != computed {
        return Err(CheckpointError::ChecksumMismatch { stored, computed });
    }
    Ok((table?, crcs))
}

/// Check the header: magic, version, declared length, header fields. Returns
/// the version and the section count; the table fits in the file.
fn decode_header(bytes: &[u8]) -> Result<(u16, usize), CheckpointError> {
    let len = bytes.len() as u64;
    let truncated = |expected: u64| CheckpointError::Truncated {
        expected,
        actual: len,
    };
    if bytes.len() < MAGIC.len() {
        let is_prefix = MAGIC.starts_with(bytes) && !bytes.is_empty();
        return Err(if is_prefix {
            truncated(HEADER_SIZE as u64)
        } else {
            CheckpointError::NotACheckpoint
        });
    }
    if &bytes[..8] != MAGIC {
        return Err(CheckpointError::NotACheckpoint);
    }
    if bytes.len() < 10 {
        return Err(truncated(HEADER_SIZE as u64));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(CheckpointError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if bytes.len() < HEADER_SIZE {
        return Err(truncated(HEADER_SIZE as u64));
    }
    let total = u64_at(bytes, 16);
    if len < total {
        return Err(truncated(total));
    }
    if len > total {
        return Err(corrupt(format!(
            "{} bytes follow the declared end",
            len - total
        )));
    }
    let header_size = u16::from_le_bytes([bytes[10], bytes[11]]) as usize;
    let count = u32_at(bytes, 12) as usize;
    if header_size != HEADER_SIZE || bytes[24..32] != [0; 8] {
        return Err(corrupt("unexpected header fields"));
    }
    if count == 0 || count > MAX_SECTIONS {
        return Err(corrupt(format!("{count} sections")));
    }
    if HEADER_SIZE + TABLE_ENTRY_SIZE * count + TRAILER_SIZE > bytes.len() {
        return Err(corrupt("the section table overruns the file"));
    }
    Ok((version, count))
}

/// Check the section table: known kinds, bounds, order, tiling, no
/// duplicates. Returns each section's kind and payload, in file order.
fn decode_table(bytes: &[u8], count: usize) -> Result<Table<'_>, CheckpointError> {
    let body_end = (bytes.len() - TRAILER_SIZE) as u64;
    let mut entries: Table<'_> = Vec::with_capacity(count);
    let mut expected_offset = (HEADER_SIZE + TABLE_ENTRY_SIZE * count) as u64;
    for index in 0..count {
        let entry = &bytes[HEADER_SIZE + TABLE_ENTRY_SIZE * index..][..TABLE_ENTRY_SIZE];
        let raw_kind = u32_at(entry, 0);
        let kind = SectionKind::from_u32(raw_kind)
            .ok_or_else(|| corrupt(format!("unknown section kind {raw_kind}")))?;
        let (offset, size) = (u64_at(entry, 8), u64_at(entry, 16));
        if entry[4..8] != [0; 4] {
            return Err(corrupt("unexpected section flags"));
        }
        if size > kind.maximum() {
            return Err(CheckpointError::SectionTooLarge {
                section: kind.name(),
                size,
                maximum: kind.maximum(),
            });
        }
        let end = offset.checked_add(size).filter(|end| *end <= body_end);
        let Some(end) = end.filter(|_| offset == expected_offset) else {
            return Err(corrupt(format!("section {} is out of place", kind.name())));
        };
        if entries.iter().any(|(k, _)| *k == kind) {
            return Err(corrupt(format!("section {} appears twice", kind.name())));
        }
        entries.push((kind, &bytes[offset as usize..end as usize]));
        expected_offset = end;
    }
    if expected_offset != body_end {
        return Err(corrupt("the sections do not fill the file"));
    }
    Ok(entries)
}

/// The draft and speculative sections, and the draft model entry, are
/// present exactly when the mode has them.
fn check_sections_fit_mode<'a>(
    meta: &Meta,
    mode: Mode,
    payload: impl Fn(SectionKind) -> Option<&'a [u8]>,
) -> Result<(), CheckpointError> {
    let has = |kind: SectionKind| payload(kind).is_some();
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

fn check_model(
    role: &'static str,
    expected: Option<&ModelFingerprint>,
    model: Option<&Model>,
) -> Result<(), GeneratorError> {
    let actual = model.map(fingerprint);
    let same = match (expected, &actual) {
        (Some(e), Some(a)) => e.sha256 == a.sha256 && e.size == a.size,
        (None, None) => true,
        _ => false,
    };
    if same {
        return Ok(());
    }
    let show =
        |f: Option<&ModelFingerprint>| f.map_or_else(|| "none".to_owned(), ToString::to_string);
    Err(checkpoint_error(CheckpointError::ModelMismatch {
        role,
        expected: show(expected),
        actual: show(actual.as_ref()),
    }))
}

/// Wrap a checkpoint error as a generator error (it stays recognisable).
pub fn checkpoint_error(error: CheckpointError) -> GeneratorError {
    GeneratorError::Invalid(error.to_string()) // TEMPORARY until the checkpoint split lands
}

/// Check that `checkpoint` was taken with these models.
pub fn check_models(
    checkpoint: &Checkpoint<'_>,
    target: &Model,
    draft: Option<&Model>,
) -> Result<(), GeneratorError> {
    check_model("target", Some(&checkpoint.meta.target_model), Some(target))?;
    check_model("draft", checkpoint.meta.draft_model.as_ref(), draft)
}

/// Check that `checkpoint` has the same mode and configuration as `config`.
pub fn check_config(
    checkpoint: &Checkpoint<'_>,
    config: &GeneratorConfig,
) -> Result<(), GeneratorError> {
    let theirs = checkpoint.meta.config().map_err(checkpoint_error)?;
    let fields: [(&'static str, String, String); 5] = [
        (
            "mode",
            format!("{:?}", theirs.mode),
            format!("{:?}", config.mode),
        ),
        (
            "n_draft",
            theirs.n_draft.to_string(),
            config.n_draft.to_string(),
        ),
        ("n_ctx", theirs.n_ctx.to_string(), config.n_ctx.to_string()),
        (
            "n_batch",
            theirs.n_batch.to_string(),
            config.n_batch.to_string(),
        ),
        (
            "sampling",
            format!("{:?}", theirs.sampling),
            format!("{:?}", config.sampling),
        ),
    ];
    for (field, checkpoint_value, generator_value) in fields {
        if checkpoint_value != generator_value {
            return Err(checkpoint_error(CheckpointError::ConfigMismatch {
                field,
                checkpoint: checkpoint_value,
                generator: generator_value,
            }));
        }
    }
    Ok(())
}

/// The context length a restore may allocate: the caller's `max_n_ctx`, or
/// else the model's trained context length. A checkpoint asking for more is
/// refused, so a file cannot make the process allocate memory nobody chose.
fn check_context_cap(
    config: &GeneratorConfig,
    target: &Model,
    max_n_ctx: Option<u32>,
) -> Result<(), GeneratorError> {
    let cap = max_n_ctx.unwrap_or_else(|| match target.n_ctx_train() {
        0 => DEFAULT_MAX_N_CTX,
        trained => trained,
    });
    if config.n_ctx <= cap {
        return Ok(());
    }
    Err(checkpoint_error(CheckpointError::ConfigMismatch {
        field: "n_ctx",
        checkpoint: config.n_ctx.to_string(),
        generator: format!("at most {cap}"),
    }))
}

/// The cap on a restored context when neither the caller nor the model names one.
pub const DEFAULT_MAX_N_CTX: u32 = 8192;

/// A refused part of a checkpoint's content as a checkpoint error.
fn refused(error: RestoreError) -> GeneratorError {
    checkpoint_error(CheckpointError::Corrupt(error.to_string()))
}

/// A new generator continuing `checkpoint` on these models.
///
/// Everything that comes from the file is a [`CheckpointError`]: settings
/// that do not fit the model, states llama.cpp refuses, positions that do not
/// match the state. Only `runtime` (the caller's own) gives other errors.
pub fn restore(
    checkpoint: &Checkpoint<'_>,
    target: Arc<Model>,
    draft: Option<Arc<Model>>,
    runtime: RuntimeOptions,
    max_n_ctx: Option<u32>,
) -> Result<Generator, GeneratorError> {
    runtime.validate()?;
    check_models(checkpoint, &target, draft.as_deref())?;
    let config = checkpoint.meta.config().map_err(checkpoint_error)?;
    check_context_cap(&config, &target, max_n_ctx)?;
    let mut generator = Generator::new(target, draft, config, runtime).map_err(|error| {
        checkpoint_error(CheckpointError::Corrupt(format!(
            "meta: the configuration cannot run on these models: {error}"
        )))
    })?;
    generator
        .restore(
            checkpoint.state.clone(),
            checkpoint.target_state,
            checkpoint.draft_state,
            checkpoint.speculative_state,
        )
        .map_err(refused)?;
    Ok(generator)
}

/// Restore `checkpoint` into `generator` in place, reusing its contexts.
///
/// The checkpoint must have the generator's mode, configuration and models
/// (checked first). The generator's current boundary is kept aside; if
/// llama.cpp refuses any of the three states, or the positions they hold do
/// not match the checkpoint's state, it is put back, so a refused checkpoint
/// leaves the generator exactly as it was.
pub fn load_into(
    generator: &mut Generator,
    checkpoint: &Checkpoint<'_>,
) -> Result<(), GeneratorError> {
    check_config(checkpoint, generator.config())?;
    check_models(
        checkpoint,
        generator.target_model(),
        generator.draft_model().map(|m| m.as_ref()),
    )?;
    let kept = generator.boundary()?;
    let applied = generator.restore(
        checkpoint.state.clone(),
        checkpoint.target_state,
        checkpoint.draft_state,
        checkpoint.speculative_state,
    );
    if let Err(error) = applied {
        generator
            .restore(
                kept.state,
                &kept.target_state,
                kept.draft_state.as_deref(),
                kept.speculative_state.as_deref(),
            )
            .map_err(|e| {
                GeneratorError::Usage(format!("could not put the generation back: {e}"))
            })?;
        return Err(refused(error));
    }
    Ok(())
}
