//! The codec alone: no model, no llama.cpp. Checkpoints are encoded from
//! hand-built values, or assembled byte by byte from the layout documented in
//! docs/checkpoint-format.md, then decoded, broken and fuzzed.

use serde_json::{json, Value};

use super::*;
use crate::chat::{Conversation, Message};
use crate::checkpoint::format::{FORMAT_VERSION, MAX_SECTIONS};
use crate::checkpoint::meta::{check_n_ctx_cap, ModelFingerprint};
use crate::checkpoint::state::{STATE_SIZE, STATE_SIZE_V1};
use crate::engine::AdaptiveState;
use crate::sampling::SamplingParams;
use crate::settings::GeneratorConfig;
use crate::settings::NgramConfig;

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

// --- the frame: magic, version, length, checksum, table --------------------------

#[test]
fn bytes_without_the_magic_are_not_a_checkpoint() {
    let bytes = valid(Mode::None);
    let not = |b: &[u8]| decode(b).unwrap_err();
    assert_eq!(not(b""), CheckpointError::NotACheckpoint);
    assert_eq!(not(b"PK\x03\x04"), CheckpointError::NotACheckpoint);
    assert_eq!(not(b"SPECSTAX and more"), CheckpointError::NotACheckpoint);
    let mut renamed = bytes.clone();
    renamed[0] = b's';
    assert_eq!(not(&renamed), CheckpointError::NotACheckpoint);
    // A proper prefix of the magic is a truncated checkpoint.
    for len in 1..8 {
        let expected = CheckpointError::Truncated {
            expected: 32,
            actual: len as u64,
        };
        assert_eq!(not(&bytes[..len]), expected);
    }
    assert_eq!(
        CheckpointError::NotACheckpoint.to_string(),
        "not a specstate checkpoint"
    );
}

#[test]
fn unknown_versions_are_refused() {
    let bytes = valid(Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }));
    for version in [0u16, 6, 0xffff] {
        let mut changed = bytes.clone();
        changed[8..10].copy_from_slice(&version.to_le_bytes());
        let error = decode(&changed).unwrap_err();
        let expected = CheckpointError::UnsupportedVersion {
            found: version,
            supported: 5,
        };
        assert_eq!(error, expected);
        // Reported before the length: a short file of a new version says so.
        assert_eq!(decode(&changed[..12]).unwrap_err(), expected);
    }
    assert_eq!(
        decode(&bytes[..9]).unwrap_err(),
        CheckpointError::Truncated {
            expected: 32,
            actual: 9
        }
    );
    let error = CheckpointError::UnsupportedVersion {
        found: 6,
        supported: 5,
    };
    assert_eq!(
        error.to_string(),
        "unsupported checkpoint format version 6 (this build reads version 5)"
    );
}

