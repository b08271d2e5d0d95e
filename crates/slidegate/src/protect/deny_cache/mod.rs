//! The exact local deny cache: once the store has denied an identity, the
//! same identity and limit set is answered here, without a store call, until
//! the store's `retry_after` has passed.
//!
//! # Why it is exact
//!
//! The store denied a request charging cost `c_i` under each limit `i` of a
//! limit set `L` for identity `k`, and said it fits again after `T` (the
//! longest `retry_after` of the violated limits, each exact to the
//! millisecond). A request of the same `k` and `L` whose every cost is at
//! least the denied one (`c'_i ≥ c_i`), arriving before `T`, would be denied
//! by the store too:
//!
//! - **A denial charges nothing** (`decide_all` charges all limits or none),
//!   so the denied request left the state as it found it.
//! - **Without charges, state only decays toward admitting.** Every
//!   algorithm's state is a function of the admitted charges and the time:
//!   a fixed window resets, a sliding window's previous count weighs less, a
//!   GCRA's theoretical arrival time and a token bucket's debt fall behind
//!   the clock, a sliding log's entries age out. The earliest time a charge
//!   of `c_i` fits under limit `i` is what its `retry_after` computes, and
//!   for `c'_i ≥ c_i` it is no earlier (needing more room never needs less
//!   time); the request fits when every limit does.
//! - **Other arrivals only add charges** (this instance's smaller costs,
//!   which still go to the store, and every other instance's): a charge
//!   never makes room, so it can only push the earliest fitting time later.
//!
//! Hence the store would admit no such request before `T`: answering
//! those locally changes no decision. `T` is measured on the local monotonic
//! clock from the moment the store call *started*: the store decided after
//! that moment, so the local deadline is never later than the store's.
//!
//! # Where it does not hold, and what happens then
//!
//! - **A smaller cost** under any limit than the cached one may fit
//!   earlier: it goes to the store (a miss), whose answer replaces the entry
//!   if it is a denial.
//! - **A changed limit set** (another rule, a split rule's other set, a
//!   configuration built anew): entries are keyed by identity *and* by a
//!   fingerprint of the limits, so a changed set misses.
//! - **Several instances** share a store: each caches only the denials it
//!   was told of. Each is still exact; an instance that has not yet been
//!   told asks the store once.
//! - **The store's clock steps** (Redis `TIME`, or a client clock): the
//!   cache counts `retry_after` on the local monotonic clock. If the store's
//!   clock steps *back*, the store would still deny at local `T`; the request
//!   then goes to the store, which denies and re-caches — still exact. If it
//!   steps *forward* by `Δ`, the store would have admitted up to `Δ` before
//!   `T`: the cache denies for up to `Δ` longer than the store would have.
//!   A step forward also ages every identity's state at once in the store, so
//!   this is the one case where the cache is stricter than the store.
//! - **The store's state is deleted** (a flushed Redis, an expired key):
//!   the store would admit at once; the cache keeps denying until `T`. The
//!   identity had exceeded its quota, so this errs on its side.
//!
//! # Bounded memory
//!
//! A fixed number of buckets of [`WAYS`] slots each, each bucket behind its
//! own mutex; an identity's keyed hash picks the bucket. A full bucket evicts
//! an expired slot if it has one, else the slot whose denial ends first: that
//! entry would stop saving store calls soonest, and an evicted identity only
//! costs one store call to come back. The hash is keyed per process, so a
//! client cannot choose identities that crowd one bucket. Each slot holds
//! the identity (a shared scope and a 16-byte digest), the deadline, the
//! denied costs and the decisions to replay the headers: about 100 bytes
//! plus 56 per limit of the rule. A bucket's slots are allocated by its
//! first denial: an idle process holds only the empty buckets (32 bytes
//! each, 256 KB for the default capacity), and memory grows with the
//! identities denied, up to the capacity.
//!
//! # As a layer
//!
//! [`DenyCached`] puts the cache in front of a store and is a store itself:
//! a hit answers with [`Origin::Cache`]; a miss asks the store and remembers
//! its answer. Under a penalty the store counts denials toward a block, so
//! only a block is answered locally then.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Charge, Decision, Decisions, Identity, Origin, Outcome, Request, Store, StoreError};

