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
//! everything. A table that stops growing is otherwise only swept when one of
//! its identities is decided again after a long horizon (2^14 windows and
//! more), so a long-running process should call
//! [`MemoryStore::evict_idle_step`] from a timer: it sweeps a bounded number
//! of shards per call, round-robin, and gives memory back after a burst
//! without ever holding more than one shard's lock for one shard's work.

mod hot;
mod packing;
mod shared_slots;
mod slots;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub(crate) use self::packing::PackedFixed;
use self::packing::{PackedCounter, Packing, Plain};
use self::shared_slots::SharedSlots;
use self::slots::{slot_id, Slots};
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::{for_each_algorithm, sliding_log, Definition};
use crate::distinct::DistinctTable;
use crate::store::{
    check_charge, check_time, validate, Charge, Decisions, DistinctStore, Outcome, Request, Store, StoreError,
};
use crate::{Algorithm, Clock, Decision, Identity, Limit, Penalty, PenaltyState, Quota, SystemClock};

const DEFAULT_SHARDS: usize = 64;
/// A sliding-log table is not swept before it holds this many identities.
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

/// How the embedded store keeps the states of one limit: each algorithm
/// names its kind of table in [`Definition::MemoryTable`].
pub(crate) trait LimitTable {
    /// An empty table for states under `quota`, created at `now`.
    fn new(quota: Quota, now: u64) -> Self;
    /// Decides `cost` for identity `id`; charges it only when `commit`.
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision;
    /// Forgets every identity whose state no longer matters and gives back
    /// the memory the rest does not need.
    fn shrink(&mut self, now: u64);
    /// How many identities the table holds.
    fn len(&self) -> usize;
    /// Keeps `id`'s state out of reach of decisions without the lock (see
    /// `hot.rs`) until [`LimitTable::release`], so that a multi-limit
    /// decision is atomic.
    fn hold(&mut self, _id: u64, _now: u64) {}
    /// Ends [`LimitTable::hold`].
    fn release(&mut self) {}
    /// A handle for deciding on `id`'s state without the lock, where the table allows it.
    fn handle(&self, _id: u64) -> Option<hot::Handle> {
        None
    }
}

/// The states of one limit whose state is a small copyable value, in a
/// compact table ([`Slots`]) in the representation [`Packing`] chose.
pub(crate) struct Keyed<P: Packing> {
    packing: P,
    slots: Slots<P::Packed>,
    /// When the table was last swept: packed times are restored relative to
    /// it, and every state in the table was written at most one horizon later.
    swept_ms: u64,
    /// [`Packing::reference`] of `swept_ms`.
    reference: u64,
}

impl<P: Packing> Keyed<P> {
    fn new(packing: P, now: u64) -> Self {
        Self { packing, slots: Slots::new(), swept_ms: now, reference: packing.reference(now) }
    }

    /// Decides for a copyable state: updates in place, inserts only when the
    /// state changed, so denials and unknown identities store nothing; no
    /// allocation unless the table grows.
    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        if now.saturating_sub(self.swept_ms) >= self.packing.horizon_ms() {
            self.rebuild(now, 0);
        }
        let (packing, reference) = (self.packing, self.reference);
        if let Some(slot) = self.slots.get_mut(id) {
            let (next, decision) =
                P::Algorithm::decide(packing.unpack(*slot, reference), now, cost, packing.quota());
            if commit {
                *slot = packing.pack(next);
            }
            return decision;
        }
        let fresh = packing::State::<P>::default();
        let (next, decision) = P::Algorithm::decide(fresh, now, cost, packing.quota());
        if commit && next != fresh {
            if self.slots.is_full() {
                // Growing is the moment to drop idle states: the table may not need to grow.
                self.rebuild(now, 1);
            }
            self.slots.insert_new(id, packing.pack(next));
        }
        decision
    }

    /// Drops every idle state and resizes the table for the rest plus `room`.
    ///
    /// States are restored relative to the previous sweep (exact: none was
    /// written more than a horizon after it); those that survive are at most
    /// a window old, so the next horizon starts now.
    fn rebuild(&mut self, now: u64, room: usize) {
        let (packing, reference) = (self.packing, self.reference);
        self.slots
            .rebuild(|p| !P::Algorithm::is_idle(&packing.unpack(*p, reference), now, packing.quota()), room);
        self.swept_ms = now;
        self.reference = packing.reference(now);
    }

    fn len(&self) -> usize {
        self.slots.len()
    }
}

