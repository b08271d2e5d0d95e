//! The rate limiter of an HTTP service: rules and identities in front of a
//! store composed of layers.
//!
//! ```text
//! RateLimiter ── Fallback ── DenyCached ── Guarded ── S (the store)
//!  rules,         decides     answers      deadline,
//!  identities,    while S     denials S    breaker,
//!  verdicts,      cannot      gave, until  probe
//!  metrics                    they end
//! ```
//!
//! Each layer wraps a [`Store`] and is one (`fallback.rs`, `deny_cache.rs`,
//! `guard.rs`); the limiter asks the outermost once per request and turns
//! its [`Outcome`] into a [`Verdict`]: the policy (which rule, which
//! identity, what a failure means, shadow mode, peeks before a charge that
//! comes with the response) lives here, how a store is protected there.

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method};
use slidegate::{
    check_charge, Charge, Decision, Decisions, DistinctStore, Identity, MemoryStore, Origin, Penalty,
    Request, Source, Store, StoreError,
};

use crate::clock::Ticks;
use crate::config::{
    IdentityConfig, IdentityKind, LimitConfig, LimiterConfig, OnError, RuleConfig, RuleLimits, StoreGuard,
};
use crate::cost_headers::CostHeaders;
use crate::deny_cache::DenyCached;
use crate::fallback::Fallback;
use crate::guard::Guarded;
use crate::identity::IdentityExtractor;
use crate::in_flight::InFlight;
use crate::metrics::{Metrics, RuleCounters};
use crate::offenders::{Event, Offenders};
use crate::rules::RuleMatcher;
use crate::verdict::{DecisionSource, PendingCharge, PolicyResult, Verdict};

/// The named limits one identity is charged together.
#[derive(Debug, Clone)]
struct PolicySet {
    names: Vec<String>,
    charges: Vec<Charge>,
    /// `RateLimit-Policy` listing every limit of the set: the same on every
    /// allowed response, so rendered once.
    policy_value: Option<http::HeaderValue>,
}

impl PolicySet {
    fn new(limits: &[LimitConfig]) -> Self {
        Self {
            names: limits.iter().map(|l| l.name.clone()).collect(),
            charges: limits.iter().map(|l| Charge::new(l.limit, l.cost)).collect(),
            policy_value: crate::headers::policy_value(
                limits.iter().map(|l| (l.name.as_str(), l.limit.quota)),
            ),
        }
    }

    /// The charges of a request of `cost` (each limit's own cost times it).
    fn scaled(&self, cost: u64) -> Vec<Charge> {
        self.charges.iter().map(|c| Charge::new(c.limit, c.cost.saturating_mul(cost))).collect()
    }
}

#[derive(Debug)]
enum RuleSets {
    Shared { identity: IdentityKind, set: PolicySet },
    Split { authenticated: PolicySet, anonymous: PolicySet },
}

impl RuleSets {
    /// The set a request is charged under: an anonymous one (no API key) or not.
    fn pick(&self, anonymous: bool) -> &PolicySet {
        match self {
            RuleSets::Shared { set, .. } => set,
            RuleSets::Split { anonymous: set, .. } if anonymous => set,
            RuleSets::Split { authenticated: set, .. } => set,
        }
    }
}

#[derive(Debug)]
struct Rule {
    name: String,
    /// The rule's name as the scope of its identities.
    scope: Arc<str>,
    sets: RuleSets,
    on_error: OnError,
    shadow: bool,
    /// The largest cost one `/v1/check` call may charge.
    max_cost: u64,
    breadth: Option<crate::BreadthConfig>,
    /// The breadth limit's policy name: `<rule>-breadth`.
    breadth_name: String,
    response_cost: crate::ResponseCost,
    /// With `response_cost`: requests of one identity in flight at once.
    max_in_flight: u32,
    penalty: Option<Penalty>,
}

impl Rule {
    fn new(r: &RuleConfig) -> Self {
        Rule {
            name: r.name.clone(),
            scope: r.name.as_str().into(),
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
            max_in_flight: r.max_in_flight,
            penalty: r.penalty,
        }
    }

