//! The operations that take a checkpoint of a generator and put one back:
//! they use the generator and the models, the codec does the bytes.

use std::sync::Arc;

use super::codec::{Checkpoint, EncodeError, Payload, Sections};
use super::format::{CheckpointError, SectionKind};
use super::meta::{check_n_ctx_cap, LogprobsMeta, Meta, ModelFingerprint};
use super::state::EncodedState;
use crate::generator::{rollback_snapshots, Generator, LogprobLog, RestoreError};
use crate::native::{recurrent_state_bytes, Model};
use crate::settings::{GeneratorConfig, RuntimeOptions};
use crate::Error;

/// The cap on a restored context when neither the caller nor the model names one.
pub const DEFAULT_MAX_N_CTX: u32 = 8192;

/// The most rows per compute pass a restore allocates when the caller names
/// no `max_n_batch`: llama.cpp's default batch ([`crate::limits::LLAMA_N_BATCH`]).
pub const DEFAULT_MAX_N_BATCH: u32 = crate::limits::LLAMA_N_BATCH;

/// The caller's limits on what a restore may allocate (`None`: the defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreLimits {
    /// The longest context: by default the target's trained context length
    /// (or [`DEFAULT_MAX_N_CTX`] if it names none).
    pub max_n_ctx: Option<u32>,
    /// The most rows per compute pass (the checkpoint's `n_batch`): by
    /// default [`DEFAULT_MAX_N_BATCH`]. Naming it also lifts the default
    /// bound on a recurrent model's rollback snapshots (see `restore`).
    pub max_n_batch: Option<u32>,
}

