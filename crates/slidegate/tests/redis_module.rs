//! The native module (`crates/slidegate-redis-module`) behind `RedisStore`:
//! the conformance cases and the stores-agree traces on a server that loads
//! it, interop with the Lua scripts on one key, engine detection, and
//! replication of its effects to a replica that does not load it.
//!
//! The module's `.so` is taken from `SLIDEGATE_REDIS_MODULE` when set, else
//! from this build's target directory (`cargo build -p
//! slidegate-redis-module` puts it there); when it is missing, the test
//! builds it into a target directory of its own (the running `cargo test`
//! holds the lock of the main one).
#![cfg(feature = "redis")]

mod agree_cases;
mod support;
#[macro_use]
mod conformance_cases;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use proptest::test_runner::{Config, TestRunner};
use slidegate::{Algorithm, Engine, ManualClock, MemoryStore, RedisOptions, RedisStore, Store, TimeSource};
use slidegate_test_redis::RedisServer;

const LIB: &str = "libslidegate_redis_module.so";

/// The module's shared library, built once per test binary when missing.
fn module_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("SLIDEGATE_REDIS_MODULE") {
            return PathBuf::from(path);
        }
        // <target>/<profile>/deps/<this test>
        let exe = std::env::current_exe().expect("the test's own path");
        let profile_dir =
            exe.parent().and_then(Path::parent).expect("a test runs from <target>/<profile>/deps");
        let built = profile_dir.join(LIB);
        if built.exists() {
            return built;
        }
        let target = profile_dir.parent().expect("<target>").join("module-test");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .args(["build", "-p", "slidegate-redis-module", "--target-dir"])
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p slidegate-redis-module");
        assert!(status.success(), "cargo build -p slidegate-redis-module failed");
        target.join("debug").join(LIB)
    })
}

fn module_server() -> RedisServer {
    let path = module_path();
    let path = path.to_str().expect("a UTF-8 module path");
    // MODULE UNLOAD in a test needs the MODULE command enabled.
    RedisServer::spawn_with_args(&["--loadmodule", path, "--enable-module-command", "yes"])
}

/// A store forced onto the module (a server without it fails every decision,
/// so these tests cannot pass on the scripts by accident).
async fn module_store(server: &RedisServer) -> RedisStore {
    RedisStore::connect_with(&server.url(), RedisOptions::default().with_engine(Engine::Module))
        .await
        .expect("connect to the spawned redis-server")
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod conformance {
            use slidegate::{ManualClock, TimeSource};
            use std::sync::Arc;
            $(
                #[tokio::test]
                async fn $case() {
                    let server = crate::module_server();
                    let clock = ManualClock::new(crate::support::T0);
                    let store = crate::module_store(&server)
                        .await
                        .with_prefix(crate::support::unique_prefix(stringify!($case)))
                        .with_time_source(TimeSource::Client(Arc::new(clock.clone())));
                    crate::conformance_cases::$case(&store, &clock).await;
                }
            )*
        }
    };
}

with_conformance_cases!(conformance);

/// The stores-agree traces, single decisions by the module and `decide_all`
/// by the Lua script on the same keys: they interoperate call by call.
#[test]
fn memory_and_module_decide_identically() {
    let server = module_server();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let redis = runtime.block_on(module_store(&server));
    let admin = runtime.block_on(support::admin(&server));
    let mut config = Config::with_cases(256);
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config);
    let case = AtomicUsize::new(0);
    let result = runner.run(&agree_cases::trace(), |trace| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(agree_cases::replay(&redis, &admin, "", case, &trace))
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
}

/// Lua and the module alternating on one key decide as the memory store does.
#[tokio::test]
async fn lua_and_module_share_keys() {
    let server = module_server();
    let clock = ManualClock::new(support::T0);
    let time = TimeSource::Client(Arc::new(clock.clone()));
    let module = module_store(&server).await.with_prefix("mix:").with_time_source(time.clone());
    let lua = module.clone().with_engine(Engine::Lua);
    let memory = MemoryStore::with_clock(clock.clone());
    let mut step = 0u64;
    for algorithm in Algorithm::ALL {
        for (n, ms) in [(5, 1000), (3, 250), (5_000_000_000, 2000)] {
            // The layouts for limits of 2^32 and more; the sliding log keeps no such count.
            if algorithm == Algorithm::SlidingLog && n > 1000 {
                continue;
            }
            let limit = support::limit(algorithm, n, ms);
            for i in 0..40u64 {
                step += 1;
                clock.advance(Duration::from_millis(step * 37 % 190));
                let cost = [1, 0, 2, 1, n][(i % 5) as usize].min(n);
                let redis = if i % 2 == 0 { &module } else { &lua };
                let want = memory.decide("id", &limit, cost).await.expect("memory decides");
                let got = redis.decide("id", &limit, cost).await.expect("redis decides");
                assert_eq!(got, want, "{limit}, call {i}, cost {cost}");
            }
        }
    }
}

