//! `ShouldRateLimit`: a request's descriptors matched in its domain, each
//! matched limit decided by the limiter (`RateLimiter::check_key`, through
//! the same layered store, failure policy, deny cache, penalty box and
//! metrics as the proxy), and the answer Envoy reads.
//!
//! The descriptor's entries are the identity: written as one key (each key
//! and value prefixed by its length, so no two descriptors spell the same
//! key; an entry matched by a `share_threshold` wildcard written as its
//! pattern, so every value it matches counts as one) and hashed with the
//! instance secret, under the rule of the matched node as scope, before any
//! store, cache or log sees it.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use slidegate::Quota;
use slidegate_http::headers::{policy_header, ratelimit_header};
use slidegate_http::{CheckError, KeyCheck, PolicyResult, RateLimiter, Verdict};

use super::descriptors::{EnvoyConfig, LimitKind, NodeLimit};
use super::proto::{
    Code, DescriptorStatus, HeaderValue, RateLimit, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
    RateLimitService, Unit,
};
use crate::store::AnyStore;

/// The most descriptors one request may carry (Envoy sends a handful).
pub const MAX_DESCRIPTORS: usize = 256;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;

/// What the service decides by now: the limiter and the descriptor tree
/// of one configuration, replaced together by a reload.
pub struct Current {
    running: Mutex<Arc<Running>>,
    /// The distinct `limit` overrides decided so far (each is a limit of
    /// its own in the store: bounded, [`MAX_OVERRIDES`]).
    overrides: Mutex<HashSet<(u32, i32)>>,
}

/// The most distinct descriptor `limit` overrides (`requests_per_unit`,
/// `unit`) one listener decides; a request bringing another is refused
/// (`INVALID_ARGUMENT`), so that no caller grows the store's tables of
/// limits without bound.
pub const MAX_OVERRIDES: usize = 1024;

/// One configuration's limiter and descriptors.
pub struct Running {
    limiter: RateLimiter<AnyStore>,
    config: Arc<EnvoyConfig>,
}

impl Current {
    /// The service's view of `limiter` and `config`.
    pub fn new(limiter: &RateLimiter<AnyStore>, config: &Arc<EnvoyConfig>) -> Self {
        let running = Running { limiter: limiter.clone(), config: Arc::clone(config) };
        Self { running: Mutex::new(Arc::new(running)), overrides: Mutex::default() }
    }

    /// Replaces both, for a reload.
    pub fn set(&self, limiter: &RateLimiter<AnyStore>, config: &Arc<EnvoyConfig>) {
        let running = Arc::new(Running { limiter: limiter.clone(), config: Arc::clone(config) });
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = running;
    }

