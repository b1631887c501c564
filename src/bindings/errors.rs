//! Raising the typed exceptions of `specstate.errors` from native code.
//!
//! The exception classes live in Python (so that they carry fields, accept
//! keyword arguments and pickle like any Python exception). They are reached
//! through PyO3's typed import ([`classes`]). The core's one error,
//! [`crate::Error`], becomes an exception in one place, its
//! `From<Error> for PyErr` (as polars-python's `PyPolarsErr`); each layer's
//! own error reaches it through its `From` into [`crate::Error`], so the
//! bindings use `?` on any of them. The module's init imports every class
//! named here, so a misspelt one fails at import, not when that error first
//! happens.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::PyTypeInfo;

use crate::chat::ChatError;
use crate::checkpoint::CheckpointError;
use crate::limits::SettingError;
use crate::native::{NativeError, OutOfVocabulary};
use crate::session::SessionError;
use crate::speculative::SpeculativeStateError;
use crate::Error;

macro_rules! python_exceptions {
    ($($name:ident),* $(,)?) => {
        $(pyo3::import_exception!(specstate.errors, $name);)*

        /// Import every exception class the bindings raise (at module init).
        pub(crate) fn import_all(py: Python<'_>) -> PyResult<()> {
            let module = py.import("specstate.errors")?;
            $(module.getattr(stringify!($name))?;)*
            Ok(())
        }
    };
}

/// The exception classes of `specstate.errors`, as Rust types.
pub(crate) mod classes {
    use pyo3::prelude::*;

    python_exceptions!(
        AllocationLimitError,
        BadSequenceError,
        BufferTooSmallError,
        CapacityError,
        ChatTemplateError,
        ChecksumMismatchError,
        ConfigError,
        ConfigMismatchError,
        ContextError,
        CorruptCheckpointError,
        DecodeError,
        ExcessiveStateError,
        GenerationError,
        InvalidStateError,
        ModelChangedError,
        ModelLoadError,
        ModelMismatchError,
        NativeExceptionError,
        NotACheckpointError,
        NotQuiescentError,
        NullStateError,
        SectionTooLargeError,
        SequenceStateError,
        SessionError,
        StateOverflowError,
        StateSizeChangedError,
        StateUnavailableError,
        ThreadAffinityError,
        TruncatedCheckpointError,
        UnknownStatusError,
        UnsupportedVersionError,
    );
}

/// The exception of the contract's speculative-state error: one class per variant.
fn speculative_state_error(error: SpeculativeStateError) -> PyErr {
    use classes as c;
    use SpeculativeStateError as E;
    match error {
        E::Null => c::NullStateError::new_err(()),
        E::BadSequence => c::BadSequenceError::new_err(()),
        E::NotQuiescent => c::NotQuiescentError::new_err(()),
        E::SizeChanged { expected, actual } => {
            c::StateSizeChangedError::new_err((expected, actual))
        }
        E::BufferTooSmall => c::BufferTooSmallError::new_err(()),
        E::Unavailable => c::StateUnavailableError::new_err(()),
        E::Invalid => c::InvalidStateError::new_err(()),
        E::Overflow => c::StateOverflowError::new_err(()),
        E::Exception => c::NativeExceptionError::new_err(()),
        E::Excessive { size, maximum } => c::ExcessiveStateError::new_err((size, maximum)),
        E::Unknown(status) => c::UnknownStatusError::new_err((status,)),
    }
}

/// A native failure's exception.
fn native_error(error: NativeError) -> PyErr {
    match error {
        NativeError::ModelLoad { path, reason } => {
            classes::ModelLoadError::new_err((path.display().to_string(), reason))
        }
        NativeError::ContextInit(message) => classes::ContextError::new_err((message,)),
        NativeError::InvalidArgument(message) => PyValueError::new_err(message),
        NativeError::Decode(status) => classes::DecodeError::new_err((status,)),
        NativeError::SequenceState(message) => classes::SequenceStateError::new_err((message,)),
        NativeError::ModelChanged { path, change } => {
            classes::ModelChangedError::new_err((path.display().to_string(), change))
        }
    }
}

/// A session failure's exception.
fn session_error(error: SessionError) -> PyErr {
    match error {
        SessionError::Config(message) => classes::ConfigError::new_err((message,)),
        SessionError::Capacity(message) => classes::CapacityError::new_err((message,)),
        SessionError::Incompatible(message) => classes::ContextError::new_err((message,)),
        SessionError::BadSequence { .. } => {
            speculative_state_error(SpeculativeStateError::BadSequence)
        }
        SessionError::Usage(message) | SessionError::Native(message) => {
            classes::SessionError::new_err((message,))
        }
        SessionError::State(state) => speculative_state_error(state),
    }
}

