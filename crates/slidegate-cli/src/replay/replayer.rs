//! The simulation: each request of a log through the limiter `serve` would
//! build from the config, on the embedded store, at the time the log gives.
//!
//! Time. The store reads a [`ManualClock`] set to each line's time; the
//! limits and the penalty box keep their state in the store, so they follow
//! it exactly. Lines out of order (a log written as requests end, not as
//! they start, is a little out of order) are decided at the latest time seen
//! so far: the clock never goes back, as a server's does not, and each such
//! line is counted with how far behind it was. The limiter's own clock
//! (`Ticks`: deny cache, breaker, fallback) is the process's; the caller
//! turns the deny cache off ([`super::run`]), which changes no decision (it
//! is exact), and the breaker and fallback act only when a store fails,
//! which the embedded store does not.
//!
//! Rules charged after the response (`count_status`, `cost_header`) are
//! charged with the logged status; a log does not carry a cost header, so
//! such a request costs 1 when its status counts. A line without a status
//! is charged what `serve` charges a request whose response never came:
//! 1, or `max_cost` under a `cost_header` rule. Every request ends before
//! the next starts, so `max_in_flight` never binds.

use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use slidegate::{ManualClock, MemoryStore, Source};
use slidegate_http::config::{IdentityKind, RuleConfig, RuleLimits};
use slidegate_http::offenders::IdentityHash;
use slidegate_http::RateLimiter;

use super::access_log::{self, Entry};
use super::line_reader::{Line, MAX_LINE};
use super::tally::{Outcome, RuleTally, Timeline};

/// How often (simulated) the store gives back the memory of idle identities.
const SWEEP_EVERY_MS: u64 = 60_000;

/// A line that did not read.
#[derive(Debug, Clone)]
pub struct Malformed {
    pub file: String,
    pub line: u64,
    pub reason: String,
}

/// A replay in progress, and what it counted.
pub struct Replayer<'c> {
    limiter: RateLimiter<MemoryStore<ManualClock>>,
    clock: ManualClock,
    rules: &'c [RuleConfig],
    scopes: Vec<Arc<str>>,
    key_header: Option<HeaderName>,
    next_sweep_ms: u64,
    /// The latest time seen: the simulated clock.
    pub now_ms: Option<u64>,
    pub first_ms: Option<u64>,
    /// Per rule, in the config's order.
    pub tallies: Vec<RuleTally>,
    pub timeline: Timeline,
    pub lines: u64,
    pub requests: u64,
    /// Requests no rule matched: not limited.
    pub unmatched: u64,
    pub malformed: u64,
    /// The first malformed lines, up to the number asked for.
    pub first_malformed: Vec<Malformed>,
    keep_malformed: usize,
    pub out_of_order: u64,
    pub max_behind_ms: u64,
}

impl<'c> Replayer<'c> {
    /// A replay of `rules` through `limiter`, whose store reads `clock`.
    pub fn new(
        limiter: RateLimiter<MemoryStore<ManualClock>>,
        clock: ManualClock,
        rules: &'c [RuleConfig],
        key_header: Option<HeaderName>,
        keep_malformed: usize,
    ) -> Self {
        Self {
            limiter,
            clock,
            rules,
            scopes: rules.iter().map(|r| Arc::from(r.name.as_str())).collect(),
            key_header,
            next_sweep_ms: 0,
            now_ms: None,
            first_ms: None,
            tallies: rules.iter().map(|_| RuleTally::default()).collect(),
            timeline: Timeline::new(rules.len()),
            lines: 0,
            requests: 0,
            unmatched: 0,
            malformed: 0,
            first_malformed: Vec::new(),
            keep_malformed,
            out_of_order: 0,
            max_behind_ms: 0,
        }
    }

    pub fn rules(&self) -> &[RuleConfig] {
        self.rules
    }

    /// Replays line number `number` of `file`. Blank lines are skipped.
    pub async fn line(&mut self, file: &str, number: u64, line: Line<'_>) {
        self.lines += 1;
        let entry = match line {
            Line::Text(text) if text.iter().all(u8::is_ascii_whitespace) => return,
            Line::Text(text) => access_log::parse(text),
            Line::TooLong(n) => Err(format!("line of {n} bytes, longer than the {MAX_LINE} read")),
        };
        match entry {
            Ok(entry) => self.request(entry).await,
            Err(reason) => {
                self.malformed += 1;
                if self.first_malformed.len() < self.keep_malformed {
                    self.first_malformed.push(Malformed { file: file.to_owned(), line: number, reason });
                }
            }
        }
    }

