//! One request to the layered store, turned into a verdict and counted.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use slidegate::{
    check_charge, Charge, Decision, Decisions, Identity, InvalidRequest, Origin, Outcome, Request, Store,
    StoreError,
};

use super::rule::{Mode, PolicySet, Rule};
use super::{CheckError, RateLimiter};
use crate::config::OnError;
use crate::metrics::RuleCounters;
use crate::offenders::Event;
use crate::verdict::{DecisionSource, Policies, PolicyResult, Verdict};

impl<S: Store + 'static> RateLimiter<S> {
    /// Decides `cost` times each limit's cost for the opaque identity `key`
    /// under the rule named `rule` (`/v1/check`). `key` is hashed like an API
    /// key, so it shares quota with requests carrying that key; `anonymous`
    /// picks a rule's anonymous limits instead of its authenticated ones.
    ///
    /// # Errors
    /// [`CheckError`] for an unknown rule, an empty key or an impossible cost.
    pub async fn check_key(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        anonymous: bool,
    ) -> Result<Verdict<'_>, CheckError> {
        let (index, identity, set) = match self.place_key(rule, key, cost, anonymous)? {
            KeyPlace::Listed(listed) => return Ok(*listed),
            KeyPlace::Rule { index, identity, set } => (index, identity, set),
        };
        for (name, charge) in set.names.iter().zip(&set.charges) {
            check_policy(&charge.limit, charge.cost.saturating_mul(cost), name)?;
        }
        Ok(self.decide(index, &identity, set, cost, Mode::Charge).await)
    }

    /// Decides `cost` permits of `limit` — a limit the caller chose, not
    /// the rule's — for the opaque key `key` under the rule named `rule`,
    /// which names the policy and gives the scope, failure policy and
    /// metrics (Envoy's descriptor `limit` override). The store counts it
    /// apart from the rule's own limits (its keys name the limit).
    ///
    /// # Errors
    /// As [`RateLimiter::check_key`], for `limit`.
    pub async fn check_key_with_limit(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        limit: slidegate::Limit,
    ) -> Result<Verdict<'_>, CheckError> {
        let (index, identity, set) = match self.place_key(rule, key, cost, false)? {
            KeyPlace::Listed(listed) => return Ok(*listed),
            KeyPlace::Rule { index, identity, set } => (index, identity, set),
        };
        check_policy(&limit, cost, set.names.first().map_or("", String::as_str))?;
        let charges = [Charge::new(limit, cost)];
        let verdict = self.ask_charges(index, &identity, set, &charges, Mode::Charge).await;
        self.count(index, &identity, &verdict, Mode::Charge);
        Ok(verdict)
    }

    /// What every check of an opaque key makes before anything is charged:
    /// the rule named `rule`, a key, the lists' answer for it (an anonymous
    /// check names no API key, so only a rule decides it), `cost` within
    /// the rule's `max_cost` (a large cost is a large write: a sliding log
    /// keeps one entry per permit); then the key's identity and the limits
    /// it is charged under (its plan's, or the rule's).
    pub(super) fn place_key(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        anonymous: bool,
    ) -> Result<KeyPlace<'_>, CheckError> {
        let index = self.rule_index(rule)?;
        if key.is_empty() {
            return Err(CheckError::EmptyKey);
        }
        if !anonymous {
            if let Some(listed) = self.listed_client(Some(index), None, Some(key.as_bytes())) {
                return Ok(KeyPlace::Listed(Box::new(listed)));
            }
        }
        let rule = &self.inner.rules[index];
        if cost > rule.max_cost {
            return Err(CheckError::CostAboveMax { cost, max_cost: rule.max_cost });
        }
        let (identity, plan) = self.key_identity(rule, key.as_bytes());
        Ok(KeyPlace::Rule { index, identity, set: rule.set(anonymous, plan) })
    }

    /// One request to the layered store, as a verdict, counted.
    pub(super) async fn decide<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        set: &'s PolicySet,
        cost: u64,
        mode: Mode,
    ) -> Verdict<'s> {
        let verdict = self.ask(index, identity, set, cost, mode).await;
        self.count(index, identity, &verdict, mode);
        verdict
    }

    /// One request to the layered store, as a verdict not yet counted.
    pub(super) async fn ask<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        set: &'s PolicySet,
        cost: u64,
        mode: Mode,
    ) -> Verdict<'s> {
        let scaled: Vec<Charge>;
        let charges = if cost == 1 {
            &set.charges
        } else {
            scaled = set.scaled(cost);
            &scaled
        };
        self.ask_charges(index, identity, set, charges, mode).await
    }

    /// `charges` (`set`'s, or a limit a caller chose, named by `set`) in one
    /// request to the layered store, as a verdict not yet counted.
    async fn ask_charges<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        set: &'s PolicySet,
        charges: &[Charge],
        mode: Mode,
    ) -> Verdict<'s> {
        let rule = &self.inner.rules[index];
        let request = Request { identity, charges, penalty: rule.penalty.as_ref(), deadline: None };
        // Only a rule whose failure policy is the fallback limiter asks
        // through it; the others see the store's failure and apply their own.
        // A store that answers at once (the embedded one) is asked so, with
        // no future built through every layer and moved into this one; the
        // future of a store that waits is boxed, so this one stays small.
        let store = &self.inner.store;
        let now = match rule.on_error {
            OnError::Fallback => store.decide_now(request),
            OnError::Allow | OnError::Deny => store.without_fallback().decide_now(request),
        };
        let answer = match (now, rule.on_error) {
            (Some(answer), _) => answer,
            (None, OnError::Fallback) => Box::pin(store.decide(request)).await,
            (None, OnError::Allow | OnError::Deny) => {
                Box::pin(store.without_fallback().decide(request)).await
            }
        };
        match answer {
            Ok(outcome) => self.verdict(index, identity, set, charges, Ok(outcome), mode),
            Err(err) => self.verdict(index, identity, set, charges, Err(&err), mode),
        }
    }

    /// The store's answer to one rule's `charges` (`set`'s, scaled), as a
    /// verdict not yet counted.
    pub(super) fn verdict<'s>(
        &'s self,
        index: usize,
        identity: &Identity,
        set: &'s PolicySet,
        charges: &[Charge],
        answer: Result<Outcome, &StoreError>,
        mode: Mode,
    ) -> Verdict<'s> {
        let rule = &self.inner.rules[index];
        let counters = self.inner.metrics.rule(index);
        let cached = matches!(&answer, Ok(outcome) if outcome.origin == Origin::Cache);
        let (mut decisions, source, blocked) = read_answer(rule, counters, identity, charges, answer);
        if mode == Mode::Peek {
            // A peek is allowed even at zero permits left; the request it
            // guards would charge at least one, so deny it now. The wait is
            // the store's reset time: exact for fixed windows, an upper
            // bound for the others.
            for d in decisions.iter_mut() {
                if d.allowed && d.remaining == 0 {
                    d.allowed = false;
                    d.retry_after = Some(d.reset_after.max(Duration::from_millis(1)));
                }
            }
        }
        let policies: Policies<'s> = decisions
            .iter()
            .zip(set.names.iter().zip(charges))
            .map(|(&decision, (name, charge))| PolicyResult {
                name: name.as_str(),
                quota: charge.limit.quota,
                decision,
            })
            .collect();
        Verdict {
            rule: &rule.name,
            policies,
            source,
            shadow: rule.shadow,
            pending: None,
            blocked,
            set_values: set.values.as_ref(),
            cost_header: rule.response_cost.cost_header.as_ref(),
            over_in_flight: None,
            identity: identity.into(),
            cached,
            delayed: None,
        }
    }

    /// Counts a verdict in the rule's metrics and the top offenders.
    pub(super) fn count(&self, index: usize, identity: &Identity, verdict: &Verdict<'_>, mode: Mode) {
        let counters = self.inner.metrics.rule(index);
        if verdict.blocked {
            if verdict.shadow {
                counters.shadow_blocked.fetch_add(1, Relaxed);
            } else {
                // Counts the block and shows it on the top offenders page.
                let wait = verdict.policies.iter().filter_map(|p| p.decision.retry_after).max();
                let until = std::time::SystemTime::now() + wait.unwrap_or_default();
                self.record_offence(index, identity, Event::Blocked { until });
            }
        }
        if mode == Mode::AfterResponse
            || !matches!(verdict.source, DecisionSource::Store | DecisionSource::Fallback)
        {
            return;
        }
        match (verdict.allowed(), verdict.shadow) {
            (true, _) => counters.allowed.fetch_add(1, Relaxed),
            (false, false) => counters.denied.fetch_add(1, Relaxed),
            (false, true) => counters.shadow_denied.fetch_add(1, Relaxed),
        };
        if verdict.allowed() {
            // Near the limit: a tenth or less of some limit left.
            if verdict.policies.iter().any(|p| p.decision.remaining.saturating_mul(10) <= p.decision.limit) {
                counters.near_limit.fetch_add(1, Relaxed);
            }
        } else if !verdict.blocked {
            // Shadow denials too: the operator of a shadow rule wants to
            // see whom it would refuse.
            self.record_offence(index, identity, Event::Denied);
        }
    }
}

