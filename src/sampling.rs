//! Choosing tokens from logits: greedy choice, seeded stochastic sampling with
//! a serialisable RNG, and speculative verification that keeps the target's
//! distribution.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::native::{Grammar, NativeError};
use crate::settings::SamplingParams;

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
///
/// One pass keeping the `k` best seen in a heap (the sampler chain's `top_k` of 40 over a vocabulary of tens of
/// thousands), or a selection over every index when `k` is a large part of the vocabulary: the same tokens in the
/// same order either way.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(i32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut order: Vec<usize> = if k * 16 < logits.len() {
        best_indices(logits, k)
    } else {
        let mut all: Vec<usize> = (0..logits.len()).collect();
        all.select_nth_unstable_by(k - 1, by_logit);
        all.truncate(k);
        all
    };
    order.sort_by(by_logit);
    order
        .into_iter()
        .map(|index| (index as i32, logits[index]))
        .collect()
}

/// A candidate kept by [`best_indices`], ordered worst first: the smaller logit, then the larger id.
#[derive(Clone, Copy, Debug)]
struct Kept(f32, usize);

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Kept {}

impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Kept {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.total_cmp(&self.0).then(self.1.cmp(&other.1))
    }
}

/// The ids of the `k` largest logits (`0 < k <= logits.len()`), in no particular order: a heap of the `k` best
/// seen, its top the worst of them. A later id never beats an equal logit, so only a larger one enters.
fn best_indices(logits: &[f32], k: usize) -> Vec<usize> {
    let mut kept: std::collections::BinaryHeap<Kept> = (0..k).map(|i| Kept(logits[i], i)).collect();
    for (index, &logit) in logits.iter().enumerate().skip(k) {
        let worst = kept.peek().map_or(f32::NEG_INFINITY, |w| w.0);
        if logit.total_cmp(&worst) == std::cmp::Ordering::Greater {
            kept.pop();
            kept.push(Kept(logit, index));
        }
    }
    kept.into_iter().map(|Kept(_, index)| index).collect()
}

/// The probability of the most likely token under the softmax of `logits` (0 where the largest logit is not
/// finite). Computed in f32 in [`SUM_LANES`] running sums (a fixed order: the same bits on every run) with
/// [`exp_nonpositive`], so it costs a fraction of a libm `exp` per logit: it is taken over the whole vocabulary
/// every round and for every token a draft model drafts. Its relative error is about 1e-5, far inside the margins
/// it is compared against.
pub fn top_probability(logits: &[f32]) -> f64 {
    let best = largest(logits);
    if !best.is_finite() {
        return 0.0;
    }
    let mut sums = [0.0_f32; SUM_LANES];
    let chunks = logits.chunks_exact(SUM_LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (sum, &logit) in sums.iter_mut().zip(chunk) {
            *sum += exp_nonpositive(logit - best);
        }
    }
    let rest: f64 = rest
        .iter()
        .map(|&l| f64::from(exp_nonpositive(l - best)))
        .sum();
    let total: f64 = sums.iter().map(|&s| f64::from(s)).sum::<f64>() + rest;
    1.0 / total
}

/// The running sums (and maxima) a pass over the logits keeps, one per lane of a wide vector register.
const SUM_LANES: usize = 16;

/// The largest of `logits` (NaN ignored; negative infinity for none), in [`SUM_LANES`] running maxima.
fn largest(logits: &[f32]) -> f32 {
    let bigger = |a: f32, b: f32| if b > a { b } else { a };
    let mut lanes = [f32::NEG_INFINITY; SUM_LANES];
    let chunks = logits.chunks_exact(SUM_LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &logit) in lanes.iter_mut().zip(chunk) {
            *lane = bigger(*lane, logit);
        }
    }
    lanes
        .into_iter()
        .chain(rest.iter().copied())
        .fold(f32::NEG_INFINITY, bigger)
}

