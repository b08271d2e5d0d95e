//! Lengths of time written as `"60s"`, and [`TimeSpan`], the type of the ones
//! that are not rate-limit windows.
//!
//! A window is part of a quota (`slidegate::Quota`) and shapes what a client
//! may do; a time span (a store deadline, a probe interval, a shutdown grace
//! period) only shapes how the service behaves. Two types keep one from being
//! passed where the other belongs. (It was called `Delay`, which read as
//! `slidegate_http::delay`, the rules' hold-instead-of-refuse.)

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A length of time that is not a rate-limit window: a store deadline, a
/// breaker's probe interval, a shutdown grace period.
///
/// ```
/// use slidegate::TimeSpan;
///
/// let grace: TimeSpan = "10s".parse()?;
/// assert_eq!(grace, TimeSpan::from_secs(10));
/// assert_eq!(grace.get(), std::time::Duration::from_secs(10));
/// # Ok::<(), slidegate::DurationError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TimeSpan(Duration);

impl TimeSpan {
    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        TimeSpan(Duration::from_millis(ms))
    }

    /// `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        TimeSpan(Duration::from_secs(secs))
    }

    /// The length as a [`Duration`], for timers.
    pub const fn get(self) -> Duration {
        self.0
    }

    /// Whole milliseconds, for logs.
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl From<Duration> for TimeSpan {
    fn from(d: Duration) -> Self {
        TimeSpan(d)
    }
}

impl From<TimeSpan> for Duration {
    fn from(d: TimeSpan) -> Self {
        d.0
    }
}

impl FromStr for TimeSpan {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(TimeSpan)
    }
}

/// Why a duration could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a whole number followed by a known unit.
    #[error("invalid duration {0:?}: expected a whole number followed by ms, s, m, h or d, such as \"60s\"")]
    Malformed(String),
    /// More milliseconds than a `u64` holds.
    #[error("invalid duration {0:?}: too long")]
    TooLong(String),
}

/// Parses a duration written as a whole number and a unit: `"500ms"`, `"1s"`,
/// `"60s"`, `"5m"`, `"1h"`, `"1d"`.
///
/// # Errors
/// [`DurationError`] for anything else (no unit, a fraction, an unknown
/// unit) and for lengths beyond `u64::MAX` milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let n: u64 = number.parse().map_err(|_| DurationError::Malformed(s.to_owned()))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(DurationError::Malformed(s.to_owned())),
    };
    n.checked_mul(ms_per_unit).map(Duration::from_millis).ok_or_else(|| DurationError::TooLong(s.to_owned()))
}

impl fmt::Display for TimeSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("60"), Err(DurationError::Malformed("60".into())));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert_eq!(
            parse_duration("99999999999999999d"),
            Err(DurationError::TooLong("99999999999999999d".into()))
        );
    }

    #[test]
    fn a_delay_reads_like_a_duration() {
        assert_eq!("500ms".parse::<TimeSpan>(), Ok(TimeSpan::from_millis(500)));
        assert!("500".parse::<TimeSpan>().is_err());
    }
}
