//! What the limiter answers about one request: a [`Verdict`] made of one
//! [`PolicyResult`] per limit of the rule it matched. Plain values: the
//! headers, the layer and the proxy read them; nothing here decides.

use slidegate::{Decision, Identity, Quota};

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
}

/// The outcome of checking one request against the rule it matched.
///
/// It borrows the names from the [`RateLimiter`](crate::RateLimiter): no reference count is
/// touched per request.
#[derive(Debug, Clone)]
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
}

/// A charge decided after the response: who, under which rule's limits.
#[derive(Debug, Clone)]
pub struct PendingCharge {
    pub(crate) index: usize,
    pub(crate) identity: Identity,
    pub(crate) anonymous: bool,
}

impl<'a> Verdict<'a> {
    /// The charge owed after the upstream answers, for rules that count
    /// responses (`count_status`) or price them (`cost_header`).
    pub fn pending(&self) -> Option<&PendingCharge> {
        self.pending.as_ref()
    }

    /// Whether every limit allowed (true for fail-open, false for fail-closed).
    pub fn allowed(&self) -> bool {
        match self.source {
            DecisionSource::FailOpen => true,
            DecisionSource::FailClosed => false,
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
