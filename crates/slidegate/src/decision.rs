//! The answer to one request: allowed or not, and what the client should know.

use std::time::Duration;

/// The outcome of asking a limiter for `cost` permits.
///
/// A denial is a value (`allowed == false`), never an error. Denied requests
/// are never charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request may proceed (and was charged).
    pub allowed: bool,
    /// The quota's limit: permits per window.
    pub limit: u64,
    /// How many more single-permit requests would be allowed right now.
    pub remaining: u64,
    /// How long until the limiter is back to its full quota if nothing else arrives.
    pub reset_after: Duration,
    /// For a denial: the wait after which this same request is allowed if
    /// nothing else arrives. `None` when allowed.
    pub retry_after: Option<Duration>,
}