#[test]
fn short_and_long_files_are_refused() {
    let bytes = valid(Mode::Mtp);
    let total = bytes.len() as u64;
    for len in 10..bytes.len() {
        let expected = if len < 32 { 32 } else { total };
        let error = decode(&bytes[..len]).unwrap_err();
        let truncated = CheckpointError::Truncated {
            expected,
            actual: len as u64,
        };
        assert_eq!(error, truncated, "{len} bytes");
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(b"xyz");
    assert_eq!(corrupt_message(&longer), "3 bytes follow the declared end");
    let error = CheckpointError::Truncated {
        expected: 100,
        actual: 40,
    };
    assert_eq!(
        error.to_string(),
        "the checkpoint is truncated: 40 of 100 bytes"
    );
}

#[test]
fn the_largest_readable_file_is_every_section_at_its_bound() {
    use crate::checkpoint::format::MAX_CHECKPOINT_BYTES;
    let header_table_trailer = 32 + 24 * 6 + 4;
    let payloads = (16 << 20) + (1 << 10) + (4 << 24) + 2 * (1 << 36) + (64 << 20);
    assert_eq!(MAX_CHECKPOINT_BYTES, header_table_trailer + payloads);
}

#[test]
fn a_changed_byte_is_a_checksum_mismatch() {
    let bytes = valid(Mode::Draft);
    let stored = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
    // In a payload, in a table entry's offset and kind, in the trailer: the
    // checksum is reported before anything wrong with the table.
    for at in [bytes.len() - 10, 40, 33, bytes.len() - 1] {
        let mut changed = bytes.clone();
        changed[at] ^= 0x10;
        let body_end = changed.len() - 4;
        let stored_now = u32::from_le_bytes(changed[body_end..].try_into().unwrap());
        let computed = crc32fast::hash(&changed[..body_end]);
        let expected = CheckpointError::ChecksumMismatch {
            stored: stored_now,
            computed,
        };
        assert_eq!(decode(&changed).unwrap_err(), expected, "byte {at}");
        assert!(stored_now == stored || at >= body_end);
    }
    let error = CheckpointError::ChecksumMismatch {
        stored: 0xab,
        computed: 0x1234_5678,
    };
    assert_eq!(
        error.to_string(),
        "checkpoint checksum mismatch: stored 000000ab, computed 12345678"
    );
}

#[test]
fn an_oversized_section_names_its_bound() {
    let bytes = valid(Mode::Mtp);
    let cases = [
        (0, 16u64 << 20, "meta"),
        (1, 1 << 10, "state"),
        (2, 4 << 24, "tokens"),
        (3, 1 << 36, "target_state"),
        (4, 1 << 36, "draft_state"),
        (5, 64 << 20, "speculative_state"),
    ];
    for (index, maximum, section) in cases {
        let size = maximum + 1;
        let changed = patched(&bytes, 32 + 24 * index + 16, &size.to_le_bytes());
        let expected = CheckpointError::SectionTooLarge {
            section,
            size,
            maximum,
        };
        assert_eq!(decode(&changed).unwrap_err(), expected);
    }
    let error = CheckpointError::SectionTooLarge {
        section: "state",
        size: 2000,
        maximum: 1024,
    };
    assert_eq!(
        error.to_string(),
        "checkpoint section state is 2000 bytes, exceeding its 1024-byte bound"
    );
}

#[test]
fn bad_header_fields_are_corrupt() {
    let bytes = valid(Mode::None);
    let cases: [(usize, &[u8], &str); 5] = [
        (10, &33u16.to_le_bytes(), "unexpected header fields"),
        (24, &[1], "unexpected header fields"),
        (12, &0u32.to_le_bytes(), "0 sections"),
        (12, &17u32.to_le_bytes(), "17 sections"),
        (12, &u32::MAX.to_le_bytes(), "4294967295 sections"),
    ];
    for (at, with, message) in cases {
        assert_eq!(corrupt_message(&patched(&bytes, at, with)), message);
    }
    // Sixteen sections' table does not fit a small file.
    let mut small = bytes[..100].to_vec();
    small[16..24].copy_from_slice(&100u64.to_le_bytes());
    small[12..16].copy_from_slice(&(MAX_SECTIONS as u32).to_le_bytes());
    reseal(&mut small);
    assert_eq!(
        corrupt_message(&small),
        "the section table overruns the file"
    );
}

#[test]
fn a_bad_section_table_is_corrupt() {
    let bytes = valid(Mode::Mtp);
    let entry = |index: usize| 32 + 24 * index;
    let offset_of =
        |index: usize| u64::from_le_bytes(bytes[entry(index) + 8..][..8].try_into().unwrap());
    let cases: Vec<(usize, Vec<u8>, &str)> = vec![
        (
            entry(2),
            9u32.to_le_bytes().to_vec(),
            "unknown section kind 9",
        ),
        (
            entry(2),
            0u32.to_le_bytes().to_vec(),
            "unknown section kind 0",
        ),
        (
            entry(1) + 4,
            1u32.to_le_bytes().to_vec(),
            "unexpected section flags",
        ),
        // Overlapping the previous section.
        (
            entry(2) + 8,
            (offset_of(2) - 1).to_le_bytes().to_vec(),
            "section tokens is out of place",
        ),
        // Leaving a gap.
        (
            entry(3) + 8,
            (offset_of(3) + 1).to_le_bytes().to_vec(),
            "section target_state is out of place",
        ),
        // Running past the trailer, or wrapping.
        (
            entry(5) + 16,
            1_000_000u64.to_le_bytes().to_vec(),
            "section speculative_state is out of place",
        ),
        (
            entry(5) + 8,
            u64::MAX.to_le_bytes().to_vec(),
            "section speculative_state is out of place",
        ),
        // Twice the same kind.
        (
            entry(3),
            1u32.to_le_bytes().to_vec(),
            "section meta appears twice",
        ),
        (
            entry(5),
            4u32.to_le_bytes().to_vec(),
            "section target_state appears twice",
        ),
        // The last section ending before the trailer.
        (
            entry(5) + 16,
            1u64.to_le_bytes().to_vec(),
            "the sections do not fill the file",
        ),
    ];
    for (at, with, message) in cases {
        assert_eq!(corrupt_message(&patched(&bytes, at, &with)), message);
    }
}

// --- content: sections, state, bindings, meta ---------------------------------

#[test]
fn every_needed_section_must_be_there() {
    let bytes = valid(Mode::None);
    for (kind, message) in [
        (SectionKind::Meta, "no meta section"),
        (SectionKind::State, "no state section"),
        (SectionKind::Tokens, "no tokens section"),
    ] {
        let mut sections = parts(&bytes);
        sections.retain(|(k, _)| *k != kind as u32);
        assert_eq!(
            corrupt_message(&assemble(FORMAT_VERSION, &sections)),
            message
        );
    }
    // Version 2 binds the target state: its absence is a binding mismatch first.
    let mut sections = parts(&bytes);
    sections.retain(|(k, _)| *k != SectionKind::TargetState as u32);
    let message = corrupt_message(&assemble(FORMAT_VERSION, &sections));
    assert!(
        message.starts_with("section target_state does not belong"),
        "{message}"
    );
}

#[test]
fn the_sections_must_fit_the_mode() {
    let mtp = valid(Mode::Mtp);
    let without =
        |kind: SectionKind| rebuilt(&mtp, |sections| sections.retain(|(k, _)| *k != kind as u32));
    let unfit = "sections do not fit mode mtp";
    assert_eq!(
        corrupt_message(&without(SectionKind::SpeculativeState)),
        unfit
    );
    assert_eq!(corrupt_message(&without(SectionKind::DraftState)), unfit);
    let none = valid(Mode::None);
    let extra = rebuilt(&none, |sections| sections.push((5, vec![1, 2, 3])));
    assert_eq!(corrupt_message(&extra), "sections do not fit mode none");
    let with_draft_model = with_meta(&none, |meta| meta["draft_model"] = json!(model("d")));
    assert_eq!(
        corrupt_message(&with_draft_model),
        "meta.draft_model: does not fit mode none"
    );
    let eagle3 = valid(Mode::Eagle3);
    let no_draft_model = with_meta(&eagle3, |meta| meta["draft_model"] = Value::Null);
    assert_eq!(
        corrupt_message(&no_draft_model),
        "meta.draft_model: does not fit mode eagle3"
    );
}

const POSITIONS: &str =
    "state.n_past: positions are inconsistent (1 <= n_prompt <= n_past = history length - 1)";
const COUNTERS: &str =
    "state.rounds: rounds, drafted and accepted do not account for the generated tokens";
const HISTORY: &str = "state.history_length: does not match the tokens section";

#[test]
fn the_state_invariants_are_checked() {
    let draft = valid(Mode::Draft);
    let mtp = valid(Mode::Mtp);
    // (checkpoint, u64 field index, value, message); fields: n_prompt, n_past,
    // draft_past, rounds, drafted, accepted, history length, delivered.
    let cases: [(&[u8], usize, u64, &str); 14] = [
        (&draft, 0, 0, POSITIONS),
        (&draft, 0, 13, POSITIONS),
        (&draft, 1, 11, POSITIONS),
        (&draft, 1, 13, POSITIONS),
        (&draft, 1, u64::MAX, POSITIONS),
        (&draft, 2, 13, "state.draft_past: 13 exceeds 12"),
        (&mtp, 2, 1, "state.draft_past: 1 exceeds 0"),
        (
            &draft,
            7,
            9,
            "state.delivered: more tokens delivered than generated",
        ),
        (&draft, 5, 8, COUNTERS),
        (&draft, 3, 4, COUNTERS),
        (&draft, 3, u64::MAX, COUNTERS),
        (&draft, 5, u64::MAX, COUNTERS),
        (&draft, 6, 12, HISTORY),
        (&draft, 6, u64::MAX, HISTORY),
    ];
    for (bytes, field, value, message) in cases {
        let changed = with_state_field(bytes, field, value);
        assert_eq!(
            corrupt_message(&changed),
            message,
            "field {field} = {value}"
        );
    }
    let flag = rebuilt(&draft, |s| payload_of(s, SectionKind::State)[64] = 2);
    assert_eq!(corrupt_message(&flag), "state.finished: not 0 or 1");
    let rng = rebuilt(&draft, |s| {
        payload_of(s, SectionKind::State)[65..97].fill(0)
    });
    assert_eq!(
        corrupt_message(&rng),
        "state.rng: the RNG state is all zero"
    );
    let odd = rebuilt(&draft, |s| payload_of(s, SectionKind::Tokens).push(0));
    assert_eq!(corrupt_message(&odd), HISTORY);
    let empty = rebuilt(&draft, |s| payload_of(s, SectionKind::Tokens).clear());
    assert_eq!(corrupt_message(&with_state_field(&empty, 6, 0)), HISTORY);
    let long = rebuilt(&draft, |s| payload_of(s, SectionKind::State).push(0));
    assert_eq!(
        corrupt_message(&long),
        "the state section is 118 bytes, not the 117 of format version 5"
    );
    // A finished generation and every token delivered are fine.
    let finished = rebuilt(&draft, |s| payload_of(s, SectionKind::State)[64] = 1);
    assert!(
        decode(&with_state_field(&finished, 7, 8))
            .unwrap()
            .state
            .finished
    );
}

#[test]
fn the_bindings_tie_every_section_to_the_state() {
    let bytes = valid(Mode::Mtp);
    let kinds = [
        SectionKind::Meta,
        SectionKind::Tokens,
        SectionKind::TargetState,
        SectionKind::DraftState,
        SectionKind::SpeculativeState,
    ];
    for (index, kind) in kinds.into_iter().enumerate() {
        let mut sections = parts(&bytes);
        let actual = crc32fast::hash(payload_of(&mut sections, kind));
        let state = payload_of(&mut sections, SectionKind::State);
        state[97 + 4 * index] ^= 1;
        let recorded = u32::from_le_bytes(state[97 + 4 * index..][..4].try_into().unwrap());
        let message = corrupt_message(&assemble(FORMAT_VERSION, &sections));
        let expected = format!(
            "section {} does not belong to this checkpoint's state (CRC-32 {actual:08x}, recorded {recorded:08x})",
            kind.name()
        );
        assert_eq!(message, expected);
    }
    // A section spliced in, the file's checksum made right.
    let mut sections = parts(&bytes);
    payload_of(&mut sections, SectionKind::TargetState)[0] ^= 0xff;
    let message = corrupt_message(&assemble(FORMAT_VERSION, &sections));
    assert!(
        message.starts_with("section target_state does not belong"),
        "{message}"
    );
    // An absent section is bound as 0.
    let none = valid(Mode::None);
    let mut sections = parts(&none);
    payload_of(&mut sections, SectionKind::State)[109] = 1;
    let message = corrupt_message(&assemble(FORMAT_VERSION, &sections));
    assert!(
        message.starts_with("section draft_state does not belong"),
        "{message}"
    );
    assert!(
        message.ends_with("(CRC-32 00000000, recorded 00000001)"),
        "{message}"
    );
}

#[test]
fn the_meta_json_is_checked() {
    let bytes = valid(Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }));
    let payload = |json: &[u8]| {
        rebuilt(&bytes, |s| {
            *payload_of(s, SectionKind::Meta) = json.to_vec()
        })
    };
    let changed = |change: fn(&mut Value)| with_meta(&bytes, change);
    // (a checkpoint, the start of its message after "meta section: "): bytes that are not a
    // meta object, then meta objects with a key too many (at any depth), one missing, a value
    // out of its type's range.
    let cases = [
        (payload(b"{not json"), "key must be a string"),
        (payload(b""), "EOF while parsing"),
        (payload(b"42"), "invalid type: integer `42`"),
        (payload(b"[]"), "invalid length 0"),
        (payload(b"\xff\xfe"), "expected value"),
        (changed(|m| m["extra"] = json!(1)), "unknown field `extra`"),
        (
            changed(|m| m["target_model"]["x"] = json!(1)),
            "unknown field `x`",
        ),
        (
            changed(|m| {
                m.as_object_mut().unwrap().remove("seed");
            }),
            "missing field `seed`",
        ),
        (changed(|m| m["n_ctx"] = json!(-1)), "invalid value"),
    ];
    for (checkpoint, expected) in cases {
        let message = corrupt_message(&checkpoint);
        assert!(
            message.starts_with(&format!("meta section: {expected}")),
            "{message}"
        );
    }
}

