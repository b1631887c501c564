//! Large `bytes` results (checkpoints, states) written in place.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::native::advise_huge_pages;

/// A `bytes` of `len` bytes written by `fill`, as `PyBytes::new_with` makes
/// one, except that huge pages are asked for before the buffer is first
/// touched: a checkpoint of tens of megabytes otherwise spends more time in
/// page faults than in copying.
pub(crate) fn filled_bytes<'py>(
    py: Python<'py>,
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> PyResult<()>,
) -> PyResult<Bound<'py, PyBytes>> {
    let size = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyMemoryError::new_err(format!("{len} bytes")))?;
    // SAFETY: the GIL is held; a null source asks CPython for a new `bytes`
    // of `size` uninitialised bytes, returned as a new reference (or null with
    // a Python error set), which `from_owned_ptr_or_err` takes ownership of.
    let object = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size),
        )?
    };
    let bytes = object.cast_into::<PyBytes>()?;
    // SAFETY: `bytes` is a live `bytes` object; its buffer holds `len` bytes
    // (plus CPython's terminating zero) and lives as long as the object.
    let start = unsafe { pyo3::ffi::PyBytes_AsString(bytes.as_ptr()) }.cast::<u8>();
    advise_huge_pages(start, len);
    // SAFETY: `start` points to `len` writable bytes that nothing else
    // references yet (the object is new and not shared); they are zeroed
    // before the slice over them is made, so every byte is initialised.
    let buffer = unsafe {
        std::ptr::write_bytes(start, 0, len);
        std::slice::from_raw_parts_mut(start, len)
    };
    fill(buffer)?;
    Ok(bytes)
}
