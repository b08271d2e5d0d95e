//! The circuit breaker in front of the store.
//!
//! The breaker judges the store by its failure *rate* over a short sliding
//! window, not by a run of consecutive failures: at hundreds of decisions a
//! second a 50 ms stall (or a busy CPU) times out a dozen calls in a row, yet
//! the store is healthy, and opening on that run cost every decision of the
//! following probe interval. It opens when, among the calls of the last
//! `window`, at least `min_calls` were made and at least `failure_rate` percent
//! failed. Below `min_calls` calls per window (low traffic, where a rate means
//! little) it falls back to `failures` consecutive failures.
//!
//! While open, decisions skip the store (so a dead Redis costs them nothing,
//! not even the deadline), except one *trial* call per `trial_interval`: the
//! first success — a trial, or a call that started before the breaker opened —
//! closes it. A background probe (started by the caller when the breaker
//! opens) closes it too, so it also recovers when no traffic arrives.
//!
//! Time is passed in as milliseconds since an epoch the caller picks, so the
//! state machine is tested with hand-made times.

use crate::TimeSpan;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Buckets of the sliding window: the window slides in steps of `window / BUCKETS`.
const BUCKETS: usize = 10;

/// How the breaker decides to open and to try the store again: the one
/// definition of these settings (`slidegate serve` reads its `[store]
/// breaker_*` keys into it), and its [`Default`] the one set of defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerPolicy {
    /// Consecutive failures that open the breaker while the window holds
    /// fewer than `min_calls` calls.
    pub failures: u32,
    /// The sliding window the failure rate is measured over.
    pub window: TimeSpan,
    /// Calls the window must hold before its failure rate is trusted.
    pub min_calls: u32,
    /// Percentage of failed calls in the window (1 to 100) that opens the breaker.
    pub failure_rate: u8,
    /// While open, one decision per this interval calls the store as a trial.
    pub trial_interval: TimeSpan,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            failures: 3,
            // At 600 decisions a second, a 1 s window holds 600 calls: a stall
            // that times out a few dozen is far below half. 20 calls is the
            // least for a rate to mean something; below it (a few requests a
            // second) consecutive failures decide.
            window: TimeSpan::from_secs(1),
            min_calls: 20,
            failure_rate: 50,
            // One decision in 20 ms may pay the deadline to learn the store is
            // back: recovery within ~20 ms instead of a probe interval.
            trial_interval: TimeSpan::from_millis(20),
        }
    }
}

/// What a decision should do about the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Closed: call the store.
    Call,
    /// Open, and this decision is the trial of its interval: call the store.
    Trial,
    /// Open: skip the store.
    Skip,
}

/// Failure-rate breaker state, shared by every request.
#[derive(Debug)]
pub struct Breaker {
    policy: BreakerPolicy,
    /// Width of one bucket in ms (at least 1).
    bucket_ms: u64,
    /// Per bucket: bucket number (high 32 bits), calls (next 16), failures (low 16).
    buckets: [AtomicU64; BUCKETS],
    consecutive: AtomicU32,
    open: AtomicBool,
    /// While open: the time (ms) from which the next trial may go.
    next_trial_ms: AtomicU64,
}

const COUNT_MAX: u64 = 0xFFFF;

fn pack(bucket: u64, calls: u64, failures: u64) -> u64 {
    ((bucket & 0xFFFF_FFFF) << 32) | (calls.min(COUNT_MAX) << 16) | failures.min(COUNT_MAX)
}

fn unpack(v: u64) -> (u64, u64, u64) {
    (v >> 32, (v >> 16) & COUNT_MAX, v & COUNT_MAX)
}

impl Breaker {
    /// A closed breaker with `policy` (counts below 1 are taken as 1).
    pub fn new(policy: BreakerPolicy) -> Self {
        let window_ms = policy.window.as_millis();
        let bucket_ms = (window_ms / BUCKETS as u64).max(1);
        let policy = BreakerPolicy {
            failures: policy.failures.max(1),
            min_calls: policy.min_calls.max(1),
            failure_rate: policy.failure_rate.clamp(1, 100),
            ..policy
        };
        Self {
            policy,
            bucket_ms,
            buckets: Default::default(),
            consecutive: AtomicU32::new(0),
            open: AtomicBool::new(false),
            next_trial_ms: AtomicU64::new(0),
        }
    }

    /// Whether decisions skip the store (but for trials).
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Whether a decision at `now_ms` should call the store.
    pub fn admit(&self, now_ms: u64) -> Admit {
        if !self.is_open() {
            return Admit::Call;
        }
        let next = self.next_trial_ms.load(Ordering::Acquire);
        if now_ms >= next {
            let after = now_ms.saturating_add(self.trial_ms());
            // One winner per interval: the others see the new time and skip.
            if self.next_trial_ms.compare_exchange(next, after, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Admit::Trial;
            }
        }
        Admit::Skip
    }

    fn trial_ms(&self) -> u64 {
        self.policy.trial_interval.as_millis().max(1)
    }

    /// A store call succeeded at `now_ms`. Returns true when it closed the breaker.
    pub fn record_success(&self, now_ms: u64) -> bool {
        self.consecutive.store(0, Ordering::Relaxed);
        if self.is_open() {
            // The store answered: whether a trial or a call from before the
            // opening, it decides again.
            return self.close();
        }
        self.count(now_ms, false);
        false
    }

