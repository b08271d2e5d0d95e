//! A compact hash table from identity hash to packed state.
//!
//! One flat array of `(id, state)` slots with linear probing: a lookup costs
//! one cache miss in the common case, and there is no per-slot control byte
//! or power-of-two rounding. The table holds at most 80% of its slots and is
//! rebuilt at 53% (×1.875 the live entries), so memory per entry stays within
//! 1.25–1.9× the slot size whatever the count — with 16-byte slots, 20–30 B
//! per identity — where a power-of-two table swings between 1.1× and 2.3×.
//!
//! Entries are never deleted one by one: idle ones are dropped when the table
//! is rebuilt (to grow, or on [`Slots::rebuild`] from a sweep), which keeps
//! probing simple and every lookup free of tombstones.

/// Marks an empty slot. Stored ids always have bit 0 set (see [`slot_id`]).
const EMPTY: u64 = 0;

/// The id under which a keyed hash is stored: never [`EMPTY`]. Setting the
/// low bit merges hashes in pairs, a 2^-63 chance per pair of identities.
pub(super) fn slot_id(hash: u64) -> u64 {
    hash | 1
}

/// An open-addressing table of `(identity hash, value)`.
pub(super) struct Slots<V> {
    slots: Vec<(u64, V)>,
    len: usize,
}

impl<V: Copy + Default> Slots<V> {
    pub(super) fn new() -> Self {
        Self { slots: Vec::new(), len: 0 }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slot an id would start probing from: the high bits of the id
    /// scaled to the table size (no power-of-two size needed).
    fn home(&self, id: u64) -> usize {
        ((u128::from(id) * self.slots.len() as u128) >> 64) as usize
    }

    /// Where `id` is stored, or the empty slot where it would go (`Err`).
    /// The table must have slots: one is always empty (load ≤ 80%).
    fn probe(&self, id: u64) -> Result<usize, usize> {
        let mut i = self.home(id);
        loop {
            match self.slots[i].0 {
                found if found == id => return Ok(i),
                EMPTY => return Err(i),
                _ => i = if i + 1 == self.slots.len() { 0 } else { i + 1 },
            }
        }
    }

    /// The value stored for `id`.
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut V> {
        if self.len == 0 {
            return None;
        }
        match self.probe(id) {
            Ok(i) => Some(&mut self.slots[i].1),
            Err(_) => None,
        }
    }

    /// Whether one more entry would exceed the maximal load of 80%.
    pub(super) fn is_full(&self) -> bool {
        (self.len + 1) * 5 > self.slots.len() * 4
    }

    /// Stores `value` for an `id` that is not in the table; the table must
    /// not be full ([`Slots::is_full`]).
    pub(super) fn insert_new(&mut self, id: u64, value: V) {
        debug_assert!(!self.is_full());
        match self.probe(id) {
            Err(i) => {
                self.slots[i] = (id, value);
                self.len += 1;
            }
            Ok(_) => unreachable!("insert_new called for an id already stored"),
        }
    }

    /// Rebuilds the table with the entries `keep` accepts, sized for them
    /// plus `room` more at 53% load (an empty table frees its memory).
    pub(super) fn rebuild(&mut self, mut keep: impl FnMut(&V) -> bool, room: usize) {
        let live = self.slots.iter().filter(|(id, v)| *id != EMPTY && keep(v)).count();
        let want = live + room;
        let capacity = if want == 0 { 0 } else { (want * 15 / 8).max(8) };
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, V::default()); capacity]);
        self.len = 0;
        for (id, value) in old {
            if id != EMPTY && keep(&value) {
                self.insert_new(id, value);
            }
        }
    }

    /// Every stored `(id, value)`.
    pub(super) fn entries(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.slots.iter().filter(|(id, _)| *id != EMPTY).copied()
    }

    /// Every stored value.
    #[cfg(test)]
    fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().filter(|(id, _)| *id != EMPTY).map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_it_stored_across_growth_and_sweeps() {
        let mut t: Slots<u64> = Slots::new();
        let ids: Vec<u64> = (0..10_000u64).map(|i| slot_id(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))).collect();
        for (n, &id) in ids.iter().enumerate() {
            assert!(t.get_mut(id).is_none());
            if t.is_full() {
                t.rebuild(|_| true, 1);
            }
            t.insert_new(id, n as u64);
            assert!(t.len() * 5 <= t.slots.len() * 4, "load stays at most 80%");
        }
        for (n, &id) in ids.iter().enumerate() {
            assert_eq!(t.get_mut(id).copied(), Some(n as u64));
        }
        t.rebuild(|v| v % 2 == 0, 0);
        assert_eq!(t.len(), 5_000);
        assert!(t.values().all(|v| v % 2 == 0));
        for (n, &id) in ids.iter().enumerate() {
            assert_eq!(t.get_mut(id).copied(), (n % 2 == 0).then_some(n as u64));
        }
        t.rebuild(|_| false, 0);
        assert_eq!((t.len(), t.slots.capacity()), (0, 0), "an empty table frees its memory");
    }
}
