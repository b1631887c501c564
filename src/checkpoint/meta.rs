//! The `meta` section: versions, model fingerprints, mode, configuration and
//! sampling, as JSON; and the comparisons of a checkpoint's meta with the
//! models and the configuration it is restored on. Plain data only.

use serde::{Deserialize, Serialize};

use super::format::{corrupt, CheckpointError};
use crate::chat::Conversation;
use crate::engine::{AdaptiveState, LogprobLog};
use crate::limits::check_threads;
use crate::native::info::{LLAMA_CPP_BUILD, LLAMA_CPP_COMMIT, LLAMA_CPP_SYS_VERSION};
use crate::sampling::TokenLogprobs;
use crate::settings::{draft_policy_name, GeneratorConfig, Mode};
use crate::settings::{NgramConfig, SamplingParams};

/// An exact fingerprint of a model file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFingerprint {
    /// SHA-256 of the file's bytes, hex.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
    /// File name when saved (informational).
    pub file: String,
}

impl std::fmt::Display for ModelFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The name comes from a file: shown with control characters escaped.
        let file: String = self.file.chars().take(256).collect();
        write!(
            f,
            "{} ({} bytes, sha256 {})",
            file.escape_debug(),
            self.size,
            self.sha256.escape_debug()
        )
    }
}

/// The `meta` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// specstate release that wrote it.
    pub specstate_version: String,
    /// Pinned llama-cpp-sys-4 release.
    pub llama_cpp_sys_version: String,
    /// llama.cpp build.
    pub llama_cpp_build: String,
    /// llama.cpp commit.
    pub llama_cpp_commit: String,
    /// `none`, `ngram`, `draft`, `mtp` or `eagle3`.
    pub mode: String,
    /// n-gram lengths (`ngram` mode).
    pub ngram: Option<[usize; 2]>,
    /// Most tokens drafted per round.
    pub n_draft: u32,
    /// Context length.
    pub n_ctx: u32,
    /// Rows per decode.
    pub n_batch: u32,
    /// Sampling temperature (0: greedy).
    pub temperature: f32,
    /// Top-k (0: off).
    pub top_k: u32,
    /// Top-p (1: off).
    pub top_p: f32,
    /// RNG seed.
    pub seed: u64,
    /// The target model.
    pub target_model: ModelFingerprint,
    /// The draft model (`draft` and `eagle3` modes).
    pub draft_model: Option<ModelFingerprint>,
    /// The threads the generation decoded with (format version 3), checked
    /// as every thread count is ([`check_threads`]); a restore uses it by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_threads: Option<u32>,
    /// The conversation that led to the current reply, if the generation is
    /// a chat (format version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Conversation>,
    /// The adaptive draft policy's state (format version 4); present exactly
    /// when the generation's draft policy is `adaptive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveState>,
    /// The sampler chain's other parameters, in force at the boundary
    /// (format version 5; an older file's are the neutral defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<SamplerMeta>,
    /// The log-probability records of the committed tokens not yet handed
    /// out, present when the generation records them (format version 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsMeta>,
}

/// The `meta.logprobs` entry: what is recorded (`top_n` alternatives) and the
/// records of reply positions `from..` (the committed tokens not handed out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogprobsMeta {
    /// Alternatives each record lists.
    pub top_n: usize,
    /// The reply position of the first record.
    pub from: usize,
    /// One record per token from `from` to the end of the reply.
    pub records: Vec<TokenLogprobs>,
}

impl LogprobsMeta {
    /// The entry of `log`'s records from reply position `delivered` on.
    pub fn pending(log: &LogprobLog, delivered: usize) -> Self {
        let from = log.from.max(delivered);
        Self {
            top_n: log.top_n,
            from,
            records: log.records[(from - log.from).min(log.records.len())..].to_vec(),
        }
    }

