//! Joint decisions: several identities' charges decided all or nothing in
//! one store call — each charged only if every charge of every identity
//! allows. A capability some stores have, asked for through
//! [`Store::joint`](super::Store::joint): the embedded store (every shard
//! involved locked, in shard order) and one Redis server (one script call);
//! not a Redis Cluster, whose identities live in different slots, which no
//! script can write together.
//!
//! What it is for: a request limited under several identities at once (an
//! Envoy request's descriptors: per user, per route, per tenant), admitted
//! only when all of them have room, so that a request refused by one limit
//! takes nothing from the others.

use std::future::Future;
use std::time::Instant;

use super::{validate, Outcome, StoreError};
use crate::{Charge, Identity, InvalidRequest};

/// One identity's charges in a joint request.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// Who is charged.
    pub identity: &'a Identity,
    /// Its charges, at most one per limit.
    pub charges: &'a [Charge],
}

/// A store that decides several identities at once: see the module docs.
pub trait JointStore: Send + Sync {
    /// Decides every part's charges all or nothing: if any charge of any
    /// part denies, nothing is charged, and the charges that had room report
    /// their state without this request (a cost-0 peek). One outcome per
    /// part, in order, one decision per charge, with who answered
    /// ([`Outcome::origin`]: a layer may answer for the store). No penalty
    /// box applies.
    ///
    /// Rejects, before touching any state, what [`Store::decide`]
    /// rejects in any part, no parts, and an identity named by two parts
    /// ([`InvalidRequest::DuplicateIdentity`]: merge its charges instead).
    /// `deadline` is [`Request::deadline`](super::Request::deadline)'s.
    ///
    /// [`Store::decide`]: super::Store::decide
    fn decide_joint(
        &self,
        parts: &[Part<'_>],
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send;
}

/// A store's answer when it makes no joint decisions.
#[derive(Debug, Clone, Copy)]
pub enum NoJoint {}

impl JointStore for NoJoint {
    async fn decide_joint(&self, _: &[Part<'_>], _: Option<Instant>) -> Result<Vec<Outcome>, StoreError> {
        match *self {}
    }
}

impl<J: JointStore> JointStore for &J {
    fn decide_joint(
        &self,
        parts: &[Part<'_>],
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send {
        (**self).decide_joint(parts, deadline)
    }
}

/// The checks of [`JointStore::decide_joint`], before any state is touched.
pub(crate) fn validate_parts(parts: &[Part<'_>]) -> Result<(), StoreError> {
    if parts.is_empty() {
        return Err(StoreError::Invalid(InvalidRequest::NoLimits));
    }
    for (i, part) in parts.iter().enumerate() {
        if parts[..i].iter().any(|seen| seen.identity == part.identity) {
            return Err(StoreError::Invalid(InvalidRequest::DuplicateIdentity(part.identity.to_string())));
        }
        validate(part.charges)?;
    }
    Ok(())
}

/// `flat`, one decision per charge of every part in order, cut into one
/// answer per part (a Redis reply's decisions).
#[cfg(feature = "redis")]
pub(crate) fn split(parts: &[Part<'_>], flat: &[crate::Decision]) -> Vec<Outcome> {
    let mut rest = flat;
    parts
        .iter()
        .map(|part| {
            let (mine, next) = rest.split_at(part.charges.len().min(rest.len()));
            rest = next;
            Outcome::decided(mine.to_vec())
        })
        .collect()
}
