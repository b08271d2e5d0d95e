//! The conformance cases: one behaviour, asserted with exact values on any
//! store deciding on a `ManualClock`, every store through one macro,
//! `conformance_suite!`: `conformance.rs` runs them on the embedded store
//! and a single `redis-server`, `cluster.rs` on a Redis Cluster,
//! `redis_module.rs` and `cluster_module.rs` on the native module, on one
//! server and on a Cluster. Each case is `async fn(&impl Store, &ManualClock)`.
#![allow(dead_code)] // each test binary runs its own stores

use std::time::Duration;

use slidegate::{Algorithm, Decision, InvalidRequest, Limit, ManualClock, Store, StoreError, Unavailable};

use crate::support::{id, limit, Decide, T0};

mod tables;
pub use tables::*;

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn one<S: Store>(store: &S, key: &str, limit: &Limit, cost: u64) -> Decision {
    store
        .decide_one(&id(key), limit, cost)
        .await
        .unwrap_or_else(|e| panic!("decide {key} {limit} cost {cost}: {e}"))
}

/// Limit 3 per 1000 ms, three single permits from 250 ms into a window: the
/// exact remaining / reset_after of every algorithm, then the denial's
/// retry_after, honest to the millisecond.
pub async fn fills_to_the_limit_with_exact_values<S: Store>(store: &S, clock: &ManualClock) {
    // (algorithm, reset_after after each of the three permits, retry_after of the fourth)
    let expected: [(Algorithm, [u64; 3], u64); 5] = [
        // both windows count: 2 W − elapsed; next window at 334 ms: 3 × 666 ≤ 2 × 1000
        (Algorithm::SlidingWindowCounter, [1750, 1750, 1750], 750 + 334),
        (Algorithm::FixedWindow, [750, 750, 750], 750),
        (Algorithm::SlidingLog, [1000, 1000, 1000], 1000),
        // one token per 333⅓ ms
        (Algorithm::TokenBucket, [334, 667, 1000], 334),
        // T = 333⅓ ms exactly
        (Algorithm::Gcra, [334, 667, 1000], 334),
    ];
    for (algorithm, resets, retry) in expected {
        clock.set(T0 + 250);
        let l = limit(algorithm, 3, 1000);
        let key = format!("fill-{algorithm}");
        for (i, reset) in resets.into_iter().enumerate() {
            let d = one(store, &key, &l, 1).await;
            let want = Decision {
                allowed: true,
                limit: 3,
                remaining: 2 - i as u64,
                reset_after: ms(reset),
                retry_after: None,
            };
            assert_eq!(d, want, "{algorithm}, permit {}", i + 1);
        }
        let denied = one(store, &key, &l, 1).await;
        assert!(!denied.allowed, "{algorithm}");
        assert_eq!(denied.remaining, 0, "{algorithm}");
        assert_eq!(denied.retry_after, Some(ms(retry)), "{algorithm}");

        clock.advance(ms(retry) - MS);
        let still = one(store, &key, &l, 1).await;
        assert_eq!(
            (still.allowed, still.retry_after),
            (false, Some(MS)),
            "{algorithm}: 1 ms before retry_after"
        );
        clock.advance(MS);
        assert!(one(store, &key, &l, 1).await.allowed, "{algorithm}: at retry_after");
    }
}

/// For every algorithm and several costs: waiting exactly `retry_after`
/// passes, 1 ms less is still denied — including waits that span windows.
pub async fn retry_after_is_exact_for_every_algorithm<S: Store>(store: &S, clock: &ManualClock) {
    for algorithm in Algorithm::ALL {
        for (cost, offset) in [(1, 0), (3, 999), (5, 480), (2, 1)] {
            let l = limit(algorithm, 5, 1000);
            let key = format!("retry-{algorithm}-{cost}-{offset}");
            clock.set(T0 + 10_000 + offset);
            // Spread permits over two windows so the counter has both counts.
            assert!(one(store, &key, &l, 3).await.allowed);
            clock.advance(ms(700));
            let _ = one(store, &key, &l, 2).await;
            let mut denied = one(store, &key, &l, cost).await;
            while denied.allowed {
                denied = one(store, &key, &l, cost).await;
            }
            let wait = denied.retry_after.expect("a denial has a retry_after");
            assert!(wait > Duration::ZERO);
            clock.advance(wait - MS);
            let early = one(store, &key, &l, cost).await;
            assert!(!early.allowed, "{algorithm} cost {cost}: passed 1 ms before retry_after {wait:?}");
            assert_eq!(early.retry_after, Some(MS), "{algorithm} cost {cost}");
            clock.advance(MS);
            assert!(
                one(store, &key, &l, cost).await.allowed,
                "{algorithm} cost {cost}: denied at retry_after {wait:?}"
            );
        }
    }
}

