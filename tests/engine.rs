//! The round engine on the real SmolLM2-135M-Instruct model, with no Python:
//! every drafter that needs no extra model (none, n-gram, a draft model),
//! exact resume from a captured boundary, the rules for a full context and an
//! end-of-generation token, argument errors, and grammars over the bounds of
//! llama.cpp's grammar engine (patch 0004). `make test-rust` fetches
//! the model first (SPECSTATE_SMOLLM2 names it; otherwise the cache).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use specstate::generator::Generator;
use specstate::native::{Context, ContextKind, ContextParams, Grammar, Model, NativeError};
use specstate::sampling::{argmax, GrammarState, Rng, Sampler};
use specstate::session::{DraftSession, SessionConfig, SessionError, SpecType};
use specstate::settings::SamplingParams;
use specstate::settings::{GeneratorConfig, Mode, NgramConfig, RuntimeOptions};
use specstate::Error;

const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const REPETITIVE: &str = "one two three four, one two three four, one two three four, one two";

fn model_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SPECSTATE_SMOLLM2") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("SPECSTATE_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/specstate"))
        })
        .expect("HOME or SPECSTATE_CACHE");
    cache.join(SMOLLM2_FILE)
}

/// One test at a time: ggml's threads spin, and tests running side by side
/// on a small machine would slow each other down many times over.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn smollm2() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = model_path();
            let model = Model::load(&path, 0).unwrap_or_else(|error| {
                panic!("{error}: run `make test-rust`, which fetches SmolLM2 first")
            });
            Arc::new(model)
        })
        .clone()
}

fn config(mode: Mode, temperature: f32, n_ctx: u32) -> GeneratorConfig {
    GeneratorConfig {
        mode,
        n_draft: 4,
        sampling: SamplingParams {
            temperature,
            top_k: 40,
            top_p: 0.95,
            seed: 7,
            ..SamplingParams::default()
        },
        n_ctx,
        n_batch: 32,
        adaptive: false,
    }
}

fn generator_with(mode: Mode, temperature: f32, n_ctx: u32) -> Generator {
    let draft = mode.needs_draft_model().then(smollm2);
    let runtime = RuntimeOptions {
        n_threads: 1,
        ..RuntimeOptions::DEFAULT
    };
    let config = config(mode, temperature, n_ctx);
    Generator::new(smollm2(), draft, config, runtime).expect("generator")
}

fn generator(mode: Mode, temperature: f32) -> Generator {
    generator_with(mode, temperature, 256)
}

fn prompt(text: &str) -> Vec<i32> {
    smollm2().tokenize(text, true, false).expect("tokenize")
}

/// Up to `n` more generated tokens, one round's worth at a time.
fn take(generator: &mut Generator, n: usize) -> Vec<i32> {
    let mut tokens = Vec::new();
    while tokens.len() < n {
        let more = generator.take(n - tokens.len()).expect("take");
        if more.is_empty() {
            break;
        }
        tokens.extend(more);
    }
    tokens
}

const MODES: [Mode; 3] = [
    Mode::None,
    Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 }),
    Mode::Draft,
];

#[test]
fn a_restored_boundary_continues_exactly_in_every_mode() {
    let _serial = serial();
    for mode in MODES {
        for temperature in [0.0, 0.8] {
            let mut first = generator(mode, temperature);
            first.prefill(&prompt(REPETITIVE)).expect("prefill");
            take(&mut first, 9);
            let boundary = first.boundary().expect("boundary");
            let expected = take(&mut first, 24);

            let mut second = generator(mode, temperature);
            second.put_back(boundary).expect("restore");
            assert_eq!(take(&mut second, 24), expected, "{mode:?} at {temperature}");
        }
    }
}

#[test]
fn how_tokens_are_taken_does_not_change_what_is_generated() {
    let _serial = serial();
    for mode in MODES {
        let mut whole = generator(mode, 0.8);
        whole.prefill(&prompt(REPETITIVE)).expect("prefill");
        let expected = take(&mut whole, 30);
        let mut one_by_one = generator(mode, 0.8);
        one_by_one.prefill(&prompt(REPETITIVE)).expect("prefill");
        let singles: Vec<i32> = (0..30)
            .flat_map(|_| one_by_one.take(1).expect("take"))
            .collect();
        assert_eq!(singles, expected, "{mode:?}");
    }
}

#[test]
fn drafters_propose_and_the_target_accepts_some() {
    let _serial = serial();
    for mode in [MODES[1], MODES[2]] {
        let mut generator = generator(mode, 0.0);
        generator.prefill(&prompt(REPETITIVE)).expect("prefill");
        take(&mut generator, 40);
        let state = generator.state();
        assert!(
            state.drafted > 0 && state.accepted > 0,
            "{mode:?}: {state:?}"
        );
        assert!(state.rounds < 40, "{mode:?}: fewer rounds than tokens");
    }
}

