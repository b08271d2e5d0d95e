//! The tables the embedded store keeps states in: the [`LimitTable`]
//! contract every kind of table meets, and the compact tables of copyable
//! states ([`Keyed`]). Which kind each algorithm gets is `kept.rs`.

use super::hot;
use super::packing::{self, Packing, Plain, Reach};
use super::slots::Slots;
use crate::algorithm::Definition;
use crate::store::lease::GivesBack;
use crate::{Decision, Quota};

/// How the embedded store keeps the states of one limit: each algorithm
/// names its kind of table in `Kept::Table` (`kept.rs`). Every method is
/// required: a table states whether it takes part in the lock-free path.
pub(super) trait LimitTable {
    /// The state of one identity, as the algorithm decides on it.
    type State;
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
    /// Undoes up to `unused` permits a lease charged `id` in window
    /// `window` (`GivesBack`); how many it undid.
    fn give_back(&mut self, id: u64, now: u64, window: u64, unused: u64) -> u64;
    /// Calls `each` with every state the table holds and its id, unpacked:
    /// what a snapshot writes (`snapshot/`), read under the shard's lock.
    fn for_each_state(&self, each: impl FnMut(u64, &Self::State));
    /// Adds `states` at `now` (a snapshot's, read back); an id the table
    /// holds already keeps its state.
    fn restore(&mut self, now: u64, states: Vec<(u64, Self::State)>);
}

/// When a table of packed states was last re-referenced: what unpacking
/// and the reach check need, computed once per sweep.
#[derive(Clone, Copy)]
pub(super) struct Swept {
    /// When: packed times are restored relative to it.
    pub(super) at_ms: u64,
    /// [`Packing::reference`] of `at_ms`.
    pub(super) reference: u64,
    /// [`Packing::reach`] of `at_ms`: the times the table may decide at.
    pub(super) reach: Reach,
}

impl Swept {
    pub(super) fn at<P: Packing>(packing: &P, now: u64) -> Self {
        Self { at_ms: now, reference: packing.reference(now), reach: packing.reach(now) }
    }

    /// After a sweep at `now`: a new reference if the clock moved forward;
    /// the same one if it stepped back, so that states written ahead of
    /// `now` still restore (see `packing.rs`).
    pub(super) fn after_sweep<P: Packing>(self, packing: &P, now: u64) -> Self {
        if now >= self.at_ms {
            Self::at(packing, now)
        } else {
            self
        }
    }
}

/// The states of one limit whose state is a small copyable value, in a
/// compact table ([`Slots`]) in the representation [`Packing`] chose.
pub(super) struct Keyed<P: Packing> {
    packing: P,
    slots: Slots<P::Packed>,
    /// Every state in the table restores exactly relative to it.
    swept: Swept,
}

impl<P: Packing> Keyed<P> {
    pub(super) fn new(packing: P, now: u64) -> Self {
        Self { packing, slots: Slots::new(), swept: Swept::at(&packing, now) }
    }

    /// A table referenced at `now` holding `states`, which must restore
    /// exactly relative to it.
    fn with_states(packing: P, now: u64, states: &[(u64, packing::State<P>)]) -> Self {
        let mut table = Self::new(packing, now);
        table.slots.rebuild(|_| false, states.len());
        for &(id, state) in states {
            table.slots.insert_new(id, packing.pack(state));
        }
        table
    }

    /// Every state, unpacked, with its id.
    fn states(&self) -> Vec<(u64, packing::State<P>)> {
        let (packing, reference) = (self.packing, self.swept.reference);
        self.slots.entries().map(|(id, p)| (id, packing.unpack(p, reference))).collect()
    }

