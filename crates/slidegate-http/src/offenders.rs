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
//!
//! Rotation defeats any per-identity summary: a client cycling through
//! hundreds of thousands of addresses (or keys) is refused once or twice per
//! identity, every tracked entry is a newcomer whose error equals its count,
//! and the list ranks nothing ([`Offenders::ranked`] says so). The same
//! refusals are therefore also summed per client network ([`Network`]: the
//! /24 of an IPv4 address, the /48 of an IPv6 one) in summaries of their
//! own, where a rotation inside a few networks adds up to a few heavy,
//! exactly counted entries.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

    /// The full form an operator acts on (`DELETE /v1/penalty/{id}`): the
    /// source's tag and all 128 bits, `k:<32 hex>` or `ip:<32 hex>`.
    pub fn id(&self) -> String {
        format!("{}:{}", self.source.tag(), self.digest)
    }

    /// The identity's digest.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

/// Why a text is not an identity's full form ([`IdentityHash::id`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("identity {shown:?}: expected k:<32 hex digits> (an API key) or ip:<32 hex digits> (a client address), as `slidegate identity hash --full` and the offenders page's id show")]
pub struct IdentityHashError {
    /// The text, cut to 80 characters.
    shown: String,
}

impl std::str::FromStr for IdentityHash {
    type Err = IdentityHashError;

    /// Parses `k:<32 hex>` or `ip:<32 hex>` (either case of hex digits).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || IdentityHashError { shown: text.chars().take(80).collect() };
        let (source, hex) = match text.split_once(':') {
            Some(("k", hex)) => (Source::ApiKey, hex),
            Some(("ip", hex)) => (Source::Ip, hex),
            _ => return Err(err()),
        };
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err());
        }
        let value = u128::from_str_radix(hex, 16).map_err(|_| err())?;
        Ok(Self { digest: Digest(value.to_be_bytes()), source })
    }
}

/// A client network: the /24 of an IPv4 address or the /48 of an IPv6 one
/// (an IPv4-mapped IPv6 address counts as IPv4). Shown as a prefix, such as
/// `203.0.113.0/24`: a network an operator can act on, and no one client's
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Network(IpAddr);

impl Network {
    /// The network of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::v4(v4),
                None => {
                    let s = v6.segments();
                    Self(IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], 0, 0, 0, 0, 0)))
                }
            },
        }
    }

    fn v4(ip: Ipv4Addr) -> Self {
        let [a, b, c, _] = ip.octets();
        Self(IpAddr::V4(Ipv4Addr::new(a, b, c, 0)))
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(ip) => write!(f, "{ip}/24"),
            IpAddr::V6(ip) => write!(f, "{ip}/48"),
        }
    }
}

/// One network of the top list by network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkOffender {
    /// The rule's index in the configuration.
    pub rule: usize,
    /// The network.
    pub network: Network,
    /// Refusals of its clients over the window: an upper bound.
    pub denials: u64,
    /// How much `denials` may overcount (0: exact).
    pub error: u64,
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

/// One tracked identity (or network) of one minute.
#[derive(Debug, Clone, Copy)]
struct Entry<K> {
    rule: usize,
    identity: K,
    count: u64,
    error: u64,
    /// Unix ms; 0 when no block was recorded.
    blocked_until_ms: u64,
}

/// The Space-Saving summary of one minute.
#[derive(Debug)]
struct Bucket<K> {
    /// Unix minute this bucket counts; a bucket of an older minute is stale.
    minute: u64,
    entries: Vec<Entry<K>>,
}

impl<K: Copy + Eq> Bucket<K> {
    fn record(&mut self, rule: usize, identity: K, blocked_until_ms: u64) {
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
    // One lock each: a record is a scan of 64 entries, and only refusals record.
    buckets: Mutex<Vec<Bucket<IdentityHash>>>,
    networks: Mutex<Vec<Bucket<Network>>>,
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
        Self { buckets: Mutex::new(buckets()), networks: Mutex::new(buckets()) }
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
        record_in(&mut lock(&self.buckets), now_ms, rule, identity, until_ms);
    }

    /// Records a refusal of a client in `network` under rule number `rule`, now.
    pub fn record_network(&self, rule: usize, network: Network) {
        self.record_network_at(unix_ms(SystemTime::now()), rule, network);
    }

    /// Records a refusal in `network` at `now_ms` (Unix milliseconds).
    pub fn record_network_at(&self, now_ms: u64, rule: usize, network: Network) {
        record_in(&mut lock(&self.networks), now_ms, rule, network, 0);
    }

