//! The safe native layer: RAII owners of llama.cpp's handles (models,
//! contexts, embedding contexts, batches, grammars, chat templates,
//! speculative sessions) and safe functions over its other calls (the
//! build's description).
//!
//! Every `unsafe` call into `llama-cpp-sys-4` lives in this module tree, next
//! to a `// SAFETY:` note. Types here are plain Rust: the Python bindings wrap
//! them without reaching into llama.cpp themselves.

mod backend;
mod batch;
mod chat;
mod chat_tools;
mod context;
mod embedding;
mod grammar;
pub mod info;
mod model;
mod pages;
mod pool;
mod seq_state;
mod session;
pub mod threads;

pub use backend::ensure_backend;
pub use batch::Batch;
pub use chat::{builtin_template_names, ChatTemplates, PromptPart, MAX_RENDERED_BYTES};
pub use chat_tools::{format_name, GrammarTrigger, ToolChoice, ToolRender, ToolRequest};
pub use context::{
    recurrent_state_bytes, restream_seq_state, Context, ContextBytes, ContextKind, ContextParams,
};
pub use embedding::{
    Embedder, EmbedderParams, Embedding, EmbeddingInputError, Pooling, MAX_EMBEDDING_FLOATS,
    MAX_EMBEDDING_INPUTS,
};
pub use grammar::{json_schema_to_grammar, Grammar};
pub use model::Model;
pub use pages::{advise_huge_pages, zeroed_buffer};
pub use session::{OtherContexts, SessionConfig, SessionHandle, SpecType, StateStatus};
pub use threads::default_threads;

use std::path::PathBuf;

use crate::messages::{fill, template};

/// Failures of the native layer, each with a message fit for a user.
///
/// The message of each variant with fields of its own Python exception
/// (`ModelLoad`, `Decode`, `ModelChanged`) is written once, in
/// [`NativeError::MESSAGES`]: `Display` fills it in here, and the Python
/// exceptions of `specstate.errors` read the same templates from
/// `specstate._native.NATIVE_MESSAGES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeError {
    /// The model file is missing, unreadable, not GGUF, or refused by llama.cpp.
    ModelLoad {
        /// The path as given.
        path: PathBuf,
        /// Why it could not be loaded.
        reason: String,
    },
    /// llama.cpp refused to create a context with these parameters.
    ContextInit(String),
    /// An argument is outside what the native call accepts.
    InvalidArgument(String),
    /// `llama_decode` failed.
    Decode(i32),
    /// Sequence state could not be read or written.
    SequenceState(String),
    /// The file of a model loaded with `use_mmap` was written after loading.
    ModelChanged {
        /// The path the model was loaded from.
        path: PathBuf,
        /// What changed (size, times, or the error reading them).
        change: String,
    },
}

impl NativeError {
    /// The message of each variant whose Python exception has fields, by
    /// variant name, the one place it is written: `{name}` stands for the
    /// field `name` (`{status}` for `Decode`'s), as in Python's `str.format`.
    pub const MESSAGES: [(&'static str, &'static str); 3] = [
        ("ModelLoad", "cannot load model {path}: {reason}"),
        ("Decode", "llama_decode failed with status {status}"),
        (
            "ModelChanged",
            "model {path} was loaded with use_mmap=True and its file has changed since ({change}): \
             its weights may no longer be the ones its fingerprint names, so no checkpoint is \
             written or restored with it; load the model again",
        ),
    ];
}

impl std::fmt::Display for NativeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ModelLoad { path, reason } => f.write_str(&fill(
                template(&Self::MESSAGES, "ModelLoad"),
                &[("path", &path.display()), ("reason", reason)],
            )),
            Self::ContextInit(reason) => write!(f, "cannot create a llama.cpp context: {reason}"),
            Self::InvalidArgument(message) | Self::SequenceState(message) => f.write_str(message),
            Self::Decode(status) => f.write_str(&fill(
                template(&Self::MESSAGES, "Decode"),
                &[("status", status)],
            )),
            Self::ModelChanged { path, change } => f.write_str(&fill(
                template(&Self::MESSAGES, "ModelChanged"),
                &[("path", &path.display()), ("change", change)],
            )),
        }
    }
}

impl std::error::Error for NativeError {}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_filled_in_once_from_their_templates() {
        let load = NativeError::ModelLoad {
            path: "/m/{reason}.gguf".into(),
            reason: "not GGUF".into(),
        };
        assert_eq!(
            load.to_string(),
            "cannot load model /m/{reason}.gguf: not GGUF"
        );
        assert_eq!(
            NativeError::Decode(-3).to_string(),
            "llama_decode failed with status -3"
        );
        let changed = NativeError::ModelChanged {
            path: "m.gguf".into(),
            change: "size".into(),
        };
        assert!(changed
            .to_string()
            .starts_with("model m.gguf was loaded with use_mmap=True and its file has changed since (size): its weights"));
        let names: Vec<&str> = NativeError::MESSAGES
            .iter()
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(names, ["ModelLoad", "Decode", "ModelChanged"]);
    }
}
