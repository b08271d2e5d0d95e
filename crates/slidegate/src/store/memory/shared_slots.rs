//! A compact hash table from identity hash to packed state whose states can
//! be updated without the shard's lock.
//!
//! The layout and probing are [`super::slots::Slots`]' (16-byte `(id, state)`
//! slots, linear probing, 53–80% load), but each word is an atomic and the
//! array is reference-counted, so a thread may keep a handle on one slot
//! (see `hot.rs`) and decide on its state by compare-and-swap while other
//! threads hold the shard's lock.
//!
//! The protocol, which `tests/memory_concurrency.rs` checks:
//!
//! - Ids and the table's length change only under the shard's lock; the
//!   array is only ever read without the lock at a slot whose id is known.
//! - A stored state is changed by compare-and-swap only, with or without the
//!   lock, so no write is lost between two writers — except by the lock
//!   holder's swaps to and from [`FROZEN`] below.
//! - The lock holder takes a state out of reach of the lock-free writers by
//!   swapping it to [`FROZEN`], a value no packed state ever takes: a
//!   compare-and-swap from any state fails on it, and a writer that reads it
//!   gives up and takes the lock. [`SharedSlots::freeze`] /
//!   [`SharedSlots::thaw`] do that around a multi-limit decision.
//! - A rebuild freezes every state of the old array as it copies it, and
//!   the old array is never thawed: a writer still holding it either wrote
//!   before the copy (and its write was copied) or finds it frozen.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Marks an empty slot, as in [`super::slots`]: stored ids have bit 0 set.
const EMPTY: u64 = 0;

/// A state word no packed state takes (see [`super::packing::PackedCounter`]):
/// held out of reach of the lock-free writers.
pub(super) const FROZEN: u64 = u64::MAX;

/// One `(identity hash, packed state)` entry.
#[derive(Default)]
pub(super) struct Slot {
    id: AtomicU64,
    state: AtomicU64,
}

impl Slot {
    /// The state word, for a compare-and-swap without the lock.
    pub(super) fn state(&self) -> &AtomicU64 {
        &self.state
    }
}

/// An open-addressing table of `(identity hash, packed state)` whose states
/// may be written without the owner's lock (see the module's protocol).
pub(super) struct SharedSlots {
    slots: Arc<[Slot]>,
    len: usize,
}

impl SharedSlots {
    pub(super) fn new() -> Self {
        Self { slots: Arc::from(Vec::new()), len: 0 }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The array, for a handle on one of its slots.
    pub(super) fn array(&self) -> &Arc<[Slot]> {
        &self.slots
    }

    /// The slot an id would start probing from (as in [`super::slots`]).
    fn home(&self, id: u64) -> usize {
        ((u128::from(id) * self.slots.len() as u128) >> 64) as usize
    }

    /// Where `id` is stored, or the empty slot where it would go (`Err`).
    /// The table must have slots: one is always empty (load ≤ 80%).
    fn probe(&self, id: u64) -> Result<usize, usize> {
        let mut i = self.home(id);
        loop {
            // Ids change only under the owner's lock, which the caller holds.
            match self.slots[i].id.load(Ordering::Relaxed) {
                found if found == id => return Ok(i),
                EMPTY => return Err(i),
                _ => i = if i + 1 == self.slots.len() { 0 } else { i + 1 },
            }
        }
    }

    /// Where `id` is stored.
    pub(super) fn find(&self, id: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        self.probe(id).ok()
    }

    /// The state word of slot `index`.
    #[cfg(test)]
    fn state(&self, index: usize) -> &AtomicU64 {
        &self.slots[index].state
    }

    /// Whether one more entry would exceed the maximal load of 80%.
    pub(super) fn is_full(&self) -> bool {
        (self.len + 1) * 5 > self.slots.len() * 4
    }

    /// Stores `state` for an `id` that is not in the table; the table must
    /// not be full ([`SharedSlots::is_full`]). Returns its slot.
    pub(super) fn insert_new(&mut self, id: u64, state: u64) -> usize {
        debug_assert!(!self.is_full());
        match self.probe(id) {
            Err(i) => {
                // No writer without the lock knows this slot yet.
                self.slots[i].state.store(state, Ordering::Relaxed);
                self.slots[i].id.store(id, Ordering::Relaxed);
                self.len += 1;
                i
            }
            Ok(_) => unreachable!("insert_new called for an id already stored"),
        }
    }

    /// Takes the state of slot `index` out of reach of the lock-free
    /// writers and returns it. Until [`SharedSlots::thaw`], the caller
    /// decides on the returned value instead.
    pub(super) fn freeze(&self, index: usize) -> u64 {
        let state = self.slots[index].state.swap(FROZEN, Ordering::AcqRel);
        debug_assert_ne!(state, FROZEN, "a slot frozen twice");
        state
    }

    /// Puts `state` back in slot `index`, frozen by [`SharedSlots::freeze`].
    pub(super) fn thaw(&self, index: usize, state: u64) {
        self.slots[index].state.store(state, Ordering::Release);
    }

    /// Replaces the state in slot `index` by compare-and-swap with what
    /// `decide` makes of it: `decide` returns its answer and the new state,
    /// or `None` to leave the state as it is. `None` when the state is frozen.
    #[inline]
    pub(super) fn update<T>(&self, index: usize, decide: impl FnMut(u64) -> (T, Option<u64>)) -> Option<T> {
        update(&self.slots[index].state, decide)
    }

    /// Every `(index, id, state)` as it is now, leaving the states in
    /// place; a state frozen by [`SharedSlots::freeze`] reads as [`FROZEN`].
    pub(super) fn entries(&self) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let id = slot.id.load(Ordering::Relaxed);
            (id != EMPTY).then(|| (index, id, slot.state.load(Ordering::Acquire)))
        })
    }

    /// Every `(id, state)`, each state frozen for good as it is read (as by
    /// [`SharedSlots::rebuild`]); the table is left empty.
    pub(super) fn take(&mut self) -> Vec<(u64, u64)> {
        let states = self
            .slots
            .iter()
            .filter_map(|slot| {
                let id = slot.id.load(Ordering::Relaxed);
                (id != EMPTY).then(|| (id, slot.state.swap(FROZEN, Ordering::AcqRel)))
            })
            .collect();
        *self = Self::new();
        states
    }

    /// Rebuilds the table with the states `keep` accepts, sized for them
    /// plus `room` more at 53% load (an empty table frees its memory).
    /// Every state of the old array is frozen for good as it is read, so a
    /// writer still holding the old array cannot change it any more.
    pub(super) fn rebuild(&mut self, mut keep: impl FnMut(u64) -> bool, room: usize) {
        let states: Vec<(u64, u64)> = self
            .slots
            .iter()
            .filter_map(|slot| {
                let id = slot.id.load(Ordering::Relaxed);
                (id != EMPTY).then(|| (id, slot.state.swap(FROZEN, Ordering::AcqRel)))
            })
            .filter(|&(_, state)| keep(state))
            .collect();
        let want = states.len() + room;
        let capacity = if want == 0 { 0 } else { (want * 15 / 8).max(8) };
        self.slots = (0..capacity).map(|_| Slot::default()).collect();
        self.len = 0;
        for (id, state) in states {
            self.insert_new(id, state);
        }
    }
}