/// `e^x` for `x <= 0` (NaN and anything below -87 taken as -87, where `e^x` is the smallest normal f32): `2^k e^r`
/// with `k` the nearest integer to `x / ln 2` and `|r| <= ln 2 / 2` (ln 2 in two parts, Cody and Waite), `e^r` by
/// its Taylor polynomial of degree 6; relative error below 3e-7. Plain arithmetic and bit operations, so the
/// compiler vectorises a loop of it.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer, which the low bits of the sum then hold.
    const ROUNDER: f32 = 12_582_912.0;
    const LN2_HIGH: f32 = 0.693_145_75;
    const LN2_LOW: f32 = 1.428_606_8e-6;
    let x = x.max(-87.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUNDER;
    let k = shifted - ROUNDER;
    let r = x - k * LN2_HIGH - k * LN2_LOW;
    let e_r = 1.0
        + r * (1.0
            + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r / 720.0)))));
    // 2^k: the exponent field k + 127.
    let two_to_k = f32::from_bits(shifted.to_bits().wrapping_sub(ROUNDER.to_bits() - 127) << 23);
    e_r * two_to_k
}

/// The most alternatives a log-probability record lists (OpenAI's `top_logprobs` bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A committed token's log-probability under the target's distribution at its
/// position (the log-softmax of the model's logits, before the sampler chain,
/// as llama-cpp-python and OpenAI report it), and the `top` most likely
/// tokens' `(token, logprob)`, most likely first.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenLogprobs {
    /// The committed token's log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities.
    pub top: Vec<(i32, f32)>,
}

impl TokenLogprobs {
    /// The record of `token` chosen from `logits`, with its `top_n` most likely alternatives.
    pub fn of(logits: &[f32], token: i32, top_n: usize) -> Self {
        let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = logits
            .iter()
            .map(|&l| (f64::from(l) - f64::from(best)).exp())
            .sum();
        let log_total = f64::from(best) + total.ln();
        let logprob = |l: f32| (f64::from(l) - log_total) as f32;
        let at = usize::try_from(token).ok().and_then(|t| logits.get(t));
        Self {
            logprob: at.map_or(f32::NEG_INFINITY, |&l| logprob(l)),
            top: top_k(logits, top_n.min(MAX_TOP_LOGPROBS))
                .into_iter()
                .map(|(t, l)| (t, logprob(l)))
                .collect(),
        }
    }
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

/// A grammar over a reply: its state after the first `covers` tokens of the reply.
#[derive(Clone, Debug)]
pub struct GrammarState {
    grammar: Grammar,
    covers: usize,
}

impl GrammarState {
    /// `grammar` before any token of the reply.
    pub fn new(grammar: Grammar) -> Self {
        Self { grammar, covers: 0 }
    }

    /// Advance over the tokens of `reply` not yet followed (from the start
    /// again if the reply is shorter than what was followed). On a token the
    /// grammar forbids, the state goes back to the start of the reply and the
    /// error names the token and its place; so on a step llama.cpp refuses
    /// (a grammar over its bounds), with llama.cpp's reason.
    pub fn follow(&mut self, reply: &[i32]) -> Result<(), NativeError> {
        if reply.len() < self.covers {
            self.restart()?;
        }
        for (index, &token) in reply.iter().enumerate().skip(self.covers) {
            let refused = match self.grammar.try_accept(token) {
                Ok(true) => None,
                Ok(false) => Some(NativeError::InvalidArgument(format!(
                    "the reply does not follow the grammar: token {token} at reply position {index} is not allowed there"
                ))),
                Err(error) => Some(error),
            };
            if let Some(error) = refused {
                self.restart()?;
                return Err(error);
            }
            self.covers = index + 1;
        }
        Ok(())
    }

    /// Back to the start of a reply.
    pub fn restart(&mut self) -> Result<(), NativeError> {
        self.grammar.restart()?;
        self.covers = 0;
        Ok(())
    }
}

/// How a generation chooses its tokens: the parameters, the RNG they draw
/// from, and the grammar's state over the current reply.
#[derive(Clone, Debug)]
pub struct Sampler {
    /// The sampler chain's parameters and the seed.
    pub params: SamplingParams,
    /// The RNG, advanced by every stochastic choice.
    pub rng: Rng,
    /// The grammar of `params.grammar`, compiled for the target's vocabulary.
    pub grammar: Option<GrammarState>,
}

impl Sampler {
    /// A sampler whose RNG starts from `params.seed` (its grammar, if any,
    /// is compiled and set by the generator, which has the vocabulary).
    pub fn new(params: SamplingParams) -> Self {
        Self {
            rng: Rng::new(params.seed),
            params,
            grammar: None,
        }
    }

