//! The default thread count (`crate::native::threads`) as Python reads it: `default_threads`, the machine
//! it reads (`machine_cpus`) and the rule itself over given numbers (`threads_for`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::arguments::WideInt;
use crate::native::threads::{self, Cpus};

/// A number of slots: 1 to `u32::MAX`, else a `ValueError` naming `slots`.
fn slots_argument(slots: WideInt) -> PyResult<u32> {
    match slots.narrow::<u32>("slots")? {
        0 => Err(PyValueError::new_err("slots must be at least 1, not 0")),
        slots => Ok(slots),
    }
}

/// The threads each of `slots` generations decoding at once in this process gets by default.
#[pyfunction]
#[pyo3(signature = (slots = WideInt(1)), text_signature = "(slots=1)")]
pub(crate) fn default_threads(slots: WideInt) -> PyResult<i32> {
    Ok(threads::default_threads(slots_argument(slots)?))
}

/// What the rule reads of this machine: `usable` CPUs and `physical_cores` (0 if unknown).
#[pyfunction]
pub(crate) fn machine_cpus(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let cpus = Cpus::read();
    let out = PyDict::new(py);
    out.set_item("usable", cpus.usable)?;
    out.set_item("physical_cores", cpus.physical_cores)?;
    Ok(out)
}

/// The rule over given numbers: threads for each of `slots` generations on a machine with `usable` CPUs and
/// `physical_cores` cores (0: unknown).
#[pyfunction]
#[pyo3(signature = (usable, physical_cores, slots = WideInt(1)),
       text_signature = "(usable, physical_cores, slots=1)")]
pub(crate) fn threads_for(
    usable: WideInt,
    physical_cores: WideInt,
    slots: WideInt,
) -> PyResult<u32> {
    let cpus = Cpus {
        usable: usable.narrow("usable")?,
        physical_cores: physical_cores.narrow("physical_cores")?,
    };
    Ok(threads::threads_for(cpus, slots_argument(slots)?))
}

/// The threads a graph of a context configured for `configured` threads (0: the default) would run with
/// now (docs/threads.md): at most the CPUs that the machine's other runnable tasks leave free, smoothed over
/// the last readings (this call is one). For tests and diagnostics; every decode asks the same.
#[pyfunction]
#[pyo3(text_signature = "(configured)")]
pub(crate) fn threads_now(configured: WideInt) -> PyResult<i32> {
    let configured = crate::limits::check_threads(configured.narrow::<i32>("configured")?.into())
        .map_err(|error| PyValueError::new_err(error.to_string()))?;
    Ok(threads::threads_now(threads::resolved(configured)))
}