    fn get(&self) -> Arc<Running> {
        Arc::clone(&self.running.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Each descriptor's `limit` override as the limit it asks for, when
    /// `running` applies them; refused when one is no limit (an unknown
    /// unit, too many permits) or one too many distinct ones.
    fn overrides(
        &self,
        running: &Running,
        request: &RateLimitRequest,
    ) -> Result<Vec<Option<NodeLimit>>, tonic::Status> {
        if !running.config.applies_overrides() || request.descriptors.iter().all(|d| d.limit.is_none()) {
            return Ok(Vec::new());
        }
        let rule = super::yaml::override_rule(&request.domain);
        let mut limits = Vec::with_capacity(request.descriptors.len());
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let Some(asked) = &descriptor.limit else {
                limits.push(None);
                continue;
            };
            let invalid = |why: String| {
                tonic::Status::invalid_argument(format!("descriptor {i}: limit override {why}"))
            };
            let unit = Unit::try_from(asked.unit).ok().filter(|u| *u != Unit::Unknown).ok_or_else(|| {
                invalid(format!("unit {} is not a rate limit unit (SECOND to WEEK)", asked.unit))
            })?;
            let kind = if asked.requests_per_unit == 0 {
                LimitKind::Blocked
            } else {
                let quota = Quota::new(u64::from(asked.requests_per_unit), unit_length(unit))
                    .map_err(|e| invalid(format!("{} per {unit:?}: {e}", asked.requests_per_unit)))?;
                LimitKind::Chosen(slidegate::Limit::new(slidegate::Algorithm::SlidingWindowCounter, quota))
            };
            let mut seen = self.overrides.lock().unwrap_or_else(PoisonError::into_inner);
            if !seen.contains(&(asked.requests_per_unit, asked.unit)) {
                if seen.len() >= MAX_OVERRIDES {
                    return Err(invalid(format!(
                        "{} per {unit:?}: {MAX_OVERRIDES} distinct overrides are decided already, and no more",
                        asked.requests_per_unit
                    )));
                }
                seen.insert((asked.requests_per_unit, asked.unit));
            }
            limits.push(Some(NodeLimit {
                rule: rule.clone(),
                kind,
                requests_per_unit: asked.requests_per_unit,
                unit,
                name: None,
                replaces: Vec::new(),
                shadow: false,
                quota: false,
                shared: Vec::new(),
            }));
        }
        Ok(limits)
    }
}

/// The rate limit service.
pub struct EnvoyService {
    current: Arc<Current>,
}

impl EnvoyService {
    /// Decides by whatever `current` holds at each request.
    pub fn new(current: Arc<Current>) -> Self {
        Self { current }
    }
}

impl RateLimitService for EnvoyService {
    async fn should_rate_limit(&self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        check_shape(&request)?;
        let running = self.current.get();
        let overrides = self.current.overrides(&running, &request)?;
        Ok(decide(&running, &request, &overrides).await)
    }
}

/// Refuses what no configuration could decide, as the reference service does.
fn check_shape(request: &RateLimitRequest) -> Result<(), tonic::Status> {
    if request.domain.is_empty() {
        return Err(tonic::Status::invalid_argument("rate limit domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(tonic::Status::invalid_argument("rate limit descriptor list must not be empty"));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(tonic::Status::invalid_argument(format!(
            "{} descriptors: at most {MAX_DESCRIPTORS} are decided per request",
            request.descriptors.len()
        )));
    }
    if request.descriptors.iter().any(|d| d.entries.len() > MAX_ENTRIES) {
        return Err(tonic::Status::invalid_argument(format!(
            "a descriptor has more than {MAX_ENTRIES} entries"
        )));
    }
    Ok(())
}

/// One request decided: every descriptor, then the overall code and headers.
/// A descriptor with a `limit` override (`overrides[i]`) is decided under
/// it alone, as in the reference service: no configured limit, no
/// `replaces`, no shadow mode.
async fn decide<'a>(
    running: &'a Running,
    request: &'a RateLimitRequest,
    overrides: &'a [Option<NodeLimit>],
) -> RateLimitResponse {
    let config = &running.config;
    let matched: Vec<Option<&'a NodeLimit>> = request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| match overrides.get(i) {
            Some(Some(chosen)) => Some(chosen),
            _ => config.find(&request.domain, d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))),
        })
        .collect();
    // A limit another matched limit replaces is not applied.
    let replaced: HashSet<&str> = if matched.iter().flatten().any(|l| !l.replaces.is_empty()) {
        matched.iter().flatten().flat_map(|l| l.replaces.iter().map(String::as_str)).collect()
    } else {
        HashSet::new()
    };
    let applied: Vec<Option<&'a NodeLimit>> = matched
        .iter()
        .map(|limit| limit.filter(|l| l.name.as_deref().is_none_or(|name| !replaced.contains(name))))
        .collect();
    let request_hits = if request.hits_addend == 0 { 1 } else { u64::from(request.hits_addend) };
    let decide = |descriptor, limit: Option<&'a NodeLimit>| {
        decide_matched(&running.limiter, limit, descriptor, request_hits)
    };
    let decided = match (request.descriptors.as_slice(), applied.as_slice()) {
        // Envoy's most common call: no join of futures for one.
        ([descriptor], [limit]) => vec![decide(descriptor, *limit).await],
        (descriptors, limits) if config.all_or_nothing(&request.domain) => {
            decide_jointly(&running.limiter, descriptors, limits, request_hits).await
        }
        // Decided concurrently: with Redis, one round trip for all of them.
        _ => {
            let each = request.descriptors.iter().zip(applied.iter().copied());
            futures_util::future::join_all(each.map(|(descriptor, limit)| decide(descriptor, limit))).await
        }
    };
    let mut statuses = Vec::with_capacity(decided.len());
    let mut policies: Vec<PolicyResult<'_>> = Vec::new();
    for (status, decided) in decided {
        statuses.push(status);
        policies.extend(decided);
    }
    let over =
        over_limit(statuses.iter().zip(&applied).map(|(s, l)| (s.code == i32::from(Code::OverLimit), *l)));
    let mut response_headers_to_add = Vec::new();
    if !policies.is_empty() {
        let policies: Vec<&PolicyResult<'_>> = policies.iter().collect();
        response_headers_to_add.push(header("RateLimit-Policy", policy_header(&policies)));
        response_headers_to_add.push(header("RateLimit", ratelimit_header(&policies)));
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
        statuses,
        response_headers_to_add,
        request_headers_to_add: Vec::new(),
    }
}