    /// The grammar's state after the reply, which the next choice follows.
    pub fn grammar(&self) -> Option<&Grammar> {
        self.grammar.as_ref().map(|state| &state.grammar)
    }

    /// Greedy choice (the RNG is never drawn from).
    pub fn greedy() -> Self {
        Self::new(SamplingParams::default())
    }

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// Choose a token from one row of logits that follows `history` (and,
    /// with a grammar, the reply it has followed).
    pub fn choose(&mut self, logits: &[f32], history: &[i32]) -> Result<i32, NativeError> {
        let grammar = self.grammar();
        if self.params.is_greedy() {
            greedy_choice(logits, &self.params, history, grammar)
        } else {
            let dist = constrained_distribution(logits, &self.params, history, grammar)?;
            Ok(sample(&dist, &mut self.rng))
        }
    }

    /// Choose a draft token after `history` and the distribution it was
    /// drawn from (a point mass when greedy): what rejection sampling needs
    /// of a drafter.
    pub fn draw(&mut self, logits: &[f32], history: &[i32]) -> (i32, Distribution) {
        if self.is_greedy() {
            let token = argmax(&adjusted(logits, &self.params, history));
            return (token, vec![(token, 1.0)]);
        }
        let dist = distribution(logits, &self.params, history);
        (sample(&dist, &mut self.rng), dist)
    }

    /// Verify `draft`, which follows `history`, against the target's rows: see [`verify`].
    pub fn verify<'a>(
        &mut self,
        rows: impl Fn(usize) -> &'a [f32],
        history: &[i32],
        draft: &[i32],
        draft_dists: Option<&[Distribution]>,
    ) -> Result<Verdict, NativeError> {
        let round = Round {
            history,
            draft,
            draft_dists,
            grammar: self.grammar.as_ref().map(|state| &state.grammar),
        };
        verify(rows, round, &self.params, &mut self.rng)
    }

    /// Advance the grammar over the reply's tokens it has not followed yet.
    pub fn follow(&mut self, reply: &[i32]) -> Result<(), NativeError> {
        self.grammar
            .as_mut()
            .map_or(Ok(()), |state| state.follow(reply))
    }

    /// A new reply begins: the grammar starts again.
    pub fn restart_grammar(&mut self) -> Result<(), NativeError> {
        self.grammar.as_mut().map_or(Ok(()), GrammarState::restart)
    }
}

/// No token is left: the grammar forbids every one the chain keeps.
fn dead_end() -> NativeError {
    NativeError::InvalidArgument(
        "the grammar allows no token of the vocabulary at this point of the reply".into(),
    )
}

/// A sparse probability distribution: `(token, probability)`, most likely first.
pub type Distribution = Vec<(i32, f64)>;

/// The logits after the logit bias and the repetition penalties over the
/// penalty window of `history` (borrowed unchanged when both are neutral).
///
/// Penalties as llama.cpp's `llama_sampler_penalties`: a token seen `c > 0`
/// times in the window has its logit divided by `repeat_penalty` when
/// positive, multiplied when not, then lowered by
/// `c * frequency_penalty + presence_penalty`.
pub fn adjusted<'a>(logits: &'a [f32], params: &SamplingParams, history: &[i32]) -> Cow<'a, [f32]> {
    let window = params.penalty_window(history);
    if params.logit_bias.is_empty() && window.is_empty() {
        return Cow::Borrowed(logits);
    }
    let mut out = logits.to_vec();
    for &(token, bias) in &params.logit_bias {
        if let Some(logit) = usize::try_from(token).ok().and_then(|t| out.get_mut(t)) {
            *logit += bias;
        }
    }
    let mut counts: HashMap<i32, u32> = HashMap::new();
    for &token in window {
        *counts.entry(token).or_default() += 1;
    }
    for (token, count) in counts {
        let Some(logit) = usize::try_from(token).ok().and_then(|t| out.get_mut(t)) else {
            continue;
        };
        if *logit <= 0.0 {
            *logit *= params.repeat_penalty;
        } else {
            *logit /= params.repeat_penalty;
        }
        *logit -= count as f32 * params.frequency_penalty + params.presence_penalty;
    }
    Cow::Owned(out)
}

