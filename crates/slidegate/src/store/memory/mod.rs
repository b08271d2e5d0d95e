//! The embedded store: everything in process, nothing to install.
//!
//! State is split over shards, each behind its own mutex, so threads deciding
//! for different identities rarely meet. An identity is known only by a
//! 64-bit keyed hash of its key (randomly seeded per store): no key string is
//! kept, and a lookup allocates nothing. The shard is picked from the same
//! hash, so every limit of one identity lives in one shard and
//! [`MemoryStore::decide_sync`] is atomic under one lock.
//!
//! Every algorithm but the sliding log keeps its state in a compact table of
//! `(identity hash, state)` slots, the window-based ones packed into one
//! `u64` (see `packing.rs`): 16 bytes a slot, 20–30 bytes per identity at
//! any count, so a million identities under the sliding window counter cost
//! about 21 MB. Packing only changes how a state is stored; the algorithms
//! decide on the unpacked state, so decisions are the same.
//!
//! A hot identity — one thread deciding for it again and again, as for an
//! attacked endpoint — skips the shard's lock: after two decisions in a row
//! under the lock, the thread keeps a handle on the identity's slot and
//! decides by one compare-and-swap on its packed state (sliding window
//! counter only; see `hot.rs`). The lock stays for inserts, sweeps and
//! multi-limit decisions, which freeze the states they need (see
//! `shared_slots.rs` for the protocol).
//!
//! Idle identities — whose state no longer changes any decision — are swept
//! out as tables grow, and [`MemoryStore::evict_idle`] sweeps and shrinks
//! everything. A table that stops growing is otherwise never swept (a state
//! idle now counts again if the clock steps back before its window ends),
//! so a long-running process should call
//! [`MemoryStore::evict_idle_step`] from a timer: it sweeps a bounded number
//! of shards per call, round-robin, and gives memory back after a burst
//! without ever holding more than one shard's lock for one shard's work.

mod counter_table;
mod hot;
mod kept;
mod logs;
mod packing;
mod shard;
mod shared_slots;
mod shared_table;
mod slots;
mod snapshot;
mod tables;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use self::shard::{decide_locked, decide_penalized, Shard};
use self::shared_table::Tables;
use self::slots::slot_id;
use crate::distinct::DistinctTable;
use crate::store::joint::{self, JointStore, Part};
use crate::store::{
    check_charge, check_time, lease, validate, Charge, DistinctStore, GiveBack, Lease, LeaseStore, Outcome,
    Request, SharedTables, Store, StoreError, TableEntry, TableName,
};
use crate::{Clock, Decision, Identity, InvalidRequest, Quota, SystemClock};

pub use self::snapshot::{Corruption, SnapshotError, SnapshotReport};

const DEFAULT_SHARDS: usize = 64;

/// What one [`MemoryStore::evict_idle_step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SweepReport {
    /// How many shards were swept: at most the bound asked for, and at most
    /// the store's shard count.
    pub shards: usize,
    /// How many (identity, limit) states those shards forgot.
    pub forgotten: usize,
    /// How many states those shards still hold.
    pub remaining: usize,
}

/// The embedded, in-process store. Usable from any thread, with or without an
/// async runtime.
pub struct MemoryStore<C: Clock = SystemClock> {
    /// Names this store's tables in threads' handles (`hot.rs`); never reused.
    uid: u64,
    shards: Box<[Mutex<Shard>]>,
    /// Keys `hasher`: drawn at random, and kept in a snapshot so that a
    /// restored store finds each identity where the snapshot's put it.
    seed: u64,
    hasher: foldhash::quality::FixedState,
    clock: C,
    /// The shard [`MemoryStore::evict_idle_step`] sweeps next.
    next_sweep: AtomicUsize,
    /// Distinct-value sketches ([`DistinctStore::decide_distinct`]).
    distinct: DistinctTable,
    /// Shared tables ([`SharedTables`]).
    tables: Tables,
}

