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

conformance_suite!(redis_packed, [packed_windows_follow_the_clock_they_are_given], |clock, case| {
    let server = slidegate_test_redis::RedisServer::spawn();
    // Two buckets: the cases' identities share window hashes.
    let layout = slidegate::Layout::Packed(slidegate::Buckets::new(2).expect("a power of two"));
    let store = crate::support::client_time_store(&server, &clock, case).await.with_layout(layout);
    (server, store)
});
