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

/// The policies of a [`Verdict`], in the rule's order. Derefs to a slice;
/// the common rule's one policy is kept inline, so its verdict allocates
/// nothing.
#[derive(Debug, Clone, Default)]
pub struct Policies<'a>(PoliciesRepr<'a>);

#[derive(Debug, Clone)]
enum PoliciesRepr<'a> {
    One(PolicyResult<'a>),
    Many(Vec<PolicyResult<'a>>),
}

impl Default for PoliciesRepr<'_> {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl<'a> Policies<'a> {
    /// Adds `policy` after the others.
    pub fn push(&mut self, policy: PolicyResult<'a>) {
        match &mut self.0 {
            PoliciesRepr::Many(many) if many.is_empty() => self.0 = PoliciesRepr::One(policy),
            PoliciesRepr::Many(many) => many.push(policy),
            PoliciesRepr::One(_) => {
                let PoliciesRepr::One(first) = std::mem::take(&mut self.0) else { return };
                self.0 = PoliciesRepr::Many(vec![first, policy]);
            }
        }
    }
}

impl<'a> std::ops::Deref for Policies<'a> {
    type Target = [PolicyResult<'a>];

    fn deref(&self) -> &[PolicyResult<'a>] {
        match &self.0 {
            PoliciesRepr::One(policy) => std::slice::from_ref(policy),
            PoliciesRepr::Many(many) => many,
        }
    }
}

impl std::ops::DerefMut for Policies<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match &mut self.0 {
            PoliciesRepr::One(policy) => std::slice::from_mut(policy),
            PoliciesRepr::Many(many) => many,
        }
    }
}

/// Equal when they list the same policies, kept inline or not.
impl PartialEq for Policies<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Policies<'_> {}

impl<'p, 'a> IntoIterator for &'p Policies<'a> {
    type Item = &'p PolicyResult<'a>;
    type IntoIter = std::slice::Iter<'p, PolicyResult<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'p, 'a> IntoIterator for &'p mut Policies<'a> {
    type Item = &'p mut PolicyResult<'a>;
    type IntoIter = std::slice::IterMut<'p, PolicyResult<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<'a> From<Vec<PolicyResult<'a>>> for Policies<'a> {
    fn from(many: Vec<PolicyResult<'a>>) -> Self {
        Self(PoliciesRepr::Many(many))
    }
}

impl<'a> FromIterator<PolicyResult<'a>> for Policies<'a> {
    fn from_iter<I: IntoIterator<Item = PolicyResult<'a>>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else { return Self::default() };
        match iter.next() {
            None => Self(PoliciesRepr::One(first)),
            Some(second) => {
                let mut many = Vec::with_capacity(2 + iter.size_hint().0);
                many.extend([first, second]);
                many.extend(iter);
                Self(PoliciesRepr::Many(many))
            }
        }
    }
}

/// The header values of a rule's policy set that are the same on every
/// response, rendered when the limiter is built.
#[derive(Debug, Clone)]
pub(crate) struct SetValues {
    /// `RateLimit-Policy` listing every policy of the set.
    pub(crate) policy: http::HeaderValue,
    /// `X-RateLimit-Limit` of each policy, in the set's order.
    pub(crate) limits: Vec<http::HeaderValue>,
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
    pub policies: Policies<'a>,
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
    /// The header values of exactly `policies` that never change, rendered
    /// once per rule by the limiter; `None` when the list differs (a breadth
    /// policy added).
    pub(crate) set_values: Option<&'a SetValues>,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy(name: &str) -> PolicyResult<'_> {
        let quota = Quota::new(10, Duration::from_secs(1)).unwrap();
        let decision = Decision {
            allowed: true,
            limit: 10,
            remaining: 9,
            reset_after: Duration::from_secs(1),
            retry_after: None,
        };
        PolicyResult { name, quota, decision }
    }

    /// One policy inline, then every push kept in order, whichever way the
    /// list was made.
    #[test]
    fn policies_keep_their_order_inline_or_not() {
        let mut pushed = Policies::default();
        assert!(pushed.is_empty());
        for (n, name) in ["a", "b", "c"].into_iter().enumerate() {
            pushed.push(policy(name));
            assert_eq!(pushed.iter().map(|p| p.name).collect::<Vec<_>>(), ["a", "b", "c"][..=n]);
        }
        for n in 0..4 {
            let names = &["a", "b", "c"][..n.min(3)];
            let collected: Policies<'_> = names.iter().map(|name| policy(name)).collect();
            let from_vec = Policies::from(names.iter().map(|name| policy(name)).collect::<Vec<_>>());
            assert_eq!(collected.iter().map(|p| p.name).collect::<Vec<_>>(), names);
            assert_eq!(collected, from_vec, "inline or not, the same list");
        }
        let mut one: Policies<'_> = std::iter::once(policy("a")).collect();
        one[0].decision.allowed = false;
        assert!(!one[0].decision.allowed);
    }
}
