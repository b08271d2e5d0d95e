//! Allow and deny lists against the real binary: exempt clients pass
//! unlimited without rate limit headers or a store call (Redis down too),
//! listed clients get 403 and never reach the upstream, a reload changes
//! the lists, a spoofed `X-Forwarded-For` lists nobody, and IPv6 and
//! IPv4-mapped peers are judged by their canonical address.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use common::*;

/// A GET over `stream`, read to its end.
fn get_over(mut stream: TcpStream, target: &str, headers: &[(&str, &str)]) -> Reply {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!("GET {target} HTTP/1.1\r\nhost: slidegate\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let (status_line, headers) = read_head(&mut reader).expect("a response");
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let body = read_body(&mut reader, &headers);
    Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned(), elapsed: Duration::ZERO }
}

/// A GET from the loopback address `127.0.0.{last}`.
fn get_from(last: u8, addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> Reply {
    get_over(connect_from(Ipv4Addr::new(127, 0, 0, last), addr), target, headers)
}

/// Two rules of 2 requests a minute; `lists` is the `[lists]` table and
/// `search_lists` lines added to the `search` rule.
fn lists_config(upstream: &Upstream, store: &str, lists: &str, search_lists: &str, log: &Path) -> String {
    format!(
        r#"{head}
[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "{SECRET_ENV}"
trusted_proxies = ["127.0.0.9/32"]

[access_log]
path = "{log}"
sample_allowed = 1.0

[lists]
{lists}

[[rules]]
name = "search"
path = "/search"
limits = [{{ limit = 2, window = "60s" }}]
{search_lists}

[[rules]]
name = "feed"
path = "/feed"
limits = [{{ limit = 2, window = "60s" }}]
"#,
        head = config_head(upstream.addr, "admin_on_public = true", store),
        log = log.display(),
    )
}

fn has_rate_headers(reply: &Reply) -> bool {
    ["ratelimit", "ratelimit-policy", "x-ratelimit-limit", "retry-after"]
        .iter()
        .any(|h| reply.header(h).is_some())
}

/// The access log's lines, once `n` are written.
fn log_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    wait_for("the access log", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        lines = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        lines.len() >= n
    });
    lines
}

