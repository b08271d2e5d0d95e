//! The rate limiter of an HTTP service: rules and identities in front of a
//! store behind the core's protections (`slidegate::protect`).
//!
//! ```text
//! RateLimiter ── Fallback ── DenyCached ── Guarded ── Leased ── S (the store)
//!  rules,         decides     answers      deadline,  hot identities
//!  identities,    while S     denials S    breaker,   from leased
//!  verdicts,      cannot      gave, until  probe      permits
//!  metrics                    they end
//! ```
//!
//! Each layer wraps a [`Store`] and is one, built in that order by
//! `slidegate::protect::Protect`; the limiter asks the outermost once per request and turns
//! its [`Outcome`] into a [`Verdict`]: the policy (which rule, which
//! identity, what a failure means, shadow mode, peeks before a charge that
//! comes with the response) lives here, how a store is protected there.

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use http::{HeaderMap, Method};
use slidegate::protect::{Protect, Protected};
use slidegate::{Identity, MemoryStore, Source, Store};

use crate::config::{IdentityConfig, LimiterConfig, OnError, PlansConfig, RuleConfig, StoreGuard};
use crate::cost_headers::CostHeaders;
use crate::delay::Delays;
use crate::extractor::IdentityExtractor;
use crate::in_flight::InFlight;
use crate::lift::{AppliedLifts, LiftError, Lifted};
use crate::lists::{AccessLists, Lists};
use crate::metrics::Metrics;
use crate::offenders::{Event, IdentityHash, Offenders};
use crate::plans::{PlanOverrides, Plans};
use crate::rules::RuleMatcher;
use crate::verdict::{DecisionSource, PendingCharge, Verdict};

mod admit;
mod after_response;
mod breadth;
mod decide;
mod delayed;
mod error;
mod joint;
mod listed;
mod rule;
#[cfg(test)]
mod tests;

pub use admit::Admission;
use decide::deny_in_flight;
pub use error::{CheckError, LimiterError};
pub use joint::KeyCheck;
use rule::{Mode, Rule};

/// A limiter: what one configuration says (rules, identity, headers), and
/// what outlives it, shared with the limiters [`RateLimiter::reconfigure`]
/// builds from this one (the layered store, whose deny cache, breaker and
/// fallback seeds are state, the requests in flight, the counters).
struct Inner<S> {
    rules: Vec<Rule>,
    matcher: RuleMatcher,
    identity: IdentityExtractor,
    store: Arc<Protected<S>>,
    metrics: Arc<Metrics>,
    legacy_headers: bool,
    /// The identities refused most lately, in bounded memory.
    offenders: Arc<Offenders>,
    /// Requests in flight per identity under rules charged after the response.
    in_flight: Arc<InFlight>,
    /// Requests held by rules with `delay`.
    delays: Arc<Delays>,
    /// Every rule's `cost_header`, stripped from every response.
    cost_headers: CostHeaders,
    /// The allow and deny lists, global and per rule.
    lists: Lists,
    /// The plans and the keys on them.
    plans: Plans,
    /// Plans set per key at run time, kept across reloads.
    overrides: Arc<PlanOverrides>,
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

    /// The family of every metric as OpenMetrics text, without the `# EOF`
    /// line that ends an exposition. Whoever serves it appends any families
    /// of its own, then ends it with [`Metrics::end_exposition`], and
    /// answers with `Content-Type:` [`Metrics::CONTENT_TYPE`]: without its
    /// `# EOF`, a strict OpenMetrics scraper refuses the whole text.
    pub fn render_metrics(&self) -> String {
        let mut text = self.inner.metrics.render(self.breaker_open());
        self.inner.delays.render(&mut text);
        text
    }

    /// Whether the store's circuit breaker is open.
    pub fn breaker_open(&self) -> bool {
        self.inner.store.breaker_open()
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
        self.inner.store.store()
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

    /// The names of the configuration's plans, in order.
    pub fn plan_names(&self) -> Vec<&str> {
        self.inner.plans.names().collect()
    }

    /// The plans set per key at run time: one table for this limiter and
    /// every one [`RateLimiter::reconfigure`] builds from it, filled by the
    /// caller (`slidegate serve` reads it from the shared store).
    pub fn plan_overrides(&self) -> &Arc<PlanOverrides> {
        &self.inner.overrides
    }

    /// The embedded fallback store, unless every rule's `on_error` is
    /// `allow` or `deny`: a caller
    /// sweeps it as it sweeps an embedded store, to give memory back.
    pub fn fallback_store(&self) -> Option<&MemoryStore> {
        self.inner.store.fallback_store()
    }
}

impl<S: Store + 'static> RateLimiter<S> {
    /// Gives every unused leased permit back to the store and forgets the
    /// leases (`serve` at shutdown): how many permits the store took back,
    /// `0` without `[store] lease`. A give-back that fails is logged at
    /// debug level; its permits stay charged until their window ends.
    pub async fn give_back_leases(&self) -> u64 {
        self.inner.store.give_back_leases().await
    }

