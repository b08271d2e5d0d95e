//! `slidegate replay` predicts what `slidegate serve` answers: one table of
//! hostile requests (encoded NULs, an API key on two lines or with a comma,
//! gRPC calls and a GET claiming gRPC, encoded traversal) sent to a real
//! `serve`, then logged as nginx would log them and replayed under the same
//! config. Each line's decision in the replay (allowed, denied, refused
//! before any rule) must be the answer `serve` gave.
//!
//! Replay reports totals, so a line's decision is what changes in the report
//! when that line is added to the log: the log is replayed once per prefix
//! (the replay is deterministic, and a line never changes what came before).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{keyed_head, request, Reply, Slidegate, Upstream, SECRET_ENV};
use serde_json::Value;

/// The rules: both sides decide by them (replay reads `[server]` for nothing
/// but `max_delayed`). A sliding log over an hour: the wall clock `serve`
/// runs on and the log's times give the same decisions.
const RULES: &str = r#"
[[rules]]
name = "search"
path = "/api/search*"
limits = [{ limit = 3, window = "1h", algorithm = "sliding_log" }]
"#;

/// One request of the table: what it is, method, target, headers, and
/// what `serve` answers it.
type Case<'a> = (&'a str, &'a str, &'a str, Vec<(&'a str, &'a str)>, &'a str);

/// What an answer means, as one word.
fn served(reply: &Reply) -> &'static str {
    // A gRPC call is answered 200 with its status in `grpc-status`.
    match (reply.status, reply.header("grpc-status")) {
        (200, None | Some("0")) => "allowed",
        (400, None) | (200, Some("3")) => "refused",
        (429, None) | (200, Some("8")) => "denied",
        (status, grpc) => panic!("an answer this table does not expect: {status} grpc-status {grpc:?}"),
    }
}

/// The totals a replay reports, in one vector: per rule `allowed`,
/// `delayed`, `denied`, `blocked`, then `unmatched`, then `refused`.
fn totals(report: &Value) -> Vec<u64> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let mut totals = Vec::new();
    for rule in report["rules"].as_array().unwrap() {
        totals.extend(["allowed", "delayed", "denied", "blocked"].map(|k| n(&rule[k])));
    }
    totals.push(n(&report["unmatched"]));
    totals.push(n(&report["refused"]["count"]));
    totals
}

/// The decision of the line that turned `before` into `after`.
fn replayed(before: &[u64], after: &[u64]) -> &'static str {
    let changed: Vec<usize> = (0..after.len()).filter(|&i| after[i] != before[i]).collect();
    let [i] = changed[..] else { panic!("one line changed {changed:?}: {before:?} -> {after:?}") };
    let unmatched = after.len() - 2;
    match i {
        i if i == unmatched => "allowed",
        i if i == unmatched + 1 => "refused",
        i => ["allowed", "delayed", "denied", "blocked"][i % 4],
    }
}

/// Runs `replay --json` of `lines` under `config`.
fn replay(dir: &Path, config: &Path, lines: &[String]) -> Value {
    let log = dir.join("access.jsonl");
    std::fs::write(&log, lines.concat()).unwrap();
    let out = Command::new(common::binary())
        .args(["replay", "--json", "--config"])
        .arg(config)
        .arg(&log)
        .env(SECRET_ENV, "end-to-end-secret")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn replay_decides_each_hostile_request_as_serve_answered_it() {
    let upstream = Upstream::start();
    let config = format!("{}{RULES}", keyed_head(upstream.addr, "", ""));
    let serve = Slidegate::start(&config);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("slidegate.toml");
    std::fs::write(&config_path, &config).unwrap();

    let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
    let key = |k| [("x-api-key", k)];
    let table: Vec<Case<'_>> = vec![
        ("a key, 1 of 3", "GET", "/api/search", key("sk-1").to_vec(), "allowed"),
        ("an encoded NUL", "GET", "/api/search%00.png", key("sk-1").to_vec(), "refused"),
        ("an encoded NUL on no rule's path", "GET", "/static/%00", vec![], "refused"),
        (
            "the key on two lines",
            "GET",
            "/api/search",
            vec![("x-api-key", "sk-1"), ("x-api-key", "sk-2")],
            "refused",
        ),
        ("a key with a comma", "GET", "/api/search", key("sk-a,sk-b").to_vec(), "refused"),
        ("an encoded NUL, a gRPC call", "POST", "/api/search%00x", grpc.to_vec(), "refused"),
        ("a gRPC call, 2 of 3", "POST", "/api/search", [&grpc[..], &key("sk-1")].concat(), "allowed"),
        ("a GET claiming gRPC, 3 of 3", "GET", "/api/search", [&grpc[..], &key("sk-1")].concat(), "allowed"),
        ("a gRPC call, over", "POST", "/api/search", [&grpc[..], &key("sk-1")].concat(), "denied"),
        ("a GET claiming gRPC, over", "GET", "/api/search", [&grpc[..], &key("sk-1")].concat(), "denied"),
        (
            "encoded traversal onto the rule, over",
            "GET",
            "/api/x/%2e%2e/search",
            key("sk-1").to_vec(),
            "denied",
        ),
        ("another key", "GET", "/api/search?q=%2500", key("sk-2").to_vec(), "allowed"),
        ("anonymous", "GET", "/api/search", vec![], "allowed"),
        ("an empty key: anonymous, 2 of 3", "GET", "/api/search", key("").to_vec(), "allowed"),
        ("no rule", "GET", "/static/app.js", vec![], "allowed"),
    ];

    let mut lines = Vec::new();
    let mut answers = Vec::new();
    for (i, (what, method, target, headers, expected)) in table.iter().enumerate() {
        let reply = request(serve.addr, method, target, headers, b"");
        assert_eq!((*what, served(&reply)), (*what, *expected), "serve's answer");
        answers.push(served(&reply));
        // As nginx logs a header sent on several lines: the values joined with ", ".
        let keys: Vec<&str> = headers.iter().filter(|(k, _)| *k == "x-api-key").map(|(_, v)| *v).collect();
        let line = serde_json::json!({
            "time": 1_796_119_200 + i, "method": method, "path": target, "ip": "127.0.0.1",
            "api_key": (!keys.is_empty()).then(|| keys.join(", ")), "status": reply.status,
        });
        lines.push(format!("{line}\n"));
    }

    let mut before = totals(&replay(dir.path(), &config_path, &[]));
    let mut decisions = Vec::new();
    for n in 1..=lines.len() {
        let after = totals(&replay(dir.path(), &config_path, &lines[..n]));
        decisions.push(replayed(&before, &after));
        before = after;
    }
    let whats: Vec<&str> = table.iter().map(|(what, ..)| *what).collect();
    let of = |d: &[&'static str]| whats.iter().copied().zip(d.iter().copied()).collect::<Vec<_>>();
    assert_eq!(of(&decisions), of(&answers), "replay's decision of each line, and serve's answer");

    let report = replay(dir.path(), &config_path, &lines);
    let reasons: Vec<(String, u64)> = report["refused"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["reason"].as_str().unwrap().to_owned(), r["requests"].as_u64().unwrap()))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons.iter().any(|(r, n)| r.contains("encoded NUL") && *n == 3), "{reasons:?}");
    assert!(reasons.iter().any(|(r, n)| r.contains("API key") && *n == 2), "{reasons:?}");
}
