//! The fallback: an embedded limiter that decides while the store cannot,
//! as a layer around the store that is a store itself.
//!
//! It does not start from zero: each answer of a store that can have
//! outages ([`Store::has_outages`]; not the embedded one) is remembered per
//! identity (a bounded map, arbitrary eviction when full), and while the
//! store fails an identity gets at most what the store last said was left
//! (divided among the instances) until the store's reset time; after it, or
//! without a memory of the identity, the rules' limits divided by
//! `instances`, decided by an embedded [`MemoryStore`]. Its answers say
//! [`Origin::Fallback`]. Only failures of the store fall back
//! ([`StoreError::is_unavailable`]); a request no store could decide is
//! still an error.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{
    Charge, Decision, DistinctStore, Identity, InvalidRequest, JointStore, Limit, MemoryStore, Origin,
    Outcome, Part, Quota, Request, Store, StoreError,
};

use super::Ticks;
use crate::penalty::block_denials;

/// Shards of the seed map: requests of different identities rarely share a lock.
const SEED_SHARDS: usize = 16;
/// Identities whose last store decision the fallback remembers, at most:
/// about 100 bytes each, a few MB in all.
pub const SEED_CAPACITY: usize = 1 << 16;

/// How the fallback limiter decides: each of `instances` instances sharing
/// the store enforces `limit / instances` (at least 1) while the store
/// cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackPolicy {
    /// Instances sharing the store (0 counts as 1).
    pub instances: u32,
}

impl Default for FallbackPolicy {
    fn default() -> Self {
        Self { instances: 1 }
    }
}

/// What the store last said of one limit of an identity.
#[derive(Debug, Clone, Copy)]
struct Seed {
    /// Permits this instance may still admit before `reset_at_ms`.
    remaining: u64,
    /// When the store's window is back to the full quota (`Ticks` ms).
    reset_at_ms: u64,
}

/// How often (ms) a shard of the seeds forgets the identities whose every
/// seed is past its reset, when a new identity comes.
const SEED_SWEEP_MS: u64 = 1_000;

/// One shard of the seeds: identity → one seed per limit of its rule.
#[derive(Debug, Default)]
struct SeedShard {
    map: HashMap<Identity, Vec<Seed>>,
    /// When (`Ticks` ms) a new identity next sweeps the shard.
    next_sweep: u64,
}

impl SeedShard {
    /// Forgets the identities none of whose seeds is live (a seed past its
    /// reset decides nothing: the fallback store alone does), and gives the
    /// map's spare room back, so that the seeds of identities seen once
    /// (churn, a crawl) do not stay until the map is full.
    fn sweep(&mut self, now_ms: u64) {
        self.map.retain(|_, seeds| seeds.iter().any(|s| s.reset_at_ms > now_ms));
        if self.map.capacity() > 64.max(4 * self.map.len()) {
            self.map.shrink_to(2 * self.map.len());
        }
        self.next_sweep = now_ms.saturating_add(SEED_SWEEP_MS);
    }
}

/// The embedded limiter and what the store last said.
struct Seeded {
    store: MemoryStore,
    instances: u64,
    hasher: std::hash::RandomState,
    seeds: Box<[Mutex<SeedShard>]>,
}

/// A store with an embedded fallback limiter (when on), itself a store.
pub struct Fallback<S> {
    inner: S,
    seeded: Option<Seeded>,
    ticks: Ticks,
}

impl<S> std::fmt::Debug for Fallback<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let instances = self.seeded.as_ref().map(|s| s.instances);
        f.debug_struct("Fallback").field("instances", &instances).finish_non_exhaustive()
    }
}

impl<S> Fallback<S> {
    /// `inner`, with a fallback limiter deciding by `policy`; without one,
    /// the store's failures pass through.
    pub(crate) fn new(inner: S, policy: Option<FallbackPolicy>, ticks: Ticks) -> Self {
        let seeded = policy.map(|policy| Seeded {
            store: MemoryStore::new(),
            instances: u64::from(policy.instances.max(1)),
            hasher: std::hash::RandomState::new(),
            seeds: (0..SEED_SHARDS).map(|_| Mutex::new(SeedShard::default())).collect(),
        });
        Self { inner, seeded, ticks }
    }