/// Where [`RateLimiter::place_key`] puts a key: the lists' answer, or the
/// rule (by number), the key's identity and the limits it is charged under.
pub(super) enum KeyPlace<'s> {
    /// Boxed: the lists' answer is rare, the rule's is every decision's.
    Listed(Box<Verdict<'s>>),
    Rule {
        index: usize,
        identity: Identity,
        set: &'s PolicySet,
    },
}

/// [`check_charge`] of `cost` under `limit`, as the error of a check
/// naming the limit's `policy`.
pub(super) fn check_policy(limit: &slidegate::Limit, cost: u64, policy: &str) -> Result<(), CheckError> {
    check_charge(limit, cost).map_err(|err| match err {
        StoreError::Invalid(InvalidRequest::CostExceedsLimit { cost, limit }) => {
            CheckError::CostExceedsLimit { cost, limit, policy: policy.to_owned() }
        }
        source => CheckError::InvalidLimit { policy: policy.to_owned(), source },
    })
}

/// Turns an allowing peek into the refusal of a request over the rule's
/// `max_in_flight`: every policy denied, with what the store said is left,
/// and a wait of a second (the time a slot frees is the upstream's).
pub(super) fn deny_in_flight(verdict: &mut Verdict<'_>, max_in_flight: u32) {
    for policy in &mut verdict.policies {
        policy.decision.allowed = false;
        policy.decision.retry_after = Some(Duration::from_secs(1));
    }
    verdict.over_in_flight = Some(max_in_flight);
}

