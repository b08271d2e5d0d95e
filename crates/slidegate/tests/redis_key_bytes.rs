//! Bytes per identity in Redis with the production key layout (the default
//! prefix, a hashed API key under a short rule name), and what becomes of
//! the keys the layout before wrote (32 hex digits).
//!
//! Memory is the `used_memory` delta of `N` fresh identities on a fresh
//! server, against the same identities' keys in the layout before and
//! against the shortest key Redis holds in its smallest allocation (the
//! floor of one string key with an expiry). Run with `--nocapture` for the
//! figures (BENCHMARKS.md, "Bytes per identity in Redis").
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use slidegate::{
    Algorithm, Identity, IdentityHasher, Limit, ManualClock, Quota, RedisOptions, RedisStore, Source,
    TimeSource,
};
use slidegate_test_redis::RedisServer;
use support::{admin, Decide, T0};

/// Identities per measurement, as in BENCHMARKS.md's `bench redis`
/// command: dict tables of 32,768 buckets.
const N: usize = 20_000;
/// Decisions in flight while filling.
const TASKS: usize = 8;

fn hasher() -> IdentityHasher {
    IdentityHasher::new(b"the instance secret")
}

/// The `i`-th API key's identity under the rule `api`.
fn identity(i: usize) -> Identity {
    hasher().identity("api", Source::ApiKey, format!("key-{i}").as_bytes())
}

fn limit() -> Limit {
    Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100).expect("valid"))
}

/// The key the layout before wrote for `identity` under `limit()`: the
/// digest in 32 hex digits.
fn hex_key(identity: &Identity) -> String {
    format!("slidegate:{{api:k:{}}}:swc:100:60000", identity.digest())
}

async fn used_memory(server: &RedisServer) -> i64 {
    // The incremental rehash of a growing table holds both tables until it
    // ends; the server's cron finishes it within a few ms of idle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let info: String =
        redis::cmd("INFO").arg("memory").query_async(&mut admin(server).await).await.expect("INFO memory");
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Whether `server` is what the size classes below are Redis's on: Redis
/// 7.0 with jemalloc (Debian 12's, CI's). Another server or allocator
/// spends other sizes (Valkey 8.0 holds the same base64 key in 163.5 B).
async fn sized_as_redis_7_0(server: &RedisServer) -> (bool, String) {
    let mut conn = admin(server).await;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.expect("INFO server");
    let memory: String = redis::cmd("INFO").arg("memory").query_async(&mut conn).await.expect("INFO memory");
    let field = |text: &str, name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)).unwrap_or("?").trim().to_owned()
    };
    let (version, allocator) = (field(&info, "redis_version:"), field(&memory, "mem_allocator:"));
    let valkey = info.lines().any(|line| line.starts_with("valkey_version:"));
    let sized = version.starts_with("7.0.") && allocator.starts_with("jemalloc") && !valkey;
    (sized, format!("redis_version {version}, {allocator}{}", if valkey { ", Valkey" } else { "" }))
}

/// A store with the production default prefix on `clock`.
async fn store(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    // Deadlines for two busy cores: this test is about bytes, not time.
    let options = RedisOptions::new().with_timeout(Duration::from_secs(5));
    RedisStore::connect_with(&server.url(), options)
        .await
        .expect("connect to the spawned redis-server")
        .with_time_source(TimeSource::Client(Arc::new(clock.clone())))
}

/// `used_memory` per identity after one decision for each of `N` identities.
async fn bytes_through_the_store() -> f64 {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 30_000);
    let store = store(&server, &clock).await;
    let before = used_memory(&server).await;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..N).step_by(TASKS) {
                assert!(store.decide_one(&identity(i), &limit(), 1).await.expect("decides").allowed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let after = used_memory(&server).await;
    (after - before) as f64 / N as f64
}

/// `used_memory` per key after `SET <key> <12 bytes> PX 120000` for the
/// keys `name` gives: the state the script writes, under another name.
async fn bytes_of_keys(name: impl Fn(usize) -> String) -> f64 {
    let server = RedisServer::spawn();
    let mut conn = admin(&server).await;
    let before = used_memory(&server).await;
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.cmd("SET").arg(name(i)).arg(&[7u8; 12][..]).arg("PX").arg(120_000).ignore();
        }
        let () = pipe.query_async(&mut conn).await.expect("SET");
    }
    let after = used_memory(&server).await;
    (after - before) as f64 / N as f64
}