#[test]
fn an_allowed_network_passes_three_times_the_limit_without_headers_and_a_spoofed_header_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let upstream = Upstream::start();
    let sg =
        Slidegate::start(&lists_config(&upstream, "", r#"allow = { cidrs = ["127.0.0.2/32"] }"#, "", &log));
    for _ in 0..6 {
        let reply = get_from(2, sg.addr, "/search", &[]);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(!has_rate_headers(&reply), "{reply:?}");
    }
    // Another client, and one writing the exempt address into a header it
    // may not write (127.0.0.3 is no trusted proxy): limited.
    let statuses: Vec<u16> =
        (0..3).map(|_| get_from(3, sg.addr, "/search", &[("x-forwarded-for", "127.0.0.2")]).status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    // Through the trusted proxy, the forwarded client is judged: exempt.
    let proxied = get_from(9, sg.addr, "/search", &[("x-forwarded-for", "127.0.0.2")]);
    assert_eq!((proxied.status, has_rate_headers(&proxied)), (200, false));
    assert_eq!(upstream.hits(), 6 + 2 + 1);
    let metrics = sg.metrics();
    assert_eq!(metrics["slidegate_requests_exempt_total{list=\"global\"}"], 7.0);
    assert_eq!(metrics["slidegate_requests_exempt_total{rule=\"search\"}"], 0.0);
    assert_eq!(metrics["slidegate_store_calls_total"], 3.0, "exempt requests call no store");
    let lines = log_lines(&log, 10);
    let exempt = lines.iter().filter(|l| l["outcome"] == "exempt" && l["source"] == "global_list").count();
    assert_eq!(exempt, 7, "{lines:?}");
}

#[test]
fn a_denied_key_gets_403_and_never_reaches_the_upstream_and_a_rule_list_applies_to_its_rule_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let (abusers, partners) = (dir.path().join("abusers.txt"), dir.path().join("partners.txt"));
    std::fs::write(&abusers, "# known abusers\nabuser-key\n").unwrap();
    std::fs::write(&partners, "partner-key\n").unwrap();
    let upstream = Upstream::start();
    let global = format!("deny = {{ keys_file = \"{}\" }}", abusers.display());
    let search = format!("allow = {{ keys_file = \"{}\" }}", partners.display());
    let sg = Slidegate::start(&lists_config(&upstream, "", &global, &search, &log));
    for target in ["/search", "/feed", "/not-limited"] {
        let reply = sg.get(target, &[("x-api-key", "abuser-key")]);
        assert_eq!(reply.status, 403, "{reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        assert!(!has_rate_headers(&reply), "{reply:?}");
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["status"], 403);
        assert_eq!(body["detail"], "the client is on the deny list");
        assert_eq!(body["instance"], target);
    }
    assert_eq!(upstream.hits(), 0);
    let partner = [("x-api-key", "partner-key")];
    assert!((0..6).all(|_| sg.get("/search", &partner).status == 200));
    let feed: Vec<u16> = (0..3).map(|_| sg.get("/feed", &partner).status).collect();
    assert_eq!(feed, [200, 200, 429], "the search rule's allow list is not the feed rule's");
    let metrics = sg.metrics();
    assert_eq!(metrics["slidegate_requests_listed_denied_total{list=\"global\"}"], 3.0);
    assert_eq!(metrics["slidegate_requests_exempt_total{rule=\"search\"}"], 6.0);
    assert_eq!(metrics["slidegate_requests_exempt_total{list=\"global\"}"], 0.0);
    let lines = log_lines(&log, 12);
    let denied: Vec<_> = lines.iter().filter(|l| l["outcome"] == "listed_denied").collect();
    assert_eq!(denied.len(), 3, "{lines:?}");
    assert!(denied.iter().all(|l| l["status"] == 403 && l["source"] == "global_list"));
    assert_eq!(denied[2]["rule"], "", "no rule matched /not-limited");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("abuser-key") && !text.contains("partner-key"), "keys are never logged");
    assert_eq!(lines.iter().filter(|l| l["outcome"] == "exempt" && l["source"] == "rule_list").count(), 6);
}

#[test]
fn the_check_api_answers_a_listed_key_as_its_requests_are_answered() {
    // Before: `/v1/check` skipped the lists, so a key on the deny list was
    // told "allowed" by the decision service and refused by the proxy.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let (abusers, partners) = (dir.path().join("abusers.txt"), dir.path().join("partners.txt"));
    std::fs::write(&abusers, "abuser-key\n").unwrap();
    std::fs::write(&partners, "partner-key\n").unwrap();
    let upstream = Upstream::start();
    let global = format!("deny = {{ keys_file = \"{}\" }}", abusers.display());
    let search = format!("allow = {{ keys_file = \"{}\" }}", partners.display());
    let sg = Slidegate::start(&lists_config(&upstream, "", &global, &search, &log));
    let check = |rule: &str, key: &str, anonymous: bool| {
        let body = format!(r#"{{"rule":"{rule}","key":"{key}","anonymous":{anonymous}}}"#);
        let reply =
            request(sg.addr, "POST", "/v1/check", &[("content-type", "application/json")], body.as_bytes());
        assert_eq!(reply.status, 200, "{reply:?}");
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        (
            json["allowed"].as_bool().unwrap(),
            json["listed"].as_str().map(str::to_owned),
            has_rate_headers(&reply),
        )
    };
    let deny = (false, Some("deny".to_owned()), false);
    assert_eq!(check("search", "abuser-key", false), deny);
    assert_eq!(check("feed", "abuser-key", false), deny);
    let exempt = (true, Some("allow".to_owned()), false);
    assert!((0..5).all(|_| check("search", "partner-key", false) == exempt));
    // The search rule's allow list is not the feed rule's: 2 a minute there.
    let feed: Vec<_> = (0..3).map(|_| check("feed", "partner-key", false).0).collect();
    assert_eq!(feed, [true, true, false]);
    // An anonymous check's key names no API key: the rule decides.
    assert_eq!(check("search", "abuser-key", true), (true, None, true));
    let metrics = sg.metrics();
    assert_eq!(metrics["slidegate_requests_listed_denied_total{list=\"global\"}"], 2.0);
    assert_eq!(metrics["slidegate_requests_exempt_total{rule=\"search\"}"], 5.0);
    assert_eq!(upstream.hits(), 0);
}

#[test]
fn a_reload_adds_a_denied_network_and_a_broken_keys_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let upstream = Upstream::start();
    let sg = Slidegate::start(&lists_config(&upstream, "", "", "", &log));
    assert_eq!(get_from(4, sg.addr, "/search", &[]).status, 200);
    std::fs::write(
        sg.config_path(),
        lists_config(&upstream, "", r#"deny = { cidrs = ["127.0.0.4/32"] }"#, "", &log),
    )
    .unwrap();
    let answer = request(sg.addr, "POST", "/admin/reload", &[], b"");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(get_from(4, sg.addr, "/search", &[]).status, 403);
    assert_eq!(get_from(5, sg.addr, "/search", &[]).status, 200);
    // A keys file with a bad line: the reload fails, located in that file.
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, "fine\nnot,fine\n").unwrap();
    let broken = format!("deny = {{ keys_file = \"{}\" }}", keys.display());
    std::fs::write(sg.config_path(), lists_config(&upstream, "", &broken, "", &log)).unwrap();
    let answer = request(sg.addr, "POST", "/admin/reload", &[], b"");
    assert_ne!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("keys.txt:2:1: a key with a comma"), "{answer:?}");
    assert_eq!(get_from(4, sg.addr, "/search", &[]).status, 403, "the running lists stay");
}

