//! What a generation is configured with, and the one rule for each setting.
//!
//! Every path that builds a setting (the Python constructor, a checkpoint's
//! metadata, the CLI through the constructor) goes through the validating
//! constructors here: [`Mode::parse`], [`NgramConfig::validate`],
//! [`GeneratorConfig::validate`] and [`RuntimeOptions::validate`]. The
//! bounds and the rules over bare numbers that the native layer shares
//! (`check_threads`, `resolve_n_ctx`, `SettingError`) are in the leaf
//! [`crate::limits`].

use crate::limits::{
    check_threads, resolve_n_ctx, SettingError, MAX_BATCH_ROWS, MAX_GRAMMAR_BYTES,
};
use crate::speculative::MAX_SPECULATIVE_DRAFT_TOKENS;

fn refuse(field: &'static str, reason: String) -> Result<(), SettingError> {
    Err(SettingError { field, reason })
}

/// How tokens are chosen. `temperature == 0` is greedy decoding.
///
/// The chain, in llama.cpp's order (`crate::sampling`): logit bias,
/// repetition penalties, the grammar, then (sampling only) top-k, typical,
/// top-p, min-p and temperature. Greedy decoding takes the argmax after bias,
/// penalties and grammar.
/// Each neutral default and each bound is written once, here.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 chooses greedily.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p` (1: all).
    pub top_p: f32,
    /// Keep the tokens at least `min_p` times as likely as the most likely one (0: all).
    pub min_p: f32,
    /// Locally typical sampling's mass (1: off).
    pub typical_p: f32,
    /// Repetition penalty over the last `repeat_last_n` tokens (1: off).
    pub repeat_penalty: f32,
    /// Tokens of the history the penalties count (0: none, -1: the whole history).
    pub repeat_last_n: i32,
    /// Subtracted from the logit of every token present in the window (0: off).
    pub presence_penalty: f32,
    /// Subtracted once per occurrence in the window (0: off).
    pub frequency_penalty: f32,
    /// `(token, bias)` added to the logits, by ascending distinct token.
    pub logit_bias: Vec<(i32, f32)>,
    /// A GBNF grammar (start rule `root`) every reply follows: what is
    /// generated after each prompt or new turn (`None`: no grammar; never empty).
    pub grammar: Option<String>,
    /// Seed of the RNG.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl SamplingParams {
    /// The defaults: greedy, every other sampler neutral (llama.cpp's
    /// `repeat_last_n` of 64, which counts nothing while the penalties are neutral).
    pub const DEFAULT: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        typical_p: 1.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        logit_bias: Vec::new(),
        grammar: None,
        seed: 0,
    };
}

/// Check that `value` is finite and within `low..=high` (above `low` when
/// `open_low`): the message names `field` and the range.
fn check_range(
    field: &'static str,
    value: f32,
    low: f32,
    high: f32,
    open_low: bool,
) -> Result<(), SettingError> {
    let above = if open_low { value > low } else { value >= low };
    if value.is_finite() && above && value <= high {
        return Ok(());
    }
    let open = if open_low { "(" } else { "[" };
    refuse(
        field,
        format!("must be in {open}{low}, {high}], not {value}"),
    )
}

