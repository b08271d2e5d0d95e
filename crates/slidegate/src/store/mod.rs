//! Where limiter state lives. A store makes each decision atomic; it never
//! formats HTTP.
//!
//! Both stores run the same algorithms ([`crate::algorithm`]) and give the
//! same decisions for the same trace — the conformance suite and the property
//! test in `tests/` hold them to it.

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;

use thiserror::Error;

use crate::algorithm::sliding_log;
use crate::{Algorithm, Decision, Limit, Penalized, Penalty, Quota};

/// Why a store could not decide. A denial is not an error: it is a [`Decision`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The request asked for more permits than the limit could ever allow.
    #[error("cost {cost} exceeds the limit {limit}: such a request could never be allowed")]
    CostExceedsLimit {
        /// The requested cost.
        cost: u64,
        /// The limit it exceeded.
        limit: u64,
    },
    /// The identity key was empty.
    #[error("identity key must not be empty")]
    EmptyKey,
    /// No limits were given to `decide_all`.
    #[error("decide_all needs at least one limit")]
    NoLimits,
    /// The same limit appeared twice in one `decide_all`.
    #[error("limit {0} appears twice in one decide_all; merge the costs instead")]
    DuplicateLimit(Limit),
    /// A sliding log limit above [`crate::algorithm::sliding_log::MAX_LIMIT`].
    #[error("sliding_log limits must be at most {max} (one entry per permit), got {limit}; use sliding_window_counter for larger limits", max = crate::algorithm::sliding_log::MAX_LIMIT)]
    SlidingLogTooLarge {
        /// The rejected limit.
        limit: u64,
    },
    /// Redis failed or could not be reached.
    #[cfg(feature = "redis")]
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The store has no connection (not yet, or not since it was lost; it
    /// connects in the background). The decision was never sent, so nothing
    /// was charged.
    #[error("not connected to the store yet: {0}")]
    NotConnected(String),
    /// The store did not answer within its deadline. The decision may or may
    /// not have been made (and charged): see [`Store`] on failures.
    #[error("the store did not answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// Redis answered with something the script never returns.
    #[error("unexpected reply from the store: {0}")]
    UnexpectedReply(String),
    /// The clock read a time the algorithms cannot compute with: past
    /// [`MAX_TIME_MS`] (the end of year 9999), where sums of times and
    /// windows would overflow or lose exactness.
    #[error("time {now_ms} ms since the epoch is out of range: the stores decide at times from 0 to {MAX_TIME_MS} ms (the end of year 9999)")]
    TimeOutOfRange {
        /// The time the clock read, in ms since the Unix epoch.
        now_ms: u64,
    },
    /// The store cannot do what was asked (a store that keeps no
    /// distinct-value sketches, say). Nothing was charged.
    #[error("the store does not support {0}")]
    Unsupported(&'static str),
}

impl StoreError {
    /// Whether the store itself failed (unreachable, timed out, broken reply),
    /// as opposed to a request that was invalid. Fail-open policies apply to these.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::CostExceedsLimit { .. }
            | StoreError::EmptyKey
            | StoreError::NoLimits
            | StoreError::DuplicateLimit(_)
            | StoreError::SlidingLogTooLarge { .. }
            | StoreError::Unsupported(_) => false,
            #[cfg(feature = "redis")]
            StoreError::Redis(_) => true,
            StoreError::NotConnected(_) | StoreError::UnexpectedReply(_) | StoreError::TimedOut(_) => true,
            // A clock this far off is the host's fault, not the request's,
            // but no store could decide: fail-open policies apply.
            StoreError::TimeOutOfRange { .. } => true,
        }
    }

    /// Whether the failed call may still have been decided, and charged, by
    /// the store: `false` only when it provably never reached it (an invalid
    /// request, or no connection). A timeout or a connection lost mid-call
    /// cannot tell whether the script ran.
    pub fn may_have_charged(&self) -> bool {
        match self {
            StoreError::CostExceedsLimit { .. }
            | StoreError::EmptyKey
            | StoreError::NoLimits
            | StoreError::DuplicateLimit(_)
            | StoreError::SlidingLogTooLarge { .. }
            | StoreError::NotConnected(_)
            | StoreError::Unsupported(_)
            | StoreError::TimeOutOfRange { .. } => false,
            #[cfg(feature = "redis")]
            StoreError::Redis(e) => !e.is_connection_refusal(),
            StoreError::UnexpectedReply(_) | StoreError::TimedOut(_) => true,
        }
    }
}

