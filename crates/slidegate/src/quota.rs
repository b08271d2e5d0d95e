//! What a limit allows: `limit` permits per `window`, validated once when built.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// The largest integer every store computes exactly.
///
/// Redis runs its scripts in Lua 5.1, whose numbers are IEEE doubles: integers
/// are exact up to 2^53. Every product an algorithm forms is bounded by
/// `limit × window_ms`, so keeping that product under this bound makes the Lua
/// scripts decide exactly like the Rust code, boundary cases included.
pub const MAX_EXACT: u64 = 1 << 53;

/// The largest limit a quota may have: 2^50.
///
/// Below [`MAX_EXACT`] with room to spare, so that sums the scripts form on
/// top of a product near the limit (a count plus a cost, a time plus a
/// horizon) stay exact in Lua's doubles too.
pub const MAX_LIMIT: u64 = 1 << 50;

/// The longest window a quota may have: ten years.
///
/// GCRA keeps its state in microseconds; this bound keeps `now + window` in
/// microseconds under [`MAX_EXACT`] for centuries to come.
pub const MAX_WINDOW: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// Why a [`Quota`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was zero: a quota must admit at least one permit.
    #[error("limit must be at least 1, got 0")]
    ZeroLimit,
    /// The limit was above [`MAX_LIMIT`].
    #[error("limit must be at most 2^50 ({MAX_LIMIT}), got {0}")]
    LimitTooLarge(u64),
    /// The window was shorter than one millisecond.
    #[error("window must be at least 1 ms, got {0:?}")]
    WindowTooShort(Duration),
    /// The window had a part finer than a millisecond.
    #[error("window must be a whole number of milliseconds, got {0:?}")]
    WindowNotWholeMillis(Duration),
    /// The window was longer than [`MAX_WINDOW`].
    #[error("window must be at most {max_days} days, got {window:?}", max_days = MAX_WINDOW.as_secs() / 86_400)]
    WindowTooLong {
        /// The rejected window.
        window: Duration,
    },
    /// `limit × window_ms` exceeded [`MAX_EXACT`], so decisions could not be exact.
    #[error("limit × window in ms must be at most 2^53 ({MAX_EXACT}), got {limit} × {window_ms} ms")]
    TooLarge {
        /// The rejected limit.
        limit: u64,
        /// The window in milliseconds.
        window_ms: u64,
    },
}

/// `limit` permits per `window`.
///
/// ```
/// use std::time::Duration;
/// use slidegate::Quota;
///
/// let quota = Quota::new(100, Duration::from_secs(60))?;
/// assert_eq!(quota.permits(), 100);
/// assert_eq!(quota.window_ms(), 60_000);
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), slidegate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    permits: u64,
    window_ms: u64,
}

impl Quota {
    /// A quota of `limit` permits per `window`.
    ///
    /// # Errors
    /// [`QuotaError`] when the limit is zero or above [`MAX_LIMIT`], the window is not a whole number
    /// of milliseconds between 1 ms and [`MAX_WINDOW`], or `limit × window_ms`
    /// exceeds [`MAX_EXACT`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if limit > MAX_LIMIT {
            return Err(QuotaError::LimitTooLarge(limit));
        }
        if window < Duration::from_millis(1) {
            return Err(QuotaError::WindowTooShort(window));
        }
        if !window.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(QuotaError::WindowNotWholeMillis(window));
        }
        if window > MAX_WINDOW {
            return Err(QuotaError::WindowTooLong { window });
        }
        // Below MAX_WINDOW, so it fits in u64.
        let window_ms = window.as_millis() as u64;
        match limit.checked_mul(window_ms) {
            Some(product) if product <= MAX_EXACT => Ok(Self { permits: limit, window_ms }),
            _ => Err(QuotaError::TooLarge { limit, window_ms }),
        }
    }

    /// `limit` permits per second.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn per_second(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` permits per minute.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn per_minute(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` permits per hour.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn per_hour(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// Permits per window.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {} ms", self.permits, self.window_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_invalid_value_by_name() {
        assert_eq!(Quota::new(0, Duration::from_secs(1)), Err(QuotaError::ZeroLimit));
        assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::WindowTooShort(Duration::ZERO)));
        assert_eq!(
            Quota::new(1, Duration::from_micros(1500)),
            Err(QuotaError::WindowNotWholeMillis(Duration::from_micros(1500)))
        );
        let long = MAX_WINDOW + Duration::from_millis(1);
        assert_eq!(Quota::new(1, long), Err(QuotaError::WindowTooLong { window: long }));
        assert_eq!(Quota::new(u64::MAX, Duration::from_secs(1)), Err(QuotaError::LimitTooLarge(u64::MAX)));
        assert_eq!(
            Quota::new(MAX_LIMIT, Duration::from_millis(9)),
            Err(QuotaError::TooLarge { limit: MAX_LIMIT, window_ms: 9 })
        );
        assert!(Quota::new(MAX_LIMIT, Duration::from_millis(8)).is_ok());
        let msg = Quota::new(1 << 40, Duration::from_secs(3600)).unwrap_err().to_string();
        assert!(msg.contains("1099511627776 × 3600000 ms"), "{msg}");
    }

    #[test]
    fn accepts_the_largest_exact_product() {
        let q = Quota::new(MAX_EXACT / 1000, Duration::from_secs(1)).unwrap();
        assert_eq!(q.permits() * q.window_ms(), MAX_EXACT / 1000 * 1000);
        assert!(Quota::new(MAX_EXACT / 1000 + 1, Duration::from_secs(1)).is_err());
    }
}
