//! The hot identity: decisions without the shard's lock.
//!
//! An identity asked about again and again from one thread — an attacked
//! endpoint, a busy client — would pay two atomic read-modify-writes of its
//! shard's mutex per decision and make threads queue on it. Instead, a
//! thread that decides twice in a row for the same identity under the lock
//! takes a handle on that identity's slot: a counted reference to the
//! table's array ([`SharedSlots`]), the slot's index and what unpacking
//! needs. Its next decisions for that identity and limit are one load and
//! one compare-and-swap on the slot's state word, and touch no line other
//! threads write but that one.
//!
//! Only the sliding window counter's packed states have handles (their
//! packing leaves a [`FROZEN`] value free). A handle goes stale when its
//! table rebuilds (the old array's states are frozen for good) or when the
//! lock holder freezes the state for a multi-limit decision; either way the
//! thread finds [`FROZEN`], takes the lock, and on its next repeat takes a
//! fresh handle. A stale handle keeps its old array alive until the thread
//! takes another, so each thread holds at most one array that is no longer
//! in use; [`forget`] lets a thread drop its own.
//!
//! [`SharedSlots`]: super::shared_slots::SharedSlots
//! [`FROZEN`]: super::shared_slots::FROZEN

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use super::packing::{PackedCounter, Packing};
use super::shared_slots::{self, Slot};
use crate::algorithm::sliding_window_counter;
use crate::{Decision, Limit};

/// A handle on one identity's slot in one table, with what deciding needs.
pub(crate) struct Handle {
    /// The array and the index of the identity's slot in it.
    pub(super) slots: Arc<[Slot]>,
    pub(super) index: usize,
    pub(super) packing: PackedCounter,
    /// The table's [`Packing::reference`] when the handle was taken.
    pub(super) reference: u64,
    /// From this time on the table must sweep before deciding (the end of
    /// its [`Packing::reach`]), so the handle may not be used. Earlier
    /// times need no check: the state is one the table holds, and a
    /// decision before its window leaves the window as it is (`packing.rs`).
    pub(super) sweep_due_ms: u64,
}

/// Whose handle it is: store, identity, limit.
struct Held {
    store: u64,
    id: u64,
    limit: Limit,
    handle: Handle,
}

thread_local! {
    /// This thread's handle, if it holds one. In an `Rc` so a decision can
    /// take it out of the thread-local's closure for a plain increment and
    /// decide in its caller's frame.
    static HELD: RefCell<Option<Rc<Held>>> = const { RefCell::new(None) };
    /// `(store, identity)` of this thread's last decision under a lock.
    static LAST_LOCKED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Decides `cost` for identity `id` of `store` under `limit` at `now`
/// without a lock, if this thread holds a handle for them that is still in
/// use; `None` otherwise (decide under the lock).
#[inline(always)]
pub(super) fn decide(store: u64, id: u64, limit: &Limit, now: u64, cost: u64) -> Option<Decision> {
    let held = HELD.with_borrow(|held| {
        held.as_ref()
            .filter(|h| h.id == id && h.store == store && h.limit == *limit && now < h.handle.sweep_due_ms)
            .map(Rc::clone)
    })?;
    let Handle { slots, index, packing, reference, .. } = &held.handle;
    shared_slots::update(slots[*index].state(), |packed| {
        let state = packing.unpack(packed, *reference);
        let (next, decision) = sliding_window_counter::decide(state, now, cost, packing.quota());
        (decision, (next != state).then(|| packing.pack(next)))
    })
}

/// Records a decision under the lock for `id` of `store`; whether it
/// repeats this thread's previous one, so a handle is worth taking.
#[inline]
pub(super) fn repeated(store: u64, id: u64) -> bool {
    LAST_LOCKED.replace((store, id)) == (store, id)
}

/// Gives this thread `handle` for `id` of `store` under `limit`, in place of
/// the one it held.
pub(super) fn hold(store: u64, id: u64, limit: Limit, handle: Handle) {
    HELD.set(Some(Rc::new(Held { store, id, limit, handle })));
}

/// Drops this thread's handle if it is on `store`'s tables, so a sweep on
/// this thread gives back the arrays it replaced.
pub(super) fn forget(store: u64) {
    HELD.with_borrow_mut(|held| {
        if held.as_ref().is_some_and(|h| h.store == store) {
            *held = None;
        }
    });
}
