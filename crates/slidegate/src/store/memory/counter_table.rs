//! The sliding window counter's table: packed states that a thread holding
//! a handle (`hot.rs`) may update without the shard's lock.

use std::sync::Arc;

use super::hot;
use super::packing::{PackedCounter, Packing, Plain};
use super::shared_slots::SharedSlots;
use super::tables::{Keyed, LimitTable, PlainTable};
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::Definition;
use crate::{Decision, Quota};

/// The sliding window counter's packed states, in a table whose states a
/// thread holding a handle may also update without the shard's lock (see
/// `hot.rs` and `shared_slots.rs`). Decides exactly as [`Keyed`] does.
pub(super) struct CounterTable {
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
pub(super) enum CounterTables {
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
