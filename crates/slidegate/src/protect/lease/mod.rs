//! The lease layer: [`Leased`] wraps a [`Store`] that grants quota leases
//! ([`Store::leases`]) and answers a hot identity's requests from permits
//! it leased, without a store call, while a lease has permits left.
//!
//! # Why it never admits more than the store would
//!
//! A lease's permits are charged in the store before the first is handed
//! out, in the store's one atomic call, so the store's count is always at
//! least what every instance admitted. A leased permit is used only before
//! its window ends (the lease call's send time plus
//! [`Lease::usable_for`](crate::Lease::usable_for), which cannot be
//! after the store's window end: the store read its clock after the call
//! was sent), so it counts in the store where the request it admits would
//! have been counted. `docs/leases.md` gives the argument per algorithm.
//!
//! Where it is not exact:
//! - **under-admission**: permits leased and not used are refused to
//!   others until they are given back — at the lease's next use after its
//!   window ends (for the sliding window counter; a fixed window's count
//!   no longer matters then) or by [`Leased::give_back_all`] (reload,
//!   shutdown). At most `max` per identity and instance at any moment; a
//!   give-back that fails leaves them charged in their window.
//! - **what is leased**: one charge of cost 1, no penalty box, under a
//!   fixed window or sliding window counter limit
//!   ([`crate::store::lease::leasable`]). Every other request goes to
//!   the store as before.
//!
//! # Size
//!
//! `k` is what this instance saw of the identity in the last horizon
//! (its expected requests in the next), at most `max`, at most a quarter of
//! the permits the store said remain (which already excludes every other
//! instance's outstanding leases: they are charged), and 1 — a plain store
//! call — below 2.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::store::lease::leasable;
use crate::{
    Charge, Decision, GiveBack, Identity, LeaseStore, Limit, NoLeases, Origin, Outcome, Request, Store,
    StoreError,
};
use std::sync::Arc;

use crate::Clock;

use crate::TimeSpan;

/// Shards of the lease table: requests of different identities rarely wait
/// for one another.
const SHARDS: usize = 16;
/// The most identities one shard tracks (rates and leases): the table's
/// memory is bounded; past it, a request goes to the store unleased.
const MAX_HELD: usize = 4096;
/// A swept shard whose table has room for more than this many times its
/// entries, and more than [`MIN_ROOM`], gives the room back.
const SPARE_FACTOR: usize = 4;
const MIN_ROOM: usize = 64;

/// How big leases get: `[store] lease = { max = 64, horizon = "50ms" }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// The most permits one lease takes.
    pub max: u64,
    /// How far ahead a lease is sized for: the requests this instance saw
    /// of the identity in the last horizon are those it expects in the next.
    pub horizon: TimeSpan,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self { max: 64, horizon: TimeSpan::from_millis(50) }
    }
}

/// What this instance holds of one identity's limit.
#[derive(Debug)]
struct Held {
    identity: Identity,
    limit: Limit,
    /// Leased permits not used yet.
    left: u64,
    /// The store's window of those permits.
    window: u64,
    /// Until when they may be used, in ms on the layer's clock.
    until: u64,
    /// The store's decision on the lease, for the headers of local answers.
    decision: Decision,
    leased_at: u64,
    /// Requests seen in the current horizon, and in the one before.
    seen: u64,
    seen_before: u64,
    horizon_start: u64,
}

/// A [`Store`] whose hot identities are decided from leased permits (see
/// the module docs). Without a policy, or on a store granting no leases,
/// every request passes through.
pub struct Leased<S> {
    inner: S,
    policy: Option<LeasePolicy>,
    shards: Vec<Mutex<Shard>>,
    /// The layer's time, in ms: monotonic, so a lease never outlives its
    /// window because the wall clock stepped back.
    clock: Arc<dyn Clock>,
}

/// One shard of the lease table.
#[derive(Debug, Default)]
struct Shard {
    held: HashMap<(Identity, Limit), Held>,
    /// When (layer ms) a new identity next sweeps the shard.
    next_sweep: u64,
}

impl Shard {
    /// Forgets the identities neither leasing nor seen in the last two
    /// horizons (their rates would read 0 anyway; an ended lease dropped
    /// here keeps its permits charged in its window: under-admission, never
    /// over), and gives back the table's spare room, so that identities
    /// seen once (a crawl, a burst while the store was away) do not keep
    /// memory until the table is full.
    fn sweep(&mut self, now: u64, horizon: u64) {
        self.held.retain(|_, h| {
            (h.left > 0 && now < h.until) || now.saturating_sub(h.horizon_start) < 2 * horizon
        });
        if self.held.capacity() > MIN_ROOM.max(SPARE_FACTOR * self.held.len()) {
            self.held.shrink_to(2 * self.held.len());
        }
        self.next_sweep = now.saturating_add(2 * horizon);
    }
}

