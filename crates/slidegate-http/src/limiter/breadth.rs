//! Crawl breadth: the distinct values an identity touches, asked before its rate limits.

use std::sync::atomic::Ordering::Relaxed;

use slidegate::{DistinctStore, Identity, Store};

use super::RateLimiter;
use crate::config::OnError;
use crate::verdict::{DecisionSource, Policies, PolicyResult, Verdict};

impl<S: Store + 'static> RateLimiter<S> {
    /// The breadth decision for a request whose path read as `reading` when
    /// it matched the rule, with `query`: `Ok(Some(policy))` to report with
    /// the rate limits, `Ok(None)` when the store failed and the rule's
    /// failure policy is not the fallback (breadth then steps aside and the
    /// rate limits apply it), `Err(verdict)` a denial. Every request has a value (see [`crate::BreadthOf::value`]).
    pub(super) async fn decide_breadth<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        breadth: &crate::BreadthConfig,
        reading: &str,
        query: Option<&str>,
    ) -> Result<Option<PolicyResult<'s>>, Verdict<'s>> {
        let rule = &self.inner.rules[index];
        let value = breadth.of.value(reading, query);
        let digest;
        let value: &[u8] = if value.len() > crate::breadth::MAX_VALUE_BYTES {
            digest = self.inner.identity.value_digest(&value);
            &digest
        } else {
            &value
        };
        // As for the rate limits, only a rule whose failure policy is the
        // fallback limiter asks through it. Otherwise breadth steps aside
        // when the store fails, and the rate limits apply `on_error` (a
        // `deny` rule fails closed there). `new` refused a breadth rule on a
        // store without sketches.
        let answer = match rule.on_error {
            OnError::Fallback => match self.inner.store.distinct() {
                Some(distinct) => distinct.decide_distinct(identity, &breadth.quota, value).await,
                None => return Ok(None),
            },
            OnError::Allow | OnError::Deny => match self.inner.store.without_fallback().distinct() {
                Some(distinct) => distinct.decide_distinct(identity, &breadth.quota, value).await,
                None => return Ok(None),
            },
        };
        let Ok(decision) = answer else {
            return Ok(None);
        };
        let policy = PolicyResult { name: &rule.breadth_name, quota: breadth.quota, decision };
        if policy.decision.allowed {
            return Ok(Some(policy));
        }
        let counters = self.inner.metrics.rule(index);
        if rule.shadow {
            counters.shadow_denied.fetch_add(1, Relaxed);
        } else {
            counters.denied.fetch_add(1, Relaxed);
        }
        Err(Verdict {
            rule: &rule.name,
            policies: Policies::from_iter([policy]),
            source: DecisionSource::Store,
            shadow: rule.shadow,
            pending: None,
            blocked: false,
            set_values: None,
            cost_header: None,
            over_in_flight: None,
            identity: identity.into(),
            cached: false,
            delayed: None,
        })
    }
}
