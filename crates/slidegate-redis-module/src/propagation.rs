//! Whether a write's effects must be propagated, or Redis would drop them,
//! and propagating them: the `SET`, or only the count of a change.
//!
//! Redis hands a propagated command to the AOF and to the replication
//! stream, and drops it when neither takes it: AOF off and, on a master, no
//! replication backlog and no replica (`shouldPropagate` in Redis's
//! `server.c`, 7.0). Building the `SET` for `RedisModule_Replicate` costs
//! about a third of a decision's instructions (the command is looked up by
//! name and every argument becomes an object, to be freed unread), so the
//! module skips it exactly when Redis would drop it:
//!
//! - AOF is read at the first write after the module loaded and after every
//!   load of data (`REDISMODULE_CTX_FLAGS_AOF`, set from the moment
//!   `appendonly` is turned on, before the rewrite's fork) and kept: outside
//!   a replica's sync (a change of role, watched below), only `CONFIG SET
//!   appendonly` turns it on or off at run time. The command filter sees
//!   that command before it runs (queued in a `MULTI`, or called by another
//!   module, too), and from then on AOF is asked on every call, for good, as
//!   it was before the cache (`RM_GetContextFlags`: 131 instructions a
//!   call, the largest item the module added to a write).
//! - A backlog appears when a replica syncs (`SYNC` or `PSYNC`, which a
//!   command filter sees before it runs), with a change of role (this
//!   server became a replica, or a replica was promoted with the backlog it
//!   had), or when data is loaded from an RDB file that carries replication
//!   state (a master restarted with `--loadmodule` loads the module first,
//!   then the file, and keeps a backlog so that its replicas can resume).
//!   The first two mark replication as possible **for good**; `INFO
//!   replication` is read at the first write after the module loaded and
//!   after every load of data (no command runs while loading), and a
//!   replica, a backlog or the replica role found there marks it too, as
//!   does any doubt (an answer the module cannot read, a watcher it could
//!   not register).
//!
//! So a master that has never had a replica and writes no AOF builds no
//! `SET`; one that has, propagates every write with its absolute expiry, as
//! before. A replica attaching later gets the skipped writes in its initial
//! snapshot, as it gets every key. A skipped write is still counted toward
//! the RDB save points (`count_change`), which Redis counts for a module
//! only where it replicates: with `RedisModule_ReplicateVerbatim`, which
//! names no command. Where the skip applies Redis drops the verbatim
//! command unread (the same `shouldPropagate` test); were the skip ever
//! misjudged, a replica would get the decision itself rather than nothing
//! (it would re-decide it, or fail it without the module): neither is
//! right, and the judgement is what the tests cover (a replica attaching
//! after skipped writes, AOF turned on, a master restarted from its RDB).
#![cfg_attr(test, allow(dead_code))]

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use redis_module::{raw, Context, RedisError, Status};

use crate::wire::WRITE_FAILED;

/// A replica synced or the role changed since the module loaded: for good.
static REPLICATION: AtomicBool = AtomicBool::new(false);
/// The last read of `INFO replication` found a replica, a backlog or the
/// replica role, or could not be made.
static BACKLOG: AtomicBool = AtomicBool::new(true);
/// `BACKLOG` was read since the module loaded and since data was last loaded.
static READ: AtomicBool = AtomicBool::new(false);
/// What is known of the AOF: one of `AOF_UNREAD`, `AOF_OFF`, `AOF_ON`, `AOF_ASK`.
static AOF: AtomicU8 = AtomicU8::new(AOF_UNREAD);
/// Not read since the module loaded or data was last loaded.
const AOF_UNREAD: u8 = 0;
/// Read off, and no `CONFIG SET appendonly` seen since.
const AOF_OFF: u8 = 1;
/// Read on, and no `CONFIG SET appendonly` seen since.
const AOF_ON: u8 = 2;
/// A `CONFIG SET appendonly` was seen: asked on every call, for good.
const AOF_ASK: u8 = 3;

