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
//! `max_delayed` over every rule and identity (one semaphore). Between the
//! two, each client's share of `max_delayed` shrinks as the queue fills, as
//! its share of `serve`'s upstream pool does (`crate::client_share`): one
//! holding `h` may add one only while more than `4 × h` places are free.
//! Identities are not a client's to count — an API key is not verified, so
//! one client rotating keys has as many `per_identity` queues as it likes —
//! but its address is: alone it holds at most a fifth of `max_delayed`, and
//! a client holding nothing is held while any place is free. A request
//! finding any of the three full is refused at once, as without `delay`.
//! Memory is what is held: a `DelaySlot` frees its three places when
//! dropped, which is also what happens when the client hangs up and the
//! request's future is dropped mid-sleep.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use slidegate::{Digest, Identity, IdentityHasher, Source};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::client_share::crowded;
use crate::config::DelayConfig;
use crate::extractor::{random_secret, IdentityExtractor};
use crate::in_flight::{Counted, InFlight, InFlightSlot};
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

/// One client as the delay queue counts it: its address as the limits
/// group it (after the trusted proxies, IPv6 by `ipv6_prefix`), under a
/// keyed hash of the queue's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Client(Digest);

impl Counted for Client {
    fn spread(&self) -> usize {
        // A keyed hash: its bytes are uniform, and a client cannot choose.
        usize::from(self.0 .0[0])
    }
}

/// The requests held now: per identity (under each rule), per client and
/// over all.
pub(crate) struct Delays {
    per_identity: Arc<InFlight>,
    per_client: Arc<InFlight<Client>>,
    /// Hashes client addresses under a secret drawn when the queue is made,
    /// kept across reloads (which may change the limits' secret).
    clients: IdentityHasher,
    held: Arc<Semaphore>,
    cap: u32,
}

impl std::fmt::Debug for Delays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delays").field("held", &self.held()).field("cap", &self.cap).finish_non_exhaustive()
    }
}

impl Delays {
    /// Room for `cap` requests held at once.
    pub(crate) fn new(cap: u32) -> Self {
        Self {
            per_identity: Arc::default(),
            per_client: Arc::default(),
            clients: IdentityHasher::new(&random_secret()),
            held: Arc::new(Semaphore::new(cap as usize)),
            cap,
        }
    }

    /// A cap of `cap` over the same per-identity and per-client counts as
    /// `self` (a reload): the requests held under the old cap keep their
    /// places until they end, so while they do at most the old cap and the
    /// new are held, and a client's share of the new counts what it holds
    /// under the old.
    pub(crate) fn with_cap(&self, cap: u32) -> Self {
        Self {
            per_identity: Arc::clone(&self.per_identity),
            per_client: Arc::clone(&self.per_client),
            clients: self.clients.clone(),
            held: Arc::new(Semaphore::new(cap as usize)),
            cap,
        }
    }

    /// The cap over all rules and identities.
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }

    /// Requests held now, over all.
    pub(crate) fn held(&self) -> u32 {
        self.cap - u32::try_from(self.held.available_permits()).unwrap_or(self.cap)
    }

    /// The OpenMetrics gauges of requests held now, and of the cap.
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

    /// The client at `ip` (after the trusted proxies), grouped as
    /// `identity` groups addresses; every request without an address is one
    /// client, as the limits count it.
    pub(crate) fn client(&self, identity: &IdentityExtractor, ip: Option<IpAddr>) -> Client {
        let bytes = ip.map(|ip| identity.ip_bytes(ip)).unwrap_or_default();
        Client(self.clients.digest(Source::Ip, &bytes))
    }

    /// A place for one more held request of `identity` from `client`, or
    /// `None` when the identity has `per_identity` held already, the cap is
    /// reached, or the client holds too much of a queue this full.
    pub(crate) fn enter(&self, identity: &Identity, per_identity: u32, client: Client) -> Option<DelaySlot> {
        let slot = self.per_identity.enter(identity, per_identity)?;
        let permit = Arc::clone(&self.held).try_acquire_owned().ok()?;
        // Read with this request's own place taken, so that requests of
        // other clients taking places at the same time each see the others';
        // the places free before it are one more.
        let free = self.held.available_permits().saturating_add(1);
        let client = self.per_client.enter_if(&client, |held| !crowded(held as usize, free))?;
        Some(DelaySlot { _identity: slot, _client: client, _held: permit })
    }
}

/// One request held: its identity's place, its client's and its place under
/// the cap, all freed when dropped.
#[derive(Debug)]
pub(crate) struct DelaySlot {
    _identity: InFlightSlot,
    _client: InFlightSlot<Client>,
    _held: OwnedSemaphorePermit,
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn identity(n: u8) -> Identity {
        slidegate::IdentityHasher::new(b"test").identity("search", Source::ApiKey, &[n])
    }

