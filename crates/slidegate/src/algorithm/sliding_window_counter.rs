//! Sliding window counter: Cloudflare's estimate from two fixed-window counters.
//!
//! Windows are aligned to multiples of the window length `W`. With `cur`
//! permits counted in the current window, `prev` in the previous one, and `e`
//! milliseconds elapsed in the current window, the rate over the last `W` is
//! estimated as `cur + prev × (W − e) / W`: the previous window's permits are
//! assumed spread evenly, and the part of it still inside the sliding window
//! is counted.
//!
//! A request for `cost` permits is allowed when the estimate after it fits:
//! `cur + cost + prev × (W − e) / W ≤ limit`, decided in integers as
//! `prev × (W − e) ≤ (limit − cur − cost) × W` — no rounding at the boundary.
//! (The source article's script tests `estimate < limit` before adding one,
//! which admits a request whenever the estimate is fractional just below the
//! limit, so its boundary burst lets 101–102 through; this rule lets 100.)
//!
//! Time is expected not to go backwards; when a clock steps back, the
//! decision is taken as at the start of the state's own window.
//!
//! `retry_after` is exact: with no new arrivals, `cur` and `prev` are fixed
//! until the window ends and the estimate falls linearly, so the first
//! millisecond at which the request fits has a closed form (see [`decide`]).

use std::time::Duration;

use super::Usage;
use crate::{Decision, Quota};

/// The counters of the window they were last written in and of the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// Window number of `cur`: `now_ms / window_ms`.
    pub window: u64,
    /// Permits admitted in window `window`.
    pub cur: u64,
    /// Permits admitted in window `window − 1`.
    pub prev: u64,
}

impl State {
    /// `(cur, prev)` as seen from window `window`.
    #[inline]
    fn counters_at(&self, window: u64) -> (u64, u64) {
        if self.window == window {
            (self.cur, self.prev)
        } else if self.window + 1 == window {
            (0, self.cur)
        } else {
            (0, 0)
        }
    }
}

/// Decides `cost` permits at `now_ms`.
///
/// On a denial, `retry_after` is the first instant the same request fits if
/// nothing else arrives:
/// - within the current window, when `cur + cost ≤ limit`: at elapsed
///   `W − ⌊(limit − cur − cost) × W / prev⌋`;
/// - otherwise in the next window, where `cur` becomes the previous count: at
///   elapsed `W − ⌊(limit − cost) × W / cur⌋` into it.
// Inlined into the stores, so the `Decision` is built in their frame rather
// than copied out of this one's (a copy right after its fields were written
// one by one stalls on store forwarding).
#[inline(always)]
pub fn decide(state: State, now_ms: u64, cost: u64, quota: &Quota) -> (State, Decision) {
    let (w, limit) = (quota.window_ms(), quota.permits());
    let counted = state.cur > 0 || state.prev > 0;
    let skew = if counted { super::skew_ms(state.window, now_ms, w) } else { 0 };
    let now_ms = now_ms + skew;
    let window = now_ms / w;
    let elapsed = now_ms % w;
    let (cur, prev) = state.counters_at(window);
    // prev × (W − e) is the previous window's weight scaled by W; ≤ limit × W ≤ 2^53.
    let prev_weight = prev * (w - elapsed);
    let allowed = cur + cost <= limit && prev_weight <= (limit - cur - cost) * w;
    let cur_after = if allowed { cur + cost } else { cur };
    let remaining = (limit - cur_after).saturating_sub(prev_weight.div_ceil(w));
    let reset_after = if cur_after > 0 {
        2 * w - elapsed
    } else if prev > 0 {
        w - elapsed
    } else {
        0
    };
    let retry_after = (!allowed).then(|| {
        let fits_this_window = (cur + cost <= limit && prev > 0)
            .then(|| w - (limit - cur - cost) * w / prev)
            .filter(|&at| at < w);
        match fits_this_window {
            Some(at) => at - elapsed,
            None => {
                // `cur` becomes the previous window's count; when it alone leaves
                // room for `cost`, the request fits as soon as that window starts.
                let at_next = ((limit - cost) * w).checked_div(cur).map_or(0, |fits| w.saturating_sub(fits));
                (w - elapsed) + at_next
            }
        }
    });
    let decision = Decision {
        allowed,
        limit,
        remaining,
        reset_after: Duration::from_millis(if reset_after == 0 { 0 } else { reset_after + skew }),
        retry_after: retry_after.map(|wait| Duration::from_millis(wait + skew)),
    };
    // A denial or a peek (cost 0) changes nothing, as on Redis, where neither writes.
    if allowed && cost > 0 {
        (State { window, cur: cur_after, prev }, decision)
    } else {
        (state, decision)
    }
}

