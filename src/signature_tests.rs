//! The Python bindings' text signatures state the core's defaults.
//!
//! PyO3 takes a `text_signature` only as a string literal (it renders any
//! other default as `...`), so the defaults are written there a second time,
//! as text. These tests read every binding's `#[pyo3(signature = ...,
//! text_signature = ...)]` from the sources (plain text: no Python, no
//! `python` feature) and check, parameter by parameter, that the literal
//! names the parameters of the signature with the values its default
//! expressions have: literals as Python writes them, and the owners of the
//! defaults ([`GeneratorConfig::DEFAULT`], [`SamplingParams::DEFAULT`],
//! [`NgramConfig::DEFAULT`], [`RuntimeOptions::DEFAULT`] and the limits)
//! evaluated here.

use crate::settings::SamplingParams;
use crate::settings::{draft_policy_name, GeneratorConfig, NgramConfig, RuntimeOptions};

/// Every bindings source with its file name.
const BINDINGS: [(&str, &str); 16] = [
    ("arguments.rs", include_str!("bindings/arguments.rs")),
    ("batched.rs", include_str!("bindings/batch_engine.rs")),
    ("chat.rs", include_str!("bindings/chat.rs")),
    ("context.rs", include_str!("bindings/context.rs")),
    ("corpus.rs", include_str!("bindings/corpus.rs")),
    ("embedding.rs", include_str!("bindings/embedding.rs")),
    ("errors.rs", include_str!("bindings/errors.rs")),
    ("generator.rs", include_str!("bindings/generator.rs")),
    ("guarded.rs", include_str!("bindings/guarded.rs")),
    ("info.rs", include_str!("bindings/info.rs")),
    ("mod.rs", include_str!("bindings/mod.rs")),
    ("model.rs", include_str!("bindings/model.rs")),
    ("session.rs", include_str!("bindings/session.rs")),
    (
        "shared_engine.rs",
        include_str!("bindings/shared_engine.rs"),
    ),
    ("threads.rs", include_str!("bindings/threads.rs")),
    ("validators.rs", include_str!("bindings/validators.rs")),
];

/// Every `text_signature` literal of `source`, as Python reads it (line
/// continuations joined).
fn text_signatures(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("text_signature = \"") {
        rest = &rest[at + "text_signature = \"".len()..];
        let end = rest.find("\")").expect("a closed literal");
        found.push(joined(&rest[..end]));
        rest = &rest[end..];
    }
    found
}

/// A literal's text with its line continuations joined.
fn joined(literal: &str) -> String {
    let mut lines = literal.split("\\\n");
    let mut text = lines.next().unwrap_or_default().to_string();
    for line in lines {
        text.push_str(line.trim_start());
    }
    text
}

/// Every `#[pyo3(signature = (...), text_signature = "...")]` of `source`:
/// the signature's parameter list and the literal.
fn signature_pairs(source: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("#[pyo3(signature = (") {
        rest = &rest[at + "#[pyo3(signature = (".len()..];
        let close = closing(rest);
        let parameters = rest[..close].to_string();
        let attribute_end = rest.find(")]").unwrap_or(rest.len());
        if let Some(literal) = rest[close..attribute_end + 2]
            .find("text_signature = \"")
            .map(|at| &rest[close + at + "text_signature = \"".len()..])
        {
            let end = literal.find("\")").expect("a closed literal");
            pairs.push((parameters, joined(&literal[..end])));
        }
        rest = &rest[close..];
    }
    pairs
}

