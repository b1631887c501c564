//! Unit tests of the sampler chain and speculative acceptance (src/sampling.rs).

use super::*;

fn plain(draft: &[i32]) -> Round<'_> {
    Round {
        history: &[],
        draft,
        draft_dists: None,
        grammar: None,
    }
}

#[test]
fn argmax_prefers_the_lowest_id_on_ties() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[5.0]), 0);
}

#[test]
fn top_k_is_sorted_and_bounded() {
    assert_eq!(
        top_k(&[1.0, 3.0, 2.0, 3.0], 3),
        vec![(1, 3.0), (3, 3.0), (2, 2.0)]
    );
    assert_eq!(top_k(&[1.0], 5), vec![(0, 1.0)]);
    assert!(top_k(&[1.0], 0).is_empty());
}

#[test]
fn top_k_keeps_the_same_tokens_as_a_full_sort() {
    let mut rng = Rng::new(5);
    for case in 0..200 {
        let n = 1 + case * 7 % 900;
        // Few distinct values, so that ties are common.
        let logits: Vec<f32> = (0..n)
            .map(|_| (rng.uniform() * 12.0).floor() as f32)
            .collect();
        let mut sorted: Vec<usize> = (0..n).collect();
        sorted.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
        for k in [1, 2, 5, 40, n / 2, n] {
            let expected: Vec<(i32, f32)> = sorted
                .iter()
                .take(k)
                .map(|&i| (i as i32, logits[i]))
                .collect();
            assert_eq!(top_k(&logits, k), expected, "n {n}, k {k}");
        }
    }
}

#[test]
fn top_probability_is_the_softmax_maximum() {
    assert!((top_probability(&[0.0, 0.0]) - 0.5).abs() < 1e-12);
    assert!(top_probability(&[10.0, 0.0, 0.0]) > 0.99);
    assert_eq!(top_probability(&[]), 0.0);
    assert_eq!(top_probability(&[f32::NEG_INFINITY; 3]), 0.0);
    assert_eq!(top_probability(&[0.0, f32::INFINITY]), 0.0);
    assert!((top_probability(&[0.0, f32::NAN, 0.0]) - 0.5).abs() < 1e-6);
}

/// The softmax maximum in f64 with libm's `exp`: what `top_probability` approximates.
fn reference_top_probability(logits: &[f32]) -> f64 {
    let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    1.0 / logits
        .iter()
        .map(|&l| (f64::from(l) - f64::from(best)).exp())
        .sum::<f64>()
}

#[test]
fn top_probability_agrees_with_the_f64_softmax_on_vocabulary_sized_rows() {
    let mut rng = Rng::new(11);
    for (n, spread) in [
        (1, 1.0),
        (15, 3.0),
        (17, 40.0),
        (49_152, 12.0),
        (151_936, 30.0),
        (151_936, 200.0),
    ] {
        let mut logits: Vec<f32> = (0..n)
            .map(|_| (rng.uniform() as f32 - 0.5) * spread)
            .collect();
        logits[n / 2] += spread / 4.0;
        let (fast, exact) = (top_probability(&logits), reference_top_probability(&logits));
        assert!(
            (fast / exact - 1.0).abs() < 1e-4,
            "n {n}, spread {spread}: {fast} against {exact}"
        );
    }
}

#[test]
fn exp_nonpositive_is_within_3e_7_of_libm_down_to_the_smallest_normal() {
    let mut x = 0.0_f32;
    while x > -87.0 {
        let relative = f64::from(exp_nonpositive(x)) / f64::from(x).exp() - 1.0;
        assert!(relative.abs() < 3e-7, "e^{x}: relative error {relative}");
        x -= 0.001_7;
    }
    assert_eq!(exp_nonpositive(-1_000.0), exp_nonpositive(-87.0));
}

#[test]
fn rng_state_round_trips_and_is_deterministic() {
    let mut a = Rng::new(7);
    let _ = a.uniform();
    let mut b = Rng::from_state(a.state()).unwrap();
    for _ in 0..100 {
        let (x, y) = (a.uniform(), b.uniform());
        assert_eq!(x, y);
        assert!((0.0..1.0).contains(&x));
    }
    assert!(Rng::from_state([0; 4]).is_none());
    assert_ne!(Rng::new(1).state(), Rng::new(2).state());
}

