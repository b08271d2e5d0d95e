//! The commands: their handlers, registered directly with Redis, and what
//! each does with the keys it declares.
#![cfg_attr(test, allow(dead_code))]

use std::ffi::{c_int, CStr};

use redis_module::{raw, Context, RedisError};

use crate::clock::Clock;
use crate::key::OpenKey;
use crate::stored::{self, decide};
use crate::strings::string_bytes;
use crate::wire::{
    decision_bytes, lease_bytes, parse_give_back, parse_limit, split_args, Args, DECISION_BYTES, LEASE_BYTES,
    LIMIT_BYTES,
};

/// What a command replies: one decision (on the stack), several, a lease,
/// or a count.
enum Reply {
    One([u8; DECISION_BYTES]),
    All(Vec<u8>),
    Lease([u8; LEASE_BYTES]),
    Count(u64),
}

/// `SLIDEGATE.DECIDE <key> <args>`: one limit.
fn decide_one(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    args: &[u8],
) -> Result<Reply, RedisError> {
    let split = split_args(args, 1)?;
    let a = parse_limit(split.limits)?;
    let clock = Clock::read(split.client_now)?;
    clock.check_deadline(split.deadline)?;
    let mut key = OpenKey::open(ctx, name);
    let (decision, write) = decide(key.value()?, clock.now, &a)?;
    if let Some(write) = write {
        key.write(ctx, &write, &clock)?;
    }
    key.keep(ctx, &clock, reset_ms(&decision))?;
    Ok(Reply::One(decision_bytes(&decision)))
}

/// `SLIDEGATE.DECIDE_ALL <key>... <args>`: several limits of one identity,
/// all or nothing, as `decide_all.lua` and the memory store decide them.
/// Every limit is decided before any is written; if one denies, nothing is
/// written and the limits that had room report the state without this
/// request (a cost-0 peek).
fn decide_all(
    ctx: *mut raw::RedisModuleCtx,
    names: &[*mut raw::RedisModuleString],
    args: &[u8],
) -> Result<Reply, RedisError> {
    let split = split_args(args, names.len())?;
    let limits = split.limits.chunks_exact(LIMIT_BYTES).map(parse_limit).collect::<Result<Vec<_>, _>>()?;
    let clock = Clock::read(split.client_now)?;
    clock.check_deadline(split.deadline)?;
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
        key.keep(ctx, &clock, reset_ms(decision))?;
        reply.extend_from_slice(&decision_bytes(decision));
    }
    Ok(Reply::All(reply))
}

/// `SLIDEGATE.LEASE <key> <args>`: `lease.lua`. The arguments are
/// `SLIDEGATE.DECIDE`'s (they name the algorithm, which `lease.lua`, one
/// script per algorithm, needs not), the decision and its write exactly
/// `DECIDE`'s; the reply adds the window the permits were charged in.
fn lease_one(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    args: &[u8],
) -> Result<Reply, RedisError> {
    let split = split_args(args, 1)?;
    let a = parse_limit(split.limits)?;
    let clock = Clock::read(split.client_now)?;
    clock.check_deadline(split.deadline)?;
    let mut key = OpenKey::open(ctx, name);
    let (decision, write, window) = stored::lease(key.value()?, clock.now, &a)?;
    if let Some(write) = write {
        key.write(ctx, &write, &clock)?;
    }
    key.keep(ctx, &clock, reset_ms(&decision))?;
    Ok(Reply::Lease(lease_bytes(&decision, window)))
}

/// `SLIDEGATE.GIVE_BACK <key> <algorithm> <limit> <window> <permits> <deadline>`:
/// `give_back.lua`, with its arguments and its reply (the permits given
/// back). A missing key gives nothing and is not created; a written one is
/// rewritten in place, keeping its expiry, and propagated as `SET … KEEPTTL`.
fn give_back(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    args: [&[u8]; 5],
) -> Result<Reply, RedisError> {
    let args = parse_give_back(args)?;
    let clock = Clock::read(None)?;
    clock.check_deadline(args.deadline)?;
    let mut key = OpenKey::open(ctx, name);
    let Some(value) = key.value()? else {
        return Ok(Reply::Count(0));
    };
    let (back, write) = stored::give_back(value, args.leased, args.limit, args.window, args.unused)?;
    if let Some(write) = write {
        key.write(ctx, &write, &clock)?;
    }
    Ok(Reply::Count(back))
}

/// A decision's `reset_after` in ms: how much longer its state matters.
fn reset_ms(d: &slidegate::Decision) -> u64 {
    u64::try_from(d.reset_after.as_millis()).unwrap_or(u64::MAX)
}

