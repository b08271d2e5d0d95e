//! Sliding log: one timestamp per admitted permit — exact, and the ground truth.
//!
//! A permit admitted at `t` counts while `now < t + W`. A request for `cost`
//! is allowed when the permits still counting plus `cost` fit in the limit.
//! Memory grows with the limit (up to `limit` timestamps per identity), which
//! is why the sliding window counter exists.

use std::collections::VecDeque;
use std::time::Duration;

use super::Usage;
use crate::{Decision, Quota};

/// The largest limit a sliding log accepts: 10,000.
///
/// The log holds one entry per admitted permit, so its limit bounds the
/// memory of one identity and the work of one request: a cost of `limit`
/// writes `limit` entries, and on Redis that runs inside one script, during
/// which the server answers nobody. Measured on a loaded 2-core machine (Redis
/// 7, client time, one key): a call of cost 10,000 on an empty log took
/// 30–50 ms and left 1.4 MB (137 B per entry); the same on a full log a
/// window later (trim 10,000, add 10,000) took 50 ms. At 100,000 it took
/// 180–450 ms and 12.8 MB, and a million stalled Redis for 1.8 s and left
/// 115 MB. In process the log costs 8 B per entry (80 KB at the cap). Larger
/// limits want the sliding window counter, which is exact enough and costs
/// two counters whatever the limit.
pub const MAX_LIMIT: u64 = 10_000;

/// The sliding log's state: the log itself.
pub type State = Log;

/// The admission times of the permits that may still count, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    entries: VecDeque<u64>,
}

impl Log {
    /// Admission times in ms, oldest first (one per permit).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.entries.iter().copied()
    }

    /// Index of the first entry still counting at `now_ms`.
    fn first_live(&self, now_ms: u64, w: u64) -> usize {
        self.entries.partition_point(|&t| t + w <= now_ms)
    }

    /// A log of `entries`, admission times in ms, oldest first (a
    /// snapshot's, read back and checked by the caller).
    pub(crate) fn from_entries(entries: VecDeque<u64>) -> Self {
        debug_assert!(entries.iter().zip(entries.iter().skip(1)).all(|(a, b)| a <= b));
        Self { entries }
    }

    /// Bytes this log holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<u64>()
    }
}

/// Decides `cost` permits at `now_ms` without changing the log.
///
/// Use [`record`] to charge an allowed decision; [`decide`] does both.
pub fn check(log: &Log, now_ms: u64, cost: u64, quota: &Quota) -> Decision {
    let (w, limit) = (quota.window_ms(), quota.permits());
    let first = log.first_live(now_ms, w);
    let live = log.entries.len() - first;
    let count = live as u64;
    let allowed = count + cost <= limit;
    let newest =
        if allowed && cost > 0 { Some(now_ms) } else { log.entries.back().copied().filter(|_| live > 0) };
    Decision {
        allowed,
        limit,
        remaining: limit - if allowed { count + cost } else { count },
        reset_after: Duration::from_millis(newest.map_or(0, |t| t + w - now_ms)),
        retry_after: (!allowed).then(|| {
            // The request fits once the oldest `count + cost − limit` permits expire.
            let must_expire = (count + cost - limit) as usize;
            let t = log.entries[first + must_expire - 1];
            Duration::from_millis(t + w - now_ms)
        }),
    }
}

/// Charges `cost` permits at `now_ms`, forgetting the entries that expired.
pub fn record(log: &mut Log, now_ms: u64, cost: u64, quota: &Quota) {
    let first = log.first_live(now_ms, quota.window_ms());
    log.entries.drain(..first);
    // Entries stay sorted even after a clock stepped back (newer stamps
    // already in the log): the new ones go before them, as in a sorted set.
    let at = log.entries.partition_point(|&t| t <= now_ms);
    let later = log.entries.split_off(at);
    log.entries.extend(std::iter::repeat_n(now_ms, cost as usize));
    log.entries.extend(later);
}

/// Decides `cost` permits at `now_ms` and charges them when allowed.
///
/// Takes the log by value like every algorithm's `decide`; moving a log
/// moves three words, never its entries.
pub fn decide(mut log: Log, now_ms: u64, cost: u64, quota: &Quota) -> (Log, Decision) {
    let decision = check(&log, now_ms, cost, quota);
    // A peek (cost 0) writes nothing, as on Redis.
    if decision.allowed && cost > 0 {
        record(&mut log, now_ms, cost, quota);
    }
    (log, decision)
}

/// Whether every entry expired at `now_ms`, so the log may be forgotten.
pub fn is_idle(log: &Log, now_ms: u64, quota: &Quota) -> bool {
    log.entries.back().is_none_or(|&t| t + quota.window_ms() <= now_ms)
}

/// The permits still counting at `now_ms`: the exact count.
pub fn usage(log: &Log, now_ms: u64, quota: &Quota) -> Usage {
    let live = log.entries.len() - log.first_live(now_ms, quota.window_ms());
    Usage { units: live as u64, per_permit: 1 }
}

/// The sliding log as the stores see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlidingLog;

#[cfg(test)]
mod tests {
    use super::*;

    /// Decides and keeps the new log, as a store does.
    fn run(log: &mut Log, now_ms: u64, cost: u64, q: &Quota) -> Decision {
        let (next, decision) = decide(std::mem::take(log), now_ms, cost, q);
        *log = next;
        decision
    }

    #[test]
    fn exact_over_any_window_and_retry_waits_for_the_oldest_to_expire() {
        let q = Quota::new(3, Duration::from_millis(1000)).unwrap();
        let mut log = Log::default();
        assert!(run(&mut log, 100, 1, &q).allowed);
        assert!(run(&mut log, 400, 1, &q).allowed);
        let d = run(&mut log, 700, 1, &q);
        assert_eq!((d.allowed, d.remaining), (true, 0));
        assert_eq!(d.reset_after, Duration::from_millis(1000));
        let d = run(&mut log, 800, 2, &q);
        assert!(!d.allowed);
        // Two must expire: the one at 400 leaves at 1400.
        assert_eq!(d.retry_after, Some(Duration::from_millis(600)));
        assert!(!run(&mut log, 1_399, 2, &q).allowed);
        assert!(run(&mut log, 1_400, 2, &q).allowed);
        assert_eq!(log.entries().collect::<Vec<_>>(), [700, 1_400, 1_400]);
    }

    #[test]
    fn idle_once_the_newest_entry_expired() {
        let q = Quota::new(3, Duration::from_millis(1000)).unwrap();
        let mut log = Log::default();
        assert!(is_idle(&log, 0, &q));
        run(&mut log, 100, 1, &q);
        assert!(!is_idle(&log, 1_099, &q));
        assert!(is_idle(&log, 1_100, &q));
    }
}
