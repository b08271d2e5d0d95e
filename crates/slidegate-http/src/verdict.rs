//! What the limiter answers about one request: a [`Verdict`] made of one
//! [`PolicyResult`] per limit of the rule it matched. Plain values: the
//! headers, the layer and the proxy read them; nothing here decides.

use slidegate::{Decision, Identity, Quota};

use crate::lists::ListScope;
use crate::offenders::IdentityHash;

/// One named limit of a rule and what it decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyResult<'a> {
    /// The policy name (`RateLimit-Policy` item).
    pub name: &'a str,
    /// The quota enforced.
    pub quota: Quota,
    /// The decision.
    pub decision: Decision,
}

/// Who decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionSource {
    /// The store.
    Store,
    /// The embedded fallback limiter, because the store was unavailable.
    Fallback,
    /// Nobody: the store was unavailable and the rule fails open.
    FailOpen,
    /// Nobody: the store was unavailable and the rule fails closed.
    FailClosed,
    /// An allow list: the client is not limited (no store call, no headers).
    AllowList(ListScope),
    /// A deny list: the client is refused with 403 (no store call).
    DenyList(ListScope),
}

/// The outcome of checking one request against the rule it matched.
///
/// It borrows the names from the [`RateLimiter`](crate::RateLimiter): no reference count is
/// touched per request. Not `Clone`: its pending charge holds the request's
/// place among those in flight.
#[derive(Debug)]
pub struct Verdict<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// Every limit of the rule with its decision; empty when nobody decided.
    pub policies: Vec<PolicyResult<'a>>,
    /// Who decided.
    pub source: DecisionSource,
    /// Whether the rule is in shadow mode (never blocks).
    pub shadow: bool,
    /// The charge still owed after the upstream answers (a rule with
    /// `count_status` or `cost_header`): see [`RateLimiter::charge_response`](crate::RateLimiter::charge_response).
    pub(crate) pending: Option<PendingCharge>,
    /// Whether the identity is in the rule's penalty box: every policy is
    /// denied until the block ends, whatever the limits say.
    pub blocked: bool,
    /// `RateLimit-Policy` listing exactly `policies`, rendered once per rule
    /// by the limiter; `None` when the list differs (a breadth policy added).
    pub(crate) policy_value: Option<&'a http::HeaderValue>,
    /// The rule's `cost_header`: the upstream's word to the limiter, removed
    /// from the response before the client sees it.
    pub(crate) cost_header: Option<&'a http::HeaderName>,
    /// Set when the request was refused because its identity already had
    /// this many requests in flight under the rule (`max_in_flight`): every
    /// policy then reads as denied for a second, with what the store said is
    /// left.
    pub(crate) over_in_flight: Option<u32>,
    /// Whom the request was counted as: the keyed hash, never the key or address.
    pub(crate) identity: IdentityHash,
    /// Whether the store's answer came from the in-process deny cache
    /// (`source` then reads [`DecisionSource::Store`]: the cache answers
    /// exactly as the store would).
    pub(crate) cached: bool,
    /// How long the request was held before this answer, under a rule with
    /// `delay`; `None` when it was not held.
    pub(crate) delayed: Option<std::time::Duration>,
}

/// A charge decided after the response: who, under which rule's limits.
///
/// It holds the request's place among its identity's requests in flight
/// (`max_in_flight`) until it is dropped: keep it until the charge is made,
/// and make the charge even when the client has gone (see
/// [`RateLimiter::charge_response`](crate::RateLimiter::charge_response)).
#[derive(Debug)]
pub struct PendingCharge {
    pub(crate) index: usize,
    pub(crate) identity: Identity,
    pub(crate) anonymous: bool,
    /// The API key's plan, if it has one.
    pub(crate) plan: Option<crate::plans::PlanId>,
    /// `None` only in shadow mode, for a request over the bound that is let through.
    pub(crate) _slot: Option<crate::in_flight::InFlightSlot>,
}

impl<'a> Verdict<'a> {
    /// The charge owed after the upstream answers, for rules that count
    /// responses (`count_status`) or price them (`cost_header`).
    pub fn pending(&self) -> Option<&PendingCharge> {
        self.pending.as_ref()
    }

    /// The charge owed after the upstream answers, taken out of the verdict
    /// (to be made by a task that outlives the request; see
    /// [`RateLimiter::charge_response`](crate::RateLimiter::charge_response)).
    pub fn take_pending(&mut self) -> Option<PendingCharge> {
        self.pending.take()
    }

    /// The response header the upstream prices a request in, for a rule
    /// with `cost_header`: remove it from the response the client gets.
    pub fn cost_header(&self) -> Option<&'a http::HeaderName> {
        self.cost_header
    }

    /// The rule's `max_in_flight`, when the request was refused because its
    /// identity already had that many requests in flight under the rule.
    pub fn over_in_flight(&self) -> Option<u32> {
        self.over_in_flight
    }

    /// Whom the request was counted as, as the top offenders page shows
    /// it: a keyed hash and its kind, never the API key or the address.
    pub fn identity_hash(&self) -> IdentityHash {
        self.identity
    }

    /// Whether the in-process deny cache answered for the store (a denial
    /// the store gave, repeated until its wait ends).
    pub fn cached(&self) -> bool {
        self.cached
    }

    /// How long the request was held (a rule's `delay`) before it was
    /// decided as it reads now; `None` when it was answered at once.
    pub fn delayed(&self) -> Option<std::time::Duration> {
        self.delayed
    }

    /// Whether every limit allowed (true for fail-open, false for fail-closed).
    pub fn allowed(&self) -> bool {
        match self.source {
            DecisionSource::FailOpen | DecisionSource::AllowList(_) => true,
            DecisionSource::FailClosed | DecisionSource::DenyList(_) => false,
            DecisionSource::Store | DecisionSource::Fallback => {
                self.policies.iter().all(|p| p.decision.allowed)
            }
        }
    }

    /// Whether the request must be refused: denied and not in shadow mode.
    pub fn blocks(&self) -> bool {
        !self.allowed() && !self.shadow
    }

    /// The limits that denied.
    pub fn violated(&self) -> impl Iterator<Item = &PolicyResult<'a>> {
        self.policies.iter().filter(|p| !p.decision.allowed)
    }

    /// The limit that binds: for a denial, the violated one with the longest
    /// wait; otherwise the one with the fewest permits left.
    pub fn decisive(&self) -> Option<&PolicyResult<'a>> {
        if self.policies.iter().any(|p| !p.decision.allowed) {
            self.violated().max_by_key(|p| p.decision.retry_after)
        } else {
            // min_by_key keeps the first of equals: the rule's first limit.
            self.policies.iter().min_by_key(|p| p.decision.remaining)
        }
    }
}