/// A place that decides rate limits atomically.
///
/// `key` names the identity (an API key, a hashed IP, …). A store keeps one
/// state per identity and [`Limit`]; the same identity under two limits has
/// two independent states.
///
/// # Failures and charging
///
/// A decision that fails with [`StoreError::NotConnected`] (or any error for
/// which [`StoreError::may_have_charged`] is `false`) never reached the store:
/// nothing was charged. A decision that fails after it was sent — a timeout,
/// a connection lost while waiting for the reply — may have run in the store
/// and charged its cost even though the caller saw an error. So across an
/// outage an identity is charged at most the cost of its own calls that
/// failed that way, on top of the calls it saw decided; never more, and never
/// twice for one call (a retry after `NOSCRIPT` re-sends only a call that
/// provably did not run).
pub trait Store: Send + Sync {
    /// Decides `cost` permits for `key` under `limit`, charging them when allowed.
    fn decide(
        &self,
        key: &str,
        limit: &Limit,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides several limits for `key` all-or-nothing: each `(limit, cost)`
    /// is charged only if every one of them allows. The decisions come back in
    /// the order given; when any is denied, none is charged and every
    /// decision's `remaining` describes the state without this request.
    fn decide_all(
        &self,
        key: &str,
        charges: &[(Limit, u64)],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Admits `value` among the distinct values `key` touches per window of
    /// `quota` (at most `quota.permits()` of them, estimated with the
    /// HyperLogLog of [`crate::distinct`]; windows aligned to multiples of
    /// the window since the epoch). A value already seen in the window is
    /// always admitted; a new one while the estimate is below the permits.
    /// Only an admitted value is added: a denial writes nothing.
    ///
    /// The `Decision`'s `remaining` is the permits minus the estimate,
    /// `reset_after` the end of the window.
    ///
    /// The default answers [`StoreError::Unsupported`]: a store without
    /// sketches.
    fn decide_distinct(
        &self,
        key: &str,
        quota: &Quota,
        value: &[u8],
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let _ = (key, quota, value);
        std::future::ready(Err(StoreError::Unsupported("distinct-value limits")))
    }

    /// [`Store::decide_all`] under a [`Penalty`]: an identity the penalty
    /// has blocked is answered without deciding its limits, and a denial is
    /// counted toward the next block, atomically with the decision.
    ///
    /// The default decides without a penalty (never blocks): a store that
    /// keeps no penalty state stays usable, and the limits still hold.
    fn decide_all_penalized(
        &self,
        key: &str,
        charges: &[(Limit, u64)],
        penalty: &Penalty,
    ) -> impl Future<Output = Result<Penalized, StoreError>> + Send {
        let _ = penalty;
        let decided = self.decide_all(key, charges);
        async move { decided.await.map(Penalized::decided) }
    }
}

/// The latest time the stores decide at: 9999-12-31T23:59:59.999Z, in ms
/// since the Unix epoch.
///
/// Every time an algorithm forms stays below 2^48 with it (now plus the
/// longest window, [`crate::MAX_WINDOW`]), so the Lua scripts pack times in
/// 48 bits and compute exactly in doubles, and no sum overflows a `u64`. A
/// clock past it (a broken RTC, a hostile or buggy client clock) is refused
/// with [`StoreError::TimeOutOfRange`] before any arithmetic.
pub const MAX_TIME_MS: u64 = 253_402_300_799_999;

/// `now_ms`, when the stores can decide at that time.
pub(crate) fn check_time(now_ms: u64) -> Result<u64, StoreError> {
    if now_ms > MAX_TIME_MS {
        return Err(StoreError::TimeOutOfRange { now_ms });
    }
    Ok(now_ms)
}

/// Rejects requests no store could decide, before touching any state.
pub(crate) fn validate(key: &str, charges: &[(Limit, u64)]) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    if charges.is_empty() {
        return Err(StoreError::NoLimits);
    }
    for (i, (limit, cost)) in charges.iter().enumerate() {
        if charges[..i].iter().any(|(seen, _)| seen == limit) {
            return Err(StoreError::DuplicateLimit(*limit));
        }
        check_charge(limit, *cost)?;
    }
    Ok(())
}

/// Whether a store could ever decide `cost` permits under `limit`: the one
/// check of a charge, used by both stores and by every layer above them that
/// wants to reject a charge before it reaches a store (a config file, an API).
///
/// ```
/// use slidegate::{check_charge, Algorithm, Limit, Quota, StoreError};
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(10)?);
/// assert!(check_charge(&limit, 10).is_ok());
/// assert!(matches!(check_charge(&limit, 11), Err(StoreError::CostExceedsLimit { cost: 11, limit: 10 })));
/// # Ok::<(), slidegate::QuotaError>(())
/// ```
pub fn check_charge(limit: &Limit, cost: u64) -> Result<(), StoreError> {
    if limit.algorithm == Algorithm::SlidingLog && limit.quota.permits() > sliding_log::MAX_LIMIT {
        return Err(StoreError::SlidingLogTooLarge { limit: limit.quota.permits() });
    }
    if cost > limit.quota.permits() {
        return Err(StoreError::CostExceedsLimit { cost, limit: limit.quota.permits() });
    }
    Ok(())
}
