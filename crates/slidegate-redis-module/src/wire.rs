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

/// Bytes of a lease's reply: a decision, then the window it charged.
pub const LEASE_BYTES: usize = DECISION_BYTES + 8;

/// `lease.lua`'s reply: the decision's four doubles, then the number of the
/// window it was decided in, modulo 2^32 (what `give_back` takes).
pub fn lease_bytes(d: &Decision, window: u64) -> [u8; LEASE_BYTES] {
    let mut out = [0u8; LEASE_BYTES];
    out[..DECISION_BYTES].copy_from_slice(&decision_bytes(d));
    out[DECISION_BYTES..].copy_from_slice(&(window as f64).to_le_bytes());
    out
}

/// Which window algorithm a give-back is for: `give_back.lua`'s `ARGV[1]`.
#[derive(Clone, Copy)]
pub enum Leased {
    /// 1: the sliding window counter.
    SlidingWindowCounter,
    /// 2: the fixed window.
    FixedWindow,
}

/// `give_back.lua`'s `ARGV`, read from their decimal strings.
pub struct GiveBackArgs {
    pub leased: Leased,
    pub limit: u64,
    /// The window the lease was charged in, modulo 2^32.
    pub window: u64,
    pub unused: u64,
    /// The caller's deadline on the server's clock (`None`: a negative argument).
    pub deadline: Option<u64>,
}

/// Reads `give_back.lua`'s five arguments: the algorithm (1 for the sliding
/// window counter, 2 for the fixed window), the limit, the window, the
/// permits to give back and the deadline (-1: none). An argument that is
/// not such an integer is an error naming it.
pub fn parse_give_back(args: [&[u8]; 5]) -> Result<GiveBackArgs, RedisError> {
    let bad = |what: &str| RedisError::String(format!("ERR slidegate: malformed arguments: {what}"));
    let int = |bytes: &[u8], what: &str| -> Result<i64, RedisError> {
        std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()).ok_or_else(|| bad(what))
    };
    let count = |bytes: &[u8], what: &str| u64::try_from(int(bytes, what)?).map_err(|_| bad(what));
    let [kind, limit, window, unused, deadline] = args;
    let leased = match int(kind, "the algorithm")? {
        1 => Leased::SlidingWindowCounter,
        2 => Leased::FixedWindow,
        _ => return Err(bad("the algorithm (1 or 2)")),
    };
    let window = count(window, "the window").and_then(|w| {
        if w < 1 << 32 {
            Ok(w)
        } else {
            Err(bad("the window (below 2^32)"))
        }
    })?;
    Ok(GiveBackArgs {
        leased,
        limit: count(limit, "the limit")?,
        window,
        unused: count(unused, "the permits")?,
        deadline: u64::try_from(int(deadline, "the deadline")?).ok(),
    })
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
    fn give_back_arguments_are_the_scripts_integers() {
        let args = parse_give_back([b"2", b"40", b"4294967295", b"7", b"-1"]).expect("valid");
        assert!(matches!(args.leased, Leased::FixedWindow));
        assert_eq!((args.limit, args.window, args.unused, args.deadline), (40, (1 << 32) - 1, 7, None));
        let args = parse_give_back([b"1", b"40", b"3", b"7", b"1700000000050"]).expect("valid");
        assert!(matches!(args.leased, Leased::SlidingWindowCounter));
        assert_eq!(args.deadline, Some(1_700_000_000_050));
        for (bad, what) in [
            ([b"3".as_slice(), b"40", b"3", b"7", b"-1"], "the algorithm"),
            ([b"1", b"-40", b"3", b"7", b"-1"], "the limit"),
            ([b"1", b"40", b"4294967296", b"7", b"-1"], "the window"),
            ([b"1", b"40", b"3", b"seven", b"-1"], "the permits"),
            ([b"1", b"40", b"3", b"7", b"1.5"], "the deadline"),
        ] {
            let err = parse_give_back(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(what), "{err}");
        }
    }

    #[test]
    fn a_lease_replies_the_decision_then_its_window() {
        let d = Decision {
            allowed: true,
            limit: 40,
            remaining: 24,
            reset_after: Duration::from_millis(1500),
            retry_after: None,
        };
        let bytes = lease_bytes(&d, 7);
        assert_eq!(bytes[..DECISION_BYTES], decision_bytes(&d));
        assert_eq!(bytes[DECISION_BYTES..], 7.0f64.to_le_bytes());
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