    /// What a failed store means for this rule, counted.
    fn fail(&self, counters: &RuleCounters) -> DecisionSource {
        match self.on_error {
            OnError::Allow => {
                counters.fail_open.fetch_add(1, Relaxed);
                DecisionSource::FailOpen
            }
            // The fallback limiter answers every failure of the store; a
            // failure reaching here is the fallback's own: closed.
            OnError::Deny | OnError::Fallback => {
                counters.fail_closed.fetch_add(1, Relaxed);
                DecisionSource::FailClosed
            }
        }
    }
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

/// The store as the limiter asks it: behind the guard, the deny cache and
/// the fallback.
type Layered<S> = Fallback<DenyCached<Guarded<S>>>;

/// A limiter: what one configuration says (rules, identity, headers), and
/// what outlives it, shared with the limiters [`RateLimiter::reconfigure`]
/// builds from this one (the layered store, whose deny cache, breaker and
/// fallback seeds are state, the requests in flight, the counters).
struct Inner<S> {
    rules: Vec<Rule>,
    matcher: RuleMatcher,
    identity: IdentityExtractor,
    store: Arc<Layered<S>>,
    metrics: Arc<Metrics>,
    legacy_headers: bool,
    /// The identities refused most lately, in bounded memory.
    offenders: Arc<Offenders>,
    /// Requests in flight per identity under rules charged after the response.
    in_flight: Arc<InFlight>,
    /// Every rule's `cost_header`, stripped from every response.
    cost_headers: CostHeaders,
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
/// let limiter = RateLimiter::from_config(&config, MemoryStore::new())?;
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

/// Why a limiter cannot be built on a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// A rule limits crawl breadth, and the store keeps no distinct-value
    /// sketches ([`Store::distinct`] answers `None`).
    #[error("rule {rule:?} limits crawl breadth (`breadth`), which this store cannot count: it keeps no distinct-value sketches")]
    BreadthUnsupported {
        /// The rule's name.
        rule: String,
    },
    /// A reconfigured rule falls back to the embedded limiter when the store
    /// fails (`on_error = "fallback"`, the default), and the running limiter
    /// was built without one (every rule of its configuration opted out).
    #[error("rule {rule:?} needs the fallback limiter (on_error = \"fallback\"), which the running limiter was started without (every rule opted out): restart to add it, or set its on_error")]
    FallbackOff {
        /// The rule's name.
        rule: String,
    },
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

    /// The rules with `on_error = "deny"`, in order: those that refuse every
    /// request they match while the store is unreachable (the others decide
    /// without it).
    pub fn rules_denying_without_store(&self) -> Vec<&str> {
        self.inner.rules.iter().filter(|r| r.on_error == OnError::Deny).map(|r| r.name.as_str()).collect()
    }

    /// Every rule's `cost_header`: a proxy strips them from every response,
    /// whichever rule matched, if any.
    pub fn cost_headers(&self) -> &CostHeaders {
        &self.inner.cost_headers
    }

    /// The metrics, for rendering.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The Prometheus text of every metric.
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render(self.breaker_open())
    }

    /// Whether the store's circuit breaker is open.
    pub fn breaker_open(&self) -> bool {
        self.inner.store.get_ref().get_ref().breaker_open()
    }

    /// Whether `X-RateLimit-*` headers are sent.
    pub fn legacy_headers(&self) -> bool {
        self.inner.legacy_headers
    }

    /// The identity extractor.
    pub fn identity(&self) -> &IdentityExtractor {
        &self.inner.identity
    }

    /// The store, without the layers in front of it.
    pub fn store(&self) -> &S {
        self.inner.store.get_ref().get_ref().get_ref()
    }

    /// The identities refused most over the last minutes (the admin
    /// `/v1/offenders` and `/offenders`).
    pub fn offenders(&self) -> &Offenders {
        &self.inner.offenders
    }

