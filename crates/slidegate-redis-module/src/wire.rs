//! The commands' arguments and reply, as `decide_all.lua` takes and gives
//! them (`store/redis/wire.rs` on the client): little-endian doubles.

use std::time::Duration;

use redis_module::RedisError;
use slidegate::{Algorithm, Decision, Quota};

/// The time argument that asks for the server's clock.
const NOW_FROM_REDIS: f64 = -1.0;

/// The error of a write Redis refused.
pub const WRITE_FAILED: RedisError = RedisError::Str("ERR slidegate: cannot write the key");

/// The arguments of one decision.
#[derive(Clone, Copy)]
pub struct Args {
    pub algorithm: Algorithm,
    pub quota: Quota,
    pub cost: u64,
}

/// An integer a double holds exactly, as every argument and stored count is.
pub fn whole(x: f64) -> Option<u64> {
    // The round trip, not `fract()`: a libm call on every argument.
    (x >= 0.0 && x <= slidegate::MAX_EXACT as f64).then_some(x as u64).filter(|&n| n as f64 == x)
}

/// Bytes of one limit's arguments: four doubles.
pub const LIMIT_BYTES: usize = 32;

/// The arguments of `count` limits, split.
pub struct Split<'a> {
    /// The decision's time (`None`: the server's clock).
    pub client_now: Option<u64>,
    /// The limits' bytes.
    pub limits: &'a [u8],
    /// The caller's deadline on the server's clock, when it sent one.
    pub deadline: Option<u64>,
}

/// Splits the arguments of `count` limits: the time, the limits' bytes and,
/// when the arguments are one double longer, the deadline.
pub fn split_args(bytes: &[u8], count: usize) -> Result<Split<'_>, RedisError> {
    let bad = || RedisError::Str("ERR slidegate: malformed arguments");
    let plain = 8 + LIMIT_BYTES * count;
    let (bytes, deadline) = if bytes.len() == plain + 8 {
        let (args, deadline) = bytes.split_at(plain);
        (args, Some(whole(le_double(deadline)).ok_or_else(bad)?))
    } else {
        (bytes, None)
    };
    if bytes.len() != plain {
        return Err(bad());
    }
    let (now, limits) = bytes.split_at(8);
    let now = le_double(now);
    let client_now = if now == NOW_FROM_REDIS { None } else { Some(whole(now).ok_or_else(bad)?) };
    Ok(Split { client_now, limits, deadline })
}

fn le_double(bytes: &[u8]) -> f64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(&bytes[..8]);
    f64::from_le_bytes(le)
}

/// One limit's 32 bytes: algorithm number, limit, window in ms, cost.
pub fn parse_limit(bytes: &[u8]) -> Result<Args, RedisError> {
    let bad = || RedisError::Str("ERR slidegate: malformed arguments");
    if bytes.len() != LIMIT_BYTES {
        return Err(bad());
    }
    let v = |i: usize| le_double(&bytes[8 * i..]);
    let algorithm = whole(v(0))
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| Algorithm::ALL.get(usize::try_from(i).ok()?).copied())
        .ok_or_else(bad)?;
    let limit = whole(v(1)).ok_or_else(bad)?;
    let window = whole(v(2)).ok_or_else(bad)?;
    let quota = Quota::new(limit, Duration::from_millis(window))
        .map_err(|e| RedisError::String(format!("ERR slidegate: {e}")))?;
    let cost = whole(v(3)).filter(|&c| c <= limit).ok_or_else(bad)?;
    Ok(Args { algorithm, quota, cost })
}

/// Bytes of one decision in a reply: four doubles.
pub const DECISION_BYTES: usize = 32;

/// The scripts' reply for `d`: allowed (1|0), remaining, reset_after ms,
/// retry_after ms (-1 when allowed), as little-endian doubles.
pub fn decision_bytes(d: &Decision) -> [u8; DECISION_BYTES] {
    let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX) as f64;
    let values = [
        if d.allowed { 1.0 } else { 0.0 },
        d.remaining as f64,
        ms(d.reset_after),
        d.retry_after.map_or(-1.0, ms),
    ];
    let mut out = [0u8; DECISION_BYTES];
    for (chunk, v) in out.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubles(values: &[f64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn the_deadline_is_the_optional_last_double() {
        let limit = [1.0, 10.0, 60_000.0, 1.0];
        let plain = doubles(&[[-1.0].as_slice(), &limit].concat());
        let split = split_args(&plain, 1).expect("valid");
        assert_eq!((split.client_now, split.deadline, split.limits.len()), (None, None, LIMIT_BYTES));
        let timed = doubles(&[[5.0].as_slice(), &limit, &limit, &[1_700_000_000_050.0]].concat());
        let split = split_args(&timed, 2).expect("valid");
        assert_eq!((split.client_now, split.deadline), (Some(5), Some(1_700_000_000_050)));
        assert_eq!(split.limits.len(), 2 * LIMIT_BYTES);
    }

    #[test]
    fn a_hostile_deadline_or_length_is_malformed() {
        let limit = [1.0, 10.0, 60_000.0, 1.0];
        for deadline in [-1.0, 0.5, f64::NAN, f64::INFINITY, 1e300] {
            let args = doubles(&[[-1.0].as_slice(), &limit, &[deadline]].concat());
            assert!(split_args(&args, 1).is_err(), "deadline {deadline}");
        }
        let args = doubles(&[[-1.0].as_slice(), &limit, &[1.0, 2.0]].concat());
        assert!(split_args(&args, 1).is_err(), "two doubles too many");
        assert!(split_args(&args[..20], 1).is_err(), "short");
        assert!(split_args(&[], 0).is_err(), "empty");
    }
}