    /// A limiter for `config`'s rules, identity and store guard, deciding on `store`.
    ///
    /// # Errors
    /// [`LimiterError`] when a rule needs what the store cannot do.
    pub fn from_config(config: &LimiterConfig, store: S) -> Result<Self, LimiterError> {
        let identity = extractor(&config.identity, None);
        let limiter = Self::build(
            &config.rules,
            &config.plans,
            identity,
            store,
            config.guard.clone(),
            config.headers.legacy,
        )?;
        let mut limiter = limiter.with_max_delayed(config.max_delayed);
        if let Some(inner) = Arc::get_mut(&mut limiter.inner) {
            inner.lists = lists(&config.lists, &config.rules);
        }
        Ok(limiter)
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
        let plans = Plans::compile(&config.plans, &identity);
        let rules: Vec<Rule> = config.rules.iter().map(|r| Rule::new(r, &config.plans)).collect();
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
                delays: self.inner.delays_for(config.max_delayed),
                lists: lists(&config.lists, &config.rules),
                plans,
                overrides: Arc::clone(&self.inner.overrides),
            }),
        })
    }

    /// A limiter from its parts: `store` behind the layers `guard` configures.
    ///
    /// # Errors
    /// [`LimiterError`] when a rule needs what the store cannot do.
    pub fn new(
        rules_config: &[RuleConfig],
        identity: IdentityExtractor,
        store: S,
        guard: StoreGuard,
        legacy_headers: bool,
    ) -> Result<Self, LimiterError> {
        Self::build(rules_config, &PlansConfig::default(), identity, store, guard, legacy_headers)
    }

    /// [`RateLimiter::new`] with plans.
    fn build(
        rules: &[RuleConfig],
        plans: &PlansConfig,
        identity: IdentityExtractor,
        store: S,
        guard: StoreGuard,
        legacy_headers: bool,
    ) -> Result<Self, LimiterError> {
        check_store(rules, &store)?;
        let rules_config = rules;
        let matcher = matcher(rules_config);
        let rules: Vec<Rule> = rules_config.iter().map(|r| Rule::new(r, plans)).collect();
        let plans = Plans::compile(plans, &identity);
        let metrics = Arc::new(Metrics::new(rules.iter().map(|r| r.name.to_string())));
        // The default failure policy: off only when every rule opted out.
        let opted_out = !rules.is_empty() && rules.iter().all(|r| r.on_error != OnError::Fallback);
        let store = Protect::new(store, Arc::clone(&metrics) as Arc<dyn slidegate::protect::Events>)
            .leases(guard.lease)
            .guard(guard.calls)
            .deny_cache(guard.deny_cache)
            .fallback((!opted_out).then_some(guard.fallback))
            .build();
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
                delays: Arc::new(Delays::new(crate::config::DelayConfig::DEFAULT_MAX_DELAYED)),
                lists: lists(&AccessLists::default(), rules_config),
                plans,
                overrides: Arc::default(),
            }),
        })
    }

    /// Lifts `hash`'s penalty block under `rule`, or under every rule with a
    /// penalty, on every instance sharing the store (see `lift.rs`): the
    /// blocks lifted, none when it was not blocked.
    ///
    /// # Errors
    /// [`LiftError`]: an unknown rule, one without a penalty, a store
    /// without shared tables, or a failed store.
    pub async fn lift_penalty(
        &self,
        hash: IdentityHash,
        rule: Option<&str>,
    ) -> Result<Vec<Lifted>, LiftError> {
        crate::lift::lift(&self.inner.store, &self.inner.metrics, &self.penalty_rules(), hash, rule).await
    }

    /// Forgets from this instance's deny cache and fallback every lift
    /// recorded (by any instance) since the last call with `applied`: one
    /// read of the shared table, for a background task. Returns how many.
    ///
    /// # Errors
    /// The store's failure.
    pub async fn apply_lifts(&self, applied: &mut AppliedLifts) -> Result<usize, slidegate::StoreError> {
        crate::lift::apply(&self.inner.store, &self.inner.metrics, &self.penalty_rules(), applied).await
    }

    fn penalty_rules(&self) -> Vec<crate::lift::PenaltyRule<'_>> {
        let rules = self.inner.rules.iter();
        rules
            .map(|r| crate::lift::PenaltyRule { name: &r.name, scope: &r.scope, penalty: r.penalty.as_ref() })
            .collect()
    }

    /// Decides a request: `None` when no rule matches (the request is not limited).
    ///
    /// Only the check: this is step 4 of [`RateLimiter::admit`], without
    /// the steps before it, so it answers some requests that `serve`, the
    /// layer and forward-auth never check. It does not remove the other
    /// spellings of the identity headers (`headers` is not changed: an
    /// `x_api_key` is not read as the key, nor taken away), does
    /// not refuse a path with an encoded NUL, and does not refuse an
    /// ambiguous API key: given the key header on two lines it counts the
    /// first, and a value with a comma as one key. Nor does it say whether
    /// the request is a gRPC call (which changes the form of a refusal,
    /// not the verdict). A caller that predicts what a surface answers
    /// (`slidegate replay`) goes through [`RateLimiter::admit`].
    ///
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
        let api_key = self.inner.identity.api_key(headers);
        let client = peer.map(|peer| self.inner.identity.client_ip(peer, headers));
        self.check_head(method, target, client, api_key).await
    }

    /// [`RateLimiter::check_request`], given who the request is from, each
    /// worked out once: the API key it carries, as the extractor read it
    /// ([`RateLimiter::admit`] reads it while it checks the key is not
    /// ambiguous), and the client's address, after the trusted proxies.
    async fn check_head(
        &self,
        method: &Method,
        target: &str,
        client: Option<IpAddr>,
        api_key: Option<&[u8]>,
    ) -> Option<Verdict<'_>> {
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target, None),
        };
        let matched = self.inner.matcher.matching(method, path);
        if let Some(listed) = self.listed(matched.as_ref().map(|m| m.index), client, api_key) {
            return Some(listed);
        }
        let matched = matched?;
        let index = matched.index;
        let rule = &self.inner.rules[index];
        let extractor = &self.inner.identity;
        let anonymous = api_key.is_none();
        let (identity, plan) = match api_key.filter(|_| rule.counts_keys()) {
            Some(k) => self.key_identity(rule, k),
            None => {
                let bytes = client.map(|ip| extractor.ip_bytes(ip)).unwrap_or_default();
                (extractor.identity(&rule.scope, Source::Ip, &bytes), None)
            }
        };
        let set = rule.set(anonymous, plan);
        // Breadth first: its denial is never charged to the rate limits.
        let breadth = match &rule.breadth {
            // Boxed, as the other rare paths below: the future of every
            // request is as large as its largest branch, and the common one
            // (a charge, no breadth, no delay) is far smaller.
            Some(breadth) => {
                match Box::pin(self.decide_breadth(index, &identity, breadth, &matched.path, query)).await {
                    Ok(policy) => policy,
                    Err(verdict) => {
                        // A crawler refused for breadth is an offender like one
                        // refused for rate (shadow refusals too, as `count` does).
                        self.record_offence(index, &identity, Event::Denied);
                        self.record_network(index, client);
                        return Some(verdict);
                    }
                }
            }
            None => None,
        };
        let mut verdict = if rule.response_cost.is_deferred() {
            let mut verdict = Box::pin(self.ask(index, &identity, set, 0, Mode::Peek)).await;
            if matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback) && !verdict.blocks()
            {
                let slot = self.inner.in_flight.enter(&identity, rule.max_in_flight);
                if slot.is_none() {
                    deny_in_flight(&mut verdict, rule.max_in_flight);
                }
                // In shadow mode a request over the bound goes on, and is charged.
                if slot.is_some() || !verdict.blocks() {
                    verdict.pending = Some(PendingCharge {
                        index,
                        identity: identity.clone(),
                        anonymous,
                        plan,
                        _slot: slot,
                    });
                }
            }
            self.count(index, &identity, &verdict, Mode::Peek);
            verdict
        } else if let Some(delay) = &rule.delay {
            Box::pin(self.decide_delayed(index, &identity, client, set, delay)).await
        } else {
            self.decide(index, &identity, set, 1, Mode::Charge).await
        };
        if let Some(breadth) = breadth {
            verdict.policies.push(breadth);
            verdict.set_values = None;
        }
        // What `count` recorded as an offence, also by client network.
        let recorded =
            verdict.blocked || matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback);
        if !verdict.allowed() && recorded {
            self.record_network(index, client);
        }
        Some(verdict)
    }

    /// The identity of the API key `key` under `rule`, and the key's plan:
    /// the key hashed once, for both.
    fn key_identity(&self, rule: &Rule, key: &[u8]) -> (Identity, Option<crate::plans::PlanId>) {
        let digest = self.inner.identity.key_digest(key);
        let plan = self.inner.plans.of(&digest, &self.inner.overrides);
        (Identity::new(Arc::clone(&rule.scope), Source::ApiKey, digest), plan)
    }

    /// Counts a refusal of the client at `client` under rule number `index`
    /// by its network (see [`Offenders`]): the identity may be an API key,
    /// and rotated identities add up only there.
    fn record_network(&self, index: usize, client: Option<IpAddr>) {
        if let Some(ip) = client {
            self.inner.offenders.record_network(index, crate::offenders::Network::of(ip));
        }
    }
}

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

/// The lists of `global` and of each of `rules`.
fn lists(global: &AccessLists, rules: &[RuleConfig]) -> Lists {
    Lists::new(global, rules.iter().map(|r| &r.lists))
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

/// The cost header names of `rules`.
fn cost_headers(rules: &[Rule]) -> CostHeaders {
    CostHeaders::new(rules.iter().map(|r| r.response_cost.cost_header.as_ref()))
}
