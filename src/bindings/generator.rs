//! `specstate._native.Generator`: the five-mode generator and its checkpoints.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::ThreadId;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::arguments::{bias_entries, narrow_cost_curve, TokenIds, WideInt};
use super::chat::{messages as chat_messages, pairs, Pairs};
use super::corpus::PyLookupCorpus;
use super::errors::ensure_thread;
use super::guarded::Guarded;
use super::model::PyModel;
use super::shared_engine::PySharedEngine;
use crate::chat::Conversation;
use crate::checkpoint;
use crate::generator::{Generator, Positions};
use crate::settings::{
    draft_policy_name, parse_draft_policy, GeneratorConfig, Mode, NgramConfig, RuntimeOptions,
    SamplingParams,
};

/// The core's defaults, written once in `settings.rs`, as the constructor's signature and `GENERATOR_DEFAULTS` read them.
const DEFAULTS: GeneratorConfig = GeneratorConfig::DEFAULT;
const NGRAM: NgramConfig = NgramConfig::DEFAULT;
const RUNTIME: RuntimeOptions = RuntimeOptions::DEFAULT;

/// `specstate._native.GENERATOR_DEFAULTS`: every defaulted parameter of the constructor, by name. The command line
/// reads its defaults here: Python 3.9 cannot read an abi3 class's signature (PyO3 attaches it from 3.10 on).
pub(crate) fn generator_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let defaults = PyDict::new(py);
    defaults.set_item("mode", DEFAULTS.mode.name())?;
    defaults.set_item("draft_model", py.None())?;
    defaults.set_item("n_draft", DEFAULTS.n_draft)?;
    defaults.set_item("n_ctx", DEFAULTS.n_ctx)?;
    defaults.set_item("n_batch", DEFAULTS.n_batch)?;
    set_sampler_numbers(&defaults, &DEFAULTS.sampling)?;
    for name in ["logit_bias", "grammar", "cost_curve", "engine"] {
        defaults.set_item(name, py.None())?;
    }
    defaults.set_item("ngram_max", NGRAM.n_max)?;
    defaults.set_item("ngram_min", NGRAM.n_min)?;
    defaults.set_item("n_threads", RUNTIME.n_threads)?;
    defaults.set_item("draft_policy", draft_policy_name(DEFAULTS.adaptive))?;
    defaults.set_item("grammar_drafts", RUNTIME.grammar_drafts)?;
    Ok(defaults)
}

/// The sampler's arguments as `Generator(...)` and `check_sampling` take them, made into parameters in one way
/// (the narrowing of each integer, the logit bias's entries, `""` for no grammar), so both refuse a value with
/// the same message.
struct SamplingArguments {
    temperature: f32,
    top_k: WideInt,
    top_p: f32,
    seed: WideInt,
    min_p: f32,
    typical_p: f32,
    repeat_penalty: f32,
    repeat_last_n: WideInt,
    presence_penalty: f32,
    frequency_penalty: f32,
    logit_bias: Option<BTreeMap<i64, f32>>,
    grammar: Option<String>,
}

impl SamplingArguments {
    /// The parameters, their integers narrowed (ranges are the core's to check: `SamplingParams::validate`).
    fn params(self) -> PyResult<SamplingParams> {
        Ok(SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k.narrow("top_k")?,
            top_p: self.top_p,
            seed: self.seed.narrow("seed")?,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n.narrow("repeat_last_n")?,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: bias_entries(self.logit_bias)?,
            grammar: self.grammar.filter(|text| !text.is_empty()),
        })
    }
}

