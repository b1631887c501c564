//! Prompt-lookup drafting: propose what followed the most recent earlier
//! occurrence of the history's last n tokens. No model involved.

use crate::settings::NgramConfig;

/// Up to `n_draft` tokens that followed the most recent earlier occurrence of
/// the longest matching suffix of `history` (lengths `n_max` down to `n_min`).
pub fn propose(history: &[i32], config: NgramConfig, n_draft: usize) -> Vec<i32> {
    if n_draft == 0 {
        return Vec::new();
    }
    for n in (config.n_min.max(1)..=config.n_max).rev() {
        if history.len() <= n {
            continue;
        }
        let pattern = &history[history.len() - n..];
        // Most recent occurrence that ends before the suffix itself.
        let found = (0..history.len() - n)
            .rev()
            .find(|&start| &history[start..start + n] == pattern);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + n_draft).min(history.len());
            return history[from..to].to_vec();
        }
    }
    Vec::new()
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
    fn falls_back_to_shorter_suffixes_and_to_nothing() {
        let config = NgramConfig { n_max: 3, n_min: 1 };
        assert_eq!(propose(&[5, 6, 4, 6], config, 3), vec![4, 6]);
        assert!(propose(&[1, 2, 3], config, 3).is_empty());
        assert!(propose(&[], config, 3).is_empty());
        assert!(propose(&[1, 1], config, 0).is_empty());
    }
}