/// States stored as they are, for algorithms whose state has no spare bits.
pub(crate) type PlainTable<A> = Keyed<Plain<A>>;

impl<A: Definition<State: Copy>> LimitTable for PlainTable<A> {
    fn new(quota: Quota, now: u64) -> Self {
        Keyed::new(Plain::of(quota), now)
    }
    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        Keyed::decide(self, id, now, cost, commit)
    }
    fn shrink(&mut self, now: u64) {
        self.rebuild(now, 0);
    }
    fn len(&self) -> usize {
        Keyed::len(self)
    }
}

/// States packed by `P` when the quota leaves room for it (see `packing.rs`),
/// stored as they are otherwise (limits of 2^24 and more for the sliding
/// window counter).
pub(crate) enum PackedTable<P: Packing> {
    Packed(Keyed<P>),
    Plain(PlainTable<P::Algorithm>),
}

impl<P: Packing> LimitTable for PackedTable<P> {
    fn new(quota: Quota, now: u64) -> Self {
        match P::new(quota) {
            Some(packing) => Self::Packed(Keyed::new(packing, now)),
            None => Self::Plain(Keyed::new(Plain::of(quota), now)),
        }
    }
    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        match self {
            Self::Packed(t) => t.decide(id, now, cost, commit),
            Self::Plain(t) => Keyed::decide(t, id, now, cost, commit),
        }
    }
    fn shrink(&mut self, now: u64) {
        match self {
            Self::Packed(t) => t.rebuild(now, 0),
            Self::Plain(t) => t.rebuild(now, 0),
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Packed(t) => t.len(),
            Self::Plain(t) => Keyed::len(t),
        }
    }
}

/// The sliding window counter's packed states, in a table whose states a
/// thread holding a handle may also update without the shard's lock (see
/// `hot.rs` and `shared_slots.rs`). Decides exactly as [`Keyed`] does.
pub(crate) struct CounterTable {
    packing: PackedCounter,
    slots: SharedSlots,
    /// As in [`Keyed`].
    swept_ms: u64,
    reference: u64,
    /// `(id, slot, state)` of the state a multi-limit decision holds frozen
    /// ([`LimitTable::hold`]): decisions under the lock use this copy.
    held: Option<(u64, usize, u64)>,
}

