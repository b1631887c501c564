//! The safe native layer: RAII owners of llama.cpp's handles.
//!
//! Every `unsafe` call into `llama-cpp-sys-4` lives in this module tree, next
//! to a `// SAFETY:` note. Types here are plain Rust: the Python bindings wrap
//! them without reaching into llama.cpp themselves.

mod backend;
mod batch;
mod context;
mod model;

pub use backend::ensure_backend;
pub use batch::{Batch, MAX_BATCH_ROWS};
pub use context::{Context, ContextKind, ContextParams, MAX_SEQUENCES, MAX_THREADS};
pub use model::Model;

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
}

/// Shorthand for results of the native layer.
pub type NativeResult<T> = Result<T, NativeError>;
