//! The embedding context on the real SmolLM2-135M-Instruct model, with no
//! Python: exact and independent of the other inputs of a call, the poolings
//! reading the per-token rows, and refusals (typed, before anything is
//! decoded). `make test-rust` fetches the model first (SPECSTATE_SMOLLM2
//! names it; otherwise the cache).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use specstate::native::{
    Embedder, EmbedderParams, Embedding, EmbeddingInputError, Model, NativeError, Pooling,
    MAX_EMBEDDING_INPUTS,
};

const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

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
            let model = Model::load(&model_path(), 0).unwrap_or_else(|error| {
                panic!("{error}: run `make test-rust`, which fetches SmolLM2 first")
            });
            Arc::new(model)
        })
        .clone()
}

fn embedder(pooling: Option<Pooling>) -> Embedder {
    let params = EmbedderParams {
        n_ctx: 64,
        pooling,
        n_threads: 2,
    };
    Embedder::new(smollm2(), params).expect("an embedding context")
}

fn tokens(text: &str) -> Vec<i32> {
    smollm2().tokenize(text, true, false).expect("tokens")
}

fn pooled(embedding: Embedding) -> Vec<f32> {
    match embedding {
        Embedding::Pooled(vector) => vector,
        Embedding::PerToken(_) => panic!("a pooled embedding was expected"),
    }
}

#[test]
fn an_input_gives_the_same_bits_alone_or_among_others() {
    let _serial = serial();
    let mut mean = embedder(Some(Pooling::Mean));
    assert_eq!(mean.pooling(), Pooling::Mean);
    let (cat, other) = (tokens("The cat sat on the mat."), tokens("Revenue rose."));
    let alone = mean.embed(&cat).unwrap();
    assert_eq!(mean.embed(&cat).unwrap(), alone);
    let all = mean
        .embed_all(&[other.clone(), cat.clone(), other])
        .unwrap();
    assert_eq!(all[1], alone);
    assert_eq!(all[0], all[2]);
    assert_eq!(pooled(alone).len(), mean.n_embd());
}

#[test]
fn pooling_none_gives_a_row_per_token_that_the_poolings_read() {
    let _serial = serial();
    let cat = tokens("The cat sat on the mat.");
    let mut none = embedder(None);
    assert_eq!(none.pooling(), Pooling::None); // SmolLM2 records no pooling
    let Embedding::PerToken(rows) = none.embed(&cat).unwrap() else {
        panic!("pooling none gives one row per token");
    };
    assert_eq!(rows.len(), cat.len());
    assert!(rows.iter().all(|row| row.len() == none.n_embd()));
    let first = pooled(embedder(Some(Pooling::Cls)).embed(&cat).unwrap());
    let last = pooled(embedder(Some(Pooling::Last)).embed(&cat).unwrap());
    let mean = pooled(embedder(Some(Pooling::Mean)).embed(&cat).unwrap());
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4);
    assert!(close(&first, &rows[0]));
    assert!(close(&last, &rows[rows.len() - 1]));
    let average: Vec<f32> = (0..none.n_embd())
        .map(|i| rows.iter().map(|row| row[i]).sum::<f32>() / rows.len() as f32)
        .collect();
    assert!(close(&mean, &average));
}

#[test]
fn refused_inputs_are_typed_and_decode_nothing() {
    let _serial = serial();
    let mut mean = embedder(Some(Pooling::Mean));
    let cat = tokens("The cat sat on the mat.");
    let before = mean.embed(&cat).unwrap();
    let long = vec![cat[0]; 65];
    assert_eq!(
        mean.check_inputs(&[cat.clone(), long.clone()]),
        Err(EmbeddingInputError::ExceedsContext {
            index: 1,
            tokens: 65,
            n_ctx: 64
        })
    );
    assert_eq!(
        mean.embed(&long).unwrap_err(),
        NativeError::InvalidArgument(
            "Requested tokens (65) exceed context window of 64 (input 0)".into()
        )
    );
    assert_eq!(
        mean.check_inputs(&[Vec::new()]),
        Err(EmbeddingInputError::Empty { index: 0 })
    );
    let n_vocab = i32::try_from(smollm2().n_vocab()).unwrap();
    assert!(matches!(
        mean.check_inputs(&[vec![n_vocab]]),
        Err(EmbeddingInputError::Vocabulary { index: 0, .. })
    ));
    let many = vec![vec![cat[0]]; MAX_EMBEDDING_INPUTS + 1];
    assert!(matches!(
        mean.embed_all(&many),
        Err(NativeError::InvalidArgument(message)) if message.contains("2049 inputs")
    ));
    assert_eq!(mean.embed(&cat).unwrap(), before);
}

#[test]
fn bad_parameters_are_refused_before_llama_cpp_sees_them() {
    let _serial = serial();
    for (n_ctx, n_threads, expected) in [
        (1, 1, "n_ctx must be"),
        (
            1 << 20,
            1,
            "n_ctx must be between 2 and the model's trained context length 8192",
        ),
        (64, -1, "n_threads must be between 0"),
    ] {
        let params = EmbedderParams {
            n_ctx,
            pooling: None,
            n_threads,
        };
        match Embedder::new(smollm2(), params) {
            Err(NativeError::InvalidArgument(message)) => {
                assert!(message.contains(expected), "{message}")
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("n_ctx {n_ctx}, n_threads {n_threads} accepted"),
        }
    }
}
