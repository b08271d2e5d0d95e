//! The tables the embedded store keeps states in, one per limit in a shard:
//! which kind each algorithm gets ([`Kept`]), the compact tables of copyable
//! states ([`Keyed`]), and the per-limit [`Table`] that dispatches to them.

use super::counter_table::CounterTables;
use super::hot;
use super::logs::Logs;
use super::packing::{self, PackedFixed, Packing, Plain};
use super::slots::Slots;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_log::SlidingLog;
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::{for_each_algorithm, Definition};
use crate::{Algorithm, Decision, Limit, Quota};

/// How the embedded store keeps the states of one limit: each algorithm
/// names its kind of table in [`Kept::Table`].
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
    fn hold(&mut self, _id: u64, _now: u64) {}
    /// Ends [`LimitTable::hold`].
    fn release(&mut self) {}
    /// A handle for deciding on `id`'s state without the lock, where the table allows it.
    fn handle(&self, _id: u64) -> Option<hot::Handle> {
        None
    }
}

/// What the embedded store keeps per algorithm: the kind of table for its
/// states. Implemented here for each algorithm's unit type, so the
/// algorithms know nothing of the store; the table of [`States`] is built
/// from `for_each_algorithm!` through this trait, and an algorithm without
/// an implementation is a compile error.
pub(super) trait Kept: Definition {
    /// How the states of one limit under the algorithm are kept.
    type Table: LimitTable;
}

impl Kept for SlidingWindowCounter {
    type Table = CounterTables;
}

impl Kept for FixedWindow {
    type Table = PackedTable<PackedFixed>;
}

impl Kept for SlidingLog {
    type Table = Logs;
}

impl Kept for TokenBucket {
    type Table = PlainTable<Self>;
}

impl Kept for Gcra {
    type Table = PlainTable<Self>;
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
}

/// The states of one limit, in the table its algorithm is [`Kept`] in.
macro_rules! memory_states {
    ($($variant:ident => $module:ident),* $(,)?) => {
        pub(super) enum States {
            $($variant(<crate::algorithm::$module::$variant as Kept>::Table),)*
        }

        impl States {
            pub(super) fn new(limit: &Limit, now: u64) -> Self {
                match limit.algorithm {
                    $(Algorithm::$variant => Self::$variant(LimitTable::new(limit.quota, now)),)*
                }
            }

            #[inline]
            pub(super) fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
                match self {
                    $(Self::$variant(t) => t.decide(id, now, cost, commit),)*
                }
            }

            pub(super) fn shrink(&mut self, now: u64) {
                match self {
                    $(Self::$variant(t) => t.shrink(now),)*
                }
            }

            pub(super) fn len(&self) -> usize {
                match self {
                    $(Self::$variant(t) => t.len(),)*
                }
            }

            pub(super) fn hold(&mut self, id: u64, now: u64) {
                match self {
                    $(Self::$variant(t) => t.hold(id, now),)*
                }
            }

            pub(super) fn release(&mut self) {
                match self {
                    $(Self::$variant(t) => t.release(),)*
                }
            }

            pub(super) fn handle(&self, id: u64) -> Option<hot::Handle> {
                match self {
                    $(Self::$variant(t) => t.handle(id),)*
                }
            }
        }
    };
}

for_each_algorithm!(memory_states);

pub(super) struct Table {
    pub(super) limit: Limit,
    pub(super) states: States,
}

impl Table {
    pub(super) fn new(limit: Limit, now: u64) -> Self {
        Self { limit, states: States::new(&limit, now) }
    }

    /// Decides `cost` for identity `id`; charges it only when `commit`.
    #[inline]
    pub(super) fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        self.states.decide(id, now, cost, commit)
    }

    /// Forgets every identity whose state no longer matters and gives back
    /// the memory the rest does not need.
    pub(super) fn shrink(&mut self, now: u64) {
        self.states.shrink(now);
    }

    pub(super) fn len(&self) -> usize {
        self.states.len()
    }
}
