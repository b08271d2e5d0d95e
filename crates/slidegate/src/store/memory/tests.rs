//! The embedded store's own tests: exact decisions through its tables, the
//! hot path, holds and sweeps.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::Duration;

use super::*;
use crate::store::Decisions;
use crate::{Algorithm, InvalidRequest, Limit, ManualClock};

fn limit(algorithm: Algorithm, n: u64, ms: u64) -> Limit {
    Limit::new(algorithm, Quota::new(n, Duration::from_millis(ms)).unwrap())
}

/// The identity a test calls `name`.
fn id(name: &str) -> Identity {
    Identity::named("t", name)
}

/// The tests' shorthand for one request: one charge, or several.
impl<C: Clock> MemoryStore<C> {
    fn decide_one_sync(&self, identity: &Identity, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        let outcome = self.decide_sync(Request::new(identity, &[Charge::new(*limit, cost)]))?;
        Ok(outcome.decisions[0])
    }

    fn decide_all_sync(&self, identity: &Identity, pairs: &[(Limit, u64)]) -> Result<Decisions, StoreError> {
        let charges: Vec<Charge> = pairs.iter().map(|&(limit, cost)| Charge::new(limit, cost)).collect();
        Ok(self.decide_sync(Request::new(identity, &charges))?.decisions)
    }
}

#[test]
fn identities_and_limits_are_independent() {
    let store = MemoryStore::with_clock(ManualClock::new(5_000));
    let a = limit(Algorithm::FixedWindow, 1, 1000);
    let b = limit(Algorithm::FixedWindow, 2, 1000);
    assert!(store.decide_one_sync(&id("x"), &a, 1).unwrap().allowed);
    assert!(!store.decide_one_sync(&id("x"), &a, 1).unwrap().allowed);
    assert!(store.decide_one_sync(&id("y"), &a, 1).unwrap().allowed);
    assert!(store.decide_one_sync(&id("x"), &b, 1).unwrap().allowed);
    assert_eq!(store.len(), 3);
}

#[test]
fn decide_all_charges_nothing_when_one_limit_denies() {
    let store = MemoryStore::with_clock(ManualClock::new(5_000));
    let per_second = limit(Algorithm::SlidingWindowCounter, 10, 1000);
    let per_hour = limit(Algorithm::SlidingLog, 2, 3_600_000);
    let both = [(per_second, 1), (per_hour, 1)];
    assert!(store.decide_all_sync(&id("k"), &both).unwrap().iter().all(|d| d.allowed));
    assert!(store.decide_all_sync(&id("k"), &both).unwrap().iter().all(|d| d.allowed));
    let denied = store.decide_all_sync(&id("k"), &both).unwrap();
    assert_eq!((denied[0].allowed, denied[0].remaining), (true, 8));
    assert_eq!((denied[1].allowed, denied[1].remaining), (false, 0));
    // The per-second limit was not charged by the denied request.
    assert_eq!(store.decide_one_sync(&id("k"), &per_second, 1).unwrap().remaining, 7);
}

#[test]
fn invalid_requests_are_errors_naming_the_value() {
    let store = MemoryStore::with_clock(ManualClock::new(0));
    let l = limit(Algorithm::Gcra, 5, 1000);
    let err = store.decide_one_sync(&id("k"), &l, 6).unwrap_err();
    assert_eq!(err.to_string(), "cost 6 exceeds the limit 5: such a request could never be allowed");
    // An empty name is a value like any other: its identity is never empty.
    assert!(store.decide_one_sync(&id(""), &l, 1).unwrap().allowed);
    assert!(matches!(
        store.decide_all_sync(&id("k"), &[]),
        Err(StoreError::Invalid(InvalidRequest::NoLimits))
    ));
    // A sliding log past its cap would let one request allocate gigabytes.
    let huge = limit(Algorithm::SlidingLog, 4_000_000_000, 1000);
    let err = store.decide_one_sync(&id("k"), &huge, 4_000_000_000).unwrap_err();
    assert!(err.to_string().starts_with("sliding_log limits must be at most 10000 "), "{err}");
    let largest = limit(Algorithm::SlidingLog, crate::algorithm::sliding_log::MAX_LIMIT, 1000);
    assert!(store.decide_one_sync(&id("k"), &largest, 3).unwrap().allowed);
}

#[test]
fn denials_and_zero_cost_peeks_store_nothing() {
    let store = MemoryStore::with_clock(ManualClock::new(0));
    for a in Algorithm::ALL {
        let d = store.decide_one_sync(&id("peek"), &limit(a, 5, 1000), 0).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 5), "{a}");
    }
    assert!(store.is_empty());
}