    /// The log these records continue, checked against a reply of
    /// `reply_len` tokens over a vocabulary of `n_vocab`.
    pub fn log(&self, reply_len: usize, n_vocab: usize) -> Result<LogprobLog, CheckpointError> {
        let most = crate::sampling::MAX_TOP_LOGPROBS;
        if self.top_n > most {
            return Err(corrupt(format!(
                "meta.logprobs: top_n {} is above {most}",
                self.top_n
            )));
        }
        if self.from.checked_add(self.records.len()) != Some(reply_len) {
            return Err(corrupt(format!(
                "meta.logprobs: {} records from reply position {} do not end with the reply's {reply_len} tokens",
                self.records.len(),
                self.from
            )));
        }
        let fits = |value: f32| value <= 0.0;
        for record in &self.records {
            let tokens_fit = record.top.iter().all(|&(token, value)| {
                fits(value) && usize::try_from(token).is_ok_and(|t| t < n_vocab)
            });
            if record.top.len() > self.top_n || !fits(record.logprob) || !tokens_fit {
                return Err(corrupt(
                    "meta.logprobs: a record is not a log-probability with at most top_n \
                     alternatives of the vocabulary"
                        .to_string(),
                ));
            }
        }
        Ok(LogprobLog {
            top_n: self.top_n,
            from: self.from,
            records: self.records.clone(),
        })
    }
}

/// The `meta.sampler` entry (format version 5): the sampling parameters
/// besides temperature, top-k, top-p and seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerMeta {
    /// Min-p (0: off).
    pub min_p: f32,
    /// Typical-p (1: off).
    pub typical_p: f32,
    /// Repetition penalty (1: off).
    pub repeat_penalty: f32,
    /// Tokens the penalties count (0: none, -1: the whole history).
    pub repeat_last_n: i32,
    /// Presence penalty (0: off).
    pub presence_penalty: f32,
    /// Frequency penalty (0: off).
    pub frequency_penalty: f32,
    /// `[token, bias]` pairs, by ascending distinct token.
    pub logit_bias: LogitBias,
    /// The GBNF grammar replies follow (absent: none). The grammar's state is
    /// not stored: a reader compiles the grammar and follows the reply's
    /// tokens with it, refusing a reply it does not allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
}

/// A logit bias as a file holds it: at most
/// [`SamplingParams::MAX_LOGIT_BIAS`] entries, refused while being read
/// beyond that, so a file cannot make a reader allocate more.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct LogitBias(pub Vec<(i32, f32)>);

impl<'de> Deserialize<'de> for LogitBias {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded;
        impl<'de> serde::de::Visitor<'de> for Bounded {
            type Value = LogitBias;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(
                    f,
                    "at most {} [token, bias] pairs",
                    SamplingParams::MAX_LOGIT_BIAS
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<LogitBias, A::Error> {
                let most = SamplingParams::MAX_LOGIT_BIAS;
                let mut entries = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(entry) = seq.next_element::<(i32, f32)>()? {
                    if entries.len() == most {
                        return Err(serde::de::Error::invalid_length(most + 1, &self));
                    }
                    entries.push(entry);
                }
                Ok(LogitBias(entries))
            }
        }
        deserializer.deserialize_seq(Bounded)
    }
}

impl SamplerMeta {
    /// The entry recording `params`.
    pub fn new(params: &SamplingParams) -> Self {
        Self {
            min_p: params.min_p,
            typical_p: params.typical_p,
            repeat_penalty: params.repeat_penalty,
            repeat_last_n: params.repeat_last_n,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            logit_bias: LogitBias(params.logit_bias.clone()),
            grammar: params.grammar.clone(),
        }
    }

    /// `base` (temperature, top-k, top-p, seed) with these parameters.
    fn apply(&self, base: SamplingParams) -> SamplingParams {
        SamplingParams {
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.0.clone(),
            grammar: self.grammar.clone(),
            ..base
        }
    }
}

impl Meta {
    /// The meta of a checkpoint this build writes of a generation with this
    /// configuration on these models.
    pub fn new(
        config: &GeneratorConfig,
        target_model: ModelFingerprint,
        draft_model: Option<ModelFingerprint>,
    ) -> Self {
        let (mode, ngram) = describe_mode(config.mode);
        Self {
            specstate_version: env!("CARGO_PKG_VERSION").into(),
            llama_cpp_sys_version: LLAMA_CPP_SYS_VERSION.into(),
            llama_cpp_build: LLAMA_CPP_BUILD.into(),
            llama_cpp_commit: LLAMA_CPP_COMMIT.into(),
            mode,
            ngram,
            n_draft: config.n_draft,
            n_ctx: config.n_ctx,
            n_batch: config.n_batch,
            temperature: config.sampling.temperature,
            top_k: config.sampling.top_k,
            top_p: config.sampling.top_p,
            seed: config.sampling.seed,
            target_model,
            draft_model,
            n_threads: None,
            conversation: None,
            adaptive: None,
            sampler: Some(SamplerMeta::new(&config.sampling)),
            logprobs: None,
        }
    }

