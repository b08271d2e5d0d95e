//! Where limiter state lives. A store makes each decision atomic; it never
//! formats HTTP.
//!
//! Both stores run the same algorithms ([`crate::algorithm`]) and give the
//! same decisions for the same trace — the conformance suite and the property
//! test in `tests/` hold them to it.

pub mod joint;
pub mod lease;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod table;

pub use self::joint::{JointStore, NoJoint, Part};
pub use self::lease::{GiveBack, Lease, LeaseStore, NoLeases};
pub use self::table::{NoTables, SharedTables, TableEntry, TableName};

use std::future::Future;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::algorithm::sliding_log;
use crate::{Algorithm, Decision, Identity, Limit, Penalty, Quota};

/// Why a store could not decide, sorted by what the caller does about it.
/// A denial is not an error: it is a [`Decision`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A request no store could ever decide: it was refused before any
    /// state was touched, nothing was charged. The caller must change it.
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// The store could not answer: down, unreachable, too late, a reply it
    /// never sends, a clock out of range. Fail-open policies apply;
    /// [`Unavailable::may_have_charged`] says whether the call may still
    /// have been decided.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A shared table refused an entry: nothing was written.
    #[error(transparent)]
    Table(#[from] TableError),
}

/// A request no store could ever decide ([`StoreError::Invalid`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InvalidRequest {
    /// The request asked for more permits than the limit could ever allow.
    #[error("cost {cost} exceeds the limit {limit}: such a request could never be allowed")]
    CostExceedsLimit {
        /// The requested cost.
        cost: u64,
        /// The limit it exceeded.
        limit: u64,
    },
    /// A request without charges.
    #[error("a request needs at least one charge")]
    NoLimits,
    /// The same limit appeared twice in one request.
    #[error("limit {0} appears twice in one request; merge the costs instead")]
    DuplicateLimit(Limit),
    /// The same identity appeared in two parts of one joint request
    /// ([`JointStore::decide_joint`]).
    #[error("identity {0} appears in two parts of one joint request; merge its charges instead")]
    DuplicateIdentity(String),
    /// A sliding log limit above [`crate::algorithm::sliding_log::MAX_LIMIT`].
    #[error("sliding_log limits must be at most {max} (one entry per permit), got {limit}; use sliding_window_counter for larger limits", max = crate::algorithm::sliding_log::MAX_LIMIT)]
    SlidingLogTooLarge {
        /// The rejected limit.
        limit: u64,
    },
    /// A lease asked for under an algorithm that is not leased
    /// ([`lease::leasable`]).
    #[error("{0} limits are not leased (only fixed_window and sliding_window_counter are)")]
    NotLeased(Algorithm),
}

/// Why the store could not answer ([`StoreError::Unavailable`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Unavailable {
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
    /// The store reached the call after its [`Request::deadline`] and
    /// refused it: nothing was decided, nothing charged.
    #[error("the store reached the call after its deadline, and refused it (nothing was charged)")]
    Expired,
    /// Redis answered with something the script never returns.
    #[error("unexpected reply from the store: {0}")]
    UnexpectedReply(String),
    /// The server is older than what the stores need (see
    /// `redis::MIN_SERVER`): refused at
    /// connect, naming what it lacks.
    #[error("{0}")]
    Incompatible(String),
    /// Another store recorded another layout or bucket count under this
    /// store's prefix (`RedisStore::record_layout`): deciding here would
    /// count apart from it.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    LayoutConflict(Box<crate::store::redis::LayoutConflict>),
    /// The clock read a time the algorithms cannot compute with: past
    /// [`MAX_TIME_MS`] (the end of year 9999), where sums of times and
    /// windows would overflow or lose exactness. The host's fault, not the
    /// request's, but no store could decide: fail-open policies apply.
    #[error("time {now_ms} ms since the epoch is out of range: the stores decide at times from 0 to {MAX_TIME_MS} ms (the end of year 9999)")]
    TimeOutOfRange {
        /// The time the clock read, in ms since the Unix epoch.
        now_ms: u64,
    },
}

