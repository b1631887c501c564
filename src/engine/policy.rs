//! Adaptive draft length: each round drafts the number of tokens that
//! maximises the expected committed tokens per second of verification.
//!
//! Two inputs decide it:
//! - **A cost curve**: how long a decode of `r` rows takes, for `r` from 1
//!   (a plain decode) to the longest verify batch (`n_draft + 1`), and what
//!   one decode of a draft model adds per drafted token. A greedy generation
//!   starts from an estimate ([`AdaptiveState::estimated`]: a row adds an
//!   eighth of a plain decode, a draft model's decode costs its share of the
//!   target's weights) that its own rounds replace as they are timed, so it
//!   spends nothing on measuring before its first token; so does a sampled
//!   one drafting by prompt lookup. A sampled one with a draft model times its
//!   curve on its own target context before its prompt ([`measure_cost_curve`]).
//! - **The acceptance of recent rounds**: an exponentially decaying count of
//!   accepted draft tokens (hits) over verified ones up to and including the
//!   first rejection (trials), in fixed point. Under a geometric model (each
//!   next draft token is accepted with probability `alpha` given that the
//!   previous one was), a draft of `k` tokens commits `1 + alpha + ... +
//!   alpha^k` tokens on average, and the round costs `cost(k + 1)`.
//!   Acceptance comes in streaks (a quotation is copied token for token until
//!   it ends), so two counts are kept: one for rounds that follow a round
//!   whose draft was accepted whole, one for the others; each round reads and
//!   updates the count of its situation.
//!
//! The draft length is the `k` in `0..=limit` with the most expected tokens
//! per microsecond, `0` (decode plainly) included; a draft of `k` tokens
//! costs its verification and, with a draft model, `k` of its decodes. When a
//! plain round is chosen, a drafter that proposes for free (prompt lookup) is
//! still asked for one token, which is compared with the committed one; other
//! drafters are probed ([`Probe`]) after [`PROBE_AFTER`] rounds without
//! evidence, twice as many after each probe after which drafting still does
//! not pay (up to [`MAX_PROBE_AFTER`]), since a probe makes the draft model
//! catch up on the pause (its last tokens, `drafters::CATCH_UP_WINDOW`) and
//! draft; and once more right after
//! a first probe accepted whole, whose situation has no evidence of its own.
//! A draft model drafts, and is probed, only while the target has been sure
//! of most of its recent tokens ([`AdaptiveState::sure`]): where the target
//! itself hesitates (free prose), a smaller model rarely predicts its choice,
//! and the draft model's catch-up on the prompt and the pause would be paid
//! for nothing; where the target is sure of its first tokens, the first probe
//! does not wait for the pause.
//! A draft model stops drafting where it is unsure of its next token, so its
//! probe asks for as long a draft as the round allows: on text it predicts,
//! one probe shows how far it does; on text it does not, it stops early.
//! Such a probe is evidence of many tokens at once, so a draft model's
//! counts start from a lighter prior ([`DRAFT_MODEL_PRIOR`]). Its first
//! probe comes only where some draft would pay at high acceptance
//! ([`PROBE_ACCEPTANCE`]) at its own cost, which a greedy generation times on
//! one decode (the prompt's first token) before that probe: a draft model
//! that costs nearly what the target does never repays its catch-up on the
//! prompt.
//!
//! **Exactness.** Everything here is integer state that a checkpoint carries
//! (the curve and the draft cost in microseconds, the counts in fixed point),
//! and the choice is a pure function of it. A sampled `draft`-mode
//! generation's text depends on its draft lengths (rejection sampling against
//! the draft's distribution decides how the RNG is drawn), so its curve never
//! changes after it is measured: a restored generation makes the same choices
//! as the uninterrupted one, token for token. A greedy generation's text does
//! not (verification gives each token its single decode's logits, on the CPU),
//! nor does a sampled one's whose drafts carry no distributions (each row is
//! drawn as plain sampling draws it), so the curve is **live** there: each
//! round's own verify time moves the entry for its row count an eighth of the
//! way ([`AdaptiveState::observe_cost`]), or replaces an estimate,
//! keeping the policy current on a machine whose load changes. A verification
//! also slows the plain decode after it (measured in
//! `BatchTimer::between_plain`), so a plain round right after one charges
//! its excess over the plain entry to that verification's entry instead of
//! moving the plain entry ([`AdaptiveState::unsettled`]). A curve a caller
//! pins (`cost_curve=`) never moves, so that two fresh runs choose alike; nor
//! does any curve in a GPU build, where verification is exact only up to
//! near-ties.

