//! Quota leases: `k` permits of one identity's limit charged in one store
//! call, for an instance to hand out without asking again, and the call that
//! gives back the ones it did not use. A capability some stores have, asked
//! for through [`Store::leases`](super::Store::leases).
//!
//! # Why a lease never admits more than the store would
//!
//! The permits are charged before any is handed out, so the store's count
//! is always at least what was admitted. What remains is *when* a leased
//! permit may be used (the full argument is in `docs/leases.md`):
//!
//! - **fixed window, sliding window counter**: only in the window it was
//!   charged in, that is until [`Lease::usable_for`] after the call was
//!   sent. In the next window the store counts it nowhere (fixed window) or
//!   with a falling weight (the counter's previous window), while the
//!   request it would admit counts in full.
//! - **token bucket, GCRA**: taken early, a permit is safe only while the
//!   bucket would not have been full; for the identities leases are for
//!   (hot, with headroom) that is no time at all, so they are not leased
//!   ([`leasable`] is `false`), nor is the **sliding log**, whose permits
//!   are timestamps.
//!
//! [`LeaseStore::give_back`] undoes exactly the unused charge in the window
//! the lease was charged in, and nothing once that window no longer
//! counts: the store that charged the lease names the window
//! ([`Lease::window`]), so instances with different clocks never disagree
//! about it.

use std::future::Future;
use std::time::{Duration, Instant};

use super::{Charge, StoreError};
use crate::algorithm::fixed_window::{self, FixedWindow};
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_log::SlidingLog;
use crate::algorithm::sliding_window_counter::{self, SlidingWindowCounter};
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::Definition;
use crate::{Algorithm, Decision, Identity, Limit};

/// Whether limits of `algorithm` are leased: the fixed window and the
/// sliding window counter (see the module docs for why not the others).
pub fn leasable(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindowCounter)
}

/// The answer to [`LeaseStore::lease`]: the store's decision on the whole
/// lease, and, when it allowed it, where its permits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The decision on all the lease's permits at once, as
    /// [`Store::decide`](super::Store::decide) would give it.
    pub decision: Decision,
    /// The window the permits were charged in, numbered as the store numbers
    /// windows (what [`GiveBack::window`] carries back). 0 when denied.
    pub window: u64,
    /// How long after the lease call was **sent** its permits may be used:
    /// until its window ends on the store's clock, which cannot have been
    /// read before the call was sent. Zero when denied.
    pub usable_for: Duration,
}

impl Lease {
    /// The lease the store decided at `now_ms` (on its clock) under `limit`:
    /// `decision.reset_after` tells when the charged window ends.
    pub(crate) fn decided(limit: &Limit, decision: Decision, now_ms: u64) -> Self {
        if !decision.allowed {
            return Self { decision, window: 0, usable_for: Duration::ZERO };
        }
        let usable_for = usable_for(limit, decision.reset_after);
        let w = limit.quota.window_ms();
        let end = now_ms + u64::try_from(usable_for.as_millis()).unwrap_or(u64::MAX - now_ms);
        Self { decision, window: (end / w).saturating_sub(1), usable_for }
    }
}

/// How long the permits of an allowed charge under `limit` count in the
/// window they were charged in, from a decision's `reset_after`: the fixed
/// window's is that window's end; the counter's is the end of the next one,
/// a window later. Zero for an algorithm that is not [`leasable`].
pub fn usable_for(limit: &Limit, reset_after: Duration) -> Duration {
    match limit.algorithm {
        Algorithm::FixedWindow => reset_after,
        Algorithm::SlidingWindowCounter => reset_after.saturating_sub(limit.quota.window()),
        Algorithm::SlidingLog | Algorithm::TokenBucket | Algorithm::Gcra => Duration::ZERO,
    }
}

/// Unused permits of a [`Lease`] to give back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBack {
    /// The lease's limit.
    pub limit: Limit,
    /// [`Lease::window`].
    pub window: u64,
    /// How many of its permits were not used.
    pub unused: u64,
}

