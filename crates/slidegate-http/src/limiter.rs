//! The rate limiter of an HTTP service: rules, identities, a store behind a
//! deadline and a circuit breaker, and the counters of what it decided.

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, Method};
use slidegate::{check_charge, Algorithm, Decision, Limit, MemoryStore, Quota, Store, StoreError};

use crate::breaker::Breaker;
use crate::config::{Config, Delay, IdentityKind, LimitConfig, OnError, RuleConfig, RuleLimits};
use crate::identity::{IdentityExtractor, IdentitySource};
use crate::metrics::Metrics;
use crate::rules::RuleMatcher;

/// One named limit of a rule and what it decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyResult<'a> {
    /// The policy name (`RateLimit-Policy` item).
    pub name: &'a str,
    /// The quota enforced.
    pub quota: Quota,
    /// The decision.
    pub decision: Decision,
}

/// Who decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionSource {
    /// The store.
    Store,
    /// The embedded fallback limiter, because the store was unavailable.
    Fallback,
    /// Nobody: the store was unavailable and the rule fails open.
    FailOpen,
    /// Nobody: the store was unavailable and the rule fails closed.
    FailClosed,
}

/// The outcome of checking one request against the rule it matched.
///
/// It borrows the names from the [`RateLimiter`]: no reference count is
/// touched per request.
#[derive(Debug, Clone)]
pub struct Verdict<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// Every limit of the rule with its decision; empty when nobody decided.
    pub policies: Vec<PolicyResult<'a>>,
    /// Who decided.
    pub source: DecisionSource,
    /// Whether the rule is in shadow mode (never blocks).
    pub shadow: bool,
}

impl<'a> Verdict<'a> {
    /// Whether every limit allowed (true for fail-open, false for fail-closed).
    pub fn allowed(&self) -> bool {
        match self.source {
            DecisionSource::FailOpen => true,
            DecisionSource::FailClosed => false,
            DecisionSource::Store | DecisionSource::Fallback => {
                self.policies.iter().all(|p| p.decision.allowed)
            }
        }
    }

    /// Whether the request must be refused: denied and not in shadow mode.
    pub fn blocks(&self) -> bool {
        !self.allowed() && !self.shadow
    }

    /// The limits that denied.
    pub fn violated(&self) -> impl Iterator<Item = &PolicyResult<'a>> {
        self.policies.iter().filter(|p| !p.decision.allowed)
    }

    /// The limit that binds: for a denial, the violated one with the longest
    /// wait; otherwise the one with the fewest permits left.
    pub fn decisive(&self) -> Option<&PolicyResult<'a>> {
        if self.policies.iter().any(|p| !p.decision.allowed) {
            self.violated().max_by_key(|p| p.decision.retry_after)
        } else {
            // min_by_key keeps the first of equals: the rule's first limit.
            self.policies.iter().min_by_key(|p| p.decision.remaining)
        }
    }
}

/// The named limits one identity is charged together.
#[derive(Debug, Clone)]
struct PolicySet {
    names: Vec<String>,
    charges: Vec<(Limit, u64)>,
}

impl PolicySet {
    fn new(limits: &[LimitConfig]) -> Self {
        Self {
            names: limits.iter().map(|l| l.name.clone()).collect(),
            charges: limits.iter().map(|l| (l.limit, l.cost)).collect(),
        }
    }
}

#[derive(Debug)]
enum RuleSets {
    Shared { identity: IdentityKind, set: PolicySet },
    Split { authenticated: PolicySet, anonymous: PolicySet },
}

#[derive(Debug)]
struct Rule {
    name: String,
    sets: RuleSets,
    on_error: OnError,
    shadow: bool,
}

/// How the limiter guards itself against its store: a deadline on each call,
/// a circuit breaker, and optionally an embedded fallback limiter.
///
/// Its [`Default`] is the one set of defaults; `[store]` in the configuration
/// starts from it too.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreGuard {
    /// Deadline of one store call.
    pub timeout: Delay,
    /// Consecutive failures that open the breaker.
    pub breaker_failures: u32,
    /// How often an open breaker probes the store.
    pub probe_interval: Delay,
    /// Whether an embedded fallback limiter decides while the store is unavailable.
    pub fallback: bool,
}

impl Default for StoreGuard {
    fn default() -> Self {
        Self {
            timeout: Delay::from_millis(50),
            breaker_failures: 3,
            probe_interval: Delay::from_millis(500),
            fallback: false,
        }
    }
}

