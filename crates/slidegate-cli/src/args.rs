//! Argument parsers shared by the subcommands: each names the accepted range,
//! so clap's error says which flag was wrong and why.

use std::ops::RangeInclusive;

/// A whole number within `range`.
pub fn count(
    range: RangeInclusive<usize>,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.parse::<usize>() {
        Ok(n) if range.contains(&n) => Ok(n),
        Ok(n) => Err(format!("must be from {} to {}, got {n}", range.start(), range.end())),
        Err(e) => Err(format!("must be a whole number from {} to {}: {e}", range.start(), range.end())),
    }
}

/// A number of seconds above 0 and at most `max`.
pub fn seconds(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= max => Ok(v),
        Ok(v) => Err(format!("must be a number of seconds above 0 and at most {max}, got {v}")),
        Err(e) => Err(format!("must be a number of seconds above 0 and at most {max}: {e}")),
    }
}