impl CounterTable {
    fn new(packing: PackedCounter, now: u64) -> Self {
        Self {
            packing,
            slots: SharedSlots::new(),
            swept_ms: now,
            reference: packing.reference(now),
            held: None,
        }
    }

    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        if now.saturating_sub(self.swept_ms) >= self.packing.horizon_ms() {
            self.rebuild(now, 0);
        }
        let (packing, reference) = (self.packing, self.reference);
        let quota = *packing.quota();
        if let Some(index) = self.slots.find(id) {
            if let Some((_, held, packed)) = &mut self.held {
                if *held == index {
                    let (next, decision) =
                        SlidingWindowCounter::decide(packing.unpack(*packed, reference), now, cost, &quota);
                    if commit {
                        *packed = packing.pack(next);
                    }
                    return decision;
                }
            }
            let decided = self.slots.update(index, |packed| {
                let state = packing.unpack(packed, reference);
                let (next, decision) = SlidingWindowCounter::decide(state, now, cost, &quota);
                (decision, (commit && next != state).then(|| packing.pack(next)))
            });
            // Only `hold` freezes a state of the table in use, and that one is `held`.
            return decided.unwrap_or_else(|| unreachable!("a frozen state in a table in use"));
        }
        let fresh = crate::algorithm::sliding_window_counter::State::default();
        let (next, decision) = SlidingWindowCounter::decide(fresh, now, cost, &quota);
        if commit && next != fresh {
            if self.slots.is_full() {
                // Growing is the moment to drop idle states: the table may not need to grow.
                self.rebuild(now, 1);
            }
            self.slots.insert_new(id, packing.pack(next));
        }
        decision
    }

    /// As [`Keyed::rebuild`]; a state held frozen is put back first and
    /// held again in the new array.
    fn rebuild(&mut self, now: u64, room: usize) {
        let held = self.held.map(|(id, _, _)| id);
        self.release();
        let (packing, reference) = (self.packing, self.reference);
        self.slots.rebuild(
            |p| !SlidingWindowCounter::is_idle(&packing.unpack(p, reference), now, packing.quota()),
            room,
        );
        self.swept_ms = now;
        self.reference = packing.reference(now);
        if let Some(id) = held {
            self.hold(id, now);
        }
    }

    fn hold(&mut self, id: u64, now: u64) {
        // One identity at a time. A hold still in place was left by a panic
        // between `hold` and `release`: ending it keeps a poisoned shard sound.
        self.release();
        if now.saturating_sub(self.swept_ms) >= self.packing.horizon_ms() {
            self.rebuild(now, 0);
        }
        if let Some(index) = self.slots.find(id) {
            self.held = Some((id, index, self.slots.freeze(index)));
        }
    }

    fn release(&mut self) {
        if let Some((_, index, packed)) = self.held.take() {
            self.slots.thaw(index, packed);
        }
    }

    fn handle(&self, id: u64) -> Option<hot::Handle> {
        let index = self.slots.find(id)?;
        Some(hot::Handle {
            slots: Arc::clone(self.slots.array()),
            index,
            packing: self.packing,
            reference: self.reference,
            sweep_due_ms: self.swept_ms.saturating_add(self.packing.horizon_ms()),
        })
    }
}

/// The sliding window counter's table: packed with handles (see
/// [`CounterTable`]) when the limit leaves room, plain otherwise (limits of
/// 2^24 and more).
pub(crate) enum CounterTables {
    Packed(CounterTable),
    Plain(PlainTable<SlidingWindowCounter>),
}

impl LimitTable for CounterTables {
    fn new(quota: Quota, now: u64) -> Self {
        match PackedCounter::new(quota) {
            Some(packing) => Self::Packed(CounterTable::new(packing, now)),
            None => Self::Plain(Keyed::new(Plain::of(quota), now)),
        }
    }
    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        match self {
            Self::Packed(t) => t.decide(id, now, cost, commit),
            Self::Plain(t) => Keyed::decide(t, id, now, cost, commit),
        }
    }
    fn shrink(&mut self, now: u64) {
        match self {
            Self::Packed(t) => t.rebuild(now, 0),
            Self::Plain(t) => t.rebuild(now, 0),
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Packed(t) => t.slots.len(),
            Self::Plain(t) => Keyed::len(t),
        }
    }
    fn hold(&mut self, id: u64, now: u64) {
        if let Self::Packed(t) = self {
            t.hold(id, now);
        }
    }
    fn release(&mut self) {
        if let Self::Packed(t) = self {
            t.release();
        }
    }
    fn handle(&self, id: u64) -> Option<hot::Handle> {
        match self {
            Self::Packed(t) => t.handle(id),
            Self::Plain(_) => None,
        }
    }
}

/// The sliding logs of one limit, keyed by identity hash.
pub(crate) struct Logs {
    quota: Quota,
    map: HashMap<u64, sliding_log::Log, BuildHasherDefault<Prehashed>>,
    sweep_at: usize,
}

impl Logs {
    fn sweep(&mut self, now: u64) {
        self.map.retain(|_, log| !sliding_log::is_idle(log, now, &self.quota));
        if self.map.len() * 4 <= self.map.capacity() {
            self.map.shrink_to_fit();
        }
    }
}