use super::Events;
use super::Ticks;
use crate::penalty::block_denials;

/// Slots per bucket: a lookup compares at most this many entries.
pub const WAYS: usize = 8;

/// The default capacity (`[store] deny_cache`): 64 Ki denied identities, a
/// few MB.
pub const DEFAULT_CAPACITY: usize = 1 << 16;

/// One cached denial.
#[derive(Debug)]
struct Slot {
    /// Hash of the identity and of the limit set: compared first, cheaply.
    fingerprint: u64,
    /// The identity, compared in full: a hash collision never denies.
    identity: Identity,
    /// The fingerprint of the limit set alone, compared in full too.
    set: u64,
    /// The denied request's cost under each limit.
    costs: Box<[u64]>,
    /// When the store call that denied started (`Ticks` ms).
    decided_at_ms: u64,
    /// When the denial ends (`Ticks` ms): `decided_at_ms` + the longest `retry_after`.
    until_ms: u64,
    /// The store's decisions, replayed with the elapsed time taken off.
    decisions: Box<[Decision]>,
    /// A penalty-box block: it covers every cost, not only `cost` and above.
    blocked: bool,
}

/// A cached denial, as of the lookup's time.
#[derive(Debug)]
pub struct CachedDenial {
    /// One decision per limit, waits counted down.
    pub decisions: Vec<Decision>,
    /// Whether the identity is blocked by the penalty box.
    pub blocked: bool,
}

/// A fixed-capacity cache of store denials (see the module docs).
#[derive(Debug)]
pub struct DenyCache {
    buckets: Box<[Mutex<Vec<Slot>>]>,
    hasher: std::hash::RandomState,
    /// How many slots hold an entry (expired ones included). While none
    /// does — every identity within its limits — a lookup and an
    /// admission's `remember` have nothing to find, and skip the hashing and
    /// the bucket's lock that every decision would otherwise pay.
    occupied: AtomicUsize,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl DenyCache {
    /// A cache of about `capacity` denials (rounded up to whole buckets);
    /// `None` for a capacity of 0 (the cache is off).
    pub fn new(capacity: usize) -> Option<Self> {
        if capacity == 0 {
            return None;
        }
        let buckets = capacity.div_ceil(WAYS);
        Some(Self {
            buckets: (0..buckets).map(|_| Mutex::new(Vec::new())).collect(),
            hasher: std::hash::RandomState::new(),
            occupied: AtomicUsize::new(0),
        })
    }

    /// How many denials the cache holds at most.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.buckets.len() * WAYS
    }

