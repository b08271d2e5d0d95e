//! End to end: a real upstream HTTP server, a real `slidegate serve` process,
//! a real `redis-server`, and an HTTP client, all on loopback sockets.
//!
//! The client and upstream are a page of std-only HTTP/1.1 so that what is
//! tested is slidegate's behaviour on the wire, headers byte for byte.
//! Quotas use `sliding_log` with long windows so every header value is exact
//! while a test runs (a test would have to stall for a second to shift one).

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

// ---------------------------------------------------------------- tests

#[test]
fn denies_after_the_limit_with_exact_headers_and_a_problem_body() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);

    let first = sg.get("/api/search?q=cats", &[]);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, "GET /api/search?q=cats xff=127.0.0.1");
    assert_eq!(first.header("x-upstream"), Some("yes"));
    assert_eq!(first.header("ratelimit-policy"), Some("\"search-60s\";q=2;w=60, \"search-1h\";q=100;w=3600"));
    assert_eq!(first.header("ratelimit"), Some("\"search-60s\";r=1;t=60, \"search-1h\";r=99;t=3600"));
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(first.header("retry-after"), None);

    let second = sg.get("/api/search?q=dogs", &[]);
    assert_eq!(second.status, 200);
    assert_eq!(second.header("ratelimit"), Some("\"search-60s\";r=0;t=60, \"search-1h\";r=98;t=3600"));
    assert_eq!(second.header("x-ratelimit-remaining"), Some("0"));

    let denied = sg.get("/api/search/users", &[]);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("retry-after"), Some("60"));
    assert_eq!(denied.header("cache-control"), Some("no-store"));
    assert_eq!(denied.header("content-type"), Some("application/problem+json"));
    assert_eq!(denied.header("ratelimit-policy"), Some("\"search-60s\";q=2;w=60"));
    assert_eq!(denied.header("ratelimit"), Some("\"search-60s\";r=0;t=60"));
    assert_eq!(denied.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(denied.header("x-upstream"), None);
    let problem: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
    assert_eq!(
        problem,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "detail": "policy \"search-60s\" allows 2 requests per 60 s; retry in 60 s",
            "instance": "/api/search/users",
            "violated-policies": ["search-60s"],
        })
    );
    // The denied request never reached the upstream, and was not charged to the hourly limit.
    assert_eq!(upstream.hits(), 2);
    let m = sg.metrics();
    assert_eq!(m["slidegate_requests_allowed_total{rule=\"search\"}"], 2.0);
    assert_eq!(m["slidegate_requests_denied_total{rule=\"search\"}"], 1.0);
    assert_eq!(m["slidegate_requests_fail_open_total{rule=\"search\"}"], 0.0);
    assert_eq!(m["slidegate_store_latency_seconds_count"], 3.0);
}

#[test]
fn endpoints_have_independent_limits_and_unmatched_paths_are_not_limited() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    let statuses = |target: &str, n: usize| (0..n).map(|_| sg.get(target, &[]).status).collect::<Vec<_>>();
    assert_eq!(statuses("/api/search", 3), [200, 200, 429]);
    assert_eq!(statuses("/api/videos/trending", 4), [200, 200, 200, 429]);
    assert_eq!(statuses("/api/search", 1), [429]);
    // A method the rule does not name, and a path no rule names, pass unlimited.
    let post = request(sg.addr, "POST", "/api/videos/trending", &[], b"");
    assert_eq!((post.status, post.header("ratelimit")), (200, None));
    assert_eq!(statuses("/api/videos/42", 5), [200; 5]);
    assert_eq!(upstream.hits(), 2 + 3 + 1 + 5);
}

#[test]
fn path_variants_count_against_the_rule_and_are_forwarded_as_received() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    let replies: Vec<Reply> = [
        "/api/videos/trending/",
        "//api/videos/trending",
        "/api/videos/%74rending",
        "/api/./videos/trending",
    ]
    .iter()
    .map(|target| sg.get(target, &[]))
    .collect();
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(replies[0].header("ratelimit"), Some("\"trending\";r=2;t=60"));
    assert_eq!(replies[1].body, "GET //api/videos/trending xff=127.0.0.1");
    assert_eq!(replies[2].body, "GET /api/videos/%74rending xff=127.0.0.1");
    assert_eq!(replies[3].header("retry-after"), Some("60"));
    assert_eq!(upstream.hits(), 3);
}