/// Whether a request is over limit, from each descriptor's `(over, applied
/// limit)`: when a limit that is not in `quota_mode` is over, or when every
/// quota-mode limit is (an unlimited one never counts), as in the
/// reference service.
fn over_limit<'l>(descriptors: impl Iterator<Item = (bool, Option<&'l NodeLimit>)>) -> bool {
    let (mut quotas, mut quotas_over) = (0usize, 0usize);
    for (over, limit) in descriptors {
        match limit {
            Some(l) if l.kind == LimitKind::Unlimited => {}
            Some(l) if l.quota => {
                quotas += 1;
                quotas_over += usize::from(over);
            }
            _ if over => return true,
            _ => {}
        }
    }
    quotas > 0 && quotas == quotas_over
}

/// One descriptor's status (`Ok` when no limit applies), and the policies
/// decided (for the headers).
async fn decide_matched<'l>(
    limiter: &'l RateLimiter<AnyStore>,
    limit: Option<&NodeLimit>,
    descriptor: &RateLimitDescriptor,
    request_hits: u64,
) -> (DescriptorStatus, Vec<PolicyResult<'l>>) {
    match limit {
        None => (DescriptorStatus { code: Code::Ok.into(), ..Default::default() }, Vec::new()),
        Some(limit) => {
            let hits = descriptor.hits_addend.unwrap_or(request_hits);
            decide_one(limiter, limit, descriptor, hits).await
        }
    }
}

/// One matched descriptor's status, and the policies decided (for the headers).
async fn decide_one<'l>(
    limiter: &'l RateLimiter<AnyStore>,
    limit: &NodeLimit,
    descriptor: &RateLimitDescriptor,
    hits: u64,
) -> (DescriptorStatus, Vec<PolicyResult<'l>>) {
    let quota = match limit.kind {
        LimitKind::Unlimited => {
            let status =
                DescriptorStatus { code: Code::Ok.into(), limit_remaining: u32::MAX, ..Default::default() };
            return (status, Vec::new());
        }
        LimitKind::Blocked => {
            let status = DescriptorStatus {
                code: code(limit, true).into(),
                current_limit: current_limit(limit),
                ..Default::default()
            };
            return (status, Vec::new());
        }
        LimitKind::Quota(quota) => quota,
        LimitKind::Chosen(chosen) => chosen.quota,
    };
    let key = identity_key(descriptor, &limit.shared);
    let verdict = match limit.kind {
        LimitKind::Chosen(chosen) => limiter.check_key_with_limit(&limit.rule, &key, hits, chosen).await,
        _ => limiter.check_key(&limit.rule, &key, hits, false).await,
    };
    match verdict {
        Ok(verdict) => {
            let status = status_of(limit, &quota, &verdict);
            (status, verdict.policies.to_vec())
        }
        // More hits than the limit holds: no such request could pass.
        Err(CheckError::CostExceedsLimit { .. }) => (over_status(limit, &quota), Vec::new()),
        Err(err) => {
            tracing::error!(rule = %limit.rule, %err, "envoy descriptor not decided");
            (undecided_status(limit), Vec::new())
        }
    }
}

/// The limit as Envoy is told it.
fn current_limit(limit: &NodeLimit) -> Option<RateLimit> {
    Some(RateLimit {
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit.into(),
        name: limit.name.clone().unwrap_or_default(),
    })
}

