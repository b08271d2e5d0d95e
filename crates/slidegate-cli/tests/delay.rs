//! End to end: a rule's `delay` (hold a request that fits within
//! `max_wait` instead of answering 429) and `[server] max_delayed`, through
//! the real binary: pacing, the caps, a client's share of the queue, a
//! client hanging up while held, and Redis dying while a request is held.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// One rule, `api` on `/api/*`: `limit` per `window` by GCRA (one permit
/// every `window / limit`), per API key, with `delay`; `server` adds to
/// `[server]`, `extra` to the file's end. The tests' own loopback address is
/// a trusted proxy, so a request names its client in `x-forwarded-for`.
fn delay_config(upstream: &Upstream, server: &str, store: &str, rule: &str, extra: &str) -> String {
    format!(
        r#"{head}
[identity]
api_key_header = "x-api-key"
ip_hash_secret_env = "{SECRET_ENV}"
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "api"
path = "/api/*"
{rule}
{extra}
"#,
        head = config_head(upstream.addr, &format!("admin_on_public = true\n{server}"), store),
    )
}

fn key(n: usize) -> String {
    format!("sk-delay-{n:04}")
}

/// A request sent and left waiting for its answer.
fn send(sg: &Slidegate, key: &str) -> TcpStream {
    send_from(sg, key, "127.0.0.1")
}

/// [`send`], from the client at `client` (through the trusted proxy).
fn send_from(sg: &Slidegate, key: &str, client: &str) -> TcpStream {
    let mut stream = TcpStream::connect(sg.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "GET /api/x HTTP/1.1\r\nhost: t\r\nconnection: close\r\nx-api-key: {key}\r\n\
         x-forwarded-for: {client}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// The status of the answer on `stream`.
fn status(stream: TcpStream) -> u16 {
    let (line, _) = read_head(&mut BufReader::new(stream)).expect("an answer");
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

fn held(sg: &Slidegate) -> f64 {
    sg.metric("slidegate_delayed_requests")
}

fn access_log(path: &Path, lines: usize) -> Vec<Value> {
    let mut read = Vec::new();
    wait_for("the access log", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        read = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        read.len() >= lines
    });
    read
}

/// A client asking as fast as it can of a rule admitting 2 a second gets
/// every request, spaced out: the first two at once, each later one held
/// about 500 ms and then allowed; none refused. The responses carry the
/// usual headers and nothing else; the access log says "delayed".
#[test]
fn a_client_faster_than_the_limit_gets_every_request_spaced_out() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.jsonl");
    let rule = r#"limits = [{ limit = 2, window = "1s", algorithm = "gcra" }]
delay = { max_wait = "600ms", per_identity = 1 }"#;
    let extra = format!("[access_log]\npath = \"{}\"\nsample_allowed = 1.0\n", log.display());
    let sg = Slidegate::start(&delay_config(&upstream, "", "", rule, &extra));
    let replies: Vec<Reply> = (0..8).map(|_| sg.get("/api/x", &[("x-api-key", "sk-paced")])).collect();
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200; 8]);
    let names = |r: &Reply| {
        let mut names: Vec<String> = r.headers.keys().filter(|k| *k != "date").cloned().collect();
        names.sort();
        names
    };
    assert_eq!(names(&replies[0]), names(&replies[7]), "a delayed answer carries the same headers");
    assert_eq!(replies[7].header("ratelimit-policy"), Some("\"api\";q=2;w=1"));
    assert_eq!(upstream.hits(), 8);
    assert_eq!(sg.metric("slidegate_requests_allowed_total{rule=\"api\"}"), 8.0);
    assert_eq!(sg.metric("slidegate_requests_denied_total{rule=\"api\"}"), 0.0);
    assert_eq!(sg.metric("slidegate_requests_delayed_total{rule=\"api\"}"), 6.0);
    assert!(sg.metric("slidegate_delayed_seconds_total{rule=\"api\"}") > 0.0);
    let lines = access_log(&log, 8);
    let outcomes: Vec<&str> = lines.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
    assert_eq!(
        outcomes,
        ["allowed", "allowed", "delayed", "delayed", "delayed", "delayed", "delayed", "delayed"]
    );
    assert!(lines[..2].iter().all(|l| l.get("held_ms").is_none()), "{lines:?}");
    assert!(
        lines[2..].iter().all(|l| l["held_ms"].as_u64().unwrap() >= 1 && l["status"] == 200),
        "{lines:?}"
    );
}