    /// Records that `identity` was refused under rule number `rule`: in the
    /// top offenders and, for a block, in the rule's blocked counter. One
    /// call for every kind of refusal; an unknown rule records nothing.
    pub fn record_offence(&self, rule: usize, identity: &Identity, event: Event) {
        if rule >= self.inner.rules.len() {
            return;
        }
        if matches!(event, Event::Blocked { .. }) {
            self.inner.metrics.rule(rule).blocked.fetch_add(1, Relaxed);
        }
        self.inner.offenders.record(rule, identity, event);
    }

    /// The embedded fallback store, unless every rule's `on_error` is
    /// `allow` or `deny`: a caller
    /// sweeps it as it sweeps an embedded store, to give memory back.
    pub fn fallback_store(&self) -> Option<&MemoryStore> {
        self.inner.store.fallback_store()
    }
}

impl<S: Store + 'static> RateLimiter<S> {
    /// A limiter for `config`'s rules, identity and store guard, deciding on `store`.
    ///
    /// # Errors
    /// [`LimiterError`] when a rule needs what the store cannot do.
    pub fn from_config(config: &LimiterConfig, store: S) -> Result<Self, LimiterError> {
        let identity = extractor(&config.identity, None);
        Self::new(&config.rules, identity, store, config.guard.clone(), config.headers.legacy)
    }

    /// A limiter for `config`'s rules, identity and headers over this one's
    /// store and layers: what a reloaded configuration runs on, while
    /// requests already decided by this one finish with it.
    ///
    /// Kept from this limiter: the store and its connection, the deny cache,
    /// the breaker, the fallback limiter and its seeds, the requests in
    /// flight, the store's metrics and those of every rule kept by name, the
    /// top offenders while the rules keep their places (they are recorded by
    /// rule number), and the identity secret unless `config` names one. So
    /// every limit whose rule name, algorithm and quota are unchanged goes on
    /// with its counters, cached denials and penalty blocks; a changed limit
    /// starts from zero (the stores keep each limit's state apart). `config.guard` is not read:
    /// the layers it configures are this limiter's.
    ///
    /// # Errors
    /// [`LimiterError`] when a rule needs what the store or the running
    /// layers cannot do.
    pub fn reconfigure(&self, config: &LimiterConfig) -> Result<Self, LimiterError> {
        check_store(&config.rules, self.store())?;
        if self.fallback_store().is_none() {
            if let Some(rule) = config.rules.iter().find(|r| r.on_error == OnError::Fallback) {
                return Err(LimiterError::FallbackOff { rule: rule.name.clone() });
            }
        }
        let identity = extractor(&config.identity, Some(&self.inner.identity));
        let rules: Vec<Rule> = config.rules.iter().map(Rule::new).collect();
        let metrics = Arc::new(self.inner.metrics.carried_over(rules.iter().map(|r| r.name.clone())));
        let places_kept = rules.len() >= self.inner.rules.len()
            && self.inner.rules.iter().zip(&rules).all(|(old, new)| old.name == new.name);
        let offenders =
            if places_kept { Arc::clone(&self.inner.offenders) } else { Arc::new(Offenders::new()) };
        Ok(Self {
            inner: Arc::new(Inner {
                matcher: matcher(&config.rules),
                cost_headers: cost_headers(&rules),
                rules,
                identity,
                store: Arc::clone(&self.inner.store),
                metrics,
                legacy_headers: config.headers.legacy,
                offenders,
                in_flight: Arc::clone(&self.inner.in_flight),
            }),
        })
    }

    /// A limiter from its parts: `store` behind the layers `guard` configures.
    ///
    /// # Errors
    /// [`LimiterError`] when a rule needs what the store cannot do.
    pub fn new(
        rules: &[RuleConfig],
        identity: IdentityExtractor,
        store: S,
        guard: StoreGuard,
        legacy_headers: bool,
    ) -> Result<Self, LimiterError> {
        check_store(rules, &store)?;
        let matcher = matcher(rules);
        let rules: Vec<Rule> = rules.iter().map(Rule::new).collect();
        let metrics = Arc::new(Metrics::new(rules.iter().map(|r| r.name.to_string())));
        let ticks = Ticks::start();
        let guarded = Guarded::new(store, &guard, Arc::clone(&metrics), ticks);
        let cached = DenyCached::new(guarded, guard.deny_cache, Arc::clone(&metrics), ticks);
        // The default failure policy: off only when every rule opted out.
        let opted_out = !rules.is_empty() && rules.iter().all(|r| r.on_error != OnError::Fallback);
        let store = Fallback::new(cached, !opted_out, guard.instances, ticks);
        Ok(Self {
            inner: Arc::new(Inner {
                cost_headers: cost_headers(&rules),
                rules,
                matcher,
                identity,
                store: Arc::new(store),
                metrics,
                legacy_headers,
                offenders: Arc::default(),
                in_flight: Arc::default(),
            }),
        })
    }

    /// Decides a request: `None` when no rule matches (the request is not limited).
    /// `target` is the request target in origin form, the path and its
    /// query (`uri.path_and_query()`); rules match the path, and a breadth
    /// limit of `query:<name>` reads the query (given the path alone, it
    /// counts every request as one without the parameter).
    /// `peer` is the socket peer; `None` counts every such request as one client.
    pub async fn check_request(
        &self,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Option<Verdict<'_>> {
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target, None),
        };
        let matched = self.inner.matcher.matching(method, path)?;
        let index = matched.index;
        let rule = &self.inner.rules[index];
        let extractor = &self.inner.identity;
        let api_key = extractor.api_key(headers);
        let anonymous = api_key.is_none();
        let by_key = match (&rule.sets, api_key) {
            (RuleSets::Shared { identity: IdentityKind::ApiKey, .. } | RuleSets::Split { .. }, Some(k)) => {
                Some(k)
            }
            _ => None,
        };
        let identity = match by_key {
            Some(k) => extractor.identity(&rule.scope, Source::ApiKey, k),
            None => {
                let ip = peer.map(|p| extractor.client_ip(p, headers));
                let bytes = ip.map(|ip| extractor.ip_bytes(ip)).unwrap_or_default();
                extractor.identity(&rule.scope, Source::Ip, &bytes)
            }
        };
        let set = rule.sets.pick(anonymous);
        // Breadth first: its denial is never charged to the rate limits.
        let breadth = match &rule.breadth {
            Some(breadth) => match self.decide_breadth(index, &identity, breadth, &matched.path, query).await
            {
                Ok(policy) => policy,
                Err(verdict) => {
                    // A crawler refused for breadth is an offender like one
                    // refused for rate (shadow refusals too, as `count` does).
                    self.record_offence(index, &identity, Event::Denied);
                    self.record_network(index, headers, peer);
                    return Some(verdict);
                }
            },
            None => None,
        };
        let mut verdict = if rule.response_cost.is_deferred() {
            let mut verdict = self.ask(index, &identity, set, 0, Mode::Peek).await;
            if matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback) && !verdict.blocks()
            {
                let slot = self.inner.in_flight.enter(&identity, rule.max_in_flight);
                if slot.is_none() {
                    deny_in_flight(&mut verdict, rule.max_in_flight);
                }
                // In shadow mode a request over the bound goes on, and is charged.
                if slot.is_some() || !verdict.blocks() {
                    verdict.pending =
                        Some(PendingCharge { index, identity: identity.clone(), anonymous, _slot: slot });
                }
            }
            self.count(index, &identity, &verdict, Mode::Peek);
            verdict
        } else {
            self.decide(index, &identity, set, 1, Mode::Charge).await
        };
        if let Some(breadth) = breadth {
            verdict.policies.push(breadth);
            verdict.policy_value = None;
        }
        // What `count` recorded as an offence, also by client network.
        let recorded =
            verdict.blocked || matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback);
        if !verdict.allowed() && recorded {
            self.record_network(index, headers, peer);
        }
        Some(verdict)
    }

    /// Counts a refusal of the client at `peer` under rule number `index`
    /// by its network (see [`Offenders`]): the identity may be an API key,
    /// and rotated identities add up only there.
    fn record_network(&self, index: usize, headers: &HeaderMap, peer: Option<IpAddr>) {
        if let Some(peer) = peer {
            let ip = self.inner.identity.client_ip(peer, headers);
            self.inner.offenders.record_network(index, crate::offenders::Network::of(ip));
        }
    }

    /// The breadth decision for a request whose path read as `reading` when
    /// it matched the rule, with `query`: `Ok(Some(policy))` to report with
    /// the rate limits, `Ok(None)` when the store failed and the rule's
    /// failure policy is not the fallback (breadth then steps aside and the
    /// rate limits apply it), `Err(verdict)` a denial. Every request has a value (see [`crate::BreadthOf::value`]).
    async fn decide_breadth<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        breadth: &crate::BreadthConfig,
        reading: &str,
        query: Option<&str>,
    ) -> Result<Option<PolicyResult<'s>>, Verdict<'s>> {
        let rule = &self.inner.rules[index];
        let value = breadth.of.value(reading, query);
        let digest;
        let value: &[u8] = if value.len() > crate::breadth::MAX_VALUE_BYTES {
            digest = self.inner.identity.value_digest(&value);
            &digest
        } else {
            &value
        };
        // As for the rate limits, only a rule whose failure policy is the
        // fallback limiter asks through it. Otherwise breadth steps aside
        // when the store fails, and the rate limits apply `on_error` (a
        // `deny` rule fails closed there). `new` refused a breadth rule on a
        // store without sketches.
        let answer = match rule.on_error {
            OnError::Fallback => match self.inner.store.distinct() {
                Some(distinct) => distinct.decide_distinct(identity, &breadth.quota, value).await,
                None => return Ok(None),
            },
            OnError::Allow | OnError::Deny => match self.inner.store.get_ref().distinct() {
                Some(distinct) => distinct.decide_distinct(identity, &breadth.quota, value).await,
                None => return Ok(None),
            },
        };
        let Ok(decision) = answer else {
            return Ok(None);
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
            policy_value: None,
            cost_header: None,
            over_in_flight: None,
            identity: identity.into(),
            cached: false,
        })
    }

    /// Charges what the response says a request cost, for a verdict with a
    /// [`Verdict::pending`] charge: nothing for a status the rule does not
    /// count, else the `cost_header` value (clamped to `max_cost` and to the
    /// smallest limit) or 1. One store call; if the whole cost no longer
    /// fits, a second one charges what is left, so an expensive answer
    /// exhausts the limit rather than going free. Returns the decision of the
    /// charge (for the response's headers), `None` when nothing was charged.
    ///
    /// The charge must be made whether or not the client is still there: a
    /// client that hangs up before the answer has had the upstream do the
    /// work all the same. A server that drops a request's future when its
    /// client goes (hyper does) must finish the exchange with the upstream
    /// and this call elsewhere (`slidegate serve` moves them to a task of
    /// their own); the tower layer, whose inner service's answer goes with
    /// the dropped future, charges [`RateLimiter::charge_abandoned`] instead.
    pub async fn charge_response(
        &self,
        pending: &PendingCharge,
        status: http::StatusCode,
        headers: &HeaderMap,
    ) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        self.charge(pending, rule.response_cost.cost(status, headers, rule.max_cost)).await
    }

    /// Charges a request whose response will never be seen (its client hung
    /// up and the service answering it was dropped): the most its response
    /// could have cost — `max_cost` for a rule with a `cost_header`, 1 for
    /// one counting statuses — so hanging up never costs less than waiting
    /// for the answer. Returns what [`RateLimiter::charge_response`] does.
    pub async fn charge_abandoned(&self, pending: &PendingCharge) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        let cost = if rule.response_cost.cost_header.is_some() { rule.max_cost } else { 1 };
        self.charge(pending, cost).await
    }

    /// Charges `cost` for a pending charge: clamped to the smallest limit,
    /// and what is left when the whole no longer fits.
    async fn charge(&self, pending: &PendingCharge, cost: u64) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        let set = rule.sets.pick(pending.anonymous);
        // Never more than the smallest limit holds: the store would refuse it.
        let most = set.charges.iter().map(|c| c.limit.quota.permits() / c.cost.max(1)).min().unwrap_or(0);
        let cost = cost.min(most);
        if cost == 0 {
            return None;
        }
        let verdict = self.decide(pending.index, &pending.identity, set, cost, Mode::AfterResponse).await;
        if verdict.allowed() || verdict.source != DecisionSource::Store {
            return Some(verdict);
        }
        let left = verdict
            .policies
            .iter()
            .zip(&set.charges)
            .map(|(p, c)| p.decision.remaining / c.cost.max(1))
            .min()
            .unwrap_or(0);
        if left == 0 {
            return Some(verdict);
        }
        Some(self.decide(pending.index, &pending.identity, set, left, Mode::AfterResponse).await)
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
        let set = rule.sets.pick(anonymous);
        for (name, charge) in set.names.iter().zip(&set.charges) {
            check_charge(&charge.limit, charge.cost.saturating_mul(cost)).map_err(|err| match err {
                StoreError::CostExceedsLimit { cost, limit } => {
                    CheckError::CostExceedsLimit { cost, limit, policy: name.clone() }
                }
                source => CheckError::InvalidLimit { policy: name.clone(), source },
            })?;
        }
        let identity = self.inner.identity.identity(&rule.scope, Source::ApiKey, key.as_bytes());
        Ok(self.decide(index, &identity, set, cost, Mode::Charge).await)
    }

    /// One request to the layered store, as a verdict, counted.
    async fn decide<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        set: &'s PolicySet,
        cost: u64,
        mode: Mode,
    ) -> Verdict<'s> {
        let verdict = self.ask(index, identity, set, cost, mode).await;
        self.count(index, identity, &verdict, mode);
        verdict
    }

    /// One request to the layered store, as a verdict not yet counted.
    async fn ask<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        set: &'s PolicySet,
        cost: u64,
        mode: Mode,
    ) -> Verdict<'s> {
        let rule = &self.inner.rules[index];
        let counters = self.inner.metrics.rule(index);
        let scaled: Vec<Charge>;
        let charges = if cost == 1 {
            &set.charges
        } else {
            scaled = set.scaled(cost);
            &scaled
        };
        let request = Request { identity, charges, penalty: rule.penalty.as_ref(), deadline: None };
        // Only a rule whose failure policy is the fallback limiter asks
        // through it; the others see the store's failure and apply their own.
        let answer = match rule.on_error {
            OnError::Fallback => self.inner.store.decide(request).await,
            OnError::Allow | OnError::Deny => self.inner.store.get_ref().decide(request).await,
        };
        let cached = matches!(&answer, Ok(outcome) if outcome.origin == Origin::Cache);
        let (mut decisions, source, blocked) = match answer {
            Ok(outcome) => {
                let source = match outcome.origin {
                    Origin::Fallback => {
                        counters.fallback.fetch_add(1, Relaxed);
                        DecisionSource::Fallback
                    }
                    _ => DecisionSource::Store,
                };
                match outcome.blocked_for {
                    Some(wait) => {
                        if !outcome.decisions.is_empty() {
                            // This denial started the block: worth a line, once.
                            tracing::warn!(rule = %rule.name, identity = %identity, block_ms = wait.as_millis() as u64,
                                shadow = rule.shadow, "identity blocked by the penalty box");
                        }
                        (crate::penalty::block_denials(charges, wait).into(), source, true)
                    }
                    None => (outcome.decisions, source, false),
                }
            }
            // A request no store could allow (cost above a limit) is denied
            // by the algorithms' own check, which says so.
            Err(err) if !err.is_unavailable() => {
                tracing::warn!(rule = %rule.name, %err, "invalid rate limit request");
                (invalid_denial(charges).into(), DecisionSource::Store, false)
            }
            Err(_) => (Decisions::none(), rule.fail(counters), false),
        };
        if mode == Mode::Peek {
            // A peek is allowed even at zero permits left; the request it
            // guards would charge at least one, so deny it now. The wait is
            // the store's reset time: exact for fixed windows, an upper
            // bound for the others.
            for d in decisions.iter_mut() {
                if d.allowed && d.remaining == 0 {
                    d.allowed = false;
                    d.retry_after = Some(d.reset_after.max(Duration::from_millis(1)));
                }
            }
        }
        let policies: Vec<PolicyResult<'s>> = decisions
            .iter()
            .zip(set.names.iter().zip(charges))
            .map(|(&decision, (name, charge))| PolicyResult {
                name: name.as_str(),
                quota: charge.limit.quota,
                decision,
            })
            .collect();
        Verdict {
            rule: &rule.name,
            policies,
            source,
            shadow: rule.shadow,
            pending: None,
            blocked,
            policy_value: set.policy_value.as_ref(),
            cost_header: rule.response_cost.cost_header.as_ref(),
            over_in_flight: None,
            identity: identity.into(),
            cached,
        }
    }

    /// Counts a verdict in the rule's metrics and the top offenders.
    fn count(&self, index: usize, identity: &Identity, verdict: &Verdict<'_>, mode: Mode) {
        let counters = self.inner.metrics.rule(index);
        if verdict.blocked {
            if verdict.shadow {
                counters.shadow_blocked.fetch_add(1, Relaxed);
            } else {
                // Counts the block and shows it on the top offenders page.
                let wait = verdict.policies.iter().filter_map(|p| p.decision.retry_after).max();
                let until = std::time::SystemTime::now() + wait.unwrap_or_default();
                self.record_offence(index, identity, Event::Blocked { until });
            }
        }
        if mode == Mode::AfterResponse
            || !matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback)
        {
            return;
        }
        match (verdict.allowed(), verdict.shadow) {
            (true, _) => counters.allowed.fetch_add(1, Relaxed),
            (false, false) => counters.denied.fetch_add(1, Relaxed),
            (false, true) => counters.shadow_denied.fetch_add(1, Relaxed),
        };
        if verdict.allowed() {
            // Near the limit: a tenth or less of some limit left.
            if verdict.policies.iter().any(|p| p.decision.remaining.saturating_mul(10) <= p.decision.limit) {
                counters.near_limit.fetch_add(1, Relaxed);
            }
        } else if !verdict.blocked {
            // Shadow denials too: the operator of a shadow rule wants to
            // see whom it would refuse.
            self.record_offence(index, identity, Event::Denied);
        }
    }
}

