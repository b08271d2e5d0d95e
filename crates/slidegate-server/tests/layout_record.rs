//! The layout record when Redis is down as `serve` starts: the check is made
//! when the store first connects, and a store whose settings differ from the
//! record never decides.

use std::time::Duration;

use slidegate::{
    Algorithm, Charge, Identity, Layout, Limit, Quota, RedisOptions, RedisStore, RedisTarget, Request, Store,
    StoreError, Unavailable,
};
use slidegate_server::{AnyStore, LazyRedis, LAYOUT_RECORD_MIN};
use slidegate_test_redis::RedisServer;

async fn decide(store: &AnyStore) -> Result<(), StoreError> {
    let limit = Limit::new(Algorithm::FixedWindow, Quota::per_minute(5).expect("a quota"));
    let identity = Identity::named("t", "alice");
    store.decide(Request::new(&identity, &[Charge::new(limit, 1)])).await.map(|_| ())
}

#[tokio::test]
async fn a_store_connecting_after_start_is_refused_by_another_layouts_record() {
    let mut redis = RedisServer::spawn();
    redis.kill();
    let options = RedisOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_layout(Layout::packed_for(1_000));
    let target = RedisTarget::Single(redis.url());
    let (lazy, error) = LazyRedis::connect_to(target, "test".into(), None, options, LAYOUT_RECORD_MIN).await;
    assert!(error.is_some(), "Redis is down");
    redis.restart();
    // Meanwhile an instance keeping a key per identity started and recorded it.
    let other = RedisStore::connect(&redis.url()).await.expect("connect");
    other.record_layout(LAYOUT_RECORD_MIN).await.expect("the first record");
    let store = AnyStore::Redis(lazy.clone());
    // Each decision asks for a connect in the background; every one is
    // refused by the record, so none decides.
    for _ in 0..60 {
        match decide(&store).await {
            Err(StoreError::Unavailable(Unavailable::NotConnected(_))) => {}
            other => panic!("a store in another layout decided: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!lazy.is_connected());
    // With the same settings as the record, the same sequence connects.
    let options = RedisOptions::new().with_connect_timeout(Duration::from_millis(500));
    let target = RedisTarget::Single(redis.url());
    let (same, error) = LazyRedis::connect_to(target, "test".into(), None, options, LAYOUT_RECORD_MIN).await;
    assert!(error.is_none(), "{error:?}");
    decide(&AnyStore::Redis(same)).await.expect("decided");
}
