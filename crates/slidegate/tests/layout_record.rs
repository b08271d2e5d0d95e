//! One layout per prefix: the first store records its layout and bucket
//! count under the prefix, and a store with other settings is refused,
//! naming both, instead of counting apart from it.
#![cfg(feature = "redis")]

use std::time::Duration;

use slidegate::{Buckets, Layout, RedisStore, StoreError, Unavailable};
use slidegate_test_redis::RedisServer;

const HOUR: Duration = Duration::from_secs(3600);

/// Each test has its own server; prefixes tell the stores of one test apart.
fn unique_prefix(name: &str) -> String {
    format!("{name}:")
}

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("valid url");
    client.get_multiplexed_async_connection().await.expect("connect to the spawned redis-server")
}

fn packed(buckets: u32) -> Layout {
    Layout::Packed(Buckets::new(buckets).expect("a power of two"))
}

async fn store(server: &RedisServer, prefix: &str, layout: Layout) -> RedisStore {
    RedisStore::connect(&server.url()).await.expect("connect").with_prefix(prefix).with_layout(layout)
}

/// The conflict `record_layout` refused with, as its message.
fn conflict(result: Result<(), StoreError>) -> String {
    match result {
        Err(StoreError::Unavailable(Unavailable::LayoutConflict(conflict))) => conflict.to_string(),
        other => panic!("expected a layout conflict, got {other:?}"),
    }
}

async fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(&mut admin(server).await).await.expect("PTTL")
}

#[tokio::test]
async fn packed_and_per_key_on_one_prefix_are_refused_naming_both() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("mixed");
    let first = store(&server, &prefix, packed(1024)).await;
    first.record_layout(HOUR).await.expect("the first store records its layout");
    let message = conflict(store(&server, &prefix, Layout::PerKey).await.record_layout(HOUR).await);
    assert!(
        message.starts_with(&format!(
            "the prefix's layout is recorded in Redis as packed (1024 buckets) (key {prefix}layout), \
             but this store is per_key:"
        )),
        "{message}"
    );
    assert!(message.contains("use a new prefix"), "{message}");
    assert!(message.contains(&format!("DEL {prefix}layout")), "{message}");
    // And the other way round.
    let other = unique_prefix("mixed-again");
    store(&server, &other, Layout::PerKey).await.record_layout(HOUR).await.expect("recorded");
    let message = conflict(store(&server, &other, packed(1024)).await.record_layout(HOUR).await);
    assert!(message.contains("recorded in Redis as per_key"), "{message}");
    assert!(message.contains("this store is packed (1024 buckets)"), "{message}");
}

#[tokio::test]
async fn packed_with_other_bucket_counts_are_refused() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("buckets");
    // expected_identities 20,000 and 1,000.
    let (many, few) = (Layout::packed_for(20_000), Layout::packed_for(1_000));
    store(&server, &prefix, many).await.record_layout(HOUR).await.expect("recorded");
    let message = conflict(store(&server, &prefix, few).await.record_layout(HOUR).await);
    assert!(message.contains("recorded in Redis as packed (1024 buckets)"), "{message}");
    assert!(message.contains("this store is packed (32 buckets)"), "{message}");
}

#[tokio::test]
async fn same_settings_share_a_prefix_and_other_prefixes_are_apart() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("same");
    let a = store(&server, &prefix, packed(32)).await;
    let b = store(&server, &prefix, packed(32)).await;
    a.record_layout(HOUR).await.expect("first");
    b.record_layout(HOUR).await.expect("same settings");
    a.record_layout(HOUR).await.expect("again");
    let elsewhere = unique_prefix("elsewhere");
    store(&server, &elsewhere, Layout::PerKey).await.record_layout(HOUR).await.expect("another prefix");
    let value: String = redis::cmd("GET")
        .arg(format!("{prefix}layout"))
        .query_async(&mut admin(&server).await)
        .await
        .expect("GET");
    assert_eq!(value, "packed 32");
}

#[tokio::test]
async fn a_live_store_renews_the_record_and_a_gone_one_lets_it_expire() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("renew");
    let key = format!("{prefix}layout");
    let a = store(&server, &prefix, Layout::PerKey).await;
    a.record_layout(Duration::from_secs(60)).await.expect("recorded");
    let first = pttl(&server, &key).await;
    assert!((59_000..=60_000).contains(&first), "{first}");
    a.record_layout(HOUR).await.expect("renewed");
    let renewed = pttl(&server, &key).await;
    assert!((3_599_000..=3_600_000).contains(&renewed), "{renewed}");
    // A shorter renewal never shortens the record another store renewed.
    a.record_layout(Duration::from_secs(60)).await.expect("renewed");
    assert!(pttl(&server, &key).await > 3_500_000);
    // Once it expired (every store gone that long), other settings may start.
    let _: () =
        redis::cmd("PEXPIRE").arg(&key).arg(1).query_async(&mut admin(&server).await).await.expect("PEXPIRE");
    tokio::time::sleep(Duration::from_millis(20)).await;
    store(&server, &prefix, packed(4)).await.record_layout(HOUR).await.expect("a fresh start");
}

#[tokio::test]
async fn a_hostile_record_is_a_clear_error() {
    let server = RedisServer::spawn();
    let mut conn = admin(&server).await;
    // Not a string: refused, naming the key's type and the way out.
    let prefix = unique_prefix("hash");
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}layout"))
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    match store(&server, &prefix, Layout::PerKey).await.record_layout(HOUR).await {
        Err(StoreError::Unavailable(Unavailable::Incompatible(message))) => {
            assert!(message.contains(&format!("the layout record {prefix}layout holds a hash")), "{message}");
        }
        other => panic!("expected an incompatible record, got {other:?}"),
    }
    // Garbage, long and binary: a conflict quoting (a cut of) it.
    let prefix = unique_prefix("junk");
    let junk = format!("\u{1b}[31m{}", "x".repeat(500));
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}layout"))
        .arg(&junk)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let message = conflict(store(&server, &prefix, Layout::PerKey).await.record_layout(HOUR).await);
    assert!(message.contains(r#"an unknown record "\u{1b}[31mxxx"#), "{message}");
    assert!(message.len() < 700, "{message}");
    // A record written by hand without expiry gets one when renewed.
    let prefix = unique_prefix("forever");
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}layout"))
        .arg("per_key")
        .query_async(&mut conn)
        .await
        .expect("SET");
    store(&server, &prefix, Layout::PerKey).await.record_layout(HOUR).await.expect("the same layout");
    assert!(pttl(&server, &format!("{prefix}layout")).await > 3_500_000);
}