/// Check sampling settings as `Generator(...)` checks them, with no model: every range, the logit bias's
/// entries and values, the grammar's text. What needs the model (the bias's tokens against its vocabulary,
/// whether the grammar parses) is left to the generator. `ValueError` or `TypeError` with the constructor's
/// message; `None` when every setting passes.
#[pyfunction]
#[pyo3(signature = (*, temperature = DEFAULTS.sampling.temperature, top_k = WideInt(DEFAULTS.sampling.top_k.into()),
                    top_p = DEFAULTS.sampling.top_p, seed = WideInt(DEFAULTS.sampling.seed.into()),
                    min_p = DEFAULTS.sampling.min_p, typical_p = DEFAULTS.sampling.typical_p,
                    repeat_penalty = DEFAULTS.sampling.repeat_penalty,
                    repeat_last_n = WideInt(DEFAULTS.sampling.repeat_last_n.into()),
                    presence_penalty = DEFAULTS.sampling.presence_penalty,
                    frequency_penalty = DEFAULTS.sampling.frequency_penalty, logit_bias = None, grammar = None),
       text_signature = "(*, temperature=0.0, top_k=0, top_p=1.0, seed=0, min_p=0.0, typical_p=1.0, \
                         repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0, \
                         logit_bias=None, grammar=None)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_sampling(
    temperature: f32,
    top_k: WideInt,
    top_p: f32,
    seed: WideInt,
    min_p: f32,
    typical_p: f32,
    repeat_penalty: f32,
    repeat_last_n: WideInt,
    presence_penalty: f32,
    frequency_penalty: f32,
    logit_bias: Option<BTreeMap<i64, f32>>,
    grammar: Option<String>,
) -> PyResult<()> {
    let params = SamplingArguments {
        temperature,
        top_k,
        top_p,
        seed,
        min_p,
        typical_p,
        repeat_penalty,
        repeat_last_n,
        presence_penalty,
        frequency_penalty,
        logit_bias,
        grammar,
    }
    .params()?;
    Ok(params.validate()?)
}

/// A generation over a target model in one of five modes (see `specstate.Generator`).
///
/// Its contexts are used only from the thread that created it (every method
/// that changes them checks). Everything is behind one lock, taken with the
/// GIL released: a getter called from another thread while a call runs
/// waits for it (the class is frozen, so Python never sees a borrow error).
#[pyclass(name = "Generator", module = "specstate._native", frozen)]
pub(crate) struct PyGenerator {
    inner: Guarded<Generator>,
    target: Py<PyModel>,
    draft: Option<Py<PyModel>>,
    owner: ThreadId,
}

impl PyGenerator {
    fn check_thread(&self) -> PyResult<()> {
        ensure_thread(self.owner, "Generator")
    }

    /// Run `work` on the generator, after the thread check, with the GIL released.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut Generator) -> R + Send,
    ) -> PyResult<R> {
        self.check_thread()?;
        Ok(py.detach(|| work(&mut self.inner.lock())))
    }

    /// Read the generator from any thread (waiting while a call runs).
    fn read<R>(&self, py: Python<'_>, read: impl FnOnce(&Generator) -> R) -> R {
        read(&self.inner.lock_waiting(py))
    }

    /// The generator, for a call from its own thread that must hold it (a batch's join).
    pub(crate) fn hold(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, Generator>> {
        self.check_thread()?;
        Ok(self.inner.lock_waiting(py))
    }

    pub(crate) fn wrap(inner: Generator, target: Py<PyModel>, draft: Option<Py<PyModel>>) -> Self {
        Self {
            inner: Guarded::new(inner),
            target,
            draft,
            owner: std::thread::current().id(),
        }
    }
}

/// A conversation from Python, checked before anything runs.
fn checked_conversation(conversation: Option<(Pairs, String)>) -> PyResult<Option<Conversation>> {
    let Some((messages, template_sha256)) = conversation else {
        return Ok(None);
    };
    let conversation = Conversation {
        messages: chat_messages(messages),
        template_sha256,
    };
    conversation.validate()?;
    Ok(Some(conversation))
}

/// A log-probability record as Python sees it: `(logprob, [(token, logprob), ...])`.
type LogprobRecord = (f32, Vec<(i32, f32)>);

fn arc(model: &Option<Py<PyModel>>) -> Option<Arc<crate::native::Model>> {
    model.as_ref().map(|m| Arc::clone(&m.get().inner))
}

