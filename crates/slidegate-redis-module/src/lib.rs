//! `SLIDEGATE.DECIDE` and `SLIDEGATE.DECIDE_ALL`: slidegate's decisions as
//! native Redis commands.
//!
//! The arithmetic is `slidegate::algorithm`'s own (the functions the memory
//! store runs); this crate only translates between those states and the
//! values the Lua scripts keep in Redis (`store/redis/*.lua`), so a key
//! written by a script is read by the module and the other way round. The
//! translation lives in `decide`, one arm per algorithm.
//!
//! ```text
//! SLIDEGATE.DECIDE <key> <args>
//! SLIDEGATE.DECIDE_ALL <key>... <args>
//! ```
//!
//! `<args>` is `decide_all.lua`'s `ARGV[1]`: little-endian doubles, now in ms
//! since the epoch (or -1 for the server's clock), then per key the
//! algorithm's number (its place in `Algorithm::ALL`, from 1), limit, window
//! in ms and cost. The reply is the scripts' 32 bytes per key: allowed
//! (1|0), remaining, reset_after ms, retry_after ms (-1 when allowed).
//! `DECIDE_ALL` decides every limit before it writes any, and writes none
//! if one denies (the others then report a cost-0 peek), as the script and
//! the memory store do. Both commands declare their keys (the first; the
//! first to the one before last), so Redis Cluster routes them, and
//! answers `MOVED` or `CROSSSLOT` before anything runs.
//!
//! Replication carries effects, never the decision: a write is propagated as
//! `SET key value PXAT <absolute ms>` (or `KEEPTTL` where the script keeps the
//! TTL), so a replica or an AOF replay neither re-decides on another clock
//! nor needs the module loaded; where Redis would drop it (no AOF, no
//! replica ever), it is not built (`propagation.rs`), though the write still
//! counts toward the RDB save points (`count_change`). The sliding log (a
//! sorted set) is left to the Lua scripts: the commands answer it with an
//! error the store never provokes.
//!
//! This is the one crate of the workspace that allows `unsafe` (it does not
//! take the workspace lints, which forbid it): a Redis module talks to the
//! server through its C API, and the calls `redis-module` does not wrap
//! safely (the command handlers, replicating a command, the server clock,
//! raw key values, absolute expiry, the replication watchers) are made
//! directly, each with a `SAFETY` note. The need is measured: a decision
//! costs 0.2–0.3× the article's script's server CPU here (0.07–0.24× in
//! instructions), against about the same as the script in Lua (BENCHMARKS.md).

use std::ffi::{c_int, CStr};
use std::time::Duration;

use redis_module::{raw, Context, RedisError};

mod propagation;
use slidegate::algorithm::{fixed_window, gcra, sliding_window_counter as swc, token_bucket};
use slidegate::{Algorithm, Decision, Quota};

/// The time argument that asks for the server's clock.
const NOW_FROM_REDIS: f64 = -1.0;
/// As in `prelude.lua`: in client time a key outlives its state by this much
/// on the server's clock, covering a client clock that lags the server's.
const CLIENT_TTL_SLACK_MS: u64 = 10_000;
const TWO_32: u64 = 1 << 32;
const TWO_48: u64 = 1 << 48;

/// The arguments of one decision.
#[derive(Clone, Copy)]
struct Args {
    algorithm: Algorithm,
    quota: Quota,
    cost: u64,
}

/// An integer a double holds exactly, as every argument and stored count is.
fn whole(x: f64) -> Option<u64> {
    // The round trip, not `fract()`: a libm call on every argument.
    (x >= 0.0 && x <= slidegate::MAX_EXACT as f64).then_some(x as u64).filter(|&n| n as f64 == x)
}

/// Bytes of one limit's arguments: four doubles.
const LIMIT_BYTES: usize = 32;

