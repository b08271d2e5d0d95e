//! The five algorithms, each a pure state transition in its own module.
//!
//! Every algorithm is arithmetic on integers and nothing else:
//! `(state, now_ms, cost, quota) -> (state', Decision)`. No I/O, no clock, no
//! floating point. The stores call these functions (the embedded store) or
//! mirror them line for line in Lua (the Redis store); a property test replays
//! random traces through both and asserts identical decisions.
//!
//! Every function here expects `cost <= quota.permits()`; the stores check that
//! first and report a larger cost as an error ([`crate::StoreError::CostExceedsLimit`]).
//! Time is expected not to go backwards for one identity. When a clock steps
//! back anyway (a Redis failover, an NTP step), the window algorithms decide
//! as at the start of the state's own window instead of forgetting it, the
//! token bucket and GCRA never refill backwards, and the log keeps counting
//! permits stamped in the future.

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window_counter;
pub mod token_bucket;

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::Quota;

/// Which algorithm decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Algorithm {
    /// Cloudflare's estimate `cur + prev × (1 − elapsed/window)`: two counters, smooth, near exact.
    #[default]
    SlidingWindowCounter,
    /// One counter per window: cheapest, but admits up to 2× the limit across a boundary.
    FixedWindow,
    /// One timestamp per admitted permit: exact, memory grows with the limit.
    SlidingLog,
    /// A bucket of `limit` tokens refilled at `limit` per window: allows bursts.
    TokenBucket,
    /// Generic cell rate algorithm: one theoretical arrival time, bursts up to `limit`.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, the default first.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::SlidingWindowCounter,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];

    /// The algorithm's name in configs, JSON and keys: `sliding_window_counter`, …
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that is not one of the five.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown algorithm {0:?}: expected one of sliding_window_counter, fixed_window, sliding_log, token_bucket, gcra")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// One limit: an algorithm enforcing a quota.
///
/// ```
/// use slidegate::{Algorithm, Limit, Quota};
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100)?);
/// assert_eq!(limit.quota.permits(), 100);
/// # Ok::<(), slidegate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Which algorithm decides.
    pub algorithm: Algorithm,
    /// What it allows.
    pub quota: Quota,
}

impl Limit {
    /// `algorithm` enforcing `quota`.
    pub fn new(algorithm: Algorithm, quota: Quota) -> Self {
        Self { algorithm, quota }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.quota, self.algorithm)
    }
}

/// How far `now_ms` lies before the start of window `window` (0 when it does not).
///
/// A clock that stepped back — a Redis failover to a server whose clock is
/// behind, an NTP step — must not forget what was counted in a later window.
/// The window algorithms then decide as at the start of the state's own
/// window and add this difference to every wait, so the waits stay exact.
/// A state that counts nothing has nothing to remember and never skews.
pub(crate) fn skew_ms(window: u64, now_ms: u64, w: u64) -> u64 {
    (window * w).saturating_sub(now_ms)
}

/// The state of one identity under any of the five algorithms, for callers
/// that keep state themselves (simulations, replays, custom stores).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityState {
    /// [`sliding_window_counter`] state.
    SlidingWindowCounter(sliding_window_counter::State),
    /// [`fixed_window`] state.
    FixedWindow(fixed_window::State),
    /// [`sliding_log`] state.
    SlidingLog(sliding_log::Log),
    /// [`token_bucket`] state.
    TokenBucket(token_bucket::State),
    /// [`gcra`] state.
    Gcra(gcra::State),
}

impl IdentityState {
    /// A fresh identity under `algorithm`: nothing admitted yet.
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::SlidingWindowCounter => Self::SlidingWindowCounter(Default::default()),
            Algorithm::FixedWindow => Self::FixedWindow(Default::default()),
            Algorithm::SlidingLog => Self::SlidingLog(Default::default()),
            Algorithm::TokenBucket => Self::TokenBucket(Default::default()),
            Algorithm::Gcra => Self::Gcra(Default::default()),
        }
    }

    /// Decides `cost` permits at `now_ms` and charges them when allowed, as a
    /// store does. Expects `cost <= quota.permits()`.
    pub fn decide(&mut self, now_ms: u64, cost: u64, quota: &Quota) -> crate::Decision {
        fn apply<S>(state: &mut S, (next, decision): (S, crate::Decision)) -> crate::Decision {
            *state = next;
            decision
        }
        match self {
            Self::SlidingWindowCounter(s) => {
                apply(s, sliding_window_counter::decide(*s, now_ms, cost, quota))
            }
            Self::FixedWindow(s) => apply(s, fixed_window::decide(*s, now_ms, cost, quota)),
            Self::SlidingLog(log) => sliding_log::decide(log, now_ms, cost, quota),
            Self::TokenBucket(s) => apply(s, token_bucket::decide(*s, now_ms, cost, quota)),
            Self::Gcra(s) => apply(s, gcra::decide(*s, now_ms, cost, quota)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_listed() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        let err = "leaky".parse::<Algorithm>().unwrap_err().to_string();
        assert!(err.starts_with("unknown algorithm \"leaky\": expected one of"), "{err}");
    }
}
