//! An embedding context: a llama.cpp context with `embeddings = true` over a
//! [`Model`], which embeds one token sequence at a time.
//!
//! Each input is decoded alone, from an empty memory, in one batch of at
//! most `n_ctx` rows (llama.cpp pools a sequence per compute pass, so the
//! whole input must fit one: `n_batch = n_ubatch = n_ctx`). Its result is
//! read with `llama_get_embeddings_seq` for a pooled embedding (mean, CLS,
//! last) and `llama_get_embeddings_ith` row by row for pooling `none` (one
//! vector per token). Every input of a call is checked before anything is
//! decoded, so a refused call leaves nothing changed.

use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_4 as sys;

use super::context::fit_threads;
use super::pool::GraphPool;
use super::threads::resolved;
use super::{Batch, Model, NativeError, NativeResult, OutOfVocabulary};
use crate::limits::{check_threads, resolve_n_ctx, SettingError, MAX_BATCH_ROWS};

/// The most inputs one call embeds (OpenAI's bound per embeddings request).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The most floats one call returns (256 MiB of `f32`): pooling `none` gives
/// `n_embd` floats per input token.
pub const MAX_EMBEDDING_FLOATS: usize = 1 << 26;

/// How the rows of an input are pooled into its embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// No pooling: one vector per token.
    None,
    /// The mean of the tokens' vectors.
    Mean,
    /// The first token's vector (BERT's CLS).
    Cls,
    /// The last token's vector.
    Last,
}

impl Pooling {
    /// The names [`Pooling::parse`] accepts, in llama.cpp's order.
    pub const NAMES: [&'static str; 4] = ["none", "mean", "cls", "last"];

    /// The pooling called `name` (one of [`Pooling::NAMES`]).
    pub fn parse(name: &str) -> Result<Self, SettingError> {
        match name {
            "none" => Ok(Self::None),
            "mean" => Ok(Self::Mean),
            "cls" => Ok(Self::Cls),
            "last" => Ok(Self::Last),
            other => Err(SettingError {
                field: "pooling",
                reason: format!(
                    "must be None (the model's own), 'none', 'mean', 'cls' or 'last', not {other:?}"
                ),
            }),
        }
    }

    /// `none`, `mean`, `cls` or `last`.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    fn raw(self) -> sys::llama_pooling_type {
        match self {
            Self::None => sys::LLAMA_POOLING_TYPE_NONE,
            Self::Mean => sys::LLAMA_POOLING_TYPE_MEAN,
            Self::Cls => sys::LLAMA_POOLING_TYPE_CLS,
            Self::Last => sys::LLAMA_POOLING_TYPE_LAST,
        }
    }

    fn from_raw(raw: sys::llama_pooling_type) -> Option<Self> {
        match raw {
            sys::LLAMA_POOLING_TYPE_NONE => Some(Self::None),
            sys::LLAMA_POOLING_TYPE_MEAN => Some(Self::Mean),
            sys::LLAMA_POOLING_TYPE_CLS => Some(Self::Cls),
            sys::LLAMA_POOLING_TYPE_LAST => Some(Self::Last),
            _ => None,
        }
    }
}

/// Parameters of an [`Embedder`]; every one is given (the native layer holds
/// no defaults).
#[derive(Clone, Copy, Debug)]
pub struct EmbedderParams {
    /// Context length in tokens, the longest input (0: the model's training length).
    pub n_ctx: u32,
    /// The pooling, or `None` for the model's own (`<arch>.pooling_type`;
    /// `none` when the model records none, as for generative models).
    pub pooling: Option<Pooling>,
    /// Threads for decoding (0: the default thread count).
    pub n_threads: i32,
}

/// An input an [`Embedder`] refuses, before anything is decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddingInputError {
    /// An input without tokens.
    #[error("input {index} is empty: there is nothing to embed")]
    Empty {
        /// The input's position in the call.
        index: usize,
    },
    /// An input longer than the context (llama-cpp-python's words, which code matches).
    #[error("Requested tokens ({tokens}) exceed context window of {n_ctx} (input {index})")]
    ExceedsContext {
        /// The input's position in the call.
        index: usize,
        /// Its tokens.
        tokens: usize,
        /// The context length.
        n_ctx: u32,
    },
    /// A token outside the vocabulary.
    #[error("input {index}: {error}")]
    Vocabulary {
        /// The input's position in the call.
        index: usize,
        /// The token refused.
        error: OutOfVocabulary,
    },
    /// More inputs than one call embeds.
    #[error("{count} inputs exceed the {maximum} that one call embeds")]
    TooManyInputs {
        /// Inputs given.
        count: usize,
        /// [`MAX_EMBEDDING_INPUTS`].
        maximum: usize,
    },
    /// More floats than one call returns.
    #[error("the embeddings of these inputs are {values} floats, over the {maximum} that one call returns")]
    TooManyValues {
        /// Floats the call would return.
        values: usize,
        /// [`MAX_EMBEDDING_FLOATS`].
        maximum: usize,
    },
}