/// Splits the arguments of `count` limits into the time (`None`: the
/// server's clock) and the limits' bytes.
fn split_args(bytes: &[u8], count: usize) -> Result<(Option<u64>, &[u8]), RedisError> {
    let bad = || RedisError::Str("ERR slidegate: malformed arguments");
    if bytes.len() != 8 + LIMIT_BYTES * count {
        return Err(bad());
    }
    let (now, limits) = bytes.split_at(8);
    let now = le_double(now);
    let client_now = if now == NOW_FROM_REDIS { None } else { Some(whole(now).ok_or_else(bad)?) };
    Ok((client_now, limits))
}

fn le_double(bytes: &[u8]) -> f64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(&bytes[..8]);
    f64::from_le_bytes(le)
}

/// One limit's 32 bytes: algorithm number, limit, window in ms, cost.
fn parse_limit(bytes: &[u8]) -> Result<Args, RedisError> {
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

/// Little-endian unsigned integer of `bytes.len()` bytes (Lua's `I<n>`).
fn uint(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

fn push_uint(out: &mut Value, v: u64, n: usize) {
    out.extend_from_slice(&v.to_le_bytes()[..n]);
}

/// A little-endian double at the start of `bytes` (Lua's `d`).
fn double(bytes: &[u8]) -> Option<u64> {
    let mut le = [0u8; 8];
    le.copy_from_slice(bytes.get(..8)?);
    whole(f64::from_le_bytes(le))
}

/// A count in the layout the limit calls for: 4 bytes below 2^32, a double above.
fn push_count(out: &mut Value, v: u64, small: bool) {
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

/// A value as a decision writes it, on the stack: the longest layout is
/// the counter's for limits from 2^32, 20 bytes.
struct Value {
    bytes: [u8; 24],
    len: usize,
    /// More was pushed than fits: a broken layout, refused at write.
    overflow: bool,
}

impl Value {
    fn new() -> Self {
        Self { bytes: [0; 24], len: 0, overflow: false }
    }

    fn extend_from_slice(&mut self, more: &[u8]) {
        match self.bytes.get_mut(self.len..self.len + more.len()) {
            Some(room) => {
                room.copy_from_slice(more);
                self.len += more.len();
            }
            None => self.overflow = true,
        }
    }

    fn as_slice(&self) -> Option<&[u8]> {
        (!self.overflow).then(|| &self.bytes[..self.len])
    }
}

/// What a decision writes: the new value and its expiry.
struct Write {
    value: Value,
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
            let mut value = Value::new();
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
            let mut value = Value::new();
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
            let mut value = Value::new();
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
        Algorithm::SlidingLog => {
            Err(RedisError::Str("ERR slidegate: the sliding log is decided by the Lua scripts"))
        }
    }
}

/// Bytes of one decision in a reply: four doubles.
const DECISION_BYTES: usize = 32;

/// The scripts' reply for `d`: allowed (1|0), remaining, reset_after ms,
/// retry_after ms (-1 when allowed), as little-endian doubles.
fn decision_bytes(d: &Decision) -> [u8; DECISION_BYTES] {
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

/// What a command replies: one decision (on the stack) or several.
enum Reply {
    One([u8; DECISION_BYTES]),
    All(Vec<u8>),
}

impl Reply {
    fn bytes(&self) -> &[u8] {
        match self {
            Reply::One(bytes) => bytes,
            Reply::All(bytes) => bytes,
        }
    }
}

/// The bytes of a module string, borrowed for as long as Redis keeps it.
fn string_bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0;
    // SAFETY: `s` is an argument of the running command, alive until it
    // returns; StringPtrLen neither copies nor allocates.
    unsafe {
        let ptr = raw::RedisModule_StringPtrLen.map_or(std::ptr::null(), |f| f(s, &mut len));
        if ptr.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        }
    }
}

/// The time of one call: the decision's clock and the server's, which
/// every expiry is set on.
struct Clock {
    now: u64,
    server_now: u64,
    client_time: bool,
}

impl Clock {
    fn read(client_now: Option<u64>) -> Result<Self, RedisError> {
        // SAFETY: Milliseconds takes no argument and is bound when the module loads.
        let server_now = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
        let server_now = u64::try_from(server_now)
            .map_err(|_| RedisError::Str("ERR slidegate: the server clock is before 1970"))?;
        Ok(Self { now: client_now.unwrap_or(server_now), server_now, client_time: client_now.is_some() })
    }

    /// The absolute expiry, on the server's clock, of a state idle at
    /// `idle_at` on the decision's clock: as the script's PXAT (server time),
    /// or its PX from now (client time, with slack).
    fn expire_at(&self, idle_at: u64) -> Result<i64, RedisError> {
        let at = if self.client_time {
            self.server_now + (idle_at + CLIENT_TTL_SLACK_MS).saturating_sub(self.now)
        } else {
            idle_at
        };
        i64::try_from(at).map_err(|_| WRITE_FAILED)
    }
}

/// An open key, closed (and signalled as modified, when written) on drop.
#[cfg_attr(test, allow(dead_code))]
struct OpenKey {
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
}

#[cfg_attr(test, allow(dead_code))]
impl OpenKey {
    fn open(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString) -> Self {
        let key = raw::open_key(ctx, name, raw::KeyMode::READ | raw::KeyMode::WRITE);
        Self { key, name }
    }

    /// The value a script (or this module) left, `None` for no key. Valid
    /// until the key is written or closed, which the borrow enforces.
    fn value(&self) -> Result<Option<&[u8]>, RedisError> {
        // SAFETY: the key is open until `self` drops.
        let key_type = unsafe { raw::RedisModule_KeyType.map_or(-1, |f| f(self.key)) };
        match isize::try_from(key_type) {
            Ok(raw::REDISMODULE_KEYTYPE_EMPTY) => Ok(None),
            Ok(raw::REDISMODULE_KEYTYPE_STRING) => {
                let mut len = 0;
                let ptr = raw::string_dma(self.key, &mut len, raw::KeyMode::READ);
                if ptr.is_null() {
                    return Err(RedisError::WrongType);
                }
                // SAFETY: DMA gives `len` readable bytes, valid until the key
                // is written or closed, neither of which can happen while
                // `&self` is borrowed for the slice.
                Ok(Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }))
            }
            _ => Err(RedisError::WrongType),
        }
    }

    /// Writes `write` with its expiry and propagates the same as a `SET`.
    fn write(
        &mut self,
        ctx: *mut raw::RedisModuleCtx,
        write: &Write,
        clock: &Clock,
    ) -> Result<(), RedisError> {
        let value = write.value.as_slice().ok_or(WRITE_FAILED)?;
        // In place: truncating to the new length and writing through DMA
        // keeps the key's expiry, which `Expiry::Keep` relies on.
        if raw::string_truncate(self.key, value.len()) == raw::Status::Err {
            return Err(WRITE_FAILED);
        }
        let mut len = 0;
        let ptr = raw::string_dma(self.key, &mut len, raw::KeyMode::WRITE);
        if ptr.is_null() || len != value.len() {
            return Err(WRITE_FAILED);
        }
        // SAFETY: DMA gives `len` writable bytes, exactly the value's length.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), ptr.cast::<u8>(), len) };
        let name = self.name;
        let propagate = propagation::needed(ctx);
        if !propagate {
            count_change(ctx)?;
        }
        match write.expiry {
            Expiry::Keep if propagate => replicate_set(ctx, name, value, None),
            Expiry::Keep => Ok(()),
            Expiry::IdleAt(idle_at) => {
                let at = clock.expire_at(idle_at)?;
                // SAFETY: the key is open for writing and holds the value just written.
                let status = unsafe { raw::RedisModule_SetAbsExpire.map_or(-1, |f| f(self.key, at)) };
                if status != raw::REDISMODULE_OK as i32 {
                    return Err(WRITE_FAILED);
                }
                if propagate {
                    replicate_set(ctx, name, value, Some(at))?;
                }
                Ok(())
            }
        }
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        raw::close_key(self.key);
    }
}