    /// Check the entries of format versions 3 (`n_threads`, `conversation`),
    /// 4 (`adaptive`) and 5 (`sampler`): well formed, and only in a file of a version that
    /// has them. (`adaptive` is checked against the configuration by
    /// [`Meta::adaptive_state`].)
    pub fn check_versioned_entries(&self, version: u16) -> Result<(), CheckpointError> {
        let absent_before =
            |since: u16, entry: &str, present: bool| match present && version < since {
                true => Err(corrupt(format!(
                    "meta.{entry}: not part of format version {version}"
                ))),
                false => Ok(()),
            };
        absent_before(3, "n_threads", self.n_threads.is_some())?;
        absent_before(3, "conversation", self.conversation.is_some())?;
        absent_before(4, "adaptive", self.adaptive.is_some())?;
        absent_before(5, "sampler", self.sampler.is_some())?;
        absent_before(5, "logprobs", self.logprobs.is_some())?;
        if let Some(n) = self.n_threads {
            check_threads(n.into()).map_err(|e| corrupt(format!("meta.{e}")))?;
        }
        match &self.conversation {
            Some(conversation) => conversation
                .validate()
                .map_err(|e| corrupt(format!("meta.conversation: {e}"))),
            None => Ok(()),
        }
    }

    /// The runtime options a restore uses unless the caller gives others:
    /// the recorded thread count, at most the `available` CPUs (a file may
    /// not push the count past them), or 0 (the default thread count) if none is
    /// recorded (or 0 is, which specstate never writes). The count changes speed only: verification is exact at any
    /// count (specstate's llama.cpp patch), so the continuation is the same.
    pub fn recorded_runtime(&self, available: u32) -> crate::settings::RuntimeOptions {
        crate::settings::RuntimeOptions {
            n_threads: self.n_threads.map_or(0, |n| n.min(available.max(1)) as i32),
            ..crate::settings::RuntimeOptions::DEFAULT
        }
    }

