//! Conversations: a chat is a generation that pauses for the user.
//!
//! The first turn's prompt is the conversation rendered by the chat template
//! with the assistant's turn opened. A next turn does not re-read the
//! conversation: what the template puts after the assistant's reply (the
//! end of its turn, the new messages, the opening of the next reply) is
//! decoded after the tokens the generation already holds
//! ([`next_turn_tokens`]). Text from the template is tokenized with special
//! tokens parsed; text from messages is read literally, so a message cannot
//! forge a role.
//!
//! A [`Conversation`] (the messages that led to the current reply, and the
//! template's fingerprint) travels in checkpoints, so a restored generation
//! can take its next turn in another process.

use serde::{Deserialize, Serialize};

use crate::native::{ChatTemplates, Model, NativeError, PromptPart};

mod named;
#[cfg(test)]
mod named_tests;
mod tools;

pub use tools::{tool_next_turn_tokens, ToolTurn};

/// Longest role name accepted.
pub const MAX_ROLE_BYTES: usize = 64;

/// Stands for the assistant's reply while the next turn is rendered.
const REPLY_SENTINEL: &str = "\u{1}specstate:reply\u{1}";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// `system`, `user`, `assistant`, ... (as the template knows them).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The messages that led to a generation's current reply, and the template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conversation {
    /// Every message before the current reply, in order.
    pub messages: Vec<Message>,
    /// SHA-256 (hex) of the chat template's source.
    pub template_sha256: String,
}

/// Failures of chat rendering and conversation checks.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// Messages that cannot be rendered (or a conversation that is malformed).
    #[error("{0}")]
    Messages(String),
    /// The template failed, or cannot continue a conversation.
    #[error("{0}")]
    Template(String),
    /// Tokenization failed.
    #[error(transparent)]
    Native(#[from] NativeError),
}

type Result<T> = std::result::Result<T, ChatError>;

/// Check messages: at least one, each role a short non-empty name.
pub fn check_messages(messages: &[Message]) -> Result<()> {
    if messages.is_empty() {
        return Err(ChatError::Messages("no messages".into()));
    }
    for (index, message) in messages.iter().enumerate() {
        let role = &message.role;
        if role.is_empty() || role.len() > MAX_ROLE_BYTES || role.chars().any(char::is_control) {
            return Err(ChatError::Messages(format!(
                "message {index}: the role must be 1 to {MAX_ROLE_BYTES} bytes without control characters"
            )));
        }
        if message.content.contains(REPLY_SENTINEL) {
            return Err(ChatError::Messages(format!(
                "message {index} contains specstate's reply marker"
            )));
        }
    }
    Ok(())
}

impl Conversation {
    /// Check a conversation read from a checkpoint (or given by a caller).
    pub fn validate(&self) -> Result<()> {
        check_messages(&self.messages)?;
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if self.template_sha256.len() != 64 || !self.template_sha256.chars().all(hex) {
            return Err(ChatError::Messages(
                "template_sha256 must be 64 lowercase hex digits".into(),
            ));
        }
        Ok(())
    }
}

