//! Text that prompt lookup may copy besides a generation's own history: the
//! prompts and replies of earlier requests (in a server, every slot's), kept
//! up to a token budget, oldest dropped first.
//!
//! A corpus changes proposals only. Greedy verification and sampled
//! verification of a point-mass draft commit what plain decoding would, so a
//! generation's text is the same with or without it, and a checkpoint does not
//! carry it.
//!
//! Each position that follows two tokens of a text is chained to the previous
//! position that follows the same two (a hash chain, as LZ77 compressors
//! keep), so a lookup walks the most recent [`MAX_CANDIDATES`] occurrences of
//! the history's last two tokens instead of scanning every text: its cost is
//! bounded whatever the budget (a scan of the largest corpus, 4,194,304
//! tokens, for every n-gram length, took longer than a decode). An occurrence
//! in the corpus agrees with the history on at least those two tokens.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use super::agreement::{agreement_before, MAX_CONTEXT};

/// The largest token budget a corpus may have (16 MiB of tokens).
pub const MAX_CORPUS_TOKENS: usize = 1 << 22;
/// The token budget of a corpus made without one.
pub const DEFAULT_CORPUS_TOKENS: usize = 1 << 16;
/// Earlier occurrences of the history's last two tokens that one lookup
/// examines, the most recent first: a lookup's cost does not grow with the
/// corpus.
pub const MAX_CANDIDATES: usize = 256;

/// The one rule for a lookup corpus: only `ngram` mode's prompt lookup drafts from one.
pub fn check_mode(mode: &str) -> Result<(), String> {
    if mode == "ngram" {
        return Ok(());
    }
    Err(format!(
        "a lookup corpus drafts for mode 'ngram', not '{mode}'"
    ))
}

/// Earlier texts, each a token sequence, within `max_tokens` in all, indexed
/// by the two tokens before each position.
#[derive(Debug)]
pub struct LookupCorpus {
    max_tokens: usize,
    store: Mutex<Store>,
}