/// The counter weighs the previous window by the part still inside the sliding window.
pub async fn counter_weighs_the_previous_window<S: Store>(store: &S, clock: &ManualClock) {
    let l = limit(Algorithm::SlidingWindowCounter, 100, 1000);
    clock.set(T0 + 500);
    assert_eq!(one(store, "weigh", &l, 40).await.remaining, 60);
    clock.set(T0 + 1250);
    // 30 of the 40 still count: 30 + 70 = 100 fits exactly.
    let d = one(store, "weigh", &l, 70).await;
    assert_eq!((d.allowed, d.remaining, d.reset_after), (true, 0, ms(1750)));
    clock.set(T0 + 1251);
    let d = one(store, "weigh", &l, 1).await;
    assert_eq!((d.allowed, d.retry_after), (false, Some(ms(24))));
    clock.set(T0 + 1275);
    assert!(one(store, "weigh", &l, 1).await.allowed);
}

/// A denial whose wait ends as the next window starts: the current count
/// alone leaves room there, so retry_after is the rest of this window.
pub async fn counter_retry_when_the_current_count_alone_leaves_room<S: Store>(
    store: &S,
    clock: &ManualClock,
) {
    let l = limit(Algorithm::SlidingWindowCounter, 6, 3);
    let start = T0 + 1; // a multiple of 3
    clock.set(start);
    assert!(one(store, "room", &l, 4).await.allowed);
    clock.set(start + 3);
    // 4 × 3 ≤ (6 − 1) × 3: one more fits beside the previous window's four.
    assert!(one(store, "room", &l, 1).await.allowed);
    let d = one(store, "room", &l, 4).await;
    assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 1, Some(ms(3))));
    clock.set(start + 5);
    assert_eq!(one(store, "room", &l, 4).await.retry_after, Some(MS));
    clock.set(start + 6);
    assert!(one(store, "room", &l, 4).await.allowed);
}

/// Limits beyond 32 bits count exactly (the Redis store packs larger states
/// for them). The sliding log is left out: it would hold billions of entries.
pub async fn huge_limits_count_exactly<S: Store>(store: &S, clock: &ManualClock) {
    let huge = (1u64 << 33) + 7;
    clock.set(T0 + 1);
    for algorithm in Algorithm::ALL.into_iter().filter(|a| *a != Algorithm::SlidingLog) {
        let l = limit(algorithm, huge, 1000);
        let d = one(store, "huge", &l, huge - 3).await;
        assert_eq!((d.allowed, d.remaining), (true, 3), "{algorithm}");
        let d = one(store, "huge", &l, 4).await;
        assert_eq!((d.allowed, d.remaining), (false, 3), "{algorithm}");
        let d = one(store, "huge", &l, 3).await;
        assert_eq!((d.allowed, d.remaining), (true, 0), "{algorithm}");
        assert!(!one(store, "huge", &l, 1).await.allowed, "{algorithm}");
    }
}

/// Window numbers past 2^32 (1 ms windows today, 1 s windows in 2106) and
/// the step from window 2^32 − 1 to 2^32 keep their meaning.
pub async fn window_numbers_past_32_bits<S: Store>(store: &S, clock: &ManualClock) {
    let w = 1000;
    let boundary = (1u64 << 32) * w;
    let counter = limit(Algorithm::SlidingWindowCounter, 4, w);
    let fixed = limit(Algorithm::FixedWindow, 4, w);
    clock.set(boundary - 500);
    assert_eq!(one(store, "wrap", &counter, 3).await.remaining, 1);
    assert_eq!(one(store, "wrap", &fixed, 3).await.remaining, 1);
    clock.set(boundary + 250);
    // 3 × 750 / 1000 of the previous window still counts: 2.25, rounded up for remaining.
    let d = one(store, "wrap", &counter, 1).await;
    assert_eq!((d.allowed, d.remaining, d.reset_after), (true, 0, ms(1750)));
    assert_eq!(one(store, "wrap", &fixed, 1).await.remaining, 3);
    clock.set(boundary + w + 500);
    // Window 2^32's one permit is now the previous window's, half inside.
    assert_eq!(one(store, "wrap", &counter, 0).await.remaining, 3);
    clock.set(boundary + 2 * w);
    assert_eq!(one(store, "wrap", &counter, 0).await.remaining, 4);
}

