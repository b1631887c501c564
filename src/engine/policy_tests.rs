//! Unit tests of the adaptive draft policy (src/engine/policy.rs).

use super::*;

fn round(drafted: usize, accepted: usize) -> Round {
    Round {
        committed: vec![0; accepted + 1],
        drafted,
        accepted,
        ..Round::default()
    }
}

/// A CPU-like curve: 11 ms plus 4 ms a row.
fn cpu_curve(rows: usize) -> Vec<u32> {
    (1..=rows)
        .map(|r| 11_000 + 4_000 * (r as u32 - 1))
        .collect()
}

/// Rows at an eighth of a plain decode, a draft model's decode at 0.45 of one: at the prior's acceptance no draft
/// pays.
fn draft_model_state() -> AdaptiveState {
    let curve = (0..9).map(|extra| 10_000 + 1_250 * extra).collect();
    AdaptiveState::new(curve).priced(Some(0.45))
}

#[test]
fn timed_rows_are_both_sides_of_each_power_of_two_and_the_longest() {
    assert_eq!(timed_rows(9), vec![1, 2, 3, 4, 5, 8, 9]);
    assert_eq!(timed_rows(17), vec![1, 2, 3, 4, 5, 8, 9, 16, 17]);
    assert_eq!(timed_rows(12), vec![1, 2, 3, 4, 5, 8, 9, 12]);
    assert_eq!(timed_rows(1), vec![1]);
    assert_eq!(timed_rows(2), vec![1, 2]);
    assert_eq!(timed_rows(3), vec![1, 2, 3]);
}

#[test]
fn interpolation_is_linear_between_timed_points() {
    let curve = interpolate(&[(1, 10), (2, 20), (3, 30), (5, 50), (9, 90)], 9);
    assert_eq!(curve, vec![10, 20, 30, 40, 50, 60, 70, 80, 90]);
}

#[test]
fn the_best_length_grows_with_acceptance_and_is_zero_when_drafts_do_not_pay() {
    let curve = cpu_curve(17);
    let cost = |rows: usize| f64::from(curve[rows - 1]);
    assert_eq!(best_draft_length(0.2, 16, cost), 0);
    // A one-token draft would give 6% more tokens per microsecond: under the margin.
    assert_eq!(best_draft_length(0.45, 16, cost), 0);
    assert_eq!(best_draft_length(0.6, 16, cost), 1);
    let high = best_draft_length(0.9, 16, cost);
    assert!((3..=10).contains(&high), "{high}");
    assert_eq!(best_draft_length(1.0, 16, cost), 16);
    // Free verification rows: draft everything that might be accepted.
    assert_eq!(best_draft_length(0.5, 8, |_| 1.0), 8);
    assert_eq!(best_draft_length(0.9, 0, cost), 0);
}

#[test]
fn streaks_and_the_rounds_after_a_rejection_are_told_apart() {
    let mut policy = AdaptiveState::new(cpu_curve(17));
    // Quotations (whole drafts accepted) between stretches of other text (rejected drafts).
    for _ in 0..10 {
        for _ in 0..4 {
            policy.observe(&round(8, 8), Evidence::Verified);
        }
        for _ in 0..3 {
            policy.observe(&round(8, 0), Evidence::Verified);
        }
    }
    assert!(!policy.streak && policy.acceptance() < 0.9);
    let after_rejection = policy.choose(16, Probe::Never);
    policy.observe(&round(8, 8), Evidence::Verified);
    assert!(policy.streak && policy.acceptance() > 0.9);
    assert!(policy.choose(16, Probe::Never) > after_rejection);
}

#[test]
fn acceptance_follows_recent_rounds() {
    let mut policy = AdaptiveState::new(cpu_curve(9));
    assert!((policy.acceptance() - 2.0 / 3.0).abs() < 1e-9);
    for _ in 0..40 {
        policy.observe(&round(8, 8), Evidence::Verified);
    }
    assert!(policy.acceptance() > 0.99);
    assert_eq!(policy.choose(8, Probe::Never), 8);
    for _ in 0..80 {
        policy.observe(&round(4, 0), Evidence::Verified);
    }
    assert!(policy.acceptance() < 0.01);
    assert_eq!(policy.choose(8, Probe::Never), 0);
    policy.validate(8).unwrap();
}

