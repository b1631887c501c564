//! The file's frame: header, section table, CRC-32 trailer, and the errors
//! that refuse a checkpoint. Bytes only: no llama.cpp, no generator.

use crate::speculative::MAX_SPECULATIVE_STATE_BYTES;

/// First eight bytes of every checkpoint.
pub const MAGIC: &[u8; 8] = b"SPECSTAT";
/// The format version this build writes. Versions 1 (no section bindings),
/// 2 (no conversation in `meta`), 3 (no adaptive draft policy in `meta`)
/// and 4 (no `meta.sampler`: neutral min-p, typical-p, penalties and logit
/// bias) are still read.
pub const FORMAT_VERSION: u16 = 5;
/// The oldest format version this build reads.
pub(super) const OLDEST_READABLE_VERSION: u16 = 1;
pub(super) const HEADER_SIZE: usize = 32;
pub(super) const TABLE_ENTRY_SIZE: usize = 24;
pub(super) const TRAILER_SIZE: usize = 4;
pub(super) const MAX_SECTIONS: usize = 16;

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
    pub const fn maximum(self) -> u64 {
        match self {
            Self::Meta => 16 << 20,
            Self::State => 1 << 10,
            Self::Tokens => 4 << 24,
            Self::TargetState | Self::DraftState => 1 << 36,
            Self::SpeculativeState => MAX_SPECULATIVE_STATE_BYTES as u64,
        }
    }
}

/// The largest checkpoint this build can read: the header, one table entry
/// and the largest payload of each section kind (a kind appears at most
/// once), and the trailer. A file longer than this cannot be a checkpoint, so
/// a reader never needs to read more than one byte past it.
pub const MAX_CHECKPOINT_BYTES: u64 = {
    let kinds = SectionKind::ALL;
    let mut total = (table_end(kinds.len()) + TRAILER_SIZE) as u64;
    let mut index = 0;
    while index < kinds.len() {
        total += kinds[index].maximum();
        index += 1;
    }
    total
};

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
    /// The checkpoint's configuration would make a restore allocate more than
    /// its limits: compute buffers for more rows per pass than `max_n_batch`
    /// (by default [`DEFAULT_MAX_N_BATCH`](crate::checkpoint::DEFAULT_MAX_N_BATCH)), or, on a
    /// recurrent or hybrid model, rollback snapshots of the recurrent state
    /// taking more memory than the model's weights.
    #[error(
        "the checkpoint's {field} of {value} {reason}: pass max_n_batch (--max-n-batch on the \
         command line; at least its n_batch) to restore it"
    )]
    ExcessiveAllocation {
        /// `n_batch` or `n_draft`.
        field: &'static str,
        /// Its value in the checkpoint.
        value: u32,
        /// What it would allocate, against which limit.
        reason: String,
        /// Rows per pass (`n_batch`) or snapshot bytes (`n_draft`) asked for.
        requested: u64,
        /// The limit on them.
        maximum: u64,
    },
}

/// A [`CheckpointError::Corrupt`] saying `what`.
pub(super) fn corrupt(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt(what.into())
}

pub(super) fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

pub(super) fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

/// Where the section payloads start in a file of `count` sections.
pub(super) const fn table_end(count: usize) -> usize {
    HEADER_SIZE + TABLE_ENTRY_SIZE * count
}

/// Bytes of a checkpoint whose sections have these payload lengths.
pub(super) fn file_len(payload_lengths: impl IntoIterator<Item = usize>) -> usize {
    let (count, payloads) = payload_lengths
        .into_iter()
        .fold((0, 0), |(count, sum), len| (count + 1, sum + len));
    table_end(count) + payloads + TRAILER_SIZE
}

