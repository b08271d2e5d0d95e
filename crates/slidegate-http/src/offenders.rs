//! Top offenders: which identities were refused most over the last minutes,
//! in bounded memory.
//!
//! A scraper at 50× its limit is refused thousands of times a minute; an
//! operator wants to see *who*, without a map that grows with every address
//! an attacker can spoof. [`Offenders`] keeps one Space-Saving summary
//! (Metwally, Agrawal, El Abbadi, 2005) of [`CAPACITY`] entries per minute
//! for the last [`MINUTES`] minutes: about 15 KB in all, whatever the
//! traffic. Space-Saving never undercounts: an identity that is not tracked
//! takes the place of the least counted one and inherits its count as its
//! error, so every reported count `c` with error `e` satisfies
//! `c - e ≤ true count ≤ c`, and any identity refused more than `N / k`
//! times in a minute of `N` refusals is tracked. With fewer than `k`
//! identities refused in a minute nothing is ever evicted and counts are
//! exact (error 0).
//!
//! Identities are the limiter's keyed BLAKE3 digests ([`IdentityHash`]),
//! never raw keys or addresses.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slidegate::{Digest, Identity, Source};

/// Identities tracked per minute: refusals spread over more identities than
/// this are counted approximately (with a stated error).
pub const CAPACITY: usize = 64;
/// Minutes of history kept; a query asks for at most this many.
pub const MINUTES: usize = 5;
const MINUTE_MS: u64 = 60_000;

/// What happened to an identity's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The request was denied by a limit.
    Denied,
    /// The request was refused because the identity is blocked until
    /// `until` (a penalty). It counts as a refusal and records the block.
    Blocked {
        /// When the block ends.
        until: SystemTime,
    },
}

/// An identity as the top list keeps it: its source and digest, without its
/// scope (the list keeps the rule beside it). Copied, never parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentityHash {
    digest: Digest,
    source: Source,
}

impl From<&Identity> for IdentityHash {
    fn from(identity: &Identity) -> Self {
        Self { digest: identity.digest(), source: identity.source() }
    }
}

impl IdentityHash {
    /// Whether it is an API key, an address or a name.
    pub fn kind(&self) -> Source {
        self.source
    }

    /// The first 64 bits in hex (16 digits): enough to tell offenders apart
    /// and to grep the logs for, and still only a keyed hash.
    pub fn short_hex(&self) -> String {
        format!("{:016x}", self.digest.high_u64())
    }
}

/// One identity of the top list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offender {
    /// The rule's index in the configuration.
    pub rule: usize,
    /// The identity.
    pub identity: IdentityHash,
    /// Refusals over the window: an upper bound, at most `error` above the truth.
    pub denials: u64,
    /// How much `denials` may overcount (0: exact).
    pub error: u64,
    /// The end of the latest block recorded, if it is still in the future.
    pub blocked_until: Option<SystemTime>,
}

/// One tracked identity of one minute.
#[derive(Debug, Clone, Copy)]
struct Entry {
    rule: usize,
    identity: IdentityHash,
    count: u64,
    error: u64,
    /// Unix ms; 0 when no block was recorded.
    blocked_until_ms: u64,
}

/// The Space-Saving summary of one minute.
#[derive(Debug)]
struct Bucket {
    /// Unix minute this bucket counts; a bucket of an older minute is stale.
    minute: u64,
    entries: Vec<Entry>,
}

impl Bucket {
    fn record(&mut self, rule: usize, identity: IdentityHash, blocked_until_ms: u64) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.rule == rule && e.identity == identity) {
            e.count += 1;
            e.blocked_until_ms = e.blocked_until_ms.max(blocked_until_ms);
            return;
        }
        let fresh = Entry { rule, identity, count: 1, error: 0, blocked_until_ms };
        if self.entries.len() < CAPACITY {
            self.entries.push(fresh);
            return;
        }
        // Full: the newcomer replaces the least counted entry and inherits its
        // count as the error, so no true count is ever underestimated. A
        // linear scan of 64 entries is a few dozen ns; a heap would save
        // nothing at this size.
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            *min = Entry { count: min.count + 1, error: min.count, ..fresh };
        }
    }

    /// The count an identity missing from this bucket may have had: 0 unless
    /// the bucket is full (then at most its least count).
    fn absent_bound(&self) -> u64 {
        if self.entries.len() < CAPACITY {
            0
        } else {
            self.entries.iter().map(|e| e.count).min().unwrap_or(0)
        }
    }
}

