//! Conversion of Python arguments into the native types the speculative-session contract takes.
//!
//! The rules are the same for every binding:
//! - an integer argument is anything `operator.index` accepts, except `bool`;
//! - an integer outside the native type's range saturates to the nearest bound
//!   of that type, so it fails the contract's own bound check with the contract's own
//!   message (never an `OverflowError`);
//! - a float argument is converted to `f32` exactly as C converts a double:
//!   round to nearest, overflow to infinity.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use std::collections::BTreeMap;

use crate::limits::SettingError;
use crate::settings::SamplingParams;

/// `operator.index(value)`, refusing `bool` with a `TypeError` naming `name`.
pub(crate) fn index_argument<'py>(
    value: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Bound<'py, PyInt>> {
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an integer, not bool"
        )));
    }
    if let Ok(int) = value.cast::<PyInt>() {
        return Ok(int.clone());
    }
    let py = value.py();
    // SAFETY: `value` is a live object for the duration of the call and the
    // GIL is held (we have a `Python` token); `PyNumber_Index` returns a new
    // reference or null with a Python error set, which `from_owned_ptr_or_err`
    // takes ownership of.
    let index =
        unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyNumber_Index(value.as_ptr())) };
    match index {
        Ok(index) => Ok(index.cast_into::<PyInt>()?),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be an integer, not {}",
            value.get_type().name()?
        ))),
    }
}

/// An integer as `i128`, saturated when it does not fit.
fn saturating_i128(value: &Bound<'_, PyInt>) -> PyResult<i128> {
    match value.extract::<i128>() {
        Ok(exact) => Ok(exact),
        Err(error) if error.is_instance_of::<PyOverflowError>(value.py()) => {
            Ok(if value.lt(0)? { i128::MIN } else { i128::MAX })
        }
        Err(error) => Err(error),
    }
}

/// The integer clamped into `T`'s range, for bound checks that reject both ends.
pub(crate) fn saturating<T>(value: &Bound<'_, PyAny>, name: &str) -> PyResult<T>
where
    T: TryFrom<i128> + Bounded,
{
    let wide = saturating_i128(&index_argument(value, name)?)?;
    Ok(T::try_from(wide).unwrap_or(if wide < 0 { T::MIN } else { T::MAX }))
}

/// What an integer argument is, relative to a native type's range.
pub(crate) enum Ranged<T> {
    Fits(T),
    Negative,
    TooLarge,
}

/// The integer in `T` if it fits, or which side of `T`'s range it falls on.
pub(crate) fn ranged<T: TryFrom<i128>>(
    value: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<Ranged<T>> {
    let wide = saturating_i128(&index_argument(value, name)?)?;
    Ok(match T::try_from(wide) {
        Ok(fits) => Ranged::Fits(fits),
        Err(_) if wide < 0 => Ranged::Negative,
        Err(_) => Ranged::TooLarge,
    })
}

/// A probability argument as the native `float` receives it.
///
/// Accepts a `float` (converted to `f32` with round-to-nearest and overflow to
/// infinity) or an integer per [`index_argument`] (an integer too large for a
/// double becomes an infinity of its sign).
pub(crate) fn f32_argument(value: &Bound<'_, PyAny>, name: &str) -> PyResult<f32> {
    if let Ok(float) = value.cast::<PyFloat>() {
        return Ok(float.value() as f32);
    }
    if value.is_instance_of::<PyBool>()
        || value.hasattr("__index__").map(|has| !has).unwrap_or(true)
    {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int or a float, not {}",
            value.get_type().name()?
        )));
    }
    let int = index_argument(value, name)?;
    match int.extract::<f64>() {
        Ok(double) => Ok(double as f32),
        Err(error) if error.is_instance_of::<PyOverflowError>(value.py()) => Ok(if int.lt(0)? {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        }),
        Err(error) => Err(error),
    }
}

/// Native integer types with a smallest and largest value.
pub(crate) trait Bounded: Sized {
    const MIN: Self;
    const MAX: Self;
}

macro_rules! bounded {
    ($($t:ty),*) => {$(
        impl Bounded for $t {
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
        }
    )*};
}
bounded!(u32, i32, u64, usize);

/// An integer argument kept wide until [`WideInt::narrow`] names it, so that
/// a value outside the native type gives a `ValueError` naming the argument
/// (never an `OverflowError`). Anything `operator.index` accepts except
/// `bool`; out-of-`i128` values saturate (and then fail to narrow).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WideInt(pub(crate) i128);

impl<'a, 'py> FromPyObject<'a, 'py> for WideInt {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        saturating_i128(&index_argument(&obj, "the argument")?).map(Self)
    }
}

impl WideInt {
    /// A count: negative is a `ValueError` naming `name`; one beyond every
    /// native size saturates (it means "all").
    pub(crate) fn count(self, name: &str) -> PyResult<usize> {
        if self.0 < 0 {
            return Err(PyValueError::new_err(format!(
                "{name} must not be negative, not {}",
                self.0
            )));
        }
        Ok(usize::try_from(self.0).unwrap_or(usize::MAX))
    }

    /// The value clamped into `T`'s range, for bound checks that reject both
    /// ends (they then refuse it with their own message, naming the argument).
    pub(crate) fn saturate<T>(self) -> T
    where
        T: TryFrom<i128> + Bounded,
    {
        T::try_from(self.0).unwrap_or(if self.0 < 0 { T::MIN } else { T::MAX })
    }

    /// The value in `T`, or a `ValueError` naming `name` and `T`'s range.
    pub(crate) fn narrow<T>(self, name: &str) -> PyResult<T>
    where
        T: TryFrom<i128> + Bounded + std::fmt::Display,
    {
        T::try_from(self.0).map_err(|_| {
            PyValueError::new_err(format!(
                "{name} must be between {} and {}, not {}",
                T::MIN,
                T::MAX,
                self.0
            ))
        })
    }
}

/// Token ids from Python. An id outside `i32` saturates, so that the
/// vocabulary check refuses it like any other id outside the vocabulary
/// (never an `OverflowError`).
pub(crate) struct TokenIds(pub(crate) Vec<i32>);

impl<'a, 'py> FromPyObject<'a, 'py> for TokenIds {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let wide: Vec<WideInt> = obj.extract()?;
        Ok(Self(wide.into_iter().map(WideInt::saturate).collect()))
    }
}

/// A logit bias from Python (`{token: bias}`) as ascending entries; the
/// generator checks the values and the tokens against the vocabulary.
pub(crate) fn bias_entries(bias: Option<BTreeMap<i64, f32>>) -> PyResult<Vec<(i32, f32)>> {
    let bias = bias.unwrap_or_default();
    if bias.len() > SamplingParams::MAX_LOGIT_BIAS {
        return Err(SettingError {
            field: "logit_bias",
            reason: format!(
                "has {} entries, more than {}",
                bias.len(),
                SamplingParams::MAX_LOGIT_BIAS
            ),
        }
        .into());
    }
    bias.into_iter()
        .map(|(token, value)| match i32::try_from(token) {
            Ok(token) if token >= 0 => Ok((token, value)),
            _ => Err(SettingError {
                field: "logit_bias",
                reason: format!("token {token} is not a token id"),
            }
            .into()),
        })
        .collect()
}

/// A cost curve's entries as microseconds (each narrowed to `u32`).
pub(crate) fn narrow_cost_curve(costs: Option<Vec<WideInt>>) -> PyResult<Option<Vec<u32>>> {
    costs
        .map(|costs| {
            costs
                .into_iter()
                .map(|c| c.narrow::<u32>("cost_curve"))
                .collect()
        })
        .transpose()
}
