//! The exact local deny cache through `RateLimiter`: a cached denial is the
//! store's denial (same decisions, same headers), costs no store call, and
//! ends exactly when the store would admit again. Time is a `ManualClock` for
//! the embedded store and tokio's paused clock for the limiter, moved together.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::HeaderMap;
use slidegate::{Algorithm, ManualClock, MemoryStore};
use slidegate_http::{headers, RateLimiter, Verdict};
use slidegate_server::Config;

/// A rule `api` with `limits`; `max_cost` is the smallest limit, the
/// largest cost a check may charge.
fn config(algorithm: Algorithm, limits: &str, deny_cache: usize) -> Config {
    let max_cost = limits
        .split("limit = ")
        .skip(1)
        .filter_map(|rest| rest.split([',', ' ']).next()?.parse::<u64>().ok())
        .min()
        .unwrap();
    let source = format!(
        "[identity]\nip_hash_secret_env = \"SECRET\"\n[store]\ndeny_cache = {deny_cache}\n\
         [[rules]]\nname = \"api\"\npath = \"/api/*\"\nmax_cost = {max_cost}\nlimits = [{limits}]\n",
    );
    let source = source.replace("ALGORITHM", algorithm.name());
    let env = |name: &str| (name == "SECRET").then(|| "s3cret".to_owned());
    Config::parse_with_env(&source, "inline.toml", &env).unwrap()
}

fn limiter(config: &Config, clock: &ManualClock) -> RateLimiter<MemoryStore<ManualClock>> {
    RateLimiter::from_config(&config.limiter, MemoryStore::with_clock(clock.clone())).unwrap()
}

fn store_calls<S>(limiter: &RateLimiter<S>) -> u64 {
    // The render sums the per-thread shards; the counter itself is per thread.
    let text = limiter.render_metrics();
    let line = text.lines().find(|l| l.starts_with("slidegate_store_calls_total ")).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn cache_hits<S>(limiter: &RateLimiter<S>) -> u64 {
    let text = limiter.render_metrics();
    let line = text.lines().find(|l| l.starts_with("slidegate_deny_cache_hits_total ")).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn rendered(verdict: &Verdict<'_>) -> HeaderMap {
    let mut out = HeaderMap::new();
    headers::apply(&mut out, verdict, true);
    out
}

async fn advance(clock: &ManualClock, ms: u64) {
    clock.advance(Duration::from_millis(ms));
    tokio::time::advance(Duration::from_millis(ms)).await;
}

/// Every algorithm, a rule of two limits, costs 1 to 3 at irregular times:
/// the limiter with the cache decides exactly as the one without, header for
/// header, and asks its store less.
#[tokio::test(start_paused = true)]
async fn a_cached_denial_is_the_stores_denial_for_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let limits = "{ name = \"burst\", limit = 5, window = \"2s\", algorithm = \"ALGORITHM\" }, \
                      { name = \"hour\", limit = 40, window = \"60s\", algorithm = \"ALGORITHM\" }";
        let clock = ManualClock::new(1_000_000);
        let cached = limiter(&config(algorithm, limits, 1024), &clock);
        let direct = limiter(&config(algorithm, limits, 0), &clock);
        let mut seed = 0x9e37_79b9_u64;
        for _ in 0..600 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let cost = 1 + (seed >> 33) % 3;
            let key = if (seed >> 40).is_multiple_of(4) { "polite" } else { "scraper" };
            let a = cached.check_key("api", key, cost, false).await.unwrap();
            let b = direct.check_key("api", key, cost, false).await.unwrap();
            assert_eq!(a.allowed(), b.allowed(), "{algorithm:?} cost {cost}");
            if cost == 1 {
                // Every HTTP request costs 1: its headers are the store's to
                // the byte. (A larger cost's denial shows the remaining
                // permits, which decay upward while cached.)
                assert_eq!(a.decisive(), b.decisive(), "{algorithm:?}");
                assert_eq!(rendered(&a), rendered(&b), "{algorithm:?}");
            } else if let (Some(x), Some(y)) = (a.decisive(), b.decisive()) {
                assert!(
                    x.decision.retry_after <= y.decision.retry_after,
                    "{algorithm:?}: never later than the store"
                );
            }
            advance(&clock, (seed >> 20) % 90).await;
        }
        let (with, without) = (store_calls(&cached), store_calls(&direct));
        assert_eq!(with + cache_hits(&cached), without, "{algorithm:?}: every decision is a call or a hit");
        assert!(with < without / 2, "{algorithm:?}: {with} store calls with the cache, {without} without");
    }
}