/// The source article's boundary burst: 100 in the last 100 ms of a minute,
/// 100 in the first 100 ms of the next.
pub async fn boundary_burst<S: Store>(store: &S, clock: &ManualClock) {
    let minute = 60_000;
    let start = (T0 / minute + 1) * minute - 100;
    for (algorithm, expected) in [
        (Algorithm::FixedWindow, 200),
        (Algorithm::SlidingWindowCounter, 100),
        (Algorithm::SlidingLog, 100),
        (Algorithm::TokenBucket, 100),
        (Algorithm::Gcra, 100),
    ] {
        let l = limit(algorithm, 100, minute);
        let mut allowed = 0;
        for t in start..start + 200 {
            clock.set(t);
            allowed += u64::from(one(store, "burst", &l, 1).await.allowed);
        }
        assert_eq!(allowed, expected, "{algorithm}");
    }
}

/// After the state stops mattering, an identity starts over with the full limit.
pub async fn idle_identities_start_over<S: Store>(store: &S, clock: &ManualClock) {
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 4, 1000);
        clock.set(T0 + 100);
        assert!(one(store, "idle", &l, 4).await.allowed);
        assert!(!one(store, "idle", &l, 1).await.allowed);
        clock.advance(ms(2000));
        let d = one(store, "idle", &l, 1).await;
        assert_eq!((d.allowed, d.remaining), (true, 3), "{algorithm}");
    }
}

/// Cost 0 peeks: allowed, reports the state, charges nothing; cost = limit
/// passes on a fresh identity.
pub async fn zero_cost_peeks_and_whole_limit_costs<S: Store>(store: &S, clock: &ManualClock) {
    clock.set(T0 + 400);
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 6, 1000);
        let d = one(store, "peek", &l, 0).await;
        assert_eq!((d.allowed, d.remaining, d.reset_after), (true, 6, Duration::ZERO), "{algorithm}");
        assert_eq!(one(store, "peek", &l, 2).await.remaining, 4, "{algorithm}");
        assert_eq!(one(store, "peek", &l, 0).await.remaining, 4, "{algorithm}");
        assert_eq!(one(store, "peek", &l, 0).await.remaining, 4, "{algorithm}");
        let whole = one(store, "whole", &l, 6).await;
        assert_eq!((whole.allowed, whole.remaining), (true, 0), "{algorithm}");
    }
}

/// Invalid requests are errors before any state is touched.
pub async fn invalid_requests_are_errors<S: Store>(store: &S, clock: &ManualClock) {
    clock.set(T0);
    let l = limit(Algorithm::Gcra, 5, 1000);
    match store.decide_one(&id("k"), &l, 6).await {
        Err(StoreError::Invalid(InvalidRequest::CostExceedsLimit { cost: 6, limit: 5 })) => {}
        other => panic!("cost 6 over limit 5 gave {other:?}"),
    }
    // An empty name is a value like any other: its identity is never empty.
    assert!(store.decide_one(&id(""), &l, 1).await.expect("an empty name decides").allowed);
    assert!(matches!(
        store.decide_all(&id("k"), &[]).await,
        Err(StoreError::Invalid(InvalidRequest::NoLimits))
    ));
    assert!(
        matches!(store.decide_all(&id("k"), &[(l, 1), (l, 2)]).await, Err(StoreError::Invalid(InvalidRequest::DuplicateLimit(d))) if d == l)
    );
    let other = limit(Algorithm::FixedWindow, 2, 1000);
    assert!(matches!(
        store.decide_all(&id("k"), &[(l, 1), (other, 3)]).await,
        Err(StoreError::Invalid(InvalidRequest::CostExceedsLimit { cost: 3, limit: 2 }))
    ));
    // Nothing was charged by the failed calls.
    assert_eq!(one(store, "k", &l, 0).await.remaining, 5);
    assert_eq!(one(store, "k", &other, 0).await.remaining, 2);
}