    /// The `limit` networks refused most in the last `minutes` minutes, as
    /// [`Offenders::top`] ranks identities.
    pub fn top_networks(&self, minutes: usize, limit: usize) -> Vec<NetworkOffender> {
        self.top_networks_at(unix_ms(SystemTime::now()), minutes, limit)
    }

    /// [`Offenders::top_networks`] as of `now_ms` (Unix milliseconds).
    pub fn top_networks_at(&self, now_ms: u64, minutes: usize, limit: usize) -> Vec<NetworkOffender> {
        let mut top: Vec<NetworkOffender> = merge(&lock(&self.networks), now_ms, minutes)
            .into_iter()
            .map(|e| NetworkOffender { rule: e.rule, network: e.identity, denials: e.count, error: e.error })
            .collect();
        top.sort_by(|a, b| {
            (b.denials, b.denials - b.error, a.rule, a.network.0).cmp(&(
                a.denials,
                a.denials - a.error,
                b.rule,
                b.network.0,
            ))
        });
        top.truncate(limit);
        top
    }

    /// Whether a top list ranks anything: its leader's sure count (`denials
    /// - error`) exceeds its error. Under rotation every entry is a newcomer
    /// whose error is about its whole count, and the order is noise; then
    /// [`Offenders::top_networks`] is the list to read.
    pub fn ranked(top: &[Offender]) -> bool {
        top.first().is_none_or(|o| o.denials - o.error > o.error)
    }

    /// The `limit` identities refused most in the last `minutes` minutes (the
    /// current, partial minute included; 1 to [`MINUTES`]), most refused first.
    pub fn top(&self, minutes: usize, limit: usize) -> Vec<Offender> {
        self.top_at(unix_ms(SystemTime::now()), minutes, limit)
    }