#[test]
fn plain_rounds_learn_from_free_proposals_or_probe() {
    let mut policy = AdaptiveState::new(cpu_curve(9));
    for _ in 0..40 {
        policy.observe(&round(1, 0), Evidence::Verified);
    }
    assert_eq!(policy.choose(8, Probe::OneToken), 0);
    for _ in 0..PROBE_AFTER {
        policy.observe(&round(0, 0), Evidence::Nothing);
    }
    assert_eq!(
        policy.choose(8, Probe::OneToken),
        1,
        "a probe after idle rounds"
    );
    assert_eq!(
        policy.choose(8, Probe::Never),
        0,
        "no probe where proposals are free"
    );
    assert_eq!(
        policy.choose(0, Probe::OneToken),
        0,
        "never beyond the limit"
    );
    policy.observe(&round(0, 0), Evidence::Forced);
    assert_eq!(policy.idle, PROBE_AFTER);
    for _ in 0..40 {
        policy.observe(&round(0, 0), Evidence::Shadow(true));
    }
    assert_eq!(policy.idle, 0);
    assert!(policy.choose(8, Probe::Never) > 4);
}

#[test]
fn states_outside_what_updates_reach_are_refused() {
    let good = AdaptiveState::new(cpu_curve(5));
    assert!(good.validate(4).is_ok());
    assert!(good.validate(5).unwrap_err().contains("needs 6"));
    let cases = [
        AdaptiveState {
            cost_us: vec![0; 5],
            ..good.clone()
        },
        AdaptiveState {
            cost_us: vec![MAX_COST_MICROS + 1; 5],
            ..good.clone()
        },
        AdaptiveState {
            hits: [5, 1],
            trials: [4, 4],
            ..good.clone()
        },
        AdaptiveState {
            trials: [3, 0],
            hits: [0, 0],
            ..good.clone()
        },
        AdaptiveState {
            trials: [3, MAX_TRIALS + 1],
            ..good.clone()
        },
        AdaptiveState {
            idle: PROBE_AFTER + 1,
            ..good.clone()
        },
        AdaptiveState {
            unsettled: [1, 10],
            ..good.clone()
        },
        AdaptiveState {
            unsettled: [6, 10],
            ..good.clone()
        },
        AdaptiveState {
            unsettled: [2, 0],
            ..good.clone()
        },
        AdaptiveState {
            probe_after: PROBE_AFTER - 1,
            ..good.clone()
        },
        AdaptiveState {
            probe_after: MAX_PROBE_AFTER + 1,
            ..good.clone()
        },
        AdaptiveState {
            draft_us: MAX_COST_MICROS + 1,
            ..good.clone()
        },
        AdaptiveState {
            estimated: vec![true; 4],
            ..good.clone()
        },
    ];
    for state in cases {
        assert!(state.validate(4).is_err(), "{state:?}");
    }
}

#[test]
fn a_live_curve_moves_an_eighth_of_the_way_to_each_verify_time() {
    let mut measured = AdaptiveState::measured(vec![800, 1600, 2400]);
    assert!(measured.follows_timings(true) && !measured.follows_timings(false));
    measured.observe_cost(2, 800);
    assert_eq!(measured.unsettled, [2, 800], "settled by the next round");
    measured.observe_cost(3, 2400);
    assert_eq!(measured.cost_us, vec![800, 1500, 2400]);
    measured.observe_cost(1, 1600); // 800 more than a plain round: the verification's
    assert_eq!(measured.cost_us, vec![800, 1500, 2400 + 800 / 8]);
    measured.observe_cost(1, u64::MAX); // bounded by the largest cost
    assert_eq!(measured.cost_us[0], 800 + (MAX_COST_MICROS - 800) / 8);
    measured.observe_cost(4, 1); // no such entry: nothing changes
    measured.observe_cost(0, 1);
    assert_eq!(measured.cost_us.len(), 3);
    assert_eq!(measured.unsettled, [0, 0]);
    assert!(
        !AdaptiveState::new(vec![1, 2]).follows_timings(true),
        "a pinned curve never moves"
    );
}

#[test]
fn an_estimated_curve_is_scaled_by_its_first_timing_and_replaced_by_the_next() {
    // Long batches are not promised for less than the exact kernels cost: 8 rows about twice one, 16 four times.
    let long = AdaptiveState::estimated(17, None).cost_us;
    assert_eq!([long[7], long[15]], [20_267, 40_000]);
    let mut state = AdaptiveState::estimated(5, Some(0.5));
    assert_eq!(state.cost_us, vec![10_000, 11_067, 12_267, 13_600, 15_067]);
    assert_eq!(state.draft_us, 5_000);
    assert!(state.validate(4).is_ok() && state.follows_timings(true));
    // The first timing (a plain decode after a plain decode) scales every estimate.
    state.observe_cost(1, 20_000);
    assert_eq!(state.cost_us, vec![20_000, 22_133, 24_533, 27_200, 30_133]);
    assert_eq!(state.draft_us, 10_000);
    // A verification of 5 rows, settled by the plain round after it: it replaces its
    // estimate, and the estimates between the timed entries lie on the line between them.
    state.observe_cost(5, 60_000);
    state.observe_cost(1, 20_000);
    assert_eq!(state.cost_us, vec![20_000, 30_000, 40_000, 50_000, 60_000]);
    assert_eq!(state.estimated, vec![false, true, true, true, false]);
    state.observe_cost(3, 30_000);
    state.observe_cost(1, 20_000);
    assert_eq!(state.cost_us, vec![20_000, 25_000, 30_000, 45_000, 60_000]);
    // A timed entry then moves an eighth of the way, as a measured curve's does.
    state.observe_cost(3, 38_000);
    state.observe_cost(1, 20_000);
    assert_eq!(state.cost_us[2], 31_000);
    assert!(state.validate(4).is_ok());
}