#[test]
fn with_redis_stopped_an_exempt_client_passes_and_a_denied_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = redis_store(&redis).replace("on_error = \"allow\"", "on_error = \"deny\"");
    let lists = r#"allow = { cidrs = ["127.0.0.2/32"] }
deny = { cidrs = ["127.0.0.6/32"] }"#;
    let sg = Slidegate::start(&lists_config(&upstream, &store, lists, "", &log));
    assert!(get_from(3, sg.addr, "/search", &[]).header("ratelimit").is_some(), "limiting on Redis");
    redis.kill();
    for _ in 0..6 {
        let reply = get_from(2, sg.addr, "/search", &[]);
        assert_eq!((reply.status, has_rate_headers(&reply)), (200, false), "{reply:?}");
    }
    assert_eq!(get_from(6, sg.addr, "/search", &[]).status, 403);
    assert_eq!(get_from(3, sg.addr, "/search", &[]).status, 503, "the others fail closed");
    assert_eq!(sg.metric("slidegate_store_calls_total"), 2.0, "listed requests call no store");
}

#[test]
fn ipv6_networks_and_ipv4_mapped_peers_are_judged_by_their_canonical_address() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let upstream = Upstream::start();
    let lists = r#"allow = { cidrs = ["::1/128"] }
deny = { cidrs = ["::ffff:127.0.0.7/128", "127.0.0.8"] }"#;
    let config = lists_config(&upstream, "", lists, "", &log)
        .replace("listen = \"127.0.0.1:0\"", "listen = \"[::]:0\"");
    let sg = Slidegate::start(&config);
    let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, sg.addr.port()));
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, sg.addr.port()));
    for _ in 0..6 {
        let reply = get(v6, "/search", &[]);
        assert_eq!((reply.status, has_rate_headers(&reply)), (200, false), "{reply:?}");
    }
    // IPv4 clients of a dual-stack listener arrive as ::ffff:127.0.0.x.
    assert_eq!(get_from(7, v4, "/search", &[]).status, 403);
    assert_eq!(get_from(8, v4, "/search", &[]).status, 403);
    let reply = get_from(3, v4, "/search", &[]);
    assert_eq!((reply.status, reply.header("ratelimit").is_some()), (200, true));
    assert_eq!(upstream.hits(), 7);
}