impl LimitTable for Logs {
    fn new(quota: Quota, _now: u64) -> Self {
        Self { quota, map: HashMap::default(), sweep_at: MIN_SWEEP }
    }

    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        let q = self.quota;
        let (decision, inserted) = match self.map.get_mut(&id) {
            Some(log) if commit => {
                let (next, decision) = sliding_log::decide(std::mem::take(log), now, cost, &q);
                *log = next;
                (decision, false)
            }
            Some(log) => (sliding_log::check(log, now, cost, &q), false),
            None => {
                let (log, decision) = sliding_log::decide(sliding_log::Log::default(), now, cost, &q);
                let insert = commit && decision.allowed && cost > 0;
                if insert {
                    self.map.insert(id, log);
                }
                (decision, insert)
            }
        };
        if inserted && self.map.len() >= self.sweep_at {
            self.sweep(now);
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
        }
        decision
    }

    fn shrink(&mut self, now: u64) {
        self.sweep(now);
        self.map.shrink_to_fit();
        self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The states of one limit, in the table its algorithm chose.
macro_rules! memory_states {
    ($($variant:ident => $module:ident),* $(,)?) => {
        enum States {
            $($variant(<crate::algorithm::$module::$variant as Definition>::MemoryTable),)*
        }

        impl States {
            fn new(limit: &Limit, now: u64) -> Self {
                match limit.algorithm {
                    $(Algorithm::$variant => Self::$variant(LimitTable::new(limit.quota, now)),)*
                }
            }

            #[inline]
            fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
                match self {
                    $(Self::$variant(t) => t.decide(id, now, cost, commit),)*
                }
            }

            fn shrink(&mut self, now: u64) {
                match self {
                    $(Self::$variant(t) => t.shrink(now),)*
                }
            }

            fn len(&self) -> usize {
                match self {
                    $(Self::$variant(t) => t.len(),)*
                }
            }

            fn hold(&mut self, id: u64, now: u64) {
                match self {
                    $(Self::$variant(t) => t.hold(id, now),)*
                }
            }

            fn release(&mut self) {
                match self {
                    $(Self::$variant(t) => t.release(),)*
                }
            }

            fn handle(&self, id: u64) -> Option<hot::Handle> {
                match self {
                    $(Self::$variant(t) => t.handle(id),)*
                }
            }
        }
    };
}

for_each_algorithm!(memory_states);

struct Table {
    limit: Limit,
    states: States,
}

impl Table {
    fn new(limit: Limit, now: u64) -> Self {
        Self { limit, states: States::new(&limit, now) }
    }

    /// Decides `cost` for identity `id`; charges it only when `commit`.
    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        self.states.decide(id, now, cost, commit)
    }

    /// Forgets every identity whose state no longer matters and gives back
    /// the memory the rest does not need.
    fn shrink(&mut self, now: u64) {
        self.states.shrink(now);
    }

    fn len(&self) -> usize {
        self.states.len()
    }
}

#[derive(Default)]
struct Shard {
    /// One table per limit seen; an identity rarely meets more than a handful.
    tables: Vec<Table>,
    /// Penalty states by identity hash: only identities that were denied
    /// under a penalty, forgotten by the sweep once idle.
    penalties: HashMap<u64, PenaltyState>,
}

impl Shard {
    fn table(&mut self, limit: &Limit, now: u64) -> &mut Table {
        let index = match self.tables.iter().position(|t| t.limit == *limit) {
            Some(i) => i,
            None => {
                self.tables.push(Table::new(*limit, now));
                self.tables.len() - 1
            }
        };
        &mut self.tables[index]
    }

    /// Forgets every idle state, shrinks every table to what remains, drops
    /// empty tables. Returns how many states remain.
    fn sweep(&mut self, now: u64) -> usize {
        for table in &mut self.tables {
            table.shrink(now);
        }
        self.tables.retain(|t| t.len() > 0);
        self.tables.shrink_to_fit();
        self.penalties.retain(|_, p| !p.is_idle(now));
        self.penalties.shrink_to_fit();
        self.len()
    }

    fn len(&self) -> usize {
        self.tables.iter().map(Table::len).sum()
    }
}

