//! A Jinja chat template rendered with tools (`common_chat_templates_apply`
//! with OpenAI-shaped `tools`, through the crate's `chat_shim_templates_apply`),
//! and llama.cpp's parser of the replies (`chat_shim_parse`): what llama.cpp's
//! server uses for tool calling.

use std::ffi::c_char;

use llama_cpp_sys_4 as sys;
use serde::Deserialize;

use super::chat::{
    c_string, check_size_query, check_status, parse_parts, text_at, ChatParser, ChatTemplates,
};
use super::{NativeError, NativeResult, PromptPart};

/// Longest parsed reply accepted from the parser (bytes of JSON).
const MAX_PARSED_BYTES: usize = 64 << 20;

/// OpenAI's `tool_choice` as llama.cpp knows it (`common_chat_tool_choice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call a tool.
    Required,
    /// No tool calls.
    None,
}

impl ToolChoice {
    fn raw(self) -> i32 {
        let raw = match self {
            Self::Auto => sys::CHAT_SHIM_TOOL_CHOICE_AUTO,
            Self::Required => sys::CHAT_SHIM_TOOL_CHOICE_REQUIRED,
            Self::None => sys::CHAT_SHIM_TOOL_CHOICE_NONE,
        };
        i32::try_from(raw).unwrap_or(0)
    }
}

/// What to render: OpenAI-shaped messages and tools, as JSON text.
#[derive(Clone, Copy, Debug)]
pub struct ToolRequest<'a> {
    /// A JSON array of messages (`tool_calls`, `tool_call_id`, `name` included).
    pub messages_json: &'a str,
    /// A JSON array of `{"type": "function", "function": {...}}`, or None.
    pub tools_json: Option<&'a str>,
    /// Whether (and which) tool calls the reply may hold.
    pub tool_choice: ToolChoice,
    /// Whether the reply may hold several calls.
    pub parallel_tool_calls: bool,
    /// Open the assistant's turn.
    pub add_generation_prompt: bool,
}

/// One trigger of a lazy grammar (llama.cpp's `common_grammar_trigger`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct GrammarTrigger {
    /// `token`, `word`, `pattern` or `pattern_full`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The word or pattern.
    pub value: String,
    /// The token (for `token` triggers; -1 otherwise).
    pub token: i64,
}

/// A conversation rendered with tools, and how to read the reply.
pub struct ToolRender {
    /// The prompt, as parts (template text and message text).
    pub parts: Vec<PromptPart>,
    /// llama.cpp's chat format (`common_chat_format`).
    pub format: i32,
    /// Its name (`common_chat_format_name`).
    pub format_name: String,
    /// llama.cpp's grammar for the reply ("" for none).
    pub grammar: String,
    /// Whether the grammar applies only from a trigger on.
    pub grammar_lazy: bool,
    /// The lazy grammar's triggers.
    pub grammar_triggers: Vec<GrammarTrigger>,
    /// Texts to keep as single tokens.
    pub preserved_tokens: Vec<String>,
    /// More stop strings.
    pub additional_stops: Vec<String>,
    /// What the parser must see before the reply.
    pub generation_prompt: String,
    parser: Option<ChatParser>,
}

impl ChatTemplates {
    /// Render `request` with this (Jinja) template, as llama.cpp's server does.
    pub fn apply_tools(&self, request: &ToolRequest<'_>) -> NativeResult<ToolRender> {
        let messages = c_string("messages", request.messages_json)?;
        let tools = request
            .tools_json
            .map(|tools| c_string("tools", tools))
            .transpose()?;
        let params = sys::chat_shim_apply_params {
            messages_json: messages.as_ptr(),
            tools_json: tools.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            grammar: std::ptr::null(),
            json_schema: std::ptr::null(),
            template_kwargs_json: std::ptr::null(),
            tool_choice: request.tool_choice.raw(),
            reasoning_format: 0,
            add_generation_prompt: request.add_generation_prompt,
            enable_thinking: true,
            parallel_tool_calls: request.parallel_tool_calls,
            use_jinja: true,
            add_bos: self.add_bos(),
            add_eos: false,
            force_pure_content: false,
        };
        let applied = self.apply_raw(&params)?;
        let (result, buffer) = (&applied.result, &applied.buffer);
        Ok(ToolRender {
            parts: parse_parts(buffer, result.prompt_parts_off)?,
            format: result.format,
            format_name: format_name(result.format)?,
            grammar: text_at(buffer, result.grammar_off),
            grammar_lazy: result.grammar_lazy,
            grammar_triggers: json_at(buffer, result.grammar_triggers_off)?,
            preserved_tokens: json_at(buffer, result.preserved_tokens_off)?,
            additional_stops: json_at(buffer, result.additional_stops_off)?,
            generation_prompt: text_at(buffer, result.generation_prompt_off),
            parser: applied.parser,
        })
    }
}

