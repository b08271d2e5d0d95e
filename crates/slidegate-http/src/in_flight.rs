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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use slidegate::Identity;

const SHARDS: usize = 16;

/// The requests in flight per identity, shared by every clone of a limiter.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    shards: [Mutex<HashMap<Identity, u32>>; SHARDS],
}

impl InFlight {
    fn shard(&self, identity: &Identity) -> &Mutex<HashMap<Identity, u32>> {
        // The folded hash is uniform; its top bits pick the shard, the map
        // rehashes the whole with its own seed.
        &self.shards[(identity.folded() >> 60) as usize % SHARDS]
    }

    /// A slot for one more request of `identity`, or `None` when it already
    /// has `max` in flight.
    pub(crate) fn enter(self: &Arc<Self>, identity: &Identity, max: u32) -> Option<InFlightSlot> {
        let mut shard = self.shard(identity).lock().unwrap_or_else(PoisonError::into_inner);
        match shard.get_mut(identity) {
            Some(count) if *count >= max => return None,
            Some(count) => *count += 1,
            None if max == 0 => return None,
            None => {
                shard.insert(identity.clone(), 1);
            }
        }
        Some(InFlightSlot { table: Arc::clone(self), identity: identity.clone() })
    }

    /// How many requests of `identity` are in flight.
    #[cfg(test)]
    pub(crate) fn count(&self, identity: &Identity) -> u32 {
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
pub(crate) struct InFlightSlot {
    table: Arc<InFlight>,
    identity: Identity,
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        let mut shard = self.table.shard(&self.identity).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = shard.get_mut(&self.identity) {
            *count -= 1;
            if *count == 0 {
                shard.remove(&self.identity);
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