/// The identity extractor `config` describes; without a secret, keyed as
/// `running` is (a reloaded configuration keeps its identities) or by a
/// random one.
fn extractor(config: &IdentityConfig, running: Option<&IdentityExtractor>) -> IdentityExtractor {
    let base = match (&config.secret, running) {
        (Some(secret), _) => IdentityExtractor::new(secret),
        (None, Some(running)) => running.keyed_alike(),
        (None, None) => IdentityExtractor::with_random_secret(),
    };
    let base = base
        .trusted_proxies(config.trusted_proxies.clone())
        .forwarded_header(config.forwarded_header)
        .ipv6_prefix(config.ipv6_prefix);
    match &config.api_key_header {
        Some(h) => base.api_key_header(h.clone()),
        None => base,
    }
}

/// The rule matcher of `rules`, in order.
fn matcher(rules: &[RuleConfig]) -> RuleMatcher {
    RuleMatcher::new(rules.iter().map(|r| (r.methods.clone(), r.path.clone())).collect())
}

/// Refuses rules that need what `store` cannot do.
fn check_store(rules: &[RuleConfig], store: &impl Store) -> Result<(), LimiterError> {
    match rules.iter().find(|r| r.breadth.is_some()) {
        Some(rule) if store.distinct().is_none() => {
            Err(LimiterError::BreadthUnsupported { rule: rule.name.clone() })
        }
        _ => Ok(()),
    }
}