/// A store id no store has had before.
fn next_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A seed for a store's identity hasher: the standard library's random
/// keys (drawn from the operating system), so no process can predict it.
fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(next_uid())
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
        let seed = random_seed();
        Self {
            uid: next_uid(),
            shards: (0..DEFAULT_SHARDS).map(|_| Mutex::default()).collect(),
            seed,
            hasher: foldhash::quality::FixedState::with_seed(seed),
            clock,
            next_sweep: AtomicUsize::new(0),
            distinct: DistinctTable::default(),
            tables: Tables::default(),
        }
    }

    /// The same store split over `shards` locks (at least one).
    pub fn with_shards(mut self, shards: usize) -> Self {
        self.shards = (0..shards.max(1)).map(|_| Mutex::default()).collect();
        // Handles on the old shards' tables must not match the new ones.
        self.uid = next_uid();
        self
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The table id of `identity`: its scope and digest under this store's seed.
    #[inline]
    fn identity(&self, identity: &Identity) -> u64 {
        slot_id(self.hasher.hash_one(identity.folded()))
    }

    /// [`JointStore::decide_joint`], answered at once.
    ///
    /// # Errors
    /// As [`JointStore::decide_joint`], and [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange)
    /// when the clock reads past [`crate::store::MAX_TIME_MS`].
    pub fn decide_joint_sync(&self, parts: &[Part<'_>]) -> Result<Vec<Outcome>, StoreError> {
        joint::validate_parts(parts)?;
        let now = check_time(self.clock.now_ms())?;
        let ids: Vec<u64> = parts.iter().map(|p| self.identity(p.identity)).collect();
        let mut order: Vec<usize> = ids.iter().map(|&id| self.shard_index(id)).collect();
        order.sort_unstable();
        order.dedup();
        let at: Vec<usize> =
            ids.iter().map(|&id| order.binary_search(&self.shard_index(id)).unwrap_or_default()).collect();
        // As in `lock`: a poisoned shard is still sound.
        let mut locked: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| self.shards[i].lock().unwrap_or_else(PoisonError::into_inner)).collect();
        Ok(shard::decide_joint_locked(&mut locked, &at, &ids, parts, now))
    }

    fn shard_index(&self, id: u64) -> usize {
        (id >> 32) as usize % self.shards.len()
    }

    /// The shard identity `id` lives in, locked.
    fn lock(&self, id: u64) -> MutexGuard<'_, Shard> {
        // Bits 32.. pick the shard; compact tables start probing from the
        // high bits, the sliding log's map uses the low bits for buckets and
        // the top 7 for tags: the choices stay independent.
        let shard = &self.shards[self.shard_index(id)];
        // A panic while holding the lock cannot leave a state half-written
        // (states are replaced whole; a state left frozen is thawed by the
        // next hold or rebuild), so a poisoned shard is still sound.
        shard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides `request` now; see [`Store::decide`]. The embedded store
    /// answers at once, so it needs no runtime.
    ///
    /// A single charge without a penalty, for the identity this thread
    /// decided last, is one compare-and-swap on its slot (`hot.rs`); the
    /// rest decides under the identity's shard lock, the penalty's
    /// arithmetic ([`crate::PenaltyState`]) with it.
    ///
    /// # Errors
    /// [`InvalidRequest::NoLimits`], [`InvalidRequest::DuplicateLimit`],
    /// [`InvalidRequest::CostExceedsLimit`], [`InvalidRequest::SlidingLogTooLarge`],
    /// or [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange) when the clock reads past
    /// [`crate::store::MAX_TIME_MS`].
    pub fn decide_sync(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        let now = check_time(self.clock.now_ms())?;
        let id = self.identity(request.identity);
        match (request.charges, request.penalty) {
            ([charge], None) => self.decide_one(id, now, charge).map(Outcome::decided),
            (charges, None) => {
                validate(charges)?;
                Ok(Outcome::decided(decide_locked(&mut self.lock(id), id, now, charges)))
            }
            (charges, Some(penalty)) => {
                validate(charges)?;
                Ok(decide_penalized(&mut self.lock(id), id, now, charges, penalty))
            }
        }
    }

    /// One charge without a penalty: the hot identity's path when it is one.
    fn decide_one(&self, id: u64, now: u64, charge: &Charge) -> Result<Decision, StoreError> {
        check_charge(&charge.limit, charge.cost)?;
        if let Some(decision) = hot::decide(self.uid, id, &charge.limit, now, charge.cost) {
            return Ok(decision);
        }
        let mut shard = self.lock(id);
        let table = shard.table(&charge.limit, now);
        let decision = table.decide(id, now, charge.cost, true);
        if hot::repeated(self.uid, id) {
            if let Some(handle) = table.states.handle(id) {
                hot::hold(self.uid, id, charge.limit, handle);
            }
        }
        Ok(decision)
    }

    /// Forgets every identity whose state no longer affects any decision and
    /// gives the memory back. Returns how many states remain.
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now_ms();
        hot::forget(self.uid);
        self.distinct.sweep(now);
        self.tables.sweep(now);
        self.shards.iter().map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).sweep(now)).sum()
    }

    /// Sweeps the next `max_shards` shards (round-robin over calls) as
    /// [`MemoryStore::evict_idle`] sweeps all of them: forgets their idle
    /// states and gives the memory back.
    ///
    /// The bound: one call visits at most `max_shards` shards (none for 0,
    /// each at most once), locks one at a time, and in each rebuilds its
    /// tables once — work proportional to the states those shards hold,
    /// about `max_shards / shard count` of the store, since identities
    /// spread evenly by hash. A decision for an identity in the shard being
    /// swept waits for that shard's rebuild; all other shards are untouched.
    /// Calling it every `t` with `max_shards = k` sweeps the whole store
    /// every `t × shards / k`.
    pub fn evict_idle_step(&self, max_shards: usize) -> SweepReport {
        let count = self.shards.len();
        let steps = max_shards.min(count);
        let first = self.next_sweep.fetch_add(steps, Ordering::Relaxed) % count;
        let now = self.clock.now_ms();
        hot::forget(self.uid);
        let mut report = SweepReport { shards: steps, ..SweepReport::default() };
        // Sketches of ended windows go too, as many of their shards per step.
        self.distinct.sweep_step(now, steps);
        for i in 0..steps {
            let mut shard = self.shards[(first + i) % count].lock().unwrap_or_else(PoisonError::into_inner);
            let before = shard.len();
            let after = shard.sweep(now);
            report.forgotten += before - after;
            report.remaining += after;
        }
        report
    }

    /// How many (identity, limit) states the store holds.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len()).sum()
    }

    /// Whether the store holds no state at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn decide(&self, request: Request<'_>) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        std::future::ready(self.decide_sync(request))
    }

    /// Always: the embedded store never waits.
    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        Some(self.decide_sync(request))
    }

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        Some(self)
    }

    fn leases(&self) -> Option<impl LeaseStore + '_> {
        Some(self)
    }

    fn tables(&self) -> Option<impl SharedTables + '_> {
        Some(self)
    }

    fn joint(&self) -> Option<impl JointStore + '_> {
        Some(self)
    }

    fn lift_penalty(
        &self,
        identity: &Identity,
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<Option<std::time::Duration>, StoreError>> + Send {
        std::future::ready(self.lift_penalty_sync(identity))
    }

    /// In the process: never unreachable, never late.
    fn has_outages(&self) -> bool {
        false
    }
}