fn chat() -> Conversation {
    Conversation {
        messages: vec![
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello!"),
            Message::new("user", "Bye <|im_end|>"),
        ],
        template_sha256: "ab".repeat(32),
    }
}

#[test]
fn a_conversation_travels_in_meta_from_version_3() {
    let mut s = synthetic(Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }));
    s.meta.conversation = Some(chat());
    let bytes = encode(&s);
    assert_eq!(decode(&bytes).unwrap().meta.conversation, Some(chat()));
    let version_2 = patched(&bytes, 8, &2u16.to_le_bytes());
    assert_eq!(
        corrupt_message(&version_2),
        "meta.conversation: not part of format version 2"
    );
    // Without a conversation the meta is version 2's, key for key, and a
    // version 2 file of it still decodes.
    let plain = valid(Mode::None);
    let meta: Value = serde_json::from_slice(&parts(&plain)[0].1).unwrap();
    assert!(meta.get("conversation").is_none());
    let version_2 = patched(&plain, 8, &2u16.to_le_bytes());
    let old = decode(&version_2).unwrap();
    assert_eq!((old.version, old.meta.conversation), (2, None));
}

fn adaptive(n_draft: u32) -> AdaptiveState {
    AdaptiveState::new((1..=n_draft + 1).map(|r| 1000 * r).collect())
}