impl Unavailable {
    /// Whether the call missed a deadline: the store's own, the caller's
    /// carried into the store (refused there, unrun), or a Redis client's
    /// response timeout. Every such miss is a timeout, whoever noticed it.
    pub fn is_timeout(&self) -> bool {
        match self {
            Unavailable::TimedOut(_) | Unavailable::Expired => true,
            #[cfg(feature = "redis")]
            Unavailable::Redis(e) => e.is_timeout(),
            Unavailable::NotConnected(_)
            | Unavailable::UnexpectedReply(_)
            | Unavailable::TimeOutOfRange { .. }
            | Unavailable::Incompatible(_) => false,
            #[cfg(feature = "redis")]
            Unavailable::LayoutConflict(_) => false,
        }
    }

    /// Whether the failed call may still have been decided, and charged, by
    /// the store: `false` only when it provably never reached it (no
    /// connection, refused past its deadline, a clock no store computes
    /// with, a server refused at connect). A timeout or a connection lost mid-call cannot tell whether
    /// the script ran.
    pub fn may_have_charged(&self) -> bool {
        match self {
            Unavailable::NotConnected(_)
            | Unavailable::Expired
            | Unavailable::TimeOutOfRange { .. }
            | Unavailable::Incompatible(_) => false,
            #[cfg(feature = "redis")]
            Unavailable::LayoutConflict(_) => false,
            #[cfg(feature = "redis")]
            Unavailable::Redis(e) => !e.is_connection_refusal(),
            Unavailable::UnexpectedReply(_) | Unavailable::TimedOut(_) => true,
        }
    }
}

/// Why a shared table refused an entry ([`StoreError::Table`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TableError {
    /// A shared table's name, field, value or TTL out of its bounds
    /// (see [`table`]); nothing was written.
    #[error("shared table: {0}")]
    InvalidEntry(String),
    /// A shared table holds the most live entries it may
    /// ([`table::MAX_TABLE_ENTRIES`]): a new field is refused, and so is a
    /// read of a table holding more.
    #[error("shared table {table:?} is full: it may hold at most {max} live entries; delete some or let them expire")]
    Full {
        /// The table.
        table: String,
        /// The bound.
        max: usize,
    },
}

#[cfg(feature = "redis")]
impl From<::redis::RedisError> for StoreError {
    fn from(e: ::redis::RedisError) -> Self {
        StoreError::Unavailable(Unavailable::Redis(e))
    }
}

impl StoreError {
    /// Whether the store itself failed (unreachable, timed out, broken reply),
    /// as opposed to a request that was invalid. Fail-open policies apply to these.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// Whether the call missed a deadline ([`Unavailable::is_timeout`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Unavailable(e) if e.is_timeout())
    }

    /// Whether the failed call may still have been decided, and charged, by
    /// the store ([`Unavailable::may_have_charged`]); never for an invalid
    /// request or a table's refusal, which no store ran.
    pub fn may_have_charged(&self) -> bool {
        matches!(self, StoreError::Unavailable(e) if e.may_have_charged())
    }
}

/// One identity's charges, one decision per charge: `cost` permits under `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Charge {
    /// The algorithm and quota that decide.
    pub limit: Limit,
    /// How many permits the request takes (0 peeks without charging).
    pub cost: u64,
}

impl Charge {
    /// `cost` permits under `limit`.
    pub fn new(limit: Limit, cost: u64) -> Self {
        Self { limit, cost }
    }
}

