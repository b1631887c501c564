//! Drafts from the grammar: the text a grammar leaves no choice about.
//!
//! Under a grammar (a JSON schema, a tool call), much of a reply is decided
//! by the grammar alone: the rest of a key name once its quote is open, the
//! colon after it, the quote that opens a string value. The grammar is probed
//! one character at a time with the vocabulary's one-character tokens
//! ([`crate::native::Model::byte_tokens`]): where it allows exactly one, that
//! character is the reply's next. Where it allows one character and, before
//! it, only optional whitespace (JSON's `space` rule), the draft takes the
//! whitespace the reply put between the same two characters the last time it
//! wrote them, and stops where the reply has no such place yet. The text is
//! tokenized as the model's tokenizer would, and the tokens the grammar
//! accepts in turn are the draft.
//!
//! A grammar draft is verified as any draft is ([`crate::sampling::verify`]):
//! a token the target would not have chosen is rejected, so the reply is the
//! same with grammar drafts or without.

use crate::native::{Grammar, Model, NativeResult};

/// Most characters one grammar draft probes (each probe is one pass of the
/// grammar engine over the one-character tokens).
pub const MAX_DRAFT_BYTES: usize = 128;

/// Committed tokens whose text the whitespace choice looks back over.
pub const LOOKBACK_TOKENS: usize = 128;

/// Most bytes of optional whitespace one choice takes from the reply.
const MAX_SPACING_BYTES: usize = 24;

/// The tokens the grammar in state `grammar` (after `history`) leaves no
/// choice about, at most `limit` (see the module documentation): empty where
/// the grammar allows several characters next, or the reply may end.
pub fn forced_tokens(
    model: &Model,
    grammar: &Grammar,
    history: &[i32],
    limit: usize,
) -> NativeResult<Vec<i32>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let max_bytes = limit.saturating_mul(16).min(MAX_DRAFT_BYTES);
    let text = forced_text(model, grammar, history, max_bytes)?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Ok(text) = std::str::from_utf8(&text) else {
        return Ok(Vec::new());
    };
    let mut tokens = model.tokenize(text, false, false)?;
    tokens.truncate(limit);
    let mut state = grammar.clone();
    let mut kept = 0;
    for &token in &tokens {
        if model.is_eog(token) || !state.try_accept(token)? {
            break;
        }
        kept += 1;
    }
    tokens.truncate(kept);
    Ok(tokens)
}

/// The characters that follow `grammar`'s state with no choice (but the
/// reply's own whitespace), at most `max_bytes`.
fn forced_text(
    model: &Model,
    grammar: &Grammar,
    history: &[i32],
    max_bytes: usize,
) -> NativeResult<Vec<u8>> {
    let probes = model.byte_tokens();
    let eos = model.eos();
    // One pass of the grammar engine per character: the one-character tokens, then the end of the reply.
    let mut ids: Vec<i32> = probes.iter().map(|&(id, _)| id).collect();
    if eos >= 0 {
        ids.push(eos);
    }
    // The grammar after the drafted text, copied at its first character (most rounds draft none).
    let mut advanced: Option<Grammar> = None;
    let mut text = Vec::new();
    // The text of the recent history, detokenized when a whitespace choice first needs it.
    let mut before: Option<Vec<u8>> = None;
    while text.len() < max_bytes {
        let state = advanced.as_ref().unwrap_or(grammar);
        let verdicts = state.allowed_among(&ids)?;
        if eos >= 0 && verdicts.last() == Some(&true) {
            break;
        }
        let allowed: Vec<u8> = verdicts
            .into_iter()
            .zip(probes)
            .filter_map(|(allowed, &(_, byte))| allowed.then_some(byte))
            .collect();
        let next = match allowed[..] {
            [only] => vec![only],
            _ => {
                let Some(single) = only_after_spacing(&allowed) else {
                    break;
                };
                let recent = match &mut before {
                    Some(recent) => recent,
                    none => none.insert(recent_text(model, history)?),
                };
                let Some(next) = spacing_before(recent, &text, single) else {
                    break;
                };
                next
            }
        };
        let state = advanced.get_or_insert_with(|| grammar.clone());
        for byte in next {
            let Some(&(token, _)) = probes.iter().find(|&&(_, b)| b == byte) else {
                return Ok(text);
            };
            if !state.try_accept(token)? {
                return Ok(text);
            }
            text.push(byte);
        }
    }
    Ok(text)
}

/// Whether `byte` is whitespace a grammar may allow before a character.
fn is_spacing(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The one character other than whitespace among `allowed`, when all the others are whitespace.
fn only_after_spacing(allowed: &[u8]) -> Option<u8> {
    let mut others = allowed.iter().copied().filter(|&byte| !is_spacing(byte));
    match (others.next(), others.next()) {
        (Some(single), None) => Some(single),
        _ => None,
    }
}

/// The text of the last [`LOOKBACK_TOKENS`] tokens of `history`.
fn recent_text(model: &Model, history: &[i32]) -> NativeResult<Vec<u8>> {
    let start = history.len().saturating_sub(LOOKBACK_TOKENS);
    model.detokenize(&history[start..], false)
}

/// The whitespace then `single` the reply wrote the last time it went from
/// the character the text ends with (`recent` then `drafted`) to `single`;
/// `None` when it never did.
fn spacing_before(recent: &[u8], drafted: &[u8], single: u8) -> Option<Vec<u8>> {
    let last = drafted.last().or(recent.last()).copied()?;
    for (at, &byte) in recent.iter().enumerate().rev() {
        if byte != single {
            continue;
        }
        let run = recent[..at]
            .iter()
            .rev()
            .take_while(|&&b| is_spacing(b))
            .count();
        if run > MAX_SPACING_BYTES || at <= run {
            continue;
        }
        if recent[at - run - 1] == last && !is_spacing(last) {
            return Some(recent[at - run..=at].to_vec());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spacing_follows_the_last_place_with_the_same_two_characters() {
        let recent = br#"{"a": "x", "b":"y""#;
        // From a comma to a quote: a space the one time the reply did it.
        assert_eq!(spacing_before(recent, b",", b'"'), Some(b" \"".to_vec()));
        // From a colon to a quote: the latest place wins (no space).
        assert_eq!(spacing_before(recent, b"\":", b'"'), Some(b"\"".to_vec()));
        assert_eq!(spacing_before(recent, b"", b':'), Some(b":".to_vec()));
        // Never a closing brace yet, nor anything in an empty text.
        assert_eq!(spacing_before(recent, b"y", b'}'), None);
        assert_eq!(spacing_before(b"", b"x", b':'), None);
    }

    #[test]
    fn only_whitespace_may_come_before_the_single_character() {
        assert_eq!(only_after_spacing(b" \n\""), Some(b'"'));
        assert_eq!(only_after_spacing(b" \n"), None);
        assert_eq!(only_after_spacing(b"ab"), None);
    }
}
