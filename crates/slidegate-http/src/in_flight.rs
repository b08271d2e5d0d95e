//! How many requests of one identity are in flight under a rule charged
//! after the response (`cost_header`, `count_status`).
//!
//! Such a rule peeks before forwarding and charges when the answer comes, so
//! every request of an identity that is in flight at once passes the same
//! peek: without a bound, one identity could put any number of requests to
//! work at the upstream before the first of them is charged. [`InFlight`]
//! counts them per identity (the identity's scope is the rule, so the count
//! is per rule too) and refuses one more than the rule's `max_in_flight`; the
//! overshoot of a limit is then at most `max_in_flight × max_cost` per
//! identity and instance.
//!
//! Memory is what is in flight: an identity's counter is removed when its
//! last request's [`InFlightSlot`] is dropped, so the table holds one entry
//! per identity with a request in flight, never more. The counters are in
//! 16 shards behind their own locks, each held for one map operation; a
//! shard's map hashes the identity with its own random seed, so a client
//! cannot aim at one bucket.
//!
//! The same table counts the requests each client holds in the delay
//! queue (`crate::delay`), keyed by the client rather than an identity.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use slidegate::Identity;

const SHARDS: usize = 16;

/// What [`InFlight`] counts under: a keyed hash, whose uniform bits pick
/// its shard.
pub(crate) trait Counted: Eq + Hash + Clone {
    /// A number from the key's uniform bits; its remainder picks the shard.
    fn spread(&self) -> usize;
}

impl Counted for Identity {
    fn spread(&self) -> usize {
        // The folded hash is uniform; its top bits pick the shard, the map
        // rehashes the whole with its own seed.
        (self.folded() >> 60) as usize
    }
}

/// The requests in flight per identity (or per other [`Counted`] key),
/// shared by every clone of a limiter.
#[derive(Debug)]
pub(crate) struct InFlight<K = Identity> {
    shards: [Mutex<HashMap<K, u32>>; SHARDS],
}

impl<K> Default for InFlight<K> {
    fn default() -> Self {
        Self { shards: std::array::from_fn(|_| Mutex::new(HashMap::new())) }
    }
}

impl<K: Counted> InFlight<K> {
    fn shard(&self, key: &K) -> &Mutex<HashMap<K, u32>> {
        &self.shards[key.spread() % SHARDS]
    }

    /// A slot for one more request of `identity`, or `None` when it already
    /// has `max` in flight.
    pub(crate) fn enter(self: &Arc<Self>, identity: &K, max: u32) -> Option<InFlightSlot<K>> {
        self.enter_if(identity, |count| count < max)
    }

    /// A slot for one more request of `key`, or `None` when `admits` refuses
    /// one more to a key with that many in flight: the count is read and
    /// raised under one lock, so two requests of a key never both pass on
    /// the same count.
    pub(crate) fn enter_if(
        self: &Arc<Self>,
        key: &K,
        admits: impl Fn(u32) -> bool,
    ) -> Option<InFlightSlot<K>> {
        let mut shard = self.shard(key).lock().unwrap_or_else(PoisonError::into_inner);
        match shard.get_mut(key) {
            Some(count) if !admits(*count) => return None,
            Some(count) => *count += 1,
            None if !admits(0) => return None,
            None => {
                shard.insert(key.clone(), 1);
            }
        }
        Some(InFlightSlot { table: Arc::clone(self), key: key.clone() })
    }

    /// How many requests of `identity` are in flight.
    #[cfg(test)]
    pub(crate) fn count(&self, identity: &K) -> u32 {
        self.shard(identity)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(identity)
            .copied()
            .unwrap_or(0)
    }

    /// How many identities have a request in flight.
    #[cfg(test)]
    pub(crate) fn identities(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len()).sum()
    }
}

/// One request in flight: counted until dropped.
#[derive(Debug)]
pub(crate) struct InFlightSlot<K: Counted = Identity> {
    table: Arc<InFlight<K>>,
    key: K,
}

impl<K: Counted> Drop for InFlightSlot<K> {
    fn drop(&mut self) {
        let mut shard = self.table.shard(&self.key).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = shard.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                shard.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use slidegate::Source;

    use super::*;

    fn identity(n: u8) -> Identity {
        slidegate::IdentityHasher::new(b"test").identity("search", Source::ApiKey, &[n])
    }

    #[test]
    fn at_most_max_slots_per_identity_and_a_dropped_slot_frees_one() {
        let table = Arc::new(InFlight::default());
        let (a, b) = (identity(1), identity(2));
        let mut slots: Vec<_> = (0..3).map(|_| table.enter(&a, 3).unwrap()).collect();
        assert!(table.enter(&a, 3).is_none(), "a fourth");
        let other = table.enter(&b, 3).expect("another identity is not held back");
        assert_eq!((table.count(&a), table.count(&b)), (3, 1));
        drop(slots.pop());
        let again = table.enter(&a, 3).expect("a slot was freed");
        assert!(table.enter(&a, 3).is_none());
        drop(again);
        assert_eq!(table.count(&a), 2);
        drop(other);
        assert!(table.enter(&a, 0).is_none(), "max 0 admits nothing");
    }

    /// Memory is what is in flight: an identity whose requests all ended
    /// holds no entry.
    #[test]
    fn counters_are_removed_at_zero() {
        let table = Arc::new(InFlight::default());
        let slots: Vec<_> = (0..=255).map(|n| table.enter(&identity(n), 8).unwrap()).collect();
        assert_eq!(table.identities(), 256);
        drop(slots);
        assert_eq!(table.identities(), 0);
    }
}
