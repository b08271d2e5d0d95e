//! The tests' shorthand for the store API: identities from names, and one
//! request (one charge, several, or several under a penalty) as one call.
//! Shared by every test binary, the embedded store's included
//! (`#[path = "support/decide.rs"]`, without the Redis helpers).
#![allow(dead_code)] // each test binary uses its own part of this module

use std::future::Future;

use slidegate::{
    Charge, Clock, Decision, Identity, Limit, MemoryStore, Outcome, Penalty, Request, Store, StoreError,
};

/// The identity a test calls `name`: a named identity in scope `t`, so its
/// Redis keys read `<prefix>{t:n:<name>}:...`.
pub fn id(name: &str) -> Identity {
    Identity::named("t", name)
}

/// `(limit, cost)` pairs as the store's charges.
pub fn charges(pairs: &[(Limit, u64)]) -> Vec<Charge> {
    pairs.iter().map(|&(limit, cost)| Charge::new(limit, cost)).collect()
}

/// One [`Store::decide`] call, in the shapes the tests ask for.
pub trait Decide: Store {
    /// `cost` permits of `limit` for `identity`: the one decision.
    fn decide_one(
        &self,
        identity: &Identity,
        limit: &Limit,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let charge = [Charge::new(*limit, cost)];
        let identity = identity.clone();
        async move { self.decide(Request::new(&identity, &charge)).await.map(|o| only(&o)) }
    }

    /// Several charges for `identity`, all or nothing: one decision each.
    fn decide_all(
        &self,
        identity: &Identity,
        pairs: &[(Limit, u64)],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        let (identity, charges) = (identity.clone(), charges(pairs));
        async move { self.decide(Request::new(&identity, &charges)).await.map(|o| o.decisions.to_vec()) }
    }

    /// Several charges for `identity` under `penalty`.
    fn decide_all_penalized(
        &self,
        identity: &Identity,
        pairs: &[(Limit, u64)],
        penalty: &Penalty,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        let (identity, charges, penalty) = (identity.clone(), charges(pairs), *penalty);
        async move { self.decide(Request::new(&identity, &charges).with_penalty(&penalty)).await }
    }
}

impl<S: Store> Decide for S {}

/// [`Decide`] for the embedded store, without a runtime.
pub trait DecideSync {
    /// `cost` permits of `limit` for `identity`: the one decision.
    fn decide_one_sync(&self, identity: &Identity, limit: &Limit, cost: u64) -> Result<Decision, StoreError>;
    /// Several charges for `identity`, all or nothing: one decision each.
    fn decide_all_sync(
        &self,
        identity: &Identity,
        pairs: &[(Limit, u64)],
    ) -> Result<Vec<Decision>, StoreError>;
}

impl<C: Clock> DecideSync for MemoryStore<C> {
    fn decide_one_sync(&self, identity: &Identity, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        self.decide_sync(Request::new(identity, &[Charge::new(*limit, cost)])).map(|o| only(&o))
    }

    fn decide_all_sync(
        &self,
        identity: &Identity,
        pairs: &[(Limit, u64)],
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide_sync(Request::new(identity, &charges(pairs))).map(|o| o.decisions.to_vec())
    }
}

/// The decision of a one-charge request without a penalty: there is exactly one.
fn only(outcome: &Outcome) -> Decision {
    match &*outcome.decisions {
        [decision] => *decision,
        other => panic!("one charge, {} decisions", other.len()),
    }
}
