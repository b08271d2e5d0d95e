//! `[[rules]]`: paths, methods, limits per identity, and the rule's
//! defences (breadth, response-based costs, the penalty box).

use slidegate::{InvalidRequest, Limit, Quota, QuotaError, StoreError};
use slidegate_http::config::{
    DelayConfig, DelayError, IdentityKind, LimitConfig, OnError, RuleConfig, RuleLimits,
};
use slidegate_http::{BreadthConfig, BreadthOf, ResponseCost};
use toml::Spanned;

use super::super::error::ConfigError;
use super::super::raw::{RawBreadth, RawDelay, RawLimit, RawPenalty, RawRule};
use super::super::values::MethodName;
use super::Validator;

impl Validator<'_> {
    pub(super) fn rule(
        &self,
        spanned: Spanned<RawRule>,
        store_on_error: OnError,
    ) -> Result<RuleConfig, ConfigError> {
        let rule_span = spanned.span();
        let mut raw = spanned.into_inner();
        let name = raw.name.get_ref().clone();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(self.err(
                raw.name.span(),
                format!("invalid rule name {name:?}: expected letters, digits, '-', '_' or '.'"),
            ));
        }
        let limits = self.rule_limits(&name, rule_span, &mut raw)?;
        let breadth = match raw.breadth {
            Some(b) => Some(self.breadth(b.into_inner(), &raw.path.0.to_string())?),
            None => None,
        };
        let response_cost = self.response_cost(raw.count_status, raw.cost_header)?;
        let path = raw.path.0.case_sensitive(raw.case_sensitive).format_suffix(raw.format_suffix);
        let mut rule = RuleConfig::new(name, path, limits);
        rule.breadth = breadth;
        rule.response_cost = response_cost;
        rule.methods = self.each::<MethodName>(raw.methods)?.into_iter().map(|m| m.0).collect();
        rule.on_error = raw.on_error.unwrap_or(store_on_error);
        rule.shadow = raw.shadow;
        if let Some(m) = raw.max_cost {
            if *m.get_ref() == 0 {
                return Err(self.err(m.span(), "max_cost must be at least 1"));
            }
            rule.max_cost = *m.get_ref();
            if let Some((limit, most)) =
                smallest_headroom(&rule.limits).filter(|(_, most)| rule.max_cost > *most)
            {
                return Err(self.err(
                    m.span(),
                    format!(
                        "max_cost = {} is above what limit {limit:?} of rule {:?} can ever admit ({most}): \
                         a check of that cost is always refused; expected at most {most}",
                        rule.max_cost, rule.name
                    ),
                ));
            }
        }
        if let Some(m) = raw.max_in_flight {
            rule.max_in_flight = self.max_in_flight(m, &rule.response_cost)?;
        }
        if let Some(p) = raw.penalty {
            rule.penalty = Some(self.penalty(p)?);
        }
        if let Some(d) = raw.delay {
            rule.delay = Some(self.delay(d, &rule)?);
        }
        Ok(rule)
    }

    /// `limits` (with `identity`), or `authenticated` and `anonymous`.
    fn rule_limits(
        &self,
        name: &str,
        rule_span: std::ops::Range<usize>,
        raw: &mut RawRule,
    ) -> Result<RuleLimits, ConfigError> {
        match (raw.limits.take(), raw.authenticated.take(), raw.anonymous.take()) {
            (Some(limits), None, None) => Ok(RuleLimits::Shared {
                identity: raw.identity.as_ref().map_or(IdentityKind::default(), |i| *i.get_ref()),
                limits: self.limits(name, limits)?,
            }),
            (None, Some(auth), Some(anon)) => {
                if let Some(identity) = &raw.identity {
                    return Err(self.err(
                        identity.span(),
                        "identity applies to `limits` only: `authenticated` limits count per API key and \
                         `anonymous` limits per client IP",
                    ));
                }
                Ok(RuleLimits::Split {
                    authenticated: self.limits(name, auth)?,
                    anonymous: self.limits(name, anon)?,
                })
            }
            (Some(limits), _, _) => Err(self.err(
                limits.span(),
                format!(
                    "rule {name:?} has both `limits` and `authenticated`/`anonymous`: expected either \
                     `limits` or both `authenticated` and `anonymous`"
                ),
            )),
            (None, Some(one), None) | (None, None, Some(one)) => Err(self.err(
                one.span(),
                format!("rule {name:?} needs both `authenticated` and `anonymous` limits, or `limits` alone"),
            )),
            (None, None, None) => Err(self.err(
                rule_span,
                format!("rule {name:?} has no limits: expected `limits = [{{ limit = 10, window = \"1s\" }}]` or `authenticated` and `anonymous` lists"),
            )),
        }
    }

    /// `count_status` and `cost_header`: what is charged after the response.
    fn response_cost(
        &self,
        count_status: Option<Spanned<Vec<Spanned<u16>>>>,
        cost_header: Option<Spanned<String>>,
    ) -> Result<ResponseCost, ConfigError> {
        let mut cost = ResponseCost::default();
        if let Some(list) = count_status.as_ref().filter(|l| l.get_ref().is_empty()) {
            return Err(self.err(
                list.span(),
                "count_status = [] counts no response: expected the statuses to count (e.g. [404]), \
                 or no count_status to charge every request before it is forwarded",
            ));
        }
        for status in count_status.map(Spanned::into_inner).unwrap_or_default() {
            if !(100..=599).contains(status.get_ref()) {
                return Err(self.err(status.span(), "count_status: expected HTTP statuses from 100 to 599"));
            }
            cost.count_status.push(*status.get_ref());
        }
        if let Some(h) = cost_header {
            cost.cost_header = Some(http::HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
                self.err(h.span(), format!("invalid cost_header {:?}: expected a header name", h.get_ref()))
            })?);
        }
        Ok(cost)
    }

    /// `max_in_flight`: only where the rule charges after the response (the
    /// others charge before forwarding, and are never ahead of their count).
    fn max_in_flight(&self, max: Spanned<u32>, cost: &ResponseCost) -> Result<u32, ConfigError> {
        if !cost.is_deferred() {
            return Err(self.err(
                max.span(),
                "max_in_flight bounds requests charged after the response: it needs `cost_header` or \
                 `count_status` on the rule",
            ));
        }
        if *max.get_ref() == 0 {
            return Err(self.err(max.span(), "max_in_flight must be at least 1, got 0"));
        }
        Ok(*max.get_ref())
    }

    fn breadth(&self, raw: RawBreadth, pattern: &str) -> Result<BreadthConfig, ConfigError> {
        let quota = Quota::new(*raw.distinct.get_ref(), raw.window.duration).map_err(|e| {
            let at = if matches!(e, QuotaError::ZeroLimit) {
                raw.distinct.span()
            } else {
                raw.window.span.clone()
            };
            self.err(at, format!("invalid breadth: {e}"))
        })?;
        let of = match &raw.of {
            Some(of) => BreadthOf::parse(of.get_ref(), pattern)
                .map_err(|e| self.err(of.span(), format!("invalid breadth `of`: {e}")))?,
            None => BreadthOf::Path,
        };
        Ok(BreadthConfig { quota, of })
    }

    fn penalty(&self, spanned: Spanned<RawPenalty>) -> Result<slidegate::Penalty, ConfigError> {
        let span = spanned.span();
        let raw = spanned.into_inner();
        let block = raw.block.0.get();
        // Without a cap, repeat offenders double up to a day (or the first block, if longer).
        let max_block =
            raw.max_block.map_or(block.max(std::time::Duration::from_secs(86_400)), |m| m.0.get());
        let after = *raw.after.get_ref();
        slidegate::Penalty::new(after, raw.within.0.get(), block, max_block).map_err(|e| {
            let at = if matches!(e, slidegate::PenaltyError::After(_)) { raw.after.span() } else { span };
            self.err(at, format!("invalid penalty: {e}"))
        })
    }

    /// `delay`: on a rule that refuses (not shadow), charges before
    /// forwarding and has no penalty box.
    fn delay(&self, spanned: Spanned<RawDelay>, rule: &RuleConfig) -> Result<DelayConfig, ConfigError> {
        let span = spanned.span();
        let raw = spanned.into_inner();
        let conflict = if rule.shadow {
            Some("a shadow rule never refuses, so it has nothing to hold")
        } else if rule.response_cost.is_deferred() {
            Some("a rule charged after the response (`count_status`, `cost_header`) decides before the cost is known")
        } else if rule.penalty.is_some() {
            Some("each request held counts a denial toward the penalty box, which would block clients for pacing")
        } else {
            None
        };
        if let Some(why) = conflict {
            return Err(self.err(span, format!("delay cannot be set on rule {:?}: {why}", rule.name)));
        }
        let max_wait = raw.max_wait.get_ref().0;
        let per_identity =
            raw.per_identity.as_ref().map_or(DelayConfig::DEFAULT_PER_IDENTITY, |p| *p.get_ref());
        DelayConfig::new(max_wait, per_identity).map_err(|e| {
            let at = match e {
                DelayError::PerIdentity(_) => raw.per_identity.as_ref().map_or(span, Spanned::span),
                _ => raw.max_wait.span(),
            };
            self.err(at, format!("invalid delay: {e}"))
        })
    }

    /// `[server] max_delayed`: the cap on requests held by every rule's `delay`.
    pub(super) fn max_delayed(&self, max: Option<Spanned<u32>>) -> Result<u32, ConfigError> {
        let Some(max) = max else {
            return Ok(DelayConfig::DEFAULT_MAX_DELAYED);
        };
        let most = DelayConfig::MAX_MAX_DELAYED;
        if !(1..=most).contains(max.get_ref()) {
            return Err(self.err(
                max.span(),
                format!(
                    "max_delayed must be from 1 to {most}, got {}: each held request keeps a connection open",
                    max.get_ref()
                ),
            ));
        }
        Ok(*max.get_ref())
    }

    pub(super) fn limits(
        &self,
        rule: &str,
        list: Spanned<Vec<Spanned<RawLimit>>>,
    ) -> Result<Vec<LimitConfig>, ConfigError> {
        let list_span = list.span();
        let list = list.into_inner();
        if list.is_empty() {
            return Err(self.err(
                list_span,
                format!("rule {rule:?} has an empty limit list: expected at least one limit"),
            ));
        }
        let single = list.len() == 1;
        let mut out: Vec<LimitConfig> = Vec::with_capacity(list.len());
        for spanned in list {
            let span = spanned.span();
            let limit = self.limit(rule, spanned, single)?;
            if let Some(dup) = out.iter().find(|l| l.name == limit.name || l.limit == limit.limit) {
                let what =
                    if dup.limit == limit.limit { "the same limit twice" } else { "two limits named alike" };
                return Err(self.err(
                    span,
                    format!(
                        "rule {rule:?} has {what} ({:?}): give each limit its own `name` and window",
                        limit.name
                    ),
                ));
            }
            out.push(limit);
        }
        Ok(out)
    }

    /// One limit of the rule `rule`; `single` when it is the rule's only one
    /// (then an unnamed limit takes the rule's name).
    fn limit(
        &self,
        rule: &str,
        spanned: Spanned<RawLimit>,
        single: bool,
    ) -> Result<LimitConfig, ConfigError> {
        let span = spanned.span();
        let raw = spanned.into_inner();
        let quota = Quota::new(*raw.limit.get_ref(), raw.window.duration).map_err(|e| {
            let at =
                if matches!(e, QuotaError::ZeroLimit) { raw.limit.span() } else { raw.window.span.clone() };
            self.err(at, format!("invalid limit: {e}"))
        })?;
        let limit = Limit::new(raw.algorithm.0 .0, quota);
        let (cost, cost_span) = match &raw.cost {
            Some(c) => (*c.get_ref(), c.span()),
            None => (LimitConfig::DEFAULT_COST, raw.limit.span()),
        };
        if cost == 0 {
            return Err(self.err(cost_span, "cost must be at least 1, got 0"));
        }
        let name = match &raw.name {
            Some(n) => n.get_ref().clone(),
            None if single => rule.to_owned(),
            None => format!("{rule}-{}", raw.window.text),
        };
        let name_ok = !name.is_empty()
            && !name.contains(['"', '\\'])
            && name.bytes().all(|b| (0x20..=0x7e).contains(&b));
        let name_span = raw.name.as_ref().map_or(span, Spanned::span);
        // The one check the stores make too (`check_charge`): reported where it went wrong.
        let config = LimitConfig::new(name, limit, cost).map_err(|e| {
            let at = match e {
                StoreError::Invalid(InvalidRequest::CostExceedsLimit { .. }) => cost_span,
                _ => raw.limit.span(),
            };
            self.err(at, format!("invalid limit: {e}"))
        })?;
        if !name_ok {
            return Err(self.err(
                name_span,
                format!("invalid policy name {:?}: expected printable ASCII without quotes", config.name),
            ));
        }
        Ok(config)
    }
}

/// The limit of `limits` that admits the fewest requests in one check, and
/// how many: a check of cost `c` charges `c` times each limit's own cost, so
/// no cost above `permits / cost` of any limit is ever admitted.
fn smallest_headroom(limits: &RuleLimits) -> Option<(String, u64)> {
    let all: Vec<&LimitConfig> = match limits {
        RuleLimits::Shared { limits, .. } => limits.iter().collect(),
        RuleLimits::Split { authenticated, anonymous } => authenticated.iter().chain(anonymous).collect(),
        _ => Vec::new(),
    };
    all.into_iter()
        .map(|l| (l.name.clone(), l.limit.quota.permits() / l.cost.max(1)))
        .min_by_key(|(_, most)| *most)
}
