//! `native_info()` and the import-time CPU check.

use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::native::info as build;

/// A description of the native build, as a dict of plain values.
#[pyfunction]
pub(crate) fn native_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = PyDict::new(py);
    info.set_item("specstate_version", env!("CARGO_PKG_VERSION"))?;
    info.set_item("llama_cpp_sys_version", build::LLAMA_CPP_SYS_VERSION)?;
    info.set_item("llama_cpp_build", build::LLAMA_CPP_BUILD)?;
    info.set_item("llama_cpp_commit", build::LLAMA_CPP_COMMIT)?;
    info.set_item("backends", build::compiled_backends())?;
    info.set_item("cpu_baseline", build::CPU_BASELINE)?;
    info.set_item("simd_features", build::compiled_simd_features())?;
    info.set_item("exact_sums", build::exact_sums())?;
    info.set_item("exact_attention", build::exact_attention())?;
    info.set_item("exact_tiles", build::exact_tiles())?;
    info.set_item("exact_q4_k", build::exact_q4_k())?;
    info.set_item("exact_q4_k_cols_chunks", build::exact_q4_k_cols_chunks())?;
    info.set_item("exact_q6_k", build::exact_q6_k())?;
    info.set_item("exact_q6_k_cols_chunks", build::exact_q6_k_cols_chunks())?;
    for (name, ty) in build::SWITCHED_KERNELS {
        info.set_item(format!("exact_{name}"), build::exact_type(ty))?;
        info.set_item(
            format!("exact_{name}_cols_chunks"),
            build::exact_type_cols_chunks(ty),
        )?;
    }
    info.set_item("system_info", build::system_info())?;
    let devices = PyList::empty(py);
    for device in build::devices() {
        let entry = PyDict::new(py);
        entry.set_item("name", device.name)?;
        entry.set_item("description", device.description)?;
        entry.set_item("type", device.kind)?;
        entry.set_item("memory_total", device.memory_total)?;
        entry.set_item("memory_free", device.memory_free)?;
        devices.append(entry)?;
    }
    info.set_item("devices", devices)?;
    Ok(info)
}

/// Refuse to load on a CPU that lacks the SIMD features compiled in.
pub(crate) fn ensure_cpu_supported() -> PyResult<()> {
    let missing = build::missing_cpu_features();
    if missing.is_empty() {
        return Ok(());
    }
    Err(PyImportError::new_err(format!(
        "specstate's native code was compiled for {} and this CPU lacks {}; \
         rebuild it from source for this CPU (see docs/cpu-baseline.md)",
        build::CPU_BASELINE,
        missing.join(", ")
    )))
}

/// The GBNF grammar (start rule `root`) of the JSON values a JSON Schema
/// (given as JSON text) describes: llama.cpp's own converter.
#[pyfunction]
pub(crate) fn json_schema_to_grammar(py: Python<'_>, schema: &str) -> PyResult<String> {
    crate::native::ensure_backend();
    Ok(py.detach(|| crate::native::json_schema_to_grammar(schema))?)
}
