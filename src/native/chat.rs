//! llama.cpp's own chat templates: the model's Jinja template, or one the
//! caller gives, rendered by llama.cpp's Jinja engine
//! (`common_chat_templates_*`, through the pinned crate's `chat_shim_*` C
//! layer), or one of llama.cpp's built-in templates by name (`gemma`,
//! `llama3`, ...), rendered by `llama_chat_apply_template`. Rendering with
//! tools, and llama.cpp's parser of the replies, are in `chat_tools.rs`.

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

use llama_cpp_sys_4 as sys;
use serde::Deserialize;

use super::{Model, NativeError, NativeResult};

/// Longest rendered prompt accepted from the template engine (bytes).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// How llama.cpp's Jinja engine begins the error of a render that exceeds one
/// of its bounds on steps, text and time (patch 0010, `jinja/utils.h`).
const RENDER_BOUND_ERROR: &str = "the chat template exceeds a rendering bound";

/// One span of a rendered prompt.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct PromptPart {
    /// The text.
    pub text: String,
    /// Whether it came from a message's content (whose special-token text
    /// must be read as plain text), rather than from the template itself.
    pub is_input: bool,
}

/// Longest name of a built-in template (bytes).
const MAX_BUILTIN_NAME_BYTES: usize = 64;

/// Most built-in template names read from llama.cpp.
const MAX_BUILTIN_TEMPLATES: usize = 1024;

/// A chat template: a model's Jinja template set, owned
/// (`chat_shim_templates_init`/`_free`), or a built-in one by name.
pub struct ChatTemplates {
    kind: Kind,
    add_bos: bool,
}

enum Kind {
    Jinja(NonNull<sys::chat_shim_templates>),
    /// A name of `llama_chat_builtin_templates`.
    Builtin(CString),
}

// SAFETY: the template set is plain data built once; `apply` and `source`
// only read it, and the shim keeps its error text in thread-local storage.
// A built-in template is a name.
unsafe impl Send for ChatTemplates {}
// SAFETY: see `Send`.
unsafe impl Sync for ChatTemplates {}

/// The names of llama.cpp's built-in chat templates
/// (`llama_chat_builtin_templates`), in its order (sorted).
pub fn builtin_template_names() -> Vec<String> {
    // SAFETY: a NULL output with length 0 asks for the count only.
    let count = unsafe { sys::llama_chat_builtin_templates(std::ptr::null_mut(), 0) };
    let count = usize::try_from(count)
        .unwrap_or(0)
        .min(MAX_BUILTIN_TEMPLATES);
    let mut names = vec![std::ptr::null(); count];
    // SAFETY: `names` has `count` writable pointer slots; llama.cpp fills at
    // most that many with pointers to its static map's keys.
    unsafe { sys::llama_chat_builtin_templates(names.as_mut_ptr(), names.len()) };
    names
        .into_iter()
        .filter(|name| !name.is_null())
        .map(|name| {
            // SAFETY: each pointer is a NUL-terminated key of llama.cpp's static
            // template map, alive for the whole program; it is copied at once.
            let name = unsafe { CStr::from_ptr(name) };
            name.to_string_lossy().into_owned()
        })
        .collect()
}