    /// How many slots are allocated, used or not.
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.buckets.iter().map(|b| self.bucket(b).capacity()).sum()
    }

    /// Whether no slot holds an entry. Read without a lock: a `remember`
    /// racing with it is ordered before or after it, as it would be by the
    /// bucket's lock.
    fn is_empty(&self) -> bool {
        self.occupied.load(Ordering::Relaxed) == 0
    }

    /// The fingerprint of a limit set: its algorithms and quotas, in order.
    fn set_fingerprint(&self, charges: &[Charge]) -> u64 {
        let mut h = self.hasher.build_hasher();
        for charge in charges {
            charge.limit.hash(&mut h);
        }
        h.finish()
    }

    fn locate(&self, identity: &Identity, set: u64) -> (u64, &Mutex<Vec<Slot>>) {
        let mut h = self.hasher.build_hasher();
        identity.hash(&mut h);
        set.hash(&mut h);
        let fingerprint = h.finish();
        let index = (fingerprint % self.buckets.len() as u64) as usize;
        (fingerprint, &self.buckets[index])
    }

    fn bucket<'a>(&self, bucket: &'a Mutex<Vec<Slot>>) -> std::sync::MutexGuard<'a, Vec<Slot>> {
        // A panic while holding the lock leaves slots that are each still sound.
        bucket.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The decisions of a cached denial of `identity` under `charges` that
    /// covers them at `now_ms`, with `retry_after` and `reset_after` counting
    /// down; `None` when the store must decide.
    pub fn lookup(&self, identity: &Identity, charges: &[Charge], now_ms: u64) -> Option<CachedDenial> {
        if self.is_empty() {
            return None;
        }
        let set = self.set_fingerprint(charges);
        let (fingerprint, bucket) = self.locate(identity, set);
        let slots = self.bucket(bucket);
        let slot =
            slots.iter().find(|s| s.fingerprint == fingerprint && s.set == set && s.identity == *identity)?;
        let covered =
            slot.costs.len() == charges.len() && charges.iter().zip(&*slot.costs).all(|(c, &d)| c.cost >= d);
        if now_ms >= slot.until_ms || !(covered || slot.blocked) {
            return None;
        }
        let elapsed = Duration::from_millis(now_ms - slot.decided_at_ms);
        let decisions = slot
            .decisions
            .iter()
            .map(|d| {
                let reset_after = d.reset_after.saturating_sub(elapsed);
                match d.retry_after {
                    Some(wait) if wait > elapsed => {
                        Decision { reset_after, retry_after: Some(wait - elapsed), ..*d }
                    }
                    // This limit's own wait is over: the store would no
                    // longer list it as violated; a longer one still binds.
                    Some(_) => Decision { allowed: true, reset_after, retry_after: None, ..*d },
                    None => Decision { reset_after, ..*d },
                }
            })
            .collect();
        Some(CachedDenial { decisions, blocked: slot.blocked })
    }

    /// Remembers what the store decided for `identity` under `charges`, in
    /// a call that started at `started_ms`: a denial is cached until its
    /// longest `retry_after`; an admission (of smaller costs) drops the
    /// entry, whose headers would no longer be the store's. A `blocked`
    /// denial (the penalty box) then covers every cost.
    pub fn remember(
        &self,
        identity: &Identity,
        charges: &[Charge],
        decisions: &[Decision],
        started_ms: u64,
        blocked: bool,
    ) {
        let wait = decisions.iter().filter(|d| !d.allowed).filter_map(|d| d.retry_after).max();
        let wait = wait.filter(|w| !w.is_zero() && charges.iter().any(|c| c.cost > 0));
        if wait.is_none() && self.is_empty() {
            // An admission, and no entry it could make stale.
            return;
        }
        let set = self.set_fingerprint(charges);
        let (fingerprint, bucket) = self.locate(identity, set);
        let Some(wait) = wait else {
            // The store's state moved (an admission charged it): a cached
            // denial is still a denial, but its headers would be stale.
            let mut slots = self.bucket(bucket);
            let before = slots.len();
            slots.retain(|s| !(s.fingerprint == fingerprint && s.set == set && s.identity == *identity));
            self.occupied.fetch_sub(before - slots.len(), Ordering::Relaxed);
            return;
        };
        let slot = Slot {
            fingerprint,
            identity: identity.clone(),
            set,
            costs: charges.iter().map(|c| c.cost).collect(),
            decided_at_ms: started_ms,
            until_ms: started_ms.saturating_add(millis(wait)),
            decisions: decisions.into(),
            blocked,
        };
        let mut slots = self.bucket(bucket);
        if let Some(old) =
            slots.iter_mut().find(|s| s.fingerprint == fingerprint && s.set == set && s.identity == *identity)
        {
            *old = slot;
        } else if slots.len() < WAYS {
            // The bucket's one allocation, at its first denial.
            let len = slots.len();
            slots.reserve_exact(WAYS - len);
            slots.push(slot);
            self.occupied.fetch_add(1, Ordering::Relaxed);
        } else if let Some(victim) = slots.iter_mut().min_by_key(|s| s.until_ms) {
            // An expired slot has the smallest deadline of all, so it goes first.
            *victim = slot;
        }
    }
}

impl DenyCache {
    /// Forgets every cached denial and block of `identity` (under any limit
    /// set): a lifted penalty. Visits every bucket, one lock at a time:
    /// about a millisecond for the default capacity, and only for a lift.
    /// Returns how many entries it forgot.
    pub fn forget(&self, identity: &Identity) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut forgotten = 0;
        for bucket in &*self.buckets {
            let mut slots = self.bucket(bucket);
            let before = slots.len();
            slots.retain(|s| s.identity != *identity);
            forgotten += before - slots.len();
        }
        self.occupied.fetch_sub(forgotten, Ordering::Relaxed);
        forgotten
    }
}

/// A store behind the deny cache, itself a store (see the module docs).
pub struct DenyCached<S> {
    cache: Option<DenyCache>,
    inner: S,
    events: Arc<dyn Events>,
    ticks: Ticks,
}