struct Inner<S> {
    rules: Vec<Rule>,
    matcher: RuleMatcher,
    identity: IdentityExtractor,
    store: S,
    guard: StoreGuard,
    breaker: Breaker,
    fallback: Option<MemoryStore>,
    metrics: Metrics,
    legacy_headers: bool,
}

/// Rules, identities and a store: decides HTTP requests. Cheap to clone.
///
/// ```
/// use slidegate::MemoryStore;
/// use slidegate_http::{Config, RateLimiter};
///
/// let config = Config::parse(r#"
/// [[rules]]
/// name = "search"
/// path = "/api/search*"
/// limits = [{ limit = 10, window = "1s" }]
/// "#, "inline.toml")?;
/// let limiter = RateLimiter::from_config(&config, MemoryStore::new());
/// assert_eq!(limiter.rule_names(), ["search"]);
/// # Ok::<(), slidegate_http::ConfigError>(())
/// ```
pub struct RateLimiter<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for RateLimiter<S> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<S> std::fmt::Debug for RateLimiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter").field("rules", &self.rule_names()).finish_non_exhaustive()
    }
}

/// Why `/v1/check` could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No rule has that name.
    #[error("unknown rule {0:?}")]
    UnknownRule(String),
    /// The key was empty.
    #[error("key must not be empty")]
    EmptyKey,
    /// The cost exceeds a limit of the rule: no such request could ever pass.
    #[error(
        "cost {cost} exceeds the limit {limit} of policy {policy:?}: such a request could never be allowed"
    )]
    CostExceedsLimit {
        /// The requested cost, times the limit's own cost.
        cost: u64,
        /// The limit.
        limit: u64,
        /// The policy's name.
        policy: String,
    },
    /// A limit of the rule can never be decided (a sliding log too large to
    /// keep); only a rule built in code, not a validated configuration, has one.
    #[error("policy {policy:?}: {source}")]
    InvalidLimit {
        /// The policy's name.
        policy: String,
        /// What the store would say.
        source: StoreError,
    },
}

impl<S> RateLimiter<S> {
    /// The rule names, in order.
    pub fn rule_names(&self) -> Vec<&str> {
        self.inner.rules.iter().map(|r| r.name.as_str()).collect()
    }

    /// The metrics, for rendering.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The Prometheus text of every metric.
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render(self.inner.breaker.is_open())
    }

    /// Whether the store's circuit breaker is open.
    pub fn breaker_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Whether `X-RateLimit-*` headers are sent.
    pub fn legacy_headers(&self) -> bool {
        self.inner.legacy_headers
    }

    /// The identity extractor.
    pub fn identity(&self) -> &IdentityExtractor {
        &self.inner.identity
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The embedded fallback store, when `[store] fallback` is on: a caller
    /// sweeps it as it sweeps an embedded store, to give memory back.
    pub fn fallback_store(&self) -> Option<&MemoryStore> {
        self.inner.fallback.as_ref()
    }
}

