//! GCRA, the generic cell rate algorithm: one theoretical arrival time (TAT).
//!
//! Permits are spaced by the emission interval `T = W / limit`, and a burst of
//! up to `limit` permits is tolerated. A request of `cost` is allowed when
//! `max(TAT, now) + cost × T ≤ now + limit × T`; it then moves TAT there.
//!
//! The arithmetic is exact: time ahead of now is counted in ticks of
//! `1 / limit` ms, in which `T` is exactly `window_ms` ticks and the burst
//! horizon `limit × window_ms` ticks, at most 2^53 (the bound [`Quota`]
//! keeps). Rounding `T` to a whole unit instead would let large quotas
//! through too fast: at 1 µs, 10,000,000 per second sustained only
//! 1,000,000. The TAT itself is kept as whole ms since the epoch plus a
//! fraction in ticks, because ms since the epoch times the limit would pass
//! 2^53; only its distance ahead of now is ever turned into ticks, and that
//! distance is at most one window unless the clock stepped back.

use std::time::Duration;

use super::Usage;
use crate::{Decision, Quota};

/// The theoretical arrival time of the next permit: `tat_ms + frac / limit` ms since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// The whole milliseconds of the TAT, since the epoch.
    pub tat_ms: u64,
    /// The rest of the TAT in ticks of `1 / limit` ms: below the limit.
    pub frac: u64,
}

/// How far the TAT lies ahead of `now_ms`: whole ms and ticks of `1 / limit`
/// ms, `(0, 0)` when it does not.
fn ahead(state: &State, now_ms: u64) -> (u64, u64) {
    if state.tat_ms >= now_ms {
        (state.tat_ms - now_ms, state.frac)
    } else {
        (0, 0)
    }
}

/// Decides `cost` permits at `now_ms`.
pub fn decide(state: State, now_ms: u64, cost: u64, quota: &Quota) -> (State, Decision) {
    let (w, limit) = (quota.window_ms(), quota.permits());
    let horizon = limit * w;
    let (ahead_ms, frac) = ahead(&state, now_ms);
    // The TAT in ticks ahead of now, when it lies within the horizon; only a
    // clock that stepped back leaves it further, where the product could
    // pass 2^53 (the tests are exact: ahead_ms < w gives at most horizon − 1).
    let ticks = (ahead_ms < w || (ahead_ms == w && frac == 0)).then(|| ahead_ms * limit + frac);
    // cost × T ≤ horizon − ticks rather than ticks + cost × T ≤ horizon: the sum could pass 2^53.
    let room = horizon - cost * w;
    let allowed = ticks.is_some_and(|t| t <= room);
    let (settled, remaining) = match ticks {
        Some(t) if allowed => (Some(t + cost * w), (horizon - t - cost * w) / w),
        Some(t) => (Some(t), (horizon - t) / w),
        None => (None, 0),
    };
    let reset_ms = match settled {
        Some(t) => t.div_ceil(limit),
        None => ahead_ms + u64::from(frac > 0),
    };
    // For a denial, ⌈(ticks − room) / limit⌉, split so that no term passes
    // 2^53; ticks > room makes it at least 1.
    let retry_ms = || if room >= frac { ahead_ms - (room - frac) / limit } else { ahead_ms + 1 };
    let decision = Decision {
        allowed,
        limit,
        remaining,
        reset_after: Duration::from_millis(reset_ms),
        retry_after: (!allowed).then(|| Duration::from_millis(retry_ms())),
    };
    // A denial or a peek (cost 0) changes nothing, as on Redis, where neither writes.
    match settled {
        Some(t) if allowed && cost > 0 => (State { tat_ms: now_ms + t / limit, frac: t % limit }, decision),
        _ => (state, decision),
    }
}

/// Whether `state` has no effect any more at `now_ms` and may be forgotten.
pub fn is_idle(state: &State, now_ms: u64, _quota: &Quota) -> bool {
    ahead(state, now_ms) == (0, 0)
}

/// The permits the TAT still holds back at `now_ms`: how many emission
/// intervals (`window_ms` ticks each) it lies ahead.
pub fn usage(state: &State, now_ms: u64, quota: &Quota) -> Usage {
    let (ahead_ms, frac) = ahead(state, now_ms);
    Usage {
        units: ahead_ms.saturating_mul(quota.permits()).saturating_add(frac),
        per_permit: quota.window_ms(),
    }
}

/// GCRA as the stores see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gcra;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn burst_of_limit_then_one_per_interval() {
        let q = Quota::new(4, Duration::from_millis(1000)).unwrap();
        let mut s = State::default();
        for remaining in [3, 2, 1, 0] {
            let (next, d) = decide(s, 10_000, 1, &q);
            assert!(d.allowed);
            assert_eq!(d.remaining, remaining);
            s = next;
        }
        let d = decide(s, 10_000, 1, &q).1;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(250)));
        assert_eq!(d.reset_after, Duration::from_millis(1000));
        assert!(!decide(s, 10_249, 1, &q).1.allowed);
        assert!(decide(s, 10_250, 1, &q).1.allowed);
    }

    #[test]
    fn uneven_interval_rounds_retry_up() {
        // 3 per second: T = 333⅓ ms.
        let q = Quota::new(3, Duration::from_millis(1000)).unwrap();
        let (s, _) = decide(State::default(), 0, 3, &q);
        let d = decide(s, 0, 1, &q).1;
        assert_eq!(d.retry_after, Some(Duration::from_millis(334)));
        assert!(!decide(s, 333, 1, &q).1.allowed);
        assert!(decide(s, 334, 1, &q).1.allowed);
    }

    /// A rate finer than one permit per µs is kept exactly, not rounded down
    /// to one per µs: 10,000 per ms admits a burst of 10,000 and then 10,000
    /// more every ms, no fewer.
    #[test]
    fn sub_microsecond_intervals_sustain_the_full_rate() {
        let q = Quota::new(10_000, Duration::from_millis(1)).unwrap();
        let (mut s, d) = decide(State::default(), 5_000, 10_000, &q);
        assert!(d.allowed);
        assert!(!decide(s, 5_000, 1, &q).1.allowed);
        for now in 5_001..5_100 {
            let (next, d) = decide(s, now, 10_000, &q);
            assert!(d.allowed, "at {now}");
            assert!(!decide(next, now, 1, &q).1.allowed, "at {now}");
            s = next;
        }
        // 3 per 1 ms (T = ⅓ ms): a whole ms later exactly 3 more fit.
        let q = Quota::new(3, Duration::from_millis(1)).unwrap();
        let (s, _) = decide(State::default(), 0, 3, &q);
        let (s, d) = decide(s, 1, 3, &q);
        assert!(d.allowed);
        assert_eq!(decide(s, 1, 1, &q).1.retry_after, Some(Duration::from_millis(1)));
    }

    #[test]
    fn a_tat_far_ahead_after_a_clock_step_back_is_exact_at_the_largest_quota() {
        let q = Quota::new(crate::MAX_LIMIT, Duration::from_millis(8)).unwrap();
        let (s, _) = decide(State::default(), 1_000_000, 5, &q);
        // A TAT beyond the horizon: denied, and the waits count the step back.
        let d = decide(s, 1_000_000 - 60_000, 1, &q).1;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, Duration::from_millis(60_001));
        assert_eq!(d.retry_after, Some(Duration::from_millis(60_001 - 8)));
    }
}
