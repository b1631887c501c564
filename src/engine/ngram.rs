//! Prompt-lookup drafting: propose what followed an earlier occurrence of the
//! history's last n tokens. No model involved.
//!
//! Among the earlier occurrences of the longest n-gram found, the one whose
//! preceding tokens agree with the history's for longest (up to
//! [`MAX_CONTEXT`] tokens in all) is copied, the most recent among equals. In
//! text that copies a source with small edits (a file rewritten, a document
//! quoted) the same few tokens recur in many places (`"""`, `return`, an
//! indentation), and the longer agreement is the place being copied
//! (docs/measured.md, "Prompt lookup").
//!
//! **Resynchronising.** Text that copies a source changes single tokens of it
//! (two blank lines for three, `"""` for `."""`). Right after such a change the
//! history's last token occurs nowhere near the passage being copied, and the
//! n-gram match lands on some other `"""`. So an earlier passage whose token at
//! the history's last position differs also competes, with the context that
//! agrees before that token (at least [`RESYNC_CONTEXT`] tokens), and its
//! continuation past the replaced token is proposed when that context is the
//! longest. It raises acceptance on text that copies with edits and lowers it
//! where an answer departs from its source for good (the passage is still
//! proposed); the adaptive policy drafts little after a rejection, so the cost
//! there stays small (docs/measured.md, "Prompt lookup").

use super::agreement::{agreement_before, MAX_CONTEXT};
use super::corpus::LookupCorpus;
use crate::settings::NgramConfig;

/// Tokens that must agree before a token the history replaced for the
/// passage's continuation to be proposed (and at least `n_min`).
pub const RESYNC_CONTEXT: usize = 8;

/// Up to `n_draft` tokens that followed the earlier occurrence of the
/// history's end with the longest agreeing context (at least `n_min` tokens,
/// at most [`MAX_CONTEXT`]), the most recent among equals.
///
/// This is what looking up the longest matching suffix of `n_max` down to
/// `n_min` tokens and then taking its occurrence with the longest agreeing
/// context gives, in one pass: the longest suffix found is the longest
/// context's, whatever `n_max`.
pub fn propose(history: &[i32], config: NgramConfig, n_draft: usize) -> Vec<i32> {
    propose_from(history, None, config, n_draft)
}

/// [`propose`] over `history` and then a corpus's earlier texts
/// ([`LookupCorpus::lookup`]): an occurrence in the corpus wins over the
/// history's only with a longer agreeing context.
pub fn propose_from(
    history: &[i32],
    corpus: Option<&LookupCorpus>,
    config: NgramConfig,
    n_draft: usize,
) -> Vec<i32> {
    if n_draft == 0 {
        return Vec::new();
    }
    let own = best_occurrence(history, RESYNC_CONTEXT.max(config.n_min));
    let own_context = own.map_or(0, |(_, context)| context);
    let earlier = corpus
        .filter(|_| own_context < MAX_CONTEXT)
        .and_then(|corpus| corpus.lookup(history, n_draft))
        .filter(|&(context, _)| context > own_context);
    match (earlier, own) {
        (Some((context, tokens)), _) if context >= config.n_min => tokens,
        (None, Some((from, context))) if context >= config.n_min => {
            history[from..(from + n_draft).min(history.len())].to_vec()
        }
        _ => Vec::new(),
    }
}

