//! Choosing tokens from logits: greedy choice, seeded stochastic sampling with
//! a serialisable RNG, and speculative verification that keeps the target's
//! distribution.

pub use crate::settings::SamplingParams;

/// The id of the largest logit; the lowest id wins a tie (as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0_usize;
    for (index, &value) in logits.iter().enumerate().skip(1) {
        if value > logits[best] {
            best = index;
        }
    }
    best as i32
}

/// The `k` largest logits as `(token, logit)`, largest first, lowest id first on ties.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(i32, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    order.select_nth_unstable_by(k - 1, by_logit);
    order.truncate(k);
    order.sort_by(by_logit);
    order
        .into_iter()
        .map(|index| (index as i32, logits[index]))
        .collect()
}

/// The probability of the most likely token under the softmax of `logits`.
pub fn top_probability(logits: &[f32]) -> f64 {
    let Some(best) = logits.iter().copied().reduce(f32::max) else {
        return 0.0;
    };
    let total: f64 = logits
        .iter()
        .map(|&l| (f64::from(l) - f64::from(best)).exp())
        .sum();
    1.0 / total
}

/// xoshiro256** seeded by splitmix64: small, fast, and its whole state is four words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            state: [next(), next(), next(), next()],
        }
    }

    /// A generator continuing from a saved state (not all zero).
    pub fn from_state(state: [u64; 4]) -> Option<Self> {
        (state != [0; 4]).then_some(Self { state })
    }

    /// The whole state.
    pub fn state(&self) -> [u64; 4] {
        self.state
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform double in `[0, 1)` (53 random bits).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1_u64 << 53) as f64)
    }
}

/// How a generation chooses its tokens: the parameters and the RNG they draw from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// Temperature, top-k, top-p and seed.
    pub params: SamplingParams,
    /// The RNG, advanced by every stochastic choice.
    pub rng: Rng,
}

impl Sampler {
    /// A sampler whose RNG starts from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: Rng::new(params.seed),
        }
    }

    /// Greedy choice (the RNG is never drawn from).
    pub fn greedy() -> Self {
        Self::new(SamplingParams::default())
    }

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// Choose a token from one row of logits.
    pub fn choose(&mut self, logits: &[f32]) -> i32 {
        if self.is_greedy() {
            argmax(logits)
        } else {
            sample(&distribution(logits, &self.params), &mut self.rng)
        }
    }

    /// Choose a draft token and the distribution it was drawn from (a point
    /// mass when greedy): what rejection sampling needs of a drafter.
    pub fn draw(&mut self, logits: &[f32]) -> (i32, Distribution) {
        if self.is_greedy() {
            let token = argmax(logits);
            return (token, vec![(token, 1.0)]);
        }
        let dist = distribution(logits, &self.params);
        (sample(&dist, &mut self.rng), dist)
    }

    /// Verify `draft` against the target's rows: see [`verify`].
    pub fn verify<'a>(
        &mut self,
        rows: impl Fn(usize) -> &'a [f32],
        draft: &[i32],
        draft_dists: Option<&[Distribution]>,
    ) -> Verdict {
        verify(rows, draft, draft_dists, &self.params, &mut self.rng)
    }
}

/// A sparse probability distribution: `(token, probability)`, most likely first.
pub type Distribution = Vec<(i32, f64)>;

/// The distribution `params` samples from, after temperature, top-k and top-p.
pub fn distribution(logits: &[f32], params: &SamplingParams) -> Distribution {
    let keep = if params.top_k == 0 {
        logits.len()
    } else {
        (params.top_k as usize).min(logits.len())
    };
    let candidates = top_k(logits, keep);
    let Some(&(_, best)) = candidates.first() else {
        return Vec::new();
    };
    let temperature = f64::from(params.temperature);
    let mut weights: Vec<(i32, f64)> = candidates
        .into_iter()
        .map(|(token, logit)| {
            (
                token,
                ((f64::from(logit) - f64::from(best)) / temperature).exp(),
            )
        })
        .collect();
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    let mut mass = 0.0;
    let mut cut = None;
    for (index, (_, weight)) in weights.iter_mut().enumerate() {
        *weight /= total;
        mass += *weight;
        if cut.is_none() && mass >= f64::from(params.top_p) {
            cut = Some(index + 1);
        }
    }
    if let Some(cut) = cut {
        weights.truncate(cut);
    }
    let kept: f64 = weights.iter().map(|(_, w)| w).sum();
    weights.iter_mut().for_each(|(_, w)| *w /= kept);
    weights
}

