//! The `meta` section: every way a file's meta can be refused, as data (a
//! valid checkpoint, one change of its meta, the error expected), checked by
//! one loop; then what each format version added, travelling and read back,
//! and the comparisons of a checkpoint's models and configuration.

use super::*;

/// The valid checkpoints the cases start from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    /// `ngram` mode (4, 2).
    Ngram,
    /// `none` mode.
    None,
    /// `eagle3` mode (a draft model).
    Eagle3,
    /// `none` mode with every sampler set ([`full_sampling`]; format version 5).
    Sampler,
    /// `mtp` mode with the adaptive policy (format version 4).
    Adaptive,
    /// `draft` mode with a recorded thread count of 2 (format version 3).
    Threads,
    /// `none` mode with a conversation (format version 3).
    Chat,
}

const NGRAM: Mode = Mode::Ngram(NgramConfig { n_max: 4, n_min: 2 });

fn chat() -> Conversation {
    Conversation {
        messages: vec![
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello!"),
            Message::new("user", "Bye <|im_end|>"),
        ],
        template_sha256: "ab".repeat(32),
    }
}

fn adaptive(n_draft: u32) -> AdaptiveState {
    AdaptiveState::new((1..=n_draft + 1).map(|r| 1000 * r).collect())
}

fn full_sampling() -> SamplingParams {
    SamplingParams {
        min_p: 0.05,
        typical_p: 0.9,
        repeat_penalty: 1.3,
        repeat_last_n: -1,
        presence_penalty: 0.5,
        frequency_penalty: -0.25,
        logit_bias: vec![(3, -2.5), (17, 1.0)],
        ..config(Mode::None).sampling
    }
}

/// What `base` is built from.
fn synthetic_base(base: Base) -> Synthetic {
    match base {
        Base::Ngram => synthetic(NGRAM),
        Base::None => synthetic(Mode::None),
        Base::Eagle3 => synthetic(Mode::Eagle3),
        Base::Sampler => {
            let mut s = synthetic(Mode::None);
            let config = GeneratorConfig {
                sampling: full_sampling(),
                ..config(Mode::None)
            };
            s.meta = Meta::new(&config, model("target.gguf"), None);
            s
        }
        Base::Adaptive => {
            let mut s = synthetic(Mode::Mtp);
            s.meta.adaptive = Some(adaptive(s.meta.n_draft));
            s
        }
        Base::Threads => {
            let mut s = synthetic(Mode::Draft);
            s.meta.n_threads = Some(2);
            s
        }
        Base::Chat => {
            let mut s = synthetic(Mode::None);
            s.meta.conversation = Some(chat());
            s
        }
    }
}

