//! The guard: a store behind a deadline and a circuit breaker, itself a store.
//!
//! Every call gets the deadline ([`GuardPolicy::timeout`]); the breaker
//! (`breaker.rs`) counts the answers and, once open, makes calls fail at
//! once with [`Unavailable::NotConnected`](crate::Unavailable::NotConnected) — nothing reached the store, so
//! nothing was charged — except one trial per interval. When it opens, a
//! background probe writes to the store as decisions do until it answers,
//! then closes it, so the guard also recovers when no traffic arrives.
//!
//! Each decision carries the deadline into the store ([`Request::deadline`]):
//! a store that honours it (Redis) refuses a call it reaches too late, so a
//! call counted here as failed charges nothing.
//!
//! A store that answers without waiting (the embedded one) is polled once
//! before any timer is armed: the deadline costs only the calls that wait.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::{
    Algorithm, Charge, Decision, Digest, DistinctStore, Identity, JointStore, Limit, Outcome, Part, Quota,
    Request, SharedTables, Source, Store, StoreError, TableEntry, TableName, TimeSpan, Unavailable,
};

mod breaker;

use super::Events;
use super::Ticks;
pub use breaker::BreakerPolicy;
use breaker::{Admit, Breaker};

/// How the guard guards each store call: its deadline, the breaker, and how
/// often an open breaker probes the store ([`StoreGuard::calls`](super::StoreGuard::calls)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuardPolicy {
    /// Deadline of one store call.
    pub timeout: TimeSpan,
    /// How often an open breaker probes the store.
    pub probe_interval: TimeSpan,
    /// When the breaker opens and how it tries the store again.
    pub breaker: BreakerPolicy,
}

impl Default for GuardPolicy {
    fn default() -> Self {
        Self {
            timeout: TimeSpan::from_millis(50),
            probe_interval: TimeSpan::from_millis(500),
            breaker: BreakerPolicy::default(),
        }
    }
}

struct Shared<S> {
    store: S,
    timeout: Duration,
    probe_interval: Duration,
    trial_interval: Duration,
    breaker: Breaker,
    events: Arc<dyn Events>,
    ticks: Ticks,
}

/// A store behind the deadline and the breaker (see the module docs).
pub struct Guarded<S> {
    shared: Arc<Shared<S>>,
}

impl<S> std::fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded").field("breaker_open", &self.breaker_open()).finish_non_exhaustive()
    }
}

impl<S> Guarded<S> {
    /// The store, guarded by `policy`'s deadline and breaker, told to `events`.
    pub(crate) fn new(store: S, policy: GuardPolicy, events: Arc<dyn Events>, ticks: Ticks) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                timeout: policy.timeout.get(),
                probe_interval: policy.probe_interval.get(),
                trial_interval: policy.breaker.trial_interval.get(),
                breaker: Breaker::new(policy.breaker),
                events,
                ticks,
            }),
        }
    }

    /// The guarded store.
    pub fn get_ref(&self) -> &S {
        &self.shared.store
    }

    /// Whether the breaker is open (calls skip the store).
    pub fn breaker_open(&self) -> bool {
        self.shared.breaker.is_open()
    }
}