/// Turns an allowing peek into the refusal of a request over the rule's
/// `max_in_flight`: every policy denied, with what the store said is left,
/// and a wait of a second (the time a slot frees is the upstream's).
fn deny_in_flight(verdict: &mut Verdict<'_>, max_in_flight: u32) {
    for policy in &mut verdict.policies {
        policy.decision.allowed = false;
        policy.decision.retry_after = Some(Duration::from_secs(1));
    }
    verdict.over_in_flight = Some(max_in_flight);
}

/// Denials for a request the store rejected as impossible.
fn invalid_denial(charges: &[Charge]) -> Vec<Decision> {
    charges
        .iter()
        .map(|c| Decision {
            allowed: c.cost <= c.limit.quota.permits(),
            limit: c.limit.quota.permits(),
            remaining: 0,
            reset_after: c.limit.quota.window(),
            retry_after: (c.cost > c.limit.quota.permits()).then(|| c.limit.quota.window()),
        })
        .collect()
}

/// The cost header names of `rules`.
fn cost_headers(rules: &[Rule]) -> CostHeaders {
    CostHeaders::new(rules.iter().map(|r| r.response_cost.cost_header.as_ref()))
}

#[cfg(test)]
mod tests {
    use slidegate::{Algorithm, Limit, Quota};

