//! The frame (magic, version, length, checksum, section table) and the
//! content of the sections (which must be there, the state's invariants, the
//! bindings of every section to the state), each broken byte by byte.

use super::*;

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

// --- content: sections, state, bindings ---------------------------------------

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
    // A draft model that does not fit the mode: `meta_tests`.
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