#[test]
fn a_full_context_ends_the_generation_without_an_error() {
    let _serial = serial();
    for mode in MODES {
        let mut generator = generator_with(mode, 0.0, 64);
        generator.prefill(&prompt(REPETITIVE)).expect("prefill");
        take(&mut generator, 1000);
        let state = generator.state().clone();
        let length = generator.context_length();
        // Every committed token fits the context; the last round left one free.
        assert_eq!(state.history.len(), length, "{mode:?}");
        assert_eq!(state.n_past + 1, length);
        assert!(generator.take(5).expect("take").is_empty());
        assert_eq!(generator.state(), &state, "{mode:?}: nothing changes");
    }
}

#[test]
fn an_end_of_generation_token_is_the_last_committed() {
    let _serial = serial();
    let model = smollm2();
    let chat =
        "<|im_start|>user\nReply with the single word: yes<|im_end|>\n<|im_start|>assistant\n";
    let chat = model.tokenize(chat, false, true).expect("tokenize");
    for mode in MODES {
        let mut generator = generator(mode, 0.0);
        generator.prefill(&chat).expect("prefill");
        let tokens = take(&mut generator, 200);
        let state = generator.state().clone();
        assert!(state.finished, "{mode:?}: {tokens:?}");
        let end = tokens.iter().position(|t| model.is_eog(*t));
        assert_eq!(
            end,
            Some(tokens.len() - 1),
            "{mode:?}: nothing after the end"
        );
        assert!(generator.take(5).expect("take").is_empty());
        assert_eq!(generator.state(), &state);
    }
}

#[test]
fn bad_prompts_and_calls_are_refused_with_their_kind() {
    let _serial = serial();
    let mut generator = generator(Mode::None, 0.0);
    let invalid = |result: Result<i32, Error>, needle: &str| match result {
        Err(error @ (Error::Invalid(_) | Error::Vocabulary(_))) => {
            assert!(error.to_string().contains(needle), "{error}");
        }
        other => panic!("expected Invalid({needle}), got {other:?}"),
    };
    assert!(matches!(generator.take(1), Err(Error::Usage(_))));
    invalid(generator.prefill(&[]), "empty");
    invalid(generator.prefill(&[1, -1]), "vocabulary");
    invalid(generator.prefill(&[1; 256]), "no room");
    assert!(
        !generator.started(),
        "a refused prompt leaves nothing behind"
    );
    generator.prefill(&prompt("hello")).expect("prefill");
    assert!(matches!(generator.prefill(&[1]), Err(Error::Usage(_))));
}

#[test]
fn a_session_refuses_a_configuration_or_contexts_that_cannot_work() {
    let _serial = serial();
    let model = smollm2();
    let params = ContextParams {
        n_ctx: 128,
        n_batch: 16,
        n_ubatch: 16,
        n_seq_max: 1,
        n_rs_seq: 0,
        kind: ContextKind::Default,
        n_threads: 1,
    };
    let mut target = Context::new(Arc::clone(&model), params).expect("target");
    let mut draft = Context::new(Arc::clone(&model), params).expect("draft");
    let session = |n_draft_max, spec_type| SessionConfig {
        n_seq: 1,
        n_draft_max,
        n_min: 0,
        p_min: 0.0,
        spec_type,
    };
    let error = refused(&mut target, &mut draft, session(0, SpecType::Eagle3));
    assert!(matches!(error, SessionError::Config(_)), "{error:?}");
    let error = refused(&mut target, &mut draft, session(3, SpecType::Eagle3));
    assert!(
        matches!(error, SessionError::Incompatible(ref m) if m.contains("separate")),
        "{error:?}"
    );
    let error = refused(&mut target, &mut draft, session(3, SpecType::Mtp));
    assert!(
        matches!(error, SessionError::Incompatible(ref m) if m.contains("kind")),
        "{error:?}"
    );
}

fn refused(target: &mut Context, draft: &mut Context, config: SessionConfig) -> SessionError {
    let session = DraftSession::new(target, draft, config);
    session.err().expect("refused")
}

/// A grammar whose `levels` nested rules have ten alternatives each (a rule of
/// the next level, then a digit): 10^levels parse stacks once `root` reaches `l1`.
fn nested_alternatives(levels: usize, root: &str) -> String {
    let mut rules = format!("root ::= {root}\n");
    for level in 1..=levels {
        let inner = if level < levels {
            format!("l{} ", level + 1)
        } else {
            String::new()
        };
        let alternatives: Vec<String> =
            (0..10).map(|digit| format!("{inner}\"{digit}\"")).collect();
        rules.push_str(&format!("l{level} ::= {}\n", alternatives.join(" | ")));
    }
    rules
}

