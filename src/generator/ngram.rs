//! Prompt-lookup drafting: propose what followed the most recent earlier
//! occurrence of the history's last n tokens. No model involved.

/// Longest and shortest n-gram looked up, and how many tokens to propose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Longest suffix matched (tried first).
    pub n_max: usize,
    /// Shortest suffix matched.
    pub n_min: usize,
}

impl NgramConfig {
    /// The longest n-gram that may be looked up.
    pub const MAX_N: usize = 64;

    /// `1 <= n_min <= n_max <= 64`: the one rule for n-gram settings.
    pub fn validate(&self) -> Result<(), super::SettingError> {
        if self.n_min >= 1 && self.n_min <= self.n_max && self.n_max <= Self::MAX_N {
            return Ok(());
        }
        Err(super::SettingError {
            field: "ngram",
            reason: format!(
                "sizes must satisfy 1 <= ngram_min <= ngram_max <= {}, not ngram_min={} ngram_max={}",
                Self::MAX_N,
                self.n_min,
                self.n_max
            ),
        })
    }
}

impl Default for NgramConfig {
    fn default() -> Self {
        Self { n_max: 4, n_min: 3 }
    }
}

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
