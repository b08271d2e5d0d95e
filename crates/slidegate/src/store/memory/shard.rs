//! One shard of the embedded store: the tables and penalty states of the
//! identities whose hash picks it, and the decisions made under its lock.

use std::collections::HashMap;

use super::kept::Table;
use std::sync::MutexGuard;

use crate::store::{Charge, Decisions, Outcome, Part};
use crate::{Decision, Limit, Penalty, PenaltyState};

#[derive(Default)]
pub(super) struct Shard {
    /// One table per limit seen; an identity rarely meets more than a handful.
    tables: Vec<Table>,
    /// Penalty states by identity hash: only identities that were denied
    /// under a penalty, forgotten by the sweep once idle.
    penalties: HashMap<u64, PenaltyState>,
}

impl Shard {
    pub(super) fn table(&mut self, limit: &Limit, now: u64) -> &mut Table {
        let index = match self.tables.iter().position(|t| t.limit == *limit) {
            Some(i) => i,
            None => {
                self.tables.push(Table::new(*limit, now));
                self.tables.len() - 1
            }
        };
        &mut self.tables[index]
    }

    /// Forgets every idle state, shrinks every table to what remains, drops
    /// empty tables. Returns how many states remain.
    pub(super) fn sweep(&mut self, now: u64) -> usize {
        for table in &mut self.tables {
            table.shrink(now);
        }
        self.tables.retain(|t| t.len() > 0);
        self.tables.shrink_to_fit();
        self.penalties.retain(|_, p| !p.is_idle(now));
        self.penalties.shrink_to_fit();
        self.len()
    }

    /// Forgets identity `id`'s penalty state; the ms its block had left at
    /// `now`, if it was blocked.
    pub(super) fn lift_penalty(&mut self, id: u64, now: u64) -> Option<u64> {
        self.penalties.remove(&id).and_then(|p| p.blocked_for(now))
    }

    pub(super) fn len(&self) -> usize {
        self.tables.iter().map(Table::len).sum()
    }

    /// The tables, one per limit (what a snapshot writes).
    pub(super) fn tables(&self) -> &[Table] {
        &self.tables
    }

    /// The penalty states, by identity.
    pub(super) fn penalties(&self) -> &HashMap<u64, PenaltyState> {
        &self.penalties
    }

    /// Sets the penalty state of identity `id`, unless it has one.
    pub(super) fn restore_penalty(&mut self, id: u64, state: PenaltyState) {
        self.penalties.entry(id).or_insert(state);
    }
}

/// Decides `charges` for identity `id` at `now` all-or-nothing, under the
/// shard's lock the caller holds.
pub(super) fn decide_locked(shard: &mut Shard, id: u64, now: u64, charges: &[Charge]) -> Decisions {
    if let [charge] = charges {
        return Decisions::one(shard.table(&charge.limit, now).decide(id, now, charge.cost, true));
    }
    // No thread may change one of the states between the check and the commit.
    for charge in charges {
        shard.table(&charge.limit, now).states.hold(id, now);
    }
    let mut decisions: Vec<Decision> =
        charges.iter().map(|c| shard.table(&c.limit, now).decide(id, now, c.cost, false)).collect();
    if decisions.iter().all(|d| d.allowed) {
        // Same state, same time: committing reproduces each checked
        // decision, now with the charges of the limits before it applied.
        for (c, decision) in charges.iter().zip(&mut decisions) {
            *decision = shard.table(&c.limit, now).decide(id, now, c.cost, true);
        }
    } else {
        // Nothing is charged, so a limit that had room reports its
        // remaining permits without this request: a peek at cost 0.
        for (c, decision) in charges.iter().zip(&mut decisions) {
            if decision.allowed {
                *decision = shard.table(&c.limit, now).decide(id, now, 0, false);
            }
        }
    }
    for charge in charges {
        shard.table(&charge.limit, now).states.release();
    }
    decisions.into()
}

/// Decides every part's charges all or nothing (`JointStore::decide_joint`),
/// under the locks of all their shards, which the caller holds: part `i` is
/// identity `ids[i]`, living in `shards[at[i]]`. As [`decide_locked`] for one
/// identity: every state is held (out of reach of hot handles) and checked,
/// then all are charged or none.
pub(super) fn decide_joint_locked(
    shards: &mut [MutexGuard<'_, Shard>],
    at: &[usize],
    ids: &[u64],
    parts: &[Part<'_>],
    now: u64,
) -> Vec<Outcome> {
    let each = || parts.iter().zip(ids.iter().copied()).zip(at.iter().copied());
    for ((part, id), s) in each() {
        for charge in part.charges {
            shards[s].table(&charge.limit, now).states.hold(id, now);
        }
    }
    let mut decisions: Vec<Vec<Decision>> = each()
        .map(|((part, id), s)| {
            part.charges
                .iter()
                .map(|c| shards[s].table(&c.limit, now).decide(id, now, c.cost, false))
                .collect()
        })
        .collect();
    let admitted = decisions.iter().flatten().all(|d| d.allowed);
    for (((part, id), s), decided) in each().zip(&mut decisions) {
        for (c, decision) in part.charges.iter().zip(decided.iter_mut()) {
            let table = shards[s].table(&c.limit, now);
            if admitted {
                // Same states, same time: the checked decision, now charged.
                *decision = table.decide(id, now, c.cost, true);
            } else if decision.allowed {
                // Nothing is charged: the state without this request.
                *decision = table.decide(id, now, 0, false);
            }
        }
    }
    for ((part, _), s) in each() {
        for charge in part.charges {
            shards[s].table(&charge.limit, now).states.release();
        }
    }
    decisions.into_iter().map(Outcome::decided).collect()
}

/// Decides `charges` under `penalty` for identity `id`, under the shard's
/// lock the caller holds.
pub(super) fn decide_penalized(
    shard: &mut Shard,
    id: u64,
    now: u64,
    charges: &[Charge],
    penalty: &Penalty,
) -> Outcome {
    if let Some(ms) = shard.penalties.get(&id).and_then(|p| p.blocked_for(now)) {
        return Outcome::blocked(Decisions::none(), ms);
    }
    let decisions = decide_locked(shard, id, now, charges);
    if decisions.iter().all(|d| d.allowed) {
        return Outcome::decided(decisions);
    }
    match shard.penalties.entry(id).or_default().deny(penalty, now) {
        Some(ms) => Outcome::blocked(decisions, ms),
        None => Outcome::decided(decisions),
    }
}
