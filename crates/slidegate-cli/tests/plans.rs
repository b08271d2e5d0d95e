//! Plans against the real binary: keys in the plans file get their plan's
//! limits (and the plan's policy names in the headers), unknown keys the
//! default plan, requests without a key the rule's own; a reload moves a key
//! to another plan; a broken keys file is reported by its own line.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A rule of 5 a minute; plans `free` (2 a minute) and `pro` (100 a minute)
/// on it; unknown keys on `free`; keys in `keys`.
fn planned(upstream: &Upstream, store: &str, keys: &Path, secret: bool) -> String {
    let secret = if secret { format!("ip_hash_secret_env = \"{SECRET_ENV}\"\n") } else { String::new() };
    format!(
        r#"{head}
[identity]
api_key_header = "x-api-key"
{secret}plans_file = "{keys}"
default_plan = "free"

[[rules]]
name = "search"
path = "/search"
limits = [{{ limit = 5, window = "60s", algorithm = "sliding_window_counter" }}]

[[rules]]
name = "other"
path = "/other"
limits = [{{ limit = 7, window = "60s", algorithm = "sliding_window_counter" }}]

[[plans]]
name = "free"
limits.search = [{{ limit = 2, window = "60s", algorithm = "sliding_window_counter" }}]

[[plans]]
name = "pro"
limits.search = [{{ limit = 100, window = "60s", algorithm = "sliding_window_counter" }}]
"#,
        head = config_head(upstream.addr, "admin_on_public = true", store),
        keys = keys.display(),
    )
}

/// A keys file with `text`, in a directory of its own.
fn keys_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.txt");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn as_key(sg: &Slidegate, path: &str, key: &str) -> Reply {
    sg.get(path, &[("x-api-key", key)])
}

/// `RateLimit-Policy` and the `r=` of `RateLimit`.
fn policy(reply: &Reply) -> (String, u64) {
    assert_eq!(reply.status, 200, "{reply:?}");
    let r = remaining(reply).unwrap_or_else(|| panic!("no RateLimit: {reply:?}"));
    (reply.header("ratelimit-policy").unwrap().to_owned(), r)
}

fn owned(policy: &str, r: u64) -> (String, u64) {
    (policy.to_owned(), r)
}

#[test]
fn keys_get_their_plans_limits_and_unknown_keys_the_default_plan() {
    let upstream = Upstream::start();
    let (_dir, keys) = keys_file("# customers\nsk-alice pro\nsk-bob free\n");
    let sg = Slidegate::start(&planned(&upstream, "", &keys, false));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-alice")), owned("\"pro-search\";q=100;w=60", 99));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-alice")), owned("\"pro-search\";q=100;w=60", 98));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-bob")), owned("\"free-search\";q=2;w=60", 1));
    // Not in the file: the default plan, counted under its own key.
    assert_eq!(policy(&as_key(&sg, "/search", "sk-mallory")), owned("\"free-search\";q=2;w=60", 1));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-mallory")), owned("\"free-search\";q=2;w=60", 0));
    let refused = as_key(&sg, "/search", "sk-mallory");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("ratelimit-policy"), Some("\"free-search\";q=2;w=60"));
    // No key: the rule's own limit. A rule no plan names: its own limit.
    assert_eq!(policy(&sg.get("/search", &[])), owned("\"search\";q=5;w=60", 4));
    assert_eq!(policy(&as_key(&sg, "/other", "sk-alice")), owned("\"other\";q=7;w=60", 6));
    assert_eq!(upstream.hits(), 7);
    assert!(!sg.log.lock().unwrap().contains("sk-alice"), "no key is logged");
}

/// A key given as its hash (`slidegate identity hash --full`) is the same
/// key; on Redis, with the secret every instance shares.
#[test]
fn a_key_given_as_its_hash_gets_its_plan_on_redis() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = redis_decides(&redis);
    let (dir, keys) = keys_file("");
    let config = planned(&upstream, &store, &keys, true);
    let config_path = dir.path().join("slidegate.toml");
    std::fs::write(&config_path, &config).unwrap();
    let hash = full_key_id(&config_path, "sk-carol");
    std::fs::write(&keys, format!("{hash} pro\n")).unwrap();
    let sg = Slidegate::start(&config);
    assert_eq!(policy(&as_key(&sg, "/search", "sk-carol")), owned("\"pro-search\";q=100;w=60", 99));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-dave")), owned("\"free-search\";q=2;w=60", 1));
}

