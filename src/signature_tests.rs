//! The Python bindings' text signatures state the core's defaults.
//!
//! PyO3 takes a `text_signature` only as a string literal (it renders any
//! other default as `...`), so the defaults are written there a second time,
//! as text. These tests read the literals from the bindings' sources (plain
//! text: no Python, no `python` feature) and compare each with the
//! signature rendered from the owners of the defaults:
//! [`GeneratorConfig::DEFAULT`], [`SamplingParams::DEFAULT`],
//! [`NgramConfig::DEFAULT`] and [`RuntimeOptions::DEFAULT`].

use crate::settings::SamplingParams;
use crate::settings::{draft_policy_name, GeneratorConfig, NgramConfig, RuntimeOptions};

const GENERATOR_BINDINGS: &str = include_str!("bindings/generator.rs");
const CONTEXT_BINDINGS: &str = include_str!("bindings/context.rs");

/// Every `text_signature` literal of `source`, as Python reads it (line
/// continuations joined).
fn text_signatures(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("text_signature = \"") {
        rest = &rest[at + "text_signature = \"".len()..];
        let end = rest.find("\")").expect("a closed literal");
        let mut text = String::new();
        let mut lines = rest[..end].split("\\\n");
        text.push_str(lines.next().unwrap_or_default());
        for line in lines {
            text.push_str(line.trim_start());
        }
        found.push(text);
        rest = &rest[end..];
    }
    found
}

/// The literal of `source` whose parameters begin with `start`.
fn signature_starting(source: &str, start: &str) -> String {
    let matching: Vec<String> = text_signatures(source)
        .into_iter()
        .filter(|text| text.starts_with(start))
        .collect();
    assert_eq!(matching.len(), 1, "one text signature starts with {start}");
    matching.into_iter().next().unwrap_or_default()
}

/// A Python literal of a default.
fn float(value: f32) -> String {
    format!("{value:?}")
}

fn string(value: &str) -> String {
    format!("'{value}'")
}

/// A boolean as Python writes it.
fn boolean(value: bool) -> String {
    if value { "True" } else { "False" }.into()
}

/// `(lead, name=value, ...)`.
fn render(lead: &str, parameters: &[(&str, String)]) -> String {
    let defaults: Vec<String> = parameters
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    format!("({lead}{})", defaults.join(", "))
}

/// The sampler's keyword arguments with their defaults, in the constructor's order.
fn sampling_defaults() -> Vec<(&'static str, String)> {
    let s = SamplingParams::DEFAULT;
    assert!(s.logit_bias.is_empty() && s.grammar.is_none());
    vec![
        ("temperature", float(s.temperature)),
        ("top_k", s.top_k.to_string()),
        ("top_p", float(s.top_p)),
        ("seed", s.seed.to_string()),
        ("min_p", float(s.min_p)),
        ("typical_p", float(s.typical_p)),
        ("repeat_penalty", float(s.repeat_penalty)),
        ("repeat_last_n", s.repeat_last_n.to_string()),
        ("presence_penalty", float(s.presence_penalty)),
        ("frequency_penalty", float(s.frequency_penalty)),
        ("logit_bias", "None".into()),
        ("grammar", "None".into()),
    ]
}

#[test]
fn the_generators_text_signature_states_the_cores_defaults() {
    let config = GeneratorConfig::DEFAULT;
    let ngram = NgramConfig::DEFAULT;
    let mut parameters = vec![
        ("mode", string(config.mode.name())),
        ("draft_model", "None".into()),
        ("n_draft", config.n_draft.to_string()),
        ("n_ctx", config.n_ctx.to_string()),
        ("n_batch", config.n_batch.to_string()),
    ];
    parameters.extend(sampling_defaults());
    parameters.extend([
        ("ngram_max", ngram.n_max.to_string()),
        ("ngram_min", ngram.n_min.to_string()),
        ("n_threads", RuntimeOptions::DEFAULT.n_threads.to_string()),
        ("draft_policy", string(draft_policy_name(config.adaptive))),
        ("cost_curve", "None".into()),
        ("engine", "None".into()),
        (
            "grammar_drafts",
            boolean(RuntimeOptions::DEFAULT.grammar_drafts),
        ),
    ]);
    assert_eq!(
        signature_starting(GENERATOR_BINDINGS, "(target, *,"),
        render("target, *, ", &parameters)
    );
}

#[test]
fn check_samplings_text_signature_states_the_samplers_defaults() {
    assert_eq!(
        signature_starting(GENERATOR_BINDINGS, "(*, temperature"),
        render("*, ", &sampling_defaults())
    );
}

#[test]
fn the_contexts_text_signature_states_a_generators_context_sizes() {
    let config = GeneratorConfig::DEFAULT;
    let parameters = [
        ("n_ctx", config.n_ctx.to_string()),
        ("n_batch", config.n_batch.to_string()),
        ("n_ubatch", config.n_batch.to_string()),
        ("n_seq_max", "1".into()),
        ("n_rs_seq", "0".into()),
        ("kind", string("default")),
        ("n_threads", RuntimeOptions::DEFAULT.n_threads.to_string()),
        ("other", "None".into()),
    ];
    assert_eq!(
        signature_starting(CONTEXT_BINDINGS, "(model, *,"),
        render("model, *, ", &parameters)
    );
}

#[test]
fn text_signatures_are_read_as_python_reads_them() {
    let source = "text_signature = \"(a, \\\n      b=1)\")]\ntext_signature = \"(c)\")]";
    assert_eq!(text_signatures(source), ["(a, b=1)", "(c)"]);
}
