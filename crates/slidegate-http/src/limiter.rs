//! The rate limiter of an HTTP service: rules, identities, a store behind a
//! deadline and a circuit breaker, and the counters of what it decided.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, Method};
use slidegate::{
    check_charge, Algorithm, Decision, Limit, MemoryStore, Penalized, Penalty, Quota, Store, StoreError,
};

use crate::breaker::{Admit, Breaker, BreakerPolicy};
use crate::config::{Delay, IdentityKind, LimitConfig, LimiterConfig, OnError, RuleConfig, RuleLimits};
use crate::deny_cache::DenyCache;
use crate::identity::{IdentityExtractor, IdentitySource};
use crate::metrics::Metrics;
use crate::offenders::{Event, IdentityHash, Offenders};
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
    /// The charge still owed after the upstream answers (a rule with
    /// `count_status` or `cost_header`): see [`RateLimiter::charge_response`].
    pub(crate) pending: Option<PendingCharge>,
    /// Whether the identity is in the rule's penalty box: every policy is
    /// denied until the block ends, whatever the limits say.
    pub blocked: bool,
}

/// A charge decided after the response: who, under which rule's limits.
#[derive(Debug, Clone)]
pub struct PendingCharge {
    index: usize,
    key: String,
    anonymous: bool,
}

impl<'a> Verdict<'a> {
    /// The charge owed after the upstream answers, for rules that count
    /// responses (`count_status`) or price them (`cost_header`).
    pub fn pending(&self) -> Option<&PendingCharge> {
        self.pending.as_ref()
    }

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
    /// The largest cost one `/v1/check` call may charge.
    max_cost: u64,
    breadth: Option<crate::BreadthConfig>,
    /// The breadth limit's policy name: `<rule>-breadth`.
    breadth_name: String,
    response_cost: crate::ResponseCost,
    penalty: Option<Penalty>,
}

/// How [`RateLimiter::decide`] charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Charge the cost now (the usual request).
    Charge,
    /// Charge nothing; deny when a limit has no permit left (before a
    /// charge that comes with the response).
    Peek,
    /// The charge after the response: counted in no metric (the request was
    /// counted at its peek).
    AfterResponse,
}

/// How the limiter guards itself against its store: a deadline on each call,
/// a circuit breaker, and optionally an embedded fallback limiter.
///
/// Its [`Default`] is the one set of defaults; `slidegate serve` reads its
/// `[store]` keys into it, each over the default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreGuard {
    /// Deadline of one store call.
    pub timeout: Delay,
    /// How often an open breaker probes the store.
    pub probe_interval: Delay,
    /// When the breaker opens and how it tries the store again.
    pub breaker: BreakerPolicy,
    /// Whether an embedded fallback limiter decides while the store is unavailable.
    pub fallback: bool,
    /// Instances sharing the store: the fallback limiter enforces `limit / instances`.
    pub instances: u32,
    /// Capacity of the exact local deny cache (denied identities); 0 turns it off.
    pub deny_cache: usize,
}

