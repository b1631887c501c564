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
//! wrote them (a member after `{`, `[` or `,` spaced alike); where the reply
//! has no such place yet, the layout of pretty-printed JSON
//! ([`usual_spacing`]). The text is tokenized as the model's tokenizer would,
//! and the tokens the grammar accepts in turn are the draft.
//!
//! A grammar draft is verified as any draft is ([`crate::sampling::verify`]):
//! a token the target would not have chosen is rejected, so the reply is the
//! same with grammar drafts or without.

use super::{Cursor, Draft, Engine};
use crate::native::{Grammar, Model, NativeError, NativeResult};

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
                let Some(next) = spacing_before(&[recent.as_slice(), &text].concat(), single)
                else {
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

/// Characters after which a member of an object or an element of an array
/// begins: the reply spaces a member after any of them alike.
const MEMBER_STARTS: &[u8] = b"{[,";

/// The whitespace then `single` to draft after `text` (the recent history,
/// then the drafted text): what the reply wrote the last time it went from
/// the character `text` ends with to `single` (or from any of
/// [`MEMBER_STARTS`] when it ends with one), else [`usual_spacing`]; `None`
/// after whitespace (the reply chose a layout of its own) or where neither
/// applies.
fn spacing_before(text: &[u8], single: u8) -> Option<Vec<u8>> {
    let last = *text.last().filter(|&&byte| !is_spacing(byte))?;
    let spacing = last_spacing(text, single, |byte| byte == last)
        .or_else(|| {
            MEMBER_STARTS
                .contains(&last)
                .then(|| last_spacing(text, single, |byte| MEMBER_STARTS.contains(&byte)))
                .flatten()
        })
        .or_else(|| usual_spacing(text, last, single))?;
    (spacing.len() <= MAX_SPACING_BYTES).then(|| [spacing.as_slice(), &[single]].concat())
}

/// The whitespace `text` held the last time a character that passes `after`
/// was followed by whitespace then `single`; `None` when it never was.
fn last_spacing(text: &[u8], single: u8, after: impl Fn(u8) -> bool) -> Option<Vec<u8>> {
    for (at, &byte) in text.iter().enumerate().rev() {
        if byte != single {
            continue;
        }
        let run = text[..at]
            .iter()
            .rev()
            .take_while(|&&b| is_spacing(b))
            .count();
        if run > MAX_SPACING_BYTES || at <= run {
            continue;
        }
        // Not whitespace: the run above stopped at it.
        if after(text[at - run - 1]) {
            return Some(text[at - run..at].to_vec());
        }
    }
    None
}

/// The whitespace pretty-printed JSON puts between `last` (the character
/// `text` ends with) and `single`, for a reply that has not shown its own:
/// none before a colon and a space after it; a member on a new line,
/// indented two spaces past the line that opens it; a closing bracket on a
/// new line at the indentation of its opening bracket's line, or right after
/// the value where the reply wrote the members on the opening bracket's line.
fn usual_spacing(text: &[u8], last: u8, single: u8) -> Option<Vec<u8>> {
    match (last, single) {
        (b':', _) => Some(b" ".to_vec()),
        (_, b':') => Some(Vec::new()),
        (_, b'}' | b']') => {
            let opening = matching_opener(text)?;
            let members = &text[opening..];
            if members.contains(&b'\n') {
                Some([b"\n", indentation(&text[..opening])].concat())
            } else {
                Some(Vec::new())
            }
        }
        (b'{' | b'[', _) => Some([b"\n", indentation(text), b"  "].concat()),
        _ => None,
    }
}

/// Where the bracket that the end of `text` is inside opens (brackets in
/// strings counted too: this only guesses a layout); `None` when it is not
/// in `text`.
fn matching_opener(text: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    for (at, &byte) in text.iter().enumerate().rev() {
        match byte {
            b'}' | b']' => depth += 1,
            b'{' | b'[' if depth == 0 => return Some(at),
            b'{' | b'[' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// The spaces and tabs that begin the last line of `text`.
fn indentation(text: &[u8]) -> &[u8] {
    let line = text
        .iter()
        .rposition(|&byte| byte == b'\n')
        .map_or(text, |newline| &text[newline + 1..]);
    let width = line
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    &line[..width]
}

/// How a round adds the grammar's tokens to its draft.
impl Engine<'_> {
    /// `own`, the drafter's draft, followed by the tokens the grammar forces
    /// after it ([`forced_tokens`]), and how many of the draft's first
    /// tokens are the drafter's. A drafter's token the grammar forbids ends
    /// the draft (the target would reject it); a draft whose first token is
    /// not the one the grammar forces is replaced by the grammar's. Nothing
    /// is added without a grammar, under a drafter that must not verify other
    /// tokens, or when the drafter sampled its draft from the generation's
    /// RNG (drafting more would move its later draws, and so the reply); nor
    /// when probing the grammar fails (verification reports that error if
    /// the reply reaches it).
    pub(super) fn with_grammar_draft(
        &self,
        at: &Cursor<'_>,
        own: Draft,
        max_commit: usize,
    ) -> (Draft, usize) {
        let n_own = own.tokens.len();
        let Some(grammar) = self.sampler.grammar().filter(|_| self.grammar_drafts > 0) else {
            return (own, n_own);
        };
        let limit = self.grammar_room(at, max_commit);
        let moves_text = !self.lengths_leave_text_alone();
        if limit == 0 || moves_text || !self.drafter.follows_foreign_drafts() {
            return (own, n_own);
        }
        match self.grammar_draft(grammar, at.history, &own.tokens, limit) {
            Ok((kept, forced)) => {
                let mut draft = own.truncated(kept);
                if let Some(dists) = draft.distributions.as_mut() {
                    dists.extend(forced.iter().map(|&token| vec![(token, 1.0)]));
                }
                draft.tokens.extend(forced);
                (draft, kept)
            }
            Err(_) => (own, n_own),
        }
    }

    /// How many of the drafter's `own` tokens to keep (those the grammar
    /// allows in turn; none when the grammar forces another first token) and
    /// the tokens the grammar forces after them, in all at most `limit`
    /// beyond the kept ones.
    fn grammar_draft(
        &self,
        grammar: &Grammar,
        history: &[i32],
        own: &[i32],
        limit: usize,
    ) -> std::result::Result<(usize, Vec<i32>), NativeError> {
        let model = self.target.model();
        let forced = forced_tokens(model, grammar, history, limit)?;
        if own.is_empty() || (!forced.is_empty() && own.first() != forced.first()) {
            return Ok((0, forced));
        }
        let mut state = grammar.clone();
        let mut kept = 0;
        for &token in own {
            if !state.try_accept(token)? {
                return Ok((kept, Vec::new()));
            }
            kept += 1;
        }
        let room = limit.saturating_sub(kept);
        let lookback = history.len().saturating_sub(LOOKBACK_TOKENS);
        let after = [&history[lookback..], own].concat();
        let forced = forced_tokens(model, &state, &after, room)?;
        Ok((kept, forced))
    }

    /// Most tokens this round may draft from the grammar: its
    /// `grammar_drafts`, within the context, the batch and `max_commit`, and
    /// on a recurrent or hybrid target within the recurrent-state snapshots
    /// it keeps to roll back (none in `none` mode).
    fn grammar_room(&self, at: &Cursor<'_>, max_commit: usize) -> usize {
        let room = (self.target.n_ctx_seq() as usize).saturating_sub(at.n_past + 1);
        let rows = self.batch.capacity().saturating_sub(1);
        let capacity = self.target.capacity();
        let snapshots = if capacity.recurrent_or_hybrid {
            capacity.recurrent_slots as usize
        } else {
            usize::MAX
        };
        self.grammar_drafts
            .min(room.saturating_sub(1))
            .min(rows)
            .min(max_commit.saturating_sub(1))
            .min(snapshots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `spacing_before` on `recent` then `drafted`.
    fn spaced(recent: &[u8], drafted: &[u8], single: u8) -> Option<Vec<u8>> {
        spacing_before(&[recent, drafted].concat(), single)
    }

    #[test]
    fn spacing_follows_the_last_place_with_the_same_two_characters() {
        let recent = br#"{"a":  "x", "b":"y""#;
        // From a comma to a quote: the one time the reply did it.
        assert_eq!(spaced(recent, b",", b'"'), Some(b" \"".to_vec()));
        // From a colon to a quote: the latest place wins (no space).
        assert_eq!(spaced(recent, b"\":", b'"'), Some(b"\"".to_vec()));
        assert_eq!(spaced(recent, b"", b':'), Some(b":".to_vec()));
        // Nothing to follow after whitespace, nor in an empty text.
        assert_eq!(spaced(recent, b" ", b'"'), None);
        assert_eq!(spaced(b"", b"", b':'), None);
    }

    #[test]
    fn a_member_is_spaced_as_after_any_member_start() {
        // The first comma of the reply: spaced as the member after the opening brace.
        assert_eq!(
            spaced(b"{\n    \"a\": 1", b",", b'"'),
            Some(b"\n    \"".to_vec())
        );
        assert_eq!(spaced(b"[\"a\"", b",", b'"'), Some(b"\"".to_vec()));
    }

    #[test]
    fn a_reply_with_no_layout_yet_is_spaced_as_pretty_printed_json() {
        assert_eq!(spaced(b"answer:\n", b"{", b'"'), Some(b"\n  \"".to_vec()));
        assert_eq!(spaced(b"{\n  \"a\"", b"", b':'), Some(b":".to_vec()));
        assert_eq!(spaced(b"{\n  \"a\":", b"", b'"'), Some(b" \"".to_vec()));
        let nested = b"{\n  \"a\": {\n    \"b\": 1";
        assert_eq!(spaced(nested, b"", b'}'), Some(b"\n  }".to_vec()));
        assert_eq!(spaced(nested, b"\n  }", b'}'), Some(b"\n}".to_vec()));
        // Members on their opening line: the bracket closes right after them.
        assert_eq!(spaced(b"x\n[1, 2", b"", b']'), Some(b"]".to_vec()));
        // No guess between two values, nor without the opening bracket.
        assert_eq!(spaced(b"{\"a\": 1", b"", b','), None);
        assert_eq!(spaced(b"\"b\": 1", b"", b'}'), None);
    }

    #[test]
    fn only_whitespace_may_come_before_the_single_character() {
        assert_eq!(only_after_spacing(b" \n\""), Some(b'"'));
        assert_eq!(only_after_spacing(b" \n"), None);
        assert_eq!(only_after_spacing(b"ab"), None);
    }
}