/// The ability to lease permits and give unused ones back: a capability
/// some stores have, asked for through [`Store::leases`](super::Store::leases).
pub trait LeaseStore: Send + Sync {
    /// Charges `charge` (its cost is the lease's size) for `identity`,
    /// exactly as [`Store::decide`](super::Store::decide) would decide a
    /// request with that one charge and no penalty, and says in which window
    /// the permits count and until when they may be used.
    ///
    /// # Errors
    /// What `decide` answers, and [`InvalidRequest::NotLeased`](crate::InvalidRequest::NotLeased) for a limit
    /// whose algorithm is not [`leasable`].
    fn lease(
        &self,
        identity: &Identity,
        charge: Charge,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Lease, StoreError>> + Send;

    /// Undoes `back.unused` permits of a lease charged in `back.window`:
    /// from that window's count while it still counts (for the sliding
    /// window counter also as the previous window), never below zero, and
    /// nothing at all once it no longer counts. Answers how many were
    /// given back. Sent once: a give-back that failed is not retried (its
    /// permits stay charged in their window, an under-admission of at most
    /// `back.unused`).
    fn give_back(
        &self,
        identity: &Identity,
        back: GiveBack,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The [`LeaseStore`] of a store that has none: it cannot be made, so a
/// store returns `None::<NoLeases>` from [`Store::leases`](super::Store::leases).
#[derive(Debug)]
pub enum NoLeases {}

impl LeaseStore for NoLeases {
    async fn lease(&self, _: &Identity, _: Charge, _: Option<Instant>) -> Result<Lease, StoreError> {
        match *self {}
    }

    async fn give_back(&self, _: &Identity, _: GiveBack, _: Option<Instant>) -> Result<u64, StoreError> {
        match *self {}
    }
}

impl<L: LeaseStore> LeaseStore for &L {
    fn lease(
        &self,
        identity: &Identity,
        charge: Charge,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Lease, StoreError>> + Send {
        (**self).lease(identity, charge, deadline)
    }

    fn give_back(
        &self,
        identity: &Identity,
        back: GiveBack,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).give_back(identity, back, deadline)
    }
}

/// What giving permits back does to an algorithm's state: the arithmetic
/// of [`LeaseStore::give_back`], which the embedded store runs and
/// `give_back.lua` mirrors. Implemented for every algorithm, so a table
/// generic over the algorithm has it; those not [`leasable`] never hold a
/// leased permit, and give nothing back.
pub(crate) trait GivesBack: Definition {
    /// `state` with up to `unused` permits charged in window `window` undone;
    /// and how many were.
    fn give_back(state: Self::State, window: u64, unused: u64) -> (Self::State, u64);
}

impl GivesBack for SlidingWindowCounter {
    fn give_back(
        state: sliding_window_counter::State,
        window: u64,
        unused: u64,
    ) -> (sliding_window_counter::State, u64) {
        let mut state = state;
        let back = if state.window == window {
            let back = unused.min(state.cur);
            state.cur -= back;
            back
        } else if state.window == window + 1 {
            let back = unused.min(state.prev);
            state.prev -= back;
            back
        } else {
            0
        };
        (state, back)
    }
}

impl GivesBack for FixedWindow {
    fn give_back(state: fixed_window::State, window: u64, unused: u64) -> (fixed_window::State, u64) {
        let mut state = state;
        let back = if state.window == window { unused.min(state.count) } else { 0 };
        state.count -= back;
        (state, back)
    }
}

/// Not leased: nothing to give back.
macro_rules! gives_nothing_back {
    ($($algorithm:ty),*) => {$(
        impl GivesBack for $algorithm {
            fn give_back(state: Self::State, _window: u64, _unused: u64) -> (Self::State, u64) {
                (state, 0)
            }
        }
    )*};
}

gives_nothing_back!(SlidingLog, TokenBucket, Gcra);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    #[test]
    fn the_counter_gives_back_to_its_window_then_to_the_previous_then_nothing() {
        use sliding_window_counter::State;
        let s = State { window: 7, cur: 5, prev: 3 };
        assert_eq!(SlidingWindowCounter::give_back(s, 7, 2), (State { window: 7, cur: 3, prev: 3 }, 2));
        assert_eq!(SlidingWindowCounter::give_back(s, 7, 9), (State { window: 7, cur: 0, prev: 3 }, 5));
        assert_eq!(SlidingWindowCounter::give_back(s, 6, 2), (State { window: 7, cur: 5, prev: 1 }, 2));
        assert_eq!(SlidingWindowCounter::give_back(s, 5, 2), (s, 0));
        assert_eq!(SlidingWindowCounter::give_back(s, 8, 2), (s, 0));
    }

    #[test]
    fn the_fixed_window_gives_back_only_to_its_window() {
        use fixed_window::State;
        let s = State { window: 7, count: 5 };
        assert_eq!(FixedWindow::give_back(s, 7, 2), (State { window: 7, count: 3 }, 2));
        assert_eq!(FixedWindow::give_back(s, 7, 6), (State { window: 7, count: 0 }, 5));
        assert_eq!(FixedWindow::give_back(s, 6, 2), (s, 0));
    }

    #[test]
    fn a_lease_is_usable_until_its_window_ends() -> Result<(), crate::QuotaError> {
        let quota = Quota::new(100, Duration::from_secs(1))?;
        let counter = Limit::new(Algorithm::SlidingWindowCounter, quota);
        let fixed = Limit::new(Algorithm::FixedWindow, quota);
        let allowed = |reset_ms| Decision {
            allowed: true,
            limit: 100,
            remaining: 90,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: None,
        };
        // At 5_300 ms, window 5 ends in 700 ms; the counter's reset is a window later.
        let lease = Lease::decided(&counter, allowed(1_700), 5_300);
        assert_eq!((lease.window, lease.usable_for), (5, Duration::from_millis(700)));
        let lease = Lease::decided(&fixed, allowed(700), 5_300);
        assert_eq!((lease.window, lease.usable_for), (5, Duration::from_millis(700)));
        let denied =
            Decision { allowed: false, retry_after: Some(Duration::from_millis(700)), ..allowed(700) };
        assert_eq!(Lease::decided(&fixed, denied, 5_300).usable_for, Duration::ZERO);
        Ok(())
    }
}
