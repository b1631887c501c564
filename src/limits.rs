//! The bounds of the core and the rules over bare numbers (thread counts,
//! context lengths, rows, sequences, grammar sizes), in one leaf module: it
//! imports nothing of the crate, so the native layer and the settings read
//! them here without importing each other. (The speculative-session contract's own bounds,
//! `MAX_SPECULATIVE_*`, stay in [`crate::speculative`], itself a leaf but for
//! the message tables.)

/// A setting outside its range: the setting's name and why (the error of
/// every rule here and in [`crate::settings`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct SettingError {
    /// The setting (`n_ctx`, `n_batch`, `n_draft`, `temperature`, ...).
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

/// The most threads a context may use: ggml's `GGML_MAX_N_THREADS`. Beyond
/// it ggml's thread pool aborts the process instead of failing.
pub const MAX_THREADS: i32 = 512;

/// The one rule for a thread count, wherever one comes from (a context, a
/// generator, a restore, a checkpoint's record, the command line): 0 (the
/// default thread count, `native::threads`) to [`MAX_THREADS`]. The count, narrowed to `i32`.
pub fn check_threads(n_threads: i64) -> Result<i32, SettingError> {
    match i32::try_from(n_threads) {
        Ok(n) if (0..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(SettingError {
            field: "n_threads",
            reason: format!(
                "must be between 0 (the default thread count) and {MAX_THREADS}, not {n_threads}"
            ),
        }),
    }
}

/// The one rule for a context length: `n_ctx` 0 means the model's trained
/// length `n_ctx_train` (llama.cpp's and llama-cpp-python's meaning);
/// otherwise from 2 to that length (to any length when the model records
/// none, `n_ctx_train` 0, or when no model is known yet). The resolved length.
pub fn resolve_n_ctx(n_ctx: u32, n_ctx_train: u32) -> Result<u32, SettingError> {
    let resolved = if n_ctx == 0 { n_ctx_train } else { n_ctx };
    if resolved >= 2 && (n_ctx_train == 0 || resolved <= n_ctx_train) {
        return Ok(resolved);
    }
    let reason = match (n_ctx, n_ctx_train) {
        (0, 0) => "is 0, the model's trained context length, which this model does not record: \
                   give a length of at least 2"
            .to_owned(),
        (_, 0) => format!("must be 0 (the model's trained context length) or at least 2, not {n_ctx}"),
        (_, trained) => format!(
            "must be between 2 and the model's trained context length {trained} (0: that length), not {n_ctx}"
        ),
    };
    Err(SettingError {
        field: "n_ctx",
        reason,
    })
}

/// The most rows a batch may hold (and a context's `n_batch` and `n_ubatch`,
/// and a generator's `n_batch`). `llama_batch_init` allocates every per-row
/// array up front (about 40 bytes a row) and does not check its allocations,
/// so the capacity is bounded before it is called.
pub const MAX_BATCH_ROWS: usize = 1 << 20;

/// The most sequences a context may hold: llama.cpp's `LLAMA_MAX_SEQ`.
pub const MAX_SEQUENCES: u32 = 256;

/// The most rows one decode of a batched step holds ([`crate::batch_engine`]): patch 0001's
/// `GGML_CPU_EXACT_MAX_ROWS`, up to which every row of a decode gets its single decode's bits.
/// A step whose rows are more is decoded in several decodes of at most this many.
pub const MAX_EXACT_ROWS: usize = 17;

/// Prompt chunk rows that keep a prompt's memory exact: every row of a chunk
/// of at most [`MAX_EXACT_ROWS`] gets its single decode's bits, so the cells
/// of a prompt decoded in such chunks are the same whatever the chunks were,
/// a prefix kept from an earlier generation included. The largest multiple
/// of patch 0003's four-row kernel within [`MAX_EXACT_ROWS`]: 17 rows would
/// leave a lone column, decoded on its own (docs/measured.md, "Exact prompt
/// chunks").
pub const EXACT_PROMPT_ROWS: usize = 16;

/// The rows of one prompt chunk decoded through a batch of `capacity` rows:
/// [`EXACT_PROMPT_ROWS`] for a batch of [`MAX_EXACT_ROWS`] (every row is exact
/// either way, and a seventeenth row would be a lone column), else the whole
/// batch.
pub fn prompt_chunk_rows(capacity: usize) -> usize {
    if capacity == MAX_EXACT_ROWS {
        EXACT_PROMPT_ROWS
    } else {
        capacity
    }
}

/// llama.cpp's default rows per compute pass: a native `Context`'s default
/// `n_batch` and `n_ubatch`, and the most rows a restore allocates for when
/// the caller names no `max_n_batch`. Batches of more than
/// [`MAX_EXACT_ROWS`] rows take ggml's big-batch kernels, whose rows do not
/// get their single decode's bits.
pub const LLAMA_N_BATCH: u32 = 512;

/// An embedder's context length unless one is given: llama-cpp-python's
/// default `n_ctx` (and `n_batch`, its longest embedding input).
pub const EMBEDDING_N_CTX: u32 = 512;

/// The longest grammar accepted, from a caller or a file (bytes); also the
/// longest JSON schema converted into one (`native::json_schema_to_grammar`).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_the_most_exact_rows_takes_prompts_in_exact_chunks() {
        assert_eq!(prompt_chunk_rows(MAX_EXACT_ROWS), EXACT_PROMPT_ROWS);
        assert_eq!(prompt_chunk_rows(9), 9);
        assert_eq!(prompt_chunk_rows(LLAMA_N_BATCH as usize), 512);
    }

    #[test]
    fn thread_counts_are_bounded_with_one_message() {
        assert_eq!(check_threads(0), Ok(0));
        assert_eq!(check_threads(MAX_THREADS.into()), Ok(MAX_THREADS));
        assert_eq!(check_threads(-1).unwrap_err().field, "n_threads");
        assert_eq!(
            check_threads(1 << 40).unwrap_err().to_string(),
            "n_threads must be between 0 (the default thread count) and 512, not 1099511627776"
        );
    }

    #[test]
    fn a_context_length_resolves_against_the_trained_one() {
        assert_eq!(resolve_n_ctx(0, 128), Ok(128));
        assert_eq!(resolve_n_ctx(64, 128), Ok(64));
        assert_eq!(resolve_n_ctx(4096, 0), Ok(4096));
        assert_eq!(
            resolve_n_ctx(1, 0).unwrap_err().to_string(),
            "n_ctx must be 0 (the model's trained context length) or at least 2, not 1"
        );
        assert_eq!(resolve_n_ctx(129, 128).unwrap_err().field, "n_ctx");
    }
}