/// Many identities at once, each from a client of its own with a request
/// that would be held: never more than `max_delayed` are held; the others
/// are refused at once, and the held ones are allowed when their wait ends.
#[test]
fn many_identities_never_hold_more_than_max_delayed() {
    let upstream = Upstream::start();
    let rule = r#"limits = [{ limit = 1, window = "5s", algorithm = "gcra" }]
delay = { max_wait = "6s", per_identity = 4 }"#;
    let sg = Arc::new(Slidegate::start(&delay_config(&upstream, "max_delayed = 3", "", rule, "")));
    assert_eq!(sg.metric("slidegate_delayed_requests_max"), 3.0);
    let from = |n: usize| format!("192.0.2.{}", n + 1);
    for n in 0..12 {
        assert_eq!(sg.get("/api/x", &[("x-api-key", &key(n)), ("x-forwarded-for", &from(n))]).status, 200);
    }
    let most = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (sg, most) = (Arc::clone(&sg), Arc::clone(&most));
        thread::spawn(move || {
            while sg.metric("slidegate_requests_delayed_total{rule=\"api\"}") < 3.0 {
                most.fetch_max(held(&sg) as u64, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let clients: Vec<_> = (0..12)
        .map(|n| {
            let sg = Arc::clone(&sg);
            thread::spawn(move || sg.get("/api/x", &[("x-api-key", &key(n)), ("x-forwarded-for", &from(n))]))
        })
        .collect();
    let replies: Vec<Reply> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    watcher.join().unwrap();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let refused: Vec<&Reply> = replies.iter().filter(|r| r.status == 429).collect();
    assert_eq!((ok, refused.len()), (3, 9));
    assert!(refused.iter().all(|r| r.header("retry-after").is_some()), "{refused:?}");
    assert!(most.load(Ordering::Relaxed) <= 3, "held at once: {}", most.load(Ordering::Relaxed));
    assert_eq!(held(&sg), 0.0);
    assert_eq!(sg.metric("slidegate_requests_denied_total{rule=\"api\"}"), 9.0);
    assert_eq!(upstream.hits(), 15);
}

/// One client rotating API keys cannot fill the queue: its share of
/// `max_delayed = 10` shrinks as the queue fills (one holding `h` adds one
/// only while more than `4 × h` places are free), so of its 12 keys' requests
/// 2 are held and 10 refused at once, and a client at another address is
/// still held, then served. Before the share, its keys held all 10 places
/// and the other client got 429.
#[test]
fn one_client_rotating_keys_cannot_fill_the_queue() {
    let upstream = Upstream::start();
    let rule = r#"limits = [{ limit = 1, window = "5s", algorithm = "gcra" }]
delay = { max_wait = "6s", per_identity = 4 }"#;
    let sg = Slidegate::start(&delay_config(&upstream, "max_delayed = 10", "", rule, ""));
    let (attacker, victim) = ("203.0.113.7", "198.51.100.9");
    // Each key's permit spent, so that its next request waits about 5 s.
    for n in 0..12 {
        assert_eq!(sg.get("/api/x", &[("x-api-key", &key(n)), ("x-forwarded-for", attacker)]).status, 200);
    }
    assert_eq!(sg.get("/api/x", &[("x-api-key", "sk-victim"), ("x-forwarded-for", victim)]).status, 200);
    let denied = || sg.metric("slidegate_requests_denied_total{rule=\"api\"}");
    // One key at a time, each held or refused before the next is sent, so
    // that what the share allows does not depend on which thread is first.
    let mut attacks = Vec::new();
    for n in 0..12 {
        let decided = held(&sg) + denied();
        attacks.push(send_from(&sg, &key(n), attacker));
        wait_for(&format!("key {n} to be decided"), Duration::from_secs(5), || {
            held(&sg) + denied() == decided + 1.0
        });
    }
    let (attacker_held, attacker_refused) = (held(&sg), denied());
    let victim_status = status(send_from(&sg, "sk-victim", victim));
    assert_eq!((attacker_held, attacker_refused, victim_status), (2.0, 10.0, 200));
    let statuses: Vec<u16> = attacks.into_iter().map(status).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(sg.metric("slidegate_requests_delayed_total{rule=\"api\"}"), 3.0, "the victim's and 2 keys'");
    assert_eq!(denied(), 10.0);
    assert_eq!(held(&sg), 0.0);
    assert_eq!(upstream.hits(), 16);
}

/// A client that hangs up while its request is held frees its place at
/// once (not when the wait would have ended): the identity's next request
/// is held again rather than refused for a full queue.
#[test]
fn a_client_hanging_up_while_held_frees_its_place() {
    let upstream = Upstream::start();
    let rule = r#"limits = [{ limit = 1, window = "10s", algorithm = "gcra" }]
delay = { max_wait = "10s", per_identity = 1 }"#;
    let sg = Slidegate::start(&delay_config(&upstream, "", "", rule, ""));
    assert_eq!(sg.get("/api/x", &[("x-api-key", "sk-gone")]).status, 200);
    for attempt in 0..2 {
        let stream = send(&sg, "sk-gone");
        wait_for("the request to be held", Duration::from_secs(5), || held(&sg) == 1.0);
        stream.shutdown(Shutdown::Both).unwrap();
        drop(stream);
        wait_for(&format!("hang-up {attempt} to free its place"), Duration::from_secs(5), || {
            held(&sg) == 0.0
        });
    }
    assert_eq!(sg.metric("slidegate_requests_denied_total{rule=\"api\"}"), 0.0);
    assert_eq!(upstream.hits(), 1, "a request whose client left is never forwarded");
}

/// Redis dies while a request is held: the decision after the wait goes
/// through the rule's failure policy like any other (`deny`: 503).
#[test]
fn a_request_held_while_redis_dies_gets_the_failure_policy() {
    let mut redis = RedisServer::spawn();
    let upstream = Upstream::start();
    let store = format!("[store]\nurl = \"{}\"\ntimeout_ms = 50\non_error = \"deny\"\n", redis.url());
    let rule = r#"limits = [{ limit = 1, window = "2s", algorithm = "gcra" }]
delay = { max_wait = "3s", per_identity = 1 }"#;
    let sg = Slidegate::start(&delay_config(&upstream, "", &store, rule, ""));
    assert_eq!(sg.get("/api/x", &[("x-api-key", "sk-redis")]).status, 200);
    let stream = send(&sg, "sk-redis");
    wait_for("the request to be held", Duration::from_secs(5), || held(&sg) == 1.0);
    redis.kill();
    assert_eq!(status(stream), 503);
    assert_eq!(sg.metric("slidegate_requests_fail_closed_total{rule=\"api\"}"), 1.0);
    assert_eq!(sg.metric("slidegate_requests_delayed_total{rule=\"api\"}"), 0.0);
    assert_eq!(upstream.hits(), 1);
}
