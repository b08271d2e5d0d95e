//! Shared by the Redis test binaries: stores on a spawned server, limits.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use slidegate::{Algorithm, Limit, ManualClock, Quota, RedisStore, TimeSource};
use slidegate_test_redis::RedisServer;

mod decide;
pub use decide::*;

/// A realistic "now" (2023-11-14T22:13:20Z), on a whole second: windows of 1 s start here.
pub const T0: u64 = 1_700_000_000_000;

/// `n` permits per `ms` milliseconds under `algorithm`.
pub fn limit(algorithm: Algorithm, n: u64, ms: u64) -> Limit {
    Limit::new(algorithm, Quota::new(n, Duration::from_millis(ms)).expect("valid test quota"))
}

/// A key prefix no other store in this process uses, so tests sharing a
/// server never see each other's keys.
pub fn unique_prefix(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("t{}-{name}:", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A store on `server` deciding on `clock`'s time, under a fresh prefix.
pub async fn client_time_store(server: &RedisServer, clock: &ManualClock, name: &str) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .expect("connect to the spawned redis-server")
        .with_prefix(unique_prefix(name))
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())))
        // Not the 250 ms a production call waits: a case filling a table of
        // 10,000 entries on a loaded machine is a slow case, not a failure.
        .with_timeout(std::time::Duration::from_secs(10))
}

/// A plain connection for inspecting the server (SCAN, PTTL, SCRIPT FLUSH).
///
/// Without redis-rs's default 500 ms response timeout: a test's `WAIT`, `SAVE`
/// or `DEBUG LOADAOF` on a loaded machine can take longer; a test waits up to
/// a minute for its own server.
pub async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
        .set_response_timeout(Some(std::time::Duration::from_secs(60)));
    redis::Client::open(server.url())
        .expect("valid url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect to the spawned redis-server")
}

/// Every key on the server, with its PTTL.
pub async fn keys_with_pttl(server: &RedisServer) -> Vec<(String, i64)> {
    let mut conn = admin(server).await;
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("COUNT").arg(1000).query_async(&mut conn).await.expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.expect("PTTL");
        out.push((key, pttl));
    }
    out
}