/// Whether a write made under `ctx` must be propagated.
#[allow(unsafe_code)]
pub fn needed(ctx: *mut raw::RedisModuleCtx) -> bool {
    if REPLICATION.load(Ordering::Relaxed) {
        return true;
    }
    if !READ.swap(true, Ordering::Relaxed) {
        BACKLOG.store(!never_replicated(ctx), Ordering::Relaxed);
    }
    if BACKLOG.load(Ordering::Relaxed) {
        return true;
    }
    match AOF.load(Ordering::Relaxed) {
        AOF_OFF => false,
        AOF_ON => true,
        AOF_ASK => aof_on(ctx),
        _ => {
            let on = aof_on(ctx);
            // Unless a `CONFIG SET appendonly` was seen meanwhile (it cannot
            // be: the filter and the commands run on Redis's main thread).
            let known = if on { AOF_ON } else { AOF_OFF };
            let _ = AOF.compare_exchange(AOF_UNREAD, known, Ordering::Relaxed, Ordering::Relaxed);
            on
        }
    }
}

/// Whether the AOF is on (or being turned on) as the server says now.
#[allow(unsafe_code)]
fn aof_on(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: bound when the module loads; `ctx` is the running command's.
    let flags = unsafe { raw::RedisModule_GetContextFlags.map_or(-1, |f| f(ctx)) };
    flags & raw::REDISMODULE_CTX_FLAGS_AOF as c_int != 0
}

/// Registers the watchers: a command filter, the role-change and loading events.
#[allow(unsafe_code)]
pub fn init(ctx: &Context) -> Status {
    // SAFETY: called from OnLoad with its context; the callbacks are plain
    // functions that live as long as the module.
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.map_or(std::ptr::null_mut(), |register| {
            register(ctx.ctx, Some(watch_sync), raw::REDISMODULE_CMDFILTER_NOSELF as c_int)
        })
    };
    let subscribe = |id: u64, callback: raw::RedisModuleEventCallback| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: as above.
        unsafe {
            raw::RedisModule_SubscribeToServerEvent
                .map_or(raw::REDISMODULE_ERR as c_int, |subscribe| subscribe(ctx.ctx, event, callback))
        }
    };
    let role = subscribe(raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, Some(role_changed));
    let loading = subscribe(raw::REDISMODULE_EVENT_LOADING, Some(loading_changed));
    let ok = raw::REDISMODULE_OK as c_int;
    if filter.is_null() || role != ok || loading != ok {
        // Without the watchers every write is propagated: correct, only slower.
        REPLICATION.store(true, Ordering::Relaxed);
        ctx.log_warning("slidegate: cannot watch for replicas; every write is propagated");
    }
    Status::Ok
}

/// `INFO replication` says master, no replica, no backlog.
#[allow(unsafe_code)]
fn never_replicated(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: a command's context; the info is read, then freed once.
    unsafe {
        let (Some(get), Some(free), Some(field_c), Some(field_signed)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_FreeServerInfo,
            raw::RedisModule_ServerInfoGetFieldC,
            raw::RedisModule_ServerInfoGetFieldSigned,
        ) else {
            return false;
        };
        let info = get(ctx, c"replication".as_ptr());
        if info.is_null() {
            return false;
        }
        let role = field_c(info, c"role".as_ptr());
        let master = !role.is_null() && CStr::from_ptr(role) == c"master";
        let zero = |field: &CStr| {
            let mut err = 0;
            let n = field_signed(info, field.as_ptr(), &mut err);
            err == 0 && n == 0
        };
        let never = master && zero(c"connected_slaves") && zero(c"repl_backlog_active");
        free(ctx, info);
        never
    }
}

