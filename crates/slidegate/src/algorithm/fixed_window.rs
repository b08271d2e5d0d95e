//! Fixed window: one counter per window `[k·W, (k+1)·W)`.
//!
//! Cheapest of all, and the one the source article warns about: a client can
//! spend the whole limit at the end of one window and again at the start of
//! the next, 2× the limit within a few milliseconds.

use std::time::Duration;

use super::Usage;
use crate::{Decision, Quota};

/// The counter of the window it was last written in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// Window number: `now_ms / window_ms`.
    pub window: u64,
    /// Permits admitted in that window.
    pub count: u64,
}

/// Decides `cost` permits at `now_ms`.
pub fn decide(state: State, now_ms: u64, cost: u64, quota: &Quota) -> (State, Decision) {
    let w = quota.window_ms();
    // A clock that stepped back decides as at the start of the state's window.
    let skew = if state.count > 0 { super::skew_ms(state.window, now_ms, w) } else { 0 };
    let window = (now_ms + skew) / w;
    let count = if state.window == window { state.count } else { 0 };
    let until_next = (window + 1) * w - now_ms;
    let allowed = count + cost <= quota.permits();
    let count = if allowed { count + cost } else { count };
    let decision = Decision {
        allowed,
        limit: quota.permits(),
        remaining: quota.permits() - count,
        reset_after: Duration::from_millis(if count == 0 { 0 } else { until_next }),
        retry_after: (!allowed).then(|| Duration::from_millis(until_next)),
    };
    // A denial or a peek (cost 0) changes nothing, as on Redis, where neither writes.
    if allowed && cost > 0 {
        (State { window, count }, decision)
    } else {
        (state, decision)
    }
}

/// Whether `state` has no effect any more at `now_ms` and may be forgotten.
pub fn is_idle(state: &State, now_ms: u64, quota: &Quota) -> bool {
    state.window < now_ms / quota.window_ms()
}

/// The permits counted in the window `now_ms` falls in, as [`decide`] sees it.
pub fn usage(state: &State, now_ms: u64, quota: &Quota) -> Usage {
    let w = quota.window_ms();
    let skew = if state.count > 0 { super::skew_ms(state.window, now_ms, w) } else { 0 };
    let count = if state.window == (now_ms + skew) / w { state.count } else { 0 };
    Usage { units: count, per_permit: 1 }
}

/// The fixed window as the stores see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedWindow;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_the_limit_then_denies_until_the_next_window() {
        let q = Quota::new(3, Duration::from_millis(1000)).unwrap();
        let mut s = State::default();
        for expected_remaining in [2, 1, 0] {
            let (next, d) = decide(s, 10_100, 1, &q);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
            assert_eq!(d.reset_after, Duration::from_millis(900));
            s = next;
        }
        let (same, d) = decide(s, 10_999, 1, &q);
        assert!(!d.allowed);
        assert_eq!(same, s, "a denial is not charged");
        assert_eq!(d.retry_after, Some(Duration::from_millis(1)));
        assert!(decide(s, 11_000, 1, &q).1.allowed);
    }

    #[test]
    fn the_boundary_burst_gets_twice_the_limit() {
        let q = Quota::per_minute(100).unwrap();
        let mut s = State::default();
        let mut allowed = 0;
        for t in (59_900..60_100).step_by(1) {
            let (next, d) = decide(s, t, 1, &q);
            allowed += u64::from(d.allowed);
            s = next;
        }
        assert_eq!(allowed, 200);
    }
}