impl SamplingParams {
    /// The most entries a logit bias may have.
    pub const MAX_LOGIT_BIAS: usize = 1 << 18;
    /// The largest magnitude of a logit bias.
    pub const MAX_ABS_LOGIT_BIAS: f32 = 1.0e4;
    /// The largest repetition penalty.
    pub const MAX_REPEAT_PENALTY: f32 = 100.0;
    /// The largest magnitude of the presence and frequency penalties.
    pub const MAX_ABS_PENALTY: f32 = 100.0;

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether the repetition penalties change any logit.
    pub fn penalizes(&self) -> bool {
        self.repeat_last_n != 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// The history's tokens the penalties count: its last `repeat_last_n`
    /// (all for -1; none when the penalties are off).
    pub fn penalty_window<'a>(&self, history: &'a [i32]) -> &'a [i32] {
        if !self.penalizes() {
            return &[];
        }
        match usize::try_from(self.repeat_last_n) {
            Ok(n) => &history[history.len().saturating_sub(n)..],
            Err(_) => history,
        }
    }

    /// Check the parameters; the message names the bad one.
    pub fn validate(&self) -> Result<(), SettingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return refuse(
                "temperature",
                format!("must be finite and >= 0, not {}", self.temperature),
            );
        }
        check_range("top_p", self.top_p, 0.0, 1.0, true)?;
        check_range("min_p", self.min_p, 0.0, 1.0, false)?;
        check_range("typical_p", self.typical_p, 0.0, 1.0, true)?;
        let most = Self::MAX_REPEAT_PENALTY;
        check_range("repeat_penalty", self.repeat_penalty, 0.0, most, true)?;
        let most = Self::MAX_ABS_PENALTY;
        check_range(
            "presence_penalty",
            self.presence_penalty,
            -most,
            most,
            false,
        )?;
        check_range(
            "frequency_penalty",
            self.frequency_penalty,
            -most,
            most,
            false,
        )?;
        if self.repeat_last_n < -1 {
            return refuse(
                "repeat_last_n",
                format!(
                    "must be -1 (the whole history), 0 (off) or positive, not {}",
                    self.repeat_last_n
                ),
            );
        }
        self.validate_logit_bias()?;
        self.validate_grammar()
    }

    /// The grammar's text: not empty (no grammar is `None`), bounded, no NUL.
    /// Whether it parses is checked against the vocabulary it is compiled for.
    fn validate_grammar(&self) -> Result<(), SettingError> {
        let Some(text) = &self.grammar else {
            return Ok(());
        };
        let most = MAX_GRAMMAR_BYTES;
        if text.trim().is_empty() {
            return refuse("grammar", "is empty (give None for no grammar)".into());
        }
        if text.len() > most {
            return refuse(
                "grammar",
                format!("is {} bytes, more than {most}", text.len()),
            );
        }
        if text.contains('\0') {
            return refuse("grammar", "contains a NUL character".into());
        }
        Ok(())
    }

    fn validate_logit_bias(&self) -> Result<(), SettingError> {
        let bias = &self.logit_bias;
        if bias.len() > Self::MAX_LOGIT_BIAS {
            return refuse(
                "logit_bias",
                format!(
                    "has {} entries, more than {}",
                    bias.len(),
                    Self::MAX_LOGIT_BIAS
                ),
            );
        }
        let most = Self::MAX_ABS_LOGIT_BIAS;
        for (index, &(token, value)) in bias.iter().enumerate() {
            if token < 0 || (index > 0 && bias[index - 1].0 >= token) {
                return refuse(
                    "logit_bias",
                    format!(
                        "tokens must be distinct, ascending and >= 0; not {token} at entry {index}"
                    ),
                );
            }
            if !value.is_finite() || value.abs() > most {
                return refuse(
                    "logit_bias",
                    format!("the bias of token {token} must be in [-{most}, {most}], not {value}"),
                );
            }
        }
        Ok(())
    }

    /// Check the logit bias's tokens against a vocabulary of `n_vocab` tokens.
    pub fn check_vocabulary(&self, n_vocab: usize) -> Result<(), SettingError> {
        match self.logit_bias.last() {
            Some(&(token, _)) if token as usize >= n_vocab => refuse(
                "logit_bias",
                format!("token {token} is not in the model's vocabulary of {n_vocab} tokens"),
            ),
            _ => Ok(()),
        }
    }
}

/// Longest and shortest n-gram looked up by prompt-lookup drafting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Longest suffix matched. Kept in checkpoints and settings; prompt
    /// lookup copies the occurrence whose context agrees longest (up to
    /// [`crate::engine::agreement::MAX_CONTEXT`] tokens), which does not depend on it.
    pub n_max: usize,
    /// Shortest suffix matched (and the least context before a token the
    /// history replaced, with [`crate::engine::ngram::RESYNC_CONTEXT`]).
    pub n_min: usize,
}

impl NgramConfig {
    /// The longest n-gram that may be looked up.
    pub const MAX_N: usize = 64;

    /// `1 <= n_min <= n_max <= 64`: the one rule for n-gram settings.
    pub fn validate(&self) -> Result<(), SettingError> {
        if self.n_min >= 1 && self.n_min <= self.n_max && self.n_max <= Self::MAX_N {
            return Ok(());
        }
        refuse(
            "ngram",
            format!(
                "sizes must satisfy 1 <= ngram_min <= ngram_max <= {}, not ngram_min={} ngram_max={}",
                Self::MAX_N,
                self.n_min,
                self.n_max
            ),
        )
    }
}

impl NgramConfig {
    /// The defaults: suffixes of 4 tokens, then of 3.
    pub const DEFAULT: Self = Self { n_max: 4, n_min: 3 };
}

