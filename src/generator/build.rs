//! Building a generator: the checks that need the models, then the contexts,
//! the session and the batches its mode needs.

use std::sync::Arc;

use super::multi_sequence::check_joins;
use super::shared_engine::SharedEngine;
use super::{DraftParts, Generator, Member, Target};
use crate::native::{Batch, Context, ContextKind, ContextParams, Model};
use crate::sampling::Sampler;
use crate::session::{DraftSession, SessionConfig, SpecType};
use crate::settings::{GeneratorConfig, Mode, RuntimeOptions};
use crate::{Error, Result};

/// The recurrent-state snapshots per sequence that a context of `model`
/// keeps for `config`: rollback of rejected drafts needs them on a recurrent
/// or hybrid model (seed: slots >= n_draft); none otherwise.
pub(crate) fn rollback_snapshots(model: &Model, config: &GeneratorConfig) -> u32 {
    let recurrent = model.is_recurrent() || model.is_hybrid();
    if recurrent && config.mode.is_speculative() {
        config.n_draft.max(1)
    } else {
        0
    }
}

fn context_params(
    model: &Model,
    config: &GeneratorConfig,
    runtime: RuntimeOptions,
    kind: ContextKind,
) -> ContextParams {
    let n_rs_seq = rollback_snapshots(model, config);
    // llama.cpp needs room for the snapshots in every compute pass; the
    // generator itself never decodes more than `config.n_batch` rows at once.
    let n_rows = config.n_batch.max(n_rs_seq + 2);
    ContextParams {
        n_ctx: config.n_ctx,
        n_batch: n_rows,
        n_ubatch: n_rows,
        n_seq_max: 1,
        n_rs_seq,
        kind,
        n_threads: runtime.n_threads,
    }
}

/// The draft model against the mode and the target (the settings are
/// checked by [`new_member`]; the context length against the model's trained
/// length, and the thread count, by `Context::new` before it allocates).
fn check_models(target: &Model, draft: Option<&Model>, config: &GeneratorConfig) -> Result<()> {
    let mode = config.mode.name();
    match (config.mode.needs_draft_model(), draft) {
        (true, None) => Err(Error::Invalid(format!("mode '{mode}' needs a draft model"))),
        (false, Some(_)) => Err(Error::Invalid(format!(
            "mode '{mode}' takes no draft model"
        ))),
        (_, Some(draft))
            if config.mode == Mode::Draft && (draft.is_recurrent() || draft.is_hybrid()) =>
        {
            // The draft context decodes its tokens one at a time, and a
            // recurrent memory can roll back only within its last batch.
            Err(Error::Invalid(format!(
                "the draft model ({}) is recurrent or hybrid: mode 'draft' cannot roll its state back \
                 after a rejected draft; use an attention-only draft model, or this model as the target \
                 (its own MTP head drafts in mode 'mtp' where it has one)",
                draft.architecture()
            )))
        }
        (_, Some(draft)) if config.mode == Mode::Draft && draft.n_vocab() != target.n_vocab() => {
            Err(Error::Invalid(format!(
                "the draft model has {} tokens and the target {}: vocabularies differ",
                draft.n_vocab(),
                target.n_vocab()
            )))
        }
        _ => Ok(()),
    }
}

/// The draft side of `config.mode` over `target`: the draft model's context
/// and batch (`draft`), or a session and its draft context (`mtp`, `eagle3`).
fn draft_parts(
    target: &mut Context,
    draft_model: Option<Arc<Model>>,
    config: &GeneratorConfig,
    runtime: RuntimeOptions,
) -> Result<DraftParts> {
    let (spec_type, mut context) = match (config.mode, draft_model) {
        (Mode::Mtp, _) => {
            let model = Arc::clone(target.model());
            let params = context_params(&model, config, runtime, ContextKind::Mtp);
            (SpecType::Mtp, Context::new(model, params)?)
        }
        (Mode::Eagle3, Some(model)) => {
            let params = context_params(&model, config, runtime, ContextKind::Default);
            (
                SpecType::Eagle3,
                Context::with_other(model, params, target)?,
            )
        }
        (Mode::Draft, Some(model)) => {
            let params = context_params(&model, config, runtime, ContextKind::Default);
            return Ok(DraftParts::Model {
                context: Context::new(model, params)?,
                batch: Batch::new(config.n_batch as usize)?,
            });
        }
        _ => return Ok(DraftParts::History),
    };
    let session_config = SessionConfig {
        n_seq: 1,
        n_draft_max: config.n_draft as i32,
        n_min: 0,
        p_min: 0.0,
        spec_type,
    };
    let session = DraftSession::new(target, &mut context, session_config)?;
    Ok(DraftParts::Session { session, context })
}