#[pymethods]
impl PyGenerator {
    #[new]
    #[pyo3(signature = (target, *, mode = DEFAULTS.mode.name(), draft_model = None,
                        n_draft = WideInt(DEFAULTS.n_draft.into()), n_ctx = WideInt(DEFAULTS.n_ctx.into()),
                        n_batch = WideInt(DEFAULTS.n_batch.into()), temperature = DEFAULTS.sampling.temperature,
                        top_k = WideInt(DEFAULTS.sampling.top_k.into()), top_p = DEFAULTS.sampling.top_p,
                        seed = WideInt(DEFAULTS.sampling.seed.into()), min_p = DEFAULTS.sampling.min_p,
                        typical_p = DEFAULTS.sampling.typical_p, repeat_penalty = DEFAULTS.sampling.repeat_penalty,
                        repeat_last_n = WideInt(DEFAULTS.sampling.repeat_last_n.into()),
                        presence_penalty = DEFAULTS.sampling.presence_penalty,
                        frequency_penalty = DEFAULTS.sampling.frequency_penalty, logit_bias = None,
                        grammar = None, ngram_max = WideInt(NGRAM.n_max as i128),
                        ngram_min = WideInt(NGRAM.n_min as i128), n_threads = WideInt(RUNTIME.n_threads.into()),
                        draft_policy = draft_policy_name(DEFAULTS.adaptive), cost_curve = None, engine = None,
                        grammar_drafts = RUNTIME.grammar_drafts),
           text_signature = "(target, *, mode='none', draft_model=None, n_draft=8, n_ctx=2048, n_batch=17, \
                             temperature=0.0, top_k=0, top_p=1.0, seed=0, min_p=0.0, typical_p=1.0, \
                             repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0, \
                             logit_bias=None, grammar=None, ngram_max=4, ngram_min=3, n_threads=0, \
                             draft_policy='fixed', cost_curve=None, engine=None, grammar_drafts=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: Py<PyModel>,
        mode: &str,
        draft_model: Option<Py<PyModel>>,
        n_draft: WideInt,
        n_ctx: WideInt,
        n_batch: WideInt,
        temperature: f32,
        top_k: WideInt,
        top_p: f32,
        seed: WideInt,
        min_p: f32,
        typical_p: f32,
        repeat_penalty: f32,
        repeat_last_n: WideInt,
        presence_penalty: f32,
        frequency_penalty: f32,
        logit_bias: Option<BTreeMap<i64, f32>>,
        grammar: Option<String>,
        ngram_max: WideInt,
        ngram_min: WideInt,
        n_threads: WideInt,
        draft_policy: &str,
        cost_curve: Option<Vec<WideInt>>,
        engine: Option<Py<PySharedEngine>>,
        grammar_drafts: bool,
    ) -> PyResult<Self> {
        let ngram = NgramConfig {
            n_max: ngram_max.narrow("ngram_max")?,
            n_min: ngram_min.narrow("ngram_min")?,
        };
        let mode = Mode::parse(mode, ngram)?;
        let config = GeneratorConfig {
            mode,
            n_draft: n_draft.narrow("n_draft")?,
            sampling: SamplingArguments {
                temperature,
                top_k,
                top_p,
                seed,
                min_p,
                typical_p,
                repeat_penalty,
                repeat_last_n,
                presence_penalty,
                frequency_penalty,
                logit_bias,
                grammar,
            }
            .params()?,
            n_ctx: n_ctx.narrow("n_ctx")?,
            n_batch: n_batch.narrow("n_batch")?,
            adaptive: parse_draft_policy(draft_policy)?,
        };
        let cost_curve = narrow_cost_curve(cost_curve)?;
        let runtime = RuntimeOptions {
            n_threads: n_threads.narrow("n_threads")?,
            grammar_drafts,
        };
        let target_model = Arc::clone(&target.get().inner);
        let draft = arc(&draft_model);
        let mut inner = match &engine {
            None => py.detach(|| Generator::new(target_model, draft, config, runtime))?,
            Some(engine) => {
                let engine = engine.get().arc(target_model, draft.is_some())?;
                py.detach(|| Generator::attached(&engine, config))?
            }
        };
        inner.set_grammar_drafts(grammar_drafts);
        if let Some(cost_us) = cost_curve {
            inner.pin_cost_curve(cost_us)?;
        }
        Ok(Self::wrap(inner, target, draft_model))
    }

    /// Change the sampling parameters given (the others stay; `None` is not
    /// given), checked before anything changes; the RNG starts again from
    /// `seed` only when it changes.
    #[pyo3(signature = (*, temperature = None, top_k = None, top_p = None, seed = None, min_p = None,
                        typical_p = None, repeat_penalty = None, repeat_last_n = None, presence_penalty = None,
                        frequency_penalty = None, logit_bias = None, grammar = None),
           text_signature = "(self, /, *, temperature=..., top_k=..., top_p=..., seed=..., min_p=..., \
                             typical_p=..., repeat_penalty=..., repeat_last_n=..., presence_penalty=..., \
                             frequency_penalty=..., logit_bias=..., grammar=...)")]
    #[allow(clippy::too_many_arguments)]
    fn set_sampling(
        &self,
        py: Python<'_>,
        temperature: Option<f32>,
        top_k: Option<WideInt>,
        top_p: Option<f32>,
        seed: Option<WideInt>,
        min_p: Option<f32>,
        typical_p: Option<f32>,
        repeat_penalty: Option<f32>,
        repeat_last_n: Option<WideInt>,
        presence_penalty: Option<f32>,
        frequency_penalty: Option<f32>,
        logit_bias: Option<BTreeMap<i64, f32>>,
        grammar: Option<String>,
    ) -> PyResult<()> {
        self.check_thread()?;
        let mut params = self.read(py, |generator| generator.config().sampling.clone());
        params.temperature = temperature.unwrap_or(params.temperature);
        params.top_p = top_p.unwrap_or(params.top_p);
        params.min_p = min_p.unwrap_or(params.min_p);
        params.typical_p = typical_p.unwrap_or(params.typical_p);
        params.repeat_penalty = repeat_penalty.unwrap_or(params.repeat_penalty);
        params.presence_penalty = presence_penalty.unwrap_or(params.presence_penalty);
        params.frequency_penalty = frequency_penalty.unwrap_or(params.frequency_penalty);
        if let Some(top_k) = top_k {
            params.top_k = top_k.narrow("top_k")?;
        }
        if let Some(seed) = seed {
            params.seed = seed.narrow("seed")?;
        }
        if let Some(last_n) = repeat_last_n {
            params.repeat_last_n = last_n.narrow("repeat_last_n")?;
        }
        if logit_bias.is_some() {
            params.logit_bias = bias_entries(logit_bias)?;
        }
        if let Some(text) = grammar {
            // The empty string takes the grammar away.
            params.grammar = (!text.is_empty()).then_some(text);
        }
        Ok(self.run(py, |generator| generator.set_sampling(params))??)
    }

    /// Decode the prompt and commit the first generated token; `conversation`
    /// (`(messages, template_sha256)`) records the chat the prompt renders.
    #[pyo3(signature = (prompt, conversation = None))]
    fn prefill(
        &self,
        py: Python<'_>,
        prompt: TokenIds,
        conversation: Option<(Pairs, String)>,
    ) -> PyResult<()> {
        let conversation = checked_conversation(conversation)?;
        let outcome = self.run(py, |generator| {
            (generator.prefill(&prompt.0)).map(|_| generator.set_conversation(conversation))
        })?;
        Ok(outcome??)
    }

    /// Continue with a new turn: decode `tokens` after every committed token,
    /// commit and return the first token after them. `conversation`
    /// (`(messages, template_sha256)`) becomes the recorded chat, in the same
    /// call, so the two cannot part.
    #[pyo3(signature = (tokens, conversation = None))]
    fn extend(
        &self,
        py: Python<'_>,
        tokens: TokenIds,
        conversation: Option<(Pairs, String)>,
    ) -> PyResult<i32> {
        let conversation = checked_conversation(conversation)?;
        let outcome = self.run(py, |generator| {
            (generator.extend(&tokens.0))
                .map(|first| generator.set_conversation(conversation).map(|()| first))
        })?;
        Ok(outcome??)
    }

    /// The conversation that led to the current reply: `(messages, template_sha256)`, or `None`.
    #[getter]
    fn conversation(&self, py: Python<'_>) -> Option<(Pairs, String)> {
        let generator = self.inner.lock_waiting(py);
        generator
            .conversation()
            .map(|c| (pairs(&c.messages), c.template_sha256.clone()))
    }

    /// Up to `max_n` generated tokens, running a round when none are waiting
    /// (empty once finished or full and all handed out).
    /// A negative `max_n` is a `ValueError`; one beyond every native size means "all".
    /// With `max_commit`, a round run for this call commits at most that many tokens.
    #[pyo3(signature = (max_n = WideInt(i128::MAX), *, max_commit = None),
           text_signature = "(self, /, max_n=..., *, max_commit=None)")]
    fn take(
        &self,
        py: Python<'_>,
        max_n: WideInt,
        max_commit: Option<WideInt>,
    ) -> PyResult<Vec<i32>> {
        let max_n = max_n.count("max_n")?;
        let max_commit = max_commit
            .map(|n| n.count("max_commit"))
            .transpose()?
            .unwrap_or(usize::MAX);
        Ok(self.run(py, |generator| generator.take_rounds(max_n, max_commit))??)
    }

    /// The target context's real length in tokens.
    #[getter]
    fn context_length(&self, py: Python<'_>) -> usize {
        self.inner.lock_waiting(py).context_length()
    }

    /// The adaptive draft policy's cost curve: microseconds to verify 1, 2,
    /// ... `n_draft + 1` rows (`None` for the fixed policy, or before it is measured).
    #[getter]
    fn cost_curve(&self, py: Python<'_>) -> Option<Vec<u32>> {
        let generator = self.inner.lock_waiting(py);
        generator
            .state()
            .adaptive
            .as_ref()
            .map(|a| a.cost_us.clone())
    }

    /// The adaptive draft policy's current estimate of a draft token's
    /// acceptance (`None` for the fixed policy, or before its curve is measured).
    #[getter]
    fn draft_acceptance(&self, py: Python<'_>) -> Option<f64> {
        let generator = self.inner.lock_waiting(py);
        generator.state().adaptive.as_ref().map(|a| a.acceptance())
    }

    /// The threads the contexts decode with (resolved, never 0).
    #[getter]
    fn n_threads(&self, py: Python<'_>) -> u32 {
        self.inner.lock_waiting(py).n_threads()
    }

    /// Whether rounds under a grammar draft the tokens it forces (settable;
    /// the reply is the same either way, only its speed changes).
    #[getter]
    fn grammar_drafts(&self, py: Python<'_>) -> bool {
        self.inner.lock_waiting(py).grammar_drafts()
    }

    #[setter]
    fn set_grammar_drafts(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        self.check_thread()?;
        self.inner.lock_waiting(py).set_grammar_drafts(on);
        Ok(())
    }

    /// Generated tokens handed out so far.
    #[getter]
    fn delivered(&self, py: Python<'_>) -> usize {
        self.inner.lock_waiting(py).state().delivered
    }

    /// Committed tokens not yet handed out.
    #[getter]
    fn undelivered(&self, py: Python<'_>) -> usize {
        self.inner.lock_waiting(py).undelivered()
    }

    /// The whole checkpoint of the current boundary, as bytes.
    fn checkpoint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.check_thread()?;
        let generator = &mut *self.inner.lock_waiting(py);
        let capture = checkpoint::capture(generator)?;
        super::buffers::filled_bytes(py, capture.encoded_len(), |out| {
            Ok(capture.encode_into(generator, out)?)
        })
    }

    /// A generator continuing a checkpoint on these models (validated first).
    ///
    /// The checkpoint's context length may be at most `max_n_ctx` (default:
    /// the target model's trained context length), its `n_batch` at most
    /// `max_n_batch` (default: 512), and, unless `max_n_batch` is given, a
    /// recurrent or hybrid target's rollback snapshots may take at most the
    /// model's size.
    #[staticmethod]
    #[pyo3(signature = (data, target, *, draft_model = None, n_threads = None, max_n_ctx = None,
                        max_n_batch = None),
           text_signature = "(data, target, *, draft_model=None, n_threads=None, max_n_ctx=None, max_n_batch=None)")]
    fn restore(
        py: Python<'_>,
        data: &[u8],
        target: Py<PyModel>,
        draft_model: Option<Py<PyModel>>,
        n_threads: Option<WideInt>,
        max_n_ctx: Option<WideInt>,
        max_n_batch: Option<WideInt>,
    ) -> PyResult<Self> {
        let n_threads = n_threads
            .map(|n| n.narrow::<i32>("n_threads"))
            .transpose()?;
        let limits = checkpoint::RestoreLimits {
            max_n_ctx: max_n_ctx
                .map(|n| n.narrow::<u32>("max_n_ctx"))
                .transpose()?,
            max_n_batch: max_n_batch
                .map(|n| n.narrow::<u32>("max_n_batch"))
                .transpose()?,
        };
        let decoded = checkpoint::decode(data)?;
        let runtime = match n_threads {
            Some(n_threads) => RuntimeOptions {
                n_threads,
                ..RUNTIME
            },
            None => decoded
                .meta
                .recorded_runtime(crate::native::default_threads(1).unsigned_abs()),
        };
        let target_model = Arc::clone(&target.get().inner);
        let draft = arc(&draft_model);
        let inner =
            py.detach(|| checkpoint::restore(&decoded, target_model, draft, runtime, limits))?;
        Ok(Self::wrap(inner, target, draft_model))
    }

    /// Move this generation onto a sequence of `engine` (its target state copied
    /// there, its own context freed); it goes on exactly as before. Refused,
    /// changing nothing, for another mode than `none` and `ngram`, another
    /// model, another `n_ctx`, a larger `n_batch`, or a full engine.
    fn attach(&self, py: Python<'_>, engine: &PySharedEngine) -> PyResult<()> {
        let engine = engine.arc(Arc::clone(&self.target.get().inner), false)?;
        Ok(self.run(py, |generator| generator.attach(&engine))??)
    }

    /// Give this generation's sequence of a shared engine back at once (a
    /// `Llama` letting go of its held generations does): it can no longer
    /// decode or checkpoint. Nothing for a generator with its own context.
    fn release_sequence(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |generator| generator.release_sequence())?;
        Ok(())
    }

    /// Replace this generation with a checkpoint of the same mode, configuration
    /// and models, reusing this generator's contexts. Everything is validated
    /// first; if anything is refused, this generator is left exactly as it was.
    fn load(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.check_thread()?;
        let decoded = checkpoint::decode(data)?;
        Ok(self.run(py, |generator| checkpoint::load_into(generator, &decoded))??)
    }

    /// The lowest and highest positions of sequence 0 in the target context
    /// and in the draft context, if the mode has one (`(-1, -1)` when empty).
    #[getter]
    fn memory_positions(&self, py: Python<'_>) -> PyResult<(Positions, Option<Positions>)> {
        self.check_thread()?;
        Ok(self.read(py, |generator| generator.memory_positions())?)
    }

    /// Prompt and committed tokens.
    #[getter]
    fn history(&self, py: Python<'_>) -> Vec<i32> {
        self.inner.lock_waiting(py).state().history.clone()
    }

    /// Let ``ngram`` mode's prompt lookup copy from ``corpus`` besides the
    /// history (``None``: the history alone). Other modes raise
    /// ``ValueError``. Proposals only: the generated text is the same either way.
    #[pyo3(signature = (corpus))]
    fn set_lookup_corpus(
        &self,
        py: Python<'_>,
        corpus: Option<PyRef<'_, PyLookupCorpus>>,
    ) -> PyResult<()> {
        let corpus = corpus.map(|corpus| Arc::clone(&corpus.inner));
        Ok(self.run(py, |generator| generator.set_lookup_corpus(corpus))??)
    }

    /// On a shared engine, keep this generation's exact cells under ``key``
    /// when it gives its sequence back, and let its prompt reuse only cells
    /// kept under the same key (None: it keeps none and reuses none). A key
    /// of more than 1,024 bytes raises ``ValueError``.
    #[pyo3(signature = (key))]
    fn set_reuse_key(&self, py: Python<'_>, key: Option<String>) -> PyResult<()> {
        Ok(self.run(py, |generator| generator.set_reuse_key(key.as_deref()))??)
    }

    /// The key of the cells this generation keeps and reuses on a shared
    /// engine (``""`` unless set; None: none).
    #[getter]
    fn reuse_key(&self, py: Python<'_>) -> Option<String> {
        self.read(py, |generator| generator.reuse_key().map(str::to_owned))
    }

    /// Record the log-probability of every token committed from now on with
    /// its `top_n` most likely alternatives (None: stop recording; asking
    /// again for the same `top_n` keeps the records).
    #[pyo3(signature = (top_n))]
    fn set_logprobs(&self, py: Python<'_>, top_n: Option<WideInt>) -> PyResult<()> {
        self.check_thread()?;
        let top_n = top_n
            .map(|n| n.narrow::<usize>("top_logprobs"))
            .transpose()?;
        Ok(self.run(py, |generator| generator.set_logprobs(top_n))??)
    }

    /// The log-probability records of reply positions `start..`: `(from,
    /// records)`, a record per reply token from position `from` (at least
    /// `start`) on, each `(logprob, [(token, logprob), ...])`; None when not recording.
    #[pyo3(signature = (start = 0))]
    fn logprobs(&self, py: Python<'_>, start: usize) -> Option<(usize, Vec<LogprobRecord>)> {
        self.read(py, |generator| {
            generator.logprobs().map(|log| {
                let from = log.from.max(start);
                let records = log.records.iter().skip(from - log.from);
                (from, records.map(|r| (r.logprob, r.top.clone())).collect())
            })
        })
    }

    /// Prompt tokens at the start of `history`.
    #[getter]
    fn n_prompt(&self, py: Python<'_>) -> usize {
        self.inner.lock_waiting(py).state().n_prompt
    }

    /// Tokens in the target's memory.
    #[getter]
    fn n_past(&self, py: Python<'_>) -> usize {
        self.inner.lock_waiting(py).state().n_past
    }

    /// Whether an end-of-generation token was committed.
    #[getter]
    fn finished(&self, py: Python<'_>) -> bool {
        self.inner.lock_waiting(py).state().finished
    }

    /// Rounds run.
    #[getter]
    fn rounds(&self, py: Python<'_>) -> u64 {
        self.inner.lock_waiting(py).state().rounds
    }

    /// Draft tokens verified.
    #[getter]
    fn n_drafted(&self, py: Python<'_>) -> u64 {
        self.inner.lock_waiting(py).state().drafted
    }

    /// Draft tokens accepted.
    #[getter]
    fn n_accepted(&self, py: Python<'_>) -> u64 {
        self.inner.lock_waiting(py).state().accepted
    }

    /// The mode's name.
    #[getter]
    fn mode(&self, py: Python<'_>) -> &'static str {
        self.inner.lock_waiting(py).config().mode.name()
    }

    /// The target model.
    #[getter]
    fn target(&self, py: Python<'_>) -> Py<PyModel> {
        self.target.clone_ref(py)
    }

    /// The draft model, if the mode has one.
    #[getter]
    fn draft_model(&self, py: Python<'_>) -> Option<Py<PyModel>> {
        self.draft.as_ref().map(|m| m.clone_ref(py))
    }

    /// The configuration as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        config_dict(py, self.inner.lock_waiting(py).config())
    }
}

