//! The embedded store: everything in process, nothing to install.
//!
//! State is split over shards, each behind its own mutex, so threads deciding
//! for different identities rarely meet. An identity is known only by a
//! 64-bit keyed hash of its key (randomly seeded per store): no key string is
//! kept, and a lookup allocates nothing. The shard is picked from the same
//! hash, so every limit of one identity lives in one shard and
//! [`MemoryStore::decide_all_sync`] is atomic under one lock.
//!
//! Idle identities — whose state no longer changes any decision — are swept
//! out as tables grow, and [`MemoryStore::evict_idle`] sweeps and shrinks
//! everything (call it from a timer to give memory back after a burst).

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::algorithm::{fixed_window, gcra, sliding_log, sliding_window_counter, token_bucket};
use crate::store::{validate, Store, StoreError};
use crate::{Algorithm, Clock, Decision, Limit, Quota, SystemClock};

const DEFAULT_SHARDS: usize = 64;
/// A table is not swept before it holds this many identities.
const MIN_SWEEP: usize = 1024;

/// Hashes a key that already is a keyed hash: passes it through.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Map<S> = HashMap<u64, S, BuildHasherDefault<Prehashed>>;

/// The states of one limit, keyed by identity hash.
enum States {
    Counter(Map<sliding_window_counter::State>),
    Fixed(Map<fixed_window::State>),
    Log(Map<sliding_log::Log>),
    Bucket(Map<token_bucket::State>),
    Gcra(Map<gcra::State>),
}

struct Table {
    limit: Limit,
    states: States,
    sweep_at: usize,
}

/// Decides for a copyable state: updates in place, inserts only when the
/// state changed, so denials and unknown identities allocate nothing.
fn step<S: Copy + Default + PartialEq>(
    map: &mut Map<S>,
    id: u64,
    commit: bool,
    f: impl FnOnce(S) -> (S, Decision),
) -> (Decision, bool) {
    match map.get_mut(&id) {
        Some(state) => {
            let (next, decision) = f(*state);
            if commit {
                *state = next;
            }
            (decision, false)
        }
        None => {
            let (next, decision) = f(S::default());
            let insert = commit && next != S::default();
            if insert {
                map.insert(id, next);
            }
            (decision, insert)
        }
    }
}

impl Table {
    fn new(limit: Limit) -> Self {
        let states = match limit.algorithm {
            Algorithm::SlidingWindowCounter => States::Counter(Map::default()),
            Algorithm::FixedWindow => States::Fixed(Map::default()),
            Algorithm::SlidingLog => States::Log(Map::default()),
            Algorithm::TokenBucket => States::Bucket(Map::default()),
            Algorithm::Gcra => States::Gcra(Map::default()),
        };
        Self { limit, states, sweep_at: MIN_SWEEP }
    }

    /// Decides `cost` for identity `id`; charges it only when `commit`.
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        let q = self.limit.quota;
        let (decision, inserted) = match &mut self.states {
            States::Counter(m) => step(m, id, commit, |s| sliding_window_counter::decide(s, now, cost, &q)),
            States::Fixed(m) => step(m, id, commit, |s| fixed_window::decide(s, now, cost, &q)),
            States::Bucket(m) => step(m, id, commit, |s| token_bucket::decide(s, now, cost, &q)),
            States::Gcra(m) => step(m, id, commit, |s| gcra::decide(s, now, cost, &q)),
            States::Log(m) => match m.get_mut(&id) {
                Some(log) if commit => (sliding_log::decide(log, now, cost, &q), false),
                Some(log) => (sliding_log::check(log, now, cost, &q), false),
                None => {
                    let mut log = sliding_log::Log::default();
                    let decision = sliding_log::decide(&mut log, now, cost, &q);
                    let insert = commit && decision.allowed && cost > 0;
                    if insert {
                        m.insert(id, log);
                    }
                    (decision, insert)
                }
            },
        };
        if inserted && self.len() >= self.sweep_at {
            self.sweep(now);
            self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
        }
        decision
    }

    /// Forgets every identity whose state no longer matters and gives back
    /// memory when the table is mostly empty.
    fn sweep(&mut self, now: u64) {
        fn retain<S>(m: &mut Map<S>, idle: impl Fn(&S) -> bool) {
            m.retain(|_, s| !idle(s));
            if m.len() * 4 <= m.capacity() {
                m.shrink_to_fit();
            }
        }
        let q: Quota = self.limit.quota;
        match &mut self.states {
            States::Counter(m) => retain(m, |s| sliding_window_counter::is_idle(s, now, &q)),
            States::Fixed(m) => retain(m, |s| fixed_window::is_idle(s, now, &q)),
            States::Log(m) => retain(m, |s| sliding_log::is_idle(s, now, &q)),
            States::Bucket(m) => retain(m, |s| token_bucket::is_idle(s, now, &q)),
            States::Gcra(m) => retain(m, |s| gcra::is_idle(s, now)),
        }
    }

    fn len(&self) -> usize {
        match &self.states {
            States::Counter(m) => m.len(),
            States::Fixed(m) => m.len(),
            States::Log(m) => m.len(),
            States::Bucket(m) => m.len(),
            States::Gcra(m) => m.len(),
        }
    }
}

