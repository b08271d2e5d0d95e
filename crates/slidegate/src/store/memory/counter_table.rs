//! The sliding window counter's table: packed states that a thread holding
//! a handle (`hot.rs`) may update without the shard's lock.

use std::sync::Arc;

use super::hot;
use super::packing::{PackedCounter, Packing};
use super::shared_slots::SharedSlots;
use super::tables::{PackedStates, Swept};
use crate::algorithm::sliding_window_counter::{self, SlidingWindowCounter};
use crate::algorithm::Definition;
use crate::store::lease::GivesBack;
use crate::Decision;

/// The sliding window counter's packed states, in a table whose states a
/// thread holding a handle may also update without the shard's lock (see
/// `hot.rs` and `shared_slots.rs`). Decides exactly as
/// [`Keyed`](super::tables::Keyed) does.
pub(super) struct CounterTable {
    packing: PackedCounter,
    slots: SharedSlots,
    /// As in [`Keyed`](super::tables::Keyed).
    swept: Swept,
    /// `(id, slot, state)` of each state a multi-limit or joint decision
    /// holds frozen ([`LimitTable::hold`](super::tables::LimitTable::hold)):
    /// decisions under the lock use these copies. Empty but for the length
    /// of such a decision; a joint one may hold several identities here.
    held: Vec<(u64, usize, u64)>,
}

impl PackedStates for CounterTable {
    type Packing = PackedCounter;

    fn new(packing: PackedCounter, now: u64) -> Self {
        Self { packing, slots: SharedSlots::new(), swept: Swept::at(&packing, now), held: Vec::new() }
    }

    fn with_states(
        packing: PackedCounter,
        now: u64,
        states: &[(u64, sliding_window_counter::State)],
    ) -> Self {
        let mut table = Self::new(packing, now);
        table.slots.rebuild(|_| false, states.len());
        for &(id, state) in states {
            table.slots.insert_new(id, packing.pack(state));
        }
        table
    }

    /// The old array's states are frozen for good: handles on it go stale.
    fn take_states(&mut self) -> Vec<(u64, sliding_window_counter::State)> {
        self.release();
        let (packing, reference) = (self.packing, self.swept.reference);
        self.slots.take().into_iter().map(|(id, p)| (id, packing.unpack(p, reference))).collect()
    }

    fn packing(&self) -> &PackedCounter {
        &self.packing
    }

    #[inline(always)]
    fn swept(&self) -> &Swept {
        &self.swept
    }

    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        let (packing, reference) = (self.packing, self.swept.reference);
        let quota = *packing.quota();
        if let Some(index) = self.slots.find(id) {
            if let Some((_, _, packed)) = self.held.iter_mut().find(|(_, held, _)| *held == index) {
                let (next, decision) =
                    SlidingWindowCounter::decide(packing.unpack(*packed, reference), now, cost, &quota);
                if commit {
                    *packed = packing.pack(next);
                }
                return decision;
            }
            let decided = self.slots.update(index, |packed| {
                let state = packing.unpack(packed, reference);
                let (next, decision) = SlidingWindowCounter::decide(state, now, cost, &quota);
                (decision, (commit && next != state).then(|| packing.pack(next)))
            });
            // Only `hold` freezes a state of the table in use, and those are `held`.
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

    /// As [`Keyed::rebuild`](super::tables::Keyed::rebuild); the states
    /// held frozen are put back first and held again in the new array.
    fn rebuild(&mut self, now: u64, room: usize) {
        let held: Vec<u64> = self.held.iter().map(|&(id, _, _)| id).collect();
        self.release();
        let (packing, reference) = (self.packing, self.swept.reference);
        self.slots.rebuild(
            |p| !SlidingWindowCounter::is_idle(&packing.unpack(p, reference), now, packing.quota()),
            room,
        );
        self.swept = self.swept.after_sweep(&packing, now);
        for id in held {
            self.hold(id);
        }
    }

    /// Holds `id`'s state too (a joint decision holds several identities'),
    /// once. A hold left in place by a panic between `hold` and `release` is
    /// sound: decisions under the lock read the held copy, hot handles find
    /// the state frozen and take the lock; the next release ends it.
    fn hold(&mut self, id: u64) {
        if self.held.iter().any(|&(held, _, _)| held == id) {
            return;
        }
        if let Some(index) = self.slots.find(id) {
            self.held.push((id, index, self.slots.freeze(index)));
        }
    }

    fn release(&mut self) {
        for (_, index, packed) in self.held.drain(..) {
            self.slots.thaw(index, packed);
        }
    }

    fn handle(&self, id: u64) -> Option<hot::Handle> {
        let index = self.slots.find(id)?;
        Some(hot::Handle {
            slots: Arc::clone(self.slots.array()),
            index,
            packing: self.packing,
            reference: self.swept.reference,
            sweep_due_ms: self.swept.reach.until_ms(),
        })
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// A state held frozen is read from its held copy.
    fn for_each_state(&self, mut each: impl FnMut(u64, &sliding_window_counter::State)) {
        let (packing, reference) = (self.packing, self.swept.reference);
        for (index, id, packed) in self.slots.entries() {
            let packed = match self.held.iter().find(|&&(_, held, _)| held == index) {
                Some(&(_, _, held)) => held,
                None => packed,
            };
            each(id, &packing.unpack(packed, reference));
        }
    }

    /// Through the slot's compare-and-swap, as a decision without the lock
    /// would: a hot handle on the same slot sees the state given back.
    fn give_back(&mut self, id: u64, window: u64, unused: u64) -> u64 {
        let (packing, reference) = (self.packing, self.swept.reference);
        let Some(index) = self.slots.find(id) else { return 0 };
        if let Some((_, _, packed)) = self.held.iter_mut().find(|(_, held, _)| *held == index) {
            let (state, back) =
                SlidingWindowCounter::give_back(packing.unpack(*packed, reference), window, unused);
            *packed = packing.pack(state);
            return back;
        }
        let given = self.slots.update(index, |packed| {
            let (state, back) =
                SlidingWindowCounter::give_back(packing.unpack(packed, reference), window, unused);
            (back, (back > 0).then(|| packing.pack(state)))
        });
        given.unwrap_or(0)
    }
}
