//! llama.cpp's GBNF grammar engine (`llama_sampler_init_grammar`) as an owned
//! token filter, and its JSON-schema-to-grammar converter (the pinned
//! crate's `common_json_schema_to_grammar_c`), so that a grammar means here
//! what it means in llama.cpp.
//!
//! The engine's work is bounded by specstate's patch 0004 (parse stacks, their
//! depth, the steps of one call: llama-cpp-sys-4/README.md); a call over a
//! bound throws a C++ exception, which the guarded wrappers of
//! `grammar_guard.cpp` catch and turn into a status and a message.

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_4 as sys;

use super::chat::last_shim_error;
use super::{Model, NativeError, NativeResult};
use crate::messages::fill;

use crate::limits::MAX_GRAMMAR_BYTES;

/// What the grammar is when llama.cpp's grammar engine throws (`{detail}`:
/// the exception's message, which names the bound exceeded).
const REFUSED: &str = "is refused by llama.cpp's grammar engine ({detail})";

/// The room for an exception's message (longer ones are cut).
const MESSAGE_BYTES: usize = 512;

/// specstate's own C++ (`grammar_guard.cpp`, compiled by build.rs): llama.cpp's
/// grammar sampler calls with every C++ exception caught.
mod guarded {
    use super::sys;
    use std::ffi::c_char;

    /// The call returned normally.
    pub const OK: i32 = 0;

    extern "C" {
        /// `llama_sampler_init_grammar`; `*out` is NULL if the grammar does not parse.
        pub fn specstate_grammar_init(
            vocab: *const sys::llama_vocab,
            grammar: *const c_char,
            root: *const c_char,
            out: *mut *mut sys::llama_sampler,
            message: *mut c_char,
            message_len: usize,
        ) -> i32;
        /// `llama_sampler_apply`.
        pub fn specstate_grammar_apply(
            sampler: *mut sys::llama_sampler,
            array: *mut sys::llama_token_data_array,
            message: *mut c_char,
            message_len: usize,
        ) -> i32;
        /// `llama_sampler_reset`; the sampler keeps its state if it throws.
        pub fn specstate_grammar_reset(
            sampler: *mut sys::llama_sampler,
            message: *mut c_char,
            message_len: usize,
        ) -> i32;
        /// `llama_sampler_clone`; NULL if it throws (out of memory).
        pub fn specstate_grammar_clone(
            sampler: *const sys::llama_sampler,
        ) -> *mut sys::llama_sampler;
    }
}

/// Run a guarded call, which writes an exception's message into the buffer it
/// is given; the message, marked as a refusal, if it threw.
fn guard(call: impl FnOnce(*mut c_char, usize) -> i32) -> Result<(), String> {
    let mut message = [0_u8; MESSAGE_BYTES];
    if call(message.as_mut_ptr().cast::<c_char>(), message.len()) == guarded::OK {
        return Ok(());
    }
    let detail = CStr::from_bytes_until_nul(&message)
        .map_or_else(|_| "no message".into(), |text| text.to_string_lossy());
    Err(fill(REFUSED, &[("detail", &detail)]))
}

/// The start symbol of every grammar (as llama.cpp's tools and llama-cpp-python).
const ROOT: &std::ffi::CStr = c"root";

/// A parsed grammar and where it stands: the tokens it allows next.
///
/// Holds the model, whose vocabulary the native grammar reads.
pub struct Grammar {
    raw: NonNull<sys::llama_sampler>,
    model: Arc<Model>,
}