/// decide_all charges every limit or none; on a denial, limits with room
/// report their state without this request.
pub async fn decide_all_is_all_or_nothing<S: Store>(store: &S, clock: &ManualClock) {
    clock.set(T0 + 100);
    let per_second = limit(Algorithm::SlidingWindowCounter, 10, 1000);
    let per_hour = limit(Algorithm::SlidingLog, 2, 3_600_000);
    let bucket = limit(Algorithm::TokenBucket, 5, 1000);
    let gcra = limit(Algorithm::Gcra, 8, 1000);
    let fixed = limit(Algorithm::FixedWindow, 9, 1000);
    let all = [(per_second, 1), (per_hour, 1), (bucket, 2), (gcra, 1), (fixed, 3)];

    let first = store.decide_all(&id("multi"), &all).await.expect("decide_all");
    let remaining: Vec<u64> = first.iter().map(|d| d.remaining).collect();
    assert!(first.iter().all(|d| d.allowed));
    assert_eq!(remaining, [9, 1, 3, 7, 6]);
    assert_eq!(first[1].reset_after, ms(3_600_000));

    let second = store.decide_all(&id("multi"), &all).await.expect("decide_all");
    assert!(second.iter().all(|d| d.allowed));
    assert_eq!(second.iter().map(|d| d.remaining).collect::<Vec<_>>(), [8, 0, 1, 6, 3]);

    clock.advance(ms(10));
    let denied = store.decide_all(&id("multi"), &all).await.expect("decide_all");
    let got: Vec<(bool, u64)> = denied.iter().map(|d| (d.allowed, d.remaining)).collect();
    // The log denies, and so does the bucket: 10 ms refilled 0.05 token, 1.05
    // are there, 2 are asked. The others report remaining as a cost-0 peek would.
    assert_eq!(got, [(true, 8), (false, 0), (false, 1), (true, 6), (true, 3)]);
    assert_eq!(denied[1].retry_after, Some(ms(3_600_000 - 10)));
    // 0.95 token missing at 5 per second.
    assert_eq!(denied[2].retry_after, Some(ms(190)));
    assert!(denied.iter().enumerate().all(|(i, d)| (i == 1 || i == 2) == d.retry_after.is_some()));

    // Nothing was charged by the denied call.
    assert_eq!(one(store, "multi", &per_second, 0).await.remaining, 8);
    assert_eq!(one(store, "multi", &bucket, 1).await.remaining, 0);
    assert_eq!(one(store, "multi", &gcra, 1).await.remaining, 5);
    assert_eq!(one(store, "multi", &fixed, 3).await.remaining, 0);

    // Two denials: each reports its own retry_after.
    let both = store
        .decide_all(&id("multi"), &[(per_hour, 1), (fixed, 1), (per_second, 1)])
        .await
        .expect("decide_all");
    assert_eq!(both.iter().map(|d| d.allowed).collect::<Vec<_>>(), [false, false, true]);
    assert_eq!(both[1].retry_after, Some(ms(890)));
    assert_eq!(both[2].remaining, 8);
}