impl Default for NgramConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The five ways of drafting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Plain decoding: no drafts.
    None,
    /// Prompt lookup over the history.
    Ngram(NgramConfig),
    /// A separate draft model with the same vocabulary.
    Draft,
    /// The target's own multi-token-prediction head.
    Mtp,
    /// A separate EAGLE-3 draft model.
    Eagle3,
}

impl Mode {
    /// The names of the modes, in the order users read them.
    pub const NAMES: [&'static str; 5] = ["none", "ngram", "draft", "mtp", "eagle3"];

    /// The mode called `name`; `ngram` is used (and validated) by `ngram` mode only.
    pub fn parse(name: &str, ngram: NgramConfig) -> Result<Self, SettingError> {
        let mode = match name {
            "none" => Self::None,
            "ngram" => Self::Ngram(ngram),
            "draft" => Self::Draft,
            "mtp" => Self::Mtp,
            "eagle3" => Self::Eagle3,
            other => {
                return Err(SettingError {
                    field: "mode",
                    reason: format!("must be one of {}; not {other:?}", Self::NAMES.join(", ")),
                })
            }
        };
        if let Self::Ngram(config) = mode {
            config.validate()?;
        }
        Ok(mode)
    }

    /// The mode's name: `none`, `ngram`, `draft`, `mtp`, `eagle3`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ngram(_) => "ngram",
            Self::Draft => "draft",
            Self::Mtp => "mtp",
            Self::Eagle3 => "eagle3",
        }
    }

    /// Whether the mode needs a separate draft model.
    pub fn needs_draft_model(&self) -> bool {
        matches!(self, Self::Draft | Self::Eagle3)
    }

    /// Whether the mode drafts at all.
    pub fn is_speculative(&self) -> bool {
        !matches!(self, Self::None)
    }
}

/// Everything that decides what a generation computes.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratorConfig {
    /// How drafts are made.
    pub mode: Mode,
    /// Most tokens drafted per round (ignored by `none`).
    pub n_draft: u32,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// Context length of the target (and draft) context (0, as given: the
    /// target model's trained length; see [`GeneratorConfig::resolve`]).
    pub n_ctx: u32,
    /// Rows per decode call (and per processed batch); as given it may exceed
    /// `n_ctx`, which [`GeneratorConfig::resolve`] clamps it to.
    pub n_batch: u32,
    /// Whether each round chooses its draft length (up to `n_draft`) from a
    /// measured cost curve and the recent acceptance (`engine::policy`);
    /// otherwise every round drafts up to `n_draft`.
    pub adaptive: bool,
}

impl GeneratorConfig {
    /// The generator's defaults, the one place each is written (with
    /// [`SamplingParams::DEFAULT`], [`NgramConfig::DEFAULT`] for `ngram` mode
    /// and [`RuntimeOptions::DEFAULT`]): no drafts (`none`), up to 8 drafted
    /// tokens per round, a 2048-token context, decodes of at most
    /// [`crate::limits::MAX_EXACT_ROWS`] rows (verifications of up to 16
    /// drafted tokens, prompts in exact chunks of
    /// [`crate::limits::EXACT_PROMPT_ROWS`]: a reply is the same whatever was
    /// cached or how it was chunked), the fixed draft policy (every round
    /// drafting up to `n_draft`, so that a generation's rounds and checkpoints
    /// are a function of its settings alone; `specstate serve` asks for the
    /// adaptive one). The Python constructor's signature and
    /// `_native.GENERATOR_DEFAULTS` read them here.
    pub const DEFAULT: Self = Self {
        mode: Mode::None,
        n_draft: 8,
        sampling: SamplingParams::DEFAULT,
        n_ctx: 2048,
        n_batch: crate::limits::MAX_EXACT_ROWS as u32,
        adaptive: false,
    };
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The names of the draft policies: `adaptive` off and on.
pub const DRAFT_POLICIES: [&str; 2] = ["fixed", "adaptive"];

/// The name of a draft policy: `adaptive` or `fixed`.
pub fn draft_policy_name(adaptive: bool) -> &'static str {
    DRAFT_POLICIES[usize::from(adaptive)]
}

/// Whether the draft policy called `name` is the adaptive one.
pub fn parse_draft_policy(name: &str) -> Result<bool, SettingError> {
    match name {
        "fixed" => Ok(false),
        "adaptive" => Ok(true),
        other => Err(SettingError {
            field: "draft_policy",
            reason: format!(
                "must be one of {}; not {other:?}",
                DRAFT_POLICIES.join(", ")
            ),
        }),
    }
}