/// The earlier occurrence in `history` of its own end with the longest
/// agreeing context, the most recent among equals: where its continuation
/// starts (before the history's last token, so that there is one) and how many
/// tokens agree. An occurrence whose last token differs from the history's
/// counts the tokens agreeing before it, if at least `resync_context`.
fn best_occurrence(history: &[i32], resync_context: usize) -> Option<(usize, usize)> {
    let (&last, before) = history.split_last()?;
    let mut best: Option<(usize, usize)> = None;
    for from in (1..history.len()).rev() {
        let context = if history[from - 1] == last {
            agreement_before(history, from, history, history.len(), MAX_CONTEXT)
        } else {
            let context = agreement_before(history, from - 1, before, before.len(), MAX_CONTEXT);
            if context < resync_context {
                continue;
            }
            context
        };
        if best.is_none_or(|(_, longest)| context > longest) {
            best = Some((from, context));
            if context >= MAX_CONTEXT {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::corpus::MAX_CANDIDATES;

    #[test]
    fn proposes_the_continuation_of_the_latest_repeat() {
        let history = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        let config = NgramConfig { n_max: 3, n_min: 1 };
        assert_eq!(propose(&history, config, 2), vec![7, 8]);
        assert_eq!(propose(&history, config, 10), vec![7, 8, 1, 2, 3]);
    }

    #[test]
    fn the_occurrence_with_the_longest_agreeing_context_wins() {
        // `5 1 2` is followed by 6 early on; `1 2` alone, more recently, by 7.
        let history = [5, 1, 2, 6, 0, 1, 2, 7, 0, 5, 1, 2];
        let config = NgramConfig { n_max: 2, n_min: 1 };
        assert_eq!(propose(&history, config, 1), vec![6]);
        // Equal contexts: the most recent.
        let history = [0, 1, 2, 6, 0, 1, 2, 7, 0, 1, 2];
        assert_eq!(propose(&history, config, 1), vec![7]);
    }

    #[test]
    fn a_passage_with_its_last_token_replaced_is_copied_past_it() {
        let config = NgramConfig { n_max: 4, n_min: 3 };
        // A source of ten tokens, then its copy with 9 in place of 10.
        let source: Vec<i32> = (1..=10).chain([11, 12, 13]).collect();
        let mut history = source.clone();
        history.extend(1..=9);
        history.push(99);
        assert_eq!(propose(&history, config, 3), vec![11, 12, 13]);
        // One agreeing token fewer than RESYNC_CONTEXT: nothing to copy.
        let short = &history[history.len() - RESYNC_CONTEXT..];
        let history: Vec<i32> = [source.as_slice(), short].concat();
        assert!(propose(&history, config, 3).is_empty());
        // Against a plain n-gram match (which counts its last token): the longer context wins.
        let tail: Vec<i32> = (1..=9).chain([42]).collect();
        let history = [(1..=11).collect(), vec![5, 6, 7, 8, 9, 42, 7], tail.clone()].concat();
        assert_eq!(propose(&history, config, 1), vec![11]);
        let history = [
            (1..=11).collect(),
            vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 42, 7],
            tail,
        ]
        .concat();
        assert_eq!(propose(&history, config, 1), vec![7]);
    }

    fn corpus_of(texts: &[&[i32]]) -> LookupCorpus {
        let corpus = LookupCorpus::new(1 << 16).unwrap();
        for text in texts {
            corpus.add(text).unwrap();
        }
        corpus
    }

    #[test]
    fn earlier_texts_are_copied_where_their_context_agrees_longer() {
        let config = NgramConfig { n_max: 2, n_min: 1 };
        let corpus = corpus_of(&[&[7, 8, 1, 2, 3, 4]]);
        let from = |history: &[i32], n_draft| propose_from(history, Some(&corpus), config, n_draft);
        // Nothing to copy in the history: the text's continuation.
        assert_eq!(from(&[9, 1, 2], 3), vec![3, 4]);
        // A history as long as the two tokens finds them in a text.
        assert_eq!(from(&[1, 2], 1), vec![3]);
        // The history's own occurrence, as long in context, wins ties.
        assert_eq!(from(&[1, 2, 5, 0, 1, 2], 1), vec![5]);
        // A longer agreeing context in the text wins.
        assert_eq!(from(&[1, 2, 5, 8, 1, 2], 1), vec![3]);
        // The corpus offers occurrences of the last two tokens, not of one.
        assert!(from(&[6], 2).is_empty());
        assert!(from(&[9, 4], 2).is_empty());
    }

    #[test]
    fn corpus_occurrences_stay_within_their_text_and_the_budget() {
        let config = NgramConfig { n_max: 4, n_min: 2 };
        // The context stops at a text's start, the continuation at its end.
        let corpus = corpus_of(&[&[1, 2, 3], &[4, 1, 2, 5, 6], &[1, 2, 7]]);
        assert_eq!(corpus.lookup(&[4, 1, 2], 8), Some((3, vec![5, 6])));
        assert_eq!(corpus.lookup(&[0, 1, 2], 8), Some((2, vec![7])));
        assert_eq!(propose_from(&[9, 1, 2], Some(&corpus), config, 8), vec![7]);
        // Dropped texts are never proposed, and their keys go with them.
        let small = LookupCorpus::new(5).unwrap();
        small.add(&[1, 2, 3, 4]).unwrap();
        small.add(&[5, 1, 2, 9]).unwrap();
        assert_eq!(small.lookup(&[1, 2], 4), Some((2, vec![9])));
        small.add(&[8, 8]).unwrap();
        assert_eq!(small.lookup(&[1, 2], 4), None);
        assert_eq!((small.n_documents(), small.n_tokens()), (1, 2));
    }

    #[test]
    fn a_lookup_walks_at_most_the_most_recent_candidates() {
        // Many occurrences of `1 2`; the one with the longest context is older than the candidates walked.
        let mut texts: Vec<Vec<i32>> = vec![vec![5, 6, 1, 2, 42]];
        texts.extend((0..MAX_CANDIDATES + 10).map(|i| vec![0, 1, 2, i as i32 % 7 + 100]));
        let corpus = LookupCorpus::new(1 << 16).unwrap();
        for text in &texts {
            corpus.add(text).unwrap();
        }
        let (context, tokens) = corpus.lookup(&[6, 1, 2], 1).unwrap();
        assert_eq!(context, 2); // `5 6 1 2` is out of reach: the most recent `1 2` wins
        assert_eq!(tokens, vec![(MAX_CANDIDATES + 9) as i32 % 7 + 100]);
    }

    /// The lookup as it was written before one pass: for each n from `n_max`
    /// down, the occurrence of the last n tokens with the longest agreeing
    /// context in the history, then in each text (a text winning only with a
    /// longer one); then a resynchronising occurrence in the history
    /// ([`resync_by_suffixes`]) wins with a longer context than the history's
    /// (or as long and more recent) and than the text's (or as long).
    fn propose_by_suffixes(
        history: &[i32],
        texts: &[&[i32]],
        config: NgramConfig,
        n_draft: usize,
    ) -> Vec<i32> {
        let copy =
            |source: &[i32], from: usize| source[from..(from + n_draft).min(source.len())].to_vec();
        let resync = resync_by_suffixes(history, RESYNC_CONTEXT.max(config.n_min));
        match (exact_by_suffixes(history, texts, config), resync) {
            (Some((0, from, context)), Some(resync)) if resync > (context, from) => {
                copy(history, resync.1)
            }
            (Some((text, _, context)), Some(resync)) if text > 0 && resync.0 >= context => {
                copy(history, resync.1)
            }
            (None, Some((_, from))) => copy(history, from),
            (Some((0, from, _)), _) => copy(history, from),
            (Some((text, from, _)), _) => copy(texts[text - 1], from),
            (None, None) => Vec::new(),
        }
    }

    /// The suffix-by-suffix n-gram match: which source (0: the history, `i`:
    /// text `i - 1`), where its continuation starts, and its context.
    fn exact_by_suffixes(
        history: &[i32],
        texts: &[&[i32]],
        config: NgramConfig,
    ) -> Option<(usize, usize, usize)> {
        for n in (config.n_min.max(1)..=config.n_max).rev() {
            if history.len() < n {
                continue;
            }
            let suffix_at = history.len() - n;
            let mut best: Option<(usize, usize, usize)> = None;
            for (index, source) in std::iter::once(history)
                .chain(texts.iter().copied())
                .enumerate()
            {
                for start in (0..source.len().saturating_sub(n)).rev() {
                    if source[start..start + n] != history[suffix_at..] {
                        continue;
                    }
                    let context = n + agreement_before(
                        source,
                        start,
                        history,
                        suffix_at,
                        MAX_CONTEXT.saturating_sub(n),
                    );
                    if best.is_none_or(|(_, _, longest)| context > longest) {
                        best = Some((index, start + n, context));
                    }
                }
            }
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// For each r from [`MAX_CONTEXT`] down to `least`, the most recent
    /// occurrence in the history of the r tokens before its last one that is
    /// followed by another token and then a continuation: its context r and
    /// where the continuation starts.
    fn resync_by_suffixes(history: &[i32], least: usize) -> Option<(usize, usize)> {
        let (&last, before) = history.split_last()?;
        for r in (least..=MAX_CONTEXT.min(before.len())).rev() {
            let wanted = &before[before.len() - r..];
            let found = (0..before.len().saturating_sub(r))
                .rev()
                .find(|&start| &history[start..start + r] == wanted && history[start + r] != last);
            if let Some(start) = found {
                return Some((r, start + r + 1));
            }
        }
        None
    }

    #[test]
    fn one_pass_proposes_what_the_suffix_by_suffix_lookup_did() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound) as i32
        };
        for case in 0..3000 {
            let alphabet = 2 + (case % 5) as u64;
            let history: Vec<i32> = (0..next(80) + 1).map(|_| next(alphabet)).collect();
            let texts: Vec<Vec<i32>> = (0..next(3))
                .map(|_| (0..next(40)).map(|_| next(alphabet)).collect())
                .collect();
            let n_min = 2 + next(3) as usize;
            let config = NgramConfig {
                n_max: n_min + next(4) as usize,
                n_min,
            };
            let n_draft = 1 + next(8) as usize;
            let slices: Vec<&[i32]> = texts.iter().map(Vec::as_slice).collect();
            let corpus = corpus_of(&slices);
            let newest_first: Vec<&[i32]> = slices.iter().rev().copied().collect();
            assert_eq!(
                propose_from(&history, Some(&corpus), config, n_draft),
                propose_by_suffixes(&history, &newest_first, config, n_draft),
                "case {case}: {history:?} {texts:?} {config:?}"
            );
            assert_eq!(
                propose(&history, config, n_draft),
                propose_by_suffixes(&history, &[], config, n_draft)
            );
        }
    }

    #[test]
    fn falls_back_to_shorter_suffixes_and_to_nothing() {
        let config = NgramConfig { n_max: 3, n_min: 1 };
        assert_eq!(propose(&[5, 6, 4, 6], config, 3), vec![4, 6]);
        assert!(propose(&[1, 2, 3], config, 3).is_empty());
        assert!(propose(&[], config, 3).is_empty());
        assert!(propose(&[1, 1], config, 0).is_empty());
    }
}
