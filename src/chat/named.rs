//! Conversations rendered with one of llama.cpp's built-in templates by name
//! (`gemma`, `llama3`, ...): `llama_chat_apply_template`'s text, split into
//! template text and message text so that a message cannot forge a role.
//!
//! llama.cpp renders a built-in template as one string. The conversation is
//! rendered twice: as given, and with each message's text replaced by a
//! marker of its own. The second rendering is the template text around the
//! markers; the first tells what each message became in place of its marker
//! (its text, or its text trimmed, as several templates write it). Messages
//! of whitespace only keep their text in both renderings (some templates
//! write an empty message differently, and whitespace cannot forge a token).

use super::{ChatError, Message, Result};
use crate::native::{ChatTemplates, PromptPart};

/// Starts and ends each message's marker (not whitespace, so no template trims it).
const MARK: char = '\u{1}';
/// The marker's text between the two `MARK`s, before the message's index.
const MARK_TAG: &str = "specstate:message:";

/// Most steps of the search for a split (a conversation needs about two per message).
const MAX_SPLIT_STEPS: usize = 1 << 20;

fn marker(index: usize) -> String {
    format!("{MARK}{MARK_TAG}{index}{MARK}")
}

/// The conversation as prompt parts, rendered by the built-in template.
pub(super) fn render(
    templates: &ChatTemplates,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<Vec<PromptPart>> {
    let failed = |e: crate::native::NativeError| ChatError::Template(e.to_string());
    let pairs: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    let text = templates
        .apply_builtin(&pairs, add_generation_prompt)
        .map_err(failed)?;
    let markers: Vec<Option<String>> = messages
        .iter()
        .enumerate()
        .map(|(index, m)| marked(&m.content).then(|| marker(index)))
        .collect();
    let marked_pairs: Vec<(&str, &str)> = messages
        .iter()
        .zip(&markers)
        .map(|(m, mark)| (m.role.as_str(), mark.as_deref().unwrap_or(&m.content)))
        .collect();
    let skeleton = templates
        .apply_builtin(&marked_pairs, add_generation_prompt)
        .map_err(failed)?;
    split(&text, &skeleton, messages).ok_or_else(|| {
        ChatError::Template(format!(
            "llama.cpp's {:?} chat template changes message text in a way specstate cannot \
             separate from the template's own text",
            templates.builtin_name().unwrap_or_default()
        ))
    })
}

/// Whether a message's text is replaced by a marker: whether it is more than whitespace.
fn marked(content: &str) -> bool {
    !trim(content).is_empty()
}

/// llama.cpp's `trim`: ASCII whitespace (`isspace`) off both ends.
fn trim(text: &str) -> &str {
    text.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r'))
}

/// One piece of the skeleton: template text, or the marker of a message.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Template(&'a str),
    Message(usize),
}

/// The skeleton's pieces, in order (markers of messages that exist only).
fn pieces<'a>(skeleton: &'a str, messages: &[Message]) -> Vec<Piece<'a>> {
    let mut pieces = Vec::new();
    let mut rest = skeleton;
    let opening = format!("{MARK}{MARK_TAG}");
    while let Some(at) = rest.find(&opening) {
        let after = &rest[at + opening.len()..];
        let Some(end) = after.find(MARK) else { break };
        let index = after[..end]
            .parse::<usize>()
            .ok()
            .filter(|&i| i < messages.len());
        let Some(index) = index else {
            // Not a marker after all: keep it as template text.
            pieces.push(Piece::Template(&rest[..at + opening.len()]));
            rest = after;
            continue;
        };
        pieces.push(Piece::Template(&rest[..at]));
        pieces.push(Piece::Message(index));
        rest = &after[end + MARK.len_utf8()..];
    }
    pieces.push(Piece::Template(rest));
    pieces.retain(|piece| *piece != Piece::Template(""));
    pieces
}

/// The readings of a message's text in the rendered prompt: as given, or trimmed.
fn readings(content: &str) -> Vec<&str> {
    let trimmed = trim(content);
    if trimmed == content {
        vec![content]
    } else {
        vec![content, trimmed]
    }
}

/// Parts of `text` along the skeleton, or None when `text` is not the
/// skeleton with each marker replaced by its message's text (or that text
/// trimmed). A search with backtracking over the readings, without recursion
/// (a conversation may be long).
pub(super) fn split(text: &str, skeleton: &str, messages: &[Message]) -> Option<Vec<PromptPart>> {
    let pieces = pieces(skeleton, messages);
    let options = |piece: &Piece<'_>| -> Vec<String> {
        match *piece {
            Piece::Template(template) => vec![template.to_owned()],
            Piece::Message(index) => readings(&messages[index].content)
                .into_iter()
                .map(str::to_owned)
                .collect(),
        }
    };
    let options: Vec<Vec<String>> = pieces.iter().map(options).collect();
    // For each piece matched so far: where it starts in `text`, and which option matched.
    let mut chosen: Vec<(usize, usize)> = Vec::with_capacity(pieces.len());
    let (mut at, mut option) = (0_usize, 0_usize);
    // Each step matches a piece or backs up; pathological texts give up (an error) rather than search on.
    let mut steps = MAX_SPLIT_STEPS;
    loop {
        steps = steps.checked_sub(1)?;
        let index = chosen.len();
        if index == pieces.len() && at == text.len() {
            break;
        }
        let matched = options.get(index).and_then(|choices| {
            (option..choices.len()).find(|&o| text[at..].starts_with(choices[o].as_str()))
        });
        if let Some(o) = matched {
            chosen.push((at, o));
            at += options[index][o].len();
            option = 0;
            continue;
        }
        // Back to the last piece with another option.
        loop {
            let (start, tried) = chosen.pop()?;
            if tried + 1 < options[chosen.len()].len() {
                (at, option) = (start, tried + 1);
                break;
            }
        }
    }
    Some(
        pieces
            .iter()
            .zip(options)
            .zip(chosen)
            .map(|((piece, mut choices), (_, o))| PromptPart {
                text: choices.swap_remove(o),
                is_input: matches!(piece, Piece::Message(_)),
            })
            .collect(),
    )
}