#[cfg_attr(test, allow(dead_code))]
const WRITE_FAILED: RedisError = RedisError::Str("ERR slidegate: cannot write the key");

/// Counts one change toward the RDB save points (`server.dirty`) without
/// building the write's `SET`, for a write nothing receives (see
/// `propagation.rs`). Redis counts a module's changes only in
/// `RedisModule_Replicate`; a `PING` flagged for neither the AOF (`A`) nor
/// the replicas (`R`) goes nowhere and is the cheapest command to name, so
/// a server that persists by `save` points still snapshots the limiter's
/// state, as it does a script's writes.
#[cfg_attr(test, allow(dead_code))]
fn count_change(ctx: *mut raw::RedisModuleCtx) -> Result<(), RedisError> {
    // SAFETY: bound once when the module loads, read-only afterwards.
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(WRITE_FAILED)?;
    // SAFETY: `ctx` is the running command's; both C strings are
    // NUL-terminated literals and the format takes no further argument.
    let status = unsafe { replicate(ctx, c"PING".as_ptr(), c"AR".as_ptr()) };
    if status == raw::REDISMODULE_OK as i32 {
        Ok(())
    } else {
        Err(WRITE_FAILED)
    }
}

/// Propagates `SET key value PXAT at` (or `KEEPTTL` without `at`) to
/// replicas and the AOF. The format string hands Redis the key as the
/// command's own argument (`s`: shared, not copied), the value as a buffer
/// (`b`: pointer and length), the rest as a C string (`c`) and a long long (`l`).
#[cfg_attr(test, allow(dead_code))]
fn replicate_set(
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleString,
    value: &[u8],
    at: Option<i64>,
) -> Result<(), RedisError> {
    // SAFETY: bound once when the module loads, read-only afterwards.
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(WRITE_FAILED)?;
    // SAFETY: the key is an argument of the running command, every pointer
    // lives across the call, the buffer comes with its length, and the C
    // strings are NUL-terminated literals.
    let status = unsafe {
        match at {
            None => replicate(
                ctx,
                c"SET".as_ptr(),
                c"sbc".as_ptr(),
                key,
                value.as_ptr(),
                value.len(),
                c"KEEPTTL".as_ptr(),
            ),
            Some(at) => replicate(
                ctx,
                c"SET".as_ptr(),
                c"sbcl".as_ptr(),
                key,
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

/// `SLIDEGATE.DECIDE <key> <args>`: one limit.
#[cfg_attr(test, allow(dead_code))]
fn decide_one(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    args: &[u8],
) -> Result<Reply, RedisError> {
    let (client_now, limits) = split_args(args, 1)?;
    let a = parse_limit(limits)?;
    let clock = Clock::read(client_now)?;
    let mut key = OpenKey::open(ctx, name);
    let (decision, write) = decide(key.value()?, clock.now, &a)?;
    if let Some(write) = write {
        key.write(ctx, &write, &clock)?;
    }
    Ok(Reply::One(decision_bytes(&decision)))
}

/// `SLIDEGATE.DECIDE_ALL <key>... <args>`: several limits of one identity,
/// all or nothing, as `decide_all.lua` and the memory store decide them.
/// Every limit is decided before any is written; if one denies, nothing is
/// written and the limits that had room report the state without this
/// request (a cost-0 peek).
#[cfg_attr(test, allow(dead_code))]
fn decide_all(
    ctx: *mut raw::RedisModuleCtx,
    names: &[*mut raw::RedisModuleString],
    args: &[u8],
) -> Result<Reply, RedisError> {
    let (client_now, limits) = split_args(args, names.len())?;
    let limits = limits.chunks_exact(LIMIT_BYTES).map(parse_limit).collect::<Result<Vec<_>, _>>()?;
    let clock = Clock::read(client_now)?;
    let mut checked = Vec::with_capacity(names.len());
    for (&name, a) in names.iter().zip(&limits) {
        let key = OpenKey::open(ctx, name);
        let (decision, write) = decide(key.value()?, clock.now, a)?;
        checked.push((key, decision, write));
    }
    let denied = checked.iter().any(|(_, d, _)| !d.allowed);
    let mut reply = Vec::with_capacity(DECISION_BYTES * names.len());
    for ((key, decision, write), a) in checked.iter_mut().zip(&limits) {
        if denied {
            if decision.allowed {
                let peek = Args { cost: 0, ..*a };
                *decision = decide(key.value()?, clock.now, &peek)?.0;
            }
        } else if let Some(write) = write {
            key.write(ctx, write, &clock)?;
        }
        reply.extend_from_slice(&decision_bytes(decision));
    }
    Ok(Reply::All(reply))
}

/// Replies with `result`: the decisions' bytes, or the error.
#[cfg_attr(test, allow(dead_code))]
fn respond(ctx: *mut raw::RedisModuleCtx, result: Result<Reply, RedisError>) -> c_int {
    match result {
        Ok(reply) => {
            let bytes = reply.bytes();
            raw::reply_with_string_buffer(ctx, bytes.as_ptr().cast(), bytes.len()) as c_int
        }
        Err(err) => Context::new(ctx).reply(Err(err)) as c_int,
    }
}

/// The command's arguments as Redis hands them over.
///
/// # Safety
/// `argv` points to `argc` strings alive until the command returns.
unsafe fn arguments<'a>(
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> &'a [*mut raw::RedisModuleString] {
    match usize::try_from(argc) {
        // SAFETY: as the caller promises.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    }
}

/// The handler of `SLIDEGATE.DECIDE`, called by Redis. Registered directly
/// rather than through `redis_module`'s wrapper, which retains every
/// argument as a module string in a fresh `Vec` first.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn decide_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: Redis calls a command handler with its argv and argc.
    let result = match unsafe { arguments(argv, argc) } {
        &[_, key, args] => decide_one(ctx, key, string_bytes(args)),
        _ => Err(RedisError::WrongArity),
    };
    respond(ctx, result)
}

/// The handler of `SLIDEGATE.DECIDE_ALL`, called by Redis.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn decide_all_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: Redis calls a command handler with its argv and argc.
    let result = match unsafe { arguments(argv, argc) } {
        [_, keys @ .., args] if !keys.is_empty() => decide_all(ctx, keys, string_bytes(*args)),
        _ => Err(RedisError::WrongArity),
    };
    respond(ctx, result)
}

/// At load: registers the commands with the keys they declare, which Redis
/// Cluster routes by (`MOVED`, `ASK`, `CROSSSLOT`) and ACL key patterns
/// check (one key for `DECIDE`; for `DECIDE_ALL` every argument from the
/// first to the one before last), then the replication watchers.
#[cfg_attr(test, allow(dead_code))]
fn register_commands(ctx: &Context, _args: &[redis_module::RedisString]) -> redis_module::Status {
    type Handler = extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;
    let commands: [(&CStr, Handler, c_int); 2] =
        [(c"slidegate.decide", decide_command, 1), (c"slidegate.decide_all", decide_all_command, -2)];
    for (name, handler, last_key) in commands {
        // SAFETY: called from OnLoad with its context; the name and flags
        // are NUL-terminated literals Redis copies.
        let status = unsafe {
            raw::RedisModule_CreateCommand.map_or(raw::REDISMODULE_ERR as c_int, |create| {
                create(ctx.ctx, name.as_ptr(), Some(handler), c"write deny-oom fast".as_ptr(), 1, last_key, 1)
            })
        };
        if status != raw::REDISMODULE_OK as c_int {
            ctx.log_warning(&format!("slidegate: cannot register {}", name.to_string_lossy()));
            return redis_module::Status::Err;
        }
    }
    propagation::init(ctx)
}

// Not in unit tests: the module's allocator is Redis's, which a test binary lacks.
#[cfg(not(test))]
redis_module::redis_module! {
    name: "slidegate",
    version: 2,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: register_commands,
    commands: [],
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
        let mut v = Value::new();
        push_uint(&mut v, 0x0102_0304_0506, 6);
        assert_eq!(v.as_slice(), Some(&[6, 5, 4, 3, 2, 1][..]));
        assert_eq!(uint(&v.bytes[..6]), 0x0102_0304_0506);
        // A layout longer than any writes is refused, not truncated.
        v.extend_from_slice(&[0; 19]);
        assert_eq!(v.as_slice(), None);
    }
}
