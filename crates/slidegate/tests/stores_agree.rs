//! Same trace ⇒ same decisions: random traces replayed through `MemoryStore`
//! and `RedisStore` (client time, one shared `ManualClock`) must give
//! identical results, call for call, for every algorithm.
#![cfg(feature = "redis")]

mod agree_cases;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};

use agree_cases::Clock;
use proptest::test_runner::{Config, TestRunner};
use slidegate::{Buckets, Layout, RedisStore};
use slidegate_test_redis::RedisServer;

/// Enough to hit every boundary kind many times; the whole test takes a few seconds.
const CASES: u32 = 384;

#[test]
fn memory_and_redis_decide_identically() {
    agree(Layout::PerKey, Clock::StepsBack);
}

/// The packed layout, its buckets few so that the three identities share
/// hashes: identical decisions under a clock that never steps back.
#[test]
fn memory_and_packed_redis_decide_identically() {
    agree(Layout::Packed(Buckets::new(2).expect("a power of two")), Clock::Forward);
}

fn agree(layout: Layout, clock: Clock) {
    let server = RedisServer::spawn();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let redis = runtime.block_on(RedisStore::connect(&server.url())).expect("connect").with_layout(layout);
    let admin = runtime.block_on(support::admin(&server));
    let mut config = Config::with_cases(CASES);
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config);
    let case = AtomicUsize::new(0);
    let result = runner.run(&agree_cases::trace(clock), |trace| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(agree_cases::replay(&redis, &admin, "", case, &trace))
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
}