#[test]
fn distribution_applies_top_k_and_top_p() {
    let logits = [0.0_f32, 1.0, 2.0, 3.0];
    let params = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let all = distribution(&logits, &params, &[]);
    assert_eq!(
        all.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec![3, 2, 1, 0]
    );
    assert!((all.iter().map(|(_, p)| p).sum::<f64>() - 1.0).abs() < 1e-12);
    let two = distribution(
        &logits,
        &SamplingParams {
            top_k: 2,
            ..params.clone()
        },
        &[],
    );
    assert_eq!(two.len(), 2);
    let nucleus = distribution(
        &logits,
        &SamplingParams {
            top_p: 0.5,
            ..params
        },
        &[],
    );
    assert_eq!(nucleus, vec![(3, 1.0)]);
}

#[test]
fn rejection_sampling_keeps_the_target_distribution() {
    // Target p over 3 tokens; a point-mass draft on token 0 and a draft
    // distribution q: the committed first token must follow p either way.
    let logits = [0.0_f32, (2.0_f32).ln(), (3.0_f32).ln()];
    let params = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let p = distribution(&logits, &params, &[]);
    let q: Distribution = vec![(0, 0.7), (1, 0.2), (2, 0.1)];
    for dists in [None, Some(vec![q.clone()])] {
        let mut rng = Rng::new(42);
        let mut counts = [0_u32; 3];
        let trials = 60_000;
        for _ in 0..trials {
            let drafted = if dists.is_some() {
                sample(&q, &mut rng)
            } else {
                0
            };
            let round = Round {
                history: &[],
                draft: &[drafted],
                draft_dists: dists.as_deref(),
                grammar: None,
            };
            let verdict = verify(|_| &logits[..], round, &params, &mut rng).unwrap();
            let first = if verdict.accepted == 1 {
                drafted
            } else {
                verdict.next
            };
            counts[first as usize] += 1;
        }
        for (token, count) in counts.iter().enumerate() {
            let expected = probability(&p, token as i32);
            let seen = f64::from(*count) / f64::from(trials);
            assert!(
                (seen - expected).abs() < 0.01,
                "token {token}: {seen} vs {expected}"
            );
        }
    }
}

#[test]
fn greedy_verification_stops_at_the_first_mismatch() {
    let rows = [[0.0_f32, 1.0], [1.0, 0.0], [0.0, 1.0]];
    let mut rng = Rng::new(0);
    let params = SamplingParams::default();
    let verdict = verify(|i| &rows[i][..], plain(&[1, 1]), &params, &mut rng).unwrap();
    assert_eq!(
        verdict,
        Verdict {
            accepted: 1,
            next: 0
        }
    );
    let verdict = verify(|i| &rows[i][..], plain(&[1, 0]), &params, &mut rng).unwrap();
    assert_eq!(
        verdict,
        Verdict {
            accepted: 2,
            next: 1
        }
    );
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

fn assert_dist(dist: &Distribution, expected: &[(i32, f64)]) {
    assert_eq!(dist.len(), expected.len(), "{dist:?}");
    for (&(t, p), &(et, ep)) in dist.iter().zip(expected) {
        assert!(t == et && close(p, ep), "{dist:?} vs {expected:?}");
    }
}

#[test]
fn bias_then_penalties_follow_llama_cpp() {
    let logits = [2.0_f32, -1.0, 0.5, 3.0];
    let params = SamplingParams {
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        repeat_last_n: 3,
        logit_bias: vec![(2, 1.0), (3, 1.0)],
        ..SamplingParams::default()
    };
    // Window [1, 1, 3]: token 1 twice (negative: multiplied), token 3
    // once (positive: divided, after its bias); token 0 is outside it.
    let history = [0, 0, 1, 1, 3];
    let out = adjusted(&logits, &params, &history);
    assert_eq!(&out[..], &[2.0, -3.25, 1.5, 1.25]);
    // Greedy takes the argmax after them (3 before).
    let mut sampler = Sampler::new(params.clone());
    assert_eq!(sampler.choose(&logits, &history).unwrap(), 0);
    let whole = SamplingParams {
        repeat_last_n: -1,
        ..params.clone()
    };
    assert_eq!(
        adjusted(&logits, &whole, &history)[0],
        2.0 / 2.0 - 0.25 - 1.0
    );
    let off = SamplingParams {
        repeat_last_n: 0,
        logit_bias: Vec::new(),
        ..params
    };
    assert!(matches!(
        adjusted(&logits, &off, &history),
        Cow::Borrowed(_)
    ));
}

fn ln_probs(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn sampled() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    }
}

#[test]
fn min_p_keeps_tokens_near_the_best() {
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    let params = SamplingParams {
        min_p: 0.2,
        ..sampled()
    };
    let dist = distribution(&logits, &params, &[]);
    assert_dist(&dist, &[(0, 0.5 / 0.95), (1, 0.3 / 0.95), (2, 0.15 / 0.95)]);
}