impl<S> std::fmt::Debug for DenyCached<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCached").field("cache", &self.cache.is_some()).finish_non_exhaustive()
    }
}

impl<S> DenyCached<S> {
    /// `inner` behind a cache of about `capacity` denials (none at 0),
    /// telling `events` of its hits.
    pub(crate) fn new(inner: S, capacity: usize, events: Arc<dyn Events>, ticks: Ticks) -> Self {
        Self { cache: DenyCache::new(capacity), inner, events, ticks }
    }

    /// The store behind the cache.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Forgets `identity`'s cached denials and blocks (`DenyCache::forget`).
    pub fn forget(&self, identity: &Identity) -> usize {
        self.cache.as_ref().map_or(0, |cache| cache.forget(identity))
    }
}

impl<S> DenyCached<S> {
    /// The cache's answer to `request` at `now_ms`, counted, if it holds
    /// one (a block answers a request under a penalty too).
    fn cached(&self, cache: &DenyCache, request: Request<'_>, now_ms: u64) -> Option<Outcome> {
        let hit = cache.lookup(request.identity, request.charges, now_ms)?;
        if !hit.blocked && request.penalty.is_some() {
            return None;
        }
        self.events.deny_cache_hit();
        let outcome = match hit.decisions.iter().filter_map(|d| d.retry_after).max() {
            Some(wait) if hit.blocked => Outcome::blocked(Decisions::none(), millis(wait)),
            _ => Outcome::decided(hit.decisions),
        };
        Some(outcome.from_origin(Origin::Cache))
    }
}

/// Remembers the store's `outcome` of `request`, asked at `started_ms`:
/// its denials, or its block as the denial of every charge.
fn remember(cache: &DenyCache, request: Request<'_>, outcome: &Outcome, started_ms: u64) {
    match outcome.blocked_for {
        Some(wait) => {
            let denials = block_denials(request.charges, wait);
            cache.remember(request.identity, request.charges, &denials, started_ms, true);
        }
        None => cache.remember(request.identity, request.charges, &outcome.decisions, started_ms, false),
    }
}

impl<S: Store> Store for DenyCached<S> {
    async fn decide(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        let Some(cache) = &self.cache else {
            return self.inner.decide(request).await;
        };
        let started_ms = self.ticks.now_ms();
        if let Some(outcome) = self.cached(cache, request, started_ms) {
            return Ok(outcome);
        }
        let outcome = self.inner.decide(request).await?;
        remember(cache, request, &outcome, started_ms);
        Ok(outcome)
    }

    /// As `decide`, for a stack below that answers at once; `None` at once
    /// for one that may wait, so that a remote store's decision probes the
    /// cache once (a lease layer over the embedded store answering `None`
    /// after a miss costs a second lookup, which counts nothing).
    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        if self.inner.has_outages() {
            return None;
        }
        let Some(cache) = &self.cache else {
            return self.inner.decide_now(request);
        };
        let started_ms = self.ticks.now_ms();
        if let Some(outcome) = self.cached(cache, request, started_ms) {
            return Some(Ok(outcome));
        }
        let answer = self.inner.decide_now(request)?;
        if let Ok(outcome) = &answer {
            remember(cache, request, outcome, started_ms);
        }
        Some(answer)
    }

    // The store's own: leases (the lease layer, below, takes them), and
    // joint decisions uncached: a joint decision is asked of the store
    // every time, and what it answers is not remembered (a denial of one
    // part is the whole request's, not that identity's alone). An identity
    // the cache holds denied is denied by the store too, so nothing that
    // passes here is charged where the cache would have refused.
    crate::store::forward!((.inner) distinct, tables, leases, joint);

    /// Forgets the identity's cached denials first: whatever the store
    /// answers, this instance no longer answers for it.
    async fn lift_penalty(
        &self,
        identity: &Identity,
        deadline: Option<Instant>,
    ) -> Result<Option<Duration>, StoreError> {
        self.forget(identity);
        self.inner.lift_penalty(identity, deadline).await
    }

    // Outages: the store's (a cached denial is one the store gave).
    crate::store::forward!((.inner) has_outages);
}

#[cfg(test)]
mod tests;