/// decide_all over the algorithms the native Redis module decides itself
/// (a sliding log among the limits sends the call to the script): the same
/// all-or-nothing charging and the same reports of the limits with room.
pub async fn decide_all_without_a_log_is_all_or_nothing<S: Store>(store: &S, clock: &ManualClock) {
    clock.set(T0 + 100);
    let per_second = limit(Algorithm::SlidingWindowCounter, 10, 1000);
    let bucket = limit(Algorithm::TokenBucket, 5, 1000);
    let gcra = limit(Algorithm::Gcra, 8, 1000);
    let fixed = limit(Algorithm::FixedWindow, 9, 1000);
    let all = [(per_second, 1), (bucket, 2), (gcra, 1), (fixed, 3)];

    let first = store.decide_all(&id("multi"), &all).await.expect("decide_all");
    assert!(first.iter().all(|d| d.allowed && d.retry_after.is_none()));
    assert_eq!(first.iter().map(|d| d.remaining).collect::<Vec<_>>(), [9, 3, 7, 6]);
    assert_eq!(first[3].reset_after, ms(900));
    let second = store.decide_all(&id("multi"), &all).await.expect("decide_all");
    assert_eq!(second.iter().map(|d| d.remaining).collect::<Vec<_>>(), [8, 1, 6, 3]);

    clock.advance(ms(10));
    let denied = store.decide_all(&id("multi"), &all).await.expect("decide_all");
    let got: Vec<(bool, u64)> = denied.iter().map(|d| (d.allowed, d.remaining)).collect();
    // The bucket holds 1.05 tokens and 2 are asked; the others report what
    // a cost-0 peek would.
    assert_eq!(got, [(true, 8), (false, 1), (true, 6), (true, 3)]);
    assert_eq!(denied.iter().map(|d| d.retry_after).collect::<Vec<_>>(), [None, Some(ms(190)), None, None]);

    // Nothing was charged by the denied call.
    assert_eq!(one(store, "multi", &per_second, 0).await.remaining, 8);
    assert_eq!(one(store, "multi", &bucket, 1).await.remaining, 0);
    assert_eq!(one(store, "multi", &gcra, 1).await.remaining, 5);
    assert_eq!(one(store, "multi", &fixed, 3).await.remaining, 0);

    // Two denials, each with its own retry_after; the counter had room.
    let both = store
        .decide_all(&id("multi"), &[(bucket, 1), (fixed, 1), (per_second, 1)])
        .await
        .expect("decide_all");
    assert_eq!(both.iter().map(|d| d.allowed).collect::<Vec<_>>(), [false, false, true]);
    assert_eq!(both[0].retry_after, Some(ms(190)));
    assert_eq!(both[1].retry_after, Some(ms(890)));
    assert_eq!(both[2].remaining, 8);
    // At the retry time the bucket and the window allow, charging once each.
    clock.advance(ms(890));
    let later = store
        .decide_all(&id("multi"), &[(bucket, 1), (fixed, 1), (per_second, 1)])
        .await
        .expect("decide_all");
    assert!(later.iter().all(|d| d.allowed), "{later:?}");
    assert_eq!(later[1].remaining, 8);
}

/// State is per identity and per limit.
pub async fn identities_and_limits_are_independent<S: Store>(store: &S, clock: &ManualClock) {
    clock.set(T0);
    for algorithm in Algorithm::ALL {
        let a = limit(algorithm, 1, 1000);
        let b = limit(algorithm, 2, 1000);
        let c = limit(algorithm, 1, 2000);
        assert!(one(store, "x", &a, 1).await.allowed);
        assert!(!one(store, "x", &a, 1).await.allowed, "{algorithm}");
        assert!(one(store, "y", &a, 1).await.allowed, "{algorithm}: another identity");
        assert!(one(store, "x", &b, 1).await.allowed, "{algorithm}: another limit");
        assert!(one(store, "x", &c, 1).await.allowed, "{algorithm}: another window");
        // Identities that look like hash tags or key separators are just identities.
        for odd in ["}x", "{x", "x}", "x}:swc:1:1000", "{}"] {
            assert!(one(store, odd, &a, 1).await.allowed, "{algorithm}: {odd:?}");
            assert!(!one(store, odd, &a, 1).await.allowed, "{algorithm}: {odd:?}");
        }
    }
    let l = limit(Algorithm::FixedWindow, 1, 1000);
    assert!(one(store, "x", &l, 0).await.allowed);
}

/// A clock that steps back across a window boundary (a failover to a Redis
/// whose clock is behind) forgets no permit, and the wait it reports is still
/// exact to the millisecond.
pub async fn a_clock_stepping_back_forgets_nothing<S: Store>(store: &S, clock: &ManualClock) {
    // (algorithm, retry_after at 200 ms before the permits were stamped)
    let expected = [
        // as at the start of window 5: next window at 334 ms, plus the 100 ms step
        (Algorithm::SlidingWindowCounter, 1434),
        (Algorithm::FixedWindow, 1100),
        (Algorithm::SlidingLog, 1200),
        // refills from the stamp at 5100, one token per 333⅓ ms
        (Algorithm::TokenBucket, 534),
        (Algorithm::Gcra, 534),
    ];
    for (algorithm, retry) in expected {
        let l = limit(algorithm, 3, 1000);
        let key = format!("step-back-{algorithm}");
        clock.set(T0 + 5_100);
        assert!(one(store, &key, &l, 3).await.allowed, "{algorithm}");
        clock.set(T0 + 4_900);
        let d = one(store, &key, &l, 1).await;
        assert_eq!((d.allowed, d.remaining), (false, 0), "{algorithm}: the three permits still count");
        assert_eq!(d.retry_after, Some(ms(retry)), "{algorithm}");
        clock.advance(ms(retry) - MS);
        assert!(!one(store, &key, &l, 1).await.allowed, "{algorithm}: 1 ms before retry_after");
        clock.advance(MS);
        assert!(one(store, &key, &l, 1).await.allowed, "{algorithm}: at retry_after");
    }
}

