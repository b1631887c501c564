//! The settings' rules and defaults.

use super::*;
use crate::limits::MAX_THREADS;

fn config(mode: Mode) -> GeneratorConfig {
    GeneratorConfig {
        mode,
        n_draft: 4,
        sampling: SamplingParams::default(),
        n_ctx: 64,
        n_batch: 8,
        adaptive: false,
    }
}

#[test]
fn every_mode_name_parses_back() {
    for name in Mode::NAMES {
        let mode = Mode::parse(name, NgramConfig::default()).unwrap();
        assert_eq!(mode.name(), name);
    }
    let error = Mode::parse("medusa", NgramConfig::default()).unwrap_err();
    assert_eq!(error.field, "mode");
    assert!(error.reason.contains("none, ngram, draft, mtp, eagle3"));
}

#[test]
fn ngram_sizes_are_checked_where_the_mode_is_built() {
    let bad = NgramConfig { n_max: 2, n_min: 3 };
    assert_eq!(Mode::parse("ngram", bad).unwrap_err().field, "ngram");
    assert_eq!(Mode::parse("none", bad).unwrap(), Mode::None);
    let too_long = NgramConfig {
        n_max: NgramConfig::MAX_N + 1,
        n_min: 1,
    };
    assert!(too_long.validate().is_err());
}

#[test]
fn each_generator_setting_names_itself_when_refused() {
    assert!(config(Mode::Mtp).validate().is_ok());
    let cases: [(GeneratorConfig, &str); 7] = [
        (
            GeneratorConfig {
                adaptive: true,
                ..config(Mode::None)
            },
            "draft_policy",
        ),
        (
            GeneratorConfig {
                n_ctx: 1,
                ..config(Mode::None)
            },
            "n_ctx",
        ),
        (
            GeneratorConfig {
                n_batch: 0,
                ..config(Mode::None)
            },
            "n_batch",
        ),
        (
            GeneratorConfig {
                n_batch: MAX_BATCH_ROWS as u32 + 1,
                ..config(Mode::None)
            },
            "n_batch",
        ),
        (
            GeneratorConfig {
                n_draft: 8,
                ..config(Mode::Draft)
            },
            "n_draft",
        ),
        (
            GeneratorConfig {
                n_draft: 0,
                ..config(Mode::Mtp)
            },
            "n_draft",
        ),
        (
            GeneratorConfig {
                sampling: SamplingParams {
                    top_p: 2.0,
                    ..SamplingParams::default()
                },
                ..config(Mode::None)
            },
            "top_p",
        ),
    ];
    for (config, field) in cases {
        assert_eq!(config.validate().unwrap_err().field, field, "{config:?}");
    }
    assert!(GeneratorConfig {
        n_draft: 0,
        ..config(Mode::None)
    }
    .validate()
    .is_ok());
}

#[test]
fn n_ctx_0_is_the_trained_length_and_n_batch_is_clamped_to_n_ctx() {
    let given = GeneratorConfig {
        n_ctx: 0,
        n_batch: 512,
        ..config(Mode::Mtp)
    };
    assert!(given.validate().is_ok());
    assert_eq!(given.check_resolved().unwrap_err().field, "n_ctx");
    let resolved = given.clone().resolve(128).unwrap();
    assert_eq!((resolved.n_ctx, resolved.n_batch), (128, 128));
    assert_eq!(resolved.check_resolved(), Ok(()));
    assert_eq!(resolved.clone().resolve(128), Ok(resolved));
    assert_eq!(
        given.clone().resolve(0).unwrap_err().to_string(),
        "n_ctx is 0, the model's trained context length, which this model does not record: \
         give a length of at least 2"
    );
    let long = GeneratorConfig {
        n_ctx: 129,
        ..given.clone()
    };
    assert_eq!(
        long.clone().resolve(128).unwrap_err().to_string(),
        "n_ctx must be between 2 and the model's trained context length 128 (0: that length), not 129"
    );
    assert_eq!(long.check_resolved().unwrap_err().field, "n_batch");
    assert_eq!(
        GeneratorConfig { n_ctx: 1, ..given }
            .validate()
            .unwrap_err()
            .to_string(),
        "n_ctx must be 0 (the model's trained context length) or at least 2, not 1"
    );
    // n_draft is checked against the rows the generator runs: n_batch clamped to n_ctx.
    let short = GeneratorConfig {
        n_ctx: 4,
        n_batch: 512,
        ..config(Mode::Mtp)
    };
    assert_eq!(short.validate().unwrap_err().field, "n_draft");
}

