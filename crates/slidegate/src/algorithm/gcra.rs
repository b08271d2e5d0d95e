//! GCRA, the generic cell rate algorithm: one theoretical arrival time (TAT).
//!
//! Permits are spaced by the emission interval `T = ⌈W / limit⌉` (in µs, so
//! uneven rates lose at most 1 µs per permit and never exceed the quota), and
//! a burst of up to `limit` permits is tolerated. A request of `cost` is
//! allowed when `max(TAT, now) + cost × T ≤ now + limit × T`; it then moves
//! TAT there. All state is that one number.

use super::{Definition, Usage};
use crate::decision::ceil_ms;
use crate::{Decision, Quota};

/// The theoretical arrival time of the next permit, in µs since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// TAT in microseconds since the epoch.
    pub tat_us: u64,
}

/// The emission interval `⌈W / limit⌉` in microseconds.
pub fn emission_interval_us(quota: &Quota) -> u64 {
    (quota.window_ms() * 1000).div_ceil(quota.permits())
}

/// Decides `cost` permits at `now_ms`.
pub fn decide(state: State, now_ms: u64, cost: u64, quota: &Quota) -> (State, Decision) {
    let t = emission_interval_us(quota);
    let now = now_ms * 1000;
    let horizon = now + quota.permits() * t;
    let start = state.tat_us.max(now);
    let tat = start + cost * t;
    let allowed = tat <= horizon;
    let settled = if allowed { tat } else { start };
    let decision = Decision {
        allowed,
        limit: quota.permits(),
        // Only a clock that stepped back can leave the TAT past the horizon.
        remaining: horizon.saturating_sub(settled) / t,
        reset_after: ceil_ms(settled - now),
        retry_after: (!allowed).then(|| ceil_ms(tat - horizon)),
    };
    // A denial or a peek (cost 0) changes nothing, as on Redis, where neither writes.
    if allowed && cost > 0 {
        (State { tat_us: tat }, decision)
    } else {
        (state, decision)
    }
}

/// Whether `state` has no effect any more at `now_ms` and may be forgotten.
pub fn is_idle(state: &State, now_ms: u64, _quota: &Quota) -> bool {
    state.tat_us <= now_ms * 1000
}

/// The permits the TAT still holds back at `now_ms`: how many emission
/// intervals it lies ahead.
pub fn usage(state: &State, now_ms: u64, quota: &Quota) -> Usage {
    Usage { units: state.tat_us.saturating_sub(now_ms * 1000), per_permit: emission_interval_us(quota) }
}

/// GCRA as the stores see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gcra;

impl Definition for Gcra {
    const NAME: &'static str = "gcra";
    const TAG: &'static str = "gcra";
    const LUA: &'static str = include_str!("../store/redis/gcra.lua");
    type State = State;
    type MemoryTable = crate::store::memory::PlainTable<Self>;

    fn decide(state: State, now_ms: u64, cost: u64, quota: &Quota) -> (State, Decision) {
        decide(state, now_ms, cost, quota)
    }
    fn is_idle(state: &State, now_ms: u64, quota: &Quota) -> bool {
        is_idle(state, now_ms, quota)
    }
    fn usage(state: &State, now_ms: u64, quota: &Quota) -> Usage {
        usage(state, now_ms, quota)
    }
}

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
        // 3 per second: T = 333,334 µs.
        let q = Quota::new(3, Duration::from_millis(1000)).unwrap();
        let (s, _) = decide(State::default(), 0, 3, &q);
        let d = decide(s, 0, 1, &q).1;
        assert_eq!(d.retry_after, Some(Duration::from_millis(334)));
        assert!(!decide(s, 333, 1, &q).1.allowed);
        assert!(decide(s, 334, 1, &q).1.allowed);
    }
}
