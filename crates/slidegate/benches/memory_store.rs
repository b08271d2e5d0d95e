//! Decision time of the embedded store, side by side with governor's keyed
//! limiter on the same identities and the same kind of clock (a fake clock
//! each, advanced by hand), in one run:
//!
//! - `one_identity/<algorithm>`: one key decided over and over;
//! - `keyed_1m/<algorithm>`: 1,000,000 identities, all present before timing
//!   starts, visited in a scattered order (slidegate's identities made
//!   before timing, as a server makes one per request at the edge;
//!   governor's keys written into a reused buffer);
//! - `two_threads_one_identity/<algorithm>`: two threads deciding for the
//!   same key at once (time per decision of each thread).
//!
//! Every loop advances its clock by 1 ms every 64 decisions and the quotas
//! allow 100,000 per second (the sliding log: 10,000 per 100 ms, within its
//! cap), so every decision is an allowed, charged one — the path a healthy
//! service takes — and the sliding log stays bounded.
//!
//! Run: `cargo bench -p slidegate --bench memory_store -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::clock::FakeRelativeClock;
use governor::RateLimiter;
use slidegate::{Algorithm, Charge, Limit, ManualClock, MemoryStore, Quota, Request};

mod common;
use common::{identities, scattered, user_42, KeyWriter, IDENTITIES};

const RATE: u32 = 100_000;
/// Decisions per simulated millisecond: below `RATE / 1000`, so all are allowed.
const PER_MS: u64 = 64;

fn limit(algorithm: Algorithm) -> Limit {
    let quota = match algorithm {
        // The same rate within the log's cap of 10,000 entries: 10,000 per 100 ms.
        Algorithm::SlidingLog => Quota::new(u64::from(RATE) / 10, Duration::from_millis(100)),
        _ => Quota::per_second(u64::from(RATE)),
    };
    Limit::new(algorithm, quota.expect("a valid quota"))
}

fn governor_quota() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(RATE).expect("non-zero"))
}

fn one_identity(c: &mut Criterion) {
    let mut group = c.benchmark_group("one_identity");
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let (user, charge) = (user_42(), [Charge::new(limit(algorithm), 1)]);
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("slidegate", algorithm.name()), |b| {
            b.iter(|| {
                i += 1;
                if i.is_multiple_of(PER_MS) {
                    clock.advance(Duration::from_millis(1));
                }
                black_box(store.decide_sync(black_box(Request::new(&user, &charge))))
            })
        });
    }
    // Each on its own real clock: what a user gets out of the box (slidegate
    // reads SystemTime, governor a TSC-based quanta clock).
    let store = MemoryStore::new();
    // 2^20 per ms: every decision is allowed and the state stays packed.
    let limit = Limit::new(
        Algorithm::SlidingWindowCounter,
        Quota::new(1 << 20, Duration::from_millis(1)).expect("a valid quota"),
    );
    let (user, charge) = (user_42(), [Charge::new(limit, 1)]);
    group.bench_function(BenchmarkId::new("slidegate", "sliding_window_counter_system_clock"), |b| {
        b.iter(|| black_box(store.decide_sync(black_box(Request::new(&user, &charge)))))
    });
    let governor = RateLimiter::dashmap(governor::Quota::per_second(NonZeroU32::MAX));
    let key = "user:42".to_owned();
    group.bench_function(BenchmarkId::new("governor", "dashmap_default_clock"), |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key))))
    });

    let clock = FakeRelativeClock::default();
    let governor = RateLimiter::dashmap_with_clock(governor_quota(), clock.clone());
    let mut i = 0u64;
    group.bench_function(BenchmarkId::new("governor", "dashmap"), |b| {
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(PER_MS) {
                clock.advance(Duration::from_millis(1));
            }
            black_box(governor.check_key(black_box(&key)))
        })
    });
    group.finish();
}