use std::time::Instant;

use super::{decode_in_chunks, position, Error, Result, Round};
use crate::native::{Batch, Context};

/// Fixed-point scale of the acceptance counts.
const SCALE: u32 = 256;
/// Every count decays by an eighth per round that gives evidence.
const DECAY_SHIFT: u32 = 3;
/// The counts a generation starts from, `(hits, trials)` in each situation:
/// two in three, the same after a whole accepted draft as after others: a
/// higher prior there would set off a long draft after a one-token draft
/// accepted by chance on text that does not repeat (docs/measured.md,
/// "Adaptive draft length").
const PRIOR: [(u32, u32); 2] = [(2 * SCALE, 3 * SCALE); 2];
/// The counts a draft model's generation starts from: two in three as well,
/// weighing half as much. Its drafts stop where it is unsure and its probes
/// draft as far as it is sure, so a probe is evidence of many tokens at
/// once: after two probes accepted whole the estimate is near what they
/// showed, where the heavier prior would keep it low enough that drafting
/// at a draft model's cost never seems to pay.
const DRAFT_MODEL_PRIOR: [(u32, u32); 2] = [(SCALE, 3 * SCALE / 2); 2];
/// Rounds without evidence after which a drafter that does not propose for
/// free is probed as it takes a probe ([`Probe`]; at first, and after a
/// probe that found an accepted token).
pub const PROBE_AFTER: u32 = 16;
/// The longest pause between probes: each probe after which drafting still
/// does not pay doubles the pause, up to this.
pub const MAX_PROBE_AFTER: u32 = 256;
/// A target row whose most likely token has at least this probability counts
/// as sure ([`AdaptiveState::observe_sureness`]).
const SURE_PROBABILITY: f64 = 0.9;
/// The share of sure rounds (times [`SCALE`]) below which a draft model
/// neither drafts nor is probed, and the share a generation starts from.
const SURE_TO_PROBE: u32 = SCALE / 2;
/// The share of sure rounds at which a draft model's first probe comes
/// before the pause: four sure rounds in a row from the start.
const SURE_TO_PROBE_EARLY: u32 = SCALE / 2 + SCALE / 16;
/// The share of sure rounds decays by a 32nd per round: a stretch of sure
/// tokens in prose does not open the way to a probe, a reply that copies or
/// follows a pattern soon does.
const SURE_DECAY_SHIFT: u32 = 5;
/// The cost of a plain decode in an estimated curve before anything was timed
/// (microseconds; only the ratios matter until the first timing scales them).
const NOMINAL_MICROS: u32 = 10_000;
/// An estimated curve's cost of a batch of `rows` rows, in plain decodes:
/// what the exact multi-column kernels cost, or a little less for short
/// drafts, so that a draft is tried and its timing corrects the estimate (an
/// estimate too high would never be tried, and never corrected). Each row
/// beyond the first adds a tenth of a plain decode, and a little more the
/// more rows there are, as the exact kernels' cost rises (they take columns
/// in groups): 8 rows come to about twice one row and 16 rows to four times,
/// so that an estimate for a long draft, tried only where drafts have been
/// accepted, does not promise it for less than it costs.
fn estimated_shape(rows: usize) -> f64 {
    let extra = rows.saturating_sub(1) as f64;
    1.0 + 0.1 * extra + extra * extra / 150.0
}
/// The largest cost a curve may hold: one minute, in microseconds.
pub const MAX_COST_MICROS: u32 = 60_000_000;
/// The largest trial count the decaying counts can reach (a round adds at
/// most `MAX_SPECULATIVE_DRAFT_TOKENS + 1` trials, and decay keeps eight of
/// them), with room for the prior.
const MAX_TRIALS: u32 = (crate::speculative::MAX_SPECULATIVE_DRAFT_TOKENS as u32 + 2) * 8 * SCALE;
/// How much more a draft's expected tokens per microsecond must be than a
/// plain round's: acceptance and cost are estimates, and where drafts barely
/// pay the errors decide (docs/measured.md, "Adaptive draft length").
const DRAFT_MARGIN: f64 = 0.1;
/// Timed repetitions of each batch size (the fastest counts).
const REPETITIONS: usize = 2;

