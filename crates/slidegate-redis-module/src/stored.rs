//! Each algorithm's stored value: read into `slidegate::algorithm`'s state,
//! decided with its own function, and written back as the Lua script would
//! write it, with the key's expiry. The one place a stored format lives in
//! Rust; `store/redis/<name>.lua` is the other side of each.

use redis_module::RedisError;
use slidegate::algorithm::{fixed_window, gcra, sliding_window_counter as swc, token_bucket};
use slidegate::{Algorithm, Decision};

use crate::layout::{count_at, double, push_count, push_uint, uint, unwrap_window, Value, TWO_32, TWO_48};
use crate::wire::{whole, Args};

/// What a decision writes: the new value and its expiry.
pub struct Write {
    pub value: Value,
    pub expiry: Expiry,
}

/// When a written key expires.
pub enum Expiry {
    /// The key already carries the right expiry.
    Keep,
    /// The state stops mattering at this time, on the decision's clock.
    IdleAt(u64),
}

/// A decision and what it writes, if anything.
type Outcome = Result<(Decision, Option<Write>), RedisError>;

/// Decides on the value a script would have left (`None`: no key).
pub fn decide(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    match a.algorithm {
        Algorithm::SlidingWindowCounter => sliding_window_counter(stored, now, a),
        Algorithm::FixedWindow => fixed_window(stored, now, a),
        Algorithm::Gcra => gcra(stored, now, a),
        Algorithm::TokenBucket => token_bucket(stored, now, a),
        Algorithm::SlidingLog => {
            Err(RedisError::Str("ERR slidegate: the sliding log is decided by the Lua scripts"))
        }
    }
}

fn corrupt() -> RedisError {
    RedisError::Str("ERR slidegate: the key holds a value no script wrote")
}

/// Whether the decision changes the state (a denial or a peek writes nothing).
fn charged(d: &Decision, a: &Args) -> bool {
    d.allowed && a.cost > 0
}

/// `sliding_window_counter.lua`: window mod 2^32 (4 bytes), then the current
/// and previous counts (4 bytes each below 2^32, else doubles).
fn sliding_window_counter(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    let (limit, w) = (a.quota.permits(), a.quota.window_ms());
    let small = limit < TWO_32;
    let state = match stored {
        None => None,
        Some(v) => {
            let window = uint(v.get(..4).ok_or_else(corrupt)?);
            let n = if small { 4 } else { 8 };
            let cur = count_at(v.get(4..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
            let prev = count_at(v.get(4 + n..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
            unwrap_window(window, now / w).map(|window| swc::State { window, cur, prev })
        }
    };
    let (after, d) = swc::decide(state.unwrap_or_default(), now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None));
    }
    let mut value = Value::new();
    push_uint(&mut value, after.window % TWO_32, 4);
    push_count(&mut value, after.cur, small);
    push_count(&mut value, after.prev, small);
    let same_window = state.is_some_and(|s| s.window == after.window);
    let expiry = if same_window { Expiry::Keep } else { Expiry::IdleAt(now - now % w + 2 * w) };
    Ok((d, Some(Write { value, expiry })))
}

/// `fixed_window.lua`: window mod 2^32 (4 bytes), then the count (4 bytes
/// below 2^32, else a double).
fn fixed_window(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    let (limit, w) = (a.quota.permits(), a.quota.window_ms());
    let small = limit < TWO_32;
    let state = match stored {
        None => None,
        Some(v) => {
            let window = uint(v.get(..4).ok_or_else(corrupt)?);
            let count = count_at(v.get(4..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
            unwrap_window(window, now / w).map(|window| fixed_window::State { window, count })
        }
    };
    let (after, d) = fixed_window::decide(state.unwrap_or_default(), now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None));
    }
    let mut value = Value::new();
    push_uint(&mut value, after.window % TWO_32, 4);
    push_count(&mut value, after.count, small);
    let same_window = state.is_some_and(|s| s.window == after.window);
    let expiry = if same_window { Expiry::Keep } else { Expiry::IdleAt(now - now % w + w) };
    Ok((d, Some(Write { value, expiry })))
}

/// `gcra.lua`: the theoretical arrival time in ms (6 bytes) and its
/// fraction of a ms in ticks (7 bytes).
fn gcra(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    let state = match stored {
        None => gcra::State::default(),
        Some(v) if v.len() == 13 => gcra::State { tat_ms: uint(&v[..6]), frac: uint(&v[6..]) },
        // The layout before exact ticks: the TAT in µs, read as the script reads it.
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .and_then(whole)
            .map_or_else(gcra::State::default, |us| gcra::State { tat_ms: us.div_ceil(1000), frac: 0 }),
    };
    let (after, d) = gcra::decide(state, now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None));
    }
    let mut value = Value::new();
    push_uint(&mut value, after.tat_ms, 6);
    push_uint(&mut value, after.frac, 7);
    let idle_at = after.tat_ms + u64::from(after.frac > 0);
    Ok((d, Some(Write { value, expiry: Expiry::IdleAt(idle_at) })))
}

/// `token_bucket.lua`: the tokens missing from a full bucket, in 1/window
/// units (6 bytes while limit × window < 2^48, else a double), then the
/// time of the last decision (6 bytes).
fn token_bucket(stored: Option<&[u8]>, now: u64, a: &Args) -> Outcome {
    let (limit, w) = (a.quota.permits(), a.quota.window_ms());
    let small = limit * w < TWO_48;
    let state = match stored {
        None => token_bucket::State::default(),
        Some(v) => {
            let (used, rest) = if small {
                (uint(v.get(..6).ok_or_else(corrupt)?), v.get(6..))
            } else {
                (double(v).ok_or_else(corrupt)?, v.get(8..))
            };
            let last_ms = uint(rest.filter(|r| r.len() == 6).ok_or_else(corrupt)?);
            token_bucket::State { used, last_ms }
        }
    };
    let (after, d) = token_bucket::decide(state, now, a.cost, &a.quota);
    if !charged(&d, a) {
        return Ok((d, None));
    }
    let mut value = Value::new();
    if small {
        push_uint(&mut value, after.used, 6);
    } else {
        value.extend_from_slice(&(after.used as f64).to_le_bytes());
    }
    push_uint(&mut value, after.last_ms, 6);
    let idle_at = after.last_ms + after.used.div_ceil(limit);
    Ok((d, Some(Write { value, expiry: Expiry::IdleAt(idle_at) })))
}
