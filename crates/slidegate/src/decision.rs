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

/// Microseconds to a duration rounded up to whole milliseconds.
///
/// Stores count time in milliseconds; rounding waits up keeps `retry_after`
/// honest: waiting exactly that long is always enough.
pub(crate) fn ceil_ms(us: u64) -> Duration {
    Duration::from_millis(us.div_ceil(1000))
}
