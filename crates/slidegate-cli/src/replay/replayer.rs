//! The simulation: each request of a log through the limiter `serve` would
//! build from the config, on the embedded store, at the time the log gives.
//!
//! Admission. Each request is decided by [`RateLimiter::admit`], the
//! pipeline `serve`, the tower layer and forward-auth run: a path with an
//! encoded NUL and an ambiguous API key (a logged key with a comma, which
//! is how nginx logs a key header sent twice) are refused as `serve`
//! refuses them, with a 400, before any rule, and counted apart. A target
//! `http` cannot read as a request target is refused too: `serve`'s HTTP
//! server answers it 400 before the limiter sees it. What a log does not
//! carry cannot be judged: the key header on two lines (logged as one
//! value, so only a comma between them shows), other spellings of the key
//! header (`x_api_key`, which `admit` removes: counted as no key, as
//! replay counts a line without one), and whether a request was a gRPC
//! call, which changes the form of `serve`'s answer, never the verdict.
//!
//! Time. The store reads a [`ManualClock`] set to each line's time; the
//! limits and the penalty box keep their state in the store, so they follow
//! it exactly. Lines out of order (a log written as requests end, not as
//! they start, is a little out of order) are decided at the latest time seen
//! so far: the clock never goes back, as a server's does not, and each such
//! line is counted with how far behind it was. A line dated outside
//! [`Recorded`] (before 2000, or over a day past the machine's clock) is
//! malformed: it would move the clock across decades. The limiter's own clock
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
//!
//! Delay. The limiter is built without the rules' `delay`, so it answers a
//! request at once; the replay holds it instead, as `serve` would
//! (`slidegate_http::delay::wait_for` says whether and how long, the same
//! function `serve` asks), and decides it again, charging, at its time
//! plus the wait on the simulated clock — after the lines logged before
//! then and before those logged after — within `max_wait`, the
//! per-identity queue, `max_delayed` and the same number of decisions. A
//! held request that is then allowed counts as delayed. What is not
//! simulated: a log records requests as they came, so the requests a
//! client would have sent later because it was kept waiting are replayed
//! at their logged times; and `serve`'s real timers wake a little after
//! the wait, the replay exactly at it.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, Request};
use slidegate::{ManualClock, MemoryStore, Source};
use slidegate_http::config::{DelayConfig, IdentityKind, RuleConfig, RuleLimits};
use slidegate_http::delay::{max_decisions, wait_for};
use slidegate_http::grpc::GrpcDenialStatus;
use slidegate_http::offenders::IdentityHash;
use slidegate_http::RateLimiter;

use super::access_log::{self, Entry};
use super::held::{Held, Holds};
use super::line_reader::{Line, MAX_LINE};
use super::tally::{Outcome, RuleTally, Timeline};
use super::timestamp::Recorded;

/// How often (simulated) the store gives back the memory of idle identities.
const SWEEP_EVERY_MS: u64 = 60_000;

/// Why a target `http` cannot read is refused: `serve` never gets to decide it.
const UNREADABLE_TARGET: &str = "the target is not one an HTTP server reads (serve answers 400)";

/// What the admission made of one request.
enum Decided {
    /// Refused before any rule, with a 400: why.
    Refused(&'static str),
    /// No rule matched: not limited.
    Unmatched,
    /// Decided under rule number `.0`: the outcome and, under a rule with
    /// `delay`, how long to hold it before deciding again (`None`: answer now).
    Rule(usize, Outcome, Option<Duration>),
}

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
    /// Requests refused before any rule (a 400 from `serve`), by reason.
    pub refused: BTreeMap<&'static str, u64>,
    pub malformed: u64,
    /// The first malformed lines, up to the number asked for.
    pub first_malformed: Vec<Malformed>,
    keep_malformed: usize,
    /// The times a line may carry; one dated outside is malformed.
    pub recorded: Recorded,
    /// Malformed lines whose time read but lay outside `recorded`.
    pub out_of_range: u64,
    pub out_of_order: u64,
    pub max_behind_ms: u64,
    /// Per rule, its `delay`, which this replay simulates (the limiter's
    /// rules have none: it answers at once).
    delays: Vec<Option<DelayConfig>>,
    holds: Holds,
}