#[derive(Default)]
struct Shard {
    /// One table per limit seen; rules rarely have more than a handful.
    tables: Vec<Table>,
}

impl Shard {
    fn table(&mut self, limit: &Limit) -> &mut Table {
        let index = match self.tables.iter().position(|t| t.limit == *limit) {
            Some(i) => i,
            None => {
                self.tables.push(Table::new(*limit));
                self.tables.len() - 1
            }
        };
        &mut self.tables[index]
    }
}

/// The embedded, in-process store. Usable from any thread, with or without an
/// async runtime.
pub struct MemoryStore<C: Clock = SystemClock> {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::quality::RandomState,
    clock: C,
}

impl MemoryStore<SystemClock> {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store on `clock` (a [`crate::ManualClock`] in tests and replays).
    pub fn with_clock(clock: C) -> Self {
        Self {
            shards: (0..DEFAULT_SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::quality::RandomState::default(),
            clock,
        }
    }

    /// The same store split over `shards` locks (at least one).
    pub fn with_shards(mut self, shards: usize) -> Self {
        self.shards = (0..shards.max(1)).map(|_| Mutex::default()).collect();
        self
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The identity hash of `key` and the shard it lives in.
    fn locate(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let id = self.hasher.hash_one(key);
        // Bits 32.. pick the shard; the table uses the low bits for buckets and
        // the top 7 for tags, so the three stay independent.
        let shard = &self.shards[(id >> 32) as usize % self.shards.len()];
        // A panic while holding the lock cannot leave a state half-written
        // (states are replaced whole), so a poisoned shard is still sound.
        (id, shard.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Decides `cost` permits for `key` under `limit` now, charging them when allowed.
    ///
    /// # Errors
    /// [`StoreError::EmptyKey`] or [`StoreError::CostExceedsLimit`].
    pub fn decide_sync(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        validate(key, &[(*limit, cost)])?;
        let now = self.clock.now_ms();
        let (id, mut shard) = self.locate(key);
        Ok(shard.table(limit).decide(id, now, cost, true))
    }

    /// Decides several limits for `key` all-or-nothing; see [`Store::decide_all`].
    ///
    /// # Errors
    /// As [`MemoryStore::decide_sync`], and [`StoreError::NoLimits`].
    pub fn decide_all_sync(&self, key: &str, charges: &[(Limit, u64)]) -> Result<Vec<Decision>, StoreError> {
        validate(key, charges)?;
        let now = self.clock.now_ms();
        let (id, mut shard) = self.locate(key);
        let mut decisions: Vec<Decision> =
            charges.iter().map(|(limit, cost)| shard.table(limit).decide(id, now, *cost, false)).collect();
        if decisions.iter().all(|d| d.allowed) {
            // Same state, same time: committing reproduces each checked
            // decision, now with the charges of the limits before it applied.
            for ((limit, cost), decision) in charges.iter().zip(&mut decisions) {
                *decision = shard.table(limit).decide(id, now, *cost, true);
            }
        } else {
            // Nothing is charged, so a limit that had room reports its
            // remaining permits without this request: a peek at cost 0.
            for ((limit, _), decision) in charges.iter().zip(&mut decisions) {
                if decision.allowed {
                    *decision = shard.table(limit).decide(id, now, 0, false);
                }
            }
        }
        Ok(decisions)
    }

    /// Forgets every identity whose state no longer affects any decision and
    /// gives the memory back. Returns how many states remain.
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now_ms();
        let mut remaining = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for table in &mut shard.tables {
                table.sweep(now);
                table.shrink();
            }
            shard.tables.retain(|t| t.len() > 0);
            shard.tables.shrink_to_fit();
            remaining += shard.tables.iter().map(Table::len).sum::<usize>();
        }
        remaining
    }

    /// How many (identity, limit) states the store holds.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock().unwrap_or_else(PoisonError::into_inner).tables.iter().map(Table::len).sum::<usize>()
            })
            .sum()
    }

    /// Whether the store holds no state at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Table {
    fn shrink(&mut self) {
        match &mut self.states {
            States::Counter(m) => m.shrink_to_fit(),
            States::Fixed(m) => m.shrink_to_fit(),
            States::Log(m) => m.shrink_to_fit(),
            States::Bucket(m) => m.shrink_to_fit(),
            States::Gcra(m) => m.shrink_to_fit(),
        }
        self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn decide(
        &self,
        key: &str,
        limit: &Limit,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.decide_sync(key, limit, cost))
    }

    fn decide_all(
        &self,
        key: &str,
        charges: &[(Limit, u64)],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        std::future::ready(self.decide_all_sync(key, charges))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ManualClock;

    fn limit(algorithm: Algorithm, n: u64, ms: u64) -> Limit {
        Limit::new(algorithm, Quota::new(n, Duration::from_millis(ms)).unwrap())
    }

    #[test]
    fn identities_and_limits_are_independent() {
        let store = MemoryStore::with_clock(ManualClock::new(5_000));
        let a = limit(Algorithm::FixedWindow, 1, 1000);
        let b = limit(Algorithm::FixedWindow, 2, 1000);
        assert!(store.decide_sync("x", &a, 1).unwrap().allowed);
        assert!(!store.decide_sync("x", &a, 1).unwrap().allowed);
        assert!(store.decide_sync("y", &a, 1).unwrap().allowed);
        assert!(store.decide_sync("x", &b, 1).unwrap().allowed);
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn decide_all_charges_nothing_when_one_limit_denies() {
        let store = MemoryStore::with_clock(ManualClock::new(5_000));
        let per_second = limit(Algorithm::SlidingWindowCounter, 10, 1000);
        let per_hour = limit(Algorithm::SlidingLog, 2, 3_600_000);
        let both = [(per_second, 1), (per_hour, 1)];
        assert!(store.decide_all_sync("k", &both).unwrap().iter().all(|d| d.allowed));
        assert!(store.decide_all_sync("k", &both).unwrap().iter().all(|d| d.allowed));
        let denied = store.decide_all_sync("k", &both).unwrap();
        assert_eq!((denied[0].allowed, denied[0].remaining), (true, 8));
        assert_eq!((denied[1].allowed, denied[1].remaining), (false, 0));
        // The per-second limit was not charged by the denied request.
        assert_eq!(store.decide_sync("k", &per_second, 1).unwrap().remaining, 7);
    }

    #[test]
    fn invalid_requests_are_errors_naming_the_value() {
        let store = MemoryStore::with_clock(ManualClock::new(0));
        let l = limit(Algorithm::Gcra, 5, 1000);
        let err = store.decide_sync("k", &l, 6).unwrap_err();
        assert_eq!(err.to_string(), "cost 6 exceeds the limit 5: such a request could never be allowed");
        assert!(matches!(store.decide_sync("", &l, 1), Err(StoreError::EmptyKey)));
        assert!(matches!(store.decide_all_sync("k", &[]), Err(StoreError::NoLimits)));
    }

    #[test]
    fn denials_and_zero_cost_peeks_store_nothing() {
        let store = MemoryStore::with_clock(ManualClock::new(0));
        for a in Algorithm::ALL {
            let d = store.decide_sync("peek", &limit(a, 5, 1000), 0).unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 5), "{a}");
        }
        assert!(store.is_empty());
    }

    #[test]
    fn evict_idle_forgets_identities_once_their_state_expired() {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        for a in Algorithm::ALL {
            for i in 0..3000 {
                store.decide_sync(&format!("id-{i}"), &limit(a, 5, 1000), 1).unwrap();
            }
        }
        assert_eq!(store.evict_idle(), 15_000);
        clock.advance(Duration::from_millis(1999));
        // The sliding window counter still weighs the previous window.
        assert_eq!(store.evict_idle(), 3000);
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.evict_idle(), 0);
    }
}