#[test]
fn the_adaptive_policy_travels_in_meta_from_version_4() {
    let mut s = synthetic(Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }));
    s.meta.adaptive = Some(adaptive(s.meta.n_draft));
    let bytes = encode(&s);
    let decoded = decode(&bytes).unwrap();
    assert!(decoded.meta.config().unwrap().adaptive);
    let state = decoded.state.adaptive.expect("the policy state");
    assert_eq!(state.cost_us, vec![1000, 2000, 3000, 4000, 5000]);
    let version_3 = patched(&bytes, 8, &3u16.to_le_bytes());
    assert_eq!(
        corrupt_message(&version_3),
        "meta.adaptive: not part of format version 3"
    );
    // Without it the policy is the fixed one, as in every older file.
    let plain_bytes = valid(Mode::Draft);
    let plain = decode(&plain_bytes).unwrap();
    assert!(!plain.meta.config().unwrap().adaptive && plain.state.adaptive.is_none());
}

fn full_sampling() -> SamplingParams {
    SamplingParams {
        min_p: 0.05,
        typical_p: 0.9,
        repeat_penalty: 1.3,
        repeat_last_n: -1,
        presence_penalty: 0.5,
        frequency_penalty: -0.25,
        logit_bias: vec![(3, -2.5), (17, 1.0)],
        ..config(Mode::None).sampling
    }
}

