//! Raising the typed exceptions of `specstate.errors` from native code.
//!
//! The exception classes live in Python (so that they carry fields, accept
//! keyword arguments and pickle like any Python exception); this module maps
//! the seed's error values onto them one to one.

use pyo3::call::PyCallArgs;
use pyo3::prelude::*;

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