#[test]
fn a_draft_models_decodes_are_priced_and_timed() {
    let mut state = AdaptiveState::new(cpu_curve(9)).priced(Some(0.5));
    state.hits = [6 * SCALE, 6 * SCALE];
    state.trials = [8 * SCALE, 8 * SCALE];
    let free = AdaptiveState {
        draft_us: 0,
        ..state.clone()
    };
    assert!(free.choose(8, Probe::OneToken) > 0);
    assert_eq!(state.draft_us, 5_500);
    assert_eq!(state.choose(8, Probe::OneToken), 0);
    // Timed drafting takes the place of the estimate at once, then moves an eighth of the way.
    state.draft_estimated = true;
    state.observe_draft_cost(4, 8_000);
    assert_eq!(state.draft_us, 2_000);
    state.observe_draft_cost(2, 20_000);
    assert_eq!(state.draft_us, 3_000);
}

#[test]
fn each_failed_probe_doubles_the_pause_before_the_next() {
    let mut state = AdaptiveState::new(cpu_curve(5));
    state.hits = [0, 0];
    let mut pauses = Vec::new();
    for _ in 0..6 {
        let mut idle_rounds = 0;
        while state.choose(4, Probe::OneToken) == 0 {
            state.observe(&round(0, 0), Evidence::Nothing);
            idle_rounds += 1;
        }
        pauses.push(idle_rounds);
        state.observe(&round(1, 0), Evidence::Verified);
    }
    assert_eq!(pauses, vec![16, 32, 64, 128, 256, 256]);
    // A probe after which drafting pays brings the first pause back.
    while state.choose(4, Probe::OneToken) == 0 {
        state.observe(&round(0, 0), Evidence::Nothing);
    }
    state.hits = [4 * SCALE, 4 * SCALE];
    state.trials = [4 * SCALE, 4 * SCALE];
    state.observe(&round(1, 1), Evidence::Verified);
    assert_eq!(state.probe_after, PROBE_AFTER);
}

#[test]
fn counts_stay_bounded_under_the_longest_drafts() {
    let max = crate::speculative::MAX_SPECULATIVE_DRAFT_TOKENS as usize;
    let mut policy = AdaptiveState::new(cpu_curve(3));
    for _ in 0..1000 {
        policy.observe(&round(max, max - 1), Evidence::Verified);
    }
    for at in 0..2 {
        assert!(policy.trials[at] <= MAX_TRIALS && policy.hits[at] <= policy.trials[at]);
    }
}

#[test]
fn a_drafter_that_stops_when_unsure_is_probed_with_the_longest_draft() {
    let mut state = draft_model_state();
    assert_eq!(state.best_length(8), 0);
    // The first probe waits for the pause.
    assert_eq!(state.choose(8, Probe::WhileSure), 0);
    for _ in 0..PROBE_AFTER {
        state.observe(&round(0, 0), Evidence::Nothing);
    }
    let probe = state.choose(8, Probe::WhileSure);
    assert_eq!(probe, 8);
    assert_eq!(state.choose(8, Probe::OneToken), 1);
    assert_eq!(state.choose(8, Probe::Never), 0);
    // The probe was accepted whole: the situation after a whole draft has no evidence yet, so it is probed too.
    state.observe(&round(probe, probe), Evidence::Verified);
    assert!(state.streak && state.situation_unseen());
    assert_eq!(state.choose(8, Probe::WhileSure), probe);
    state.observe(&round(probe, 0), Evidence::Verified);
    // Both situations seen: the rounds' evidence decides, probes wait for the pause.
    assert!(!state.situation_unseen() && state.idle == 0);
    assert_eq!(state.choose(8, Probe::WhileSure), state.best_length(8));
}

