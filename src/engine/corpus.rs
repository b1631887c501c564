//! Text that prompt lookup may copy besides a generation's own history: the
//! prompts and replies of earlier requests (in a server, every slot's), kept
//! up to a token budget, oldest dropped first.
//!
//! A corpus changes proposals only. Greedy verification and sampled
//! verification of a point-mass draft commit what plain decoding would, so a
//! generation's text is the same with or without it, and a checkpoint does not
//! carry it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// The largest token budget a corpus may have (16 MiB of tokens).
pub const MAX_CORPUS_TOKENS: usize = 1 << 22;
/// The token budget of a corpus made without one.
pub const DEFAULT_CORPUS_TOKENS: usize = 1 << 16;

/// Earlier texts, each a token sequence, within `max_tokens` in all.
#[derive(Debug)]
pub struct LookupCorpus {
    max_tokens: usize,
    documents: Mutex<Documents>,
}

#[derive(Debug, Default)]
struct Documents {
    texts: VecDeque<Arc<[i32]>>,
    n_tokens: usize,
}

impl LookupCorpus {
    /// An empty corpus keeping at most `max_tokens` tokens, `1..=MAX_CORPUS_TOKENS`.
    pub fn new(max_tokens: usize) -> Result<Self, String> {
        if !(1..=MAX_CORPUS_TOKENS).contains(&max_tokens) {
            return Err(format!(
                "max_tokens must be from 1 to {MAX_CORPUS_TOKENS}, not {max_tokens}"
            ));
        }
        Ok(Self {
            max_tokens,
            documents: Mutex::default(),
        })
    }

    /// The token budget.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Add a text (its last `max_tokens` tokens when longer), dropping the
    /// oldest texts beyond the budget. Token ids must be non-negative; a draft
    /// copied from the corpus stops at the first id outside the target's
    /// vocabulary.
    pub fn add(&self, tokens: &[i32]) -> Result<(), String> {
        if let Some(bad) = tokens.iter().find(|&&token| token < 0) {
            return Err(format!("token ids must be non-negative, not {bad}"));
        }
        let text: Arc<[i32]> = tokens[tokens.len().saturating_sub(self.max_tokens)..].into();
        if text.is_empty() {
            return Ok(());
        }
        let mut documents = self.lock();
        documents.n_tokens += text.len();
        documents.texts.push_back(text);
        while documents.n_tokens > self.max_tokens {
            let dropped = documents.texts.pop_front().map_or(0, |text| text.len());
            documents.n_tokens -= dropped;
        }
        Ok(())
    }

    /// Forget every text.
    pub fn clear(&self) {
        *self.lock() = Documents::default();
    }

    /// Tokens held, in all.
    pub fn n_tokens(&self) -> usize {
        self.lock().n_tokens
    }

    /// Texts held.
    pub fn n_documents(&self) -> usize {
        self.lock().texts.len()
    }

    /// The texts held now, newest first (searched without holding the lock).
    pub fn newest_first(&self) -> Vec<Arc<[i32]>> {
        self.lock().texts.iter().rev().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Documents> {
        // The lock guards plain data updated whole; a panic elsewhere leaves it consistent.
        self.documents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_texts_go_first_beyond_the_budget() {
        let corpus = LookupCorpus::new(5).unwrap();
        corpus.add(&[1, 2]).unwrap();
        corpus.add(&[3, 4]).unwrap();
        assert_eq!((corpus.n_documents(), corpus.n_tokens()), (2, 4));
        corpus.add(&[5, 6]).unwrap();
        assert_eq!(
            corpus.newest_first(),
            vec![Arc::from([5, 6]), Arc::from([3, 4])]
        );
        corpus.add(&[7, 8, 9, 10, 11, 12]).unwrap();
        assert_eq!(corpus.newest_first(), vec![Arc::from([8, 9, 10, 11, 12])]);
        corpus.add(&[]).unwrap();
        assert_eq!(corpus.n_documents(), 1);
        corpus.clear();
        assert_eq!((corpus.n_documents(), corpus.n_tokens()), (0, 0));
    }

    #[test]
    fn bad_budgets_and_tokens_are_refused_and_change_nothing() {
        assert!(LookupCorpus::new(0).is_err());
        assert!(LookupCorpus::new(MAX_CORPUS_TOKENS + 1).is_err());
        let corpus = LookupCorpus::new(DEFAULT_CORPUS_TOKENS).unwrap();
        assert!(corpus.add(&[1, -2]).unwrap_err().contains("-2"));
        assert_eq!(corpus.n_tokens(), 0);
    }
}
