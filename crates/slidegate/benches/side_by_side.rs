//! slidegate's sliding window counter and governor's keyed limiter,
//! interleaved: each round times one slice of each contender back to back,
//! and the figures are medians over the rounds. On a shared or noisy machine
//! the load changes between criterion benchmarks, which run one after the
//! other; interleaving gives both contenders the same conditions, so the
//! ratio holds even when the absolute figures drift.
//!
//! Same identities (`user:<n>` keys, written into a reused buffer as a server
//! has them), same kind of clock (each its fake clock, advanced 1 ms every 64
//! decisions), every decision allowed. governor is also measured keyed by
//! the 64-bit hash of the same keys (what a caller would do to use integer
//! keys) and by bare integer indexes (its best case: no key to read at all),
//! once with the same key reading and hashing done and discarded, and once
//! without. Without any per-request work, the loop issues the next lookup
//! before the previous one's cache miss returns, so misses overlap: a
//! throughput no server handling real requests sees.
//!
//! Run: `cargo bench -p slidegate --bench side_by_side` (`-- --rounds N`,
//! `-- --only <scenario>` for one of `one_identity`, `keyed_1m`,
//! `two_threads_one_identity`, as when profiling one).

use std::hash::BuildHasher;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use governor::clock::FakeRelativeClock;
use governor::RateLimiter;
use slidegate::{Algorithm, Charge, Limit, ManualClock, MemoryStore, Quota, Request};

mod common;
use common::{identities, scattered, user_42, KeyWriter};

const RATE: u32 = 100_000;
const PER_MS: u64 = 64;

/// A contender: runs `n` decisions starting at step `from`, returns ns per decision.
type Contender<'a> = (&'a str, Box<dyn FnMut(u64, u64) -> f64 + 'a>);