#[test]
fn the_sampler_travels_in_meta_from_version_5() {
    let mut s = synthetic(Mode::Mtp);
    let mut config = config(Mode::Mtp);
    config.sampling = full_sampling();
    s.meta = Meta::new(&config, model("target.gguf"), None);
    let bytes = encode(&s);
    let decoded = decode(&bytes).unwrap();
    assert_eq!(decoded.meta.config().unwrap(), config);
    let meta: Value = serde_json::from_slice(&parts(&bytes)[0].1).unwrap();
    assert_eq!(meta["sampler"]["logit_bias"], json!([[3, -2.5], [17, 1.0]]));
    let version_4 = patched(&bytes, 8, &4u16.to_le_bytes());
    assert_eq!(
        corrupt_message(&version_4),
        "meta.sampler: not part of format version 4"
    );
    // An older file's samplers are the neutral ones.
    let old_bytes = patched(&valid(Mode::Mtp), 8, &4u16.to_le_bytes());
    let old = decode(&old_bytes).unwrap();
    let sampling = old.meta.config().unwrap().sampling;
    assert_eq!(
        sampling,
        SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            seed: 7,
            ..SamplingParams::default()
        }
    );
}

#[test]
fn a_bad_sampler_is_corrupt() {
    let mut s = synthetic(Mode::None);
    let mut config = config(Mode::None);
    config.sampling = full_sampling();
    s.meta = Meta::new(&config, model("target.gguf"), None);
    let bytes = encode(&s);
    type Change = fn(&mut Value);
    let too_many = SamplingParams::MAX_LOGIT_BIAS + 1;
    let cases: [(Change, &str); 12] = [
        (
            |m| m["sampler"]["min_p"] = json!(1.5),
            "meta.min_p must be in [0, 1]",
        ),
        (
            |m| m["sampler"]["min_p"] = json!(1e39),
            "meta.min_p must be in",
        ),
        (
            |m| m["sampler"]["typical_p"] = json!(0),
            "meta.typical_p must be in (0, 1]",
        ),
        (
            |m| m["sampler"]["repeat_penalty"] = json!(0),
            "meta.repeat_penalty",
        ),
        (
            |m| m["sampler"]["repeat_penalty"] = json!(1000),
            "meta.repeat_penalty",
        ),
        (
            |m| m["sampler"]["repeat_last_n"] = json!(-2),
            "meta.repeat_last_n",
        ),
        (
            |m| m["sampler"]["presence_penalty"] = json!(-101),
            "meta.presence_penalty",
        ),
        (
            |m| m["sampler"]["frequency_penalty"] = json!(101),
            "meta.frequency_penalty",
        ),
        (
            |m| m["sampler"]["logit_bias"] = json!([[5, 1.0], [5, 2.0]]),
            "meta.logit_bias",
        ),
        (
            |m| m["sampler"]["logit_bias"] = json!([[-1, 1.0]]),
            "meta.logit_bias",
        ),
        (
            |m| m["sampler"]["logit_bias"] = json!([[1, 1e5]]),
            "meta.logit_bias",
        ),
        (|m| m["sampler"]["extra"] = json!(1), "unknown field"),
    ];
    for (change, expected) in cases {
        let message = corrupt_message(&with_meta(&bytes, change));
        assert!(message.contains(expected), "{message}");
    }
    let long = with_meta(&bytes, |m| {
        m["sampler"]["logit_bias"] =
            json!((0..too_many).map(|t| json!([t, 0.5])).collect::<Vec<_>>())
    });
    let message = corrupt_message(&long);
    assert!(message.contains("at most"), "{message}");
    let missing = with_meta(&bytes, |m| {
        m["sampler"].as_object_mut().unwrap().remove("min_p");
    });
    assert!(corrupt_message(&missing).contains("missing field"));
}