/// The adaptive policy's state: part of a generation's state and of its
/// checkpoints (`meta.adaptive`, checked with [`AdaptiveState::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveState {
    /// `cost_us[r - 1]`: microseconds to decode `r` rows, for `r` in `1..=n_draft + 1`.
    pub cost_us: Vec<u32>,
    /// Accepted draft tokens, decayed, times [`SCALE`]: after a rejection
    /// (or at the start), and after a draft accepted whole.
    pub hits: [u32; 2],
    /// Verified draft tokens up to the first rejection, decayed, times
    /// [`SCALE`], in the same two situations.
    pub trials: [u32; 2],
    /// Whether the last round that gave evidence had its draft accepted whole.
    pub streak: bool,
    /// Plain rounds in a row that gave no evidence.
    pub idle: u32,
    /// Whether the curve follows the rounds' own timings (a measured curve; see the module notes).
    #[serde(default)]
    pub live: bool,
    /// A live curve's last verification of several rows, `[rows, microseconds]`, until the next round says
    /// what it cost the round after it (`[0, 0]`: none).
    #[serde(default)]
    pub unsettled: [u32; 2],
    /// Microseconds one decode of the draft model adds to a round per drafted
    /// token (0: drafting costs nothing beside the verification).
    #[serde(default)]
    pub draft_us: u32,
    /// Which entries of the curve are still estimates (empty: none): the
    /// first timing of an entry replaces it, and the first timing of all
    /// scales every estimate.
    #[serde(default)]
    pub estimated: Vec<bool>,
    /// Whether `draft_us` is still an estimate (the first drafting timed replaces it).
    #[serde(default)]
    pub draft_estimated: bool,
    /// Rounds without evidence before the next probe ([`PROBE_AFTER`] to [`MAX_PROBE_AFTER`]).
    #[serde(default = "first_probe_after")]
    pub probe_after: u32,
    /// The share of recent rounds whose first target row was sure
    /// ([`SURE_PROBABILITY`]), decayed, times [`SCALE`] ([`SURE_TO_PROBE`]
    /// at first): observed only where a draft model is probed.
    #[serde(default = "first_sure")]
    pub sure: u32,
    /// Whether a draft model drafts: its counts start from [`DRAFT_MODEL_PRIOR`].
    #[serde(default)]
    pub model_drafts: bool,
}

fn first_probe_after() -> u32 {
    PROBE_AFTER
}

fn first_sure() -> u32 {
    SURE_TO_PROBE
}

/// How a drafter that does not propose for free is probed after rounds
/// without evidence, and in a situation that has had none yet once the other
/// has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It proposes for free: a plain round compares its proposal instead.
    Never,
    /// A one-token draft.
    OneToken,
    /// A draft as long as the round allows: the drafter stops where it is
    /// unsure, so on text it predicts one probe shows how far it does, and on
    /// text it cannot predict the probe costs little more than a one-token
    /// draft. The first such probe comes only where some draft would pay at
    /// [`PROBE_ACCEPTANCE`].
    WhileSure,
}

/// The acceptance at which a [`Probe::WhileSure`] drafter must be able to
/// pay for its first probe to come: that probe makes a draft model catch up
/// on the whole prompt, which only drafts that pay at high acceptance repay.
const PROBE_ACCEPTANCE: f64 = 0.9;

/// What a round drafted, for the policy to learn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The round verified a draft.
    Verified,
    /// A free one-token proposal, compared with the committed token.
    Shadow(bool),
    /// Nothing was drafted or proposed by the policy's choice.
    Nothing,
    /// The round's limit was zero (a budget or the context), not the policy's choice.
    Forced,
}

impl AdaptiveState {
    /// A policy with this cost curve and no acceptance seen yet.
    pub fn new(cost_us: Vec<u32>) -> Self {
        Self {
            cost_us,
            hits: PRIOR.map(|(hits, _)| hits),
            trials: PRIOR.map(|(_, trials)| trials),
            streak: false,
            idle: 0,
            live: false,
            unsettled: [0, 0],
            draft_us: 0,
            estimated: Vec::new(),
            draft_estimated: false,
            probe_after: PROBE_AFTER,
            sure: SURE_TO_PROBE,
            model_drafts: false,
        }
    }