/// Milliseconds since the layer was built, on the monotonic clock.
#[derive(Debug)]
struct Monotonic(std::time::Instant);

impl Clock for Monotonic {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl<S> std::fmt::Debug for Leased<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased").field("policy", &self.policy).finish_non_exhaustive()
    }
}

/// What a request found in the lease table.
enum Found {
    /// A leased permit: the answer.
    Permit(Decision),
    /// No permit: lease `size` (1: ask the store as usual), after giving
    /// `back` the permits of an ended lease.
    Ask { size: u64, back: Option<GiveBack> },
}

impl<S> Leased<S> {
    /// `inner`, leasing under `policy` (`None`: never).
    pub(crate) fn new(inner: S, policy: Option<LeasePolicy>) -> Self {
        Self::with_clock(inner, policy, Arc::new(Monotonic(std::time::Instant::now())))
    }

    /// [`Leased::new`] on `clock` (tests drive it by hand). It must not step
    /// back, and must run at the store's rate: a lease is used until its
    /// send time on it plus what the store said was left of the window.
    pub(crate) fn with_clock(inner: S, policy: Option<LeasePolicy>, clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Self { inner, policy: policy.filter(|p| p.max > 1), shards, clock }
    }

    /// The store behind the leases.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Store> Leased<S> {
    fn shard(&self, identity: &Identity) -> std::sync::MutexGuard<'_, Shard> {
        let shard = &self.shards[(identity.folded() % SHARDS as u64) as usize];
        shard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The leased permits this instance holds and has not used, summed.
    pub fn outstanding(&self) -> u64 {
        let now = self.clock.now_ms();
        self.shards
            .iter()
            .map(|s| {
                let held = s.lock().unwrap_or_else(PoisonError::into_inner);
                held.held.values().filter(|h| now < h.until).map(|h| h.left).sum::<u64>()
            })
            .sum()
    }

    /// Gives every unused leased permit back to the store and forgets the
    /// leases (a reload, a shutdown). Answers how many permits the store
    /// took back.
    pub async fn give_back_all(&self) -> u64 {
        let Some(leases) = self.inner.leases() else { return 0 };
        let mut backs = Vec::new();
        for shard in &self.shards {
            let mut held = shard.lock().unwrap_or_else(PoisonError::into_inner);
            backs.extend(held.held.drain().filter(|(_, h)| h.left > 0).map(|(_, h)| {
                (h.identity.clone(), GiveBack { limit: h.limit, window: h.window, unused: h.left })
            }));
        }
        let mut given = 0;
        for (identity, back) in backs {
            match leases.give_back(&identity, back, None).await {
                Ok(n) => given += n,
                Err(err) => tracing::debug!(%identity, error = %err, "lease give-back failed"),
            }
        }
        given
    }

    /// Looks `identity`'s lease of `limit` up at `now`, counting the request.
    fn find(&self, identity: &Identity, limit: &Limit, policy: &LeasePolicy, now: u64) -> Found {
        let horizon = policy.horizon.as_millis().max(1);
        let mut shard = self.shard(identity);
        let key = (identity.clone(), *limit);
        if (now >= shard.next_sweep || shard.held.len() >= MAX_HELD) && !shard.held.contains_key(&key) {
            shard.sweep(now, horizon);
            if shard.held.len() >= MAX_HELD {
                return Found::Ask { size: 1, back: None };
            }
        }
        let held = shard.held.entry(key).or_insert_with(|| Held {
            identity: identity.clone(),
            limit: *limit,
            left: 0,
            window: 0,
            until: now,
            decision: Decision {
                allowed: true,
                limit: 0,
                remaining: 0,
                reset_after: Duration::ZERO,
                retry_after: None,
            },
            leased_at: now,
            seen: 0,
            seen_before: 0,
            horizon_start: now,
        });
        let since = now.saturating_sub(held.horizon_start);
        if since >= horizon {
            held.seen_before = if since >= 2 * horizon { 0 } else { held.seen };
            held.seen = 0;
            held.horizon_start = now;
        }
        held.seen += 1;
        if held.left > 0 && now < held.until {
            held.left -= 1;
            let elapsed = Duration::from_millis(now.saturating_sub(held.leased_at));
            return Found::Permit(Decision {
                remaining: held.decision.remaining + held.left,
                reset_after: held.decision.reset_after.saturating_sub(elapsed),
                ..held.decision
            });
        }
        let back =
            (held.left > 0).then_some(GiveBack { limit: *limit, window: held.window, unused: held.left });
        held.left = 0;
        let expected = held.seen_before.max(held.seen);
        let room = held.decision.remaining / 4;
        let size = expected.min(policy.max).min(room.max(1)).min(limit.quota.permits()).max(1);
        Found::Ask { size, back }
    }