fn render(
    templates: &ChatTemplates,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<Vec<PromptPart>> {
    if templates.builtin_name().is_some() {
        return named::render(templates, messages, add_generation_prompt);
    }
    let json = serde_json::to_string(messages).map_err(|e| ChatError::Messages(e.to_string()))?;
    templates
        .apply(&json, add_generation_prompt)
        .map_err(|e| ChatError::Template(e.to_string()))
}

/// The conversation as text, as the template renders it.
pub fn render_text(
    templates: &ChatTemplates,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<String> {
    check_messages(messages)?;
    Ok(render(templates, messages, add_generation_prompt)?
        .into_iter()
        .map(|part| part.text)
        .collect())
}

/// Tokens of rendered parts: the whole text tokenized at once, with special
/// tokens parsed, as llama.cpp's server reads a rendered prompt (so merges
/// across a part's edge are kept: `"  hi"` is not split where the message
/// begins) -- unless a special token would come from message text, which
/// would let a message forge a role: then template text is tokenized with
/// special tokens parsed and message text literally, part by part.
fn tokenize_parts(model: &Model, parts: &[PromptPart]) -> Result<Vec<i32>> {
    let whole: String = parts.iter().map(|part| part.text.as_str()).collect();
    let tokens = model.tokenize(&whole, false, true)?;
    if specials_only_in_template(model, parts, &tokens)? {
        return Ok(tokens);
    }
    let mut tokens = Vec::new();
    for part in parts.iter().filter(|part| !part.text.is_empty()) {
        tokens.extend(model.tokenize(&part.text, false, !part.is_input)?);
    }
    Ok(tokens)
}

/// Whether `tokens` spell the parts' text exactly and every special token
/// among them lies within template text.
fn specials_only_in_template(model: &Model, parts: &[PromptPart], tokens: &[i32]) -> Result<bool> {
    let mut input = Vec::new(); // for each byte of the text: whether a message wrote it
    let mut text = Vec::new();
    for part in parts {
        input.extend(std::iter::repeat_n(part.is_input, part.text.len()));
        text.extend_from_slice(part.text.as_bytes());
    }
    let mut at = 0;
    for &token in tokens {
        let piece = model.token_to_piece(token, true)?;
        let end = at + piece.len();
        if end > text.len() || text[at..end] != piece[..] {
            return Ok(false);
        }
        let special = model.token_to_piece(token, false)? != piece;
        if special && input[at..end].iter().any(|&from_message| from_message) {
            return Ok(false);
        }
        at = end;
    }
    Ok(at == input.len())
}

/// The tokens of a rendered prompt (a conversation rendered with tools, say),
/// BOS first if the model adds one: template text with special tokens
/// parsed, message text literally (see `tokenize_parts`).
pub fn parts_tokens(model: &Model, parts: &[PromptPart]) -> Result<Vec<i32>> {
    let mut tokens = Vec::new();
    if model.add_bos() {
        tokens.push(model.bos());
    }
    tokens.extend(tokenize_parts(model, parts)?);
    Ok(tokens)
}

/// The first turn's prompt: the conversation rendered with the assistant's
/// turn opened, BOS first if the model adds one.
pub fn prompt_tokens(
    model: &Model,
    templates: &ChatTemplates,
    messages: &[Message],
) -> Result<Vec<i32>> {
    check_messages(messages)?;
    parts_tokens(model, &render(templates, messages, true)?)
}

/// The tokens of a next turn, to decode after a reply.
///
/// `before` are the messages that led to the reply, `reply` its text,
/// `last_token` the last token the generation holds, and `new` the messages
/// of the next turn. The template renders the whole conversation, with the
/// reply's place marked; what follows the mark is the next turn (the end of
/// the reply's turn, the new messages, the next reply's opening). When the
/// reply ended with an end-of-generation token that the template also
/// writes there (ChatML's `<|im_end|>`), it is not written twice.
pub fn next_turn_tokens(
    model: &Model,
    templates: &ChatTemplates,
    before: &[Message],
    last_token: i32,
    new: &[Message],
) -> Result<Vec<i32>> {
    check_messages(before)?;
    check_messages(new)?;
    let mut messages = before.to_vec();
    messages.push(Message::new("assistant", REPLY_SENTINEL));
    messages.extend_from_slice(new);
    turn_tokens(model, render(templates, &messages, true)?, last_token)
}

/// The tokens after the reply's mark in `parts` (a conversation rendered with
/// the reply marked): the end of the reply's turn, without the
/// end-of-generation token the reply already holds, then the next turn.
fn turn_tokens(model: &Model, parts: Vec<PromptPart>, last_token: i32) -> Result<Vec<i32>> {
    let mut tail = after_reply(parts)?;
    if model.is_eog(last_token) {
        let piece = model.token_to_piece(last_token, true)?;
        let piece = String::from_utf8_lossy(&piece);
        if let Some(first) = tail.first_mut().filter(|part| !part.is_input) {
            if let Some(rest) = first.text.strip_prefix(piece.as_ref()) {
                first.text = rest.to_owned();
            }
        }
    }
    let tokens = tokenize_parts(model, &tail)?;
    if tokens.is_empty() {
        return Err(ChatError::Template(
            "the next turn renders to no tokens".into(),
        ));
    }
    Ok(tokens)
}

/// The parts after the reply's mark (non-empty ones), or an error if the
/// template does not write the reply where it can be found.
fn after_reply(parts: Vec<PromptPart>) -> Result<Vec<PromptPart>> {
    let found = parts
        .iter()
        .enumerate()
        .find_map(|(index, part)| part.text.find(REPLY_SENTINEL).map(|at| (index, at)));
    let Some((index, at)) = found else {
        return Err(ChatError::Template(
            "the chat template does not write the assistant's reply verbatim, so a conversation cannot continue without re-reading it".into(),
        ));
    };
    let mut tail = parts;
    let rest = tail[index].text[at + REPLY_SENTINEL.len()..].to_owned();
    tail[index].text = rest;
    Ok(tail
        .into_iter()
        .skip(index)
        .filter(|part| !part.text.is_empty())
        .collect())
}