/// Whether `state` has no effect any more at `now_ms` and may be forgotten.
pub fn is_idle(state: &State, now_ms: u64, quota: &Quota) -> bool {
    state.window + 1 < now_ms / quota.window_ms()
}

/// The estimate `cur + prev × (W − e) / W` at `now_ms`, as [`decide`] weighs it.
pub fn usage(state: &State, now_ms: u64, quota: &Quota) -> Usage {
    let w = quota.window_ms();
    let counted = state.cur > 0 || state.prev > 0;
    let now_ms = now_ms + if counted { super::skew_ms(state.window, now_ms, w) } else { 0 };
    let (cur, prev) = state.counters_at(now_ms / w);
    // ≤ 2 × limit × W ≤ 2^54: fits.
    Usage { units: cur * w + prev * (w - now_ms % w), per_permit: w }
}

/// The sliding window counter as the stores see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlidingWindowCounter;

#[cfg(test)]
mod tests {
    use super::*;

    fn run(q: &Quota, s: &mut State, now: u64, cost: u64) -> Decision {
        let (next, d) = decide(*s, now, cost, q);
        *s = next;
        d
    }

    #[test]
    fn boundary_burst_admits_the_limit_not_twice_it() {
        let q = Quota::per_minute(100).unwrap();
        let mut s = State::default();
        let allowed: u64 = (59_900..60_100).map(|t| u64::from(run(&q, &mut s, t, 1).allowed)).sum();
        assert_eq!(allowed, 100);
    }

    #[test]
    fn estimate_weighs_the_previous_window_by_the_part_still_inside() {
        // 40 in window 0; at 25% into window 1, 30 of them still count.
        let q = Quota::new(100, Duration::from_millis(1000)).unwrap();
        let mut s = State::default();
        assert!(run(&q, &mut s, 500, 40).allowed);
        let d = run(&q, &mut s, 1_250, 70);
        assert!(d.allowed, "30 + 70 = 100 fits exactly");
        assert_eq!(d.remaining, 0);
        assert!(!run(&q, &mut s, 1_250, 1).allowed);
        // Next: 30 + 70 + 1 needs prev weight ≤ 29 × 1000 / 40 → elapsed ≥ 275.
        let d = run(&q, &mut s, 1_251, 1);
        assert_eq!(d.retry_after, Some(Duration::from_millis(24)));
        assert!(!run(&q, &mut s, 1_274, 1).allowed);
        assert!(run(&q, &mut s, 1_275, 1).allowed);
    }

    #[test]
    fn retry_after_spans_into_the_next_window_when_cur_alone_is_full() {
        let q = Quota::new(10, Duration::from_millis(1000)).unwrap();
        let mut s = State::default();
        assert!(run(&q, &mut s, 200, 10).allowed);
        let d = run(&q, &mut s, 300, 4);
        // Next window: 4 + 10 × (1000 − e) / 1000 ≤ 10 ⇔ e ≥ 400, i.e. t = 1400.
        assert_eq!(d.retry_after, Some(Duration::from_millis(1_100)));
        assert!(!run(&q, &mut s, 1_399, 4).allowed);
        assert!(run(&q, &mut s, 1_400, 4).allowed);
    }

    #[test]
    fn cost_of_the_whole_limit_waits_for_the_window_after_next() {
        let q = Quota::new(10, Duration::from_millis(1000)).unwrap();
        let mut s = State::default();
        assert!(run(&q, &mut s, 999, 1).allowed);
        let d = run(&q, &mut s, 1_000, 10);
        assert_eq!(d.retry_after, Some(Duration::from_millis(1_000)));
        assert!(!run(&q, &mut s, 1_999, 10).allowed);
        assert!(run(&q, &mut s, 2_000, 10).allowed);
    }

    #[test]
    fn idle_after_two_windows() {
        let q = Quota::new(10, Duration::from_millis(1000)).unwrap();
        let (s, _) = decide(State::default(), 1_500, 1, &q);
        assert!(!is_idle(&s, 2_999, &q));
        assert!(is_idle(&s, 3_000, &q));
    }
}