/// Joint decisions under the locks of every shard involved, taken in shard
/// order so that two joint decisions never wait on each other.
impl<C: Clock> JointStore for MemoryStore<C> {
    fn decide_joint(
        &self,
        parts: &[Part<'_>],
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send {
        std::future::ready(self.decide_joint_sync(parts))
    }
}

/// Leases as the shared store would grant them, so that a limiter leasing
/// from the embedded store (in tests, in `replay`) decides as it would on
/// Redis; in one process a lease saves nothing.
impl<C: Clock> LeaseStore for MemoryStore<C> {
    fn lease(
        &self,
        identity: &Identity,
        charge: Charge,
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<Lease, StoreError>> + Send {
        std::future::ready(self.lease_sync(identity, charge))
    }

    fn give_back(
        &self,
        identity: &Identity,
        back: GiveBack,
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        std::future::ready(self.give_back_sync(identity, back))
    }
}

impl<C: Clock> MemoryStore<C> {
    /// [`LeaseStore::lease`], answered at once.
    ///
    /// # Errors
    /// As [`MemoryStore::decide_sync`], and [`InvalidRequest::NotLeased`].
    pub fn lease_sync(&self, identity: &Identity, charge: Charge) -> Result<Lease, StoreError> {
        if !lease::leasable(charge.limit.algorithm) {
            return Err(StoreError::Invalid(InvalidRequest::NotLeased(charge.limit.algorithm)));
        }
        let now = check_time(self.clock.now_ms())?;
        let decision = self.decide_one(self.identity(identity), now, &charge)?;
        Ok(Lease::decided(&charge.limit, decision, now))
    }

    /// [`LeaseStore::give_back`], answered at once.
    ///
    /// # Errors
    /// [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange) when the clock reads past
    /// [`crate::store::MAX_TIME_MS`].
    pub fn give_back_sync(&self, identity: &Identity, back: GiveBack) -> Result<u64, StoreError> {
        let now = check_time(self.clock.now_ms())?;
        let id = self.identity(identity);
        let mut shard = self.lock(id);
        Ok(shard.table(&back.limit, now).states.give_back(id, now, back.window, back.unused))
    }
}

impl<C: Clock> DistinctStore for MemoryStore<C> {
    fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.decide_distinct_sync(identity, quota, value))
    }
}

impl<C: Clock> MemoryStore<C> {
    /// [`DistinctStore::decide_distinct`], now.
    ///
    /// # Errors
    /// [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange).
    pub fn decide_distinct_sync(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> Result<Decision, StoreError> {
        let now = check_time(self.clock.now_ms())?;
        Ok(self.distinct.decide(identity, quota, now, value))
    }
}

/// In process: every user of this store shares its tables. Deadlines are
/// moot, the store answers at once.
impl<C: Clock> SharedTables for MemoryStore<C> {
    fn put_entry(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: std::time::Duration,
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(self.put_entry_sync(table, field, value, ttl))
    }