    /// The `meta` section's payload.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(self)
    }

    /// Parse a `meta` section's payload (unknown keys refused).
    pub fn from_json(payload: &[u8]) -> Result<Self, CheckpointError> {
        serde_json::from_slice(payload).map_err(|e| corrupt(format!("meta section: {e}")))
    }

    /// The generator configuration the checkpoint was taken with.
    /// Every setting is checked with the generator's own rules
    /// ([`GeneratorConfig::validate`]), and the configuration must be a
    /// resolved one ([`GeneratorConfig::check_resolved`]: a generator records
    /// the context length it runs, and its clamped `n_batch`); a failure names the field.
    pub fn config(&self) -> Result<GeneratorConfig, CheckpointError> {
        let config = GeneratorConfig {
            mode: self.mode()?,
            n_draft: self.n_draft,
            sampling: self.sampling(),
            n_ctx: self.n_ctx,
            n_batch: self.n_batch,
            adaptive: self.adaptive.is_some(),
        };
        config
            .validate()
            .and_then(|()| config.check_resolved())
            .map_err(|e| corrupt(format!("meta.{e}")))?;
        Ok(config)
    }

    /// The sampling parameters recorded (an older file's: neutral but for
    /// temperature, top-k, top-p and seed).
    fn sampling(&self) -> SamplingParams {
        let base = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
            ..SamplingParams::default()
        };
        match &self.sampler {
            Some(sampler) => sampler.apply(base),
            None => base,
        }
    }

    /// The adaptive policy's state (`None` for the fixed policy), checked
    /// against the configuration's `n_draft`.
    pub fn adaptive_state(&self) -> Result<Option<AdaptiveState>, CheckpointError> {
        let Some(state) = &self.adaptive else {
            return Ok(None);
        };
        state
            .validate(self.n_draft)
            .map_err(|e| corrupt(format!("meta.adaptive: {e}")))?;
        Ok(Some(state.clone()))
    }

    /// The mode named by `mode` and `ngram` (sizes present in `ngram` mode only).
    fn mode(&self) -> Result<Mode, CheckpointError> {
        let unknown = || {
            corrupt(format!(
                "meta.mode: unknown mode {:?} (or n-gram sizes that do not fit it)",
                truncated(&self.mode)
            ))
        };
        let [n_max, n_min] = self.ngram.unwrap_or([0; 2]);
        let mode = match Mode::parse(&self.mode, NgramConfig { n_max, n_min }) {
            Ok(mode) => mode,
            Err(error) if error.field == "mode" => return Err(unknown()),
            Err(error) => return Err(corrupt(format!("meta.{error}"))),
        };
        if matches!(mode, Mode::Ngram(_)) != self.ngram.is_some() {
            return Err(unknown());
        }
        Ok(mode)
    }

    /// Check that the checkpoint has the same mode and configuration as
    /// `config`, sampling aside (it may change between calls; a load takes
    /// the checkpoint's).
    pub fn check_config(&self, config: &GeneratorConfig) -> Result<(), CheckpointError> {
        let theirs = self.config()?;
        let fields: [(&'static str, String, String); 5] = [
            (
                "mode",
                format!("{:?}", theirs.mode),
                format!("{:?}", config.mode),
            ),
            (
                "n_draft",
                theirs.n_draft.to_string(),
                config.n_draft.to_string(),
            ),
            ("n_ctx", theirs.n_ctx.to_string(), config.n_ctx.to_string()),
            (
                "n_batch",
                theirs.n_batch.to_string(),
                config.n_batch.to_string(),
            ),
            (
                "draft_policy",
                draft_policy_name(theirs.adaptive).into(),
                draft_policy_name(config.adaptive).into(),
            ),
        ];
        match fields
            .into_iter()
            .find(|(_, checkpoint, ours)| checkpoint != ours)
        {
            Some((field, checkpoint, generator)) => Err(CheckpointError::ConfigMismatch {
                field,
                checkpoint,
                generator,
            }),
            None => Ok(()),
        }
    }

    /// Check that the checkpoint was taken with models of these fingerprints
    /// (`draft`: `None` for no draft model).
    pub fn check_models(
        &self,
        target: &ModelFingerprint,
        draft: Option<&ModelFingerprint>,
    ) -> Result<(), CheckpointError> {
        check_model("target", Some(&self.target_model), Some(target))?;
        check_model("draft", self.draft_model.as_ref(), draft)
    }
}

/// The model the checkpoint names for `role` against the model given: the
/// same file content and size (the file name is informational).
fn check_model(
    role: &'static str,
    expected: Option<&ModelFingerprint>,
    actual: Option<&ModelFingerprint>,
) -> Result<(), CheckpointError> {
    let same = match (expected, actual) {
        (Some(e), Some(a)) => e.sha256 == a.sha256 && e.size == a.size,
        (None, None) => true,
        _ => false,
    };
    if same {
        return Ok(());
    }
    let show =
        |f: Option<&ModelFingerprint>| f.map_or_else(|| "none".to_owned(), ToString::to_string);
    Err(CheckpointError::ModelMismatch {
        role,
        expected: show(expected),
        actual: show(actual),
    })
}

/// Refuse a context length beyond `cap`, the most a restore may allocate.
pub fn check_n_ctx_cap(n_ctx: u32, cap: u32) -> Result<(), CheckpointError> {
    if n_ctx <= cap {
        return Ok(());
    }
    Err(CheckpointError::ConfigMismatch {
        field: "n_ctx",
        checkpoint: n_ctx.to_string(),
        generator: format!("at most {cap}"),
    })
}

/// At most 64 characters of a string from a file, for messages.
fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The `mode` and `ngram` entries of a mode.
fn describe_mode(mode: Mode) -> (String, Option<[usize; 2]>) {
    match mode {
        Mode::Ngram(ngram) => ("ngram".into(), Some([ngram.n_max, ngram.n_min])),
        mode => (mode.name().into(), None),
    }
}