/// Everything a store is asked in one call: for whom, which charges, and the
/// penalty box that applies, if any.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Who is charged.
    pub identity: &'a Identity,
    /// Decided all-or-nothing: each is charged only if every one allows.
    pub charges: &'a [Charge],
    /// When set, an identity the penalty has blocked is answered without
    /// deciding its limits, and a denial counts toward the next block,
    /// atomically with the decision.
    pub penalty: Option<&'a Penalty>,
    /// When the caller stops waiting for the answer. A store that can
    /// carries it along and refuses to decide after it
    /// ([`Unavailable::Expired`]), so that a call the caller counted as failed
    /// charges nothing; the Redis store does (see its docs for the bound).
    /// `None`: the store's own deadline only.
    pub deadline: Option<Instant>,
}

impl<'a> Request<'a> {
    /// `charges` for `identity`, without a penalty.
    pub fn new(identity: &'a Identity, charges: &'a [Charge]) -> Self {
        Self { identity, charges, penalty: None, deadline: None }
    }

    /// The same request under `penalty`.
    pub fn with_penalty(self, penalty: &'a Penalty) -> Self {
        Self { penalty: Some(penalty), ..self }
    }

    /// The same request, given up at `deadline` (or at the one it already
    /// had, if earlier).
    pub fn with_deadline(self, deadline: Instant) -> Self {
        let deadline = self.deadline.map_or(deadline, |d| d.min(deadline));
        Self { deadline: Some(deadline), ..self }
    }
}

/// One decision per charge of a request, in the order asked. Derefs to a
/// slice; a single charge's decision is kept inline, so the common request
/// (one limit) allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decisions(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    One(Decision),
    Many(Vec<Decision>),
}

impl Decisions {
    /// No decisions (an identity blocked before its limits were decided).
    pub fn none() -> Self {
        Self(Repr::Many(Vec::new()))
    }

    /// The decision of a request with one charge.
    pub fn one(decision: Decision) -> Self {
        Self(Repr::One(decision))
    }
}

impl std::ops::Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        match &self.0 {
            Repr::One(d) => std::slice::from_ref(d),
            Repr::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Decisions {
    fn deref_mut(&mut self) -> &mut [Decision] {
        match &mut self.0 {
            Repr::One(d) => std::slice::from_mut(d),
            Repr::Many(v) => v,
        }
    }
}

impl From<Vec<Decision>> for Decisions {
    fn from(v: Vec<Decision>) -> Self {
        match <[Decision; 1]>::try_from(v) {
            Ok([one]) => Self::one(one),
            Err(v) => Self(Repr::Many(v)),
        }
    }
}

impl From<Decision> for Decisions {
    fn from(d: Decision) -> Self {
        Self::one(d)
    }
}

impl FromIterator<Decision> for Decisions {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        Vec::from_iter(iter).into()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq<Vec<Decision>> for Decisions {
    fn eq(&self, other: &Vec<Decision>) -> bool {
        **self == **other
    }
}

/// A store's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// One decision per charge, in the order asked; empty when the identity
    /// was already blocked (the limits were not decided). When any is denied,
    /// none was charged and every decision's `remaining` describes the state
    /// without this request.
    pub decisions: Decisions,
    /// How long the identity stays blocked by the request's penalty: it was
    /// already, or this denial blocked it. `None` when it is not blocked.
    pub blocked_for: Option<Duration>,
    /// Who answered: the store, or a layer in front of it.
    pub origin: Origin,
}

/// Which part of a composed store answered a request. A store answers
/// [`Origin::Store`]; layers wrapping one (a cache of its denials, a stand-in
/// while it is unavailable) say when they answered instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Origin {
    /// The store itself decided.
    #[default]
    Store,
    /// A local cache of the store's earlier answers: exactly what the store
    /// would have said (see the layer's proof).
    Cache,
    /// A stand-in that decided because the store could not.
    Fallback,
    /// A permit of a lease ([`LeaseStore`]): charged in the store before it
    /// was handed out, and used where the store counts it.
    Lease,
}

impl Outcome {
    /// Decisions without a block.
    pub fn decided(decisions: impl Into<Decisions>) -> Self {
        Self { decisions: decisions.into(), blocked_for: None, origin: Origin::Store }
    }

