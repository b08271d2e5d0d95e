//! What a replay counts: per rule and per identity, requests allowed,
//! delayed, denied and blocked, and the refusals over time in a bounded number of
//! buckets. Exact counts; one entry per (rule, identity) seen.

use std::collections::HashMap;

use slidegate_http::offenders::IdentityHash;

/// The buckets a timeline keeps at most, whatever the span: when a log
/// spans more, buckets widen to the next width ([`next_width`]), adding up
/// neighbours. A timeline's memory is this many buckets per rule.
pub const MAX_BUCKETS: usize = 120;

/// Bucket widths, each a multiple of the one before, so widening sums whole
/// buckets: 1 s, 5 s, 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 6 h, 12 h, 1 d, 7 d, 28 d;
/// then doubling (56 d, 112 d, ...) for spans over 120 × 28 d, about 9 years.
const WIDTHS_MS: [u64; 14] = [
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
    21_600_000,
    43_200_000,
    86_400_000,
    604_800_000,
    2_419_200_000,
];

/// What happened to some requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    /// Allowed at once.
    pub allowed: u64,
    /// Held by the rule's `delay`, then allowed.
    pub delayed: u64,
    /// Refused by a limit (in shadow mode: would have been).
    pub denied: u64,
    /// Refused because the identity was in the penalty box (the denial that
    /// started a block included).
    pub blocked: u64,
}

impl Counts {
    pub fn add(&mut self, outcome: Outcome) {
        self.requests += 1;
        match outcome {
            Outcome::Allowed => self.allowed += 1,
            Outcome::Delayed => self.delayed += 1,
            Outcome::Denied => self.denied += 1,
            Outcome::Blocked => self.blocked += 1,
        }
    }

    /// Denied or blocked.
    pub fn refused(&self) -> u64 {
        self.denied + self.blocked
    }
}

/// One request's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Delayed,
    Denied,
    Blocked,
}

/// One rule's counts.
#[derive(Debug, Default)]
pub struct RuleTally {
    pub counts: Counts,
    pub identities: HashMap<IdentityHash, Counts>,
}

impl RuleTally {
    /// The `n` identities refused most (at least once), most refused first;
    /// ties by requests, then by hash, so the order is the same every run
    /// with the same secret.
    pub fn heaviest(&self, n: usize) -> Vec<(IdentityHash, Counts)> {
        let mut refused: Vec<(IdentityHash, Counts)> =
            self.identities.iter().filter(|(_, c)| c.refused() > 0).map(|(h, c)| (*h, *c)).collect();
        refused.sort_by(|(ha, a), (hb, b)| {
            (b.refused(), b.requests)
                .cmp(&(a.refused(), a.requests))
                .then_with(|| ha.short_hex().cmp(&hb.short_hex()))
        });
        refused.truncate(n);
        refused
    }
}

/// Refusals per rule per bucket of time, from the first request's time on.
#[derive(Debug)]
pub struct Timeline {
    start_ms: Option<u64>,
    width_ms: u64,
    /// Per rule, refusals per bucket; every series as long as the timeline.
    series: Vec<Vec<u64>>,
    len: usize,
}

impl Timeline {
    pub fn new(rules: usize) -> Self {
        Self { start_ms: None, width_ms: WIDTHS_MS[0], series: vec![Vec::new(); rules], len: 0 }
    }

    /// Extends the timeline to `now_ms` (times never go back: the replay's
    /// clock does not), widening its buckets until it fits in [`MAX_BUCKETS`].
    pub fn reach(&mut self, now_ms: u64) {
        let start = *self.start_ms.get_or_insert(now_ms);
        loop {
            let needed = (now_ms.saturating_sub(start) / self.width_ms).saturating_add(1);
            // Any span fits at last: a width over half of u64's range needs 2 buckets.
            if let Ok(needed @ ..=MAX_BUCKETS) = usize::try_from(needed) {
                if needed > self.len {
                    self.len = needed;
                    for s in &mut self.series {
                        s.resize(needed, 0);
                    }
                }
                return;
            }
            self.widen();
        }
    }

    /// Counts a refusal under `rule` at `now_ms`, reached already.
    pub fn refuse(&mut self, rule: usize, now_ms: u64) {
        let start = self.start_ms.unwrap_or(now_ms);
        let i = usize::try_from(now_ms.saturating_sub(start) / self.width_ms).unwrap_or(usize::MAX);
        if let Some(bucket) = self.series.get_mut(rule).and_then(|s| s.get_mut(i)) {
            *bucket += 1;
        }
    }

    fn widen(&mut self) {
        let next = next_width(self.width_ms);
        let factor = usize::try_from(next / self.width_ms).unwrap_or(usize::MAX);
        self.width_ms = next;
        for s in &mut self.series {
            *s = s.chunks(factor).map(|c| c.iter().sum()).collect();
        }
        self.len = self.len.div_ceil(factor);
    }

    pub fn start_ms(&self) -> u64 {
        self.start_ms.unwrap_or(0)
    }

    pub fn bucket_ms(&self) -> u64 {
        self.width_ms
    }

    /// Refusals per bucket of rule number `rule`.
    pub fn series(&self, rule: usize) -> &[u64] {
        self.series.get(rule).map_or(&[], Vec::as_slice)
    }
}

/// The bucket width after `width_ms`: the next of [`WIDTHS_MS`], or twice it.
fn next_width(width_ms: u64) -> u64 {
    match WIDTHS_MS.iter().find(|&&w| w > width_ms) {
        Some(&w) => w,
        None => width_ms.saturating_mul(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_widens_its_buckets_and_keeps_every_refusal() {
        let mut t = Timeline::new(2);
        let start = 1_000_000;
        for s in 0..600 {
            let now = start + s * 1000;
            t.reach(now);
            t.refuse(0, now);
            if s % 2 == 0 {
                t.refuse(1, now);
            }
        }
        assert_eq!(t.bucket_ms(), 5_000, "600 s in 120 buckets of 5 s");
        assert_eq!(t.series(0).len(), 120);
        assert_eq!(t.series(0).iter().sum::<u64>(), 600);
        assert_eq!(t.series(1).iter().sum::<u64>(), 300);
        assert!(t.series(0).iter().all(|&n| n == 5));
        // A year later: the widest buckets still hold it.
        t.reach(start + 365 * 86_400_000);
        assert!(t.series(0).len() <= MAX_BUCKETS);
        assert_eq!(t.series(0).iter().sum::<u64>(), 600);
    }

    /// Past 120 buckets of 28 days, buckets double: the end of u64's range
    /// still fits in 120, and every refusal is kept.
    #[test]
    fn any_span_fits_in_max_buckets() {
        let mut t = Timeline::new(3);
        t.reach(0);
        t.refuse(2, 0);
        let day = 86_400_000;
        // 120 × 28 d and a day: the first doubling.
        t.reach(120 * 28 * day + day);
        assert_eq!((t.bucket_ms(), t.series(2).len()), (56 * day, 61));
        for end in [400 * 365 * day, u64::MAX] {
            t.reach(end);
            t.refuse(2, end);
            assert!(t.series(2).len() <= MAX_BUCKETS, "{end}: {}", t.series(2).len());
            assert_eq!(t.series(0).len(), t.series(2).len(), "every series as long");
        }
        assert_eq!(t.series(2).iter().sum::<u64>(), 3);
        assert_eq!(t.series(2).last(), Some(&1), "the last refusal in the last bucket");
    }
}
