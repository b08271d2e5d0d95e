//! Lifting a penalty block on every instance sharing the store.
//!
//! A lift (`RateLimiter::lift_penalty`) forgets the identity's penalty
//! state in the store, and this instance's copies of it (its deny cache's
//! denials and blocks, the fallback's seeds), for every rule with a penalty
//! or the one named. The other instances each hold the block in their own
//! deny cache for its whole length, so the lift is recorded in the shared
//! table [`LIFTS`] — field `<rule>\n<id>`, value a nonce, live for the
//! rule's `max_block` (no cached block outlives it) — and every instance
//! polls that table in the background (`RateLimiter::apply_lifts`, never on
//! a request's path) and forgets the cached entries of each lift it has not
//! applied yet. A block is so lifted everywhere within one poll interval
//! plus one store call of the lift.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slidegate::protect::Protected;
use slidegate::{Identity, Penalty, SharedTables, Store, StoreError, TableName};

use crate::metrics::Metrics;
use crate::offenders::IdentityHash;

/// The shared table lifts are recorded in.
pub const LIFTS: &str = "lifts";

/// Why a lift was refused. A lift of an identity with no block is not an
/// error: [`RateLimiter::lift_penalty`](crate::RateLimiter::lift_penalty)
/// answers an empty list.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiftError {
    /// No rule of that name.
    #[error("no rule is named {0:?}")]
    UnknownRule(String),
    /// The rule named has no penalty box.
    #[error("rule {0:?} has no [rules.penalty]: nothing to lift")]
    NoPenalty(String),
    /// No rule has a penalty box.
    #[error("no rule has a [rules.penalty]: nothing to lift")]
    NoPenaltyRules,
    /// The store keeps no shared tables: the other instances could not hear of the lift.
    #[error("the store keeps no shared tables, so other instances could not hear of a lift")]
    NoTables,
    /// The store failed; nothing may have been lifted.
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
}

/// A block lifted under one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifted {
    /// The rule.
    pub rule: String,
    /// How long the block had left.
    pub blocked_for: Duration,
}

/// A rule as a lift sees it: its name, its identities' scope, its penalty.
pub(crate) struct PenaltyRule<'a> {
    pub(crate) name: &'a str,
    pub(crate) scope: &'a Arc<str>,
    pub(crate) penalty: Option<&'a Penalty>,
}

/// Lifts `hash`'s blocks under `rule` (or every rule with a penalty) and
/// records each in the shared table.
pub(crate) async fn lift<S: Store + 'static>(
    store: &Protected<S>,
    metrics: &Metrics,
    rules: &[PenaltyRule<'_>],
    hash: IdentityHash,
    rule: Option<&str>,
) -> Result<Vec<Lifted>, LiftError> {
    let chosen: Vec<(&PenaltyRule<'_>, &Penalty)> = match rule {
        Some(name) => {
            let r =
                rules.iter().find(|r| r.name == name).ok_or_else(|| LiftError::UnknownRule(name.into()))?;
            let penalty = r.penalty.ok_or_else(|| LiftError::NoPenalty(name.into()))?;
            vec![(r, penalty)]
        }
        None => rules.iter().filter_map(|r| Some((r, r.penalty?))).collect(),
    };
    if chosen.is_empty() {
        return Err(LiftError::NoPenaltyRules);
    }
    let tables = store.tables().ok_or(LiftError::NoTables)?;
    let table = lifts_table();
    let mut lifted = Vec::new();
    for (r, penalty) in chosen {
        let identity = Identity::new(Arc::clone(r.scope), hash.kind(), hash.digest());
        let Some(blocked_for) = store.lift_penalty(&identity, None).await? else { continue };
        let ttl = Duration::from_millis(penalty.max_block_ms().max(1));
        tables.put_entry(&table, &field(r.name, hash), &nonce(), ttl, None).await?;
        metrics.store().penalty_lifts.fetch_add(1, Relaxed);
        lifted.push(Lifted { rule: r.name.to_owned(), blocked_for });
    }
    Ok(lifted)
}

/// The lifts this instance has applied: each field with the nonce it had.
#[derive(Debug, Default)]
pub struct AppliedLifts(HashMap<Vec<u8>, Vec<u8>>);

/// Forgets, from this instance's deny cache and fallback, the identities
/// of every lift in the shared table not yet in `applied`. Returns how many
/// it applied.
pub(crate) async fn apply<S: Store + 'static>(
    store: &Protected<S>,
    metrics: &Metrics,
    rules: &[PenaltyRule<'_>],
    applied: &mut AppliedLifts,
) -> Result<usize, StoreError> {
    // No rule with a penalty: no block to forget, and no read to make.
    if rules.iter().all(|r| r.penalty.is_none()) {
        return Ok(0);
    }
    let Some(tables) = store.tables() else { return Ok(0) };
    let entries = tables.read_table(&lifts_table(), None).await?;
    let mut fresh = 0;
    let mut live = HashMap::with_capacity(entries.len());
    for entry in entries {
        if applied.0.get(&entry.field) != Some(&entry.value) {
            if let Some(identity) = identity_of(&entry.field, rules) {
                store.forget_in_process(&identity);
                fresh += 1;
            }
        }
        live.insert(entry.field, entry.value);
    }
    // Only live lifts are remembered: the set stays as small as the table.
    applied.0 = live;
    metrics.store().lifts_applied.fetch_add(fresh as u64, Relaxed);
    Ok(fresh)
}

fn lifts_table() -> TableName {
    TableName::new(LIFTS).expect("\"lifts\" is a valid table name")
}

/// A lift's field: the rule, a newline (no rule name has one), the id.
fn field(rule: &str, hash: IdentityHash) -> Vec<u8> {
    format!("{rule}\n{}", hash.id()).into_bytes()
}

/// The identity a lift's field names, when its rule is one of `rules`
/// (a lift under a rule this configuration lacks has nothing to forget).
fn identity_of(field: &[u8], rules: &[PenaltyRule<'_>]) -> Option<Identity> {
    let text = std::str::from_utf8(field).ok()?;
    let (rule, id) = text.split_once('\n')?;
    let hash: IdentityHash = id.parse().ok()?;
    let r = rules.iter().find(|r| r.name == rule)?;
    Some(Identity::new(Arc::clone(r.scope), hash.kind(), hash.digest()))
}

/// A value unique to one lift: a second lift of the same identity, while
/// the first is still in the table, must be applied again.
fn nonce() -> Vec<u8> {
    let ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), ns);
    format!("{ns:x}-{random:016x}").into_bytes()
}