impl ToolRender {
    /// llama.cpp's reading of `text`, a reply to this prompt: an OpenAI-shaped
    /// JSON message (`role`, `content`, `reasoning_content`, `tool_calls`).
    /// `partial`: the reply is still arriving (a cut tail is tolerated).
    pub fn parse(&self, text: &str, partial: bool) -> NativeResult<String> {
        let text = c_string("reply", text)?;
        let generation_prompt = c_string("generation prompt", &self.generation_prompt)?;
        let params = sys::chat_shim_parse_params {
            text: text.as_ptr(),
            parser: self
                .parser
                .as_ref()
                .map_or(std::ptr::null(), ChatParser::as_ptr),
            generation_prompt: generation_prompt.as_ptr(),
            format: self.format,
            is_partial: partial,
        };
        let mut needed = 0_usize;
        // SAFETY: `params`, the strings and the parser it points to are live for
        // the call (the parser is borrowed, not consumed); a NULL buffer asks
        // for the size only.
        let status = unsafe { sys::chat_shim_parse(&params, std::ptr::null_mut(), 0, &mut needed) };
        check_parse_size(status, needed)?;
        let mut buffer = vec![0_u8; needed];
        // SAFETY: as above, with `buffer` holding `needed` writable bytes.
        let status = unsafe {
            sys::chat_shim_parse(
                &params,
                buffer.as_mut_ptr().cast::<c_char>(),
                buffer.len(),
                &mut needed,
            )
        };
        check_status(status)
            .map_err(|e| NativeError::InvalidArgument(format!("the reply does not parse: {e}")))?;
        Ok(text_at(&buffer, 0))
    }
}

fn check_parse_size(status: i32, needed: usize) -> NativeResult<()> {
    if needed > MAX_PARSED_BYTES {
        return Err(NativeError::InvalidArgument(format!(
            "the parsed reply would be {needed} bytes (at most {MAX_PARSED_BYTES})"
        )));
    }
    check_size_query(status, needed)
        .map_err(|e| NativeError::InvalidArgument(format!("the reply does not parse: {e}")))
}

/// The name llama.cpp gives chat format `format`.
pub fn format_name(format: i32) -> NativeResult<String> {
    let mut needed = 0_usize;
    // SAFETY: a NULL buffer asks for the size only.
    let status =
        unsafe { sys::chat_shim_format_name(format, std::ptr::null_mut(), 0, &mut needed) };
    check_size_query(status, needed)?;
    let mut buffer = vec![0_u8; needed];
    // SAFETY: `buffer` has `needed` writable bytes.
    let status = unsafe {
        sys::chat_shim_format_name(
            format,
            buffer.as_mut_ptr().cast::<c_char>(),
            buffer.len(),
            &mut needed,
        )
    };
    check_status(status)?;
    Ok(text_at(&buffer, 0))
}

/// The JSON value at `offset` of a packed shim buffer.
fn json_at<T: for<'de> Deserialize<'de>>(buffer: &[u8], offset: usize) -> NativeResult<T> {
    serde_json::from_str(&text_at(buffer, offset))
        .map_err(|e| NativeError::InvalidArgument(format!("unreadable rendered chat prompt: {e}")))
}
