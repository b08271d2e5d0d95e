//! The algorithms, each a pure state transition in its own module.
//!
//! Every algorithm is arithmetic on integers and nothing else:
//! `(state, now_ms, cost, quota) -> (state', Decision)`. No I/O, no clock, no
//! floating point. The stores call these functions (the embedded store) or
//! mirror them line for line in Lua (the Redis store); a property test replays
//! random traces through both and asserts identical decisions.
//!
//! Every function here expects `cost <= quota.permits()`; the stores check that
//! first and report a larger cost as an error ([`InvalidRequest::CostExceedsLimit`](crate::InvalidRequest::CostExceedsLimit)).
//! Time is expected not to go backwards for one identity. When a clock steps
//! back anyway (a Redis failover, an NTP step), the window algorithms decide
//! as at the start of the state's own window instead of forgetting it, the
//! token bucket and GCRA never refill backwards, and the log keeps counting
//! permits stamped in the future.
//!
//! Each algorithm module also implements `Definition` (crate-private) on a
//! unit type: its name, its state and its arithmetic. The one list of
//! algorithms is `for_each_algorithm!`; everything that differs per
//! algorithm (`Algorithm::ALL` and its names, [`IdentityState`]) is derived
//! from that list and the `Definition`s. The algorithms know nothing of the
//! stores: each store says what it keeps per algorithm by a trait of its own
//! implemented on the same unit types (the embedded store's `Kept`, the
//! Redis store's `Scripted`), reached through the same list.

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window_counter;
pub mod token_bucket;

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::{Decision, Quota};

/// Everything that defines one algorithm, implemented once per algorithm
/// module: its name, its state and its arithmetic, nothing of any store.
pub(crate) trait Definition {
    /// The algorithm's name in configs, JSON and keys' documentation.
    const NAME: &'static str;
    /// The state of one identity; the default is an identity never seen.
    type State: Clone + Default + PartialEq + fmt::Debug;

    /// Decides `cost` permits at `now_ms` (`cost ≤ quota.permits()`); the
    /// state comes back charged when allowed, unchanged on a denial or a
    /// cost of 0.
    fn decide(state: Self::State, now_ms: u64, cost: u64, quota: &Quota) -> (Self::State, Decision);
    /// Whether `state` changes no decision any more at `now_ms`, so a store may forget it.
    fn is_idle(state: &Self::State, now_ms: u64, quota: &Quota) -> bool;
    /// The permits `state` counts against the quota at `now_ms`.
    fn usage(state: &Self::State, now_ms: u64, quota: &Quota) -> Usage;
}

/// The one list of algorithms: calls `$then!` with `Variant => module` for
/// each, in the order of [`Algorithm::ALL`]. Each `module` holds a unit type
/// named like the variant that implements [`Definition`], and its state type
/// `State`. Adding an algorithm adds its line here and its variant to
/// [`Algorithm`]; the compiler points out every match that is then missing
/// an arm (there is none outside the generated code) and every store trait
/// the new unit type does not implement yet.
macro_rules! for_each_algorithm {
    ($then:ident) => {
        $then! {
            SlidingWindowCounter => sliding_window_counter,
            FixedWindow => fixed_window,
            SlidingLog => sliding_log,
            TokenBucket => token_bucket,
            Gcra => gcra,
        }
    };
}
pub(crate) use for_each_algorithm;

/// What a state counts against its quota at one instant: exactly
/// `units / per_permit` permits. For the window algorithms, the permits in
/// the last window as the algorithm estimates them; for the token bucket and
/// GCRA, the permits not yet refilled or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The count, in units of `1 / per_permit` permit.
    pub units: u64,
    /// Units per permit (at least 1).
    pub per_permit: u64,
}

impl Usage {
    /// The count in permits, as a float (for statistics, never for decisions).
    pub fn permits(&self) -> f64 {
        self.units as f64 / self.per_permit as f64
    }
}

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

