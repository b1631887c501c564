//! The one error of the core.
//!
//! Each layer keeps its own error type, with the fields its failures carry
//! ([`NativeError`], [`SessionError`] with the contract's `SpeculativeStateError`,
//! [`SettingError`], [`OutOfVocabulary`], [`CheckpointError`], [`ChatError`]);
//! each converts into [`Error`] with `From`, keeping its type (no message is
//! turned into a string on the way). The generator, the engine, the
//! checkpoint operations and chat return [`Error`], and the Python bindings
//! turn it into exceptions in one place (`bindings/errors.rs`).

use crate::chat::ChatError;
use crate::checkpoint::CheckpointError;
use crate::limits::SettingError;
use crate::native::{NativeError, OutOfVocabulary};
use crate::session::SessionError;
use crate::speculative::SpeculativeStateError;

/// Every failure of the core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// The call does not fit the generation's state.
    #[error("{0}")]
    Usage(String),
    /// A setting outside its range.
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// A token outside the vocabulary.
    #[error(transparent)]
    Vocabulary(#[from] OutOfVocabulary),
    /// A native failure (a failed decode included).
    #[error(transparent)]
    Native(#[from] NativeError),
    /// A speculative session failure (its speculative state included).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A checkpoint was refused (it is untrusted input).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Chat rendering or a conversation failed.
    #[error(transparent)]
    Chat(#[from] ChatError),
}

impl From<SpeculativeStateError> for Error {
    fn from(error: SpeculativeStateError) -> Self {
        Self::Session(SessionError::State(error))
    }
}

/// Shorthand for results of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;