#[test]
fn a_bad_adaptive_state_is_corrupt() {
    let mut s = synthetic(Mode::Mtp);
    s.meta.adaptive = Some(adaptive(s.meta.n_draft));
    let bytes = encode(&s);
    type Change = fn(&mut Value);
    let cases: [(Change, &str); 9] = [
        (|m| m["adaptive"]["cost_us"] = json!([1, 2]), "needs 5"),
        (|m| m["adaptive"]["cost_us"][2] = json!(0), "between 1 and"),
        (|m| m["adaptive"]["cost_us"][2] = json!(-1), "invalid value"),
        (
            |m| m["adaptive"]["hits"][1] = json!(1_000_000),
            "hits <= trials",
        ),
        (|m| m["adaptive"]["trials"][0] = json!(0), "1 <= trials"),
        (|m| m["adaptive"]["trials"] = json!([768]), "invalid length"),
        (|m| m["adaptive"]["streak"] = json!(1), "invalid type"),
        (|m| m["adaptive"]["idle"] = json!(17), "probe interval"),
        (|m| m["adaptive"]["extra"] = json!(1), "unknown field"),
    ];
    for (change, expected) in cases {
        let message = corrupt_message(&with_meta(&bytes, change));
        assert!(message.starts_with("meta"), "{message}");
        assert!(message.contains(expected), "{message}");
    }
    let none = with_meta(&bytes, |m| m["mode"] = json!("none"));
    assert!(corrupt_message(&none).contains("draft_policy"));
}

