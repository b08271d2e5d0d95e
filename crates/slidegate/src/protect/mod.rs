//! The protections around a store, each a layer that wraps a [`Store`] and
//! is one, tower-style: for anything that decides — an HTTP service, a job
//! queue, a message consumer — not only for `slidegate-http`, which builds
//! its limiter on them.
//!
//! ```text
//! Fallback ── DenyCached ── Guarded ── Leased ── S (the store)
//!  decides     answers      deadline,  hot identities
//!  while S     denials S    breaker,   from leased
//!  cannot      gave, until  probe      permits
//!              they end
//! ```
//!
//! - [`Leased`] (`lease/`): a hot identity's requests answered from permits
//!   the store charged ahead in one call; never admits more than the store
//!   would (`docs/leases.md`).
//! - [`Guarded`] (`guard/`): every call under a deadline, a circuit breaker
//!   judging the store by its failure rate, and a background probe that
//!   closes it once the store answers.
//! - [`DenyCached`] (`deny_cache/`): a denial the store gave is answered in
//!   process, exactly, until it ends.
//! - [`Fallback`] (`fallback/`): while the store cannot answer, an embedded
//!   limiter seeded with the store's last answers decides, at
//!   `limit / instances`, answering [`Origin::Fallback`](crate::Origin::Fallback).
//!
//! The order is not a convention: it is the only one [`Protect`] builds, and
//! the layers are built by nothing else. The lease layer must be below the
//! guard (a lease call is a store call, under its deadline), the deny cache
//! above it (a cached denial costs no call, so the breaker never hears of
//! it), and the fallback on top (it decides whatever the layers below
//! could not).
//!
//! ```
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//!
//! use slidegate::protect::{NoEvents, Protect, StoreGuard};
//! use slidegate::{Algorithm, Charge, Identity, Limit, MemoryStore, Quota, Request, Store};
//!
//! let guard = StoreGuard::default();
//! let store = Protect::new(MemoryStore::new(), Arc::new(NoEvents))
//!     .leases(guard.lease)
//!     .guard(guard.calls)
//!     .deny_cache(guard.deny_cache)
//!     .fallback(Some(guard.fallback))
//!     .build();
//! let tenant = Identity::named("jobs", "tenant-7");
//! let charge = [Charge::new(Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(2)?), 1)];
//! assert!(store.decide(Request::new(&tenant, &charge)).await?.allowed());
//! # Ok(()) }
//! # tokio::runtime::Runtime::new()?.block_on(run())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What the layers do is told to an [`Events`] (`slidegate-http`'s
//! `Metrics` counts them); their logs go to `tracing`.

use std::sync::Arc;
use std::time::Duration;

use crate::{Clock, Store};

mod deny_cache;
mod fallback;
mod guard;
mod lease;

pub use deny_cache::{DenyCached, DEFAULT_CAPACITY};
pub use fallback::{Fallback, FallbackPolicy};
pub use guard::{BreakerPolicy, GuardPolicy, Guarded};
pub use lease::{LeasePolicy, Leased};

/// Every layer, in their one order, around `S`: what [`Protect`] builds.
pub type Protected<S> = Fallback<DenyCached<Guarded<Leased<S>>>>;

/// What a caller of the whole stack reaches below its top, named once here
/// rather than as a chain of `get_ref()`s wherever it is needed.
impl<S> Protected<S> {
    /// The stack without the fallback: what a caller that handles the
    /// store's failure itself asks (a rule whose failure policy is to allow
    /// or to deny, not to fall back).
    pub fn without_fallback(&self) -> &DenyCached<Guarded<Leased<S>>> {
        self.get_ref()
    }

    /// Whether the breaker is open (calls skip the store).
    pub fn breaker_open(&self) -> bool {
        self.get_ref().get_ref().breaker_open()
    }

    /// The store itself, under every layer.
    pub fn store(&self) -> &S {
        self.get_ref().get_ref().get_ref().get_ref()
    }

    /// Forgets what every layer of this process holds of `identity` (a
    /// lifted penalty block): the fallback's seeds and the deny cache's
    /// denials; the store's own state is the store's to lift.
    pub fn forget_in_process(&self, identity: &crate::Identity) {
        Fallback::forget(self, identity);
        self.get_ref().forget(identity);
    }
}