    /// The store behind the fallback.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Forgets what the store last said of `identity` (its seeds).
    pub fn forget(&self, identity: &Identity) {
        if let Some(seeded) = &self.seeded {
            seeded.shard(identity).map.remove(identity);
        }
    }

    /// The embedded fallback store, when on: a caller sweeps it as it sweeps
    /// an embedded store, to give memory back.
    pub fn fallback_store(&self) -> Option<&MemoryStore> {
        self.seeded.as_ref().map(|s| &s.store)
    }
}

impl<S: Store> Fallback<S> {
    /// The store's `answer` to `request`, through the fallback: remembered
    /// to start from in an outage, or, when the store is unavailable,
    /// replaced by the fallback limiter's own decision.
    fn settle(
        &self,
        request: Request<'_>,
        answer: Result<Outcome, StoreError>,
    ) -> Result<Outcome, StoreError> {
        let Some(seeded) = &self.seeded else { return answer };
        match answer {
            // A store without outages is never bridged from what it said.
            Ok(outcome) if !self.inner.has_outages() => Ok(outcome),
            Ok(outcome) => {
                let now_ms = self.ticks.now_ms();
                match outcome.blocked_for {
                    Some(wait) => {
                        seeded.remember(request.identity, &block_denials(request.charges, wait), now_ms)
                    }
                    None => seeded.remember(request.identity, &outcome.decisions, now_ms),
                }
                Ok(outcome)
            }
            Err(err) if err.is_unavailable() => {
                let decisions = seeded.decide(request.identity, request.charges, self.ticks.now_ms());
                Ok(Outcome::decided(decisions).from_origin(Origin::Fallback))
            }
            Err(err) => Err(err),
        }
    }
}

impl<S: Store> Store for Fallback<S> {
    async fn decide(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        let answer = self.inner.decide(request).await;
        self.settle(request, answer)
    }

    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        let answer = self.inner.decide_now(request)?;
        Some(self.settle(request, answer))
    }

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        let inner = self.inner.distinct()?;
        Some(FallbackDistinct { inner, seeded: self.seeded.as_ref() })
    }

    // The store's own: shared tables exist to reach every instance, which
    // no stand-in in this process can (while the store fails, so do they);
    // leases, which the lease layer, below, takes.
    crate::store::forward!((.inner) tables, leases);

    /// The store's, and while it fails the fallback limiter's own joint
    /// decisions: every part under this instance's share of its limits, all
    /// or nothing as the store would decide them.
    fn joint(&self) -> Option<impl JointStore + '_> {
        let inner = self.inner.joint()?;
        Some(FallbackJoint { inner, fallback: self })
    }

    /// Forgets what the store last said of the identity (a block's denials
    /// among it) first, so the fallback does not keep a lifted block either.
    async fn lift_penalty(
        &self,
        identity: &Identity,
        deadline: Option<Instant>,
    ) -> Result<Option<Duration>, StoreError> {
        self.forget(identity);
        self.inner.lift_penalty(identity, deadline).await
    }

    /// Off, the store's; on, none: every outage of the store is decided here.
    fn has_outages(&self) -> bool {
        self.seeded.is_none() && self.inner.has_outages()
    }
}

/// Joint decisions through the fallback: what the store answers is
/// remembered for each part as a decision is; while the store fails, the
/// parts are decided together on the fallback store under each limit's
/// share, denied whole when a part's remembered seed has too little left.
struct FallbackJoint<'a, S, J> {
    inner: J,
    fallback: &'a Fallback<S>,
}

impl<S: Store, J: JointStore> JointStore for FallbackJoint<'_, S, J> {
    async fn decide_joint(
        &self,
        parts: &[Part<'_>],
        deadline: Option<Instant>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let Some(seeded) = &self.fallback.seeded else {
            return self.inner.decide_joint(parts, deadline).await;
        };
        let now_ms = || self.fallback.ticks.now_ms();
        match self.inner.decide_joint(parts, deadline).await {
            Ok(outcomes) => {
                if self.fallback.inner.has_outages() {
                    let now_ms = now_ms();
                    for (part, outcome) in parts.iter().zip(&outcomes) {
                        seeded.remember(part.identity, &outcome.decisions, now_ms);
                    }
                }
                Ok(outcomes)
            }
            Err(err) if err.is_unavailable() => {
                let decisions = seeded.decide_joint(parts, now_ms())?;
                Ok(decisions.into_iter().map(|d| Outcome::decided(d).from_origin(Origin::Fallback)).collect())
            }
            Err(err) => Err(err),
        }
    }
}