    /// An estimated curve of `rows` entries that follows the rounds' timings:
    /// a batch costs [`estimated_shape`] plain decodes, and a draft model's
    /// decode costs `draft_share` of one (its weights' share of the target's;
    /// `None`: a drafter that costs nothing).
    pub fn estimated(rows: usize, draft_share: Option<f64>) -> Self {
        let plain = f64::from(NOMINAL_MICROS);
        let cost_us = (1..=rows)
            .map(|batch| (plain * estimated_shape(batch)).round() as u32)
            .collect();
        Self {
            estimated: vec![true; rows],
            draft_estimated: draft_share.is_some(),
            ..Self::measured(cost_us).priced(draft_share)
        }
    }

    /// This curve pricing a draft model's decode at `draft_share` of its
    /// plain decode, its counts at [`DRAFT_MODEL_PRIOR`] (`None`: a drafter
    /// that costs nothing).
    pub fn priced(mut self, draft_share: Option<f64>) -> Self {
        let plain = f64::from(self.cost_us.first().copied().unwrap_or(0));
        self.draft_us = draft_share.map_or(0, |share| {
            clamp_micros((plain * share.clamp(0.0, 1e3)).round() as i64)
        });
        self.model_drafts = draft_share.is_some();
        let prior = self.prior();
        self.hits = prior.map(|(hits, _)| hits);
        self.trials = prior.map(|(_, trials)| trials);
        self
    }

    /// The counts this generation started from.
    fn prior(&self) -> [(u32, u32); 2] {
        if self.model_drafts {
            DRAFT_MODEL_PRIOR
        } else {
            PRIOR
        }
    }

    /// Whether the entry for `rows` rows is still an estimate.
    fn is_estimate(&self, rows: usize) -> bool {
        self.estimated
            .get(rows.wrapping_sub(1))
            .copied()
            .unwrap_or(false)
    }

    /// A measured curve, which follows the rounds' timings where the text allows it.
    pub fn measured(cost_us: Vec<u32>) -> Self {
        Self {
            live: true,
            ..Self::new(cost_us)
        }
    }

    /// Whether a round moves the curve, in a generation whose text does not
    /// depend on its draft lengths (`lengths_free`: greedy, or drafts without
    /// distributions).
    pub fn follows_timings(&self, lengths_free: bool) -> bool {
        self.live && lengths_free && !cfg!(any(feature = "cuda", feature = "metal"))
    }

    /// A round verified `rows` rows in `micros`. A verification of several
    /// rows waits for the next round: if that is plain, its excess over the
    /// plain entry is added to the verification's time, which moves the
    /// verification's entry, and the plain entry stays; otherwise the
    /// verification's own time moves it. A plain round after a plain round
    /// moves the plain entry. Each entry moves an eighth of the way to its sample.
    pub fn observe_cost(&mut self, rows: usize, micros: u64) {
        if rows == 0 || rows > self.cost_us.len() {
            return;
        }
        let micros = micros.clamp(1, u64::from(MAX_COST_MICROS)) as i64;
        let [before_rows, before_micros] = std::mem::take(&mut self.unsettled);
        if before_rows > 0 {
            let excess = if rows == 1 {
                micros - i64::from(self.cost_us[0])
            } else {
                0
            };
            self.move_entry(before_rows as usize, i64::from(before_micros) + excess);
            if rows == 1 {
                return;
            }
        }
        if rows == 1 {
            self.move_entry(1, micros);
        } else {
            self.unsettled = [rows as u32, micros as u32];
        }
    }

    /// The entry for `rows` rows moves an eighth of the way to `sample`
    /// microseconds; an estimate is replaced by it ([`AdaptiveState::timed`]).
    fn move_entry(&mut self, rows: usize, sample: i64) {
        if self.is_estimate(rows) {
            return self.timed(rows, clamp_micros(sample));
        }
        if let Some(cost) = self.cost_us.get_mut(rows.wrapping_sub(1)) {
            *cost = clamp_micros(i64::from(*cost) + (sample - i64::from(*cost)) / 8);
        }
    }

    /// The first timing of the entry for `rows` rows: while every entry is
    /// an estimate it scales them all (and an estimated draft cost) to it;
    /// then it replaces its entry, and each estimate left is derived anew from
    /// the timed entries around it ([`AdaptiveState::reestimate`]).
    fn timed(&mut self, rows: usize, micros: u32) {
        if self.estimated.iter().all(|&estimate| estimate) {
            let scale = f64::from(micros) / f64::from(self.cost_us[rows - 1].max(1));
            let scaled = |cost: u32| clamp_micros((f64::from(cost) * scale).round() as i64);
            self.cost_us
                .iter_mut()
                .for_each(|cost| *cost = scaled(*cost));
            if self.draft_estimated {
                self.draft_us = scaled(self.draft_us);
            }
        }
        self.cost_us[rows - 1] = micros;
        self.estimated[rows - 1] = false;
        self.reestimate();
        if !self.estimated.contains(&true) {
            self.estimated.clear();
        }
    }

