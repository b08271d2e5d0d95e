//! The circuit breaker in front of the store.
//!
//! After `threshold` consecutive failures the breaker opens: decisions stop
//! calling the store (so a dead Redis costs requests nothing, not even the
//! deadline) and one background task probes the store until it answers,
//! then closes the breaker. There is no half-open state on the request path:
//! requests never pay for finding out whether the store is back.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Consecutive-failure breaker state, shared by every request.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    failures: AtomicU32,
    open: AtomicBool,
}

impl Breaker {
    /// A closed breaker that opens after `threshold` consecutive failures (at least 1).
    pub fn new(threshold: u32) -> Self {
        Self { threshold: threshold.max(1), failures: AtomicU32::new(0), open: AtomicBool::new(false) }
    }

    /// Whether decisions should skip the store.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// A store call succeeded.
    pub fn record_success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// A store call failed. Returns true for exactly the call that opened the
    /// breaker: its caller starts the probe.
    pub fn record_failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel)
    }

    /// The probe reached the store: close.
    pub fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_once_after_consecutive_failures_and_successes_reset_the_count() {
        let b = Breaker::new(3);
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        b.record_success();
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        assert!(!b.is_open());
        assert!(b.record_failure());
        assert!(b.is_open());
        // Failures racing in after the opening one do not start a second probe.
        assert!(!b.record_failure());
        b.close();
        assert!(!b.is_open());
        assert!(!b.record_failure());
    }
}
