//! After traffic stops, the embedded store gives its memory back.
//!
//! The only test in its binary, so no other test allocates while it measures.

use std::alloc::System;
use std::time::Duration;

use cap::Cap;
#[path = "support/decide.rs"]
mod decide;

use slidegate::{Algorithm, Limit, ManualClock, MemoryStore, Quota};

use decide::{id, DecideSync};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

#[test]
fn memory_returns_near_its_baseline_once_identities_go_idle() {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    let limits: Vec<Limit> = Algorithm::ALL
        .into_iter()
        .map(|a| Limit::new(a, Quota::new(50, Duration::from_secs(10)).unwrap()))
        .collect();
    store.evict_idle();
    let baseline = ALLOCATOR.allocated();

    let mut key = String::with_capacity(32);
    for i in 0..50_000 {
        key.clear();
        key.push_str("identity:");
        key.push_str(&i.to_string());
        for limit in &limits {
            assert!(store.decide_one_sync(&id(&key), limit, 3).unwrap().allowed);
        }
    }
    let loaded = ALLOCATOR.allocated() - baseline;
    assert_eq!(store.len(), 250_000);
    assert!(loaded > 250_000 * 16, "50,000 identities × 5 limits should hold real memory, held {loaded} B");

    // 3 permits refill in 600 ms: until then nothing may be forgotten.
    clock.advance(Duration::from_millis(599));
    assert_eq!(store.evict_idle(), 250_000);
    // Then the token bucket and GCRA states are as good as fresh; the
    // window-based ones still count.
    clock.advance(Duration::from_millis(1));
    assert_eq!(store.evict_idle(), 150_000);
    clock.advance(Duration::from_millis(8_400));

    assert_eq!(store.evict_idle(), 150_000);
    // Next window: the fixed window and the log are done; the counter still
    // weighs the previous window until the one after.
    clock.advance(Duration::from_millis(1_000));
    assert_eq!(store.evict_idle(), 50_000);
    clock.advance(Duration::from_secs(10));
    assert_eq!(store.evict_idle(), 0);
    let left = ALLOCATOR.allocated().saturating_sub(baseline);
    assert!(left < 4096, "{left} B still held after eviction (held {loaded} B under load)");
}