/// The fingerprint of a loaded model's file.
pub fn fingerprint(model: &Model) -> ModelFingerprint {
    let (sha256, size) = model.file_digest().clone();
    ModelFingerprint {
        sha256,
        size,
        file: model
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// Refuse models loaded with `use_mmap` whose files were written since they
/// were loaded: their weights may no longer be the bytes their fingerprints
/// name, so they take part in no checkpoint, written or restored.
fn check_unchanged(target: &Model, draft: Option<&Model>) -> Result<(), Error> {
    target.check_unchanged()?;
    if let Some(draft) = draft {
        draft.check_unchanged()?;
    }
    Ok(())
}

/// What a checkpoint is written from. The small sections are captured here;
/// the contexts' sequence states are written straight from llama.cpp into
/// the output by [`Capture::encode_into`], so a capture needs no second copy.
pub struct Capture {
    meta: Vec<u8>,
    state: EncodedState,
    target_len: usize,
    draft_state_len: Option<usize>,
    speculative_state: Option<Vec<u8>>,
}

/// Capture a generator at its current boundary.
pub fn capture(generator: &mut Generator) -> Result<Capture, Error> {
    if !generator.started() {
        return Err(Error::Usage(
            "nothing to checkpoint: the generator has no prompt yet".into(),
        ));
    }
    check_unchanged(
        generator.target_model(),
        generator.draft_model().map(|m| m.as_ref()),
    )?;
    let mut meta = Meta::new(
        generator.config(),
        fingerprint(generator.target_model()),
        generator.draft_model().map(|m| fingerprint(m)),
    );
    meta.conversation = generator.conversation().cloned();
    meta.n_threads = Some(generator.n_threads());
    meta.adaptive = generator.state().adaptive.clone();
    meta.logprobs = generator
        .logprobs()
        .map(|log| LogprobsMeta::pending(log, generator.state().delivered));
    let meta = meta.to_json().map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(Capture {
        meta,
        state: EncodedState::new(generator.state()),
        speculative_state: generator.speculative_state()?,
        target_len: generator.target_state_size()?,
        draft_state_len: generator.draft_state_size()?,
    })
}

impl Capture {
    fn sections(&self) -> Sections<'_> {
        Sections {
            meta: &self.meta,
            state: &self.state,
            target_state: Payload::Written(self.target_len),
            draft_state: self.draft_state_len.map(Payload::Written),
            speculative_state: self.speculative_state.as_deref().map(Payload::Bytes),
        }
    }

    /// Bytes of the encoded checkpoint.
    pub fn encoded_len(&self) -> usize {
        self.sections().encoded_len()
    }

    /// Write the checkpoint into `out` (exactly `encoded_len()` bytes),
    /// copying the contexts' states from `generator`, which must be the one
    /// captured and unchanged since.
    pub fn encode_into(&self, generator: &mut Generator, out: &mut [u8]) -> Result<(), Error> {
        let written = self
            .sections()
            .encode_into(out, |kind, payload| match kind {
                SectionKind::TargetState => generator.write_target_state(payload),
                SectionKind::DraftState => generator.write_draft_state(payload),
                kind => Err(Error::Usage(format!(
                    "no writer for the {} section",
                    kind.name()
                ))),
            });
        written.map_err(|error| match error {
            EncodeError::BufferSize { .. } => Error::Usage(error.to_string()),
            EncodeError::Write(error) => error,
        })
    }
}

/// Check that `checkpoint` was taken with these models.
pub fn check_models(
    checkpoint: &Checkpoint<'_>,
    target: &Model,
    draft: Option<&Model>,
) -> Result<(), CheckpointError> {
    let draft = draft.map(fingerprint);
    checkpoint
        .meta
        .check_models(&fingerprint(target), draft.as_ref())
}

/// Check that `checkpoint` has the same mode and configuration as `config`.
pub fn check_config(
    checkpoint: &Checkpoint<'_>,
    config: &GeneratorConfig,
) -> Result<(), CheckpointError> {
    checkpoint.meta.check_config(config)
}

/// The context length a restore may allocate: the caller's `max_n_ctx`, or
/// else the model's trained context length. A checkpoint asking for more is
/// refused, so a file cannot make the process allocate memory nobody chose.
fn check_context_cap(
    config: &GeneratorConfig,
    target: &Model,
    max_n_ctx: Option<u32>,
) -> Result<(), CheckpointError> {
    let cap = max_n_ctx.unwrap_or_else(|| match target.n_ctx_train() {
        0 => DEFAULT_MAX_N_CTX,
        trained => trained,
    });
    check_n_ctx_cap(config.n_ctx, cap)
}

/// What a restore may allocate beyond the context length: compute buffers
/// for at most `max_n_batch` rows per pass (default [`DEFAULT_MAX_N_BATCH`]);
/// and, unless the caller named `max_n_batch`, on a recurrent or hybrid
/// target, rollback snapshots of the recurrent state (one per drafted token,
/// each cleared, so really held) taking at most as much memory as the
/// model's weights. Checked before any context is created, so a file cannot
/// make the process reserve memory nobody chose.
fn check_allocation(
    config: &GeneratorConfig,
    target: &Arc<Model>,
    max_n_batch: Option<u32>,
) -> Result<(), Error> {
    let cap = max_n_batch.unwrap_or(DEFAULT_MAX_N_BATCH);
    if config.n_batch > cap {
        let limit = match max_n_batch {
            Some(_) => format!("max_n_batch={cap}"),
            None => format!("by default: {cap}, the generator's default n_batch"),
        };
        return Err(CheckpointError::ExcessiveAllocation {
            field: "n_batch",
            value: config.n_batch,
            reason: format!(
                "asks for compute buffers of that many rows per pass, more than a restore allocates ({limit})"
            ),
            requested: u64::from(config.n_batch),
            maximum: u64::from(cap),
        }
        .into());
    }
    let snapshots = u64::from(rollback_snapshots(target, config));
    if max_n_batch.is_some() || snapshots == 0 {
        return Ok(());
    }
    let state = recurrent_state_bytes(target)?;
    let (bytes, weights) = (snapshots.saturating_mul(state), target.size_bytes());
    if bytes <= weights {
        return Ok(());
    }
    Err(CheckpointError::ExcessiveAllocation {
        field: "n_draft",
        value: config.n_draft,
        reason: format!(
            "keeps {snapshots} rollback snapshots of the model's {state}-byte recurrent state, \
             {bytes} bytes, more than the {weights} bytes of its weights"
        ),
        requested: bytes,
        maximum: weights,
    }
    .into())
}

/// A refused part of a checkpoint's content as a checkpoint error.
fn refused(error: RestoreError) -> CheckpointError {
    CheckpointError::Corrupt(error.to_string())
}

/// Give the generator the checkpoint's conversation (or none).
fn set_conversation(generator: &mut Generator, checkpoint: &Checkpoint<'_>) -> Result<(), Error> {
    generator
        .set_conversation(checkpoint.meta.conversation.clone())
        .map_err(|e| CheckpointError::Corrupt(format!("meta.conversation: {e}")).into())
}

/// A new generator continuing `checkpoint` on these models.
///
/// Everything that comes from the file is a [`CheckpointError`]: settings
/// that do not fit the model, states llama.cpp refuses, positions that do not
/// match the state, a context longer or contexts larger than `limits`
/// allow (checked before they are created). Only `runtime` (the caller's
/// own) gives other errors.
pub fn restore(
    checkpoint: &Checkpoint<'_>,
    target: Arc<Model>,
    draft: Option<Arc<Model>>,
    runtime: RuntimeOptions,
    limits: RestoreLimits,
) -> Result<Generator, Error> {
    runtime.validate()?;
    check_models(checkpoint, &target, draft.as_deref())?;
    check_unchanged(&target, draft.as_deref())?;
    let config = checkpoint.meta.config()?;
    let logprobs = recorded_logprobs(checkpoint, &target)?;
    check_context_cap(&config, &target, limits.max_n_ctx)?;
    check_allocation(&config, &target, limits.max_n_batch)?;
    let mut generator =
        Generator::new(target, draft, config, runtime).map_err(|error| match error {
            // The grammar llama.cpp refuses, as `load_into` names it.
            Error::Setting(setting) if setting.field == "grammar" => {
                CheckpointError::Corrupt(format!("meta.{setting}"))
            }
            error => CheckpointError::Corrupt(format!(
                "meta: the configuration cannot run on these models: {error}"
            )),
        })?;
    generator
        .restore(
            checkpoint.state.clone(),
            checkpoint.target_state,
            checkpoint.draft_state,
            checkpoint.speculative_state,
        )
        .map_err(refused)?;
    generator
        .follow_grammar()
        .map_err(|e| CheckpointError::Corrupt(format!("meta.grammar: {e}")))?;
    generator.put_logprobs(logprobs);
    set_conversation(&mut generator, checkpoint)?;
    Ok(generator)
}

/// The log-probability records `checkpoint` carries, checked against its reply and `target`'s vocabulary.
fn recorded_logprobs(
    checkpoint: &Checkpoint<'_>,
    target: &Model,
) -> Result<Option<LogprobLog>, CheckpointError> {
    let reply = checkpoint.state.reply().len();
    (checkpoint.meta.logprobs.as_ref())
        .map(|entry| entry.log(reply, target.n_vocab()))
        .transpose()
}

/// Restore `checkpoint` into `generator` in place, reusing its contexts.
///
/// The checkpoint must have the generator's mode, configuration and models
/// (checked first); the generator takes its sampling parameters. The generator's current boundary is kept aside; if
/// llama.cpp refuses any of the three states, or the positions they hold do
/// not match the checkpoint's state, it is put back, so a refused checkpoint
/// leaves the generator exactly as it was.
pub fn load_into(generator: &mut Generator, checkpoint: &Checkpoint<'_>) -> Result<(), Error> {
    check_config(checkpoint, generator.config())?;
    check_models(
        checkpoint,
        generator.target_model(),
        generator.draft_model().map(|m| m.as_ref()),
    )?;
    check_unchanged(
        generator.target_model(),
        generator.draft_model().map(|m| m.as_ref()),
    )?;
    let sampling = checkpoint.meta.config()?.sampling;
    let mut grammar = generator
        .check_sampling(&sampling)
        .map_err(|e| CheckpointError::Corrupt(format!("meta.{e}")))?;
    if let Some(grammar) = grammar.as_mut() {
        grammar
            .follow(checkpoint.state.reply())
            .map_err(|e| CheckpointError::Corrupt(format!("meta.grammar: {e}")))?;
    }
    let logprobs = recorded_logprobs(checkpoint, generator.target_model())?;
    let kept = generator.boundary()?;
    let applied = generator.restore(
        checkpoint.state.clone(),
        checkpoint.target_state,
        checkpoint.draft_state,
        checkpoint.speculative_state,
    );
    let Err(error) = applied else {
        generator.put_sampling(sampling, grammar);
        generator.put_logprobs(logprobs);
        return set_conversation(generator, checkpoint);
    };
    generator
        .put_back(kept)
        .map_err(|e| Error::Usage(format!("could not put the generation back: {e}")))?;
    Err(refused(error).into())
}
