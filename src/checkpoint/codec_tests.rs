//! The codec alone: no model, no llama.cpp. Checkpoints are encoded from
//! hand-built values, or assembled byte by byte from the layout documented in
//! docs/checkpoint-format.md, then decoded, broken and fuzzed. Here: the
//! helpers, round trips and the fuzzer; the frame and the sections' content
//! are broken in `frame_tests.rs`, the meta section in `meta_tests.rs`.

use serde_json::{json, Value};

use super::*;
use crate::chat::{Conversation, Message};
use crate::checkpoint::format::{FORMAT_VERSION, MAX_SECTIONS};
use crate::checkpoint::meta::{check_n_ctx_cap, ModelFingerprint};
use crate::checkpoint::state::{STATE_SIZE, STATE_SIZE_V1};
use crate::engine::AdaptiveState;
use crate::settings::GeneratorConfig;
use crate::settings::NgramConfig;
use crate::settings::SamplingParams;

#[path = "frame_tests.rs"]
mod frame_tests;
#[path = "meta_tests.rs"]
mod meta_tests;

const MODES: [Mode; 5] = [
    Mode::None,
    Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }),
    Mode::Draft,
    Mode::Mtp,
    Mode::Eagle3,
];

fn config(mode: Mode) -> GeneratorConfig {
    GeneratorConfig {
        mode,
        n_draft: 4,
        sampling: SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            seed: 7,
            ..SamplingParams::default()
        },
        n_ctx: 256,
        n_batch: 32,
        adaptive: false,
    }
}

fn model(name: &str) -> ModelFingerprint {
    ModelFingerprint {
        sha256: format!("{:064x}", name.len()),
        size: 1000 + name.len() as u64,
        file: name.into(),
    }
}

/// A consistent state: 5 prompt tokens, then 1 + 3 rounds + 4 accepted = 8 generated.
fn generator_state(mode: Mode) -> GeneratorState {
    GeneratorState {
        history: (100..113).collect(),
        n_prompt: 5,
        n_past: 12,
        draft_past: if mode == Mode::Draft { 10 } else { 0 },
        delivered: 6,
        rng: [1, 2, 3, 0xdead_beef],
        finished: false,
        rounds: 3,
        drafted: 7,
        accepted: 4,
        adaptive: None,
    }
}

/// Everything a checkpoint is encoded from.
struct Synthetic {
    meta: Meta,
    state: GeneratorState,
    target: Vec<u8>,
    draft: Option<Vec<u8>>,
    speculative: Option<Vec<u8>>,
}

/// A checkpoint of `mode` whose meta every format version reads (no
/// `sampler` entry: the version-5 samplers neutral).
fn synthetic(mode: Mode) -> Synthetic {
    let draft_model = mode.needs_draft_model().then(|| model("draft.gguf"));
    let has_draft_state = matches!(mode, Mode::Draft | Mode::Mtp | Mode::Eagle3);
    let has_speculative = matches!(mode, Mode::Mtp | Mode::Eagle3);
    let mut meta = Meta::new(&config(mode), model("target.gguf"), draft_model);
    meta.sampler = None;
    Synthetic {
        meta,
        state: generator_state(mode),
        target: (0..300u32).map(|i| (i * 7) as u8).collect(),
        draft: has_draft_state.then(|| (0..120u32).map(|i| (i * 13) as u8).collect()),
        speculative: has_speculative.then(|| b"LLSPEC1 speculative".to_vec()),
    }
}

/// Encode `s` with the sequence states written in place by the writer.
fn encode(s: &Synthetic) -> Vec<u8> {
    let meta = s.meta.to_json().unwrap();
    let state = EncodedState::new(&s.state);
    let sections = Sections {
        meta: &meta,
        state: &state,
        target_state: Payload::Written(s.target.len()),
        draft_state: s.draft.as_ref().map(|d| Payload::Written(d.len())),
        speculative_state: s.speculative.as_deref().map(Payload::Bytes),
    };
    let mut out = vec![0xa5; sections.encoded_len()];
    sections
        .encode_into(&mut out, |kind, payload| {
            let source = match kind {
                SectionKind::TargetState => &s.target,
                SectionKind::DraftState => s.draft.as_ref().unwrap(),
                _ => return Err(format!("asked to write {}", kind.name())),
            };
            payload.copy_from_slice(source);
            Ok(())
        })
        .unwrap();
    out
}

fn valid(mode: Mode) -> Vec<u8> {
    encode(&synthetic(mode))
}

// --- the documented layout, written out independently of the codec ---------

const STATE_KIND: u32 = 2;

