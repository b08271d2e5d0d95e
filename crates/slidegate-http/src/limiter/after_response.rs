//! Work charged after the response: by status or by the upstream's cost header.

use http::HeaderMap;
use slidegate::Store;

use super::rule::Mode;
use super::RateLimiter;
use crate::verdict::{DecisionSource, PendingCharge, Verdict};

impl<S: Store + 'static> RateLimiter<S> {
    /// Charges what the response says a request cost, for a verdict with a
    /// [`Verdict::pending`] charge: nothing for a status the rule does not
    /// count, else the `cost_header` value (clamped to `max_cost` and to the
    /// smallest limit) or 1. One store call; if the whole cost no longer
    /// fits, a second one charges what is left, so an expensive answer
    /// exhausts the limit rather than going free. Returns the decision of the
    /// charge (for the response's headers), `None` when nothing was charged.
    ///
    /// The charge must be made whether or not the client is still there: a
    /// client that hangs up before the answer has had the upstream do the
    /// work all the same. A server that drops a request's future when its
    /// client goes (hyper does) must finish the exchange with the upstream
    /// and this call elsewhere (`slidegate serve` moves them to a task of
    /// their own); the tower layer, whose inner service's answer goes with
    /// the dropped future, charges [`RateLimiter::charge_abandoned`] instead.
    pub async fn charge_response(
        &self,
        pending: &PendingCharge,
        status: http::StatusCode,
        headers: &HeaderMap,
    ) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        self.charge(pending, rule.response_cost.cost(status, headers, rule.max_cost)).await
    }

    /// Charges a request whose response will never be seen (its client hung
    /// up and the service answering it was dropped): the most its response
    /// could have cost — `max_cost` for a rule with a `cost_header`, 1 for
    /// one counting statuses — so hanging up never costs less than waiting
    /// for the answer. Returns what [`RateLimiter::charge_response`] does.
    pub async fn charge_abandoned(&self, pending: &PendingCharge) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        let cost = if rule.response_cost.cost_header.is_some() { rule.max_cost } else { 1 };
        self.charge(pending, cost).await
    }

    /// Charges `cost` for a pending charge: clamped to the smallest limit,
    /// and what is left when the whole no longer fits.
    pub(super) async fn charge(&self, pending: &PendingCharge, cost: u64) -> Option<Verdict<'_>> {
        let rule = self.inner.rules.get(pending.index)?;
        let set = rule.set(pending.anonymous, pending.plan);
        // Never more than the smallest limit holds: the store would refuse it.
        let most = set.charges.iter().map(|c| c.limit.quota.permits() / c.cost.max(1)).min().unwrap_or(0);
        let cost = cost.min(most);
        if cost == 0 {
            return None;
        }
        let verdict = self.decide(pending.index, &pending.identity, set, cost, Mode::AfterResponse).await;
        if verdict.allowed() || verdict.source != DecisionSource::Store {
            return Some(verdict);
        }
        let left = verdict
            .policies
            .iter()
            .zip(&set.charges)
            .map(|(p, c)| p.decision.remaining / c.cost.max(1))
            .min()
            .unwrap_or(0);
        if left == 0 {
            return Some(verdict);
        }
        Some(self.decide(pending.index, &pending.identity, set, left, Mode::AfterResponse).await)
    }
}
