//! Process-wide llama.cpp initialisation.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

use llama_cpp_sys_4 as sys;

static BACKEND: Once = Once::new();

/// Whether llama.cpp's own log lines are shown (`SPECSTATE_LLAMA_LOG=1`).
fn llama_log_enabled() -> bool {
    std::env::var_os("SPECSTATE_LLAMA_LOG").is_some_and(|value| value != "0" && !value.is_empty())
}

unsafe extern "C" fn forward_log(
    _level: sys::ggml_log_level,
    text: *const c_char,
    _user: *mut c_void,
) {
    if text.is_null() || !llama_log_enabled() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string that lives for the call.
    let text = unsafe { CStr::from_ptr(text) };
    eprint!("{}", text.to_string_lossy());
}

/// Initialise llama.cpp's backends once per process (idempotent, thread-safe).
///
/// llama.cpp's log goes to standard error only when `SPECSTATE_LLAMA_LOG` is set.
pub fn ensure_backend() {
    BACKEND.call_once(|| {
        // SAFETY: both calls are process-global initialisers that llama.cpp
        // documents as "call once at start"; `Once` guarantees that, and the
        // callback is a `'static` function that only reads its arguments.
        unsafe {
            sys::llama_log_set(Some(forward_log), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}