/// A file of these `(kind, payload)` sections: header, table, payloads, CRC-32.
fn assemble(version: u16, sections: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let table_end = 32 + 24 * sections.len();
    let total = table_end + sections.iter().map(|(_, p)| p.len()).sum::<usize>() + 4;
    let mut out = b"SPECSTAT".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&32u16.to_le_bytes());
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    out.extend_from_slice(&(total as u64).to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    let mut offset = table_end as u64;
    for (kind, payload) in sections {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        offset += payload.len() as u64;
    }
    for (_, payload) in sections {
        out.extend_from_slice(payload);
    }
    out.extend_from_slice(&[0; 4]);
    reseal(&mut out);
    out
}

/// Recompute the trailer over everything before it.
fn reseal(bytes: &mut [u8]) {
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
}

/// The `(kind, payload)` sections of a well-formed file, in table order.
fn parts(bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let count = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    (0..count)
        .map(|i| {
            let entry = &bytes[32 + 24 * i..][..24];
            let kind = u32::from_le_bytes(entry[..4].try_into().unwrap());
            let offset = u64::from_le_bytes(entry[8..16].try_into().unwrap()) as usize;
            let len = u64::from_le_bytes(entry[16..24].try_into().unwrap()) as usize;
            (kind, bytes[offset..offset + len].to_vec())
        })
        .collect()
}

/// Write into a 117-byte `state` the CRC-32s of meta, tokens, target, draft
/// and speculative payloads (0 for an absent one), at offsets 97..117.
fn bind(sections: &mut [(u32, Vec<u8>)]) {
    let crc = |kind: u32| {
        sections
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, p)| crc32fast::hash(p))
    };
    let recorded: Vec<u32> = [1, 3, 4, 5, 6].into_iter().map(crc).collect();
    let state = &mut sections
        .iter_mut()
        .find(|(k, _)| *k == STATE_KIND)
        .unwrap()
        .1;
    if state.len() == STATE_SIZE {
        for (index, value) in recorded.iter().enumerate() {
            let at = 97 + 4 * index;
            state[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
    }
}

/// `bytes` (the current version) with its sections changed by `change`, then rebound and resealed.
fn rebuilt(bytes: &[u8], change: impl FnOnce(&mut Vec<(u32, Vec<u8>)>)) -> Vec<u8> {
    let mut sections = parts(bytes);
    change(&mut sections);
    bind(&mut sections);
    assemble(FORMAT_VERSION, &sections)
}

fn payload_of(sections: &mut [(u32, Vec<u8>)], kind: SectionKind) -> &mut Vec<u8> {
    let raw = kind as u32;
    &mut sections.iter_mut().find(|(k, _)| *k == raw).unwrap().1
}

/// `bytes` with its `meta` JSON changed by `change`.
fn with_meta(bytes: &[u8], change: impl FnOnce(&mut Value)) -> Vec<u8> {
    rebuilt(bytes, |sections| {
        let meta = payload_of(sections, SectionKind::Meta);
        let mut value: Value = serde_json::from_slice(meta).unwrap();
        change(&mut value);
        *meta = serde_json::to_vec(&value).unwrap();
    })
}

/// `bytes` with the u64 field `index` of the `state` section set to `value`.
fn with_state_field(bytes: &[u8], index: usize, value: u64) -> Vec<u8> {
    rebuilt(bytes, |sections| {
        let state = payload_of(sections, SectionKind::State);
        state[8 * index..8 * index + 8].copy_from_slice(&value.to_le_bytes());
    })
}

/// `bytes` with bytes at `at` overwritten (header or table), resealed.
fn patched(bytes: &[u8], at: usize, with: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[at..at + with.len()].copy_from_slice(with);
    reseal(&mut out);
    out
}

fn corrupt_message(bytes: &[u8]) -> String {
    match decode(bytes) {
        Err(CheckpointError::Corrupt(message)) => message,
        other => panic!("expected a corrupt checkpoint, got {other:?}"),
    }
}

// --- round trips -------------------------------------------------------------

#[test]
fn every_mode_encodes_and_decodes_back_equal() {
    for mode in MODES {
        let s = synthetic(mode);
        let bytes = encode(&s);
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded.version, FORMAT_VERSION);
        assert_eq!(decoded.meta, s.meta);
        assert_eq!(decoded.meta.config().unwrap(), config(mode));
        assert_eq!(decoded.state, s.state);
        assert_eq!(decoded.target_state, &s.target[..]);
        assert_eq!(decoded.draft_state, s.draft.as_deref());
        assert_eq!(decoded.speculative_state, s.speculative.as_deref());
        let trailer = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
        assert_eq!(decoded.checksum, trailer);
        assert_eq!(decoded.checksum, crc32fast::hash(&bytes[..bytes.len() - 4]));
        let names: Vec<&str> = decoded.sections.iter().map(|(n, _)| *n).collect();
        let expected = match mode {
            Mode::None | Mode::Ngram(_) => 4,
            Mode::Draft => 5,
            Mode::Mtp | Mode::Eagle3 => 6,
        };
        let all = [
            "meta",
            "state",
            "tokens",
            "target_state",
            "draft_state",
            "speculative_state",
        ];
        assert_eq!(names, all[..expected]);
    }
}