#[test]
fn authenticated_clients_get_their_own_larger_quota_per_key() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    let trending = |headers: &[(&str, &str)], n: usize| {
        (0..n).map(|_| sg.get("/api/videos/trending", headers).status).collect::<Vec<_>>()
    };
    assert_eq!(trending(&[], 4), [200, 200, 200, 429]);
    let alice = sg.get("/api/videos/trending", &[("x-api-key", "alice")]);
    assert_eq!(alice.header("ratelimit-policy"), Some("\"trending\";q=5;w=60"));
    assert_eq!(alice.header("x-ratelimit-remaining"), Some("4"));
    assert_eq!(trending(&[("x-api-key", "alice")], 5), [200, 200, 200, 200, 429]);
    assert_eq!(trending(&[("x-api-key", "bob")], 1), [200]);
    // Anonymous traffic from the same address is still denied.
    let anonymous = sg.get("/api/videos/trending", &[]);
    assert_eq!(
        (anonymous.status, anonymous.header("ratelimit-policy")),
        (429, Some("\"trending\";q=3;w=60"))
    );
}

#[test]
fn forwarding_headers_from_an_untrusted_peer_change_nothing() {
    let upstream = Upstream::start();
    // 127.0.0.1, the test client, is not a trusted proxy here.
    let sg = embedded(&upstream);
    let spoofed: Vec<u16> = ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"]
        .iter()
        .map(|ip| {
            sg.get("/api/videos/trending", &[("x-forwarded-for", ip), ("forwarded", &format!("for={ip}"))])
                .status
        })
        .collect();
    assert_eq!(spoofed, [200, 200, 200, 429]);
    // The upstream sees the client's chain with the real peer appended.
    let reply = sg.get("/api/videos/42", &[("x-forwarded-for", "9.9.9.9")]);
    assert_eq!(reply.body, "GET /api/videos/42 xff=9.9.9.9, 127.0.0.1");
}

