//! The limiter across a reload.

use slidegate::{Algorithm, Limit, Quota};

use super::*;
use crate::config::{LimitConfig, RuleLimits};
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