impl<'c> Replayer<'c> {
    /// A replay of `rules` through `limiter`, whose store reads `clock`, of
    /// lines dated in `recorded`.
    pub fn new(
        limiter: RateLimiter<MemoryStore<ManualClock>>,
        clock: ManualClock,
        rules: &'c [RuleConfig],
        key_header: Option<HeaderName>,
        keep_malformed: usize,
        recorded: Recorded,
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
            refused: BTreeMap::new(),
            malformed: 0,
            first_malformed: Vec::new(),
            keep_malformed,
            recorded,
            out_of_range: 0,
            out_of_order: 0,
            max_behind_ms: 0,
            delays: rules.iter().map(|_| None).collect(),
            holds: Holds::new(0),
        }
    }

    /// Simulates each rule's `delay` of `delays` (the rules' own, taken out
    /// of the config the limiter was built from), with at most `max_delayed` held at once.
    pub fn with_delays(mut self, delays: Vec<Option<DelayConfig>>, max_delayed: u32) -> Self {
        self.delays = delays;
        self.delays.resize(self.rules.len(), None);
        self.holds = Holds::new(max_delayed);
        self
    }

    pub fn rules(&self) -> &[RuleConfig] {
        self.rules
    }

    /// Replays line number `number` of `file`. Blank lines are skipped; a
    /// line dated outside `recorded` is malformed, and counted apart.
    pub async fn line(&mut self, file: &str, number: u64, line: Line<'_>) {
        self.lines += 1;
        let entry = match line {
            Line::Text(text) if text.iter().all(u8::is_ascii_whitespace) => return,
            Line::Text(text) => access_log::parse(text),
            Line::TooLong(n) => Err(format!("line of {n} bytes, longer than the {MAX_LINE} read")),
        };
        let entry = entry.and_then(|entry| match self.recorded.check(entry.time_ms) {
            Ok(()) => Ok(entry),
            Err(reason) => {
                self.out_of_range += 1;
                Err(reason)
            }
        });
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

    /// Decides one request at its time (or the clock's, if it is behind),
    /// after every held request due by then.
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
        self.decide_held(now).await;
        self.reach(now);

        let mut headers = HeaderMap::new();
        if let (Some(name), Some(key)) = (&self.key_header, &entry.key) {
            headers.insert(name.clone(), key.clone());
        }
        let (index, outcome, wait) = match self.decide(&entry, &headers, Duration::ZERO).await {
            Decided::Rule(index, outcome, wait) => (index, outcome, wait),
            Decided::Unmatched => {
                self.unmatched += 1;
                return;
            }
            Decided::Refused(reason) => {
                *self.refused.entry(reason).or_default() += 1;
                return;
            }
        };
        let identity = self.identity(index, &headers, entry.ip);
        if let (Some(wait), Some(delay)) = (wait, self.delays[index]) {
            let due_ms = now.saturating_add(millis(wait));
            let held = Held { due_ms, since_ms: now, decisions: 0, rule: index, identity, entry, headers };
            if self.holds.hold(held, delay.per_identity) {
                return;
            }
        }
        self.tally(index, identity, outcome, now);
    }

    /// Decides every held request due at or before `until_ms`, in order of
    /// time, each at its own time: allowed (delayed), held again, or refused.
    async fn decide_held(&mut self, until_ms: u64) {
        while let Some(mut held) = self.holds.take_due(until_ms) {
            let at = held.due_ms;
            self.reach(at);
            let since = Duration::from_millis(at - held.since_ms);
            // It was admitted when first decided, and the same request is again.
            let Decided::Rule(index, outcome, wait) = self.decide(&held.entry, &held.headers, since).await
            else {
                continue;
            };
            held.decisions += 1;
            let outcome = match (outcome, wait, self.delays[index]) {
                (Outcome::Allowed, ..) => Outcome::Delayed,
                (_, Some(wait), Some(delay)) if held.decisions < max_decisions(&delay) => {
                    held.due_ms = at.saturating_add(millis(wait));
                    self.holds.hold_again(held);
                    continue;
                }
                (other, ..) => other,
            };
            self.tally(held.rule, held.identity, outcome, at);
        }
    }

    /// Decides what is still held when the logs end.
    pub async fn finish(&mut self) {
        self.decide_held(u64::MAX).await;
    }

    /// Moves the simulated clock to `now` (never back).
    fn reach(&mut self, now: u64) {
        self.now_ms = Some(now);
        self.first_ms.get_or_insert(now);
        self.clock.set(now);
        self.timeline.reach(now);
        if now >= self.next_sweep_ms {
            self.limiter.store().evict_idle();
            self.next_sweep_ms = now.saturating_add(SWEEP_EVERY_MS);
        }
    }

    /// One decision of `entry`, sent with `headers` and held `held` so far,
    /// through the admission `serve` runs.
    async fn decide(&self, entry: &Entry, headers: &HeaderMap, held: Duration) -> Decided {
        let limiter = &self.limiter;
        let request = Request::builder().method(entry.method.clone()).uri(entry.target.as_str()).body(());
        let Ok(mut request) = request else { return Decided::Refused(UNREADABLE_TARGET) };
        request.headers_mut().clone_from(headers);
        let admission = limiter.admit(&mut request, Some(entry.ip), GrpcDenialStatus::default()).await;
        if let Some(reason) = admission.refused() {
            return Decided::Refused(reason);
        }
        let Some(mut verdict) = admission.verdict else { return Decided::Unmatched };
        let outcome = if verdict.blocked {
            Outcome::Blocked
        } else if verdict.allowed() {
            Outcome::Allowed
        } else {
            Outcome::Denied
        };
        let index = self.rules.iter().position(|r| r.name == verdict.rule);
        let wait = index.and_then(|i| self.delays[i]).and_then(|delay| wait_for(&delay, &verdict, held));
        if let Some(pending) = verdict.take_pending() {
            match entry.status {
                Some(status) => drop(limiter.charge_response(&pending, status, &HeaderMap::new()).await),
                None => drop(limiter.charge_abandoned(&pending).await),
            }
        }
        match index {
            Some(index) => Decided::Rule(index, outcome, wait),
            None => Decided::Unmatched,
        }
    }

    /// Counts one request's fate under rule number `index`, at `now`.
    fn tally(&mut self, index: usize, identity: IdentityHash, outcome: Outcome, now: u64) {
        let tally = &mut self.tallies[index];
        tally.counts.add(outcome);
        tally.identities.entry(identity).or_default().add(outcome);
        if matches!(outcome, Outcome::Denied | Outcome::Blocked) {
            self.timeline.refuse(index, now);
        }
    }

    /// The identity rule number `index` counts the request under, as the
    /// limiter makes it: the API key for a rule keyed by it when the
    /// request has one, else the client address. `admit` keeps its
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

