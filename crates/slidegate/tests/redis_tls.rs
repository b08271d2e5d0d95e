//! Credentials and TLS: a password and an ACL user (from the URL or from
//! `RedisOptions::with_credentials`), `rediss://` with a given CA; wrong
//! credentials and an untrusted certificate fail with a clear error.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use slidegate::{Algorithm, RedisOptions, RedisStore, RedisTarget, StoreError};
use slidegate_test_redis::SecuredRedis;
use support::{id, limit, Decide};

fn options() -> RedisOptions {
    RedisOptions::new().with_timeout(Duration::from_secs(2)).with_connect_timeout(Duration::from_secs(2))
}

async fn connect(url: &str, options: RedisOptions) -> Result<RedisStore, StoreError> {
    RedisStore::connect_to(&RedisTarget::Single(url.to_owned()), options).await
}

async fn decides(store: &RedisStore, what: &str) {
    let l = limit(Algorithm::SlidingWindowCounter, 2, 1000);
    let first = store.decide_one(&id(what), &l, 1).await.unwrap_or_else(|e| panic!("{what}: {e}"));
    // Two charges, so the multi-limit script runs too (the second is a peek).
    let peek = limit(Algorithm::FixedWindow, 2, 1000);
    let all =
        store.decide_all(&id(what), &[(l, 1), (peek, 0)]).await.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(first.allowed && all[0].allowed && all[0].remaining == 0, "{what}: {first:?} {all:?}");
}

fn assert_mentions(err: &StoreError, words: &[&str], what: &str) {
    eprintln!("{what}: {err}");
    let text = err.to_string().to_lowercase();
    assert!(words.iter().any(|w| text.contains(w)), "{what}: {err} mentions none of {words:?}");
}

#[tokio::test]
async fn passwords_and_acl_users_log_in_and_wrong_ones_are_refused() {
    let redis = SecuredRedis::builder().password("pw").user("limiter", "lpw", "~* +@all").start();
    let plain = format!("redis://127.0.0.1:{}/", redis.port());

    decides(&connect(&redis.url(), options()).await.expect("password in the URL"), "url-password").await;
    decides(
        &connect(&redis.url_with(Some("limiter"), "lpw"), options()).await.expect("ACL user in the URL"),
        "url-acl",
    )
    .await;
    let given = options().with_credentials(None, Some("pw".to_owned()));
    decides(&connect(&plain, given).await.expect("password in the options"), "options-password").await;
    let user = options().with_credentials(Some("limiter".to_owned()), Some("lpw".to_owned()));
    decides(&connect(&plain, user.clone()).await.expect("ACL user in the options"), "options-acl").await;
    // The options override the URL's credentials.
    let stale = redis.url_with(Some("limiter"), "old");
    decides(&connect(&stale, user).await.expect("options over the URL"), "override").await;

    let none = connect(&plain, options()).await.expect_err("no credentials");
    assert_mentions(&none, &["auth"], "no credentials");
    let wrong = connect(&redis.url_with(None, "nope"), options()).await.expect_err("wrong password");
    assert_mentions(&wrong, &["wrongpass", "password", "auth"], "wrong password");
    let wrong_user = options().with_credentials(Some("limiter".to_owned()), Some("nope".to_owned()));
    let wrong = connect(&plain, wrong_user).await.expect_err("wrong ACL password");
    assert_mentions(&wrong, &["wrongpass", "password", "auth"], "wrong ACL password");
}

#[tokio::test]
async fn rediss_with_the_ca_decides_and_without_it_fails_on_the_certificate() {
    let redis = SecuredRedis::builder().tls().password("pw").user("limiter", "lpw", "~* +@all").start();
    let ca = redis.ca_cert().expect("a TLS server has a CA").to_path_buf();
    assert!(redis.url().starts_with("rediss://"), "{}", redis.url());

    let trusted = options().with_tls_ca(ca.clone());
    decides(&connect(&redis.url(), trusted.clone()).await.expect("rediss:// with the CA"), "tls").await;
    let acl = trusted.with_credentials(Some("limiter".to_owned()), Some("lpw".to_owned()));
    decides(&connect(&redis.url(), acl).await.expect("rediss:// with the CA and an ACL user"), "tls-acl")
        .await;

    let untrusted = connect(&redis.url(), options()).await.expect_err("the test CA is not a system root");
    assert_mentions(&untrusted, &["certificate", "unknownissuer", "tls"], "without the CA");

    let missing = options().with_tls_ca(ca.with_file_name("no-such-ca.crt"));
    let err = connect(&redis.url(), missing).await.expect_err("a missing CA file");
    assert_mentions(&err, &["no-such-ca.crt"], "missing CA file");
}