impl Generator {
    /// Resolve the configuration against the target (`n_ctx` 0: its trained
    /// length; `n_batch` at most `n_ctx`: [`GeneratorConfig::resolve`]),
    /// check it against the models, then build the contexts (and session)
    /// that `config.mode` needs. [`Generator::config`] is the resolved one.
    pub fn new(
        target_model: Arc<Model>,
        draft_model: Option<Arc<Model>>,
        config: GeneratorConfig,
        runtime: RuntimeOptions,
    ) -> Result<Self> {
        let mut member = new_member(&target_model, config)?;
        member.grammar_drafts = runtime.grammar_drafts;
        check_models(&target_model, draft_model.as_deref(), &member.config)?;
        let config = &member.config;
        let params = context_params(&target_model, config, runtime, ContextKind::Default);
        let mut target = Context::new(target_model, params)?;
        let parts = draft_parts(&mut target, draft_model, config, runtime)?;
        Ok(Self {
            target: Target::Own(target),
            batch: Batch::new(config.n_batch as usize)?,
            parts,
            member,
        })
    }

    /// A generator of mode `none` or `ngram` continuing `member`, with a
    /// target context of its own holding `target_state` (if prefilled).
    pub(crate) fn from_member(
        target_model: Arc<Model>,
        member: Member,
        runtime: RuntimeOptions,
        target_state: Option<&[u8]>,
    ) -> Result<Self> {
        let params = context_params(&target_model, &member.config, runtime, ContextKind::Default);
        let mut target = Context::new(target_model, params)?;
        if let Some(state) = target_state {
            target.set_seq_state(0, state)?;
        }
        Ok(Self {
            target: Target::Own(target),
            batch: Batch::new(member.config.n_batch as usize)?,
            parts: DraftParts::History,
            member,
        })
    }

    /// The generation without its contexts.
    pub(crate) fn member(&self) -> &Member {
        &self.member
    }

    /// The target context's sequence state (see `Context::seq_state`).
    pub(crate) fn target_state(&mut self) -> Result<Vec<u8>> {
        self.target.state()
    }

    /// A generator of mode `none` or `ngram` on a sequence of `engine`, whose
    /// rounds are decoded with the other attached generators' (configured,
    /// resolved and checked as [`Generator::new`] does, and checked against
    /// the engine: its model, its sequences' `n_ctx`, its `n_batch`).
    pub fn attached(engine: &Arc<SharedEngine>, config: GeneratorConfig) -> Result<Self> {
        let member = new_member(engine.model(), config)?;
        check_joins(&member, engine.config())?;
        Ok(Self {
            target: Target::Shared(engine.attach(None)?),
            batch: Batch::new(member.config.n_batch as usize)?,
            parts: DraftParts::History,
            member,
        })
    }

    /// Give a shared sequence back to its engine at once, whatever else still
    /// holds this generator: its record (tokens, counts) stays, but it can no
    /// longer decode or checkpoint. Nothing for a context of its own.
    pub fn release_sequence(&mut self) {
        let member = &self.member;
        let exact = member.config.decodes_exactly() && member.started();
        let keep = match &member.reuse_key {
            Some(key) if exact => Some((&member.state.history[..member.state.n_past], key)),
            _ => None,
        };
        self.target.release(keep);
    }

    /// Move this generation onto a sequence of `engine` (its target state
    /// copied there, its own context freed); it goes on exactly as before.
    /// Refused, changing nothing, for another mode than `none` and `ngram`,
    /// another model, or what [`Generator::attached`] checks.
    pub fn attach(&mut self, engine: &Arc<SharedEngine>) -> Result<()> {
        if !Arc::ptr_eq(self.target.model(), engine.model()) {
            return Err(Error::Invalid(
                "the generator's target is another model than the engine's".into(),
            ));
        }
        check_joins(&self.member, engine.config())?;
        let state = match self.started() {
            true => Some(self.target.state()?),
            false => None,
        };
        self.target = Target::Shared(engine.attach(state.as_deref())?);
        self.parts = DraftParts::History;
        Ok(())
    }

    /// The shared engine this generator is attached to, if any.
    pub fn engine(&self) -> Option<&Arc<SharedEngine>> {
        self.target.engine()
    }
}

/// A generation with no prompt yet: `config` resolved against the target
/// (`n_ctx` 0: its trained length; `n_batch` at most `n_ctx`:
/// [`GeneratorConfig::resolve`]), its sampling checked and its grammar compiled.
pub(crate) fn new_member(target_model: &Arc<Model>, config: GeneratorConfig) -> Result<Member> {
    let config = config.resolve(target_model.n_ctx_train())?;
    config.validate()?;
    config.sampling.check_vocabulary(target_model.n_vocab())?;
    let grammar = super::compiled_grammar(target_model, &config.sampling)?;
    let mut sampler = Sampler::new(config.sampling.clone());
    sampler.grammar = grammar;
    Ok(Member::new(config, sampler))
}
