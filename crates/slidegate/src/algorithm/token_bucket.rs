//! Token bucket: `limit` tokens, refilled continuously at `limit` per window.
//!
//! It allows a burst of up to `limit` at once and then a steady rate. To stay
//! in integers the bucket counts in units of `1/W` token (W = window in ms):
//! it holds at most `limit × W` units and gains `limit` units per millisecond.

use std::time::Duration;

use super::Usage;
use crate::{Decision, Quota};

/// How far below full the bucket was when it was last charged.
///
/// The default state is a full bucket, and so is a long-idle identity's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// Tokens missing from a full bucket, in units of `1/window_ms` token.
    pub used: u64,
    /// When `used` was measured, in ms since the epoch.
    pub last_ms: u64,
}

/// Units missing at `now_ms` after refilling.
fn used_at(state: &State, now_ms: u64, quota: &Quota) -> u64 {
    // After a whole window any bucket is full; capping first keeps the product small.
    let elapsed = now_ms.saturating_sub(state.last_ms).min(quota.window_ms());
    state.used.saturating_sub(elapsed * quota.permits())
}

/// Decides `cost` permits at `now_ms`.
pub fn decide(state: State, now_ms: u64, cost: u64, quota: &Quota) -> (State, Decision) {
    let (w, limit) = (quota.window_ms(), quota.permits());
    let capacity = limit * w;
    let used = used_at(&state, now_ms, quota);
    // A clock that stepped back: the bucket refills from `last_ms`, not from now.
    let skew = state.last_ms.saturating_sub(now_ms);
    let need = cost * w;
    let allowed = used + need <= capacity;
    let used_after = if allowed { used + need } else { used };
    let reset_after = used_after.div_ceil(limit);
    let decision = Decision {
        allowed,
        limit,
        remaining: (capacity - used_after) / w,
        reset_after: Duration::from_millis(if reset_after == 0 { 0 } else { reset_after + skew }),
        retry_after: (!allowed)
            .then(|| Duration::from_millis((used + need - capacity).div_ceil(limit) + skew)),
    };
    // A denial or a peek (cost 0) changes nothing, as on Redis, where neither writes.
    if allowed && cost > 0 {
        let last_ms = now_ms.max(state.last_ms);
        (State { used: used_after, last_ms }, decision)
    } else {
        (state, decision)
    }
}

/// Whether the bucket is full again at `now_ms`, so forgetting it changes nothing.
pub fn is_idle(state: &State, now_ms: u64, quota: &Quota) -> bool {
    used_at(state, now_ms, quota) == 0
}

/// The tokens missing from a full bucket at `now_ms`: the permits it still remembers.
pub fn usage(state: &State, now_ms: u64, quota: &Quota) -> Usage {
    Usage { units: used_at(state, now_ms, quota), per_permit: quota.window_ms() }
}

/// The token bucket as the stores see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBucket;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_the_capacity_then_refills_at_the_rate() {
        // 10 per second: one token every 100 ms.
        let q = Quota::new(10, Duration::from_millis(1000)).unwrap();
        let (s, d) = decide(State::default(), 50_000, 10, &q);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, Duration::from_millis(1000));
        let (s2, d) = decide(s, 50_050, 1, &q);
        assert!(!d.allowed);
        assert_eq!(s2, s);
        assert_eq!(d.retry_after, Some(Duration::from_millis(50)));
        assert!(!decide(s, 50_099, 1, &q).1.allowed);
        let (_, d) = decide(s, 50_100, 1, &q);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn fractional_rates_stay_exact() {
        // 3 per 1000 ms: one token every 333⅓ ms.
        let q = Quota::new(3, Duration::from_millis(1000)).unwrap();
        let (s, _) = decide(State::default(), 0, 3, &q);
        let d = decide(s, 0, 1, &q).1;
        assert_eq!(d.retry_after, Some(Duration::from_millis(334)));
        assert!(!decide(s, 333, 1, &q).1.allowed);
        assert!(decide(s, 334, 1, &q).1.allowed);
        assert!(is_idle(&s, 1000, &q));
        assert!(!is_idle(&s, 999, &q));
    }
}