/// The packed layout keeps a window's counts in that window's hash, found
/// by the time each call gives: a clock that steps back across a window
/// boundary decides on the windows of its own time and does not see the
/// later window's permits (it fails toward admitting, by at most what the
/// later window counted); when the clock is back, that window's count and
/// the earlier window's (now its previous) both weigh. The algorithms it
/// does not pack forget nothing, as in the per-key layout.
pub async fn packed_windows_follow_the_clock_they_are_given<S: Store>(store: &S, clock: &ManualClock) {
    for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
        let l = limit(algorithm, 3, 1000);
        let key = format!("step-back-{algorithm}");
        clock.set(T0 + 5_100);
        assert!(one(store, &key, &l, 3).await.allowed, "{algorithm}");
        assert!(!one(store, &key, &l, 1).await.allowed, "{algorithm}: full in window 5");
        clock.set(T0 + 4_900);
        let d = one(store, &key, &l, 1).await;
        assert_eq!((d.allowed, d.remaining), (true, 2), "{algorithm}: window 4 holds nothing yet");
        clock.set(T0 + 5_100);
        let d = one(store, &key, &l, 1).await;
        assert!(!d.allowed, "{algorithm}: window 5 still holds its three");
        assert_eq!(d.remaining, 0, "{algorithm}");
    }
    // Counted in window 5 with window 4's one as the previous: 3 + 1 × 0.9.
    let l = limit(Algorithm::SlidingWindowCounter, 3, 1000);
    let d = store.decide_one(&id("step-back-sliding_window_counter"), &l, 0).await.expect("peek");
    assert_eq!(d.retry_after, None);
    assert_eq!(d.reset_after, ms(1_900));
    for algorithm in [Algorithm::SlidingLog, Algorithm::TokenBucket, Algorithm::Gcra] {
        let l = limit(algorithm, 3, 1000);
        let key = format!("step-back-{algorithm}");
        clock.set(T0 + 5_100);
        assert!(one(store, &key, &l, 3).await.allowed, "{algorithm}");
        clock.set(T0 + 4_900);
        assert!(!one(store, &key, &l, 1).await.allowed, "{algorithm}: the three permits still count");
    }
}

/// GCRA keeps rates finer than a permit per µs exactly (an emission interval
/// rounded up to a whole µs would make 10,000 per ms sustain 1,000):
/// 10,000 per 1 ms admits exactly 10,000 in a burst and 10,000 more every ms.
pub async fn gcra_sustains_rates_finer_than_a_microsecond<S: Store>(store: &S, clock: &ManualClock) {
    let l = limit(Algorithm::Gcra, 10_000, 1);
    clock.set(T0);
    let d = one(store, "fine", &l, 10_000).await;
    assert_eq!((d.allowed, d.remaining, d.reset_after), (true, 0, ms(1)));
    assert_eq!(one(store, "fine", &l, 1).await.retry_after, Some(MS));
    for _ in 0..50 {
        clock.advance(MS);
        let d = one(store, "fine", &l, 10_000).await;
        assert_eq!((d.allowed, d.remaining), (true, 0), "a whole ms refills all 10,000");
        assert!(!one(store, "fine", &l, 1).await.allowed, "and not one more");
    }
    // One by one: exactly 10,000 fit at one instant after a refill.
    clock.advance(MS);
    let mut allowed = 0;
    for _ in 0..10_001 {
        allowed += u64::from(one(store, "fine", &l, 1).await.allowed);
    }
    assert_eq!(allowed, 10_000);
    // The largest rate a quota allows, 2^50 per 8 ms: half a window refills half.
    let max = limit(Algorithm::Gcra, slidegate::MAX_LIMIT, 8);
    assert!(one(store, "max", &max, slidegate::MAX_LIMIT).await.allowed);
    clock.advance(ms(4));
    assert!(one(store, "max", &max, slidegate::MAX_LIMIT / 2).await.allowed);
    let d = one(store, "max", &max, 1).await;
    assert_eq!((d.allowed, d.retry_after, d.reset_after), (false, Some(MS), ms(8)));
}

