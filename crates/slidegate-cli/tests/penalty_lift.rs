//! `DELETE /v1/penalty/{id}`: a lift on one instance's admin listener frees
//! a blocked client on every instance sharing the Redis, the deny caches
//! included; hostile ids, paths, rules and methods get a clear 4xx.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
use slidegate_test_redis::RedisServer;

const TOKEN: &str = "end-to-end-secret";

/// Two rules with a penalty (a block of 10 minutes after 3 denials), one
/// without; an admin listener behind the token.
fn config(upstream: &Upstream, redis: &RedisServer) -> String {
    config_with_window(upstream, redis, "1m")
}

/// The same, the login limit's window `window` long.
fn config_with_window(upstream: &Upstream, redis: &RedisServer, window: &str) -> String {
    format!(
        r#"{head}
[[rules]]
name = "login"
path = "/login"
limits = [{{ limit = 2, window = "{window}", algorithm = "sliding_window_counter" }}]
penalty = {{ after = 3, within = "1m", block = "10m" }}

[[rules]]
name = "search"
path = "/search"
limits = [{{ limit = 2, window = "1m", algorithm = "sliding_window_counter" }}]
penalty = {{ after = 3, within = "1m", block = "10m" }}

[[rules]]
name = "plain"
path = "/plain"
limits = [{{ limit = 1, window = "1m" }}]
"#,
        head = keyed_head(
            upstream.addr,
            &format!("admin_listen = \"127.0.0.1:0\"\ncheck_token_env = \"{SECRET_ENV}\""),
            &format!("[store]\nurl = \"{}\"\n", redis.url()),
        ),
    )
}

fn key(sg: &Slidegate, path: &str) -> Reply {
    sg.get(path, &[("x-api-key", "abuser-key")])
}

fn blocked(reply: &Reply) -> bool {
    reply.status == 429 && reply.body.contains("abnormal-usage-detected")
}

/// The full id `identity hash --full` prints for the abuser's key.
fn abuser_id(sg: &Slidegate) -> String {
    full_key_id(&sg.config_path(), "abuser-key")
}

fn delete(sg: &Slidegate, target: &str, token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    request(sg.admin_addr(), "DELETE", target, &headers, b"")
}

/// Blocks the abuser on `sg` under "login": 2 allowed, 3 denied, then blocked.
fn block_on(sg: &Slidegate) {
    let statuses: Vec<u16> = (0..5).map(|_| key(sg, "/login").status).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert!(blocked(&key(sg, "/login")), "the 4th denial blocks");
}

#[test]
fn a_lift_on_one_instance_frees_the_client_on_both() {
    let upstream = Upstream::start();
    let redis = RedisServer::spawn();
    // A short window: once lifted, the limit itself has room again soon.
    let a = Slidegate::start(&config_with_window(&upstream, &redis, "2s"));
    let b = Slidegate::start(&config_with_window(&upstream, &redis, "2s"));
    block_on(&a);
    // b hears of the block from Redis and caches it.
    assert!(blocked(&key(&b, "/login")));
    assert!(blocked(&key(&b, "/login")));
    let hits = b.metric_at(b.admin_addr(), "slidegate_deny_cache_hits_total");
    assert!(hits >= 1.0, "b answers the block from its cache: {hits}");
    let offenders = get(a.admin_addr(), "/v1/offenders", &[]);
    let id = abuser_id(&a);
    assert!(offenders.body.contains(&format!("\"id\":\"{id}\"")), "{}", offenders.body);

    let reply = delete(&a, &format!("/v1/penalty/{id}"), Some(TOKEN));
    assert_eq!(reply.status, 204, "{reply:?}");
    assert_eq!(reply.body, "");
    // a forgot at once; b within a poll (1 s) of the lift. Each answers a
    // plain denial now (the limit is still spent), not the block: two
    // denials, fewer than the penalty's `after`, so no new block.
    let plain = key(&a, "/login");
    assert!(plain.status == 429 && !blocked(&plain), "a no longer answers the block: {plain:?}");
    wait_for("b to forget the lifted block", Duration::from_secs(5), || !blocked(&key(&b, "/login")));
    // Once the 2 s limit has room, both serve the client: a 10 minute
    // block would still refuse it.
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(key(&a, "/login").status, 200);
    assert_eq!(key(&b, "/login").status, 200);
    assert_eq!(a.metric_at(a.admin_addr(), "slidegate_penalty_lifts_total"), 1.0);
    assert!(b.metric_at(b.admin_addr(), "slidegate_penalty_lifts_applied_total") >= 1.0);

    // Nothing left to lift: 404 with a problem.
    let again = delete(&a, &format!("/v1/penalty/{id}"), Some(TOKEN));
    assert_eq!(again.status, 404, "{again:?}");
    assert_eq!(again.header("content-type"), Some("application/problem+json"));
    assert!(again.body.contains(&format!("{id} is not blocked under any rule")), "{again:?}");
}