#[test]
fn two_probes_accepted_whole_make_a_draft_model_draft() {
    let mut state = draft_model_state();
    assert!(state.model_drafts && state.nothing_seen());
    for _ in 0..2 {
        state.observe(&round(8, 8), Evidence::Verified);
    }
    assert!(state.acceptance() > 0.95, "{}", state.acceptance());
    assert!(state.choose(8, Probe::WhileSure) >= 4);
    // The heavier prior of drafters that stop anywhere keeps the same evidence below it.
    let mut heavier = AdaptiveState::new(state.cost_us.clone());
    heavier.draft_us = state.draft_us;
    for _ in 0..2 {
        heavier.observe(&round(8, 8), Evidence::Verified);
    }
    assert!(heavier.acceptance() < state.acceptance());
}

#[test]
fn a_draft_model_that_would_not_pay_at_high_acceptance_is_not_probed_first() {
    let mut state = draft_model_state();
    for _ in 0..PROBE_AFTER {
        state.observe(&round(0, 0), Evidence::Nothing);
    }
    assert_eq!(state.choose(8, Probe::WhileSure), 8);
    // Its decode timed at 0.7 of the target's: no draft pays at 90% acceptance.
    state.draft_estimated = true;
    state.observe_draft_cost(1, 7_000);
    assert!(!state.draft_estimated && state.draft_us == 7_000);
    assert_eq!(state.length_at(PROBE_ACCEPTANCE, 8, state.draft_us), 0);
    assert_eq!(state.choose(8, Probe::WhileSure), 0);
    // A one-token probe (an MTP or EAGLE-3 session) still comes.
    assert_eq!(state.choose(8, Probe::OneToken), 1);
    // Once a probe has caught it up on the prompt, later probes come after the pause.
    state.observe(&round(8, 3), Evidence::Verified);
    for _ in 0..state.probe_after {
        state.observe(&round(0, 0), Evidence::Nothing);
    }
    assert_eq!(state.choose(8, Probe::WhileSure), 8);
}

#[test]
fn a_draft_model_drafts_only_while_the_target_is_sure() {
    let mut state = draft_model_state();
    for _ in 0..PROBE_AFTER {
        state.observe(&round(0, 0), Evidence::Nothing);
    }
    let probe = state.choose(8, Probe::WhileSure);
    assert!(probe > 0);
    // Prose the target hesitates over: no probe, nor a draft that would pay at the acceptance seen so far.
    for _ in 0..8 {
        state.observe_sureness(0.6);
    }
    assert!(state.sure < SURE_TO_PROBE);
    assert_eq!(state.choose(8, Probe::WhileSure), 0);
    state.hits = [4 * SCALE, 4 * SCALE];
    state.trials = [4 * SCALE, 4 * SCALE];
    assert!(state.best_length(8) > 0);
    assert_eq!(state.choose(8, Probe::WhileSure), 0);
    // Drafters that cost nothing to ask are not held back.
    assert_eq!(state.choose(8, Probe::OneToken), state.best_length(8));
    // A stretch of sure rows opens the way again; the share stays within its scale.
    for _ in 0..1000 {
        state.observe_sureness(0.99);
    }
    assert_eq!(state.sure, SCALE);
    assert!(state.validate(8).is_ok());
    assert_eq!(state.choose(8, Probe::WhileSure), state.best_length(8));
}

#[test]
fn a_target_sure_from_the_start_brings_a_draft_models_first_probe_forward() {
    let mut state = draft_model_state();
    let mut rounds = 0;
    while state.choose(8, Probe::WhileSure) == 0 {
        state.observe_sureness(0.99);
        state.observe(&round(0, 0), Evidence::Nothing);
        rounds += 1;
    }
    assert_eq!(rounds, 4);
    // Only the first probe: once a probe gave evidence, the pause decides again.
    state.observe(&round(1, 0), Evidence::Verified);
    state.observe_sureness(0.99);
    assert_eq!(state.choose(8, Probe::WhileSure), 0);
    // Nor for drafters that are asked for free or probed with one token.
    let fresh = draft_model_state();
    let mut sure = fresh.clone();
    for _ in 0..4 {
        sure.observe_sureness(0.99);
    }
    assert!(sure.sure >= SURE_TO_PROBE_EARLY && fresh.sure < SURE_TO_PROBE_EARLY);
    assert_eq!(sure.choose(8, Probe::OneToken), 0);
}

#[test]
fn a_copied_draft_is_priced_by_its_verification_alone() {
    // At the prior's acceptance a draft model's tokens do not pay here; copied ones, which cost no decode, do.
    let state = draft_model_state();
    assert_eq!(state.choose(8, Probe::OneToken), 0);
    let free = state.choose_free(8);
    assert!(free > 0, "{free}");
    assert_eq!(
        free,
        best_draft_length(state.acceptance(), 8, |rows| state.cost(rows))
    );
    // Never beyond the curve.
    assert!(state.choose_free(100) <= 8);
}