/// A chat failure's exception.
fn chat_error(error: ChatError) -> PyErr {
    match error {
        ChatError::Messages(message) => PyValueError::new_err(message),
        ChatError::Template(message) => classes::ChatTemplateError::new_err((message,)),
        ChatError::Native(error) => native_error(error),
    }
}

/// The one conversion of the core's error into a Python exception.
impl From<Error> for PyErr {
    fn from(error: Error) -> Self {
        match error {
            Error::Invalid(message) => PyValueError::new_err(message),
            Error::Setting(error) => PyValueError::new_err(error.to_string()),
            Error::Vocabulary(error) => PyValueError::new_err(error.to_string()),
            Error::Usage(message) => classes::GenerationError::new_err((message,)),
            Error::Native(error) => native_error(error),
            Error::Session(error) => session_error(error),
            Error::Checkpoint(error) => checkpoint_error(&error),
            Error::Chat(error) => chat_error(error),
        }
    }
}

/// Each layer's error becomes an exception through [`Error`] (so that `?`
/// works on it in the bindings).
macro_rules! through_core_error {
    ($($error:ty),* $(,)?) => {
        $(impl From<$error> for PyErr {
            fn from(error: $error) -> Self {
                Error::from(error).into()
            }
        })*
    };
}

through_core_error!(
    ChatError,
    CheckpointError,
    NativeError,
    OutOfVocabulary,
    SessionError,
    SettingError,
    SpeculativeStateError,
);

/// `ExcessiveStateError(size, maximum)` for a size given as a Python integer,
/// which may exceed every native integer type.
pub(crate) fn excessive_state_error(size: Bound<'_, PyAny>, maximum: usize) -> PyErr {
    classes::ExcessiveStateError::new_err((size.unbind(), maximum))
}

/// Raise `ThreadAffinityError` unless called on `owner`, the creating thread.
pub(crate) fn ensure_thread(owner: std::thread::ThreadId, what: &str) -> PyResult<()> {
    if std::thread::current().id() == owner {
        return Ok(());
    }
    Err(classes::ThreadAffinityError::new_err((format!(
        "this {what} was created on another thread; use it only from the thread that created it"
    ),)))
}

/// A checkpoint error's class and its fields, as keyword arguments.
fn checkpoint_fields<'py>(
    py: Python<'py>,
    error: &CheckpointError,
) -> PyResult<(Bound<'py, pyo3::types::PyType>, Bound<'py, PyDict>)> {
    use classes as c;
    use CheckpointError as E;
    let fields = PyDict::new(py);
    let class = match error {
        E::NotACheckpoint => c::NotACheckpointError::type_object(py),
        E::UnsupportedVersion { found, supported } => {
            fields.set_item("found", found)?;
            fields.set_item("supported", supported)?;
            c::UnsupportedVersionError::type_object(py)
        }
        E::Truncated { expected, actual } => {
            fields.set_item("expected", expected)?;
            fields.set_item("actual", actual)?;
            c::TruncatedCheckpointError::type_object(py)
        }
        E::ChecksumMismatch { stored, computed } => {
            fields.set_item("stored", stored)?;
            fields.set_item("computed", computed)?;
            c::ChecksumMismatchError::type_object(py)
        }
        E::Corrupt(_) => c::CorruptCheckpointError::type_object(py),
        E::SectionTooLarge {
            section,
            size,
            maximum,
        } => {
            fields.set_item("section", section)?;
            fields.set_item("size", size)?;
            fields.set_item("maximum", maximum)?;
            c::SectionTooLargeError::type_object(py)
        }
        E::ModelMismatch {
            role,
            expected,
            actual,
        } => {
            fields.set_item("role", role)?;
            fields.set_item("expected", expected)?;
            fields.set_item("actual", actual)?;
            c::ModelMismatchError::type_object(py)
        }
        E::ConfigMismatch {
            field,
            checkpoint,
            generator,
        } => {
            fields.set_item("field", field)?;
            fields.set_item("checkpoint", checkpoint)?;
            fields.set_item("generator", generator)?;
            c::ConfigMismatchError::type_object(py)
        }
        E::ExcessiveAllocation {
            field,
            value,
            requested,
            maximum,
            ..
        } => {
            fields.set_item("field", field)?;
            fields.set_item("checkpoint", value.to_string())?;
            fields.set_item("generator", format!("at most {maximum}"))?;
            fields.set_item("requested", requested)?;
            fields.set_item("maximum", maximum)?;
            c::AllocationLimitError::type_object(py)
        }
    };
    Ok((class, fields))
}

/// A refused checkpoint's exception, its fields as keyword arguments.
fn checkpoint_error(error: &CheckpointError) -> PyErr {
    Python::attach(|py| {
        let raised = checkpoint_fields(py, error)
            .and_then(|(class, fields)| class.call((error.to_string(),), Some(&fields)));
        match raised {
            Ok(instance) => PyErr::from_value(instance),
            Err(failure) => failure,
        }
    })
}
