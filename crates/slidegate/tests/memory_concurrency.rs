//! Threads racing on one identity in the embedded store: however their
//! decisions interleave, exactly the limit is admitted, and a multi-limit
//! decision never charges past any of its limits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use slidegate::{Algorithm, Limit, ManualClock, MemoryStore, Quota};

const THREADS: usize = 8;

/// `THREADS` threads each ask `per_thread` times for one permit of `limit`
/// on one identity, the clock standing still; returns how many were allowed.
fn admitted(store: &MemoryStore<ManualClock>, limit: &Limit, per_thread: u64, key: &str) -> u64 {
    let allowed = AtomicU64::new(0);
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                for _ in 0..per_thread {
                    if store.decide_sync(key, limit, 1).expect("a valid request").allowed {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    allowed.into_inner()
}

#[test]
fn threads_on_one_identity_admit_exactly_the_limit() {
    for algorithm in Algorithm::ALL {
        // Limits packed into one word and one too large for it.
        for permits in [1_000, (1 << 24) + 1] {
            let permits = if algorithm == Algorithm::SlidingLog { permits.min(1_000) } else { permits };
            let limit =
                Limit::new(algorithm, Quota::new(permits, Duration::from_secs(60)).expect("a valid quota"));
            let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000));
            // Seed the identity so the race is on a stored state, then race
            // for the rest and well past it.
            assert!(store.decide_sync("hot", &limit, 1).expect("a valid request").allowed);
            let want = permits.min(40_000) - 1;
            let per_thread = want.div_ceil(THREADS as u64) + 500;
            let up_front = if want < permits - 1 {
                // Large limits: charge the excess up front so the race ends at the limit.
                let rest = permits - 1 - want;
                assert!(store.decide_sync("hot", &limit, rest).expect("a valid request").allowed);
                rest
            } else {
                0
            };
            let got = admitted(&store, &limit, per_thread, "hot");
            assert_eq!(got, want, "{limit}: {up_front} charged up front");
            assert!(!store.decide_sync("hot", &limit, 1).expect("a valid request").allowed, "{limit}");
        }
    }
}

#[test]
fn racing_single_and_multi_limit_decisions_never_exceed_a_limit() {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryStore::with_clock(clock);
    let minute =
        Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(3_000).expect("a valid quota"));
    let hour = Limit::new(Algorithm::FixedWindow, Quota::per_hour(5_000).expect("a valid quota"));
    let both = [(minute, 1), (hour, 1)];
    let (single, multi) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (store, single, multi, start) = (&store, &single, &multi, &start);
            s.spawn(move || {
                start.wait();
                for _ in 0..1_000 {
                    if t % 2 == 0 {
                        if store.decide_sync("hot", &minute, 1).expect("a valid request").allowed {
                            single.fetch_add(1, Ordering::Relaxed);
                        }
                    } else if store
                        .decide_all_sync("hot", &both)
                        .expect("a valid request")
                        .iter()
                        .all(|d| d.allowed)
                    {
                        multi.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (single, multi) = (single.into_inner(), multi.into_inner());
    // Every admitted request counted once against the minute limit, and the
    // minute limit is exhausted: 8,000 asked for 3,000 permits.
    assert_eq!(single + multi, 3_000);
    let minute_left = store.decide_sync("hot", &minute, 0).expect("a valid request");
    assert_eq!(minute_left.remaining, 0);
    let hour_left = store.decide_sync("hot", &hour, 0).expect("a valid request");
    assert_eq!(
        hour_left.remaining,
        5_000 - multi,
        "the hour limit was charged by multi-limit decisions only"
    );
}

/// Threads deciding for a hot identity without the lock (each holds a
/// handle on its slot after two decisions in a row) while another thread
/// rebuilds the very table under them, again and again: by sweeps, by
/// growth (new identities), and by multi-limit decisions that freeze the
/// state. A write that landed in an array after its copy was taken would be
/// lost, and more than the limit admitted; a write refused for nothing
/// would leave permits unused.
#[test]
fn hot_identity_races_rebuilds_and_multi_limit_decisions_and_admits_exactly_the_limit() {
    const PERMITS: u64 = 30_000;
    let clock = ManualClock::new(1_700_000_000_000);
    // One shard: every identity in the hot identity's table.
    let store = MemoryStore::with_clock(clock).with_shards(1);
    let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(PERMITS).expect("a valid quota"));
    let other = Limit::new(Algorithm::FixedWindow, Quota::per_minute(1_000_000).expect("a valid quota"));
    let (single, multi, rebuilds) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let racing = AtomicU64::new(3);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..12_000 {
                    if store.decide_sync("hot", &limit, 1).expect("a valid request").allowed {
                        single.fetch_add(1, Ordering::Relaxed);
                    }
                }
                racing.fetch_sub(1, Ordering::Relaxed);
            });
        }
        s.spawn(|| {
            let mut n = 0u64;
            while racing.load(Ordering::Relaxed) > 0 {
                n += 1;
                match n % 3 {
                    // A sweep rebuilds every table, even when nothing is idle.
                    0 => {
                        store.evict_idle();
                    }
                    // New identities grow the table now and then.
                    1 => {
                        store.decide_sync(&format!("cold-{n}"), &limit, 1).expect("a valid request");
                    }
                    _ => {
                        let both = [(other, 1), (limit, 1)];
                        let decisions = store.decide_all_sync("hot", &both).expect("a valid request");
                        if decisions.iter().all(|d| d.allowed) {
                            multi.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                rebuilds.fetch_add(1, Ordering::Relaxed);
            }
        });
    });
    let (single, multi) = (single.into_inner(), multi.into_inner());
    assert!(rebuilds.into_inner() > 100, "the race needs rebuilds during it");
    assert!(multi > 0, "multi-limit decisions took part");
    // 36,000 + the multi-limit requests asked for 30,000 permits.
    assert_eq!(single + multi, PERMITS);
    assert_eq!(store.decide_sync("hot", &limit, 0).expect("a valid request").remaining, 0);
    assert_eq!(store.decide_sync("hot", &other, 0).expect("a valid request").remaining, 1_000_000 - multi);
}