    use super::*;
    use crate::rules::PathPattern;

    fn config(limits: &[(&str, u64)]) -> LimiterConfig {
        let mut config = LimiterConfig::default();
        for (name, permits) in limits {
            let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(*permits).unwrap());
            let limits = vec![LimitConfig::new(*name, limit, 1).unwrap()];
            let path: PathPattern = format!("/{name}").parse().unwrap();
            let shared = RuleLimits::Shared { identity: IdentityKind::ApiKey, limits };
            config.rules.push(RuleConfig::new(*name, path, shared));
        }
        config
    }

    async fn remaining(limiter: &RateLimiter<MemoryStore>, rule: &str) -> u64 {
        let verdict = limiter.check_key(rule, "user-1", 1, false).await.unwrap();
        verdict.decisive().unwrap().decision.remaining
    }

    /// The random secret, the store and the counters of unchanged limits
    /// carry over; a changed limit starts from zero; the old limiter, still
    /// held by requests in flight, decides on the same state.
    #[tokio::test]
    async fn a_reconfigured_limiter_keeps_the_store_and_the_secret() {
        let old =
            RateLimiter::from_config(&config(&[("kept", 5), ("changed", 3)]), MemoryStore::new()).unwrap();
        assert_eq!(remaining(&old, "kept").await, 4);
        assert_eq!(remaining(&old, "changed").await, 2);
        let new = old.reconfigure(&config(&[("kept", 5), ("changed", 10), ("added", 2)])).unwrap();
        assert_eq!(new.rule_names(), ["kept", "changed", "added"]);
        assert_eq!(remaining(&new, "kept").await, 3);
        assert_eq!(remaining(&new, "changed").await, 9);
        assert_eq!(remaining(&old, "kept").await, 2, "one store under both");
        assert!(std::ptr::eq(old.store(), new.store()));
        assert!(std::ptr::eq(old.offenders(), new.offenders()), "the rules kept their places");
        let moved = new.reconfigure(&config(&[("added", 2), ("kept", 5)])).unwrap();
        assert!(!std::ptr::eq(new.offenders(), moved.offenders()), "offenders are kept by rule number");
        assert_eq!(remaining(&moved, "kept").await, 1);
    }

    #[tokio::test]
    async fn a_rule_needing_the_fallback_is_refused_when_the_limiter_runs_without() {
        let mut opted_out = config(&[("a", 5)]);
        opted_out.rules[0].on_error = OnError::Deny;
        let limiter = RateLimiter::from_config(&opted_out, MemoryStore::new()).unwrap();
        let err = limiter.reconfigure(&config(&[("a", 5)])).unwrap_err();
        assert!(matches!(err, LimiterError::FallbackOff { ref rule } if rule == "a"), "{err}");
    }
}