impl<S: Store> Protected<S> {
    /// Gives every unused leased permit back to the store and forgets the
    /// leases ([`Leased::give_back_all`]).
    pub async fn give_back_leases(&self) -> u64 {
        self.get_ref().get_ref().get_ref().give_back_all().await
    }
}

/// What the layers tell whoever counts them. Each method is called on the
/// decision's path: keep it to a counter.
pub trait Events: Send + Sync + 'static {
    /// A decision called the store (a probe is not a decision).
    fn call(&self);
    /// A decision called the store while the breaker was open, as its trial.
    fn trial(&self);
    /// A decision skipped the store: the breaker is open.
    fn skipped(&self);
    /// The store answered a decision's call after `latency`.
    fn answered(&self, latency: Duration);
    /// A decision's call failed (the store unavailable).
    fn failed(&self);
    /// A decision's call reached its deadline.
    fn timed_out(&self);
    /// The breaker opened.
    fn breaker_opened(&self);
    /// The open breaker's background probe called the store.
    fn probe(&self);
    /// The deny cache answered a denial without a store call.
    fn deny_cache_hit(&self);
}

/// Counts nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEvents;

impl Events for NoEvents {
    fn call(&self) {}
    fn trial(&self) {}
    fn skipped(&self) {}
    fn answered(&self, _latency: Duration) {}
    fn failed(&self) {}
    fn timed_out(&self) {}
    fn breaker_opened(&self) {}
    fn probe(&self) {}
    fn deny_cache_hit(&self) {}
}

/// How the layers guard a store: one field per layer, innermost first, each
/// the argument of that layer's step of [`Protect`] (`.leases(guard.lease)
/// .guard(guard.calls).deny_cache(guard.deny_cache)
/// .fallback(Some(guard.fallback))`).
///
/// Its [`Default`] is the one set of defaults; `slidegate serve` reads its
/// `[store]` keys into it, each over the default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreGuard {
    /// Quota leases (`docs/leases.md`): `None`, the default, decides every
    /// request in the store.
    pub lease: Option<LeasePolicy>,
    /// Each store call's deadline, the circuit breaker and its probe.
    pub calls: GuardPolicy,
    /// Capacity of the exact local deny cache (denied identities); 0 turns it off.
    pub deny_cache: usize,
    /// The fallback limiter's share of each limit. Whether it is on is the
    /// caller's choice at [`Layers::fallback`]: `slidegate-http` turns it
    /// off when no rule falls back.
    pub fallback: FallbackPolicy,
}

impl Default for StoreGuard {
    fn default() -> Self {
        Self {
            lease: None,
            calls: GuardPolicy::default(),
            deny_cache: DEFAULT_CAPACITY,
            fallback: FallbackPolicy::default(),
        }
    }
}

/// Builds the layers around a store, innermost first, in their one order.
/// [`Protect`] is the first step: the store, and the lease layer
/// ([`Protect::leases`]); each later step is a method only of the [`Layers`]
/// before it, and only the lease layer alone or the whole stack can be
/// built, so a stack in another order, or missing a layer between, does
/// not compile. Each step takes one field of [`StoreGuard`], whole, in the
/// same order: `lease`, `calls`, `deny_cache`, `fallback`. A layer is turned
/// off by its argument (no lease policy, a deny cache of 0, no fallback
/// policy), never left out. (What is not prevented: a built stack handed to
/// `Protect::new` again.) Each of these fails to compile:
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use slidegate::protect::{NoEvents, Protect, StoreGuard};
/// # let guard = StoreGuard::default();
/// // The guard before the lease layer.
/// let _ = Protect::new(slidegate::MemoryStore::new(), Arc::new(NoEvents)).guard(guard.calls);
/// ```
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use slidegate::protect::{NoEvents, Protect, StoreGuard};
/// # let guard = StoreGuard::default();
/// // The deny cache left out.
/// let _ = Protect::new(slidegate::MemoryStore::new(), Arc::new(NoEvents)).leases(None).guard(guard.calls).fallback(None);
/// ```
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use slidegate::protect::{NoEvents, Protect, StoreGuard};
/// # let guard = StoreGuard::default();
/// // Built without the deny cache and the fallback.
/// let _ = Protect::new(slidegate::MemoryStore::new(), Arc::new(NoEvents)).leases(None).guard(guard.calls).build();
/// ```
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use slidegate::protect::{NoEvents, Protect, StoreGuard};
/// # let guard = StoreGuard::default();
/// // A second lease layer above the guard.
/// let _ = Protect::new(slidegate::MemoryStore::new(), Arc::new(NoEvents)).leases(None).guard(guard.calls).leases(None);
/// ```
///
/// The stack runs on tokio: a call that waits is timed by tokio's timer,
/// and an opened breaker probes the store from a spawned task, so its
/// decisions must be made inside a tokio runtime with the time driver on
/// (`#[tokio::main]` has it).
pub struct Protect<S> {
    store: S,
    events: Arc<dyn Events>,
    lease_clock: Option<Arc<dyn Clock>>,
}

