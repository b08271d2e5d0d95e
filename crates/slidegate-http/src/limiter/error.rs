//! Why a limiter cannot be built, and why `/v1/check` cannot decide.

use slidegate::StoreError;

/// Why a limiter cannot be built on a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// A rule limits crawl breadth, and the store keeps no distinct-value
    /// sketches ([`Store::distinct`](slidegate::Store::distinct) answers `None`).
    #[error("rule {rule:?} limits crawl breadth (`breadth`), which this store cannot count: it keeps no distinct-value sketches")]
    BreadthUnsupported {
        /// The rule's name.
        rule: String,
    },
    /// A reconfigured rule falls back to the embedded limiter when the store
    /// fails (`on_error = "fallback"`, the default), and the running limiter
    /// was built without one (every rule of its configuration opted out).
    #[error("rule {rule:?} needs the fallback limiter (on_error = \"fallback\"), which the running limiter was started without (every rule opted out): restart to add it, or set its on_error")]
    FallbackOff {
        /// The rule's name.
        rule: String,
    },
}

/// Why `/v1/check` could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No rule has that name.
    #[error("unknown rule {0:?}")]
    UnknownRule(String),
    /// The key was empty.
    #[error("key must not be empty")]
    EmptyKey,
    /// The cost exceeds a limit of the rule: no such request could ever pass.
    #[error(
        "cost {cost} exceeds the limit {limit} of policy {policy:?}: such a request could never be allowed"
    )]
    CostExceedsLimit {
        /// The requested cost, times the limit's own cost.
        cost: u64,
        /// The limit.
        limit: u64,
        /// The policy's name.
        policy: String,
    },
    /// A limit of the rule can never be decided (a sliding log too large to
    /// keep); only a rule built in code, not a validated configuration, has one.
    #[error("policy {policy:?}: {source}")]
    InvalidLimit {
        /// The policy's name.
        policy: String,
        /// What the store would say.
        source: StoreError,
    },
    /// The cost is above the rule's `max_cost`: one call may not charge that much.
    #[error("cost {cost} is above the rule's max_cost {max_cost}: one check may charge at most {max_cost}")]
    CostAboveMax {
        /// The requested cost.
        cost: u64,
        /// The rule's bound.
        max_cost: u64,
    },
    /// A joint check the store or a rule cannot make
    /// ([`RateLimiter::check_keys_joint`](super::RateLimiter::check_keys_joint)).
    #[error("no joint decision: {0}")]
    NotJoint(String),
}
