//! Delay instead of refuse: a request its rule's limits deny, that would be
//! allowed within the rule's `max_wait`, is held and decided again, as
//! nginx's `limit_req ... delay=` does — for clients that cannot handle 429.
//!
//! What is held, and for how long ([`wait_for`]): a denial by the rule's
//! limits (from the store or the fallback limiter), not in shadow mode, not
//! a block of the penalty box, not a refusal for `max_in_flight` or crawl
//! breadth, and not a failure of the store without a decision; its wait is
//! the longest `retry_after` of the limits that denied. The request sleeps
//! that long on tokio's clock (it is a future: it pins no thread) and is
//! decided again, charged as any request; while it is denied again and the
//! new wait still fits in what is left of `max_wait`, again, at most
//! [`max_decisions`] times (`per_identity + 1`); then it is answered,
//! allowed or 429. Requests of one identity held together wake together
//! and the limit admits them one by one, so the last of `per_identity`
//! needs that many turns: the bound lets each have its turn while keeping
//! the store calls one held request makes finite (and each is charged only
//! if it is allowed).
//!
//! Bounds (`Delays`): at most `per_identity` requests of one identity are
//! held at once under a rule (the identity's scope is the rule), and at most
//! `max_delayed` over every rule and identity (one semaphore); a request
//! finding either full is refused at once, as without `delay`. Memory is
//! what is held: a `DelaySlot` frees both places when dropped, which is
//! also what happens when the client hangs up and the request's future is
//! dropped mid-sleep.

use std::sync::Arc;
use std::time::Duration;

use slidegate::Identity;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::DelayConfig;
use crate::in_flight::{InFlight, InFlightSlot};
use crate::verdict::{DecisionSource, Verdict};

/// Decisions a request held under `delay` takes after its first, at most:
/// one more than the requests of an identity held at once.
pub fn max_decisions(delay: &DelayConfig) -> u32 {
    delay.per_identity.saturating_add(1)
}

/// The shortest sleep: a denial whose wait rounds to nothing is retried a
/// millisecond later, never in a busy loop.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// How long to hold the request `verdict` answered before deciding it
/// again under `delay`, when it has been held `held` already: `None` when
/// it must be answered now (allowed, not a denial a delay serves, or a wait
/// that would end beyond `max_wait`).
pub fn wait_for(delay: &DelayConfig, verdict: &Verdict<'_>, held: Duration) -> Option<Duration> {
    let decided = matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback);
    if verdict.allowed() || verdict.shadow || verdict.blocked || verdict.over_in_flight.is_some() || !decided
    {
        return None;
    }
    let wait = verdict.violated().filter_map(|p| p.decision.retry_after).max()?.max(MIN_WAIT);
    (held.saturating_add(wait) <= delay.max_wait.get()).then_some(wait)
}

/// The requests held now: per identity (under each rule) and over all.
#[derive(Debug)]
pub(crate) struct Delays {
    per_identity: Arc<InFlight>,
    held: Arc<Semaphore>,
    cap: u32,
}

impl Delays {
    /// Room for `cap` requests held at once.
    pub(crate) fn new(cap: u32) -> Self {
        Self::sharing(Arc::default(), cap)
    }

    /// A cap of `cap` over the same per-identity counts as `self` (a
    /// reload): the requests held under the old cap keep their places until
    /// they end, so while they do at most the old cap and the new are held.
    pub(crate) fn with_cap(&self, cap: u32) -> Self {
        Self::sharing(Arc::clone(&self.per_identity), cap)
    }

    fn sharing(per_identity: Arc<InFlight>, cap: u32) -> Self {
        Self { per_identity, held: Arc::new(Semaphore::new(cap as usize)), cap }
    }

    /// The cap over all rules and identities.
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }

    /// Requests held now, over all.
    pub(crate) fn held(&self) -> u32 {
        self.cap - u32::try_from(self.held.available_permits()).unwrap_or(self.cap)
    }

    /// The Prometheus gauge of requests held now, and the cap.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP slidegate_delayed_requests Requests held by rules' delay now.\n\
             # TYPE slidegate_delayed_requests gauge\nslidegate_delayed_requests {}\n\
             # HELP slidegate_delayed_requests_max The most requests held at once ([server] max_delayed).\n\
             # TYPE slidegate_delayed_requests_max gauge\nslidegate_delayed_requests_max {}",
            self.held(),
            self.cap
        );
    }

    /// A place for one more held request of `identity`, or `None` when it
    /// has `per_identity` held already or the cap is reached.
    pub(crate) fn enter(&self, identity: &Identity, per_identity: u32) -> Option<DelaySlot> {
        let slot = self.per_identity.enter(identity, per_identity)?;
        let permit = Arc::clone(&self.held).try_acquire_owned().ok()?;
        Some(DelaySlot { _identity: slot, _held: permit })
    }
}

/// One request held: its identity's place and its place under the cap,
/// both freed when dropped.
#[derive(Debug)]
pub(crate) struct DelaySlot {
    _identity: InFlightSlot,
    _held: OwnedSemaphorePermit,
}

#[cfg(test)]
mod tests {
    use slidegate::Source;

    use super::*;

    fn identity(n: u8) -> Identity {
        slidegate::IdentityHasher::new(b"test").identity("search", Source::ApiKey, &[n])
    }

    #[test]
    fn per_identity_and_the_cap_bound_what_is_held_and_a_drop_frees_both() {
        let delays = Delays::new(3);
        let a1 = delays.enter(&identity(1), 2).unwrap();
        let a2 = delays.enter(&identity(1), 2).unwrap();
        assert!(delays.enter(&identity(1), 2).is_none(), "a third of one identity");
        let b = delays.enter(&identity(2), 2).unwrap();
        assert_eq!(delays.held(), 3);
        assert!(delays.enter(&identity(3), 2).is_none(), "over the cap");
        drop(a1);
        let c = delays.enter(&identity(3), 2).expect("a place was freed");
        assert!(delays.enter(&identity(1), 2).is_none(), "the cap, not the identity");
        drop((a2, b, c));
        assert_eq!(delays.held(), 0);
        assert_eq!(delays.per_identity.identities(), 0, "nothing kept of identities held no more");
    }

    #[test]
    fn a_refusal_by_the_cap_keeps_no_place_of_the_identity() {
        let delays = Delays::new(1);
        let held = delays.enter(&identity(1), 5).unwrap();
        assert!(delays.enter(&identity(2), 5).is_none());
        assert_eq!(delays.per_identity.count(&identity(2)), 0);
        drop(held);
    }
}
