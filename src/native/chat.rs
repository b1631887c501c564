//! llama.cpp's own chat templates (`common_chat_templates_*`, through the
//! pinned crate's `chat_shim_*` C layer): the model's Jinja template, or one
//! the caller gives, rendered by llama.cpp's Jinja engine.

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

use llama_cpp_sys_4 as sys;
use serde::Deserialize;

use super::{Model, NativeError, NativeResult};

/// Longest rendered prompt accepted from the template engine (bytes).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// One span of a rendered prompt.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct PromptPart {
    /// The text.
    pub text: String,
    /// Whether it came from a message's content (whose special-token text
    /// must be read as plain text), rather than from the template itself.
    pub is_input: bool,
}

/// A model's chat template set, owned (`chat_shim_templates_init`/`_free`).
pub struct ChatTemplates {
    raw: NonNull<sys::chat_shim_templates>,
    add_bos: bool,
}

// SAFETY: the template set is plain data built once; `apply` and `source`
// only read it, and the shim keeps its error text in thread-local storage.
unsafe impl Send for ChatTemplates {}
// SAFETY: see `Send`.
unsafe impl Sync for ChatTemplates {}

/// The shim's text for the failure that just happened on this thread.
pub(super) fn last_shim_error() -> String {
    // SAFETY: the shim returns a NUL-terminated thread-local string, never NULL,
    // valid until the next shim call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(sys::llama_shim_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn c_string(what: &str, text: &str) -> NativeResult<CString> {
    CString::new(text)
        .map_err(|_| NativeError::InvalidArgument(format!("the {what} contains a NUL character")))
}

impl ChatTemplates {
    /// The model's templates, or `source` (Jinja) in place of the model's.
    /// A model without a template gets llama.cpp's ChatML default.
    pub fn new(model: &Model, source: Option<&str>) -> NativeResult<Self> {
        let source = source.map(|s| c_string("chat template", s)).transpose()?;
        let source_ptr = source.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: the model is live; `source_ptr` is NULL or NUL-terminated and
        // outlives the call; the shim catches every C++ exception.
        let raw = unsafe { sys::chat_shim_templates_init(model.raw(), source_ptr) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            NativeError::InvalidArgument(format!(
                "the chat template does not parse (llama.cpp: {})",
                last_shim_error()
            ))
        })?;
        Ok(Self {
            raw,
            add_bos: model.add_bos(),
        })
    }

    /// The Jinja source of the template in use.
    pub fn source(&self) -> NativeResult<String> {
        let mut needed = 0_usize;
        // SAFETY: the handle is live; a NULL buffer asks for the size only.
        let status = unsafe {
            sys::chat_shim_templates_source(
                self.raw.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
                &mut needed,
            )
        };
        check_size_query(status, needed)?;
        let mut buffer = vec![0_u8; needed];
        // SAFETY: `buffer` has `needed` writable bytes, the size just reported.
        let status = unsafe {
            sys::chat_shim_templates_source(
                self.raw.as_ptr(),
                std::ptr::null(),
                buffer.as_mut_ptr().cast::<c_char>(),
                buffer.len(),
                &mut needed,
            )
        };
        check_status(status)?;
        Ok(text_at(&buffer, 0))
    }

    /// Render `messages_json` (an OpenAI-shaped JSON array of messages) into
    /// prompt parts; `add_generation_prompt` opens the assistant's turn.
    pub fn apply(
        &self,
        messages_json: &str,
        add_generation_prompt: bool,
    ) -> NativeResult<Vec<PromptPart>> {
        let messages = c_string("messages", messages_json)?;
        let params = sys::chat_shim_apply_params {
            messages_json: messages.as_ptr(),
            tools_json: std::ptr::null(),
            grammar: std::ptr::null(),
            json_schema: std::ptr::null(),
            template_kwargs_json: std::ptr::null(),
            tool_choice: 0,
            reasoning_format: 0,
            add_generation_prompt,
            enable_thinking: true,
            parallel_tool_calls: false,
            use_jinja: true,
            add_bos: self.add_bos,
            add_eos: false,
            force_pure_content: false,
        };
        let (result, buffer) = self.apply_raw(&params)?;
        let parts = text_at(&buffer, result.prompt_parts_off);
        serde_json::from_str(&parts).map_err(|e| {
            NativeError::InvalidArgument(format!("unreadable rendered chat prompt: {e}"))
        })
    }

    /// The shim's two-call protocol: size, then fill. The parser the second
    /// call hands over is released at once (specstate does not parse replies).
    fn apply_raw(
        &self,
        params: &sys::chat_shim_apply_params,
    ) -> NativeResult<(sys::chat_shim_apply_result, Vec<u8>)> {
        // SAFETY: a zeroed result is a valid value of this plain C struct.
        let mut result: sys::chat_shim_apply_result = unsafe { std::mem::zeroed() };
        let mut needed = 0_usize;
        // SAFETY: the handle, `params` and the strings it points to are live
        // for the call; a NULL buffer asks for the size only.
        let status = unsafe {
            sys::chat_shim_templates_apply(
                self.raw.as_ptr(),
                params,
                &mut result,
                std::ptr::null_mut(),
                0,
                &mut needed,
            )
        };
        check_size_query(status, needed)?;
        let mut buffer = vec![0_u8; needed];
        // SAFETY: as above, with `buffer` holding `needed` writable bytes.
        let status = unsafe {
            sys::chat_shim_templates_apply(
                self.raw.as_ptr(),
                params,
                &mut result,
                buffer.as_mut_ptr().cast::<c_char>(),
                buffer.len(),
                &mut needed,
            )
        };
        if !result.parser.is_null() {
            // SAFETY: the parser was handed to us by this call and is freed once.
            unsafe { sys::chat_shim_parser_free(result.parser) };
            result.parser = std::ptr::null_mut();
        }
        check_status(status)?;
        Ok((result, buffer))
    }
}

impl Drop for ChatTemplates {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `chat_shim_templates_init` and is freed once.
        unsafe { sys::chat_shim_templates_free(self.raw.as_ptr()) };
    }
}

/// A size query must answer "buffer too small" with a bounded size.
fn check_size_query(status: i32, needed: usize) -> NativeResult<()> {
    if status != sys::LLAMA_SHIM_BUFFER_TOO_SMALL && status != sys::LLAMA_SHIM_OK {
        return check_status(status);
    }
    if needed == 0 || needed > MAX_RENDERED_BYTES {
        return Err(NativeError::InvalidArgument(format!(
            "the rendered chat prompt would be {needed} bytes (at most {MAX_RENDERED_BYTES})"
        )));
    }
    Ok(())
}

fn check_status(status: i32) -> NativeResult<()> {
    if status == sys::LLAMA_SHIM_OK {
        return Ok(());
    }
    Err(NativeError::InvalidArgument(format!(
        "the chat template failed: {}",
        last_shim_error()
    )))
}

/// The NUL-terminated text at `offset` of a packed shim buffer ("" if out of range).
fn text_at(buffer: &[u8], offset: usize) -> String {
    let tail = buffer.get(offset..).unwrap_or_default();
    let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
    String::from_utf8_lossy(&tail[..end]).into_owned()
}