impl<S: Store + 'static> RateLimiter<S> {
    /// A limiter for `config`'s rules, identity and store guard, deciding on `store`.
    pub fn from_config(config: &Config, store: S) -> Self {
        let identity = {
            let base = match &config.identity.secret {
                Some(secret) => IdentityExtractor::new(secret),
                None => IdentityExtractor::with_random_secret(),
            };
            let base = base
                .trusted_proxies(config.identity.trusted_proxies.clone())
                .forwarded_header(config.identity.forwarded_header)
                .ipv6_prefix(config.identity.ipv6_prefix);
            match &config.identity.api_key_header {
                Some(h) => base.api_key_header(h.clone()),
                None => base,
            }
        };
        Self::new(&config.rules, identity, store, config.store.guard(), config.headers.legacy)
    }

    /// A limiter from its parts.
    pub fn new(
        rules: &[RuleConfig],
        identity: IdentityExtractor,
        store: S,
        guard: StoreGuard,
        legacy_headers: bool,
    ) -> Self {
        let matcher = RuleMatcher::new(rules.iter().map(|r| (r.methods.clone(), r.path.clone())).collect());
        let rules: Vec<Rule> = rules
            .iter()
            .map(|r| Rule {
                name: r.name.clone(),
                sets: match &r.limits {
                    RuleLimits::Shared { identity, limits } => {
                        RuleSets::Shared { identity: *identity, set: PolicySet::new(limits) }
                    }
                    RuleLimits::Split { authenticated, anonymous } => RuleSets::Split {
                        authenticated: PolicySet::new(authenticated),
                        anonymous: PolicySet::new(anonymous),
                    },
                },
                on_error: r.on_error,
                shadow: r.shadow,
            })
            .collect();
        let metrics = Metrics::new(rules.iter().map(|r| r.name.to_string()));
        let breaker = Breaker::new(guard.breaker_failures);
        let fallback = guard.fallback.then(MemoryStore::new);
        Self {
            inner: Arc::new(Inner {
                rules,
                matcher,
                identity,
                store,
                guard,
                breaker,
                fallback,
                metrics,
                legacy_headers,
            }),
        }
    }

    /// Decides a request: `None` when no rule matches (the request is not limited).
    /// `peer` is the socket peer; `None` counts every such request as one client.
    pub async fn check_request(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Option<Verdict<'_>> {
        let index = self.inner.matcher.find(method, path)?;
        let rule = &self.inner.rules[index];
        let identity = &self.inner.identity;
        let api_key = identity.api_key(headers);
        let ip_key = || {
            let ip = peer.map(|p| identity.client_ip(p, headers));
            let bytes = ip.map(|ip| identity.ip_bytes(ip)).unwrap_or_default();
            identity.key(&rule.name, IdentitySource::Ip, &bytes)
        };
        let (key, set) = match (&rule.sets, api_key) {
            (RuleSets::Shared { identity: IdentityKind::ApiKey, set }, Some(k)) => {
                (identity.key(&rule.name, IdentitySource::ApiKey, k), set)
            }
            (RuleSets::Shared { set, .. }, _) => (ip_key(), set),
            (RuleSets::Split { authenticated, .. }, Some(k)) => {
                (identity.key(&rule.name, IdentitySource::ApiKey, k), authenticated)
            }
            (RuleSets::Split { anonymous, .. }, None) => (ip_key(), anonymous),
        };
        Some(self.decide(index, &key, set, 1).await)
    }

    /// Decides `cost` times each limit's cost for the opaque identity `key`
    /// under the rule named `rule` (`/v1/check`). `key` is hashed like an API
    /// key, so it shares quota with requests carrying that key; `anonymous`
    /// picks a rule's anonymous limits instead of its authenticated ones.
    ///
    /// # Errors
    /// [`CheckError`] for an unknown rule, an empty key or an impossible cost.
    pub async fn check_key(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        anonymous: bool,
    ) -> Result<Verdict<'_>, CheckError> {
        let index = self
            .inner
            .rules
            .iter()
            .position(|r| r.name == rule)
            .ok_or_else(|| CheckError::UnknownRule(rule.to_owned()))?;
        if key.is_empty() {
            return Err(CheckError::EmptyKey);
        }
        let rule = &self.inner.rules[index];
        let set = match &rule.sets {
            RuleSets::Shared { set, .. } => set,
            RuleSets::Split { anonymous: set, .. } if anonymous => set,
            RuleSets::Split { authenticated: set, .. } => set,
        };
        for (name, (limit, per_request)) in set.names.iter().zip(&set.charges) {
            check_charge(limit, per_request.saturating_mul(cost)).map_err(|err| match err {
                StoreError::CostExceedsLimit { cost, limit } => {
                    CheckError::CostExceedsLimit { cost, limit, policy: name.clone() }
                }
                source => CheckError::InvalidLimit { policy: name.clone(), source },
            })?;
        }
        let key = self.inner.identity.key(&rule.name, IdentitySource::ApiKey, key.as_bytes());
        Ok(self.decide(index, &key, set, cost).await)
    }

    async fn decide<'s>(&'s self, index: usize, key: &str, set: &'s PolicySet, cost: u64) -> Verdict<'s> {
        let rule = &self.inner.rules[index];
        let counters = self.inner.metrics.rule(index);
        let scaled: Vec<(Limit, u64)>;
        let charges = if cost == 1 {
            &set.charges
        } else {
            scaled = set.charges.iter().map(|(l, c)| (*l, c.saturating_mul(cost))).collect();
            &scaled
        };
        let (decisions, source) = match self.call_store(key, charges).await {
            Ok(decisions) => (decisions, DecisionSource::Store),
            Err(failure) => match (&self.inner.fallback, failure) {
                // A request no store could allow (cost above a limit) is denied
                // by the embedded limiter's arithmetic, which says so.
                (_, Failure::Invalid(err)) => {
                    tracing::warn!(rule = %rule.name, %err, "invalid rate limit request");
                    (invalid_denial(charges), DecisionSource::Store)
                }
                (Some(fallback), Failure::Unavailable) => match fallback.decide_all_sync(key, charges) {
                    Ok(decisions) => {
                        counters.fallback.fetch_add(1, Relaxed);
                        (decisions, DecisionSource::Fallback)
                    }
                    Err(_) => (Vec::new(), self.fail(rule, counters)),
                },
                (None, Failure::Unavailable) => (Vec::new(), self.fail(rule, counters)),
            },
        };
        let policies: Vec<PolicyResult<'s>> = decisions
            .into_iter()
            .zip(set.names.iter().zip(charges))
            .map(|(decision, (name, (limit, _)))| PolicyResult {
                name: name.as_str(),
                quota: limit.quota,
                decision,
            })
            .collect();
        let verdict = Verdict { rule: &rule.name, policies, source, shadow: rule.shadow };
        if matches!(source, DecisionSource::Store | DecisionSource::Fallback) {
            match (verdict.allowed(), rule.shadow) {
                (true, _) => counters.allowed.fetch_add(1, Relaxed),
                (false, false) => counters.denied.fetch_add(1, Relaxed),
                (false, true) => counters.shadow_denied.fetch_add(1, Relaxed),
            };
        }
        verdict
    }

    fn fail(&self, rule: &Rule, counters: &crate::metrics::RuleCounters) -> DecisionSource {
        match rule.on_error {
            OnError::Allow => {
                counters.fail_open.fetch_add(1, Relaxed);
                DecisionSource::FailOpen
            }
            OnError::Deny => {
                counters.fail_closed.fetch_add(1, Relaxed);
                DecisionSource::FailClosed
            }
        }
    }

    /// One store call under the deadline and the breaker.
    async fn call_store(&self, key: &str, charges: &[(Limit, u64)]) -> Result<Vec<Decision>, Failure> {
        let inner = &*self.inner;
        if inner.breaker.is_open() {
            inner.metrics.store().skipped.fetch_add(1, Relaxed);
            return Err(Failure::Unavailable);
        }
        inner.metrics.store().calls.fetch_add(1, Relaxed);
        let start = Instant::now();
        let result =
            tokio::time::timeout(inner.guard.timeout.get(), inner.store.decide_all(key, charges)).await;
        match result {
            Ok(Ok(decisions)) => {
                inner.metrics.store().observe_latency(start.elapsed());
                inner.breaker.record_success();
                Ok(decisions)
            }
            Ok(Err(err)) if !err.is_unavailable() => Err(Failure::Invalid(err)),
            Ok(Err(err)) => {
                inner.metrics.store().errors.fetch_add(1, Relaxed);
                tracing::warn!(%err, "rate limit store failed");
                self.store_failed();
                Err(Failure::Unavailable)
            }
            Err(_) => {
                inner.metrics.store().timeouts.fetch_add(1, Relaxed);
                tracing::warn!(timeout_ms = inner.guard.timeout.as_millis(), "rate limit store timed out");
                self.store_failed();
                Err(Failure::Unavailable)
            }
        }
    }

    fn store_failed(&self) {
        if self.inner.breaker.record_failure() {
            self.inner.metrics.store().breaker_opened.fetch_add(1, Relaxed);
            tracing::error!(
                probe_interval_ms = self.inner.guard.probe_interval.as_millis(),
                "rate limit store unavailable: circuit breaker open, probing in the background"
            );
            let inner = Arc::clone(&self.inner);
            tokio::spawn(probe(inner));
        }
    }
}