/// A clock past the end of year 9999 is refused with an error naming the
/// time, on every algorithm, before any arithmetic (such a time overflows in
/// debug builds, wraps in release, and fails GCRA's script in Lua).
pub async fn times_out_of_range_are_errors<S: Store>(store: &S, clock: &ManualClock) {
    use slidegate::store::MAX_TIME_MS;
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm, 5, 1000);
        clock.set(MAX_TIME_MS);
        assert!(one(store, "late", &l, 5).await.allowed, "{algorithm} at the last supported ms");
        for bad in [MAX_TIME_MS + 1, 18_000_000_000_000_000, u64::MAX] {
            clock.set(bad);
            let err = store.decide_one(&id("late"), &l, 1).await.expect_err("out of range");
            assert!(
                matches!(err, StoreError::Unavailable(Unavailable::TimeOutOfRange { now_ms }) if now_ms == bad),
                "{algorithm}: {err}"
            );
            assert!(err.to_string().contains(&bad.to_string()), "{err}");
            let other = limit(algorithm, 6, 1000);
            let err = store.decide_all(&id("late"), &[(l, 1), (other, 1)]).await.expect_err("out of range");
            assert!(
                matches!(err, StoreError::Unavailable(Unavailable::TimeOutOfRange { .. })),
                "{algorithm}: {err}"
            );
        }
    }
}

/// The conformance suite on one store: `conformance_suite!(name, |clock,
/// case| setup)` makes `mod name` with a `#[tokio::test]` per case. In each,
/// `clock` is a fresh `ManualClock` at `T0`, `case` the case's name (for a
/// key prefix), and `setup` (which may `.await`) gives `(guard, store)`: the
/// store the case runs on, deciding on `clock`, and what must live as long
/// as the test (its server, or `()`). Every store runs this one list; a new
/// store joins it with one call.
macro_rules! conformance_suite {
    ($suite:ident, |$clock:ident, $case_name:ident| $setup:expr) => {
        conformance_suite!($suite, [a_clock_stepping_back_forgets_nothing], |$clock, $case_name| $setup);
    };
    // A store whose own contract differs in one place (the packed layout
    // under a clock that steps back) names its own cases for it.
    ($suite:ident, [$($own:ident),*], |$clock:ident, $case_name:ident| $setup:expr) => {
        conformance_suite!(@cases $suite, |$clock, $case_name| $setup;
            fills_to_the_limit_with_exact_values,
            retry_after_is_exact_for_every_algorithm,
            counter_weighs_the_previous_window,
            huge_limits_count_exactly,
            window_numbers_past_32_bits,
            counter_retry_when_the_current_count_alone_leaves_room,
            boundary_burst,
            idle_identities_start_over,
            zero_cost_peeks_and_whole_limit_costs,
            invalid_requests_are_errors,
            decide_all_is_all_or_nothing,
            decide_all_without_a_log_is_all_or_nothing,
            identities_and_limits_are_independent,
            gcra_sustains_rates_finer_than_a_microsecond,
            times_out_of_range_are_errors,
            shared_tables_expire_replace_and_delete,
            shared_tables_refuse_what_is_out_of_bounds,
            shared_tables_are_bounded,
            a_lift_forgets_the_penalty_box,
            $($own),*
        );
    };
    (@cases $suite:ident, |$clock:ident, $case_name:ident| $setup:expr; $($case:ident),* $(,)?) => {
        mod $suite {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let $clock = slidegate::ManualClock::new(crate::support::T0);
                    let $case_name = stringify!($case);
                    let (_guard, store) = $setup;
                    crate::conformance_cases::$case(&store, &$clock).await;
                }
            )*
        }
    };
}
