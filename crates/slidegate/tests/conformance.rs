//! One behaviour, two stores: every case runs against the embedded
//! `MemoryStore` and against `RedisStore` on a spawned `redis-server`, both
//! deciding on the same kind of `ManualClock`, and asserts exact values.
#![cfg(feature = "redis")]

mod support;
#[macro_use]
mod conformance_cases;

conformance_suite!(memory, |clock, _case| ((), slidegate::MemoryStore::with_clock(clock.clone())));

conformance_suite!(redis, |clock, case| {
    let server = slidegate_test_redis::RedisServer::spawn();
    let store = crate::support::client_time_store(&server, &clock, case).await;
    (server, store)
});