/// The shim's text for the failure that just happened on this thread.
pub(super) fn last_shim_error() -> String {
    // SAFETY: the shim returns a NUL-terminated thread-local string, never NULL,
    // valid until the next shim call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(sys::llama_shim_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub(super) fn c_string(what: &str, text: &str) -> NativeResult<CString> {
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
            let reason = last_shim_error();
            NativeError::InvalidArgument(if reason.starts_with(RENDER_BOUND_ERROR) {
                reason
            } else {
                format!("the chat template does not parse (llama.cpp: {reason})")
            })
        })?;
        Ok(Self {
            kind: Kind::Jinja(raw),
            add_bos: model.add_bos(),
        })
    }

    /// llama.cpp's built-in template `name` (one of [`builtin_template_names`]).
    pub fn builtin(model: &Model, name: &str) -> NativeResult<Self> {
        if name.len() > MAX_BUILTIN_NAME_BYTES
            || !builtin_template_names().iter().any(|n| n == name)
        {
            return Err(NativeError::InvalidArgument(format!(
                "{name:?} is not one of llama.cpp's built-in chat templates"
            )));
        }
        Ok(Self {
            kind: Kind::Builtin(c_string("template name", name)?),
            add_bos: model.add_bos(),
        })
    }

    /// The name of the built-in template, if this is one.
    pub fn builtin_name(&self) -> Option<&str> {
        match &self.kind {
            Kind::Builtin(name) => name.to_str().ok(),
            Kind::Jinja(_) => None,
        }
    }

    /// The Jinja template set, or an error naming `what` for a built-in template.
    pub(super) fn jinja(&self, what: &str) -> NativeResult<NonNull<sys::chat_shim_templates>> {
        match &self.kind {
            Kind::Jinja(raw) => Ok(*raw),
            Kind::Builtin(name) => Err(NativeError::InvalidArgument(format!(
                "{what} needs a Jinja chat template, and llama.cpp's built-in {:?} is not one",
                name.to_string_lossy()
            ))),
        }
    }

    /// Whether the model adds BOS (so the template's BOS text is dropped).
    pub(super) fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The Jinja source of the template in use (a built-in template's name).
    pub fn source(&self) -> NativeResult<String> {
        let raw = match &self.kind {
            Kind::Jinja(raw) => *raw,
            Kind::Builtin(name) => return Ok(name.to_string_lossy().into_owned()),
        };
        let mut needed = 0_usize;
        // SAFETY: the handle is live; a NULL buffer asks for the size only.
        let status = unsafe {
            sys::chat_shim_templates_source(
                raw.as_ptr(),
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
                raw.as_ptr(),
                std::ptr::null(),
                buffer.as_mut_ptr().cast::<c_char>(),
                buffer.len(),
                &mut needed,
            )
        };
        check_status(status)?;
        Ok(text_at(&buffer, 0))
    }

    /// Render `messages` (role and content) with the built-in template, as
    /// `llama_chat_apply_template` renders them; `add_generation_prompt` opens
    /// the assistant's turn.
    pub fn apply_builtin(
        &self,
        messages: &[(&str, &str)],
        add_generation_prompt: bool,
    ) -> NativeResult<String> {
        let Kind::Builtin(name) = &self.kind else {
            return Err(NativeError::InvalidArgument(
                "apply_builtin needs a built-in chat template".into(),
            ));
        };
        let mut strings = Vec::with_capacity(messages.len());
        for (role, content) in messages {
            strings.push((c_string("role", role)?, c_string("message", content)?));
        }
        let chat: Vec<sys::llama_chat_message> = strings
            .iter()
            .map(|(role, content)| sys::llama_chat_message {
                role: role.as_ptr(),
                content: content.as_ptr(),
            })
            .collect();
        let mut buffer = vec![0_u8; 0];
        loop {
            let length = i32::try_from(buffer.len()).unwrap_or(i32::MAX);
            // SAFETY: `name` and every role and content pointer are
            // NUL-terminated and outlive the call; `buffer` has `length`
            // writable bytes (llama.cpp writes nothing when the length is 0,
            // which asks for the size only).
            let needed = unsafe {
                sys::llama_chat_apply_template(
                    name.as_ptr(),
                    chat.as_ptr(),
                    chat.len(),
                    add_generation_prompt,
                    buffer.as_mut_ptr().cast::<c_char>(),
                    length,
                )
            };
            let needed = usize::try_from(needed).map_err(|_| {
                NativeError::InvalidArgument(format!(
                    "llama.cpp's {:?} chat template failed",
                    name.to_string_lossy()
                ))
            })?;
            if needed > MAX_RENDERED_BYTES {
                return Err(NativeError::InvalidArgument(format!(
                    "the rendered chat prompt would be {needed} bytes (at most {MAX_RENDERED_BYTES})"
                )));
            }
            if needed <= buffer.len() {
                buffer.truncate(needed);
                return String::from_utf8(buffer).map_err(|_| {
                    NativeError::InvalidArgument("the rendered chat prompt is not UTF-8".into())
                });
            }
            buffer = vec![0_u8; needed];
        }
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
        let applied = self.apply_raw(&params)?;
        parse_parts(&applied.buffer, applied.result.prompt_parts_off)
    }

    /// The shim's two-call protocol: size, then fill. The parser the second
    /// call hands over is owned by the result (and freed with it).
    pub(super) fn apply_raw(&self, params: &sys::chat_shim_apply_params) -> NativeResult<Applied> {
        let raw = self.jinja("rendering")?;
        // SAFETY: a zeroed result is a valid value of this plain C struct.
        let mut result: sys::chat_shim_apply_result = unsafe { std::mem::zeroed() };
        let mut needed = 0_usize;
        // SAFETY: the handle, `params` and the strings it points to are live
        // for the call; a NULL buffer asks for the size only.
        let status = unsafe {
            sys::chat_shim_templates_apply(
                raw.as_ptr(),
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
                raw.as_ptr(),
                params,
                &mut result,
                buffer.as_mut_ptr().cast::<c_char>(),
                buffer.len(),
                &mut needed,
            )
        };
        // The parser is owned from here on, whatever the status.
        let parser = NonNull::new(std::mem::replace(&mut result.parser, std::ptr::null_mut()))
            .map(ChatParser::new);
        check_status(status)?;
        Ok(Applied {
            result,
            buffer,
            parser,
        })
    }
}