impl<S: Store + 'static> Guarded<S> {
    /// `call`, a call to the store made at `start`, under the deadline and the breaker.
    async fn guarded<T>(
        &self,
        start: Instant,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.admit()?;
        let mut call = pin!(call);
        // One poll first: a store that answers at once needs no timer.
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        let (answer, waited) = match first {
            Poll::Ready(answer) => (Some(answer), false),
            // Boxed: the timer is large, and held here it would enlarge the
            // future of every call, also of those that never wait.
            Poll::Pending => (Box::pin(tokio::time::timeout(self.shared.timeout, call)).await.ok(), true),
        };
        self.settle(start, answer, waited)
    }

    /// Whether the breaker lets a call through now (counted as a call, or a
    /// trial while it is open), or the error of one it skips.
    fn admit(&self) -> Result<(), StoreError> {
        let shared = &*self.shared;
        let events = &*shared.events;
        if shared.breaker.is_open() {
            match shared.breaker.admit(shared.ticks.now_ms()) {
                Admit::Skip => {
                    events.skipped();
                    return Err(StoreError::Unavailable(Unavailable::NotConnected(
                        "the circuit breaker is open".into(),
                    )));
                }
                Admit::Trial => {
                    events.trial();
                }
                Admit::Call => {}
            }
        }
        events.call();
        Ok(())
    }

    /// What a call made at `start` answered (`None`: nothing before the
    /// deadline; `waited`: not at its first poll), counted, and heard by the
    /// breaker.
    fn settle<T>(
        &self,
        start: Instant,
        answer: Option<Result<T, StoreError>>,
        waited: bool,
    ) -> Result<T, StoreError> {
        let shared = &*self.shared;
        let events = &*shared.events;
        match answer {
            Some(Ok(value)) => {
                events.answered(start.elapsed());
                // A store that answered without waiting is not stalling: only
                // an open breaker needs to hear of it. Counting every such
                // answer would make each decision write the breaker's shared
                // counters, the one cache line all threads would then contend for.
                if (waited || shared.breaker.is_open())
                    && shared.breaker.record_success(shared.ticks.now_ms())
                {
                    tracing::info!("rate limit store answers again: circuit breaker closed");
                }
                Ok(value)
            }
            Some(Err(err)) if !err.is_unavailable() => Err(err),
            // The store's own deadline (or the one carried into it) may end
            // a call before this timer does: a miss all the same.
            Some(Err(err)) if err.is_timeout() => {
                events.timed_out();
                tracing::warn!(%err, "rate limit store timed out");
                self.failed();
                Err(err)
            }
            Some(Err(err)) => {
                events.failed();
                tracing::warn!(%err, "rate limit store failed");
                self.failed();
                Err(err)
            }
            None => {
                events.timed_out();
                tracing::warn!(timeout_ms = shared.timeout.as_millis() as u64, "rate limit store timed out");
                self.failed();
                Err(StoreError::Unavailable(Unavailable::TimedOut(shared.timeout)))
            }
        }
    }

    /// `call`, an operator's or a background task's call (shared tables, a
    /// lift), under the deadline only: it is not a decision, so it is counted
    /// in no decision metric and neither opens nor closes the breaker (a
    /// poll every second timing out would otherwise open it, or a lift
    /// answering close it, for the requests' path).
    async fn deadlined<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let timeout = self.shared.timeout;
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(StoreError::Unavailable(Unavailable::TimedOut(timeout))))
    }

    fn failed(&self) {
        let shared = &*self.shared;
        if shared.breaker.record_failure(shared.ticks.now_ms()) {
            shared.events.breaker_opened();
            tracing::error!(
                probe_interval_ms = shared.probe_interval.as_millis() as u64,
                trial_interval_ms = shared.trial_interval.as_millis() as u64,
                "rate limit store unavailable: circuit breaker open, probing in the background"
            );
            tokio::spawn(probe(Arc::clone(&self.shared)));
        }
    }
}

impl<S: Store + 'static> Store for Guarded<S> {
    // Not an `async fn`: the future is `guarded`'s own, one level less
    // nested in every future that awaits it.
    fn decide(&self, request: Request<'_>) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        // The store learns when this guard gives up, so that a call it
        // reaches later is refused unrun rather than charged after the
        // caller counted it failed. One clock read: the deadline and the
        // latency count from it.
        let start = Instant::now();
        let request = request.with_deadline(start + self.shared.timeout);
        self.guarded(start, self.shared.store.decide(request))
    }

    /// A store that cannot fail or wait needs no deadline and no breaker:
    /// its answer is counted (calls, latency) as any other. One that may
    /// wait is `None` at once.
    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>> {
        let store = &self.shared.store;
        if store.has_outages() || self.shared.breaker.is_open() {
            return None;
        }
        let start = Instant::now();
        let answer = store.decide_now(request)?;
        // Counted once answered (a `None` above did nothing); the breaker,
        // closed above, never opens for a store without outages.
        self.shared.events.call();
        Some(self.settle(start, Some(answer), false))
    }

    fn distinct(&self) -> Option<impl DistinctStore + '_> {
        let inner = self.shared.store.distinct()?;
        Some(GuardedDistinct { guard: self, inner })
    }

    // Leases: the store's own, unguarded: the lease layer sits below the
    // guard, so its lease calls are a decision's and carry its deadline.
    // Outages: the store's: the breaker opens, and the deadline passes, only
    // on a store that fails or waits.
    crate::store::forward!((.shared.store) leases, has_outages);

    fn tables(&self) -> Option<impl SharedTables + '_> {
        let inner = self.shared.store.tables()?;
        Some(GuardedTables { guard: self, inner })
    }

    fn joint(&self) -> Option<impl JointStore + '_> {
        let inner = self.shared.store.joint()?;
        Some(GuardedJoint { guard: self, inner })
    }

    async fn lift_penalty(
        &self,
        identity: &Identity,
        deadline: Option<Instant>,
    ) -> Result<Option<Duration>, StoreError> {
        let own = Instant::now() + self.shared.timeout;
        let deadline = deadline.map_or(own, |d| d.min(own));
        self.deadlined(self.shared.store.lift_penalty(identity, Some(deadline))).await
    }
}