/// The new layout costs one jemalloc size class less than the hex layout
/// (a 64-byte allocation for the 54-byte key's sds, 3 header bytes and a
/// NUL, instead of 80 for 64 bytes); the shortest key (12 bytes: a 16-byte
/// sds) shows what no key layout goes below: a dict entry and an expires
/// entry, the value's object and string, the key's sds, two tables' buckets.
///
/// Those sizes are Redis 7.0's with jemalloc, and asserted only there; on
/// another server the figures are printed, and what holds on every server
/// (the store writes what the bare keys hold) is asserted.
#[tokio::test]
async fn the_base64_layout_saves_a_size_class_per_identity() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 30_000);
    let names = store(&server, &clock).await;
    let key = |i: usize| names.keys_for(&identity(i), &limit()).remove(0);
    assert_eq!(key(0).len(), 54, "{}", key(0));
    assert_eq!(hex_key(&identity(0)).len(), 64);
    let stored = bytes_through_the_store().await;
    let base64 = bytes_of_keys(key).await;
    let hex = bytes_of_keys(|i| hex_key(&identity(i))).await;
    let floor = bytes_of_keys(|i| format!("{i:012}")).await;
    println!(
        "bytes per identity: through the store {stored:.1}, base64 keys {base64:.1}, hex keys {hex:.1}, 12-byte keys {floor:.1}"
    );
    let (sized, server_is) = sized_as_redis_7_0(&server).await;
    if sized {
        assert!((hex - base64 - 16.0).abs() < 1.5, "base64 {base64:.1} B against {hex:.1} B for hex");
        assert!((base64 - floor - 48.0).abs() < 1.5, "base64 {base64:.1} B, floor {floor:.1} B");
    } else {
        println!("size classes not asserted: they are Redis 7.0's with jemalloc, and this is {server_is}");
    }
    // The scripts' own writes: the same keys, values within a few bytes.
    assert!((stored - base64).abs() < 8.0, "through the store {stored:.1} B, base64 keys {base64:.1} B");
}

/// The upgrade path: a key the layout before wrote is neither read nor
/// written, so the identity starts afresh under its new key, and the old key
/// keeps its TTL and goes away by itself.
#[tokio::test]
async fn a_key_in_the_hex_layout_is_left_to_expire() {
    let server = RedisServer::spawn();
    let clock = ManualClock::new(T0 + 30_000);
    let store = store(&server, &clock).await;
    let mut conn = admin(&server).await;
    let who = identity(1);
    let old = hex_key(&who);
    // The state the script left before the upgrade: 100 of 100 used in this
    // window (window number, current and previous count, 4 bytes each).
    let window = u32::try_from((T0 + 30_000) / 60_000 % (1 << 32)).expect("32 bits");
    let state: Vec<u8> = [window, 100, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let () = redis::cmd("SET")
        .arg(&old)
        .arg(&state)
        .arg("PX")
        .arg(90_000)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let tight = Limit::new(Algorithm::SlidingWindowCounter, Quota::per_minute(100).expect("valid"));
    let decision = store.decide_one(&who, &tight, 1).await.expect("decides");
    assert!(decision.allowed, "the old key is not read");
    assert_eq!(decision.remaining, 99);
    let new = &store.keys_for(&who, &tight)[0];
    assert_ne!(new, &old);
    assert_eq!(new.len(), old.len() - 10);
    let untouched: Vec<u8> = redis::cmd("GET").arg(&old).query_async(&mut conn).await.expect("GET");
    assert_eq!(untouched, state, "the old key is not written");
    let ttl: i64 = redis::cmd("PTTL").arg(&old).query_async(&mut conn).await.expect("PTTL");
    assert!((80_000..=90_000).contains(&ttl), "the old key keeps its TTL: {ttl}");
}
