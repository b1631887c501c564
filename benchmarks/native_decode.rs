//! Greedy decoding in a native loop with no Python in it.
//!
//! `native_decode MODEL [TOKENS] [THREADS] [RUNS] [PROMPT_FILE]` prefills a prompt
//! (a fixed one, or PROMPT_FILE's text with special tokens parsed), then
//! decodes TOKENS tokens one at a time with greedy choice, RUNS times after one
//! warm-up, and prints one JSON line with the median decode and prefill speeds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use specstate::limits::EXACT_PROMPT_ROWS;
use specstate::native::{Batch, Context, ContextKind, ContextParams, Model};
use specstate::settings::GeneratorConfig;

const PROMPT: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle. \
Describe the sea, the weather and the keeper's daily routine in detail before the discovery.";

fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (index, value) in logits.iter().enumerate() {
        if *value > logits[best] {
            best = index;
        }
    }
    best as i32
}

/// One run: (prefill seconds, decode seconds, tokens generated).
fn run(model: &Arc<Model>, prompt: &[i32], tokens: usize, threads: i32) -> (f64, f64, Vec<i32>) {
    // The rows of a generator's contexts by default.
    let n_batch = GeneratorConfig::DEFAULT.n_batch;
    let params = ContextParams {
        n_ctx: 1024,
        n_batch,
        n_ubatch: n_batch,
        n_seq_max: 1,
        n_rs_seq: 0,
        kind: ContextKind::Default,
        n_threads: threads,
    };
    let mut context = Context::new(Arc::clone(model), params).expect("context");
    let mut batch = Batch::new(n_batch as usize).expect("batch");
    let started = Instant::now();
    // The prompt in the engine's exact chunks, the logits of its last row only.
    for (chunk_index, chunk) in prompt.chunks(EXACT_PROMPT_ROWS).enumerate() {
        batch.clear();
        let first = chunk_index * EXACT_PROMPT_ROWS;
        for (offset, &token) in chunk.iter().enumerate() {
            let pos = first + offset;
            batch
                .push(token, pos as i32, 0, pos + 1 == prompt.len())
                .expect("push");
        }
        context.decode(&batch).expect("prefill");
    }
    let mut next = argmax(context.logits(batch.len() as i32 - 1).expect("logits"));
    let prefill = started.elapsed().as_secs_f64();
    let mut generated = vec![next];
    let started = Instant::now();
    for step in 0..tokens - 1 {
        batch.clear();
        batch
            .push(next, (prompt.len() + step) as i32, 0, true)
            .expect("push");
        context.decode(&batch).expect("decode");
        next = argmax(context.logits(0).expect("logits"));
        generated.push(next);
    }
    (prefill, started.elapsed().as_secs_f64(), generated)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .expect("usage: native_decode MODEL [TOKENS] [THREADS] [RUNS]"),
    );
    let tokens: usize = args.next().map_or(128, |v| v.parse().expect("TOKENS"));
    let threads: i32 = args.next().map_or(2, |v| v.parse().expect("THREADS"));
    let runs: usize = args.next().map_or(5, |v| v.parse().expect("RUNS"));
    let model = Arc::new(Model::load(&path, 0).expect("model"));
    let prompt = match args.next() {
        Some(file) => {
            let text = std::fs::read_to_string(file).expect("PROMPT_FILE");
            model.tokenize(&text, false, true).expect("tokenize")
        }
        None => model.tokenize(PROMPT, true, false).expect("tokenize"),
    };
    let (_, _, reference) = run(&model, &prompt, tokens, threads);
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (p, d, generated) = run(&model, &prompt, tokens, threads);
        assert_eq!(
            generated, reference,
            "greedy decoding must be deterministic"
        );
        prefill.push(prompt.len() as f64 / p);
        decode.push((tokens - 1) as f64 / d);
    }
    println!(
        "{{\"decode_tokens_per_s\": {:.2}, \"prefill_tokens_per_s\": {:.2}, \"prompt_tokens\": {}, \"tokens\": {}, \"threads\": {}, \"runs\": {}, \"simd\": \"{}\"}}",
        median(decode),
        median(prefill),
        prompt.len(),
        tokens,
        threads,
        runs,
        specstate::native::info::compiled_simd_features().join(",")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use specstate::generator::Generator;
    use specstate::settings::RuntimeOptions;

    /// SmolLM2, as `tests/engine.rs` finds it (`make test-rust` fetches it and names it).
    fn smollm2() -> Arc<Model> {
        let path = std::env::var_os("SPECSTATE_SMOLLM2")
            .map(PathBuf::from)
            .expect("SPECSTATE_SMOLLM2: run `make test-rust`, which fetches SmolLM2 first");
        Arc::new(Model::load(&path, 0).expect("model"))
    }

    /// The benchmark's loop generates what the engine generates greedily
    /// from a prompt longer than one exact chunk, so `make bench` times the
    /// same work as the `none` mode it is set beside.
    #[test]
    fn the_native_loop_generates_the_engines_greedy_tokens() {
        const TOKENS: usize = 24;
        let model = smollm2();
        let prompt = model.tokenize(PROMPT, true, false).expect("tokenize");
        assert!(
            prompt.len() > EXACT_PROMPT_ROWS,
            "the prompt spans several chunks"
        );
        let (_, _, looped) = run(&model, &prompt, TOKENS, 2);
        let runtime = RuntimeOptions {
            n_threads: 2,
            ..RuntimeOptions::DEFAULT
        };
        let mut engine =
            Generator::new(model, None, GeneratorConfig::DEFAULT, runtime).expect("generator");
        engine.prefill(&prompt).expect("prefill");
        let mut generated = Vec::new();
        while generated.len() < TOKENS {
            let more = engine.take(TOKENS - generated.len()).expect("take");
            assert!(!more.is_empty(), "the engine stopped early");
            generated.extend(more);
        }
        assert_eq!(looped, generated);
    }
}