    /// Decides for a copyable state: updates in place, inserts only when the
    /// state changed, so denials and unknown identities store nothing; no
    /// allocation unless the table grows. `now` must be within the table's
    /// reach ([`PackedTable`] sees to it; a plain table reaches every time).
    #[inline]
    pub(super) fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        let (packing, reference) = (self.packing, self.swept.reference);
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
    /// States are restored relative to the previous sweep (exact: see
    /// `packing.rs`); after a sweep forward, the next reach starts now.
    pub(super) fn rebuild(&mut self, now: u64, room: usize) {
        let (packing, reference) = (self.packing, self.swept.reference);
        self.slots
            .rebuild(|p| !P::Algorithm::is_idle(&packing.unpack(*p, reference), now, packing.quota()), room);
        self.swept = self.swept.after_sweep(&packing, now);
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// As [`LimitTable::for_each_state`].
    fn for_each_state(&self, mut each: impl FnMut(u64, &packing::State<P>)) {
        let (packing, reference) = (self.packing, self.swept.reference);
        for (id, p) in self.slots.entries() {
            each(id, &packing.unpack(p, reference));
        }
    }

    /// Adds the states of ids the table does not hold yet; each must restore
    /// exactly relative to the table's reference (always, for plain states).
    fn insert_missing(&mut self, states: &[(u64, packing::State<P>)]) {
        self.slots.rebuild(|_| true, states.len());
        for &(id, state) in states {
            if self.slots.get_mut(id).is_none() {
                self.slots.insert_new(id, self.packing.pack(state));
            }
        }
    }

    /// As [`LimitTable::give_back`], at a time within the table's reach.
    pub(super) fn give_back(&mut self, id: u64, window: u64, unused: u64) -> u64 {
        let (packing, reference) = (self.packing, self.swept.reference);
        let Some(slot) = self.slots.get_mut(id) else { return 0 };
        let (state, back) = P::Algorithm::give_back(packing.unpack(*slot, reference), window, unused);
        // Fewer permits in the same window: it packs wherever the state did.
        *slot = packing.pack(state);
        back
    }
}

/// States stored as they are, for algorithms whose state has no spare bits.
pub(super) type PlainTable<A> = Keyed<Plain<A>>;

impl<A: Definition<State: Copy> + GivesBack> LimitTable for PlainTable<A> {
    type State = A::State;
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
    fn give_back(&mut self, id: u64, _now: u64, window: u64, unused: u64) -> u64 {
        Keyed::give_back(self, id, window, unused)
    }
    fn for_each_state(&self, each: impl FnMut(u64, &A::State)) {
        Keyed::for_each_state(self, each);
    }
    fn restore(&mut self, _now: u64, states: Vec<(u64, A::State)>) {
        self.insert_missing(&states);
    }
}

/// A table of packed states as [`PackedTable`] drives it: decides only
/// within its reach, and hands its states over, unpacked, when they must be
/// re-referenced.
pub(super) trait PackedStates: Sized {
    type Packing: Packing;
    fn new(packing: Self::Packing, now: u64) -> Self;
    /// A table referenced at `now` holding `states`, which must restore
    /// exactly relative to it.
    fn with_states(packing: Self::Packing, now: u64, states: &[(u64, packing::State<Self::Packing>)])
        -> Self;
    /// Every state, unpacked; the table is left empty and out of use.
    fn take_states(&mut self) -> Vec<(u64, packing::State<Self::Packing>)>;
    fn packing(&self) -> &Self::Packing;
    fn swept(&self) -> &Swept;
    /// As [`LimitTable::decide`], at a time within the table's reach.
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision;
    /// As [`Keyed::rebuild`].
    fn rebuild(&mut self, now: u64, room: usize);
    fn len(&self) -> usize;
    /// As [`LimitTable::hold`], at a time within the table's reach.
    fn hold(&mut self, id: u64);
    fn release(&mut self);
    fn handle(&self, id: u64) -> Option<hot::Handle>;
    /// As [`LimitTable::give_back`], at a time within the table's reach.
    fn give_back(&mut self, id: u64, window: u64, unused: u64) -> u64;
    /// As [`LimitTable::for_each_state`].
    fn for_each_state(&self, each: impl FnMut(u64, &packing::State<Self::Packing>));
}

impl<P: Packing> PackedStates for Keyed<P> {
    type Packing = P;
    fn new(packing: P, now: u64) -> Self {
        Keyed::new(packing, now)
    }
    fn with_states(packing: P, now: u64, states: &[(u64, packing::State<P>)]) -> Self {
        Keyed::with_states(packing, now, states)
    }
    fn take_states(&mut self) -> Vec<(u64, packing::State<P>)> {
        let states = self.states();
        self.slots = Slots::new();
        states
    }
    fn packing(&self) -> &P {
        &self.packing
    }
    #[inline(always)]
    fn swept(&self) -> &Swept {
        &self.swept
    }
    #[inline(always)]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        Keyed::decide(self, id, now, cost, commit)
    }
    fn rebuild(&mut self, now: u64, room: usize) {
        Keyed::rebuild(self, now, room);
    }
    fn len(&self) -> usize {
        Keyed::len(self)
    }
    // Decided under the shard's lock only: nothing to hold, no handle.
    fn hold(&mut self, _id: u64) {}
    fn release(&mut self) {}
    fn handle(&self, _id: u64) -> Option<hot::Handle> {
        None
    }
    fn give_back(&mut self, id: u64, window: u64, unused: u64) -> u64 {
        Keyed::give_back(self, id, window, unused)
    }
    fn for_each_state(&self, each: impl FnMut(u64, &packing::State<P>)) {
        Keyed::for_each_state(self, each);
    }
}

