//! Bytes per identity in process at 1,000,000 identities, by allocation
//! accounting: a counting global allocator reports what the heap holds before
//! and after one decision for each of 1,000,000 distinct identities (the key
//! strings and identities are made one at a time and not kept by the stores).
//! governor's keyed limiter is measured the same way, with the same string
//! identities and with integer identities.
//!
//! Run: `cargo bench -p slidegate --bench bytes_per_identity`
//! (`-- --identities N` for another count).

use std::alloc::System;
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::sync::Arc;

use cap::Cap;
use governor::clock::FakeRelativeClock;
use governor::RateLimiter;
use slidegate::{Algorithm, Charge, Identity, Limit, ManualClock, MemoryStore, Quota, Request};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// Builds the `i`-th identity key in `buf`, reusing its allocation.
fn key(buf: &mut String, i: usize) -> &str {
    buf.clear();
    let _ = write!(buf, "user:{i}");
    buf
}

/// Heap bytes held by what `build` returns, per identity.
fn per_identity<T>(identities: usize, build: impl FnOnce() -> T) -> (f64, T) {
    let before = ALLOCATOR.allocated();
    let held = build();
    let after = ALLOCATOR.allocated();
    ((after.saturating_sub(before)) as f64 / identities as f64, held)
}

fn main() {
    let mut args = std::env::args().skip_while(|a| a != "--identities").skip(1);
    let identities: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1_000_000);
    // `cargo bench` passes `--bench`; nothing else is expected.
    let quota = Quota::per_minute(100).expect("a valid quota");
    println!("bytes per identity at {identities} identities (heap, counting allocator)");
    let mut rows = Vec::new();
    for algorithm in Algorithm::ALL {
        let charge = [Charge::new(Limit::new(algorithm, quota), 1)];
        let (bytes, store) = per_identity(identities, || {
            let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000));
            let (mut buf, scope) = (String::with_capacity(32), Arc::<str>::from("bench"));
            for i in 0..identities {
                let id = Identity::named(Arc::clone(&scope), key(&mut buf, i));
                store.decide_sync(Request::new(&id, &charge)).expect("valid request");
            }
            store
        });
        assert_eq!(store.len(), identities);
        drop(store);
        rows.push((format!("slidegate {}", algorithm.name()), bytes));
    }
    let governor_quota = governor::Quota::per_minute(NonZeroU32::new(100).expect("non-zero"));
    let (bytes, limiter) = per_identity(identities, || {
        let limiter = RateLimiter::dashmap_with_clock(governor_quota, FakeRelativeClock::default());
        for i in 0..identities {
            let _ = limiter.check_key(&format!("user:{i}"));
        }
        limiter
    });
    drop(limiter);
    rows.push(("governor dashmap, String keys".to_owned(), bytes));
    let (bytes, limiter) = per_identity(identities, || {
        let limiter = RateLimiter::dashmap_with_clock(governor_quota, FakeRelativeClock::default());
        for i in 0..identities {
            let _ = limiter.check_key(&(i as u64));
        }
        limiter
    });
    drop(limiter);
    rows.push(("governor dashmap, u64 keys".to_owned(), bytes));
    for (name, bytes) in &rows {
        println!("{name:<40} {bytes:>8.1} B");
    }
    let json: Vec<String> = rows.iter().map(|(n, b)| format!("{n:?}:{b:.1}")).collect();
    println!("{{\"identities\":{identities},\"bytes_per_identity\":{{{}}}}}", json.join(","));
}
