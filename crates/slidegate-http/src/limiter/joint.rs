//! Several keys decided all or nothing in one store call
//! ([`RateLimiter::check_keys_joint`]): the store's joint decisions
//! (`slidegate::JointStore`) through the same layers, failure policy and
//! metrics as one key's.

use slidegate::{Charge, Identity, JointStore, Outcome, Part, Store, StoreError};

use super::decide::{check_policy, KeyPlace};
use super::rule::{Mode, PolicySet};
use super::{CheckError, RateLimiter};
use crate::config::OnError;
use crate::verdict::Verdict;

/// One key of [`RateLimiter::check_keys_joint`]: `cost` times each limit's
/// cost under the rule named `rule`, for the opaque key `key`, as
/// [`RateLimiter::check_key`] decides one (authenticated limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyCheck<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The opaque key, hashed like an API key.
    pub key: &'a str,
    /// How many times each limit's cost is charged.
    pub cost: u64,
}

/// One identity of a joint call: its rule, set and charges, and the checks
/// it answers (a key named twice under one rule is one identity, its costs
/// added).
struct Member<'s> {
    index: usize,
    identity: Identity,
    set: &'s PolicySet,
    cost: u64,
}

impl<S: Store + 'static> RateLimiter<S> {
    /// Decides every check all or nothing, in one store call: each is
    /// charged only if every limit of every check allows; otherwise none is,
    /// and each verdict says what its limits have left without this request.
    /// A key the allow list names is allowed uncharged and takes no part; a
    /// key the deny list names denies the whole call (the others are only
    /// peeked). One verdict per check, in order; a key given twice under one
    /// rule is one identity charged the sum of its costs, and both checks
    /// get its verdict.
    ///
    /// # Errors
    /// As [`RateLimiter::check_key`] for any check (nothing is charged);
    /// [`CheckError::NotJoint`] when the store makes no joint decisions (a
    /// Redis Cluster) or a rule has a penalty box (which no joint call
    /// applies).
    pub async fn check_keys_joint(&self, checks: &[KeyCheck<'_>]) -> Result<Vec<Verdict<'_>>, CheckError> {
        let mut members: Vec<Member<'_>> = Vec::with_capacity(checks.len());
        // Per check: its member, or its listed verdict.
        let mut answers: Vec<Result<usize, Verdict<'_>>> = Vec::with_capacity(checks.len());
        let mut listed_denial = false;
        for check in checks {
            let (index, identity, set) = match self.place_key(check.rule, check.key, check.cost, false)? {
                KeyPlace::Listed(listed) => {
                    listed_denial |= !listed.allowed();
                    answers.push(Err(*listed));
                    continue;
                }
                KeyPlace::Rule { index, identity, set } => (index, identity, set),
            };
            let rule = &self.inner.rules[index];
            if rule.penalty.is_some() {
                return Err(CheckError::NotJoint(format!(
                    "rule {:?} has a penalty box, which a joint decision does not apply",
                    rule.name
                )));
            }
            let at = match members.iter().position(|m| m.identity == identity) {
                Some(at) => {
                    members[at].cost = members[at].cost.saturating_add(check.cost);
                    at
                }
                None => {
                    members.push(Member { index, identity, set, cost: check.cost });
                    members.len() - 1
                }
            };
            answers.push(Ok(at));
        }
        let mut charges: Vec<Vec<Charge>> = Vec::with_capacity(members.len());
        for member in &members {
            let cost = if listed_denial { 0 } else { member.cost };
            for (name, charge) in member.set.names.iter().zip(&member.set.charges) {
                check_policy(&charge.limit, charge.cost.saturating_mul(cost), name)?;
            }
            charges.push(member.set.scaled(cost));
        }
        let outcomes = self.ask_joint(&members, &charges).await?;
        let mut verdicts = Vec::with_capacity(checks.len());
        let mut counted = vec![false; members.len()];
        for answer in answers {
            let at = match answer {
                Ok(at) => at,
                Err(listed) => {
                    verdicts.push(listed);
                    continue;
                }
            };
            let member = &members[at];
            let answer = match &outcomes {
                Ok(outcomes) => Ok(outcomes[at].clone()),
                Err(err) => Err(err),
            };
            let verdict =
                self.verdict(member.index, &member.identity, member.set, &charges[at], answer, Mode::Charge);
            // A peek (the call refused whole before it) counts for nobody.
            let peeked = listed_denial || member.cost == 0;
            if !peeked && !std::mem::replace(&mut counted[at], true) {
                self.count(member.index, &member.identity, &verdict, Mode::Charge);
            }
            verdicts.push(verdict);
        }
        Ok(verdicts)
    }

    /// The members' charges in one joint call: through the fallback when
    /// every rule's failure policy is the fallback limiter, past it
    /// otherwise (as one rule's request goes). `Ok(Err)` is the store's
    /// failure, for each rule's policy to answer; none asked when there is
    /// nobody to charge.
    async fn ask_joint(
        &self,
        members: &[Member<'_>],
        charges: &[Vec<Charge>],
    ) -> Result<Result<Vec<Outcome>, StoreError>, CheckError> {
        if members.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        let parts: Vec<Part<'_>> =
            members.iter().zip(charges).map(|(m, c)| Part { identity: &m.identity, charges: c }).collect();
        let not_joint =
            || CheckError::NotJoint("the store makes no joint decisions (a Redis Cluster)".into());
        let fallback = members.iter().all(|m| self.inner.rules[m.index].on_error == OnError::Fallback);
        Ok(if fallback {
            self.inner.store.joint().ok_or_else(not_joint)?.decide_joint(&parts, None).await
        } else {
            self.inner
                .store
                .without_fallback()
                .joint()
                .ok_or_else(not_joint)?
                .decide_joint(&parts, None)
                .await
        })
    }

    /// The number of the rule named `rule`.
    pub(super) fn rule_index(&self, rule: &str) -> Result<usize, CheckError> {
        self.inner
            .rules
            .iter()
            .position(|r| r.name == rule)
            .ok_or_else(|| CheckError::UnknownRule(rule.to_owned()))
    }
}