#[test]
fn a_lift_of_one_rule_leaves_the_others_blocked() {
    let upstream = Upstream::start();
    let redis = RedisServer::spawn();
    let a = Slidegate::start(&config(&upstream, &redis));
    block_on(&a);
    let statuses: Vec<u16> = (0..5).map(|_| key(&a, "/search").status).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert!(blocked(&key(&a, "/search")));
    let id = abuser_id(&a).to_uppercase().replacen("K:", "k:", 1).replacen(':', "%3A", 1);
    let reply = delete(&a, &format!("/v1/penalty/{id}?rule=search"), Some(TOKEN));
    assert_eq!(reply.status, 204, "{reply:?}");
    assert!(!blocked(&key(&a, "/search")), "search is lifted");
    assert!(blocked(&key(&a, "/login")), "login is not");
}

#[test]
fn hostile_lifts_get_a_clear_error() {
    let upstream = Upstream::start();
    let redis = RedisServer::spawn();
    let a = Slidegate::start(&config(&upstream, &redis));
    block_on(&a);
    let id = abuser_id(&a);
    let no_token = delete(&a, &format!("/v1/penalty/{id}"), None);
    assert_eq!(no_token.status, 401, "{no_token:?}");
    assert_eq!(no_token.header("www-authenticate"), Some("Bearer"));
    assert_eq!(delete(&a, &format!("/v1/penalty/{id}"), Some("wrong")).status, 401);
    let hex = "0".repeat(32);
    let huge = format!("/v1/penalty/k:{}", "a".repeat(6000));
    let cases: [(String, u16, &str); 11] = [
        (format!("/v1/penalty/k:{}", &hex[..31]), 400, "expected k:<32 hex digits>"),
        (format!("/v1/penalty/k:{}g", &hex[..31]), 400, "expected k:<32 hex digits>"),
        (format!("/v1/penalty/n:{hex}"), 400, "expected k:<32 hex digits>"),
        (format!("/v1/penalty/{hex}"), 400, "expected k:<32 hex digits>"),
        ("/v1/penalty/".to_owned(), 400, "expected /v1/penalty/{id}"),
        ("/v1/penalty".to_owned(), 400, "expected /v1/penalty/{id}"),
        (huge, 400, "expected k:<32 hex digits>"),
        (format!("/v1/penalty/{id}?rule=nope"), 400, "no rule is named \\\"nope\\\""),
        (format!("/v1/penalty/{id}?rule=plain"), 400, "rule \\\"plain\\\" has no [rules.penalty]"),
        (format!("/v1/penalty/{id}?limit=3"), 400, "takes only ?rule=NAME"),
        (format!("/v1/penalty/ip:{hex}"), 404, "is not blocked under any rule"),
    ];
    for (target, status, says) in &cases {
        let reply = delete(&a, target, Some(TOKEN));
        assert_eq!(reply.status, *status, "{target}: {reply:?}");
        assert!(reply.body.contains(says), "{target}: {reply:?} should say {says}");
    }
    let get_reply = get(a.admin_addr(), &format!("/v1/penalty/{id}"), &[("authorization", "Bearer x")]);
    assert_eq!(get_reply.status, 405, "{get_reply:?}");
    assert_eq!(get_reply.header("allow"), Some("DELETE"));
    // None of them lifted anything.
    assert!(blocked(&key(&a, "/login")));
}

/// With Redis stalled (SIGSTOP) and then gone, a lift answers 503 within the
/// store's deadline and lifts nothing; the background poll's failures never
/// open the breaker the requests' path relies on.
#[test]
fn a_lift_while_redis_is_out_answers_503() {
    let upstream = Upstream::start();
    let mut redis = RedisServer::spawn();
    let a = Slidegate::start(&config(&upstream, &redis));
    block_on(&a);
    let id = abuser_id(&a);
    redis.pause();
    let stalled = delete(&a, &format!("/v1/penalty/{id}"), Some(TOKEN));
    assert_eq!(stalled.status, 503, "{stalled:?}");
    assert!(stalled.body.contains("the store failed") && stalled.body.contains("retry"), "{stalled:?}");
    // Several polls time out meanwhile.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(a.metric_at(a.admin_addr(), "slidegate_breaker_opened_total"), 0.0);
    assert_eq!(a.metric_at(a.admin_addr(), "slidegate_store_timeouts_total"), 0.0);
    redis.resume();
    redis.kill();
    let gone = delete(&a, &format!("/v1/penalty/{id}"), Some(TOKEN));
    assert_eq!(gone.status, 503, "{gone:?}");
    assert_eq!(a.metric_at(a.admin_addr(), "slidegate_penalty_lifts_total"), 0.0);
}