/// Replies with `result`: the decisions' bytes, the count, or the error.
fn respond(ctx: *mut raw::RedisModuleCtx, result: Result<Reply, RedisError>) -> c_int {
    let bytes =
        |bytes: &[u8]| raw::reply_with_string_buffer(ctx, bytes.as_ptr().cast(), bytes.len()) as c_int;
    match result {
        Ok(Reply::One(reply)) => bytes(&reply),
        Ok(Reply::All(reply)) => bytes(&reply),
        Ok(Reply::Lease(reply)) => bytes(&reply),
        Ok(Reply::Count(n)) => raw::reply_with_long_long(ctx, i64::try_from(n).unwrap_or(i64::MAX)) as c_int,
        Err(err) => Context::new(ctx).reply(Err(err)) as c_int,
    }
}

/// The command's arguments as Redis hands them over.
///
/// # Safety
/// `argv` points to `argc` strings alive until the command returns.
#[allow(unsafe_code)]
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

/// What a command does with its arguments (the command's name first), as
/// Redis hands them over.
type Run = fn(*mut raw::RedisModuleCtx, &[*mut raw::RedisModuleString]) -> Result<Reply, RedisError>;

/// `SLIDEGATE.DECIDE`: one key, one argument string.
fn decide_run(
    ctx: *mut raw::RedisModuleCtx,
    args: &[*mut raw::RedisModuleString],
) -> Result<Reply, RedisError> {
    match *args {
        [_, key, args] => decide_one(ctx, key, string_bytes(args)),
        _ => Err(RedisError::WrongArity),
    }
}

/// `SLIDEGATE.DECIDE_ALL`: one key or more, then one argument string.
fn decide_all_run(
    ctx: *mut raw::RedisModuleCtx,
    args: &[*mut raw::RedisModuleString],
) -> Result<Reply, RedisError> {
    match args {
        [_, keys @ .., args] if !keys.is_empty() => decide_all(ctx, keys, string_bytes(*args)),
        _ => Err(RedisError::WrongArity),
    }
}

/// `SLIDEGATE.LEASE`: one key, one argument string.
fn lease_run(
    ctx: *mut raw::RedisModuleCtx,
    args: &[*mut raw::RedisModuleString],
) -> Result<Reply, RedisError> {
    match *args {
        [_, key, args] => lease_one(ctx, key, string_bytes(args)),
        _ => Err(RedisError::WrongArity),
    }
}

/// `SLIDEGATE.GIVE_BACK`: one key, then kind, limit, window, unused and deadline.
fn give_back_run(
    ctx: *mut raw::RedisModuleCtx,
    args: &[*mut raw::RedisModuleString],
) -> Result<Reply, RedisError> {
    match *args {
        [_, key, kind, limit, window, unused, deadline] => {
            give_back(ctx, key, [kind, limit, window, unused, deadline].map(string_bytes))
        }
        _ => Err(RedisError::WrongArity),
    }
}

/// The one command handler Redis calls, for each command its [`Run`]
/// (`RUN` names it; a `const` parameter, so each command is its own
/// handler with no lookup). Registered directly rather than through
/// `redis_module`'s wrapper, which retains every argument as a module
/// string in a fresh `Vec` first.
#[allow(unsafe_code)]
extern "C" fn handler<const RUN: usize>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: Redis calls a command handler with its argv and argc.
    let args = unsafe { arguments(argv, argc) };
    respond(ctx, (COMMANDS[RUN].run)(ctx, args))
}

/// A command: its name, what it runs, and its last key's position (`-2`:
/// the one before the last argument).
struct Command {
    name: &'static CStr,
    run: Run,
    last_key: c_int,
}

/// Every command, in the order `handler`'s `RUN` numbers them.
const COMMANDS: [Command; 4] = [
    Command { name: c"slidegate.decide", run: decide_run, last_key: 1 },
    Command { name: c"slidegate.decide_all", run: decide_all_run, last_key: -2 },
    Command { name: c"slidegate.lease", run: lease_run, last_key: 1 },
    Command { name: c"slidegate.give_back", run: give_back_run, last_key: 1 },
];

/// At load: registers the commands with the keys they declare, which Redis
/// Cluster routes by (`MOVED`, `ASK`, `CROSSSLOT`) and ACL key patterns
/// check (one key for `DECIDE`, `LEASE` and `GIVE_BACK`; for `DECIDE_ALL`
/// every argument from the first to the one before last), then the
/// replication watchers.
#[allow(unsafe_code)]
pub fn register_commands(ctx: &Context, _args: &[redis_module::RedisString]) -> redis_module::Status {
    type Handler = extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;
    let handlers: [Handler; COMMANDS.len()] = [handler::<0>, handler::<1>, handler::<2>, handler::<3>];
    for (Command { name, last_key, .. }, handler) in COMMANDS.iter().zip(handlers) {
        let (name, last_key) = (*name, *last_key);
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
    crate::propagation::init(ctx)
}
