//! The protections of `slidegate::protect` around a real Redis, as a worker
//! outside HTTP uses them (a job queue limiting per tenant): leases answer a
//! hot tenant without a store call per job and never admit past its limit,
//! the deny cache answers its denials, and when Redis is stopped mid-run the
//! breaker opens and the fallback goes on limiting — a tenant already at its
//! limit stays refused, a fresh one gets exactly `limit / instances` — until
//! Redis is back and the store decides again.
#![cfg(all(feature = "redis", feature = "protect"))]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use slidegate::protect::{Events, FallbackPolicy, LeasePolicy, NoEvents, Protect, Protected, StoreGuard};
use slidegate::{
    Algorithm, Charge, Identity, Limit, Origin, Quota, RedisOptions, RedisStore, Request, Store, TimeSpan,
};
use slidegate_test_redis::{CommandStats, RedisServer};

/// What the layers told: each counter its event.
#[derive(Default)]
struct Counted {
    calls: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    skipped: AtomicU64,
    breaker_opened: AtomicU64,
    deny_cache_hits: AtomicU64,
}

impl Events for Counted {
    fn call(&self) {
        self.calls.fetch_add(1, Relaxed);
    }
    fn trial(&self) {}
    fn skipped(&self) {
        self.skipped.fetch_add(1, Relaxed);
    }
    fn answered(&self, _latency: Duration) {}
    fn failed(&self) {
        self.failed.fetch_add(1, Relaxed);
    }
    fn timed_out(&self) {
        self.timed_out.fetch_add(1, Relaxed);
    }
    fn breaker_opened(&self) {
        self.breaker_opened.fetch_add(1, Relaxed);
    }
    fn probe(&self) {}
    fn deny_cache_hit(&self) {
        self.deny_cache_hits.fetch_add(1, Relaxed);
    }
}

/// Each tenant's limit: 30 jobs a minute.
const PERMITS: u64 = 30;

fn charge() -> [Charge; 1] {
    let quota = Quota::new(PERMITS, Duration::from_secs(60)).expect("a valid quota");
    [Charge::new(Limit::new(Algorithm::SlidingWindowCounter, quota), 1)]
}

/// `jobs` jobs of `tenant`, one after another: how many were admitted, and
/// by whom each answer was made.
async fn run_jobs<S: Store + 'static>(store: &Protected<S>, tenant: &str, jobs: usize) -> (u64, Vec<Origin>) {
    let identity = Identity::named("jobs", tenant);
    let charge = charge();
    let mut admitted = 0;
    let mut origins = Vec::new();
    for _ in 0..jobs {
        let outcome = store.decide(Request::new(&identity, &charge)).await.expect("a decision");
        admitted += u64::from(outcome.allowed());
        origins.push(outcome.origin);
    }
    (admitted, origins)
}

fn count(origins: &[Origin], origin: Origin) -> usize {
    origins.iter().filter(|&&o| o == origin).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_limits_each_tenant_through_a_redis_outage() {
    let mut redis = RedisServer::spawn();
    let options = RedisOptions::new()
        .with_timeout(Duration::from_millis(200))
        .with_connect_timeout(Duration::from_millis(200));
    let store = RedisStore::connect_with(&redis.url(), options).await.expect("connect");
    let events = Arc::new(Counted::default());
    let mut guard = StoreGuard::default();
    guard.lease = Some(LeasePolicy { max: 8, horizon: TimeSpan::from_secs(1) });
    guard.calls.timeout = TimeSpan::from_millis(200);
    guard.calls.probe_interval = TimeSpan::from_millis(50);
    let store = Protect::new(store, Arc::clone(&events) as Arc<dyn Events>)
        .leases(guard.lease)
        .guard(guard.calls)
        .deny_cache(guard.deny_cache)
        .fallback(Some(guard.fallback))
        .build();

    // Redis up: a hot tenant gets exactly its limit, most of it from leases.
    let (admitted, origins) = run_jobs(&store, "hot", 40).await;
    assert_eq!(admitted, PERMITS, "leases admit exactly the limit: {origins:?}");
    let leased = count(&origins, Origin::Lease);
    assert!(leased >= 15, "most admitted jobs came from leased permits, {leased} did: {origins:?}");
    assert_eq!(count(&origins, Origin::Store) + leased, 31, "30 admitted and one denial from the store");
    // The first denial came from the store; the deny cache answered the other nine.
    assert_eq!(count(&origins, Origin::Cache), 9, "{origins:?}");
    assert_eq!(events.deny_cache_hits.load(Relaxed), 9);
    assert_eq!(events.calls.load(Relaxed), 31, "the guard hears of every job the deny cache did not answer");
    let scripts = CommandStats::of_port(redis.port());
    let scripts = scripts.calls("evalsha") + scripts.calls("eval");
    assert!(
        scripts < 25,
        "leases spared Redis calls (31 without them): {scripts} scripts ran for 31 answers"
    );

    // Redis stopped mid-run.
    redis.kill();
    let (admitted, origins) = run_jobs(&store, "hot", 5).await;
    assert_eq!(admitted, 0, "a tenant at its limit stays refused while Redis is down: {origins:?}");
    let (admitted, origins) = run_jobs(&store, "fresh", 40).await;
    assert_eq!(admitted, PERMITS, "the fallback enforces limit / instances: {origins:?}");
    assert_eq!(count(&origins, Origin::Fallback), 40 - count(&origins, Origin::Cache));
    assert_eq!(events.breaker_opened.load(Relaxed), 1, "the breaker opened once");
    assert!(events.failed.load(Relaxed) + events.timed_out.load(Relaxed) >= 1);
    assert!(events.skipped.load(Relaxed) > 0, "with the breaker open, calls skip the store");

    // Redis back (empty: its data was lost): the probe closes the breaker
    // and the store decides again.
    redis.restart();
    let back = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut origins = Vec::new();
    while tokio::time::Instant::now() < back {
        origins = run_jobs(&store, "after", 1).await.1;
        if origins == [Origin::Store] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origins, [Origin::Store], "the store decides once Redis is back");
}

/// The fallback step takes a policy or none: with none, a store's failure
/// is the caller's to handle; with one, each of its `instances` gets its
/// share of each limit, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_decides_by_its_policy_or_not_at_all() {
    let mut redis = RedisServer::spawn();
    let options = RedisOptions::new()
        .with_timeout(Duration::from_millis(200))
        .with_connect_timeout(Duration::from_millis(200));
    let mut guard = StoreGuard::default();
    guard.deny_cache = 0;
    let stack = |store, fallback| {
        Protect::new(store, Arc::new(NoEvents))
            .leases(guard.lease)
            .guard(guard.calls)
            .deny_cache(guard.deny_cache)
            .fallback(fallback)
            .build()
    };
    let off = stack(RedisStore::connect_with(&redis.url(), options.clone()).await.expect("connect"), None);
    let shared = stack(
        RedisStore::connect_with(&redis.url(), options).await.expect("connect"),
        Some(FallbackPolicy { instances: 3 }),
    );
    redis.kill();

    let identity = Identity::named("jobs", "tenant");
    let err =
        off.decide(Request::new(&identity, &charge())).await.expect_err("no fallback: the store's error");
    assert!(err.is_unavailable(), "{err}");
    let (admitted, origins) = run_jobs(&shared, "tenant", 40).await;
    assert_eq!(admitted, PERMITS / 3, "each of 3 instances gets a third of the limit: {origins:?}");
    assert_eq!(count(&origins, Origin::Fallback), 40, "{origins:?}");
}