/// The algorithm a table of packed states decides with.
type AlgorithmOf<T> = <<T as PackedStates>::Packing as Packing>::Algorithm;

/// The states of one limit under a window-based algorithm: packed (see
/// `packing.rs`) when the quota leaves room, plain otherwise (limits of 2^24
/// and more for the sliding window counter), and plain for a while when the
/// clock stepped back too far for the packed window numbers.
pub(super) enum PackedTable<T: PackedStates> {
    Packed(T),
    /// The quota leaves no room to pack.
    Plain(PlainTable<AlgorithmOf<T>>),
    /// States that did not fit the packing after the clock stepped back,
    /// kept plain until a re-reference finds that they all fit again.
    Unpacked(Unpacked<T::Packing>),
}

/// [`PackedTable::Unpacked`]: plain states, and when to try packing them again.
pub(super) struct Unpacked<P: Packing> {
    table: PlainTable<P::Algorithm>,
    packing: P,
    /// The reach the states would have had when they were unpacked: outside
    /// it, the clock has moved on enough for another try.
    reach: Reach,
}

impl<T: PackedStates> PackedTable<T> {
    /// Decides at a time outside the table's reach: re-references first.
    #[cold]
    #[inline(never)]
    fn decide_out_of_reach(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        self.rereference(now);
        match self {
            Self::Packed(t) => t.decide(id, now, cost, commit),
            Self::Plain(t) => Keyed::decide(t, id, now, cost, commit),
            Self::Unpacked(u) => Keyed::decide(&mut u.table, id, now, cost, commit),
        }
    }

    /// Re-references every state to `now`, whose window the table then
    /// reaches: packed if every state fits, plain otherwise.
    ///
    /// Forgets nothing: a table forgets idle states only where a plain one
    /// would, when it grows or is swept, so that a state idle now still
    /// counts as written if the clock steps back before its window ends.
    fn rereference(&mut self, now: u64) {
        self.rereference_with(now, Vec::new());
    }

    /// As [`PackedTable::rereference`], with `more` states of ids the table
    /// does not hold yet (those it holds keep theirs).
    fn rereference_with(&mut self, now: u64, more: Vec<(u64, packing::State<T::Packing>)>) {
        let (packing, mut states) = match self {
            Self::Plain(t) => {
                t.insert_missing(&more);
                return;
            }
            Self::Packed(t) => (*t.packing(), t.take_states()),
            Self::Unpacked(u) => (u.packing, u.table.states()),
        };
        if !more.is_empty() {
            // Stable: the table's own state comes first and is the one kept.
            states.extend(more);
            states.sort_by_key(|&(id, _)| id);
            states.dedup_by_key(|&mut (id, _)| id);
        }
        let reference = packing.reference(now);
        *self = if states.iter().all(|&(_, s)| packing.restores(s, reference)) {
            Self::Packed(T::with_states(packing, now, &states))
        } else {
            let table = Keyed::with_states(Plain::of(*packing.quota()), now, &states);
            Self::Unpacked(Unpacked { table, packing, reach: packing.reach(now) })
        };
    }
}

