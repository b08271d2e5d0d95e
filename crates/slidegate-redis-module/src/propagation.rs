//! Whether a write's effects must be propagated, or Redis would drop them.
//!
//! Redis hands a propagated command to the AOF and to the replication
//! stream, and drops it when neither takes it: AOF off and, on a master, no
//! replication backlog and no replica (`shouldPropagate` in Redis's
//! `server.c`, 7.0). Building the `SET` for `RedisModule_Replicate` costs
//! about a quarter of a decision's instructions (the command is looked up
//! by name and every argument becomes an object, to be freed unread), so the
//! module skips it exactly when Redis would drop it:
//!
//! - AOF is asked on every call (`REDISMODULE_CTX_FLAGS_AOF`, set from the
//!   moment `appendonly` is turned on, before the rewrite's fork).
//! - A backlog appears only when a replica syncs (`SYNC` or `PSYNC`, which a
//!   command filter sees before it runs) or with a change of role (this
//!   server became a replica, or a replica was promoted with the backlog it
//!   had). Either marks replication as possible **for good**; so does a
//!   backlog, a replica or the replica role already there when the module
//!   loads, and any doubt (an answer the module cannot read).
//!
//! So a master that has never had a replica and writes no AOF builds no
//! `SET`; one that has, propagates every write with its absolute expiry, as
//! before. A replica attaching later gets the skipped writes in its initial
//! snapshot, as it gets every key.
#![cfg_attr(test, allow(dead_code))]

use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, Status};

/// Whether a replica may be fed, now or later. `true` until the module has
/// made sure at load that no replica ever synced.
static REPLICATION: AtomicBool = AtomicBool::new(true);

/// Whether a write made under `ctx` must be propagated.
pub fn needed(ctx: *mut raw::RedisModuleCtx) -> bool {
    if REPLICATION.load(Ordering::Relaxed) {
        return true;
    }
    // SAFETY: bound when the module loads; `ctx` is the running command's.
    let flags = unsafe { raw::RedisModule_GetContextFlags.map_or(-1, |f| f(ctx)) };
    flags & raw::REDISMODULE_CTX_FLAGS_AOF as c_int != 0
}

/// Watches for replicas (a command filter, a role-change event), then looks
/// at the replication state once.
pub fn init(ctx: &Context) -> Status {
    // SAFETY: called from OnLoad with its context; the callbacks are plain
    // functions that live as long as the module.
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.map_or(std::ptr::null_mut(), |register| {
            register(ctx.ctx, Some(watch_sync), raw::REDISMODULE_CMDFILTER_NOSELF as c_int)
        })
    };
    let role_changed =
        raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, dataver: 1 };
    // SAFETY: as above.
    let subscribed = unsafe {
        raw::RedisModule_SubscribeToServerEvent.map_or(raw::REDISMODULE_ERR as c_int, |subscribe| {
            subscribe(ctx.ctx, role_changed, Some(role_changed_now))
        })
    };
    if filter.is_null() || subscribed != raw::REDISMODULE_OK as c_int {
        // Without the watchers every write is propagated: correct, only slower.
        ctx.log_warning("slidegate: cannot watch for replicas; every write is propagated");
        return Status::Ok;
    }
    if never_replicated(ctx) {
        REPLICATION.store(false, Ordering::Relaxed);
    }
    Status::Ok
}

/// `INFO replication` says master, no replica, no backlog.
fn never_replicated(ctx: &Context) -> bool {
    // SAFETY: OnLoad's context; the info is read, then freed once.
    unsafe {
        let (Some(get), Some(free), Some(field_c), Some(field_signed)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_FreeServerInfo,
            raw::RedisModule_ServerInfoGetFieldC,
            raw::RedisModule_ServerInfoGetFieldSigned,
        ) else {
            return false;
        };
        let info = get(ctx.ctx, c"replication".as_ptr());
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
        free(ctx.ctx, info);
        never
    }
}

/// The command filter: marks replication possible before a `SYNC` or
/// `PSYNC` runs (one atomic load per command once marked).
extern "C" fn watch_sync(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if REPLICATION.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: Redis calls the filter with the command's context; argument 0
    // is the command name, a string alive while the filter runs.
    let name =
        unsafe { raw::RedisModule_CommandFilterArgGet.map_or(std::ptr::null_mut(), |get| get(fctx, 0)) };
    if name.is_null() {
        return;
    }
    let name = crate::string_bytes(name);
    if name.eq_ignore_ascii_case(b"psync") || name.eq_ignore_ascii_case(b"sync") {
        REPLICATION.store(true, Ordering::Relaxed);
    }
}

/// The role-change event: this server became a replica or was promoted.
extern "C" fn role_changed_now(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut std::ffi::c_void,
) {
    REPLICATION.store(true, Ordering::Relaxed);
}
