//! How far two token runs agree before given positions: the measure both
//! prompt lookups (the history's, [`super::ngram`], and a corpus's,
//! [`super::corpus`]) rank earlier occurrences by.

use std::ops::Index;

/// Tokens of agreement (the n-gram included) past which occurrences are equal.
pub const MAX_CONTEXT: usize = 64;

/// How many tokens before `a[..at_a]` and `b[..at_b]` agree, at most `limit`
/// (slices, or the corpus's ring of held tokens).
pub(crate) fn agreement_before<A, B>(a: &A, at_a: usize, b: &B, at_b: usize, limit: usize) -> usize
where
    A: Index<usize, Output = i32> + ?Sized,
    B: Index<usize, Output = i32> + ?Sized,
{
    (1..=limit.min(at_a).min(at_b))
        .take_while(|&back| a[at_a - back] == b[at_b - back])
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_stops_at_the_limit_and_the_history_start() {
        let history = [4, 4, 4, 4, 4, 4];
        assert_eq!(agreement_before(&history, 2, &history, 5, 10), 2);
        assert_eq!(agreement_before(&history, 4, &history, 5, 3), 3);
        assert_eq!(agreement_before(&history, 0, &history, 5, 3), 0);
    }
}
