//! Raising the typed exceptions of `specstate.errors` from native code.
//!
//! The exception classes live in Python (so that they carry fields, accept
//! keyword arguments and pickle like any Python exception); this module maps
//! the seed's error values onto them one to one.

use std::thread::ThreadId;

use pyo3::call::PyCallArgs;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use pyo3::types::PyDict;

use crate::checkpoint::CheckpointError;
use crate::native::NativeError;
use crate::speculative::SpeculativeStateError;

const ERRORS_MODULE: &str = "specstate.errors";

/// An instance of `specstate.errors.<class_name>(*args)` as a `PyErr`.
fn python_error<'py>(py: Python<'py>, class_name: &str, args: impl PyCallArgs<'py>) -> PyErr {
    let raised = py
        .import(ERRORS_MODULE)
        .and_then(|module| module.getattr(class_name))
        .and_then(|class| class.call1(args));
    match raised {
        Ok(instance) => PyErr::from_value(instance),
        Err(error) => error,
    }
}

/// `ConfigError(message)`: the seed's `validate_config` message.
pub(crate) fn config_error(py: Python<'_>, message: &str) -> PyErr {
    python_error(py, "ConfigError", (message,))
}

/// `CapacityError(message)`: the seed's `validate_context_capacities` message.
pub(crate) fn capacity_error(py: Python<'_>, message: &str) -> PyErr {
    python_error(py, "CapacityError", (message,))
}

/// `ExcessiveStateError(size, maximum)` for a size given as a Python integer,
/// which may exceed every native integer type.
pub(crate) fn excessive_state_error<'py>(
    py: Python<'py>,
    size: Bound<'py, PyAny>,
    maximum: usize,
) -> PyErr {
    python_error(py, "ExcessiveStateError", (size, maximum))
}

/// The Python exception of one seed `SpeculativeStateError` variant.
pub(crate) fn speculative_state_error(py: Python<'_>, error: SpeculativeStateError) -> PyErr {
    use SpeculativeStateError as E;
    match error {
        E::Null => python_error(py, "NullStateError", ()),
        E::BadSequence => python_error(py, "BadSequenceError", ()),
        E::NotQuiescent => python_error(py, "NotQuiescentError", ()),
        E::SizeChanged { expected, actual } => {
            python_error(py, "StateSizeChangedError", (expected, actual))
        }
        E::BufferTooSmall => python_error(py, "BufferTooSmallError", ()),
        E::Unavailable => python_error(py, "StateUnavailableError", ()),
        E::Invalid => python_error(py, "InvalidStateError", ()),
        E::Overflow => python_error(py, "StateOverflowError", ()),
        E::Exception => python_error(py, "NativeExceptionError", ()),
        E::Excessive { size, maximum } => python_error(py, "ExcessiveStateError", (size, maximum)),
        E::Unknown(status) => python_error(py, "UnknownStatusError", (status,)),
    }
}

/// The Python exception of a native-layer failure.
pub(crate) fn native_error(py: Python<'_>, error: NativeError) -> PyErr {
    match error {
        NativeError::ModelLoad { path, reason } => {
            python_error(py, "ModelLoadError", (path.display().to_string(), reason))
        }
        NativeError::ContextInit(message) => python_error(py, "ContextError", (message,)),
        NativeError::InvalidArgument(message) => PyValueError::new_err(message),
        NativeError::Decode(status) => python_error(py, "DecodeError", (status,)),
        NativeError::SequenceState(message) => python_error(py, "SequenceStateError", (message,)),
    }
}

/// `SessionError(message)`: a speculative session call out of order.
pub(crate) fn session_error(py: Python<'_>, message: impl Into<String>) -> PyErr {
    python_error(py, "SessionError", (message.into(),))
}

/// `ContextError(message)`: contexts that do not fit together.
pub(crate) fn context_error(py: Python<'_>, message: impl Into<String>) -> PyErr {
    python_error(py, "ContextError", (message.into(),))
}

/// Raise `ThreadAffinityError` unless called on `owner`, the creating thread.
pub(crate) fn ensure_thread(py: Python<'_>, owner: ThreadId, what: &str) -> PyResult<()> {
    if std::thread::current().id() == owner {
        return Ok(());
    }
    Err(python_error(
        py,
        "ThreadAffinityError",
        (format!("this {what} was created on another thread; use it only from the thread that created it"),),
    ))
}

/// The Python exception of a refused checkpoint, with its fields as keyword arguments.
pub(crate) fn checkpoint_error(py: Python<'_>, error: &CheckpointError) -> PyErr {
    use CheckpointError as E;
    let message = error.to_string();
    let kwargs = PyDict::new(py);
    let set = |name: &str, value: Bound<'_, PyAny>| {
        let _ = kwargs.set_item(name, value);
    };
    let class = match error {
        E::NotACheckpoint => "NotACheckpointError",
        E::UnsupportedVersion { found, supported } => {
            set("found", found.into_pyobject(py).expect("int").into_any());
            set(
                "supported",
                supported.into_pyobject(py).expect("int").into_any(),
            );
            "UnsupportedVersionError"
        }
        E::Truncated { expected, actual } => {
            set(
                "expected",
                expected.into_pyobject(py).expect("int").into_any(),
            );
            set("actual", actual.into_pyobject(py).expect("int").into_any());
            "TruncatedCheckpointError"
        }
        E::ChecksumMismatch { stored, computed } => {
            set("stored", stored.into_pyobject(py).expect("int").into_any());
            set(
                "computed",
                computed.into_pyobject(py).expect("int").into_any(),
            );
            "ChecksumMismatchError"
        }
        E::Corrupt(_) => "CorruptCheckpointError",
        E::SectionTooLarge {
            section,
            size,
            maximum,
        } => {
            set(
                "section",
                section.into_pyobject(py).expect("str").into_any(),
            );
            set("size", size.into_pyobject(py).expect("int").into_any());
            set(
                "maximum",
                maximum.into_pyobject(py).expect("int").into_any(),
            );
            "SectionTooLargeError"
        }
        E::ModelMismatch {
            role,
            expected,
            actual,
        } => {
            set("role", role.into_pyobject(py).expect("str").into_any());
            set(
                "expected",
                expected.into_pyobject(py).expect("str").into_any(),
            );
            set("actual", actual.into_pyobject(py).expect("str").into_any());
            "ModelMismatchError"
        }
        E::ConfigMismatch {
            field,
            checkpoint,
            generator,
        } => {
            set("field", field.into_pyobject(py).expect("str").into_any());
            set(
                "checkpoint",
                checkpoint.into_pyobject(py).expect("str").into_any(),
            );
            set(
                "generator",
                generator.into_pyobject(py).expect("str").into_any(),
            );
            "ConfigMismatchError"
        }
    };
    let raised = py
        .import(ERRORS_MODULE)
        .and_then(|module| module.getattr(class))
        .and_then(|class| class.call((message,), Some(&kwargs)));
    match raised {
        Ok(instance) => PyErr::from_value(instance),
        Err(error) => error,
    }
}

/// `specstate.errors.<class_name>(message)`.
pub(crate) fn python_error_message(
    py: Python<'_>,
    class_name: &str,
    message: impl Into<String>,
) -> PyErr {
    python_error(py, class_name, (message.into(),))
}