/// Check the header: magic, version, declared length, header fields. Returns
/// the version and the section count; the table fits in the file.
pub(super) fn decode_header(bytes: &[u8]) -> Result<(u16, usize), CheckpointError> {
    let version = decode_magic_and_version(bytes)?;
    check_declared_length(bytes)?;
    let header_size = u16::from_le_bytes([bytes[10], bytes[11]]) as usize;
    let count = u32_at(bytes, 12) as usize;
    if header_size != HEADER_SIZE || bytes[24..32] != [0; 8] {
        return Err(corrupt("unexpected header fields"));
    }
    if count == 0 || count > MAX_SECTIONS {
        return Err(corrupt(format!("{count} sections")));
    }
    if table_end(count) + TRAILER_SIZE > bytes.len() {
        return Err(corrupt("the section table overruns the file"));
    }
    Ok((version, count))
}

/// The magic, then the version: a proper prefix of the magic is a truncated
/// checkpoint, anything else without it is not one.
fn decode_magic_and_version(bytes: &[u8]) -> Result<u16, CheckpointError> {
    let truncated = || CheckpointError::Truncated {
        expected: HEADER_SIZE as u64,
        actual: bytes.len() as u64,
    };
    if bytes.len() < MAGIC.len() {
        let is_prefix = MAGIC.starts_with(bytes) && !bytes.is_empty();
        return Err(if is_prefix {
            truncated()
        } else {
            CheckpointError::NotACheckpoint
        });
    }
    if &bytes[..8] != MAGIC {
        return Err(CheckpointError::NotACheckpoint);
    }
    if bytes.len() < 10 {
        return Err(truncated());
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(CheckpointError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if bytes.len() < HEADER_SIZE {
        return Err(truncated());
    }
    Ok(version)
}

/// The file's length against the total its header declares.
fn check_declared_length(bytes: &[u8]) -> Result<(), CheckpointError> {
    let len = bytes.len() as u64;
    let total = u64_at(bytes, 16);
    if len < total {
        return Err(CheckpointError::Truncated {
            expected: total,
            actual: len,
        });
    }
    if len > total {
        return Err(corrupt(format!(
            "{} bytes follow the declared end",
            len - total
        )));
    }
    Ok(())
}

/// One section of a decoded table: its kind, payload and the payload's CRC-32.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry<'a> {
    pub kind: SectionKind,
    pub payload: &'a [u8],
    pub crc: u32,
}

/// The sections of a checked file, in file order.
#[derive(Debug)]
pub(super) struct Table<'a> {
    entries: Vec<Entry<'a>>,
}

impl<'a> Table<'a> {
    fn entry(&self, kind: SectionKind) -> Option<&Entry<'a>> {
        self.entries.iter().find(|entry| entry.kind == kind)
    }

    /// The payload of the `kind` section, if the file has one.
    pub fn payload(&self, kind: SectionKind) -> Option<&'a [u8]> {
        self.entry(kind).map(|entry| entry.payload)
    }

    /// The payload of the `kind` section, which the file must have.
    pub fn required(&self, kind: SectionKind) -> Result<&'a [u8], CheckpointError> {
        self.payload(kind)
            .ok_or_else(|| corrupt(format!("no {} section", kind.name())))
    }

    /// The CRC-32 of the `kind` section's payload, if the file has one.
    pub fn crc(&self, kind: SectionKind) -> Option<u32> {
        self.entry(kind).map(|entry| entry.crc)
    }

    /// `(section, payload bytes)` in file order.
    pub fn sizes(&self) -> Vec<(&'static str, u64)> {
        self.entries
            .iter()
            .map(|entry| (entry.kind.name(), entry.payload.len() as u64))
            .collect()
    }
}