    /// The answer for an identity blocked for `ms` more milliseconds.
    pub fn blocked(decisions: impl Into<Decisions>, ms: u64) -> Self {
        Self {
            decisions: decisions.into(),
            blocked_for: Some(Duration::from_millis(ms)),
            origin: Origin::Store,
        }
    }

    /// The same outcome, answered by `origin`.
    pub fn from_origin(self, origin: Origin) -> Self {
        Self { origin, ..self }
    }

    /// Whether the request may proceed: every charge allowed, no block.
    pub fn allowed(&self) -> bool {
        self.blocked_for.is_none() && !self.decisions.is_empty() && self.decisions.iter().all(|d| d.allowed)
    }
}

/// A place that decides rate limits atomically: one request, one outcome.
///
/// A store keeps one state per [`Identity`] and [`Limit`]; the same identity
/// under two limits has two independent states. What not every store can do
/// is a separate trait the caller asks for ([`Store::distinct`],
/// [`Store::tables`], [`Store::leases`]), so a
/// missing ability is visible where a feature is configured, never a feature
/// silently off. The trait has no provided methods: a store (or a layer
/// wrapping one) states every behaviour it has.
///
/// # Failures and charging
///
/// A decision that fails with [`Unavailable::NotConnected`] (or any error for
/// which [`StoreError::may_have_charged`] is `false`) never reached the store:
/// nothing was charged. A decision that fails after it was sent — a timeout,
/// a connection lost while waiting for the reply — may have run in the store
/// and charged its cost even though the caller saw an error — unless the
/// store honours the request's [`Request::deadline`], as the Redis store
/// does: a call it reaches after the deadline is refused unrun. Without
/// that, across an outage an identity is charged at most the cost of its own
/// calls that failed that way, on top of the calls it saw decided; never
/// more, and never twice for one call (a retry after `NOSCRIPT` re-sends only
/// a call that provably did not run).
pub trait Store: Send + Sync {
    /// Decides `request`: all its charges or none, under its penalty if set.
    ///
    /// Rejects, before touching any state, what [`check_charge`] rejects, an
    /// empty list of charges and a limit given twice.
    fn decide(&self, request: Request<'_>) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Decides `request` as [`Store::decide`] would, now, when this store
    /// answers without waiting (one in the process, such as
    /// [`MemoryStore`](memory::MemoryStore)); `None` when it would wait (a
    /// remote store), having done nothing: the caller then calls
    /// [`Store::decide`]. A caller that tries this first builds no future
    /// for a store that needs none; a layer answers for the stack below it.
    fn decide_now(&self, request: Request<'_>) -> Option<Result<Outcome, StoreError>>;

    /// The store's distinct-value sketches (crawl breadth), or `None` when it
    /// keeps none. A limiter asked to enforce breadth on a store answering
    /// `None` refuses the configuration.
    fn distinct(&self) -> Option<impl DistinctStore + '_>;

    /// The store's shared tables ([`SharedTables`]: small tables every
    /// instance on the store sees, entries expiring by themselves), or
    /// `None` when it keeps none. A feature that needs them refuses to be
    /// configured on a store answering `None`.
    fn tables(&self) -> Option<impl SharedTables + '_>;

    /// The store's quota leases ([`LeaseStore`]: permits charged ahead in
    /// one call, unused ones given back), or `None` when it grants none. A
    /// limiter configured to lease on a store answering `None` decides every
    /// request in the store, as without leases.
    fn leases(&self) -> Option<impl LeaseStore + '_>;

    /// The store's joint decisions ([`JointStore`]: several identities'
    /// charges all or nothing in one call), or `None` when it makes none.
    /// A configuration that needs them refuses to load on a store answering
    /// `None`; nothing decides them one identity at a time instead.
    fn joint(&self) -> Option<impl JointStore + '_>;

    /// Lifts `identity`'s penalty box: forgets its penalty state (a block,
    /// the denials counting toward the next, the strikes doubling it), so
    /// that its next request is decided by its limits again. Answers how
    /// long the block had left, or `None` when it was not blocked. Every
    /// store that decides under a penalty can lift one; a layer that keeps
    /// its own copy of a block forgets it too.
    fn lift_penalty(
        &self,
        identity: &Identity,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send;

    /// Whether the store can have outages: fail as unavailable for a while
    /// ([`StoreError::is_unavailable`]: a server down, a connection lost, a
    /// call past its deadline) and then answer again. A layer that prepares
    /// for an outage — a fallback remembering each answer to start from it —
    /// does that work only when this is `true`.
    ///
    /// `false` for a store in the process, such as [`MemoryStore`](memory::MemoryStore):
    /// its only unavailable answer is [`Unavailable::TimeOutOfRange`], a host
    /// clock past [`MAX_TIME_MS`], which is no outage that an earlier answer
    /// helps to bridge. A layer answers for the stack below it.
    fn has_outages(&self) -> bool;
}

/// Writes the named [`Store`] methods of a layer as plain forwards to the
/// store it wraps: `self` followed by the tokens in parentheses (`(.inner)`,
/// `(.as_ref())`). Only the methods named are written, so a method added to
/// `Store` is still a compile error in every layer until it says what it
/// does with it; a forward that needs a reason says it in a comment where it
/// is named.
macro_rules! forward {
    (($($to:tt)*) $method:ident $(, $rest:ident)*) => {
        $crate::store::forward!(@ ($($to)*) $method);
        $crate::store::forward!(($($to)*) $($rest),*);
    };
    (($($to:tt)*)) => {};
    (@ ($($to:tt)*) decide) => {
        fn decide(
            &self,
            request: $crate::Request<'_>,
        ) -> impl ::std::future::Future<Output = Result<$crate::Outcome, $crate::StoreError>> + Send {
            self $($to)* .decide(request)
        }
    };
    (@ ($($to:tt)*) decide_now) => {
        fn decide_now(&self, request: $crate::Request<'_>) -> Option<Result<$crate::Outcome, $crate::StoreError>> {
            self $($to)* .decide_now(request)
        }
    };
    (@ ($($to:tt)*) distinct) => {
        fn distinct(&self) -> Option<impl $crate::DistinctStore + '_> {
            self $($to)* .distinct()
        }
    };
    (@ ($($to:tt)*) tables) => {
        fn tables(&self) -> Option<impl $crate::SharedTables + '_> {
            self $($to)* .tables()
        }
    };
    (@ ($($to:tt)*) leases) => {
        fn leases(&self) -> Option<impl $crate::LeaseStore + '_> {
            self $($to)* .leases()
        }
    };
    (@ ($($to:tt)*) joint) => {
        fn joint(&self) -> Option<impl $crate::JointStore + '_> {
            self $($to)* .joint()
        }
    };
    (@ ($($to:tt)*) lift_penalty) => {
        fn lift_penalty(
            &self,
            identity: &$crate::Identity,
            deadline: Option<::std::time::Instant>,
        ) -> impl ::std::future::Future<Output = Result<Option<::std::time::Duration>, $crate::StoreError>> + Send {
            self $($to)* .lift_penalty(identity, deadline)
        }
    };
    (@ ($($to:tt)*) has_outages) => {
        fn has_outages(&self) -> bool {
            self $($to)* .has_outages()
        }
    };
}
pub(crate) use forward;