/// What the list of algorithms generates here: `Algorithm::ALL` and the
/// per-algorithm lookups, and [`IdentityState`].
macro_rules! algorithm_table {
    ($($variant:ident => $module:ident),* $(,)?) => {
        impl Algorithm {
            /// Every algorithm, the default first.
            pub const ALL: [Algorithm; [$(stringify!($variant)),*].len()] = [$(Algorithm::$variant),*];

            /// The algorithm's name in configs, JSON and keys: `sliding_window_counter`, …
            pub fn name(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Definition>::NAME,)*
                }
            }

        }

        /// The state of one identity under any of the algorithms, for callers
        /// that keep state themselves (simulations, replays, custom stores).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum IdentityState {
            $(
                #[doc = concat!("State under [`Algorithm::", stringify!($variant), "`] ([`", stringify!($module), "`]).")]
                $variant($module::State),
            )*
        }

        impl IdentityState {
            /// A fresh identity under `algorithm`: nothing admitted yet.
            pub fn new(algorithm: Algorithm) -> Self {
                match algorithm {
                    $(Algorithm::$variant => Self::$variant(Default::default()),)*
                }
            }

            /// Decides `cost` permits at `now_ms` and charges them when allowed, as a
            /// store does. Expects `cost <= quota.permits()`.
            pub fn decide(&mut self, now_ms: u64, cost: u64, quota: &Quota) -> Decision {
                match self {
                    $(Self::$variant(state) => {
                        let (next, decision) =
                            <$module::$variant as Definition>::decide(std::mem::take(state), now_ms, cost, quota);
                        *state = next;
                        decision
                    })*
                }
            }

            /// The permits this state counts against `quota` at `now_ms`, as
            /// the algorithm sees them (see [`Usage`]).
            pub fn usage(&self, now_ms: u64, quota: &Quota) -> Usage {
                match self {
                    $(Self::$variant(state) => <$module::$variant as Definition>::usage(state, now_ms, quota),)*
                }
            }
        }
    };
}

for_each_algorithm!(algorithm_table);

/// Each algorithm's [`Definition`]: its module's `decide`, `is_idle` and
/// `usage`, named after the module.
macro_rules! definitions {
    ($($variant:ident => $module:ident,)*) => {
        $(
            impl Definition for $module::$variant {
                const NAME: &'static str = stringify!($module);
                type State = $module::State;

                #[inline]
                fn decide(state: Self::State, now_ms: u64, cost: u64, quota: &Quota) -> (Self::State, Decision) {
                    $module::decide(state, now_ms, cost, quota)
                }
                fn is_idle(state: &Self::State, now_ms: u64, quota: &Quota) -> bool {
                    $module::is_idle(state, now_ms, quota)
                }
                fn usage(state: &Self::State, now_ms: u64, quota: &Quota) -> Usage {
                    $module::usage(state, now_ms, quota)
                }
            }
        )*
    };
}

for_each_algorithm!(definitions);

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that is not one of [`Algorithm::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown algorithm {0:?}: expected one of {expected}", expected = known_names())]
pub struct UnknownAlgorithm(pub String);

/// Every algorithm's name, comma-separated, for [`UnknownAlgorithm`]'s message.
fn known_names() -> String {
    Algorithm::ALL.map(Algorithm::name).join(", ")
}

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
#[inline]
pub(crate) fn skew_ms(window: u64, now_ms: u64, w: u64) -> u64 {
    (window * w).saturating_sub(now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_algorithm_once_in_declaration_order() {
        for (i, a) in Algorithm::ALL.into_iter().enumerate() {
            assert_eq!(a as usize, i, "{a}");
        }
    }

    #[test]
    fn usage_is_what_each_state_counts_in_the_last_window() {
        use std::time::Duration;
        let q = Quota::new(10, Duration::from_millis(1000)).unwrap();
        let usage_after = |a: Algorithm, at: u64| {
            let mut s = IdentityState::new(a);
            assert!(s.decide(500, 4, &q).allowed);
            s.usage(at, &q)
        };
        // 4 permits at 500; at 1_250, 750 ms of the previous window still count.
        let swc = usage_after(Algorithm::SlidingWindowCounter, 1_250);
        assert_eq!((swc, swc.permits()), (Usage { units: 3_000, per_permit: 1000 }, 3.0));
        assert_eq!(usage_after(Algorithm::FixedWindow, 999).permits(), 4.0);
        assert_eq!(usage_after(Algorithm::FixedWindow, 1_000).permits(), 0.0);
        assert_eq!(usage_after(Algorithm::SlidingLog, 1_499).permits(), 4.0);
        assert_eq!(usage_after(Algorithm::SlidingLog, 1_500).permits(), 0.0);
        // One token refills every 100 ms: 150 ms later, 2.5 are still missing.
        assert_eq!(usage_after(Algorithm::TokenBucket, 650).permits(), 2.5);
        // The TAT lies 400 ms ahead at 500, 250 ms (2.5 intervals) at 650.
        assert_eq!(usage_after(Algorithm::Gcra, 650).permits(), 2.5);
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_listed() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        let err = "leaky".parse::<Algorithm>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown algorithm \"leaky\": expected one of sliding_window_counter, fixed_window, sliding_log, token_bucket, gcra"
        );
    }
}