fn keyed(c: &mut Criterion) {
    let mut keys = KeyWriter::new();
    let mut ids = None;
    let mut group = c.benchmark_group("keyed_1m");
    // Each store is filled with the 1,000,000 identities on first use, so a
    // filtered run (`-- keyed_1m/governor`) builds only what it measures.
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(1_700_000_000_000);
        let charge = [Charge::new(limit(algorithm), 1)];
        let mut store = None;
        let mut i = 0u64;
        group.bench_function(BenchmarkId::new("slidegate", algorithm.name()), |b| {
            let ids: &[_] = ids.get_or_insert_with(identities);
            let store = store.get_or_insert_with(|| {
                let store = MemoryStore::with_clock(clock.clone());
                for id in ids {
                    store.decide_sync(Request::new(id, &charge)).expect("valid request");
                }
                store
            });
            b.iter(|| {
                i += 1;
                if i.is_multiple_of(PER_MS) {
                    clock.advance(Duration::from_millis(1));
                }
                black_box(store.decide_sync(Request::new(&ids[scattered(i)], &charge)))
            })
        });
    }

    // governor on the same string identities, then on integer identities
    // (its best case: no string to hash or compare, no key to build).
    let clock = FakeRelativeClock::default();
    // governor's keys are `String`s; looking one up needs a `&String`, so the
    // key is written into one reused `String` (no allocation per decision).
    let mut key = String::with_capacity(32);
    let mut i = 0u64;
    let mut dashmap = None;
    group.bench_function(BenchmarkId::new("governor", "dashmap"), |b| {
        let dashmap = dashmap.get_or_insert_with(|| {
            let limiter = RateLimiter::dashmap_with_clock(governor_quota(), clock.clone());
            for n in 0..IDENTITIES {
                let _ = limiter.check_key(&keys.key(n).to_owned());
            }
            limiter
        });
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(PER_MS) {
                clock.advance(Duration::from_millis(1));
            }
            key.clear();
            key.push_str(keys.key(scattered(i)));
            black_box(dashmap.check_key(&key))
        })
    });
    drop(dashmap);
    let mut hashmap = None;
    group.bench_function(BenchmarkId::new("governor", "hashmap"), |b| {
        let hashmap = hashmap.get_or_insert_with(|| {
            let limiter = RateLimiter::hashmap_with_clock(governor_quota(), clock.clone());
            for n in 0..IDENTITIES {
                let _ = limiter.check_key(&keys.key(n).to_owned());
            }
            limiter
        });
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(PER_MS) {
                clock.advance(Duration::from_millis(1));
            }
            key.clear();
            key.push_str(keys.key(scattered(i)));
            black_box(hashmap.check_key(&key))
        })
    });
    drop(hashmap);
    let mut dashmap_u64 = None;
    group.bench_function(BenchmarkId::new("governor", "dashmap_u64_keys"), |b| {
        let dashmap_u64 = dashmap_u64.get_or_insert_with(|| {
            let limiter = RateLimiter::dashmap_with_clock(governor_quota(), clock.clone());
            for n in 0..IDENTITIES {
                let _ = limiter.check_key(&(n as u64));
            }
            limiter
        });
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(PER_MS) {
                clock.advance(Duration::from_millis(1));
            }
            black_box(dashmap_u64.check_key(&(scattered(i) as u64)))
        })
    });
    group.finish();
}

/// Runs `decide` `iters` times on each of two threads started together and
/// returns the wall time: the time per decision of each thread.
fn two_threads(iters: u64, decide: impl Fn(u64) + Sync) -> Duration {
    let start = Barrier::new(3);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                start.wait();
                for i in 0..iters {
                    decide(i);
                }
            });
        }
        start.wait();
        let began = Instant::now();
        // The scope joins both threads before returning.
        began
    })
    .elapsed()
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads_one_identity");
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let (user, charge) = (user_42(), [Charge::new(limit(algorithm), 1)]);
        group.bench_function(BenchmarkId::new("slidegate", algorithm.name()), |b| {
            b.iter_custom(|iters| {
                two_threads(iters, |i| {
                    // Each thread advances every 128: 64 per ms between them.
                    if i.is_multiple_of(2 * PER_MS) {
                        clock.advance(Duration::from_millis(1));
                    }
                    black_box(store.decide_sync(Request::new(&user, &charge)).ok());
                })
            })
        });
    }
    let clock = FakeRelativeClock::default();
    let governor = RateLimiter::dashmap_with_clock(governor_quota(), clock.clone());
    let key = "user:42".to_owned();
    group.bench_function(BenchmarkId::new("governor", "dashmap"), |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |i| {
                if i.is_multiple_of(2 * PER_MS) {
                    clock.advance(Duration::from_millis(1));
                }
                black_box(governor.check_key(&key).ok());
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = one_identity, keyed, contended
}
criterion_main!(benches);
