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

/// A packed layout's bucket count: a power of two from 1 to [`slidegate::store::redis::MAX_BUCKETS`].
pub fn buckets(s: &str) -> Result<slidegate::Buckets, String> {
    let max = slidegate::store::redis::MAX_BUCKETS;
    s.parse::<u32>()
        .ok()
        .and_then(slidegate::Buckets::new)
        .ok_or_else(|| format!("must be a power of two from 1 to {max}, got {s:?}"))
}

/// A number of seconds above 0 and at most `max`.
pub fn seconds(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= max => Ok(v),
        Ok(v) => Err(format!("must be a number of seconds above 0 and at most {max}, got {v}")),
        Err(e) => Err(format!("must be a number of seconds above 0 and at most {max}: {e}")),
    }
}