/// The compact tables pack states and sweep on their own schedule, and a
/// repeated identity is decided without the lock; none of it may change
/// a decision. Replays random traces — many identities, or a few asked
/// for in runs (so handles are taken, used, and go stale when tables
/// rebuild), gaps from 0 ms to many windows, limits near the packing
/// bounds — through the store and through the pure functions, and
/// compares every decision.
#[test]
fn packed_tables_decide_exactly_like_the_algorithms() {
    use crate::algorithm::{fixed_window, gcra, sliding_window_counter, token_bucket};
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    // Limits around the packed/plain switch (2^24 for the counter) and a
    // 1 ms window with 16 window bits: packed window numbers wrap every
    // 65,536 windows, so the forced sweeps and the restore are exercised.
    let cases = [(5, 1_000), (100, 60_000), ((1 << 24) - 1, 1), (1 << 24, 1), (3, 1), ((1 << 48) - 1, 1)];
    for ((n, ms), runs) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
        for algorithm in Algorithm::ALL.into_iter().filter(|a| *a != Algorithm::SlidingLog) {
            let l = limit(algorithm, n, ms);
            let clock = ManualClock::new(1_700_000_000_000);
            let store = MemoryStore::with_clock(clock.clone()).with_shards(2);
            let mut plain: HashMap<u64, (u64, u64, u64, u64)> = HashMap::new();
            let mut who = 0;
            for step in 0..20_000 {
                let gap = match next(10) {
                    0..=5 => 0,
                    6 | 7 => next(ms * 2),
                    8 => next(ms * 200_000),
                    _ => ms * 70_000,
                };
                clock.advance(Duration::from_millis(gap));
                let now = clock.now_ms();
                who = match (runs, next(8)) {
                    (false, _) => next(3_000),
                    (true, 0) => next(3),
                    (true, _) => who,
                };
                let cost = next(n.min(4) + 1).min(n);
                let got = store.decide_one_sync(&id(&format!("id-{who}")), &l, cost).unwrap();
                let s = plain.entry(who).or_default();
                let q = l.quota;
                let want = match algorithm {
                    Algorithm::SlidingWindowCounter => {
                        let st = sliding_window_counter::State { window: s.0, cur: s.1, prev: s.2 };
                        let (st, d) = sliding_window_counter::decide(st, now, cost, &q);
                        *s = (st.window, st.cur, st.prev, 0);
                        d
                    }
                    Algorithm::FixedWindow => {
                        let (st, d) = fixed_window::decide(
                            fixed_window::State { window: s.0, count: s.1 },
                            now,
                            cost,
                            &q,
                        );
                        *s = (st.window, st.count, 0, 0);
                        d
                    }
                    Algorithm::TokenBucket => {
                        let (st, d) = token_bucket::decide(
                            token_bucket::State { used: s.0, last_ms: s.1 },
                            now,
                            cost,
                            &q,
                        );
                        *s = (st.used, st.last_ms, 0, 0);
                        d
                    }
                    Algorithm::Gcra => {
                        let (st, d) = gcra::decide(gcra::State { tat_ms: s.0, frac: s.1 }, now, cost, &q);
                        *s = (st.tat_ms, st.frac, 0, 0);
                        d
                    }
                    Algorithm::SlidingLog => unreachable!(),
                };
                assert_eq!(got, want, "{l} step {step} at {now}, identity {who}, cost {cost}");
            }
        }
    }
}

/// A thread that decides for the same identity twice in a row takes a
/// handle and decides its next requests without the shard's lock — here
/// while another thread holds every lock — until a multi-limit decision
/// or a rebuild needs the state under the lock.
#[test]
fn a_repeated_identity_is_decided_while_its_shard_is_locked() {
    let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000)).with_shards(1);
    let l = limit(Algorithm::SlidingWindowCounter, 100, 1000);
    let (locked, done) = (std::sync::Barrier::new(2), std::sync::mpsc::channel());
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(store.decide_one_sync(&id("hot"), &l, 1).unwrap().allowed);
            assert!(store.decide_one_sync(&id("hot"), &l, 1).unwrap().allowed);
            locked.wait();
            locked.wait();
            let decisions: Vec<Decision> =
                (0..99).map(|_| store.decide_one_sync(&id("hot"), &l, 1).unwrap()).collect();
            done.0.send(decisions).unwrap();
        });
        locked.wait();
        let guard = store.shards[0].lock().unwrap();
        locked.wait();
        let decisions = done.1.recv_timeout(Duration::from_secs(30));
        drop(guard);
        let decisions = decisions.expect("decided without the lock");
        assert_eq!(decisions.iter().filter(|d| d.allowed).count(), 98);
        assert_eq!((decisions[97].remaining, decisions[98].allowed), (0, false));
    });
    // The state is exactly where the lock-free decisions left it.
    let all = store.decide_all_sync(&id("hot"), &[(l, 0)]).unwrap();
    assert_eq!((all[0].allowed, all[0].remaining), (true, 0));
}