impl From<EmbeddingInputError> for NativeError {
    fn from(error: EmbeddingInputError) -> Self {
        Self::InvalidArgument(error.to_string())
    }
}

/// The embedding of one input.
#[derive(Clone, Debug, PartialEq)]
pub enum Embedding {
    /// One vector for the whole input (pooling mean, cls or last).
    Pooled(Vec<f32>),
    /// One vector per input token, in order (pooling none).
    PerToken(Vec<Vec<f32>>),
}

/// A llama.cpp context that computes embeddings, used by one thread at a time.
pub struct Embedder {
    raw: NonNull<sys::llama_context>,
    /// The model the context runs, freed after it (a field after `raw`'s owner, `Drop`).
    model: Arc<Model>,
    /// The rows of one input.
    batch: Batch,
    n_ctx: u32,
    n_embd: usize,
    pooling: Pooling,
    /// Encoder-only models (BERT) run `llama_encode`; the others `llama_decode`.
    encoder: bool,
    /// The threads its graphs may use (resolved, never 0), as many of them as the machine gives ([`threads_now`]).
    n_threads: i32,
    /// The threads its graphs run on, freed after the context (a field; `Drop` frees the context).
    pool: Option<GraphPool>,
}

// SAFETY: a llama.cpp context has no thread affinity; what it forbids is
// concurrent use, and every use of `raw` goes through `&mut self` (or `&self`
// for plain getters no `&mut` call can overlap).
unsafe impl Send for Embedder {}

/// Refuse, before llama.cpp sees them, parameters it would abort on or that
/// would allocate more than the model was made for; the context length,
/// resolved (0: the trained length), and the thread count (0: the default).
fn check_params(model: &Model, params: &EmbedderParams) -> NativeResult<(u32, i32)> {
    let setting = |e: SettingError| NativeError::InvalidArgument(e.to_string());
    let n_ctx = resolve_n_ctx(params.n_ctx, model.n_ctx_train()).map_err(setting)?;
    let max_rows = u32::try_from(MAX_BATCH_ROWS).unwrap_or(u32::MAX);
    if n_ctx > max_rows {
        return Err(NativeError::InvalidArgument(format!(
            "n_ctx of an embedder must be at most {max_rows} (it is also the rows of one batch), not {n_ctx}"
        )));
    }
    let threads = resolved(check_threads(params.n_threads.into()).map_err(setting)?);
    Ok((n_ctx, threads))
}

/// Whether the model runs `llama_encode` (encoder only); an encoder-decoder
/// model (T5) is refused, as llama.cpp's embedding example refuses it.
fn runs_encoder(model: &Model) -> NativeResult<bool> {
    // SAFETY: the model is live; plain getters.
    let (encoder, decoder) = unsafe {
        (
            sys::llama_model_has_encoder(model.raw()),
            sys::llama_model_has_decoder(model.raw()),
        )
    };
    if encoder && decoder {
        return Err(NativeError::ContextInit(format!(
            "model {} has both an encoder and a decoder: embeddings need one or the other",
            model.path().display()
        )));
    }
    Ok(encoder)
}