/// The guarded store's joint decisions, under a decision's deadline and the breaker.
struct GuardedJoint<'a, S, J> {
    guard: &'a Guarded<S>,
    inner: J,
}

impl<S: Store + 'static, J: JointStore> JointStore for GuardedJoint<'_, S, J> {
    fn decide_joint(
        &self,
        parts: &[Part<'_>],
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send {
        let start = Instant::now();
        let own = start + self.guard.shared.timeout;
        let deadline = deadline.map_or(own, |d| d.min(own));
        self.guard.guarded(start, self.inner.decide_joint(parts, Some(deadline)))
    }
}

/// The guarded store's distinct-value sketches, under the same deadline and breaker.
struct GuardedDistinct<'a, S, D> {
    guard: &'a Guarded<S>,
    inner: D,
}

impl<S: Store + 'static, D: DistinctStore> DistinctStore for GuardedDistinct<'_, S, D> {
    async fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> Result<Decision, StoreError> {
        self.guard.guarded(Instant::now(), self.inner.decide_distinct(identity, quota, value)).await
    }
}

/// The guarded store's shared tables, under the same deadline (carried into
/// the store, as a decision's is); not decisions, so outside the breaker.
struct GuardedTables<'a, S, T> {
    guard: &'a Guarded<S>,
    inner: T,
}

impl<S, T> GuardedTables<'_, S, T> {
    /// The guard's deadline for a call starting now, or `deadline` if earlier.
    fn deadline(&self, deadline: Option<Instant>) -> Option<Instant> {
        let own = Instant::now() + self.guard.shared.timeout;
        Some(deadline.map_or(own, |d| d.min(own)))
    }
}

impl<S: Store + 'static, T: SharedTables> SharedTables for GuardedTables<'_, S, T> {
    async fn put_entry(
        &self,
        table: &TableName,
        field: &[u8],
        value: &[u8],
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline(deadline);
        self.guard.deadlined(self.inner.put_entry(table, field, value, ttl, deadline)).await
    }

    async fn delete_entry(
        &self,
        table: &TableName,
        field: &[u8],
        deadline: Option<Instant>,
    ) -> Result<bool, StoreError> {
        let deadline = self.deadline(deadline);
        self.guard.deadlined(self.inner.delete_entry(table, field, deadline)).await
    }

    async fn read_table(
        &self,
        table: &TableName,
        deadline: Option<Instant>,
    ) -> Result<Vec<TableEntry>, StoreError> {
        let deadline = self.deadline(deadline);
        self.guard.deadlined(self.inner.read_table(table, deadline)).await
    }
}

/// Probes the store until it answers (or a trial closed the breaker first),
/// then closes the breaker.
async fn probe<S: Store>(shared: Arc<Shared<S>>) {
    // The probe does what decisions do: it writes. A read (cost 0) succeeds on
    // a Redis that refuses every write (out of memory), and closing on it would
    // only re-open the breaker at the next decision. Cost 1 of a billion per
    // second is always allowed, so always written; the 1 s window lets the key
    // expire by itself. No rule's identity has the probe's scope.
    let quota = Quota::new(1_000_000_000, Duration::from_secs(1)).expect("10^9 per second is a valid quota");
    let charge = [Charge::new(Limit::new(Algorithm::FixedWindow, quota), 1)];
    let identity = Identity::new("slidegate-probe", Source::Named, Digest([0; 16]));
    loop {
        tokio::time::sleep(shared.probe_interval).await;
        if !shared.breaker.is_open() {
            return;
        }
        shared.events.probe();
        let answer =
            tokio::time::timeout(shared.timeout, shared.store.decide(Request::new(&identity, &charge))).await;
        if matches!(answer, Ok(Ok(_))) {
            if shared.breaker.close() {
                tracing::info!("rate limit store answers again: circuit breaker closed");
            }
            return;
        }
    }
}