/// Decides `charges` for identity `id` at `now` all-or-nothing, under the
/// shard's lock the caller holds.
fn decide_locked(shard: &mut Shard, id: u64, now: u64, charges: &[Charge]) -> Decisions {
    if let [charge] = charges {
        return Decisions::one(shard.table(&charge.limit, now).decide(id, now, charge.cost, true));
    }
    // No thread may change one of the states between the check and the commit.
    for charge in charges {
        shard.table(&charge.limit, now).states.hold(id, now);
    }
    let mut decisions: Vec<Decision> =
        charges.iter().map(|c| shard.table(&c.limit, now).decide(id, now, c.cost, false)).collect();
    if decisions.iter().all(|d| d.allowed) {
        // Same state, same time: committing reproduces each checked
        // decision, now with the charges of the limits before it applied.
        for (c, decision) in charges.iter().zip(&mut decisions) {
            *decision = shard.table(&c.limit, now).decide(id, now, c.cost, true);
        }
    } else {
        // Nothing is charged, so a limit that had room reports its
        // remaining permits without this request: a peek at cost 0.
        for (c, decision) in charges.iter().zip(&mut decisions) {
            if decision.allowed {
                *decision = shard.table(&c.limit, now).decide(id, now, 0, false);
            }
        }
    }
    for charge in charges {
        shard.table(&charge.limit, now).states.release();
    }
    decisions.into()
}

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
    hasher: foldhash::quality::RandomState,
    clock: C,
    /// The shard [`MemoryStore::evict_idle_step`] sweeps next.
    next_sweep: AtomicUsize,
    /// Distinct-value sketches ([`Store::decide_distinct`]).
    distinct: DistinctTable,
}

/// A store id no store has had before.
fn next_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
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
            uid: next_uid(),
            shards: (0..DEFAULT_SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::quality::RandomState::default(),
            clock,
            next_sweep: AtomicUsize::new(0),
            distinct: DistinctTable::default(),
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
        slot_id(self.hasher.hash_one((identity.scope(), identity.source(), identity.digest())))
    }

    /// The shard identity `id` lives in, locked.
    fn lock(&self, id: u64) -> MutexGuard<'_, Shard> {
        // Bits 32.. pick the shard; compact tables start probing from the
        // high bits, the sliding log's map uses the low bits for buckets and
        // the top 7 for tags: the choices stay independent.
        let shard = &self.shards[(id >> 32) as usize % self.shards.len()];
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
    /// arithmetic ([`PenaltyState`]) with it.
    ///
    /// # Errors
    /// [`StoreError::NoLimits`], [`StoreError::DuplicateLimit`],
    /// [`StoreError::CostExceedsLimit`], [`StoreError::SlidingLogTooLarge`],
    /// or [`StoreError::TimeOutOfRange`] when the clock reads past
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

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        Some(self)
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
    /// [`StoreError::TimeOutOfRange`].
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

/// Decides `charges` under `penalty` for identity `id`, under the shard's
/// lock the caller holds.
fn decide_penalized(shard: &mut Shard, id: u64, now: u64, charges: &[Charge], penalty: &Penalty) -> Outcome {
    if let Some(ms) = shard.penalties.get(&id).and_then(|p| p.blocked_for(now)) {
        return Outcome::blocked(Decisions::none(), ms);
    }
    let decisions = decide_locked(shard, id, now, charges);
    if decisions.iter().all(|d| d.allowed) {
        return Outcome::decided(decisions);
    }
    match shard.penalties.entry(id).or_default().deny(penalty, now) {
        Some(ms) => Outcome::blocked(decisions, ms),
        None => Outcome::decided(decisions),
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

    /// The identity a test calls `name`.
    fn id(name: &str) -> Identity {
        Identity::named("t", name)
    }

    /// The tests' shorthand for one request: one charge, or several.
    impl<C: Clock> MemoryStore<C> {
        fn decide_one_sync(
            &self,
            identity: &Identity,
            limit: &Limit,
            cost: u64,
        ) -> Result<Decision, StoreError> {
            let outcome = self.decide_sync(Request::new(identity, &[Charge::new(*limit, cost)]))?;
            Ok(outcome.decisions[0])
        }

        fn decide_all_sync(
            &self,
            identity: &Identity,
            pairs: &[(Limit, u64)],
        ) -> Result<Decisions, StoreError> {
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
        assert!(matches!(store.decide_all_sync(&id("k"), &[]), Err(StoreError::NoLimits)));
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
}
