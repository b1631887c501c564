//! An owned `llama_batch` of token rows for one sequence per row.

use std::sync::atomic::{AtomicU64, Ordering};

use llama_cpp_sys_4 as sys;

use super::{NativeError, NativeResult};
use crate::limits::MAX_BATCH_ROWS;

/// Stamps of batch contents: never reused in a process, unlike addresses.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

fn next_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Ordering::Relaxed)
}

/// A token batch with a fixed row capacity (`llama_batch_init`/`llama_batch_free`).
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
    /// The stamp of the current rows (see [`Batch::stamp`]).
    stamp: u64,
}

impl Batch {
    /// A batch holding at most `capacity` token rows (1 ..= [`MAX_BATCH_ROWS`]).
    pub fn new(capacity: usize) -> NativeResult<Self> {
        let n_tokens = i32::try_from(capacity)
            .ok()
            .filter(|n| *n > 0 && capacity <= MAX_BATCH_ROWS)
            .ok_or_else(|| {
                NativeError::InvalidArgument(format!(
                    "capacity must be between 1 and {MAX_BATCH_ROWS}, not {capacity}"
                ))
            })?;
        // SAFETY: `n_tokens > 0`, no embeddings, one sequence id per row; the
        // returned arrays are owned by this value and freed in `Drop`.
        let raw = unsafe { sys::llama_batch_init(n_tokens, 0, 1) };
        if raw.token.is_null() || raw.pos.is_null() || raw.seq_id.is_null() || raw.logits.is_null()
        {
            return Err(NativeError::InvalidArgument(
                "llama_batch_init failed to allocate".into(),
            ));
        }
        Ok(Self {
            raw,
            capacity,
            stamp: next_stamp(),
        })
    }

    /// A process-wide unique stamp of the batch's rows, renewed on every
    /// change: a decoded batch can be told from a refilled one, or from a new
    /// batch at the same address after the old one was freed.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Remove every row.
    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
        self.stamp = next_stamp();
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.raw.n_tokens == 0
    }

    /// The row capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Append `token` at `pos` of sequence `seq_id`; `logits` requests its output row.
    pub fn push(&mut self, token: i32, pos: i32, seq_id: i32, logits: bool) -> NativeResult<()> {
        let row = self.len();
        if row >= self.capacity {
            return Err(NativeError::InvalidArgument(format!(
                "batch is full ({} rows)",
                self.capacity
            )));
        }
        // SAFETY: `row < capacity`, the number of rows `llama_batch_init`
        // allocated in every per-row array, and `seq_id[row]` points at an
        // array of one sequence id (n_seq_max = 1).
        unsafe {
            *self.raw.token.add(row) = token;
            *self.raw.pos.add(row) = pos;
            *self.raw.n_seq_id.add(row) = 1;
            *(*self.raw.seq_id.add(row)) = seq_id;
            *self.raw.logits.add(row) = i8::from(logits);
        }
        self.raw.n_tokens += 1;
        self.stamp = next_stamp();
        Ok(())
    }

    /// Replace the rows with `tokens` at positions `start_pos..` of `seq_id`,
    /// keeping logits for the last row, or for every row with `all_logits`.
    pub fn fill(
        &mut self,
        tokens: &[i32],
        start_pos: i32,
        seq_id: i32,
        all_logits: bool,
    ) -> NativeResult<()> {
        if tokens.len() > self.capacity {
            return Err(NativeError::InvalidArgument(format!(
                "{} tokens exceed the context's n_batch of {}; decode them in chunks",
                tokens.len(),
                self.capacity
            )));
        }
        self.clear();
        for (offset, &token) in tokens.iter().enumerate() {
            let pos = i32::try_from(offset)
                .ok()
                .and_then(|offset| start_pos.checked_add(offset))
                .ok_or_else(|| {
                    NativeError::InvalidArgument("token position overflows i32".into())
                })?;
            self.push(token, pos, seq_id, all_logits || offset + 1 == tokens.len())?;
        }
        Ok(())
    }

    /// The raw batch, for `llama_decode` and `mtp_session_process`.
    pub(crate) fn raw(&self) -> &sys::llama_batch {
        &self.raw
    }
}

// SAFETY: the batch owns its arrays outright; nothing else points into them.
unsafe impl Send for Batch {}
// SAFETY: `&Batch` only reads the arrays (mutation needs `&mut Batch`).
unsafe impl Sync for Batch {}

impl Drop for Batch {
    fn drop(&mut self) {
        // `llama_batch_free` frees by the pointers; it must see the full batch.
        // SAFETY: `raw` came from `llama_batch_init` and is freed exactly once.
        unsafe { sys::llama_batch_free(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_renews_the_stamp_and_no_two_batches_share_one() {
        let (mut batch, other) = (Batch::new(4).unwrap(), Batch::new(4).unwrap());
        assert_ne!(batch.stamp(), other.stamp());
        let mut seen = vec![batch.stamp(), other.stamp()];
        batch.push(1, 0, 0, true).unwrap();
        seen.push(batch.stamp());
        batch.fill(&[1, 2], 0, 0, false).unwrap();
        seen.push(batch.stamp());
        batch.clear();
        seen.push(batch.stamp());
        let count = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), count);
    }
}