impl Drop for ChatTemplates {
    fn drop(&mut self) {
        if let Kind::Jinja(raw) = &self.kind {
            // SAFETY: `raw` came from `chat_shim_templates_init` and is freed once.
            unsafe { sys::chat_shim_templates_free(raw.as_ptr()) };
        }
    }
}

/// What one `chat_shim_templates_apply` produced: offsets into `buffer`, and
/// the reply parser, if the template gave one.
pub(super) struct Applied {
    pub(super) result: sys::chat_shim_apply_result,
    pub(super) buffer: Vec<u8>,
    pub(super) parser: Option<ChatParser>,
}

/// llama.cpp's parser of a template's replies (`chat_shim_parser`), owned.
pub struct ChatParser {
    raw: NonNull<sys::chat_shim_parser>,
}

// SAFETY: the parser is an arena built once and only read by
// `chat_shim_parse` (a const parse with a per-call context); it is freed once,
// by its owner.
unsafe impl Send for ChatParser {}
// SAFETY: see `Send`: concurrent parses only read the arena.
unsafe impl Sync for ChatParser {}

impl ChatParser {
    fn new(raw: NonNull<sys::chat_shim_parser>) -> Self {
        Self { raw }
    }

    pub(super) fn as_ptr(&self) -> *const sys::chat_shim_parser {
        self.raw.as_ptr()
    }
}

impl Drop for ChatParser {
    fn drop(&mut self) {
        // SAFETY: the parser was handed over by `chat_shim_templates_apply` and
        // is freed once, here.
        unsafe { sys::chat_shim_parser_free(self.raw.as_ptr()) };
    }
}

/// The prompt parts at `offset` of a packed shim buffer.
pub(super) fn parse_parts(buffer: &[u8], offset: usize) -> NativeResult<Vec<PromptPart>> {
    serde_json::from_str(&text_at(buffer, offset))
        .map_err(|e| NativeError::InvalidArgument(format!("unreadable rendered chat prompt: {e}")))
}

/// A size query must answer "buffer too small" with a bounded size.
pub(super) fn check_size_query(status: i32, needed: usize) -> NativeResult<()> {
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

pub(super) fn check_status(status: i32) -> NativeResult<()> {
    if status == sys::LLAMA_SHIM_OK {
        return Ok(());
    }
    Err(NativeError::InvalidArgument(format!(
        "the chat template failed: {}",
        last_shim_error()
    )))
}

/// The NUL-terminated text at `offset` of a packed shim buffer ("" if out of range).
pub(super) fn text_at(buffer: &[u8], offset: usize) -> String {
    let tail = buffer.get(offset..).unwrap_or_default();
    let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
    String::from_utf8_lossy(&tail[..end]).into_owned()
}