/// Whole milliseconds of `d`, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
        let mut replay =
            Replayer::new(limiter.clone(), clock, &config.limiter.rules, header, 0, Recorded::at(u64::MAX));
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

    /// A rule's `delay` on the simulated clock: a request that fits is
    /// decided again at its time plus the wait, after the lines logged
    /// before then; the per-identity queue and `max_delayed` refuse the rest.
    #[tokio::test]
    async fn delay_is_simulated_on_the_replay_clock() {
        let mut config = slidegate_server::Config::parse(
            r#"
[server]
max_delayed = 1

[store]
deny_cache = 0

[[rules]]
name = "api"
path = "/api/*"
identity = "ip"
limits = [{ limit = 2, window = "1s", algorithm = "gcra" }]
delay = { max_wait = "600ms", per_identity = 1 }
"#,
            "t.toml",
        )
        .unwrap();
        // As `run` builds it: no deny cache (it counts on the process's
        // clock), no delay in the limiter's rules.
        let delays: Vec<_> = config.limiter.rules.iter_mut().map(|r| r.delay.take()).collect();
        let clock = ManualClock::new(0);
        let limiter =
            RateLimiter::from_config(&config.limiter, MemoryStore::with_clock(clock.clone())).unwrap();
        let mut replay =
            Replayer::new(limiter, clock, &config.limiter.rules, None, 0, Recorded::at(u64::MAX))
                .with_delays(delays, 1);
        let t = 1_796_119_200_000;
        let entry = |ms: u64, ip: &str| Entry {
            time_ms: t + ms,
            method: http::Method::GET,
            target: "/api/x".to_owned(),
            ip: ip.parse().unwrap(),
            key: None,
            status: None,
        };
        // a: two at once, the third held until t+500, the fourth beyond
        // its queue of one; b: its third finds the one place over all taken.
        for (ms, ip) in [(0, "10.0.0.1"), (0, "10.0.0.1"), (0, "10.0.0.1"), (0, "10.0.0.1")] {
            replay.request(entry(ms, ip)).await;
        }
        for _ in 0..3 {
            replay.request(entry(0, "10.0.0.2")).await;
        }
        // At t+700 a's held request was allowed at t+500; this one waits
        // until t+1000, decided when the log ends.
        replay.request(entry(700, "10.0.0.1")).await;
        assert_eq!(replay.tallies[0].counts.delayed, 1, "one decided so far");
        replay.finish().await;
        let c = replay.tallies[0].counts;
        assert_eq!((c.requests, c.allowed, c.delayed, c.denied, c.blocked), (8, 4, 2, 2, 0));
        assert_eq!(replay.now_ms, Some(t + 1_000), "the last held request was decided at its time");
        let a = replay.tallies[0].heaviest(2);
        let counts: Vec<_> = a.iter().map(|(_, c)| (c.allowed, c.delayed, c.denied)).collect();
        assert_eq!(counts, [(2, 2, 1), (2, 0, 1)], "a (more requests) first, then b");
    }

    /// What `serve` refuses with a 400 before any rule is refused here too,
    /// counted by reason and under no rule; the lines around are decided
    /// as if those were never sent.
    #[tokio::test]
    async fn what_serve_refuses_before_any_rule_is_refused() {
        let config = slidegate_server::Config::parse(
            r#"
[identity]
api_key_header = "x-api-key"

[[rules]]
name = "api"
path = "/api/*"
limits = [{ limit = 1, window = "60s" }]
"#,
            "t.toml",
        )
        .unwrap();
        let clock = ManualClock::new(0);
        let limiter =
            RateLimiter::from_config(&config.limiter, MemoryStore::with_clock(clock.clone())).unwrap();
        let header = config.limiter.identity.api_key_header.clone();
        let mut replay =
            Replayer::new(limiter, clock, &config.limiter.rules, header, 0, Recorded::at(u64::MAX));
        let lines = [
            r#"{"time":1796119200,"method":"GET","path":"/api/x%00","ip":"10.0.0.1","api_key":"k"}"#,
            r#"{"time":1796119200,"method":"GET","path":"/api/x","ip":"10.0.0.1","api_key":"k, k2"}"#,
            r#"{"time":1796119200,"method":"GET","path":"/api/x y","ip":"10.0.0.1","api_key":"k"}"#,
            r#"{"time":1796119200,"method":"GET","path":"/nowhere%00","ip":"10.0.0.1"}"#,
            r#"{"time":1796119200,"method":"GET","path":"/api/x","ip":"10.0.0.1","api_key":"k"}"#,
            r#"{"time":1796119200,"method":"GET","path":"/api/x","ip":"10.0.0.1","api_key":"k"}"#,
        ];
        for (number, line) in (1..).zip(lines) {
            replay.line("t.log", number, Line::Text(line.as_bytes())).await;
        }
        let refused: Vec<(&str, u64)> = replay.refused.iter().map(|(r, n)| (*r, *n)).collect();
        assert_eq!(
            refused,
            [
                (slidegate_http::AmbiguousKey::DETAIL, 1),
                (slidegate_http::refused_path("%00").unwrap(), 2),
                (UNREADABLE_TARGET, 1),
            ]
        );
        assert_eq!((replay.requests, replay.unmatched, replay.malformed), (6, 0, 0));
        let c = replay.tallies[0].counts;
        assert_eq!((c.requests, c.allowed, c.denied), (2, 1, 1), "the key's first request is allowed");
    }
}