/// A store shared behind an `Arc` is the store: several limiters (or
/// instances in a simulation) deciding on one state, as on one Redis.
impl<S: Store> Store for std::sync::Arc<S> {
    forward!((.as_ref()) decide, decide_now, distinct, tables, leases, joint, lift_penalty, has_outages);
}

/// The ability to count distinct values per identity (crawl breadth): a
/// capability some stores have, asked for through [`Store::distinct`].
pub trait DistinctStore: Send + Sync {
    /// Admits `value` among the distinct values `identity` touches per window
    /// of `quota` (at most `quota.permits()` of them, estimated with the
    /// HyperLogLog of [`crate::distinct`]; windows aligned to multiples of
    /// the window since the epoch). A value already seen in the window is
    /// always admitted; a new one while the estimate is below the permits.
    /// Only an admitted value is added: a denial writes nothing.
    ///
    /// The `Decision`'s `remaining` is the permits minus the estimate,
    /// `reset_after` the end of the window.
    fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;
}

/// The [`DistinctStore`] of a store that has none: it cannot be made, so a
/// store returns `None::<NoDistinct>` from [`Store::distinct`].
#[derive(Debug)]
pub enum NoDistinct {}

impl<D: DistinctStore> DistinctStore for &D {
    fn decide_distinct(
        &self,
        identity: &Identity,
        quota: &Quota,
        value: &[u8],
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).decide_distinct(identity, quota, value)
    }
}