#[test]
fn the_thread_count_is_recorded_from_version_3() {
    let mut s = synthetic(Mode::Draft);
    s.meta.n_threads = Some(2);
    let bytes = encode(&s);
    let decoded = decode(&bytes).unwrap();
    assert_eq!(decoded.meta.recorded_runtime(2).n_threads, 2);
    assert_eq!(decoded.meta.recorded_runtime(1).n_threads, 1); // at most the CPUs available
    assert_eq!(
        decode(&valid(Mode::Draft))
            .unwrap()
            .meta
            .recorded_runtime(1)
            .n_threads,
        0
    );
    for bad in [513, u32::MAX] {
        let message = corrupt_message(&with_meta(&bytes, |m| m["n_threads"] = json!(bad)));
        assert_eq!(
            message,
            format!("meta.n_threads must be between 0 (the CPUs available) and 512, not {bad}")
        );
    }
    // 0, the CPUs available, as every thread count (specstate records the resolved count).
    let zero = with_meta(&bytes, |m| m["n_threads"] = json!(0));
    assert_eq!(decode(&zero).unwrap().meta.recorded_runtime(4).n_threads, 0);
    let version_2 = patched(&bytes, 8, &2u16.to_le_bytes());
    assert_eq!(
        corrupt_message(&version_2),
        "meta.n_threads: not part of format version 2"
    );
}

#[test]
fn a_bad_conversation_is_corrupt() {
    let mut s = synthetic(Mode::None);
    s.meta.conversation = Some(chat());
    let bytes = encode(&s);
    type Change = fn(&mut Value);
    let cases: [(Change, &str); 6] = [
        (|m| m["conversation"]["messages"] = json!([]), "no messages"),
        (
            |m| m["conversation"]["messages"][0]["role"] = json!(""),
            "message 0: the role",
        ),
        (
            |m| m["conversation"]["messages"][1]["role"] = json!("a\nb"),
            "message 1: the role",
        ),
        (
            |m| m["conversation"]["messages"][2]["name"] = json!("x"),
            "unknown field `name`",
        ),
        (
            |m| m["conversation"]["template_sha256"] = json!("XYZ"),
            "template_sha256",
        ),
        (|m| m["conversation"] = json!(7), "invalid type"),
    ];
    for (change, expected) in cases {
        let message = corrupt_message(&with_meta(&bytes, change));
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn every_setting_is_checked_and_named() {
    let ngram = valid(Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }));
    let none = valid(Mode::None);
    let cases: [(&[u8], &str, Value, &str); 13] = [
        (&ngram, "n_ctx", json!(1), "meta.n_ctx must be 0 (the model's trained context length) or at least 2, not 1"),
        // A checkpoint records a resolved configuration: the context length run, n_batch clamped to it.
        (&ngram, "n_ctx", json!(0), "meta.n_ctx is 0: a generator's configuration holds the resolved context length"),
        (&ngram, "n_batch", json!(0), "meta.n_batch must be between 1 and 1048576, not 0"),
        (
            &ngram,
            "n_batch",
            json!(257),
            "meta.n_batch must be at most n_ctx (256) in a generator's configuration (a larger one is clamped to it), not 257",
        ),
        (&ngram, "n_draft", json!(0), "meta.n_draft must be between 1 and n_batch - 1 (31), not 0"),
        (&ngram, "n_draft", json!(32), "meta.n_draft must be between 1 and n_batch - 1 (31), not 32"),
        (&none, "n_draft", json!(4097), "meta.n_draft must be at most 4096, not 4097"),
        (&ngram, "temperature", json!(-0.5), "meta.temperature must be finite and >= 0, not -0.5"),
        (&ngram, "top_p", json!(0.0), "meta.top_p must be in (0, 1], not 0"),
        (&ngram, "top_p", json!(1.5), "meta.top_p must be in (0, 1], not 1.5"),
        (
            &ngram,
            "ngram",
            json!([2, 4]),
            "meta.ngram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64, not ngram_min=4 ngram_max=2",
        ),
        (
            &ngram,
            "mode",
            json!("turbo"),
            "meta.mode: unknown mode \"turbo\" (or n-gram sizes that do not fit it)",
        ),
        (
            &none,
            "ngram",
            json!([4, 2]),
            "meta.mode: unknown mode \"none\" (or n-gram sizes that do not fit it)",
        ),
    ];
    for (bytes, key, value, message) in cases {
        let changed = with_meta(bytes, |meta| meta[key] = value);
        assert_eq!(corrupt_message(&changed), message);
    }
    // A mode name from the file is cut to 64 characters in the message.
    let long = with_meta(&ngram, |meta| meta["mode"] = json!("m".repeat(1000)));
    let message = corrupt_message(&long);
    assert!(
        message.contains(&format!("{:?}", "m".repeat(64))),
        "{message}"
    );
    assert!(message.len() < 200);
    // n_draft does not matter in mode none.
    let n_draft = with_meta(&none, |meta| meta["n_draft"] = json!(0));
    assert_eq!(decode(&n_draft).unwrap().meta.n_draft, 0);
}