/// The texts' tokens end to end, each at a global position that never
/// changes (positions before `first` were dropped), and a chain per
/// two-token key through every position that follows that key in a text.
#[derive(Debug, Default)]
struct Store {
    /// The held tokens, oldest first: `tokens[i]` is at position `first + i`.
    tokens: VecDeque<i32>,
    /// For each held position: how far back the previous position that
    /// follows the same two tokens lies, 0 for none (and for the first two
    /// positions of a text and its last, which no lookup can use).
    earlier: VecDeque<u32>,
    /// The latest position that follows each two-token key.
    latest: HashMap<(i32, i32), u64>,
    /// Each held text's `[start, end)`, oldest first.
    texts: VecDeque<(u64, u64)>,
    first: u64,
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
            store: Mutex::default(),
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
        let text = &tokens[tokens.len().saturating_sub(self.max_tokens)..];
        if text.is_empty() {
            return Ok(());
        }
        let mut store = self.lock();
        store.push(text);
        while store.tokens.len() > self.max_tokens {
            store.drop_oldest();
        }
        Ok(())
    }

    /// Forget every text.
    pub fn clear(&self) {
        *self.lock() = Store::default();
    }

    /// Tokens held, in all.
    pub fn n_tokens(&self) -> usize {
        self.lock().tokens.len()
    }

    /// Texts held.
    pub fn n_documents(&self) -> usize {
        self.lock().texts.len()
    }

    /// The earlier occurrence of the history's end with the longest agreeing
    /// context (at least its last two tokens, at most [`MAX_CONTEXT`]), the
    /// most recent among equals, of the [`MAX_CANDIDATES`] most recent that
    /// follow its last two tokens: the context's length and up to `n_draft`
    /// tokens of the text that followed it.
    pub fn lookup(&self, history: &[i32], n_draft: usize) -> Option<(usize, Vec<i32>)> {
        let [.., before, last] = *history else {
            return None;
        };
        let store = self.lock();
        let mut at = *store.latest.get(&(before, last))?;
        let mut best: Option<(usize, u64)> = None;
        for _ in 0..MAX_CANDIDATES {
            let context = store.agreement(at, history);
            if best.is_none_or(|(longest, _)| context > longest) {
                best = Some((context, at));
                if context >= MAX_CONTEXT {
                    break;
                }
            }
            match store.earlier[store.index(at)] {
                0 => break,
                back if at - u64::from(back) < store.first => break,
                back => at -= u64::from(back),
            }
        }
        let (context, from) = best?;
        let to = store.text_of(from).1.min(from + n_draft as u64);
        Some((
            context,
            (from..to).map(|at| store.tokens[store.index(at)]).collect(),
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        // The lock guards plain data updated whole; a panic elsewhere leaves it consistent.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store {
    fn push(&mut self, text: &[i32]) {
        let start = self.first + self.tokens.len() as u64;
        self.tokens.extend(text);
        for offset in 0..text.len() {
            let at = start + offset as u64;
            let back = if (2..text.len()).contains(&offset) {
                let previous = self.latest.insert((text[offset - 2], text[offset - 1]), at);
                previous.map_or(0, |earlier| u32::try_from(at - earlier).unwrap_or(0))
            } else {
                0
            };
            self.earlier.push_back(back);
        }
        self.texts.push_back((start, start + text.len() as u64));
    }

    /// Drop the oldest text, and the keys whose latest position it held.
    fn drop_oldest(&mut self) {
        let Some((start, end)) = self.texts.pop_front() else {
            return;
        };
        for at in start + 2..end {
            let key = (
                self.tokens[self.index(at - 2)],
                self.tokens[self.index(at - 1)],
            );
            if self.latest.get(&key) == Some(&at) {
                self.latest.remove(&key);
            }
        }
        let dropped = (end - start) as usize;
        self.tokens.drain(..dropped);
        self.earlier.drain(..dropped);
        self.first = end;
    }

    fn index(&self, at: u64) -> usize {
        (at - self.first) as usize
    }

    /// The `[start, end)` of the held text that holds position `at`.
    fn text_of(&self, at: u64) -> (u64, u64) {
        self.texts[self.texts.partition_point(|&(_, end)| end <= at)]
    }

    /// How many tokens before position `at`, within its text, agree with the
    /// history's last ones (at most [`MAX_CONTEXT`]).
    fn agreement(&self, at: u64, history: &[i32]) -> usize {
        let within = (at - self.text_of(at).0) as usize;
        agreement_before(
            &self.tokens,
            self.index(at),
            history,
            history.len(),
            MAX_CONTEXT.min(within),
        )
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
        assert_eq!((corpus.n_documents(), corpus.n_tokens()), (2, 4));
        corpus.add(&[7, 8, 9, 10, 11, 12]).unwrap();
        assert_eq!((corpus.n_documents(), corpus.n_tokens()), (1, 5));
        assert_eq!(corpus.lookup(&[8, 9], 9), Some((2, vec![10, 11, 12])));
        assert_eq!(corpus.lookup(&[7, 8], 9), None); // the text's first tokens were beyond the budget
        corpus.add(&[]).unwrap();
        assert_eq!(corpus.n_documents(), 1);
        corpus.clear();
        assert_eq!((corpus.n_documents(), corpus.n_tokens()), (0, 0));
        assert_eq!(corpus.lookup(&[8, 9], 9), None);
    }

    #[test]
    fn the_latest_occurrence_of_a_key_survives_older_texts_going() {
        let corpus = LookupCorpus::new(8).unwrap();
        corpus.add(&[1, 2, 3, 1, 2, 4]).unwrap();
        corpus.add(&[1, 2, 5]).unwrap(); // the first text goes; `1 2` still leads to 5
        assert_eq!(corpus.lookup(&[0, 1, 2], 4), Some((2, vec![5])));
        corpus.add(&[9, 9, 9, 9, 9]).unwrap();
        assert_eq!(corpus.lookup(&[0, 1, 2], 4), Some((2, vec![5])));
        corpus.add(&[9]).unwrap(); // now it goes too, and its key with it
        assert_eq!(corpus.lookup(&[0, 1, 2], 4), None);
        assert_eq!(corpus.lookup(&[9, 9, 9, 9, 9], 2), Some((4, vec![9])));
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