/// A panic between a multi-limit decision's hold and its release leaves
/// a state frozen in a poisoned shard: decisions under the lock use the
/// held copy, and the next hold ends the old one first.
#[test]
fn a_hold_left_in_place_keeps_the_state_and_ends_at_the_next() {
    let now = 1_700_000_000_000;
    let store = MemoryStore::with_clock(ManualClock::new(now)).with_shards(1);
    let l = limit(Algorithm::SlidingWindowCounter, 10, 1000);
    for _ in 0..3 {
        assert!(store.decide_one_sync(&id("k"), &l, 1).unwrap().allowed);
    }
    let slot = store.identity(&id("k"));
    store.lock(slot).table(&l, now).states.hold(slot, now);
    // This thread's handle finds the state frozen and takes the lock.
    assert_eq!(store.decide_one_sync(&id("k"), &l, 1).unwrap().remaining, 6);
    // Two charges take the multi-limit path: hold, decide, release.
    let peek = limit(Algorithm::FixedWindow, 10, 1000);
    let all = store.decide_all_sync(&id("k"), &[(l, 2), (peek, 0)]).unwrap();
    assert_eq!((all[0].allowed, all[0].remaining), (true, 4));
    // Released: the handle decides again, on the state as it was left.
    assert_eq!(store.decide_one_sync(&id("k"), &l, 1).unwrap().remaining, 3);
    assert_eq!(store.decide_one_sync(&id("k"), &l, 3).unwrap().remaining, 0);
    assert!(!store.decide_one_sync(&id("k"), &l, 1).unwrap().allowed);
}

#[test]
fn a_packed_window_number_never_aliases_after_its_modulus() {
    // 2^24 − 1 per ms leaves 16 window bits: window numbers repeat every
    // 65,536 ms. A state left alone exactly that long must not come back,
    // and a new one must not be mistaken for it.
    for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow] {
        let l = limit(algorithm, (1 << 24) - 1, 1);
        let clock = ManualClock::new(1_700_000_000_000);
        // One shard: both identities share a table.
        let store = MemoryStore::with_clock(clock.clone()).with_shards(1);
        assert!(store.decide_one_sync(&id("k"), &l, (1 << 24) - 1).unwrap().allowed);
        clock.advance(Duration::from_millis(65_536));
        let d = store.decide_one_sync(&id("k"), &l, 1).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, (1 << 24) - 2), "{algorithm}");
        // A state written now shares its truncated window with the old one
        // and must read as this window's, not as the old one's.
        assert!(store.decide_one_sync(&id("other"), &l, (1 << 24) - 1).unwrap().allowed);
        assert!(!store.decide_one_sync(&id("other"), &l, 1).unwrap().allowed, "{algorithm}");
    }
}

#[test]
fn evict_idle_forgets_identities_once_their_state_expired() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    for a in Algorithm::ALL {
        for i in 0..3000 {
            store.decide_one_sync(&id(&format!("id-{i}")), &limit(a, 5, 1000), 1).unwrap();
        }
    }
    assert_eq!(store.evict_idle(), 15_000);
    clock.advance(Duration::from_millis(1999));
    // The sliding window counter still weighs the previous window.
    assert_eq!(store.evict_idle(), 3000);
    clock.advance(Duration::from_millis(1));
    assert_eq!(store.evict_idle(), 0);
}

/// A timer calls the step to give memory back in bounded pieces: each
/// call sweeps exactly the shards it is allowed, in turn, and leaves the
/// others' idle states alone.
#[test]
fn a_sweep_step_sweeps_only_its_bound_of_shards_in_turn() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::with_clock(clock.clone()).with_shards(8);
    let l = limit(Algorithm::FixedWindow, 5, 1000);
    for i in 0..4000 {
        store.decide_one_sync(&id(&format!("id-{i}")), &l, 1).unwrap();
    }
    let per_shard: Vec<usize> =
        store.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len()).collect();
    assert!(per_shard.iter().all(|&n| n > 0), "every shard holds identities: {per_shard:?}");
    // Nothing is idle yet: a step forgets nothing.
    let report = store.evict_idle_step(1);
    assert_eq!(report, SweepReport { shards: 1, forgotten: 0, remaining: per_shard[0] });

    clock.advance(Duration::from_millis(1000));
    // Shard 0 was swept already; the next step takes shard 1 alone.
    let report = store.evict_idle_step(1);
    assert_eq!(report, SweepReport { shards: 1, forgotten: per_shard[1], remaining: 0 });
    assert_eq!(store.len(), 4000 - per_shard[1]);
    // Three at once: shards 2, 3 and 4, nothing else.
    let report = store.evict_idle_step(3);
    let three: usize = per_shard[2..5].iter().sum();
    assert_eq!(report, SweepReport { shards: 3, forgotten: three, remaining: 0 });
    assert_eq!(store.len(), per_shard[0] + per_shard[5..].iter().sum::<usize>());
    // A zero bound does nothing; a bound past the shard count sweeps each
    // shard once, wrapping round to shard 0.
    assert_eq!(store.evict_idle_step(0), SweepReport::default());
    let report = store.evict_idle_step(100);
    assert_eq!((report.shards, report.remaining), (8, 0));
    assert_eq!(report.forgotten, per_shard[0] + per_shard[5..].iter().sum::<usize>());
    assert!(store.is_empty());
}