    /// Keeps the permits of a lease decided now, but the one this request uses.
    fn keep(&self, identity: &Identity, limit: &Limit, lease: crate::Lease, size: u64, sent: u64) {
        let mut shard = self.shard(identity);
        if let Some(held) = shard.held.get_mut(&(identity.clone(), *limit)) {
            let until = sent.saturating_add(u64::try_from(lease.usable_for.as_millis()).unwrap_or(u64::MAX));
            // A lease a concurrent request took in the same window: both
            // sets of permits count there, and end with it (the earlier end
            // of the two, as either could be the later one sent).
            if held.left > 0 && held.window == lease.window && sent < held.until {
                held.left += size - 1;
                held.until = held.until.min(until);
            } else {
                held.left = size - 1;
                held.until = until;
            }
            held.window = lease.window;
            held.decision = lease.decision;
            held.leased_at = sent;
        }
    }

    /// Remembers a plain decision's remaining permits, which size the next lease.
    fn saw(&self, identity: &Identity, limit: &Limit, decision: &Decision) {
        if let Some(held) = self.shard(identity).held.get_mut(&(identity.clone(), *limit)) {
            held.decision = *decision;
        }
    }

    async fn decide_leased(
        &self,
        request: Request<'_>,
        charge: &Charge,
        policy: &LeasePolicy,
    ) -> Result<Outcome, StoreError> {
        let Some(leases) = self.inner.leases() else { return self.inner.decide(request).await };
        let identity = request.identity;
        let sent = self.clock.now_ms();
        let (size, back) = match self.find(identity, &charge.limit, policy, sent) {
            Found::Permit(decision) => return Ok(Outcome::decided(decision).from_origin(Origin::Lease)),
            Found::Ask { size, back } => (size, back),
        };
        // A fixed window's ended count no longer matters: nothing to give back.
        if let Some(back) = back.filter(|b| b.limit.algorithm != crate::Algorithm::FixedWindow) {
            if let Err(err) = leases.give_back(identity, back, request.deadline).await {
                tracing::debug!(%identity, error = %err, "lease give-back failed");
            }
        }
        if size > 1 {
            let lease = leases.lease(identity, Charge::new(charge.limit, size), request.deadline).await?;
            if lease.decision.allowed {
                let decision = Decision { remaining: lease.decision.remaining + size - 1, ..lease.decision };
                self.keep(identity, &charge.limit, lease, size, sent);
                return Ok(Outcome::decided(decision));
            }
        }
        let outcome = self.inner.decide(request).await?;
        if let [decision] = &*outcome.decisions {
            self.saw(identity, &charge.limit, decision);
        }
        Ok(outcome)
    }
}

impl<S: Store> Store for Leased<S> {
    async fn decide(&self, request: Request<'_>) -> Result<Outcome, StoreError> {
        match (&self.policy, request.charges, request.penalty) {
            (Some(policy), [charge], None) if charge.cost == 1 && leasable(charge.limit.algorithm) => {
                self.decide_leased(request, charge, policy).await
            }
            _ => self.inner.decide(request).await,
        }
    }

    /// The store's, for a request no lease can answer; one a lease may
    /// answer is decided by `decide` (leases are for a store that waits).
    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        match (&self.policy, request.charges, request.penalty) {
            (Some(_), [charge], None) if charge.cost == 1 && leasable(charge.limit.algorithm) => None,
            _ => self.inner.decide_now(request),
        }
    }

    crate::store::forward!((.inner) distinct, tables);

    /// The leases are this layer's: none is granted above it.
    fn leases(&self) -> Option<impl LeaseStore + '_> {
        None::<NoLeases>
    }

    // Joint decisions: the store's own (a leased permit is charged in the
    // store, so a joint decision there counts it as any other instance's
    // decision would).
    crate::store::forward!((.inner) joint, lift_penalty, has_outages);
}

#[cfg(test)]
mod tests;
