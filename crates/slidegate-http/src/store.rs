//! The store `serve` decides on, chosen at run time: embedded or Redis.
//!
//! [`Store`] returns `impl Future` and so cannot be a trait object; an enum
//! is the run-time choice instead, and costs one branch.

use slidegate::{Decision, Limit, MemoryStore, Store, StoreError};

/// The embedded store or Redis.
#[non_exhaustive]
pub enum AnyStore {
    /// The embedded store: state in this process only.
    Memory(MemoryStore),
}

impl Store for AnyStore {
    async fn decide(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        match self {
            AnyStore::Memory(store) => store.decide_sync(key, limit, cost),
        }
    }

    async fn decide_all(&self, key: &str, charges: &[(Limit, u64)]) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.decide_all_sync(key, charges),
        }
    }
}
