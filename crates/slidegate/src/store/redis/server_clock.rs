//! The caller's deadline on the Redis server's clock, so that a script (or
//! the module) reaching a call after the caller gave up refuses it unrun.
//!
//! The store learns the offset between the server's clock (`TIME`, ms since
//! the epoch) and its own monotonic clock from samples: a `TIME` sent at
//! local instant `s` and answered at `r` was read by the server at some
//! local instant in `[s, r]`, so `server − r` is a *lower bound* of the
//! offset (the server's ms are floored, which only lowers it further). The
//! store keeps the highest lower bound seen in the current period and the
//! previous one ([`PERIOD_MS`]) and turns a local deadline `d` into the
//! server time `d + offset`.
//!
//! **The bound.** With a lower bound the server deadline is never later
//! than the caller's: a call the caller gave up on is refused, always. It
//! may be earlier by the sample's error, at most its round trip (a fraction
//! of a ms on a LAN; the highest bound of two periods, so one slow sample
//! does not matter): a call reaching Redis that close to its deadline is
//! refused although the caller still waited. Not covered:
//!
//! - a call that ran just before its deadline, whose reply reached the caller
//!   after it: charged, and counted failed (within one reply's trip);
//! - a server clock stepped *back* by Δ: for up to two periods deadlines are
//!   late by Δ (a refused call's reply carries the server's time, so a step
//!   *forward* is learned at the first refusal);
//! - a Redis Cluster: one offset for all masters, the highest, so deadlines
//!   on a master whose clock is behind the others' are late by the spread;
//! - before the first sample (taken when connecting, then every
//!   [`SAMPLE_EVERY_MS`] while decisions are made), calls carry no deadline.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// How long a best sample is kept: the current period's and the previous
/// one's count.
const PERIOD_MS: u64 = 1_000;
/// How often the store asks the server's time while it decides.
const SAMPLE_EVERY_MS: u64 = 250;
/// No sample in a period.
const NONE: i64 = i64::MIN;

/// The offset between the server's clock and this process's, learned from samples.
#[derive(Debug)]
pub(super) struct ServerClock {
    anchor: Instant,
    /// The period (local ms / [`PERIOD_MS`]) `current` belongs to.
    period: AtomicU64,
    /// The highest lower bound of the offset sampled in `period`, and in the one before.
    current: AtomicI64,
    previous: AtomicI64,
    /// When (local ms) a sample is next due.
    next_sample: AtomicU64,
}

impl Default for ServerClock {
    fn default() -> Self {
        Self {
            anchor: Instant::now(),
            period: AtomicU64::new(0),
            current: AtomicI64::new(NONE),
            previous: AtomicI64::new(NONE),
            next_sample: AtomicU64::new(0),
        }
    }
}

impl ServerClock {
    /// Local ms of `at` since the anchor (0 before it).
    fn local_ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.anchor).as_millis()).unwrap_or(u64::MAX)
    }

    /// Learns from the server's time `server_ms`, in a reply received at `received`.
    pub(super) fn learn(&self, server_ms: u64, received: Instant) {
        let local = self.local_ms(received);
        let Ok(server) = i64::try_from(server_ms) else { return };
        let Ok(local_signed) = i64::try_from(local) else { return };
        let sample = server - local_signed;
        let period = local / PERIOD_MS;
        let seen = self.period.load(Relaxed);
        if period > seen && self.period.compare_exchange(seen, period, Relaxed, Relaxed).is_ok() {
            let last = self.current.swap(sample, Relaxed);
            self.previous.store(if period == seen + 1 { last } else { NONE }, Relaxed);
        } else {
            self.current.fetch_max(sample, Relaxed);
        }
    }

    /// `deadline` on the server's clock (ms since the epoch), or `None`
    /// before any sample.
    pub(super) fn server_deadline(&self, deadline: Instant) -> Option<u64> {
        let offset = self.current.load(Relaxed).max(self.previous.load(Relaxed));
        if offset == NONE {
            return None;
        }
        let local = i64::try_from(self.local_ms(deadline)).ok()?;
        u64::try_from(local.checked_add(offset)?).ok()
    }

    /// Whether a sample is due at `now`; `true` to one caller per interval.
    pub(super) fn claim_sample(&self, now: Instant) -> bool {
        let local = self.local_ms(now);
        let due = self.next_sample.load(Relaxed);
        local >= due
            && self.next_sample.compare_exchange(due, local + SAMPLE_EVERY_MS, Relaxed, Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_deadline_uses_the_highest_lower_bound_of_two_periods() {
        let clock = ServerClock::default();
        let t0 = clock.anchor;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(clock.server_deadline(at(50)), None, "no deadline before a sample");
        // Server at 1,000,000 when the reply came at local 10: offset ≥ 999,990.
        clock.learn(1_000_000, at(10));
        assert_eq!(clock.server_deadline(at(50)), Some(1_000_040));
        // A slow sample (a reply 30 ms after the server read its time) is
        // a weaker bound: it changes nothing.
        clock.learn(1_000_070, at(100));
        assert_eq!(clock.server_deadline(at(150)), Some(1_000_140));
        // A tighter one raises the offset.
        clock.learn(1_000_195, at(200));
        assert_eq!(clock.server_deadline(at(250)), Some(1_000_245));
        // Two periods on, the old best is forgotten: a clock stepped back
        // by 100 ms is followed.
        clock.learn(1_002_395 - 100, at(2_400));
        clock.learn(1_003_495 - 100, at(3_500));
        assert_eq!(clock.server_deadline(at(3_600)), Some(1_003_595 - 100));
    }

    #[test]
    fn one_caller_claims_each_sample() {
        let clock = ServerClock::default();
        let now = clock.anchor;
        assert!(clock.claim_sample(now));
        assert!(!clock.claim_sample(now));
        assert!(clock.claim_sample(now + Duration::from_millis(SAMPLE_EVERY_MS)));
    }
}