/// `(token, probability)` at temperature 1 of candidates sorted by logit,
/// largest first.
fn softmax(candidates: &[(i32, f32)]) -> Vec<f64> {
    let Some(&(_, best)) = candidates.first() else {
        return Vec::new();
    };
    let weights: Vec<f64> = candidates
        .iter()
        .map(|&(_, logit)| (f64::from(logit) - f64::from(best)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    weights.into_iter().map(|w| w / total).collect()
}

/// Locally typical sampling (llama.cpp's `typical`): keep the candidates
/// whose surprise is closest to the entropy until their mass exceeds
/// `typical_p`. Candidates come and go sorted by logit, largest first.
fn typical(candidates: Vec<(i32, f32)>, typical_p: f32) -> Vec<(i32, f32)> {
    if typical_p >= 1.0 || candidates.len() <= 1 {
        return candidates;
    }
    let probs = softmax(&candidates);
    let entropy: f64 = probs
        .iter()
        .filter(|p| **p > 0.0)
        .map(|p| -p * p.ln())
        .sum();
    let score = |p: f64| (-p.ln() - entropy).abs();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| score(probs[a]).total_cmp(&score(probs[b])).then(a.cmp(&b)));
    let mut mass = 0.0;
    let mut keep = order.len();
    for (index, &candidate) in order.iter().enumerate() {
        mass += probs[candidate];
        if mass > f64::from(typical_p) {
            keep = index + 1;
            break;
        }
    }
    order.truncate(keep);
    order.sort_unstable();
    order.into_iter().map(|index| candidates[index]).collect()
}

/// Nucleus sampling: the fewest most likely candidates whose mass (at
/// temperature 1) reaches `top_p`.
fn top_p_cut(mut candidates: Vec<(i32, f32)>, top_p: f32) -> Vec<(i32, f32)> {
    if top_p >= 1.0 {
        return candidates;
    }
    let mut mass = 0.0;
    for (index, p) in softmax(&candidates).into_iter().enumerate() {
        mass += p;
        if mass >= f64::from(top_p) {
            candidates.truncate(index + 1);
            break;
        }
    }
    candidates
}

/// Min-p: the candidates whose probability is at least `min_p` times the
/// largest (llama.cpp compares logits with `max + ln(min_p)`).
fn min_p_cut(mut candidates: Vec<(i32, f32)>, min_p: f32) -> Vec<(i32, f32)> {
    let Some(&(_, best)) = candidates.first() else {
        return candidates;
    };
    if min_p <= 0.0 {
        return candidates;
    }
    let floor = best + min_p.ln();
    let keep = candidates
        .iter()
        .skip(1)
        .take_while(|(_, logit)| *logit >= floor)
        .count();
    candidates.truncate(keep + 1);
    candidates
}

/// The distribution `params` samples from after `history`: logit bias and
/// penalties ([`adjusted`]), then top-k, typical, top-p, min-p and
/// temperature, in llama.cpp's order.
pub fn distribution(logits: &[f32], params: &SamplingParams, history: &[i32]) -> Distribution {
    chain(&adjusted(logits, params, history), params)
}

/// [`distribution`] with the tokens `grammar` forbids removed first (after
/// bias and penalties, before top-k); an error when it forbids them all.
pub fn constrained_distribution(
    logits: &[f32],
    params: &SamplingParams,
    history: &[i32],
    grammar: Option<&Grammar>,
) -> Result<Distribution, NativeError> {
    let Some(grammar) = grammar else {
        return Ok(distribution(logits, params, history));
    };
    let mut masked = adjusted(logits, params, history).into_owned();
    grammar.mask(&mut masked)?;
    let dist = chain(&masked, params);
    if dist.is_empty() {
        return Err(dead_end());
    }
    Ok(dist)
}

/// Top-k, typical, top-p, min-p and temperature over adjusted logits (a
/// logit of minus infinity, forbidden by a grammar, is never a candidate).
fn chain(logits: &[f32], params: &SamplingParams) -> Distribution {
    let keep = if params.top_k == 0 {
        logits.len()
    } else {
        (params.top_k as usize).min(logits.len())
    };
    let mut candidates = top_k(logits, keep);
    candidates.retain(|(_, logit)| *logit > f32::NEG_INFINITY);
    let candidates = typical(candidates, params.typical_p);
    let candidates = top_p_cut(candidates, params.top_p);
    let candidates = min_p_cut(candidates, params.min_p);
    let Some(&(_, best)) = candidates.first() else {
        return Vec::new();
    };
    let temperature = f64::from(params.temperature);
    let mut weights: Distribution = candidates
        .into_iter()
        .map(|(token, logit)| {
            let scaled = (f64::from(logit) - f64::from(best)) / temperature;
            (token, scaled.exp())
        })
        .collect();
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    weights.iter_mut().for_each(|(_, w)| *w /= total);
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

/// What one round verifies: the draft, the history it follows, the
/// distributions it was drawn from (`None`: point masses), and the grammar's
/// state after the history.
#[derive(Clone, Copy, Debug)]
pub struct Round<'a> {
    /// Prompt and committed tokens before the draft.
    pub history: &'a [i32],
    /// The drafted tokens.
    pub draft: &'a [i32],
    /// The draft's distribution of each token, if the drafter sampled them.
    pub draft_dists: Option<&'a [Distribution]>,
    /// The grammar after the history (`None`: no grammar).
    pub grammar: Option<&'a Grammar>,
}

/// The target's choice from one row when greedy: the argmax after bias and
/// penalties over `history`, among the tokens `grammar` allows (the argmax
/// itself when allowed, else the best allowed of the largest logits, which
/// spares masking the whole vocabulary).
fn greedy_choice(
    row: &[f32],
    params: &SamplingParams,
    history: &[i32],
    grammar: Option<&Grammar>,
) -> Result<i32, NativeError> {
    let logits = adjusted(row, params, history);
    let best = argmax(&logits);
    let Some(grammar) = grammar else {
        return Ok(best);
    };
    if grammar.allows(best)? {
        return Ok(best);
    }
    if let Some(choice) = best_allowed_on_top(&logits, grammar)? {
        return choice.ok_or_else(dead_end);
    }
    let mut masked = logits.into_owned();
    grammar.mask(&mut masked)?;
    let best = argmax(&masked);
    if masked
        .get(best as usize)
        .is_none_or(|l| *l == f32::NEG_INFINITY)
    {
        return Err(dead_end());
    }
    Ok(best)
}

/// The largest logits a greedy choice under a grammar checks in one pass of
/// the grammar engine before it masks the whole vocabulary (the grammar's
/// choice is nearly always among the model's first few).
const GRAMMAR_CANDIDATES: usize = 64;

/// The argmax of `logits` among the tokens `grammar` allows, as masking every
/// forbidden logit then [`argmax`] gives it, found among the
/// [`GRAMMAR_CANDIDATES`] largest: `Some(Some(token))`, `Some(None)` when the
/// tokens it allows all have a logit of minus infinity (the grammar's dead
/// end), `None` when none of them is allowed or the row holds a NaN or ids
/// outside the vocabulary (the caller masks the whole vocabulary).
fn best_allowed_on_top(
    logits: &[f32],
    grammar: &Grammar,
) -> Result<Option<Option<i32>>, NativeError> {
    if logits.len() > grammar.n_vocab() || logits.iter().any(|l| l.is_nan()) {
        return Ok(None);
    }
    // Zeros of either sign as one key: `argmax` ranks them equal, the lower id first, and so does `top_k` then.
    let keys: Vec<f32> = logits
        .iter()
        .map(|&l| if l == 0.0 { 0.0 } else { l })
        .collect();
    let candidates = top_k(&keys, GRAMMAR_CANDIDATES);
    let ids: Vec<i32> = candidates.iter().map(|&(id, _)| id).collect();
    let allowed = grammar.allowed_among(&ids)?;
    // Every token past the candidates has a smaller key, or the same one and a larger id: the first allowed wins.
    Ok(candidates
        .iter()
        .zip(allowed)
        .find(|(_, allowed)| *allowed)
        .map(|(&(id, key), _)| (key != f32::NEG_INFINITY).then_some(id)))
}

/// Verify `round.draft` against the target's logit rows (`rows(i)` is the
/// row after the i-th verified token). Row `i` follows the history and the
/// draft tokens before it, so its penalties count them, as plain decoding's
/// would. Greedy: keep draft tokens while they equal the target's choice.
/// Sampling: standard speculative rejection sampling against
/// `draft_dists[i]`, the draft's distribution for token i; a drafter that
/// gives none (a point mass on the drafted token) has each row's token drawn
/// as plain sampling draws it and compared, which commits the tokens plain
/// sampling commits with the same seed, whatever the draft. The committed
/// tokens follow the target's own distribution exactly either way.
pub fn verify<'a>(
    rows: impl Fn(usize) -> &'a [f32],
    round: Round<'_>,
    params: &SamplingParams,
    rng: &mut Rng,
) -> Result<Verdict, NativeError> {
    let mut seen = params.penalty_window(round.history).to_vec();
    // The grammar after the accepted draft tokens (cloned at the first one).
    let mut advanced: Option<Grammar> = None;
    for (index, &token) in round.draft.iter().enumerate() {
        let row = rows(index);
        let grammar = advanced.as_ref().or(round.grammar);
        if let Some(next) = judge_row(
            row,
            token,
            params,
            &seen,
            grammar,
            rng,
            round.draft_dists.map(|d| &d[index]),
        )? {
            return Ok(Verdict {
                accepted: index,
                next,
            });
        }
        seen.push(token);
        if let Some(grammar) = round.grammar {
            let mut state = advanced.take().unwrap_or_else(|| grammar.clone());
            state.accept(token)?;
            advanced = Some(state);
        }
    }
    let row = rows(round.draft.len());
    let grammar = advanced.as_ref().or(round.grammar);
    let next = if params.is_greedy() {
        greedy_choice(row, params, &seen, grammar)?
    } else {
        sample(&constrained_distribution(row, params, &seen, grammar)?, rng)
    };
    Ok(Verdict {
        accepted: round.draft.len(),
        next,
    })
}

