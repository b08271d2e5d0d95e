//! `SLIDEGATE.DECIDE`, `SLIDEGATE.DECIDE_ALL`, `SLIDEGATE.LEASE` and
//! `SLIDEGATE.GIVE_BACK`: slidegate's decisions and quota leases as native
//! Redis commands.
//!
//! The arithmetic is `slidegate::algorithm`'s own (the functions the memory
//! store runs); this crate only translates between those states and the
//! values the Lua scripts keep in Redis (`store/redis/*.lua`), so a key
//! written by a script is read by the module and the other way round. The
//! translation lives in `stored.rs`, one function per algorithm.
//!
//! ```text
//! SLIDEGATE.DECIDE <key> <args>
//! SLIDEGATE.DECIDE_ALL <key>... <args>
//! SLIDEGATE.LEASE <key> <args>
//! SLIDEGATE.GIVE_BACK <key> <algorithm> <limit> <window> <permits> <deadline>
//! ```
//!
//! `<args>` is `decide_all.lua`'s `ARGV[1]`: little-endian doubles, now in ms
//! since the epoch (or -1 for the server's clock), then per key the
//! algorithm's number (its place in `Algorithm::ALL`, from 1), limit, window
//! in ms and cost, then optionally the caller's deadline in ms on the
//! server's clock (told by the length). The reply is the scripts' 32 bytes
//! per key: allowed (1|0), remaining, reset_after ms, retry_after ms (-1
//! when allowed); a call the server reaches after its deadline writes
//! nothing and answers the error `EXPIRED <server ms>`, as the scripts do.
//! `DECIDE_ALL` decides every limit before it writes any, and writes none
//! if one denies (the others then report a cost-0 peek), as the script and
//! the memory store do. Both commands declare their keys (the first; the
//! first to the one before last), so Redis Cluster routes them, and
//! answers `MOVED` or `CROSSSLOT` before anything runs.
//!
//! `LEASE` and `GIVE_BACK` are `lease.lua` and `give_back.lua` (quota
//! leases, `docs/leases.md`), for the fixed window and the sliding window
//! counter only. `LEASE` takes `DECIDE`'s arguments, decides and writes as
//! `DECIDE` does, and replies `lease.lua`'s five doubles: the decision, then
//! the number of the window it was decided in, modulo 2^32. `GIVE_BACK`
//! takes `give_back.lua`'s five decimal integers (1 for the counter or 2
//! for the fixed window, the limit, that window number, the unused
//! permits, the deadline or -1) and replies the permits it gave back: from
//! that window's count, or the counter's previous count once the stored
//! window is the next one, never below zero, nothing otherwise; the value
//! is rewritten in place with its expiry kept, and a missing key is never
//! created. Both refuse a call reached after its deadline as the scripts
//! do, and leave exactly the bytes the scripts leave.
//!
//! Replication carries effects, never the decision: a write (a lease's, a
//! give-back's too) is propagated as
//! `SET key value PXAT <absolute ms>` (or `KEEPTTL` where the script keeps the
//! TTL), so a replica or an AOF replay neither re-decides on another clock
//! nor needs the module loaded; where Redis would drop it (no AOF, no
//! replica ever), it is not built, though the write still counts toward the
//! RDB save points (`propagation.rs`). The sliding log (a
//! sorted set) is left to the Lua scripts: the commands answer it with an
//! error the store never provokes.
//!
//! The files, from the wire to Redis: `wire.rs` (arguments and reply),
//! `layout.rs` (the scripts' byte layouts), `stored.rs` (each algorithm's
//! stored value and decision), `clock.rs`, `key.rs` (reading and writing a
//! key), `propagation.rs` (what a write sends to replicas and the AOF),
//! `commands.rs` (the handlers and their registration).
//!
//! The crate takes the workspace's lints but for one: `unsafe` is denied
//! rather than forbidden, and allowed function by function where the FFI
//! needs it: a Redis module talks to the server through its C API, and the
//! calls `redis-module` does not wrap safely (the command handlers,
//! replicating a command, the server clock, raw key values, absolute
//! expiry, the replication watchers) are made directly, each with a
//! `SAFETY` note. The need is measured: a decision
//! costs 0.08–0.14× the article's script's instructions with no replica,
//! 0.16–0.25× with one, against about the same as the script in Lua
//! (BENCHMARKS.md, "Native Redis module").

mod clock;
mod commands;
mod key;
mod layout;
mod propagation;
mod stored;
mod strings;
mod wire;

/// The module's entry point (`RedisModule_OnLoad`), generated. Not in unit
/// tests: the module's allocator is Redis's, which a test binary lacks.
#[cfg(not(test))]
#[allow(unsafe_code)]
mod entry {
    use crate::commands::register_commands;

    redis_module::redis_module! {
        name: "slidegate",
        version: 4,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: register_commands,
        commands: [],
    }
}
