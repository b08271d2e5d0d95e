//! The limiter across a reload.

use slidegate::{Algorithm, Limit, Quota};

use super::*;
use crate::config::{IdentityKind, LimitConfig, PlanConfig, RuleLimits};
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
    let old = RateLimiter::from_config(&config(&[("kept", 5), ("changed", 3)]), MemoryStore::new()).unwrap();
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

/// Rules `a` and `b` (5 a minute each) and plans `free` (2 on `a`) and
/// `pro` (100 on `a`, 50 on `b`); `alice` on `pro`, unknown keys on `free`.
fn planned(alice: &str) -> LimiterConfig {
    let mut config = config(&[("a", 5), ("b", 5)]);
    let limit = |name: &str, permits| {
        let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(permits).unwrap());
        vec![LimitConfig::new(name, limit, 1).unwrap()]
    };
    let mut free = PlanConfig::new("free");
    free.limits.push(("a".into(), limit("free-a", 2)));
    let mut pro = PlanConfig::new("pro");
    pro.limits.push(("a".into(), limit("pro-a", 100)));
    pro.limits.push(("b".into(), limit("pro-b", 50)));
    config.plans.plans = vec![free, pro];
    config.plans.default_plan = Some(0);
    let plan = config.plans.position(alice).unwrap();
    config.plans.keys.push_key(b"alice", plan);
    config
}

async fn policy(limiter: &RateLimiter<MemoryStore>, rule: &str, key: &str, anonymous: bool) -> (String, u64) {
    let verdict = limiter.check_key(rule, key, 1, anonymous).await.unwrap();
    let policy = verdict.decisive().unwrap();
    (policy.name.to_owned(), policy.decision.remaining)
}

#[tokio::test]
async fn a_key_is_charged_under_its_plan_and_an_unknown_key_under_the_default() {
    let limiter = RateLimiter::from_config(&planned("pro"), MemoryStore::new()).unwrap();
    assert_eq!(limiter.plan_names(), ["free", "pro"]);
    assert_eq!(policy(&limiter, "a", "alice", false).await, ("pro-a".into(), 99));
    assert_eq!(policy(&limiter, "b", "alice", false).await, ("pro-b".into(), 49));
    assert_eq!(policy(&limiter, "a", "bob", false).await, ("free-a".into(), 1));
    // `free` says nothing of `b`: the rule's own limit.
    assert_eq!(policy(&limiter, "b", "bob", false).await, ("b".into(), 4));
    // No key: the rule's own limits, whatever the plans.
    assert_eq!(policy(&limiter, "a", "carol", true).await, ("a".into(), 4));
}

/// A key moved to another plan starts from zero under the new plan's limits
/// (each limit's counters are kept apart); moved back, it finds its old count.
#[tokio::test]
async fn a_key_moved_to_another_plan_starts_from_zero_under_its_limits() {
    let limiter = RateLimiter::from_config(&planned("pro"), MemoryStore::new()).unwrap();
    assert_eq!(policy(&limiter, "a", "alice", false).await, ("pro-a".into(), 99));
    let moved = limiter.reconfigure(&planned("free")).unwrap();
    assert_eq!(policy(&moved, "a", "alice", false).await, ("free-a".into(), 1));
    let back = moved.reconfigure(&planned("pro")).unwrap();
    assert_eq!(policy(&back, "a", "alice", false).await, ("pro-a".into(), 98));
}

#[tokio::test]
async fn an_override_outranks_the_file_and_is_kept_across_a_reload() {
    let limiter = RateLimiter::from_config(&planned("free"), MemoryStore::new()).unwrap();
    let digest = limiter.identity().key_digest(b"alice");
    let over = crate::PlanOverride { plan: "pro".into(), expires_at: None };
    limiter.plan_overrides().replace(std::collections::HashMap::from([(digest, over)]));
    assert_eq!(policy(&limiter, "a", "alice", false).await, ("pro-a".into(), 99));
    let reloaded = limiter.reconfigure(&planned("free")).unwrap();
    assert_eq!(policy(&reloaded, "a", "alice", false).await, ("pro-a".into(), 98));
    reloaded.plan_overrides().replace(Default::default());
    assert_eq!(policy(&limiter, "a", "alice", false).await, ("free-a".into(), 1));
}

#[tokio::test]
async fn a_rule_counting_by_address_ignores_plans() {
    let mut config = planned("pro");
    config.rules[0].limits = match config.rules[0].limits.clone() {
        RuleLimits::Shared { limits, .. } => RuleLimits::Shared { identity: IdentityKind::Ip, limits },
        other => other,
    };
    config.identity.api_key_header = Some(http::HeaderName::from_static("x-api-key"));
    let limiter = RateLimiter::from_config(&config, MemoryStore::new()).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", http::HeaderValue::from_static("alice"));
    let verdict = limiter.check_request(&Method::GET, "/a", &headers, None).await.unwrap();
    assert_eq!(verdict.decisive().unwrap().name, "a");
    let verdict = limiter.check_request(&Method::GET, "/b", &headers, None).await.unwrap();
    assert_eq!(verdict.decisive().unwrap().name, "pro-b");
    assert_eq!(verdict.decisive().unwrap().decision.remaining, 49);
}

/// The embedded store is asked at once through every layer, with the same
/// answers, calls and deny cache as the asynchronous path; a limiter on
/// the same state asked only through `decide` agrees decision by decision.
#[tokio::test]
async fn the_embedded_store_is_decided_at_once_through_every_layer_and_agrees() {
    let config = config(&[("a", 3)]);
    let limiter = RateLimiter::from_config(&config, MemoryStore::new()).unwrap();
    let twin = RateLimiter::from_config(&config, MemoryStore::new()).unwrap();
    let identity = Identity::named("a", "user-1");
    let charges = &limiter.inner.rules[0].set(false, None).charges;
    let mut now_answers = Vec::new();
    let mut async_answers = Vec::new();
    for _ in 0..5 {
        let request = slidegate::Request::new(&identity, charges);
        let now =
            limiter.inner.store.decide_now(request).expect("the embedded store answers at once").unwrap();
        let later = twin.inner.store.decide(request).await.unwrap();
        now_answers.push((now.decisions[0].allowed, now.decisions[0].remaining, now.origin));
        async_answers.push((later.decisions[0].allowed, later.decisions[0].remaining, later.origin));
    }
    assert_eq!(now_answers, async_answers);
    let allowed: Vec<bool> = now_answers.iter().map(|a| a.0).collect();
    assert_eq!(allowed, [true, true, true, false, false]);
    // The fifth is the deny cache's, on both paths.
    assert_eq!(now_answers[4].2, slidegate::Origin::Cache);
    let counted = |l: &RateLimiter<MemoryStore>| {
        let store = l.metrics().store();
        (store.calls.load(Relaxed), store.deny_cache_hits.load(Relaxed))
    };
    assert_eq!(counted(&limiter), counted(&twin));
    assert_eq!(counted(&limiter), (4, 1));
}