/// Denied locally 1 ms before the store's `retry_after`, with `Retry-After`
/// counting down; at `retry_after` the store is asked and admits.
#[tokio::test(start_paused = true)]
async fn denied_locally_until_the_deadline_then_admitted_by_the_store() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(5_000_000);
        let limits = "{ limit = 10, window = \"60s\", algorithm = \"ALGORITHM\" }";
        let limiter = limiter(&config(algorithm, limits, 1024), &clock);
        for _ in 0..10 {
            assert!(limiter.check_key("api", "k", 1, false).await.unwrap().allowed());
        }
        let first = limiter.check_key("api", "k", 1, false).await.unwrap();
        assert!(!first.allowed());
        let retry = first.decisive().unwrap().decision.retry_after.unwrap();
        let retry_ms = u64::try_from(retry.as_millis()).unwrap();
        assert!(retry_ms > 2, "{algorithm:?}: {retry_ms}");
        assert_eq!(store_calls(&limiter), 11);

        advance(&clock, 1).await;
        let cached = limiter.check_key("api", "k", 1, false).await.unwrap();
        assert!(!cached.allowed());
        assert_eq!(cached.decisive().unwrap().decision.retry_after, Some(retry - Duration::from_millis(1)));
        let headers = rendered(&cached);
        assert_eq!(headers["retry-after"], headers::ceil_secs(retry - Duration::from_millis(1)).to_string());

        advance(&clock, retry_ms - 2).await;
        let last = limiter.check_key("api", "k", 1, false).await.unwrap();
        assert!(!last.allowed(), "{algorithm:?}: denied 1 ms before the deadline");
        assert_eq!(last.decisive().unwrap().decision.retry_after, Some(Duration::from_millis(1)));
        assert_eq!(last.decisive().unwrap().decision.remaining, 0);
        assert_eq!(store_calls(&limiter), 11, "{algorithm:?}: the denials before T were local");
        assert_eq!(cache_hits(&limiter), 2);

        advance(&clock, 1).await;
        assert!(limiter.check_key("api", "k", 1, false).await.unwrap().allowed(), "{algorithm:?} at T");
        assert_eq!(store_calls(&limiter), 12, "{algorithm:?}: the store decided at T");
    }
}

/// A smaller cost than the cached denial's may fit: it goes to the store.
#[tokio::test(start_paused = true)]
async fn a_smaller_cost_asks_the_store() {
    let clock = ManualClock::new(1_000);
    let limiter = limiter(&config(Algorithm::FixedWindow, "{ limit = 10, window = \"60s\" }", 1024), &clock);
    assert!(limiter.check_key("api", "k", 8, false).await.unwrap().allowed());
    assert!(!limiter.check_key("api", "k", 5, false).await.unwrap().allowed());
    assert!(!limiter.check_key("api", "k", 6, false).await.unwrap().allowed());
    assert_eq!(store_calls(&limiter), 2, "cost 6 ≥ 5: answered locally");
    assert!(limiter.check_key("api", "k", 2, false).await.unwrap().allowed(), "cost 2 fits");
    assert_eq!(store_calls(&limiter), 3);
}

/// Prints (never asserts) what a cached denial costs through `check_key`,
/// hashing included, next to a store denial on the embedded store.
#[tokio::test(start_paused = true)]
async fn cached_denial_cost_is_printed() {
    let clock = ManualClock::new(1_000);
    for (label, capacity) in [("cached", 1024), ("embedded store", 0)] {
        let limiter = limiter(
            &config(Algorithm::SlidingWindowCounter, "{ limit = 1, window = \"1h\" }", capacity),
            &clock,
        );
        limiter.check_key("api", "k", 1, false).await.unwrap();
        let n = 200_000u32;
        let start = std::time::Instant::now();
        for _ in 0..n {
            assert!(!limiter.check_key("api", "k", 1, false).await.unwrap().allowed());
        }
        println!("{label} denial through check_key: {} ns", start.elapsed().as_nanos() / u128::from(n));
    }
}