fn timed(n: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs every contender for `slice` decisions per round, `rounds` times,
/// interleaved; prints and returns `(name, median ns)`, the first contender
/// being the reference for the printed ratios.
fn compare(
    scenario: &str,
    rounds: usize,
    slice: u64,
    contenders: &mut [Contender<'_>],
) -> Vec<(String, f64)> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    let mut step = 0;
    for round in 0..=rounds {
        let per: Vec<f64> = contenders.iter_mut().map(|(_, run)| run(step, slice)).collect();
        step += slice;
        if round == 0 {
            continue; // warm-up
        }
        for (c, ns) in per.iter().enumerate() {
            samples[c].push(*ns);
            ratios[c].push(ns / per[0]);
        }
    }
    println!("{scenario}");
    let mut out = Vec::new();
    for (c, (name, _)) in contenders.iter().enumerate() {
        let ns = median(&mut samples[c]);
        let ratio = median(&mut ratios[c]);
        println!("  {name:<40} {ns:>8.1} ns/decision   {ratio:>5.2}× the first");
        out.push((format!("{scenario}/{name}"), ns));
    }
    out
}

fn main() {
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let rounds: usize = arg("--rounds").and_then(|n| n.parse().ok()).unwrap_or(21);
    let only = arg("--only");
    let runs = |scenario: &str| only.as_deref().is_none_or(|o| o == scenario);
    let quota = Quota::per_second(u64::from(RATE)).expect("a valid quota");
    let charge = [Charge::new(Limit::new(Algorithm::SlidingWindowCounter, quota), 1)];
    let gq = governor::Quota::per_second(NonZeroU32::new(RATE).expect("non-zero"));
    let mut all = Vec::new();

    // One identity.
    if runs("one_identity") {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let gclock = FakeRelativeClock::default();
        let governor = RateLimiter::dashmap_with_clock(gq, gclock.clone());
        let (key, user) = ("user:42".to_owned(), user_42());
        let mut contenders: Vec<Contender<'_>> = vec![
            (
                "slidegate sliding_window_counter",
                Box::new(|from, n| {
                    let mut i = from;
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            clock.advance(Duration::from_millis(1));
                        }
                        black_box(store.decide_sync(black_box(Request::new(&user, &charge))).ok());
                    })
                }),
            ),
            (
                "governor dashmap",
                Box::new(|from, n| {
                    let mut i = from;
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            gclock.advance(Duration::from_millis(1));
                        }
                        black_box(governor.check_key(black_box(&key)).ok());
                    })
                }),
            ),
        ];
        all.extend(compare("one_identity", rounds, 2_000_000, &mut contenders));
    }

    // 1,000,000 identities.
    if runs("keyed_1m") {
        let mut keys = KeyWriter::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let gclock = FakeRelativeClock::default();
        let governor = RateLimiter::dashmap_with_clock(gq, gclock.clone());
        let governor_hashed = RateLimiter::dashmap_with_clock(gq, gclock.clone());
        let governor_u64 = RateLimiter::dashmap_with_clock(gq, gclock.clone());
        // What a caller would do to key governor by integers: hash the
        // identity (the same keyed hash slidegate uses internally).
        let hasher = foldhash::quality::RandomState::default();
        let ids = identities();
        for (n, id) in ids.iter().enumerate() {
            let key = keys.key(n).to_owned();
            store.decide_sync(Request::new(id, &charge)).expect("valid request");
            let _ = governor.check_key(&key);
            let _ = governor_hashed.check_key(&hasher.hash_one(&key));
            let _ = governor_u64.check_key(&(n as u64));
        }
        let keys = std::cell::RefCell::new(keys);
        let mut string = String::with_capacity(32);
        let mut contenders: Vec<Contender<'_>> = vec![
            (
                "slidegate sliding_window_counter",
                Box::new(|from, n| {
                    let mut i = from;
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            clock.advance(Duration::from_millis(1));
                        }
                        black_box(store.decide_sync(Request::new(&ids[scattered(i)], &charge)).ok());
                    })
                }),
            ),
            (
                "governor dashmap, same string keys",
                Box::new(|from, n| {
                    let mut i = from;
                    let mut keys = keys.borrow_mut();
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            gclock.advance(Duration::from_millis(1));
                        }
                        string.clear();
                        string.push_str(keys.key(scattered(i)));
                        black_box(governor.check_key(&string).ok());
                    })
                }),
            ),
            (
                "governor dashmap, same keys hashed to u64",
                Box::new(|from, n| {
                    let mut i = from;
                    let mut keys = keys.borrow_mut();
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            gclock.advance(Duration::from_millis(1));
                        }
                        let id = hasher.hash_one(keys.key(scattered(i)));
                        black_box(governor_hashed.check_key(&id).ok());
                    })
                }),
            ),
            (
                "governor dashmap, u64 index keys + same key work",
                Box::new(|from, n| {
                    let mut i = from;
                    let mut keys = keys.borrow_mut();
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            gclock.advance(Duration::from_millis(1));
                        }
                        // The key is read and hashed as for the others, and
                        // then unused: the lookup itself is by index.
                        black_box(hasher.hash_one(keys.key(scattered(i))));
                        black_box(governor_u64.check_key(&(scattered(i) as u64)).ok());
                    })
                }),
            ),
            (
                "governor dashmap, u64 index keys (no key)",
                Box::new(|from, n| {
                    let mut i = from;
                    timed(n, || {
                        i += 1;
                        if i.is_multiple_of(PER_MS) {
                            gclock.advance(Duration::from_millis(1));
                        }
                        black_box(governor_u64.check_key(&(scattered(i) as u64)).ok());
                    })
                }),
            ),
        ];
        all.extend(compare("keyed_1m", rounds, 200_000, &mut contenders));
    }

    // Two threads, one identity: ns per decision of each thread, both at once.
    if runs("two_threads_one_identity") {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let gclock = FakeRelativeClock::default();
        let governor = RateLimiter::dashmap_with_clock(gq, gclock.clone());
        let (key, user) = ("user:42".to_owned(), user_42());
        fn two_threads(n: u64, decide: impl Fn(u64) + Sync) -> f64 {
            let start = Barrier::new(3);
            let began = std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        start.wait();
                        for i in 0..n {
                            decide(i);
                        }
                    });
                }
                start.wait();
                Instant::now()
            });
            began.elapsed().as_nanos() as f64 / n as f64
        }
        let mut contenders: Vec<Contender<'_>> = vec![
            (
                "slidegate sliding_window_counter",
                Box::new(|_, n| {
                    two_threads(n, |i| {
                        if i.is_multiple_of(2 * PER_MS) {
                            clock.advance(Duration::from_millis(1));
                        }
                        black_box(store.decide_sync(Request::new(&user, &charge)).ok());
                    })
                }),
            ),
            (
                "governor dashmap",
                Box::new(|_, n| {
                    two_threads(n, |i| {
                        if i.is_multiple_of(2 * PER_MS) {
                            gclock.advance(Duration::from_millis(1));
                        }
                        black_box(governor.check_key(&key).ok());
                    })
                }),
            ),
        ];
        all.extend(compare("two_threads_one_identity", rounds, 500_000, &mut contenders));
    }

    let json: Vec<String> = all.iter().map(|(n, ns)| format!("{n:?}:{ns:.1}")).collect();
    println!("{{\"rounds\":{rounds},\"median_ns_per_decision\":{{{}}}}}", json.join(","));
}
