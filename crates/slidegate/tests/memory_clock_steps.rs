//! The embedded store after the clock steps back further than its packed
//! window numbers reach: found as the cause of the cluster agreement test's
//! flakes (`memory_and_cluster_decide_identically`, about 2 runs in 20).
//!
//! The sliding window counter's packed states keep window numbers modulo
//! 2^k (k = 16 for a limit of 10^7) and restore them relative to the table's
//! last sweep, exact within 2^(k−1) windows of it (`store/memory/packing.rs`).
//! A table sweeps again when the clock moves *forward* past its horizon, but
//! not when it steps *back*: a state written 40,000 windows (120 s of 3 ms
//! windows) before the reference is read 65,536 windows in the future.
//! Identities share a table only when they share a shard, which the store's
//! random hasher picks: with the default 64 shards the agreement tests meet
//! this in a few runs out of a hundred, with one shard every time.
#![allow(missing_docs)]

#[path = "support/decide.rs"]
mod decide;

use std::time::Duration;

use decide::DecideSync;
use slidegate::{Algorithm, Clock, Identity, Limit, ManualClock, MemoryStore, Quota};

#[test]
#[ignore = "the embedded store misreads packed states after a clock step back of more than 2^(k-1) windows; \
            a fix belongs in store/memory (packing.rs, counter_table.rs)"]
fn a_state_written_after_a_long_step_back_reads_as_written() {
    let limit = Limit::new(
        Algorithm::SlidingWindowCounter,
        Quota::new(10_000_000, Duration::from_millis(3)).expect("a valid quota"),
    );
    let clock = ManualClock::new(1_700_000_000_000);
    // One shard: both identities in one table, as the hasher picks now and then.
    let store = MemoryStore::with_clock(clock.clone()).with_shards(1);
    let (early, late) = (Identity::named("t", "early"), Identity::named("t", "late"));
    store.decide_one_sync(&early, &limit, 1).expect("decided");
    clock.set(clock.now_ms() - 120_000);
    store.decide_one_sync(&late, &limit, 1).expect("decided");
    let peek = store.decide_one_sync(&late, &limit, 0).expect("decided");
    assert_eq!((peek.remaining, peek.reset_after), (9_999_999, Duration::from_millis(3)));
}
