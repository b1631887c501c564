//! The safe native layer: RAII owners of llama.cpp's handles (models,
//! contexts, batches, grammars, chat templates, speculative sessions) and
//! safe functions over its other calls (the build's description).
//!
//! Every `unsafe` call into `llama-cpp-sys-4` lives in this module tree, next
//! to a `// SAFETY:` note. Types here are plain Rust: the Python bindings wrap
//! them without reaching into llama.cpp themselves.

mod backend;
mod batch;
mod chat;
mod context;
mod grammar;
pub mod info;
mod model;
mod seq_state;
mod session;

pub use backend::ensure_backend;
pub use batch::{Batch, MAX_BATCH_ROWS};
pub use chat::{ChatTemplates, PromptPart, MAX_RENDERED_BYTES};
pub use context::{
    available_cpus, recurrent_state_bytes, Context, ContextBytes, ContextKind, ContextParams,
    MAX_SEQUENCES,
};
pub use grammar::{json_schema_to_grammar, Grammar, MAX_GRAMMAR_BYTES};
pub use model::Model;
pub use session::{OtherContexts, SessionConfig, SessionHandle, SpecType, StateStatus};

use std::path::PathBuf;

/// Failures of the native layer, each with a message fit for a user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NativeError {
    /// The model file is missing, unreadable, not GGUF, or refused by llama.cpp.
    #[error("cannot load model {path}: {reason}")]
    ModelLoad {
        /// The path as given.
        path: PathBuf,
        /// Why it could not be loaded.
        reason: String,
    },
    /// llama.cpp refused to create a context with these parameters.
    #[error("cannot create a llama.cpp context: {0}")]
    ContextInit(String),
    /// An argument is outside what the native call accepts.
    #[error("{0}")]
    InvalidArgument(String),
    /// `llama_decode` failed.
    #[error("llama_decode failed with status {0}")]
    Decode(i32),
    /// Sequence state could not be read or written.
    #[error("{0}")]
    SequenceState(String),
    /// The file of a model loaded with `use_mmap` was written after loading.
    #[error(
        "model {path} was loaded with use_mmap=True and its file has changed since ({change}): \
         its weights may no longer be the ones its fingerprint names, so no checkpoint is \
         written or restored with it; load the model again"
    )]
    ModelChanged {
        /// The path the model was loaded from.
        path: PathBuf,
        /// What changed (size, times, or the error reading them).
        change: String,
    },
}

/// A token id outside a vocabulary: the one rule for every token a caller gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("token {token} is outside the vocabulary of {n_vocab} tokens")]
pub struct OutOfVocabulary {
    /// The first id outside the vocabulary.
    pub token: i32,
    /// Tokens in the vocabulary.
    pub n_vocab: usize,
}

/// Refuse the first of `tokens` that is not an id below `n_vocab`
/// (llama.cpp reads tables at these ids, and its drafters abort on others).
pub fn check_vocabulary(tokens: &[i32], n_vocab: usize) -> Result<(), OutOfVocabulary> {
    match tokens
        .iter()
        .find(|&&token| usize::try_from(token).map_or(true, |t| t >= n_vocab))
    {
        Some(&token) => Err(OutOfVocabulary { token, n_vocab }),
        None => Ok(()),
    }
}

impl From<OutOfVocabulary> for NativeError {
    fn from(error: OutOfVocabulary) -> Self {
        Self::InvalidArgument(error.to_string())
    }
}

/// Shorthand for results of the native layer.
pub type NativeResult<T> = Result<T, NativeError>;
