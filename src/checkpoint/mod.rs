//! The checkpoint format: one versioned, checksummed file holding everything a
//! generation needs to resume bit for bit (specified in docs/checkpoint-format.md).
//!
//! Layout (little-endian): a 32-byte header, a table of sections, the section
//! payloads in table order, and a CRC-32 trailer over every preceding byte.
//! Decoding validates everything before anything is applied.
//!
//! The module is split in two, and depends on the generator one way only:
//!
//! * the codec (`codec.rs`, with `format.rs`, `meta.rs` and `state.rs`)
//!   turns bytes into a validated [`Checkpoint`] and captured sections into
//!   bytes. It uses the generator's plain data types but never llama.cpp, a
//!   [`Generator`](crate::generator::Generator) or a model;
//! * the operations (`operations.rs`) capture a generator, write its
//!   checkpoint, and restore or load one, returning the core's
//!   [`crate::Error`] (a refused checkpoint is its `Checkpoint` variant).

mod codec;
mod format;
mod meta;
mod operations;
mod state;

pub use codec::{decode, Checkpoint, EncodeError, Payload, Sections};
pub use format::{CheckpointError, SectionKind, FORMAT_VERSION, MAGIC, MAX_CHECKPOINT_BYTES};
pub use meta::{Meta, ModelFingerprint};
pub use operations::{
    capture, check_config, check_models, fingerprint, load_into, restore, Capture, RestoreLimits,
    DEFAULT_MAX_N_BATCH, DEFAULT_MAX_N_CTX,
};
pub use state::EncodedState;