impl<S: Store> Protect<S> {
    /// The layers of `store`, telling `events` what they do.
    pub fn new(store: S, events: Arc<dyn Events>) -> Self {
        Self { store, events, lease_clock: None }
    }

    /// The lease layer reads the time from `clock` (the store's, in tests
    /// and replays that drive time by hand) instead of the monotonic clock.
    pub fn lease_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.lease_clock = Some(clock);
        self
    }

    /// First, the lease layer: `None` decides every request in the store.
    pub fn leases(self, policy: Option<LeasePolicy>) -> Layers<Leased<S>> {
        let store = match self.lease_clock {
            Some(clock) => Leased::with_clock(self.store, policy, clock),
            None => Leased::new(self.store, policy),
        };
        Layers { store, events: self.events, ticks: Ticks::start() }
    }
}

/// The layers built so far: each method adds the next one ([`Protect`]).
pub struct Layers<S> {
    store: S,
    events: Arc<dyn Events>,
    ticks: Ticks,
}

impl<S> Layers<S> {
    fn wrap<T>(self, wrap: impl FnOnce(S, &Arc<dyn Events>, Ticks) -> T) -> Layers<T> {
        let store = wrap(self.store, &self.events, self.ticks);
        Layers { store, events: self.events, ticks: self.ticks }
    }
}

impl<S: Store + 'static> Layers<Leased<S>> {
    /// Then the deadline, the breaker and its probe.
    pub fn guard(self, policy: GuardPolicy) -> Layers<Guarded<Leased<S>>> {
        self.wrap(|store, events, ticks| Guarded::new(store, policy, Arc::clone(events), ticks))
    }
}

impl<S> Layers<Leased<S>> {
    /// The lease layer alone, over a store that needs no other protection
    /// (a simulation of instances on one embedded store, a test).
    pub fn build(self) -> Leased<S> {
        self.store
    }
}

impl<S: Store + 'static> Layers<Guarded<S>> {
    /// Then the deny cache of `capacity` denied identities (0: off).
    pub fn deny_cache(self, capacity: usize) -> Layers<DenyCached<Guarded<S>>> {
        self.wrap(|store, events, ticks| DenyCached::new(store, capacity, Arc::clone(events), ticks))
    }
}

impl<S: Store> Layers<DenyCached<S>> {
    /// Last, the fallback: with a policy, an embedded limiter decides while
    /// the store cannot, at the policy's share of each limit; `None` passes
    /// the store's failures through, for the caller to handle.
    pub fn fallback(self, policy: Option<FallbackPolicy>) -> Layers<Fallback<DenyCached<S>>> {
        self.wrap(|store, _, ticks| Fallback::new(store, policy, ticks))
    }
}

impl<S> Layers<Fallback<S>> {
    /// The whole stack.
    pub fn build(self) -> Fallback<S> {
        self.store
    }
}

/// The layers' own time: milliseconds on tokio's monotonic clock (which
/// tests pause and advance), since the stack was built. The deny cache, the
/// breaker and the fallback's seeds all count on it, so their deadlines
/// agree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticks {
    epoch: tokio::time::Instant,
}

impl Ticks {
    /// A clock starting now.
    pub(crate) fn start() -> Self {
        Self { epoch: tokio::time::Instant::now() }
    }

    /// Milliseconds since the epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