/// One change of a valid checkpoint's meta.
#[derive(Clone, Copy)]
enum Change {
    /// The meta section's bytes replaced.
    Payload(&'static [u8]),
    /// The meta JSON changed.
    Json(fn(&mut Value)),
    /// The header's format version changed (to one before a meta entry existed).
    Version(u16),
}

/// What the refusal (always a corrupt checkpoint, its message starting with
/// `meta`) says.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Is(&'static str),
    StartsWith(&'static str),
    Contains(&'static str),
}

use Change::{Json, Payload, Version};
use Expect::{Contains, Is, StartsWith};

/// Every refused meta: bytes that are not a meta object, a key too many (at
/// any depth), one missing, a value out of its type's range, a setting out of
/// its rule's, a part that does not fit the mode, an entry newer than the
/// file's version.
#[rustfmt::skip]
const CASES: &[(Base, Change, Expect)] = &[
    // Not a meta object.
    (Base::Ngram, Payload(b"{not json"), StartsWith("meta section: key must be a string")),
    (Base::Ngram, Payload(b""), StartsWith("meta section: EOF while parsing")),
    (Base::Ngram, Payload(b"42"), StartsWith("meta section: invalid type: integer `42`")),
    (Base::Ngram, Payload(b"[]"), StartsWith("meta section: invalid length 0")),
    (Base::Ngram, Payload(b"\xff\xfe"), StartsWith("meta section: expected value")),
    (Base::Ngram, Json(|m| m["extra"] = json!(1)), StartsWith("meta section: unknown field `extra`")),
    (Base::Ngram, Json(|m| m["target_model"]["x"] = json!(1)), StartsWith("meta section: unknown field `x`")),
    (Base::Ngram, Json(|m| { m.as_object_mut().unwrap().remove("seed"); }), StartsWith("meta section: missing field `seed`")),
    (Base::Ngram, Json(|m| m["n_ctx"] = json!(-1)), StartsWith("meta section: invalid value")),
    // Each setting, named.
    (Base::Ngram, Json(|m| m["n_ctx"] = json!(1)), Is("meta.n_ctx must be 0 (the model's trained context length) or at least 2, not 1")),
    // A checkpoint records a resolved configuration: the context length run, n_batch clamped to it.
    (Base::Ngram, Json(|m| m["n_ctx"] = json!(0)), Is("meta.n_ctx is 0: a generator's configuration holds the resolved context length")),
    (Base::Ngram, Json(|m| m["n_batch"] = json!(0)), Is("meta.n_batch must be between 1 and 1048576, not 0")),
    (Base::Ngram, Json(|m| m["n_batch"] = json!(257)), Is("meta.n_batch must be at most n_ctx (256) in a generator's configuration (a larger one is clamped to it), not 257")),
    (Base::Ngram, Json(|m| m["n_draft"] = json!(0)), Is("meta.n_draft must be between 1 and n_batch - 1 (31), not 0")),
    (Base::Ngram, Json(|m| m["n_draft"] = json!(32)), Is("meta.n_draft must be between 1 and n_batch - 1 (31), not 32")),
    (Base::None, Json(|m| m["n_draft"] = json!(4097)), Is("meta.n_draft must be at most 4096, not 4097")),
    (Base::Ngram, Json(|m| m["temperature"] = json!(-0.5)), Is("meta.temperature must be finite and >= 0, not -0.5")),
    (Base::Ngram, Json(|m| m["top_p"] = json!(0.0)), Is("meta.top_p must be in (0, 1], not 0")),
    (Base::Ngram, Json(|m| m["top_p"] = json!(1.5)), Is("meta.top_p must be in (0, 1], not 1.5")),
    (Base::Ngram, Json(|m| m["ngram"] = json!([2, 4])), Is("meta.ngram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64, not ngram_min=4 ngram_max=2")),
    (Base::Ngram, Json(|m| m["mode"] = json!("turbo")), Is("meta.mode: unknown mode \"turbo\" (or n-gram sizes that do not fit it)")),
    (Base::None, Json(|m| m["ngram"] = json!([4, 2])), Is("meta.mode: unknown mode \"none\" (or n-gram sizes that do not fit it)")),
    // A mode name from the file is cut to 64 characters in the message.
    (Base::Ngram, Json(|m| m["mode"] = json!("m".repeat(1000))), Is("meta.mode: unknown mode \"mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm\" (or n-gram sizes that do not fit it)")),
    (Base::None, Json(|m| m["draft_model"] = json!(model("d"))), Is("meta.draft_model: does not fit mode none")),
    (Base::Eagle3, Json(|m| m["draft_model"] = Value::Null), Is("meta.draft_model: does not fit mode eagle3")),
    // The recorded thread count.
    (Base::Threads, Json(|m| m["n_threads"] = json!(513)), Is("meta.n_threads must be between 0 (the default thread count) and 512, not 513")),
    (Base::Threads, Json(|m| m["n_threads"] = json!(u32::MAX)), Is("meta.n_threads must be between 0 (the default thread count) and 512, not 4294967295")),
    // The samplers.
    (Base::Sampler, Json(|m| m["sampler"]["min_p"] = json!(1.5)), Contains("meta.min_p must be in [0, 1]")),
    (Base::Sampler, Json(|m| m["sampler"]["min_p"] = json!(1e39)), Contains("meta.min_p must be in")),
    (Base::Sampler, Json(|m| m["sampler"]["typical_p"] = json!(0)), Contains("meta.typical_p must be in (0, 1]")),
    (Base::Sampler, Json(|m| m["sampler"]["repeat_penalty"] = json!(0)), Contains("meta.repeat_penalty")),
    (Base::Sampler, Json(|m| m["sampler"]["repeat_penalty"] = json!(1000)), Contains("meta.repeat_penalty")),
    (Base::Sampler, Json(|m| m["sampler"]["repeat_last_n"] = json!(-2)), Contains("meta.repeat_last_n")),
    (Base::Sampler, Json(|m| m["sampler"]["presence_penalty"] = json!(-101)), Contains("meta.presence_penalty")),
    (Base::Sampler, Json(|m| m["sampler"]["frequency_penalty"] = json!(101)), Contains("meta.frequency_penalty")),
    (Base::Sampler, Json(|m| m["sampler"]["logit_bias"] = json!([[5, 1.0], [5, 2.0]])), Contains("meta.logit_bias")),
    (Base::Sampler, Json(|m| m["sampler"]["logit_bias"] = json!([[-1, 1.0]])), Contains("meta.logit_bias")),
    (Base::Sampler, Json(|m| m["sampler"]["logit_bias"] = json!([[1, 1e5]])), Contains("meta.logit_bias")),
    (Base::Sampler, Json(|m| m["sampler"]["logit_bias"] = json!((0..=SamplingParams::MAX_LOGIT_BIAS).map(|t| json!([t, 0.5])).collect::<Vec<_>>())), Contains("at most")),
    (Base::Sampler, Json(|m| m["sampler"]["extra"] = json!(1)), Contains("unknown field")),
    (Base::Sampler, Json(|m| { m["sampler"].as_object_mut().unwrap().remove("min_p"); }), Contains("missing field")),
    // The adaptive policy's state.
    (Base::Adaptive, Json(|m| m["adaptive"]["cost_us"] = json!([1, 2])), Contains("needs 5")),
    (Base::Adaptive, Json(|m| m["adaptive"]["cost_us"][2] = json!(0)), Contains("between 1 and")),
    (Base::Adaptive, Json(|m| m["adaptive"]["cost_us"][2] = json!(-1)), Contains("invalid value")),
    (Base::Adaptive, Json(|m| m["adaptive"]["hits"][1] = json!(1_000_000)), Contains("hits <= trials")),
    (Base::Adaptive, Json(|m| m["adaptive"]["trials"][0] = json!(0)), Contains("1 <= trials")),
    (Base::Adaptive, Json(|m| m["adaptive"]["trials"] = json!([768])), Contains("invalid length")),
    (Base::Adaptive, Json(|m| m["adaptive"]["streak"] = json!(1)), Contains("invalid type")),
    (Base::Adaptive, Json(|m| m["adaptive"]["idle"] = json!(17)), Contains("probe interval")),
    (Base::Adaptive, Json(|m| m["adaptive"]["unsettled"] = json!([6, 100])), Contains("unsettled verification")),
    (Base::Adaptive, Json(|m| m["adaptive"]["extra"] = json!(1)), Contains("unknown field")),
    (Base::Adaptive, Json(|m| m["mode"] = json!("none")), Contains("draft_policy")),
    // The conversation.
    (Base::Chat, Json(|m| m["conversation"]["messages"] = json!([])), Contains("no messages")),
    (Base::Chat, Json(|m| m["conversation"]["messages"][0]["role"] = json!("")), Contains("message 0: the role")),
    (Base::Chat, Json(|m| m["conversation"]["messages"][1]["role"] = json!("a\nb")), Contains("message 1: the role")),
    (Base::Chat, Json(|m| m["conversation"]["messages"][2]["name"] = json!("x")), Contains("unknown field `name`")),
    (Base::Chat, Json(|m| m["conversation"]["template_sha256"] = json!("XYZ")), Contains("template_sha256")),
    (Base::Chat, Json(|m| m["conversation"] = json!(7)), Contains("invalid type")),
    // An entry in a file of a version before it.
    (Base::Threads, Version(2), Is("meta.n_threads: not part of format version 2")),
    (Base::Chat, Version(2), Is("meta.conversation: not part of format version 2")),
    (Base::Adaptive, Version(3), Is("meta.adaptive: not part of format version 3")),
    (Base::Sampler, Version(4), Is("meta.sampler: not part of format version 4")),
];

#[test]
fn every_refused_meta_is_corrupt_with_its_message() {
    let bases: Vec<(Base, Vec<u8>)> = [
        Base::Ngram,
        Base::None,
        Base::Eagle3,
        Base::Sampler,
        Base::Adaptive,
        Base::Threads,
        Base::Chat,
    ]
    .into_iter()
    .map(|base| (base, encode(&synthetic_base(base))))
    .collect();
    for (index, &(base, change, expected)) in CASES.iter().enumerate() {
        let bytes = &bases.iter().find(|(b, _)| *b == base).unwrap().1;
        assert!(decode(bytes).is_ok(), "{base:?} decodes");
        let changed = match change {
            Payload(json) => rebuilt(bytes, |s| *payload_of(s, SectionKind::Meta) = json.to_vec()),
            Json(change) => with_meta(bytes, change),
            Version(version) => patched(bytes, 8, &version.to_le_bytes()),
        };
        let message = corrupt_message(&changed);
        let case = format!("case {index} ({base:?}, {expected:?}): {message}");
        assert!(message.starts_with("meta"), "{case}");
        match expected {
            Is(text) => assert_eq!(message, text, "{case}"),
            StartsWith(text) => assert!(message.starts_with(text), "{case}"),
            Contains(text) => assert!(message.contains(text), "{case}"),
        }
    }
}

#[test]
fn the_setting_a_mode_ignores_is_not_checked() {
    // n_draft does not matter in mode none.
    let n_draft = with_meta(&valid(Mode::None), |meta| meta["n_draft"] = json!(0));
    assert_eq!(decode(&n_draft).unwrap().meta.n_draft, 0);
}

#[test]
fn a_conversation_travels_in_meta_from_version_3() {
    let mut s = synthetic(NGRAM);
    s.meta.conversation = Some(chat());
    let bytes = encode(&s);
    assert_eq!(decode(&bytes).unwrap().meta.conversation, Some(chat()));
    // Without a conversation the meta is version 2's, key for key, and a
    // version 2 file of it still decodes.
    let plain = valid(Mode::None);
    let meta: Value = serde_json::from_slice(&parts(&plain)[0].1).unwrap();
    assert!(meta.get("conversation").is_none());
    let version_2 = patched(&plain, 8, &2u16.to_le_bytes());
    let old = decode(&version_2).unwrap();
    assert_eq!((old.version, old.meta.conversation), (2, None));
}

#[test]
fn the_adaptive_policy_travels_in_meta_from_version_4() {
    let mut s = synthetic(NGRAM);
    s.meta.adaptive = Some(adaptive(s.meta.n_draft));
    let bytes = encode(&s);
    let decoded = decode(&bytes).unwrap();
    assert!(decoded.meta.config().unwrap().adaptive);
    let state = decoded.state.adaptive.expect("the policy state");
    assert_eq!(state.cost_us, vec![1000, 2000, 3000, 4000, 5000]);
    // Without it the policy is the fixed one, as in every older file.
    let plain_bytes = valid(Mode::Draft);
    let plain = decode(&plain_bytes).unwrap();
    assert!(!plain.meta.config().unwrap().adaptive && plain.state.adaptive.is_none());
}

#[test]
fn the_sampler_travels_in_meta_from_version_5() {
    let mut s = synthetic(Mode::Mtp);
    let mut config = config(Mode::Mtp);
    config.sampling = full_sampling();
    s.meta = Meta::new(&config, model("target.gguf"), None);
    let bytes = encode(&s);
    let decoded = decode(&bytes).unwrap();
    assert_eq!(decoded.meta.config().unwrap(), config);
    let meta: Value = serde_json::from_slice(&parts(&bytes)[0].1).unwrap();
    assert_eq!(meta["sampler"]["logit_bias"], json!([[3, -2.5], [17, 1.0]]));
    // An older file's samplers are the neutral ones.
    let old_bytes = patched(&valid(Mode::Mtp), 8, &4u16.to_le_bytes());
    let old = decode(&old_bytes).unwrap();
    let sampling = old.meta.config().unwrap().sampling;
    assert_eq!(
        sampling,
        SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            seed: 7,
            ..SamplingParams::default()
        }
    );
}

#[test]
fn the_thread_count_is_recorded_from_version_3() {
    let bytes = encode(&synthetic_base(Base::Threads));
    let decoded = decode(&bytes).unwrap();
    assert_eq!(decoded.meta.recorded_runtime(2).n_threads, 2);
    assert_eq!(decoded.meta.recorded_runtime(1).n_threads, 1); // at most the default thread count
    assert_eq!(
        decode(&valid(Mode::Draft))
            .unwrap()
            .meta
            .recorded_runtime(1)
            .n_threads,
        0
    );
    // 0, the default thread count, as every thread count (specstate records the resolved count).
    let zero = with_meta(&bytes, |m| m["n_threads"] = json!(0));
    assert_eq!(decode(&zero).unwrap().meta.recorded_runtime(4).n_threads, 0);
}

#[test]
fn models_and_configurations_are_compared() {
    let bytes = valid(Mode::Draft);
    let decoded = decode(&bytes).unwrap();
    let meta = &decoded.meta;
    let (target, draft) = (model("target.gguf"), model("draft.gguf"));
    assert_eq!(meta.check_models(&target, Some(&draft)), Ok(()));
    // Only content and size count, not the file name.
    let renamed = ModelFingerprint {
        file: "elsewhere.gguf".into(),
        ..target.clone()
    };
    assert_eq!(meta.check_models(&renamed, Some(&draft)), Ok(()));
    let other = model("other-target.gguf");
    let error = meta.check_models(&other, Some(&draft)).unwrap_err();
    assert_eq!(
        error,
        CheckpointError::ModelMismatch {
            role: "target",
            expected: target.to_string(),
            actual: other.to_string(),
        }
    );
    assert_eq!(
        error.to_string(),
        format!("the checkpoint's target model is {target}, but the target model given is {other}")
    );
    let error = meta.check_models(&target, None).unwrap_err();
    assert!(
        matches!(error, CheckpointError::ModelMismatch { role: "draft", ref actual, .. } if actual == "none")
    );
    let odd = ModelFingerprint {
        file: "a\nb".into(),
        ..target.clone()
    };
    assert!(odd.to_string().starts_with("a\\nb (1011 bytes, sha256 "));

    assert_eq!(meta.check_config(&config(Mode::Draft)), Ok(()));
    let mut changed = config(Mode::Draft);
    changed.n_batch = 64;
    let error = meta.check_config(&changed).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the checkpoint's n_batch is 32, the generator's is 64"
    );
    let error = meta.check_config(&config(Mode::Mtp)).unwrap_err();
    assert!(matches!(
        error,
        CheckpointError::ConfigMismatch { field: "mode", .. }
    ));
    // Sampling may change between calls: a load takes the checkpoint's.
    changed = config(Mode::Draft);
    changed.sampling.seed = 8;
    changed.sampling.min_p = 0.1;
    assert_eq!(meta.check_config(&changed), Ok(()));

    assert_eq!(check_n_ctx_cap(256, 256), Ok(()));
    assert_eq!(
        check_n_ctx_cap(257, 256).unwrap_err().to_string(),
        "the checkpoint's n_ctx is 257, the generator's is at most 256"
    );
}
