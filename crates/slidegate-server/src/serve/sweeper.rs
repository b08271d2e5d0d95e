//! The embedded store's sweeper: gives memory back on a timer.
//!
//! A table of the embedded store forgets idle identities only when it grows
//! (or is swept); after a burst of identities that never return, nothing
//! would ever free their memory.
//! The sweeper calls [`MemoryStore::evict_idle_step`] every [`INTERVAL`] for
//! [`SHARDS_PER_TICK`] shard: with the store's 64 shards, every idle state
//! is gone at most 16 s after it went idle.
//!
//! One tick sweeps one shard, 1/64 of the store: at a million identities
//! about 0.3–0.6 ms (a few ms at worst on a busy machine; sliding logs cost
//! more to free, about 4 ms), under that one shard's lock only. That is
//! under 0.3% of a core, and a decision waits at most one shard's sweep.
//! Redis expires its own keys: the sweeper runs for the embedded store, and
//! for the embedded fallback that decides while Redis is unavailable (it
//! fills during an outage and would otherwise keep its memory after).
//!
//! [`MemoryStore::evict_idle_step`]: slidegate::MemoryStore::evict_idle_step

use std::time::Duration;

use slidegate_http::RateLimiter;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::store::AnyStore;

/// How often one step of the sweep runs.
const INTERVAL: Duration = Duration::from_millis(250);
/// How many shards one step sweeps.
const SHARDS_PER_TICK: usize = 1;

/// Starts sweeping `limiter`'s embedded stores, if it has any; abort the
/// handle to stop. `None` for Redis without a fallback.
pub(super) fn spawn(limiter: &RateLimiter<AnyStore>) -> Option<JoinHandle<()>> {
    let embedded = matches!(limiter.store(), AnyStore::Memory(_)) || limiter.fallback_store().is_some();
    embedded.then(|| tokio::spawn(sweep_every(limiter.clone(), INTERVAL, SHARDS_PER_TICK)))
}

async fn sweep_every(limiter: RateLimiter<AnyStore>, interval: Duration, shards: usize) {
    let mut ticks = tokio::time::interval(interval);
    // A late tick is not made up for with a burst of sweeps.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let limiter = limiter.clone();
        // Off the acceptor's thread: a step takes a shard's lock and rebuilds
        // its tables, blocking work of up to a few ms.
        let step = tokio::task::spawn_blocking(move || {
            if let AnyStore::Memory(store) = limiter.store() {
                store.evict_idle_step(shards);
            }
            if let Some(fallback) = limiter.fallback_store() {
                fallback.evict_idle_step(shards);
            }
        });
        if step.await.is_err() {
            // The runtime is shutting down.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use slidegate::{Algorithm, Limit, MemoryStore, Quota};

    use super::*;
    use crate::Config;

    /// Without the sweeper, identities whose windows have all passed stay in
    /// the embedded store (and in the embedded fallback) for as long as
    /// `serve` runs.
    #[tokio::test]
    async fn the_sweeper_empties_the_embedded_stores_once_their_states_are_idle() {
        let config = Config::parse("[store]\nfallback = true\n", "fallback.toml").unwrap();
        let limiter =
            RateLimiter::from_config(&config.limiter, AnyStore::Memory(MemoryStore::new().with_shards(4)))
                .unwrap();
        let AnyStore::Memory(store) = limiter.store() else { unreachable!() };
        let fallback = limiter.fallback_store().unwrap();
        let limit = Limit::new(Algorithm::FixedWindow, Quota::new(5, Duration::from_millis(1)).unwrap());
        let charge = [slidegate::Charge::new(limit, 1)];
        for i in 0..1000 {
            let client = slidegate::Identity::named("test", &format!("client-{i}"));
            store.decide_sync(slidegate::Request::new(&client, &charge)).unwrap();
            fallback.decide_sync(slidegate::Request::new(&client, &charge)).unwrap();
        }
        let sweeper = tokio::spawn(sweep_every(limiter.clone(), Duration::from_millis(5), 1));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !store.is_empty() || !fallback.is_empty() {
            let held = (store.len(), fallback.len());
            assert!(Instant::now() < deadline, "{held:?} states still held after 30 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sweeper.abort();
    }
}