    /// Each estimated entry from its nearest timed entries: linear between
    /// one below and one above, else in the estimate's proportions
    /// ([`estimated_shape`]) from the nearest one.
    fn reestimate(&mut self) {
        let timed: Vec<(usize, f64)> = (1..=self.cost_us.len())
            .filter(|&rows| !self.is_estimate(rows))
            .map(|rows| (rows, f64::from(self.cost_us[rows - 1])))
            .collect();
        let estimates: Vec<usize> = (1..=self.cost_us.len())
            .filter(|&rows| self.is_estimate(rows))
            .collect();
        for rows in estimates {
            let below = timed.iter().rev().find(|&&(r, _)| r < rows);
            let above = timed.iter().find(|&&(r, _)| r > rows);
            let cost = match (below, above) {
                (Some(&(r0, c0)), Some(&(r1, c1))) => {
                    c0 + (c1 - c0) * (rows - r0) as f64 / (r1 - r0) as f64
                }
                (Some(&(r, c)), None) | (None, Some(&(r, c))) => {
                    c * estimated_shape(rows) / estimated_shape(r)
                }
                (None, None) => continue,
            };
            self.cost_us[rows - 1] = clamp_micros(cost.round() as i64);
        }
    }

    /// A round's drafting took `micros` for `drafted` tokens (a draft model's
    /// decodes, catching up on the last round's included): the draft cost
    /// moves an eighth of the way to its cost per token, or takes it while it
    /// is an estimate. (The engine does not time a draft after a gap, such as
    /// plain rounds: the draft model then catches up on it first, which
    /// drafting round after round never does.)
    pub fn observe_draft_cost(&mut self, drafted: usize, micros: u64) {
        let sample =
            clamp_micros(i64::try_from(micros / drafted.max(1) as u64).unwrap_or(i64::MAX));
        let current = i64::from(self.draft_us);
        self.draft_us = if std::mem::take(&mut self.draft_estimated) || current == 0 {
            sample
        } else {
            clamp_micros(current + (i64::from(sample) - current) / 8)
        };
    }

    /// Check a state from a caller or a file against the generation's draft
    /// limit: a curve of `n_draft + 1` costs in `1..=MAX_COST_MICROS`, and
    /// counts that the updates can reach.
    pub fn validate(&self, n_draft: u32) -> std::result::Result<(), String> {
        let rows = n_draft as usize + 1;
        if self.cost_us.len() != rows {
            return Err(format!(
                "the cost curve has {} entries; n_draft {n_draft} needs {rows} (1 to n_draft + 1 rows)",
                self.cost_us.len()
            ));
        }
        if let Some(bad) = self
            .cost_us
            .iter()
            .find(|c| !(1..=MAX_COST_MICROS).contains(*c))
        {
            return Err(format!(
                "the cost curve holds {bad} microseconds; each cost must be between 1 and {MAX_COST_MICROS}"
            ));
        }
        for (hits, trials) in self.hits.into_iter().zip(self.trials) {
            if trials == 0 || trials > MAX_TRIALS || hits > trials {
                return Err(format!(
                    "acceptance counts {hits} of {trials} are not 0 <= hits <= trials, 1 <= trials <= {MAX_TRIALS}"
                ));
            }
        }
        let [unsettled_rows, unsettled_micros] = self.unsettled;
        if self.unsettled != [0, 0]
            && !((2..=rows as u32).contains(&unsettled_rows)
                && (1..=MAX_COST_MICROS).contains(&unsettled_micros))
        {
            return Err(format!(
                "the unsettled verification {:?} is not [0, 0] or [2 to {rows} rows, 1 to {MAX_COST_MICROS} \
                 microseconds]",
                self.unsettled
            ));
        }
        if !(PROBE_AFTER..=MAX_PROBE_AFTER).contains(&self.probe_after) {
            return Err(format!(
                "the probe interval {} is not between {PROBE_AFTER} and {MAX_PROBE_AFTER}",
                self.probe_after
            ));
        }
        if self.sure > SCALE {
            return Err(format!(
                "the share of sure rounds {} exceeds {SCALE}",
                self.sure
            ));
        }
        if self.idle > self.probe_after {
            return Err(format!(
                "{} idle rounds exceed the probe interval {}",
                self.idle, self.probe_after
            ));
        }
        if self.draft_us > MAX_COST_MICROS
            || !(self.estimated.is_empty() || self.estimated.len() == rows)
        {
            return Err(format!(
                "the draft cost {} microseconds (at most {MAX_COST_MICROS}) or the {} estimate marks (none or \
                 {rows}) are out of range",
                self.draft_us,
                self.estimated.len()
            ));
        }
        Ok(())
    }

