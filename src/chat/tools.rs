//! The next turn of a conversation with tools: OpenAI-shaped messages (assistant
//! `tool_calls`, `tool` results) and tools rendered by a Jinja template as
//! llama.cpp's server renders them, with the reply's place marked, as
//! [`super::next_turn_tokens`] does for plain messages.

use serde_json::Value;

use super::{turn_tokens, ChatError, Result, REPLY_SENTINEL};
use crate::native::{ChatTemplates, Model, ToolChoice, ToolRequest};

/// The tools a conversation is rendered with.
#[derive(Clone, Copy, Debug)]
pub struct ToolTurn<'a> {
    /// A JSON array of OpenAI tools, or None.
    pub tools_json: Option<&'a str>,
    /// Whether (and which) tool calls the next reply may hold.
    pub tool_choice: ToolChoice,
    /// Whether it may hold several.
    pub parallel_tool_calls: bool,
}

/// The JSON array of messages `json` (`what` names it in errors).
fn messages(json: &str, what: &str) -> Result<Vec<Value>> {
    let value: Value = serde_json::from_str(json)
        .map_err(|e| ChatError::Messages(format!("{what}: not JSON: {e}")))?;
    let Value::Array(messages) = value else {
        return Err(ChatError::Messages(format!(
            "{what}: not a JSON array of messages"
        )));
    };
    if messages.iter().any(holds_sentinel) {
        return Err(ChatError::Messages(format!(
            "{what}: a message contains specstate's reply marker"
        )));
    }
    Ok(messages)
}

/// Whether any text in `value` holds the reply marker.
fn holds_sentinel(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains(REPLY_SENTINEL),
        Value::Array(items) => items.iter().any(holds_sentinel),
        Value::Object(fields) => fields.values().any(holds_sentinel),
        _ => false,
    }
}

/// The tokens of a next turn of a conversation with tools, to decode after a
/// reply ending with `last_token`: `before_json` holds the messages that led
/// to the reply, `new_json` the next turn's (tool results, a user message).
/// The reply stays as the model wrote it (its text, tool calls included).
pub fn tool_next_turn_tokens(
    model: &Model,
    templates: &ChatTemplates,
    before_json: &str,
    last_token: i32,
    new_json: &str,
    tools: ToolTurn<'_>,
) -> Result<Vec<i32>> {
    let mut all = messages(before_json, "before")?;
    let new = messages(new_json, "new")?;
    if all.is_empty() || new.is_empty() {
        return Err(ChatError::Messages(
            "a next turn needs the messages before the reply and at least one new message".into(),
        ));
    }
    all.push(serde_json::json!({"role": "assistant", "content": REPLY_SENTINEL}));
    all.extend(new);
    let json = Value::Array(all).to_string();
    let request = ToolRequest {
        messages_json: &json,
        tools_json: tools.tools_json,
        tool_choice: tools.tool_choice,
        parallel_tool_calls: tools.parallel_tool_calls,
        add_generation_prompt: true,
    };
    let render = templates
        .apply_tools(&request)
        .map_err(|e| ChatError::Template(e.to_string()))?;
    turn_tokens(model, render.parts, last_token)
}