#[test]
fn the_defaults_pass_their_own_rules() {
    let defaults = GeneratorConfig::DEFAULT;
    assert_eq!(defaults, GeneratorConfig::default());
    assert!(defaults.validate().is_ok());
    assert!(RuntimeOptions::DEFAULT.validate().is_ok());
    for name in Mode::NAMES {
        let mode = Mode::parse(name, NgramConfig::DEFAULT).unwrap();
        let config = GeneratorConfig {
            mode,
            ..GeneratorConfig::DEFAULT
        };
        assert!(config.validate().is_ok(), "{name}");
    }
    let adaptive = GeneratorConfig {
        mode: Mode::Mtp,
        adaptive: true,
        ..GeneratorConfig::DEFAULT
    };
    assert!(adaptive.validate().is_ok());
    assert_eq!(draft_policy_name(defaults.adaptive), DRAFT_POLICIES[0]);
    assert_eq!(defaults.mode.name(), Mode::NAMES[0]);
}

#[test]
fn thread_counts_are_bounded() {
    let threads = |n_threads| RuntimeOptions {
        n_threads,
        ..RuntimeOptions::DEFAULT
    };
    assert!(threads(0).validate().is_ok());
    assert!(threads(-1).validate().is_err());
    assert!(threads(MAX_THREADS + 1).validate().is_err());
    assert_eq!(check_threads(MAX_THREADS.into()), Ok(MAX_THREADS));
    assert_eq!(
        check_threads(1 << 40).unwrap_err().to_string(),
        "n_threads must be between 0 (the default thread count) and 512, not 1099511627776"
    );
}

#[test]
fn each_sampler_names_itself_when_refused() {
    let base = SamplingParams::default();
    assert!(base.validate().is_ok() && !base.penalizes());
    let cases: [(SamplingParams, &str); 9] = [
        (
            SamplingParams {
                min_p: -0.1,
                ..base.clone()
            },
            "min_p",
        ),
        (
            SamplingParams {
                min_p: f32::NAN,
                ..base.clone()
            },
            "min_p",
        ),
        (
            SamplingParams {
                typical_p: 0.0,
                ..base.clone()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                repeat_penalty: 0.0,
                ..base.clone()
            },
            "repeat_penalty",
        ),
        (
            SamplingParams {
                repeat_last_n: -2,
                ..base.clone()
            },
            "repeat_last_n",
        ),
        (
            SamplingParams {
                presence_penalty: f32::INFINITY,
                ..base.clone()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: -1000.0,
                ..base.clone()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                logit_bias: vec![(2, 1.0), (1, 1.0)],
                ..base.clone()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                logit_bias: vec![(1, f32::NAN)],
                ..base.clone()
            },
            "logit_bias",
        ),
    ];
    for (params, field) in cases {
        let error = params.validate().unwrap_err();
        assert_eq!(error.field, field, "{params:?}");
    }
}

#[test]
fn a_refused_sampler_says_its_range_and_the_vocabulary_bounds_the_bias() {
    let base = SamplingParams::default();
    let error = SamplingParams {
        min_p: 2.0,
        ..base.clone()
    }
    .validate()
    .unwrap_err();
    assert_eq!(error.to_string(), "min_p must be in [0, 1], not 2");
    let biased = SamplingParams {
        logit_bias: vec![(0, 1.0), (9, -1.0)],
        ..base
    };
    assert!(biased.check_vocabulary(10).is_ok());
    assert_eq!(biased.check_vocabulary(9).unwrap_err().field, "logit_bias");
}