    fn delete_entry(
        &self,
        table: &TableName,
        field: &[u8],
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(self.delete_entry_sync(table, field))
    }

    fn read_table(
        &self,
        table: &TableName,
        _deadline: Option<std::time::Instant>,
    ) -> impl Future<Output = Result<Vec<TableEntry>, StoreError>> + Send {
        std::future::ready(self.read_table_sync(table))
    }
}

impl<C: Clock> MemoryStore<C> {
    /// [`Store::lift_penalty`], now.
    ///
    /// # Errors
    /// [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange).
    pub fn lift_penalty_sync(&self, identity: &Identity) -> Result<Option<std::time::Duration>, StoreError> {
        let now = check_time(self.clock.now_ms())?;
        let id = self.identity(identity);
        Ok(self.lock(id).lift_penalty(id, now).map(std::time::Duration::from_millis))
    }

    /// [`SharedTables::put_entry`], now.
    ///
    /// # Errors
    /// As [`SharedTables::put_entry`], or [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange).
    pub fn put_entry_sync(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        let now = check_time(self.clock.now_ms())?;
        self.tables.put(table, field, value, ttl, now)
    }

    /// [`SharedTables::delete_entry`], now.
    ///
    /// # Errors
    /// As [`SharedTables::delete_entry`], or [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange).
    pub fn delete_entry_sync(&self, table: &TableName, field: &[u8]) -> Result<bool, StoreError> {
        let now = check_time(self.clock.now_ms())?;
        self.tables.delete(table, field, now)
    }

    /// [`SharedTables::read_table`], now.
    ///
    /// # Errors
    /// As [`SharedTables::read_table`], or [`Unavailable::TimeOutOfRange`](crate::Unavailable::TimeOutOfRange).
    pub fn read_table_sync(&self, table: &TableName) -> Result<Vec<TableEntry>, StoreError> {
        let now = check_time(self.clock.now_ms())?;
        self.tables.read(table, now)
    }
}