/// The sampler's numeric settings, in the constructor's order (the defaults and a generator's config).
fn set_sampler_numbers(dict: &Bound<'_, PyDict>, sampling: &SamplingParams) -> PyResult<()> {
    dict.set_item("temperature", sampling.temperature)?;
    dict.set_item("top_k", sampling.top_k)?;
    dict.set_item("top_p", sampling.top_p)?;
    dict.set_item("seed", sampling.seed)?;
    dict.set_item("min_p", sampling.min_p)?;
    dict.set_item("typical_p", sampling.typical_p)?;
    dict.set_item("repeat_penalty", sampling.repeat_penalty)?;
    dict.set_item("repeat_last_n", sampling.repeat_last_n)?;
    dict.set_item("presence_penalty", sampling.presence_penalty)?;
    dict.set_item("frequency_penalty", sampling.frequency_penalty)
}

fn config_dict<'py>(py: Python<'py>, config: &GeneratorConfig) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("mode", config.mode.name())?;
    if let Mode::Ngram(ngram) = config.mode {
        dict.set_item("ngram_max", ngram.n_max)?;
        dict.set_item("ngram_min", ngram.n_min)?;
    }
    dict.set_item("n_draft", config.n_draft)?;
    dict.set_item("n_ctx", config.n_ctx)?;
    dict.set_item("n_batch", config.n_batch)?;
    dict.set_item("draft_policy", draft_policy_name(config.adaptive))?;
    let sampling = &config.sampling;
    set_sampler_numbers(&dict, sampling)?;
    let bias = PyDict::new(py);
    for &(token, value) in &sampling.logit_bias {
        bias.set_item(token, value)?;
    }
    dict.set_item("logit_bias", bias)?;
    dict.set_item("grammar", &sampling.grammar)?;
    Ok(dict)
}