#[test]
fn a_grammar_over_the_engines_bounds_is_refused_with_a_typed_error() {
    let _serial = serial();
    let bound = "more than 1024 parse stacks at one point (LLAMA_GRAMMAR_MAX_STACKS)";
    let runtime = RuntimeOptions {
        n_threads: 1,
        ..RuntimeOptions::DEFAULT
    };
    let mut exploding = config(Mode::None, 0.0, 256);
    exploding.sampling.grammar = Some(nested_alternatives(6, "l1"));
    match Generator::new(smollm2(), None, exploding, runtime) {
        Err(Error::Setting(error)) => {
            assert!(
                error.field == "grammar" && error.reason.contains(bound),
                "{error}"
            );
        }
        other => panic!("expected the grammar's SettingError, got {:?}", other.err()),
    }
    // Two stacks at first, a million after an "a": refused when the first token is chosen.
    let mut late = config(Mode::None, 0.0, 256);
    late.sampling.grammar = Some(nested_alternatives(6, "\"a\" l1 | \"b\""));
    let mut generator = Generator::new(smollm2(), None, late, runtime).expect("two stacks");
    match generator.prefill(&prompt("Say a:")) {
        Err(Error::Native(NativeError::InvalidArgument(message))) => {
            assert!(message.contains(bound), "{message}");
        }
        other => panic!("expected the grammar's NativeError, got {other:?}"),
    }
    assert!(!generator.started(), "the prompt's decode is undone");
    let mut sampling = generator.config().sampling.clone();
    sampling.grammar = Some("root ::= \"b\" [a-z]*".into());
    generator.set_sampling(sampling).expect("a bounded grammar");
    let first = generator.prefill(&prompt("Say a:")).expect("prefill");
    let mut reply = vec![first];
    reply.extend(take(&mut generator, 4));
    let text = smollm2().detokenize(&reply, false).expect("detokenize");
    assert!(text.starts_with(b"b"), "{text:?}");
}

/// The greedy choice under a grammar, as masking every forbidden logit then taking the argmax gives it.
fn masked_choice(grammar: &Grammar, logits: &[f32]) -> Option<i32> {
    let mut masked = logits.to_vec();
    grammar.mask(&mut masked).expect("mask");
    let best = argmax(&masked);
    (masked[best as usize] != f32::NEG_INFINITY).then_some(best)
}

#[test]
fn a_greedy_choice_under_a_grammar_is_the_best_allowed_token() {
    let _serial = serial();
    let model = smollm2();
    let n_vocab = model.n_vocab();
    let cases = [
        // Few tokens allowed: an opening brace, spaces before it.
        (
            "root ::= [ ]* \"{\\\"key\\\": \" (\"true\" | \"false\") \"}\"",
            "",
        ),
        // Many allowed: any lower-case word, after an opening quote.
        ("root ::= \"\\\"\" [a-z]* \"\\\"\"", "\"ab"),
    ];
    let mut rng = Rng::new(11);
    for (gbnf, prefix) in cases {
        let mut grammar = Grammar::new(&model, gbnf).expect("grammar");
        for token in model.tokenize(prefix, false, false).expect("tokenize") {
            grammar
                .accept(token)
                .expect("the prefix follows the grammar");
        }
        let allowed: Vec<i32> = (0..n_vocab as i32)
            .filter(|&id| grammar.allows(id).expect("allows"))
            .collect();
        let forbidden = (0..n_vocab as i32)
            .find(|id| !allowed.contains(id))
            .expect("a forbidden token") as usize;
        let mut sampler = Sampler::greedy();
        sampler.grammar = Some(GrammarState::new(grammar.clone()));
        for round in 0..70 {
            let mut logits: Vec<f32> = (0..n_vocab).map(|_| rng.uniform() as f32 * 20.0).collect();
            let pick =
                |rng: &mut Rng| allowed[(rng.uniform() * allowed.len() as f64) as usize] as usize;
            match round % 7 {
                // The allowed tokens far below the rest: found only by masking the whole vocabulary.
                0 => allowed.iter().for_each(|&id| logits[id as usize] = -5.0),
                // Ties among allowed tokens (the lowest id wins), below one forbidden token.
                1 => {
                    (0..3).for_each(|_| logits[pick(&mut rng)] = 30.0);
                    logits[forbidden] = 31.0;
                }
                // Zeros of both signs among the allowed tokens: equal, so the lowest id wins.
                2 => {
                    logits.iter_mut().for_each(|l| *l = -*l);
                    logits[pick(&mut rng)] = 0.0;
                    logits[pick(&mut rng)] = -0.0;
                    logits[forbidden] = 1.0;
                }
                // Every allowed token at minus infinity: a dead end.
                3 => allowed
                    .iter()
                    .for_each(|&id| logits[id as usize] = f32::NEG_INFINITY),
                // An allowed token a little below the best forbidden ones.
                4 => logits[pick(&mut rng)] = 19.9,
                // Nothing above minus infinity (the lowest ids first, an allowed one among them for the words).
                5 => logits.fill(f32::NEG_INFINITY),
                _ => {}
            }
            let chosen = sampler.choose(&logits, &[]).ok();
            assert_eq!(
                chosen,
                masked_choice(&grammar, &logits),
                "{gbnf}, round {round}"
            );
        }
    }
}