/// The section table, once the file's checksum is verified. A checksum
/// mismatch is reported before anything wrong with the table; with a valid
/// table the file's CRC-32 is combined from the sections' (each byte is read once).
pub(super) fn checked_table(bytes: &[u8], count: usize) -> Result<Table<'_>, CheckpointError> {
    let body_end = bytes.len() - TRAILER_SIZE;
    let stored = u32_at(bytes, body_end);
    let table = decode_table(bytes, count).map(|sections| Table {
        entries: sections
            .into_iter()
            .map(|(kind, payload)| Entry {
                kind,
                payload,
                crc: crc32fast::hash(payload),
            })
            .collect(),
    });
    let computed = match &table {
        Ok(table) => combined_crc(
            &bytes[..table_end(count)],
            table.entries.iter().map(|e| (e.crc, e.payload.len())),
        ),
        Err(_) => crc32fast::hash(&bytes[..body_end]),
    };
    if stored != computed {
        return Err(CheckpointError::ChecksumMismatch { stored, computed });
    }
    table
}

/// Check the section table: known kinds, bounds, order, tiling, no
/// duplicates. Returns each section's kind and payload, in file order.
fn decode_table(bytes: &[u8], count: usize) -> Result<Vec<(SectionKind, &[u8])>, CheckpointError> {
    let body_end = (bytes.len() - TRAILER_SIZE) as u64;
    let mut sections: Vec<(SectionKind, &[u8])> = Vec::with_capacity(count);
    let mut expected_offset = table_end(count) as u64;
    for index in 0..count {
        let entry = &bytes[table_end(index)..][..TABLE_ENTRY_SIZE];
        let (kind, offset, size) = decode_entry(entry)?;
        let end = offset.checked_add(size).filter(|end| *end <= body_end);
        let Some(end) = end.filter(|_| offset == expected_offset) else {
            return Err(corrupt(format!("section {} is out of place", kind.name())));
        };
        if sections.iter().any(|(k, _)| *k == kind) {
            return Err(corrupt(format!("section {} appears twice", kind.name())));
        }
        sections.push((kind, &bytes[offset as usize..end as usize]));
        expected_offset = end;
    }
    if expected_offset != body_end {
        return Err(corrupt("the sections do not fill the file"));
    }
    Ok(sections)
}

/// One table entry's kind, offset and size: a known kind, no flags, a size
/// within the kind's bound.
fn decode_entry(entry: &[u8]) -> Result<(SectionKind, u64, u64), CheckpointError> {
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
    Ok((kind, offset, size))
}

/// The CRC-32 of `prefix` followed by sections given by their own CRC-32s and
/// lengths, in file order: each byte of a checkpoint is read once.
pub(super) fn combined_crc(prefix: &[u8], sections: impl IntoIterator<Item = (u32, usize)>) -> u32 {
    let mut whole = crc32fast::Hasher::new();
    whole.update(prefix);
    for (crc, len) in sections {
        whole.combine(&crc32fast::Hasher::new_with_initial_len(crc, len as u64));
    }
    whole.finalize()
}

/// Write the header and the section table for sections of these kinds and
/// payload lengths, in this order; returns where the payloads start.
pub(super) fn write_header_and_table(out: &mut [u8], sections: &[(SectionKind, usize)]) -> usize {
    let total = file_len(sections.iter().map(|(_, len)| *len));
    out[..8].copy_from_slice(MAGIC);
    out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[10..12].copy_from_slice(&(HEADER_SIZE as u16).to_le_bytes());
    out[12..16].copy_from_slice(&(sections.len() as u32).to_le_bytes());
    out[16..24].copy_from_slice(&(total as u64).to_le_bytes());
    out[24..32].fill(0);
    let mut offset = table_end(sections.len());
    for (index, (kind, len)) in sections.iter().enumerate() {
        let entry = &mut out[table_end(index)..][..TABLE_ENTRY_SIZE];
        entry[..4].copy_from_slice(&(*kind as u32).to_le_bytes());
        entry[4..8].fill(0);
        entry[8..16].copy_from_slice(&(offset as u64).to_le_bytes());
        entry[16..24].copy_from_slice(&(*len as u64).to_le_bytes());
        offset += len;
    }
    table_end(sections.len())
}