/// Replaces the state in `word` by compare-and-swap with what `decide`
/// makes of it (see [`SharedSlots::update`]); gives up on a frozen state.
#[inline(always)]
pub(super) fn update<T>(word: &AtomicU64, mut decide: impl FnMut(u64) -> (T, Option<u64>)) -> Option<T> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        if current == FROZEN {
            return None;
        }
        let (answer, next) = decide(current);
        let Some(next) = next else { return Some(answer) };
        match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(answer),
            Err(actual) => current = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_it_stored_across_growth_and_sweeps_and_freezes_old_arrays() {
        let mut t = SharedSlots::new();
        let ids: Vec<u64> = (0..10_000u64)
            .map(|i| super::super::slots::slot_id(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        for (n, &id) in ids.iter().enumerate() {
            assert!(t.find(id).is_none());
            if t.is_full() {
                t.rebuild(|_| true, 1);
            }
            t.insert_new(id, n as u64);
            assert!(t.len() * 5 <= t.slots.len() * 4, "load stays at most 80%");
        }
        for (n, &id) in ids.iter().enumerate() {
            assert_eq!(t.find(id).map(|i| t.state(i).load(Ordering::Relaxed)), Some(n as u64));
        }
        let old = Arc::clone(t.array());
        t.rebuild(|v| v % 2 == 0, 0);
        assert_eq!(t.len(), 5_000);
        assert!(old
            .iter()
            .all(|s| s.id.load(Ordering::Relaxed) == EMPTY || s.state().load(Ordering::Relaxed) == FROZEN));
        for (n, &id) in ids.iter().enumerate() {
            assert_eq!(
                t.find(id).map(|i| t.state(i).load(Ordering::Relaxed)),
                (n % 2 == 0).then_some(n as u64)
            );
        }
        // A writer that read a state before the rebuild cannot write it after.
        let index = old.iter().position(|s| s.id.load(Ordering::Relaxed) == ids[2]).unwrap();
        let stale = old[index].state();
        assert!(stale.compare_exchange(2, 3, Ordering::AcqRel, Ordering::Acquire).is_err());
        assert_eq!(update(stale, |v| ((), Some(v + 1))), None);
        let i = t.find(ids[0]).unwrap();
        assert_eq!(t.freeze(i), 0);
        assert_eq!(t.state(i).load(Ordering::Relaxed), FROZEN);
        t.thaw(i, 7);
        assert_eq!(t.state(i).load(Ordering::Relaxed), 7);
        let old = Arc::clone(t.array());
        let taken = t.take();
        assert_eq!(taken.len(), 5_000);
        assert!(taken.contains(&(ids[0], 7)) && taken.contains(&(ids[2], 2)));
        assert_eq!((t.len(), t.slots.len()), (0, 0), "taking every state empties the table");
        assert!(old
            .iter()
            .all(|s| s.id.load(Ordering::Relaxed) == EMPTY || s.state().load(Ordering::Relaxed) == FROZEN));
        t.rebuild(|_| false, 0);
        assert_eq!((t.len(), t.slots.len()), (0, 0), "an empty table frees its memory");
    }
}