/// `Ok` unless over the limit and enforced (not shadow).
fn code(limit: &NodeLimit, over: bool) -> Code {
    if over && !limit.shadow {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// A matched descriptor's status from the limiter's verdict.
fn status_of(limit: &NodeLimit, quota: &Quota, verdict: &Verdict<'_>) -> DescriptorStatus {
    let decisive = verdict.decisive().map(|p| p.decision);
    let (remaining, wait) = match decisive {
        Some(d) if !d.allowed => (0, d.retry_after.unwrap_or(d.reset_after)),
        Some(d) => (d.remaining, d.reset_after),
        // Failed open or closed: the store said nothing.
        None => (0, quota.window()),
    };
    DescriptorStatus {
        code: code(limit, !verdict.allowed()).into(),
        current_limit: current_limit(limit),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(wait)),
    }
}

/// Over the limit without a store call: more hits than the limit holds.
fn over_status(limit: &NodeLimit, quota: &Quota) -> DescriptorStatus {
    DescriptorStatus {
        code: code(limit, true).into(),
        current_limit: current_limit(limit),
        limit_remaining: 0,
        duration_until_reset: Some(duration(quota.window())),
    }
}

/// A descriptor the limiter could not decide (logged): not limited.
fn undecided_status(limit: &NodeLimit) -> DescriptorStatus {
    DescriptorStatus { code: Code::Ok.into(), current_limit: current_limit(limit), ..Default::default() }
}

/// An `all_or_nothing` domain's descriptors: every enforced limit decided
/// in one joint call (`RateLimiter::check_keys_joint`), charged only if all
/// allow. A shadow limit, which never refuses, and a `quota_mode` one,
/// which refuses only with every other quota, are decided on their own; a
/// blocked one (`requests_per_unit: 0`) or one asked for more hits than it
/// holds refuses the request without a store call, and the others are then
/// only peeked (cost 0), so nothing is charged.
async fn decide_jointly<'l>(
    limiter: &'l RateLimiter<AnyStore>,
    descriptors: &[RateLimitDescriptor],
    limits: &[Option<&NodeLimit>],
    request_hits: u64,
) -> Vec<(DescriptorStatus, Vec<PolicyResult<'l>>)> {
    let hits = |d: &RateLimitDescriptor| d.hits_addend.unwrap_or(request_hits);
    let enforced = |limit: &NodeLimit| !limit.shadow && !limit.quota;
    let joint = |limit: &NodeLimit| enforced(limit) && matches!(limit.kind, LimitKind::Quota(_));
    let refused = descriptors.iter().zip(limits).any(|(d, l)| match l.map(|l| (l, l.kind)) {
        Some((l, LimitKind::Blocked)) => enforced(l),
        Some((l, LimitKind::Quota(q))) => joint(l) && hits(d) > q.permits(),
        _ => false,
    });
    let keys: Vec<Option<String>> = descriptors
        .iter()
        .zip(limits)
        .map(|(d, l)| l.filter(|l| joint(l)).map(|l| identity_key(d, &l.shared)))
        .collect();
    let checks: Vec<KeyCheck<'_>> = descriptors
        .iter()
        .zip(limits)
        .zip(&keys)
        .filter_map(|((d, l), key)| {
            let (l, key) = (l.as_ref()?, key.as_deref()?);
            Some(KeyCheck { rule: &l.rule, key, cost: if refused { 0 } else { hits(d) } })
        })
        .collect();
    let mut verdicts = match limiter.check_keys_joint(&checks).await {
        Ok(verdicts) => verdicts.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(err) => {
            tracing::error!(%err, "envoy descriptors not decided jointly");
            checks.iter().map(|_| Err(())).collect()
        }
    }
    .into_iter();
    let mut decided = Vec::with_capacity(descriptors.len());
    for (descriptor, limit) in descriptors.iter().zip(limits) {
        decided.push(match limit {
            Some(l) if joint(l) => {
                let LimitKind::Quota(quota) = l.kind else { unreachable!("a joint limit is a quota") };
                match verdicts.next() {
                    Some(Ok(verdict)) if hits(descriptor) > quota.permits() => {
                        (over_status(l, &quota), verdict.policies.to_vec())
                    }
                    Some(Ok(verdict)) => (status_of(l, &quota, &verdict), verdict.policies.to_vec()),
                    _ => (undecided_status(l), Vec::new()),
                }
            }
            _ => decide_matched(limiter, *limit, descriptor, request_hits).await,
        });
    }
    decided
}