/// The command filter: marks replication possible before a `SYNC` or
/// `PSYNC` runs, and the AOF to be asked per call before a `CONFIG SET`
/// that names `appendonly` runs (one atomic load per command once both
/// are marked).
#[allow(unsafe_code)]
extern "C" fn watch_sync(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let replication = REPLICATION.load(Ordering::Relaxed);
    let aof_asked = AOF.load(Ordering::Relaxed) == AOF_ASK;
    if replication && aof_asked {
        return;
    }
    let arg = |i: c_int| {
        // SAFETY: Redis calls the filter with the command's context; an
        // argument is a string alive while the filter runs, null past the last.
        let arg =
            unsafe { raw::RedisModule_CommandFilterArgGet.map_or(std::ptr::null_mut(), |get| get(fctx, i)) };
        (!arg.is_null()).then(|| crate::strings::string_bytes(arg))
    };
    let Some(name) = arg(0) else {
        return;
    };
    if !replication && (name.eq_ignore_ascii_case(b"psync") || name.eq_ignore_ascii_case(b"sync")) {
        REPLICATION.store(true, Ordering::Relaxed);
    }
    if !aof_asked
        && name.eq_ignore_ascii_case(b"config")
        && arg(1).is_some_and(|sub| sub.eq_ignore_ascii_case(b"set"))
        && (2..).map_while(arg).step_by(2).any(|param| param.eq_ignore_ascii_case(b"appendonly"))
    {
        AOF.store(AOF_ASK, Ordering::Relaxed);
    }
}

/// The role-change event: this server became a replica or was promoted.
extern "C" fn role_changed(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    REPLICATION.store(true, Ordering::Relaxed);
}

/// The loading event (at start, `DEBUG RELOAD`, a replica's sync): the
/// next write reads `INFO replication` (and the AOF) again, once loading
/// is over and a master restarted from its RDB file has made the backlog it
/// keeps for its replicas.
extern "C" fn loading_changed(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    READ.store(false, Ordering::Relaxed);
    for known in [AOF_OFF, AOF_ON] {
        let _ = AOF.compare_exchange(known, AOF_UNREAD, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Counts one change toward the RDB save points (`server.dirty`) without
/// building the write's `SET`, for a write nothing receives (see
/// [`needed`]). Redis counts a module's changes only where it replicates;
/// `RedisModule_ReplicateVerbatim` counts one without looking a command up
/// by name or building an argument (53 instructions, against 2,112 for
/// `RedisModule_Replicate` of `PING`), and hands the running command to `alsoPropagate`,
/// which drops it unread: [`needed`] is false exactly where Redis's
/// `shouldPropagate` is (no AOF, no backlog, no replica). So a server that
/// persists by `save` points alone still snapshots the limiter's state, as
/// it does a script's writes.
#[allow(unsafe_code)]
pub fn count_change(ctx: *mut raw::RedisModuleCtx) -> Result<(), RedisError> {
    // SAFETY: bound once when the module loads, read-only afterwards.
    let verbatim = unsafe { raw::RedisModule_ReplicateVerbatim }.ok_or(WRITE_FAILED)?;
    // SAFETY: `ctx` is the running command's.
    let status = unsafe { verbatim(ctx) };
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
#[allow(unsafe_code)]
pub fn replicate_set(
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

/// Propagates a lengthened expiry as `PEXPIREAT <key> <at>`.
#[allow(unsafe_code)]
pub fn replicate_expire(
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleString,
    at: i64,
) -> Result<(), RedisError> {
    // SAFETY: bound once when the module loads, read-only afterwards.
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(WRITE_FAILED)?;
    // SAFETY: the key is an argument of the running command and lives
    // across the call; the C strings are NUL-terminated literals.
    let status = unsafe { replicate(ctx, c"PEXPIREAT".as_ptr(), c"sl".as_ptr(), key, at) };
    if status == raw::REDISMODULE_OK as i32 {
        Ok(())
    } else {
        Err(WRITE_FAILED)
    }
}
