//! `SLIDEGATE.DECIDE`: slidegate's decision as a native Redis command.
//!
//! The arithmetic is `slidegate::algorithm`'s own (the functions the memory
//! store runs); this crate only translates between those states and the
//! values the Lua scripts keep in Redis (`store/redis/*.lua`), so a key
//! written by a script is read by the module and the other way round.
//!
//! ```text
//! SLIDEGATE.DECIDE <key> <args>
//! ```
//!
//! `<args>` is 40 bytes, five little-endian doubles: now in ms since the
//! epoch (or -1 for the server's clock), the algorithm's number (its place in
//! `Algorithm::ALL`, from 1, as in `decide_all.lua`), limit, window in ms and
//! cost. The reply is the scripts' 32 bytes: allowed (1|0), remaining,
//! reset_after ms, retry_after ms (-1 when allowed).
//!
//! Replication carries effects, never the decision: a write is propagated as
//! `SET key value PXAT <absolute ms>` (or `KEEPTTL` where the script keeps the
//! TTL), so a replica or an AOF replay neither re-decides on another clock
//! nor needs the module loaded. The sliding log (a sorted set) is left to the
//! Lua scripts: the command answers it with an error the store never provokes.
//!
//! This is the one crate of the workspace that allows `unsafe` (it does not
//! take the workspace lints, which forbid it): a Redis module talks to the
//! server through its C API, and the few calls `redis-module` does not wrap
//! safely (replicating a command, the server clock, raw key values and
//! absolute expiry) are made directly, each with a `SAFETY` note. The need is
//! measured: a decision costs a third of the article's script's server CPU
//! here, against about the same as the script in Lua (BENCHMARKS.md).

use std::time::Duration;

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};
use slidegate::algorithm::{fixed_window, gcra, sliding_window_counter as swc, token_bucket};
use slidegate::{Algorithm, Decision, Quota};

/// Bytes of the arguments: five doubles.
const ARGS_BYTES: usize = 40;
/// The time argument that asks for the server's clock.
const NOW_FROM_REDIS: f64 = -1.0;
/// As in `prelude.lua`: in client time a key outlives its state by this much
/// on the server's clock, covering a client clock that lags the server's.
const CLIENT_TTL_SLACK_MS: u64 = 10_000;
const TWO_32: u64 = 1 << 32;
const TWO_48: u64 = 1 << 48;

/// The arguments of one decision.
struct Args {
    /// Client time, or `None` for the server's clock.
    client_now: Option<u64>,
    algorithm: Algorithm,
    quota: Quota,
    cost: u64,
}

/// An integer a double holds exactly, as every argument and stored count is.
fn whole(x: f64) -> Option<u64> {
    (x >= 0.0 && x <= slidegate::MAX_EXACT as f64 && x.fract() == 0.0).then_some(x as u64)
}

fn parse_args(bytes: &[u8]) -> Result<Args, RedisError> {
    let bad = || RedisError::Str("ERR slidegate: malformed arguments");
    if bytes.len() != ARGS_BYTES {
        return Err(bad());
    }
    let mut v = [0f64; 5];
    for (x, chunk) in v.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut le = [0u8; 8];
        le.copy_from_slice(chunk);
        *x = f64::from_le_bytes(le);
    }
    let client_now = if v[0] == NOW_FROM_REDIS { None } else { Some(whole(v[0]).ok_or_else(bad)?) };
    let algorithm = whole(v[1])
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| Algorithm::ALL.get(usize::try_from(i).ok()?).copied())
        .ok_or_else(bad)?;
    let limit = whole(v[2]).ok_or_else(bad)?;
    let window = whole(v[3]).ok_or_else(bad)?;
    let quota = Quota::new(limit, Duration::from_millis(window))
        .map_err(|e| RedisError::String(format!("ERR slidegate: {e}")))?;
    let cost = whole(v[4]).filter(|&c| c <= limit).ok_or_else(bad)?;
    Ok(Args { client_now, algorithm, quota, cost })
}