    /// [`Offenders::top`] as of `now_ms` (Unix milliseconds).
    pub fn top_at(&self, now_ms: u64, minutes: usize, limit: usize) -> Vec<Offender> {
        let mut top: Vec<Offender> = merge(&lock(&self.buckets), now_ms, minutes)
            .into_iter()
            .map(|e| Offender {
                rule: e.rule,
                identity: e.identity,
                denials: e.count,
                error: e.error,
                blocked_until: (e.blocked_until_ms > now_ms)
                    .then(|| UNIX_EPOCH + Duration::from_millis(e.blocked_until_ms)),
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
}

fn buckets<K>() -> Vec<Bucket<K>> {
    (0..MINUTES).map(|_| Bucket { minute: u64::MAX, entries: Vec::with_capacity(CAPACITY) }).collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves counts that are still sound.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counts one refusal of `key` in the bucket of `now_ms`'s minute.
fn record_in<K: Copy + Eq>(buckets: &mut [Bucket<K>], now_ms: u64, rule: usize, key: K, until_ms: u64) {
    let minute = now_ms / MINUTE_MS;
    let bucket = &mut buckets[(minute % MINUTES as u64) as usize];
    if bucket.minute != minute {
        // The slot last counted a minute that is out of the window now.
        bucket.minute = minute;
        bucket.entries.clear();
    }
    bucket.record(rule, key, until_ms);
}

/// Each tracked key's counts and errors summed over the last `minutes`
/// minutes (1 to [`MINUTES`]) as of `now_ms`, every count an upper bound.
fn merge<K: Copy + Eq + Hash>(buckets: &[Bucket<K>], now_ms: u64, minutes: usize) -> Vec<Entry<K>> {
    let now_minute = now_ms / MINUTE_MS;
    let minutes = minutes.clamp(1, MINUTES) as u64;
    let live: Vec<&Bucket<K>> =
        buckets.iter().filter(|b| b.minute <= now_minute && now_minute - b.minute < minutes).collect();
    // Sum each key's counts and errors over the minutes, and note in which
    // minutes it was tracked.
    let mut merged: HashMap<(usize, K), (Entry<K>, u8)> = HashMap::new();
    for (i, bucket) in live.iter().enumerate() {
        for e in &bucket.entries {
            let slot = merged.entry((e.rule, e.identity)).or_insert((Entry { count: 0, error: 0, ..*e }, 0));
            slot.0.count += e.count;
            slot.0.error += e.error;
            slot.0.blocked_until_ms = slot.0.blocked_until_ms.max(e.blocked_until_ms);
            slot.1 |= 1 << i;
        }
    }
    // A minute that was full and did not track a key may still have refused
    // it up to that minute's least count: add it to both the count and the
    // error, so the count stays an upper bound.
    let bounds: Vec<u64> = live.iter().map(|b| b.absent_bound()).collect();
    merged
        .into_values()
        .map(|(mut e, seen)| {
            for (i, bound) in bounds.iter().enumerate() {
                if seen & (1 << i) == 0 {
                    e.count += bound;
                    e.error += bound;
                }
            }
            e
        })
        .collect()
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
    fn the_full_id_parses_back_and_nothing_else_does() {
        let digest = Digest(0x0123_4567_89ab_cdef_0011_2233_4455_6677_u128.to_be_bytes());
        let key = IdentityHash::from(&Identity::new("r", Source::ApiKey, digest));
        assert_eq!(key.id(), "k:0123456789abcdef0011223344556677");
        assert_eq!(key.id().parse::<IdentityHash>(), Ok(key));
        assert_eq!("k:0123456789ABCDEF0011223344556677".parse::<IdentityHash>(), Ok(key));
        let ip = IdentityHash { digest, source: Source::Ip };
        assert_eq!(ip.id().parse::<IdentityHash>(), Ok(ip));
        let long = format!("k:{}", "0".repeat(1000));
        for bad in [
            "",
            "k:",
            "k:0123",
            "n:0123456789abcdef0011223344556677",
            "0123456789abcdef0011223344556677",
            "k:+123456789abcdef0011223344556677",
            "k:0123456789abcdef001122334455667é",
            &long,
            "ip:k:00",
        ] {
            let err = bad.parse::<IdentityHash>().expect_err(bad);
            assert!(err.to_string().contains("expected k:<32 hex digits>"), "{bad}: {err}");
            assert!(err.to_string().len() < 300, "the error quotes at most 80 characters");
        }
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
    fn networks_are_the_24_and_the_48() {
        let net = |ip: &str| Network::of(ip.parse().unwrap()).to_string();
        assert_eq!(net("203.0.113.77"), "203.0.113.0/24");
        assert_eq!(net("::ffff:203.0.113.77"), "203.0.113.0/24");
        assert_eq!(net("2001:db8:1:2:3::9"), "2001:db8:1::/48");
        assert_eq!(Network::of("10.1.2.3".parse().unwrap()), Network::of("10.1.2.250".parse().unwrap()));
        assert_ne!(Network::of("10.1.2.3".parse().unwrap()), Network::of("10.1.3.3".parse().unwrap()));
    }

    /// 20,000 identities refused once each, from three networks: the list by
    /// identity ranks nothing (each error is its whole count but one), the
    /// list by network counts each network exactly.
    #[test]
    fn under_rotation_the_networks_rank_what_the_identities_cannot() {
        let o = Offenders::new();
        let nets: Vec<Network> = ["198.51.100.1", "203.0.113.1", "2001:db8:7::1"]
            .iter()
            .map(|ip| Network::of(ip.parse().unwrap()))
            .collect();
        for n in 0..20_000u128 {
            // Networks 0, 1, 2 in the proportions 6 : 3 : 1.
            let net = match n % 10 {
                0..=5 => 0,
                6..=8 => 1,
                _ => 2,
            };
            o.record_at(T0, 0, id(n), Event::Denied);
            o.record_network_at(T0, 0, nets[net]);
        }
        let top = o.top_at(T0, MINUTES, 20);
        assert!(!Offenders::ranked(&top), "{:?}", &top[..3]);
        assert!(top.iter().all(|e| e.denials - e.error <= 1), "{:?}", &top[..3]);
        let by_net = o.top_networks_at(T0, MINUTES, 20);
        let rows: Vec<(String, u64, u64)> =
            by_net.iter().map(|e| (e.network.to_string(), e.denials, e.error)).collect();
        assert_eq!(
            rows,
            [
                ("198.51.100.0/24".to_owned(), 12_000, 0),
                ("203.0.113.0/24".to_owned(), 6_000, 0),
                ("2001:db8:7::/48".to_owned(), 2_000, 0),
            ]
        );
        // A real heavy hitter among few identities is ranked.
        let o = Offenders::new();
        for _ in 0..50 {
            o.record_at(T0, 0, id(1), Event::Denied);
        }
        o.record_at(T0, 0, id(2), Event::Denied);
        assert!(Offenders::ranked(&o.top_at(T0, MINUTES, 20)));
        assert!(Offenders::ranked(&[]));
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