/// Denials for a request the store rejected as impossible.
fn invalid_denial(charges: &[Charge]) -> Vec<Decision> {
    charges
        .iter()
        .map(|c| Decision {
            allowed: c.cost <= c.limit.quota.permits(),
            limit: c.limit.quota.permits(),
            remaining: 0,
            reset_after: c.limit.quota.window(),
            retry_after: (c.cost > c.limit.quota.permits()).then(|| c.limit.quota.window()),
        })
        .collect()
}

/// The store's answer to a rule's request, as its decisions, who answered,
/// and whether the penalty box blocks the identity; a failure is the rule's
/// failure policy, counted.
fn read_answer(
    rule: &Rule,
    counters: &RuleCounters,
    identity: &Identity,
    charges: &[Charge],
    answer: Result<Outcome, &StoreError>,
) -> (Decisions, DecisionSource, bool) {
    match answer {
        Ok(outcome) => {
            let source = match outcome.origin {
                Origin::Fallback => {
                    counters.fallback.fetch_add(1, Relaxed);
                    DecisionSource::Fallback
                }
                _ => DecisionSource::Store,
            };
            match outcome.blocked_for {
                Some(wait) => {
                    if !outcome.decisions.is_empty() {
                        // This denial started the block: worth a line, once.
                        tracing::warn!(rule = %rule.name, identity = %identity, block_ms = wait.as_millis() as u64,
                            shadow = rule.shadow, "identity blocked by the penalty box");
                    }
                    (slidegate::block_denials(charges, wait).into(), source, true)
                }
                None => (outcome.decisions, source, false),
            }
        }
        // A request no store could allow (cost above a limit) is denied
        // by the algorithms' own check, which says so.
        Err(err) if !err.is_unavailable() => {
            tracing::warn!(rule = %rule.name, %err, "invalid rate limit request");
            (invalid_denial(charges).into(), DecisionSource::Store, false)
        }
        Err(_) => (Decisions::none(), rule.fail(counters), false),
    }
}