#[test]
fn forwarding_headers_from_a_trusted_proxy_name_the_client() {
    let upstream = Upstream::start();
    let sg = Slidegate::start(&config(&upstream, "", r#""127.0.0.1/32""#));
    let trending = |xff: &str| sg.get("/api/videos/trending", &[("x-forwarded-for", xff)]).status;
    assert_eq!(
        [trending("1.1.1.1"), trending("1.1.1.1"), trending("1.1.1.1"), trending("1.1.1.1")],
        [200, 200, 200, 429]
    );
    // Another client behind the same proxy has its own quota; a spoofed
    // left-most entry does not escape the right-most untrusted one.
    assert_eq!(trending("2.2.2.2"), 200);
    assert_eq!(trending("7.7.7.7, 1.1.1.1"), 429);
}

#[test]
fn a_client_forwarded_header_passed_through_a_trusted_proxy_is_not_believed() {
    let upstream = Upstream::start();
    // The trusted proxy (the test client) appends X-Forwarded-For, as nginx
    // does, and passes the client's own `Forwarded` through untouched.
    let sg = Slidegate::start(&config(&upstream, "", r#""127.0.0.1/32""#));
    let statuses: Vec<u16> = ["6.6.6.1", "6.6.6.2", "6.6.6.3"]
        .iter()
        .map(|spoof| {
            let forwarded = format!("for={spoof}");
            sg.get("/api/search", &[("forwarded", &forwarded), ("x-forwarded-for", "198.51.100.7")]).status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
}

#[test]
fn the_check_api_decides_for_a_given_key() {
    let upstream = Upstream::start();
    // One check charges at most 1 unless the rule allows more (here 2, its
    // smallest limit: `check-config` refuses more).
    let text = config(&upstream, "", r#""10.0.0.0/8""#)
        .replace("path = \"/api/search*\"\n", "path = \"/api/search*\"\nmax_cost = 2\n");
    let sg = Slidegate::start(&text);
    let check = |body: &str| {
        request(sg.addr, "POST", "/v1/check", &[("content-type", "application/json")], body.as_bytes())
    };
    let reply = check(r#"{"rule":"search","key":"user-42","cost":1}"#);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("ratelimit"), Some("\"search-60s\";r=1;t=60, \"search-1h\";r=99;t=3600"));
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"allowed": true, "limit": 2, "remaining": 1, "reset_after_ms": json["reset_after_ms"], "retry_after_ms": null, "policy": "search-60s"})
    );
    assert!((59_000..=60_000).contains(&json["reset_after_ms"].as_u64().unwrap()), "{json}");
    let reply = check(r#"{"rule":"search","key":"user-42","cost":2}"#);
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!((reply.status, &json["allowed"], &json["remaining"]), (200, &false.into(), &1.into()));
    assert!((59_000..=60_000).contains(&json["retry_after_ms"].as_u64().unwrap()), "{json}");
    assert_eq!(reply.header("retry-after"), Some("60"));
    // The key shares quota with requests carrying it as their API key.
    let proxied = sg.get("/api/search", &[("x-api-key", "user-42")]);
    assert_eq!((proxied.status, proxied.header("x-ratelimit-remaining")), (200, Some("0")));

    for (body, detail) in [
        // The rule names are not listed to whoever asks.
        (r#"{"rule":"nope","key":"k"}"#, "unknown rule \"nope\""),
        (
            r#"{"rule":"search","key":"k","cost":3}"#,
            "cost 3 is above the rule's max_cost 2: one check may charge at most 2",
        ),
    ] {
        let reply = check(body);
        assert_eq!(reply.status, 400, "{reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["detail"], detail);
        assert_eq!(json["status"], 400);
    }
    let malformed = check("{\"rule\": \"search\"");
    assert_eq!(malformed.status, 400);
    assert!(malformed.body.contains("malformed check request"), "{}", malformed.body);
    assert_eq!(request(sg.addr, "GET", "/v1/check", &[], b"").status, 405);
}

#[test]
fn admin_endpoints_move_under_a_prefix_and_health_answers() {
    let upstream = Upstream::start();
    let text = config_with(upstream.addr, "admin_on_public = true\nadmin_prefix = \"/_slidegate\"", "", "");
    let sg = Slidegate::start(&text);
    let health = sg.get("/_slidegate/healthz", &[]);
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let metrics = sg.get("/_slidegate/metrics", &[]);
    assert_eq!(
        metrics.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(metrics.body.ends_with("\n# EOF\n"), "{}", metrics.body);
    assert!(metrics.body.contains("# TYPE slidegate_store_latency_seconds histogram"));
    // Without the prefix the upstream's own /metrics is reached.
    assert_eq!(sg.get("/metrics", &[]).body, "GET /metrics xff=127.0.0.1");
    assert_eq!(upstream.hits(), 1);
}

#[test]
fn with_admin_listen_the_admin_endpoints_leave_the_public_listener() {
    let upstream = Upstream::start();
    let text = config_with(upstream.addr, "admin_listen = \"127.0.0.1:0\"", "", "");
    let sg = Slidegate::start(&text);
    let admin = sg.admin_addr();
    assert_ne!(admin, sg.addr);
    let body = br#"{"rule":"search","key":"user-42","cost":1}"#;
    // On the public port /v1/check is just another upstream path.
    let public = request(sg.addr, "POST", "/v1/check", &[("content-type", "application/json")], body);
    assert_eq!((public.status, public.body.as_str()), (200, "POST /v1/check xff=127.0.0.1"));
    assert_eq!(sg.get("/metrics", &[]).body, "GET /metrics xff=127.0.0.1");
    assert_eq!(upstream.hits(), 2);
    // On the admin port it answers the decision, and nothing is forwarded.
    let decided = request(admin, "POST", "/v1/check", &[("content-type", "application/json")], body);
    assert_eq!(decided.status, 200, "{decided:?}");
    assert_eq!(decided.header("ratelimit"), Some("\"search-60s\";r=1;t=60, \"search-1h\";r=99;t=3600"));
    let json: serde_json::Value = serde_json::from_str(&decided.body).unwrap();
    assert_eq!(
        (&json["allowed"], &json["remaining"], &json["policy"]),
        (&true.into(), &1.into(), &"search-60s".into())
    );
    let health = get(admin, "/healthz", &[]);
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let metrics = get(admin, "/metrics", &[]);
    assert!(metrics.body.contains("# TYPE slidegate_store_latency_seconds histogram"), "{}", metrics.body);
    assert_eq!(get(admin, "/api/search", &[]).status, 404);
    assert_eq!(upstream.hits(), 2);
}

#[test]
fn request_and_response_bodies_pass_through_the_proxy() {
    let upstream = Upstream::start();
    let sg = embedded(&upstream);
    let body: Vec<u8> = (0..1_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let reply =
        request(sg.addr, "POST", "/echo", &[("connection", "keep-alive, x-hop"), ("x-hop", "1")], &body);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.len(), body.len());
    assert!(reply.body.as_bytes() == body.as_slice());
}

#[test]
fn sigterm_stops_serve_gracefully() {
    let upstream = Upstream::start();
    let mut sg = embedded(&upstream);
    assert_eq!(sg.get("/healthz", &[]).status, 200);
    let status = sg.terminate();
    assert!(status.success(), "{status:?}");
    assert!(sg.log.lock().unwrap().contains("shutdown signal received"));
}

#[test]
fn a_bad_config_exits_64_naming_line_and_column() {
    let upstream = Upstream::start();
    let text = config(&upstream, "", "").replace("window = \"1h\"", "window = \"1hour\"");
    let (_dir, path) = write_config(&text);
    for args in [vec!["serve", "--config"], vec!["check-config"]] {
        let out = Command::new(binary()).args(&args).arg(&path).env(SECRET_ENV, "s").output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        let first = stderr.lines().next().unwrap();
        assert_eq!(
            first,
            format!(
                "slidegate: {}:23:93: invalid duration \"1hour\": expected a whole number followed by ms, s, m, h or d, such as \"60s\"",
                path.display()
            )
        );
    }
    // No upstream: serve cannot start, and check-config says so in the same
    // words (never ok), at the [server] table or the file's start.
    let no_upstream = [
        ("[server]\nlisten = \"127.0.0.1:0\"\n", ":1:1: [server] has no upstream"),
        ("[identity]\nipv6_prefix = 64\n", ":1:1: no [server] table"),
        (
            "[identity]\nipv6_prefix = 64\n\n[server]\nlisten = \"127.0.0.1:0\"\n",
            ":4:1: [server] has no upstream",
        ),
    ];
    for (text, expected) in no_upstream {
        let (_dir, path) = write_config(text);
        for args in [vec!["serve", "--config"], vec!["check-config"]] {
            let out = Command::new(binary()).args(&args).arg(&path).output().unwrap();
            assert_eq!(out.status.code(), Some(64), "{args:?} {text:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(expected), "{args:?}: {stderr}");
            assert!(stderr.contains("expected upstream = \"http://host:port\" under [server]"), "{stderr}");
        }
    }
    // An unknown key is an error too, and a missing secret names its variable.
    let (_dir, path) = write_config("[server]\nlisten = \"127.0.0.1:0\"\nlisten_port = 1\n");
    let out = Command::new(binary()).arg("check-config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":3:1: unknown field `listen_port`"));
    let (_dir, path) = write_config(&config(&upstream, "", ""));
    let out = Command::new(binary()).arg("check-config").arg(&path).env_remove(SECRET_ENV).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains(&format!(":10:22: environment variable {SECRET_ENV} is not set")));
}

// ---------------------------------------------------------------- Redis

#[test]
fn on_redis_limits_hold_fail_open_without_stalls_while_it_is_down_and_resume_after_restart() {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let sg = Slidegate::start(&config(&upstream, &redis_store(&redis), r#""10.0.0.0/8""#));
    let statuses = |target: &str, n: usize| (0..n).map(|_| sg.get(target, &[]).status).collect::<Vec<_>>();

    // Limiting on Redis, with the same exact headers as the embedded store.
    let first = sg.get("/api/search", &[]);
    assert_eq!(first.header("ratelimit"), Some("\"search-60s\";r=1;t=60, \"search-1h\";r=99;t=3600"));
    assert_eq!(statuses("/api/search", 2), [200, 429]);
    assert_eq!(statuses("/api/videos/trending", 4), [200, 200, 200, 429]);
    let before = sg.metrics();
    assert_eq!(before["slidegate_store_calls_total"], 7.0);
    assert_eq!(before["slidegate_breaker_open"], 0.0);

    redis.kill();
    // Fail open: the exhausted anonymous quota no longer blocks, nothing is stalled for long.
    let down: Vec<Reply> = (0..10).map(|_| sg.get("/api/videos/trending", &[])).collect();
    assert!(down.iter().all(|r| r.status == 200 && r.header("ratelimit").is_none()), "{down:?}");
    let opened = sg.metrics();
    assert_eq!(opened["slidegate_breaker_open"], 1.0);
    assert_eq!(opened["slidegate_requests_fail_open_total{rule=\"trending\"}"], 10.0);
    // The breaker opened after 3 failed calls: the other 7 never called the
    // store, but for the open breaker's trials (one per 20 ms).
    let trials = opened["slidegate_breaker_trials_total"];
    assert_eq!(opened["slidegate_store_calls_total"], 7.0 + 3.0 + trials);
    assert_eq!(opened["slidegate_store_skipped_total"] + trials, 7.0);

    // Once open, requests do not wait on the store at all.
    let fast: Vec<Reply> = (0..50).map(|_| sg.get("/api/videos/trending", &[])).collect();
    assert!(fast.iter().all(|r| r.status == 200));
    let slowest = fast.iter().map(|r| r.elapsed).max().unwrap();
    // Generous for two busy cores: a request waiting on the dead store
    // would take the 50 ms deadline at least, and before the breaker ~9.5 s.
    assert!(slowest < Duration::from_secs(2), "slowest request took {slowest:?}");
    let still = sg.metrics();
    let trials = still["slidegate_breaker_trials_total"];
    assert_eq!(still["slidegate_store_calls_total"], 10.0 + trials);
    assert_eq!(still["slidegate_store_skipped_total"] + trials, 57.0);
    assert_eq!(still["slidegate_requests_fail_open_total{rule=\"trending\"}"], 60.0);
    // The first probe is due `probe_interval_ms` (100) after the breaker
    // opened; the requests above may well have taken less than that.
    wait_for("a background probe of the dead store", Duration::from_secs(10), || {
        sg.metric("slidegate_store_probes_total") >= 1.0
    });
    assert_eq!(sg.metric("slidegate_breaker_open"), 1.0);

    // Redis comes back (empty): the background probe closes the breaker and
    // limiting resumes without restarting slidegate.
    redis.restart();
    wait_for("the breaker to close", Duration::from_secs(10), || sg.metric("slidegate_breaker_open") == 0.0);
    assert_eq!(statuses("/api/videos/trending", 4), [200, 200, 200, 429]);
    assert_eq!(sg.metric("slidegate_requests_fail_open_total{rule=\"trending\"}"), 60.0);
}

#[test]
fn serve_starts_while_redis_is_down_and_connects_when_it_appears() {
    let mut redis = RedisServer::spawn();
    redis.kill();
    let upstream = Upstream::start();
    let sg = Slidegate::start(&config(&upstream, &redis_store(&redis), r#""10.0.0.0/8""#));
    assert_eq!(sg.get("/api/search", &[]).status, 200);
    assert_eq!(sg.metric("slidegate_requests_fail_open_total{rule=\"search\"}"), 1.0);
    redis.restart();
    wait_for("limiting on Redis", Duration::from_secs(10), || {
        sg.get("/api/search", &[]).header("ratelimit").is_some()
    });
    assert_eq!((0..3).map(|_| sg.get("/api/search", &[]).status).collect::<Vec<_>>(), [200, 429, 429]);
}

#[test]
fn fail_closed_rules_answer_503_while_redis_is_down() {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let text = config(&upstream, &redis_store(&redis), "")
        .replace("name = \"search\"\n", "name = \"search\"\non_error = \"deny\"\n");
    let sg = Slidegate::start(&text);
    assert_eq!(sg.get("/api/search", &[]).status, 200);
    redis.kill();
    let reply = sg.get("/api/search", &[]);
    assert_eq!((reply.status, reply.header("retry-after")), (503, Some("1")));
    assert_eq!(sg.get("/api/videos/trending", &[]).status, 200);
    let m = sg.metrics();
    assert_eq!(m["slidegate_requests_fail_closed_total{rule=\"search\"}"], 1.0);
    assert_eq!(m["slidegate_requests_fail_open_total{rule=\"trending\"}"], 1.0);
    assert_eq!(upstream.hits(), 2);
}

/// The example configuration in `examples/`, word for word (also the README's). Tests
/// rewrite its addresses: they never touch port 6379 or 8080.
const EXAMPLE_CONFIG: &str = include_str!("../../../examples/slidegate.toml");

/// The Redis URL the example names, to be replaced by a test server's.
fn example_redis_url() -> &'static str {
    EXAMPLE_CONFIG.lines().find_map(|l| l.strip_prefix("url = \"")?.split('"').next()).unwrap()
}

#[test]
fn the_example_config_checks_and_serves_on_redis() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let text = EXAMPLE_CONFIG
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("http://127.0.0.1:9000", &format!("http://{}", upstream.addr))
        .replace(example_redis_url(), &redis.url());
    assert_eq!(text.lines().count(), EXAMPLE_CONFIG.lines().count());
    let (_dir, path) = write_config(&text);
    let out = Command::new(binary())
        .arg("check-config")
        .arg(&path)
        .env("SLIDEGATE_IP_SECRET", "s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("rule search * /api/search*: search-1s = 10 per 1000 ms (sliding_window_counter); search-1h = 500 per 3600000 ms (sliding_window_counter)"), "{stdout}");

    let text = text.replace("SLIDEGATE_IP_SECRET", SECRET_ENV);
    let sg = Slidegate::start(&text);
    let reply = sg.get("/api/search?q=x", &[]);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit-policy"), Some("\"search-1s\";q=10;w=1, \"search-1h\";q=500;w=3600"));
    let trending = sg.get("/api/videos/trending", &[("x-api-key", "k1")]);
    assert_eq!(trending.header("ratelimit-policy"), Some("\"trending\";q=1000;w=60"));
    assert_eq!(trending.header("x-ratelimit-remaining"), Some("999"));
    let anonymous = sg.get("/api/videos/trending", &[]);
    assert_eq!(anonymous.header("ratelimit-policy"), Some("\"trending\";q=100;w=60"));
    assert_eq!(anonymous.header("x-ratelimit-remaining"), Some("99"));
}

/// `serve` with `[store]` lines `extra` on `redis`, given 20 s to stop: its
/// exit code (`None`: still running, then killed) and its stderr.
fn serve_refuses(upstream: &Upstream, redis: &RedisServer, extra: &str) -> (Option<i32>, String) {
    let text = config(upstream, &format!("{}{extra}", redis_decides(redis)), "");
    let (_dir, path) = write_config(&text);
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&path)
        .env(SECRET_ENV, "s")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (code, stderr)
}

#[test]
fn a_second_instance_with_another_layout_on_one_prefix_refuses_to_start() {
    let redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let packed = "layout = \"packed\"\nexpected_identities = 20000\n";
    // The first instance records its layout; one with the same settings runs beside it.
    let first = Slidegate::start(&config(&upstream, &format!("{}{packed}", redis_decides(&redis)), ""));
    let same = Slidegate::start(&config(&upstream, &format!("{}{packed}", redis_decides(&redis)), ""));
    let layout: String = redis::cmd("GET")
        .arg("slidegate:layout")
        .query(&mut redis::Client::open(redis.url()).unwrap().get_connection().unwrap())
        .unwrap();
    assert_eq!(layout, "packed 1024");
    for (extra, this) in
        [("", "per_key"), ("layout = \"packed\"\nexpected_identities = 1000\n", "packed (32 buckets)")]
    {
        let (code, stderr) = serve_refuses(&upstream, &redis, extra);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "[store] layout and expected_identities: the prefix's layout is recorded in Redis as \
                 packed (1024 buckets) (key slidegate:layout), but this store is {this}:"
            )),
            "{stderr}"
        );
        assert!(stderr.contains("use a new prefix") && stderr.contains("DEL slidegate:layout"), "{stderr}");
    }
    // Under another prefix, other settings run.
    let apart =
        Slidegate::start(&config(&upstream, &format!("{}prefix = \"other:\"\n", redis_decides(&redis)), ""));
    for sg in [&first, &same, &apart] {
        assert_eq!(sg.get("/api/search", &[]).status, 200);
    }
}
