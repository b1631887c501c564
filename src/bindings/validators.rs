//! The contract's validators and bounds as Python functions and classes.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;

use super::arguments::{f32_argument, ranged, saturating, Ranged};
use super::errors::excessive_state_error;
use crate::session::SessionError;
use crate::speculative::{
    self, SpeculativeContextCapacity, SpeculativeStateError, MAX_SPECULATIVE_STATE_BYTES,
};

/// Check a speculative session configuration against the contract's bounds.
#[pyfunction]
pub(crate) fn validate_config(
    n_seq: &Bound<'_, PyAny>,
    n_draft_max: &Bound<'_, PyAny>,
    n_min: &Bound<'_, PyAny>,
    p_min: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let n_seq: u32 = saturating(n_seq, "n_seq")?;
    let n_draft_max: i32 = saturating(n_draft_max, "n_draft_max")?;
    let n_min: i32 = saturating(n_min, "n_min")?;
    let p_min = f32_argument(p_min, "p_min")?;
    speculative::validate_config(n_seq, n_draft_max, n_min, p_min).map_err(SessionError::Config)?;
    Ok(())
}

/// The capacities of one llama.cpp context that bound a speculative batch.
#[pyclass(module = "specstate._native", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct ContextCapacity {
    pub(crate) inner: SpeculativeContextCapacity,
}

fn u32_field(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    match ranged::<u32>(value, name)? {
        Ranged::Fits(fits) => Ok(fits),
        Ranged::Negative | Ranged::TooLarge => Err(PyValueError::new_err(format!(
            "{name} must be between 0 and 4294967295, got {value}"
        ))),
    }
}

#[pymethods]
impl ContextCapacity {
    #[new]
    fn new(
        batch: &Bound<'_, PyAny>,
        micro_batch: &Bound<'_, PyAny>,
        recurrent_slots: &Bound<'_, PyAny>,
        recurrent_or_hybrid: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let inner = SpeculativeContextCapacity {
            batch: u32_field(batch, "batch")?,
            micro_batch: u32_field(micro_batch, "micro_batch")?,
            recurrent_slots: u32_field(recurrent_slots, "recurrent_slots")?,
            recurrent_or_hybrid: recurrent_or_hybrid
                .cast::<PyBool>()
                .map_err(|_| PyTypeError::new_err("recurrent_or_hybrid must be a bool"))?
                .is_true(),
        };
        Ok(Self { inner })
    }

    /// Rows one decode call may hold (`n_batch`).
    #[getter]
    fn batch(&self) -> u32 {
        self.inner.batch
    }

    /// Rows one compute pass may hold (`n_ubatch`).
    #[getter]
    fn micro_batch(&self) -> u32 {
        self.inner.micro_batch
    }

    /// Recurrent state slots of the context (`n_rs_seq`).
    #[getter]
    fn recurrent_slots(&self) -> u32 {
        self.inner.recurrent_slots
    }

    /// Whether the model has recurrent layers (recurrent or hybrid).
    #[getter]
    fn recurrent_or_hybrid(&self) -> bool {
        self.inner.recurrent_or_hybrid
    }

    fn __repr__(&self) -> String {
        let SpeculativeContextCapacity {
            batch,
            micro_batch,
            recurrent_slots,
            recurrent_or_hybrid,
        } = self.inner;
        let flag = if recurrent_or_hybrid { "True" } else { "False" };
        format!(
            "ContextCapacity(batch={batch}, micro_batch={micro_batch}, \
             recurrent_slots={recurrent_slots}, recurrent_or_hybrid={flag})"
        )
    }

    fn __getnewargs__(&self) -> (u32, u32, u32, bool) {
        let c = self.inner;
        (
            c.batch,
            c.micro_batch,
            c.recurrent_slots,
            c.recurrent_or_hybrid,
        )
    }
}

/// Check that both contexts can hold a draft of `maximum_draft_tokens` plus one.
#[pyfunction]
pub(crate) fn validate_context_capacities(
    target: PyRef<'_, ContextCapacity>,
    draft: PyRef<'_, ContextCapacity>,
    maximum_draft_tokens: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let maximum_draft_tokens = match ranged::<u32>(maximum_draft_tokens, "maximum_draft_tokens")? {
        Ranged::Fits(fits) => fits,
        Ranged::TooLarge => u32::MAX,
        Ranged::Negative => {
            return Err(PyValueError::new_err(format!(
                "maximum_draft_tokens must not be negative, got {maximum_draft_tokens}"
            )))
        }
    };
    speculative::validate_context_capacities(target.inner, draft.inner, maximum_draft_tokens)
        .map_err(SessionError::Capacity)?;
    Ok(())
}

/// Check a speculative state size against `MAX_SPECULATIVE_STATE_BYTES`.
#[pyfunction]
pub(crate) fn validate_state_size(size: &Bound<'_, PyAny>) -> PyResult<()> {
    match ranged::<usize>(size, "size")? {
        Ranged::Fits(fits) => Ok(speculative::validate_size(fits)?),
        Ranged::TooLarge => Err(excessive_state_error(
            super::arguments::index_argument(size, "size")?.into_any(),
            MAX_SPECULATIVE_STATE_BYTES,
        )),
        Ranged::Negative => Err(PyValueError::new_err(format!(
            "size must not be negative, got {size}"
        ))),
    }
}

/// Raise the Python exception that the contract's status mapping gives `status`
/// (nothing for `MTP_STATE_STATUS_OK`). Exposed so that tests can check the
/// native-to-Python mapping of every status.
#[pyfunction]
pub(crate) fn _raise_for_status(status: u32) -> PyResult<()> {
    Ok(speculative::status_result(status as _)?)
}

/// The contract's `Display` text of one error variant, named as in the Rust enum.
/// Exposed so that tests can compare it with the Python exceptions' `str()`.
#[pyfunction]
#[pyo3(signature = (variant, first = 0, second = 0))]
pub(crate) fn _seed_error_display(variant: &str, first: usize, second: usize) -> PyResult<String> {
    use SpeculativeStateError as E;
    let error = match variant {
        "Null" => E::Null,
        "BadSequence" => E::BadSequence,
        "NotQuiescent" => E::NotQuiescent,
        "SizeChanged" => E::SizeChanged {
            expected: first,
            actual: second,
        },
        "BufferTooSmall" => E::BufferTooSmall,
        "Unavailable" => E::Unavailable,
        "Invalid" => E::Invalid,
        "Overflow" => E::Overflow,
        "Exception" => E::Exception,
        "Excessive" => E::Excessive {
            size: first,
            maximum: second,
        },
        "Unknown" => E::Unknown(
            u32::try_from(first)
                .map_err(|_| PyValueError::new_err("an Unknown status is a u32"))?,
        ),
        other => {
            return Err(PyValueError::new_err(format!(
                "no seed error variant {other:?}"
            )))
        }
    };
    Ok(error.to_string())
}