/// Little-endian unsigned integer of `bytes.len()` bytes (Lua's `I<n>`).
fn uint(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

fn push_uint(out: &mut Vec<u8>, v: u64, n: usize) {
    out.extend_from_slice(&v.to_le_bytes()[..n]);
}

/// A little-endian double at the start of `bytes` (Lua's `d`).
fn double(bytes: &[u8]) -> Option<u64> {
    let mut le = [0u8; 8];
    le.copy_from_slice(bytes.get(..8)?);
    whole(f64::from_le_bytes(le))
}

/// A count in the layout the limit calls for: 4 bytes below 2^32, a double above.
fn push_count(out: &mut Vec<u8>, v: u64, small: bool) {
    if small {
        push_uint(out, v, 4);
    } else {
        out.extend_from_slice(&(v as f64).to_le_bytes());
    }
}

fn count_at(bytes: &[u8], small: bool) -> Option<u64> {
    if small {
        Some(uint(bytes.get(..4)?))
    } else {
        double(bytes)
    }
}

/// The full window number a stored `window mod 2^32` stands for, seen from
/// window `now_window`: ahead by less than 2^31 windows, else behind (as
/// `window_skew` in `prelude.lua` reads it). `None` for a window before 0.
fn unwrap_window(stored: u64, now_window: u64) -> Option<u64> {
    let ahead = (stored + TWO_32 - now_window % TWO_32) % TWO_32;
    if ahead < TWO_32 / 2 {
        Some(now_window + ahead)
    } else {
        now_window.checked_sub(TWO_32 - ahead)
    }
}

/// What a decision writes: the new value and its expiry.
struct Write {
    value: Vec<u8>,
    expiry: Expiry,
}

enum Expiry {
    /// The key already carries the right expiry.
    Keep,
    /// The state stops mattering at this time, on the decision's clock.
    IdleAt(u64),
}

/// Decides on the value a script would have left (`None`: no key).
fn decide(stored: Option<&[u8]>, now: u64, a: &Args) -> Result<(Decision, Option<Write>), RedisError> {
    let (q, cost) = (&a.quota, a.cost);
    let (limit, w) = (q.permits(), q.window_ms());
    let corrupt = || RedisError::Str("ERR slidegate: the key holds a value no script wrote");
    let charged = |d: &Decision| d.allowed && cost > 0;
    match a.algorithm {
        Algorithm::SlidingWindowCounter => {
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
            let (after, d) = swc::decide(state.unwrap_or_default(), now, cost, q);
            if !charged(&d) {
                return Ok((d, None));
            }
            let mut value = Vec::with_capacity(20);
            push_uint(&mut value, after.window % TWO_32, 4);
            push_count(&mut value, after.cur, small);
            push_count(&mut value, after.prev, small);
            let same_window = state.is_some_and(|s| s.window == after.window);
            let expiry = if same_window { Expiry::Keep } else { Expiry::IdleAt(now - now % w + 2 * w) };
            Ok((d, Some(Write { value, expiry })))
        }
        Algorithm::FixedWindow => {
            let small = limit < TWO_32;
            let state = match stored {
                None => None,
                Some(v) => {
                    let window = uint(v.get(..4).ok_or_else(corrupt)?);
                    let count = count_at(v.get(4..).ok_or_else(corrupt)?, small).ok_or_else(corrupt)?;
                    unwrap_window(window, now / w).map(|window| fixed_window::State { window, count })
                }
            };
            let (after, d) = fixed_window::decide(state.unwrap_or_default(), now, cost, q);
            if !charged(&d) {
                return Ok((d, None));
            }
            let mut value = Vec::with_capacity(12);
            push_uint(&mut value, after.window % TWO_32, 4);
            push_count(&mut value, after.count, small);
            let same_window = state.is_some_and(|s| s.window == after.window);
            let expiry = if same_window { Expiry::Keep } else { Expiry::IdleAt(now - now % w + w) };
            Ok((d, Some(Write { value, expiry })))
        }
        Algorithm::Gcra => {
            let state = match stored {
                None => gcra::State::default(),
                Some(v) if v.len() == 13 => gcra::State { tat_ms: uint(&v[..6]), frac: uint(&v[6..]) },
                // The layout before exact ticks: the TAT in µs, read as the script reads it.
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .and_then(whole)
                    .map_or_else(gcra::State::default, |us| gcra::State {
                        tat_ms: us.div_ceil(1000),
                        frac: 0,
                    }),
            };
            let (after, d) = gcra::decide(state, now, cost, q);
            if !charged(&d) {
                return Ok((d, None));
            }
            let mut value = Vec::with_capacity(13);
            push_uint(&mut value, after.tat_ms, 6);
            push_uint(&mut value, after.frac, 7);
            let idle_at = after.tat_ms + u64::from(after.frac > 0);
            Ok((d, Some(Write { value, expiry: Expiry::IdleAt(idle_at) })))
        }
        Algorithm::TokenBucket => {
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
            let (after, d) = token_bucket::decide(state, now, cost, q);
            if !charged(&d) {
                return Ok((d, None));
            }
            let mut value = Vec::with_capacity(14);
            if small {
                push_uint(&mut value, after.used, 6);
            } else {
                value.extend_from_slice(&(after.used as f64).to_le_bytes());
            }
            push_uint(&mut value, after.last_ms, 6);
            let idle_at = after.last_ms + after.used.div_ceil(limit);
            Ok((d, Some(Write { value, expiry: Expiry::IdleAt(idle_at) })))
        }
        Algorithm::SlidingLog => {
            Err(RedisError::Str("ERR slidegate: the sliding log is decided by the Lua scripts"))
        }
    }
}

/// The scripts' reply: four little-endian doubles.
fn reply(d: &Decision) -> RedisValue {
    let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX) as f64;
    let values = [
        if d.allowed { 1.0 } else { 0.0 },
        d.remaining as f64,
        ms(d.reset_after),
        d.retry_after.map_or(-1.0, ms),
    ];
    RedisValue::StringBuffer(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// An open key, closed (and signalled as modified, when written) on drop.
#[cfg_attr(test, allow(dead_code))]
struct OpenKey(*mut raw::RedisModuleKey);

impl Drop for OpenKey {
    fn drop(&mut self) {
        raw::close_key(self.0);
    }
}

#[cfg_attr(test, allow(dead_code))]
const WRITE_FAILED: RedisError = RedisError::Str("ERR slidegate: cannot write the key");

/// Propagates `SET key value PXAT at` (or `KEEPTTL` without `at`) to
/// replicas and the AOF. The format string hands Redis the buffers as they
/// are (`b`: pointer and length; `c`: C string; `l`: long long), with no
/// module strings created on the way.
#[cfg_attr(test, allow(dead_code))]
fn replicate_set(ctx: &Context, key: &[u8], value: &[u8], at: Option<i64>) -> Result<(), RedisError> {
    // SAFETY: bound once when the module loads, read-only afterwards.
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(WRITE_FAILED)?;
    // SAFETY: every pointer lives across the call, each buffer comes with its
    // length, and the C strings are NUL-terminated literals.
    let status = unsafe {
        match at {
            None => replicate(
                ctx.ctx,
                c"SET".as_ptr(),
                c"bbc".as_ptr(),
                key.as_ptr(),
                key.len(),
                value.as_ptr(),
                value.len(),
                c"KEEPTTL".as_ptr(),
            ),
            Some(at) => replicate(
                ctx.ctx,
                c"SET".as_ptr(),
                c"bbcl".as_ptr(),
                key.as_ptr(),
                key.len(),
                value.as_ptr(),
                value.len(),
                c"PXAT".as_ptr(),
                at,
            ),
        }
    };
    if status == raw::REDISMODULE_OK as i32 {
        Ok(())
    } else {
        Err(WRITE_FAILED)
    }
}

#[cfg_attr(test, allow(dead_code))]
fn slidegate_decide(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key_name, raw_args] = args.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let a = parse_args(raw_args.as_slice())?;
    // SAFETY: Milliseconds takes no argument and is bound when the module loads.
    let server_now = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    let server_now = u64::try_from(server_now)
        .map_err(|_| RedisError::Str("ERR slidegate: the server clock is before 1970"))?;
    let now = a.client_now.unwrap_or(server_now);

    let key = OpenKey(raw::open_key(ctx.ctx, key_name.inner, raw::KeyMode::READ | raw::KeyMode::WRITE));
    // SAFETY: the key was opened above and stays open until `key` drops.
    let key_type = unsafe { raw::RedisModule_KeyType.map_or(-1, |f| f(key.0)) };
    let stored = match isize::try_from(key_type) {
        Ok(raw::REDISMODULE_KEYTYPE_EMPTY) => None,
        Ok(raw::REDISMODULE_KEYTYPE_STRING) => {
            let mut len = 0;
            let ptr = raw::string_dma(key.0, &mut len, raw::KeyMode::READ);
            if ptr.is_null() {
                return Err(RedisError::WrongType);
            }
            // SAFETY: DMA gives `len` readable bytes, valid until the key is
            // written or closed; they are copied out before either.
            Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec())
        }
        _ => return Err(RedisError::WrongType),
    };
    let (decision, write) = decide(stored.as_deref(), now, &a)?;
    if let Some(write) = write {
        // In place: truncating to the new length and writing through DMA
        // keeps the key's expiry, which `Expiry::Keep` relies on.
        if raw::string_truncate(key.0, write.value.len()) == raw::Status::Err {
            return Err(WRITE_FAILED);
        }
        let mut len = 0;
        let ptr = raw::string_dma(key.0, &mut len, raw::KeyMode::WRITE);
        if ptr.is_null() || len != write.value.len() {
            return Err(WRITE_FAILED);
        }
        // SAFETY: DMA gives `len` writable bytes, exactly the value's length.
        unsafe { std::ptr::copy_nonoverlapping(write.value.as_ptr(), ptr.cast::<u8>(), len) };
        let key_bytes = key_name.as_slice();
        match write.expiry {
            Expiry::Keep => replicate_set(ctx, key_bytes, &write.value, None)?,
            Expiry::IdleAt(idle_at) => {
                // On the server's clock: the absolute time of the script's
                // PXAT (server time), or of its PX from now (client time, with slack).
                let at = match a.client_now {
                    None => idle_at,
                    Some(_) => server_now + (idle_at + CLIENT_TTL_SLACK_MS).saturating_sub(now),
                };
                let at_ms = i64::try_from(at).map_err(|_| WRITE_FAILED)?;
                // SAFETY: the key is open for writing and holds the value just written.
                let status = unsafe { raw::RedisModule_SetAbsExpire.map_or(-1, |f| f(key.0, at_ms)) };
                if status != raw::REDISMODULE_OK as i32 {
                    return Err(WRITE_FAILED);
                }
                replicate_set(ctx, key_bytes, &write.value, Some(at_ms))?;
            }
        }
    }
    drop(key);
    Ok(reply(&decision))
}

// Not in unit tests: the module's allocator is Redis's, which a test binary lacks.
#[cfg(not(test))]
redis_module::redis_module! {
    name: "slidegate",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    commands: [
        ["slidegate.decide", slidegate_decide, "write deny-oom fast", 1, 1, 1, ""],
    ],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_unwrap_ahead_and_behind() {
        assert_eq!(unwrap_window(5, 5), Some(5));
        assert_eq!(unwrap_window(4, 5), Some(4));
        assert_eq!(unwrap_window(6, 5), Some(6));
        assert_eq!(unwrap_window((TWO_32 + 3) % TWO_32, TWO_32 + 3), Some(TWO_32 + 3));
        assert_eq!(unwrap_window(TWO_32 - 1, TWO_32 + 1), Some(TWO_32 - 1));
        assert_eq!(unwrap_window(TWO_32 - 1, 1), None);
    }

    #[test]
    fn integers_use_the_scripts_little_endian_layout() {
        let mut v = Vec::new();
        push_uint(&mut v, 0x0102_0304_0506, 6);
        assert_eq!(v, [6, 5, 4, 3, 2, 1]);
        assert_eq!(uint(&v), 0x0102_0304_0506);
    }
}