    /// The estimated probability that a draft token is accepted, in the
    /// situation of the next round.
    pub fn acceptance(&self) -> f64 {
        let at = usize::from(self.streak);
        f64::from(self.hits[at]) / f64::from(self.trials[at].max(1))
    }

    /// Cost in microseconds of a verify batch of `rows` rows.
    fn cost(&self, rows: usize) -> f64 {
        f64::from(self.cost_us[rows - 1])
    }

    /// The draft length in `0..=most` that pays best, a draft of `k` tokens
    /// costing its verification and `k` draft-model decodes.
    fn best_length(&self, most: usize) -> usize {
        self.length_at(self.acceptance(), most, self.draft_us)
    }

    /// The draft length in `0..=most` that pays best at acceptance `alpha`,
    /// each drafted token costing `draft_us` besides the verification.
    fn length_at(&self, alpha: f64, most: usize, draft_us: u32) -> usize {
        let draft = f64::from(draft_us);
        best_draft_length(alpha, most, |rows| {
            self.cost(rows) + draft * (rows - 1) as f64
        })
    }

    /// How many tokens to draft this round, at most `n_draft`: none for a
    /// draft model while the target is unsure ([`AdaptiveState::sure`]), else
    /// the length that pays best, else a probe as the drafter takes one
    /// (`probe`) after [`AdaptiveState::probe_after`] rounds without evidence,
    /// or in a situation that has had none yet.
    pub fn choose(&self, n_draft: usize, probe: Probe) -> usize {
        if probe == Probe::WhileSure && self.sure < SURE_TO_PROBE {
            return 0;
        }
        let most = n_draft.min(self.cost_us.len() - 1);
        let best = self.best_length(most);
        let due = self.idle >= self.probe_after
            || self.situation_unseen()
            || (probe == Probe::WhileSure && self.sure_from_the_start());
        if best > 0 || most == 0 || !due {
            return best;
        }
        match probe {
            Probe::Never => 0,
            Probe::OneToken => 1,
            Probe::WhileSure if self.first_probe_cannot_pay(most) => 0,
            Probe::WhileSure => most,
        }
    }

    /// How many tokens of a draft that costs nothing to propose (copied from
    /// the history) to verify, at most `n_draft`: priced by verification alone.
    pub fn choose_free(&self, n_draft: usize) -> usize {
        let most = n_draft.min(self.cost_us.len() - 1);
        self.length_at(self.acceptance(), most, 0)
    }

    /// Whether this would be a draft model's first probe (no evidence yet in
    /// either situation) and no draft of up to `most` tokens would pay even
    /// at [`PROBE_ACCEPTANCE`]: the first probe makes it catch up on the
    /// whole prompt, which only drafts that pay at high acceptance repay.
    /// Once that is paid, later probes come as for any drafter.
    fn first_probe_cannot_pay(&self, most: usize) -> bool {
        self.nothing_seen() && self.length_at(PROBE_ACCEPTANCE, most, self.draft_us) == 0
    }

    /// Whether a draft model's first probe may come before the pause: no
    /// evidence yet in either situation, and the target sure of its tokens
    /// from the start ([`SURE_TO_PROBE_EARLY`]): a reply that copies or
    /// follows a pattern repays the prompt's catch-up.
    fn sure_from_the_start(&self) -> bool {
        self.nothing_seen() && self.sure >= SURE_TO_PROBE_EARLY
    }

    /// Whether the next round's situation has had no evidence yet (its
    /// counts at the prior) while the other one has: a generation's first
    /// probe waits for the pause, since a draft model's first draft decodes
    /// the whole prompt, which a short reply never repays.
    fn situation_unseen(&self) -> bool {
        let at = usize::from(self.streak);
        self.unseen(at) && !self.unseen(1 - at)
    }