#[test]
fn typical_keeps_the_tokens_nearest_the_entropy() {
    // Entropy 1.1421; surprises 0.693, 1.204, 1.897, 2.996: token 1 is
    // nearest, then token 0, whose mass 0.8 passes 0.7.
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    let params = SamplingParams {
        typical_p: 0.7,
        ..sampled()
    };
    let dist = distribution(&logits, &params, &[]);
    assert_dist(&dist, &[(0, 0.625), (1, 0.375)]);
}

#[test]
fn top_p_cuts_before_the_temperature() {
    let logits = ln_probs(&[0.5, 0.3, 0.2]);
    let params = SamplingParams {
        top_p: 0.75,
        temperature: 2.0,
        ..SamplingParams::default()
    };
    let dist = distribution(&logits, &params, &[]);
    let (a, b) = (0.5_f64.sqrt(), 0.3_f64.sqrt());
    assert_dist(&dist, &[(0, a / (a + b)), (1, b / (a + b))]);
}

#[test]
fn verification_penalizes_each_row_after_the_drafts_before_it() {
    let row = [0.0_f32, 1.0, 0.5];
    let params = SamplingParams {
        repeat_penalty: 4.0,
        ..SamplingParams::default()
    };
    // Plain decoding: 1, then 2 (token 1 penalized to 0.25), then 1 (0.25 > 0.125).
    let mut sampler = Sampler::new(params.clone());
    let mut history = vec![7];
    for _ in 0..3 {
        let next = sampler.choose(&row, &history).unwrap();
        history.push(next);
    }
    assert_eq!(history, [7, 1, 2, 1]);
    let mut rng = Rng::new(0);
    let round = Round {
        history: &[7],
        draft: &[1, 2],
        draft_dists: None,
        grammar: None,
    };
    let verdict = verify(|_| &row[..], round, &params, &mut rng).unwrap();
    assert_eq!(
        verdict,
        Verdict {
            accepted: 2,
            next: 1
        }
    );
}

/// The full chain's distribution of each committed position, checked by
/// chi-square: speculative rounds (drafts from `q`) against `p(t0) p(t1 | t0)`.
#[test]
fn rejection_sampling_keeps_the_full_chain_distribution() {
    let logits = [1.0_f32, 0.8, 0.5, 0.3, -0.2, -1.0];
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 5,
        top_p: 0.97,
        min_p: 0.05,
        typical_p: 0.99,
        repeat_penalty: 1.5,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        repeat_last_n: 4,
        logit_bias: vec![(3, 0.4)],
        ..SamplingParams::default()
    };
    let history = [0, 2, 0];
    let q: Distribution = vec![(0, 0.3), (1, 0.3), (2, 0.2), (3, 0.1), (4, 0.1)];
    let dists = vec![q.clone(), q.clone()];
    let mut rng = Rng::new(11);
    let trials = 40_000;
    let mut counts = [[0_u32; 6]; 6];
    for _ in 0..trials {
        let mut committed: Vec<i32> = Vec::new();
        while committed.len() < 2 {
            let draft = [sample(&q, &mut rng), sample(&q, &mut rng)];
            let seen = [&history[..], &committed].concat();
            let round = Round {
                history: &seen,
                draft: &draft,
                draft_dists: Some(&dists),
                grammar: None,
            };
            let verdict = verify(|_| &logits[..], round, &params, &mut rng).unwrap();
            committed.extend_from_slice(&draft[..verdict.accepted]);
            committed.push(verdict.next);
        }
        counts[committed[0] as usize][committed[1] as usize] += 1;
    }
    let first = distribution(&logits, &params, &history);
    let mut chi_square = 0.0;
    let mut cells = 0;
    for t0 in 0..6 {
        let second = distribution(&logits, &params, &[&history[..], &[t0]].concat());
        for t1 in 0..6 {
            let expected = probability(&first, t0) * probability(&second, t1) * f64::from(trials);
            let seen = f64::from(counts[t0 as usize][t1 as usize]);
            if expected == 0.0 {
                assert_eq!(seen, 0.0, "({t0}, {t1}) is outside the chain");
                continue;
            }
            chi_square += (seen - expected).powi(2) / expected;
            cells += 1;
        }
    }
    // The 99.9th percentile of chi-square with `cells - 1` (< 36) degrees of freedom is below 67.
    assert!(
        cells > 10 && chi_square < 67.0,
        "chi-square {chi_square} over {cells} cells"
    );
}