/// A reload reads the keys file again: a key moved to another plan is
/// counted from zero under the new plan's limits (each limit keeps its own
/// counters), and moved back finds the count its old plan left.
#[test]
fn a_reload_moves_a_key_to_another_plan() {
    let upstream = Upstream::start();
    let (_dir, keys) = keys_file("sk-alice free\n");
    let sg = Slidegate::start(&planned(&upstream, "", &keys, false));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-alice")), owned("\"free-search\";q=2;w=60", 1));
    assert_eq!(policy(&as_key(&sg, "/search", "sk-alice")), owned("\"free-search\";q=2;w=60", 0));
    assert_eq!(as_key(&sg, "/search", "sk-alice").status, 429);

    std::fs::write(&keys, "sk-alice pro\n").unwrap();
    let answer = request(sg.addr, "POST", "/admin/reload", &[], b"");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(policy(&as_key(&sg, "/search", "sk-alice")), owned("\"pro-search\";q=100;w=60", 99));

    std::fs::write(&keys, "sk-alice free\n").unwrap();
    assert_eq!(request(sg.addr, "POST", "/admin/reload", &[], b"").status, 200);
    assert_eq!(as_key(&sg, "/search", "sk-alice").status, 429, "the free plan's count is where it was");
}

/// A broken keys file: `serve` refuses to start, naming the keys file's line
/// and column; a reload with one changes nothing and answers where it is wrong.
#[test]
fn a_broken_keys_file_is_reported_by_its_own_line() {
    let upstream = Upstream::start();
    let (_dir, keys) = keys_file("sk-alice pro\n\nsk-bob gold\n");
    let (_cdir, config) = write_config(&planned(&upstream, "", &keys, false));
    let out = Command::new(binary()).args(["serve", "--config"]).arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    let expected =
        format!("{}:3:8: unknown plan \"gold\": [[plans]] defines \"free\", \"pro\"", keys.display());
    assert!(err.contains(&expected), "{err}");
    assert!(!err.contains("sk-bob"), "the line's key is not printed: {err}");
    let check = Command::new(binary()).args(["check-config", "--config"]).arg(&config).output().unwrap();
    assert_eq!(check.status.code(), Some(64), "{check:?}");

    std::fs::write(&keys, "sk-alice pro\n").unwrap();
    let check = Command::new(binary()).args(["check-config", "--config"]).arg(&config).output().unwrap();
    assert!(check.status.success(), "{check:?}");
    let said = String::from_utf8(check.stdout).unwrap();
    assert!(said.contains("plan free (0 keys, the default): search: free-search = "), "{said}");
    assert!(said.contains("plan pro (1 keys): search: pro-search = "), "{said}");

    let sg = Slidegate::start(&planned(&upstream, "", &keys, false));
    std::fs::write(&keys, "sk-alice pro\nsk-alice free\n").unwrap();
    let answer = request(sg.addr, "POST", "/admin/reload", &[], b"");
    assert_eq!(answer.status, 422, "{answer:?}");
    let detail = format!("{}:2:1: this key is already mapped, at line 1: one line per key", keys.display());
    assert!(answer.body.contains(&detail), "{answer:?}");
    assert!(!answer.body.contains("sk-alice"), "the key is not echoed: {answer:?}");
    assert_eq!(policy(&as_key(&sg, "/search", "sk-alice")), owned("\"pro-search\";q=100;w=60", 99));
}