impl DistinctStore for NoDistinct {
    async fn decide_distinct(&self, _: &Identity, _: &Quota, _: &[u8]) -> Result<Decision, StoreError> {
        match *self {}
    }
}

/// The latest time the stores decide at: 9999-12-31T23:59:59.999Z, in ms
/// since the Unix epoch.
///
/// Every time an algorithm forms stays below 2^48 with it (now plus the
/// longest window, [`crate::MAX_WINDOW`]), so the Lua scripts pack times in
/// 48 bits and compute exactly in doubles, and no sum overflows a `u64`. A
/// clock past it (a broken RTC, a hostile or buggy client clock) is refused
/// with [`Unavailable::TimeOutOfRange`] before any arithmetic.
pub const MAX_TIME_MS: u64 = 253_402_300_799_999;

/// `now_ms`, when the stores can decide at that time.
pub(crate) fn check_time(now_ms: u64) -> Result<u64, StoreError> {
    if now_ms > MAX_TIME_MS {
        return Err(StoreError::Unavailable(Unavailable::TimeOutOfRange { now_ms }));
    }
    Ok(now_ms)
}

/// Rejects requests no store could decide, before touching any state.
pub(crate) fn validate(charges: &[Charge]) -> Result<(), StoreError> {
    if charges.is_empty() {
        return Err(StoreError::Invalid(InvalidRequest::NoLimits));
    }
    for (i, charge) in charges.iter().enumerate() {
        if charges[..i].iter().any(|seen| seen.limit == charge.limit) {
            return Err(StoreError::Invalid(InvalidRequest::DuplicateLimit(charge.limit)));
        }
        check_charge(&charge.limit, charge.cost)?;
    }
    Ok(())
}

/// Whether a store could ever decide `cost` permits under `limit`: the one
/// check of a charge, used by both stores and by every layer above them that
/// wants to reject a charge before it reaches a store (a config file, an API).
///
/// ```
/// use slidegate::{check_charge, Algorithm, InvalidRequest, Limit, Quota, StoreError};
///
/// let limit = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(10)?);
/// assert!(check_charge(&limit, 10).is_ok());
/// assert!(matches!(check_charge(&limit, 11), Err(StoreError::Invalid(InvalidRequest::CostExceedsLimit { cost: 11, limit: 10 }))));
/// # Ok::<(), slidegate::QuotaError>(())
/// ```
pub fn check_charge(limit: &Limit, cost: u64) -> Result<(), StoreError> {
    if limit.algorithm == Algorithm::SlidingLog && limit.quota.permits() > sliding_log::MAX_LIMIT {
        return Err(StoreError::Invalid(InvalidRequest::SlidingLogTooLarge { limit: limit.quota.permits() }));
    }
    if cost > limit.quota.permits() {
        return Err(StoreError::Invalid(InvalidRequest::CostExceedsLimit {
            cost,
            limit: limit.quota.permits(),
        }));
    }
    Ok(())
}