// SAFETY: the grammar sampler is plain data (rules, stacks, a pointer to the
// model's vocabulary, which the `Arc` keeps alive and only read); it has no
// thread affinity, and `&self` methods only read it.
unsafe impl Send for Grammar {}
// SAFETY: see `Send`: shared access only reads.
unsafe impl Sync for Grammar {}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// Parse `gbnf` (start symbol `root`) for `model`'s vocabulary; the
    /// error says why it cannot be used, such as initial parse stacks over the
    /// engine's bounds (its length is the caller's to check).
    pub fn new(model: &Arc<Model>, gbnf: &str) -> Result<Self, String> {
        let text = CString::new(gbnf).map_err(|_| "contains a NUL character".to_string())?;
        let mut raw = std::ptr::null_mut();
        guard(|message, len| {
            // SAFETY: the vocabulary belongs to the live model (kept by the Arc);
            // both strings are NUL-terminated and outlive the call, which copies
            // what it keeps; parse errors return NULL (llama.cpp catches them),
            // other exceptions are caught by the wrapper, which writes at most
            // `len` bytes of their message at `message`.
            unsafe {
                guarded::specstate_grammar_init(
                    model.vocab(),
                    text.as_ptr(),
                    ROOT.as_ptr(),
                    &mut raw,
                    message,
                    len,
                )
            }
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| {
            "does not parse as GBNF with a 'root' rule, or is left-recursive \
             (llama.cpp prints where on standard error)"
                .to_string()
        })?;
        Ok(Self {
            raw,
            model: Arc::clone(model),
        })
    }

    /// The size of the vocabulary the grammar reads.
    pub fn n_vocab(&self) -> usize {
        self.model.n_vocab()
    }

    /// Whether the grammar allows `token` next (an id of the vocabulary); an
    /// error if checking it exceeds the engine's bounds.
    pub fn allows(&self, token: i32) -> NativeResult<bool> {
        if self.model.check_tokens(&[token]).is_err() {
            return Ok(false);
        }
        let mut one = [sys::llama_token_data {
            id: token,
            logit: 0.0,
            p: 0.0,
        }];
        self.apply(&mut one)?;
        Ok(one[0].logit.is_finite())
    }

    /// Which of `tokens` the grammar allows next, in their order (an id
    /// outside the vocabulary is not allowed); an error if checking them
    /// exceeds the engine's bounds. One pass of the engine over the candidates,
    /// so the cost follows their number, not the vocabulary's.
    pub fn allowed_among(&self, tokens: &[i32]) -> NativeResult<Vec<bool>> {
        let n_vocab = self.model.n_vocab();
        let known = |id: i32| usize::try_from(id).is_ok_and(|id| id < n_vocab);
        let mut data: Vec<sys::llama_token_data> = tokens
            .iter()
            .filter(|&&id| known(id))
            .map(|&id| sys::llama_token_data {
                id,
                logit: 0.0,
                p: 0.0,
            })
            .collect();
        self.apply(&mut data)?;
        let mut verdicts = data.iter().map(|entry| entry.logit.is_finite());
        Ok(tokens
            .iter()
            .map(|&id| known(id) && verdicts.next().unwrap_or(false))
            .collect())
    }

    /// Set to minus infinity every logit of a token the grammar forbids next
    /// (`logits` holds one entry per token of the vocabulary); an error, with
    /// `logits` unchanged, if checking them exceeds the engine's bounds.
    pub fn mask(&self, logits: &mut [f32]) -> NativeResult<()> {
        let n = logits.len().min(self.model.n_vocab());
        let mut data: Vec<sys::llama_token_data> = (0..n)
            .map(|id| sys::llama_token_data {
                id: id as i32,
                logit: logits[id],
                p: 0.0,
            })
            .collect();
        self.apply(&mut data)?;
        for (logit, entry) in logits.iter_mut().zip(&data) {
            *logit = entry.logit;
        }
        Ok(())
    }

    fn apply(&self, data: &mut [sys::llama_token_data]) -> NativeResult<()> {
        let mut array = sys::llama_token_data_array {
            data: data.as_mut_ptr(),
            size: data.len(),
            selected: -1,
            sorted: false,
        };
        guard(|message, len| {
            // SAFETY: the sampler is live; `array` points at `data.len()` entries
            // whose ids are in the vocabulary (callers check or build them so), the
            // grammar's apply only lowers logits and reads its own state; the
            // wrapper catches its exceptions and writes at most `len` bytes at
            // `message`.
            unsafe { guarded::specstate_grammar_apply(self.raw.as_ptr(), &mut array, message, len) }
        })
        .map_err(|reason| grammar_error(&reason))
    }

    /// Advance past `token`, which the grammar must allow (checked: llama.cpp
    /// aborts on an end-of-generation token the grammar does not allow).
    pub fn accept(&mut self, token: i32) -> NativeResult<()> {
        if self.try_accept(token)? {
            return Ok(());
        }
        Err(grammar_error(&format!("does not allow token {token} here")))
    }

    /// Advance past `token` if the grammar allows it (`Ok(false)`: it does
    /// not, and nothing changed); an error if llama.cpp refuses the step.
    pub fn try_accept(&mut self, token: i32) -> NativeResult<bool> {
        if !self.allows(token)? {
            return Ok(false);
        }
        // SAFETY: the sampler is live and the token allowed; the shim turns a
        // C++ exception into a status.
        let status = unsafe { sys::common_shim_sampler_accept_raw(self.raw.as_ptr(), token) };
        if status != sys::LLAMA_SHIM_OK {
            return Err(grammar_error(&format!(
                "could not accept token {token} ({})",
                last_shim_error()
            )));
        }
        Ok(true)
    }

    /// Back to the start of the grammar, before any token (an error, the
    /// state unchanged, if llama.cpp refuses to build it again).
    pub fn restart(&mut self) -> NativeResult<()> {
        guard(|message, len| {
            // SAFETY: the sampler is live; reset rebuilds its initial stacks
            // (keeping its state if that throws); the wrapper catches
            // exceptions and writes at most `len` bytes at `message`.
            unsafe { guarded::specstate_grammar_reset(self.raw.as_ptr(), message, len) }
        })
        .map_err(|reason| grammar_error(&reason))
    }
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        // SAFETY: the sampler is live; clone copies rules and stacks (the
        // wrapper returns NULL if that throws).
        let raw = unsafe { guarded::specstate_grammar_clone(self.raw.as_ptr()) };
        Self {
            raw: NonNull::new(raw).expect("llama_sampler_clone returned NULL (out of memory)"),
            model: Arc::clone(&self.model),
        }
    }
}