    /// Whether neither situation has had evidence yet (both counts at the prior).
    fn nothing_seen(&self) -> bool {
        self.unseen(0) && self.unseen(1)
    }

    /// Whether situation `at` has had no evidence yet (its counts at the prior).
    fn unseen(&self, at: usize) -> bool {
        self.prior()[at] == (self.hits[at], self.trials[at])
    }

    /// Learn how sure the target was of a round's first token: the
    /// probability of its most likely one.
    pub fn observe_sureness(&mut self, top_probability: f64) {
        let sure = u32::from(top_probability >= SURE_PROBABILITY);
        self.sure =
            self.sure - (self.sure >> SURE_DECAY_SHIFT) + sure * (SCALE >> SURE_DECAY_SHIFT);
    }

    /// Learn from a round: its draft's outcome, or a free proposal's.
    pub fn observe(&mut self, round: &Round, evidence: Evidence) {
        let (hits, trials) = match evidence {
            Evidence::Verified if round.drafted > 0 => {
                let rejected = u32::from(round.accepted < round.drafted);
                (round.accepted as u32, round.accepted as u32 + rejected)
            }
            Evidence::Shadow(hit) => (u32::from(hit), 1),
            Evidence::Nothing => {
                self.idle = (self.idle + 1).min(self.probe_after);
                return;
            }
            Evidence::Verified | Evidence::Forced => return,
        };
        let probed = self.idle >= self.probe_after;
        self.idle = 0;
        let at = usize::from(self.streak);
        self.trials[at] = (decayed(self.trials[at]) + trials * SCALE).clamp(1, MAX_TRIALS);
        self.hits[at] = (decayed(self.hits[at]) + hits * SCALE).min(self.trials[at]);
        self.streak = hits == trials;
        let pays = self.best_length(self.cost_us.len() - 1) > 0;
        self.probe_after = if probed && !pays {
            (self.probe_after * 2).min(MAX_PROBE_AFTER)
        } else {
            PROBE_AFTER
        };
    }
}

/// A cost in microseconds within `1..=MAX_COST_MICROS`.
fn clamp_micros(micros: i64) -> u32 {
    micros.clamp(1, i64::from(MAX_COST_MICROS)) as u32
}

fn decayed(count: u32) -> u32 {
    count - (count >> DECAY_SHIFT)
}

/// The draft length in `0..=most` with the most expected committed tokens
/// per unit of cost, for a per-token acceptance `alpha` (ties: the shorter);
/// a draft must beat a plain round by [`DRAFT_MARGIN`].
pub fn best_draft_length(alpha: f64, most: usize, cost: impl Fn(usize) -> f64) -> usize {
    let alpha = alpha.clamp(0.0, 1.0);
    let (mut best, mut best_rate) = (0, (1.0 + DRAFT_MARGIN) / cost(1));
    let (mut expected, mut power) = (1.0, 1.0);
    for k in 1..=most {
        power *= alpha;
        expected += power;
        let rate = expected / cost(k + 1);
        if rate > best_rate {
            (best, best_rate) = (k, rate);
        }
    }
    best
}

/// The batch sizes timed: powers of two and powers of two plus one, and the
/// longest; the others are interpolated. The exact multi-row kernels take
/// columns in groups of 4, of 8 or of 8, 4, 2 and 1, so a batch of a power of
/// two rows is the cheap end of a step and one more row its expensive start:
/// timing only one side of each step would make the other look dearer or
/// cheaper than it is (docs/measured.md, "Adaptive draft length").
fn timed_rows(max_rows: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = std::iter::successors(Some(1usize), |r| Some(r * 2))
        .take_while(|&r| r < max_rows)
        .flat_map(|r| [r, r + 1])
        .filter(|&r| r < max_rows)
        .collect();
    rows.dedup();
    rows.push(max_rows);
    rows
}

/// The most context the cost curve is timed after. Verification attends to
/// the prompt and the text so far, so a curve timed on an empty context
/// prices long batches too low (docs/measured.md, "Where the curve is wrong").
pub const MAX_TIMED_CONTEXT: usize = 512;

