//! A timer's bounded sweep steps give the embedded store's memory back.
//!
//! The only test in its binary, so no other test allocates while it measures
//! (the same approach as `memory_returns.rs`).

use std::alloc::System;
use std::time::Duration;

use cap::Cap;
#[path = "support/decide.rs"]
mod decide;

use slidegate::{Algorithm, Limit, ManualClock, MemoryStore, Quota};

use decide::{id, DecideSync};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

const SHARDS: usize = 16;

/// Without a sweep, a table that stops growing keeps its idle states: a
/// burst of identities that never return would hold its memory for good. Stepping
/// the sweep one shard at a time returns all of it, shard by shard, and no
/// step sweeps more than its one shard.
#[test]
fn bounded_sweep_steps_return_the_heap_to_baseline_after_every_window() {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryStore::with_clock(clock.clone()).with_shards(SHARDS);
    let limits: Vec<Limit> = Algorithm::ALL
        .into_iter()
        .map(|a| Limit::new(a, Quota::new(50, Duration::from_secs(10)).unwrap()))
        .collect();
    store.evict_idle();
    let baseline = ALLOCATOR.allocated();

    let mut key = String::with_capacity(32);
    for i in 0..40_000 {
        key.clear();
        key.push_str("identity:");
        key.push_str(&i.to_string());
        for limit in &limits {
            assert!(store.decide_one_sync(&id(&key), limit, 3).unwrap().allowed);
        }
    }
    let loaded = ALLOCATOR.allocated() - baseline;
    assert_eq!(store.len(), 200_000);
    assert!(loaded > 200_000 * 16, "40,000 identities × 5 limits should hold real memory, held {loaded} B");

    // Every window has passed, the counter's previous one too.
    clock.advance(Duration::from_secs(30));
    // Nothing forgets them on its own: no table grows, none is asked again.
    assert_eq!(store.len(), 200_000);
    let mut held = ALLOCATOR.allocated() - baseline;
    let mut states = store.len();
    for step in 0..SHARDS {
        let report = store.evict_idle_step(1);
        assert_eq!(report.shards, 1, "step {step}");
        assert_eq!(report.remaining, 0, "step {step}: everything in the swept shard was idle");
        // One shard's share, about 1/16 of the states: never the whole store.
        assert!(
            report.forgotten > 0 && report.forgotten <= states && report.forgotten < 2 * 200_000 / SHARDS,
            "step {step} forgot {} of {states} states",
            report.forgotten
        );
        states -= report.forgotten;
        assert_eq!(store.len(), states, "step {step}: only the swept shard changed");
        let now_held = ALLOCATOR.allocated().saturating_sub(baseline);
        assert!(now_held < held, "step {step} gave memory back: {now_held} B, {held} B before");
        held = now_held;
    }
    assert!(store.is_empty());
    let left = ALLOCATOR.allocated().saturating_sub(baseline);
    assert!(left < 4096, "{left} B still held after one sweep of every shard (held {loaded} B under load)");
}