#[test]
fn the_encoding_is_the_documented_layout() {
    for mode in MODES {
        let s = synthetic(mode);
        let bytes = encode(&s);
        let mut state = Vec::new();
        for value in [5u64, 12, s.state.draft_past as u64, 3, 7, 4, 13, 6] {
            state.extend_from_slice(&value.to_le_bytes());
        }
        state.push(0);
        for word in s.state.rng {
            state.extend_from_slice(&word.to_le_bytes());
        }
        state.resize(117, 0);
        let tokens: Vec<u8> = (100..113i32).flat_map(i32::to_le_bytes).collect();
        let mut sections = vec![
            (1, serde_json::to_vec(&s.meta).unwrap()),
            (2, state),
            (3, tokens),
            (4, s.target.clone()),
        ];
        sections.extend(s.draft.clone().map(|d| (5, d)));
        sections.extend(s.speculative.clone().map(|p| (6, p)));
        bind(&mut sections);
        assert_eq!(
            bytes,
            assemble(FORMAT_VERSION, &sections),
            "mode {}",
            mode.name()
        );
    }
}

#[test]
fn the_encoder_refuses_a_wrong_buffer_and_passes_writer_errors_on() {
    let s = synthetic(Mode::Draft);
    let meta = s.meta.to_json().unwrap();
    let state = EncodedState::new(&s.state);
    let sections = Sections {
        meta: &meta,
        state: &state,
        target_state: Payload::Written(s.target.len()),
        draft_state: Some(Payload::Written(3)),
        speculative_state: None,
    };
    let len = sections.encoded_len();
    let mut short = vec![0; len - 1];
    let never = |_: SectionKind, _: &mut [u8]| -> Result<(), String> { panic!("not called") };
    match sections.encode_into(&mut short, never) {
        Err(error @ EncodeError::BufferSize { expected, actual }) => {
            assert_eq!((expected, actual), (len, len - 1));
            assert_eq!(
                error.to_string(),
                "the output buffer must be encoded_len() bytes"
            );
        }
        other => panic!("expected a buffer size error, got {other:?}"),
    }
    let mut out = vec![0; len];
    let mut asked = Vec::new();
    let result = sections.encode_into(&mut out, |kind, payload| {
        asked.push((kind, payload.len()));
        match kind {
            SectionKind::DraftState => Err("draft refused"),
            _ => Ok(()),
        }
    });
    assert!(matches!(result, Err(EncodeError::Write("draft refused"))));
    let expected = [
        (SectionKind::TargetState, s.target.len()),
        (SectionKind::DraftState, 3),
    ];
    assert_eq!(asked, expected);
}

#[test]
fn a_version_1_checkpoint_still_decodes() {
    for mode in MODES {
        let s = synthetic(mode);
        let mut sections = parts(&encode(&s));
        payload_of(&mut sections, SectionKind::State).truncate(97);
        let v1 = assemble(1, &sections);
        let decoded = decode(&v1).unwrap();
        assert_eq!(decoded.version, 1);
        assert_eq!(decoded.meta, s.meta);
        assert_eq!(decoded.state, s.state);
        assert_eq!(decoded.target_state, &s.target[..]);
        assert_eq!(decoded.draft_state, s.draft.as_deref());
        assert_eq!(decoded.speculative_state, s.speculative.as_deref());
        assert_eq!(decoded.sections[1], ("state", 97));
    }
    // Each version has its own state size.
    let v2 = valid(Mode::Mtp);
    let mut sections = parts(&v2);
    assert_eq!(
        corrupt_message(&assemble(1, &sections)),
        "the state section is 117 bytes, not the 97 of format version 1"
    );
    payload_of(&mut sections, SectionKind::State).truncate(STATE_SIZE_V1);
    assert_eq!(
        corrupt_message(&assemble(2, &sections)),
        "the state section is 97 bytes, not the 117 of format version 2"
    );
    // Version 1 has no bindings: a spliced section is not detected there.
    payload_of(&mut sections, SectionKind::Tokens)[..4].copy_from_slice(&101i32.to_le_bytes());
    assert_eq!(
        decode(&assemble(1, &sections)).unwrap().state.history[0],
        101
    );
    // A version-1 file without a target state.
    sections.retain(|(kind, _)| *kind != SectionKind::TargetState as u32);
    assert_eq!(
        corrupt_message(&assemble(1, &sections)),
        "no target_state section"
    );
}

