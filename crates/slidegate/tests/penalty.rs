//! The penalty box on both stores: the same trace through `MemoryStore` and
//! `RedisStore` (client time, one shared `ManualClock`) gives the same
//! decisions and the same blocks, and the Redis state is one hash in the
//! identity's slot that expires by itself.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use slidegate::{
    Algorithm, Limit, ManualClock, MemoryStore, Outcome, Penalty, Quota, RedisStore, TimeSource,
};
use slidegate_test_redis::RedisServer;
use support::{id, Decide};

fn charges() -> Vec<(Limit, u64)> {
    Algorithm::ALL
        .into_iter()
        .enumerate()
        .map(|(i, a)| (Limit::new(a, Quota::new(3 + i as u64, Duration::from_millis(1_000)).unwrap()), 1))
        .collect()
}

fn penalty() -> Penalty {
    Penalty::new(4, Duration::from_millis(2_000), Duration::from_millis(500), Duration::from_millis(1_200))
        .unwrap()
}

async fn both(
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
    key: &str,
    charges: &[(Limit, u64)],
) -> Outcome {
    let a = memory.decide_all_penalized(&id(key), charges, &penalty()).await.unwrap();
    let b = redis.decide_all_penalized(&id(key), charges, &penalty()).await.unwrap();
    assert_eq!(a, b, "{key}");
    a
}

#[tokio::test]
async fn both_stores_block_alike_double_the_block_and_release_it() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(1_700_000_000_000);
    let memory = MemoryStore::with_clock(clock.clone());
    let redis = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())));
    let charges = charges();

    // 3 admissions (the tightest limit is 3 a second), then 4 denials pass
    // unpunished and the 5th blocks for 500 ms.
    for _ in 0..3 {
        let r = both(&memory, &redis, "scraper", &charges).await;
        assert!(r.decisions.iter().all(|d| d.allowed) && r.blocked_for.is_none());
    }
    for _ in 0..4 {
        let r = both(&memory, &redis, "scraper", &charges).await;
        assert!(!r.decisions[0].allowed && r.blocked_for.is_none());
        clock.advance(Duration::from_millis(10));
    }
    let r = both(&memory, &redis, "scraper", &charges).await;
    assert_eq!(r.decisions.len(), charges.len(), "the denial that blocks was decided");
    assert_eq!(r.blocked_for, Some(Duration::from_millis(500)));

    // Blocked: the limits are not decided, the wait counts down to the end.
    clock.advance(Duration::from_millis(499));
    let r = both(&memory, &redis, "scraper", &charges).await;
    assert!(r.decisions.is_empty());
    assert_eq!(r.blocked_for, Some(Duration::from_millis(1)));
    // Another identity is not blocked.
    assert!(both(&memory, &redis, "polite", &charges).await.blocked_for.is_none());

    // Released at the block's end: its limits are decided again.
    clock.advance(Duration::from_millis(1));
    let r = both(&memory, &redis, "scraper", &charges).await;
    assert!(r.blocked_for.is_none());
    assert_eq!(r.decisions.len(), charges.len());

    // A repeat offence within max_block: twice as long (1000 ms).
    let second = loop {
        let r = both(&memory, &redis, "scraper", &charges).await;
        if let Some(d) = r.blocked_for {
            break d;
        }
    };
    assert_eq!(second, Duration::from_millis(1_000));
    clock.advance(second);
    // A third: capped at max_block (1200 ms, not 2000).
    let third = loop {
        let r = both(&memory, &redis, "scraper", &charges).await;
        if let Some(d) = r.blocked_for {
            break d;
        }
    };
    assert_eq!(third, Duration::from_millis(1_200));

    // The state is one hash in the identity's slot, with an expiry.
    let mut admin =
        redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let key = format!("slidegate:{{{}}}:penalty", id("scraper"));
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut admin).await.unwrap();
    assert!(ttl > 0, "the penalty hash expires by itself: {ttl}");
}
