//! A rule as the limiter keeps it: its limits compiled into charges, by identity.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use slidegate::{Charge, Penalty};

use crate::config::{IdentityKind, LimitConfig, OnError, PlansConfig, RuleConfig, RuleLimits};
use crate::metrics::RuleCounters;
use crate::plans::PlanId;
use crate::verdict::{DecisionSource, SetValues};

/// The named limits one identity is charged together.
#[derive(Debug, Clone)]
pub(super) struct PolicySet {
    pub(super) names: Vec<String>,
    pub(super) charges: Vec<Charge>,
    /// `RateLimit-Policy` listing every limit of the set and each limit's
    /// `X-RateLimit-Limit`: the same on every response, so rendered once.
    pub(super) values: Option<SetValues>,
}

impl PolicySet {
    pub(super) fn new(limits: &[LimitConfig]) -> Self {
        Self {
            names: limits.iter().map(|l| l.name.clone()).collect(),
            charges: limits.iter().map(|l| Charge::new(l.limit, l.cost)).collect(),
            values: crate::headers::set_values(limits.iter().map(|l| (l.name.as_str(), l.limit.quota))),
        }
    }

    /// The charges of a request of `cost` (each limit's own cost times it).
    pub(super) fn scaled(&self, cost: u64) -> Vec<Charge> {
        self.charges.iter().map(|c| Charge::new(c.limit, c.cost.saturating_mul(cost))).collect()
    }
}

#[derive(Debug)]
pub(super) enum RuleSets {
    Shared { identity: IdentityKind, set: PolicySet },
    Split { authenticated: PolicySet, anonymous: PolicySet },
}

impl RuleSets {
    /// The rule's own set a request is charged under: an anonymous one (no API key) or not.
    pub(super) fn pick(&self, anonymous: bool) -> &PolicySet {
        match self {
            RuleSets::Shared { set, .. } => set,
            RuleSets::Split { anonymous: set, .. } if anonymous => set,
            RuleSets::Split { authenticated: set, .. } => set,
        }
    }
}

#[derive(Debug)]
pub(super) struct Rule {
    pub(super) name: String,
    /// The rule's name as the scope of its identities.
    pub(super) scope: Arc<str>,
    pub(super) sets: RuleSets,
    /// By plan: the set replacing the rule's own for an API key on that
    /// plan; `None` where the plan leaves the rule's limits as they are.
    pub(super) by_plan: Vec<Option<PolicySet>>,
    pub(super) on_error: OnError,
    pub(super) shadow: bool,
    /// The largest cost one `/v1/check` call may charge.
    pub(super) max_cost: u64,
    pub(super) breadth: Option<crate::BreadthConfig>,
    /// The breadth limit's policy name: `<rule>-breadth`.
    pub(super) breadth_name: String,
    pub(super) response_cost: crate::ResponseCost,
    /// With `response_cost`: requests of one identity in flight at once.
    pub(super) max_in_flight: u32,
    pub(super) penalty: Option<Penalty>,
    pub(super) delay: Option<crate::config::DelayConfig>,
}

impl Rule {
    pub(super) fn new(r: &RuleConfig, plans: &PlansConfig) -> Self {
        // Plans change the limits of API keys; a rule counting by address has none.
        let by_key = !matches!(r.limits, RuleLimits::Shared { identity: IdentityKind::Ip, .. });
        let by_plan = plans
            .plans
            .iter()
            .map(|plan| plan.limits_of(&r.name).filter(|l| by_key && !l.is_empty()).map(PolicySet::new))
            .collect();
        Rule {
            by_plan,
            name: r.name.clone(),
            scope: r.name.as_str().into(),
            sets: match &r.limits {
                RuleLimits::Shared { identity, limits } => {
                    RuleSets::Shared { identity: *identity, set: PolicySet::new(limits) }
                }
                RuleLimits::Split { authenticated, anonymous } => RuleSets::Split {
                    authenticated: PolicySet::new(authenticated),
                    anonymous: PolicySet::new(anonymous),
                },
            },
            on_error: r.on_error,
            shadow: r.shadow,
            max_cost: r.max_cost,
            breadth: r.breadth.clone(),
            breadth_name: format!("{}-breadth", r.name),
            response_cost: r.response_cost.clone(),
            max_in_flight: r.max_in_flight,
            penalty: r.penalty,
            delay: r.delay,
        }
    }

    /// Whether a request carrying an API key is counted by it (else by its address).
    pub(super) fn counts_keys(&self) -> bool {
        !matches!(self.sets, RuleSets::Shared { identity: IdentityKind::Ip, .. })
    }

    /// The set a request is charged under: its plan's, when it carries an
    /// API key on a plan with limits for this rule, else the rule's own.
    pub(super) fn set(&self, anonymous: bool, plan: Option<PlanId>) -> &PolicySet {
        match plan.and_then(|p| self.by_plan.get(p.0)) {
            Some(Some(set)) if !anonymous => set,
            _ => self.sets.pick(anonymous),
        }
    }

    /// What a failed store means for this rule, counted.
    pub(super) fn fail(&self, counters: &RuleCounters) -> DecisionSource {
        match self.on_error {
            OnError::Allow => {
                counters.fail_open.fetch_add(1, Relaxed);
                DecisionSource::FailOpen
            }
            // The fallback limiter answers every failure of the store; a
            // failure reaching here is the fallback's own: closed.
            OnError::Deny | OnError::Fallback => {
                counters.fail_closed.fetch_add(1, Relaxed);
                DecisionSource::FailClosed
            }
        }
    }
}

/// How [`RateLimiter::decide`] charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Charge the cost now (the usual request).
    Charge,
    /// Charge nothing; deny when a limit has no permit left (before a
    /// charge that comes with the response).
    Peek,
    /// The charge after the response: counted in no metric (the request was
    /// counted at its peek).
    AfterResponse,
}