/// How long `unit` is, as the reference service counts it.
fn unit_length(unit: Unit) -> Duration {
    const DAY: u64 = 86_400;
    Duration::from_secs(match unit {
        Unit::Unknown | Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => DAY,
        Unit::Week => 7 * DAY,
        Unit::Month => 30 * DAY,
        Unit::Year => 365 * DAY,
    })
}

/// The descriptor's entries as one key: `<len>:<key><len>:<value>` each, so
/// that no two lists of entries write the same key; an entry whose place in
/// `shared` holds a wildcard is written with it in place of its value.
fn identity_key(descriptor: &RateLimitDescriptor, shared: &[Option<String>]) -> String {
    let mut key =
        String::with_capacity(descriptor.entries.iter().map(|e| e.key.len() + e.value.len() + 8).sum());
    for (i, entry) in descriptor.entries.iter().enumerate() {
        let value = shared.get(i).and_then(Option::as_deref).unwrap_or(&entry.value);
        let _ = write!(key, "{}:{}{}:{}", entry.key.len(), entry.key, value.len(), value);
    }
    key
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue { key: key.to_owned(), value }
}

fn duration(d: Duration) -> prost_types::Duration {
    let seconds = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    prost_types::Duration { seconds, nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0) }
}

#[cfg(test)]
mod tests {
    use super::super::proto::Entry;
    use super::*;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn identity_keys_do_not_collide() {
        let a = identity_key(&descriptor(&[("ab", "c")]), &[]);
        let b = identity_key(&descriptor(&[("a", "bc")]), &[]);
        let c = identity_key(&descriptor(&[("a", "b"), ("c", "")]), &[]);
        assert_eq!(a, "2:ab1:c");
        assert_ne!(a, b);
        assert_ne!(b, c);
    }

    #[test]
    fn a_shared_wildcard_stands_for_its_values() {
        let shared = [Some("files/*".to_owned()), None];
        let a = identity_key(&descriptor(&[("f", "files/a.pdf"), ("user", "1")]), &shared);
        let b = identity_key(&descriptor(&[("f", "files/b.csv"), ("user", "1")]), &shared);
        let c = identity_key(&descriptor(&[("f", "files/b.csv"), ("user", "2")]), &shared);
        assert_eq!(a, "1:f7:files/*4:user1:1");
        assert_eq!(a, b);
        assert_ne!(b, c);
    }

    fn limit(kind: LimitKind, quota: bool) -> NodeLimit {
        NodeLimit {
            rule: "r".into(),
            kind,
            requests_per_unit: 1,
            unit: super::super::proto::Unit::Second,
            name: None,
            replaces: Vec::new(),
            shadow: false,
            quota,
            shared: Vec::new(),
        }
    }

    #[test]
    fn quota_mode_limits_are_over_only_all_together() {
        let quota = slidegate::Quota::new(1, Duration::from_secs(1)).unwrap();
        let (rate, in_quota) = (limit(LimitKind::Quota(quota), false), limit(LimitKind::Quota(quota), true));
        let unlimited_quota = limit(LimitKind::Unlimited, true);
        let over = |list: &[(bool, Option<&NodeLimit>)]| over_limit(list.iter().copied());
        assert!(!over(&[(false, Some(&rate)), (false, None)]));
        assert!(over(&[(true, Some(&rate)), (false, Some(&in_quota))]));
        assert!(over(&[(true, Some(&in_quota))]));
        assert!(!over(&[(true, Some(&in_quota)), (false, Some(&in_quota))]));
        assert!(over(&[(true, Some(&in_quota)), (true, Some(&in_quota)), (false, Some(&rate))]));
        // An unlimited quota-mode limit is not one of them.
        assert!(over(&[(true, Some(&in_quota)), (false, Some(&unlimited_quota))]));
        // An unmatched descriptor is never over.
        assert!(!over(&[(false, None), (false, Some(&in_quota))]));
    }
}