/// Validate a checkpoint and describe it (no model needed): versions, models,
/// mode, configuration, positions, section sizes, checksum.
#[pyfunction]
pub(crate) fn inspect_checkpoint<'py>(
    py: Python<'py>,
    data: &[u8],
) -> PyResult<Bound<'py, PyDict>> {
    let decoded = checkpoint::decode(data)?;
    let meta = &decoded.meta;
    let config = meta.config()?;
    let info = PyDict::new(py);
    info.set_item("format_version", decoded.version)?;
    info.set_item("specstate_version", &meta.specstate_version)?;
    info.set_item("llama_cpp_sys_version", &meta.llama_cpp_sys_version)?;
    info.set_item("llama_cpp_build", &meta.llama_cpp_build)?;
    info.set_item("llama_cpp_commit", &meta.llama_cpp_commit)?;
    info.set_item("config", config_dict(py, &config)?)?;
    let model = |fingerprint: &checkpoint::ModelFingerprint| -> PyResult<Bound<'py, PyDict>> {
        let entry = PyDict::new(py);
        entry.set_item("file", &fingerprint.file)?;
        entry.set_item("size", fingerprint.size)?;
        entry.set_item("sha256", &fingerprint.sha256)?;
        Ok(entry)
    };
    info.set_item("target_model", model(&meta.target_model)?)?;
    info.set_item(
        "draft_model",
        meta.draft_model.as_ref().map(model).transpose()?,
    )?;
    let state = &decoded.state;
    info.set_item("n_prompt", state.n_prompt)?;
    info.set_item("n_tokens", state.history.len())?;
    info.set_item("n_generated", state.history.len() - state.n_prompt)?;
    info.set_item("n_delivered", state.delivered)?;
    info.set_item("n_past", state.n_past)?;
    info.set_item("finished", state.finished)?;
    info.set_item("n_threads", meta.n_threads)?;
    info.set_item(
        "cost_curve",
        meta.adaptive.as_ref().map(|a| a.cost_us.clone()),
    )?;
    info.set_item(
        "n_messages",
        meta.conversation.as_ref().map(|c| c.messages.len()),
    )?;
    info.set_item("rounds", state.rounds)?;
    info.set_item("drafted", state.drafted)?;
    info.set_item("accepted", state.accepted)?;
    info.set_item("sections", decoded.sections.clone())?;
    info.set_item("checksum", format!("{:08x}", decoded.checksum))?;
    info.set_item("size", data.len())?;
    Ok(info)
}

/// The SHA-256 (hex) and size of a model's file, as checkpoints record them.
#[pyfunction]
pub(crate) fn model_fingerprint(model: Py<PyModel>) -> (String, u64) {
    model.get().inner.file_digest().clone()
}