/// Judge one drafted `token` against its row: `None` accepts it, `Some(next)`
/// rejects it with the token committed in its place. Greedy: accept when it
/// is the target's choice. Sampling: rejection sampling against `q`, or
/// (no distribution) accept when it is the target's draw.
fn judge_row(
    row: &[f32],
    token: i32,
    params: &SamplingParams,
    seen: &[i32],
    grammar: Option<&Grammar>,
    rng: &mut Rng,
    q: Option<&Distribution>,
) -> Result<Option<i32>, NativeError> {
    if params.is_greedy() {
        let choice = greedy_choice(row, params, seen, grammar)?;
        return Ok((choice != token).then_some(choice));
    }
    let p = constrained_distribution(row, params, seen, grammar)?;
    let Some(q) = q else {
        // A drafted token with no distribution (a point mass): draw the
        // row's token as plain decoding draws it, with one uniform, and keep
        // the draft while it matches. Accepted with probability p(token), the
        // rejection committing a draw of p without that token: what rejection
        // sampling against a point mass gives, with the RNG drawn exactly as
        // without a draft, so the text does not depend on the draft lengths.
        let drawn = sample(&p, rng);
        return Ok((drawn != token).then_some(drawn));
    };
    let (pt, qt) = (probability(&p, token), probability(q, token));
    if qt > 0.0 && rng.uniform() < pt / qt {
        return Ok(None);
    }
    Ok(Some(sample(&residual(&p, q), rng)))
}

#[cfg(test)]
#[path = "sampling_tests.rs"]
mod tests;