/// `INFO commandstats` calls of `cmd` (lower case) so far.
async fn calls(server: &RedisServer, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut support::admin(server).await)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn auto_uses_the_module_where_loaded_and_lua_elsewhere() {
    let limit = support::limit(Algorithm::SlidingWindowCounter, 10, 1000);
    let with = module_server();
    let store = RedisStore::connect(&with.url()).await.expect("connect");
    assert!(store.decide("a", &limit, 1).await.expect("decides").allowed);
    assert_eq!(calls(&with, "slidegate.decide").await, 1);
    assert_eq!(calls(&with, "evalsha").await, 0);

    let without = RedisServer::spawn();
    let store = RedisStore::connect(&without.url()).await.expect("connect");
    assert!(store.decide("a", &limit, 1).await.expect("decides").allowed);
    assert_eq!(calls(&without, "evalsha").await, 1);

    // Forced onto a module the server lacks: an error, not a silent fallback.
    let forced =
        RedisStore::connect_with(&without.url(), RedisOptions::default().with_engine(Engine::Module))
            .await
            .expect("connect");
    assert!(forced.decide("a", &limit, 1).await.is_err());
}

#[tokio::test]
async fn after_a_module_unload_auto_falls_back_to_lua() {
    let limit = support::limit(Algorithm::SlidingWindowCounter, 10, 60_000);
    let server = module_server();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    assert!(store.decide("a", &limit, 1).await.expect("decides").allowed);
    // A MODULE UNLOAD under the live connection: the next call gets
    // "unknown command", which ran nothing, and goes to Lua.
    let _: () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("slidegate")
        .query_async(&mut support::admin(&server).await)
        .await
        .expect("MODULE UNLOAD");
    let d = store.decide("a", &limit, 1).await.expect("decides by Lua");
    assert_eq!(d.remaining, 8);
    assert_eq!(calls(&server, "evalsha").await, 1);
}

/// Effects replication: a replica WITHOUT the module holds the same value and
/// the same absolute expiry as the master after module decisions.
#[tokio::test]
async fn a_replica_without_the_module_gets_the_same_value_and_expiry() {
    let master = module_server();
    let replica = RedisServer::spawn_with_args(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    let mut master_conn = support::admin(&master).await;
    let mut replica_conn = support::admin(&replica).await;
    // Wait for the initial sync: the master counts a connected replica.
    for _ in 0..200 {
        let n: i64 = redis::cmd("WAIT").arg(0).arg(10).query_async(&mut master_conn).await.expect("WAIT");
        if n >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let store = module_store(&master).await;
    for algorithm in
        [Algorithm::SlidingWindowCounter, Algorithm::FixedWindow, Algorithm::TokenBucket, Algorithm::Gcra]
    {
        let limit = support::limit(algorithm, 10, 60_000);
        for _ in 0..3 {
            assert!(store.decide("r", &limit, 1).await.expect("decides").allowed);
        }
        let key = &store.keys_for("r", &limit)[0];
        let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query_async(&mut master_conn).await.expect("WAIT");
        assert_eq!(n, 1, "the replica acknowledged");
        let read = |conn: &mut redis::aio::MultiplexedConnection| {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                let value: Vec<u8> = redis::cmd("GET").arg(&key).query_async(&mut conn).await.expect("GET");
                let at: i64 =
                    redis::cmd("PEXPIRETIME").arg(&key).query_async(&mut conn).await.expect("PEXPIRETIME");
                (value, at)
            }
        };
        let (on_master, on_replica) = (read(&mut master_conn).await, read(&mut replica_conn).await);
        assert!(on_master.1 > 0, "{algorithm}: the key expires");
        assert_eq!(on_master, on_replica, "{algorithm}");
    }
}