/// Probes the store until it answers, then closes the breaker.
async fn probe<S: Store>(inner: Arc<Inner<S>>) {
    // Cost 0 asks without charging: a read that proves the store decides again.
    let probe = [(
        Limit::new(
            Algorithm::FixedWindow,
            Quota::new(1, Duration::from_secs(1)).expect("1 per second is valid"),
        ),
        0,
    )];
    loop {
        tokio::time::sleep(inner.guard.probe_interval.get()).await;
        inner.metrics.store().probes.fetch_add(1, Relaxed);
        let answer = tokio::time::timeout(
            inner.guard.timeout.get(),
            inner.store.decide_all("slidegate-probe", &probe),
        )
        .await;
        if matches!(answer, Ok(Ok(_))) {
            inner.breaker.close();
            tracing::info!("rate limit store answers again: circuit breaker closed");
            return;
        }
    }
}

enum Failure {
    /// The store is down or slow.
    Unavailable,
    /// The request could never be decided (a cost above a limit).
    Invalid(StoreError),
}

/// Denials for a request the store rejected as impossible.
fn invalid_denial(charges: &[(Limit, u64)]) -> Vec<Decision> {
    charges
        .iter()
        .map(|(limit, cost)| Decision {
            allowed: *cost <= limit.quota.permits(),
            limit: limit.quota.permits(),
            remaining: 0,
            reset_after: limit.quota.window(),
            retry_after: (*cost > limit.quota.permits()).then(|| limit.quota.window()),
        })
        .collect()
}