    /// A store call failed at `now_ms`. Returns true for exactly the call that
    /// opened the breaker: its caller starts the background probe.
    pub fn record_failure(&self, now_ms: u64) -> bool {
        if self.is_open() {
            // A failed trial (or a straggler): stay open, wait for the next trial.
            return false;
        }
        let consecutive = self.consecutive.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        self.count(now_ms, true);
        let (calls, failures) = self.window(now_ms);
        let trip = if calls >= u64::from(self.policy.min_calls) {
            failures.saturating_mul(100) >= calls.saturating_mul(u64::from(self.policy.failure_rate))
        } else {
            consecutive >= self.policy.failures
        };
        if trip && !self.open.swap(true, Ordering::AcqRel) {
            self.next_trial_ms.store(now_ms.saturating_add(self.trial_ms()), Ordering::Release);
            return true;
        }
        false
    }

    /// The store answers again: close, and forget the failures that opened it.
    /// Returns true when this call closed it.
    pub fn close(&self) -> bool {
        self.consecutive.store(0, Ordering::Relaxed);
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.open.swap(false, Ordering::AcqRel)
    }

    fn count(&self, now_ms: u64, failed: bool) {
        let bucket = now_ms / self.bucket_ms;
        let slot = &self.buckets[(bucket % BUCKETS as u64) as usize];
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let (b, calls, failures) = unpack(current);
            let next = if b == bucket & 0xFFFF_FFFF {
                pack(bucket, calls + 1, failures + u64::from(failed))
            } else {
                pack(bucket, 1, u64::from(failed))
            };
            match slot.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// Calls and failures in the window ending at `now_ms`.
    fn window(&self, now_ms: u64) -> (u64, u64) {
        let bucket = now_ms / self.bucket_ms;
        let oldest = bucket.saturating_sub(BUCKETS as u64 - 1) & 0xFFFF_FFFF;
        let newest = bucket & 0xFFFF_FFFF;
        self.buckets.iter().fold((0, 0), |(c, f), slot| {
            let (b, calls, failures) = unpack(slot.load(Ordering::Relaxed));
            let live = (b, calls) != (0, 0) && b >= oldest && b <= newest;
            if live {
                (c + calls, f + failures)
            } else {
                (c, f)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            failures: 3,
            window: TimeSpan::from_secs(1),
            min_calls: 20,
            failure_rate: 50,
            trial_interval: TimeSpan::from_millis(20),
        }
    }

    #[test]
    fn at_low_traffic_consecutive_failures_open_it_once_and_successes_reset_the_count() {
        let b = Breaker::new(policy());
        assert!(!b.record_failure(0));
        assert!(!b.record_failure(1));
        b.record_success(2);
        assert!(!b.record_failure(3));
        assert!(!b.record_failure(4));
        assert!(!b.is_open());
        assert!(b.record_failure(5));
        assert!(b.is_open());
        // Failures racing in after the opening one do not start a second probe.
        assert!(!b.record_failure(6));
        assert!(b.close());
        assert!(!b.is_open());
        assert!(!b.record_failure(7));
    }

    #[test]
    fn a_short_run_of_failures_amid_busy_traffic_does_not_open_it() {
        // 600 calls a second; a stall times out 30 calls in a row.
        let b = Breaker::new(policy());
        let mut t = 0;
        for _ in 0..600 {
            b.record_success(t);
            t += 1;
        }
        for _ in 0..30 {
            assert!(!b.record_failure(t));
            t += 1;
        }
        assert!(!b.is_open());
        assert_eq!(b.admit(t), Admit::Call);
    }

    #[test]
    fn half_the_calls_of_the_window_failing_opens_it() {
        let b = Breaker::new(policy());
        let mut t = 10_000;
        for _ in 0..20 {
            b.record_success(t);
            t += 10;
        }
        // 19 failures of 39 calls: under half.
        for _ in 0..19 {
            assert!(!b.record_failure(t));
            t += 10;
        }
        assert!(b.record_failure(t), "20 failures of 40 calls open it");
        // Successes older than the window no longer count.
        let b = Breaker::new(policy());
        for i in 0..100 {
            b.record_success(i);
        }
        for i in 0..20 {
            assert_eq!(b.record_failure(2_000 + i), i == 2, "only the last 1 s counts");
        }
    }

    #[test]
    fn an_open_breaker_lets_one_trial_through_per_interval_and_a_success_closes_it() {
        let b = Breaker::new(policy());
        for t in 0..3 {
            b.record_failure(t);
        }
        assert!(b.is_open());
        // Opened at 2: the first trial is due at 22.
        assert_eq!(b.admit(10), Admit::Skip);
        assert_eq!(b.admit(22), Admit::Trial);
        assert_eq!(b.admit(22), Admit::Skip);
        assert_eq!(b.admit(41), Admit::Skip);
        // The trial failed: still open, the next one at 42.
        assert!(!b.record_failure(23));
        assert_eq!(b.admit(42), Admit::Trial);
        assert!(b.record_success(43));
        assert_eq!(b.admit(43), Admit::Call);
        // The failures that opened it are forgotten.
        assert!(!b.record_failure(44));
        assert!(!b.record_failure(45));
        assert!(b.record_failure(46));
    }
}