    fn client(delays: &Delays, n: u8) -> Client {
        let extractor = IdentityExtractor::new(b"test");
        delays.client(&extractor, Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))))
    }

    #[test]
    fn per_identity_and_the_cap_bound_what_is_held_and_a_drop_frees_both() {
        let delays = Delays::new(3);
        // Each request from a client of its own, which its share never stops.
        let a1 = delays.enter(&identity(1), 2, client(&delays, 1)).unwrap();
        let a2 = delays.enter(&identity(1), 2, client(&delays, 2)).unwrap();
        assert!(delays.enter(&identity(1), 2, client(&delays, 3)).is_none(), "a third of one identity");
        let b = delays.enter(&identity(2), 2, client(&delays, 4)).unwrap();
        assert_eq!(delays.held(), 3);
        assert!(delays.enter(&identity(3), 2, client(&delays, 5)).is_none(), "over the cap");
        drop(a1);
        let c = delays.enter(&identity(3), 2, client(&delays, 5)).expect("a place was freed");
        assert!(delays.enter(&identity(1), 2, client(&delays, 6)).is_none(), "the cap, not the identity");
        drop((a2, b, c));
        assert_eq!(delays.held(), 0);
        assert_eq!(delays.per_identity.identities(), 0, "nothing kept of identities held no more");
        assert_eq!(delays.per_client.identities(), 0, "nor of clients");
    }

    #[test]
    fn a_refusal_by_the_cap_or_the_share_keeps_no_place() {
        let delays = Delays::new(1);
        let held = delays.enter(&identity(1), 5, client(&delays, 1)).unwrap();
        assert!(delays.enter(&identity(2), 5, client(&delays, 2)).is_none());
        assert_eq!(delays.per_identity.count(&identity(2)), 0);
        assert_eq!(delays.per_client.count(&client(&delays, 2)), 0);
        drop(held);
        // Refused for the client's share: neither the identity's place nor
        // the cap's is kept.
        let delays = Delays::new(10);
        let mine = [1, 2].map(|n| delays.enter(&identity(n), 5, client(&delays, 1)).unwrap());
        assert!(delays.enter(&identity(3), 5, client(&delays, 1)).is_none());
        assert_eq!(delays.per_identity.count(&identity(3)), 0);
        assert_eq!((delays.held(), delays.per_client.count(&client(&delays, 1))), (2, 2));
        drop(mine);
    }

    /// One client rotating identities cannot fill the queue: each client
    /// takes places, with a new identity each, until its share stops it,
    /// and the share shrinks as the queue fills; a newcomer gets a place
    /// while any is free.
    #[test]
    fn a_clients_share_shrinks_as_the_queue_fills() {
        let delays = Delays::new(20);
        let mut next = 0u8;
        let mut slots = Vec::new();
        let mut taken = Vec::new();
        for n in 1..=12 {
            let before = slots.len();
            for _ in 0..10 {
                next += 1;
                slots.extend(delays.enter(&identity(next), 1, client(&delays, n)));
            }
            taken.push(slots.len() - before);
        }
        // Each stops once no more than 4 × what it holds is free: the first,
        // alone, at 4 (a fifth) with 16 free, the next at 4 with 12, 3 with
        // 9, 2 with 7 and 5, 1 with 4; the last places go to clients holding
        // none, and then the cap refuses.
        assert_eq!(taken, [4, 4, 3, 2, 2, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(delays.held(), 20);
        // As the first client's requests end, room comes back.
        slots.drain(..4);
        let back = delays.enter(&identity(next + 1), 1, client(&delays, 12));
        assert!(back.is_some(), "a client holding none, with places free");
        drop((slots, back));
        assert_eq!((delays.held(), delays.per_client.identities()), (0, 0));
    }

    #[test]
    fn clients_are_grouped_as_the_limits_group_them() {
        let delays = Delays::new(1);
        let extractor = IdentityExtractor::new(b"test").ipv6_prefix(64);
        let at = |ip: &str| delays.client(&extractor, Some(ip.parse().unwrap()));
        assert_eq!(at("2001:db8::1"), at("2001:db8::ffff:2"), "one /64");
        assert_ne!(at("2001:db8::1"), at("2001:db8:0:1::1"));
        assert_ne!(at("192.0.2.1"), at("192.0.2.2"));
        assert_eq!(at("::ffff:192.0.2.1"), at("192.0.2.1"), "an IPv4-mapped address is the IPv4 client");
        // Requests without an address are one client.
        assert_eq!(delays.client(&extractor, None), delays.client(&extractor, None));
        // The queue's own secret, kept by a new cap, not the limits'.
        let other = IdentityExtractor::new(b"other").ipv6_prefix(64);
        assert_eq!(at("192.0.2.1"), delays.client(&other, Some("192.0.2.1".parse().unwrap())));
        assert_eq!(
            at("192.0.2.1"),
            delays.with_cap(5).client(&extractor, Some("192.0.2.1".parse().unwrap()))
        );
        assert_ne!(at("192.0.2.1"), Delays::new(1).client(&extractor, Some("192.0.2.1".parse().unwrap())));
    }
}