impl Embedder {
    /// An embedding context over `model`.
    pub fn new(model: Arc<Model>, params: EmbedderParams) -> NativeResult<Self> {
        let (n_ctx, threads) = check_params(&model, &params)?;
        let encoder = runs_encoder(&model)?;
        // SAFETY: the model is live; a plain getter.
        let n_embd = unsafe { sys::llama_model_n_embd_out(model.raw()) };
        let n_embd = usize::try_from(n_embd)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                NativeError::ContextInit(format!("the model's embedding width is {n_embd}"))
            })?;
        let batch = Batch::new(n_ctx as usize)?;
        // SAFETY: returns a plain struct of defaults.
        let mut raw_params = unsafe { sys::llama_context_default_params() };
        raw_params.n_ctx = n_ctx;
        raw_params.n_batch = n_ctx;
        raw_params.n_ubatch = n_ctx;
        raw_params.n_seq_max = 1;
        raw_params.n_threads = threads;
        raw_params.n_threads_batch = threads;
        raw_params.embeddings = true;
        raw_params.pooling_type = params
            .pooling
            .map_or(sys::LLAMA_POOLING_TYPE_UNSPECIFIED, Pooling::raw);
        raw_params.no_perf = true;
        // SAFETY: the model is live and kept alive by the `Arc` held below
        // (and in the returned value, which frees the context first).
        let raw = unsafe { sys::llama_init_from_model(model.raw(), raw_params) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            NativeError::ContextInit(format!(
                "llama.cpp refused an embedding context of {n_ctx} tokens for model {}",
                model.path().display()
            ))
        })?;
        // SAFETY: the context is live; `Drop` frees it before the pool (a field).
        let pool = unsafe { GraphPool::attached(threads, raw) };
        let mut embedder = Self {
            raw,
            model,
            batch,
            n_ctx,
            n_embd,
            pooling: Pooling::None,
            encoder,
            n_threads: threads,
            pool,
        };
        // SAFETY: the context is live; a plain getter.
        let resolved = unsafe { sys::llama_pooling_type(embedder.raw.as_ptr()) };
        embedder.pooling = Pooling::from_raw(resolved).ok_or_else(|| {
            NativeError::InvalidArgument(format!(
                "this model pools its embeddings with llama.cpp's pooling type {resolved} (4: rank, a \
                 reranker's score), which an embedder does not give; ask for pooling 'none', 'mean', \
                 'cls' or 'last'"
            ))
        })?;
        Ok(embedder)
    }

    /// The model this embedder runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The context length: the most tokens an input may have.
    pub fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// Floats in one embedding (`llama_model_n_embd_out`).
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// The pooling in effect (the model's own when none was asked for).
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The threads used for decoding (the resolved count, never 0).
    pub fn n_threads(&self) -> i32 {
        self.n_threads
    }

    /// Floats the embedding of an input of `tokens` tokens has.
    fn values_of(&self, tokens: usize) -> usize {
        match self.pooling {
            Pooling::None => tokens.saturating_mul(self.n_embd),
            Pooling::Mean | Pooling::Cls | Pooling::Last => self.n_embd,
        }
    }

    /// Refuse input `index` if it is empty, longer than the context, or has
    /// a token outside the vocabulary.
    pub fn check_input(&self, index: usize, tokens: &[i32]) -> Result<(), EmbeddingInputError> {
        if tokens.is_empty() {
            return Err(EmbeddingInputError::Empty { index });
        }
        if tokens.len() > self.n_ctx as usize {
            return Err(EmbeddingInputError::ExceedsContext {
                index,
                tokens: tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        self.model
            .check_tokens(tokens)
            .map_err(|error| EmbeddingInputError::Vocabulary { index, error })
    }

    /// Refuse a call of `inputs` (every one checked, and their count and
    /// total size bounded) before anything is decoded.
    pub fn check_inputs<T: AsRef<[i32]>>(&self, inputs: &[T]) -> Result<(), EmbeddingInputError> {
        if inputs.len() > MAX_EMBEDDING_INPUTS {
            return Err(EmbeddingInputError::TooManyInputs {
                count: inputs.len(),
                maximum: MAX_EMBEDDING_INPUTS,
            });
        }
        let mut values = 0_usize;
        for (index, tokens) in inputs.iter().enumerate() {
            self.check_input(index, tokens.as_ref())?;
            values = values.saturating_add(self.values_of(tokens.as_ref().len()));
        }
        if values > MAX_EMBEDDING_FLOATS {
            return Err(EmbeddingInputError::TooManyValues {
                values,
                maximum: MAX_EMBEDDING_FLOATS,
            });
        }
        Ok(())
    }

    /// The embedding of one token sequence. Runs llama.cpp's compute; call
    /// without the GIL.
    pub fn embed(&mut self, tokens: &[i32]) -> NativeResult<Embedding> {
        self.check_inputs(&[tokens])?;
        self.embed_checked(tokens)
    }

    /// The embeddings of `inputs`, in order, each computed alone (as
    /// [`Embedder::embed`] computes it); all are checked before any is decoded.
    pub fn embed_all<T: AsRef<[i32]>>(&mut self, inputs: &[T]) -> NativeResult<Vec<Embedding>> {
        self.check_inputs(inputs)?;
        inputs
            .iter()
            .map(|tokens| self.embed_checked(tokens.as_ref()))
            .collect()
    }

    /// Decode one checked input from an empty memory and read its embedding.
    fn embed_checked(&mut self, tokens: &[i32]) -> NativeResult<Embedding> {
        self.clear_memory();
        self.batch.fill(tokens, 0, 0, true)?;
        // SAFETY: the context is live and exclusively borrowed; the pool is its own.
        let _graph = unsafe { fit_threads(self.raw, self.n_threads, &mut self.pool) };
        let status = if self.encoder {
            // SAFETY: the context is live and exclusively borrowed; the batch
            // holds `tokens.len()` valid rows (<= n_batch = n_ubatch), each
            // an id checked against the vocabulary.
            unsafe { sys::llama_encode(self.raw.as_ptr(), *self.batch.raw()) }
        } else {
            // SAFETY: as for `llama_encode`; the memory was cleared, so the
            // input's rows fit the context's cells.
            unsafe { sys::llama_decode(self.raw.as_ptr(), *self.batch.raw()) }
        };
        let result = match status {
            0 => self.read(tokens.len()),
            status => Err(NativeError::Decode(status)),
        };
        self.clear_memory();
        result
    }

    /// The embedding of the last decoded input of `rows` tokens.
    fn read(&mut self, rows: usize) -> NativeResult<Embedding> {
        if self.pooling != Pooling::None {
            // SAFETY: the context is live; llama.cpp returns null when it
            // holds no pooled embedding of sequence 0.
            let pooled = unsafe { sys::llama_get_embeddings_seq(self.raw.as_ptr(), 0) };
            return self.copy(pooled, "sequence 0").map(Embedding::Pooled);
        }
        (0..rows)
            .map(|row| {
                let index = i32::try_from(row).unwrap_or(i32::MAX);
                // SAFETY: the context is live; llama.cpp checks `index` and
                // returns null for a row without output.
                let vector = unsafe { sys::llama_get_embeddings_ith(self.raw.as_ptr(), index) };
                self.copy(vector, &format!("row {row}"))
            })
            .collect::<NativeResult<_>>()
            .map(Embedding::PerToken)
    }

    /// The `n_embd` floats at `vector` (null: llama.cpp has none for `what`).
    fn copy(&self, vector: *const f32, what: &str) -> NativeResult<Vec<f32>> {
        if vector.is_null() {
            return Err(NativeError::InvalidArgument(format!(
                "llama.cpp holds no embedding of {what}"
            )));
        }
        // SAFETY: a non-null embedding of llama.cpp's has `n_embd_out`
        // floats and stays valid until the next decode, which needs
        // `&mut self`; it is copied at once.
        Ok(unsafe { std::slice::from_raw_parts(vector, self.n_embd) }.to_vec())
    }

    /// Clear the memory (KV cells and recurrent state) so that the next input
    /// starts from nothing.
    fn clear_memory(&mut self) {
        // SAFETY: the context is live and exclusively borrowed; llama.cpp
        // does nothing for a context without memory (an encoder's).
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.raw.as_ptr()), true) };
    }
}

