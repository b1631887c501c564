//! Prompt-lookup drafting: propose what followed an earlier occurrence of the
//! history's last n tokens. No model involved.
//!
//! Among the earlier occurrences of the longest n-gram found, the one whose
//! preceding tokens agree with the history's for longest (up to
//! [`MAX_CONTEXT`] tokens in all) is copied, the most recent among equals. In
//! text that copies a source with small edits (a file rewritten, a document
//! quoted) the same few tokens recur in many places (`"""`, `return`, an
//! indentation), and the longer agreement is the place being copied: on
//! `make bench`'s edit prompt the longest context is accepted on 76% of its
//! drafted tokens against 71% for the most recent occurrence.

use crate::settings::NgramConfig;

/// Tokens of agreement (the n-gram included) past which occurrences are equal.
pub const MAX_CONTEXT: usize = 64;

/// Up to `n_draft` tokens that followed the earlier occurrence of the longest
/// matching suffix of `history` (lengths `n_max` down to `n_min`) with the
/// longest agreeing context, the most recent among equals.
pub fn propose(history: &[i32], config: NgramConfig, n_draft: usize) -> Vec<i32> {
    if n_draft == 0 {
        return Vec::new();
    }
    for n in (config.n_min.max(1)..=config.n_max).rev() {
        if let Some(from) = best_occurrence(history, n) {
            let to = (from + n_draft).min(history.len());
            return history[from..to].to_vec();
        }
    }
    Vec::new()
}

/// Where the continuation of the best earlier occurrence of the history's
/// last `n` tokens starts, if there is one (ending before the suffix itself).
fn best_occurrence(history: &[i32], n: usize) -> Option<usize> {
    let len = history.len();
    if len <= n {
        return None;
    }
    let pattern = &history[len - n..];
    let (mut best, mut best_context) = (None, 0);
    for start in (0..len - n).rev() {
        if &history[start..start + n] != pattern {
            continue;
        }
        let context = n + agreement_before(history, start, len - n, MAX_CONTEXT.saturating_sub(n));
        if context > best_context {
            (best, best_context) = (Some(start + n), context);
            if context >= MAX_CONTEXT {
                break;
            }
        }
    }
    best
}

/// How many tokens before positions `a` and `b` of `history` agree, at most `limit`.
fn agreement_before(history: &[i32], a: usize, b: usize, limit: usize) -> usize {
    (1..=limit.min(a).min(b))
        .take_while(|&back| history[a - back] == history[b - back])
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn agreement_stops_at_the_limit_and_the_history_start() {
        let history = [4, 4, 4, 4, 4, 4];
        assert_eq!(agreement_before(&history, 2, 5, 10), 2);
        assert_eq!(agreement_before(&history, 4, 5, 3), 3);
        assert_eq!(agreement_before(&history, 0, 5, 3), 0);
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