/// Crawl breadth through the fallback: while the store fails, the fallback
/// limiter's own sketches admit `distinct / instances` values per window on
/// each instance (from none: a sketch cannot be seeded from a count), so an
/// outage never lifts a breadth limit either.
struct FallbackDistinct<'a, D> {
    inner: D,
    seeded: Option<&'a Seeded>,
}

impl<D: DistinctStore> DistinctStore for FallbackDistinct<'_, D> {
    async fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> Result<Decision, StoreError> {
        match self.inner.decide_distinct(identity, quota, value).await {
            Err(err) if err.is_unavailable() => {
                let (Some(seeded), Some(local)) = (self.seeded, self.seeded.and_then(|s| s.store.distinct()))
                else {
                    return Err(err);
                };
                let share = Quota::new((quota.permits() / seeded.instances).max(1), quota.window())
                    .map_err(|_| err)?;
                local.decide_distinct(identity, &share, value).await
            }
            answer => answer,
        }
    }
}

impl Seeded {
    fn shard(&self, identity: &Identity) -> std::sync::MutexGuard<'_, SeedShard> {
        let index = (self.hasher.hash_one(identity) % SEED_SHARDS as u64) as usize;
        // A panic while holding the lock leaves a map that is still sound.
        self.seeds[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers what the store decided for `identity` at `now_ms`.
    fn remember(&self, identity: &Identity, decisions: &[Decision], now_ms: u64) {
        let seeds: Vec<Seed> = decisions
            .iter()
            .map(|d| Seed {
                remaining: d.remaining / self.instances,
                reset_at_ms: now_ms
                    .saturating_add(u64::try_from(d.reset_after.as_millis()).unwrap_or(u64::MAX)),
            })
            .collect();
        let mut shard = self.shard(identity);
        if let Some(slot) = shard.map.get_mut(identity) {
            *slot = seeds;
            return;
        }
        if now_ms >= shard.next_sweep || shard.map.len() >= SEED_CAPACITY / SEED_SHARDS {
            shard.sweep(now_ms);
        }
        let map = &mut shard.map;
        if map.len() >= SEED_CAPACITY / SEED_SHARDS {
            // Full: forget an arbitrary identity (the hash order), in O(1).
            if let Some(old) = map.keys().next().cloned() {
                map.remove(&old);
            }
        }
        map.insert(identity.clone(), seeds);
    }

    /// Decides `charges` for `identity` at `now_ms` without the store.
    fn decide(&self, identity: &Identity, charges: &[Charge], now_ms: u64) -> Vec<Decision> {
        let mut shard = self.shard(identity);
        let map = &mut shard.map;
        let live = |seed: &Seed| seed.reset_at_ms > now_ms;
        if let Some(seeds) = map.get(identity).filter(|s| s.len() == charges.len()) {
            if seeds.iter().zip(charges).any(|(s, c)| live(s) && s.remaining < c.cost) {
                return seeded_denials(seeds, charges, now_ms);
            }
        }
        let shared: Vec<Charge> = charges.iter().map(|c| Charge::new(self.share(&c.limit), c.cost)).collect();
        let mut decisions: Vec<Decision> = match self.store.decide_sync(Request::new(identity, &shared)) {
            Ok(outcome) => outcome.decisions.to_vec(),
            // A cost above this instance's share: no such request passes here.
            Err(_) => return denials(&shared),
        };
        if let Some(seeds) = map.get_mut(identity).filter(|s| s.len() == charges.len()) {
            let admitted = decisions.iter().all(|d| d.allowed);
            for ((seed, c), d) in seeds.iter_mut().zip(charges).zip(&mut decisions) {
                if live(seed) {
                    if admitted {
                        seed.remaining = seed.remaining.saturating_sub(c.cost);
                    }
                    d.remaining = d.remaining.min(seed.remaining);
                }
            }
        }
        decisions
    }

    /// Decides every part at `now_ms` without the store, all or nothing: a
    /// part whose live seed has less left than a charge costs denies the
    /// whole request (nothing charged: each seeded part told its seeds'
    /// state, the others the fallback store's); else the parts are decided together on the fallback store
    /// under this instance's share, and each admitted part's seeds lowered.
    fn decide_joint(&self, parts: &[Part<'_>], now_ms: u64) -> Result<Vec<Vec<Decision>>, StoreError> {
        let live = |seed: &Seed| seed.reset_at_ms > now_ms;
        let seeds: Vec<Option<Vec<Seed>>> = parts
            .iter()
            .map(|p| {
                self.shard(p.identity).map.get(p.identity).filter(|s| s.len() == p.charges.len()).cloned()
            })
            .collect();
        let short = parts.iter().zip(&seeds).any(|(part, seeds)| {
            seeds
                .as_ref()
                .is_some_and(|s| s.iter().zip(part.charges).any(|(s, c)| live(s) && s.remaining < c.cost))
        });
        // Each charge under this instance's share; a peek (cost 0) when a
        // seed already denies the request, so that nothing is charged.
        let shared: Vec<Vec<Charge>> = parts
            .iter()
            .map(|p| {
                p.charges
                    .iter()
                    .map(|c| Charge::new(self.share(&c.limit), if short { 0 } else { c.cost }))
                    .collect()
            })
            .collect();
        let shared_parts: Vec<Part<'_>> =
            parts.iter().zip(&shared).map(|(p, charges)| Part { identity: p.identity, charges }).collect();
        let outcomes = match self.store.decide_joint_sync(&shared_parts) {
            Ok(outcomes) => outcomes,
            // A cost above this instance's share: no such request passes here.
            Err(StoreError::Invalid(InvalidRequest::CostExceedsLimit { .. })) => {
                return Ok(shared.iter().map(|charges| denials(charges)).collect());
            }
            Err(err) => return Err(err),
        };
        if short {
            return Ok(parts
                .iter()
                .zip(&seeds)
                .zip(outcomes)
                .map(|((part, seeds), peek)| match seeds {
                    Some(seeds) => seeded_denials(seeds, part.charges, now_ms),
                    None => peek.decisions.to_vec(),
                })
                .collect());
        }
        let admitted = outcomes.iter().all(|o| o.decisions.iter().all(|d| d.allowed));
        let mut answers = Vec::with_capacity(parts.len());
        for (part, outcome) in parts.iter().zip(outcomes) {
            let mut decisions = outcome.decisions.to_vec();
            let mut shard = self.shard(part.identity);
            if let Some(seeds) = shard.map.get_mut(part.identity).filter(|s| s.len() == part.charges.len()) {
                for ((seed, c), d) in seeds.iter_mut().zip(part.charges).zip(&mut decisions) {
                    if live(seed) {
                        if admitted {
                            seed.remaining = seed.remaining.saturating_sub(c.cost);
                        }
                        d.remaining = d.remaining.min(seed.remaining);
                    }
                }
            }
            answers.push(decisions);
        }
        Ok(answers)
    }

    /// `limit` with this instance's share of the quota (at least 1 permit).
    fn share(&self, limit: &Limit) -> Limit {
        let permits = (limit.quota.permits() / self.instances).max(1);
        match Quota::new(permits, limit.quota.window()) {
            Ok(quota) => Limit::new(limit.algorithm, quota),
            Err(_) => *limit,
        }
    }
}

/// The answer when a live seed has less left than a charge costs: denied
/// until the store's reset time.
fn seeded_denials(seeds: &[Seed], charges: &[Charge], now_ms: u64) -> Vec<Decision> {
    let live = |seed: &Seed| seed.reset_at_ms > now_ms;
    charges
        .iter()
        .zip(seeds)
        .map(|(c, s)| {
            let wait = Duration::from_millis(s.reset_at_ms.saturating_sub(now_ms));
            let short = live(s) && s.remaining < c.cost;
            Decision {
                allowed: !short,
                limit: c.limit.quota.permits(),
                remaining: if live(s) { s.remaining } else { 0 },
                reset_after: wait,
                retry_after: short.then_some(wait),
            }
        })
        .collect()
}

/// Denials of a request the fallback cannot decide (its cost exceeds a share).
fn denials(charges: &[Charge]) -> Vec<Decision> {
    charges
        .iter()
        .map(|c| Decision {
            allowed: false,
            limit: c.limit.quota.permits(),
            remaining: 0,
            reset_after: c.limit.quota.window(),
            retry_after: Some(c.limit.quota.window()),
        })
        .collect()
}

#[cfg(test)]
mod tests;