impl Drop for Embedder {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `llama_init_from_model` and is freed once,
        // here; the model it runs is held by `self.model`, dropped after.
        unsafe { sys::llama_free(self.raw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poolings_parse_by_name_and_refuse_others() {
        for name in Pooling::NAMES {
            assert_eq!(Pooling::parse(name).map(Pooling::name), Ok(name));
        }
        let refused = Pooling::parse("rank").unwrap_err();
        assert_eq!(refused.field, "pooling");
        assert_eq!(
            refused.to_string(),
            "pooling must be None (the model's own), 'none', 'mean', 'cls' or 'last', not \"rank\""
        );
        assert_eq!(Pooling::from_raw(sys::LLAMA_POOLING_TYPE_RANK), None);
        assert_eq!(Pooling::from_raw(sys::LLAMA_POOLING_TYPE_UNSPECIFIED), None);
        for name in Pooling::NAMES {
            let pooling = Pooling::parse(name).unwrap();
            assert_eq!(Pooling::from_raw(pooling.raw()), Some(pooling));
        }
    }

    #[test]
    fn an_input_over_the_context_says_so_as_llama_cpp_python_does() {
        let error = EmbeddingInputError::ExceedsContext {
            index: 2,
            tokens: 600,
            n_ctx: 512,
        };
        assert_eq!(
            NativeError::from(error).to_string(),
            "Requested tokens (600) exceed context window of 512 (input 2)"
        );
    }
}
