//! Threads racing on one identity in the embedded store: however their
//! decisions interleave, exactly the limit is admitted, and a multi-limit
//! decision never charges past any of its limits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

#[path = "support/decide.rs"]
mod decide;

use slidegate::{Algorithm, Limit, ManualClock, MemoryStore, Quota};

use decide::{id, DecideSync};

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
                    if store.decide_one_sync(&id(key), limit, 1).expect("a valid request").allowed {
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
            assert!(store.decide_one_sync(&id("hot"), &limit, 1).expect("a valid request").allowed);
            let want = permits.min(40_000) - 1;
            let per_thread = want.div_ceil(THREADS as u64) + 500;
            let up_front = if want < permits - 1 {
                // Large limits: charge the excess up front so the race ends at the limit.
                let rest = permits - 1 - want;
                assert!(store.decide_one_sync(&id("hot"), &limit, rest).expect("a valid request").allowed);
                rest
            } else {
                0
            };
            let got = admitted(&store, &limit, per_thread, "hot");
            assert_eq!(got, want, "{limit}: {up_front} charged up front");
            assert!(
                !store.decide_one_sync(&id("hot"), &limit, 1).expect("a valid request").allowed,
                "{limit}"
            );
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
                        if store.decide_one_sync(&id("hot"), &minute, 1).expect("a valid request").allowed {
                            single.fetch_add(1, Ordering::Relaxed);
                        }
                    } else if store
                        .decide_all_sync(&id("hot"), &both)
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
    let minute_left = store.decide_one_sync(&id("hot"), &minute, 0).expect("a valid request");
    assert_eq!(minute_left.remaining, 0);
    let hour_left = store.decide_one_sync(&id("hot"), &hour, 0).expect("a valid request");
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
/// state. The limit is never reached, so every request is charged, and the
/// state must count every one of them: a write that landed in an array
/// after its copy was taken would be missing.
#[test]
fn hot_identity_races_rebuilds_and_counts_every_permit() {
    const PERMITS: u64 = 10_000_000;
    let clock = ManualClock::new(1_700_000_000_000);
    // One shard: every identity in the hot identity's table.
    let store = MemoryStore::with_clock(clock).with_shards(1);
    let limit =
        Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(PERMITS).expect("a valid quota"));
    let other = Limit::new(Algorithm::FixedWindow, Quota::per_minute(1_000_000).expect("a valid quota"));
    // Other identities in the table make each rebuild's copy take a while.
    for n in 0..500 {
        store.decide_one_sync(&id(&format!("cold-{n}")), &limit, 1).expect("a valid request");
    }
    let (single, multi) = (AtomicU64::new(0), AtomicU64::new(0));
    let rebuilding = AtomicBool::new(true);
    let start = Barrier::new(3);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                start.wait();
                while rebuilding.load(Ordering::Relaxed) {
                    assert!(store.decide_one_sync(&id("hot"), &limit, 1).expect("a valid request").allowed);
                    single.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        s.spawn(|| {
            start.wait();
            for n in 0..3_000 {
                match n % 3 {
                    // A sweep rebuilds every table, even when nothing is idle.
                    0 => {
                        store.evict_idle();
                    }
                    // New identities grow the table now and then.
                    1 => {
                        store.decide_one_sync(&id(&format!("new-{n}")), &limit, 1).expect("a valid request");
                    }
                    _ => {
                        let both = [(other, 1), (limit, 1)];
                        let decisions = store.decide_all_sync(&id("hot"), &both).expect("a valid request");
                        assert!(decisions.iter().all(|d| d.allowed));
                        multi.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            rebuilding.store(false, Ordering::Relaxed);
        });
    });
    let (single, multi) = (single.into_inner(), multi.into_inner());
    assert_eq!(multi, 1_000);
    let left = store.decide_one_sync(&id("hot"), &limit, 0).expect("a valid request").remaining;
    assert_eq!(PERMITS - left, single + multi, "permits charged against requests admitted");
    assert_eq!(
        store.decide_one_sync(&id("hot"), &other, 0).expect("a valid request").remaining,
        1_000_000 - multi
    );
}

/// Threads deciding for a hot identity without the lock, racing threads
/// that decide it under two limits at once: a multi-limit decision freezes
/// the state between its check and its commit, so it never charges one
/// limit on a check another thread's write has made stale. Such a write
/// can only change the outcome as the limit runs out, so the race is run
/// many times over, on a fresh identity each time, and the hot limit comes
/// last of five so that the check and the commit lie far apart.
#[test]
fn hot_identity_races_multi_limit_decisions_and_charges_all_or_nothing() {
    const PERMITS: u64 = 60;
    let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000));
    let limit =
        Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(PERMITS).expect("a valid quota"));
    let others = [1_000_000, 1_000_001, 1_000_002, 1_000_003]
        .map(|n| Limit::new(Algorithm::FixedWindow, Quota::per_minute(n).expect("a valid quota")));
    let other = others[0];
    let both = [(others[0], 1), (others[1], 1), (others[2], 1), (others[3], 1), (limit, 1)];
    const ROUNDS: usize = 1_000;
    let single: Vec<AtomicU64> = (0..ROUNDS).map(|_| AtomicU64::new(0)).collect();
    let multi: Vec<AtomicU64> = (0..ROUNDS).map(|_| AtomicU64::new(0)).collect();
    // One thread of each kind, both running all rounds: they run at once on
    // two cores, and each round starts them together.
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (store, single, multi, start, both) = (&store, &single, &multi, &start, &both);
            s.spawn(move || {
                for round in 0..ROUNDS {
                    let key = format!("hot-{round}");
                    start.wait();
                    for _ in 0..90 {
                        if t == 0 {
                            if store.decide_one_sync(&id(&key), &limit, 1).expect("a valid request").allowed {
                                single[round].fetch_add(1, Ordering::Relaxed);
                            }
                        } else if store
                            .decide_all_sync(&id(&key), both)
                            .expect("a valid request")
                            .iter()
                            .all(|d| d.allowed)
                        {
                            multi[round].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for round in 0..ROUNDS {
        let (single, multi) = (single[round].load(Ordering::Relaxed), multi[round].load(Ordering::Relaxed));
        assert_eq!(single + multi, PERMITS, "round {round}");
        let left = store
            .decide_one_sync(&id(&format!("hot-{round}")), &other, 0)
            .expect("a valid request")
            .remaining;
        assert_eq!(left, 1_000_000 - multi, "round {round}: {single} single, {multi} multi");
    }
}