impl<T: PackedStates> LimitTable for PackedTable<T> {
    type State = packing::State<T::Packing>;
    fn new(quota: Quota, now: u64) -> Self {
        match <T::Packing as Packing>::new(quota) {
            Some(packing) => Self::Packed(T::new(packing, now)),
            None => Self::Plain(Keyed::new(Plain::of(quota), now)),
        }
    }
    #[inline]
    fn decide(&mut self, id: u64, now: u64, cost: u64, commit: bool) -> Decision {
        match self {
            Self::Packed(t) if t.swept().reach.covers(now) => t.decide(id, now, cost, commit),
            Self::Plain(t) => Keyed::decide(t, id, now, cost, commit),
            Self::Unpacked(u) if u.reach.covers(now) => Keyed::decide(&mut u.table, id, now, cost, commit),
            _ => self.decide_out_of_reach(id, now, cost, commit),
        }
    }
    fn shrink(&mut self, now: u64) {
        match self {
            Self::Packed(t) => t.rebuild(now, 0),
            Self::Plain(t) => t.rebuild(now, 0),
            // With the idle states gone, the rest may fit again.
            Self::Unpacked(u) => {
                u.table.rebuild(now, 0);
                self.rereference(now);
            }
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Packed(t) => t.len(),
            Self::Plain(t) => Keyed::len(t),
            Self::Unpacked(u) => Keyed::len(&u.table),
        }
    }
    fn hold(&mut self, id: u64, now: u64) {
        if matches!(self, Self::Packed(t) if !t.swept().reach.covers(now)) {
            self.rereference(now);
        }
        if let Self::Packed(t) = self {
            t.hold(id);
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
            Self::Plain(_) | Self::Unpacked(_) => None,
        }
    }
    fn give_back(&mut self, id: u64, now: u64, window: u64, unused: u64) -> u64 {
        let out_of_reach = match self {
            Self::Packed(t) => !t.swept().reach.covers(now),
            Self::Plain(_) => false,
            Self::Unpacked(u) => !u.reach.covers(now),
        };
        if out_of_reach {
            self.rereference(now);
        }
        match self {
            Self::Packed(t) => t.give_back(id, window, unused),
            Self::Plain(t) => Keyed::give_back(t, id, window, unused),
            Self::Unpacked(u) => Keyed::give_back(&mut u.table, id, window, unused),
        }
    }
    fn for_each_state(&self, each: impl FnMut(u64, &Self::State)) {
        match self {
            Self::Packed(t) => t.for_each_state(each),
            Self::Plain(t) => Keyed::for_each_state(t, each),
            Self::Unpacked(u) => Keyed::for_each_state(&u.table, each),
        }
    }
    /// Packed when every state fits relative to `now`, as after a
    /// re-reference: restored states may be far from the table's reference.
    fn restore(&mut self, now: u64, states: Vec<(u64, Self::State)>) {
        self.rereference_with(now, states);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::counter_table::CounterTable;
    use super::super::packing::PackedFixed;
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn peek<T: PackedStates>(table: &mut PackedTable<T>, id: u64, now: u64) -> (u64, Duration) {
        let d = table.decide(id, now, 0, false);
        (d.remaining, d.reset_after)
    }

    /// Packed, plain while a state written before a long step back is too
    /// far ahead, packed again once the clock has come close to it. A
    /// permit taken 2 ms into a window counts for `tail` more ms.
    fn unpacks_after_a_long_step_back_and_packs_again<T: PackedStates>(permits: u64, tail: u64) {
        let ms = |ms: u64| Duration::from_millis(ms + tail);
        let quota = Quota::new(permits, Duration::from_millis(3)).unwrap();
        let mut table = PackedTable::<T>::new(quota, T0);
        assert!(table.decide(1, T0, 1, true).allowed);
        // Back 40,000 windows, past 2^15: window T0 / 3 no longer fits.
        let back = T0 - 120_000;
        assert!(matches!(table, PackedTable::Packed(_)));
        assert!(table.decide(3, back, 1, true).allowed);
        assert!(matches!(table, PackedTable::Unpacked(_)));
        assert_eq!(table.len(), 2);
        assert_eq!(peek(&mut table, 1, back).1, ms(120_000), "ahead, as written");
        // Forward 20,000 windows, past the reach: the state ahead fits again,
        // and so does the other one, idle but not forgotten.
        let later = back + 60_000;
        assert_eq!(peek(&mut table, 1, later), (permits - 1, ms(60_000)));
        assert!(matches!(table, PackedTable::Packed(_)));
        assert_eq!(table.len(), 2);
        // A short step back keeps the reference: everything still fits.
        assert!(table.decide(5, later - 3_000, 1, true).allowed);
        assert!(matches!(table, PackedTable::Packed(_)));
        assert_eq!(peek(&mut table, 5, later - 3_000).1, ms(0));
        assert_eq!(peek(&mut table, 1, later - 3_000).1, ms(63_000));
    }

    #[test]
    fn counter_tables_unpack_after_a_long_step_back_and_pack_again() {
        unpacks_after_a_long_step_back_and_packs_again::<CounterTable>(10_000_000, 4);
    }

    #[test]
    fn fixed_window_tables_unpack_after_a_long_step_back_and_pack_again() {
        unpacks_after_a_long_step_back_and_packs_again::<Keyed<PackedFixed>>(1 << 47, 1);
    }

    #[test]
    fn forward_time_keeps_idle_states_as_a_plain_table_would() {
        let quota = Quota::new(10_000_000, Duration::from_millis(3)).unwrap();
        let mut table = PackedTable::<CounterTable>::new(quota, T0);
        assert!(table.decide(1, T0, 1, true).allowed);
        // Past the reach: re-referenced, state 1 idle but kept, and it fits.
        let on = T0 + 3 * ((1 << 14) + 1);
        assert!(table.decide(3, on, 1, true).allowed);
        assert!(matches!(table, PackedTable::Packed(_)));
        assert_eq!(table.len(), 2);
        // Past it again, more than 2^15 windows after state 1: kept plain.
        let further = on + 3 * ((1 << 14) + 1);
        assert!(table.decide(5, further, 1, true).allowed);
        assert!(matches!(table, PackedTable::Unpacked(_)));
        // A step back to state 1's window finds it as written.
        assert_eq!(peek(&mut table, 1, T0), (9_999_999, Duration::from_millis(4)));
        assert_eq!(peek(&mut table, 5, T0).1, Duration::from_millis(further - T0 + 4));
        // A sweep forgets the idle states; what is left fits.
        table.shrink(further);
        assert!(matches!(table, PackedTable::Packed(_)));
        assert_eq!(table.len(), 1);
        assert_eq!(peek(&mut table, 5, further).1, Duration::from_millis(4));
    }

    #[test]
    fn a_sweep_packs_again_what_fits() {
        let quota = Quota::new(10_000_000, Duration::from_millis(3)).unwrap();
        let mut table = PackedTable::<CounterTable>::new(quota, T0);
        assert!(table.decide(1, T0, 1, true).allowed);
        assert!(table.decide(3, T0 - 120_000, 1, true).allowed);
        assert!(matches!(table, PackedTable::Unpacked(_)));
        table.shrink(T0 - 120_000);
        assert!(matches!(table, PackedTable::Unpacked(_)), "state 1 is still too far ahead");
        table.shrink(T0 - 60_000);
        assert!(matches!(table, PackedTable::Packed(_)));
        assert_eq!(peek(&mut table, 1, T0 - 60_000).1, Duration::from_millis(60_004));
    }
}