/// Draw one token from `dist` with one uniform from `rng`.
pub fn sample(dist: &[(i32, f64)], rng: &mut Rng) -> i32 {
    let u = rng.uniform();
    let mut mass = 0.0;
    for &(token, p) in dist {
        mass += p;
        if u < mass {
            return token;
        }
    }
    dist.last().map_or(0, |&(token, _)| token)
}

/// The probability of `token` under `dist`.
pub fn probability(dist: &[(i32, f64)], token: i32) -> f64 {
    dist.iter()
        .find(|(t, _)| *t == token)
        .map_or(0.0, |(_, p)| *p)
}

/// The residual `max(0, p - q)`, normalised: where to sample after a rejection.
pub fn residual(p: &[(i32, f64)], q: &[(i32, f64)]) -> Distribution {
    let mut rest: Distribution = p
        .iter()
        .map(|&(token, pt)| (token, (pt - probability(q, token)).max(0.0)))
        .filter(|(_, w)| *w > 0.0)
        .collect();
    let total: f64 = rest.iter().map(|(_, w)| w).sum();
    if total <= 0.0 {
        return p.to_vec();
    }
    rest.iter_mut().for_each(|(_, w)| *w /= total);
    rest
}

/// The result of verifying a draft against the target's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Draft tokens accepted (a prefix of the draft).
    pub accepted: usize,
    /// The token the target commits after them.
    pub next: i32,
}

/// Verify `draft` against the target's logit rows (`rows(i)` is the row after
/// the i-th verified token). Greedy: keep draft tokens while they equal the
/// target's argmax. Sampling: standard speculative rejection sampling, with
/// `draft_dists[i]` the draft's distribution for token i, or a point mass on
/// the drafted token when the drafter gives none; the committed tokens then
/// follow the target's own distribution exactly.
pub fn verify<'a>(
    rows: impl Fn(usize) -> &'a [f32],
    draft: &[i32],
    draft_dists: Option<&[Distribution]>,
    params: &SamplingParams,
    rng: &mut Rng,
) -> Verdict {
    for (index, &token) in draft.iter().enumerate() {
        let row = rows(index);
        if params.is_greedy() {
            let choice = argmax(row);
            if choice != token {
                return Verdict {
                    accepted: index,
                    next: choice,
                };
            }
            continue;
        }
        let p = distribution(row, params);
        let point = vec![(token, 1.0)];
        let q: &[(i32, f64)] = draft_dists.map_or(&point, |dists| &dists[index]);
        let (pt, qt) = (probability(&p, token), probability(q, token));
        if qt > 0.0 && rng.uniform() < pt / qt {
            continue;
        }
        return Verdict {
            accepted: index,
            next: sample(&residual(&p, q), rng),
        };
    }
    let row = rows(draft.len());
    let next = if params.is_greedy() {
        argmax(row)
    } else {
        sample(&distribution(row, params), rng)
    };
    Verdict {
        accepted: draft.len(),
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn top_probability_is_the_softmax_maximum() {
        assert!((top_probability(&[0.0, 0.0]) - 0.5).abs() < 1e-12);
        assert!(top_probability(&[10.0, 0.0, 0.0]) > 0.99);
        assert_eq!(top_probability(&[]), 0.0);
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
        let all = distribution(&logits, &params);
        assert_eq!(
            all.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![3, 2, 1, 0]
        );
        assert!((all.iter().map(|(_, p)| p).sum::<f64>() - 1.0).abs() < 1e-12);
        let two = distribution(&logits, &SamplingParams { top_k: 2, ..params });
        assert_eq!(two.len(), 2);
        let nucleus = distribution(
            &logits,
            &SamplingParams {
                top_p: 0.5,
                ..params
            },
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
        let p = distribution(&logits, &params);
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
                let verdict = verify(
                    |_| &logits[..],
                    &[drafted],
                    dists.as_deref(),
                    &params,
                    &mut rng,
                );
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
        let verdict = verify(|i| &rows[i][..], &[1, 1], None, &params, &mut rng);
        assert_eq!(
            verdict,
            Verdict {
                accepted: 1,
                next: 0
            }
        );
        let verdict = verify(|i| &rows[i][..], &[1, 0], None, &params, &mut rng);
        assert_eq!(
            verdict,
            Verdict {
                accepted: 2,
                next: 1
            }
        );
    }
}