/// The index of the parenthesis that closes the list `text` starts inside.
fn closing(text: &str) -> usize {
    let mut depth = 0;
    let mut quoted = false;
    for (at, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '[' if !quoted => depth += 1,
            ')' | ']' if !quoted && depth == 0 => return at,
            ')' | ']' if !quoted => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// A parameter list's items at its top level (commas inside parentheses or quotes kept).
fn items(list: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        let mut depth = 0;
        let mut quoted = false;
        let mut end = rest.len();
        for (at, c) in rest.char_indices() {
            match c {
                '"' | '\'' => quoted = !quoted,
                '(' | '[' if !quoted => depth += 1,
                ')' | ']' if !quoted => depth -= 1,
                ',' if !quoted && depth == 0 => {
                    end = at;
                    break;
                }
                _ => {}
            }
        }
        let item = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        if !item.is_empty() {
            found.push(item);
        }
        rest = rest[end..].trim_start_matches(',').trim();
    }
    found
}

/// A Python literal of a float default.
fn float(value: f32) -> String {
    format!("{value:?}")
}

/// A Python literal of a string default.
fn string(value: &str) -> String {
    format!("'{value}'")
}

/// The Python literal of a default expression of a binding's signature:
/// a Rust literal, or one of the core's defaults.
fn python_default(expression: &str) -> Option<String> {
    let inner = expression
        .strip_prefix("WideInt(")
        .and_then(|e| e.strip_suffix(')'))
        .unwrap_or(expression);
    let inner = inner
        .trim_end_matches(".into()")
        .trim_end_matches(" as i128");
    let literal = match inner {
        "None" => Some("None".to_string()),
        // No bound: the text signature shows `...`.
        "i128::MAX" => Some("...".into()),
        "true" => Some("True".into()),
        "false" => Some("False".into()),
        quoted if quoted.starts_with('"') => Some(string(quoted.trim_matches('"'))),
        number if number.parse::<i64>().is_ok() => Some(number.to_string()),
        _ => None,
    };
    literal.or_else(|| core_default(inner))
}

/// The value of one of the core's defaults named in a binding's signature.
fn core_default(name: &str) -> Option<String> {
    let config = GeneratorConfig::DEFAULT;
    let s = SamplingParams::DEFAULT;
    let ngram = NgramConfig::DEFAULT;
    let field = name
        .strip_prefix("DEFAULTS.")
        .or_else(|| name.strip_prefix("GeneratorConfig::DEFAULT."));
    let value = match field.unwrap_or(name) {
        "mode.name()" => string(config.mode.name()),
        "n_draft" => config.n_draft.to_string(),
        "n_ctx" => config.n_ctx.to_string(),
        "n_batch" => config.n_batch.to_string(),
        "sampling.temperature" => float(s.temperature),
        "sampling.top_k" => s.top_k.to_string(),
        "sampling.top_p" => float(s.top_p),
        "sampling.seed" => s.seed.to_string(),
        "sampling.min_p" => float(s.min_p),
        "sampling.typical_p" => float(s.typical_p),
        "sampling.repeat_penalty" => float(s.repeat_penalty),
        "sampling.repeat_last_n" => s.repeat_last_n.to_string(),
        "sampling.presence_penalty" => float(s.presence_penalty),
        "sampling.frequency_penalty" => float(s.frequency_penalty),
        "RuntimeOptions::DEFAULT.n_threads" | "RUNTIME.n_threads" => {
            RuntimeOptions::DEFAULT.n_threads.to_string()
        }
        "RUNTIME.grammar_drafts" => {
            let on = RuntimeOptions::DEFAULT.grammar_drafts;
            if on { "True" } else { "False" }.into()
        }
        "NGRAM.n_max" => ngram.n_max.to_string(),
        "NGRAM.n_min" => ngram.n_min.to_string(),
        "draft_policy_name(DEFAULTS.adaptive)" => string(draft_policy_name(config.adaptive)),
        "LLAMA_N_BATCH" | "crate::limits::LLAMA_N_BATCH" => {
            crate::limits::LLAMA_N_BATCH.to_string()
        }
        "DEFAULT_CORPUS_TOKENS" => crate::engine::corpus::DEFAULT_CORPUS_TOKENS.to_string(),
        "EMBEDDING_N_CTX" => crate::limits::EMBEDDING_N_CTX.to_string(),
        _ => return None,
    };
    Some(value)
}

/// The `(name, default)` of each parameter of a text signature or of a
/// binding's parameter list (`sep`: `=` or ` = `), markers (`*`, `/`,
/// `self`) with no default.
fn parameters(list: &str, sep: &str) -> Vec<(String, Option<String>)> {
    items(list)
        .into_iter()
        .map(|item| match item.split_once(sep) {
            Some((name, default)) => (name.to_string(), Some(default.to_string())),
            None => (item, None),
        })
        .collect()
}

/// Check one binding: the literal names the signature's parameters in order,
/// each default the Python value of the signature's expression (`...` may
/// stand for `None`: an argument that changes nothing when left out).
fn check_pair(file: &str, signature: &str, literal: &str) {
    let text = literal.trim_start_matches('(').trim_end_matches(')');
    let text = text.strip_prefix("self, /").unwrap_or(text);
    let stated = parameters(text, "=");
    let expected = parameters(signature, " = ");
    let names =
        |list: &[(String, Option<String>)]| list.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&stated), names(&expected), "{file}: {literal}");
    for ((name, stated), (_, expression)) in stated.iter().zip(&expected) {
        let value = expression.as_deref().map(|e| {
            python_default(e)
                .unwrap_or_else(|| panic!("{file}: no Python value known for {name} = {e}"))
        });
        let ellipsis = stated.as_deref() == Some("...") && value.as_deref() == Some("None");
        assert!(
            ellipsis || *stated == value,
            "{file}: {name}={stated:?}, the binding's default {value:?}"
        );
    }
}

#[test]
fn every_text_signature_states_its_bindings_defaults() {
    let mut checked = 0;
    for (file, source) in BINDINGS {
        for (signature, literal) in signature_pairs(source) {
            check_pair(file, &signature, &literal);
            checked += 1;
        }
    }
    // Every other literal belongs to a function PyO3 reads the parameters of, with no defaults to state.
    for (file, source) in BINDINGS {
        for (at, _) in source.match_indices("#[pyo3(text_signature = \"") {
            let literal = &text_signatures(&source[at..])[0];
            assert!(
                !literal.contains('='),
                "{file}: {literal} states defaults with no signature"
            );
            checked += 1;
        }
    }
    let literals: usize = BINDINGS
        .iter()
        .map(|(_, source)| text_signatures(source).len())
        .sum();
    assert_eq!(checked, literals);
    assert!(checked >= 31, "{checked} text signatures found");
}

#[test]
fn parameter_lists_split_at_their_top_level() {
    assert_eq!(
        items("a, *, b = WideInt(f(1, 2)), c = \"x, y\""),
        ["a", "*", "b = WideInt(f(1, 2))", "c = \"x, y\""]
    );
}

#[test]
fn text_signatures_are_read_as_python_reads_them() {
    let source = "text_signature = \"(a, \\\n      b=1)\")]\ntext_signature = \"(c)\")]";
    assert_eq!(text_signatures(source), ["(a, b=1)", "(c)"]);
}