fn put_override(sg: &Slidegate, key: &str, body: &str) -> Reply {
    request(
        sg.addr,
        "PUT",
        &format!("/v1/overrides/{key}"),
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
}

fn search_policy(sg: &Slidegate, key: &str) -> String {
    as_key(sg, "/search", key).header("ratelimit-policy").unwrap_or_default().to_owned()
}

/// An override set on one instance applies on a second sharing the Redis
/// (within its next read of the table, about a second), ends at its expiry,
/// and a deleted one ends on both.
#[test]
fn an_override_set_on_one_instance_applies_on_another_and_expires_and_is_deleted() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = redis_decides(&redis);
    let (_dir, keys) = keys_file("sk-alice free\n");
    let config = planned(&upstream, &store, &keys, true);
    let (a, b) = (Slidegate::start(&config), Slidegate::start(&config));
    assert_eq!(search_policy(&b, "sk-alice"), "\"free-search\";q=2;w=60");

    let set = put_override(&a, "sk-alice", r#"{"plan": "pro"}"#);
    assert_eq!((set.status, set.body.as_str()), (200, r#"{"expires_in_ms":null,"plan":"pro"}"#), "{set:?}");
    // The instance that took it applies it at once.
    assert_eq!(policy(&as_key(&a, "/search", "sk-alice")), owned("\"pro-search\";q=100;w=60", 99));
    wait_for("the override on the second instance", Duration::from_secs(10), || {
        search_policy(&b, "sk-alice").starts_with("\"pro-search\"")
    });
    assert!(!a.log.lock().unwrap().contains("sk-alice") && !b.log.lock().unwrap().contains("sk-alice"));

    let deleted = request(b.addr, "DELETE", "/v1/overrides/sk-alice", &[], b"");
    assert_eq!((deleted.status, deleted.body.as_str()), (200, r#"{"deleted":true}"#), "{deleted:?}");
    wait_for("the deletion on the first instance", Duration::from_secs(10), || {
        search_policy(&a, "sk-alice").starts_with("\"free-search\"")
    });
    let again = request(b.addr, "DELETE", "/v1/overrides/sk-alice", &[], b"");
    assert_eq!(again.status, 404, "{again:?}");

    // An unknown key with an expiring override, given as its hash.
    let (_dir, config_path) = write_config(&config);
    let hash = full_key_id(&config_path, "sk-zoe");
    let set = put_override(&a, &hash, r#"{"plan": "pro", "expires_in": "2s"}"#);
    assert_eq!((set.status, set.body.as_str()), (200, r#"{"expires_in_ms":2000,"plan":"pro"}"#), "{set:?}");
    assert_eq!(policy(&as_key(&a, "/search", "sk-zoe")), owned("\"pro-search\";q=100;w=60", 99));
    wait_for("the override to expire", Duration::from_secs(15), || {
        search_policy(&b, "sk-zoe").starts_with("\"free-search\"")
            && search_policy(&a, "sk-zoe").starts_with("\"free-search\"")
    });
}

/// Bad overrides get a problem+json answer saying what was wrong, and change nothing.
#[test]
fn hostile_overrides_are_refused_with_a_problem() {
    let upstream = Upstream::start();
    let (_dir, keys) = keys_file("sk-alice free\n");
    let sg = Slidegate::start(&planned(&upstream, "", &keys, false));
    let long = "k".repeat(2000);
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        (
            "PUT",
            "/v1/overrides/sk-alice",
            r#"{"plan": "gold"}"#,
            422,
            "unknown plan \"gold\": the configuration's plans are \"free\", \"pro\"",
        ),
        ("PUT", "/v1/overrides/sk-alice", "{not json", 400, "malformed override: "),
        (
            "PUT",
            "/v1/overrides/sk-alice",
            r#"{"plan": "pro", "extra": 1}"#,
            400,
            "malformed override: unknown field `extra`",
        ),
        (
            "PUT",
            "/v1/overrides/sk-alice",
            r#"{"plan": "pro", "expires_in": "soon"}"#,
            400,
            "invalid expires_in: ",
        ),
        (
            "PUT",
            "/v1/overrides/sk-alice",
            r#"{"plan": "pro", "expires_in": "0s"}"#,
            400,
            "expires_in must be from 1ms to ten years",
        ),
        ("PUT", "/v1/overrides/", r#"{"plan": "pro"}"#, 400, "no key: expected /v1/overrides/{key}"),
        ("PUT", "/v1/overrides/sk%2Dalice", r#"{"plan": "pro"}"#, 400, "percent-escapes are not decoded"),
        ("PUT", "/v1/overrides/hash:12", r#"{"plan": "pro"}"#, 400, "invalid key hash"),
        (
            "PUT",
            &format!("/v1/overrides/{long}"),
            r#"{"plan": "pro"}"#,
            400,
            "the key is longer than 1024 bytes",
        ),
        (
            "POST",
            "/v1/overrides/sk-alice",
            r#"{"plan": "pro"}"#,
            405,
            "/v1/overrides/{key} expects PUT or DELETE",
        ),
    ];
    for (method, target, body, status, detail) in cases {
        let reply = request(sg.addr, method, target, &[], body.as_bytes());
        assert_eq!(reply.status, *status, "{method} {target} {body}: {reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{reply:?}");
        let problem: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        let said = problem["detail"].as_str().unwrap();
        assert!(said.starts_with(detail), "{method} {target} {body}: {said}");
    }
    let huge = format!(r#"{{"plan": "{}"}}"#, "p".repeat(10_000));
    assert_eq!(put_override(&sg, "sk-alice", &huge).status, 400);
    assert_eq!(
        policy(&as_key(&sg, "/search", "sk-alice")),
        owned("\"free-search\";q=2;w=60", 1),
        "nothing changed"
    );
}

/// With Redis stalled or down, a write answers 503 within its deadline and
/// changes nothing, and the overrides last read stay in force (decisions
/// fall back, under the overridden plan's policy).
#[test]
fn overrides_outlive_a_redis_outage() {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    // The default timeout: a paused Redis must fail the write promptly.
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let (_dir, keys) = keys_file("");
    let sg = Slidegate::start(&planned(&upstream, &store, &keys, true));
    assert_eq!(put_override(&sg, "sk-alice", r#"{"plan": "pro"}"#).status, 200);
    redis.pause();
    let stalled = put_override(&sg, "sk-bob", r#"{"plan": "pro"}"#);
    assert_eq!(stalled.status, 503, "{stalled:?}");
    assert!(stalled.body.contains("the store did not take the change"), "{stalled:?}");
    redis.resume();
    redis.kill();
    let down = request(sg.addr, "DELETE", "/v1/overrides/sk-alice", &[], b"");
    assert_eq!(down.status, 503, "{down:?}");
    wait_for("the failed read's log line", Duration::from_secs(10), || {
        sg.log.lock().unwrap().contains("cannot read the plan overrides")
    });
    assert_eq!(search_policy(&sg, "sk-alice"), "\"pro-search\";q=100;w=60", "the last read stays");
    assert_eq!(search_policy(&sg, "sk-bob"), "\"free-search\";q=2;w=60");
}

/// Every admin endpoint that changes something (a reload, an override, a
/// penalty lift) takes the `/v1/check` token when one is set: without it,
/// or with another, 401 and nothing changed; with it, done.
#[test]
fn every_mutating_admin_endpoint_takes_the_check_token() {
    let upstream = Upstream::start();
    let (_dir, keys) = keys_file("sk-alice free\n");
    let text = planned(&upstream, "", &keys, false).replace(
        "admin_on_public = true\n",
        &format!("admin_on_public = true\ncheck_token_env = \"{SECRET_ENV}\"\n"),
    );
    let sg = Slidegate::start(&text);
    let lift = format!("/v1/penalty/k:{}", "0".repeat(32));
    // Each call, its answer with the token, and alice's plan before it.
    let calls: [(&str, &str, &[u8], u16, &str); 5] = [
        ("POST", "/admin/reload", b"", 200, "free"),
        ("PUT", "/v1/overrides/sk-alice", br#"{"plan": "pro"}"#, 200, "free"),
        ("DELETE", "/v1/overrides/sk-alice", b"", 200, "pro"),
        // Past the token, the lift's own answer: no rule here has a penalty.
        ("DELETE", &lift, b"", 400, "free"),
        ("POST", "/v1/check", br#"{"rule": "search", "key": "sk-alice"}"#, 200, "free"),
    ];
    for (method, path, body, done, plan) in calls {
        for refused in [None, Some("Bearer wrong"), Some("end-to-end-secret")] {
            let headers: Vec<(&str, &str)> = refused.map(|t| ("authorization", t)).into_iter().collect();
            let reply = request(sg.addr, method, path, &headers, body);
            assert_eq!(reply.status, 401, "{method} {path} with {refused:?}: {reply:?}");
            assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "{method} {path}");
        }
        let policy = search_policy(&sg, "sk-alice");
        assert!(
            policy.starts_with(&format!("\"{plan}-search\"")),
            "{method} {path}: nothing changed: {policy}"
        );
        let reply = request(
            sg.addr,
            method,
            path,
            &[("authorization", "Bearer end-to-end-secret"), ("content-type", "application/json")],
            body,
        );
        assert_eq!(reply.status, done, "{method} {path}: {reply:?}");
    }
}