/// The identities refused most over the last [`MINUTES`] minutes, per rule:
/// [`MINUTES`] Space-Saving summaries of [`CAPACITY`] entries, merged on read.
#[derive(Debug)]
pub struct Offenders {
    // One lock: a record is a scan of 64 entries, and only refusals record.
    buckets: Mutex<Vec<Bucket>>,
}

impl Default for Offenders {
    fn default() -> Self {
        Self::new()
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Offenders {
    /// An empty record.
    pub fn new() -> Self {
        let buckets = (0..MINUTES)
            .map(|_| Bucket { minute: u64::MAX, entries: Vec::with_capacity(CAPACITY) })
            .collect();
        Self { buckets: Mutex::new(buckets) }
    }

    /// Records `event` for `identity` under rule number `rule`, now.
    pub fn record(&self, rule: usize, identity: &Identity, event: Event) {
        self.record_at(unix_ms(SystemTime::now()), rule, identity.into(), event);
    }

    /// Records `event` at `now_ms` (Unix milliseconds).
    pub fn record_at(&self, now_ms: u64, rule: usize, identity: IdentityHash, event: Event) {
        let until_ms = match event {
            Event::Denied => 0,
            Event::Blocked { until } => unix_ms(until),
        };
        let minute = now_ms / MINUTE_MS;
        let mut buckets = self.lock();
        let bucket = &mut buckets[(minute % MINUTES as u64) as usize];
        if bucket.minute != minute {
            // The slot last counted a minute that is out of the window now.
            bucket.minute = minute;
            bucket.entries.clear();
        }
        bucket.record(rule, identity, until_ms);
    }

    /// The `limit` identities refused most in the last `minutes` minutes (the
    /// current, partial minute included; 1 to [`MINUTES`]), most refused first.
    pub fn top(&self, minutes: usize, limit: usize) -> Vec<Offender> {
        self.top_at(unix_ms(SystemTime::now()), minutes, limit)
    }

    /// [`Offenders::top`] as of `now_ms` (Unix milliseconds).
    pub fn top_at(&self, now_ms: u64, minutes: usize, limit: usize) -> Vec<Offender> {
        let now_minute = now_ms / MINUTE_MS;
        let minutes = minutes.clamp(1, MINUTES) as u64;
        let buckets = self.lock();
        let live: Vec<&Bucket> =
            buckets.iter().filter(|b| b.minute <= now_minute && now_minute - b.minute < minutes).collect();
        // Merge: sum each identity's counts and errors over the minutes, and
        // note in which minutes it was tracked.
        let mut merged: HashMap<(usize, IdentityHash), (Entry, u8)> = HashMap::new();
        for (i, bucket) in live.iter().enumerate() {
            for e in &bucket.entries {
                let slot =
                    merged.entry((e.rule, e.identity)).or_insert((Entry { count: 0, error: 0, ..*e }, 0));
                slot.0.count += e.count;
                slot.0.error += e.error;
                slot.0.blocked_until_ms = slot.0.blocked_until_ms.max(e.blocked_until_ms);
                slot.1 |= 1 << i;
            }
        }
        // A minute that was full and did not track an identity may still have
        // refused it up to that minute's least count: add it to both the count
        // and the error, so the count stays an upper bound.
        let bounds: Vec<u64> = live.iter().map(|b| b.absent_bound()).collect();
        let mut top: Vec<Offender> = merged
            .into_values()
            .map(|(mut e, seen)| {
                for (i, bound) in bounds.iter().enumerate() {
                    if seen & (1 << i) == 0 {
                        e.count += bound;
                        e.error += bound;
                    }
                }
                Offender {
                    rule: e.rule,
                    identity: e.identity,
                    denials: e.count,
                    error: e.error,
                    blocked_until: (e.blocked_until_ms > now_ms)
                        .then(|| UNIX_EPOCH + Duration::from_millis(e.blocked_until_ms)),
                }
            })
            .collect();
        // Most refused first; among equals the surer count, then a fixed order.
        top.sort_by(|a, b| {
            (b.denials, b.denials - b.error, a.rule, a.identity.digest).cmp(&(
                a.denials,
                a.denials - a.error,
                b.rule,
                b.identity.digest,
            ))
        });
        top.truncate(limit);
        top
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Bucket>> {
        // A panic while holding the lock leaves counts that are still sound.
        self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> IdentityHash {
        IdentityHash { digest: Digest(n.to_be_bytes()), source: Source::Ip }
    }

    const T0: u64 = 1_700_000_000_000;

    #[test]
    fn keeps_the_source_and_shows_a_short_hash_of_the_digest() {
        let digest = Digest(0x0123_4567_89ab_cdef_0011_2233_4455_6677u128.to_be_bytes());
        let hash = IdentityHash::from(&Identity::new("search", Source::Ip, digest));
        assert_eq!(hash.short_hex(), "0123456789abcdef");
        assert_eq!(hash.kind(), Source::Ip);
        let key = IdentityHash::from(&Identity::new("a:b", Source::ApiKey, digest));
        assert_eq!(key.kind(), Source::ApiKey);
        assert_ne!(hash, key, "the source is part of what is tracked");
    }

    #[test]
    fn counts_are_exact_with_fewer_identities_than_the_capacity() {
        let o = Offenders::new();
        // 63 identities of one rule and one of another: 64 entries, none evicted.
        for n in 0..63u128 {
            for _ in 0..=n {
                o.record_at(T0, 0, id(n), Event::Denied);
            }
        }
        o.record_at(T0, 1, id(5), Event::Denied);
        let top = o.top_at(T0 + 1, MINUTES, 1000);
        assert_eq!(top.len(), 64);
        assert_eq!((top[0].identity, top[0].denials, top[0].error), (id(62), 63, 0));
        assert_eq!((top[1].identity, top[1].denials), (id(61), 62));
        assert!(top.iter().all(|o| o.error == 0));
        let rule1: Vec<_> = top.iter().filter(|o| o.rule == 1).collect();
        assert_eq!((rule1.len(), rule1[0].identity, rule1[0].denials), (1, id(5), 1));
        assert_eq!(o.top_at(T0 + 1, MINUTES, 3).len(), 3);
    }

    #[test]
    fn the_heaviest_identity_is_reported_with_a_bound_when_many_compete() {
        let o = Offenders::new();
        // 1000 one-off identities interleaved with one heavy hitter that
        // sends 300: far more identities than the capacity.
        let mut truth = 0u64;
        for n in 0..1000u128 {
            o.record_at(T0, 0, id(1_000_000 + n), Event::Denied);
            if n % 10 < 3 {
                o.record_at(T0, 0, id(7), Event::Denied);
                truth += 1;
            }
        }
        let top = o.top_at(T0, 1, 5);
        assert_eq!(top[0].identity, id(7));
        assert!(top[0].denials >= truth, "never undercounts: {:?}", top[0]);
        assert!(top[0].denials - top[0].error <= truth, "the error bounds the overcount: {:?}", top[0]);
        // The guarantee of Space-Saving: the overcount is at most N / k.
        assert!(top[0].error <= (1000 + truth) / CAPACITY as u64, "{:?}", top[0]);
        // Over two minutes, the second full with other identities, the count
        // stays an upper bound and the error covers the minute it was missing.
        for n in 0..200u128 {
            o.record_at(T0 + MINUTE_MS, 0, id(5_000_000 + n), Event::Denied);
        }
        let two = o.top_at(T0 + MINUTE_MS, 2, 1000);
        let heavy = two.iter().find(|x| x.identity == id(7)).unwrap();
        assert!(heavy.denials >= truth && heavy.denials - heavy.error <= truth, "{heavy:?}");
        assert!(heavy.error > top[0].error);
    }

    #[test]
    fn minutes_expire_from_the_window() {
        let o = Offenders::new();
        o.record_at(T0, 0, id(1), Event::Denied);
        o.record_at(T0 + MINUTE_MS, 0, id(1), Event::Denied);
        o.record_at(T0 + MINUTE_MS, 0, id(2), Event::Denied);
        let now = T0 + MINUTE_MS;
        assert_eq!(o.top_at(now, MINUTES, 10)[0].denials, 2);
        // Only the current minute.
        let last = o.top_at(now, 1, 10);
        assert_eq!(last.iter().map(|x| x.denials).collect::<Vec<_>>(), [1, 1]);
        // Four minutes later T0's minute has left the five-minute window.
        let later = T0 + 5 * MINUTE_MS;
        let top = o.top_at(later, MINUTES, 10);
        assert_eq!(top.iter().map(|x| (x.identity, x.denials)).collect::<Vec<_>>(), [(id(1), 1), (id(2), 1)]);
        // Recording reuses T0's slot and forgets what it held.
        o.record_at(later, 0, id(3), Event::Denied);
        let top = o.top_at(later, 1, 10);
        assert_eq!(top.iter().map(|x| (x.identity, x.denials)).collect::<Vec<_>>(), [(id(3), 1)]);
        assert!(o.top_at(later + 5 * MINUTE_MS, MINUTES, 10).is_empty());
    }

    /// The limiter records its denials (shadow ones too) and a block in one
    /// call, which also counts it per rule.
    #[tokio::test]
    async fn the_limiter_records_denials_and_blocks() {
        use crate::config::{IdentityKind as Counted, LimitConfig, RuleConfig, RuleLimits};
        use crate::{LimiterConfig, RateLimiter};
        use slidegate::{Algorithm, Limit, Quota};
        // `a` and `b` (in shadow mode) on their paths, 1 per minute each.
        let rule = |name: &str| {
            let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(1).unwrap());
            let limits = vec![LimitConfig::new(name, limit, 1).unwrap()];
            let path = format!("/{name}").parse().unwrap();
            RuleConfig::new(name, path, RuleLimits::Shared { identity: Counted::ApiKey, limits })
        };
        let mut config = LimiterConfig::default();
        config.rules.push(rule("a"));
        config.rules.push(rule("b"));
        config.rules[1].shadow = true;
        let limiter = RateLimiter::from_config(&config, slidegate::MemoryStore::new()).unwrap();
        for _ in 0..4 {
            limiter.check_key("a", "user-1", 1, false).await.unwrap();
        }
        for _ in 0..3 {
            limiter.check_key("b", "user-1", 1, false).await.unwrap();
        }
        let top = limiter.offenders().top(MINUTES, 10);
        assert_eq!(
            top.iter().map(|o| (o.rule, o.denials, o.error)).collect::<Vec<_>>(),
            [(0, 3, 0), (1, 2, 0)]
        );
        assert_eq!(top[0].identity.kind(), Source::ApiKey);
        // The same key hashes alike under every rule: one identity, two rules.
        assert_eq!(top[0].identity, top[1].identity);
        let key = limiter.identity().identity(&"b".into(), Source::ApiKey, b"user-1");
        let until = SystemTime::now() + Duration::from_secs(600);
        limiter.record_offence(1, &key, Event::Blocked { until });
        limiter.record_offence(9, &key, Event::Blocked { until }); // no such rule: ignored
        let text = limiter.render_metrics();
        assert!(text.contains("slidegate_requests_blocked_total{rule=\"b\"} 1\n"), "{text}");
        assert!(text.contains("slidegate_requests_blocked_total{rule=\"a\"} 0\n"));
        let blocked: Vec<_> =
            limiter.offenders().top(MINUTES, 10).into_iter().filter(|o| o.blocked_until.is_some()).collect();
        assert_eq!(blocked.iter().map(|o| (o.rule, o.denials)).collect::<Vec<_>>(), [(1, 3)]);
    }

    #[test]
    fn a_block_is_shown_until_it_ends() {
        let o = Offenders::new();
        let until = UNIX_EPOCH + Duration::from_millis(T0 + 10_000);
        o.record_at(T0, 0, id(1), Event::Denied);
        o.record_at(T0 + 1, 0, id(1), Event::Blocked { until });
        o.record_at(T0 + 2, 0, id(2), Event::Denied);
        let top = o.top_at(T0 + 5, MINUTES, 10);
        assert_eq!((top[0].identity, top[0].denials, top[0].blocked_until), (id(1), 2, Some(until)));
        assert_eq!(top[1].blocked_until, None);
        assert_eq!(o.top_at(T0 + 10_000, MINUTES, 10)[0].blocked_until, None);
    }
}
