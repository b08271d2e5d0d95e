//! A job-queue worker that limits each tenant, outside HTTP: the store
//! behind every protection of `slidegate::protect` — leases for hot
//! tenants, a deadline and a circuit breaker, the deny cache, and the
//! fallback that goes on limiting while Redis is down.
//!
//! ```text
//! cargo run -p slidegate --example tenant_worker                                  # embedded store
//! cargo run -p slidegate --example tenant_worker -- redis://127.0.0.1:PORT/       # Redis
//! ```
//!
//! Stop the Redis server while it runs: the jobs go on being limited (the
//! answers' origin turns to `Fallback`), and the store decides again once
//! Redis is back. `tests/protect.rs` checks exactly that against a real Redis.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use slidegate::protect::{Events, LeasePolicy, Protect, StoreGuard};
use slidegate::{
    Algorithm, Charge, Identity, Limit, MemoryStore, Quota, RedisStore, Request, Store, StoreError,
};

/// The store's calls and the breaker, counted for the summary.
#[derive(Default)]
struct Counts {
    store_calls: AtomicU64,
    failures: AtomicU64,
    breaker_opened: AtomicU64,
    deny_cache_hits: AtomicU64,
}

impl Events for Counts {
    fn call(&self) {
        self.store_calls.fetch_add(1, Relaxed);
    }
    fn trial(&self) {}
    fn skipped(&self) {}
    fn answered(&self, _latency: Duration) {}
    fn failed(&self) {
        self.failures.fetch_add(1, Relaxed);
    }
    fn timed_out(&self) {
        self.failures.fetch_add(1, Relaxed);
    }
    fn breaker_opened(&self) {
        self.breaker_opened.fetch_add(1, Relaxed);
    }
    fn probe(&self) {}
    fn deny_cache_hit(&self) {
        self.deny_cache_hits.fetch_add(1, Relaxed);
    }
}

/// Each tenant may start 20 jobs every 10 seconds.
fn per_tenant() -> Result<Charge, Box<dyn std::error::Error>> {
    Ok(Charge::new(Limit::new(Algorithm::SlidingWindowCounter, Quota::new(20, Duration::from_secs(10))?), 1))
}

/// Takes jobs from a queue (here, a made-up one: a noisy tenant and two
/// quiet ones) and runs those their tenant's limit admits; the others wait.
async fn work<S: Store + 'static>(store: S, events: Arc<Counts>) -> Result<(), Box<dyn std::error::Error>> {
    let mut guard = StoreGuard::default();
    guard.lease = Some(LeasePolicy::default());
    let store = Protect::new(store, Arc::clone(&events) as Arc<dyn Events>)
        .leases(guard.lease)
        .guard(guard.calls)
        .deny_cache(guard.deny_cache)
        .fallback(Some(guard.fallback))
        .build();
    let charge = [per_tenant()?];
    let queue = (0..60).map(|i| if i % 4 == 3 { ["acme", "globex"][i % 8 / 4] } else { "noisy" });
    for (round, tenant) in queue.enumerate() {
        let identity = Identity::named("jobs", tenant);
        match store.decide(Request::new(&identity, &charge)).await {
            Ok(outcome) if outcome.allowed() => {
                println!("job {round:2} of {tenant:6}: run     ({:?})", outcome.origin)
            }
            Ok(outcome) => {
                let wait = outcome.decisions.first().and_then(|d| d.retry_after).unwrap_or_default();
                println!("job {round:2} of {tenant:6}: requeued, retry in {wait:?} ({:?})", outcome.origin);
            }
            // Only a request the stores could never decide (a bad charge)
            // ends here: an outage is the fallback's to answer.
            Err(err) => return Err(err.into()),
        }
        // A short pause every ten jobs, so that stopping Redis mid-run is easy.
        if round % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    println!(
        "store calls {}, failures {}, breaker opened {}, denials from the deny cache {}",
        events.store_calls.load(Relaxed),
        events.failures.load(Relaxed),
        events.breaker_opened.load(Relaxed),
        events.deny_cache_hits.load(Relaxed),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let events = Arc::new(Counts::default());
    match std::env::args().nth(1) {
        Some(url) => {
            let store = RedisStore::connect(&url).await.map_err(|e: StoreError| format!("{url}: {e}"))?;
            work(store, events).await
        }
        None => work(MemoryStore::new(), events).await,
    }
}