impl Default for StoreGuard {
    fn default() -> Self {
        Self {
            timeout: Delay::from_millis(50),
            probe_interval: Delay::from_millis(500),
            breaker: BreakerPolicy::default(),
            fallback: false,
            instances: 1,
            deny_cache: crate::deny_cache::DEFAULT_CAPACITY,
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
    fallback: Option<Fallback>,
    metrics: Metrics,
    /// The epoch of the breaker's and the seeds' millisecond times.
    epoch: tokio::time::Instant,
    legacy_headers: bool,
    /// The identities refused most lately, in bounded memory.
    offenders: Offenders,
    /// Store denials answered locally until they end (see `deny_cache.rs`).
    deny_cache: Option<DenyCache>,
}

/// Rules, identities and a store: decides HTTP requests. Cheap to clone.
///
/// ```
/// use slidegate::{Algorithm, Limit, MemoryStore, Quota};
/// use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
/// use slidegate_http::{LimiterConfig, RateLimiter};
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_second(10)?);
/// let limits = vec![LimitConfig::new("search", limit, 1)?];
/// let mut config = LimiterConfig::default();
/// config.rules.push(RuleConfig::new("search", "/api/search*".parse()?, RuleLimits::Shared { identity: IdentityKind::ApiKey, limits }));
/// let limiter = RateLimiter::from_config(&config, MemoryStore::new());
/// assert_eq!(limiter.rule_names(), ["search"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
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
    /// The cost is above the rule's `max_cost`: one call may not charge that much.
    #[error("cost {cost} is above the rule's max_cost {max_cost}: one check may charge at most {max_cost}")]
    CostAboveMax {
        /// The requested cost.
        cost: u64,
        /// The rule's bound.
        max_cost: u64,
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

    /// The identities refused most over the last minutes (the admin
    /// `/v1/offenders` and `/offenders`).
    pub fn offenders(&self) -> &Offenders {
        &self.inner.offenders
    }

    /// Records that the identity `key` (a limiter key) was refused under rule
    /// number `rule`: in the top offenders and, for a block, in the rule's
    /// blocked counter. One call for every kind of refusal; an unknown rule
    /// or a key that is not a limiter key records nothing.
    pub fn record_offence(&self, rule: usize, key: &str, event: Event) {
        if rule >= self.inner.rules.len() {
            return;
        }
        if matches!(event, Event::Blocked { .. }) {
            self.inner.metrics.rule(rule).blocked.fetch_add(1, Relaxed);
        }
        if let Some(identity) = IdentityHash::from_key(key) {
            self.inner.offenders.record(rule, identity, event);
        }
    }

    /// The embedded fallback store, when `[store] fallback` is on: a caller
    /// sweeps it as it sweeps an embedded store, to give memory back.
    pub fn fallback_store(&self) -> Option<&MemoryStore> {
        self.inner.fallback.as_ref().map(|f| &f.store)
    }
}

impl<S: Store + 'static> RateLimiter<S> {
    /// A limiter for `config`'s rules, identity and store guard, deciding on `store`.
    pub fn from_config(config: &LimiterConfig, store: S) -> Self {
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
        Self::new(&config.rules, identity, store, config.guard.clone(), config.headers.legacy)
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
                max_cost: r.max_cost,
                breadth: r.breadth.clone(),
                breadth_name: format!("{}-breadth", r.name),
                response_cost: r.response_cost.clone(),
                penalty: r.penalty,
            })
            .collect();
        let metrics = Metrics::new(rules.iter().map(|r| r.name.to_string()));
        let breaker = Breaker::new(guard.breaker);
        let fallback = guard.fallback.then(|| Fallback::new(guard.instances));
        let deny_cache = DenyCache::new(guard.deny_cache);
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
                epoch: tokio::time::Instant::now(),
                legacy_headers,
                offenders: Offenders::new(),
                deny_cache,
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
        let anonymous = api_key.is_none();
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
        // Breadth first: its denial is never charged to the rate limits.
        let breadth = match &rule.breadth {
            Some(breadth) => match self.decide_breadth(index, &key, breadth, path).await {
                Ok(policy) => policy,
                Err(verdict) => return Some(verdict),
            },
            None => None,
        };
        let mut verdict = if rule.response_cost.is_deferred() {
            let mut verdict = self.decide(index, &key, set, 0, Mode::Peek).await;
            if verdict.source == DecisionSource::Store || verdict.source == DecisionSource::Fallback {
                verdict.pending = Some(PendingCharge { index, key, anonymous });
            }
            verdict
        } else {
            self.decide(index, &key, set, 1, Mode::Charge).await
        };
        verdict.policies.extend(breadth);
        Some(verdict)
    }

    /// The breadth decision for a request to `path`: `Ok(Some(policy))` to
    /// report with the rate limits, `Ok(None)` when breadth did not decide
    /// (no value in the path, or the store failed: breadth then steps aside
    /// and the rate limits decide as configured), `Err(verdict)` a denial.
    async fn decide_breadth<'s>(
        &'s self,
        index: usize,
        key: &str,
        breadth: &crate::BreadthConfig,
        path: &str,
    ) -> Result<Option<PolicyResult<'s>>, Verdict<'s>> {
        let rule = &self.inner.rules[index];
        let Some(value) = breadth.of.value(path) else {
            return Ok(None);
        };
        let decision = match self.guarded(self.inner.store.decide_distinct(key, &breadth.quota, &value)).await
        {
            Ok(decision) => decision,
            Err(_) => return Ok(None),
        };
        let policy = PolicyResult { name: &rule.breadth_name, quota: breadth.quota, decision };
        if policy.decision.allowed {
            return Ok(Some(policy));
        }
        let counters = self.inner.metrics.rule(index);
        if rule.shadow {
            counters.shadow_denied.fetch_add(1, Relaxed);
        } else {
            counters.denied.fetch_add(1, Relaxed);
        }
        Err(Verdict {
            rule: &rule.name,
            policies: vec![policy],
            source: DecisionSource::Store,
            shadow: rule.shadow,
            pending: None,
            blocked: false,
        })
    }

    /// Charges what the response says a request cost, for a verdict with a
    /// [`Verdict::pending`] charge: nothing for a status the rule does not
    /// count, else the `cost_header` value (clamped to `max_cost` and to the
    /// smallest limit) or 1. One store call; if the whole cost no longer
    /// fits, a second one charges what is left, so an expensive answer
    /// exhausts the limit rather than going free. Returns the decision of the
    /// charge (for the response's headers), `None` when nothing was charged.
    pub async fn charge_response(
        &self,
        pending: &PendingCharge,
        status: http::StatusCode,
        headers: &HeaderMap,
    ) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        let set = match &rule.sets {
            RuleSets::Shared { set, .. } => set,
            RuleSets::Split { anonymous: set, .. } if pending.anonymous => set,
            RuleSets::Split { authenticated: set, .. } => set,
        };
        // Never more than the smallest limit holds: the store would refuse it.
        let most = set.charges.iter().map(|(l, c)| l.quota.permits() / (*c).max(1)).min().unwrap_or(0);
        let cost = rule.response_cost.cost(status, headers, rule.max_cost).min(most);
        if cost == 0 {
            return None;
        }
        let verdict = self.decide(pending.index, &pending.key, set, cost, Mode::AfterResponse).await;
        if verdict.allowed() || verdict.source != DecisionSource::Store {
            return Some(verdict);
        }
        let left = verdict
            .policies
            .iter()
            .zip(&set.charges)
            .map(|(p, (_, c))| p.decision.remaining / (*c).max(1))
            .min()
            .unwrap_or(0);
        if left == 0 {
            return Some(verdict);
        }
        Some(self.decide(pending.index, &pending.key, set, left, Mode::AfterResponse).await)
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
        // Checked before anything is charged: a large cost is a large write
        // (a sliding log keeps one entry per permit).
        if cost > rule.max_cost {
            return Err(CheckError::CostAboveMax { cost, max_cost: rule.max_cost });
        }
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
        Ok(self.decide(index, &key, set, cost, Mode::Charge).await)
    }

    async fn decide<'s>(
        &'s self,
        index: usize,
        key: &str,
        set: &'s PolicySet,
        cost: u64,
        mode: Mode,
    ) -> Verdict<'s> {
        let rule = &self.inner.rules[index];
        let counters = self.inner.metrics.rule(index);
        let scaled: Vec<(Limit, u64)>;
        let charges = if cost == 1 {
            &set.charges
        } else {
            scaled = set.charges.iter().map(|(l, c)| (*l, c.saturating_mul(cost))).collect();
            &scaled
        };
        let started_ms = self.now_ms();
        // Under a penalty the store counts denials, so only a block is
        // answered locally (see penalty.rs).
        let cached =
            self.inner.deny_cache.as_ref().and_then(|c| c.lookup(key, &set.charges, cost, started_ms));
        let cached = cached.filter(|hit| hit.blocked || rule.penalty.is_none());
        let mut blocked = false;
        let stored = match cached {
            Some(hit) => {
                self.inner.metrics.store().deny_cache_hits.fetch_add(1, Relaxed);
                blocked = hit.blocked;
                Ok(hit.decisions)
            }
            None => self.call_store(key, charges, rule.penalty.as_ref()).await.map(|outcome| {
                let decisions = match outcome.blocked_for {
                    Some(wait) => {
                        blocked = true;
                        if !outcome.decisions.is_empty() {
                            // This denial started the block: worth a line, once.
                            tracing::warn!(rule = %rule.name, identity = key, block_ms = wait.as_millis() as u64,
                                shadow = rule.shadow, "identity blocked by the penalty box");
                        }
                        crate::penalty::block_denials(charges, wait)
                    }
                    None => outcome.decisions,
                };
                if let Some(cache) = &self.inner.deny_cache {
                    cache.remember(key, &set.charges, cost, &decisions, started_ms, blocked);
                }
                decisions
            }),
        };
        let (decisions, source) = match stored {
            Ok(decisions) => {
                if let Some(fallback) = &self.inner.fallback {
                    fallback.remember(key, &decisions, self.now_ms());
                }
                (decisions, DecisionSource::Store)
            }
            Err(failure) => match (&self.inner.fallback, failure) {
                // A request no store could allow (cost above a limit) is denied
                // by the embedded limiter's arithmetic, which says so.
                (_, Failure::Invalid(err)) => {
                    tracing::warn!(rule = %rule.name, %err, "invalid rate limit request");
                    (invalid_denial(charges), DecisionSource::Store)
                }
                (Some(fallback), Failure::Unavailable) => {
                    counters.fallback.fetch_add(1, Relaxed);
                    (fallback.decide(key, charges, self.now_ms()), DecisionSource::Fallback)
                }
                (None, Failure::Unavailable) => (Vec::new(), self.fail(rule, counters)),
            },
        };
        let mut decisions = decisions;
        if mode == Mode::Peek {
            // A peek is allowed even at zero permits left; the request it
            // guards would charge at least one, so deny it now. The wait is
            // the store's reset time: exact for fixed windows, an upper
            // bound for the others.
            for d in &mut decisions {
                if d.allowed && d.remaining == 0 {
                    d.allowed = false;
                    d.retry_after = Some(d.reset_after.max(Duration::from_millis(1)));
                }
            }
        }
        let policies: Vec<PolicyResult<'s>> = decisions
            .into_iter()
            .zip(set.names.iter().zip(charges))
            .map(|(decision, (name, (limit, _)))| PolicyResult {
                name: name.as_str(),
                quota: limit.quota,
                decision,
            })
            .collect();
        let verdict =
            Verdict { rule: &rule.name, policies, source, shadow: rule.shadow, pending: None, blocked };
        if blocked {
            if rule.shadow {
                counters.shadow_blocked.fetch_add(1, Relaxed);
            } else {
                // Counts the block and shows it on the top offenders page.
                let wait = verdict.policies.iter().filter_map(|p| p.decision.retry_after).max();
                let until = std::time::SystemTime::now() + wait.unwrap_or_default();
                self.record_offence(index, key, Event::Blocked { until });
            }
        }
        if mode != Mode::AfterResponse && matches!(source, DecisionSource::Store | DecisionSource::Fallback) {
            match (verdict.allowed(), rule.shadow) {
                (true, _) => counters.allowed.fetch_add(1, Relaxed),
                (false, false) => counters.denied.fetch_add(1, Relaxed),
                (false, true) => counters.shadow_denied.fetch_add(1, Relaxed),
            };
            if verdict.allowed() {
                // Near the limit: a tenth or less of some limit left.
                if verdict
                    .policies
                    .iter()
                    .any(|p| p.decision.remaining.saturating_mul(10) <= p.decision.limit)
                {
                    counters.near_limit.fetch_add(1, Relaxed);
                }
            } else if !blocked {
                // Shadow denials too: the operator of a shadow rule wants to
                // see whom it would refuse.
                self.record_offence(index, key, Event::Denied);
            }
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

    /// Milliseconds since the limiter was built, on tokio's clock (which tests pause).
    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// One store call under the deadline and the breaker.
    async fn call_store(
        &self,
        key: &str,
        charges: &[(Limit, u64)],
        penalty: Option<&Penalty>,
    ) -> Result<Penalized, Failure> {
        let store = &self.inner.store;
        self.guarded(async {
            match penalty {
                Some(penalty) => store.decide_all_penalized(key, charges, penalty).await,
                None => store.decide_all(key, charges).await.map(Penalized::decided),
            }
        })
        .await
    }

    /// `call`, a store call, under the deadline and the breaker.
    async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Failure> {
        let inner = &*self.inner;
        match inner.breaker.admit(self.now_ms()) {
            Admit::Skip => {
                inner.metrics.store().skipped.fetch_add(1, Relaxed);
                return Err(Failure::Unavailable);
            }
            Admit::Trial => {
                inner.metrics.store().trials.fetch_add(1, Relaxed);
            }
            Admit::Call => {}
        }
        inner.metrics.store().calls.fetch_add(1, Relaxed);
        let start = Instant::now();
        let result = tokio::time::timeout(inner.guard.timeout.get(), call).await;
        match result {
            Ok(Ok(decisions)) => {
                inner.metrics.store().observe_latency(start.elapsed());
                if inner.breaker.record_success(self.now_ms()) {
                    tracing::info!("rate limit store answers again: circuit breaker closed");
                }
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
        if self.inner.breaker.record_failure(self.now_ms()) {
            self.inner.metrics.store().breaker_opened.fetch_add(1, Relaxed);
            tracing::error!(
                probe_interval_ms = self.inner.guard.probe_interval.as_millis(),
                trial_interval_ms = self.inner.guard.breaker.trial_interval.as_millis(),
                "rate limit store unavailable: circuit breaker open, probing in the background"
            );
            let inner = Arc::clone(&self.inner);
            tokio::spawn(probe(inner));
        }
    }
}

/// The identity the probe charges: no rule's key looks like it.
const PROBE_KEY: &str = "slidegate-probe";

/// Probes the store until it answers (or a trial closed the breaker first),
/// then closes the breaker.
async fn probe<S: Store>(inner: Arc<Inner<S>>) {
    // The probe does what decisions do: it writes. A read (cost 0) succeeds on
    // a Redis that refuses every write (out of memory), and closing on it only
    // re-opened the breaker at the next decision. Cost 1 of a billion per second is
    // always allowed, so always written; the 1 s window lets the key expire
    // by itself.
    let probe = [(
        Limit::new(
            Algorithm::FixedWindow,
            Quota::new(1_000_000_000, Duration::from_secs(1)).expect("10^9 per second is a valid quota"),
        ),
        1,
    )];
    loop {
        tokio::time::sleep(inner.guard.probe_interval.get()).await;
        if !inner.breaker.is_open() {
            return;
        }
        inner.metrics.store().probes.fetch_add(1, Relaxed);
        let answer =
            tokio::time::timeout(inner.guard.timeout.get(), inner.store.decide_all(PROBE_KEY, &probe)).await;
        if matches!(answer, Ok(Ok(_))) {
            if inner.breaker.close() {
                tracing::info!("rate limit store answers again: circuit breaker closed");
            }
            return;
        }
    }
}

/// Shards of the seed map: requests of different identities rarely share a lock.
const SEED_SHARDS: usize = 16;
/// Identities whose last store decision the fallback remembers, at most:
/// about 100 bytes each, a few MB in all.
pub const SEED_CAPACITY: usize = 1 << 16;

/// What the store last said of one limit of an identity.
#[derive(Debug, Clone, Copy)]
struct Seed {
    /// Permits this instance may still admit before `reset_at_ms`.
    remaining: u64,
    /// When the store's window is back to the full quota (limiter ms).
    reset_at_ms: u64,
}

/// One shard of the seeds: identity key → one seed per limit of its rule.
type SeedMap = HashMap<String, Vec<Seed>>;

/// The embedded limiter that decides while the store is unavailable.
///
/// It does not start from zero: each store decision is remembered per
/// identity (a bounded map, arbitrary eviction when full), and while the
/// store fails an identity gets at most what the store last said was left
/// (divided among the instances) until the store's reset time; after it, or
/// without a memory of the identity, the rules' limits divided by `instances`.
struct Fallback {
    store: MemoryStore,
    instances: u64,
    hasher: std::hash::RandomState,
    seeds: Box<[Mutex<SeedMap>]>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback").field("instances", &self.instances).finish_non_exhaustive()
    }
}

impl Fallback {
    fn new(instances: u32) -> Self {
        Self {
            store: MemoryStore::new(),
            instances: u64::from(instances.max(1)),
            hasher: std::hash::RandomState::new(),
            seeds: (0..SEED_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, SeedMap> {
        let index = (self.hasher.hash_one(key) % SEED_SHARDS as u64) as usize;
        // A panic while holding the lock leaves a map that is still sound.
        self.seeds[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers what the store decided for `key` at `now_ms`.
    fn remember(&self, key: &str, decisions: &[Decision], now_ms: u64) {
        let seeds: Vec<Seed> = decisions
            .iter()
            .map(|d| Seed {
                remaining: d.remaining / self.instances,
                reset_at_ms: now_ms
                    .saturating_add(u64::try_from(d.reset_after.as_millis()).unwrap_or(u64::MAX)),
            })
            .collect();
        let mut map = self.shard(key);
        if let Some(slot) = map.get_mut(key) {
            *slot = seeds;
            return;
        }
        if map.len() >= SEED_CAPACITY / SEED_SHARDS {
            // Full: forget an arbitrary identity (the hash order), in O(1).
            if let Some(old) = map.keys().next().cloned() {
                map.remove(&old);
            }
        }
        map.insert(key.to_owned(), seeds);
    }

    /// Decides `charges` for `key` at `now_ms` without the store.
    fn decide(&self, key: &str, charges: &[(Limit, u64)], now_ms: u64) -> Vec<Decision> {
        let mut map = self.shard(key);
        let seeds = map.get_mut(key).filter(|s| s.len() == charges.len());
        let live = |seed: &Seed| seed.reset_at_ms > now_ms;
        if let Some(seeds) = seeds.as_deref() {
            if seeds.iter().zip(charges).any(|(s, (_, cost))| live(s) && s.remaining < *cost) {
                return charges
                    .iter()
                    .zip(seeds)
                    .map(|((limit, cost), s)| {
                        let wait = Duration::from_millis(s.reset_at_ms.saturating_sub(now_ms));
                        let short = live(s) && s.remaining < *cost;
                        Decision {
                            allowed: !short,
                            limit: limit.quota.permits(),
                            remaining: if live(s) { s.remaining } else { 0 },
                            reset_after: wait,
                            retry_after: short.then_some(wait),
                        }
                    })
                    .collect();
            }
        }
        let shared: Vec<(Limit, u64)> = charges.iter().map(|(l, c)| (self.share(l), *c)).collect();
        let mut decisions = match self.store.decide_all_sync(key, &shared) {
            Ok(decisions) => decisions,
            // A cost above this instance's share: no such request passes here.
            Err(_) => return denials(&shared),
        };
        if let Some(seeds) = map.get_mut(key).filter(|s| s.len() == charges.len()) {
            let admitted = decisions.iter().all(|d| d.allowed);
            for ((seed, (_, cost)), d) in seeds.iter_mut().zip(charges).zip(&mut decisions) {
                if live(seed) {
                    if admitted {
                        seed.remaining = seed.remaining.saturating_sub(*cost);
                    }
                    d.remaining = d.remaining.min(seed.remaining);
                }
            }
        }
        decisions
    }

    /// `limit` with this instance's share of the quota (at least 1 permit).
    fn share(&self, limit: &Limit) -> Limit {
        let permits = (limit.quota.permits() / self.instances).max(1);
        match Quota::new(permits, limit.quota.window()) {
            Ok(quota) => Limit::new(limit.algorithm, quota),
            Err(_) => *limit,
        }
    }
}

/// Denials of a request the fallback cannot decide (its cost exceeds a share).
fn denials(charges: &[(Limit, u64)]) -> Vec<Decision> {
    charges
        .iter()
        .map(|(limit, _)| Decision {
            allowed: false,
            limit: limit.quota.permits(),
            remaining: 0,
            reset_after: limit.quota.window(),
            retry_after: Some(limit.quota.window()),
        })
        .collect()
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