#[test]
fn models_and_configurations_are_compared() {
    let bytes = valid(Mode::Draft);
    let decoded = decode(&bytes).unwrap();
    let meta = &decoded.meta;
    let (target, draft) = (model("target.gguf"), model("draft.gguf"));
    assert_eq!(meta.check_models(&target, Some(&draft)), Ok(()));
    // Only content and size count, not the file name.
    let renamed = ModelFingerprint {
        file: "elsewhere.gguf".into(),
        ..target.clone()
    };
    assert_eq!(meta.check_models(&renamed, Some(&draft)), Ok(()));
    let other = model("other-target.gguf");
    let error = meta.check_models(&other, Some(&draft)).unwrap_err();
    assert_eq!(
        error,
        CheckpointError::ModelMismatch {
            role: "target",
            expected: target.to_string(),
            actual: other.to_string(),
        }
    );
    assert_eq!(
        error.to_string(),
        format!("the checkpoint's target model is {target}, but the target model given is {other}")
    );
    let error = meta.check_models(&target, None).unwrap_err();
    assert!(
        matches!(error, CheckpointError::ModelMismatch { role: "draft", ref actual, .. } if actual == "none")
    );
    let odd = ModelFingerprint {
        file: "a\nb".into(),
        ..target.clone()
    };
    assert!(odd.to_string().starts_with("a\\nb (1011 bytes, sha256 "));

    assert_eq!(meta.check_config(&config(Mode::Draft)), Ok(()));
    let mut changed = config(Mode::Draft);
    changed.n_batch = 64;
    let error = meta.check_config(&changed).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the checkpoint's n_batch is 32, the generator's is 64"
    );
    let error = meta.check_config(&config(Mode::Mtp)).unwrap_err();
    assert!(matches!(
        error,
        CheckpointError::ConfigMismatch { field: "mode", .. }
    ));
    // Sampling may change between calls: a load takes the checkpoint's.
    changed = config(Mode::Draft);
    changed.sampling.seed = 8;
    changed.sampling.min_p = 0.1;
    assert_eq!(meta.check_config(&changed), Ok(()));

    assert_eq!(check_n_ctx_cap(256, 256), Ok(()));
    assert_eq!(
        check_n_ctx_cap(257, 256).unwrap_err().to_string(),
        "the checkpoint's n_ctx is 257, the generator's is at most 256"
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
