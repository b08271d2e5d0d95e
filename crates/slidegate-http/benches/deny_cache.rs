//! What a denial costs through `RateLimiter::check_request`, from the
//! identity's hash to the verdict: answered by the local deny cache, and
//! decided by the embedded store (the cheapest store call there is; a Redis
//! round trip costs tens of microseconds on top).

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, Method};
use slidegate::{Algorithm, Limit, MemoryStore, Quota};
use slidegate_http::config::{IdentityKind, LimitConfig, RuleConfig, RuleLimits};
use slidegate_http::{LimiterConfig, RateLimiter};

fn limiter(deny_cache: usize) -> RateLimiter<MemoryStore> {
    // One rule, "trending": 1 an hour, per API key or else per client IP.
    let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_hour(1).unwrap());
    let limits = vec![LimitConfig::new("trending", limit, 1).unwrap()];
    let path = "/api/videos/trending".parse().unwrap();
    let mut config = LimiterConfig::default();
    config.rules.push(RuleConfig::new(
        "trending",
        path,
        RuleLimits::Shared { identity: IdentityKind::ApiKey, limits },
    ));
    config.guard.deny_cache = deny_cache;
    RateLimiter::from_config(&config, MemoryStore::new()).expect("the embedded store supports every rule")
}

fn denials(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let peer = Some(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)));
    let headers = HeaderMap::new();
    let mut group = c.benchmark_group("denial");
    for (name, capacity) in [("deny_cache", 1 << 16), ("embedded_store", 0)] {
        let limiter = limiter(capacity);
        runtime.block_on(async {
            // The one admission, then the first denial (the store's).
            for _ in 0..2 {
                limiter.check_request(&Method::GET, "/api/videos/trending", &headers, peer).await.unwrap();
            }
        });
        // One runtime entry per sample, not per request: the figure is the
        // decision's, not tokio's.
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let verdict = limiter
                            .check_request(&Method::GET, "/api/videos/trending", &headers, peer)
                            .await
                            .unwrap();
                        assert!(!verdict.allowed());
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, denials);
criterion_main!(benches);