// --- fuzz ------------------------------------------------------------------------

/// xorshift64: small, deterministic.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A value a length or offset field could interestingly hold.
    fn field_value(&mut self, len: usize) -> u64 {
        match self.below(6) {
            0 => 0,
            1 => u64::MAX,
            2 => len as u64,
            3 => self.below(len + 64) as u64,
            4 => 1 << self.below(64),
            _ => self.next(),
        }
    }
}

/// One mutation of a valid checkpoint: broken in one way, sometimes with
/// its checksum (and bindings) made right again so deeper checks are reached.
fn mutate(bytes: &[u8], rng: &mut XorShift) -> Vec<u8> {
    let mut out = bytes.to_vec();
    match rng.below(7) {
        0 => {
            let at = rng.below(out.len());
            out[at] ^= 1 << rng.below(8);
        }
        1 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(out.len());
                out[at] = rng.next() as u8;
            }
            reseal(&mut out);
        }
        2 => out.truncate(rng.below(out.len())),
        3 => {
            let count = parts(bytes).len();
            let at = 8 + rng.below(24 + 24 * count - 8);
            let at = at.min(out.len() - 12) & !3;
            let value = rng.field_value(bytes.len());
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            out[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            reseal(&mut out);
        }
        4 => {
            let mut sections = parts(bytes);
            let index = rng.below(sections.len());
            let payload = &mut sections[index].1;
            if !payload.is_empty() {
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(payload.len());
                    payload[at] = rng.next() as u8;
                }
            }
            bind(&mut sections);
            out = assemble(FORMAT_VERSION, &sections);
        }
        5 => {
            let index = rng.below(8);
            let value = rng.field_value(16);
            out = with_state_field(bytes, index, value);
        }
        _ => {
            let mut sections = parts(bytes);
            let index = rng.below(sections.len());
            let cut = rng.below(sections[index].1.len() + 1);
            sections[index].1.truncate(cut);
            if rng.below(2) == 0 {
                let other = rng.below(sections.len());
                sections.swap(index, other);
            }
            bind(&mut sections);
            out = assemble(1 + rng.below(2) as u16, &sections);
        }
    }
    out
}

/// What a decoded checkpoint must satisfy whatever the file was.
fn check_invariants(bytes: &[u8], checkpoint: &Checkpoint<'_>) {
    let state = &checkpoint.state;
    assert!(state.n_prompt >= 1 && state.n_prompt <= state.n_past);
    assert_eq!(state.n_past + 1, state.history.len());
    assert!(state.delivered <= state.history.len() - state.n_prompt);
    assert!(state.accepted <= state.drafted);
    assert!(checkpoint.meta.config().is_ok());
    let payloads: u64 = checkpoint.sections.iter().map(|(_, len)| *len).sum();
    let count = checkpoint.sections.len() as u64;
    assert_eq!(32 + 24 * count + payloads + 4, bytes.len() as u64);
}

#[test]
fn mutated_checkpoints_never_panic_and_fail_with_a_typed_error() {
    let bases: Vec<Vec<u8>> = MODES.into_iter().map(valid).collect();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..5000 {
        let base = &bases[round % bases.len()];
        let mutated = mutate(base, &mut rng);
        let outcome = match decode(&mutated) {
            Ok(checkpoint) => {
                check_invariants(&mutated, &checkpoint);
                "ok"
            }
            Err(error) => {
                assert!(!error.to_string().is_empty());
                match error {
                    CheckpointError::NotACheckpoint => "not a checkpoint",
                    CheckpointError::UnsupportedVersion { .. } => "unsupported version",
                    CheckpointError::Truncated { .. } => "truncated",
                    CheckpointError::ChecksumMismatch { .. } => "checksum mismatch",
                    CheckpointError::Corrupt(_) => "corrupt",
                    CheckpointError::SectionTooLarge { .. } => "section too large",
                    error => panic!("decode alone gave {error:?}"),
                }
            }
        };
        *seen.entry(outcome).or_insert(0) += 1;
    }
    // The mutations reach every check decode makes, and some still decode.
    assert_eq!(seen.len(), 7, "{seen:?}");
}