impl GeneratorConfig {
    /// Whether every decode of the generation holds at most
    /// [`crate::limits::MAX_EXACT_ROWS`] rows (its prompt chunks, and its
    /// verify batches, which `n_batch` bounds), so that each row gets its
    /// single decode's bits and its memory's cells are the same however its
    /// tokens were batched: a prefix of them can serve another prompt exactly.
    pub fn decodes_exactly(&self) -> bool {
        self.n_batch as usize <= crate::limits::MAX_EXACT_ROWS
    }

    /// Check every setting that does not depend on a model: the one rule for
    /// the constructor, checkpoints and the CLI. `n_ctx` may be 0 (the
    /// model's trained length) and `n_batch` above `n_ctx` (clamped to it):
    /// [`GeneratorConfig::resolve`] settles both against the model.
    pub fn validate(&self) -> Result<(), SettingError> {
        if self.n_ctx != 0 {
            resolve_n_ctx(self.n_ctx, 0)?;
        }
        let most_rows = u32::try_from(MAX_BATCH_ROWS).unwrap_or(u32::MAX);
        if self.n_batch == 0 || self.n_batch > most_rows {
            return refuse(
                "n_batch",
                format!("must be between 1 and {most_rows}, not {}", self.n_batch),
            );
        }
        self.validate_n_draft()?;
        if self.adaptive && !self.mode.is_speculative() {
            return refuse(
                "draft_policy",
                "'adaptive' chooses draft lengths: it needs a speculative mode, not 'none'".into(),
            );
        }
        if let Mode::Ngram(ngram) = self.mode {
            ngram.validate()?;
        }
        self.sampling.validate()
    }

    /// The configuration a generator over a target trained on `n_ctx_train`
    /// tokens runs, checked: `n_ctx` 0 becomes that length
    /// ([`resolve_n_ctx`]), and `n_batch` is at most `n_ctx` (a larger one is
    /// clamped, as llama.cpp clamps its own). What a checkpoint records.
    pub fn resolve(mut self, n_ctx_train: u32) -> Result<Self, SettingError> {
        self.n_ctx = resolve_n_ctx(self.n_ctx, n_ctx_train)?;
        self.n_batch = self.n_batch.min(self.n_ctx);
        self.validate()?;
        Ok(self)
    }

    /// Check that the configuration is one [`GeneratorConfig::resolve`]
    /// returns (a checkpoint records only those): `n_ctx` not 0, `n_batch` at
    /// most `n_ctx`.
    pub fn check_resolved(&self) -> Result<(), SettingError> {
        if self.n_ctx == 0 {
            return refuse(
                "n_ctx",
                "is 0: a generator's configuration holds the resolved context length".into(),
            );
        }
        if self.n_batch > self.n_ctx {
            return refuse(
                "n_batch",
                format!(
                    "must be at most n_ctx ({}) in a generator's configuration (a larger one is clamped to it), not {}",
                    self.n_ctx, self.n_batch
                ),
            );
        }
        Ok(())
    }

    fn validate_n_draft(&self) -> Result<(), SettingError> {
        let most = MAX_SPECULATIVE_DRAFT_TOKENS as u32;
        if self.n_draft > most {
            return refuse(
                "n_draft",
                format!("must be at most {most}, not {}", self.n_draft),
            );
        }
        // The rows a generator runs: n_batch, clamped to a given n_ctx.
        let n_batch = match self.n_ctx {
            0 => self.n_batch,
            n_ctx => self.n_batch.min(n_ctx),
        };
        if self.mode.is_speculative() && (self.n_draft == 0 || self.n_draft >= n_batch) {
            return refuse(
                "n_draft",
                format!(
                    "must be between 1 and n_batch - 1 ({}), not {}",
                    n_batch - 1,
                    self.n_draft
                ),
            );
        }
        Ok(())
    }
}

/// Runtime choices, not part of what is computed: threads, and whether the
/// grammar drafts (the reply is the same either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Threads per context (0: the default thread count, `native::default_threads`).
    pub n_threads: i32,
    /// Whether rounds under a grammar draft the tokens it forces
    /// (`crate::engine::grammar_drafts`).
    pub grammar_drafts: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl RuntimeOptions {
    /// The default: 0, the default thread count (docs/threads.md), and grammar drafts on.
    pub const DEFAULT: Self = Self {
        n_threads: 0,
        grammar_drafts: true,
    };

    /// Check the thread count ([`check_threads`]).
    pub fn validate(&self) -> Result<(), SettingError> {
        check_threads(self.n_threads.into()).map(drop)
    }
}

#[cfg(test)]
mod tests;