    /// Decides one request at its time (or the clock's, if it is behind).
    pub async fn request(&mut self, entry: Entry) {
        self.requests += 1;
        let now = match self.now_ms {
            Some(now) if entry.time_ms < now => {
                self.out_of_order += 1;
                self.max_behind_ms = self.max_behind_ms.max(now - entry.time_ms);
                now
            }
            _ => entry.time_ms,
        };
        self.now_ms = Some(now);
        self.first_ms.get_or_insert(now);
        self.clock.set(now);
        self.timeline.reach(now);
        if now >= self.next_sweep_ms {
            self.limiter.store().evict_idle();
            self.next_sweep_ms = now.saturating_add(SWEEP_EVERY_MS);
        }

        let mut headers = HeaderMap::new();
        if let (Some(name), Some(key)) = (&self.key_header, entry.key) {
            headers.insert(name.clone(), key);
        }
        let limiter = &self.limiter;
        let Some(mut verdict) =
            limiter.check_request(&entry.method, &entry.target, &headers, Some(entry.ip)).await
        else {
            self.unmatched += 1;
            return;
        };
        let outcome = if verdict.blocked {
            Outcome::Blocked
        } else if verdict.allowed() {
            Outcome::Allowed
        } else {
            Outcome::Denied
        };
        let index = self.rules.iter().position(|r| r.name == verdict.rule);
        if let Some(pending) = verdict.take_pending() {
            match entry.status {
                Some(status) => drop(limiter.charge_response(&pending, status, &HeaderMap::new()).await),
                None => drop(limiter.charge_abandoned(&pending).await),
            }
        }
        drop(verdict);
        let Some(index) = index else {
            return;
        };
        let identity = self.identity(index, &headers, entry.ip);
        let tally = &mut self.tallies[index];
        tally.counts.add(outcome);
        tally.identities.entry(identity).or_default().add(outcome);
        if outcome != Outcome::Allowed {
            self.timeline.refuse(index, now);
        }
    }

    /// The identity rule number `index` counts the request under, as the
    /// limiter makes it: the API key for a rule keyed by it when the
    /// request has one, else the client address. `check_request` keeps its
    /// identity to itself, so this follows it; a test holds the two equal.
    fn identity(&self, index: usize, headers: &HeaderMap, peer: std::net::IpAddr) -> IdentityHash {
        let extractor = self.limiter.identity();
        let keyed = match &self.rules[index].limits {
            RuleLimits::Shared { identity, .. } => *identity == IdentityKind::ApiKey,
            _ => true,
        };
        let identity = match extractor.api_key(headers).filter(|_| keyed) {
            Some(key) => extractor.identity(&self.scopes[index], Source::ApiKey, key),
            None => {
                let ip = extractor.client_ip(peer, headers);
                extractor.identity(&self.scopes[index], Source::Ip, &extractor.ip_bytes(ip))
            }
        };
        IdentityHash::from(&identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashes the replay reports are those the limiter counted: the
    /// limiter's own top offenders name the same identities.
    #[tokio::test]
    async fn the_reported_identities_are_the_limiters() {
        let config = slidegate_server::Config::parse(
            r#"
[identity]
api_key_header = "x-api-key"

[[rules]]
name = "keyed"
path = "/k/*"
limits = [{ limit = 1, window = "60s" }]

[[rules]]
name = "by-ip"
path = "/i/*"
identity = "ip"
limits = [{ limit = 1, window = "60s" }]

[[rules]]
name = "split"
path = "/s/*"
authenticated = [{ limit = 1, window = "60s" }]
anonymous = [{ limit = 1, window = "60s" }]
"#,
            "t.toml",
        )
        .unwrap();
        let clock = ManualClock::new(0);
        let limiter =
            RateLimiter::from_config(&config.limiter, MemoryStore::with_clock(clock.clone())).unwrap();
        let header = config.limiter.identity.api_key_header.clone();
        let mut replay = Replayer::new(limiter.clone(), clock, &config.limiter.rules, header, 0);
        let t = 1_796_119_200_000;
        for (path, ip, key) in [
            ("/k/a", "10.0.0.1", Some("alpha")),
            ("/k/a", "10.0.0.2", None),
            ("/i/a", "10.0.0.3", Some("beta")),
            ("/s/a", "2001:db8::1", Some("gamma")),
            ("/s/a", "2001:db8::2", None),
        ] {
            for _ in 0..3 {
                let entry = Entry {
                    time_ms: t,
                    method: http::Method::GET,
                    target: path.to_owned(),
                    ip: ip.parse().unwrap(),
                    key: key.map(http::HeaderValue::from_static),
                    status: None,
                };
                replay.request(entry).await;
            }
        }
        let mut ours: Vec<(usize, String)> = Vec::new();
        for (i, tally) in replay.tallies.iter().enumerate() {
            for (hash, counts) in tally.heaviest(10) {
                assert_eq!(counts.refused(), 2);
                ours.push((i, hash.short_hex()));
            }
        }
        let mut theirs: Vec<(usize, String)> =
            limiter.offenders().top(5, 10).iter().map(|o| (o.rule, o.identity.short_hex())).collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours.len(), 5);
        assert_eq!(ours, theirs);
    }
}
