//! The tables the embedded store keeps states in: the [`LimitTable`]
//! contract every kind of table meets, and the compact tables of copyable
//! states ([`Keyed`]). Which kind each algorithm gets is `kept.rs`.

use super::hot;
use super::packing::{self, Packing, Plain};
use super::slots::Slots;
use crate::algorithm::Definition;
use crate::{Decision, Quota};

/// How the embedded store keeps the states of one limit: each algorithm
/// names its kind of table in `Kept::Table` (`kept.rs`). Every method is
/// required: a table states whether it takes part in the lock-free path.
pub(super) trait LimitTable {
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
    fn hold(&mut self, id: u64, now: u64);
    /// Ends [`LimitTable::hold`].
    fn release(&mut self);
    /// A handle for deciding on `id`'s state without the lock, where the table allows it.
    fn handle(&self, id: u64) -> Option<hot::Handle>;
}

/// The states of one limit whose state is a small copyable value, in a
/// compact table ([`Slots`]) in the representation [`Packing`] chose.
pub(super) struct Keyed<P: Packing> {
    packing: P,
    slots: Slots<P::Packed>,
    /// When the table was last swept: packed times are restored relative to
    /// it, and every state in the table was written at most one horizon later.
    swept_ms: u64,
    /// [`Packing::reference`] of `swept_ms`.
    reference: u64,
}

impl<P: Packing> Keyed<P> {
    pub(super) fn new(packing: P, now: u64) -> Self {
        Self { packing, slots: Slots::new(), swept_ms: now, reference: packing.reference(now) }
    }

    /// Decides for a copyable state: updates in place, inserts only when the
    /// state changed, so denials and unknown identities store nothing; no
    /// allocation unless the table grows.
    #[inline]
    pub(super) fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
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
    pub(super) fn rebuild(&mut self, now: u64, room: usize) {
        let (packing, reference) = (self.packing, self.reference);
        self.slots
            .rebuild(|p| !P::Algorithm::is_idle(&packing.unpack(*p, reference), now, packing.quota()), room);
        self.swept_ms = now;
        self.reference = packing.reference(now);
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// States stored as they are, for algorithms whose state has no spare bits.
pub(super) type PlainTable<A> = Keyed<Plain<A>>;

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
    // Decided under the shard's lock only: nothing to hold, no handle.
    fn hold(&mut self, _id: u64, _now: u64) {}
    fn release(&mut self) {}
    fn handle(&self, _id: u64) -> Option<hot::Handle> {
        None
    }
}

/// States packed by `P` when the quota leaves room for it (see `packing.rs`),
/// stored as they are otherwise (limits of 2^24 and more for the sliding
/// window counter).
pub(super) enum PackedTable<P: Packing> {
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
    // Decided under the shard's lock only: nothing to hold, no handle.
    fn hold(&mut self, _id: u64, _now: u64) {}
    fn release(&mut self) {}
    fn handle(&self, _id: u64) -> Option<hot::Handle> {
        None
    }
}