impl Drop for Grammar {
    fn drop(&mut self) {
        // SAFETY: the sampler is owned here and freed once.
        unsafe { sys::llama_sampler_free(self.raw.as_ptr()) };
    }
}

fn grammar_error(reason: &str) -> NativeError {
    NativeError::InvalidArgument(format!("the grammar {reason}"))
}

/// The GBNF grammar of the JSON values that `schema_json` (a JSON Schema, as
/// JSON text) describes: llama.cpp's `json_schema_to_grammar`.
pub fn json_schema_to_grammar(schema_json: &str) -> NativeResult<String> {
    if schema_json.len() > MAX_GRAMMAR_BYTES {
        return Err(NativeError::InvalidArgument(format!(
            "the JSON schema is {} bytes, more than {MAX_GRAMMAR_BYTES}",
            schema_json.len()
        )));
    }
    let schema = CString::new(schema_json).map_err(|_| {
        NativeError::InvalidArgument("the JSON schema contains a NUL character".into())
    })?;
    let mut needed = 0_usize;
    // SAFETY: NUL-terminated input; a NULL buffer asks for the size only; the
    // shim catches every C++ exception.
    let status = unsafe {
        sys::common_json_schema_to_grammar_c(
            schema.as_ptr(),
            false,
            std::ptr::null_mut(),
            0,
            &mut needed,
        )
    };
    check_schema_status(status)?;
    if needed == 0 || needed > MAX_GRAMMAR_BYTES {
        return Err(NativeError::InvalidArgument(format!(
            "the JSON schema's grammar would be {needed} bytes (at most {MAX_GRAMMAR_BYTES})"
        )));
    }
    let mut buffer = vec![0_u8; needed];
    // SAFETY: `buffer` has `needed` writable bytes, the size just reported.
    let status = unsafe {
        sys::common_json_schema_to_grammar_c(
            schema.as_ptr(),
            false,
            buffer.as_mut_ptr().cast::<c_char>(),
            buffer.len(),
            &mut needed,
        )
    };
    check_schema_status(status)?;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    buffer.truncate(end);
    String::from_utf8(buffer)
        .map_err(|_| NativeError::InvalidArgument("the schema's grammar is not UTF-8".into()))
}

fn check_schema_status(status: i32) -> NativeResult<()> {
    if status == sys::LLAMA_SHIM_OK || status == sys::LLAMA_SHIM_BUFFER_TOO_SMALL {
        return Ok(());
    }
    Err(NativeError::InvalidArgument(format!(
        "the JSON schema cannot be converted to a grammar: {}",
        last_shim_error()
    )))
}