/// Measure the cost curve on sequence `seq_id` of `target`, which must be
/// empty (before a prompt): after `context` cells of `token` (at most
/// [`MAX_TIMED_CONTEXT`], none for a recurrent or hybrid model, whose memory
/// cannot drop its last positions), decode batches of `token` at the next
/// `r` positions, each timed [`REPETITIONS`] times after a warm-up and
/// removed after, then empty the sequence (only it: the other sequences of a
/// shared target keep theirs). Returns `max_rows` costs in microseconds (rows
/// `1..=max_rows`).
pub fn measure_cost_curve(
    target: &mut Context,
    batch: &mut Batch,
    seq_id: i32,
    token: i32,
    max_rows: usize,
    context: usize,
) -> Result<Vec<u32>> {
    if max_rows == 0 || max_rows > batch.capacity() {
        return Err(Error::Invalid(format!(
            "cannot time {max_rows} rows in a batch of {}",
            batch.capacity()
        )));
    }
    let model = target.model();
    let context = if model.is_recurrent() || model.is_hybrid() {
        0
    } else {
        let room = (target.n_ctx_seq() as usize).saturating_sub(max_rows);
        context.min(MAX_TIMED_CONTEXT).min(room)
    };
    let timer = BatchTimer {
        seq_id,
        token,
        context,
    };
    let filled = vec![token; context];
    let curve = decode_in_chunks(target, batch, &filled, 0, seq_id, |_, _| Ok(()))
        .and_then(|()| timer.curve(target, batch, max_rows));
    target.seq_rm(seq_id, -1, -1);
    curve
}

/// Times batches of one token after `context` cells of it on one sequence.
struct BatchTimer {
    seq_id: i32,
    token: i32,
    context: usize,
}

impl BatchTimer {
    /// The curve: every size warmed up, the sizes of [`timed_rows`] timed
    /// between plain decodes ([`BatchTimer::between_plain`]), the rest interpolated.
    fn curve(&self, target: &mut Context, batch: &mut Batch, max_rows: usize) -> Result<Vec<u32>> {
        self.time(target, batch, max_rows)?;
        self.time(target, batch, 1)?;
        let mut points = Vec::new();
        for rows in timed_rows(max_rows) {
            points.push((rows, self.between_plain(target, batch, rows)?));
        }
        Ok(interpolate(&points, max_rows))
    }

    /// What a batch of `rows` rows costs between plain decodes, as a draft
    /// comes between plain rounds: its own time (llama.cpp builds the graph
    /// of a batch of another size anew) and what it adds to the plain decode
    /// after it (a graph built anew again, caches refilled; docs/measured.md,
    /// "Adaptive draft length").
    /// Each of the three decodes counts its fastest of [`REPETITIONS`], and
    /// the excess is never below zero (the fastest of a difference would
    /// pick the noise).
    fn between_plain(&self, target: &mut Context, batch: &mut Batch, rows: usize) -> Result<u32> {
        let (mut before, mut own, mut after) = (u32::MAX, u32::MAX, u32::MAX);
        for _ in 0..REPETITIONS {
            before = before.min(self.time(target, batch, 1)?);
            if rows > 1 {
                own = own.min(self.time(target, batch, rows)?);
                after = after.min(self.time(target, batch, 1)?);
            }
        }
        if rows == 1 {
            return Ok(before);
        }
        Ok(own
            .saturating_add(after.saturating_sub(before))
            .min(MAX_COST_MICROS))
    }

    /// Microseconds to decode `rows` rows after the context, which they leave as it was.
    fn time(&self, target: &mut Context, batch: &mut Batch, rows: usize) -> Result<u32> {
        let tokens = vec![self.token; rows];
        let first = position(self.context)?;
        batch.fill(&tokens, first, self.seq_id, true)?;
        let start = Instant::now();
        let decoded = target.decode(batch);
        let micros = super::micros_since(start);
        target.seq_rm(self.seq_id, first, -1);
        decoded?;
        Ok(u32::try_from(micros)
            .unwrap_or(u32::MAX)
            .clamp(1, MAX_COST_MICROS))
    }
}

/// Costs for rows `1..=max_rows`, linear between the timed points (sorted by rows, the first at 1).
fn interpolate(points: &[(usize, u32)], max_rows: usize) -> Vec<u32> {
    (1..=max_rows)
        .map(|rows| {
            let upper = points.iter().position(|&(r, _)| r >= rows).unwrap_or(0);
            let (r1, c1) = points[upper];
            if r1 == rows || upper == 0 {
                return c1;
            }
            let (r0, c0) = points[upper - 1];
            let fraction = (rows - r0) as f64 / (r1 - r0) as f64;
            (f64::from(c0) + fraction * (f64::from(c1) - f64::from(c0))).round() as u32
        })
        .collect()
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
